package e2e

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/walship/walship/internal/testkit"
)

// walshipBin returns the walship binary ($WALSHIP_BIN, or built once).
func walshipBin(t *testing.T) string { return testkit.Walship(t) }

// proc is a walship process whose JSON log is parsed for its addresses.
type proc struct {
	t    *testing.T
	cmd  *exec.Cmd
	addr string // gRPC address from its "serving" log line
	done chan struct{}
	mu   sync.Mutex
	log  strings.Builder
}

// startProc runs `walship <args...> --log-format json` and waits until it
// logs the line whose msg is servingMsg, taking its addr attribute.
func startProc(t *testing.T, servingMsg string, args ...string) *proc {
	t.Helper()
	return startProcEnv(t, nil, servingMsg, args...)
}

// startProcEnv is startProc with env added to the process's environment.
func startProcEnv(t *testing.T, env []string, servingMsg string, args ...string) *proc {
	t.Helper()
	args = append(args, "--log-format", "json")
	cmd := exec.Command(walshipBin(t), args...)
	cmd.Env = append(cleanEnv(), env...)
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &proc{t: t, cmd: cmd, done: make(chan struct{})}
	addrc := make(chan string, 1)
	go func() {
		defer close(p.done)
		sc := bufio.NewScanner(stderr)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			line := sc.Text()
			p.mu.Lock()
			p.log.WriteString(line + "\n")
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
	t.Cleanup(func() { p.kill() })
	select {
	case p.addr = <-addrc:
	case <-p.done:
		t.Fatalf("walship %s exited before serving:\n%s", strings.Join(args, " "), p.logs())
	case <-time.After(60 * time.Second):
		t.Fatalf("walship %s did not log %q within 60s:\n%s", strings.Join(args, " "), servingMsg, p.logs())
	}
	return p
}

// cleanEnv drops WALSHIP_* variables so the test's flags are the only config.
func cleanEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "WALSHIP_") {
			env = append(env, kv)
		}
	}
	return env
}

func (p *proc) logs() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.log.String()
}

// kill sends SIGKILL and waits for the process to be gone.
func (p *proc) kill() {
	if p.cmd.ProcessState == nil {
		_ = p.cmd.Process.Kill()
	}
	<-p.done
}

// stop sends SIGTERM (graceful stop) and waits for exit; it fails the test
// if the process does not exit cleanly.
func (p *proc) stop() {
	p.t.Helper()
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(60 * time.Second):
		p.t.Fatalf("no exit 60s after SIGTERM:\n%s", p.logs())
	}
	if !p.cmd.ProcessState.Success() {
		p.t.Fatalf("exit after SIGTERM: %v\n%s", p.cmd.ProcessState, p.logs())
	}
}

func (p *proc) signal(sig syscall.Signal) {
	p.t.Helper()
	if err := p.cmd.Process.Signal(sig); err != nil {
		p.t.Fatalf("signal %v: %v", sig, err)
	}
}

// pause stops the process (SIGSTOP) and returns once every one of its
// threads is stopped (testkit.ThreadsStopped says why the signal alone is
// not enough).
func (p *proc) pause() {
	p.t.Helper()
	p.signal(syscall.SIGSTOP)
	pid := p.cmd.Process.Pid
	testkit.Until(p.t, fmt.Sprintf("every thread of pid %d to stop", pid), func() bool {
		select {
		case <-p.done:
			p.t.Fatalf("pid %d exited instead of stopping:\n%s", pid, p.logs())
		default:
		}
		stopped, err := testkit.ThreadsStopped(pid)
		if err != nil {
			p.t.Fatalf("pid %d: %v\n%s", pid, err, p.logs())
		}
		return stopped
	})
}

// dial connects to the process and waits until its health check is SERVING.
func (p *proc) dial(ctx context.Context) *grpc.ClientConn {
	p.t.Helper()
	conn, err := grpc.NewClient(p.addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		p.t.Fatal(err)
	}
	p.t.Cleanup(func() { conn.Close() })
	h := healthpb.NewHealthClient(conn)
	w, err := h.Watch(ctx, &healthpb.HealthCheckRequest{}, grpc.WaitForReady(true))
	if err != nil {
		p.t.Fatalf("health watch %s: %v", p.addr, err)
	}
	for {
		m, err := w.Recv()
		if err != nil {
			p.t.Fatalf("health watch %s: %v\n%s", p.addr, err, p.logs())
		}
		if m.Status == healthpb.HealthCheckResponse_SERVING {
			return conn
		}
	}
}

func needLinux(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("process signal tests need Linux")
	}
}
