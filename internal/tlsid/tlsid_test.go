package tlsid

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	walshipv1 "github.com/walship/walship/gen/walship/v1"
	"github.com/walship/walship/internal/testkit"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
)

var localhost = []net.IP{net.ParseIP("127.0.0.1")}

func newCA(t *testing.T, name string) *CA {
	t.Helper()
	ca, err := NewCA(name, 24*time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	return ca
}

func write(t *testing.T, ca *CA, dir, name string, l Leaf, extra ...[]byte) Files {
	t.Helper()
	f, err := ca.WriteFiles(dir, name, l, extra...)
	if err != nil {
		t.Fatal(err)
	}
	return f
}

func load(t *testing.T, f Files) *Source {
	t.Helper()
	s, err := Load(f, nil)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// TestLoadChecksTheGeneration: a key that is not the certificate's, a
// certificate not valid now, or one that does not chain to the bundle is
// refused, naming the flag.
func TestLoadChecksTheGeneration(t *testing.T) {
	dir := t.TempDir()
	ca, other := newCA(t, "ca"), newCA(t, "other")
	good := write(t, ca, dir, "good", Leaf{URI: URI("td", ClassNode, "n1"), IPs: localhost})
	s := load(t, good)
	if s.Identity() != "spiffe://td/walship/node/n1" {
		t.Fatalf("identity %q", s.Identity())
	}
	wrongKey := write(t, ca, dir, "wrongkey", Leaf{URI: "spiffe://td/x"})
	wrongKey.Key = good.Key
	expired := write(t, ca, dir, "expired", Leaf{NotBefore: time.Now().Add(-2 * time.Hour), NotAfter: time.Now().Add(-time.Hour)})
	foreign := write(t, other, t.TempDir(), "foreign", Leaf{})
	foreign.CA = good.CA
	for name, tc := range map[string]struct {
		f    Files
		want string
	}{
		"key of another certificate": {wrongKey, "--tls-cert and --tls-key"},
		"expired":                    {expired, "not valid now"},
		"another CA":                 {foreign, "does not chain to --tls-ca"},
		"missing CA flag":            {Files{Cert: good.Cert, Key: good.Key}, "--tls-ca: required"},
		"a damaged CA in the bundle": {Files{Cert: good.Cert, Key: good.Key, CA: damagedBundle(t, dir, ca)}, "certificate 2"},
		"missing file":               {Files{Cert: good.Cert, Key: good.Key, CA: dir + "/nope"}, "--tls-ca: open"},
	} {
		if _, err := Load(tc.f, nil); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: Load = %v, want an error containing %q", name, err, tc.want)
		}
	}
}

// handshake dials addr with the client source and returns the server's
// certificate, or the handshake error.
func handshake(t *testing.T, addr string, cfg *tls.Config) (*x509.Certificate, error) {
	t.Helper()
	conn, err := tls.Dial("tcp", addr, cfg)
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	// TLS 1.3: a refused client certificate shows at the first read.
	_ = conn.SetReadDeadline(time.Now().Add(time.Second))
	if _, err := conn.Read(make([]byte, 1)); err != nil && !isTimeout(err) {
		return nil, err
	}
	return conn.ConnectionState().PeerCertificates[0], nil
}

func isTimeout(err error) bool {
	ne, ok := err.(net.Error)
	return ok && ne.Timeout()
}

// serveTLS accepts TLS connections with src's server config until the
// test ends.
func serveTLS(t *testing.T, src *Source) string {
	t.Helper()
	l, err := tls.Listen("tcp", "127.0.0.1:0", src.ServerConfig())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				_ = c.(*tls.Conn).Handshake()
				_, _ = c.Read(make([]byte, 1))
			}()
		}
	}()
	return l.Addr().String()
}

// TestRotation: replaced files are read as a new generation that new
// handshakes use; a broken update keeps the last good one (counted); a CA
// bundle holding old and new CAs accepts both; a client without a
// certificate, or with one of an unknown CA, is refused.
func TestRotation(t *testing.T) {
	dir, cdir := t.TempDir(), t.TempDir()
	ca := newCA(t, "ca")
	srvFiles := write(t, ca, dir, "server", Leaf{URI: URI("td", ClassNode, "n1"), IPs: localhost})
	srv := load(t, srvFiles)
	reg := prometheus.NewRegistry()
	if err := srv.Register(reg); err != nil {
		t.Fatal(err)
	}
	addr := serveTLS(t, srv)
	cli := load(t, write(t, ca, cdir, "client", Leaf{URI: URI("td", ClassClient, "c")}))
	first, err := handshake(t, addr, cli.ClientConfig())
	if err != nil {
		t.Fatal(err)
	}

	// A new certificate from the same CA.
	write(t, ca, dir, "server", Leaf{URI: URI("td", ClassNode, "n1"), IPs: localhost})
	if swapped, err := srv.Reload(); err != nil || !swapped {
		t.Fatalf("Reload = %v, %v", swapped, err)
	}
	second, err := handshake(t, addr, cli.ClientConfig())
	if err != nil || second.SerialNumber.Cmp(first.SerialNumber) == 0 {
		t.Fatalf("after the reload the server presents serial %v (was %v): %v", second.SerialNumber, first.SerialNumber, err)
	}
	if swapped, err := srv.Reload(); err != nil || swapped {
		t.Fatalf("Reload of unchanged files = %v, %v; want no swap", swapped, err)
	}

	// A broken update: the last good generation stays.
	if err := os.WriteFile(srvFiles.Key, []byte("not a key"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := srv.Reload(); err == nil {
		t.Fatal("Reload of a broken key succeeded")
	}
	if c, err := handshake(t, addr, cli.ClientConfig()); err != nil || c.SerialNumber.Cmp(second.SerialNumber) != 0 {
		t.Fatalf("after a broken update: serial %v, %v; want the last good %v", c.SerialNumber, err, second.SerialNumber)
	}
	if v := testutil.ToFloat64(srv.reloads.WithLabelValues("error")); v != 1 {
		t.Errorf("reloads{error} = %v", v)
	}
	if v := testutil.ToFloat64(srv.reloads.WithLabelValues("ok")); v != 1 {
		t.Errorf("reloads{ok} = %v", v)
	}
	if v := testutil.ToFloat64(srv.reloadOK); v != 0 {
		t.Errorf("last reload success = %v after a broken update; want 0", v)
	}
	// Good files again: swapped in, and the failure is over (its alert
	// clears).
	write(t, ca, dir, "server", Leaf{URI: URI("td", ClassNode, "n1"), IPs: localhost})
	if swapped, err := srv.Reload(); err != nil || !swapped {
		t.Fatalf("Reload of good files after a broken update = %v, %v", swapped, err)
	}
	if v := testutil.ToFloat64(srv.reloadOK); v != 1 {
		t.Errorf("last reload success = %v after a good update; want 1", v)
	}
	second, err = handshake(t, addr, cli.ClientConfig())
	if err != nil {
		t.Fatal(err)
	}

	// CA rotation: the server trusts old and new; a client of the new CA
	// is accepted, and so is one of the old.
	next := newCA(t, "next")
	write(t, ca, dir, "server", Leaf{URI: URI("td", ClassNode, "n1"), IPs: localhost}, next.PEM())
	if _, err := srv.Reload(); err != nil {
		t.Fatal(err)
	}
	newClient := load(t, write(t, next, t.TempDir(), "client", Leaf{URI: URI("td", ClassClient, "c")}, ca.PEM()))
	if _, err := handshake(t, addr, newClient.ClientConfig()); err != nil {
		t.Fatalf("client of the new CA during the rotation: %v", err)
	}
	if _, err := handshake(t, addr, cli.ClientConfig()); err != nil {
		t.Fatalf("client of the old CA during the rotation: %v", err)
	}

	// Refused: no client certificate; a certificate of an unknown CA.
	noCert := cli.ClientConfig()
	noCert.Certificates = nil
	if _, err := handshake(t, addr, noCert); err == nil {
		t.Fatal("a client without a certificate was accepted")
	}
	stranger := load(t, write(t, newCA(t, "stranger"), t.TempDir(), "client", Leaf{URI: URI("td", ClassClient, "s")}, ca.PEM()))
	if _, err := handshake(t, addr, stranger.ClientConfig()); err == nil {
		t.Fatal("a client of an unknown CA was accepted")
	}
	// And the client refuses a server whose name is not in its certificate.
	wrongName := cli.ClientConfig()
	wrongName.ServerName = "elsewhere.example"
	if _, err := handshake(t, addr, wrongName); err == nil || !strings.Contains(err.Error(), "elsewhere.example") {
		t.Fatalf("a server not named in its certificate: %v", err)
	}
	// Nor one dialled at an IP address its certificate does not name,
	// through gRPC's credentials as well as a plain dial.
	elsewhere := load(t, write(t, ca, t.TempDir(), "elsewhere", Leaf{URI: URI("td", ClassNode, "x"), IPs: []net.IP{net.ParseIP("10.9.9.9")}}))
	other := serveTLS(t, elsewhere)
	if _, err := handshake(t, other, cli.ClientConfig()); err == nil || !strings.Contains(err.Error(), "127.0.0.1") {
		t.Fatalf("a server at 127.0.0.1 with a certificate for 10.9.9.9: %v", err)
	}
	raw, err := net.Dial("tcp", other)
	if err != nil {
		t.Fatal(err)
	}
	defer raw.Close()
	if _, _, err := cli.Credentials().ClientHandshake(context.Background(), other, raw); err == nil {
		t.Fatal("gRPC credentials accepted a server at 127.0.0.1 with a certificate for 10.9.9.9")
	}
	if v, err := testutil.GatherAndCount(reg, "walship_tls_cert_expiry_timestamp_seconds"); err != nil || v != 1 {
		t.Fatalf("expiry gauge: %v, %v", v, err)
	}
	// The bundle holds the old and the next CA: the first to expire.
	want := min(ca.cert.NotAfter.Unix(), next.cert.NotAfter.Unix())
	if v := testutil.ToFloat64(srv.caExpiry); v != float64(want) {
		t.Errorf("CA expiry gauge = %v, want %v", v, want)
	}
}

// admin answers Promote and SetPolicy as unimplemented once authorized.
type admin struct {
	walshipv1.UnimplementedAdminServiceServer
}

// TestAuthzDefaultPolicy: over mTLS, each class may call its RPCs and
// nothing else; another trust domain may call nothing.
func TestAuthzDefaultPolicy(t *testing.T) {
	dir := t.TempDir()
	ca := newCA(t, "ca")
	srv := load(t, write(t, ca, dir, "server", Leaf{URI: URI("td", ClassNode, "n0"), IPs: localhost}))
	az, err := NewAuthz(AuthzConfig{TrustDomain: "td", Reflection: ReflectionAdmin})
	if err != nil {
		t.Fatal(err)
	}
	g := grpc.NewServer(grpc.Creds(credentials.NewTLS(srv.ServerConfig())), grpc.ChainUnaryInterceptor(az.Unary), grpc.ChainStreamInterceptor(az.Stream))
	walshipv1.RegisterAdminServiceServer(g, admin{})
	walshipv1.RegisterReplicationServiceServer(g, walshipv1.UnimplementedReplicationServiceServer{})
	walshipv1.RegisterLogStoreServiceServer(g, walshipv1.UnimplementedLogStoreServiceServer{})
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = g.Serve(l) }()
	t.Cleanup(g.Stop)
	dialLeaf := func(leaf Leaf) *grpc.ClientConn {
		s := load(t, write(t, ca, t.TempDir(), "c", leaf))
		cc, err := grpc.NewClient(l.Addr().String(), grpc.WithTransportCredentials(s.Credentials()))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cc.Close() })
		return cc
	}
	dial := func(uri string) *grpc.ClientConn { return dialLeaf(Leaf{URI: uri}) }
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	call := func(cc *grpc.ClientConn, what string) error {
		switch what {
		case "Promote":
			_, err := walshipv1.NewAdminServiceClient(cc).Promote(ctx, &walshipv1.PromoteRequest{})
			return err
		case "Promote force":
			_, err := walshipv1.NewAdminServiceClient(cc).Promote(ctx, &walshipv1.PromoteRequest{Force: true})
			return err
		case "Promote depose":
			_, err := walshipv1.NewAdminServiceClient(cc).Promote(ctx, &walshipv1.PromoteRequest{Depose: true})
			return err
		case "SetPolicy":
			_, err := walshipv1.NewAdminServiceClient(cc).SetPolicy(ctx, &walshipv1.SetPolicyRequest{})
			return err
		case "add", "remove", "add_logstore", "remove_logstore", "replace_logstore":
			req := map[string]*walshipv1.ChangeMembersRequest{
				"add":              {Change: &walshipv1.ChangeMembersRequest_Add{Add: &walshipv1.Member{Id: "n3", Addr: "n3:7300"}}},
				"remove":           {Change: &walshipv1.ChangeMembersRequest_Remove{Remove: "n3"}},
				"add_logstore":     {Change: &walshipv1.ChangeMembersRequest_AddLogstore{AddLogstore: "ls3:7400"}},
				"remove_logstore":  {Change: &walshipv1.ChangeMembersRequest_RemoveLogstore{RemoveLogstore: "ls3:7400"}},
				"replace_logstore": {Change: &walshipv1.ChangeMembersRequest_ReplaceLogstore{ReplaceLogstore: &walshipv1.LogStoreReplacement{Old: "ls0:7400", New: "ls3:7400"}}},
			}[what]
			_, err := walshipv1.NewAdminServiceClient(cc).ChangeMembers(ctx, req)
			return err
		case "Status":
			_, err := walshipv1.NewAdminServiceClient(cc).Status(ctx, &walshipv1.StatusRequest{})
			return err
		case "Read":
			r, err := walshipv1.NewLogStoreServiceClient(cc).Read(ctx, &walshipv1.ReadRequest{})
			if err != nil {
				return err
			}
			_, err = r.Recv()
			return err
		case "Append":
			a, err := walshipv1.NewLogStoreServiceClient(cc).Append(ctx)
			if err != nil {
				return err
			}
			_, err = a.Recv()
			return err
		case "GetSnapshot":
			g, err := walshipv1.NewLogStoreServiceClient(cc).GetSnapshot(ctx, &walshipv1.GetSnapshotRequest{})
			if err != nil {
				return err
			}
			_, err = g.Recv()
			return err
		case "Verify":
			_, err := walshipv1.NewLogStoreServiceClient(cc).Verify(ctx, &walshipv1.VerifyRequest{})
			return err
		case "Stream":
			s, err := walshipv1.NewReplicationServiceClient(cc).Stream(ctx)
			if err != nil {
				return err
			}
			_, err = s.Recv()
			return err
		}
		panic(what)
	}
	for _, tc := range []struct {
		who, rpc string
		allowed  bool
	}{
		{URI("td", ClassClient, "app"), "Promote", false},
		{URI("td", ClassClient, "app"), "SetPolicy", false},
		{URI("td", ClassClient, "app"), "Stream", false},
		{URI("td", ClassClient, "app"), "Status", true},
		{URI("td", ClassNode, "n1"), "Stream", true},
		{URI("td", ClassNode, "n1"), "Promote", true}, // a switching primary asks its target
		{URI("td", ClassNode, "n1"), "SetPolicy", false},
		{URI("td", ClassNode, "n1"), "Status", true},
		{URI("td", ClassLogStore, "ls0"), "Stream", false},
		{URI("td", ClassLogStore, "ls0"), "Read", true}, // a log store refills from its peers
		{URI("td", ClassLogStore, "ls0"), "Append", false},
		{URI("td", ClassClient, "app"), "Read", false},
		{URI("td", ClassAdmin, "ops"), "Read", true}, // walship restore
		{URI("td", ClassAdmin, "ops"), "GetSnapshot", true},
		{URI("td", ClassClient, "app"), "GetSnapshot", false},
		{URI("td", ClassAdmin, "ops"), "Append", false},
		{URI("td", ClassAdmin, "ops"), "SetPolicy", true},
		{URI("td", ClassAdmin, "ops"), "Promote", true},
		{URI("td", ClassAdmin, "ops"), "Promote force", true},
		{URI("td", ClassAdmin, "ops"), "Verify", true}, // walship ctl verify
		{URI("td", ClassNode, "n1"), "Verify", true},
		{URI("td", ClassClient, "app"), "Verify", false},
		{URI("td", ClassAdmin, "ops"), "Stream", false},
		{URI("td", ClassNode, "n1"), "Promote force", false}, // a node asks only for a plain promotion
		{URI("td", ClassNode, "n1"), "Promote depose", false},
		{URI("td", ClassAdmin, "ops"), "Promote depose", true},
		// --join and --leave-on-scale-down: each kind of member asks for
		// its own kind only; replacements are for admins.
		{URI("td", ClassNode, "n1"), "add", true},
		{URI("td", ClassNode, "n1"), "remove", true},
		{URI("td", ClassNode, "n1"), "add_logstore", false},
		{URI("td", ClassNode, "n1"), "replace_logstore", false},
		{URI("td", ClassLogStore, "ls0"), "add_logstore", true},
		{URI("td", ClassLogStore, "ls0"), "remove_logstore", true},
		{URI("td", ClassLogStore, "ls0"), "add", false},
		{URI("td", ClassLogStore, "ls0"), "remove", false},
		{URI("td", ClassLogStore, "ls0"), "replace_logstore", false},
		{URI("td", ClassClient, "app"), "add", false},
		{URI("td", ClassClient, "app"), "add_logstore", false},
		{URI("td", ClassAdmin, "ops"), "add", true},
		{URI("td", ClassAdmin, "ops"), "remove_logstore", true},
		{URI("td", ClassAdmin, "ops"), "replace_logstore", true},
		{URI("elsewhere", ClassAdmin, "ops"), "Status", false}, // another trust domain
		{URI("elsewhere", ClassNode, "n1"), "Stream", false},
	} {
		err := call(dial(tc.who), tc.rpc)
		denied := status.Code(err) == codes.PermissionDenied
		if denied == tc.allowed {
			t.Errorf("%s calling %s: %v; allowed %v", tc.who, tc.rpc, err, tc.allowed)
		}
		if denied && !strings.Contains(status.Convert(err).Message(), tc.who+" may not call /walship.v1.") {
			t.Errorf("%s calling %s: message %q does not name the caller and the method", tc.who, tc.rpc, status.Convert(err).Message())
		}
		if !denied && status.Code(err) != codes.Unimplemented {
			t.Errorf("%s calling %s: %v; want the handler's UNIMPLEMENTED", tc.who, tc.rpc, err)
		}
		// Another trust domain is told which one the server expects
		// (dev certificates need --trust-domain walship.dev).
		if other := !strings.HasPrefix(tc.who, "spiffe://td/"); denied && other != strings.Contains(status.Convert(err).Message(), "its trust domain is elsewhere, this server expects td") {
			t.Errorf("%s calling %s: message %q; want the trust domains named only for another trust domain", tc.who, tc.rpc, status.Convert(err).Message())
		}
	}
	// Decisions cached per connection and method never leak: on one
	// connection, an allowed call leaves another method, and Promote with
	// force after a plain Promote, refused.
	node, cli := dial(URI("td", ClassNode, "n1")), dial(URI("td", ClassClient, "app"))
	for i, step := range []struct {
		cc      *grpc.ClientConn
		rpc     string
		allowed bool
	}{{node, "Promote", true}, {node, "Promote force", false}, {node, "Promote", true}, {node, "Status", true}, {node, "Status", true},
		{node, "add", true}, {node, "add_logstore", false}, {node, "remove", true}, {node, "replace_logstore", false},
		{node, "SetPolicy", false}, {cli, "Status", true}, {cli, "Status", true}, {cli, "SetPolicy", false}, {cli, "Stream", false}} {
		err := call(step.cc, step.rpc)
		if denied := status.Code(err) == codes.PermissionDenied; denied == step.allowed {
			t.Errorf("step %d, %s: %v; allowed %v", i, step.rpc, err, step.allowed)
		}
	}
	// Certificates that grpc's raw prefix matching alone would let in as
	// an admin: every one is refused.
	for name, l := range map[string]Leaf{
		"a second URI":            {URI: URI("td", ClassClient, "app"), AlsoURIs: []string{URI("td", ClassAdmin, "x")}},
		"a DNS name as an ID":     {DNS: []string{URI("td", ClassAdmin, "x")}},
		"a dot segment":           {URI: "spiffe://td/walship/admin/../node/x"},
		"an escaped path":         {URI: "spiffe://td/walship/admin/%2e%2e/x"},
		"a user in the authority": {URI: "spiffe://evil@td/walship/admin/x"},
	} {
		err := call(dialLeaf(l), "SetPolicy")
		if status.Code(err) != codes.PermissionDenied || !strings.Contains(status.Convert(err).Message(), "the certificate's identity") {
			t.Errorf("%s: SetPolicy = %v; want PERMISSION_DENIED for the identity", name, err)
		}
	}
}

// damagedBundle writes ca's certificate followed by a damaged one.
func damagedBundle(t *testing.T, dir string, ca *CA) string {
	t.Helper()
	p := dir + "/damaged-ca.crt"
	bad := strings.Replace(string(newCA(t, "next").PEM()), "MII", "MIX", 1)
	if err := os.WriteFile(p, append(ca.PEM(), bad...), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// serveAuthz serves AdminService and ReplicationService (every method
// UNIMPLEMENTED once authorized) and health over mTLS behind az until the test ends, and
// returns a dialer of certificates that ca issues.
func serveAuthz(t *testing.T, ca *CA, az *Authz) func(Leaf) *grpc.ClientConn {
	t.Helper()
	srv := load(t, write(t, ca, t.TempDir(), "server", Leaf{URI: URI("td", ClassNode, "n0"), IPs: localhost}))
	g := grpc.NewServer(grpc.Creds(credentials.NewTLS(srv.ServerConfig())), grpc.ChainUnaryInterceptor(az.Unary), grpc.ChainStreamInterceptor(az.Stream))
	walshipv1.RegisterAdminServiceServer(g, admin{})
	walshipv1.RegisterReplicationServiceServer(g, walshipv1.UnimplementedReplicationServiceServer{})
	healthpb.RegisterHealthServer(g, health.NewServer())
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = g.Serve(l) }()
	t.Cleanup(g.Stop)
	return func(leaf Leaf) *grpc.ClientConn {
		s := load(t, write(t, ca, t.TempDir(), "c", leaf))
		cc, err := grpc.NewClient(l.Addr().String(), grpc.WithTransportCredentials(s.Credentials()))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cc.Close() })
		return cc
	}
}

// writePolicy writes an A43 policy file and returns its path.
func writePolicy(t *testing.T, dir, contents string) string {
	t.Helper()
	p := filepath.Join(dir, "policy.json")
	if err := os.WriteFile(p, []byte(contents), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// TestAuthzPolicyFileCheckedAtStart: an empty, blank, malformed or
// missing --authz-policy file is refused at start, naming the flag and
// the file (grpc's file watcher took an empty file for a policy and the
// server panicked at its first call, health included); a good file serves.
func TestAuthzPolicyFileCheckedAtStart(t *testing.T) {
	for name, contents := range map[string]string{
		"empty":          "",
		"blank":          " \n\t\n",
		"not JSON":       `{"name": "p", "allow_rules": [`,
		"no name":        `{"allow_rules": [{"name": "all", "request": {"paths": ["*"]}}]}`,
		"no allow rules": `{"name": "p"}`,
	} {
		p := writePolicy(t, t.TempDir(), contents)
		if _, err := NewAuthz(AuthzConfig{TrustDomain: "td", PolicyFile: p}); err == nil {
			t.Errorf("%s: NewAuthz accepted the file", name)
		} else if !strings.Contains(err.Error(), "--authz-policy") || !strings.Contains(err.Error(), p) {
			t.Errorf("%s: %v; want the flag and the file named", name, err)
		}
	}
	missing := filepath.Join(t.TempDir(), "nope.json")
	if _, err := NewAuthz(AuthzConfig{TrustDomain: "td", PolicyFile: missing}); err == nil || !strings.Contains(err.Error(), "--authz-policy") || !strings.Contains(err.Error(), missing) {
		t.Errorf("a missing file: %v; want the flag and the file named", err)
	}

	ca := newCA(t, "ca")
	az, err := NewAuthz(AuthzConfig{TrustDomain: "td", PolicyFile: writePolicy(t, t.TempDir(), DefaultPolicy("td", ReflectionAll))})
	if err != nil {
		t.Fatal(err)
	}
	cc := serveAuthz(t, ca, az)(Leaf{URI: URI("td", ClassClient, "app")})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := healthpb.NewHealthClient(cc).Check(ctx, &healthpb.HealthCheckRequest{}); err != nil {
		t.Fatalf("health under a good policy file: %v", err)
	}
	if _, err := walshipv1.NewAdminServiceClient(cc).SetPolicy(ctx, &walshipv1.SetPolicyRequest{}); status.Code(err) != codes.PermissionDenied {
		t.Fatalf("a client's SetPolicy under the default policy as a file: %v; want PERMISSION_DENIED", err)
	}
}

// allowClients is an A43 policy that lets clients of trust domain td call
// paths.
func allowClients(td string, paths ...string) string {
	b, err := json.Marshal(map[string]any{"name": "p", "allow_rules": []any{map[string]any{
		"name":    "clients",
		"source":  map[string]any{"principals": []string{URI(td, ClassClient, "*")}},
		"request": map[string]any{"paths": paths},
	}}})
	if err != nil {
		panic(err)
	}
	return string(b)
}

// TestAuthzPolicyReload: a changed policy file is swapped in; an empty,
// malformed or missing one keeps the policy in force, each counted once
// (walship_authz_policy_reloads_total{result="error"}) however often it
// is polled, and Watch logs it at ERROR.
func TestAuthzPolicyReload(t *testing.T) {
	ca, dir := newCA(t, "ca"), t.TempDir()
	p := writePolicy(t, dir, allowClients("td", "/walship.v1.AdminService/Status"))
	var logs testkit.Output
	az, err := NewAuthz(AuthzConfig{TrustDomain: "td", PolicyFile: p, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	if err := az.Register(reg); err != nil {
		t.Fatal(err)
	}
	cc := serveAuthz(t, ca, az)(Leaf{URI: URI("td", ClassClient, "app")})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	setPolicy := func() codes.Code {
		_, err := walshipv1.NewAdminServiceClient(cc).SetPolicy(ctx, &walshipv1.SetPolicyRequest{})
		return status.Code(err)
	}
	if c := setPolicy(); c != codes.PermissionDenied {
		t.Fatalf("SetPolicy before the edit: %v", c)
	}
	if swapped, err := az.Reload(); swapped || err != nil {
		t.Fatalf("Reload of an unchanged file = %v, %v", swapped, err)
	}
	good := allowClients("td", "/walship.v1.AdminService/Status", "/walship.v1.AdminService/SetPolicy")
	writePolicy(t, dir, good)
	if swapped, err := az.Reload(); !swapped || err != nil {
		t.Fatalf("Reload of a good edit = %v, %v", swapped, err)
	}
	if c := setPolicy(); c != codes.Unimplemented {
		t.Fatalf("SetPolicy after the edit: %v; want the handler's UNIMPLEMENTED", c)
	}
	for name, bad := range map[string]func(){
		"empty":    func() { writePolicy(t, dir, "") },
		"not JSON": func() { writePolicy(t, dir, "{") },
		"missing": func() {
			if err := os.Remove(p); err != nil {
				t.Fatal(err)
			}
		},
	} {
		bad()
		if swapped, err := az.Reload(); swapped || err == nil || !strings.Contains(err.Error(), "--authz-policy") {
			t.Errorf("%s: Reload = %v, %v; want an error naming the flag", name, swapped, err)
		}
		if swapped, err := az.Reload(); swapped || err != nil {
			t.Errorf("%s polled again: Reload = %v, %v; want nothing new", name, swapped, err)
		}
		if c := setPolicy(); c != codes.Unimplemented {
			t.Errorf("%s: SetPolicy = %v; want the policy in force kept", name, c)
		}
	}
	// Back to the contents in force: nothing to swap.
	writePolicy(t, dir, good)
	if swapped, err := az.Reload(); swapped || err != nil {
		t.Fatalf("Reload back to the policy in force = %v, %v", swapped, err)
	}
	if v := testutil.ToFloat64(az.reloads.WithLabelValues("error")); v != 3 {
		t.Errorf(`reloads{result="error"} = %v, want 3`, v)
	}
	if v := testutil.ToFloat64(az.reloads.WithLabelValues("ok")); v != 1 {
		t.Errorf(`reloads{result="ok"} = %v, want 1`, v)
	}

	wctx, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); az.Watch(wctx, 10*time.Millisecond) }()
	writePolicy(t, dir, `{"name": "p"}`)
	testkit.Until(t, "Watch to log the bad edit", func() bool {
		return strings.Contains(logs.String(), "level=ERROR") && strings.Contains(logs.String(), "does not check out")
	})
	writePolicy(t, dir, allowClients("td", "/walship.v1.AdminService/Status"))
	testkit.Until(t, "Watch to swap in the good edit", func() bool { return setPolicy() == codes.PermissionDenied })
	testkit.Until(t, "Watch to log the reload", func() bool { return strings.Contains(logs.String(), "authorization policy reloaded") })
	stop()
	<-done
}

// TestAuthzDenialsCountedAndLogged: every refused call is counted by
// method and caller class (walship_authz_denied_total), allowed ones are
// not; refusals are logged at most once a second per class and method,
// the next line saying how many were held back.
func TestAuthzDenialsCountedAndLogged(t *testing.T) {
	ca := newCA(t, "ca")
	var logs testkit.Output
	az, err := NewAuthz(AuthzConfig{TrustDomain: "td", Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	if err != nil {
		t.Fatal(err)
	}
	var clock atomic.Int64
	clock.Store(time.Now().UnixNano())
	az.now = func() time.Time { return time.Unix(0, clock.Load()) }
	dial := serveAuthz(t, ca, az)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	setPolicy := func(cc *grpc.ClientConn) error {
		_, err := walshipv1.NewAdminServiceClient(cc).SetPolicy(ctx, &walshipv1.SetPolicyRequest{})
		return err
	}
	const setPolicyM, streamM = "/walship.v1.AdminService/SetPolicy", "/walship.v1.ReplicationService/Stream"
	denials := func(method, class string) float64 {
		return testutil.ToFloat64(az.denied.WithLabelValues(method, class))
	}
	lines := func() int { return strings.Count(logs.String(), "call refused by the authorization policy") }

	app := dial(Leaf{URI: URI("td", ClassClient, "app")})
	for range 3 {
		if err := setPolicy(app); status.Code(err) != codes.PermissionDenied {
			t.Fatalf("a client's SetPolicy: %v", err)
		}
	}
	if _, err := walshipv1.NewAdminServiceClient(app).Status(ctx, &walshipv1.StatusRequest{}); status.Code(err) != codes.Unimplemented {
		t.Fatalf("a client's Status: %v", err)
	}
	if v := denials(setPolicyM, ClassClient); v != 3 {
		t.Errorf("denied{SetPolicy, client} = %v, want 3", v)
	}
	if n := lines(); n != 1 {
		t.Fatalf("%d log lines for 3 refusals within a second, want 1:\n%s", n, logs.String())
	}
	clock.Add(int64(time.Second))
	if err := setPolicy(app); status.Code(err) != codes.PermissionDenied {
		t.Fatalf("a client's SetPolicy: %v", err)
	}
	if n := lines(); n != 2 || !strings.Contains(logs.String(), "held_back=2") {
		t.Fatalf("a second later: %d lines, want 2, the last with held_back=2:\n%s", n, logs.String())
	}
	if !strings.Contains(logs.String(), "level=WARN") || !strings.Contains(logs.String(), "peer=spiffe://td/walship/client/app") ||
		!strings.Contains(logs.String(), "method="+setPolicyM) {
		t.Errorf("the log line does not name level, peer and method:\n%s", logs.String())
	}

	// A stream; another class, method, trust domain; a broken identity:
	// each its own series, and its own log line.
	s, err := walshipv1.NewReplicationServiceClient(dial(Leaf{URI: URI("td", ClassLogStore, "ls")})).Stream(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Recv(); status.Code(err) != codes.PermissionDenied {
		t.Fatalf("a log store's Stream: %v", err)
	}
	if err := setPolicy(dial(Leaf{URI: URI("elsewhere", ClassAdmin, "ops")})); status.Code(err) != codes.PermissionDenied {
		t.Fatalf("another trust domain's SetPolicy: %v", err)
	}
	if err := setPolicy(dial(Leaf{URI: URI("td", ClassClient, "x"), AlsoURIs: []string{URI("td", ClassAdmin, "x")}})); status.Code(err) != codes.PermissionDenied {
		t.Fatalf("two URIs' SetPolicy: %v", err)
	}
	for _, c := range []struct {
		method, class string
	}{{streamM, ClassLogStore}, {setPolicyM, classOther}, {setPolicyM, classNone}} {
		if v := denials(c.method, c.class); v != 1 {
			t.Errorf("denied{%s, %s} = %v, want 1", c.method, c.class, v)
		}
	}
	if n := lines(); n != 5 {
		t.Errorf("%d log lines, want 5:\n%s", n, logs.String())
	}
	if n, err := testutil.GatherAndCount(mustRegistry(t, az), "walship_authz_denied_total"); err != nil || n != 4 {
		t.Errorf("walship_authz_denied_total has %d series (%v), want 4: allowed calls count for nothing", n, err)
	}

	for method, want := range map[string]string{
		setPolicyM:                      setPolicyM,
		"/grpc.health.v1.Health/Watch":  "/grpc.health.v1.Health/Watch",
		"/walship.v1.AdminService/Nope": "unknown",
		"/no.Such/Method":               "unknown",
		"garbage":                       "unknown",
	} {
		if got := methodLabel(method); got != want {
			t.Errorf("methodLabel(%q) = %q, want %q", method, got, want)
		}
	}
}

// mustRegistry is a registry holding az's metrics.
func mustRegistry(t *testing.T, az *Authz) *prometheus.Registry {
	t.Helper()
	reg := prometheus.NewRegistry()
	if err := az.Register(reg); err != nil {
		t.Fatal(err)
	}
	return reg
}

// TestAuthzCustomPolicyKeepsTheIdentityRules: under a policy file — the
// default policy's own JSON, or one of Kubernetes service-account
// identities — a certificate whose only SAN is a DNS name that looks like
// an admin's SPIFFE ID, or that carries two URIs, is refused; and only a
// caller the policy lets call every AdminService method may Promote with
// force, dry run or epoch.
func TestAuthzCustomPolicyKeepsTheIdentityRules(t *testing.T) {
	ca := newCA(t, "ca")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	call := func(cc *grpc.ClientConn, rpc string) error {
		a := walshipv1.NewAdminServiceClient(cc)
		var err error
		switch rpc {
		case "SetPolicy":
			_, err = a.SetPolicy(ctx, &walshipv1.SetPolicyRequest{})
		case "Promote":
			_, err = a.Promote(ctx, &walshipv1.PromoteRequest{})
		case "Promote force":
			_, err = a.Promote(ctx, &walshipv1.PromoteRequest{Force: true})
		case "Promote depose":
			_, err = a.Promote(ctx, &walshipv1.PromoteRequest{Depose: true})
		case "Promote dry_run":
			_, err = a.Promote(ctx, &walshipv1.PromoteRequest{DryRun: true})
		case "Promote epoch":
			_, err = a.Promote(ctx, &walshipv1.PromoteRequest{Epoch: 7})
		default:
			panic(rpc)
		}
		return err
	}
	sa := func(ns, name string) string { return "spiffe://td/ns/" + ns + "/sa/" + name }
	k8s, err := json.Marshal(map[string]any{"name": "k8s", "allow_rules": []any{
		map[string]any{"name": "ops", "source": map[string]any{"principals": []string{sa("prod", "ops")}},
			"request": map[string]any{"paths": []string{"/walship.v1.AdminService/*"}}},
		map[string]any{"name": "nodes", "source": map[string]any{"principals": []string{sa("prod", "walship")}},
			"request": map[string]any{"paths": []string{"/walship.v1.AdminService/Status", "/walship.v1.AdminService/Promote"}}},
	}})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		policy string
		who    Leaf
		rpc    string
		// identity: refused for the certificate's identity; else
		// allowed or refused by the rules.
		identity, allowed bool
	}{
		{DefaultPolicy("td", ReflectionAll), Leaf{DNS: []string{URI("td", ClassAdmin, "a1")}}, "SetPolicy", true, false},
		{DefaultPolicy("td", ReflectionAll), Leaf{URI: URI("td", ClassAdmin, "a1"), AlsoURIs: []string{URI("td", ClassAdmin, "a2")}}, "SetPolicy", true, false},
		{DefaultPolicy("td", ReflectionAll), Leaf{URI: URI("td", ClassClient, "c"), AlsoURIs: []string{URI("td", ClassAdmin, "a2")}}, "SetPolicy", true, false},
		{DefaultPolicy("td", ReflectionAll), Leaf{URI: "spiffe://td/walship/admin/../admin/x"}, "SetPolicy", true, false},
		{DefaultPolicy("td", ReflectionAll), Leaf{URI: URI("td", ClassAdmin, "a1")}, "SetPolicy", false, true},
		{DefaultPolicy("td", ReflectionAll), Leaf{URI: URI("td", ClassNode, "n1")}, "Promote", false, true},
		{DefaultPolicy("td", ReflectionAll), Leaf{URI: URI("td", ClassNode, "n1")}, "Promote force", false, false},
		{DefaultPolicy("td", ReflectionAll), Leaf{URI: URI("td", ClassNode, "n1")}, "Promote depose", false, false},
		{DefaultPolicy("td", ReflectionAll), Leaf{URI: URI("td", ClassNode, "n1")}, "Promote epoch", false, false},
		{DefaultPolicy("td", ReflectionAll), Leaf{URI: URI("td", ClassAdmin, "a1")}, "Promote force", false, true},
		{string(k8s), Leaf{URI: sa("prod", "ops")}, "SetPolicy", false, true},
		{string(k8s), Leaf{URI: sa("prod", "ops")}, "Promote force", false, true},
		{string(k8s), Leaf{URI: sa("prod", "walship")}, "Promote", false, true},
		{string(k8s), Leaf{URI: sa("prod", "walship")}, "Promote force", false, false},
		{string(k8s), Leaf{URI: sa("prod", "walship")}, "Promote dry_run", false, false},
		{string(k8s), Leaf{URI: sa("prod", "walship")}, "Promote epoch", false, false},
		{string(k8s), Leaf{URI: sa("prod", "walship")}, "SetPolicy", false, false},
		{string(k8s), Leaf{URI: sa("prod", "walship"), AlsoURIs: []string{sa("prod", "ops")}}, "SetPolicy", true, false},
		{string(k8s), Leaf{DNS: []string{sa("prod", "ops")}}, "SetPolicy", true, false},
	} {
		az, err := NewAuthz(AuthzConfig{TrustDomain: "td", PolicyFile: writePolicy(t, t.TempDir(), tc.policy)})
		if err != nil {
			t.Fatal(err)
		}
		name := fmt.Sprintf("%s %s %v", tc.rpc, tc.who.URI, append(tc.who.AlsoURIs, tc.who.DNS...))
		err = call(serveAuthz(t, ca, az)(tc.who), tc.rpc)
		msg := status.Convert(err).Message()
		switch {
		case tc.identity && (status.Code(err) != codes.PermissionDenied || !strings.Contains(msg, "the certificate's identity")):
			t.Errorf("%s: %v; want PERMISSION_DENIED for the certificate's identity", name, err)
		case !tc.identity && tc.allowed && status.Code(err) != codes.Unimplemented:
			t.Errorf("%s: %v; want the handler's UNIMPLEMENTED", name, err)
		case !tc.identity && !tc.allowed && status.Code(err) != codes.PermissionDenied:
			t.Errorf("%s: %v; want PERMISSION_DENIED", name, err)
		}
	}
}

// TestReloadKeepsTheIdentity: a reload whose certificate names another
// identity — another class, another name, a second URI — is refused,
// counted as an error and logged at ERROR, and the running certificate
// stays; a new certificate of the same identity is swapped in.
func TestReloadKeepsTheIdentity(t *testing.T) {
	dir, ca := t.TempDir(), newCA(t, "ca")
	me := Leaf{URI: URI("td", ClassNode, "n1"), IPs: localhost}
	f := write(t, ca, dir, "server", me)
	var logs testkit.Output
	src, err := Load(f, slog.New(slog.NewTextHandler(&logs, nil)))
	if err != nil {
		t.Fatal(err)
	}
	addr := serveTLS(t, src)
	cli := load(t, write(t, ca, t.TempDir(), "client", Leaf{URI: URI("td", ClassClient, "c")}))
	first, err := handshake(t, addr, cli.ClientConfig())
	if err != nil {
		t.Fatal(err)
	}
	for name, l := range map[string]Leaf{
		"node to client":  {URI: URI("td", ClassClient, "n1"), IPs: localhost},
		"another name":    {URI: URI("td", ClassNode, "n2"), IPs: localhost},
		"a second URI":    {URI: URI("td", ClassNode, "n1"), AlsoURIs: []string{URI("td", ClassAdmin, "n1")}, IPs: localhost},
		"no URI, DNS one": {DNS: []string{URI("td", ClassNode, "n1")}, IPs: localhost},
	} {
		write(t, ca, dir, "server", l)
		if swapped, err := src.Reload(); swapped || err == nil || !strings.Contains(err.Error(), "spiffe://td/walship/node/n1") {
			t.Errorf("%s: Reload = %v, %v; want refused naming the running identity", name, swapped, err)
		}
		if c, err := handshake(t, addr, cli.ClientConfig()); err != nil || c.SerialNumber.Cmp(first.SerialNumber) != 0 {
			t.Errorf("%s: the server presents %v, %v; want the running certificate", name, c.SerialNumber, err)
		}
		if src.Identity() != URI("td", ClassNode, "n1") {
			t.Errorf("%s: identity %s", name, src.Identity())
		}
	}
	if v := testutil.ToFloat64(src.reloads.WithLabelValues("error")); v != 4 {
		t.Errorf(`reloads{result="error"} = %v, want 4`, v)
	}

	ctx, stop := context.WithCancel(t.Context())
	done := make(chan struct{})
	go func() { defer close(done); src.Watch(ctx, 10*time.Millisecond) }()
	write(t, ca, dir, "server", Leaf{URI: URI("td", ClassClient, "n1"), IPs: localhost})
	testkit.Until(t, "Watch to log the refused identity", func() bool {
		l := logs.String()
		return strings.Contains(l, "level=ERROR") && strings.Contains(l, "may not change it")
	})
	// The same identity, a new key: swapped in.
	write(t, ca, dir, "server", me)
	testkit.Until(t, "a new certificate of the same identity", func() bool {
		c, err := handshake(t, addr, cli.ClientConfig())
		return err == nil && c.SerialNumber.Cmp(first.SerialNumber) != 0
	})
	stop()
	<-done
}

// certOf parses the leaf certificate of f.
func certOf(t *testing.T, f Files) *x509.Certificate {
	t.Helper()
	b, err := os.ReadFile(f.Cert)
	if err != nil {
		t.Fatal(err)
	}
	blk, _ := pem.Decode(b)
	if blk == nil {
		t.Fatalf("%s: no PEM", f.Cert)
	}
	c, err := x509.ParseCertificate(blk.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// TestRevocation: with --tls-crl, a server refuses the handshake of a
// client whose certificate the list revokes and a client refuses such a
// server, at every new handshake; the list is reloaded with the other
// files (one generation): a new list applies to the next handshakes, a
// bad one (garbage, empty, signed by a CA not in the bundle) is refused,
// counted, and the last good list stays; a bad list at start is refused
// naming the flag.
func TestRevocation(t *testing.T) {
	dir, ca := t.TempDir(), newCA(t, "ca")
	srvFiles := write(t, ca, dir, "server", Leaf{URI: URI("td", ClassNode, "n0"), IPs: localhost})
	c1Files := write(t, ca, t.TempDir(), "c1", Leaf{URI: URI("td", ClassClient, "c1")})
	c2Files := write(t, ca, t.TempDir(), "c2", Leaf{URI: URI("td", ClassClient, "c2")})
	c1, c2 := load(t, c1Files), load(t, c2Files)
	next := time.Now().Add(time.Hour).Truncate(time.Second)
	writeCRL := func(b []byte) {
		t.Helper()
		if err := os.WriteFile(srvFiles.CRL, b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	crl := func(by *CA, revoked ...*x509.Certificate) []byte {
		t.Helper()
		b, err := by.CRL(next, revoked...)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	srvFiles.CRL = filepath.Join(dir, "crl.pem")
	writeCRL(crl(ca, certOf(t, c1Files)))
	srv := load(t, srvFiles)
	reg := prometheus.NewRegistry()
	if err := srv.Register(reg); err != nil {
		t.Fatal(err)
	}
	addr := serveTLS(t, srv)
	refused := func(who *Source) bool { _, err := handshake(t, addr, who.ClientConfig()); return err != nil }
	if !refused(c1) {
		t.Fatal("a revoked client's handshake succeeded")
	}
	if refused(c2) {
		t.Fatal("a good client's handshake failed")
	}
	if v := testutil.ToFloat64(srv.crlNext); v != float64(next.Unix()) {
		t.Errorf("crl next update gauge = %v, want %v", v, next.Unix())
	}

	// A new list revoking c2 too, as DER: the next handshakes use it.
	blk, _ := pem.Decode(crl(ca, certOf(t, c1Files), certOf(t, c2Files)))
	writeCRL(blk.Bytes)
	if swapped, err := srv.Reload(); !swapped || err != nil {
		t.Fatalf("Reload of a new list = %v, %v", swapped, err)
	}
	if !refused(c2) {
		t.Fatal("c2's handshake succeeded after the list revoking it was reloaded")
	}
	// Bad lists keep the last good one.
	for name, b := range map[string][]byte{
		"garbage":        []byte("-----BEGIN X509 CRL-----\nnot base64\n-----END X509 CRL-----\n"),
		"empty":          nil,
		"another CA's":   crl(newCA(t, "stranger")),
		"a certificate":  ca.PEM(),
		"trailing bytes": append(crl(ca), "junk"...),
	} {
		writeCRL(b)
		if swapped, err := srv.Reload(); swapped || err == nil || !strings.Contains(err.Error(), "--tls-crl") {
			t.Errorf("%s: Reload = %v, %v; want refused naming --tls-crl", name, swapped, err)
		}
		if !refused(c2) || !refused(c1) {
			t.Errorf("%s: the last good list no longer applies", name)
		}
		if _, err := Load(srvFiles, nil); err == nil || !strings.Contains(err.Error(), "--tls-crl") {
			t.Errorf("%s at start: Load = %v; want refused naming --tls-crl", name, err)
		}
	}
	if v := testutil.ToFloat64(srv.reloads.WithLabelValues("error")); v != 5 {
		t.Errorf(`reloads{result="error"} = %v, want 5`, v)
	}
	// A list that revokes c1 only: c2 is back.
	writeCRL(crl(ca, certOf(t, c1Files)))
	if _, err := srv.Reload(); err != nil {
		t.Fatal(err)
	}
	if refused(c2) || !refused(c1) {
		t.Fatal("after a list revoking c1 only: want c2 accepted and c1 refused")
	}

	// A client with a list refuses a revoked server, through gRPC's
	// credentials as well as a plain dial.
	other := write(t, ca, t.TempDir(), "other", Leaf{URI: URI("td", ClassNode, "n9"), IPs: localhost})
	otherAddr := serveTLS(t, load(t, other))
	cliFiles := write(t, ca, t.TempDir(), "cli", Leaf{URI: URI("td", ClassClient, "cli")})
	cliFiles.CRL = filepath.Join(t.TempDir(), "crl.pem")
	if err := os.WriteFile(cliFiles.CRL, crl(ca, certOf(t, other)), 0o644); err != nil {
		t.Fatal(err)
	}
	cli := load(t, cliFiles)
	if _, err := handshake(t, otherAddr, cli.ClientConfig()); err == nil || !strings.Contains(err.Error(), "revoked") {
		t.Fatalf("a client with a list dialled a revoked server: %v", err)
	}
	raw, err := net.Dial("tcp", otherAddr)
	if err != nil {
		t.Fatal(err)
	}
	defer raw.Close()
	if _, _, err := cli.Credentials().ClientHandshake(context.Background(), otherAddr, raw); err == nil {
		t.Fatal("gRPC credentials accepted a revoked server")
	}
	if _, err := handshake(t, addr, cli.ClientConfig()); err != nil {
		t.Fatalf("a client with a list dialling a good server: %v", err)
	}

	// A list revoking this process's own certificate is taken, and said.
	var logs testkit.Output
	self := srvFiles
	self.CRL = filepath.Join(t.TempDir(), "self.pem")
	if err := os.WriteFile(self.CRL, crl(ca, certOf(t, srvFiles)), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := Load(self, slog.New(slog.NewTextHandler(&logs, nil))); err != nil || !strings.Contains(logs.String(), "level=ERROR") || !strings.Contains(logs.String(), "revoked") {
		t.Fatalf("Load with a list revoking its own certificate: %v\n%s", err, logs.String())
	}
}

// TestIdentityRulesCostNoAllocation: under a policy file every call
// passes the identity rules (there is no cache of the policy's answers);
// checking a good certificate allocates nothing.
func TestIdentityRulesCostNoAllocation(t *testing.T) {
	ca := newCA(t, "ca")
	f := write(t, ca, t.TempDir(), "c", Leaf{URI: "spiffe://td/ns/prod/sa/app", DNS: []string{"app.prod.svc"}})
	c := certOf(t, f)
	ctx := peer.NewContext(context.Background(), &peer.Peer{AuthInfo: credentials.TLSInfo{State: tls.ConnectionState{PeerCertificates: []*x509.Certificate{c}}}})
	az, err := NewAuthz(AuthzConfig{TrustDomain: "td", PolicyFile: writePolicy(t, t.TempDir(), allowClients("td", "/walship.v1.KVService/*"))})
	if err != nil {
		t.Fatal(err)
	}
	req := &walshipv1.PutRequest{Key: "k"}
	if err := az.check(ctx, "/walship.v1.KVService/Put", req); err != nil {
		t.Fatal(err)
	}
	if n := testing.AllocsPerRun(100, func() { _ = az.check(ctx, "/walship.v1.KVService/Put", req) }); n != 0 {
		t.Errorf("the identity rules allocate %v times per call", n)
	}
}
