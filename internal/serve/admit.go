package serve

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/walship/walship/internal/rpcerr"
	"github.com/walship/walship/internal/tlsid"
	"golang.org/x/sync/semaphore"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/tap"
)

// What one peer may hold on a server, and what peers that have not
// finished their TLS handshake may.
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
// The defences, in the order a connection meets them:
//   - handshakes: at most maxHandshakes in progress, each within
//     handshakeTimeout (grpc's default is 120 s), so peers that never
//     finish one (about 11 KiB each) cannot pile up;
//   - connections: at most Security.MaxPeerConns per identity (an idle
//     TLS connection holds about 55 KiB);
//   - calls: every call is authorized from its headers (tlsid.Authz.Tap)
//     before any of its data is read, so a refused peer holds nothing; a
//     peer that is not a data node may have at most Security.MaxPeerCalls
//     calls in progress on the server, its identity's connections
//     together, and under the default policy its connections are served
//     with an edge transport (Options.EdgeMaxMessageBytes, edgeWindow,
//     MaxPeerCalls streams per connection; serverOptions);
//   - refusals: an identity refused over and over is answered at most
//     about a hundred times a second (pacer), so that refusing it does
//     not take the CPU of the peers that are served.
//
// Data nodes (tlsid.Authz.Trusted: the peers the policy lets append to a
// log) are not limited in calls and keep the transport measured for
// commits and replication.
const (
	// DefaultPeerCalls is Security.MaxPeerCalls's default. A call may
	// hold about twice the request limit (2 MiB on a primary), and the Go
	// heap grows to twice what is live between collections: 16 calls keep
	// one identity within about 128 MiB of heap. The edge transport allows as many streams per connection, so
	// a client on one connection queues its calls past it rather than
	// have them refused.
	DefaultPeerCalls = 16
	// DefaultPeerConns is Security.MaxPeerConns's default: 256 idle
	// connections hold about 14 MiB.
	DefaultPeerConns = 256
	// maxHandshakes bounds the TLS handshakes in progress (about 11 MiB).
	maxHandshakes = 1024
	// handshakeTimeout bounds one connection's TLS handshake and HTTP/2
	// preface.
	handshakeTimeout = 10 * time.Second
	// edgeWindow is the stream flow-control window of the edge transport:
	// what a stream whose handler does not read (server reflection waiting
	// to send) may have buffered. A larger request is read all the same:
	// gRPC widens a stream's window for the message it is reading.
	edgeWindow = 256 << 10
)

// peerCounts counts what each identity holds (its calls, or its
// connections) and refuses past a limit.
type peerCounts struct {
	what  string // "calls in progress", "connections"
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
	authz      *tlsid.Authz
	calls      *peerCounts
	conns      *peerCounts
	handshakes *semaphore.Weighted
	refused    *prometheus.CounterVec
	pace       pacer
	byAddr     sync.Map // net.Addr (the connection's own) -> *connState, while connected
	// methods are the full names of the methods the server registers,
	// set once they are (nil until then: every call is authorized).
	methods atomic.Pointer[map[string]bool]
}

func newAdmission(sec Security, reg prometheus.Registerer) (*admission, error) {
	calls, conns := sec.MaxPeerCalls, sec.MaxPeerConns
	if calls <= 0 {
		calls = DefaultPeerCalls
	}
	if conns <= 0 {
		conns = DefaultPeerConns
	}
	a := &admission{authz: sec.Authz, calls: newPeerCounts("calls in progress", calls), conns: newPeerCounts("connections", conns),
		handshakes: semaphore.NewWeighted(maxHandshakes),
		refused: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "walship_server_refusals_total",
			Help: "Connections and calls a server refused past a resource limit, by limit: handshakes (TLS handshakes in progress), peer_conns (one identity's connections), peer_calls (one identity's calls in progress)."},
			[]string{"limit"})}
	for _, l := range []string{"handshakes", "peer_conns", "peer_calls"} {
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
// count ends with the call: when its handler returns (callDone), or when
// its stream ends if no handler ran.
func (a *admission) tap(ctx context.Context, info *tap.Info) (context.Context, error) {
	if a.authz == nil {
		return ctx, nil
	}
	if m := a.methods.Load(); m != nil && !(*m)[info.FullMethodName] {
		// No such method here: gRPC answers UNIMPLEMENTED without reading
		// the call, and a caller (a typo in grpcurl) learns that, not a
		// refusal of a method that does not exist.
		return ctx, nil
	}
	cs := a.connOf(ctx)
	if err := a.authz.Tap(ctx, info.FullMethodName); err != nil {
		if cs != nil {
			// The tap runs in the connection's reader: the refused
			// peer's next frames wait with it (pacer).
			time.Sleep(a.pace.pause(cs.id))
		}
		return nil, err
	}
	if cs == nil || cs.trusted(ctx, a.authz) {
		return ctx, nil
	}
	release, err := a.calls.acquire(cs.id)
	if err != nil {
		a.refused.WithLabelValues("peer_calls").Inc()
		time.Sleep(a.pace.pause(cs.id))
		return nil, peerCallsRefusal(info.FullMethodName, err)
	}
	// A stream that never reaches a handler (an unknown method, a
	// deadline already past) ends with its context.
	stop := context.AfterFunc(ctx, release)
	return context.WithValue(ctx, slotKey{}, &callSlot{id: cs.id, method: info.FullMethodName, adm: a, release: release, stop: stop}), nil
}

// callSlot is a counted call's place, freed by callDone or its stream's
// end, whichever comes first.
type callSlot struct {
	id      string
	method  string
	adm     *admission
	release func()
	stop    func() bool
}

// Calls counts the operations a stream carries (KVService.Pipeline)
// against its peer's calls in progress, as if each were a unary call:
// kvpipe.Calls.
type Calls interface {
	// Limit is the most calls the peer may have in progress
	// (Security.MaxPeerCalls).
	Limit() int
	// Acquire counts one more call of the peer, or refuses it as the tap
	// refuses a call past the limit: RESOURCE_EXHAUSTED naming the peer
	// and --max-peer-calls, paced (waiting at most until ctx ends).
	Acquire(ctx context.Context) (release func(), err error)
}

// StreamCalls is the Calls of the stream whose context is ctx, or nil if
// its calls are not counted (plaintext, a data node's).
func StreamCalls(ctx context.Context) Calls {
	if c, ok := ctx.Value(slotKey{}).(*callSlot); ok {
		return c
	}
	return nil
}

// Limit implements Calls.
func (c *callSlot) Limit() int { return c.adm.calls.limit }

// Acquire implements Calls.
func (c *callSlot) Acquire(ctx context.Context) (func(), error) {
	release, err := c.adm.calls.acquire(c.id)
	if err == nil {
		return release, nil
	}
	c.adm.refused.WithLabelValues("peer_calls").Inc()
	t := time.NewTimer(c.adm.pace.pause(c.id))
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
	}
	return nil, peerCallsRefusal(c.method, err)
}

// peerCallsRetry is the retry a refusal past --max-peer-calls asks for.
const peerCallsRetry = 100 * time.Millisecond

// peerCallsRefusal refuses a call past --max-peer-calls. The call did
// not run, so its error says so (rpcerr.NotApplied): a write refused here
// is known not applied, and pkg/client retries it after the delay.
func peerCallsRefusal(method string, err error) error {
	return rpcerr.NotApplied(codes.ResourceExhausted, "PEER_CALLS", peerCallsRetry, "%s: %v (--max-peer-calls); retry once some are answered", method, err)
}

type slotKey struct{}

// callDone frees a call's place when its handler returns (without the
// goroutine context.AfterFunc starts at the stream's end).
func callDone(ctx context.Context) {
	if c, ok := ctx.Value(slotKey{}).(*callSlot); ok && c.stop() {
		c.release()
	}
}

// unaryDone and streamDone are the outermost interceptors: after the
// handler they pace a counted call refused for its peer's limits or
// rights (RESOURCE_EXHAUSTED, PERMISSION_DENIED), holding its place
// meanwhile, and then free the place (callDone).
func (a *admission) unaryDone(ctx context.Context, req any, _ *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	defer callDone(ctx)
	resp, err := handler(ctx, req)
	a.paceRefusal(ctx, err)
	return resp, err
}

func (a *admission) streamDone(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
	defer callDone(ss.Context())
	err := handler(srv, ss)
	a.paceRefusal(ss.Context(), err)
	return err
}

func (a *admission) paceRefusal(ctx context.Context, err error) {
	if err == nil {
		return
	}
	if code := status.Code(err); code != codes.ResourceExhausted && code != codes.PermissionDenied {
		return
	}
	// The identity's: a counted call's, or, for a data node (whose calls
	// are not counted), its connection's — a node certificate refused
	// over and over (thousands of reads past the waiting-read bound) is
	// paced like any other.
	var id string
	if c, ok := ctx.Value(slotKey{}).(*callSlot); ok {
		id = c.id
	} else if cs := a.connOf(ctx); cs != nil {
		id = cs.id
	} else {
		return
	}
	t := time.NewTimer(a.pace.pause(id))
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
	}
}

// pacer spaces out the refusals of each identity: a refused call costs
// its peer about as little as it costs the server, so a peer that is
// refused in a loop — past its calls, past the reads that may wait, a
// Txn reading past its budget, a method it may not call — would take
// the server's CPU from everyone else (internal/hostile's
// BenchmarkWellBehavedClient: a well-behaved client kept a fifth of its
// commits/s under such loops). A refusal of an identity that was refused
// refusalInterval ago or less is answered once that much time has passed
// since (at most maxRefusalPause later): about 100 refusals a second per
// identity, whatever its connections, and none delayed for a peer
// refused now and then. The tap pauses in its connection's reader, so
// the refused peer's next frames wait too; a refused handler's call
// keeps its place meanwhile.
type pacer struct {
	now  func() time.Time // nil: time.Now
	mu   sync.Mutex
	next map[string]time.Time // earliest time of each identity's next refusal
}

const (
	refusalInterval = 10 * time.Millisecond
	maxRefusalPause = time.Second
)

// pause is how long to hold a refusal of id now.
func (p *pacer) pause(id string) time.Duration {
	now := time.Now()
	if p.now != nil {
		now = p.now()
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.next == nil {
		p.next = map[string]time.Time{}
	}
	if len(p.next) > 4096 {
		for k, t := range p.next {
			if t.Before(now) {
				delete(p.next, k)
			}
		}
	}
	at := now
	if n := p.next[id]; n.After(now) {
		at = n
	}
	wait := at.Sub(now)
	if wait > maxRefusalPause {
		// Past the longest pause the queue does not grow: the refusal
		// goes out, and the next waits its interval after it.
		at, wait = now.Add(maxRefusalPause), maxRefusalPause
	}
	p.next[id] = at.Add(refusalInterval)
	return wait
}

// connState is what the servers know of one connection: its peer's
// identity, and whether it is a data node (asked of the policy at its
// first call).
type connState struct {
	id      string // tlsid.Principal of the peer's certificate
	once    sync.Once
	isTrust bool
}

// trusted evaluates, once per connection, whether its peer is a data node.
func (c *connState) trusted(ctx context.Context, az *tlsid.Authz) bool {
	c.once.Do(func() { c.isTrust = az.Trusted(ctx) })
	return c.isTrust
}

// connOf is the state of a tap's connection, which serverCreds recorded
// at the handshake (nil over plaintext). It is keyed by the connection's
// remote address as its net.Conn returns it — the very value gRPC puts in
// the peer of each call, compared without formatting it.
func (a *admission) connOf(ctx context.Context) *connState {
	p, ok := peer.FromContext(ctx)
	if !ok || p.Addr == nil {
		return nil
	}
	cs, _ := a.byAddr.Load(p.Addr)
	c, _ := cs.(*connState)
	return c
}

// serverCreds are the TLS credentials of a server's listener, with the
// handshake and connection limits, and (nodes set) the dispatch of data
// nodes' connections to the server of their own.
type serverCreds struct {
	credentials.TransportCredentials
	adm   *admission
	nodes *chanListener // nil: no dispatch
}

var errTooManyHandshakes = errors.New("serve: too many TLS handshakes in progress")

func (c *serverCreds) ServerHandshake(raw net.Conn) (net.Conn, credentials.AuthInfo, error) {
	if !c.adm.handshakes.TryAcquire(1) {
		c.adm.refused.WithLabelValues("handshakes").Inc()
		return nil, nil, errTooManyHandshakes
	}
	conn, info, err := c.TransportCredentials.ServerHandshake(raw)
	c.adm.handshakes.Release(1)
	if err != nil {
		return nil, nil, err
	}
	id := ""
	if ti, ok := info.(credentials.TLSInfo); ok && len(ti.State.PeerCertificates) > 0 {
		id = tlsid.Principal(ti.State.PeerCertificates[0])
	}
	release, err := c.adm.conns.acquire(id)
	if err != nil {
		c.adm.refused.WithLabelValues("peer_conns").Inc()
		conn.Close()
		return nil, nil, err
	}
	addr := conn.RemoteAddr()
	cs := &connState{id: id}
	c.adm.byAddr.Store(addr, cs)
	counted := &countedConn{Conn: conn, release: func() {
		c.adm.byAddr.CompareAndDelete(addr, cs)
		release()
	}}
	if c.nodes != nil && c.adm.authz != nil && c.adm.authz.TrustedIdentity(id) {
		if !c.nodes.dispatch(&handshaken{Conn: counted, info: info}) {
			counted.Close()
			return nil, nil, net.ErrClosed
		}
		return nil, nil, credentials.ErrConnDispatched
	}
	return counted, info, nil
}

func (c *serverCreds) Clone() credentials.TransportCredentials {
	return &serverCreds{TransportCredentials: c.TransportCredentials.Clone(), adm: c.adm, nodes: c.nodes}
}

// countedConn uncounts its peer's connection when closed.
type countedConn struct {
	net.Conn
	release func()
	once    sync.Once
}

func (c *countedConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(c.release)
	return err
}

// handshaken is a connection whose TLS handshake serverCreds did, passed
// to the data nodes' server with what it learned.
type handshaken struct {
	net.Conn
	info credentials.AuthInfo
}

// nodeCreds are the data nodes' server's: its connections come handshaken.
type nodeCreds struct {
	credentials.TransportCredentials
}

func (nodeCreds) ServerHandshake(c net.Conn) (net.Conn, credentials.AuthInfo, error) {
	h, ok := c.(*handshaken)
	if !ok {
		return nil, nil, errors.New("serve: a connection that did not come through the listener's handshake")
	}
	return h.Conn, h.info, nil
}

func (c nodeCreds) Clone() credentials.TransportCredentials { return c }

// chanListener is the data nodes' server's listener: the connections
// serverCreds hands it.
type chanListener struct {
	addr  net.Addr
	conns chan net.Conn
	done  chan struct{}
	once  sync.Once
}

func newChanListener(addr net.Addr) *chanListener {
	return &chanListener{addr: addr, conns: make(chan net.Conn), done: make(chan struct{})}
}

// dispatch hands c to the server, or says the listener is closed.
func (l *chanListener) dispatch(c net.Conn) bool {
	select {
	case l.conns <- c:
		return true
	case <-l.done:
		return false
	}
}

func (l *chanListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.conns:
		return c, nil
	case <-l.done:
		return nil, net.ErrClosed
	}
}

func (l *chanListener) Close() error {
	l.once.Do(func() { close(l.done) })
	return nil
}

func (l *chanListener) Addr() net.Addr { return l.addr }
