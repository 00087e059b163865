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
	"sync"
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
			// 3s: the grace for calls in flight is half the age, and a
			// sync Put on a loaded CI machine can outlast 0.5s.
			"--max-connection-age", "3s"}, flags(pFiles)...)},
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
	load := startTLSLoad(lctx, cl)
	serial := func() string {
		conn, err := tls.Dial("tcp", pAddr, src.ClientConfig())
		if err != nil {
			return "dial: " + err.Error()
		}
		defer conn.Close()
		return conn.ConnectionState().PeerCertificates[0].SerialNumber.String()
	}
	load.waitFor(t, "50 commits under load", 50)
	before := serial()

	// Rotate the primary's certificate (same CA, new key).
	if _, err := ca.WriteFiles(certs, "primary", tlsid.Leaf{URI: tlsid.URI("e2e", tlsid.ClassNode, "primary"), IPs: local}); err != nil {
		t.Fatal(err)
	}
	testkit.UntilWithin(t, time.Minute, "new handshakes to get the new certificate", func() bool { s := serial(); return s != before && !strings.HasPrefix(s, "dial") })
	rotated := serial()
	load.waitFor(t, "50 commits after the rotation", load.count()+50)

	// A broken update: the last good certificate stays, and it is counted.
	if err := os.WriteFile(pFiles.Key, []byte("not a key"), 0o600); err != nil {
		t.Fatal(err)
	}
	testkit.UntilWithin(t, time.Minute, "the primary to count the broken update", func() bool {
		return scrape(t, pMetrics, `walship_tls_reloads_total{result="error"}`) >= 1
	})
	if s := serial(); s != rotated {
		t.Fatalf("after a broken update the primary presents %s; want the last good %s", s, rotated)
	}
	load.waitFor(t, "50 commits after the broken update", load.count()+50)
	stop()
	if err := load.stop(); err != nil {
		t.Fatalf("a commit failed during the rotation: %v", err)
	}
	// The replica's stream re-handshook (the primary closes connections a
	// second old) and is connected; the primary's reloads were counted.
	testkit.UntilWithin(t, time.Minute, "the replica's stream to be re-established", func() bool {
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
	t.Logf("%d sync commits across a certificate rotation and a broken update, none failed", load.count())
}

// tlsLoad is sync load from one client: Puts one after another until its
// context ends or one fails, which ends it.
type tlsLoad struct {
	mu      sync.Mutex
	commits int
	err     error         // the Put that failed
	changed chan struct{} // closed and replaced at each commit, and at the end
	done    chan struct{}
}

func startTLSLoad(ctx context.Context, cl *client.Client) *tlsLoad {
	l := &tlsLoad{changed: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(l.done)
		for i := 0; ctx.Err() == nil; i++ {
			key := fmt.Sprintf("load/%d", i%100)
			_, err := cl.Put(ctx, key, []byte("v"), nil)
			if ctx.Err() != nil {
				err = nil // stopped, not failed
			}
			l.mu.Lock()
			if err != nil {
				l.err = fmt.Errorf("Put %q, after %d commits: %w", key, l.commits, err)
			} else {
				l.commits++
			}
			close(l.changed)
			l.changed = make(chan struct{})
			l.mu.Unlock()
			if err != nil {
				return
			}
		}
	}()
	return l
}

func (l *tlsLoad) count() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.commits
}

// waitFor waits until the load has made n commits. It fails t at once with
// the load's own error if a Put failed, and if no commit came for a minute
// (a loaded machine slows the load down; only a stall fails it).
func (l *tlsLoad) waitFor(t *testing.T, what string, n int) {
	t.Helper()
	const stall = time.Minute
	timer := time.NewTimer(stall)
	defer timer.Stop()
	for {
		l.mu.Lock()
		commits, err, changed := l.commits, l.err, l.changed
		l.mu.Unlock()
		switch {
		case err != nil:
			t.Fatalf("waiting for %s: the load failed: %v", what, err)
		case commits >= n:
			return
		}
		select {
		case <-changed:
			timer.Reset(stall)
		case <-l.done:
			if l.count() < n {
				t.Fatalf("waiting for %s: the load ended after %d of %d commits: %v", what, l.count(), n, context.Cause(t.Context()))
			}
		case <-timer.C:
			t.Fatalf("waiting for %s: no commit for %v, %d of %d made", what, stall, commits, n)
		}
	}
}

// stop waits for the load (its context ended) and returns its error.
func (l *tlsLoad) stop() error {
	<-l.done
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.err
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
