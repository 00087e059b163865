package hostile

import (
	"bufio"
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/walship/walship/internal/testkit"
	"github.com/walship/walship/internal/tlsid"
	"google.golang.org/grpc"
)

// proc is a walship process whose JSON log is parsed for its address.
type proc struct {
	name string
	cmd  *exec.Cmd
	addr string
	done chan struct{}
	mu   sync.Mutex
	log  strings.Builder
}

// startProc runs `walship <args...> --log-format json` and waits until it
// logs servingMsg, taking the address from that line.
func startProc(tb testing.TB, name, servingMsg string, args ...string) *proc {
	tb.Helper()
	args = append(args, "--log-format", "json")
	cmd := exec.Command(testkit.Walship(tb), args...)
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "WALSHIP_") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	stderr, err := cmd.StderrPipe()
	if err != nil {
		tb.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		tb.Fatal(err)
	}
	p := &proc{name: name, cmd: cmd, done: make(chan struct{})}
	addrc := make(chan string, 1)
	go func() {
		defer close(p.done)
		sc := bufio.NewScanner(stderr)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			line := sc.Text()
			p.mu.Lock()
			if p.log.Len() < 4<<20 {
				p.log.WriteString(line + "\n")
			}
			p.mu.Unlock()
			var rec map[string]any
			if json.Unmarshal([]byte(line), &rec) == nil && rec["msg"] == servingMsg {
				if a, ok := rec["addr"].(string); ok {
					select {
					case addrc <- a:
					default:
					}
				}
			}
		}
		_, _ = io.Copy(io.Discard, stderr)
		_ = cmd.Wait()
	}()
	tb.Cleanup(p.kill)
	select {
	case p.addr = <-addrc:
	case <-p.done:
		tb.Fatalf("walship %s exited before serving:\n%s", strings.Join(args, " "), p.logs())
	case <-time.After(60 * time.Second):
		tb.Fatalf("walship %s did not log %q within 60s:\n%s", strings.Join(args, " "), servingMsg, p.logs())
	}
	return p
}

func (p *proc) logs() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.log.String()
}

func (p *proc) kill() {
	if p.cmd.ProcessState == nil {
		_ = p.cmd.Process.Kill()
	}
	<-p.done
}

// exited says whether the process has exited, and how.
func (p *proc) exited() (bool, string) {
	select {
	case <-p.done:
		return true, p.cmd.ProcessState.String()
	default:
		return false, ""
	}
}

// rss is the process's resident set (VmRSS of /proc/PID/status), in bytes.
func (p *proc) rss() (int64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", p.cmd.Process.Pid))
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) >= 2 && f[0] == "VmRSS:" {
			kb, err := strconv.ParseInt(f[1], 10, 64)
			return kb << 10, err
		}
	}
	return 0, fmt.Errorf("no VmRSS in /proc/%d/status", p.cmd.Process.Pid)
}

// pki is a test CA and the certificates of a cluster under trust domain
// "hostile": every class, and the certificates an attacker might hold.
type pki struct {
	dir string
	ca  *tlsid.CA
}

const trustDomain = "hostile"

func newPKI(tb testing.TB) *pki {
	tb.Helper()
	ca, err := tlsid.NewCA("hostile CA", time.Hour)
	if err != nil {
		tb.Fatal(err)
	}
	return &pki{dir: tb.TempDir(), ca: ca}
}

// files issues a certificate of class and name (class "" issues one with
// no identity at all) reachable on loopback.
func (k *pki) files(tb testing.TB, class, name string) tlsid.Files {
	tb.Helper()
	l := tlsid.Leaf{IPs: []net.IP{net.ParseIP("127.0.0.1")}}
	if class != "" {
		l.URI = tlsid.URI(trustDomain, class, name)
	}
	f, err := k.ca.WriteFiles(k.dir, fmt.Sprintf("%s-%s", class, name), l)
	if err != nil {
		tb.Fatal(err)
	}
	return f
}

// flags are a server's TLS flags for f.
func (k *pki) flags(f tlsid.Files) []string {
	return []string{"--tls-cert", f.Cert, "--tls-key", f.Key, "--tls-ca", f.CA, "--trust-domain", trustDomain}
}

// tlsConfig is a client's TLS configuration for f.
func tlsConfig(tb testing.TB, f tlsid.Files) *tls.Config {
	tb.Helper()
	src, err := tlsid.Load(f, nil)
	if err != nil {
		tb.Fatal(err)
	}
	return src.ClientConfig()
}

// grpcConn is a gRPC client connection to addr as f.
func grpcConn(tb testing.TB, addr string, f tlsid.Files, opts ...grpc.DialOption) *grpc.ClientConn {
	tb.Helper()
	src, err := tlsid.Load(f, nil)
	if err != nil {
		tb.Fatal(err)
	}
	cc, err := grpc.NewClient(addr, append([]grpc.DialOption{grpc.WithTransportCredentials(src.Credentials())}, opts...)...)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { cc.Close() })
	return cc
}

// cluster is what an attack runs against: a log store, a primary and a
// replica as processes, mTLS under the default policy.
type cluster struct {
	pki                        *pki
	logstore, primary, replica *proc
	primaryMetrics             string // its /metrics (and /debug/pprof with --pprof)
}

// startCluster starts the cluster; extra are flags for every node.
func startCluster(tb testing.TB, extra ...string) *cluster {
	tb.Helper()
	k := newPKI(tb)
	dir := tb.TempDir()
	c := &cluster{pki: k}
	c.logstore = startProc(tb, "logstore", "log store serving", append(append([]string{"logstore",
		"--listen", "127.0.0.1:0", "--metrics-listen", "", "--data-dir", filepath.Join(dir, "ls")},
		k.flags(k.files(tb, tlsid.ClassLogStore, "ls"))...), extra...)...)
	c.primaryMetrics = testkit.FreeAddr(tb)
	c.primary = startProc(tb, "primary", "primary serving", append(append([]string{"primary",
		"--listen", "127.0.0.1:0", "--metrics-listen", c.primaryMetrics, "--data-dir", filepath.Join(dir, "p"),
		"--logstore", c.logstore.addr, "--heartbeat-interval", "100ms"},
		k.flags(k.files(tb, tlsid.ClassNode, "p"))...), extra...)...)
	c.replica = startProc(tb, "replica", "replica serving", append(append([]string{"replica",
		"--listen", "127.0.0.1:0", "--metrics-listen", "", "--data-dir", filepath.Join(dir, "r0"), "--id", "r0",
		"--primary", c.primary.addr, "--logstore", c.logstore.addr, "--heartbeat-interval", "100ms"},
		k.flags(k.files(tb, tlsid.ClassNode, "r0"))...), extra...)...)
	return c
}

// proc is the node named by an attack's target.
func (c *cluster) proc(target string) *proc {
	switch target {
	case "replica":
		return c.replica
	case "logstore":
		return c.logstore
	}
	return c.primary
}

// waitCtx is a context for one attack's bounded wait.
func waitCtx(tb testing.TB, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	tb.Cleanup(cancel)
	return ctx
}
