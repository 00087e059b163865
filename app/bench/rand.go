package bench

import (
	"math"
	"math/rand/v2"
)

// newRand returns a deterministic generator for terminal t of a run seeded
// with seed.
func newRand(seed int64, t int) *rand.Rand {
	return rand.New(rand.NewPCG(uint64(seed), uint64(t)*0x9e3779b97f4a7c15+1))
}

// uniform returns an int in [lo, hi].
func uniform(r *rand.Rand, lo, hi int) int { return lo + r.IntN(hi-lo+1) }

// nuRand is TPC-C's non-uniform random NURand(A, x, y) (clause 2.1.6) with
// run-time constant c.
func nuRand(r *rand.Rand, a, c, x, y int) int {
	return (((uniform(r, 0, a) | uniform(r, x, y)) + c) % (y - x + 1)) + x
}

// zipfian draws integers in [0, n) with P(i) ∝ 1/(i+1)^theta, the
// algorithm of Gray et al. that YCSB's ZipfianGenerator uses. Item 0 is the
// most popular; scrambled spreads the popular items over the key space.
type zipfian struct {
	n                        uint64
	theta, alpha, zetan, eta float64
	half                     float64 // 1 + 0.5^theta
	scramble                 bool
}

func newZipfian(n int, theta float64, scramble bool) *zipfian {
	z := &zipfian{n: uint64(n), theta: theta, scramble: scramble}
	zeta2 := zeta(2, theta)
	z.zetan = zeta(uint64(n), theta)
	z.alpha = 1 / (1 - theta)
	z.eta = (1 - math.Pow(2/float64(n), 1-theta)) / (1 - zeta2/z.zetan)
	z.half = 1 + math.Pow(0.5, theta)
	return z
}

func zeta(n uint64, theta float64) float64 {
	s := 0.0
	for i := uint64(1); i <= n; i++ {
		s += 1 / math.Pow(float64(i), theta)
	}
	return s
}

// next returns the next item.
func (z *zipfian) next(r *rand.Rand) int {
	u := r.Float64()
	uz := u * z.zetan
	var v uint64
	switch {
	case uz < 1:
		v = 0
	case uz < z.half:
		v = 1
	default:
		v = uint64(float64(z.n) * math.Pow(z.eta*u-z.eta+1, z.alpha))
	}
	if v >= z.n {
		v = z.n - 1
	}
	if z.scramble {
		v = fnv64(v) % z.n
	}
	return int(v)
}

// fnv64 is FNV-1a over the 8 bytes of v, YCSB's scrambling hash.
func fnv64(v uint64) uint64 {
	h := uint64(0xcbf29ce484222325)
	for i := 0; i < 8; i++ {
		h ^= v & 0xff
		h *= 0x100000001b3
		v >>= 8
	}
	return h
}

// mix picks a transaction kind by weight.
type mix struct {
	names []string
	cum   []int
	total int
}

func newMix(names []string, weights []int) *mix {
	m := &mix{names: names}
	for _, w := range weights {
		m.total += w
		m.cum = append(m.cum, m.total)
	}
	return m
}

// pick returns the index of the chosen kind.
func (m *mix) pick(r *rand.Rand) int {
	x := r.IntN(m.total)
	for i, c := range m.cum {
		if x < c {
			return i
		}
	}
	return len(m.cum) - 1
}

// lettersPerDraw is how many letters one 64-bit draw yields: the base-26
// digits of a uniform 64-bit number are uniform to within one part in
// 2^64/26^10 ≈ 1.3×10^5 for the first 10.
const lettersPerDraw = 10

// randString returns n random letters, 10 from each 64-bit draw: a draw
// per letter was 6 % of the pipelined put bench's client CPU, which
// shares the cores with the nodes it measures.
func randString(r *rand.Rand, n int) []byte {
	b := make([]byte, n)
	for i := 0; i < n; {
		x := r.Uint64()
		for j := 0; j < lettersPerDraw && i < n; j, i = j+1, i+1 {
			b[i] = 'a' + byte(x%26)
			x /= 26
		}
	}
	return b
}
