package serve

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	walshipv1 "github.com/walship/walship/gen/walship/v1"
	"github.com/walship/walship/internal/kvpipe"
	"github.com/walship/walship/internal/testkit"
	"github.com/walship/walship/internal/tlsid"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	spb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

const testDomain = "serve.test"

// tlsServer is a Server under TLS and the default policy, with a KV
// service whose Put answers at once.
type tlsServer struct {
	*Server
	ca    *tlsid.CA
	certs string
}

type okKV struct {
	walshipv1.UnimplementedKVServiceServer
}

// Get is refused as past a bound, as a read past the waiting-read bound is.
func (okKV) Get(context.Context, *walshipv1.GetRequest) (*walshipv1.GetResponse, error) {
	return nil, status.Error(codes.ResourceExhausted, "min_lsn: too many reads wait")
}

// Put of key "hold" waits until its caller gives up; any other answers
// at once.
func (okKV) Put(ctx context.Context, in *walshipv1.PutRequest) (*walshipv1.PutResponse, error) {
	if in.GetKey() == "hold" {
		<-ctx.Done()
		return nil, status.FromContextError(ctx.Err()).Err()
	}
	return &walshipv1.PutResponse{Lsn: 1}, nil
}

func (okKV) Delete(context.Context, *walshipv1.DeleteRequest) (*walshipv1.DeleteResponse, error) {
	return nil, status.Error(codes.Unimplemented, "no Delete here")
}

func (okKV) Txn(context.Context, *walshipv1.TxnRequest) (*walshipv1.TxnResponse, error) {
	return nil, status.Error(codes.Unimplemented, "no Txn here")
}

// Pipeline runs operations as the nodes do, each counted as a call.
func (k okKV) Pipeline(stream walshipv1.KVService_PipelineServer) error {
	return kvpipe.Serve(stream, k, kvpipe.Limits{Calls: StreamCalls(stream.Context())})
}

func serveTLS(t *testing.T, opts Options) *tlsServer {
	t.Helper()
	ca, err := tlsid.NewCA("serve test", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	ts := &tlsServer{ca: ca, certs: t.TempDir()}
	src, err := tlsid.Load(ts.files(t, tlsid.ClassNode, "server"), nil)
	if err != nil {
		t.Fatal(err)
	}
	az, err := tlsid.NewAuthz(tlsid.AuthzConfig{TrustDomain: testDomain, Reflection: tlsid.ReflectionAll})
	if err != nil {
		t.Fatal(err)
	}
	opts.Listen = "127.0.0.1:0"
	opts.StreamGrace = 50 * time.Millisecond
	opts.Security.TLS, opts.Security.Authz = src, az
	s, err := New(opts, func(g *grpc.Server) { walshipv1.RegisterKVServiceServer(g, okKV{}) })
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Serve(ctx, nil) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	})
	s.SetServing(true)
	ts.Server = s
	return ts
}

// calls is how many calls the server counts for identity id.
func (ts *tlsServer) calls(id string) int {
	ts.adm.calls.mu.Lock()
	defer ts.adm.calls.mu.Unlock()
	return ts.adm.calls.n[id]
}

// files issues a certificate of class and name; class "" has no identity.
func (ts *tlsServer) files(t *testing.T, class, name string) tlsid.Files {
	t.Helper()
	l := tlsid.Leaf{IPs: []net.IP{net.ParseIP("127.0.0.1")}}
	if class != "" {
		l.URI = tlsid.URI(testDomain, class, name)
	}
	f, err := ts.ca.WriteFiles(ts.certs, class+"-"+name, l)
	if err != nil {
		t.Fatal(err)
	}
	return f
}

// dial is a client connection as a certificate of class and name.
func (ts *tlsServer) dial(t *testing.T, class, name string) *grpc.ClientConn {
	t.Helper()
	src, err := tlsid.Load(ts.files(t, class, name), nil)
	if err != nil {
		t.Fatal(err)
	}
	conn, err := grpc.NewClient(ts.Addr(), grpc.WithTransportCredentials(src.Credentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

// openPut starts a Put whose request never comes: gRPC sends a stream's
// headers when it is created, the message only with SendMsg. It returns
// the stream; RecvMsg returns when the server ends it.
func openPut(ctx context.Context, t *testing.T, conn *grpc.ClientConn) grpc.ClientStream {
	t.Helper()
	cs, err := conn.NewStream(ctx, &grpc.StreamDesc{ClientStreams: true, ServerStreams: true}, "/walship.v1.KVService/Put")
	if err != nil {
		t.Fatal(err)
	}
	return cs
}

// TestRefusedOnHeaders: a call the policy refuses fails PERMISSION_DENIED
// on its headers alone, naming the caller and the method, before the
// server reads any of its request — a peer it refuses holds nothing
// there. Without the tap, the server waited for the request (which gRPC
// reads whole, up to the message limit, before authorization) and the
// call ended only at its deadline.
func TestRefusedOnHeaders(t *testing.T) {
	ts := serveTLS(t, Options{})
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	for _, tc := range []struct{ class, want string }{
		{"", "may not call /walship.v1.KVService/Put"},
		{tlsid.ClassLogStore, "spiffe://serve.test/walship/logstore/ls may not call /walship.v1.KVService/Put"},
	} {
		cs := openPut(ctx, t, ts.dial(t, tc.class, "ls"))
		err := cs.RecvMsg(new(walshipv1.PutResponse))
		if status.Code(err) != codes.PermissionDenied || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("a Put without its request, as %q: %v; want PERMISSION_DENIED %q", tc.class, err, tc.want)
		}
	}
	// A method the server does not have is UNIMPLEMENTED, whoever asks.
	for _, class := range []string{"", tlsid.ClassClient} {
		err := ts.dial(t, class, "x").Invoke(ctx, "/walship.v1.NoSuchService/Nothing", &walshipv1.PutRequest{}, new(walshipv1.PutResponse))
		if status.Code(err) != codes.Unimplemented {
			t.Errorf("an unknown method, as %q: %v; want UNIMPLEMENTED", class, err)
		}
	}
	// An allowed caller's call is read and answered as before.
	kv := walshipv1.NewKVServiceClient(ts.dial(t, tlsid.ClassClient, "app"))
	if _, err := kv.Put(ctx, &walshipv1.PutRequest{Key: "k"}); err != nil {
		t.Fatalf("a client's Put: %v", err)
	}
}

// TestPeerCallsAreBounded: one identity that is not a data node has at
// most MaxPeerCalls calls in progress on the server, over all its
// connections; the next fails RESOURCE_EXHAUSTED naming the peer, at once.
// Another identity, and a data node's many calls, are served meanwhile,
// and a call that ends frees its place.
func TestPeerCallsAreBounded(t *testing.T) {
	ts := serveTLS(t, Options{Security: Security{MaxPeerCalls: 6}})
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	a1, a2 := ts.dial(t, tlsid.ClassClient, "a"), ts.dial(t, tlsid.ClassClient, "a")
	hctx, hcancel := context.WithCancel(ctx)
	defer hcancel()
	for i := range 6 {
		conn := a1
		if i%2 == 1 {
			conn = a2
		}
		openPut(hctx, t, conn)
	}
	testkit.Until(t, "the server to count the six calls", func() bool { return ts.calls("spiffe://serve.test/walship/client/a") == 6 })
	kv := walshipv1.NewKVServiceClient(a2)
	_, err := kv.Put(ctx, &walshipv1.PutRequest{Key: "k"})
	if status.Code(err) != codes.ResourceExhausted || !strings.Contains(err.Error(), "spiffe://serve.test/walship/client/a has 6 calls in progress on this server") {
		t.Fatalf("a seventh call: %v; want RESOURCE_EXHAUSTED naming the peer and its calls", err)
	}
	ts.adm.pace.mu.Lock()
	_, paced := ts.adm.pace.next["spiffe://serve.test/walship/client/a"]
	ts.adm.pace.mu.Unlock()
	if !paced {
		t.Error("the refusal did not go through the identity's pacing")
	}
	if _, err := walshipv1.NewKVServiceClient(ts.dial(t, tlsid.ClassClient, "b")).Put(ctx, &walshipv1.PutRequest{Key: "k"}); err != nil {
		t.Fatalf("another identity's call: %v", err)
	}
	node := ts.dial(t, tlsid.ClassNode, "n")
	nctx, ncancel := context.WithCancel(ctx)
	defer ncancel()
	for range 10 {
		openPut(nctx, t, node)
	}
	if _, err := walshipv1.NewKVServiceClient(node).Put(ctx, &walshipv1.PutRequest{Key: "k"}); err != nil {
		t.Fatalf("a data node's 11th call: %v", err)
	}
	// The held calls end: their places are free.
	hcancel()
	testkit.Until(t, "a call of the identity to be served again", func() bool {
		_, err := kv.Put(ctx, &walshipv1.PutRequest{Key: "k"})
		return err == nil
	})
}

// TestPeerConnsAreBounded: one identity has at most MaxPeerConns
// connections; the next is closed after its handshake, while another
// identity connects; a closed connection frees its place.
func TestPeerConnsAreBounded(t *testing.T) {
	ts := serveTLS(t, Options{Security: Security{MaxPeerConns: 3}})
	cfg := func(name string) *tls.Config {
		src, err := tlsid.Load(ts.files(t, tlsid.ClassClient, name), nil)
		if err != nil {
			t.Fatal(err)
		}
		c := src.ClientConfig()
		c.NextProtos = []string{"h2"}
		return c
	}
	// open connects and reads the server's first frame (its settings):
	// an error if the server closed the connection instead.
	open := func(name string) (net.Conn, error) {
		c, err := tls.Dial("tcp", ts.Addr(), cfg(name))
		if err != nil {
			return nil, err
		}
		c.SetReadDeadline(time.Now().Add(10 * time.Second))
		if _, err := io.WriteString(c, "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"); err != nil {
			c.Close()
			return nil, err
		}
		if _, err := c.Read(make([]byte, 9)); err != nil {
			c.Close()
			return nil, err
		}
		return c, nil
	}
	var conns []net.Conn
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	for i := range 3 {
		c, err := open("a")
		if err != nil {
			t.Fatalf("connection %d: %v", i+1, err)
		}
		conns = append(conns, c)
	}
	if c, err := open("a"); err == nil {
		c.Close()
		t.Fatal("a fourth connection of one identity was served")
	}
	c, err := open("b")
	if err != nil {
		t.Fatalf("another identity's connection: %v", err)
	}
	conns = append(conns, c)
	conns[0].Close()
	testkit.Until(t, "a closed connection to free its place", func() bool {
		c, err := open("a")
		if err == nil {
			conns = append(conns, c)
		}
		return err == nil
	})
}

// TestHandshakesAreBounded: connections that never finish their TLS
// handshake hold at most maxHandshakes places; one more is closed at once
// (each pending one would hold its goroutine and buffers for gRPC's
// 120 s), and a handshake that completes afterwards is served.
func TestHandshakesAreBounded(t *testing.T) {
	ts := serveTLS(t, Options{})
	var raw []net.Conn
	closeRaw := func() {
		for _, c := range raw {
			c.Close()
		}
		raw = nil
	}
	defer closeRaw()
	for range maxHandshakes {
		c, err := net.Dial("tcp", ts.Addr())
		if err != nil {
			t.Fatal(err)
		}
		raw = append(raw, c)
	}
	testkit.Until(t, "every pending handshake to hold its place", func() bool {
		if !ts.adm.handshakes.TryAcquire(1) {
			return true
		}
		ts.adm.handshakes.Release(1)
		return false
	})
	c, err := net.Dial("tcp", ts.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := c.Read(make([]byte, 1)); !errors.Is(err, io.EOF) && !errors.Is(err, net.ErrClosed) && !strings.Contains(err.Error(), "reset") {
		t.Fatalf("a connection past the pending handshakes: read %v; want it closed", err)
	}
	closeRaw()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	kv := walshipv1.NewKVServiceClient(ts.dial(t, tlsid.ClassClient, "app"))
	if _, err := kv.Put(ctx, &walshipv1.PutRequest{Key: "k"}, grpc.WaitForReady(true)); err != nil {
		t.Fatalf("a client after the pending handshakes went: %v", err)
	}
}

// TestEdgeTransport: under the default policy, a peer that is not a data
// node is served with the edge transport: a message over
// EdgeMaxMessageBytes fails RESOURCE_EXHAUSTED on its length prefix, and
// its connections take at most MaxPeerCalls streams each; a data node's
// message up to MaxMessageBytes is read and answered.
func TestEdgeTransport(t *testing.T) {
	ts := serveTLS(t, Options{MaxMessageBytes: 4 << 20, EdgeMaxMessageBytes: 64 << 10})
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	big := &walshipv1.PutRequest{Key: "k", Value: make([]byte, 1<<20)}
	client := walshipv1.NewKVServiceClient(ts.dial(t, tlsid.ClassClient, "app"))
	if _, err := client.Put(ctx, big); status.Code(err) != codes.ResourceExhausted {
		t.Errorf("a client's 1 MiB request to a 64 KiB edge: %v; want RESOURCE_EXHAUSTED", err)
	}
	if _, err := client.Put(ctx, &walshipv1.PutRequest{Key: "k", Value: make([]byte, 32<<10)}); err != nil {
		t.Errorf("a client's 32 KiB request: %v", err)
	}
	node := walshipv1.NewKVServiceClient(ts.dial(t, tlsid.ClassNode, "n"))
	if _, err := node.Put(ctx, big); err != nil {
		t.Errorf("a data node's 1 MiB request: %v", err)
	}
}

// TestRefusalsArePaced: an identity's refusals are answered at most one
// every 10 ms — the first at once, a burst spaced out, a pause never
// above a second (nor the queue beyond it) — each identity on its own,
// and one refused now and then is never delayed.
func TestRefusalsArePaced(t *testing.T) {
	now := time.Unix(1000, 0)
	p := &pacer{now: func() time.Time { return now }}
	var got []time.Duration
	for range 4 {
		got = append(got, p.pause("a"))
	}
	if want := []time.Duration{0, 10 * time.Millisecond, 20 * time.Millisecond, 30 * time.Millisecond}; fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("a burst of 4 refusals paused %v; want %v", got, want)
	}
	if d := p.pause("b"); d != 0 {
		t.Fatalf("another identity's first refusal paused %v", d)
	}
	for range 200 {
		p.pause("a")
	}
	if d := p.pause("a"); d != time.Second {
		t.Fatalf("after 204 refusals at once: pause %v; want the longest, 1s", d)
	}
	now = now.Add(time.Second + 10*time.Millisecond)
	if d := p.pause("a"); d != 0 {
		t.Fatalf("a refusal after the queue drained paused %v", d)
	}
	now = now.Add(time.Minute)
	for range 3 {
		if d := p.pause("c"); d > 20*time.Millisecond {
			t.Fatalf("a refusal now and then paused %v", d)
		}
		now = now.Add(10 * time.Millisecond)
	}
}

// TestNodesRefusalsArePaced: a handler's RESOURCE_EXHAUSTED to a data
// node — whose calls are not counted — is paced like any identity's: a
// node certificate refused over and over cannot make a server answer
// refusals as fast as it asks.
func TestNodesRefusalsArePaced(t *testing.T) {
	ts := serveTLS(t, Options{})
	kv := walshipv1.NewKVServiceClient(ts.dial(t, tlsid.ClassNode, "n1"))
	for range 3 {
		if _, err := kv.Get(t.Context(), &walshipv1.GetRequest{Key: "k"}); status.Code(err) != codes.ResourceExhausted {
			t.Fatalf("Get: %v", err)
		}
	}
	ts.adm.pace.mu.Lock()
	defer ts.adm.pace.mu.Unlock()
	if _, ok := ts.adm.pace.next["spiffe://serve.test/walship/node/n1"]; !ok {
		t.Fatalf("three refusals of a node were not paced: the pacer knows %v", ts.adm.pace.next)
	}
}

// TestPipelineOpsAreCalls: each operation in progress on a Pipeline
// stream is one of its peer's calls (the stream's own call stands for
// the first), so a peer cannot hold more through streams than through
// unary calls. The server tells the client its limit; with it reached on
// one stream, the peer's next unary call and the stream's next operation
// are refused RESOURCE_EXHAUSTED naming --max-peer-calls; an operation
// that ends frees its call. Before, a stream counted once however many
// operations it carried: the peer's unary Put went through.
func TestPipelineOpsAreCalls(t *testing.T) {
	ts := serveTLS(t, Options{Security: Security{MaxPeerCalls: 4}})
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	const id = "spiffe://serve.test/walship/client/a"
	conn := ts.dial(t, tlsid.ClassClient, "a")
	kv := walshipv1.NewKVServiceClient(conn)
	s, err := kv.Pipeline(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if md, err := s.Header(); err != nil || fmt.Sprint(md.Get(kvpipe.MaxOpsHeader)) != "[4]" {
		t.Fatalf("header %v, %v; want %s: 4, the peer's limit", md, err, kvpipe.MaxOpsHeader)
	}
	hold := func(id uint64) *walshipv1.PipelineRequest {
		return &walshipv1.PipelineRequest{Id: id, Op: &walshipv1.PipelineRequest_Put{Put: &walshipv1.PutRequest{Key: "hold"}}}
	}
	for i := range uint64(4) {
		if err := s.Send(hold(i + 1)); err != nil {
			t.Fatal(err)
		}
	}
	testkit.Until(t, "the server to count the four operations", func() bool { return ts.calls(id) == 4 })
	_, err = kv.Put(ctx, &walshipv1.PutRequest{Key: "k"})
	want := "has 4 calls in progress on this server, the most one peer may (--max-peer-calls)"
	if status.Code(err) != codes.ResourceExhausted || !strings.Contains(err.Error(), want) || !saysNotApplied(status.Convert(err)) {
		t.Fatalf("a unary Put with four operations in progress: %v; want RESOURCE_EXHAUSTED %q, not applied", err, want)
	}
	if err := s.Send(hold(5)); err != nil {
		t.Fatal(err)
	}
	r, err := s.Recv()
	if err != nil || r.GetId() != 5 || codes.Code(r.GetError().GetCode()) != codes.ResourceExhausted || !strings.Contains(r.GetError().GetMessage(), want) ||
		!saysNotApplied(status.FromProto(&spb.Status{Code: r.GetError().GetCode(), Message: r.GetError().GetMessage(), Details: r.GetError().GetDetails()})) {
		t.Fatalf("a fifth operation: %v, %v; want it refused RESOURCE_EXHAUSTED %q, not applied", r, err, want)
	}
	if err := s.Send(&walshipv1.PipelineRequest{Id: 1, Op: &walshipv1.PipelineRequest_Cancel{Cancel: &walshipv1.PipelineCancel{}}}); err != nil {
		t.Fatal(err)
	}
	if r, err := s.Recv(); err != nil || r.GetId() != 1 || codes.Code(r.GetError().GetCode()) != codes.Canceled {
		t.Fatalf("the cancelled operation: %v, %v; want it CANCELED", r, err)
	}
	testkit.Until(t, "the cancelled operation's call to be freed", func() bool { return ts.calls(id) == 3 })
	if _, err := kv.Put(ctx, &walshipv1.PutRequest{Key: "k"}); err != nil {
		t.Fatalf("a unary Put with three operations in progress: %v", err)
	}
	cancel()
	testkit.Until(t, "the stream's calls to be freed", func() bool { return ts.calls(id) == 0 })
}

// saysNotApplied reports whether st carries the ErrorInfo that says the
// call did not run (rpcerr.NotApplied), which pkg/client reads.
func saysNotApplied(st *status.Status) bool {
	for _, d := range st.Details() {
		if ei, ok := d.(*errdetails.ErrorInfo); ok && ei.GetMetadata()["outcome"] == "not_applied" {
			return true
		}
	}
	return false
}

// okMembers answers every ChangeMembers: what reaches it was authorized.
type okMembers struct {
	walshipv1.UnimplementedAdminServiceServer
}

func (okMembers) ChangeMembers(context.Context, *walshipv1.ChangeMembersRequest) (*walshipv1.ChangeMembersResponse, error) {
	return &walshipv1.ChangeMembersResponse{Done: true, Outcome: "done"}, nil
}

// TestMembershipChangesPassTheTap: under TLS and the default policy a
// data node may ask to add or remove a data node and a log store to add
// or remove a log store (--join, --leave-on-scale-down); the tap, which
// authorizes a call before its request is read, must let both through
// for the interceptor to check which change they ask. It refused every
// one ("may not call /walship.v1.AdminService/ChangeMembers with that
// change"), so no --join worked under mTLS.
func TestMembershipChangesPassTheTap(t *testing.T) {
	ca, err := tlsid.NewCA("serve test", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	ts := &tlsServer{ca: ca, certs: t.TempDir()}
	src, err := tlsid.Load(ts.files(t, tlsid.ClassNode, "server"), nil)
	if err != nil {
		t.Fatal(err)
	}
	az, err := tlsid.NewAuthz(tlsid.AuthzConfig{TrustDomain: testDomain})
	if err != nil {
		t.Fatal(err)
	}
	s, err := New(Options{Listen: "127.0.0.1:0", StreamGrace: 50 * time.Millisecond, Security: Security{TLS: src, Authz: az}},
		func(g *grpc.Server) { walshipv1.RegisterAdminServiceServer(g, okMembers{}) })
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Serve(ctx, nil) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	})
	s.SetServing(true)
	ts.Server = s
	add := &walshipv1.ChangeMembersRequest{Change: &walshipv1.ChangeMembersRequest_Add{Add: &walshipv1.Member{Id: "n3", Addr: "n3:7401"}}}
	addLS := &walshipv1.ChangeMembersRequest{Change: &walshipv1.ChangeMembersRequest_AddLogstore{AddLogstore: "ls3:7400"}}
	removeLS := &walshipv1.ChangeMembersRequest{Change: &walshipv1.ChangeMembersRequest_RemoveLogstore{RemoveLogstore: "ls3:7400"}}
	cctx, ccancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer ccancel()
	for _, tc := range []struct {
		class string
		req   *walshipv1.ChangeMembersRequest
		ok    bool
	}{
		{tlsid.ClassNode, add, true},
		{tlsid.ClassNode, addLS, false},
		{tlsid.ClassLogStore, addLS, true},
		{tlsid.ClassLogStore, removeLS, true},
		{tlsid.ClassLogStore, add, false},
		{tlsid.ClassClient, add, false},
		{tlsid.ClassAdmin, addLS, true},
	} {
		_, err := walshipv1.NewAdminServiceClient(ts.dial(t, tc.class, "x")).ChangeMembers(cctx, tc.req)
		if (err == nil) != tc.ok || (err != nil && status.Code(err) != codes.PermissionDenied) {
			t.Errorf("ChangeMembers %v as a %s: %v; want allowed %v", tc.req.GetChange(), tc.class, err, tc.ok)
		}
	}
}
