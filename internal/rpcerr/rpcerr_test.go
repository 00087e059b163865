package rpcerr

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

func TestStatusMapsEachSentinelOnce(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want codes.Code
	}{
		{fmt.Errorf("key: %w", ErrInvalid), codes.InvalidArgument},
		{fmt.Errorf("segment 3: %w", ErrCorrupt), codes.DataLoss},
		{fmt.Errorf("recovering: %w", ErrUnavailable), codes.Unavailable},
		{fmt.Errorf("lsn 5: %w", ErrCompacted), codes.OutOfRange},
		{fmt.Errorf("epoch 2 < 3: %w", ErrStaleEpoch), codes.FailedPrecondition},
		{fmt.Errorf("replica: %w", ErrWrongRole), codes.FailedPrecondition},
		{fmt.Errorf("wait: %w", context.DeadlineExceeded), codes.DeadlineExceeded},
		{context.Canceled, codes.Canceled},
		{errors.New("something else"), codes.Internal},
		{status.Error(codes.NotFound, "already a status"), codes.NotFound},
		{Invalid("policy.sync_level", "unknown value %d", 7), codes.InvalidArgument},
	} {
		got := Status(tc.err)
		if status.Code(got) != tc.want {
			t.Errorf("Status(%v) = %v; want %v", tc.err, status.Code(got), tc.want)
		}
		if _, ok := status.FromError(got); !ok {
			t.Errorf("Status(%v) is not a status error", tc.err)
		}
	}
	if Status(nil) != nil {
		t.Error("Status(nil) must be nil")
	}
	mine := errors.New("mine")
	got := Status(fmt.Errorf("x: %w", mine), func(err error) (codes.Code, bool) { return codes.Aborted, errors.Is(err, mine) })
	if status.Code(got) != codes.Aborted {
		t.Errorf("extra mapper not consulted: %v", got)
	}
	if m := status.Convert(Invalid("key", "empty")).Message(); m != "key: empty" {
		t.Errorf("Invalid message = %q", m)
	}
}
