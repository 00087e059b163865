package bench

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync/atomic"
	"time"
)

// TPC-B as pgbench's "tpcb-like" builtin script, over KV pairs:
//
//	branch  b/BBBBB            [balance] filler
//	teller  t/TTTTTT           [balance, bid] filler
//	account a/AAAAAAAAA        [balance, bid] filler
//	history h/RUN/TTT/SSSSSSSSSS [tid, bid, aid, delta, mtime] filler
//
// Scale s has s branches, 10·s tellers and Accounts·s accounts (pgbench:
// 100,000 per branch; the default here is 10,000, so a load takes seconds).
func bKey(b int) string { return fmt.Sprintf("b/%05d", b) }
func tKey(t int) string { return fmt.Sprintf("t/%06d", t) }
func aKey(a int) string { return fmt.Sprintf("a/%09d", a) }
func bhKey(run string, term, seq int) string {
	return fmt.Sprintf("h/%s/%03d/%010d", run, term, seq)
}

type tpcb struct{ p WorkloadParams }

func newTPCB(p WorkloadParams) *tpcb { return &tpcb{p: p} }

func (*tpcb) kinds() []string { return []string{"TPCB"} }

func (b *tpcb) load(ctx context.Context, l *loader) error {
	filler := make([]byte, 84)
	for i := range filler {
		filler[i] = ' '
	}
	for i := 1; i <= b.p.Scale; i++ {
		if err := l.put(bKey(i), row{f: []int64{0}, data: filler}.encode()); err != nil {
			return err
		}
	}
	for i := 1; i <= 10*b.p.Scale; i++ {
		if err := l.put(tKey(i), row{f: []int64{0, int64((i-1)/10 + 1)}, data: filler}.encode()); err != nil {
			return err
		}
	}
	for i := 1; i <= b.p.Accounts*b.p.Scale; i++ {
		if err := l.put(aKey(i), row{f: []int64{0, int64((i-1)/b.p.Accounts + 1)}, data: filler}.encode()); err != nil {
			return err
		}
	}
	return nil
}

type tpcbTerminal struct {
	b   *tpcb
	id  int
	r   *rand.Rand
	seq int
}

func (b *tpcb) terminal(i int, r *rand.Rand) terminal { return &tpcbTerminal{b: b, id: i, r: r} }

// next is pgbench's tpcb-like script: add delta to one account, teller and
// branch balance, and insert a history row.
func (t *tpcbTerminal) next(ctx context.Context, s *session) (int, error) {
	p := t.b.p
	aid := uniform(t.r, 1, p.Accounts*p.Scale)
	tid := uniform(t.r, 1, 10*p.Scale)
	bid := uniform(t.r, 1, p.Scale)
	delta := int64(uniform(t.r, -5000, 5000))
	t.seq++
	hk := bhKey(p.RunID, t.id, t.seq)
	now := time.Now().Unix()
	return 0, s.run(ctx, readWrite, func(ctx context.Context, tx *tx) error {
		keys := []string{aKey(aid), tKey(tid), bKey(bid)}
		vs, err := tx.get(ctx, keys...)
		if err != nil {
			return err
		}
		for i, table := range []string{"account", "teller", "branch"} {
			r, err := mustRow(keys[i], vs[i], table)
			if err != nil {
				return err
			}
			r.f[0] += delta
			tx.put(keys[i], r.encode())
		}
		tx.put(hk, row{f: []int64{int64(tid), int64(bid), int64(aid), delta, now}, data: []byte("                      ")}.encode())
		return nil
	})
}

// tpcbChecker checks pgbench's invariant: the sums of the account, teller
// and branch balances and of the history deltas are equal.
type tpcbChecker struct {
	sum  map[string]int64
	rows map[string]int
	bad  []string
}

func (*tpcb) checker() checker {
	return &tpcbChecker{sum: map[string]int64{}, rows: map[string]int{}}
}

func (c *tpcbChecker) add(key string, value []byte) {
	var table string
	switch {
	case key == "bench/loaded":
		return
	case len(key) > 2 && key[:2] == "a/":
		table = "account"
	case len(key) > 2 && key[:2] == "t/":
		table = "teller"
	case len(key) > 2 && key[:2] == "b/":
		table = "branch"
	case len(key) > 2 && key[:2] == "h/":
		table = "tpcb_history"
	default:
		c.bad = append(c.bad, fmt.Sprintf("not a TPC-B key: %q", key))
		return
	}
	r, err := decodeRow(value, nFields[table])
	if err != nil {
		c.bad = append(c.bad, fmt.Sprintf("%s %s: %v", table, key, err))
		return
	}
	v := r.f[0]
	if table == "tpcb_history" {
		v = r.f[3]
	}
	c.sum[table] += v
	c.rows[table]++
}

func (c *tpcbChecker) violations() []string {
	out := append([]string(nil), c.bad...)
	a, t, b, h := c.sum["account"], c.sum["teller"], c.sum["branch"], c.sum["tpcb_history"]
	if a != t || t != b || b != h {
		out = append(out, fmt.Sprintf("balances: sum(accounts) %d, sum(tellers) %d, sum(branches) %d, sum(history) %d are not all equal", a, t, b, h))
	}
	if c.rows["branch"] == 0 {
		out = append(out, "no branch rows")
	}
	return out
}

// YCSB workload A: 50% reads, 50% updates of one record, keys chosen by a
// scrambled zipfian (theta 0.99), records of ValueBytes bytes:
//
//	y/NNNNNNNNNN  [update_count] field bytes
type ycsb struct {
	p    WorkloadParams
	zipf *zipfian
}

func yKey(i int) string { return fmt.Sprintf("y/%010d", i) }

func newYCSB(p WorkloadParams) *ycsb {
	return &ycsb{p: p, zipf: newZipfian(p.Records, p.Theta, true)}
}

func (*ycsb) kinds() []string { return []string{"Read", "Update"} }

func (y *ycsb) load(ctx context.Context, l *loader) error {
	r := newRand(y.p.Seed, 1<<21)
	for i := 0; i < y.p.Records; i++ {
		if err := l.put(yKey(i), row{f: []int64{0}, data: randString(r, y.p.ValueBytes)}.encode()); err != nil {
			return err
		}
	}
	return nil
}

type ycsbTerminal struct {
	y *ycsb
	r *rand.Rand
}

func (y *ycsb) terminal(i int, r *rand.Rand) terminal { return &ycsbTerminal{y: y, r: r} }

func (t *ycsbTerminal) next(ctx context.Context, s *session) (int, error) {
	k := yKey(t.y.zipf.next(t.r))
	if t.r.IntN(2) == 0 {
		_, err := s.fetch(ctx, []string{k}, false)
		return 0, err
	}
	data := randString(t.r, t.y.p.ValueBytes)
	err := s.run(ctx, readWrite, func(ctx context.Context, tx *tx) error {
		vs, err := tx.get(ctx, k)
		if err != nil {
			return err
		}
		r, err := mustRow(k, vs[0], "ycsb")
		if err != nil {
			return err
		}
		tx.put(k, row{f: []int64{r.f[0] + 1}, data: data}.encode())
		return nil
	})
	if err == nil && t.y.p.counts != nil {
		t.y.p.counts.updates.Add(1)
	}
	return 1, err
}

// runCounts is what terminals report that a checker needs: how many YCSB
// updates committed, and how many writes ended with an unknown outcome
// (an error after the Txn was sent), which makes the count inexact.
type runCounts struct {
	updates atomic.Int64
	puts    atomic.Int64 // the put workload's
	unknown atomic.Int64
}

// ycsbChecker checks every record is present and well formed, and that
// the records' update counters add up to the updates the terminals saw
// commit (when no write's outcome is unknown).
type ycsbChecker struct {
	y    *ycsb
	seen int
	sum  int64
	bad  []string
}

func (y *ycsb) checker() checker { return &ycsbChecker{y: y} }

func (c *ycsbChecker) add(key string, value []byte) {
	if key == "bench/loaded" {
		return
	}
	if len(key) < 3 || key[:2] != "y/" {
		c.bad = append(c.bad, fmt.Sprintf("not a YCSB key: %q", key))
		return
	}
	r, err := decodeRow(value, 1)
	if err != nil {
		c.bad = append(c.bad, fmt.Sprintf("record %s: %v", key, err))
		return
	}
	c.seen++
	c.sum += r.f[0]
}

func (c *ycsbChecker) violations() []string {
	out := append([]string(nil), c.bad...)
	if c.seen != c.y.p.Records {
		out = append(out, fmt.Sprintf("records: %d present, %d loaded", c.seen, c.y.p.Records))
	}
	if n := c.y.p.counts; n != nil && n.unknown.Load() == 0 && c.sum != n.updates.Load() {
		out = append(out, fmt.Sprintf("updates: record counters add up to %d, terminals committed %d", c.sum, n.updates.Load()))
	}
	return out
}
