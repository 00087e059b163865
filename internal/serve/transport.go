package serve

import (
	"context"
	"runtime"
	"time"

	"github.com/walship/walship/internal/tlsid"
	"google.golang.org/grpc/credentials"

	"github.com/walship/walship/internal/backoff"
	"google.golang.org/grpc"
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

// Dialer is how a walship service dials its peers: its client identity
// (TLS from a tlsid.Source, or plaintext: the zero Dialer) and the trust
// domain whose classes PeerClass checks. It is a value in each service's
// config (Security.Dialer), not the process's: two services of one
// process — walship dev's nodes and log stores, a test's cluster — may
// dial as different identities.
type Dialer struct {
	tls *dialTLS // nil: plaintext
}

// dialTLS is a Dialer's identity, with the trust domain whose classes
// PeerClass checks ("" for none).
type dialTLS struct {
	src   *tlsid.Source
	creds credentials.TransportCredentials
	trust string
}

// NewDialer dials with TLS from src (nil: plaintext). trustDomain is that
// of the default identity scheme (spiffe://DOMAIN/walship/CLASS/NAME),
// under which a dial that names the classes it accepts (PeerClass)
// refuses a server of any other; "" checks no class (a custom
// authorization policy, whose identities need not follow the scheme; or
// one identity for every server of the process, as walship dev has).
func NewDialer(src *tlsid.Source, trustDomain string) Dialer {
	if src == nil {
		return Dialer{}
	}
	return Dialer{tls: &dialTLS{src: src, creds: src.Credentials(), trust: trustDomain}}
}

// TLS reports whether d dials with TLS.
func (d Dialer) TLS() bool { return d.tls != nil }

// Credentials are the transport credentials Options starts with.
func (d Dialer) Credentials() credentials.TransportCredentials {
	if d.tls != nil {
		return d.tls.creds
	}
	return insecure.NewCredentials()
}

// PeerClass is the dial option of a dialer that knows what it dials: the
// server must be of one of classes (tlsid.ClassNode, ClassLogStore...),
// checked at each handshake, when d dials with TLS under the default
// identity scheme; otherwise it changes nothing. Given to Options, it
// replaces the credentials those start with.
func (d Dialer) PeerClass(classes ...string) grpc.DialOption {
	if d.tls == nil || d.tls.trust == "" {
		return grpc.EmptyDialOption{}
	}
	return grpc.WithTransportCredentials(d.tls.src.PeerCredentials(d.tls.trust, classes...))
}

// Options returns the options every walship client connection starts
// with: d's transport credentials, errors that say what a failed
// connection means (explain.go), the fixed flow-control windows above,
// and a reconnect backoff of 50 ms to 2 s (gRPC's own starts at 1 s and
// grows to 2 minutes: a node that changes role restarts its server within
// tens of milliseconds, and its peers must find it again as fast).
// Callers append their own (message sizes, keepalive, PeerClass).
func (d Dialer) Options(extra ...grpc.DialOption) []grpc.DialOption {
	return append([]grpc.DialOption{
		grpc.WithTransportCredentials(d.Credentials()),
		grpc.WithChainUnaryInterceptor(explainUnary(d.TLS())),
		grpc.WithChainStreamInterceptor(explainStream(d.TLS())),
		grpc.WithInitialWindowSize(streamWindow),
		grpc.WithInitialConnWindowSize(connWindow),
		backoff.Connect,
	}, extra...)
}

// Dial is grpc.NewClient(addr, d.Options(extra...)...).
func (d Dialer) Dial(addr string, extra ...grpc.DialOption) (*grpc.ClientConn, error) {
	return grpc.NewClient(addr, d.Options(extra...)...)
}

// Call makes one call to the walship process at addr: it dials with
// d.Options(extra...), runs rpc on the connection under timeout, and
// closes the connection (a vote, a status survey, an operator's command).
func Call[T any](ctx context.Context, d Dialer, addr string, timeout time.Duration, rpc func(context.Context, *grpc.ClientConn) (T, error), extra ...grpc.DialOption) (T, error) {
	var zero T
	conn, err := d.Dial(addr, extra...)
	if err != nil {
		return zero, err
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	return rpc(ctx, conn)
}
