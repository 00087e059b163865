package serve

import (
	"context"
	"net"
	"strings"
	"testing"
	"time"

	walshipv1 "github.com/walship/walship/gen/walship/v1"
	"github.com/walship/walship/internal/testkit"
	"github.com/walship/walship/internal/tlsid"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
)

// TestDialMistakesExplained: walship's own calls tell a plaintext-versus-
// TLS mismatch (refused at once) apart from a process that does not answer
// (a timeout) and from a port nothing listens on, keeping the code.
func TestDialMistakesExplained(t *testing.T) {
	ts := serveTLS(t, Options{})
	plain := serveUntilEnd(t, Options{Listen: "127.0.0.1:0"})
	admin, err := tlsid.Load(ts.files(t, tlsid.ClassAdmin, "ops"), nil)
	if err != nil {
		t.Fatal(err)
	}
	// Accepts connections and never answers: a stopped process.
	mute, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer mute.Close()
	for _, tc := range []struct {
		name string
		addr string
		opts []grpc.DialOption
		code codes.Code
		want string
	}{
		{"plaintext to a TLS server", ts.Addr(), nil, codes.Unavailable, "serves TLS (or is not a gRPC server), and this process dials plaintext"},
		{"TLS to a plaintext server", plain.Addr(), []grpc.DialOption{grpc.WithTransportCredentials(admin.Credentials())}, codes.Unavailable, "serves plaintext, but this process dials it with TLS"},
		{"no answer", mute.Addr().String(), nil, codes.DeadlineExceeded, "did not answer within"},
		{"nothing listening", testkit.FreeAddr(t), nil, codes.Unavailable, "nothing listens at"},
	} {
		_, err := Call(t.Context(), Dialer{}, tc.addr, time.Second, func(ctx context.Context, cc *grpc.ClientConn) (*walshipv1.StatusResponse, error) {
			return walshipv1.NewAdminServiceClient(cc).Status(ctx, &walshipv1.StatusRequest{})
		}, tc.opts...)
		if status.Code(err) != tc.code || !strings.Contains(status.Convert(err).Message(), tc.addr+" ") && !strings.Contains(status.Convert(err).Message(), tc.addr+":") ||
			!strings.Contains(status.Convert(err).Message(), tc.want) {
			t.Errorf("%s: %v; want %v naming %s and saying %q", tc.name, err, tc.code, tc.addr, tc.want)
		}
	}
	// A stream's too, at its first message.
	conn, err := Dialer{}.Dial(ts.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	sctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	w, err := healthpb.NewHealthClient(conn).Watch(sctx, &healthpb.HealthCheckRequest{})
	if err == nil {
		_, err = w.Recv()
	}
	if status.Code(err) != codes.Unavailable || !strings.Contains(err.Error(), "it serves TLS") {
		t.Errorf("a plaintext stream to a TLS server: %v; want UNAVAILABLE saying it serves TLS", err)
	}
	// A call that reached the server keeps its error as it was.
	_, err = Call(t.Context(), Dialer{}, plain.Addr(), 5*time.Second, func(ctx context.Context, cc *grpc.ClientConn) (*walshipv1.StatusResponse, error) {
		return walshipv1.NewAdminServiceClient(cc).Status(ctx, &walshipv1.StatusRequest{})
	})
	if status.Code(err) != codes.Unimplemented || strings.Contains(err.Error(), "serves") {
		t.Errorf("a call the server answered: %v; want its UNIMPLEMENTED untouched", err)
	}
}
