package kvpipe

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	walshipv1 "github.com/walship/walship/gen/walship/v1"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/types/known/durationpb"
)

type ctxKey struct{}

// newOp starts an operation as Serve does, under a parent whose value
// tests can see.
func newOp(t *testing.T, req *walshipv1.PipelineRequest) (*running, *op) {
	t.Helper()
	r := &running{byID: map[uint64]*op{}}
	parent := context.WithValue(context.Background(), ctxKey{}, "stream's")
	return r, r.start(parent, req)
}

// ended waits for ch to close, failing the test after a long while.
func ended(t *testing.T, ch <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(10 * time.Second):
		t.Fatalf("%s: not done", what)
	}
}

// An operation is its handler's context: the stream's values, the
// request's deadline, ended once (Done closed whenever it was first
// asked for, Err the first cause), and followed by context.AfterFunc,
// WithCancel and WithTimeout as any context is.
func TestOpIsAContext(t *testing.T) {
	_, o := newOp(t, &walshipv1.PipelineRequest{Id: 1})
	var ctx context.Context = o
	if v := ctx.Value(ctxKey{}); v != "stream's" {
		t.Fatalf("Value = %v; want the stream's", v)
	}
	if _, ok := ctx.Deadline(); ok {
		t.Fatal("a deadline without a timeout")
	}
	if s := fmt.Sprint(ctx); s != "kvpipe.op(1)" {
		t.Fatalf("printed as %q", s)
	}
	early := ctx.Done()
	select {
	case <-early:
		t.Fatal("Done closed before the operation ended")
	default:
	}
	if err := ctx.Err(); err != nil {
		t.Fatalf("Err = %v before the operation ended", err)
	}
	ran := make(chan struct{})
	context.AfterFunc(ctx, func() { close(ran) })
	stopped := false
	stop := context.AfterFunc(ctx, func() { stopped = true })
	if !stop() || stop() {
		t.Fatal("stop of an AfterFunc not yet run: want true, then false")
	}
	child, cancelChild := context.WithCancel(ctx)
	defer cancelChild()
	timed, cancelTimed := context.WithTimeout(ctx, time.Hour)
	defer cancelTimed()

	o.end(context.Canceled)
	o.end(context.DeadlineExceeded) // a later cause does not count
	ended(t, early, "Done asked for before the end")
	ended(t, ctx.Done(), "Done asked for after the end")
	if err := ctx.Err(); !errors.Is(err, context.Canceled) {
		t.Fatalf("Err = %v; want the first cause, Canceled", err)
	}
	ended(t, ran, "AfterFunc")
	ended(t, child.Done(), "WithCancel's child")
	ended(t, timed.Done(), "WithTimeout's child")
	if stopped {
		t.Fatal("a stopped AfterFunc ran")
	}
	after := make(chan struct{})
	if stop := context.AfterFunc(ctx, func() { close(after) }); stop() {
		t.Fatal("stop of an AfterFunc registered after the end: want false (it runs)")
	}
	ended(t, after, "AfterFunc registered after the end")
}

func TestOpDeadlineIsTheRequests(t *testing.T) {
	before := time.Now()
	_, o := newOp(t, &walshipv1.PipelineRequest{Id: 1, Timeout: durationpb.New(time.Minute)})
	d, ok := o.Deadline()
	if !ok || d.Before(before.Add(time.Minute)) || d.After(time.Now().Add(time.Minute)) {
		t.Fatalf("Deadline = %v, %v; want a minute from the request's start", d, ok)
	}
	_, bad := newOp(t, &walshipv1.PipelineRequest{Id: 1, Timeout: durationpb.New(-time.Second)})
	if _, ok := bad.Deadline(); ok || bad.bad == nil {
		t.Fatalf("a negative timeout: deadline %v, bad %v; want none, refused", ok, bad.bad)
	}
}

// Operations sharing an id are all cancelled by it, and each is
// forgotten once done, whichever order they end in.
func TestOpsSharingAnID(t *testing.T) {
	answers := make(chan *walshipv1.PipelineResponse, 8)
	r := &running{byID: map[uint64]*op{}, answers: answers}
	a := r.start(context.Background(), &walshipv1.PipelineRequest{Id: 7})
	b := r.start(context.Background(), &walshipv1.PipelineRequest{Id: 7})
	c := r.start(context.Background(), &walshipv1.PipelineRequest{Id: 7})
	other := r.start(context.Background(), &walshipv1.PipelineRequest{Id: 8})
	r.done(b) // the middle one
	r.cancel(7)
	if len(answers) != 2 || a.Err() == nil || c.Err() == nil || other.Err() != nil {
		t.Fatalf("cancel(7): %d answers, a %v, c %v, other %v; want a and c cancelled, other not", len(answers), a.Err(), c.Err(), other.Err())
	}
	r.done(a)
	r.done(c)
	r.done(other)
	if len(r.byID) != 0 {
		t.Fatalf("%d ids still held once every operation is done", len(r.byID))
	}
	for _, o := range []*op{a, b, c} {
		if o.sameID != nil {
			t.Fatalf("op %p, done, still links to %p", o, o.sameID)
		}
	}
}

// countingHandler counts the operations it runs.
type countingHandler struct{ ran atomic.Int64 }

func (h *countingHandler) Put(context.Context, *walshipv1.PutRequest) (*walshipv1.PutResponse, error) {
	h.ran.Add(1)
	return &walshipv1.PutResponse{}, nil
}

func (h *countingHandler) Delete(context.Context, *walshipv1.DeleteRequest) (*walshipv1.DeleteResponse, error) {
	h.ran.Add(1)
	return &walshipv1.DeleteResponse{}, nil
}

func (h *countingHandler) Txn(context.Context, *walshipv1.TxnRequest) (*walshipv1.TxnResponse, error) {
	h.ran.Add(1)
	return &walshipv1.TxnResponse{}, nil
}

func (h *countingHandler) Get(context.Context, *walshipv1.GetRequest) (*walshipv1.GetResponse, error) {
	h.ran.Add(1)
	return &walshipv1.GetResponse{}, nil
}

// An operation whose timeout passed while it waited for a worker is
// answered DEADLINE_EXCEEDED and not run: a write is not sequenced after
// its caller was told it timed out.
func TestOpPastItsDeadlineIsNotRun(t *testing.T) {
	answers := make(chan *walshipv1.PipelineResponse, 2)
	r := &running{byID: map[uint64]*op{}, answers: answers}
	req := &walshipv1.PipelineRequest{Id: 1, Op: &walshipv1.PipelineRequest_Put{Put: &walshipv1.PutRequest{Key: "k"}}, Timeout: durationpb.New(time.Hour)}
	o := r.start(context.Background(), req)
	o.deadline = time.Now().Add(-time.Millisecond) // as if it had waited an hour
	h := &countingHandler{}
	r.run(o, h, req, &worker{ws: &workers{}})
	if n := h.ran.Load(); n != 0 {
		t.Fatalf("the handler ran %d times", n)
	}
	if a := <-answers; codes.Code(a.GetError().GetCode()) != codes.DeadlineExceeded {
		t.Fatalf("answer %v; want DEADLINE_EXCEEDED", a)
	}
	if !errors.Is(o.Err(), context.DeadlineExceeded) {
		t.Fatalf("its context: %v; want DeadlineExceeded", o.Err())
	}
}
