// Package kvapi holds what the primary's and the replicas' KV services share:
// argument validation and the read path (Get and Scan at the visible LSN,
// waiting for min_lsn).
package kvapi

import (
	"context"
	"errors"
	"fmt"
	"time"
	"unicode/utf8"

	walshipv1 "github.com/walship/walship/gen/walship/v1"
	"github.com/walship/walship/internal/state"
	"github.com/walship/walship/internal/watermark"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
)

// Limits of the KV API.
const (
	// MaxKeyBytes is the longest key.
	MaxKeyBytes = 4096
	// MaxScanLimit is the most pairs one Scan returns.
	MaxScanLimit = 10000
	// MaxScanBytes bounds the keys and values of one Scan response, so it
	// fits a gRPC message; a longer range is cut short with more=true.
	MaxScanBytes = 4 << 20
	// DefaultWait is how long a read waits for min_lsn when the request
	// does not say.
	DefaultWait = 5 * time.Second
	// MaxWait is the longest wait a request may ask for.
	MaxWait = 5 * time.Minute
)

// ValidateKey checks a key: 1..MaxKeyBytes bytes of valid UTF-8. The error
// is an InvalidArgument status naming field.
func ValidateKey(field, key string) error {
	switch {
	case len(key) == 0:
		return status.Errorf(codes.InvalidArgument, "%s: must not be empty", field)
	case len(key) > MaxKeyBytes:
		return status.Errorf(codes.InvalidArgument, "%s: %d bytes, the limit is %d", field, len(key), MaxKeyBytes)
	case !utf8.ValidString(key):
		return status.Errorf(codes.InvalidArgument, "%s: not valid UTF-8", field)
	case key[0] == ReservedPrefix[0]:
		return status.Errorf(codes.InvalidArgument, "%s: keys starting with U+0000 are reserved for walship itself", field)
	}
	return nil
}

// ReservedPrefix starts the keys walship keeps in the replicated state for
// itself (the epoch record): clients cannot read or write them, and a
// Scan skips them.
const ReservedPrefix = "\x00"

// EpochRecordKey holds the EpochRecord of the current epoch: the first
// commit of every epoch writes it, so that every node that applied the log
// knows the primary and the contract.
const EpochRecordKey = ReservedPrefix + "walship/epoch"

// EpochRecord reads the epoch record from v (nil if there is none yet).
func EpochRecord(v *state.View) (*walshipv1.EpochRecord, error) {
	b, _, ok := v.Get([]byte(EpochRecordKey))
	if !ok {
		return nil, nil
	}
	rec := &walshipv1.EpochRecord{}
	if err := proto.Unmarshal(b, rec); err != nil {
		return nil, fmt.Errorf("epoch record: %w", err)
	}
	return rec, nil
}

// validateBound checks a Scan bound, which may be empty.
func validateBound(field, key string) error {
	if key == "" {
		return nil
	}
	return ValidateKey(field, key)
}

// Reader serves reads from a Store whose applied LSN is the visible LSN.
type Reader struct {
	// View returns the current visible state (a replica re-seeded from a
	// snapshot swaps its whole store, hence a function).
	View func() *state.View
	// Visible is advanced after the Store applies; reads wait on it.
	Visible *watermark.Watermark
}

// WaitVisible waits until lsn is visible, bounded by wait (nil = DefaultWait)
// and ctx. Past the bound it returns a DeadlineExceeded status naming the
// LSN reached.
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

// Get serves KVService.Get.
func (r *Reader) Get(ctx context.Context, req *walshipv1.GetRequest) (*walshipv1.GetResponse, error) {
	if err := ValidateKey("key", req.GetKey()); err != nil {
		return nil, err
	}
	if err := r.WaitVisible(ctx, req.GetMinLsn(), req.GetWaitTimeout()); err != nil {
		return nil, err
	}
	v := r.View()
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
	if err := r.WaitVisible(ctx, req.GetMinLsn(), req.GetWaitTimeout()); err != nil {
		return nil, err
	}
	v := r.View()
	resp := &walshipv1.ScanResponse{AppliedLsn: v.AppliedLSN()}
	size := 0
	// One more than the limit tells whether the range goes on.
	start := req.GetStart()
	if start < "\x01" {
		start = "\x01" // past the reserved keys
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

// ValidatePolicy checks the enum fields of a request's policy are known
// values, naming the field; the primary merges and range-checks the rest.
func ValidatePolicy(p *walshipv1.CommitPolicy) error {
	if p == nil {
		return nil
	}
	check := func(field string, v int32, names map[int32]string) error {
		if _, ok := names[v]; !ok {
			return status.Errorf(codes.InvalidArgument, "policy.%s: unknown value %d", field, v)
		}
		return nil
	}
	for _, err := range []error{
		check("durability", int32(p.Durability), walshipv1.Durability_name),
		check("replication", int32(p.Replication), walshipv1.ReplicationMode_name),
		check("sync_level", int32(p.SyncLevel), walshipv1.SyncLevel_name),
		check("logstore", int32(p.Logstore), walshipv1.LogStoreAck_name),
	} {
		if err != nil {
			return err
		}
	}
	return nil
}
