package client_test

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/walship/walship/app/cluster"
	walshipv1 "github.com/walship/walship/gen/walship/v1"
	"github.com/walship/walship/internal/serve"
	"github.com/walship/walship/internal/testkit"
	"github.com/walship/walship/internal/tlsid"
	"github.com/walship/walship/pkg/client"
	"github.com/walship/walship/services/primary"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// TestReadsSurviveSwitchovers: linearizable reads (Get, Scan) and replica
// reads of the client's own write (GetReplica) keep succeeding while the
// primary hands over twice: a read the old primary refuses, or that a
// node changing role cuts off, is retried like a write the cluster did
// not apply.
func TestReadsSurviveSwitchovers(t *testing.T) {
	c, err := cluster.Start(t.Context(), cluster.Config{Dir: t.TempDir(), LogStores: 1, Replicas: 2, Failover: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Stop() })
	cl, err := client.New(nodeAddrs(c), client.Options{Retry: 20 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	lsn, err := cl.Put(ctx, "k", []byte("v"), nil)
	if err != nil {
		t.Fatal(err)
	}

	var reads atomic.Int64
	stop := make(chan struct{})
	errs := make(chan error, 3)
	var wg sync.WaitGroup
	for _, read := range []func() error{
		func() error {
			g, err := cl.Get(ctx, "k")
			if err == nil && string(g.GetValue()) != "v" {
				err = fmt.Errorf("Get = %q", g.GetValue())
			}
			return err
		},
		func() error {
			s, err := cl.Scan(ctx, &walshipv1.ScanRequest{})
			if err == nil && len(s.GetKvs()) == 0 {
				err = fmt.Errorf("Scan found nothing")
			}
			return err
		},
		func() error {
			g, err := cl.GetReplica(ctx, "k", lsn)
			if err == nil && string(g.GetValue()) != "v" {
				err = fmt.Errorf("GetReplica = %q", g.GetValue())
			}
			return err
		},
	} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				if err := read(); err != nil {
					errs <- err
					return
				}
				reads.Add(1)
			}
		}()
	}
	admin := func(n *cluster.Node) walshipv1.AdminServiceClient { return walshipv1.NewAdminServiceClient(c.Conn(n)) }
	from := c.Primary
	for _, to := range []*cluster.Node{c.Replicas[0], c.Replicas[1]} {
		before := reads.Load()
		testkit.Until(t, "reads before the switchover", func() bool { return reads.Load() > before+20 || len(errs) > 0 })
		if _, err := admin(from).Switchover(ctx, &walshipv1.SwitchoverRequest{Target: to.Name}); err != nil {
			t.Fatalf("switchover to %s: %v", to.Name, err)
		}
		from = to
	}
	before := reads.Load()
	testkit.Until(t, "reads after the switchovers", func() bool { return reads.Load() > before+20 || len(errs) > 0 })
	close(stop)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Errorf("a read during the switchovers failed: %v", err)
	}
}

// TestTLSFilesRotate: a client given TLS files reads them again when they
// change. Its first certificate expires seconds after the start; once it
// has, a connection to a node it never dialled before handshakes with the
// rotated certificate, which the server takes.
func TestTLSFilesRotate(t *testing.T) {
	c, ca, dir := tlsCluster(t, nil)

	me := tlsid.URI(cluster.DevTrustDomain, tlsid.ClassClient, "app")
	short := time.Now().Add(3 * time.Second)
	write := func(notAfter time.Time) {
		t.Helper()
		certPEM, keyPEM, err := ca.Issue(tlsid.Leaf{URI: me, NotAfter: notAfter})
		if err != nil {
			t.Fatal(err)
		}
		// As a Secret volume changes: all files at once.
		tmp := filepath.Join(dir, "new")
		if err := os.MkdirAll(tmp, 0o700); err != nil {
			t.Fatal(err)
		}
		for name, b := range map[string][]byte{"client.crt": certPEM, "client.key": keyPEM} {
			if err := os.WriteFile(filepath.Join(tmp, name), b, 0o600); err != nil {
				t.Fatal(err)
			}
		}
		for _, name := range []string{"client.crt", "client.key"} {
			if err := os.Rename(filepath.Join(tmp, name), filepath.Join(dir, name)); err != nil {
				t.Fatal(err)
			}
		}
	}
	write(short)
	files := &client.TLSFiles{Cert: filepath.Join(dir, "client.crt"), Key: filepath.Join(dir, "client.key"), CA: filepath.Join(dir, "ca.crt"), ReloadInterval: 50 * time.Millisecond}
	cl, err := client.New([]string{c.Primary.Addr}, client.Options{Retry: 5 * time.Second, TLS: files})
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	lsn, err := cl.Put(ctx, "k", []byte("v"), nil)
	if err != nil {
		t.Fatalf("Put with the first certificate: %v", err)
	}
	write(time.Now().Add(time.Hour))
	testkit.Until(t, "the first certificate to expire", func() bool { return time.Now().After(short.Add(time.Second)) })
	if g, err := cl.GetAt(ctx, c.Replicas[0].Addr, "k", lsn); err != nil || string(g.GetValue()) != "v" {
		t.Fatalf("GetAt on a node first dialled after the rotation: %v, %v", g, err)
	}

	if _, err := client.New([]string{c.Primary.Addr}, client.Options{TLS: &client.TLSFiles{Cert: files.Cert, Key: files.Key}}); err == nil || !contains(err.Error(), "TLSFiles.CA: required") {
		t.Fatalf("New without a CA file = %v", err)
	}
}

// tlsCluster starts a cluster (a log store, a primary and a replica) over
// mutual TLS under the default policy, its primary's config adjusted by
// p; it returns the CA, to issue clients' certificates, and the
// directory of its files (ca.crt is the bundle).
func tlsCluster(t *testing.T, p func(*primary.Config)) (*cluster.Cluster, *tlsid.CA, string) {
	t.Helper()
	dir := t.TempDir()
	ca, err := tlsid.NewCA("test CA", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	nodeFiles, err := ca.WriteFiles(dir, "node", tlsid.Leaf{URI: tlsid.URI(cluster.DevTrustDomain, tlsid.ClassNode, "n"), IPs: []net.IP{net.IPv4(127, 0, 0, 1)}})
	if err != nil {
		t.Fatal(err)
	}
	src, err := tlsid.Load(nodeFiles, nil)
	if err != nil {
		t.Fatal(err)
	}
	az, err := tlsid.NewAuthz(tlsid.AuthzConfig{TrustDomain: cluster.DevTrustDomain})
	if err != nil {
		t.Fatal(err)
	}
	c, err := cluster.Start(t.Context(), cluster.Config{Dir: t.TempDir(), LogStores: 1, Replicas: 1, Failover: true,
		Security: serve.Security{TLS: src, Authz: az, Dialer: serve.NewDialer(src, "")}, Primary: p})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Stop() })
	return c, ca, dir
}

// TestWriteQuotaPerIdentity: over mutual TLS, the primary's write quota
// (--write-quota-bytes-per-second) is each client certificate's: one
// identity over its byte rate is refused (RESOURCE_EXHAUSTED, not
// applied, with the time to wait) while another writes at once, and the
// throttle time is counted under the throttled identity.
func TestWriteQuotaPerIdentity(t *testing.T) {
	c, ca, dir := tlsCluster(t, func(p *primary.Config) { p.WriteQuotaBytesPerSecond = 10_000 })
	kv := func(name string) (walshipv1.KVServiceClient, string) {
		id := tlsid.URI(cluster.DevTrustDomain, tlsid.ClassClient, name)
		f, err := ca.WriteFiles(dir, name, tlsid.Leaf{URI: id})
		if err != nil {
			t.Fatal(err)
		}
		src, err := tlsid.Load(f, nil)
		if err != nil {
			t.Fatal(err)
		}
		cc, err := grpc.NewClient(c.Primary.Addr, grpc.WithTransportCredentials(src.Credentials()))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cc.Close() })
		return walshipv1.NewKVServiceClient(cc), id
	}
	a, idA := kv("app-a")
	b, _ := kv("app-b")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	value := make([]byte, 9_000)
	for i := range 2 {
		if _, err := a.Put(ctx, &walshipv1.PutRequest{Key: "a", Value: value}, grpc.WaitForReady(true)); err != nil {
			t.Fatalf("app-a's write %d within its quota: %v", i, err)
		}
	}
	_, err := a.Put(ctx, &walshipv1.PutRequest{Key: "a", Value: value})
	if status.Code(err) != codes.ResourceExhausted || !client.NotApplied(err) || !strings.Contains(err.Error(), idA) {
		t.Fatalf("app-a over its quota = %v; want RESOURCE_EXHAUSTED, not applied, naming %s", err, idA)
	}
	if _, err := b.Put(ctx, &walshipv1.PutRequest{Key: "b", Value: value}, grpc.WaitForReady(true)); err != nil {
		t.Fatalf("app-b while app-a is throttled: %v", err)
	}
	mfs, err := c.Primary.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var throttled float64
	for _, mf := range mfs {
		if mf.GetName() != "walship_write_quota_throttle_seconds_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "identity" && l.GetValue() == idA {
					throttled = m.GetCounter().GetValue()
				}
			}
		}
	}
	if throttled < 0.5 {
		t.Fatalf("walship_write_quota_throttle_seconds_total{identity=%q} = %v; want the ~0.8 s asked", idA, throttled)
	}
}

func contains(s string, subs ...string) bool {
	for _, sub := range subs {
		if !strings.Contains(s, sub) {
			return false
		}
	}
	return true
}
