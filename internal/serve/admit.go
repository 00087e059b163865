package serve

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/walship/walship/internal/tlsid"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/stats"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/tap"
)

// What one peer may hold on a server.
//
// A gRPC server reads a unary request whole — up to its message limit —
// before any interceptor runs, and then reads on until the client ends
// the stream (a second message, which it refuses only once whole); a
// stream's data waits in memory up to its flow-control window. So each
// call a peer opens can hold about twice the message limit, and a
// connection may open a thousand. Measured before these limits: one
// connection from a certificate without an identity, 1,000 Puts each
// sent but for its last byte, took a primary from 46 MiB to 1.5 GiB RSS
// in 20 s (and on, at the sender's pace).
//
// Every call is authorized from its headers (tlsid.Authz.Tap) before
// any of its data is read, so a refused peer holds nothing; a peer that
// is not a data node may have at most Security.MaxPeerCalls calls in
// progress on the server, its identity's connections together.
//
// Data nodes (tlsid.Authz.Trusted: the peers the policy lets append to a
// log) are not limited in calls.
// DefaultPeerCalls is Security.MaxPeerCalls's default: with the
// primary's 2 MiB message limit, at most 32 × 2 × 2 MiB = 128 MiB for one
// identity's calls.
const DefaultPeerCalls = 32

// peerCounts counts what each identity holds and refuses past a limit.
type peerCounts struct {
	what  string // "calls in progress"
	limit int
	mu    sync.Mutex
	n     map[string]int
}

func newPeerCounts(what string, limit int) *peerCounts {
	return &peerCounts{what: what, limit: limit, n: map[string]int{}}
}

// acquire counts one more for id, or says why not; release uncounts it
// (once).
func (c *peerCounts) acquire(id string) (release func(), err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.n[id] >= c.limit {
		who := id
		if who == "" {
			who = "peers without a certificate identity"
		}
		return nil, fmt.Errorf("%s has %d %s on this server, the most one peer may", who, c.n[id], c.what)
	}
	c.n[id]++
	var once sync.Once
	return func() {
		once.Do(func() {
			c.mu.Lock()
			defer c.mu.Unlock()
			if c.n[id]--; c.n[id] == 0 {
				delete(c.n, id)
			}
		})
	}, nil
}

// admission is a Server's state for these limits.
type admission struct {
	authz   *tlsid.Authz
	calls   *peerCounts
	refused *prometheus.CounterVec
}

func newAdmission(sec Security, reg prometheus.Registerer) (*admission, error) {
	calls := sec.MaxPeerCalls
	if calls <= 0 {
		calls = DefaultPeerCalls
	}
	a := &admission{authz: sec.Authz, calls: newPeerCounts("calls in progress", calls),
		refused: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "walship_server_refusals_total",
			Help: "Calls a server refused past a resource limit, by limit: peer_calls (one identity's calls in progress)."},
			[]string{"limit"})}
	for _, l := range []string{"peer_calls"} {
		a.refused.WithLabelValues(l)
	}
	if reg != nil {
		// A data node's next role's server registers it again.
		if err := reg.Register(a.refused); err != nil {
			var are prometheus.AlreadyRegisteredError
			if !errors.As(err, &are) {
				return nil, err
			}
			a.refused = are.ExistingCollector.(*prometheus.CounterVec)
		}
	}
	return a, nil
}

// tap is the servers' grpc.InTapHandle: it authorizes the call, and
// counts it against its peer's calls unless the peer is a data node. The
// count ends with the call (its context's end).
func (a *admission) tap(ctx context.Context, info *tap.Info) (context.Context, error) {
	if a.authz == nil {
		return ctx, nil
	}
	if err := a.authz.Tap(ctx, info.FullMethodName); err != nil {
		return nil, err
	}
	cs, _ := ctx.Value(connKey{}).(*connState)
	if cs == nil || cs.trusted(ctx, a.authz) {
		return ctx, nil
	}
	release, err := a.calls.acquire(tlsid.Peer(ctx))
	if err != nil {
		a.refused.WithLabelValues("peer_calls").Inc()
		return nil, status.Errorf(codes.ResourceExhausted, "%s: %v (--max-peer-calls); retry once some are answered", info.FullMethodName, err)
	}
	context.AfterFunc(ctx, release)
	return ctx, nil
}

// connState is what the servers know of one connection, set by connStats.
type connState struct {
	once    sync.Once
	isTrust bool
}

// trusted evaluates, once per connection, whether its peer is a data node.
func (c *connState) trusted(ctx context.Context, az *tlsid.Authz) bool {
	c.once.Do(func() { c.isTrust = az.Trusted(ctx) })
	return c.isTrust
}

type connKey struct{}

// connStats gives every connection's context a connState, which the tap
// of each of its calls finds there.
type connStats struct{}

func (connStats) TagConn(ctx context.Context, _ *stats.ConnTagInfo) context.Context {
	return context.WithValue(ctx, connKey{}, &connState{})
}
func (connStats) HandleConn(context.Context, stats.ConnStats) {}
func (connStats) TagRPC(ctx context.Context, _ *stats.RPCTagInfo) context.Context {
	return ctx
}
func (connStats) HandleRPC(context.Context, stats.RPCStats) {}
