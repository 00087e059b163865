package serve

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"testing"
	"time"

	walshipv1 "github.com/walship/walship/gen/walship/v1"
	"github.com/walship/walship/internal/testkit"
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
	if where, why := malformed(msg, md, 0); where != "failure[0].delete.key" || why != notUTF8 {
		t.Fatalf("path = %q, %q", where, why)
	}
	cmp := append(field(1, field(1, []byte("ok"))), field(1, field(1, bad))...)
	if where, why := malformed(cmp, md, 0); where != "compares[1].key" || why != notUTF8 {
		t.Fatalf("path = %q, %q", where, why)
	}
	if where, why := malformed(field(2, field(1, field(1, []byte("fine")))), md, 0); where != "" || why != "" {
		t.Fatalf("valid message reported %q, %q", where, why)
	}
	if _, why := malformed([]byte{0xff, 0xff, 0xff}, md, 0); why == notUTF8 || why == "" {
		t.Fatalf("garbage reported %q", why)
	}
}

// TestLimitsAtTheEdge: one connection cannot hold more than
// MaxConcurrentStreams streams — the rest wait, and fail at their
// deadline — nor send a message over MaxMessageBytes (RESOURCE_EXHAUSTED);
// meanwhile another client is served as usual.
func TestLimitsAtTheEdge(t *testing.T) {
	s := serveUntilEnd(t, Options{Listen: "127.0.0.1:0", MaxMessageBytes: 64 << 10, Security: Security{MaxConcurrentStreams: 8}})
	s.SetServing(true)
	dial := func() *grpc.ClientConn {
		conn, err := grpc.NewClient(s.Addr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { conn.Close() })
		return conn
	}
	hostile, other := healthpb.NewHealthClient(dial()), healthpb.NewHealthClient(dial())
	tctx, tcancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer tcancel()
	if _, err := other.Check(tctx, &healthpb.HealthCheckRequest{}, grpc.WaitForReady(true)); err != nil {
		t.Fatal(err)
	}
	// The hostile client holds 8 streams open, then asks for more.
	sctx, scancel := context.WithCancel(tctx)
	defer scancel()
	for i := range 8 {
		w, err := hostile.Watch(sctx, &healthpb.HealthCheckRequest{})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := w.Recv(); err != nil {
			t.Fatalf("stream %d: %v", i, err)
		}
	}
	short, shortCancel := context.WithTimeout(tctx, 300*time.Millisecond)
	defer shortCancel()
	if _, err := hostile.Check(short, &healthpb.HealthCheckRequest{}); status.Code(err) != codes.DeadlineExceeded {
		t.Fatalf("a 9th stream on the hostile connection: %v; want it held back until its deadline", err)
	}
	// A message over the limit is refused, and the server goes on.
	_, err := other.Check(tctx, &healthpb.HealthCheckRequest{Service: string(make([]byte, 128<<10))})
	if status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("a 128 KiB request to a 64 KiB limit: %v; want RESOURCE_EXHAUSTED", err)
	}
	if r, err := other.Check(tctx, &healthpb.HealthCheckRequest{}); err != nil || r.Status != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("another client meanwhile: %v, %v", r, err)
	}
}

// TestReadyz: /readyz on the metrics listener answers 503 until the
// server is serving, then 200; /healthz answers 200 throughout.
func TestReadyz(t *testing.T) {
	s := serveUntilEnd(t, Options{Listen: "127.0.0.1:0", MetricsListen: "127.0.0.1:0"})
	code := func(path string) int {
		resp, err := http.Get("http://" + s.MetricsAddr() + path)
		if err != nil {
			return -1
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	testkit.Until(t, "the metrics listener", func() bool { return code("/healthz") == 200 })
	if c := code("/readyz"); c != http.StatusServiceUnavailable {
		t.Fatalf("/readyz before SetServing = %d", c)
	}
	s.SetServing(true)
	if c := code("/readyz"); c != 200 {
		t.Fatalf("/readyz when serving = %d", c)
	}
}

// TestPprofOnlyWhenAsked: /debug/pprof/ is served on the metrics listener
// with Security.Pprof (a profile of a second parses as one: it starts
// with gzip's magic), and not without it.
func TestPprofOnlyWhenAsked(t *testing.T) {
	get := func(s *Server, path string) (int, []byte) {
		resp, err := http.Get("http://" + s.MetricsAddr() + path)
		if err != nil {
			return -1, nil
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, b
	}
	off := serveUntilEnd(t, Options{Listen: "127.0.0.1:0", MetricsListen: "127.0.0.1:0"})
	testkit.Until(t, "the metrics listener", func() bool { c, _ := get(off, "/healthz"); return c == 200 })
	if c, _ := get(off, "/debug/pprof/"); c != http.StatusNotFound {
		t.Errorf("/debug/pprof/ without Pprof = %d, want 404", c)
	}
	on := serveUntilEnd(t, Options{Listen: "127.0.0.1:0", MetricsListen: "127.0.0.1:0", Security: Security{Pprof: true}})
	testkit.Until(t, "the metrics listener", func() bool { c, _ := get(on, "/healthz"); return c == 200 })
	if c, b := get(on, "/debug/pprof/"); c != 200 || !bytes.Contains(b, []byte("goroutine")) {
		t.Errorf("/debug/pprof/ with Pprof = %d, %.80q", c, b)
	}
	if c, b := get(on, "/debug/pprof/profile?seconds=1"); c != 200 || !bytes.HasPrefix(b, []byte{0x1f, 0x8b}) {
		t.Errorf("/debug/pprof/profile with Pprof = %d, %d bytes starting %.8q", c, len(b), b)
	}
}

// serveUntilEnd serves a Server of opts (no services of its own) until
// the test ends, and then stops it, failing the test on an error.
func serveUntilEnd(t *testing.T, opts Options) *Server {
	t.Helper()
	opts.StreamGrace = 50 * time.Millisecond
	s, err := New(opts, func(*grpc.Server) {})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- s.Serve(t.Context(), nil) }()
	t.Cleanup(func() {
		if err := <-done; err != nil {
			t.Error(err)
		}
	})
	return s
}
