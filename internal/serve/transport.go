package serve

import (
	"context"
	"runtime"
	"sync/atomic"
	"time"

	"github.com/walship/walship/internal/tlsid"
	"google.golang.org/grpc/credentials"

	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/credentials/insecure"
)

// HTTP/2 flow-control windows for every walship server and client.
//
// gRPC's default starts each window at 64 KiB and grows it by BDP
// estimation: on data received it sends a PING and times the ack. On a
// request/response workload every round trip can carry such a ping, one
// more write and read on each side for nothing a commit waits for. Fixed
// windows turn the estimator off. They are as large as the estimator's own
// ceiling for a connection (16 MiB), so nothing the dynamic window allowed
// is refused, and a stream's (8 MiB) takes a large Txn or a burst of WAL
// batches without a window update mid-message. A window is a limit on data
// in flight, not a buffer allocated up front.
//
// Measured with BenchmarkCommit (durability sync, 8 committers, one
// connection; docs/BENCHMARKS.md): fixed windows and stream workers
// together raised commits/s by about a fifth and cut CPU per commit.
const (
	streamWindow = 8 << 20
	connWindow   = 16 << 20
)

// streamWorkers is how many goroutines serve incoming streams; gRPC starts
// a goroutine per stream when all are busy (a sync commit holds its worker
// while it waits for the fsync). Reusing them saves a goroutine start and
// its stack growth per request.
func streamWorkers() uint32 {
	return uint32(max(16, 8*runtime.GOMAXPROCS(0)))
}

// transportOptions are the server options behind the comment above (the
// data nodes' transport; admit.go has the edge's).
func transportOptions() []grpc.ServerOption {
	return []grpc.ServerOption{
		grpc.InitialWindowSize(streamWindow),
		grpc.InitialConnWindowSize(connWindow),
	}
}

// dialTLS is the process's client identity, with the trust domain whose
// classes PeerClass checks ("" for none).
type dialTLS struct {
	src   *tlsid.Source
	creds credentials.TransportCredentials
	trust string
}

// clientTLS is the transport security of every walship dialer in this
// process: plaintext until UseTLS.
var clientTLS atomic.Pointer[dialTLS]

// UseTLS makes every later DialOptions dial with TLS from src: the
// process's one identity, set once at start by the command that runs it
// (nil: back to plaintext). trustDomain is that of the default identity
// scheme (spiffe://DOMAIN/walship/CLASS/NAME), under which a dial that
// names the classes it accepts (PeerClass) refuses a server of any other;
// "" checks no class (a custom authorization policy, whose identities
// need not follow the scheme; or one identity for every server of the
// process, as walship dev has).
func UseTLS(src *tlsid.Source, trustDomain string) {
	if src == nil {
		clientTLS.Store(nil)
		return
	}
	clientTLS.Store(&dialTLS{src: src, creds: src.Credentials(), trust: trustDomain})
}

// TransportCredentials are the credentials DialOptions uses.
func TransportCredentials() credentials.TransportCredentials {
	if c := clientTLS.Load(); c != nil {
		return c.creds
	}
	return insecure.NewCredentials()
}

// PeerClass is the dial option of a dialer that knows what it dials: the
// server must be of one of classes (tlsid.ClassNode, ClassLogStore...),
// checked at each handshake, when the process dials with TLS under the
// default identity scheme (UseTLS); otherwise it changes nothing. Given
// to DialOptions, it replaces the credentials those start with.
func PeerClass(classes ...string) grpc.DialOption {
	c := clientTLS.Load()
	if c == nil || c.trust == "" {
		return grpc.EmptyDialOption{}
	}
	return grpc.WithTransportCredentials(c.src.PeerCredentials(c.trust, classes...))
}

// DialOptions returns the options every walship client connection starts
// with: the process's transport credentials (UseTLS), errors that say
// what a failed connection means (explain.go), the fixed flow-control windows above, and a
// reconnect backoff of 50 ms to 2 s (gRPC's own starts at 1 s and grows to
// 2 minutes: a node that changes role restarts its server within tens of
// milliseconds, and its peers must find it again as fast). Callers append
// their own (message sizes, keepalive).
func DialOptions(extra ...grpc.DialOption) []grpc.DialOption {
	return append([]grpc.DialOption{
		grpc.WithTransportCredentials(TransportCredentials()),
		grpc.WithChainUnaryInterceptor(explainUnary(clientTLS.Load() != nil)),
		grpc.WithChainStreamInterceptor(explainStream(clientTLS.Load() != nil)),
		grpc.WithInitialWindowSize(streamWindow),
		grpc.WithInitialConnWindowSize(connWindow),
		grpc.WithConnectParams(grpc.ConnectParams{Backoff: backoff.Config{BaseDelay: 50 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2,
			MaxDelay: 2 * time.Second}, MinConnectTimeout: 5 * time.Second}),
	}, extra...)
}

// Call makes one call to the walship process at addr: it dials with
// DialOptions(extra...), runs rpc on the connection under timeout, and
// closes the connection (a vote, a status survey, an operator's command).
func Call[T any](ctx context.Context, addr string, timeout time.Duration, rpc func(context.Context, *grpc.ClientConn) (T, error), extra ...grpc.DialOption) (T, error) {
	var zero T
	conn, err := grpc.NewClient(addr, DialOptions(extra...)...)
	if err != nil {
		return zero, err
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	return rpc(ctx, conn)
}
