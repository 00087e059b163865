package primary

import (
	"context"
	"fmt"
	"strings"
	"time"

	walshipv1 "github.com/walship/walship/gen/walship/v1"
	"github.com/walship/walship/internal/changefeed"
	"github.com/walship/walship/internal/keyspace"
	"github.com/walship/walship/internal/kvpipe"
	"github.com/walship/walship/internal/rpcerr"
	"github.com/walship/walship/internal/serve"
	"github.com/walship/walship/internal/state"
	"github.com/walship/walship/pkg/codec"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
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
	return unary[*walshipv1.PutResponse](k.s, func(c *call) error { return k.s.preparePut(ctx, req, c) })
}

func (k *kvServer) Delete(ctx context.Context, req *walshipv1.DeleteRequest) (*walshipv1.DeleteResponse, error) {
	return unary[*walshipv1.DeleteResponse](k.s, func(c *call) error { return k.s.prepareDelete(ctx, req, c) })
}

func (k *kvServer) Txn(ctx context.Context, req *walshipv1.TxnRequest) (*walshipv1.TxnResponse, error) {
	return unary[*walshipv1.TxnResponse](k.s, func(c *call) error { return k.s.prepareTxn(ctx, req, c) })
}

// unary runs the call prepare prepares alone (runCalls) and returns its
// response.
func unary[T proto.Message](s *Server, prepare func(*call) error) (T, error) {
	kept := takeCalls(1)
	defer keepCalls(kept)
	c := *kept
	err := prepare(&c[0])
	defer c[0].held.release()
	var none T
	if err != nil {
		return none, err
	}
	s.runCalls(c, nil)
	resp, err := c[0].response()
	if err != nil {
		return none, err
	}
	return resp.(T), nil
}

// writes reports whether ops put or delete anything.
func writes(ops []op) bool {
	for _, o := range ops {
		if o.kind != opGet {
			return true
		}
	}
	return false
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

// convertOps converts the ops of field (success or failure). The names
// of its fields are formatted only for an error: a commit's validation
// formats no strings.
func (s *Server) convertOps(field string, in []*walshipv1.TxnOp) ([]op, error) {
	out := make([]op, len(in))
	for i, o := range in {
		var err error
		if out[i], err = s.convertOp(o); err != nil {
			return nil, within(fmt.Sprintf("%s[%d]", field, i), err)
		}
	}
	return out, nil
}

// convertOp converts one op; an error names the field within it (put.key).
func (s *Server) convertOp(o *walshipv1.TxnOp) (op, error) {
	switch x := o.GetOp().(type) {
	case *walshipv1.TxnOp_Put:
		if err := keyspace.ValidateKey("put.key", x.Put.GetKey()); err != nil {
			return op{}, err
		}
		if err := s.validateValue("put.value", x.Put.GetValue()); err != nil {
			return op{}, err
		}
		return op{kind: codec.OpPut, key: x.Put.GetKey(), value: x.Put.GetValue()}, nil
	case *walshipv1.TxnOp_Delete:
		if err := keyspace.ValidateKey("delete.key", x.Delete.GetKey()); err != nil {
			return op{}, err
		}
		return op{kind: codec.OpDelete, key: x.Delete.GetKey()}, nil
	case *walshipv1.TxnOp_Get:
		if err := keyspace.ValidateKey("get.key", x.Get.GetKey()); err != nil {
			return op{}, err
		}
		return op{kind: opGet, key: x.Get.GetKey()}, nil
	default:
		return op{}, status.Error(codes.InvalidArgument, ": no op set (want put, delete or get)")
	}
}

// within names the field of err, an INVALID_ARGUMENT of a part of the
// request, by where that part is: "put.key: empty" within "success[2]" is
// "success[2].put.key: empty" (and ": no op set" is "success[2]: no op
// set").
func within(part string, err error) error {
	st := status.Convert(err)
	msg := st.Message()
	if !strings.HasPrefix(msg, ":") {
		msg = "." + msg
	}
	return status.Error(st.Code(), part+msg)
}

// convertCompare converts one compare; an error names the field within
// it (key).
func convertCompare(c *walshipv1.Compare) (state.Compare, error) {
	if err := keyspace.ValidateKey("key", c.GetKey()); err != nil {
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
		return out, rpcerr.Invalid("result", "%v is not EQUAL, NOT_EQUAL, LESS or GREATER", c.GetResult())
	}
	switch c.GetTarget() {
	case walshipv1.CompareTarget_COMPARE_TARGET_VALUE:
		v, ok := c.GetOperand().(*walshipv1.Compare_Value)
		if !ok {
			return out, rpcerr.Invalid("value", "required for target VALUE")
		}
		out.Target, out.Value = state.TargetValue, v.Value
	case walshipv1.CompareTarget_COMPARE_TARGET_VERSION:
		v, ok := c.GetOperand().(*walshipv1.Compare_VersionLsn)
		if !ok {
			return out, rpcerr.Invalid("version_lsn", "required for target VERSION")
		}
		out.Target, out.Version = state.TargetVersion, v.VersionLsn
	case walshipv1.CompareTarget_COMPARE_TARGET_EXISTS:
		v, ok := c.GetOperand().(*walshipv1.Compare_Exists)
		if !ok {
			return out, rpcerr.Invalid("exists", "required for target EXISTS")
		}
		out.Target, out.Exists = state.TargetExists, v.Exists
	default:
		return out, rpcerr.Invalid("target", "%v is not VALUE, VERSION or EXISTS", c.GetTarget())
	}
	if err := out.Validate(); err != nil {
		return out, rpcerr.Invalid("result", "%v", err)
	}
	return out, nil
}

// exec runs ops unconditionally, as a Put does (runCalls).
func (s *Server) exec(ctx context.Context, p *walshipv1.CommitPolicy, ops []op) (execResult, error) {
	var c [1]call
	c[0].success = ops
	if err := s.preparePolicy(ctx, p, &c[0]); err != nil {
		return execResult{}, err
	}
	s.runCalls(c[:], nil)
	return c[0].result()
}

// answerReads returns once reads that saw the writes up to lsn may be
// answered: those writes are visible (unless speculative), and the primary
// still holds its lease and its gate.
func (s *Server) answerReads(ctx context.Context, lsn uint64, speculative bool) error {
	if speculative {
		if !s.lease.valid() {
			return notServing("primary lost its lease (no word from a log store majority for %v): it may have been deposed", s.cfg.LeaseTimeout)
		}
		if err := s.gated(); err != nil {
			return notServing("primary does not take reads and writes: %v", err)
		}
		return nil
	}
	if _, err := s.pipe.visible.Wait(ctx, lsn); err != nil {
		return status.FromContextError(err).Err()
	}
	if !s.lease.valid() {
		return status.Errorf(codes.Unavailable, "primary lost its lease (no word from a log store majority for %v): it may have been deposed", s.cfg.LeaseTimeout)
	}
	if err := s.gated(); err != nil {
		return status.Errorf(codes.Unavailable, "primary does not take reads and writes: %v", err)
	}
	return nil
}

// stillPrimary checks, once a commit at commitLSN is acknowledged, that
// the primary still held its lease and its gate: if not, the commit is in
// the log, maybe even committed by a new primary, and its outcome unknown.
// A closed gate is waited for up to Config.GateGrace (and ctx): an
// election holder whose renewal was only slow holds it again at its next
// one, and the commit, acknowledged under the contract, is as safe to
// answer then as at once. The grace ends at *graceEnd, set by the first
// of the commits answered together that waits (runCalls) and cleared
// once the gate is open again: a group of them waits one grace per
// lapse, not one each.
func (s *Server) stillPrimary(ctx context.Context, commitLSN uint64, graceEnd *time.Time) error {
	if !s.opened.Load() {
		return nil // the epoch record itself, before the lease is waited for
	}
	gerr := s.awaitGate(ctx, graceEnd)
	if !s.lease.valid() {
		return fmt.Errorf("%w: commit LSN %d is in the log, but the primary lost its lease (no word from a log store majority for %v) and may have been deposed: its outcome is unknown",
			rpcerr.ErrUnavailable, commitLSN, s.cfg.LeaseTimeout)
	}
	if gerr != nil {
		return fmt.Errorf("%w: commit LSN %d is in the log, but the primary may no longer be the primary (%v): its outcome is unknown", rpcerr.ErrUnavailable, commitLSN, gerr)
	}
	return nil
}

// awaitGate returns nil once the gate is open, or its error if it stays
// closed until *graceEnd (Config.GateGrace from now, if not set yet),
// until ctx ends, or once the primary fails or is deposed. It looks again
// each time the election is renewed (Config.GateChanged): a lapse costs
// the waiting commits one look each per renewal, nothing in between.
func (s *Server) awaitGate(ctx context.Context, graceEnd *time.Time) error {
	err := s.gated()
	if err == nil {
		*graceEnd = time.Time{} // a later closing is another lapse
		return nil
	}
	if s.cfg.GateGrace <= 0 {
		return err
	}
	if graceEnd.IsZero() {
		*graceEnd = time.Now().Add(s.cfg.GateGrace)
	}
	err = s.gateReopens(ctx, err, *graceEnd)
	if err == nil {
		*graceEnd = time.Time{}
		s.metrics.gateWaits.WithLabelValues("held").Inc()
	} else {
		s.metrics.gateWaits.WithLabelValues("lost").Inc()
	}
	return err
}

// gateReopens waits, after the gate answered err, until it opens (nil),
// or returns its last error once ctx ends, graceEnd passes or the
// primary fails.
func (s *Server) gateReopens(ctx context.Context, err error, graceEnd time.Time) error {
	grace := time.NewTimer(time.Until(graceEnd))
	defer grace.Stop()
	for {
		// Asked before the look, so that a renewal between the two
		// closes the channel rather than going unseen.
		changed := s.cfg.GateChanged()
		if err = s.gated(); err == nil {
			return nil
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return err
		case <-grace.C:
			return err
		case <-s.pipe.failed:
			return err
		}
	}
}

// Pipeline runs each operation of the stream as its unary call
// (kvpipe.Serve): the same validation, lease checks, admission and
// answers, at most Config.MaxPipelineOps at once, each one of its peer's
// calls in progress (--max-peer-calls).
func (k *kvServer) Pipeline(stream walshipv1.KVService_PipelineServer) error {
	return kvpipe.Serve(stream, k, kvpipe.Limits{MaxOps: k.s.cfg.MaxPipelineOps, Calls: serve.StreamCalls(stream.Context())})
}

// Watch serves the transactions made visible here, up to the commit
// watermark (commitmark.go): never one a failover could take back.
func (k *kvServer) Watch(req *walshipv1.WatchRequest, stream walshipv1.KVService_WatchServer) error {
	return changefeed.Serve(changefeed.Source{Feed: k.s.pipe.feed, WAL: k.s.wal, Stall: k.s.cfg.WatchStall, Metrics: k.s.metrics.watch}, req, stream)
}
