package logstore

import (
	"errors"
	"fmt"

	"github.com/walship/walship/internal/rpcerr"
	"github.com/walship/walship/internal/wal"
	"github.com/walship/walship/pkg/codec"
	"google.golang.org/grpc/codes"
)

// refusal is an error whose message is meant for the caller as is and whose
// kind (an rpcerr sentinel) chooses the gRPC code at the edge.
type refusal struct {
	kind error
	msg  string
}

func (r *refusal) Error() string { return r.msg }
func (r *refusal) Unwrap() error { return r.kind }

func refuse(kind error, format string, args ...any) error {
	return &refusal{kind: kind, msg: fmt.Sprintf(format, args...)}
}

var (
	// errStopping ends streams during a graceful stop.
	errStopping = refuse(rpcerr.ErrUnavailable, "log store is stopping")
	// errOutOfRange marks an LSN the log store cannot serve or accept at
	// that position: not kept any more, beyond the end, or overlapping
	// different stored data.
	errOutOfRange = errors.New("out of range")
	// errPrecondition marks a request the log store's state does not
	// allow: a snapshot at an LSN that is not a durable batch end it holds.
	errPrecondition = errors.New("failed precondition")
	// errNotFound marks something the log store does not hold at all.
	errNotFound = errors.New("not found")
)

// mapErr maps the storage packages' sentinels; rpcerr handles the rest.
func mapErr(err error) (codes.Code, bool) {
	switch {
	case errors.Is(err, rpcerr.ErrInvalid), errors.Is(err, rpcerr.ErrCorrupt),
		errors.Is(err, rpcerr.ErrUnavailable), errors.Is(err, rpcerr.ErrCompacted),
		errors.Is(err, rpcerr.ErrStaleEpoch), errors.Is(err, rpcerr.ErrWrongRole):
		return rpcerr.Code(err), true
	case errors.Is(err, errOutOfRange):
		return codes.OutOfRange, true
	case errors.Is(err, errPrecondition):
		return codes.FailedPrecondition, true
	case errors.Is(err, errNotFound):
		return codes.NotFound, true
	case errors.Is(err, codec.ErrCorrupt), errors.Is(err, wal.ErrCorrupt):
		return codes.DataLoss, true
	case errors.Is(err, wal.ErrCompacted), errors.Is(err, wal.ErrFuture):
		return codes.OutOfRange, true
	case errors.Is(err, wal.ErrClosed), errors.Is(err, wal.ErrBroken):
		return codes.Unavailable, true
	}
	return 0, false
}

// toStatus is the one place where the log store's errors become gRPC
// status errors.
func toStatus(err error) error { return rpcerr.Status(err, mapErr) }
