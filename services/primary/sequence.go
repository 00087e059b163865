package primary

import (
	"fmt"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/walship/walship/internal/kvread"
	"github.com/walship/walship/internal/rpcerr"
	"github.com/walship/walship/internal/state"
	"github.com/walship/walship/pkg/codec"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// txn is one sequenced transaction on its way through the pipeline.
type txn struct {
	recs      []codec.Record // puts/deletes then one commit record
	commitLSN uint64
	policy    Policy
	// local is done once the writer's verdict is in localErr, once
	// (decide): nil once the txn is in the WAL (synced if
	// policy.needsLocalSync()), else the WAL's error. A WaitGroup kept
	// in the txn rather than a channel: one allocation per transaction
	// fewer, and its writer is the only one to wait.
	local    sync.WaitGroup
	localErr error // written before local's Done, read after its Wait
	decided  atomic.Bool
	start    time.Time
	// commitTime is its batch's commit time (set by encode, before the
	// write, read after await's Wait).
	commitTime int64
	resolved   bool // guarded by pipeline.visMu
	// shown is closed once commitLSN is visible, for a writer that resolved
	// before an earlier transaction did (nil until then). Guarded by visMu.
	shown chan struct{}
	// inline holds recs for a transaction of one write (a Put, a
	// Delete) and its commit: no allocation of their own.
	inline [2]codec.Record
}

// decide delivers t's verdict. Only the first counts: when the WAL fails,
// the committer and the syncer may both fail the same transaction.
func (t *txn) decide(err error) {
	if t.decided.CompareAndSwap(false, true) {
		t.localErr = err
		t.local.Done()
	}
}

func (t *txn) bytes() int {
	n := 0
	for i := range t.recs {
		n += len(t.recs[i].Key) + len(t.recs[i].Value) + 16
	}
	return n
}

// errStopping is returned to writes that arrive during a graceful stop.
var errStopping = fmt.Errorf("%w: primary is shutting down", rpcerr.ErrUnavailable)

// sequenceCalls sequences calls, in order, under one hold of seqMu:
// each that has not failed yet (c.err) gets its result, and its txn if
// it writes, or its refusal in c.err.
func (p *pipeline) sequenceCalls(calls []call) {
	p.seqMu.Lock()
	defer p.seqMu.Unlock()
	refusal := p.refusalLocked()
	for i := range calls {
		c := &calls[i]
		if c.err != nil {
			continue
		}
		if refusal != nil {
			c.err = refusal
			continue
		}
		c.res, c.t, c.err = p.sequenceLocked(c.pol, c.cmps, c.success, c.failure, c.start, &c.oneResult)
	}
}

// refusalLocked is why sequenceCalls refuses every transaction now, or
// nil.
func (p *pipeline) refusalLocked() error {
	switch {
	case p.broken != nil:
		return notServing("primary cannot commit: %v", p.broken)
	case p.stopping:
		return notServing("%v", errStopping)
	case p.handover.Load():
		return notServing("primary is handing over to another node (switchover)")
	}
	return nil
}

// sequenceLocked runs one transaction at the sequenced state: the newest
// write of every key, acknowledged or not. Its compares pick the branch.
// A branch with writes becomes a txn, queued for its writer; the caller
// awaits it. A branch of reads only returns no txn, and in res.lsn the
// LSN that must be visible before its results may be returned: the
// newest write they saw (the compares' outcome says what their keys
// held, so the writes behind them count as read), or the visible LSN if
// none is in flight — at which those keys hold what they hold at the
// sequenced state. Called with seqMu held. one holds the result of a
// branch of one op (no allocation of its own).
func (p *pipeline) sequenceLocked(pol Policy, cmps []state.Compare, success, failure []op, start time.Time, one *[1]opResult) (res execResult, t *txn, err error) {
	res.succeeded = true
	for i := range cmps {
		if !cmps[i].Eval(p.overlay) {
			res.succeeded = false
			break
		}
	}
	ops, budget := success, readBudget{branch: "success"}
	if !res.succeeded {
		ops, budget.branch = failure, "failure"
	}
	writes := 0
	for _, o := range ops {
		if o.kind != opGet {
			writes++
		}
	}
	if len(ops) == 1 {
		res.results = one[:]
	} else {
		res.results = make([]opResult, len(ops))
	}
	if writes == 0 {
		return res, nil, p.readLocked(&res, cmps, ops, &budget)
	}
	t, err = p.stageLocked(&res, pol, ops, writes, start, &budget)
	return res, t, err
}

// maxTxnReadBytes bounds the values one Txn's gets return, as
// kvread.MaxScanBytes bounds a Scan's page: a response is marshalled and
// held until the peer takes it, so its size times the calls in progress
// is what the primary holds. A single get may return one value of any
// size.
const maxTxnReadBytes = kvread.MaxScanBytes

// readBudget counts the value bytes a branch's gets return, before any
// response is built: one 1 MiB value read by 1,000 gets would otherwise
// have the primary build (and marshal) a 1 GiB response, only for gRPC to
// refuse to send it.
type readBudget struct {
	branch string // success or failure
	gets   int
	total  int
}

// add counts the value the get at ops[i] returns. Past the budget it
// refuses the transaction with RESOURCE_EXHAUSTED naming that get: the
// request is well-formed, and the same one reading smaller values would
// pass (what exceeds is the response, whose size depends on the data).
func (b *readBudget) add(i int, v []byte) error {
	b.gets++
	b.total += len(v)
	if b.gets == 1 || b.total <= maxTxnReadBytes {
		return nil
	}
	return status.Errorf(codes.ResourceExhausted, "%s[%d].get: the values this Txn reads reach %d bytes, more than one Txn response carries (%d); read them with fewer gets per Txn",
		b.branch, i, b.total, maxTxnReadBytes)
}

// readLocked answers a branch of reads only at the sequenced state.
func (p *pipeline) readLocked(res *execResult, cmps []state.Compare, ops []op, budget *readBudget) error {
	res.lsn = p.visible.Load()
	for i := range cmps {
		_, _, _, after := p.overlay.Read(cmps[i].Key)
		res.lsn = max(res.lsn, after)
	}
	for i, o := range ops {
		v, ver, ok, after := p.overlay.Read([]byte(o.key))
		if err := budget.add(i, v); err != nil {
			return err
		}
		res.results[i] = opResult{kind: opGet, found: ok, value: v, version: ver}
		res.lsn = max(res.lsn, after)
	}
	return nil
}

// stageLocked turns ops (writes among them) into a txn: LSNs assigned,
// reads answered from its own earlier writes and the overlay, records
// staged in the overlay, the txn queued for its writer. A read past the
// budget refuses the txn before anything is staged.
func (p *pipeline) stageLocked(res *execResult, pol Policy, ops []op, writes int, start time.Time, budget *readBudget) (*txn, error) {
	t := &txn{policy: pol, start: start}
	t.local.Add(1)
	first := p.nextLSN
	t.commitLSN = first + uint64(writes)
	txnID := p.nextTxn
	view := txnView{base: p.overlay}
	if writes+1 <= len(t.inline) {
		t.recs = t.inline[:0]
	} else {
		t.recs = make([]codec.Record, 0, writes+1)
	}
	for i, o := range ops {
		r := &res.results[i]
		r.kind = o.kind
		switch o.kind {
		case codec.OpPut:
			t.recs = append(t.recs, codec.Record{LSN: first + uint64(len(t.recs)), TxnID: txnID, Op: codec.OpPut, Key: keyBytes(o.key), Value: o.value})
			if i < len(ops)-1 {
				view.set(o.key, opResult{found: true, value: o.value, version: t.commitLSN}, len(ops))
			}
		case codec.OpDelete:
			_, _, r.existed = view.get(o.key)
			t.recs = append(t.recs, codec.Record{LSN: first + uint64(len(t.recs)), TxnID: txnID, Op: codec.OpDelete, Key: keyBytes(o.key)})
			if i < len(ops)-1 {
				view.set(o.key, opResult{}, len(ops))
			}
		default:
			r.value, r.version, r.found = view.get(o.key)
			if err := budget.add(i, r.value); err != nil {
				return nil, err
			}
		}
	}
	t.recs = append(t.recs, codec.Record{LSN: t.commitLSN, TxnID: txnID, Op: codec.OpCommit})
	p.nextLSN = t.commitLSN + 1
	p.nextTxn++
	p.overlay.Stage(t.recs)
	p.enqueueLocked(t)
	return t, nil
}

// keyBytes is k's bytes, not copied: a record's key is only read (the
// WAL's encoding, the overlay, which keeps it, the store's apply, which
// copies it, the watch feed), and the request's string never changes.
func keyBytes(k string) []byte { return unsafe.Slice(unsafe.StringData(k), len(k)) }

// txnView is what a transaction's own ops read: its earlier writes, then
// every sequenced write (the overlay). Only a write that a later op of
// the same transaction may read is kept in local, made on the first such
// write: a single Put or Delete, the common request, allocates no map.
type txnView struct {
	base  *state.Overlay
	local map[string]opResult
}

// set records the write of op key for the ops after it; ops is the
// transaction's op count, a bound on the keys it writes.
func (v *txnView) set(key string, r opResult, ops int) {
	if v.local == nil {
		v.local = make(map[string]opResult, ops)
	}
	v.local[key] = r
}

func (v *txnView) get(key string) (value []byte, version uint64, ok bool) {
	if r, found := v.local[key]; found {
		return r.value, r.version, r.found
	}
	return v.base.Get([]byte(key))
}

// enqueueLocked hands a sequenced transaction to its writer: the syncer,
// which writes it with the rest of its group right before their fsync, if
// it needs one; the committer, which writes it at once, if not. Called with
// seqMu held.
func (p *pipeline) enqueueLocked(t *txn) {
	p.queue = append(p.queue, t)
	p.visMu.Lock()
	p.unresolved = append(p.unresolved, t)
	p.visMu.Unlock()
	if t.policy.needsLocalSync() {
		p.queuedSync.Add(1)
		poke(p.wakeSyncer)
		return
	}
	poke(p.wakeCommitter)
}

// takeQueue takes every queued transaction, leaving spare (emptied) in its
// place. Only the committer calls it, and writes them before it takes the
// queue again, so that entries reach the WAL in LSN order.
func (p *pipeline) takeQueue(spare []*txn) []*txn {
	p.seqMu.Lock()
	defer p.seqMu.Unlock()
	q := p.queue
	p.queue = spare[:0]
	p.queuedSync.Store(0)
	return q
}
