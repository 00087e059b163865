package tlsid

import (
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	walshipv1 "github.com/walship/walship/gen/walship/v1"

	"google.golang.org/grpc"
	"google.golang.org/grpc/authz"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
)

// Identity classes. walship's default policy knows them by a SPIFFE path
// under the trust domain: spiffe://TRUST-DOMAIN/walship/CLASS/NAME.
const (
	ClassNode     = "node"     // a data node: primary or replica
	ClassLogStore = "logstore" // a log store
	ClassClient   = "client"   // reads and writes
	ClassAdmin    = "admin"    // operators: Promote, Switchover, SetPolicy
)

// URI is the identity of name in class under trust domain td.
func URI(td, class, name string) string {
	return fmt.Sprintf("spiffe://%s/walship/%s/%s", td, class, name)
}

// Reflection says who may use server reflection.
type Reflection string

// Reflection settings.
const (
	ReflectionAll   Reflection = "all"   // any authenticated peer
	ReflectionAdmin Reflection = "admin" // admins only (the prod overlay)
	ReflectionOff   Reflection = "off"   // nobody
)

// Set parses --reflection.
func (r *Reflection) Set(s string) error {
	switch Reflection(s) {
	case ReflectionAll, ReflectionAdmin, ReflectionOff:
		*r = Reflection(s)
		return nil
	}
	return fmt.Errorf("want all, admin or off, not %q", s)
}

func (r *Reflection) String() string { return string(*r) }

type rule struct {
	Name   string `json:"name"`
	Source *struct {
		Principals []string `json:"principals"`
	} `json:"source,omitempty"`
	Request struct {
		Paths []string `json:"paths"`
	} `json:"request"`
}

// DefaultPolicy is walship's authorization policy (gRPC A43, the format
// of grpc-go's authz package) for trust domain td: deny by default;
// health for anyone; Status for every identity of the trust domain;
// replication, log-store and epoch RPCs (and Promote, which a switching
// primary calls on its target) for data nodes; LogStoreService.Read for
// log stores (a refill from a peer); ChangeMembers for data nodes and log
// stores, each for its own kind (--join, --leave-on-scale-down); reads
// and writes for clients, admins
// and nodes; every admin RPC, a log store's Verify and its election
// register (a pause of automatic failover), for admins;
// reflection as r says.
func DefaultPolicy(td string, r Reflection) string {
	class := func(cs ...string) []string {
		var ps []string
		for _, c := range cs {
			ps = append(ps, URI(td, c, "*"))
		}
		return ps
	}
	var rules []rule
	add := func(name string, principals []string, paths ...string) {
		ru := rule{Name: name}
		if principals != nil {
			ru.Source = &struct {
				Principals []string `json:"principals"`
			}{principals}
		}
		ru.Request.Paths = paths
		rules = append(rules, ru)
	}
	add("health", nil, "/grpc.health.v1.Health/*")
	add("status", class(ClassNode, ClassLogStore, ClassClient, ClassAdmin),
		"/walship.v1.AdminService/Status", "/walship.v1.LogStoreService/Status")
	// A log store refills what it lacks from its peers' Read.
	add("logstores", class(ClassLogStore), "/walship.v1.LogStoreService/Read")
	add("nodes", class(ClassNode),
		"/walship.v1.ReplicationService/*", "/walship.v1.LogStoreService/*", "/walship.v1.EpochService/*", "/walship.v1.AdminService/Promote")
	// Nodes too: a node can already become the primary (Fence, Promote),
	// so reads and writes add nothing, and in-process tools (walship dev,
	// bench) dial as their nodes.
	add("clients", class(ClassClient, ClassAdmin, ClassNode), "/walship.v1.KVService/*")
	// A data node started with --join or --leave-on-scale-down asks the
	// primary to add or remove it, and so does a log store; check below
	// keeps each to its own kind of member.
	add("members", class(ClassNode, ClassLogStore), changeMembersMethod)
	add("admins", class(ClassAdmin), "/walship.v1.AdminService/*")
	// walship ctl failover pause|resume writes the log stores' election
	// registers (an admin may already Promote, which overrides the
	// election).
	add("failover-pause", class(ClassAdmin), "/walship.v1.EpochService/Elect")
	// Checking an archive (walship ctl verify) and restoring from it
	// (walship restore) read what it holds, as a node may, and write
	// nothing there.
	add("archive", class(ClassAdmin), "/walship.v1.LogStoreService/Verify",
		"/walship.v1.LogStoreService/Read", "/walship.v1.LogStoreService/GetSnapshot")
	reflection := []string{"/grpc.reflection.v1.ServerReflection/*", "/grpc.reflection.v1alpha.ServerReflection/*"}
	switch r {
	case ReflectionAll, "":
		add("reflection", class(ClassNode, ClassLogStore, ClassClient, ClassAdmin), reflection...)
	case ReflectionAdmin:
		add("reflection", class(ClassAdmin), reflection...)
	}
	b, _ := json.MarshalIndent(struct {
		Name  string `json:"name"`
		Allow []rule `json:"allow_rules"`
	}{"walship", rules}, "", "  ")
	return string(b)
}

// Authz checks every RPC against a policy: a policy file (A43 JSON,
// reloaded by Watch when it changes) if one is named, else
// DefaultPolicy. Whatever the policy, a peer must be one well-formed
// SPIFFE ID, and only an admin may Promote with force, dry run or epoch
// (check). A refused call fails PERMISSION_DENIED naming the caller and
// the method.
type Authz struct {
	// policy is the policy in force: grpc's static interceptor, swapped
	// whole when the file changes.
	policy atomic.Pointer[authz.StaticInterceptor]
	// file is the policy file, "" under the default policy.
	file   string
	logger *slog.Logger
	// td is the trust domain: the default policy's, and the one whose
	// classes the denials are counted by.
	td string
	// allowed caches, under the default policy (which looks only at the
	// peer's certificate and the method), the pairs it allowed: a commit
	// then costs a map lookup rather than an RBAC evaluation. Keyed by the
	// connection's parsed certificate, which the entry keeps alive, so the
	// pointer is never reused; cleared when it holds maxAllowed pairs.
	allowed  sync.Map // allowKey -> struct{}
	nAllowed atomic.Int64

	// reloadMu orders Reloads; seen identifies the file's contents (or
	// read error) the last Reload looked at, current those in force.
	reloadMu      sync.Mutex
	seen, current [sha256.Size]byte
	reloads       *prometheus.CounterVec

	denied  *prometheus.CounterVec
	denials denialLog
	now     func() time.Time
}

type allowKey struct {
	cert   *x509.Certificate
	method string
}

const maxAllowed = 4096

// leaf is the peer's certificate, or nil.
func leaf(ctx context.Context) *x509.Certificate {
	p, ok := peer.FromContext(ctx)
	if !ok {
		return nil
	}
	ti, ok := p.AuthInfo.(credentials.TLSInfo)
	if !ok || len(ti.State.PeerCertificates) == 0 {
		return nil
	}
	return ti.State.PeerCertificates[0]
}

// cached reports whether the default policy already allowed this peer's
// certificate to call method (never for Promote, whose rule reads the
// request).
func (a *Authz) cached(ctx context.Context, method string) (allowKey, bool) {
	if a.file != "" || method == promoteMethod || method == changeMembersMethod {
		return allowKey{}, false
	}
	k := allowKey{leaf(ctx), method}
	if k.cert == nil {
		return allowKey{}, false
	}
	_, ok := a.allowed.Load(k)
	return k, ok
}

func (a *Authz) remember(k allowKey) {
	if k.cert == nil {
		return
	}
	if a.nAllowed.Add(1) > maxAllowed {
		a.allowed.Clear()
		a.nAllowed.Store(1)
	}
	a.allowed.Store(k, struct{}{})
}

// AuthzConfig configures NewAuthz.
type AuthzConfig struct {
	// TrustDomain is the default policy's SPIFFE trust domain; required
	// without PolicyFile.
	TrustDomain string
	// Reflection says who the default policy lets use server reflection.
	Reflection Reflection
	// PolicyFile, if set, is the policy (A43 JSON) instead of the default.
	PolicyFile string
	// Logger logs policy reloads and refused calls.
	Logger *slog.Logger
}

// NewAuthz builds the policy check; a policy file must be good from the
// start.
func NewAuthz(cfg AuthzConfig) (*Authz, error) {
	a := &Authz{file: cfg.PolicyFile, logger: cfg.Logger, td: cfg.TrustDomain, now: time.Now}
	if a.logger == nil {
		a.logger = slog.New(slog.DiscardHandler)
	}
	a.reloads = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "walship_authz_policy_reloads_total",
		Help: "Reads of a changed --authz-policy file, by result: ok (its policy swapped in) or error (the policy in force kept).",
	}, []string{"result"})
	for _, r := range []string{"ok", "error"} {
		a.reloads.WithLabelValues(r) // exported at 0 from the start
	}
	a.denied = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "walship_authz_denied_total",
		Help: "Calls refused by the authorization policy or the identity rules, by method (unknown: one no service here declares) and caller class (node, logstore, client, admin; other: another SPIFFE ID; none: no certificate identity that keeps the rules).",
	}, []string{"method", "class"})
	if a.file != "" {
		b, err := os.ReadFile(a.file)
		if err != nil {
			return nil, fmt.Errorf("--authz-policy: %w", err)
		}
		in, err := parsePolicy(a.file, b)
		if err != nil {
			return nil, err
		}
		a.policy.Store(in)
		a.seen = sha256.Sum256(b)
		a.current = a.seen
		return a, nil
	}
	if a.td == "" {
		return nil, fmt.Errorf("--trust-domain: required with TLS (or give --authz-policy)")
	}
	in, err := authz.NewStatic(DefaultPolicy(a.td, cfg.Reflection))
	if err != nil {
		return nil, fmt.Errorf("the default authorization policy: %w", err)
	}
	a.policy.Store(in)
	return a, nil
}

// Register adds the authorization metrics to reg.
func (a *Authz) Register(reg prometheus.Registerer) error {
	for _, c := range []prometheus.Collector{a.reloads, a.denied} {
		if err := reg.Register(c); err != nil {
			return err
		}
	}
	return nil
}

// parsePolicy checks an A43 policy file's contents b.
func parsePolicy(file string, b []byte) (*authz.StaticInterceptor, error) {
	if len(bytes.TrimSpace(b)) == 0 {
		return nil, fmt.Errorf("--authz-policy %s: the file is empty", file)
	}
	in, err := authz.NewStatic(string(b))
	if err != nil {
		return nil, fmt.Errorf("--authz-policy %s: %w", file, err)
	}
	return in, nil
}

// Reload reads the policy file again and swaps in its policy if it
// changed and checks out; on an error the policy in force stays. It
// reports whether it swapped. Contents (or a read error) the last Reload
// saw are not looked at again, so a bad edit is counted and reported
// once, not at every poll. grpc's own file watcher is not used: it logs a
// bad edit only through grpclog, and serves no policy at all when the
// file starts empty.
func (a *Authz) Reload() (bool, error) {
	if a.file == "" {
		return false, nil
	}
	a.reloadMu.Lock()
	defer a.reloadMu.Unlock()
	b, readErr := os.ReadFile(a.file)
	sum := sha256.Sum256(b)
	if readErr != nil {
		sum = sha256.Sum256([]byte("read: " + readErr.Error()))
	}
	if sum == a.seen {
		return false, nil
	}
	a.seen = sum
	if sum == a.current {
		return false, nil // back to the policy in force
	}
	var in *authz.StaticInterceptor
	err := readErr
	if err != nil {
		err = fmt.Errorf("--authz-policy: %w", err)
	} else {
		in, err = parsePolicy(a.file, b)
	}
	if err != nil {
		a.reloads.WithLabelValues("error").Inc()
		return false, err
	}
	a.policy.Store(in)
	a.current = sum
	a.reloads.WithLabelValues("ok").Inc()
	return true, nil
}

// Watch reloads the policy file every interval until ctx ends (a
// Kubernetes ConfigMap volume changes by a symlink swap, which polling
// sees); it returns at once under the default policy.
func (a *Authz) Watch(ctx context.Context, every time.Duration) {
	if a.file == "" {
		return
	}
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		switch swapped, err := a.Reload(); {
		case err != nil:
			a.logger.Error("authorization policy file changed but does not check out; keeping the policy in force", "file", a.file, "err", err)
		case swapped:
			a.logger.Info("authorization policy reloaded", "file", a.file)
		}
	}
}

// refuse counts and (rate-limited) logs a refused call, and returns err,
// the refusal.
func (a *Authz) refuse(ctx context.Context, method string, err error) error {
	class, m := a.classOf(ctx), methodLabel(method)
	a.denied.WithLabelValues(m, class).Inc()
	if ok, held := a.denials.let(class, m, a.now()); ok {
		var addr string
		if p, ok := peer.FromContext(ctx); ok && p.Addr != nil {
			addr = p.Addr.String()
		}
		a.logger.Warn("call refused by the authorization policy", "method", m, "class", class, "peer", Peer(ctx), "addr", addr,
			"reason", status.Convert(err).Message(), "held_back", held)
	}
	return err
}

// Caller classes of walship_authz_denied_total besides the four of the
// default policy.
const (
	classOther = "other" // a well-formed SPIFFE ID outside walship's classes
	classNone  = "none"  // no certificate identity that keeps the identity rules
)

// classOf is the class of the call's peer for the metrics and logs.
func (a *Authz) classOf(ctx context.Context) string {
	u, err := spiffeID(ctx)
	if err != nil {
		return classNone
	}
	id := u.String()
	for _, c := range []string{ClassNode, ClassLogStore, ClassClient, ClassAdmin} {
		if a.td != "" && strings.HasPrefix(id, "spiffe://"+a.td+"/walship/"+c+"/") {
			return c
		}
	}
	return classOther
}

// methodLabel is method if a service compiled into this binary declares
// it, else "unknown", so that the label's values stay bounded whatever a
// peer asks for (gRPC runs interceptors only for registered methods
// anyway).
func methodLabel(method string) string {
	svc, m, ok := strings.Cut(strings.TrimPrefix(method, "/"), "/")
	if !ok {
		return "unknown"
	}
	d, err := protoregistry.GlobalFiles.FindDescriptorByName(protoreflect.FullName(svc))
	if err != nil {
		return "unknown"
	}
	if sd, ok := d.(protoreflect.ServiceDescriptor); !ok || sd.Methods().ByName(protoreflect.Name(m)) == nil {
		return "unknown"
	}
	return method
}

// denialLog lets through at most one log line a second per class and
// method of refused calls, and counts the refusals it held back: a peer
// retrying a refused call in a loop must not flood the log.
type denialLog struct {
	mu   sync.Mutex
	last map[[2]string]denialSeen // bounded: classes x methodLabel's values
}

type denialSeen struct {
	at   time.Time
	held int
}

// let reports whether a refusal of method for class at now is logged, and
// how many were held back since the last one that was.
func (d *denialLog) let(class, method string, now time.Time) (bool, int) {
	d.mu.Lock()
	defer d.mu.Unlock()
	k := [2]string{class, method}
	s, ok := d.last[k]
	if ok && now.Sub(s.at) < time.Second {
		s.held++
		d.last[k] = s
		return false, 0
	}
	if d.last == nil {
		d.last = map[[2]string]denialSeen{}
	}
	d.last[k] = denialSeen{at: now}
	return true, s.held
}

func (a *Authz) deniedErr(ctx context.Context, method string, err error) error {
	if status.Code(err) != codes.PermissionDenied {
		return err
	}
	who := Peer(ctx)
	if who == "" {
		who = "a peer without a certificate identity"
	}
	// The usual cause of a refusal: a certificate of another trust
	// domain (dev certificates are of walship.dev), which the default
	// policy never lets in. Say which one this server expects.
	if u, err := spiffeID(ctx); err == nil && a.td != "" && !strings.EqualFold(u.Host, a.td) {
		return status.Errorf(codes.PermissionDenied, "%s may not call %s (authorization policy): its trust domain is %s, this server expects %s (its --trust-domain)", who, method, u.Host, a.td)
	}
	return status.Errorf(codes.PermissionDenied, "%s may not call %s (authorization policy)", who, method)
}

// spiffeID is a peer's one SPIFFE ID, or an error saying why its
// certificate does not have exactly one well-formed ID.
func spiffeID(ctx context.Context) (*url.URL, error) {
	p, ok := peer.FromContext(ctx)
	if !ok {
		return nil, errors.New("no peer")
	}
	ti, ok := p.AuthInfo.(credentials.TLSInfo)
	if !ok || len(ti.State.PeerCertificates) == 0 {
		return nil, errors.New("no client certificate")
	}
	return certSPIFFEID(ti.State.PeerCertificates[0])
}

// certSPIFFEID is c's one SPIFFE ID, or an error saying why c does not
// have exactly one well-formed ID.
func certSPIFFEID(c *x509.Certificate) (*url.URL, error) {
	for _, d := range c.DNSNames {
		if len(d) >= len("spiffe:") && strings.EqualFold(d[:len("spiffe:")], "spiffe:") {
			return nil, fmt.Errorf("DNS name %q looks like a SPIFFE ID", d)
		}
	}
	if len(c.URIs) != 1 {
		return nil, fmt.Errorf("%d URI names, want exactly one SPIFFE ID", len(c.URIs))
	}
	u := c.URIs[0]
	if u.Scheme != "spiffe" || u.Host == "" || u.User != nil || u.Port() != "" || u.RawQuery != "" || u.Fragment != "" || u.Opaque != "" ||
		u.RawPath != "" || strings.Contains(u.Path, "%") {
		return nil, fmt.Errorf("%q is not a well-formed SPIFFE ID", u)
	}
	// Under a policy file every call comes here (no cache): allocate nothing.
	for seg := range strings.SplitSeq(strings.TrimPrefix(u.Path, "/"), "/") {
		if seg == "" || seg == "." || seg == ".." {
			return nil, fmt.Errorf("%q is not a well-formed SPIFFE ID (empty or dot path segment)", u)
		}
	}
	return u, nil
}

// check applies the rules that hold whatever the policy says, which then
// only decides which identity may call what: one well-formed SPIFFE ID
// per peer (grpc's matching would accept any of several URI or DNS names,
// by raw prefix), and Promote with force, depose, dry run or epoch (admins' tools)
// only for an admin — a node asks only for a plain promotion (a
// switchover).
func (a *Authz) check(ctx context.Context, method string, req any) error {
	if strings.HasPrefix(method, "/grpc.health.v1.Health/") {
		return nil
	}
	u, err := spiffeID(ctx)
	if err != nil {
		return status.Errorf(codes.PermissionDenied, "%s may not call %s: the certificate's identity: %v", Peer(ctx), method, err)
	}
	switch method {
	case promoteMethod:
		if pr, ok := req.(*walshipv1.PromoteRequest); (!ok || pr.GetForce() || pr.GetDepose() || pr.GetDryRun() || pr.GetEpoch() != 0) && !a.admin(ctx) {
			return status.Errorf(codes.PermissionDenied, "%s may not call %s with force, depose, dry_run or epoch: a node asks only for a plain promotion (a switchover); the rest is for admins, whom the policy lets call every AdminService method", u, method)
		}
	case changeMembersMethod:
		if _, tap := req.(unreadChange); tap {
			break
		}
		// The trust domain is the policy's to check.
		if class, _ := classOf(u.Host, u.Path, u.Host); selfChange(req) != class && !a.admin(ctx) {
			return status.Errorf(codes.PermissionDenied, "%s may not call %s with that change: a data node may only ask to add or remove a data node, a log store a log store (--join, --leave-on-scale-down); a replacement and every other change are for admins, whom the policy lets call every AdminService method", u, method)
		}
	}
	return nil
}

const (
	promoteMethod       = "/walship.v1.AdminService/Promote"
	changeMembersMethod = "/walship.v1.AdminService/ChangeMembers"
)

// selfChange is the class of peer that may ask for the membership change
// req without being an admin: a data node adds or removes data nodes, a
// log store adds or removes log stores (each asks for itself; the
// certificates of a StatefulSet's pods are shared, so the class is what
// can be checked). "admin" for anything else: a replacement, or what is
// not a ChangeMembersRequest.
func selfChange(req any) string {
	r, ok := req.(*walshipv1.ChangeMembersRequest)
	if !ok {
		return ClassAdmin
	}
	switch r.GetChange().(type) {
	case *walshipv1.ChangeMembersRequest_Add, *walshipv1.ChangeMembersRequest_Remove:
		return ClassNode
	case *walshipv1.ChangeMembersRequest_AddLogstore, *walshipv1.ChangeMembersRequest_RemoveLogstore:
		return ClassLogStore
	}
	return ClassAdmin
}

// admin reports whether the policy in force lets the call's peer call
// every AdminService method: what an admin is under any policy, so that
// a custom policy need not name walship's classes. (Under the default
// policy: the admin class.) A Promote costs a few RBAC evaluations; it
// is rare.
func (a *Authz) admin(ctx context.Context) bool {
	in := a.policy.Load()
	allow := func(context.Context, any) (any, error) { return nil, nil }
	for _, m := range walshipv1.AdminService_ServiceDesc.Methods {
		full := "/" + walshipv1.AdminService_ServiceDesc.ServiceName + "/" + m.MethodName
		// grpc's RBAC engine reads the method from the call's stream.
		mctx := grpc.NewContextWithServerTransportStream(ctx, probe(full))
		if _, err := in.UnaryInterceptor(mctx, nil, &grpc.UnaryServerInfo{FullMethod: full}, allow); err != nil {
			return false
		}
	}
	return true
}

// probe is the stream of a call that asks the policy about another
// method of the same peer: it names the method and carries nothing.
type probe string

func (p probe) Method() string             { return string(p) }
func (probe) SetHeader(metadata.MD) error  { return errProbe }
func (probe) SendHeader(metadata.MD) error { return errProbe }
func (probe) SetTrailer(metadata.MD) error { return errProbe }

var errProbe = errors.New("tlsid: a policy probe carries no headers")

// Unary is the unary server interceptor.
func (a *Authz) Unary(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	k, ok := a.cached(ctx, info.FullMethod)
	if ok {
		return handler(ctx, req)
	}
	if err := a.check(ctx, info.FullMethod, req); err != nil {
		return nil, a.refuse(ctx, info.FullMethod, err)
	}
	called := false
	resp, err := a.policy.Load().UnaryInterceptor(ctx, req, info, func(ctx context.Context, req any) (any, error) {
		called = true
		a.remember(k)
		return handler(ctx, req)
	})
	if !called {
		return nil, a.refuse(ctx, info.FullMethod, a.deniedErr(ctx, info.FullMethod, err))
	}
	return resp, err
}

// Stream is the stream server interceptor.
func (a *Authz) Stream(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
	if err := a.check(ss.Context(), info.FullMethod, nil); err != nil {
		return a.refuse(ss.Context(), info.FullMethod, err)
	}
	called := false
	err := a.policy.Load().StreamInterceptor(srv, ss, info, func(srv any, ss grpc.ServerStream) error {
		called = true
		return handler(srv, ss)
	})
	if !called {
		return a.refuse(ss.Context(), info.FullMethod, a.deniedErr(ss.Context(), info.FullMethod, err))
	}
	return err
}
