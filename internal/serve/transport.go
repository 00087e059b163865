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

// transportOptions are the server options behind the comment above.
func transportOptions() []grpc.ServerOption {
	return []grpc.ServerOption{
		grpc.InitialWindowSize(streamWindow),
		grpc.InitialConnWindowSize(connWindow),
		grpc.NumStreamWorkers(streamWorkers()),
	}
}

// clientCreds are the transport credentials of every walship dialer in
// this process: plaintext until UseTLS.
var clientCreds atomic.Pointer[credentials.TransportCredentials]

// UseTLS makes every later DialOptions dial with TLS from src: the
// process's one identity, set once at start by the command that runs it
// (nil: back to plaintext).
func UseTLS(src *tlsid.Source) {
	if src == nil {
		clientCreds.Store(nil)
		return
	}
	c := src.Credentials()
	clientCreds.Store(&c)
}

// TransportCredentials are the credentials DialOptions uses.
func TransportCredentials() credentials.TransportCredentials {
	if c := clientCreds.Load(); c != nil {
		return *c
	}
	return insecure.NewCredentials()
}

// DialOptions returns the options every walship client connection starts
// with: the process's transport credentials (UseTLS), the fixed flow-control windows above, and a
// reconnect backoff of 50 ms to 2 s (gRPC's own starts at 1 s and grows to
// 2 minutes: a node that changes role restarts its server within tens of
// milliseconds, and its peers must find it again as fast). Callers append
// their own (message sizes, keepalive).
func DialOptions(extra ...grpc.DialOption) []grpc.DialOption {
	return append([]grpc.DialOption{
		grpc.WithTransportCredentials(TransportCredentials()),
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
