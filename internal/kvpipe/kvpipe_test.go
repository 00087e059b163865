package kvpipe_test

import (
	"context"
	"fmt"
	"maps"
	"math/rand/v2"
	"net"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	walshipv1 "github.com/walship/walship/gen/walship/v1"
	"github.com/walship/walship/internal/kvpipe"
	"github.com/walship/walship/internal/testkit"
	"go.uber.org/goleak"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// fake is a KVService whose Puts of key "slow/..." wait for release, of
// key "echo/N" answer LSN N, and whose Deletes fail as a primary that is
// not serving does.
type fake struct {
	walshipv1.UnimplementedKVServiceServer
	maxOps           int
	release          chan struct{}
	running, maxSeen atomic.Int64
	lsn              atomic.Uint64
	// goroutines are the goroutines that ran Puts of key "where", by id.
	goroutines sync.Map
	// deep makes each Put use this many KiB of stack, as a primary's
	// does (its B-tree, protobuf's sizing).
	deep int
}

// useStack uses about kib KiB of stack.
//
//go:noinline
func useStack(kib int) byte {
	var buf [1024]byte
	if kib <= 1 {
		return buf[0]
	}
	buf[kib%len(buf)] = byte(kib)
	return useStack(kib-1) + buf[kib%len(buf)]
}

// goroutineID is the id of the calling goroutine, from its stack trace's
// first line ("goroutine 7 [running]:").
func goroutineID() string {
	buf := make([]byte, 64)
	buf = buf[:runtime.Stack(buf, false)]
	id, _, _ := strings.Cut(strings.TrimPrefix(string(buf), "goroutine "), " ")
	return id
}

func (f *fake) Put(ctx context.Context, in *walshipv1.PutRequest) (*walshipv1.PutResponse, error) {
	n := f.running.Add(1)
	defer f.running.Add(-1)
	for m := f.maxSeen.Load(); n > m && !f.maxSeen.CompareAndSwap(m, n); m = f.maxSeen.Load() {
	}
	if f.deep > 0 {
		useStack(f.deep)
	}
	if in.GetKey() == "where" {
		f.goroutines.Store(goroutineID(), true)
	}
	if len(in.GetKey()) > 5 && in.GetKey()[:5] == "slow/" {
		select {
		case <-f.release:
		case <-ctx.Done():
			return nil, status.FromContextError(ctx.Err()).Err()
		}
	}
	if n, ok := strings.CutPrefix(in.GetKey(), "echo/"); ok {
		lsn, err := strconv.ParseUint(n, 10, 64)
		return &walshipv1.PutResponse{Lsn: lsn}, err
	}
	return &walshipv1.PutResponse{Lsn: f.lsn.Add(1)}, nil
}

func (f *fake) Delete(context.Context, *walshipv1.DeleteRequest) (*walshipv1.DeleteResponse, error) {
	st, _ := status.New(codes.Unavailable, "primary is opening its epoch").WithDetails(&errdetails.ErrorInfo{Reason: "NOT_SERVING", Domain: "walship"})
	return nil, st.Err()
}

func (f *fake) Pipeline(stream walshipv1.KVService_PipelineServer) error {
	return kvpipe.Serve(stream, f, kvpipe.Limits{MaxOps: f.maxOps})
}

func serve(t *testing.T, f *fake) walshipv1.KVServiceClient { return serveB(t, f) }

func serveB(t testing.TB, f *fake) walshipv1.KVServiceClient { return serveWith(t, f) }

// serveWith serves f on loopback with opts and returns a client of it.
func serveWith(t testing.TB, f walshipv1.KVServiceServer, opts ...grpc.ServerOption) walshipv1.KVServiceClient {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	g := grpc.NewServer(opts...)
	walshipv1.RegisterKVServiceServer(g, f)
	var wg sync.WaitGroup
	wg.Go(func() { _ = g.Serve(lis) })
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		conn.Close()
		g.Stop()
		wg.Wait()
	})
	return walshipv1.NewKVServiceClient(conn)
}

// TestServeRunsAtMostMaxOps: with maxOps 2 and every operation held, the
// server runs two, reads no further until one is answered, and answers
// every one once released; a fast operation sent after a held one is
// answered first (no head-of-line waiting).
func TestServeRunsAtMostMaxOps(t *testing.T) {
	f := &fake{maxOps: 2, release: make(chan struct{})}
	kv := serve(t, f)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s, err := kv.Pipeline(ctx)
	if err != nil {
		t.Fatal(err)
	}
	put := func(id uint64, key string) *walshipv1.PipelineRequest {
		return &walshipv1.PipelineRequest{Id: id, Op: &walshipv1.PipelineRequest_Put{Put: &walshipv1.PutRequest{Key: key}}}
	}
	if err := s.Send(put(1, "slow/1")); err != nil {
		t.Fatal(err)
	}
	if err := s.Send(put(2, "fast")); err != nil {
		t.Fatal(err)
	}
	if r, err := s.Recv(); err != nil || r.GetId() != 2 || r.GetPut().GetLsn() == 0 {
		t.Fatalf("first answer %v, %v; want the fast put's (2) while 1 is held", r, err)
	}
	for id := uint64(3); id <= 6; id++ {
		if err := s.Send(put(id, "slow/x")); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.CloseSend(); err != nil {
		t.Fatal(err)
	}
	testkit.Until(t, "two operations held", func() bool { return f.running.Load() == 2 })
	answered := map[uint64]bool{2: true}
	for len(answered) < 6 {
		f.release <- struct{}{}
		r, err := s.Recv()
		if err != nil {
			t.Fatal(err)
		}
		if answered[r.GetId()] || r.GetPut() == nil {
			t.Fatalf("answer %v: a second one, or not a put's", r)
		}
		answered[r.GetId()] = true
	}
	if _, err := s.Recv(); err == nil {
		t.Fatal("the stream goes on after every operation is answered")
	}
	if m := f.maxSeen.Load(); m != 2 {
		t.Errorf("%d operations ran at once; want at most (and here exactly) 2", m)
	}
}

// TestServeReusesWorkers: a client that waits for each answer before
// sending the next has all its operations run on one goroutine (a
// goroutine per operation grows a new stack every time).
func TestServeReusesWorkers(t *testing.T) {
	f := &fake{}
	kv := serve(t, f)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s, err := kv.Pipeline(ctx)
	if err != nil {
		t.Fatal(err)
	}
	const ops = 20
	for id := uint64(1); id <= ops; id++ {
		if err := s.Send(&walshipv1.PipelineRequest{Id: id, Op: &walshipv1.PipelineRequest_Put{Put: &walshipv1.PutRequest{Key: "where"}}}); err != nil {
			t.Fatal(err)
		}
		if r, err := s.Recv(); err != nil || r.GetId() != id || r.GetPut() == nil {
			t.Fatalf("answer %v, %v; want put %d's", r, err, id)
		}
	}
	if err := s.CloseSend(); err != nil {
		t.Fatal(err)
	}
	if r, err := s.Recv(); err == nil {
		t.Fatalf("an answer %v after every operation's", r)
	}
	n := 0
	f.goroutines.Range(func(any, any) bool { n++; return true })
	if n != 1 {
		t.Errorf("%d operations, one at a time, ran on %d goroutines; want 1", ops, n)
	}
}

// TestMuxErrorsAsUnary: a pipelined call's error carries the unary
// call's code, message and details (the client's "not applied" test
// reads an ErrorInfo), and a call after Close fails at once.
func TestMuxErrorsAsUnary(t *testing.T) {
	kv := serve(t, &fake{})
	m := kvpipe.NewMux(kv)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, unary := kv.Delete(ctx, &walshipv1.DeleteRequest{Key: "k"})
	_, piped := m.Delete(ctx, &walshipv1.DeleteRequest{Key: "k"})
	u, p := status.Convert(unary), status.Convert(piped)
	if !proto.Equal(u.Proto(), p.Proto()) {
		t.Errorf("pipelined %v, unary %v: want the same status", p.Proto(), u.Proto())
	}
	if r, err := m.Put(ctx, &walshipv1.PutRequest{Key: "k"}); err != nil || r.GetLsn() == 0 {
		t.Errorf("put: %v, %v", r, err)
	}
	m.Close()
	if _, err := m.Put(ctx, &walshipv1.PutRequest{Key: "k"}); status.Code(err) != codes.Canceled {
		t.Errorf("put after Close: %v; want CANCELED", err)
	}
}

// Each call gets its own answer while callers give up all around it,
// some as their answer comes (the channel of a call that gave up is used
// again only if no answer can still come to it), some long before (their
// operations are cancelled).
func TestMuxAnswersGoToTheirCallers(t *testing.T) {
	kv := serve(t, &fake{release: make(chan struct{})})
	callersGivingUp(t, kvpipe.NewMux(kv), false)
}

// As TestMuxAnswersGoToTheirCallers, with every stream drained or
// broken within 3 ms of opening: a call gets its own answer, or
// UNAVAILABLE, or gives up.
func TestMuxAnswersGoToTheirCallersAsStreamsEnd(t *testing.T) {
	var streams atomic.Int64
	churn := func(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		n := streams.Add(1)
		after := time.Duration(rand.New(rand.NewPCG(uint64(n), 7)).IntN(3000)) * time.Microsecond
		ctx, cancel := context.WithCancel(ss.Context())
		defer cancel()
		done := make(chan error, 1)
		go func() { done <- handler(srv, &ctxStream{ServerStream: ss, ctx: ctx}) }()
		if n%2 == 0 { // a graceful stop: drained
			stop := time.AfterFunc(after, cancel)
			defer stop.Stop()
			return <-done
		}
		select { // broken: the handler's operations are abandoned
		case err := <-done:
			return err
		case <-time.After(after):
			return status.Error(codes.Unavailable, "broken")
		}
	}
	kv := serveWith(t, &fake{release: make(chan struct{})}, grpc.StreamInterceptor(churn))
	callersGivingUp(t, kvpipe.NewMux(kv), true)
	if n := streams.Load(); n < 2 {
		t.Fatalf("%d streams opened: no stream ended", n)
	}
}

// callersGivingUp runs 8 callers of 400 Puts each on m, a third giving
// up about when their answer comes (key echo/N, answered LSN N), a third
// long before (slow/..., never answered), and checks that every call
// that did not give up got its own answer (or, with broken,
// UNAVAILABLE). It closes m.
func callersGivingUp(t *testing.T, m *kvpipe.Mux, broken bool) {
	t.Helper()
	defer m.Close()
	var next atomic.Uint64
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			r := rand.New(rand.NewPCG(uint64(g), 1))
			for range 400 {
				n := next.Add(1)
				key, wait := fmt.Sprintf("echo/%d", n), 30*time.Second
				switch r.IntN(3) {
				case 0: // gives up about when its answer comes
					wait = time.Duration(r.IntN(400)) * time.Microsecond
				case 1: // gives up, never answered
					key, wait = "slow/"+key, time.Duration(r.IntN(400))*time.Microsecond
				}
				ctx, cancel := context.WithTimeout(context.Background(), wait)
				resp, err := m.Put(ctx, &walshipv1.PutRequest{Key: key})
				cancel()
				switch {
				case status.Code(err) == codes.DeadlineExceeded && wait < time.Second:
				case broken && status.Code(err) == codes.Unavailable:
				case strings.HasPrefix(key, "slow/") || err != nil || resp.GetLsn() != n:
					t.Errorf("%s: %v, %v; want LSN %d", key, resp, err, n)
				}
			}
		})
	}
	wg.Wait()
}

// TestServeCancel: the server says in its header how many operations a
// client may have in progress; a cancel ends the operation of its id
// with CANCELED at once (a cancel of no such operation is not answered),
// and one whose timeout passes ends with DEADLINE_EXCEEDED, both freeing
// their place: with one place, the next operation runs.
func TestServeCancel(t *testing.T) {
	f := &fake{maxOps: 1, release: make(chan struct{})}
	kv := serve(t, f)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s, err := kv.Pipeline(ctx)
	if err != nil {
		t.Fatal(err)
	}
	md, err := s.Header()
	if err != nil || len(md.Get(kvpipe.MaxOpsHeader)) != 1 || md.Get(kvpipe.MaxOpsHeader)[0] != "1" {
		t.Fatalf("header %v, %v; want %s: 1", md, err, kvpipe.MaxOpsHeader)
	}
	cancelOp := func(id uint64) *walshipv1.PipelineRequest {
		return &walshipv1.PipelineRequest{Id: id, Op: &walshipv1.PipelineRequest_Cancel{Cancel: &walshipv1.PipelineCancel{}}}
	}
	for _, req := range []*walshipv1.PipelineRequest{
		{Id: 1, Op: &walshipv1.PipelineRequest_Put{Put: &walshipv1.PutRequest{Key: "slow/1"}}},
		cancelOp(9),
		cancelOp(1),
		{Id: 2, Op: &walshipv1.PipelineRequest_Put{Put: &walshipv1.PutRequest{Key: "slow/2"}}, Timeout: durationpb.New(50 * time.Millisecond)},
		{Id: 3, Op: &walshipv1.PipelineRequest_Put{Put: &walshipv1.PutRequest{Key: "fast"}}},
	} {
		if err := s.Send(req); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.CloseSend(); err != nil {
		t.Fatal(err)
	}
	for _, want := range []struct {
		id   uint64
		code codes.Code
	}{{1, codes.Canceled}, {2, codes.DeadlineExceeded}, {3, codes.OK}} {
		r, err := s.Recv()
		if err != nil {
			t.Fatal(err)
		}
		if got := codes.Code(r.GetError().GetCode()); r.GetId() != want.id || got != want.code {
			t.Fatalf("answer %v; want id %d %v", r, want.id, want.code)
		}
	}
	if r, err := s.Recv(); err == nil {
		t.Fatalf("an answer %v after every operation's", r)
	}
}

// stoppable serves f as serve's endStreamsOnStop does: once stop is
// called, the context of every stream open then ends (a graceful stop
// beginning); streams opened later are not stopped. open counts the
// Pipeline streams opened, active those whose handler has not returned.
type stoppable struct {
	stopped      chan struct{}
	open, active atomic.Int64
}

func (s *stoppable) interceptor(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
	s.open.Add(1)
	s.active.Add(1)
	defer s.active.Add(-1)
	ctx, cancel := context.WithCancel(ss.Context())
	defer cancel()
	select {
	case <-s.stopped:
	default:
		stop := context.AfterFunc(ctx, func() {})
		defer stop()
		go func() {
			select {
			case <-s.stopped:
				cancel()
			case <-ctx.Done():
			}
		}()
	}
	return handler(srv, &ctxStream{ServerStream: ss, ctx: ctx})
}

type ctxStream struct {
	grpc.ServerStream
	ctx context.Context
}

func (s *ctxStream) Context() context.Context { return s.ctx }

// TestMuxDrain: when a graceful stop begins, the server finishes the
// operation it runs — answered as it would have been, not cut off — and
// tells the client, whose next call goes on a new stream; the old
// stream then ends.
func TestMuxDrain(t *testing.T) {
	f := &fake{release: make(chan struct{})}
	st := &stoppable{stopped: make(chan struct{})}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	g := grpc.NewServer(grpc.StreamInterceptor(st.interceptor))
	walshipv1.RegisterKVServiceServer(g, f)
	var wg sync.WaitGroup
	wg.Go(func() { _ = g.Serve(lis) })
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		conn.Close()
		g.Stop()
		wg.Wait()
	}()
	m := kvpipe.NewMux(walshipv1.NewKVServiceClient(conn))
	defer m.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	held := make(chan error, 1)
	go func() {
		_, err := m.Put(ctx, &walshipv1.PutRequest{Key: "slow/1"})
		held <- err
	}()
	testkit.Until(t, "the held Put to run", func() bool { return f.running.Load() == 1 })
	close(st.stopped)
	testkit.Until(t, "the next call to go on a new stream", func() bool {
		_, err := m.Put(ctx, &walshipv1.PutRequest{Key: "fast"})
		return err == nil && st.open.Load() == 2
	})
	select {
	case f.release <- struct{}{}:
	case err := <-held:
		t.Fatalf("the Put running when the stop began ended: %v", err)
	}
	if err := <-held; err != nil {
		t.Fatalf("the Put running when the stop began: %v; want it answered", err)
	}
	testkit.Until(t, "the drained stream to end", func() bool { return st.active.Load() == 1 })
}

// TestServeStopWithEverySlotTaken: a graceful stop that finds every slot
// of a stream taken, and a request waiting for one, ends the stream
// UNAVAILABLE and answers the operations still running UNAVAILABLE
// (outcome unknown: pkg/client retries a read on it, never a write),
// not CANCELED, which says the client gave up.
func TestServeStopWithEverySlotTaken(t *testing.T) {
	f := &fake{maxOps: 2, release: make(chan struct{})}
	st := &stoppable{stopped: make(chan struct{})}
	kv := serveWith(t, f, grpc.StreamInterceptor(st.interceptor))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s, err := kv.Pipeline(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for id := uint64(1); id <= 3; id++ {
		if err := s.Send(&walshipv1.PipelineRequest{Id: id, Op: &walshipv1.PipelineRequest_Put{Put: &walshipv1.PutRequest{Key: "slow/x"}}}); err != nil {
			t.Fatal(err)
		}
	}
	testkit.Until(t, "two operations held", func() bool { return f.running.Load() == 2 })
	close(st.stopped)
	got := map[uint64]codes.Code{}
	drained := false
	for {
		r, err := s.Recv()
		if err != nil {
			if status.Code(err) != codes.Unavailable {
				t.Errorf("the stream ended %v, want UNAVAILABLE", err)
			}
			break
		}
		if r.GetDrain() != nil {
			drained = true
			continue
		}
		if _, dup := got[r.GetId()]; dup || r.GetError() == nil {
			t.Fatalf("answer %v: a second one for its id, or not an error", r)
		}
		got[r.GetId()] = codes.Code(r.GetError().GetCode())
	}
	if want := map[uint64]codes.Code{1: codes.Unavailable, 2: codes.Unavailable}; !maps.Equal(got, want) {
		t.Errorf("answers %v, want %v (operation 3 never ran)", got, want)
	}
	if !drained {
		t.Error("no drain was sent")
	}
	testkit.Until(t, "the abandoned handlers to end", func() bool { return f.running.Load() == 0 })
}

// BenchmarkMux: Puts of 100-byte values through a Mux, 16 callers at
// once on its one stream (8 per CPU with 2), as the pipelined bench's
// terminal and pkg/client drive it; the handler uses 16 KiB of stack as a
// primary's Put does. Allocations are the client's and the server's.
func BenchmarkMux(b *testing.B) {
	kv := serveB(b, &fake{deep: 16})
	m := kvpipe.NewMux(kv)
	defer m.Close()
	value := make([]byte, 100)
	b.SetParallelism(max(1, 16/runtime.GOMAXPROCS(0)))
	b.ReportAllocs()
	b.ResetTimer()
	// On a shared machine the process's CPU per operation says more than
	// the wall clock's ns/op.
	before := processCPU(b)
	defer func() { b.ReportMetric(float64(processCPU(b)-before)/float64(b.N), "cpu-ns/op") }()
	b.RunParallel(func(pb *testing.PB) {
		ctx := context.Background()
		for pb.Next() {
			if _, err := m.Put(ctx, &walshipv1.PutRequest{Key: "k", Value: value}); err != nil {
				b.Error(err)
				return
			}
		}
	})
}

// processCPU is the CPU time this process has used (user and system).
func processCPU(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
