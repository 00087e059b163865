package logstore

import (
	"context"
	"net"
	"testing"
	"time"

	walshipv1 "github.com/walship/walship/gen/walship/v1"
	"github.com/walship/walship/internal/serve"
	"github.com/walship/walship/internal/tlsid"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
)

// rawBytes is a codec that sends its []byte as the message, for requests
// no generated client would build.
type rawBytes struct{}

func (rawBytes) Marshal(v any) (mem.BufferSlice, error) {
	return mem.BufferSlice{mem.SliceBuffer(*v.(*[]byte))}, nil
}
func (rawBytes) Unmarshal(data mem.BufferSlice, v any) error {
	*v.(*[]byte) = data.Materialize()
	return nil
}
func (rawBytes) Name() string { return "proto" }

// TestEdgeRequestLimit: under TLS and the default policy, only data nodes
// may send the log store a message up to MaxMessageBytes (WAL batches,
// snapshots); any other peer's request over 1 MiB fails
// RESOURCE_EXHAUSTED on its length prefix — a Status request padded to
// 2 MiB from a client certificate was read whole (up to 64 MiB per call)
// before anything looked at it.
func TestEdgeRequestLimit(t *testing.T) {
	ca, err := tlsid.NewCA("logstore test", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	issue := func(class, name string) *tlsid.Source {
		f, err := ca.WriteFiles(dir, name, tlsid.Leaf{URI: tlsid.URI("ls.test", class, name), IPs: []net.IP{net.ParseIP("127.0.0.1")}})
		if err != nil {
			t.Fatal(err)
		}
		src, err := tlsid.Load(f, nil)
		if err != nil {
			t.Fatal(err)
		}
		return src
	}
	az, err := tlsid.NewAuthz(tlsid.AuthzConfig{TrustDomain: "ls.test", Reflection: tlsid.ReflectionAll})
	if err != nil {
		t.Fatal(err)
	}
	cfg := testConfig(t, t.TempDir())
	cfg.Security = serve.Security{TLS: issue(tlsid.ClassLogStore, "ls"), Authz: az}
	r := start(t, cfg)
	// A Status request with 2 MiB in an unknown field: well-formed,
	// ignored by the handler.
	padded := protowire.AppendBytes(protowire.AppendTag(nil, 1000, protowire.BytesType), make([]byte, 2<<20))
	status := func(src *tlsid.Source) error {
		conn, err := grpc.NewClient(r.s.Addr(), grpc.WithTransportCredentials(src.Credentials()))
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
		defer cancel()
		var resp []byte
		return conn.Invoke(ctx, "/walship.v1.LogStoreService/Status", &padded, &resp, grpc.ForceCodecV2(rawBytes{}), grpc.MaxCallSendMsgSize(8<<20))
	}
	if err := status(issue(tlsid.ClassNode, "n1")); err != nil {
		t.Fatalf("a data node's 2 MiB request: %v", err)
	}
	wantCode(t, status(issue(tlsid.ClassClient, "app")), codes.ResourceExhausted, "larger than max")
	if _, err := walshipv1.NewLogStoreServiceClient(r.conn).Status(t.Context(), &walshipv1.LogStoreServiceStatusRequest{}); err == nil {
		t.Fatal("a plaintext client was served by a TLS log store")
	}
}
