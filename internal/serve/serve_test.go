package serve

import (
	"context"
	"testing"
	"time"

	walshipv1 "github.com/walship/walship/gen/walship/v1"
	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protowire"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// TestHealthAndStop: NOT_SERVING until SetServing(true); a health Watch
// stream (long-lived) does not hold the graceful stop; it ends with
// UNAVAILABLE after the stream grace.
func TestHealthAndStop(t *testing.T) {
	s, err := New(Options{Listen: "127.0.0.1:0", StreamGrace: 50 * time.Millisecond, StopTimeout: 20 * time.Second}, func(*grpc.Server) {})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Serve(ctx, nil) }()
	conn, err := grpc.NewClient(s.Addr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	h := healthpb.NewHealthClient(conn)
	tctx, tcancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer tcancel()
	resp, err := h.Check(tctx, &healthpb.HealthCheckRequest{}, grpc.WaitForReady(true))
	if err != nil || resp.Status != healthpb.HealthCheckResponse_NOT_SERVING {
		t.Fatalf("before SetServing: %v %v", resp, err)
	}
	s.SetServing(true)
	w, err := h.Watch(tctx, &healthpb.HealthCheckRequest{})
	if err != nil {
		t.Fatal(err)
	}
	for {
		m, err := w.Recv()
		if err != nil {
			t.Fatal(err)
		}
		if m.Status == healthpb.HealthCheckResponse_SERVING {
			break
		}
	}
	start := time.Now()
	cancel()
	for {
		_, err := w.Recv()
		if err != nil {
			if status.Code(err) != codes.Unavailable {
				t.Fatalf("watch ended with %v; want UNAVAILABLE", err)
			}
			break
		}
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if took := time.Since(start); took > 10*time.Second {
		t.Fatalf("graceful stop took %v: the watch stream held it", took)
	}
}

func TestInvalidUTF8FieldPath(t *testing.T) {
	field := func(num protowire.Number, v []byte) []byte {
		return protowire.AppendBytes(protowire.AppendTag(nil, num, protowire.BytesType), v)
	}
	bad := []byte{0xff}
	md := (&walshipv1.TxnRequest{}).ProtoReflect().Descriptor()
	msg := append(field(2, field(1, field(1, []byte("ok")))), field(3, field(2, field(1, bad)))...)
	if got := invalidUTF8Field(msg, md); got != "failure[0].delete.key" {
		t.Fatalf("path = %q", got)
	}
	cmp := append(field(1, field(1, []byte("ok"))), field(1, field(1, bad))...)
	if got := invalidUTF8Field(cmp, md); got != "compares[1].key" {
		t.Fatalf("path = %q", got)
	}
	if got := invalidUTF8Field(field(2, field(1, field(1, []byte("fine")))), md); got != "" {
		t.Fatalf("valid message reported %q", got)
	}
	if got := invalidUTF8Field([]byte{0xff, 0xff, 0xff}, md); got != "" {
		t.Fatalf("garbage reported %q", got)
	}
}
