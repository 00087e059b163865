package primary

import (
	"context"
	"fmt"
	"time"

	walshipv1 "github.com/walship/walship/gen/walship/v1"
	"github.com/walship/walship/internal/kvapi"
	"github.com/walship/walship/internal/rpcerr"
	"github.com/walship/walship/internal/state"
	"github.com/walship/walship/pkg/codec"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// kvServer is the primary's KVService.
type kvServer struct {
	walshipv1.UnimplementedKVServiceServer
	s *Server
}

func (k *kvServer) Get(ctx context.Context, req *walshipv1.GetRequest) (*walshipv1.GetResponse, error) {
	if err := k.s.serving(); err != nil {
		return nil, err
	}
	resp, err := k.s.reads.Get(ctx, req)
	if err == nil {
		// Read under the lease: a deposed primary's reads could be stale.
		err = k.s.serving()
	}
	if err != nil {
		return nil, err
	}
	return resp, nil
}

func (k *kvServer) Scan(ctx context.Context, req *walshipv1.ScanRequest) (*walshipv1.ScanResponse, error) {
	if err := k.s.serving(); err != nil {
		return nil, err
	}
	resp, err := k.s.reads.Scan(ctx, req)
	if err == nil {
		err = k.s.serving()
	}
	if err != nil {
		return nil, err
	}
	return resp, nil
}

func (k *kvServer) Put(ctx context.Context, req *walshipv1.PutRequest) (*walshipv1.PutResponse, error) {
	if err := kvapi.ValidateKey("key", req.GetKey()); err != nil {
		return nil, err
	}
	if err := k.s.validateValue("value", req.GetValue()); err != nil {
		return nil, err
	}
	if err := k.s.serving(); err != nil {
		return nil, err
	}
	res, err := k.s.exec(ctx, req.GetPolicy(), nil, []op{{kind: codec.OpPut, key: req.GetKey(), value: req.GetValue()}})
	if err != nil {
		return nil, err
	}
	return &walshipv1.PutResponse{Lsn: res.lsn}, nil
}

func (k *kvServer) Delete(ctx context.Context, req *walshipv1.DeleteRequest) (*walshipv1.DeleteResponse, error) {
	if err := kvapi.ValidateKey("key", req.GetKey()); err != nil {
		return nil, err
	}
	if err := k.s.serving(); err != nil {
		return nil, err
	}
	res, err := k.s.exec(ctx, req.GetPolicy(), nil, []op{{kind: codec.OpDelete, key: req.GetKey()}})
	if err != nil {
		return nil, err
	}
	return &walshipv1.DeleteResponse{Lsn: res.lsn, Existed: res.results[0].existed}, nil
}

func (k *kvServer) Txn(ctx context.Context, req *walshipv1.TxnRequest) (*walshipv1.TxnResponse, error) {
	if n := len(req.GetSuccess()) + len(req.GetFailure()); n > k.s.cfg.MaxTxnOps {
		return nil, rpcerr.Invalid("success", "%d ops in success and failure together, the limit is %d", n, k.s.cfg.MaxTxnOps)
	}
	if n := len(req.GetCompares()); n > k.s.cfg.MaxTxnOps {
		return nil, rpcerr.Invalid("compares", "%d compares, the limit is %d", n, k.s.cfg.MaxTxnOps)
	}
	cmps := make([]state.Compare, len(req.GetCompares()))
	for i, c := range req.GetCompares() {
		var err error
		if cmps[i], err = convertCompare(fmt.Sprintf("compares[%d]", i), c); err != nil {
			return nil, err
		}
	}
	success, err := k.s.convertOps("success", req.GetSuccess())
	if err != nil {
		return nil, err
	}
	failure, err := k.s.convertOps("failure", req.GetFailure())
	if err != nil {
		return nil, err
	}
	if err := k.s.serving(); err != nil {
		return nil, err
	}
	res, err := k.s.execTxn(ctx, req.GetPolicy(), cmps, success, failure, req.GetSpeculative())
	if err != nil {
		return nil, err
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

// opGet is the kind of a read inside a Txn (not a WAL op).
const opGet codec.Op = 0

// op is one validated operation of a transaction.
type op struct {
	kind  codec.Op // OpPut, OpDelete or opGet
	key   string
	value []byte
}

type opResult struct {
	kind    codec.Op
	existed bool // delete
	found   bool // get
	value   []byte
	version uint64
}

type execResult struct {
	succeeded bool
	lsn       uint64
	results   []opResult
}

func (s *Server) validateValue(field string, v []byte) error {
	if len(v) > s.cfg.MaxValueBytes {
		return rpcerr.Invalid(field, "%d bytes, the limit is %d (--max-value-bytes)", len(v), s.cfg.MaxValueBytes)
	}
	return nil
}

func (s *Server) convertOps(field string, in []*walshipv1.TxnOp) ([]op, error) {
	out := make([]op, len(in))
	for i, o := range in {
		f := fmt.Sprintf("%s[%d]", field, i)
		switch x := o.GetOp().(type) {
		case *walshipv1.TxnOp_Put:
			if err := kvapi.ValidateKey(f+".put.key", x.Put.GetKey()); err != nil {
				return nil, err
			}
			if err := s.validateValue(f+".put.value", x.Put.GetValue()); err != nil {
				return nil, err
			}
			out[i] = op{kind: codec.OpPut, key: x.Put.GetKey(), value: x.Put.GetValue()}
		case *walshipv1.TxnOp_Delete:
			if err := kvapi.ValidateKey(f+".delete.key", x.Delete.GetKey()); err != nil {
				return nil, err
			}
			out[i] = op{kind: codec.OpDelete, key: x.Delete.GetKey()}
		case *walshipv1.TxnOp_Get:
			if err := kvapi.ValidateKey(f+".get.key", x.Get.GetKey()); err != nil {
				return nil, err
			}
			out[i] = op{kind: opGet, key: x.Get.GetKey()}
		default:
			return nil, rpcerr.Invalid(f, "no op set (want put, delete or get)")
		}
	}
	return out, nil
}

func convertCompare(field string, c *walshipv1.Compare) (state.Compare, error) {
	if err := kvapi.ValidateKey(field+".key", c.GetKey()); err != nil {
		return state.Compare{}, err
	}
	out := state.Compare{Key: []byte(c.GetKey())}
	switch c.GetResult() {
	case walshipv1.CompareResult_COMPARE_RESULT_EQUAL:
		out.Result = state.Equal
	case walshipv1.CompareResult_COMPARE_RESULT_NOT_EQUAL:
		out.Result = state.NotEqual
	case walshipv1.CompareResult_COMPARE_RESULT_LESS:
		out.Result = state.Less
	case walshipv1.CompareResult_COMPARE_RESULT_GREATER:
		out.Result = state.Greater
	default:
		return out, rpcerr.Invalid(field+".result", "%v is not EQUAL, NOT_EQUAL, LESS or GREATER", c.GetResult())
	}
	switch c.GetTarget() {
	case walshipv1.CompareTarget_COMPARE_TARGET_VALUE:
		v, ok := c.GetOperand().(*walshipv1.Compare_Value)
		if !ok {
			return out, rpcerr.Invalid(field+".value", "required for target VALUE")
		}
		out.Target, out.Value = state.TargetValue, v.Value
	case walshipv1.CompareTarget_COMPARE_TARGET_VERSION:
		v, ok := c.GetOperand().(*walshipv1.Compare_VersionLsn)
		if !ok {
			return out, rpcerr.Invalid(field+".version_lsn", "required for target VERSION")
		}
		out.Target, out.Version = state.TargetVersion, v.VersionLsn
	case walshipv1.CompareTarget_COMPARE_TARGET_EXISTS:
		v, ok := c.GetOperand().(*walshipv1.Compare_Exists)
		if !ok {
			return out, rpcerr.Invalid(field+".exists", "required for target EXISTS")
		}
		out.Target, out.Exists = state.TargetExists, v.Exists
	default:
		return out, rpcerr.Invalid(field+".target", "%v is not VALUE, VERSION or EXISTS", c.GetTarget())
	}
	if err := out.Validate(); err != nil {
		return out, rpcerr.Invalid(field+".result", "%v", err)
	}
	return out, nil
}

// exec runs ops unconditionally.
func (s *Server) exec(ctx context.Context, p *walshipv1.CommitPolicy, cmps []state.Compare, ops []op) (execResult, error) {
	return s.execTxn(ctx, p, cmps, ops, nil, false)
}

// txnView is what a transaction's own ops read: its earlier writes, then
// every sequenced write (the overlay).
type txnView struct {
	base  *state.Overlay
	local map[string]*opResult
}

func (v *txnView) get(key string) (value []byte, version uint64, ok bool) {
	if r, found := v.local[key]; found {
		return r.value, r.version, r.found
	}
	return v.base.Get([]byte(key))
}

// execTxn sequences a transaction. One with writes answers once its
// policy is met and its commit is visible (await), which every write it
// read or compared, being sequenced before it, then is too. One without
// waits until the writes it read or compared are visible, unless it is
// speculative (TxnRequest.speculative): a response never carries a write
// whose writer has not been answered, whichever branch runs and whatever
// the policies are.
func (s *Server) execTxn(ctx context.Context, p *walshipv1.CommitPolicy, cmps []state.Compare, success, failure []op, speculative bool) (execResult, error) {
	if err := kvapi.ValidatePolicy(p); err != nil {
		return execResult{}, err
	}
	pol, err := s.policy.Load().Merge(p)
	if err != nil {
		return execResult{}, rpcerr.Invalid("policy", "%v", err)
	}
	if err := ctx.Err(); err != nil {
		return execResult{}, status.FromContextError(err).Err()
	}
	start := time.Now()

	s.seqMu.Lock()
	switch {
	case s.broken != nil:
		s.seqMu.Unlock()
		return execResult{}, notServing("primary cannot commit: %v", s.broken)
	case s.stopping:
		s.seqMu.Unlock()
		return execResult{}, notServing("%v", errStopping)
	case s.handover.Load():
		// Checked under seqMu: Switchover reads the last LSN under it, so
		// nothing is sequenced after the LSN the target must have flushed.
		s.seqMu.Unlock()
		return execResult{}, notServing("primary is handing over to another node (switchover)")
	}
	res := execResult{succeeded: true}
	for i := range cmps {
		if !cmps[i].Eval(s.overlay) {
			res.succeeded = false
			break
		}
	}
	ops := success
	if !res.succeeded {
		ops = failure
	}
	writes := 0
	for _, o := range ops {
		if o.kind != opGet {
			writes++
		}
	}
	if writes == 0 {
		// Reads only: compares and reads ran at the sequenced state (the
		// newest write of each key, acknowledged or not); wait until the
		// writes they saw are visible, so nothing unacknowledged leaks.
		// Only those: a transaction over keys no in-flight transaction
		// wrote returns at once, and its LSN is the visible one — at which
		// those keys hold what they hold at the sequenced state.
		// The compares' outcome says what their keys held, so the writes
		// behind them count as read.
		res.results = make([]opResult, len(ops))
		res.lsn = s.visible.Load()
		for i := range cmps {
			_, _, _, after := s.overlay.Read(cmps[i].Key)
			res.lsn = max(res.lsn, after)
		}
		for i, o := range ops {
			v, ver, ok, after := s.overlay.Read([]byte(o.key))
			res.results[i] = opResult{kind: opGet, found: ok, value: v, version: ver}
			res.lsn = max(res.lsn, after)
		}
		s.seqMu.Unlock()
		if speculative {
			if !s.lease.valid() {
				return execResult{}, notServing("primary lost its lease (no word from a log store majority for %v): it may have been deposed", s.cfg.LeaseTimeout)
			}
			if err := s.gated(); err != nil {
				return execResult{}, notServing("primary does not take reads and writes: %v", err)
			}
			return res, nil
		}
		if _, err := s.visible.Wait(ctx, res.lsn); err != nil {
			return execResult{}, status.FromContextError(err).Err()
		}
		if !s.lease.valid() {
			return execResult{}, status.Errorf(codes.Unavailable, "primary lost its lease (no word from a log store majority for %v): it may have been deposed", s.cfg.LeaseTimeout)
		}
		if err := s.gated(); err != nil {
			return execResult{}, status.Errorf(codes.Unavailable, "primary does not take reads and writes: %v", err)
		}
		return res, nil
	}
	t := &txn{policy: pol, local: make(chan error, 1), start: start}
	first := s.nextLSN
	t.commitLSN = first + uint64(writes)
	txnID := s.nextTxn
	view := txnView{base: s.overlay, local: make(map[string]*opResult, len(ops))}
	t.recs = make([]codec.Record, 0, writes+1)
	res.results = make([]opResult, len(ops))
	for i, o := range ops {
		r := &res.results[i]
		r.kind = o.kind
		switch o.kind {
		case codec.OpPut:
			t.recs = append(t.recs, codec.Record{LSN: first + uint64(len(t.recs)), TxnID: txnID, Op: codec.OpPut, Key: []byte(o.key), Value: o.value})
			view.local[o.key] = &opResult{found: true, value: o.value, version: t.commitLSN}
		case codec.OpDelete:
			_, _, r.existed = view.get(o.key)
			t.recs = append(t.recs, codec.Record{LSN: first + uint64(len(t.recs)), TxnID: txnID, Op: codec.OpDelete, Key: []byte(o.key)})
			view.local[o.key] = &opResult{}
		default:
			r.value, r.version, r.found = view.get(o.key)
		}
	}
	t.recs = append(t.recs, codec.Record{LSN: t.commitLSN, TxnID: txnID, Op: codec.OpCommit})
	s.nextLSN = t.commitLSN + 1
	s.nextTxn++
	s.overlay.Stage(t.recs)
	s.enqueueLocked(t)
	s.seqMu.Unlock()

	err = s.await(t)
	if err == nil && s.opened.Load() && !s.lease.valid() {
		// In the log, maybe even committed by a new primary: unknown.
		err = fmt.Errorf("%w: commit LSN %d is in the log, but the primary lost its lease (no word from a log store majority for %v) and may have been deposed: its outcome is unknown",
			rpcerr.ErrUnavailable, t.commitLSN, s.cfg.LeaseTimeout)
	} else if err == nil && s.opened.Load() {
		if gerr := s.gated(); gerr != nil {
			err = fmt.Errorf("%w: commit LSN %d is in the log, but the primary may no longer be the primary (%v): its outcome is unknown", rpcerr.ErrUnavailable, t.commitLSN, gerr)
		}
	}
	s.metrics.observeCommit(pol, err, time.Since(start))
	if err != nil {
		return execResult{}, rpcerr.Status(err)
	}
	res.lsn = t.commitLSN
	return res, nil
}
