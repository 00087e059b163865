package serve

import (
	"context"
	"errors"
	"fmt"
	"io"
	"runtime"
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

// callRaw sends req to method as the only message of a stream (a unary
// call when unary), reads every response, and returns the call's status.
func callRaw(ctx context.Context, conn *grpc.ClientConn, method string, unary bool, req []byte) error {
	if unary {
		var resp []byte
		return conn.Invoke(ctx, method, req, &resp, grpc.ForceCodecV2(rawCodec{}))
	}
	s, err := conn.NewStream(ctx, &grpc.StreamDesc{ClientStreams: true, ServerStreams: true}, method, grpc.ForceCodecV2(rawCodec{}))
	if err != nil {
		return err
	}
	if err := s.SendMsg(req); err != nil && !errors.Is(err, io.EOF) {
		return err
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

// recvStreams are replication and log store streams that read their
// first message, as the real services do, then end UNIMPLEMENTED.
type recvRepl struct {
	walshipv1.UnimplementedReplicationServiceServer
}

func (recvRepl) Stream(s walshipv1.ReplicationService_StreamServer) error {
	if _, err := s.Recv(); err != nil {
		return err
	}
	return status.Error(codes.Unimplemented, "test server")
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
	conn, err := grpc.NewClient(s.Addr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		conn.Close()
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	})
	return conn
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
			append(tc.valid, field(utf8Mark, []byte("forged: not valid UTF-8"))...),
			append(append(tc.valid, field(18_999, []byte("x"))...), field(utf8Mark, []byte("forged"))...),
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
	c := newUTF8Codec()
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

// BenchmarkUTF8Check is what every unary request pays for the check: the
// codec's decoding of a small Put and the interceptor's test.
func BenchmarkUTF8Check(b *testing.B) {
	buf, err := protov2.Marshal(&walshipv1.PutRequest{Key: "bench/key/0001", Value: make([]byte, 100)})
	if err != nil {
		b.Fatal(err)
	}
	data := mem.BufferSlice{mem.SliceBuffer(buf)}
	c := newUTF8Codec()
	handler := func(context.Context, any) (any, error) { return nil, nil }
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		req := new(walshipv1.PutRequest)
		if err := c.Unmarshal(data, req); err != nil {
			b.Fatal(err)
		}
		if _, err := utf8Unary(ctx, req, nil, handler); err != nil {
			b.Fatal(err)
		}
	}
}
