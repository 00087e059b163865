package serve

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	walshipv1 "github.com/walship/walship/gen/walship/v1"
	"github.com/walship/walship/internal/tlsid"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protowire"
	protov2 "google.golang.org/protobuf/proto"
)

// rawCodec sends pre-encoded request bytes and receives responses as
// bytes, so a test can send what the protobuf runtime would refuse to
// marshal (invalid UTF-8 in a string).
type rawCodec struct{}

func (rawCodec) Marshal(v any) (mem.BufferSlice, error) {
	return mem.BufferSlice{mem.SliceBuffer(v.([]byte))}, nil
}

func (rawCodec) Unmarshal(data mem.BufferSlice, v any) error {
	*v.(*[]byte) = data.Materialize()
	return nil
}

func (rawCodec) Name() string { return "proto" }

// field encodes one length-delimited protobuf field.
func field(num protowire.Number, v []byte) []byte {
	return protowire.AppendBytes(protowire.AppendTag(nil, num, protowire.BytesType), v)
}

var badUTF8 = []byte{0xff, 0xfe}

// callRaw sends reqs to method, the first as a unary call's request when
// unary, else as the messages of a stream; it reads every response and
// returns the call's status.
func callRaw(ctx context.Context, conn *grpc.ClientConn, method string, unary bool, reqs ...[]byte) error {
	return callRawWith(ctx, conn, method, unary, reqs, grpc.ForceCodecV2(rawCodec{}))
}

// callRawWith is callRaw with call options of its own.
func callRawWith(ctx context.Context, conn *grpc.ClientConn, method string, unary bool, reqs [][]byte, opts ...grpc.CallOption) error {
	if unary {
		var resp []byte
		return conn.Invoke(ctx, method, reqs[0], &resp, opts...)
	}
	s, err := conn.NewStream(ctx, &grpc.StreamDesc{ClientStreams: true, ServerStreams: true}, method, opts...)
	if err != nil {
		return err
	}
	for _, req := range reqs {
		if err := s.SendMsg(req); err != nil && !errors.Is(err, io.EOF) {
			return err
		}
	}
	if err := s.CloseSend(); err != nil {
		return err
	}
	for {
		var resp []byte
		if err := s.RecvMsg(&resp); err != nil {
			if errors.Is(err, io.EOF) {
				return nil
			}
			return err
		}
	}
}

// recvRepl and recvLogStore are replication and log store streams that
// read, as the real services do: a replication stream every message until
// the client is done, a log store stream its first; then they end
// UNIMPLEMENTED.
type recvRepl struct {
	walshipv1.UnimplementedReplicationServiceServer
}

func (recvRepl) Stream(s walshipv1.ReplicationService_StreamServer) error {
	for {
		if _, err := s.Recv(); errors.Is(err, io.EOF) {
			return status.Error(codes.Unimplemented, "test server")
		} else if err != nil {
			return err
		}
	}
}

type recvLogStore struct {
	walshipv1.UnimplementedLogStoreServiceServer
}

func (recvLogStore) Append(s walshipv1.LogStoreService_AppendServer) error {
	if _, err := s.Recv(); err != nil {
		return err
	}
	return status.Error(codes.Unimplemented, "test server")
}

// utf8Server serves KVService, ReplicationService and LogStoreService
// (which answer UNIMPLEMENTED once they have the request) besides health
// and reflection, behind sec, until the test ends; it returns a
// connection to it.
func utf8Server(t *testing.T, sec Security) *grpc.ClientConn {
	t.Helper()
	conn, err := grpc.NewClient(serveRecv(t, sec), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

// serveRecv serves what utf8Server describes and returns its address.
func serveRecv(t *testing.T, sec Security) string {
	t.Helper()
	s, err := New(Options{Listen: "127.0.0.1:0", StreamGrace: 50 * time.Millisecond, Security: sec}, func(g *grpc.Server) {
		walshipv1.RegisterKVServiceServer(g, walshipv1.UnimplementedKVServiceServer{})
		walshipv1.RegisterReplicationServiceServer(g, recvRepl{})
		walshipv1.RegisterLogStoreServiceServer(g, recvLogStore{})
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Serve(ctx, nil) }()
	s.SetServing(true)
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	})
	return s.Addr()
}

// TestInvalidUTF8OnEveryKindOfCall: invalid UTF-8 in a string field is
// INVALID_ARGUMENT naming the field on unary calls and on every kind of
// stream (server, client, bidirectional; walship's, health's,
// reflection's), and the handler never sees the request; a client that
// sends the field number the check uses to mark a request gets only its
// own refusal, never its own words back as the server's.
func TestInvalidUTF8OnEveryKindOfCall(t *testing.T) {
	conn := utf8Server(t, Security{})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, tc := range []struct {
		method string
		unary  bool
		req    []byte
		field  string
	}{
		{"/walship.v1.KVService/Put", true, append(field(2, []byte("v")), field(1, badUTF8)...), "key"},
		{"/walship.v1.KVService/Txn", true, append(field(2, field(1, field(1, []byte("ok")))), field(3, field(2, field(1, badUTF8)))...), "failure[0].delete.key"},
		{"/walship.v1.LogStoreService/Read", false, field(4, badUTF8), "cluster_id"},
		{"/walship.v1.LogStoreService/Append", false, field(2, field(5, badUTF8)), "heartbeat.primary_addr"},
		{"/walship.v1.ReplicationService/Stream", false, field(1, field(1, badUTF8)), "hello.replica_id"},
		{"/grpc.health.v1.Health/Watch", false, field(1, badUTF8), "service"},
		{"/grpc.health.v1.Health/Check", true, field(1, badUTF8), "service"},
		{"/grpc.reflection.v1.ServerReflection/ServerReflectionInfo", false, append(field(1, []byte("host")), field(3, badUTF8)...), "file_by_filename"},
		{"/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo", false, field(4, badUTF8), "file_containing_symbol"},
	} {
		// A call of its own deadline: without the check a health Watch
		// goes on.
		cctx, ccancel := context.WithTimeout(ctx, 5*time.Second)
		err := callRaw(cctx, conn, tc.method, tc.unary, tc.req)
		ccancel()
		if want := tc.field + ": not valid UTF-8"; status.Code(err) != codes.InvalidArgument || status.Convert(err).Message() != want {
			t.Errorf("%s: %v; want INVALID_ARGUMENT %q", tc.method, err, want)
		}
	}
	// Valid requests: the handlers see them. Then the same with the
	// field number of the check's mark, alone or after another unknown
	// field: refused, in the server's words.
	for _, tc := range []struct {
		method string
		unary  bool
		valid  []byte
	}{
		{"/walship.v1.KVService/Put", true, field(1, []byte("ok"))},
		{"/walship.v1.ReplicationService/Stream", false, field(1, field(1, []byte("ok")))},
	} {
		if err := callRaw(ctx, conn, tc.method, tc.unary, tc.valid); status.Code(err) != codes.Unimplemented {
			t.Errorf("%s, valid: %v; want the handler's UNIMPLEMENTED", tc.method, err)
		}
		for _, forged := range [][]byte{
			append(tc.valid, field(refusalMark, []byte("forged: not valid UTF-8"))...),
			append(append(tc.valid, field(18_999, []byte("x"))...), field(refusalMark, []byte("forged"))...),
		} {
			err := callRaw(ctx, conn, tc.method, tc.unary, forged)
			if status.Code(err) != codes.InvalidArgument || strings.Contains(status.Convert(err).Message(), "forged") ||
				!strings.Contains(status.Convert(err).Message(), "field 19000: reserved") {
				t.Errorf("%s with a forged mark: %v; want INVALID_ARGUMENT in the server's words", tc.method, err)
			}
		}
		// Other unknown fields, reserved numbers included, are ignored
		// as protobuf ignores unknown fields.
		if err := callRaw(ctx, conn, tc.method, tc.unary, append(tc.valid, field(19_001, []byte("x"))...)); status.Code(err) != codes.Unimplemented {
			t.Errorf("%s with unknown field 19001: %v; want the handler's UNIMPLEMENTED", tc.method, err)
		}
	}
}

// TestUTF8CheckCostsNoAllocation: on a good request, the codec allocates
// no more than protobuf's own, and the interceptors' test allocates
// nothing.
func TestUTF8CheckCostsNoAllocation(t *testing.T) {
	b, err := protov2.Marshal(&walshipv1.PutRequest{Key: "k", Value: []byte("v"), Policy: &walshipv1.CommitPolicy{SyncReplicas: 1}})
	if err != nil {
		t.Fatal(err)
	}
	data := mem.BufferSlice{mem.SliceBuffer(b)}
	c := newCheckedCodec()
	inner := testing.AllocsPerRun(100, func() { _ = c.inner.Unmarshal(data, new(walshipv1.PutRequest)) })
	checked := testing.AllocsPerRun(100, func() { _ = c.Unmarshal(data, new(walshipv1.PutRequest)) })
	if checked != inner {
		t.Errorf("the codec allocates %v times per good request, protobuf alone %v", checked, inner)
	}
	req := &walshipv1.PutRequest{Key: "k"}
	if n := testing.AllocsPerRun(100, func() { _ = marked(req) }); n != 0 {
		t.Errorf("the interceptors' test allocates %v times per good request", n)
	}
	if err := marked(req); err != nil {
		t.Fatalf("a good request marked: %v", err)
	}
}

// heapAfterGC is the live heap once garbage is collected (twice: pooled
// buffers survive one collection).
func heapAfterGC() uint64 {
	runtime.GC()
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}

// TestInvalidUTF8HoldsNoMemory: requests with invalid UTF-8 that the
// authorization policy refuses, or that arrive on a stream, leave nothing
// behind: the heap after 32 of each, each holding a 1 MiB value decoded
// before the bad field, is back near where it was.
func TestInvalidUTF8HoldsNoMemory(t *testing.T) {
	az, err := tlsid.NewAuthz(tlsid.AuthzConfig{TrustDomain: "td"})
	if err != nil {
		t.Fatal(err)
	}
	// Without TLS the policy refuses everything but health: no peer has
	// a certificate.
	refusing, open := utf8Server(t, Security{Authz: az}), utf8Server(t, Security{})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	big := make([]byte, 1<<20)
	for i := range big {
		big[i] = 'a'
	}
	put := append(field(2, big), field(1, badUTF8)...)     // value first: decoded, then the bad key
	reflect := append(field(1, big), field(3, badUTF8)...) // host first, then the bad file name
	const n = 32
	round := func(count int) {
		for range count {
			if err := callRaw(ctx, refusing, "/walship.v1.KVService/Put", true, put); status.Code(err) != codes.PermissionDenied {
				t.Fatalf("a refused Put: %v", err)
			}
			if err := callRaw(ctx, open, "/grpc.reflection.v1.ServerReflection/ServerReflectionInfo", false, reflect); status.Code(err) == codes.ResourceExhausted {
				t.Fatalf("a reflection stream: %v", err)
			}
		}
	}
	round(2) // warm up
	before := heapAfterGC()
	round(n)
	after := heapAfterGC()
	grew := int64(after) - int64(before)
	t.Logf("heap %d -> %d bytes (%+d) after %d refused Puts and %d reflection streams of 1 MiB", before, after, grew, n, n)
	if grew > 8<<20 {
		t.Fatalf("the heap grew %s after %d refused and %d streamed requests of 1 MiB with invalid UTF-8: they are held", fmt.Sprintf("%.1f MiB", float64(grew)/(1<<20)), n, n)
	}
}

// BenchmarkDecodeCheck is what every unary request pays for the check: the
// codec's decoding of a small Put and the interceptor's test.
func BenchmarkDecodeCheck(b *testing.B) {
	buf, err := protov2.Marshal(&walshipv1.PutRequest{Key: "bench/key/0001", Value: make([]byte, 100)})
	if err != nil {
		b.Fatal(err)
	}
	data := mem.BufferSlice{mem.SliceBuffer(buf)}
	c := newCheckedCodec()
	handler := func(context.Context, any) (any, error) { return nil, nil }
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		req := new(walshipv1.PutRequest)
		if err := c.Unmarshal(data, req); err != nil {
			b.Fatal(err)
		}
		if _, err := refuseMarkedUnary(ctx, req, nil, handler); err != nil {
			b.Fatal(err)
		}
	}
}

// wireTag encodes a field tag.
func wireTag(num protowire.Number, typ protowire.Type) []byte {
	return protowire.AppendTag(nil, num, typ)
}

// cat concatenates wire-format pieces.
func cat(parts ...[]byte) []byte {
	var b []byte
	for _, p := range parts {
		b = append(b, p...)
	}
	return b
}

// malformedCase is a request protobuf refuses to decode, and what the
// server says of it.
type malformedCase struct {
	name string
	msg  protov2.Message // an empty message of the type to decode as
	req  []byte
	want string
}

// malformedCases are requests of each kind of problem, in every position
// the walk tells apart. The packed field is of a response (no request has
// one), decoded as the codec would.
func malformedCases() []malformedCase {
	return []malformedCase{
		{"a value cut short", &walshipv1.PutRequest{}, cat(wireTag(1, protowire.BytesType), []byte{5, 'a', 'b'}), "request: malformed protobuf: key: truncated"},
		{"a tag cut short", &walshipv1.PutRequest{}, cat(field(1, []byte("k")), []byte{0x80}), "request: malformed protobuf: field tag: truncated"},
		{"a wire type that does not exist", &walshipv1.PutRequest{}, cat(field(1, []byte("k")), wireTag(2, 7)), "request: malformed protobuf: value: wire type 7 does not exist"},
		{"field number 0", &walshipv1.PutRequest{}, []byte{0x02, 0x00}, "request: malformed protobuf: field tag: field number 0 is not in 1..536870911"},
		{"a field number above protobuf's", &walshipv1.PutRequest{}, cat(wireTag(protowire.MaxValidNumber+1, protowire.VarintType), []byte{1}), "request: malformed protobuf: field tag: field number 536870912 is not in 1..536870911"},
		{"a varint past 64 bits", &walshipv1.PutRequest{}, cat(wireTag(10, protowire.VarintType), bytes.Repeat([]byte{0xff}, 10), []byte{1}), "request: malformed protobuf: field 10: varint overflows 64 bits"},
		{"a group never closed", &walshipv1.PutRequest{}, cat(wireTag(20, protowire.StartGroupType), field(1, []byte("x"))), "request: malformed protobuf: field 20: truncated"},
		{"a group end never opened", &walshipv1.PutRequest{}, wireTag(5, protowire.EndGroupType), "request: malformed protobuf: field 5: end of a group that was never started"},
		{"deep in a Txn", &walshipv1.TxnRequest{}, cat(field(2, field(1, field(1, []byte("ok")))), field(2, field(1, cat(wireTag(1, protowire.BytesType), []byte{3, 'a'})))), "request: malformed protobuf: success[1].put.key: truncated"},
		{"a sub-message cut short", &walshipv1.TxnRequest{}, cat(field(3, field(2, field(1, []byte("ok")))), field(3, cat(wireTag(2, protowire.BytesType), []byte{9, 0x0a}))), "request: malformed protobuf: failure[1].delete: truncated"},
		{"a stream message", &walshipv1.StreamRequest{}, field(1, cat(wireTag(1, protowire.BytesType), []byte{9, 'r'})), "request: malformed protobuf: hello.replica_id: truncated"},
		{"packed values cut short", &walshipv1.StreamResponse{}, field(5, []byte{0x01, 0x80}), "request: malformed protobuf: reply_at: packed values: truncated"},
		{"invalid UTF-8", &walshipv1.PutRequest{}, cat(field(2, []byte("v")), field(1, badUTF8)), "key: not valid UTF-8"},
	}
}

// TestMalformedRequestSaysWhatIsWrong: every request protobuf refuses is
// answered INVALID_ARGUMENT with where and why, and nothing that was
// decoded before the problem is kept; a known field of the wrong wire type
// is no problem, protobuf keeps it as an unknown field.
func TestMalformedRequestSaysWhatIsWrong(t *testing.T) {
	c := newCheckedCodec()
	for _, tc := range malformedCases() {
		if err := protov2.Unmarshal(tc.req, tc.msg); err == nil {
			t.Fatalf("%s: protobuf decodes %x", tc.name, tc.req)
		}
		m := tc.msg.ProtoReflect().New().Interface()
		if err := c.Unmarshal(mem.BufferSlice{mem.SliceBuffer(tc.req)}, m); err != nil {
			t.Errorf("%s: the codec fails: %v", tc.name, err)
			continue
		}
		err := marked(m)
		if status.Code(err) != codes.InvalidArgument || status.Convert(err).Message() != tc.want {
			t.Errorf("%s: %v; want INVALID_ARGUMENT %q", tc.name, err, tc.want)
		}
		if m.ProtoReflect().SetUnknown(nil); !protov2.Equal(m, tc.msg.ProtoReflect().New().Interface()) {
			t.Errorf("%s: besides its refusal, the message holds %v", tc.name, m)
		}
	}
	m := &walshipv1.PutRequest{}
	if err := c.Unmarshal(mem.BufferSlice{mem.SliceBuffer(cat(wireTag(1, protowire.VarintType), []byte{7}, field(2, []byte("v"))))}, m); err != nil || marked(m) != nil || string(m.Value) != "v" {
		t.Errorf("key sent as a varint: %v, %v, %v; want it decoded, the key an unknown field", err, marked(m), m)
	}
}

// FuzzMalformed: the walk that says what is wrong with a request finds a
// problem exactly when protobuf refuses the request, whatever the bytes.
func FuzzMalformed(f *testing.F) {
	for _, tc := range malformedCases() {
		f.Add(tc.req)
	}
	f.Add(field(2, field(1, field(1, []byte("ok")))))
	f.Add(field(1, field(1, []byte("replica"))))
	f.Add(field(5, []byte{1, 2, 3}))
	types := []protov2.Message{&walshipv1.PutRequest{}, &walshipv1.TxnRequest{}, &walshipv1.StreamRequest{}, &walshipv1.StreamResponse{}, &walshipv1.AppendRequest{}}
	f.Fuzz(func(t *testing.T, b []byte) {
		for _, typ := range types {
			m := typ.ProtoReflect().New().Interface()
			err := protov2.Unmarshal(b, m)
			where, why := malformed(b, m.ProtoReflect().Descriptor(), 0)
			if (err != nil) != (why != "") {
				t.Fatalf("%T %x: protobuf says %v, the walk %q %q", m, b, err, where, why)
			}
		}
	})
}

// mtlsServer serves what utf8Server describes over mTLS under the default
// policy of trust domain td, and returns a dialer of certificates of its
// CA with the given SPIFFE ID ("": no identity).
func mtlsServer(t *testing.T) func(uri string) *grpc.ClientConn {
	t.Helper()
	ca, err := tlsid.NewCA("test", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	load := func(name string, l tlsid.Leaf) *tlsid.Source {
		f, err := ca.WriteFiles(t.TempDir(), name, l)
		if err != nil {
			t.Fatal(err)
		}
		src, err := tlsid.Load(f, nil)
		if err != nil {
			t.Fatal(err)
		}
		return src
	}
	az, err := tlsid.NewAuthz(tlsid.AuthzConfig{TrustDomain: "td"})
	if err != nil {
		t.Fatal(err)
	}
	srv := load("server", tlsid.Leaf{URI: tlsid.URI("td", tlsid.ClassNode, "n0"), IPs: []net.IP{net.IPv4(127, 0, 0, 1)}})
	addr := serveRecv(t, Security{TLS: srv, Authz: az})
	return func(uri string) *grpc.ClientConn {
		conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(load("caller", tlsid.Leaf{URI: uri}).Credentials()))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { conn.Close() })
		return conn
	}
}

// TestMalformedAfterAuthorization: a request that does not decode is
// INVALID_ARGUMENT saying what is wrong for a caller the policy lets call
// the method, and PERMISSION_DENIED for any other, whatever it sent; on
// unary calls, on server and bidirectional streams, on a stream's first
// message and on a later one. (gRPC alone answers INTERNAL, for a unary
// call before authorization.)
func TestMalformedAfterAuthorization(t *testing.T) {
	dial := mtlsServer(t)
	callers := map[string]*grpc.ClientConn{}
	for _, class := range []string{tlsid.ClassNode, tlsid.ClassClient, tlsid.ClassLogStore} {
		callers[class] = dial(tlsid.URI("td", class, "c1"))
	}
	callers["none"] = dial("")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	hello := field(1, field(1, []byte("r1")))
	truncHello := field(1, cat(wireTag(1, protowire.BytesType), []byte{9, 'r'}))
	for _, tc := range []struct {
		method  string
		unary   bool
		reqs    [][]byte
		want    string
		allowed []string
	}{
		{"/walship.v1.KVService/Put", true, [][]byte{cat(wireTag(1, protowire.BytesType), []byte{5, 'a', 'b'})}, "key: truncated", []string{"node", "client"}},
		{"/walship.v1.KVService/Txn", true, [][]byte{field(2, field(1, cat(wireTag(1, protowire.BytesType), []byte{3, 'a'})))}, "success[0].put.key: truncated", []string{"node", "client"}},
		{"/walship.v1.KVService/Get", true, [][]byte{cat(field(1, []byte("k")), wireTag(1, 6))}, "key: wire type 6 does not exist", []string{"node", "client"}},
		{"/walship.v1.ReplicationService/Stream", false, [][]byte{truncHello}, "hello.replica_id: truncated", []string{"node"}},
		{"/walship.v1.ReplicationService/Stream", false, [][]byte{hello, hello, {0x02, 0x00}}, "field tag: field number 0 is not in 1..536870911", []string{"node"}},
		{"/walship.v1.LogStoreService/Read", false, [][]byte{{0x08}}, "from_lsn: truncated", []string{"node", "logstore"}},
		{"/grpc.health.v1.Health/Check", true, [][]byte{{0x0a, 0x01}}, "service: truncated", []string{"node", "client", "logstore", "none"}},
		{"/grpc.health.v1.Health/Watch", false, [][]byte{{0x0a, 0x01}}, "service: truncated", []string{"node", "client", "logstore", "none"}},
	} {
		for class, conn := range callers {
			cctx, ccancel := context.WithTimeout(ctx, 10*time.Second)
			err := callRaw(cctx, conn, tc.method, tc.unary, tc.reqs...)
			ccancel()
			if slices.Contains(tc.allowed, class) {
				if want := "request: malformed protobuf: " + tc.want; status.Code(err) != codes.InvalidArgument || status.Convert(err).Message() != want {
					t.Errorf("%s as %s, %d messages: %v; want INVALID_ARGUMENT %q", tc.method, class, len(tc.reqs), err, want)
				}
			} else if status.Code(err) != codes.PermissionDenied {
				t.Errorf("%s as %s: %v; want PERMISSION_DENIED", tc.method, class, err)
			}
		}
	}
	// Good requests reach the handlers.
	if err := callRaw(ctx, callers["node"], "/walship.v1.ReplicationService/Stream", false, hello, hello); status.Code(err) != codes.Unimplemented {
		t.Errorf("a good stream: %v; want the handler's UNIMPLEMENTED", err)
	}
	if err := callRaw(ctx, callers["client"], "/walship.v1.KVService/Put", true, field(1, []byte("k"))); status.Code(err) != codes.Unimplemented {
		t.Errorf("a good Put: %v; want the handler's UNIMPLEMENTED", err)
	}
}

// TestMalformedBeyondTheCodec: what gRPC refuses before the codec keeps
// its code: a request over the receive limit, malformed or not, is
// RESOURCE_EXHAUSTED, and a compressed one UNIMPLEMENTED (the server has
// no decompressor, so a payload that does not decompress never reaches
// one).
func TestMalformedBeyondTheCodec(t *testing.T) {
	addr := serveRecv(t, Security{})
	dial := func(opts ...grpc.DialOption) *grpc.ClientConn {
		conn, err := grpc.NewClient(addr, append(opts, grpc.WithTransportCredentials(insecure.NewCredentials()))...)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { conn.Close() })
		return conn
	}
	// The client's own compressor, not registered in the process (which
	// would give the server one too).
	plain, gzipped := dial(), dial(grpc.WithCompressor(grpc.NewGZIPCompressor())) //nolint:staticcheck // see above
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	big := cat(field(2, make([]byte, 5<<20)), []byte{0x0a, 0x05})
	for _, tc := range []struct {
		method string
		unary  bool
	}{{"/walship.v1.KVService/Put", true}, {"/walship.v1.ReplicationService/Stream", false}} {
		if err := callRaw(ctx, plain, tc.method, tc.unary, big); status.Code(err) != codes.ResourceExhausted {
			t.Errorf("%s, 5 MiB and malformed: %v; want RESOURCE_EXHAUSTED", tc.method, err)
		}
		for _, req := range [][]byte{{0x0a, 0x05}, field(1, []byte("k"))} {
			if err := callRaw(ctx, gzipped, tc.method, tc.unary, req); status.Code(err) != codes.Unimplemented {
				t.Errorf("%s compressed (%x): %v; want UNIMPLEMENTED", tc.method, req, err)
			}
		}
	}
}
