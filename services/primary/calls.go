package primary

import (
	"context"
	"fmt"
	"sync"
	"time"

	walshipv1 "github.com/walship/walship/gen/walship/v1"
	"github.com/walship/walship/internal/keyspace"
	"github.com/walship/walship/internal/kvpipe"
	"github.com/walship/walship/internal/rpcerr"
	"github.com/walship/walship/internal/state"
	"github.com/walship/walship/pkg/codec"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
)

// A call is one KV call that may write (Put, Delete, Txn), from its
// arrival to its answer, in three steps: prepare (validation, the
// serving and taking-writes checks, admission, the policy), run with
// others (runCalls: sequenced under one hold of the sequencer, then
// awaited and made visible together) and answer (response).
//
// A unary call is run alone. A Pipeline message's writes are run as one
// group (RunWrites): the worker that runs them sequences them all, then
// waits for their verdicts in LSN order — the order in which they become
// visible anyway — instead of one goroutine, one sequencer hold, one
// wake-up and one apply per write. Each keeps its own policy, LSN and
// outcome: a group is what the same calls, sequenced one after the other
// with nothing in between, would be.
type call struct {
	ctx context.Context
	// kind is the request's: codec.OpPut, codec.OpDelete, or opGet for a
	// Txn.
	kind        codec.Op
	pol         Policy
	cmps        []state.Compare
	success     []op
	failure     []op
	speculative bool
	held        admitted
	start       time.Time
	// one holds the op of a Put or a Delete: success is one[:].
	one [1]op
	// oneResult holds the result of a branch of one op.
	oneResult [1]opResult

	// err is the call's answer if it failed before it was sequenced, or
	// was refused when sequenced: returned as it is.
	err error
	// res is the sequenced result; t the sequenced transaction (nil for
	// reads only).
	res execResult
	t   *txn
	// awaitErr is what waiting for t's policy gave; lost, that t will
	// not become visible here (it never reached the WAL, or visibility
	// stopped): there is nothing to resolve or wait for.
	awaitErr error
	lost     bool
	// answered: finished and answered (runCalls).
	answered bool
}

// preparePut prepares a Put; c.held is the caller's to release, error
// or not.
func (s *Server) preparePut(ctx context.Context, req *walshipv1.PutRequest, c *call) error {
	if err := keyspace.ValidateKey("key", req.GetKey()); err != nil {
		return err
	}
	if err := s.validateValue("value", req.GetValue()); err != nil {
		return err
	}
	return s.prepareOne(ctx, req, op{kind: codec.OpPut, key: req.GetKey(), value: req.GetValue()}, req.GetPolicy(), c)
}

// prepareDelete prepares a Delete, as preparePut a Put.
func (s *Server) prepareDelete(ctx context.Context, req *walshipv1.DeleteRequest, c *call) error {
	if err := keyspace.ValidateKey("key", req.GetKey()); err != nil {
		return err
	}
	return s.prepareOne(ctx, req, op{kind: codec.OpDelete, key: req.GetKey()}, req.GetPolicy(), c)
}

// prepareOne prepares the write o of req (a Put or a Delete, validated)
// under policy p: the taking-writes check, admission, the policy.
func (s *Server) prepareOne(ctx context.Context, req proto.Message, o op, p *walshipv1.CommitPolicy, c *call) error {
	if err := s.takingWrite(); err != nil {
		return err
	}
	var err error
	if c.held, err = s.admit.admit(ctx, proto.Size(req)); err != nil {
		return err
	}
	c.kind = o.kind
	c.one[0] = o
	c.success = c.one[:]
	return s.preparePolicy(ctx, p, c)
}

// prepareTxn prepares a Txn, as preparePut a Put; one that only reads is
// checked as a read (serving) and not admitted.
func (s *Server) prepareTxn(ctx context.Context, req *walshipv1.TxnRequest, c *call) error {
	if n := len(req.GetSuccess()) + len(req.GetFailure()); n > s.cfg.MaxTxnOps {
		return rpcerr.Invalid("success", "%d ops in success and failure together, the limit is %d", n, s.cfg.MaxTxnOps)
	}
	if n := len(req.GetCompares()); n > s.cfg.MaxTxnOps {
		return rpcerr.Invalid("compares", "%d compares, the limit is %d", n, s.cfg.MaxTxnOps)
	}
	cmps := make([]state.Compare, len(req.GetCompares()))
	for i, cmp := range req.GetCompares() {
		var err error
		if cmps[i], err = convertCompare(cmp); err != nil {
			return within(fmt.Sprintf("compares[%d]", i), err)
		}
	}
	success, err := s.convertOps("success", req.GetSuccess())
	if err != nil {
		return err
	}
	failure, err := s.convertOps("failure", req.GetFailure())
	if err != nil {
		return err
	}
	writing := writes(success) || writes(failure)
	check := s.serving
	if writing {
		check = s.takingWrite
	}
	if err := check(); err != nil {
		return err
	}
	if writing {
		if c.held, err = s.admit.admit(ctx, proto.Size(req)); err != nil {
			return err
		}
	}
	c.kind, c.cmps, c.success, c.failure, c.speculative = opGet, cmps, success, failure, req.GetSpeculative()
	return s.preparePolicy(ctx, req.GetPolicy(), c)
}

// preparePolicy sets c's policy (the primary's, merged with the
// request's p) and its start, once it is known that c's caller still
// waits.
func (s *Server) preparePolicy(ctx context.Context, p *walshipv1.CommitPolicy, c *call) error {
	if err := validatePolicyEnums(p); err != nil {
		return err
	}
	pol, err := s.policy.Load().Merge(p)
	if err != nil {
		return rpcerr.Invalid("policy", "%v", err)
	}
	if err := s.checkSyncReplicas(pol); err != nil {
		return rpcerr.Invalid("policy", "%v", err)
	}
	if err := ctx.Err(); err != nil {
		return status.FromContextError(err).Err()
	}
	c.ctx, c.pol, c.start = ctx, pol, time.Now()
	return nil
}

// result is c's outcome once answered: its result, or its error as the
// unary call returns it.
func (c *call) result() (execResult, error) {
	if c.err != nil {
		return execResult{}, c.err
	}
	return c.res, nil
}

// response is c's answer as its unary call gives it.
func (c *call) response() (proto.Message, error) {
	res, err := c.result()
	if err != nil {
		return nil, err
	}
	switch c.kind {
	case codec.OpPut:
		return &walshipv1.PutResponse{Lsn: res.lsn}, nil
	case codec.OpDelete:
		return &walshipv1.DeleteResponse{Lsn: res.lsn, Existed: res.results[0].existed}, nil
	}
	resp := &walshipv1.TxnResponse{Succeeded: res.succeeded, Lsn: res.lsn, Results: make([]*walshipv1.TxnOpResult, len(res.results))}
	for i, r := range res.results {
		switch r.kind {
		case codec.OpPut:
			resp.Results[i] = &walshipv1.TxnOpResult{Result: &walshipv1.TxnOpResult_Put{Put: &walshipv1.PutOpResult{}}}
		case codec.OpDelete:
			resp.Results[i] = &walshipv1.TxnOpResult{Result: &walshipv1.TxnOpResult_Delete{Delete: &walshipv1.DeleteOpResult{Existed: r.existed}}}
		default:
			resp.Results[i] = &walshipv1.TxnOpResult{Result: &walshipv1.TxnOpResult_Get{Get: &walshipv1.GetOpResult{Found: r.found, Value: r.value, VersionLsn: r.version}}}
		}
	}
	return resp, nil
}

// RunWrites runs a Pipeline message's writes as one group
// (kvpipe.Grouper): each is prepared as its unary call is, then they
// are run together (runCalls) and each is answered as soon as it is
// done, in order.
func (k *kvServer) RunWrites(ws []kvpipe.Write, done func(i int, resp proto.Message, err error)) {
	kept := takeCalls(len(ws))
	defer keepCalls(kept)
	calls := *kept
	for i, w := range ws {
		c := &calls[i]
		switch x := w.Req.GetOp().(type) {
		case *walshipv1.PipelineRequest_Put:
			c.err = k.s.preparePut(w.Ctx, x.Put, c)
		case *walshipv1.PipelineRequest_Delete:
			c.err = k.s.prepareDelete(w.Ctx, x.Delete, c)
		case *walshipv1.PipelineRequest_Txn:
			c.err = k.s.prepareTxn(w.Ctx, x.Txn, c)
		default:
			c.err = rpcerr.Invalid("op", "not a put, delete or txn")
		}
	}
	k.s.runCalls(calls, func(i int) {
		c := &calls[i]
		c.held.release()
		resp, err := c.response()
		done(i, resp, err)
	})
}

// callsKept are the calls of finished runs, for the next: a call is
// some 350 bytes, a seventh of what a pipelined Put allocated, and a
// unary call's largest allocation.
var callsKept = sync.Pool{New: func() any { return new([]call) }}

// takeCalls returns n zero calls, kept or new, for keepCalls once
// nothing refers to them.
func takeCalls(n int) *[]call {
	p := callsKept.Get().(*[]call)
	if cap(*p) < n {
		*p = make([]call, n)
	}
	*p = (*p)[:n]
	return p
}

// keepCalls zeroes calls and keeps them for a later takeCalls.
func keepCalls(p *[]call) {
	clear(*p)
	callsKept.Put(p)
}

// runCalls runs calls, prepared (one that failed already has its err):
// they are sequenced in order under one hold of the sequencer, and
// answer(i) is called once calls[i] is done (its result set). A call
// that failed, or a branch of reads with nothing to wait for, is
// answered at once; the writes are awaited and answered in order. A
// transaction that needs no wait beyond what its verdict already gave is
// resolved together with the ones before it; before waiting for a
// verdict not in yet, or for replicas and log stores, the calls before
// are resolved and answered once visible, so that none waits for a
// later one's fsync or peers.
//
// A write is answered once its policy is met and it is visible: the
// answer to a writer is what makes a later read see its write, so no
// writer hears back before every transaction ahead of it in the log has
// resolved (met its policy or failed) and the visible LSN has reached
// its own. A commit behind one that waits for more (a replica, a log
// store, an fsync it did not ask for) thus waits too: visibility is in
// LSN order, and so are the answers.
//
// A sequenced transaction is awaited even once its caller's context
// ends: it is in the log and must resolve for later ones to become
// visible. The wait for replicas and log stores is bounded by the
// policy's sync timeout; the wait for its own write and fsync is not (a
// disk that hangs hangs its commits; one that fails fails them).
func (s *Server) runCalls(calls []call, answer func(int)) {
	s.pipe.sequenceCalls(calls)
	r := callRun{s: s, calls: calls, answer: answer}
	for i := range calls {
		if c := &calls[i]; c.t == nil && r.answersAtOnce(c) {
			r.finishAndAnswer(i)
		}
	}
	for i := range calls {
		c := &calls[i]
		t := c.t
		if t == nil {
			continue
		}
		if r.resolved < i && (!t.decided.Load() || t.policy.waitsForPeers()) {
			r.resolveTo(i)
			r.answerTo(i)
		}
		t.local.Wait()
		if err := t.localErr; err != nil {
			// The WAL is broken, or the primary deposed; nothing after
			// this becomes visible here.
			c.lost = true
			c.awaitErr = fmt.Errorf("%w: commit LSN %d: outcome unknown: %v", rpcerr.ErrUnavailable, t.commitLSN, err)
			continue
		}
		c.awaitErr = s.pipe.awaitPeers(t)
	}
	r.resolveTo(len(calls))
	r.answerTo(len(calls))
}

// callRun is runCalls' progress through its calls.
type callRun struct {
	s      *Server
	calls  []call
	answer func(int) // nil: none
	// calls[:resolved] are resolved (those with a transaction that
	// reached the WAL), calls[:answered] answered (and some after).
	resolved int
	answered int
	// graceEnd ends the wait for a closed gate of every call here
	// (stillPrimary): set by the first that waits.
	graceEnd time.Time
}

// resolveTo resolves the transactions of calls[r.resolved:to] (those
// that reached the WAL).
func (r *callRun) resolveTo(to int) {
	cs := r.calls[r.resolved:to]
	r.resolved = to
	err := r.s.pipe.resolve(cs)
	if err == nil {
		return
	}
	for i := range cs {
		if c := &cs[i]; c.resolvable() {
			c.awaitErr = fmt.Errorf("%w: commit LSN %d is in the log but the primary stopped making commits visible: %v", rpcerr.ErrUnavailable, c.t.commitLSN, err)
			c.lost = true
		}
	}
}

// resolvable reports whether c has a transaction to resolve.
func (c *call) resolvable() bool { return c.t != nil && !c.lost }

// answerTo finishes and answers, in order, the calls of
// calls[r.answered:to] not answered yet, each once its commit is visible.
func (r *callRun) answerTo(to int) {
	for ; r.answered < to; r.answered++ {
		if !r.calls[r.answered].answered {
			r.finishAndAnswer(r.answered)
		}
	}
}

// finishAndAnswer finishes calls[i] and answers it.
func (r *callRun) finishAndAnswer(i int) {
	c := &r.calls[i]
	r.finish(c)
	c.answered = true
	if r.answer != nil {
		r.answer(i)
	}
}

// answersAtOnce reports whether c, without a transaction, is answered
// without waiting: it failed, or its reads need nothing visible that is
// not already.
func (r *callRun) answersAtOnce(c *call) bool {
	return c.err != nil || c.speculative || r.s.pipe.visible.Load() >= c.res.lsn
}

// finish sets c's outcome, once resolved: a branch of reads once what
// it read is visible, a write once it is (and observed in the commit
// metrics).
func (r *callRun) finish(c *call) {
	s := r.s
	if c.err != nil {
		return
	}
	t := c.t
	if t == nil {
		c.err = s.answerReads(c.ctx, c.res.lsn, c.speculative)
		return
	}
	err := c.awaitErr
	if !c.lost && t.shown != nil {
		select {
		case <-t.shown:
		case <-s.pipe.failed:
			err = fmt.Errorf("%w: commit LSN %d is in the log, but the primary failed before an earlier commit was acknowledged: its outcome is unknown", rpcerr.ErrUnavailable, t.commitLSN)
		}
	}
	if err == nil {
		err = s.stillPrimary(c.ctx, t.commitLSN, &r.graceEnd)
	}
	s.metrics.observeCommit(c.pol, err, time.Since(c.start))
	if err != nil {
		c.err = rpcerr.Status(err)
		return
	}
	c.res.lsn = t.commitLSN
}
