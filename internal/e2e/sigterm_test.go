package e2e

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	walshipv1 "github.com/walship/walship/gen/walship/v1"
	"github.com/walship/walship/internal/testkit"
	"github.com/walship/walship/pkg/client"
)

// TestSIGTERMSwitchesOver: on bare metal (no --kube-lease), SIGTERM of the
// primary under load, async writes included, hands its role to the most
// advanced replica before the process exits: the process exits cleanly, a
// replica is the primary and takes writes, and every acknowledged write is
// on it. With --switchover-on-stop=false the primary stops at once and
// leaves no primary.
func TestSIGTERMSwitchesOver(t *testing.T) {
	needLinux(t)
	c := startFailoverCluster(t)
	ctx, load := loadBeforeSIGTERM(t, c)
	ackedSoFar := load.count

	began := time.Now()
	c.nodes[0].p.stop() // SIGTERM; fails the test unless it exits cleanly
	stopped := time.Since(began)
	logs := c.nodes[0].p.logs()
	if !strings.Contains(logs, "switched over before stopping") {
		t.Fatalf("the primary did not switch over before it stopped:\n%s", logs)
	}
	// The hand-over happened before the exit: a replica is the primary now.
	var newPrim *procNode
	for _, n := range c.nodes[1:] {
		if st := nodeStatusOf(t, ctx, n.addr); st.GetRole() == walshipv1.Role_ROLE_PRIMARY {
			newPrim = n
		}
	}
	if newPrim == nil {
		t.Fatalf("no replica is the primary once the old one exited")
	}
	at := ackedSoFar()
	testkit.UntilWithin(t, time.Minute, "50 writes on the new primary", func() bool { return ackedSoFar() >= at+50 })
	acked, pause := load.stop()
	t.Logf("SIGTERM to exit %v; %s took over; %d writes acknowledged (half async); longest gap between acknowledgements %v",
		stopped.Round(time.Millisecond), newPrim.name, len(acked), pause.Round(time.Millisecond))
	checkAcked(t, ctx, acked, newPrim.addr, newPrim.name)

	// --switchover-on-stop=false: n0 comes back, takes the role back by
	// a switchover, and stops at once when told to.
	c.nodes[0].args = append(c.nodes[0].args, "--switchover-on-stop=false")
	c.nodes[0].serving = "replica serving"
	c.nodes[0].start()
	converge(t, ctx, newPrim.addr, c.nodes[0].addr)
	t.Logf("ctl switchover:\n%s", ctl(t, "switchover", "--primary", newPrim.addr, "--target", "n0", "--timeout", "30s"))
	epoch := nodeStatusOf(t, ctx, c.nodes[0].addr).GetEpoch()
	c.nodes[0].p.stop()
	if logs := c.nodes[0].p.logs(); strings.Contains(logs, "switching over first") {
		t.Fatalf("--switchover-on-stop=false, and the primary switched over:\n%s", logs)
	}
	for _, n := range c.nodes[1:] {
		if st := nodeStatusOf(t, ctx, n.addr); st.GetRole() != walshipv1.Role_ROLE_REPLICA || st.GetVoteEpoch() != epoch {
			t.Fatalf("%s after the primary stopped without a switchover: %v in vote epoch %d; want a replica of epoch %d", n.name, st.GetRole(), st.GetVoteEpoch(), epoch)
		}
	}
}

// loadBeforeSIGTERM runs the alternating load on c through a client that
// follows the primary, until the test ends (or 3 minutes), and returns
// once 50 writes are acknowledged, with the load's context.
func loadBeforeSIGTERM(t *testing.T, c *failoverCluster) (context.Context, *alternatingLoad) {
	t.Helper()
	cl, err := client.New(c.addrs(), client.Options{Retry: 30 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cl.Close() })
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	t.Cleanup(cancel)
	load := startAlternatingLoad(ctx, cl)
	testkit.UntilWithin(t, time.Minute, "50 writes before the SIGTERM", func() bool { return load.count() >= 50 })
	return ctx, load
}

// alternatingLoad writes keys term/0, term/1, … one after another through
// a client that follows the primary, every other one async (the others
// under the cluster's contract), recording those acknowledged and the
// gaps between acknowledgements.
type alternatingLoad struct {
	stopLoad context.CancelFunc
	done     chan struct{}
	mu       sync.Mutex
	acked    []string
	pause    time.Duration // the longest gap between acknowledgements
}

func startAlternatingLoad(ctx context.Context, cl *client.Client) *alternatingLoad {
	async := &walshipv1.CommitPolicy{Durability: walshipv1.Durability_DURABILITY_ASYNC,
		Replication: walshipv1.ReplicationMode_REPLICATION_MODE_ASYNC, Logstore: walshipv1.LogStoreAck_LOG_STORE_ACK_ASYNC}
	wctx, stop := context.WithCancel(ctx)
	l := &alternatingLoad{stopLoad: stop, done: make(chan struct{})}
	go func() {
		defer close(l.done)
		prev := time.Now()
		for i := 0; wctx.Err() == nil; i++ {
			key := fmt.Sprintf("term/%d", i)
			pol := async
			if i%2 == 1 {
				pol = nil // the cluster's contract
			}
			if _, err := cl.Put(wctx, key, []byte("v"), pol); err == nil {
				l.mu.Lock()
				l.acked = append(l.acked, key)
				l.pause = max(l.pause, time.Since(prev))
				l.mu.Unlock()
				prev = time.Now()
			}
		}
	}()
	return l
}

// count is how many writes were acknowledged so far.
func (l *alternatingLoad) count() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.acked)
}

// stop ends the load and returns the keys acknowledged and the longest
// gap between acknowledgements.
func (l *alternatingLoad) stop() ([]string, time.Duration) {
	l.stopLoad()
	<-l.done
	return l.acked, l.pause
}

// checkAcked fails t unless every key in acked is on the node at addr.
func checkAcked(t *testing.T, ctx context.Context, acked []string, addr, name string) {
	t.Helper()
	kv := walshipv1.NewKVServiceClient(conn(t, addr))
	for _, k := range acked {
		r, err := kv.Get(ctx, &walshipv1.GetRequest{Key: k})
		if err != nil || !r.GetFound() {
			t.Fatalf("%s was acknowledged but is not on the new primary %s: %v", k, name, err)
		}
	}
}

// TestSIGTERMSwitchoverDelay: with --switchover-delay a primary told to
// stop keeps taking writes for the delay (its pod has left the Services
// on Kubernetes; its clients' open connections still reach it), then
// switches over as without it, and nothing acknowledged is lost.
func TestSIGTERMSwitchoverDelay(t *testing.T) {
	needLinux(t)
	c := newFailoverCluster(t, func(i int) string { return fmt.Sprintf("n%d", i) })
	c.nodes[0].args = append(c.nodes[0].args, "--switchover-delay", "2s")
	c.start(t)
	ctx, load := loadBeforeSIGTERM(t, c)
	if err := c.nodes[0].p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	testkit.UntilWithin(t, time.Minute, "the primary to log its delay", func() bool {
		return strings.Contains(c.nodes[0].p.logs(), "taking writes for --switchover-delay")
	})
	// Within the delay, the old primary still takes writes.
	at := load.count()
	testkit.UntilWithin(t, time.Minute, "20 writes after the SIGTERM", func() bool { return load.count() >= at+20 })
	if logs := c.nodes[0].p.logs(); strings.Contains(logs, "switching over first") {
		t.Fatalf("the primary switched over before its writes after the SIGTERM were acknowledged:\n%s", logs)
	}
	<-c.nodes[0].p.done
	if logs := c.nodes[0].p.logs(); !strings.Contains(logs, "switched over before stopping") {
		t.Fatalf("the primary did not switch over after its delay:\n%s", logs)
	}
	var newPrim *procNode
	testkit.UntilWithin(t, time.Minute, "a replica to be the primary", func() bool {
		for _, n := range c.nodes[1:] {
			if st := nodeStatusOf(t, ctx, n.addr); st.GetRole() == walshipv1.Role_ROLE_PRIMARY && st.GetTakingWrites() {
				newPrim = n
				return true
			}
		}
		return false
	})
	at = load.count()
	testkit.UntilWithin(t, time.Minute, "20 writes on the new primary", func() bool { return load.count() >= at+20 })
	acked, pause := load.stop()
	t.Logf("%s took over; %d writes acknowledged; longest gap %v", newPrim.name, len(acked), pause.Round(time.Millisecond))
	checkAcked(t, ctx, acked, newPrim.addr, newPrim.name)
}

// TestSIGTERMLingersAfterSwitchover: with --switchover-delay a primary
// that switched over and stopped keeps its process up for the delay again,
// its port refusing connections. On Kubernetes its terminating pod is
// walship-rw's only endpoint until kube-proxy applies the new primary's,
// up to a minSyncPeriod after the hand-over: the connections kube-proxy
// sends it meanwhile are refused, and their clients dial again at once,
// instead of going unanswered, once its pod's network is gone, until the
// client's connect timeout.
func TestSIGTERMLingersAfterSwitchover(t *testing.T) {
	needLinux(t)
	c := newFailoverCluster(t, func(i int) string { return fmt.Sprintf("n%d", i) })
	// Long enough that the check below runs within the linger on a busy
	// machine: the delay is waited twice, before and after the hand-over.
	c.nodes[0].args = append(c.nodes[0].args, "--switchover-delay", "5s")
	c.start(t)
	_, load := loadBeforeSIGTERM(t, c)
	old := c.nodes[0].p
	if err := old.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	exited := func() bool {
		select {
		case <-old.done:
			return true
		default:
			return false
		}
	}
	testkit.UntilWithin(t, time.Minute, "the stopped primary to linger", func() bool {
		if logs := old.logs(); strings.Contains(logs, "keeping the process up") {
			return true
		} else if exited() {
			t.Fatalf("the primary exited without lingering after its stop:\n%s", logs)
		}
		return false
	})
	if logs := old.logs(); !strings.Contains(logs, "switched over before stopping") {
		t.Fatalf("the primary lingered without switching over first:\n%s", logs)
	}
	conn, err := net.Dial("tcp", c.nodes[0].addr)
	if err == nil {
		conn.Close()
		t.Fatalf("%s accepted a connection after it stopped serving", c.nodes[0].addr)
	}
	if !errors.Is(err, syscall.ECONNREFUSED) {
		t.Fatalf("a dial of the stopped primary: %v, want connection refused", err)
	}
	if exited() {
		t.Fatalf("the primary exited within its linger (the check came too late on this machine?):\n%s", old.logs())
	}
	<-old.done
	acked, pause := load.stop()
	t.Logf("%d writes acknowledged; longest gap %v", len(acked), pause.Round(time.Millisecond))
}
