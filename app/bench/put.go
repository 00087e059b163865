package bench

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"

	walshipv1 "github.com/walship/walship/gen/walship/v1"
)

// put is single-key Puts (KVService.Put, no reads, no compares): each
// terminal inserts keys of its own, put/RUN/TT/NNNNNNNNNNNN, with values
// of PutBytes random bytes. It measures what one commit costs walship
// beyond the gRPC round trip, with nothing of a workload's own on top.
type put struct {
	p WorkloadParams
}

func newPut(p WorkloadParams) *put { return &put{p: p} }

func (*put) kinds() []string { return []string{"Put"} }

// load writes nothing: every key is new.
func (*put) load(context.Context, *loader) error { return nil }

func (w *put) prefix() string { return "put/" + w.p.RunID + "/" }

type putTerminal struct {
	w   *put
	key string // put/RUN/TT/
	n   int
	r   *rand.Rand
}

func (w *put) terminal(i int, r *rand.Rand) terminal {
	return &putTerminal{w: w, key: fmt.Sprintf("%s%02d/", w.prefix(), i), r: r}
}

func (t *putTerminal) next(ctx context.Context, s *session) (int, error) {
	t.n++
	resp, err := s.kv.Put(ctx, &walshipv1.PutRequest{Key: putKey(t.key, t.n),
		Value: randString(t.r, t.w.p.PutBytes), Policy: s.policy})
	if err != nil {
		return 0, err
	}
	s.lastLSN = max(s.lastLSN, resp.GetLsn())
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
// terminals saw commit (when no Put's outcome is unknown), each with a
// value of the run's size.
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
	if len(value) != c.w.p.PutBytes && len(c.bad) < 10 {
		c.bad = append(c.bad, fmt.Sprintf("%s: %d bytes, want %d", key, len(value), c.w.p.PutBytes))
	}
}

func (c *putChecker) violations() []string {
	out := append([]string(nil), c.bad...)
	if n := c.w.p.counts; n != nil && n.unknown.Load() == 0 && c.seen != n.puts.Load() {
		out = append(out, fmt.Sprintf("puts: %d keys present, terminals committed %d", c.seen, n.puts.Load()))
	}
	return out
}
