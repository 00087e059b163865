// Package rpcerr turns walship's internal errors into gRPC status errors at
// the service edge, in one place, so every service maps the same failure to
// the same code:
//
//	bad argument      → InvalidArgument
//	corruption        → DataLoss
//	not ready/stopped → Unavailable
//	LSN gone          → OutOfRange
//	stale epoch       → FailedPrecondition
//	another cluster   → FailedPrecondition
package rpcerr

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
)

// Sentinels that services wrap to choose a code.
var (
	// ErrInvalid marks a bad argument.
	ErrInvalid = errors.New("invalid argument")
	// ErrCorrupt marks corrupted data (bad CRC, undecodable payload).
	ErrCorrupt = errors.New("corrupt data")
	// ErrUnavailable marks a process that cannot serve the call now
	// (recovering, stopping, too few replicas).
	ErrUnavailable = errors.New("unavailable")
	// ErrCompacted marks an LSN no longer held.
	ErrCompacted = errors.New("lsn no longer retained")
	// ErrStaleEpoch marks a message from an older epoch.
	ErrStaleEpoch = errors.New("stale epoch")
	// ErrWrongRole marks a call that this process's role does not serve.
	ErrWrongRole = errors.New("wrong role")
)

// Invalid returns an InvalidArgument error naming field.
func Invalid(field, format string, args ...any) error {
	return status.Error(codes.InvalidArgument, field+": "+fmt.Sprintf(format, args...))
}

// Mapper lets a package declare which gRPC code its own sentinels map to,
// without rpcerr importing it.
type Mapper func(err error) (codes.Code, bool)

// Status returns err as a gRPC status error. A status error passes through;
// known sentinels map as the package doc says; extra mappers are consulted
// first; anything else is Internal.
func Status(err error, extra ...Mapper) error {
	if err == nil {
		return nil
	}
	if _, ok := status.FromError(err); ok {
		return err
	}
	for _, m := range extra {
		if c, ok := m(err); ok {
			return status.Error(c, err.Error())
		}
	}
	return status.Error(Code(err), err.Error())
}

// Code is the gRPC code for err.
func Code(err error) codes.Code {
	if s, ok := status.FromError(err); ok && s.Code() != codes.Unknown {
		return s.Code()
	}
	switch {
	case errors.Is(err, ErrInvalid):
		return codes.InvalidArgument
	case errors.Is(err, ErrCorrupt):
		return codes.DataLoss
	case errors.Is(err, ErrUnavailable):
		return codes.Unavailable
	case errors.Is(err, ErrCompacted):
		return codes.OutOfRange
	case errors.Is(err, ErrStaleEpoch), errors.Is(err, ErrWrongRole), errors.Is(err, ErrOtherCluster):
		return codes.FailedPrecondition
	case errors.Is(err, context.DeadlineExceeded):
		return codes.DeadlineExceeded
	case errors.Is(err, context.Canceled):
		return codes.Canceled
	default:
		return codes.Internal
	}
}

// NotApplied is a refusal of a call before it ran (a write not
// sequenced): code, with an ErrorInfo of reason whose metadata says
// outcome "not_applied" (what pkg/client's NotApplied looks for, so a
// client knows the write did not happen and may retry it) and a
// RetryInfo of retry.
func NotApplied(code codes.Code, reason string, retry time.Duration, format string, args ...any) error {
	st := status.Newf(code, format, args...)
	if d, err := st.WithDetails(
		&errdetails.ErrorInfo{Reason: reason, Domain: "walship.io", Metadata: map[string]string{"outcome": "not_applied", "retry_after_ms": strconv.FormatInt(retry.Milliseconds(), 10)}},
		&errdetails.RetryInfo{RetryDelay: durationpb.New(retry)}); err == nil {
		st = d
	}
	return st.Err()
}
