package check

import (
	"errors"
	"testing"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// TestNotApplied: a write the primary refused before sequencing it is
// known not to have happened — by its code, or, for UNAVAILABLE, by the
// NOT_SERVING ErrorInfo a primary that is opening its epoch, handing over
// or without its lease attaches — and is left out of the history instead
// of counted as of unknown outcome (hundreds of those once made the
// check time out); any other UNAVAILABLE, a deadline or a broken stream
// may have been applied.
func TestNotApplied(t *testing.T) {
	withInfo := func(code codes.Code, reason string) error {
		st, err := status.New(code, "primary is opening epoch 3: its epoch record does not meet the contract yet").
			WithDetails(&errdetails.ErrorInfo{Reason: reason, Domain: "walship.io"})
		if err != nil {
			t.Fatal(err)
		}
		return st.Err()
	}
	for _, c := range []struct {
		name string
		err  error
		want bool
	}{
		{"not the primary", status.Error(codes.FailedPrecondition, "not the primary"), true},
		{"bad argument", status.Error(codes.InvalidArgument, "key: empty"), true},
		{"primary opening its epoch", withInfo(codes.Unavailable, "NOT_SERVING"), true},
		{"unavailable, another reason", withInfo(codes.Unavailable, "SOMETHING_ELSE"), false},
		{"unavailable", status.Error(codes.Unavailable, "error reading from server: EOF"), false},
		{"deadline", status.Error(codes.DeadlineExceeded, "context deadline exceeded"), false},
		{"not a status", errors.New("boom"), false},
	} {
		if got := NotApplied(c.err); got != c.want {
			t.Errorf("%s: NotApplied(%v) = %v, want %v", c.name, c.err, got, c.want)
		}
	}
}
