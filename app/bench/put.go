package bench

import (
	"context"
	"fmt"
	"hash/maphash"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync"

	walshipv1 "github.com/walship/walship/gen/walship/v1"
)

// put is single-key Puts (KVService.Put, no reads, no compares): each
// terminal writes keys of its own, put/RUN/TT/NNNNNNNNNNNN, with values
// of PutBytes random bytes — a new key each time, or, with PutKeys, one
// drawn at random from its share of PutKeys. It measures what one commit
// costs walship beyond the gRPC round trip, with nothing of a workload's
// own on top.
type put struct {
	p    WorkloadParams
	seed maphash.Seed
	// keysEach is how many keys each terminal overwrites (0: a new key
	// each Put).
	keysEach int

	mu    sync.Mutex
	terms map[string]*putTerminal // by key prefix
}

func newPut(p WorkloadParams) *put {
	w := &put{p: p, seed: maphash.MakeSeed(), terms: map[string]*putTerminal{}}
	if p.PutKeys > 0 {
		w.keysEach = max(1, p.PutKeys/max(1, p.loops))
	}
	return w
}

func (*put) kinds() []string { return []string{"Put"} }

// load writes nothing: a run's keys are its own.
func (*put) load(context.Context, *loader) error { return nil }

func (w *put) prefix() string { return "put/" + w.p.RunID + "/" }

type putTerminal struct {
	w   *put
	key string // put/RUN/TT/
	n   int
	r   *rand.Rand
	// last is, with keysEach, the hash of the value each key number
	// last committed, if wrote says one did (the terminal is one closed
	// loop: its Puts commit in the order it makes them).
	last  []uint64
	wrote []bool
}

func (w *put) terminal(i int, r *rand.Rand) terminal {
	t := &putTerminal{w: w, key: fmt.Sprintf("%s%02d/", w.prefix(), i), r: r}
	if k := w.keysEach; k > 0 {
		t.last, t.wrote = make([]uint64, k), make([]bool, k)
	}
	w.mu.Lock()
	w.terms[t.key] = t
	w.mu.Unlock()
	return t
}

func (t *putTerminal) next(ctx context.Context, s *session) (int, error) {
	n := t.n + 1
	if k := t.w.keysEach; k > 0 {
		n = t.r.IntN(k)
	}
	t.n++
	value := randString(t.r, t.w.p.PutBytes)
	resp, err := s.kv.Put(ctx, &walshipv1.PutRequest{Key: putKey(t.key, n), Value: value, Policy: s.policy})
	if err != nil {
		return 0, err
	}
	s.lastLSN = max(s.lastLSN, resp.GetLsn())
	if t.last != nil {
		t.last[n], t.wrote[n] = maphash.Bytes(t.w.seed, value), true
	}
	if c := t.w.p.counts; c != nil {
		c.puts.Add(1)
	}
	return 0, nil
}

// putKey is prefix then n in at least 12 digits, zero-padded: what
// fmt.Sprintf("%s%012d", prefix, n) makes of a non-negative n, in 40 %
// of its time (Sprintf was 4.6 % of the pipelined put bench's client,
// which shares the cores with the nodes it measures).
func putKey(prefix string, n int) string {
	var digits [20]byte
	d := strconv.AppendUint(digits[:0], uint64(n), 10)
	var b strings.Builder
	b.Grow(len(prefix) + max(12, len(d)))
	b.WriteString(prefix)
	for range 12 - len(d) {
		b.WriteByte('0')
	}
	b.Write(d)
	return b.String()
}

// putChecker checks that this run's keys are exactly the Puts the
// terminals saw commit (when no Put's outcome is unknown): one key per
// Put, or, with PutKeys, each key a terminal wrote holding the value of
// its last Put; and that every value has the run's size.
type putChecker struct {
	w    *put
	seen int64
	bad  []string
}

func (w *put) checker() checker { return &putChecker{w: w} }

func (c *putChecker) add(key string, value []byte) {
	if !strings.HasPrefix(key, c.w.prefix()) {
		return // the marker, or an earlier run's data on an external cluster
	}
	c.seen++
	if len(value) != c.w.p.PutBytes {
		c.fail("%s: %d bytes, want %d", key, len(value), c.w.p.PutBytes)
	}
	if c.w.keysEach == 0 || c.unknown() {
		return
	}
	cut := strings.LastIndexByte(key, '/') + 1
	t := c.w.terms[key[:cut]]
	n, err := strconv.Atoi(key[cut:])
	if t == nil || err != nil {
		c.fail("%s: no terminal of this run writes it", key)
		return
	}
	switch {
	case n < 0 || n >= len(t.wrote) || !t.wrote[n]:
		c.fail("%s: present, but no Put of it committed", key)
	case maphash.Bytes(c.w.seed, value) != t.last[n]:
		c.fail("%s: %q is not the value its last committed Put wrote", key, value)
	}
}

// unknown reports whether a Put's outcome was unknown.
func (c *putChecker) unknown() bool {
	n := c.w.p.counts
	return n == nil || n.unknown.Load() > 0
}

func (c *putChecker) fail(format string, args ...any) {
	if len(c.bad) < 10 {
		c.bad = append(c.bad, fmt.Sprintf(format, args...))
	}
}

func (c *putChecker) violations() []string {
	out := append([]string(nil), c.bad...)
	if c.unknown() {
		return out
	}
	want := c.w.p.counts.puts.Load()
	if c.w.keysEach > 0 {
		want = 0
		for _, t := range c.w.terms {
			for _, w := range t.wrote {
				if w {
					want++
				}
			}
		}
	}
	if c.seen != want {
		out = append(out, fmt.Sprintf("puts: %d keys present, want %d (the keys the terminals' committed Puts wrote)", c.seen, want))
	}
	return out
}
