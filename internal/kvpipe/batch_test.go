package kvpipe_test

import (
	"context"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	walshipv1 "github.com/walship/walship/gen/walship/v1"
	"github.com/walship/walship/internal/kvpipe"
	"github.com/walship/walship/internal/testkit"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
)

func putReq(id uint64, key string) *walshipv1.PipelineRequest {
	return &walshipv1.PipelineRequest{Id: id, Op: &walshipv1.PipelineRequest_Put{Put: &walshipv1.PutRequest{Key: key}}}
}

// flatten is a response and those it carries in more.
func flatten(r *walshipv1.PipelineResponse) []*walshipv1.PipelineResponse {
	return append([]*walshipv1.PipelineResponse{r}, r.GetMore()...)
}

// TestServeBatchedRequests: the server says it reads operations carried
// in more; a message of six held Puts and a failing Delete, with maxOps
// 2, runs two at a time and answers each once, by its id, as if each had
// come alone; answers come several to a message only for a client that
// asked (its header).
func TestServeBatchedRequests(t *testing.T) {
	for _, asks := range []bool{false, true} {
		f := &fake{maxOps: 2, release: make(chan struct{})}
		kv := serve(t, f)
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if asks {
			ctx = metadata.AppendToOutgoingContext(ctx, kvpipe.BatchHeader, "1")
		}
		s, err := kv.Pipeline(ctx)
		if err != nil {
			t.Fatal(err)
		}
		md, err := s.Header()
		if err != nil {
			t.Fatal(err)
		}
		if v := md.Get(kvpipe.BatchHeader); len(v) != 1 || v[0] != "1" {
			t.Fatalf("header %s: %q; want \"1\"", kvpipe.BatchHeader, v)
		}
		msg := putReq(1, "slow/1")
		for id := uint64(2); id <= 6; id++ {
			msg.More = append(msg.More, putReq(id, "slow/x"))
		}
		msg.More = append(msg.More, &walshipv1.PipelineRequest{Id: 7, Op: &walshipv1.PipelineRequest_Delete{Delete: &walshipv1.DeleteRequest{Key: "k"}}})
		if err := s.Send(msg); err != nil {
			t.Fatal(err)
		}
		if err := s.CloseSend(); err != nil {
			t.Fatal(err)
		}
		testkit.Until(t, "two operations held", func() bool { return f.running.Load() == 2 })
		// Release every held Put at once, so that answers are ready
		// together.
		go func() {
			for range 6 {
				f.release <- struct{}{}
			}
		}()
		answered := map[uint64]bool{}
		for {
			r, err := s.Recv()
			if err != nil {
				break
			}
			if !asks && len(r.GetMore()) > 0 {
				t.Errorf("answer %v carries more to a client that did not ask", r)
			}
			for _, a := range flatten(r) {
				if answered[a.GetId()] {
					t.Errorf("operation %d answered twice", a.GetId())
				}
				answered[a.GetId()] = true
				if a.GetId() == 7 {
					if a.GetError().GetCode() != int32(codes.Unavailable) {
						t.Errorf("delete's answer %v; want the unary call's UNAVAILABLE", a)
					}
				} else if a.GetPut().GetLsn() == 0 {
					t.Errorf("answer %v; want a put's", a)
				}
			}
		}
		if len(answered) != 7 {
			t.Errorf("client asks %v: answered %v; want 1..7", asks, answered)
		}
		if m := f.maxSeen.Load(); m != 2 {
			t.Errorf("%d operations ran at once; want at most (and here exactly) 2", m)
		}
	}
}

// TestServeRefusesNestedMore: an operation carried in more that carries
// more of its own ends the stream INVALID_ARGUMENT naming the field.
func TestServeRefusesNestedMore(t *testing.T) {
	kv := serve(t, &fake{})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s, err := kv.Pipeline(ctx)
	if err != nil {
		t.Fatal(err)
	}
	inner := putReq(3, "a")
	inner.More = []*walshipv1.PipelineRequest{putReq(4, "b")}
	if err := s.Send(&walshipv1.PipelineRequest{Id: 1, Op: &walshipv1.PipelineRequest_Put{Put: &walshipv1.PutRequest{Key: "k"}},
		More: []*walshipv1.PipelineRequest{putReq(2, "c"), inner}}); err != nil {
		t.Fatal(err)
	}
	for {
		r, err := s.Recv()
		if err == nil {
			t.Fatalf("answer %v to a message refused whole", r)
		}
		if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "more[1].more") {
			t.Fatalf("stream ended %v; want INVALID_ARGUMENT naming more[1].more", err)
		}
		return
	}
}

// holdingKV is a KVServiceClient whose Pipeline streams hold the nth
// message sent (counting from 1 over all its streams), for each gate in
// hold, until that gate is released.
type holdingKV struct {
	walshipv1.KVServiceClient
	hold map[int]*gate

	mu sync.Mutex
	n  int
}

// gate holds one message: holding is closed once it is held, release
// lets it go.
type gate struct{ holding, release chan struct{} }

func newGate() *gate { return &gate{holding: make(chan struct{}), release: make(chan struct{})} }

func (h *holdingKV) Pipeline(ctx context.Context, opts ...grpc.CallOption) (walshipv1.KVService_PipelineClient, error) {
	s, err := h.KVServiceClient.Pipeline(ctx, opts...)
	if err != nil {
		return nil, err
	}
	return &holdingStream{KVService_PipelineClient: s, h: h}, nil
}

type holdingStream struct {
	walshipv1.KVService_PipelineClient
	h *holdingKV
}

func (s *holdingStream) Send(r *walshipv1.PipelineRequest) error {
	s.h.mu.Lock()
	s.h.n++
	g := s.h.hold[s.h.n]
	s.h.mu.Unlock()
	if g != nil {
		close(g.holding)
		<-g.release
	}
	return s.KVService_PipelineClient.Send(r)
}

// received records, on the server, how many operations each message of
// a Pipeline stream carried; with older, the server does not say it takes
// several to a message (its header has no BatchHeader), as an older one.
type received struct {
	older bool
	mu    sync.Mutex
	ops   []int
}

func (r *received) interceptor(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
	return handler(srv, receivedStream{ss, r})
}

func (r *received) messages() []int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.ops)
}

type receivedStream struct {
	grpc.ServerStream
	r *received
}

func (s receivedStream) SendHeader(md metadata.MD) error {
	if s.r.older {
		md = md.Copy()
		md.Delete(kvpipe.BatchHeader)
	}
	return s.ServerStream.SendHeader(md)
}

func (s receivedStream) RecvMsg(m any) error {
	err := s.ServerStream.RecvMsg(m)
	if req, ok := m.(*walshipv1.PipelineRequest); ok && err == nil {
		s.r.mu.Lock()
		s.r.ops = append(s.r.ops, 1+len(req.GetMore()))
		s.r.mu.Unlock()
	}
	return err
}

// TestMuxSendsQueuedCallsTogether: calls made while another's is being
// sent go together in the next message, and each is answered as its
// own; one among them that does not marshal (a key that is not UTF-8)
// fails INTERNAL at once, as its unary call would, nothing being sent for
// it, and the others go on the same stream. A server that
// does not say it takes several operations to a message (an older one)
// gets one per message.
func TestMuxSendsQueuedCallsTogether(t *testing.T) {
	for _, tc := range []struct {
		name       string
		older, bad bool
		want       []int // operations per message
	}{
		{name: "batched", want: []int{1, 5}},
		{name: "one does not marshal", bad: true, want: []int{1, 4}},
		{name: "older server", older: true, want: []int{1, 1, 1, 1, 1, 1}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rec := &received{older: tc.older}
			kv := serveWith(t, &fake{}, grpc.StreamInterceptor(rec.interceptor))
			g := newGate()
			h := &holdingKV{KVServiceClient: kv, hold: map[int]*gate{1: g}}
			m := kvpipe.NewMux(h)
			defer m.Close()
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			type result struct {
				key string
				err error
			}
			results := make(chan result, 6)
			put := func(key string) {
				_, err := m.Put(ctx, &walshipv1.PutRequest{Key: key})
				results <- result{key, err}
			}
			go put("first")
			<-g.holding
			keys := []string{"a", "b", "c", "d", "e"}
			queued := 5
			if tc.bad {
				keys[2] = "\xff"
				queued = 4
			}
			for _, k := range keys {
				go put(k)
			}
			testkit.Until(t, "the calls queued behind the held send", func() bool { return m.Queued() == queued })
			close(g.release)
			for range 6 {
				r := <-results
				switch {
				case r.key == "\xff":
					if status.Code(r.err) != codes.Internal || !strings.Contains(r.err.Error(), "UTF-8") {
						t.Errorf("Put of a key that is not UTF-8: %v; want INTERNAL", r.err)
					}
				case r.err != nil:
					t.Errorf("Put %q: %v", r.key, r.err)
				}
			}
			if got := rec.messages(); !slices.Equal(got, tc.want) {
				t.Errorf("operations per message %v; want %v", got, tc.want)
			}
		})
	}
}

// sendRecorder is a Pipeline server stream that records how many answers
// each message sent carried.
type sendRecorder struct {
	walshipv1.KVService_PipelineServer
	answers []int
}

func (s *sendRecorder) Send(r *walshipv1.PipelineResponse) error {
	s.answers = append(s.answers, 1+len(r.GetMore()))
	return nil
}

// TestSendAnswersTogether: answers ready together go in one message, up
// to maxBatchBytes (64 KiB): one too large to join starts the next
// message, alone if it is larger than the bound; without
// batch, one to a message. Every answer's slot is freed.
func TestSendAnswersTogether(t *testing.T) {
	put := func(id uint64) *walshipv1.PipelineResponse {
		return &walshipv1.PipelineResponse{Id: id, Result: &walshipv1.PipelineResponse_Put{Put: &walshipv1.PutResponse{Lsn: id}}}
	}
	big := &walshipv1.PipelineResponse{Id: 6, Result: &walshipv1.PipelineResponse_Get{Get: &walshipv1.GetResponse{Value: make([]byte, 70<<10)}}}
	for _, tc := range []struct {
		batch bool
		want  []int
	}{
		{batch: true, want: []int{5, 1, 2, 1}},
		{batch: false, want: []int{1, 1, 1, 1, 1, 1, 1, 1, 1}},
	} {
		list := []*walshipv1.PipelineResponse{put(1), put(2), put(3), put(4), put(5), big, put(7), put(8), big}
		answers := make(chan *walshipv1.PipelineResponse, len(list))
		slots := make(chan struct{}, len(list))
		for _, a := range list {
			answers <- proto.Clone(a).(*walshipv1.PipelineResponse)
			slots <- struct{}{}
		}
		close(answers)
		s := &sendRecorder{}
		if err := kvpipe.SendAnswers(s, answers, slots, tc.batch); err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(s.answers, tc.want) {
			t.Errorf("batch %v: answers per message %v; want %v", tc.batch, s.answers, tc.want)
		}
		if len(slots) != 0 {
			t.Errorf("batch %v: %d slots still held; want every one freed", tc.batch, len(slots))
		}
	}
}

// TestMuxCallerMayReuseItsRequest: a call that gives up while its
// operation waits to be sent returns, and its caller may change the
// request at once: what is sent is what the call was given (its
// operation, then its cancel).
func TestMuxCallerMayReuseItsRequest(t *testing.T) {
	var mu sync.Mutex
	var keys []string // Put keys the server ran
	kv := serveWith(t, &fake{}, grpc.StreamInterceptor(func(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		return handler(srv, keysStream{ServerStream: ss, keys: func(k string) { mu.Lock(); keys = append(keys, k); mu.Unlock() }})
	}))
	g := newGate()
	m := kvpipe.NewMux(&holdingKV{KVServiceClient: kv, hold: map[int]*gate{1: g}})
	defer m.Close()
	done := goPut(context.Background(), m, "first")
	<-g.holding
	ctx, cancel := context.WithCancel(context.Background())
	req := &walshipv1.PutRequest{Key: "given"}
	gaveUp := make(chan error, 1)
	go func() {
		_, err := m.Put(ctx, req)
		gaveUp <- err
	}()
	testkit.Until(t, "the call queued behind the held send", func() bool { return m.Queued() == 1 })
	cancel()
	if err := <-gaveUp; status.Code(err) != codes.Canceled {
		t.Fatalf("the call that gave up: %v; want CANCELED", err)
	}
	req.Key = "changed" // the caller's, once the call returned
	close(g.release)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	testkit.Until(t, "the server to read both operations and the cancel", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(keys) == 2
	})
	mu.Lock()
	defer mu.Unlock()
	if !slices.Equal(keys, []string{"first", "given"}) {
		t.Errorf("the server read Puts of %q; want [first given]", keys)
	}
}

// keysStream reports the key of each Put a Pipeline stream receives.
type keysStream struct {
	grpc.ServerStream
	keys func(string)
}

func (s keysStream) RecvMsg(m any) error {
	err := s.ServerStream.RecvMsg(m)
	if req, ok := m.(*walshipv1.PipelineRequest); ok && err == nil {
		for _, op := range append([]*walshipv1.PipelineRequest{req}, req.GetMore()...) {
			if op.GetPut() != nil {
				s.keys(op.GetPut().GetKey())
			}
		}
	}
	return err
}

// TestMuxCallerSendsOnlyItsRound: a caller that sends sends the messages
// waiting when it began, its own among them, and leaves those queued
// meanwhile to the stream's sender: it is answered and returns while a
// later caller's message is still held in sending.
func TestMuxCallerSendsOnlyItsRound(t *testing.T) {
	g1, g2 := newGate(), newGate()
	m := kvpipe.NewMux(&holdingKV{KVServiceClient: serve(t, &fake{}), hold: map[int]*gate{1: g1, 2: g2}})
	defer m.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	first := goPut(ctx, m, "first")
	<-g1.holding
	second := goPut(ctx, m, "second")
	testkit.Until(t, "the second call queued behind the first's send", func() bool { return m.Queued() == 1 })
	close(g1.release)
	<-g2.holding
	select {
	case err := <-first:
		if err != nil {
			t.Fatal(err)
		}
	case <-ctx.Done():
		t.Fatal("the first call did not return while the second's message was held: it is sending others'")
	}
	close(g2.release)
	if err := <-second; err != nil {
		t.Fatal(err)
	}
}

// TestMuxResendsWhatNeverWent: when a stream ends, a call whose operation
// was still waiting in the Mux to be sent sends it again on a new stream
// and is answered there (it was never sent: its outcome is known), while
// the call whose message was being sent fails with the stream's error
// (its outcome unknown); the server runs the resent operation once.
func TestMuxResendsWhatNeverWent(t *testing.T) {
	var mu sync.Mutex
	var keys []string
	var streams atomic.Int64
	broken := make(chan struct{})
	kv := serveWith(t, &fake{}, grpc.StreamInterceptor(func(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		ks := keysStream{ServerStream: ss, keys: func(k string) { mu.Lock(); keys = append(keys, k); mu.Unlock() }}
		if streams.Add(1) > 1 {
			return handler(srv, ks)
		}
		done := make(chan error, 1)
		go func() { done <- handler(srv, ks) }()
		select {
		case err := <-done:
			return err
		case <-broken:
			return status.Error(codes.Unavailable, "the first stream breaks")
		}
	}))
	g := newGate()
	m := kvpipe.NewMux(&holdingKV{KVServiceClient: kv, hold: map[int]*gate{1: g}})
	defer m.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	first := goPut(ctx, m, "first")
	<-g.holding
	second := goPut(ctx, m, "second")
	testkit.Until(t, "the second call queued behind the first's send", func() bool { return m.Queued() == 1 })
	close(broken)
	if err := <-second; err != nil {
		t.Fatalf("the call whose operation never went: %v; want it sent on a new stream and answered", err)
	}
	close(g.release)
	if err := <-first; status.Code(err) != codes.Unavailable {
		t.Fatalf("the call whose message was being sent: %v; want the stream's UNAVAILABLE", err)
	}
	mu.Lock()
	defer mu.Unlock()
	if !slices.Equal(keys, []string{"second"}) || streams.Load() != 2 {
		t.Errorf("the server read Puts of %q on %d streams; want [second] on 2", keys, streams.Load())
	}
}

// goPut runs a Put of key through m on a goroutine of its own; its error
// comes on the channel returned.
func goPut(ctx context.Context, m *kvpipe.Mux, key string) <-chan error {
	ch := make(chan error, 1)
	go func() {
		_, err := m.Put(ctx, &walshipv1.PutRequest{Key: key})
		ch <- err
	}()
	return ch
}
