package hostile

import (
	"bufio"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"os/signal"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/walship/walship/internal/tlsid"
)

// attackerEnv is how a test tells its attacker process what to attack:
// the attack, the address, the certificates.
const attackerEnv = "WALSHIP_HOSTILE_ATTACKER"

type attackerSpec struct {
	Attack string
	Addr   string
	Certs  map[string]tlsid.Files
}

// TestAttackerProcess is not a test: it is the attacker process that
// startAttacker runs (this test binary again, with attackerEnv set). It
// prints "ready" once the attack's load is in place and attacks until
// it is signalled.
func TestAttackerProcess(t *testing.T) {
	raw := os.Getenv(attackerEnv)
	if raw == "" {
		t.Skip("the attacker process of TestHostileClients and BenchmarkWellBehavedClient")
	}
	var spec attackerSpec
	if err := json.Unmarshal([]byte(raw), &spec); err != nil {
		t.Fatal(err)
	}
	var a *attack
	for i := range attacks {
		if attacks[i].name == spec.Attack {
			a = &attacks[i]
		}
	}
	if a == nil {
		t.Fatalf("no attack %q", spec.Attack)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	e := &env{tb: t, certs: spec.Certs}
	a.run(ctx, e, spec.Addr, func() { os.Stdout.WriteString("ready\n") })
}

// attacker is a running attacker process.
type attacker struct {
	cmd   *exec.Cmd
	ready chan struct{} // closed when it says its load is in place
	done  chan struct{} // closed when it has exited
	out   strings.Builder
}

// startAttacker runs attack a against addr in a process of its own.
func startAttacker(tb testing.TB, a *attack, addr string, e *env) *attacker {
	tb.Helper()
	spec, err := json.Marshal(attackerSpec{Attack: a.name, Addr: addr, Certs: e.certs})
	if err != nil {
		tb.Fatal(err)
	}
	cmd := exec.Command(os.Args[0], "-test.run", "^TestAttackerProcess$", "-test.v", "-test.timeout", "0")
	cmd.Env = append(os.Environ(), attackerEnv+"="+string(spec))
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		tb.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		tb.Fatal(err)
	}
	// The lowest CPU priority: the attacker takes the CPU the cluster and
	// the well-behaved client leave idle, as one on a machine of its own
	// would (this machine has two cores for all of them), and still
	// loads the servers as hard as they answer it.
	if err := syscall.Setpriority(syscall.PRIO_PROCESS, cmd.Process.Pid, 19); err != nil {
		tb.Logf("nice the attacker: %v", err)
	}
	at := &attacker{cmd: cmd, ready: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(at.done)
		sc := bufio.NewScanner(stdout)
		ready := false
		for sc.Scan() {
			line := sc.Text()
			if line == "ready" && !ready {
				ready = true
				close(at.ready)
				continue
			}
			if at.out.Len() < 64<<10 {
				at.out.WriteString(line + "\n")
			}
		}
		_ = cmd.Wait()
	}()
	tb.Cleanup(at.stop)
	return at
}

// stop ends the attack (SIGTERM, then SIGKILL after 10 s) and waits for
// the process to exit.
func (at *attacker) stop() {
	select {
	case <-at.done:
		return
	default:
	}
	_ = at.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-at.done:
	case <-time.After(10 * time.Second):
		_ = at.cmd.Process.Kill()
		<-at.done
	}
}
