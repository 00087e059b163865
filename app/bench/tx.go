package bench

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"

	walshipv1 "github.com/walship/walship/gen/walship/v1"
)

var (
	// errAborted: a transaction's compares failed on every attempt.
	errAborted = errors.New("aborted after too many conflicts")
	// errRollback: the transaction decided to roll back (TPC-C's 1% of
	// NewOrders with an unused item). It counts as a completed transaction.
	errRollback = errors.New("rolled back by the transaction")
)

// maxOps is the API's limit on the ops of one Txn (kv.proto).
const maxOps = 1000

// session is one terminal's connection to the cluster: where it writes and
// reads, its commit policy, and its counters.
type session struct {
	kv     walshipv1.KVServiceClient // the primary
	read   walshipv1.KVServiceClient // a replica for reads, or nil for the primary
	policy *walshipv1.CommitPolicy
	// maxRetries is how many times a conflicting transaction runs again
	// before it aborts.
	maxRetries int
	// lastLSN is this terminal's newest commit: replica reads wait for it
	// (read-your-writes).
	lastLSN uint64
	// speculative lets read-write transactions read pending writes on the
	// primary at once (TxnRequest.speculative): their compares guard what
	// they read, and their commit is ordered after it.
	speculative bool

	retries atomic.Int64
}

// val is a key's state as read.
type val struct {
	v     []byte
	ver   uint64
	found bool
}

// kvPair is one key of a scan.
type kvPair struct {
	key string
	val
}

// tx is one attempt of an optimistic transaction: what it read (with
// versions) and what it will write.
type tx struct {
	s     *session
	cache map[string]val // survives retries: refreshed by the failure branch
	spec  bool           // reads may see pending writes (a read-write transaction)

	reads    map[string]uint64
	readKeys []string
	ops      []*walshipv1.TxnOp
	wrote    map[string]val
	inserts  []string // written keys never read: compared with version 0
}

func (t *tx) reset() {
	t.reads = make(map[string]uint64)
	t.readKeys = t.readKeys[:0]
	t.ops = t.ops[:0]
	t.wrote = make(map[string]val)
	t.inserts = t.inserts[:0]
}

func (t *tx) noteRead(k string, v val) {
	if _, ok := t.reads[k]; ok {
		return
	}
	if _, ok := t.wrote[k]; ok {
		return
	}
	t.reads[k] = v.ver
	t.readKeys = append(t.readKeys, k)
}

// get returns the keys' values: the transaction's own writes, else what
// this transaction already fetched, else one read from the server.
func (t *tx) get(ctx context.Context, keys ...string) ([]val, error) {
	var missing []string
	for _, k := range keys {
		if _, ok := t.wrote[k]; ok {
			continue
		}
		if _, ok := t.cache[k]; !ok {
			missing = append(missing, k)
		}
	}
	if len(missing) > 0 {
		vs, err := t.s.fetch(ctx, missing, t.spec)
		if err != nil {
			return nil, err
		}
		for i, k := range missing {
			t.cache[k] = vs[i]
		}
	}
	out := make([]val, len(keys))
	for i, k := range keys {
		if w, ok := t.wrote[k]; ok {
			out[i] = w
			continue
		}
		out[i] = t.cache[k]
		t.noteRead(k, out[i])
	}
	return out, nil
}

// scan reads [start, end) from the server (never the cache: a retry must
// see new keys) and records every key it returns as read.
func (t *tx) scan(ctx context.Context, start, end string, limit int) ([]kvPair, error) {
	kvs, err := t.s.scan(ctx, start, end, limit)
	if err != nil {
		return nil, err
	}
	for _, p := range kvs {
		t.cache[p.key] = p.val
		t.noteRead(p.key, p.val)
	}
	return kvs, nil
}

// scanRange is one range of scanMany.
type scanRange struct {
	start, end string
	limit      int
}

// scanMany runs scans in parallel (one round trip for all of them) and
// records their keys as read, in the order of rs.
func (t *tx) scanMany(ctx context.Context, rs []scanRange) ([][]kvPair, error) {
	out := make([][]kvPair, len(rs))
	errs := make([]error, len(rs))
	var wg sync.WaitGroup
	for i, r := range rs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			out[i], errs[i] = t.s.scan(ctx, r.start, r.end, r.limit)
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	for _, kvs := range out {
		for _, p := range kvs {
			t.cache[p.key] = p.val
			t.noteRead(p.key, p.val)
		}
	}
	return out, nil
}

func (t *tx) put(k string, v []byte) {
	if _, ok := t.wrote[k]; !ok {
		if _, read := t.reads[k]; !read {
			t.inserts = append(t.inserts, k)
		}
	}
	t.wrote[k] = val{v: v, found: true}
	t.ops = append(t.ops, &walshipv1.TxnOp{Op: &walshipv1.TxnOp_Put{Put: &walshipv1.PutOp{Key: k, Value: v}}})
}

func (t *tx) del(k string) {
	t.wrote[k] = val{}
	t.ops = append(t.ops, &walshipv1.TxnOp{Op: &walshipv1.TxnOp_Delete{Delete: &walshipv1.DeleteOp{Key: k}}})
}

// request builds the commit Txn: compares on the version of every key
// read and of every key inserted; on failure, get every key read.
func (t *tx) request() *walshipv1.TxnRequest {
	req := &walshipv1.TxnRequest{Success: t.ops, Policy: t.s.policy}
	req.Compares = make([]*walshipv1.Compare, 0, len(t.readKeys)+len(t.inserts))
	for _, k := range t.readKeys {
		req.Compares = append(req.Compares, versionIs(k, t.reads[k]))
	}
	for _, k := range t.inserts {
		req.Compares = append(req.Compares, versionIs(k, 0))
	}
	req.Failure = make([]*walshipv1.TxnOp, len(t.readKeys))
	for i, k := range t.readKeys {
		req.Failure[i] = getOp(k)
	}
	return req
}

func versionIs(k string, v uint64) *walshipv1.Compare {
	return &walshipv1.Compare{Key: k, Target: walshipv1.CompareTarget_COMPARE_TARGET_VERSION,
		Result: walshipv1.CompareResult_COMPARE_RESULT_EQUAL, Operand: &walshipv1.Compare_VersionLsn{VersionLsn: v}}
}

func getOp(k string) *walshipv1.TxnOp {
	return &walshipv1.TxnOp{Op: &walshipv1.TxnOp_Get{Get: &walshipv1.GetOp{Key: k}}}
}

// txnKind says what a transaction does with what it reads.
type txnKind int

const (
	// readWrite: reads feed writes whose version compares guard them, so
	// they may see pending writes (session.speculative).
	readWrite txnKind = iota
	// readOnly: read committed; commits without a round trip.
	readOnly
	// readOnlyValidated: serializable read-only; a Txn of compares checks
	// the reads at the end.
	readOnlyValidated
)

// run runs fn as an optimistic transaction until it commits, rolls back
// or aborts. A read-only transaction's reads wait for what they saw to be
// acknowledged, as any read shown to a user must.
func (s *session) run(ctx context.Context, kind txnKind, fn func(ctx context.Context, t *tx) error) error {
	validate := kind == readOnlyValidated
	t := &tx{s: s, cache: make(map[string]val), spec: s.speculative && kind == readWrite}
	for attempt := 0; ; attempt++ {
		t.reset()
		if err := fn(ctx, t); err != nil {
			return err
		}
		if len(t.ops) == 0 && !validate {
			return nil
		}
		req := t.request()
		req.Speculative = t.spec // a failed compare's reads return at once
		if n := len(req.Success) + len(req.Failure); n > maxOps || len(req.Compares) > maxOps {
			return fmt.Errorf("transaction too large: %d ops, %d compares", n, len(req.Compares))
		}
		resp, err := s.kv.Txn(ctx, req)
		if err != nil {
			return err
		}
		if resp.Succeeded {
			if len(t.ops) > 0 {
				s.lastLSN = max(s.lastLSN, resp.Lsn)
			}
			return nil
		}
		for i, r := range resp.Results {
			g := r.GetGet()
			t.cache[t.readKeys[i]] = val{v: g.GetValue(), ver: g.GetVersionLsn(), found: g.GetFound()}
		}
		if attempt >= s.maxRetries {
			return errAborted
		}
		s.retries.Add(1)
	}
}

// fetch reads keys: on the primary in one read-only Txn (a consistent
// snapshot that includes every commit sequenced before it, so hot rows
// are rarely stale; speculative: without waiting for those commits'
// acknowledgements); on a replica with Gets in parallel at min_lsn.
func (s *session) fetch(ctx context.Context, keys []string, speculative bool) ([]val, error) {
	out := make([]val, len(keys))
	if s.read == nil {
		for lo := 0; lo < len(keys); lo += maxOps {
			hi := min(lo+maxOps, len(keys))
			req := &walshipv1.TxnRequest{Success: make([]*walshipv1.TxnOp, 0, hi-lo), Speculative: speculative}
			for _, k := range keys[lo:hi] {
				req.Success = append(req.Success, getOp(k))
			}
			resp, err := s.kv.Txn(ctx, req)
			if err != nil {
				return nil, err
			}
			for i, r := range resp.Results {
				g := r.GetGet()
				out[lo+i] = val{v: g.GetValue(), ver: g.GetVersionLsn(), found: g.GetFound()}
			}
		}
		return out, nil
	}
	if len(keys) == 1 {
		r, err := s.read.Get(ctx, &walshipv1.GetRequest{Key: keys[0], MinLsn: s.lastLSN})
		if err != nil {
			return nil, err
		}
		out[0] = val{v: r.Value, ver: r.VersionLsn, found: r.Found}
		return out, nil
	}
	var (
		wg       sync.WaitGroup
		mu       sync.Mutex
		firstErr error
	)
	for i, k := range keys {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r, err := s.read.Get(ctx, &walshipv1.GetRequest{Key: k, MinLsn: s.lastLSN})
			if err != nil {
				mu.Lock()
				firstErr = cmpOr(firstErr, err)
				mu.Unlock()
				return
			}
			out[i] = val{v: r.Value, ver: r.VersionLsn, found: r.Found}
		}()
	}
	wg.Wait()
	if firstErr != nil {
		return nil, firstErr
	}
	return out, nil
}

func cmpOr(a, b error) error {
	if a != nil {
		return a
	}
	return b
}

// scan reads a range from the primary, or from the replica at min_lsn.
func (s *session) scan(ctx context.Context, start, end string, limit int) ([]kvPair, error) {
	c, minLSN := s.kv, uint64(0)
	if s.read != nil {
		c, minLSN = s.read, s.lastLSN
	}
	resp, err := c.Scan(ctx, &walshipv1.ScanRequest{Start: start, End: end, Limit: uint32(limit), MinLsn: minLSN})
	if err != nil {
		return nil, err
	}
	out := make([]kvPair, len(resp.Kvs))
	for i, p := range resp.Kvs {
		out[i] = kvPair{key: p.Key, val: val{v: p.Value, ver: p.VersionLsn, found: true}}
	}
	return out, nil
}

// prefixEnd is the first key after every key starting with prefix.
func prefixEnd(prefix string) string {
	b := []byte(prefix)
	for i := len(b) - 1; i >= 0; i-- {
		if b[i] < 0x7f {
			b[i]++
			return string(b[:i+1])
		}
	}
	return ""
}
