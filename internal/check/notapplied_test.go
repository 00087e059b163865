package check

import (
	"context"
	"errors"
	"testing"
	"time"

	walshipv1 "github.com/walship/walship/gen/walship/v1"
	"google.golang.org/grpc"

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

// refusingKV answers Get with NOT_SERVING refusals first, then found.
type refusingKV struct {
	walshipv1.KVServiceClient
	refusals int
	calls    int
}

func (f *refusingKV) Get(context.Context, *walshipv1.GetRequest, ...grpc.CallOption) (*walshipv1.GetResponse, error) {
	f.calls++
	if f.calls <= f.refusals {
		st, _ := status.New(codes.Unavailable, "primary is opening epoch 4: its epoch record does not meet the contract yet").
			WithDetails(&errdetails.ErrorInfo{Reason: "NOT_SERVING", Domain: "walship.io"})
		return nil, st.Err()
	}
	return &walshipv1.GetResponse{Found: true, Value: []byte("v")}, nil
}

// TestReadBackWaitsForAnOpeningPrimary: the read back after the faults
// asks again while the primary, restarted by the last kill, refuses as
// still opening its epoch (a refusal that did nothing), and records only
// the read that answered.
func TestReadBackWaitsForAnOpeningPrimary(t *testing.T) {
	kv := &refusingKV{refusals: 3}
	h := NewHistory()
	h.Add(Op{Input: Input{Kind: KindPut, Key: "k", Value: "v"}, Call: h.Now(), Return: h.Now()})
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	if err := (Workload{Primary: kv}).ReadBack(ctx, h); err != nil {
		t.Fatal(err)
	}
	if kv.calls != 4 {
		t.Fatalf("%d Get calls, want 3 refused and 1 answered", kv.calls)
	}
	ops := h.Ops()
	if last := ops[len(ops)-1]; len(ops) != 2 || last.Input.Kind != KindGet || !last.Output.Found || last.Output.Value != "v" {
		t.Fatalf("history %+v: want the put and the one read that answered", ops)
	}
}
