package replica

import (
	"crypto/tls"
	"net"
	"sync/atomic"
	"testing"
	"time"

	walshipv1 "github.com/walship/walship/gen/walship/v1"
	"github.com/walship/walship/internal/serve"
	"github.com/walship/walship/internal/testkit"
	"github.com/walship/walship/internal/tlsid"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
)

// TestPrimaryMustBeANode: under the default identity scheme a replica
// follows only a primary whose certificate is a node's. A server at the
// primary's address holding a log store's or a client's certificate —
// of the cluster's CA, with the right IP address in it — fails the
// handshake: the replica never sends it a hello nor takes a batch from
// it. A node's certificate at the same kind of address is followed.
func TestPrimaryMustBeANode(t *testing.T) {
	const td = "td.test"
	ca, err := tlsid.NewCA("ca", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	source := func(class, name string) *tlsid.Source {
		f, err := ca.WriteFiles(t.TempDir(), name, tlsid.Leaf{URI: tlsid.URI(td, class, name), IPs: []net.IP{net.ParseIP("127.0.0.1")}})
		if err != nil {
			t.Fatal(err)
		}
		s, err := tlsid.Load(f, nil)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	dialer := serve.NewDialer(source(tlsid.ClassNode, "r1"), td)
	config := func(primary string) Config {
		cfg := testConfig(t, t.TempDir(), primary)
		cfg.Security.Dialer = dialer
		return cfg
	}

	for _, class := range []string{tlsid.ClassLogStore, tlsid.ClassClient} {
		t.Run("a "+class+" as the primary", func(t *testing.T) {
			impostor, hellos := newTLSFakePrimary(t, source(class, "x"))
			r := start(t, config(impostor.addr))
			// The replica dials, is refused by its own check, and dials
			// again: a second TLS hello means the first came to nothing.
			testkit.Until(t, "the replica to try the impostor twice, or open a stream", func() bool {
				return hellos.Load() >= 2 || len(impostor.sessions) > 0
			})
			select {
			case s := <-impostor.sessions:
				t.Fatalf("the replica opened a stream to a %s: hello %v", class, s.hello)
			default:
			}
			if st := r.status(t); st.Peers[0].GetConnected() || st.LastLsn != 0 {
				t.Fatalf("after a %s as the primary: %v", class, st)
			}
		})
	}
	t.Run("a node as the primary", func(t *testing.T) {
		node, _ := newTLSFakePrimary(t, source(tlsid.ClassNode, "p1"))
		start(t, config(node.addr))
		if s := node.next(t); s.hello.GetReplicaId() != "r1" {
			t.Fatalf("hello %v", s.hello)
		}
	})
}

// newTLSFakePrimary is newFakePrimary served over mTLS with src, counting
// the TLS hellos it gets.
func newTLSFakePrimary(t *testing.T, src *tlsid.Source) (*fakePrimary, *atomic.Int32) {
	var hellos atomic.Int32
	cfg := src.ServerConfig()
	inner := cfg.GetConfigForClient
	cfg.GetConfigForClient = func(h *tls.ClientHelloInfo) (*tls.Config, error) {
		hellos.Add(1)
		return inner(h)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	f := &fakePrimary{sessions: make(chan *session, 1)}
	g := grpc.NewServer(grpc.Creds(credentials.NewTLS(cfg)))
	walshipv1.RegisterReplicationServiceServer(g, f)
	done := make(chan struct{})
	go func() { defer close(done); _ = g.Serve(lis) }()
	t.Cleanup(func() { g.Stop(); <-done })
	f.addr = lis.Addr().String()
	return f, &hellos
}
