// Package kubetest runs a real Kubernetes API server for tests: Debian's
// etcd and a kube-apiserver built from k8s.io/kubernetes (tools/kube,
// `make kube`). No kubelet and no controllers run: tests create the
// objects (Pods among them) themselves and walship processes play the
// pods, each with a kubeconfig of its own.
//
// Users authenticate with static tokens: "admin" is in system:masters,
// [Server.Kubeconfig] writes a kubeconfig for any other user and groups,
// whom RBAC then judges — so a test of least privilege runs against the
// real authorizer.
package kubetest

import (
	"context"
	"crypto/rand"
	"crypto/rsa"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/walship/walship/internal/freeport"
	"github.com/walship/walship/internal/testkit"
)

// Env names the binaries: WALSHIP_KUBE_APISERVER, WALSHIP_KUBECTL and
// WALSHIP_ETCD (default: etcd on PATH). make test sets the first two to
// bin/kube-apiserver and bin/kubectl.
const (
	EnvAPIServer = "WALSHIP_KUBE_APISERVER"
	EnvKubectl   = "WALSHIP_KUBECTL"
	EnvEtcd      = "WALSHIP_ETCD"
)

// Server is a running API server.
type Server struct {
	// URL is the API server's https URL.
	URL string
	// Admin is a kubeconfig for a user in system:masters.
	Admin string

	dir    string
	caPEM  []byte
	tokens map[string]string // user -> token
	mu     sync.Mutex
	users  []string // token file lines
	cancel func()
	done   chan struct{}
	logs   *testkit.Output
}

// Binaries returns the API server and etcd binaries, or skips tb with the
// reason one is missing.
func Binaries(tb testing.TB) (apiserver, etcd string) {
	tb.Helper()
	apiserver = os.Getenv(EnvAPIServer)
	if apiserver == "" {
		tb.Skipf("%s is not set: build the API server with `make kube` (make test does)", EnvAPIServer)
	}
	if _, err := os.Stat(apiserver); err != nil {
		tb.Skipf("%s: %v: build it with `make kube`", EnvAPIServer, err)
	}
	etcd = os.Getenv(EnvEtcd)
	if etcd == "" {
		p, err := exec.LookPath("etcd")
		if err != nil {
			tb.Skip("etcd is not on PATH: apt-get install etcd-server (.ci/run does)")
		}
		etcd = p
	}
	return apiserver, etcd
}

// Kubectl returns the kubectl binary, or skips tb.
func Kubectl(tb testing.TB) string {
	tb.Helper()
	p := os.Getenv(EnvKubectl)
	if p == "" {
		tb.Skipf("%s is not set: build kubectl with `make kube` (make test does)", EnvKubectl)
	}
	if _, err := os.Stat(p); err != nil {
		tb.Skipf("%s: %v", EnvKubectl, err)
	}
	return p
}

// Start starts etcd and an API server in dir (both stop at Close) and
// waits until the API server is ready. Users may be added later with
// Kubeconfig only if they were named here (the token file is read at
// start): users are "name" or "name|group1,group2".
func Start(ctx context.Context, apiserver, etcd, dir string, users ...string) (*Server, error) {
	s := &Server{dir: dir, tokens: map[string]string{}, done: make(chan struct{}), logs: &testkit.Output{}}
	ctx, cancel := context.WithCancel(ctx)
	s.cancel = cancel
	fail := func(err error) (*Server, error) {
		s.Close()
		return nil, fmt.Errorf("%w\n%s", err, s.logs.Head(3000))
	}
	etcdClient, etcdPeer, apiPort, err := freePorts()
	if err != nil {
		return fail(err)
	}
	for _, d := range []string{"etcd", "certs"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o700); err != nil {
			return fail(err)
		}
	}
	lines := []string{}
	for i, u := range append([]string{"admin|system:masters"}, users...) {
		name, groups, _ := strings.Cut(u, "|")
		tok := fmt.Sprintf("walship-test-token-%d-%s", i, name)
		s.tokens[name] = tok
		lines = append(lines, fmt.Sprintf("%s,%s,uid-%d,%q", tok, name, i, groups))
	}
	tokenFile := filepath.Join(dir, "tokens.csv")
	if err := os.WriteFile(tokenFile, []byte(strings.Join(lines, "\n")+"\n"), 0o600); err != nil {
		return fail(err)
	}
	saKey := filepath.Join(dir, "certs", "sa.key")
	if err := writeKey(saKey); err != nil {
		return fail(err)
	}
	var wg sync.WaitGroup
	run := func(name string, args ...string) error {
		cmd := exec.CommandContext(ctx, name, args...)
		cmd.Stdout, cmd.Stderr = s.logs, s.logs
		// Their data is the test's temporary directory: no graceful stop.
		cmd.Cancel = func() error { return cmd.Process.Kill() }
		cmd.WaitDelay = 10 * time.Second
		if err := cmd.Start(); err != nil {
			return err
		}
		wg.Add(1)
		go func() { defer wg.Done(); _ = cmd.Wait() }()
		return nil
	}
	go func() { <-ctx.Done(); wg.Wait(); close(s.done) }()
	if err := run(etcd, "--data-dir", filepath.Join(dir, "etcd"),
		"--listen-client-urls", "http://"+etcdClient, "--advertise-client-urls", "http://"+etcdClient,
		"--listen-peer-urls", "http://"+etcdPeer, "--initial-advertise-peer-urls", "http://"+etcdPeer,
		"--initial-cluster", "default=http://"+etcdPeer, "--log-level", "warn"); err != nil {
		return fail(fmt.Errorf("start etcd: %w", err))
	}
	s.URL = "https://" + apiPort
	_, port, _ := net.SplitHostPort(apiPort)
	if err := run(apiserver, "--etcd-servers", "http://"+etcdClient,
		"--bind-address", "127.0.0.1", "--advertise-address", "127.0.0.1", "--secure-port", port,
		"--cert-dir", filepath.Join(dir, "certs"),
		"--token-auth-file", tokenFile, "--authorization-mode", "RBAC",
		"--service-account-issuer", "https://kubernetes.default.svc",
		"--service-account-key-file", saKey, "--service-account-signing-key-file", saKey,
		"--service-cluster-ip-range", "10.96.0.0/16",
		// No controller creates service accounts here; pods name theirs
		// and tests create it.
		"--disable-admission-plugins", "ServiceAccount",
		"--enable-priority-and-fairness=false",
		"--v", "0"); err != nil {
		return fail(fmt.Errorf("start kube-apiserver: %w", err))
	}
	if err := s.waitReady(ctx); err != nil {
		return fail(err)
	}
	admin, err := s.Kubeconfig("admin")
	if err != nil {
		return fail(err)
	}
	s.Admin = admin
	return s, nil
}

// StartT starts a server for tb (skipping when the binaries are missing)
// and stops it at cleanup.
func StartT(tb testing.TB, users ...string) *Server {
	tb.Helper()
	apiserver, etcd := Binaries(tb)
	s, err := Start(context.Background(), apiserver, etcd, tb.TempDir(), users...)
	if err != nil {
		tb.Fatalf("kube-apiserver: %v", err)
	}
	tb.Cleanup(s.Close)
	return s
}

// Close stops the API server and etcd.
func (s *Server) Close() {
	if s.cancel == nil {
		return
	}
	s.cancel()
	<-s.done
}

// Logs is the tail of what etcd and the API server wrote.
func (s *Server) Logs() string { return s.logs.Tail(8000) }

// Kubeconfig writes a kubeconfig for user (named at Start) and returns its
// path. server, if given, replaces the API server's address (a proxy's).
func (s *Server) Kubeconfig(user string, server ...string) (string, error) {
	tok, ok := s.tokens[user]
	if !ok {
		return "", fmt.Errorf("kubetest: user %q was not named at Start", user)
	}
	url := s.URL
	if len(server) > 0 {
		url = server[0]
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.users = append(s.users, user)
	path := filepath.Join(s.dir, fmt.Sprintf("kubeconfig-%s-%d", user, len(s.users)))
	ca := filepath.Join(s.dir, "ca.crt")
	if err := os.WriteFile(ca, s.caPEM, 0o600); err != nil {
		return "", err
	}
	cfg := fmt.Sprintf(`apiVersion: v1
kind: Config
clusters:
- name: test
  cluster:
    server: %s
    certificate-authority: %s
users:
- name: %s
  user:
    token: %s
contexts:
- name: test
  context:
    cluster: test
    user: %s
current-context: test
`, url, ca, user, tok, user)
	return path, os.WriteFile(path, []byte(cfg), 0o600)
}

// waitReady polls /readyz until the API server answers ok, and keeps the
// certificate it serves (self-signed, from --cert-dir) as the CA.
func (s *Server) waitReady(ctx context.Context) error {
	deadline := time.Now().Add(90 * time.Second)
	for {
		if time.Now().After(deadline) {
			return errors.New("kube-apiserver: not ready within 90s")
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		if err := s.readyOnce(); err == nil {
			return nil
		}
		t := time.NewTimer(200 * time.Millisecond)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
		}
	}
}

func (s *Server) readyOnce() error {
	certs, err := os.ReadFile(filepath.Join(s.dir, "certs", "apiserver.crt"))
	if err != nil {
		return err
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(certs) {
		return errors.New("apiserver.crt: no certificate")
	}
	c := &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}}
	req, _ := http.NewRequest(http.MethodGet, s.URL+"/readyz", nil)
	req.Header.Set("Authorization", "Bearer "+s.tokens["admin"])
	resp, err := c.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("readyz: %s", resp.Status)
	}
	s.caPEM = certs
	return nil
}

// writeKey writes a new service-account signing key.
func writeKey(path string) error {
	k, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		return err
	}
	return os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: "RSA PRIVATE KEY", Bytes: x509.MarshalPKCS1PrivateKey(k)}), 0o600)
}

// freePorts returns three distinct free loopback addresses, outside the
// ephemeral range (freeport.Pick): etcd and the API server bind them
// after this returns.
func freePorts() (a, b, c string, err error) {
	var addrs [3]string
	for i := range addrs {
		if addrs[i], err = freeport.Pick("127.0.0.1"); err != nil {
			return "", "", "", err
		}
	}
	return addrs[0], addrs[1], addrs[2], nil
}
