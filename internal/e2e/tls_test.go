package e2e

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	walshipv1 "github.com/walship/walship/gen/walship/v1"
	"github.com/walship/walship/internal/testkit"
	"github.com/walship/walship/internal/tlsid"
	"github.com/walship/walship/pkg/client"
	"google.golang.org/grpc"
)

// TestTLSRotationUnderLoad: a log store, a primary and a replica as
// processes, mTLS everywhere under the default authorization policy.
// Real grpcurl with the README's flags writes as a client, is refused
// admin RPCs, and cannot connect without a certificate. Under sync load
// (K=1: every commit waits for the replica over its TLS stream), the
// primary's certificate files are replaced: new handshakes get the new
// certificate and every commit goes on — the replica's stream, closed at
// the primary's --max-connection-age, resumes over a new handshake; then a
// broken update is refused (counted) and the last good certificate stays.
func TestTLSRotationUnderLoad(t *testing.T) {
	needLinux(t)
	dir, certs := t.TempDir(), t.TempDir()
	ca, err := tlsid.NewCA("e2e CA", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	local := []net.IP{net.ParseIP("127.0.0.1")}
	issue := func(name, class string) tlsid.Files {
		f, err := ca.WriteFiles(certs, name, tlsid.Leaf{URI: tlsid.URI("e2e", class, name), IPs: local})
		if err != nil {
			t.Fatal(err)
		}
		return f
	}
	flags := func(f tlsid.Files) []string {
		return []string{"--tls-cert", f.Cert, "--tls-key", f.Key, "--tls-ca", f.CA, "--trust-domain", "e2e", "--tls-reload-interval", "100ms"}
	}
	lsAddr, pAddr, rAddr, pMetrics := testkit.FreeAddr(t), testkit.FreeAddr(t), testkit.FreeAddr(t), testkit.FreeAddr(t)
	pFiles := issue("primary", tlsid.ClassNode)
	nodes := []*procNode{
		{name: "logstore", serving: "log store serving", addr: lsAddr, args: append([]string{"logstore",
			"--listen", lsAddr, "--metrics-listen", "", "--data-dir", filepath.Join(dir, "ls")}, flags(issue("ls", tlsid.ClassLogStore))...)},
		{name: "primary", serving: "primary serving", addr: pAddr, args: append([]string{"primary",
			"--listen", pAddr, "--metrics-listen", pMetrics, "--data-dir", filepath.Join(dir, "p"), "--logstore", lsAddr,
			"--replication", "sync", "--sync-replicas", "1", "--heartbeat-interval", "100ms", "--sync-timeout", "3s",
			"--max-connection-age", "1s"}, flags(pFiles)...)},
		{name: "r0", serving: "replica serving", addr: rAddr, args: append([]string{"replica",
			"--listen", rAddr, "--metrics-listen", "", "--data-dir", filepath.Join(dir, "r0"), "--id", "r0",
			"--primary", pAddr, "--logstore", lsAddr, "--heartbeat-interval", "100ms"}, flags(issue("r0", tlsid.ClassNode))...)},
	}
	for _, n := range nodes {
		n.t = t
		n.start()
	}
	cFiles, aFiles := issue("app", tlsid.ClassClient), issue("ops", tlsid.ClassAdmin)
	gc := func(f tlsid.Files, args ...string) (string, error) {
		out, err := exec.Command(grpcurl(t), append([]string{"-cacert", f.CA, "-cert", f.Cert, "-key", f.Key, "-max-time", "20"}, args...)...).CombinedOutput()
		return string(out), err
	}
	// grpcurl as the README shows it.
	if out, err := gc(cFiles, "-d", `{"key":"tls","value":"eA=="}`, pAddr, "walship.v1.KVService/Put"); err != nil || !strings.Contains(out, `"lsn"`) {
		t.Fatalf("grpcurl Put as a client: %v\n%s", err, out)
	}
	if out, err := gc(cFiles, "-d", `{}`, pAddr, "walship.v1.AdminService/SetPolicy"); err == nil || !strings.Contains(out, "PermissionDenied") || !strings.Contains(out, "spiffe://e2e/walship/client/app may not call") {
		t.Fatalf("grpcurl SetPolicy as a client: %v\n%s", err, out)
	}
	if out, err := gc(aFiles, pAddr, "walship.v1.AdminService/Status"); err != nil || !strings.Contains(out, "ROLE_PRIMARY") {
		t.Fatalf("grpcurl Status as an admin: %v\n%s", err, out)
	}
	if out, err := exec.Command(grpcurl(t), "-cacert", cFiles.CA, pAddr, "list").CombinedOutput(); err == nil {
		t.Fatalf("grpcurl without a client certificate connected:\n%s", out)
	}
	if out, err := exec.Command(grpcurl(t), "-plaintext", pAddr, "list").CombinedOutput(); err == nil {
		t.Fatalf("grpcurl in plaintext connected:\n%s", out)
	}

	// Sync load from a client with its own certificate.
	src, err := tlsid.Load(cFiles, nil)
	if err != nil {
		t.Fatal(err)
	}
	cl, err := client.New([]string{pAddr}, client.Options{Retry: 10 * time.Second,
		DialOptions: []grpc.DialOption{grpc.WithTransportCredentials(src.Credentials())}})
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	lctx, stop := context.WithCancel(ctx)
	var commits atomic.Int64
	loadErr := make(chan error, 1)
	go func() {
		for i := 0; lctx.Err() == nil; i++ {
			if _, err := cl.Put(lctx, fmt.Sprintf("load/%d", i%100), []byte("v"), nil); err != nil && lctx.Err() == nil {
				loadErr <- err
				return
			}
			commits.Add(1)
		}
		loadErr <- nil
	}()
	serial := func() string {
		conn, err := tls.Dial("tcp", pAddr, src.ClientConfig())
		if err != nil {
			return "dial: " + err.Error()
		}
		defer conn.Close()
		return conn.ConnectionState().PeerCertificates[0].SerialNumber.String()
	}
	testkit.Until(t, "commits under load", func() bool { return commits.Load() > 50 })
	before := serial()

	// Rotate the primary's certificate (same CA, new key).
	if _, err := ca.WriteFiles(certs, "primary", tlsid.Leaf{URI: tlsid.URI("e2e", tlsid.ClassNode, "primary"), IPs: local}); err != nil {
		t.Fatal(err)
	}
	testkit.Until(t, "new handshakes to get the new certificate", func() bool { s := serial(); return s != before && !strings.HasPrefix(s, "dial") })
	rotated := serial()
	at := commits.Load()
	testkit.Until(t, "commits after the rotation", func() bool { return commits.Load() > at+50 })

	// A broken update: the last good certificate stays, and it is counted.
	if err := os.WriteFile(pFiles.Key, []byte("not a key"), 0o600); err != nil {
		t.Fatal(err)
	}
	testkit.Until(t, "the primary to count the broken update", func() bool {
		return scrape(t, pMetrics, `walship_tls_reloads_total{result="error"}`) >= 1
	})
	if s := serial(); s != rotated {
		t.Fatalf("after a broken update the primary presents %s; want the last good %s", s, rotated)
	}
	at = commits.Load()
	testkit.Until(t, "commits after the broken update", func() bool { return commits.Load() > at+50 })
	stop()
	if err := <-loadErr; err != nil {
		t.Fatalf("a commit failed during the rotation: %v", err)
	}
	// The replica's stream re-handshook (the primary closes connections a
	// second old) and is connected; the primary's reloads were counted.
	testkit.Until(t, "the replica's stream to be re-established", func() bool {
		return strings.Count(nodes[1].p.logs(), `"msg":"replica connected"`) >= 3
	})
	st, err := walshipv1.NewAdminServiceClient(tlsConn(t, pAddr, src)).Status(ctx, &walshipv1.StatusRequest{})
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range st.Peers {
		if p.Id == "r0" && !p.Connected {
			t.Fatalf("the replica is not connected after the rotation: %v", p)
		}
	}
	if v := scrape(t, pMetrics, `walship_tls_reloads_total{result="ok"}`); v < 1 {
		t.Fatalf("reloads ok = %v", v)
	}
	t.Logf("%d sync commits across a certificate rotation and a broken update, none failed", commits.Load())
}

func tlsConn(t *testing.T, addr string, src *tlsid.Source) *grpc.ClientConn {
	t.Helper()
	cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(src.Credentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	return cc
}

// scrape returns the value of the metric line starting with series on
// addr's /metrics, or -1.
func scrape(t *testing.T, addr, series string) float64 {
	t.Helper()
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		return -1
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	for _, line := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(line, series+" ") {
			var v float64
			if _, err := fmt.Sscan(strings.TrimPrefix(line, series+" "), &v); err == nil {
				return v
			}
		}
	}
	return -1
}
