package logstore

import (
	"net"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/walship/walship/internal/serve"
	"github.com/walship/walship/internal/testkit"
	"github.com/walship/walship/internal/tlsid"
)

// TestTwoIdentitiesInOneProcess: two log stores of one process, each
// refilling from a peer that trusts only its own CA, dial each with the
// identity its config gives it (Security.Dialer), and both refill. With
// one identity per process (serve.UseTLS, before the Dialer) one of them
// dialled as the other and its peer refused the handshake.
func TestTwoIdentitiesInOneProcess(t *testing.T) {
	const td = "ls.test"
	// domain makes a CA, a peer served with TLS under it holding txns
	// transactions, and the dialer of a log store of that CA.
	domain := func(name string, txns int) (peer string, d serve.Dialer) {
		ca, err := tlsid.NewCA(name, time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		issue := func(leaf string) *tlsid.Source {
			f, err := ca.WriteFiles(t.TempDir(), leaf, tlsid.Leaf{URI: tlsid.URI(td, tlsid.ClassLogStore, leaf), IPs: []net.IP{net.ParseIP("127.0.0.1")}})
			if err != nil {
				t.Fatal(err)
			}
			src, err := tlsid.Load(f, nil)
			if err != nil {
				t.Fatal(err)
			}
			return src
		}
		az, err := tlsid.NewAuthz(tlsid.AuthzConfig{TrustDomain: td, Reflection: tlsid.ReflectionAll})
		if err != nil {
			t.Fatal(err)
		}
		// Written in plaintext (the helpers' clients), then served with
		// TLS at the same address.
		cfg := testConfig(t, t.TempDir())
		cfg.Listen = testkit.FreeAddr(t)
		p := start(t, cfg)
		p.appendAll(t, chain(t, 1, 1, txns, 10)...)
		if err := p.stop(); err != nil {
			t.Fatal(err)
		}
		cfg.Registry = prometheus.NewRegistry()
		cfg.Security = serve.Security{TLS: issue(name + "-peer"), Authz: az}
		start(t, cfg)
		return cfg.Listen, serve.NewDialer(issue(name+"-ls"), td)
	}
	peerA, dialA := domain("a", 5)
	peerB, dialB := domain("b", 7)

	refill := func(peer string, d serve.Dialer) *running {
		cfg := testConfig(t, t.TempDir())
		cfg.Peers = []string{peer}
		cfg.Security.Dialer = d
		return start(t, cfg)
	}
	a, b := refill(peerA, dialA), refill(peerB, dialB)
	if st := a.refilled(t); st.DurableLsn != 10 {
		t.Errorf("the log store of CA a after its refill: %v; want LSNs 1..10 from its peer", st)
	}
	if st := b.refilled(t); st.DurableLsn != 14 {
		t.Errorf("the log store of CA b after its refill: %v; want LSNs 1..14 from its peer", st)
	}
}
