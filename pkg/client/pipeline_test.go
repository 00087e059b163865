package client_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/walship/walship/app/cluster"
	walshipv1 "github.com/walship/walship/gen/walship/v1"
	"github.com/walship/walship/internal/testkit"
	"github.com/walship/walship/pkg/client"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/encoding"
	grpcproto "google.golang.org/grpc/encoding/proto"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
)

// calls counts what a client sends: unary KVService calls by method,
// Pipeline streams opened, and each Put key sent on a stream.
type calls struct {
	mu      sync.Mutex
	unary   map[string]int
	streams int
	sent    map[string]int // Put key -> sends on Pipeline streams
}

func newCalls() *calls { return &calls{unary: map[string]int{}, sent: map[string]int{}} }

func (c *calls) dialOptions() []grpc.DialOption {
	return []grpc.DialOption{
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithChainUnaryInterceptor(func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
			c.mu.Lock()
			c.unary[method]++
			c.mu.Unlock()
			return invoker(ctx, method, req, reply, cc, opts...)
		}),
		grpc.WithChainStreamInterceptor(func(ctx context.Context, desc *grpc.StreamDesc, cc *grpc.ClientConn, method string, streamer grpc.Streamer, opts ...grpc.CallOption) (grpc.ClientStream, error) {
			s, err := streamer(ctx, desc, cc, method, opts...)
			if err == nil && strings.HasSuffix(method, "/Pipeline") {
				c.mu.Lock()
				c.streams++
				c.mu.Unlock()
			}
			return s, err
		}),
		// The Mux sends operations it has encoded already (as a
		// message's unknown fields): counted from the bytes sent.
		grpc.WithDefaultCallOptions(grpc.ForceCodecV2(countingCodec{encoding.GetCodecV2(grpcproto.Name), c})),
	}
}

// countingCodec is gRPC's protobuf codec, counting the Put keys of each
// Pipeline message it encodes (those its more carries included).
type countingCodec struct {
	encoding.CodecV2
	c *calls
}

func (cc countingCodec) Marshal(v any) (mem.BufferSlice, error) {
	b, err := cc.CodecV2.Marshal(v)
	if _, ok := v.(*walshipv1.PipelineRequest); ok && err == nil {
		r := &walshipv1.PipelineRequest{}
		if err := proto.Unmarshal(b.Materialize(), r); err != nil {
			return nil, err
		}
		cc.c.mu.Lock()
		for _, op := range append([]*walshipv1.PipelineRequest{r}, r.GetMore()...) {
			if op.GetPut() != nil {
				cc.c.sent[op.GetPut().GetKey()]++
			}
		}
		cc.c.mu.Unlock()
	}
	return b, err
}

// TestPipelinedConcurrentCallers: many concurrent callers of a pipelining
// client share its stream (no unary write goes out); every write they
// were answered for is there afterwards, with what it wrote.
func TestPipelinedConcurrentCallers(t *testing.T) {
	c, err := cluster.Start(t.Context(), cluster.Config{Dir: t.TempDir(), LogStores: 1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Stop() })
	seen := newCalls()
	cl, err := client.New([]string{c.Primary.Addr}, client.Options{DialOptions: seen.dialOptions()})
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	const callers, each = 32, 30
	type acked struct {
		key   string
		value string // "" for a delete
		lsn   uint64
	}
	results := make([][]acked, callers)
	var wg sync.WaitGroup
	for i := range callers {
		wg.Go(func() {
			for j := range each {
				key, value := fmt.Sprintf("p/%02d/%03d", i, j), fmt.Sprintf("v%d.%d", i, j)
				var lsn uint64
				var err error
				switch j % 3 {
				case 0:
					lsn, err = cl.Put(ctx, key, []byte(value), nil)
				case 1:
					// Put then delete: the key is gone afterwards.
					if _, err = cl.Put(ctx, key, []byte(value), nil); err == nil {
						lsn, _, err = cl.Delete(ctx, key, nil)
						value = ""
					}
				case 2:
					var r *walshipv1.TxnResponse
					r, err = cl.Txn(ctx, &walshipv1.TxnRequest{
						Compares: []*walshipv1.Compare{{Key: key, Target: walshipv1.CompareTarget_COMPARE_TARGET_EXISTS, Result: walshipv1.CompareResult_COMPARE_RESULT_EQUAL, Operand: &walshipv1.Compare_Exists{Exists: false}}},
						Success:  []*walshipv1.TxnOp{{Op: &walshipv1.TxnOp_Put{Put: &walshipv1.PutOp{Key: key, Value: []byte(value)}}}},
					})
					if err == nil && !r.GetSucceeded() {
						err = fmt.Errorf("txn on new key %s did not succeed", key)
					}
					lsn = r.GetLsn()
				}
				if err != nil {
					t.Errorf("%s: %v", key, err)
					return
				}
				results[i] = append(results[i], acked{key, value, lsn})
			}
		})
	}
	wg.Wait()
	if t.Failed() {
		return
	}
	kv := walshipv1.NewKVServiceClient(c.Conn(c.Primary))
	lsns := map[uint64]string{}
	for _, rs := range results {
		for _, a := range rs {
			if other, dup := lsns[a.lsn]; dup || a.lsn == 0 {
				t.Errorf("%s answered LSN %d, as %s was", a.key, a.lsn, other)
			}
			lsns[a.lsn] = a.key
			g, err := kv.Get(ctx, &walshipv1.GetRequest{Key: a.key})
			if err != nil {
				t.Fatal(err)
			}
			if g.GetFound() != (a.value != "") || string(g.GetValue()) != a.value {
				t.Errorf("%s: found %v value %q; want %q", a.key, g.GetFound(), g.GetValue(), a.value)
			}
		}
	}
	seen.mu.Lock()
	defer seen.mu.Unlock()
	for m, n := range seen.unary {
		if strings.Contains(m, "KVService") {
			t.Errorf("%d unary %s calls; want every write on the stream", n, m)
		}
	}
	if seen.streams < 1 || len(seen.sent) != callers*each*2/3 {
		t.Errorf("%d streams, %d Put keys sent on them; want >= 1 and %d", seen.streams, len(seen.sent), callers*each*2/3)
	}
}

// TestPipelinedBadInputAsUnary: a bad request fails on the stream with
// the unary call's code and message, which names the field.
func TestPipelinedBadInputAsUnary(t *testing.T) {
	c, err := cluster.Start(t.Context(), cluster.Config{Dir: t.TempDir(), LogStores: 1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Stop() })
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	clients := map[bool]*client.Client{}
	for _, piped := range []bool{false, true} {
		cl, err := client.New([]string{c.Primary.Addr}, client.Options{Unary: !piped})
		if err != nil {
			t.Fatal(err)
		}
		defer cl.Close()
		clients[piped] = cl
	}
	badPut := &walshipv1.TxnOp{Op: &walshipv1.TxnOp_Put{Put: &walshipv1.PutOp{Key: ""}}}
	for _, tc := range []struct {
		name  string
		field string
		call  func(*client.Client) error
	}{
		{"empty key", "key", func(cl *client.Client) error { _, err := cl.Put(ctx, "", []byte("v"), nil); return err }},
		{"value too big", "value", func(cl *client.Client) error {
			_, err := cl.Put(ctx, "k", make([]byte, 1<<20+1), nil)
			return err
		}},
		{"delete key", "key", func(cl *client.Client) error { _, _, err := cl.Delete(ctx, strings.Repeat("k", 5000), nil); return err }},
		{"txn op", "success[0].put.key", func(cl *client.Client) error {
			_, err := cl.Txn(ctx, &walshipv1.TxnRequest{Success: []*walshipv1.TxnOp{badPut}})
			return err
		}},
		{"policy", "policy", func(cl *client.Client) error {
			_, err := cl.Put(ctx, "k", nil, &walshipv1.CommitPolicy{Durability: walshipv1.Durability(99)})
			return err
		}},
	} {
		unary, piped := status.Convert(errors.Unwrap(tc.call(clients[false]))), status.Convert(errors.Unwrap(tc.call(clients[true])))
		if piped.Code() != codes.InvalidArgument || !strings.Contains(piped.Message(), tc.field) {
			t.Errorf("%s: pipelined %v; want INVALID_ARGUMENT naming %s", tc.name, piped.Err(), tc.field)
		}
		if piped.Code() != unary.Code() || piped.Message() != unary.Message() {
			t.Errorf("%s: pipelined %v, unary %v; want the same", tc.name, piped.Err(), unary.Err())
		}
	}
}

// TestPipelineStream drives the stream itself: answers carry their ids,
// an operation without an op or with a bad timeout fails naming the
// field, and a replica refuses writes naming the primary while serving
// reads, as its unary calls do.
func TestPipelineStream(t *testing.T) {
	c, err := cluster.Start(t.Context(), cluster.Config{Dir: t.TempDir(), LogStores: 1, Replicas: 1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Stop() })
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	exchange := func(n *cluster.Node, reqs ...*walshipv1.PipelineRequest) map[uint64]*walshipv1.PipelineResponse {
		t.Helper()
		s, err := walshipv1.NewKVServiceClient(c.Conn(n)).Pipeline(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range reqs {
			if err := s.Send(r); err != nil {
				t.Fatal(err)
			}
		}
		if err := s.CloseSend(); err != nil {
			t.Fatal(err)
		}
		out := map[uint64]*walshipv1.PipelineResponse{}
		for {
			r, err := s.Recv()
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				t.Fatal(err)
			}
			out[r.GetId()] = r
		}
		if len(out) != len(reqs) {
			t.Fatalf("%d answers to %d requests: %v", len(out), len(reqs), out)
		}
		return out
	}
	put := func(id uint64, key string) *walshipv1.PipelineRequest {
		return &walshipv1.PipelineRequest{Id: id, Op: &walshipv1.PipelineRequest_Put{Put: &walshipv1.PutRequest{Key: key, Value: []byte("v")}}}
	}
	got := exchange(c.Primary,
		put(7, "a"), put(3, "b"),
		&walshipv1.PipelineRequest{Id: 9},
		&walshipv1.PipelineRequest{Id: 11, Op: put(0, "c").Op, Timeout: durationpb.New(-time.Second)},
		&walshipv1.PipelineRequest{Id: 12, Op: &walshipv1.PipelineRequest_Get{Get: &walshipv1.GetRequest{Key: "a", MinLsn: 1}}},
	)
	if got[7].GetPut().GetLsn() == 0 || got[3].GetPut().GetLsn() == 0 || got[7].GetPut().GetLsn() == got[3].GetPut().GetLsn() {
		t.Errorf("puts answered %v and %v; want two commits", got[7], got[3])
	}
	for id, field := range map[uint64]string{9: "op", 11: "timeout"} {
		if e := got[id].GetError(); codes.Code(e.GetCode()) != codes.InvalidArgument || !strings.HasPrefix(e.GetMessage(), field+":") {
			t.Errorf("request %d answered %v; want INVALID_ARGUMENT naming %s", id, got[id], field)
		}
	}
	if got[12].GetGet() == nil && got[12].GetError() == nil {
		t.Errorf("get answered %v", got[12])
	}
	rep := exchange(c.Replicas[0], put(1, "r"), &walshipv1.PipelineRequest{Id: 2, Op: &walshipv1.PipelineRequest_Get{Get: &walshipv1.GetRequest{Key: "a",
		MinLsn: got[7].GetPut().GetLsn(), WaitTimeout: durationpb.New(30 * time.Second)}}})
	if e := rep[1].GetError(); codes.Code(e.GetCode()) != codes.FailedPrecondition || !strings.Contains(e.GetMessage(), c.Primary.Addr) {
		t.Errorf("replica answered a put %v; want FAILED_PRECONDITION naming the primary %s", rep[1], c.Primary.Addr)
	}
	if g := rep[2].GetGet(); !g.GetFound() || string(g.GetValue()) != "v" {
		t.Errorf("replica answered a get %v; want a's value", rep[2])
	}
}

// TestPipelineBrokenMidFlight: when the connection under a pipelining
// client's stream breaks with writes in flight, each of those writes
// fails with an *UnknownOutcomeError — none hangs, none is retried, none
// is reported as applied or not applied — and every write acknowledged is
// there. (A write still waiting in the client to be sent when the stream
// broke was never sent: it goes on a new stream and is answered there.)
func TestPipelineBrokenMidFlight(t *testing.T) {
	c, err := cluster.Start(t.Context(), cluster.Config{Dir: t.TempDir(), LogStores: 1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Stop() })
	px := newProxy(t, c.Primary.Addr)
	seen := newCalls()
	cl, err := client.New([]string{px.addr()}, client.Options{DialOptions: seen.dialOptions(), Retry: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	const writers = 16
	var inFlight, done atomic.Int64
	var stop atomic.Bool
	var mu sync.Mutex
	acked := map[string]bool{}
	var unknown []string
	var wg sync.WaitGroup
	for i := range writers {
		wg.Go(func() {
			for j := 0; !stop.Load(); j++ {
				key := fmt.Sprintf("m/%02d/%05d", i, j)
				inFlight.Add(1)
				_, err := cl.Put(ctx, key, []byte(key), nil)
				inFlight.Add(-1)
				done.Add(1)
				var u *client.UnknownOutcomeError
				mu.Lock()
				switch {
				case err == nil:
					acked[key] = true
				case errors.As(err, &u):
					unknown = append(unknown, key)
				default:
					t.Errorf("%s: %v; want success or an unknown outcome", key, err)
				}
				mu.Unlock()
			}
		})
	}
	testkit.Until(t, "writes acknowledged", func() bool { return done.Load() >= 200 })
	// Hold the primary's answers back until every writer waits for one,
	// then cut the connection under them.
	px.hold()
	testkit.Until(t, "every writer waiting for an answer", func() bool { return inFlight.Load() == writers })
	stop.Store(true)
	px.cut()
	wg.Wait()
	// A message one writer took to send may reach gRPC (and the counting
	// codec) after the stream's end answered its operations with an
	// unknown outcome: the send that then fails is still the one send.
	// Closing waits for the client's sends to finish.
	if err := cl.Close(); err != nil {
		t.Fatal(err)
	}

	mu.Lock()
	defer mu.Unlock()
	// Every writer waited for an answer at the cut, but an answer that
	// had passed the proxy before it held may still have been on its way:
	// such a write succeeded. The others are unknown.
	if len(unknown) < 1 || len(unknown) > writers {
		t.Errorf("%d writes with an unknown outcome (%v); want 1..%d, those in flight", len(unknown), unknown, writers)
	}
	seen.mu.Lock()
	for _, k := range unknown {
		if n := seen.sent[k]; n != 1 {
			t.Errorf("%s, of unknown outcome, sent %d times; want once (never retried)", k, n)
		}
	}
	seen.mu.Unlock()
	kv := walshipv1.NewKVServiceClient(c.Conn(c.Primary))
	present := 0
	for start := "m/"; ; {
		r, err := kv.Scan(ctx, &walshipv1.ScanRequest{Start: start, End: "m0", Limit: 1000})
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range r.GetKvs() {
			present++
			if string(p.GetValue()) != p.GetKey() {
				t.Errorf("%s = %q", p.GetKey(), p.GetValue())
			}
			delete(acked, p.GetKey())
		}
		if !r.GetMore() {
			break
		}
		start = r.GetKvs()[len(r.GetKvs())-1].GetKey() + "\x00"
	}
	if len(acked) > 0 {
		t.Errorf("%d acknowledged writes missing, e.g. %v", len(acked), acked)
	}
	t.Logf("%d writes present, %d of unknown outcome", present, len(unknown))
}

// proxy forwards TCP connections to a server; it can hold back what the
// server sends and cut every connection.
type proxy struct {
	t    *testing.T
	lis  net.Listener
	to   string
	mu   sync.Mutex
	held bool
	cond *sync.Cond
	open []net.Conn
	wg   sync.WaitGroup
}

func newProxy(t *testing.T, to string) *proxy {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &proxy{t: t, lis: lis, to: to}
	p.cond = sync.NewCond(&p.mu)
	p.wg.Go(p.accept)
	t.Cleanup(func() {
		lis.Close()
		p.cut()
		p.wg.Wait()
	})
	return p
}

func (p *proxy) addr() string { return p.lis.Addr().String() }

func (p *proxy) accept() {
	for {
		in, err := p.lis.Accept()
		if err != nil {
			return
		}
		out, err := net.Dial("tcp", p.to)
		if err != nil {
			in.Close()
			continue
		}
		p.mu.Lock()
		p.open = append(p.open, in, out)
		p.mu.Unlock()
		p.wg.Go(func() { _, _ = io.Copy(out, in); out.Close() })
		p.wg.Go(func() { p.back(in, out); in.Close() })
	}
}

// back copies what the server sends to the client, waiting while held.
func (p *proxy) back(in, out net.Conn) {
	buf := make([]byte, 32<<10)
	for {
		n, err := out.Read(buf)
		if n > 0 {
			// Written under the lock: once hold returns, nothing more
			// reaches the client.
			p.mu.Lock()
			for p.held {
				p.cond.Wait()
			}
			_, werr := in.Write(buf[:n])
			p.mu.Unlock()
			if werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

func (p *proxy) hold() {
	p.mu.Lock()
	p.held = true
	p.mu.Unlock()
}

// cut closes every connection and lets later ones through.
func (p *proxy) cut() {
	p.mu.Lock()
	for _, c := range p.open {
		c.Close()
	}
	p.open = nil
	p.held = false
	p.cond.Broadcast()
	p.mu.Unlock()
}
