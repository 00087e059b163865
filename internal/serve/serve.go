// Package serve runs a walship gRPC server the way every walship process
// needs it: gRPC health (NOT_SERVING until the service says otherwise) and
// server reflection registered, so grpcurl needs no proto files; message size
// limits; Prometheus metrics on a separate HTTP listener; and a graceful stop
// bounded in time.
package serve

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/walship/walship/internal/apidesc"
	"github.com/walship/walship/internal/tlsid"
	"golang.org/x/sync/errgroup"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/reflection"
	reflectionv1 "google.golang.org/grpc/reflection/grpc_reflection_v1"
	reflectionv1alpha "google.golang.org/grpc/reflection/grpc_reflection_v1alpha"
	"google.golang.org/grpc/status"
)

// Options configures a Server.
type Options struct {
	// Listen is the gRPC address, e.g. ":7400" or "127.0.0.1:0".
	Listen string
	// MetricsListen is the HTTP address for /metrics; empty disables it.
	MetricsListen string
	// MaxMessageBytes bounds received and sent gRPC messages.
	MaxMessageBytes int
	// Registry receives the process and Go collectors and is served on /metrics.
	Registry *prometheus.Registry
	// Logger logs lifecycle events.
	Logger *slog.Logger
	// StopTimeout bounds the graceful stop; past it, connections are cut.
	StopTimeout time.Duration
	// Ready, if set, is what /readyz asks besides health: nil for ready,
	// else why not (a primary: whether it takes writes; a replica:
	// whether it is caught up).
	Ready func() error
	// StreamGrace is how long streams may go on after a graceful stop
	// begins, to finish what they are doing on their own (a log store acks
	// the batch it is fsyncing); then their contexts end. 0 means 1s.
	StreamGrace time.Duration
	// MaxSendBytes bounds sent messages when they may be larger than
	// received ones (a primary streams batches bigger than any request);
	// 0 means MaxMessageBytes.
	MaxSendBytes int
	// EdgeMaxMessageBytes bounds the messages received from peers that are
	// not data nodes, when the server tells them apart (TLS under the
	// default policy): the largest request such a peer has reason to send
	// (a log store receives WAL batches from nodes only). 0 means
	// MaxMessageBytes.
	EdgeMaxMessageBytes int
	// Security is TLS and authorization; the zero value serves plaintext.
	Security Security
	// WrongNode, if set, says what this node is — "127.0.0.1:7400 is a
	// log store; the primary is p1 at 127.0.0.1:7401" — to a call it does
	// not serve (a service or a method of another kind of node), which is
	// answered UNIMPLEMENTED "<method> is not served here: <WrongNode>"
	// rather than gRPC's bare "unknown service". With full false it names
	// the node's role alone: the answer to a method no policy rule can
	// have let through (the server does not register it) goes out before
	// authorization, and tells a caller nothing Status would not.
	WrongNode func(full bool) string
}

// Security is how a server authenticates and authorizes its peers.
type Security struct {
	// TLS, when set, serves TLS 1.3 only and requires a client
	// certificate from its CA bundle (reloaded as its files change).
	TLS *tlsid.Source
	// Authz checks every RPC against the authorization policy (with TLS).
	Authz *tlsid.Authz
	// MaxConnectionAge closes connections this old (after a grace for
	// their streams of half that, at most a minute), so that long streams
	// re-handshake with rotated certificates; they resume from next_lsn.
	// 0 = never.
	MaxConnectionAge time.Duration
	// MaxConcurrentStreams bounds the streams of one connection, so that
	// one client cannot hold all of a node's stream workers and memory.
	// 0 = 1000.
	MaxConcurrentStreams uint32
	// MaxPeerCalls bounds the calls one identity that is not a data node
	// may have in progress on the server (admit.go); past it a call fails
	// RESOURCE_EXHAUSTED. 0 = DefaultPeerCalls.
	MaxPeerCalls int
	// MaxPeerConns bounds one identity's connections; past it a
	// connection is closed after its handshake. 0 = DefaultPeerConns.
	MaxPeerConns int
	// Pprof serves Go's profiles (/debug/pprof/) on the metrics listener:
	// anyone who reaches that port can read them and spend the process's
	// CPU on a profile, so it is off unless asked for.
	Pprof bool
	// Dialer is how the service dials its peers: its client identity,
	// usually TLS's (NewDialer(TLS, trust domain)); zero: plaintext.
	Dialer Dialer
}

// Server is a listening gRPC server with health, reflection and metrics.
//
// With TLS under the default policy it is two gRPC servers on one
// listener: the listener's, which does every TLS handshake and serves the
// peers that are not data nodes with the edge transport (admit.go), and
// one for the data nodes' connections, which the handshake hands over
// (credentials.ErrConnDispatched), with the transport measured for
// commits and replication.
type Server struct {
	opts       Options
	endStreams chan struct{} // closed StreamGrace after a graceful stop begins
	serving    atomic.Bool
	grpc       *grpc.Server
	nodes      *grpc.Server  // nil unless the peers are told apart
	nodeLis    *chanListener // nodes' listener
	adm        *admission
	health     *health.Server
	lis        net.Listener
	metrics    *http.Server
	metricLis  net.Listener
	services   []string
}

// NewRegistry returns a metrics registry holding the Go runtime and process
// collectors; each walship process builds its own (no global registry).
func NewRegistry() *prometheus.Registry {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return reg
}

// New listens on the configured addresses and returns a Server whose gRPC
// services are registered by register. Health reports NOT_SERVING until
// SetServing(true).
func New(opts Options, register func(*grpc.Server)) (*Server, error) {
	opts = withDefaults(opts)
	lis, err := net.Listen("tcp", opts.Listen)
	if err != nil {
		return nil, fmt.Errorf("listen %s: %w", opts.Listen, err)
	}
	s := &Server{opts: opts, lis: lis, endStreams: make(chan struct{})}
	sopts, nodeOpts, err := s.serverOptions()
	if err != nil {
		lis.Close()
		return nil, err
	}
	s.grpc = grpc.NewServer(sopts...)
	s.health = health.NewServer()
	servers := []*grpc.Server{s.grpc}
	if nodeOpts != nil {
		s.nodes = grpc.NewServer(nodeOpts...)
		servers = append(servers, s.nodes)
	}
	for _, g := range servers {
		register(g)
		healthpb.RegisterHealthServer(g, s.health)
		if err := registerReflection(g); err != nil {
			lis.Close()
			return nil, err
		}
	}
	methods := map[string]bool{}
	for name, info := range s.grpc.GetServiceInfo() {
		s.services = append(s.services, name)
		for _, m := range info.Methods {
			methods["/"+name+"/"+m.Name] = true
		}
	}
	s.adm.methods.Store(&methods)
	s.SetServing(false)
	if opts.MetricsListen != "" {
		if err := s.listenMetrics(); err != nil {
			lis.Close()
			return nil, err
		}
	}
	return s, nil
}

// withDefaults is opts with its unset fields set.
func withDefaults(opts Options) Options {
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	if opts.StopTimeout <= 0 {
		opts.StopTimeout = 30 * time.Second
	}
	if opts.MaxMessageBytes <= 0 {
		opts.MaxMessageBytes = 4 << 20
	}
	if opts.MaxSendBytes <= 0 {
		opts.MaxSendBytes = opts.MaxMessageBytes
	}
	if opts.EdgeMaxMessageBytes <= 0 {
		opts.EdgeMaxMessageBytes = opts.MaxMessageBytes
	}
	if opts.StreamGrace <= 0 {
		opts.StreamGrace = time.Second
	}
	return opts
}

// serverOptions are the gRPC servers': the listener's, and the data
// nodes' (nil unless the peers are told apart). Both have the codec that
// refuses what does not decode (decode.go), keepalive, the tap that
// authorizes and counts calls (admit.go) and the interceptors
// (authorization first); they differ in transport: the nodes' has the
// fixed windows measured for commits and replication (transport.go),
// MaxMessageBytes and MaxConcurrentStreams; the edge's, small windows,
// EdgeMaxMessageBytes and MaxPeerCalls streams per connection.
func (s *Server) serverOptions() (edge, nodes []grpc.ServerOption, err error) {
	opts, sec := s.opts, s.opts.Security
	if sec.TLS != nil && sec.Authz == nil {
		return nil, nil, errors.New("serve: TLS without an authorization policy would let any certificate of the CA call everything")
	}
	if sec.MaxConcurrentStreams == 0 {
		sec.MaxConcurrentStreams = 1000
	}
	var reg prometheus.Registerer
	if opts.Registry != nil {
		reg = opts.Registry
	}
	if s.adm, err = newAdmission(sec, reg); err != nil {
		return nil, nil, err
	}
	unary := []grpc.UnaryServerInterceptor{refuseMarkedUnary}
	stream := []grpc.StreamServerInterceptor{refuseMarkedStream, s.endStreamsOnStop}
	common := []grpc.ServerOption{
		grpc.ForceServerCodecV2(newCheckedCodec()),
		grpc.MaxSendMsgSize(opts.MaxSendBytes),
		grpc.NumStreamWorkers(streamWorkers()),
		// Replication streams are long-lived; let peers ping them, but
		// not more often than every 5 s (a flood of pings is refused).
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: 5 * time.Second, PermitWithoutStream: true}),
		grpc.ConnectionTimeout(handshakeTimeout),
	}
	if sec.Authz != nil {
		// Before anything of the call is read (tlsid.Authz.Tap); it also
		// counts the calls of peers that are not data nodes (admit.go).
		common = append(common, grpc.InTapHandle(s.adm.tap))
	}
	nodeTransport := append(transportOptions(),
		grpc.MaxRecvMsgSize(opts.MaxMessageBytes),
		grpc.MaxConcurrentStreams(sec.MaxConcurrentStreams))
	split := sec.TLS != nil && sec.Authz.DefaultPolicy()
	edgeTransport := nodeTransport
	if split {
		s.nodeLis = newChanListener(s.lis.Addr())
		edgeTransport = []grpc.ServerOption{
			grpc.InitialWindowSize(edgeWindow),
			grpc.InitialConnWindowSize(connWindow),
			grpc.MaxRecvMsgSize(opts.EdgeMaxMessageBytes),
			grpc.MaxConcurrentStreams(uint32(s.adm.calls.limit)),
		}
	}
	edge = append(append([]grpc.ServerOption{}, common...), edgeTransport...)
	if sec.TLS != nil {
		edge = append(edge, grpc.Creds(&serverCreds{TransportCredentials: credentials.NewTLS(sec.TLS.ServerConfig()), adm: s.adm, nodes: s.nodeLis}))
		if opts.Registry != nil {
			// A data node's next role's server registers them again.
			if err := sec.TLS.Register(opts.Registry); err != nil && !errors.As(err, new(prometheus.AlreadyRegisteredError)) {
				return nil, nil, err
			}
		}
	}
	if sec.Authz != nil {
		if opts.Registry != nil {
			if err := sec.Authz.Register(opts.Registry); err != nil && !errors.As(err, new(prometheus.AlreadyRegisteredError)) {
				return nil, nil, err
			}
		}
		// Then first among the interceptors, which alone see a request:
		// nothing runs for a caller the policy refuses.
		unary = append([]grpc.UnaryServerInterceptor{s.adm.unaryDone, sec.Authz.Unary}, unary...)
		stream = append([]grpc.StreamServerInterceptor{s.adm.streamDone, sec.Authz.Stream}, stream...)
	}
	var tail []grpc.ServerOption
	if opts.WrongNode != nil {
		// A method the server does not register is answered first (after
		// the admission's count), UNIMPLEMENTED as gRPC would, whoever
		// asks: the handler below only routes it into the chain.
		unknown := []grpc.StreamServerInterceptor{s.unregisteredStream}
		if sec.Authz != nil {
			stream = append(append([]grpc.StreamServerInterceptor{stream[0]}, unknown...), stream[1:]...)
		} else {
			stream = append(unknown, stream...)
		}
		// Last in the chains: only what the handler itself answers.
		unary = append(unary, s.wrongNodeUnary)
		stream = append(stream, s.wrongNodeStream)
		tail = append(tail, grpc.UnknownServiceHandler(func(_ any, ss grpc.ServerStream) error {
			method, _ := grpc.MethodFromServerStream(ss)
			return s.wrongNode(method, sec.Authz == nil)
		}))
	}
	if sec.MaxConnectionAge > 0 {
		grace := min(time.Minute, sec.MaxConnectionAge/2)
		tail = append(tail, grpc.KeepaliveParams(keepalive.ServerParameters{MaxConnectionAge: sec.MaxConnectionAge, MaxConnectionAgeGrace: grace}))
	}
	tail = append(tail, grpc.ChainUnaryInterceptor(unary...), grpc.ChainStreamInterceptor(stream...))
	edge = append(edge, tail...)
	if split {
		nodes = append(append(append(append([]grpc.ServerOption{}, common...), nodeTransport...),
			grpc.Creds(nodeCreds{credentials.NewTLS(sec.TLS.ServerConfig())})), tail...)
	}
	return edge, nodes, nil
}

// registerReflection registers server reflection, v1 and v1alpha. It
// serves walship's descriptors with their comments, so `grpcurl describe`
// is the user's manual.
func registerReflection(g *grpc.Server) error {
	res, err := apidesc.NewResolver()
	if err != nil {
		return err
	}
	ropts := reflection.ServerOptions{Services: g, DescriptorResolver: res}
	reflectionv1.RegisterServerReflectionServer(g, reflection.NewServerV1(ropts))
	reflectionv1alpha.RegisterServerReflectionServer(g, reflection.NewServer(ropts))
	return nil
}

// listenMetrics listens on MetricsListen for /metrics and the HTTP probes.
func (s *Server) listenMetrics() error {
	ml, err := net.Listen("tcp", s.opts.MetricsListen)
	if err != nil {
		return fmt.Errorf("listen %s (metrics): %w", s.opts.MetricsListen, err)
	}
	s.metricLis = ml
	mux := http.NewServeMux()
	reg := s.opts.Registry
	if reg == nil {
		reg = prometheus.NewRegistry()
	}
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg, EnableOpenMetrics: true}))
	// Probes that cannot speak gRPC over mTLS (kubelet's cannot):
	// /healthz says the process answers, /readyz what health and
	// opts.Ready say.
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { fmt.Fprintln(w, "ok") })
	mux.HandleFunc("/readyz", s.readyz)
	if s.opts.Security.Pprof {
		mux.HandleFunc("/debug/pprof/", pprof.Index)
		mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
		mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
		mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
		mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	}
	s.metrics = &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	return nil
}

// readyz serves /readyz: ready when serving and Options.Ready (if set)
// says so.
func (s *Server) readyz(w http.ResponseWriter, _ *http.Request) {
	if !s.Serving() {
		http.Error(w, "not serving", http.StatusServiceUnavailable)
		return
	}
	if s.opts.Ready != nil {
		if err := s.opts.Ready(); err != nil {
			http.Error(w, "not ready: "+err.Error(), http.StatusServiceUnavailable)
			return
		}
	}
	fmt.Fprintln(w, "serving")
}

// Addr is the gRPC listener's address (useful with port 0).
func (s *Server) Addr() string { return s.lis.Addr().String() }

// MetricsAddr is the metrics listener's address, or "" when disabled.
func (s *Server) MetricsAddr() string {
	if s.metricLis == nil {
		return ""
	}
	return s.metricLis.Addr().String()
}

// Serving reports what SetServing last set.
func (s *Server) Serving() bool { return s.serving.Load() }

// SetServing sets the health status of the server ("") and of every
// registered service.
func (s *Server) SetServing(serving bool) {
	s.serving.Store(serving)
	st := healthpb.HealthCheckResponse_NOT_SERVING
	if serving {
		st = healthpb.HealthCheckResponse_SERVING
	}
	s.health.SetServingStatus("", st)
	for _, name := range s.services {
		s.health.SetServingStatus(name, st)
	}
}

// Serve serves until ctx is done, then reports NOT_SERVING, stops
// gracefully (bounded by StopTimeout) and returns. beforeStop, if not nil,
// runs after health turns NOT_SERVING and before the gRPC server stops
// accepting calls, so a service can refuse new work first.
func (s *Server) Serve(ctx context.Context, beforeStop func()) error {
	g, gctx := errgroup.WithContext(ctx)
	g.Go(func() error {
		if err := s.grpc.Serve(s.lis); err != nil && !errors.Is(err, grpc.ErrServerStopped) {
			return fmt.Errorf("grpc serve: %w", err)
		}
		return nil
	})
	if s.nodes != nil {
		g.Go(func() error {
			if err := s.nodes.Serve(s.nodeLis); err != nil && !errors.Is(err, grpc.ErrServerStopped) {
				return fmt.Errorf("grpc serve (data nodes): %w", err)
			}
			return nil
		})
	}
	if s.metrics != nil {
		g.Go(func() error {
			if err := s.metrics.Serve(s.metricLis); err != nil && !errors.Is(err, http.ErrServerClosed) {
				return fmt.Errorf("metrics serve: %w", err)
			}
			return nil
		})
	}
	g.Go(func() error {
		<-gctx.Done()
		s.opts.Logger.Info("stopping", "addr", s.Addr())
		s.health.Shutdown()
		if beforeStop != nil {
			beforeStop()
		}
		grace := time.AfterFunc(s.opts.StreamGrace, func() { close(s.endStreams) })
		defer grace.Stop()
		done := make(chan struct{})
		go func() {
			var wg sync.WaitGroup
			for _, g := range s.servers() {
				wg.Go(g.GracefulStop)
			}
			wg.Wait()
			close(done)
		}()
		t := time.NewTimer(s.opts.StopTimeout)
		defer t.Stop()
		select {
		case <-done:
		case <-t.C:
			s.opts.Logger.Warn("graceful stop timed out; closing connections", "timeout", s.opts.StopTimeout)
			for _, g := range s.servers() {
				g.Stop()
			}
			<-done
		}
		if s.metrics != nil {
			sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			_ = s.metrics.Shutdown(sctx)
		}
		return nil
	})
	return g.Wait()
}

// Close releases the listeners of a server that was never served.
func (s *Server) Close() {
	for _, g := range s.servers() {
		g.Stop()
	}
	if s.nodeLis != nil {
		s.nodeLis.Close()
	}
	s.lis.Close() // a listener never served is not the gRPC server's to close
	if s.metricLis != nil {
		s.metricLis.Close()
	}
}

// servers are the gRPC servers: the listener's, and the data nodes'.
func (s *Server) servers() []*grpc.Server {
	if s.nodes == nil {
		return []*grpc.Server{s.grpc}
	}
	return []*grpc.Server{s.grpc, s.nodes}
}

// endStreamsOnStop gives every streaming call a context that ends
// StreamGrace after a graceful stop begins. Long-lived streams (replication, log store follow,
// health Watch) would otherwise hold GracefulStop until StopTimeout; their
// handlers see the context end and return, and peers reconnect elsewhere or
// later.
func (s *Server) endStreamsOnStop(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
	ctx, cancel := context.WithCancel(ss.Context())
	defer cancel()
	go func() {
		select {
		case <-s.endStreams:
			cancel()
		case <-ctx.Done():
		}
	}()
	err := handler(srv, &stoppableStream{ServerStream: ss, ctx: ctx})
	select {
	case <-s.endStreams:
		// Ended by the stop, not by the peer: tell it to retry elsewhere or later.
		if errors.Is(err, context.Canceled) || status.Code(err) == codes.Canceled {
			return status.Error(codes.Unavailable, "server is stopping")
		}
	default:
	}
	return err
}

type stoppableStream struct {
	grpc.ServerStream
	ctx context.Context
}

func (s *stoppableStream) Context() context.Context { return s.ctx }

// wrongNode is the answer to a call of method this node does not serve;
// full says what WrongNode may say.
func (s *Server) wrongNode(method string, full bool) error {
	return status.Errorf(codes.Unimplemented, "%s is not served here: %s", method, s.opts.WrongNode(full))
}

// unregisteredStream answers a method the server does not register (an
// unknown service or method reaches the chain as a stream) before the
// authorization, which would refuse it PERMISSION_DENIED: no policy rule
// names it. Without authorization every caller may read the full answer.
func (s *Server) unregisteredStream(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
	if m := s.adm.methods.Load(); m != nil && !(*m)[info.FullMethod] {
		return s.wrongNode(info.FullMethod, s.opts.Security.Authz == nil)
	}
	return handler(srv, ss)
}

// isStub reports whether err is the answer of a generated
// Unimplemented<Service>Server method: a method of a service this node
// registers but does not serve (a log store's Verify on a data node).
func isStub(err error) bool {
	st, ok := status.FromError(err)
	if !ok || st.Code() != codes.Unimplemented {
		return false
	}
	m := st.Message()
	return strings.HasPrefix(m, "method ") && strings.HasSuffix(m, " not implemented")
}

func (s *Server) wrongNodeUnary(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	resp, err := handler(ctx, req)
	if isStub(err) {
		return nil, s.wrongNode(info.FullMethod, true) // past the authorization
	}
	return resp, err
}

func (s *Server) wrongNodeStream(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
	err := handler(srv, ss)
	if isStub(err) {
		return s.wrongNode(info.FullMethod, true) // past the authorization
	}
	return err
}
