// Package kvread is the read path the primary's and the replicas' KV
// services share: Get and Scan at the visible LSN, after waiting for the
// request's min_lsn to become visible, and the checks of their arguments.
package kvread

import (
	"context"
	"errors"
	"sync"
	"time"

	walshipv1 "github.com/walship/walship/gen/walship/v1"
	"github.com/walship/walship/internal/keyspace"
	"github.com/walship/walship/internal/state"
	"github.com/walship/walship/internal/watermark"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
)

// Limits of reads.
const (
	// MaxScanLimit is the most pairs one Scan returns.
	MaxScanLimit = 10000
	// MaxScanBytes bounds the keys and values of one Scan response (one
	// pair may exceed it alone); a longer range is cut short with
	// more=true. A response is marshalled into a buffer of its own and
	// held until the peer has taken it: 16 concurrent Scans of 4 MiB
	// pages (one client's calls) took a primary's RSS from 120 to 450
	// MiB; of 1 MiB pages, to 121.
	MaxScanBytes = 1 << 20
	// DefaultWait is how long a read waits for min_lsn when the request
	// does not say.
	DefaultWait = 5 * time.Second
	// MaxWait is the longest wait a request may ask for.
	MaxWait = 5 * time.Minute
	// DefaultMaxWaiting bounds the reads that wait for their min_lsn at
	// once on one server, and DefaultMaxWaitingPerConn those of one
	// connection: each holds a goroutine and its stream (about 16 KiB)
	// for up to MaxWait, so a client asking for an LSN far ahead must
	// not be able to pile them up without end.
	DefaultMaxWaiting        = 4096
	DefaultMaxWaitingPerConn = 256
)

// validateBound checks a Scan bound, which may be empty.
func validateBound(field, key string) error {
	if key == "" {
		return nil
	}
	return keyspace.ValidateKey(field, key)
}

// Reader serves reads from a Store whose applied LSN is the visible LSN.
type Reader struct {
	// View returns the current visible state (a replica re-seeded from a
	// snapshot swaps its whole store, hence a function).
	View func() *state.View
	// Visible is advanced after the Store applies; reads wait on it.
	Visible *watermark.Watermark
	// MaxWaiting and MaxWaitingPerConn bound the reads waiting for their
	// min_lsn at once, on the server and per connection; a read past
	// either fails with RESOURCE_EXHAUSTED. 0: DefaultMaxWaiting,
	// DefaultMaxWaitingPerConn.
	MaxWaiting, MaxWaitingPerConn int
	// Lag reports how far the served state trails the primary, in LSNs
	// and in time, for max_lag; nil: not at all (the primary).
	Lag func() (lsns uint64, behind time.Duration)

	mu      sync.Mutex
	waiting int            // reads waiting now
	perConn map[string]int // of them, by the connection's remote address
}

// admitWait counts a read about to wait, or refuses it past the limits;
// release uncounts it.
func (r *Reader) admitWait(ctx context.Context) (release func(), err error) {
	conn := ""
	if p, ok := peer.FromContext(ctx); ok && p.Addr != nil {
		conn = p.Addr.String()
	}
	maxAll, maxConn := r.MaxWaiting, r.MaxWaitingPerConn
	if maxAll <= 0 {
		maxAll = DefaultMaxWaiting
	}
	if maxConn <= 0 {
		maxConn = DefaultMaxWaitingPerConn
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	switch {
	case r.perConn[conn] >= maxConn:
		return nil, status.Errorf(codes.ResourceExhausted, "min_lsn: %d reads of this connection already wait for an LSN to become visible, the most one connection may; retry once some are answered", maxConn)
	case r.waiting >= maxAll:
		return nil, status.Errorf(codes.ResourceExhausted, "min_lsn: %d reads already wait for an LSN to become visible on this server, the most it keeps waiting; retry once some are answered", maxAll)
	}
	if r.perConn == nil {
		r.perConn = map[string]int{}
	}
	r.waiting++
	r.perConn[conn]++
	return func() {
		r.mu.Lock()
		defer r.mu.Unlock()
		r.waiting--
		if r.perConn[conn]--; r.perConn[conn] == 0 {
			delete(r.perConn, conn)
		}
	}, nil
}

// WaitVisible waits until lsn is visible, bounded by wait (nil = DefaultWait)
// and ctx. Past the bound it returns a DeadlineExceeded status naming the
// LSN reached; past the limits on waiting reads, a ResourceExhausted one.
func (r *Reader) WaitVisible(ctx context.Context, lsn uint64, wait *durationpb.Duration) error {
	if lsn == 0 {
		return nil
	}
	d := DefaultWait
	if wait != nil {
		if err := wait.CheckValid(); err != nil {
			return status.Errorf(codes.InvalidArgument, "wait_timeout: %v", err)
		}
		d = wait.AsDuration()
		if d < 0 || d > MaxWait {
			return status.Errorf(codes.InvalidArgument, "wait_timeout: %v is not in [0, %v]", d, MaxWait)
		}
	}
	if r.Visible.Load() >= lsn {
		return nil
	}
	release, err := r.admitWait(ctx)
	if err != nil {
		return err
	}
	defer release()
	wctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	got, err := r.Visible.Wait(wctx, lsn)
	if err == nil {
		return nil
	}
	if errors.Is(err, context.Canceled) && ctx.Err() != nil {
		return status.FromContextError(ctx.Err()).Err()
	}
	return status.Errorf(codes.DeadlineExceeded, "min_lsn: LSN %d not visible within %v (visible LSN is %d)", lsn, d, got)
}

// view waits until minLSN is visible and returns the view to read. A
// replica that restarted has no view until the commit watermark covers
// what it had applied: a read without min_lsn then waits for the first,
// bounded as a min_lsn wait, and fails with UNAVAILABLE past the bound.
func (r *Reader) view(ctx context.Context, minLSN uint64, wait *durationpb.Duration) (*state.View, error) {
	if err := r.WaitVisible(ctx, minLSN, wait); err != nil {
		return nil, err
	}
	if v := r.View(); v != nil {
		return v, nil
	}
	if err := r.WaitVisible(ctx, 1, wait); err != nil {
		if status.Code(err) == codes.DeadlineExceeded {
			return nil, status.Errorf(codes.Unavailable, "no state is readable here yet: the commit watermark has not reached what this replica applied before it restarted")
		}
		return nil, err
	}
	if v := r.View(); v != nil {
		return v, nil
	}
	return nil, status.Errorf(codes.Unavailable, "no state is readable here yet")
}

// checkLag refuses a read whose staleness bound the served state misses.
func (r *Reader) checkLag(maxLSNs uint64, maxTime *durationpb.Duration) error {
	if maxTime != nil {
		if err := maxTime.CheckValid(); err != nil {
			return status.Errorf(codes.InvalidArgument, "max_lag_time: %v", err)
		}
		if maxTime.AsDuration() < 0 {
			return status.Errorf(codes.InvalidArgument, "max_lag_time: %v is negative", maxTime.AsDuration())
		}
	}
	if r.Lag == nil || (maxLSNs == 0 && maxTime == nil) {
		return nil
	}
	lsns, behind := r.Lag()
	if maxLSNs > 0 && lsns > maxLSNs {
		return status.Errorf(codes.FailedPrecondition, "max_lag_lsns: this replica serves a state %d LSNs behind the primary, more than %d; read from the primary or a replica closer to it", lsns, maxLSNs)
	}
	if maxTime != nil && behind > maxTime.AsDuration() {
		return status.Errorf(codes.FailedPrecondition, "max_lag_time: this replica serves a state %v behind the primary, more than %v; read from the primary or a replica closer to it", behind.Round(time.Millisecond), maxTime.AsDuration())
	}
	return nil
}

// Get serves KVService.Get.
func (r *Reader) Get(ctx context.Context, req *walshipv1.GetRequest) (*walshipv1.GetResponse, error) {
	if err := keyspace.ValidateKey("key", req.GetKey()); err != nil {
		return nil, err
	}
	v, err := r.view(ctx, req.GetMinLsn(), req.GetWaitTimeout())
	if err != nil {
		return nil, err
	}
	if err := r.checkLag(req.GetMaxLagLsns(), req.GetMaxLagTime()); err != nil {
		return nil, err
	}
	val, ver, ok := v.Get([]byte(req.GetKey()))
	return &walshipv1.GetResponse{Found: ok, Value: val, VersionLsn: ver, AppliedLsn: v.AppliedLSN()}, nil
}

// Scan serves KVService.Scan.
func (r *Reader) Scan(ctx context.Context, req *walshipv1.ScanRequest) (*walshipv1.ScanResponse, error) {
	if err := validateBound("start", req.GetStart()); err != nil {
		return nil, err
	}
	if err := validateBound("end", req.GetEnd()); err != nil {
		return nil, err
	}
	if req.GetEnd() != "" && req.GetEnd() <= req.GetStart() {
		return nil, status.Errorf(codes.InvalidArgument, "end: %q is not after start %q", req.GetEnd(), req.GetStart())
	}
	limit := int(req.GetLimit())
	if limit > MaxScanLimit {
		return nil, status.Errorf(codes.InvalidArgument, "limit: %d exceeds the maximum %d", limit, MaxScanLimit)
	}
	if limit == 0 {
		limit = MaxScanLimit
	}
	v, err := r.view(ctx, req.GetMinLsn(), req.GetWaitTimeout())
	if err != nil {
		return nil, err
	}
	if err := r.checkLag(req.GetMaxLagLsns(), req.GetMaxLagTime()); err != nil {
		return nil, err
	}
	resp := &walshipv1.ScanResponse{AppliedLsn: v.AppliedLSN()}
	size := 0
	// One more than the limit tells whether the range goes on.
	start := req.GetStart()
	if start < "\x01" {
		start = "\x01" // past the reserved keys (keyspace.ReservedPrefix)
	}
	v.Scan([]byte(start), []byte(req.GetEnd()), limit+1, func(k, val []byte, ver uint64) bool {
		if len(resp.Kvs) == limit || (len(resp.Kvs) > 0 && size+len(k)+len(val) > MaxScanBytes) {
			resp.More = true
			return false
		}
		size += len(k) + len(val)
		resp.Kvs = append(resp.Kvs, &walshipv1.KeyValue{Key: string(k), Value: val, VersionLsn: ver})
		return true
	})
	return resp, nil
}
