package e2e

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	walshipv1 "github.com/walship/walship/gen/walship/v1"
	"github.com/walship/walship/internal/testkit"
	"github.com/walship/walship/pkg/client"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/types/known/durationpb"
)

// The automatic failover tests without Kubernetes (issue #37): the
// failover cluster's processes with `--auto-failover`, the election held
// on its three log stores, shipped defaults but for the hold-down where a
// test fails over more than once.

// startAutoCluster starts the failover cluster with --auto-failover on
// every data node, and extra flags.
func startAutoCluster(t *testing.T, extra ...string) *failoverCluster {
	t.Helper()
	c := newFailoverCluster(t, func(i int) string { return fmt.Sprintf("n%d", i) })
	for _, n := range c.nodes {
		n.args = append(n.args, append([]string{"--auto-failover"}, extra...)...)
	}
	c.start(t)
	return c
}

// withoutFlags drops each of flags, and its value, from args.
func withoutFlags(args []string, flags ...string) []string {
	var out []string
	for i := 0; i < len(args); i++ {
		if slices.Contains(flags, args[i]) {
			i++
			continue
		}
		out = append(out, args[i])
	}
	return out
}

// logstoreAddrs are the cluster's log store addresses, comma-separated.
func (c *failoverCluster) logstoreAddrs() string {
	var out []string
	for _, n := range c.logstores {
		out = append(out, n.addr)
	}
	return strings.Join(out, ",")
}

// primaryOf returns the data node that is the primary and takes writes,
// and its epoch (nil if none does).
func (c *failoverCluster) primaryOf(ctx context.Context, t *testing.T) (*procNode, uint64) {
	for _, n := range c.nodes {
		if n.p == nil {
			continue
		}
		select {
		case <-n.p.done:
			continue // killed
		default:
		}
		cctx, cancel := context.WithTimeout(ctx, time.Second)
		st, err := walshipv1.NewAdminServiceClient(conn(t, n.addr)).Status(cctx, &walshipv1.StatusRequest{})
		cancel()
		if err == nil && st.GetRole() == walshipv1.Role_ROLE_PRIMARY && st.GetTakingWrites() {
			return n, st.GetEpoch()
		}
	}
	return nil, 0
}

// exactlyOnePrimary fails the test unless exactly one live data node is
// a primary (taking writes or not), and no live node has promised an
// epoch beyond epoch: a second winner of the same death would be one or
// the other.
func (c *failoverCluster) exactlyOnePrimary(ctx context.Context, t *testing.T, epoch uint64) {
	t.Helper()
	var primaries []string
	for _, n := range c.nodes {
		select {
		case <-n.p.done:
			continue // killed
		default:
		}
		st := nodeStatusOf(t, ctx, n.addr)
		if st.GetRole() == walshipv1.Role_ROLE_PRIMARY {
			primaries = append(primaries, fmt.Sprintf("%s (epoch %d)", n.name, st.GetEpoch()))
		}
		if st.GetVoteEpoch() > epoch {
			t.Fatalf("%s promised epoch %d beyond the primary's %d: a second election after one death", n.name, st.GetVoteEpoch(), epoch)
		}
	}
	if len(primaries) != 1 {
		t.Fatalf("primaries %v in epoch %d: want exactly one", primaries, epoch)
	}
}

// TestAutoFailoverKill9Repeated: under checked sync load, the primary is
// killed (kill -9) three times; each time a replica promotes itself with
// no command, exactly one epoch opens per death (both replicas see it;
// one wins), the first write after it is acknowledged, the killed node
// restarted rejoins as a replica, and in the end the history is
// linearizable, every acknowledged write is read back and every node has
// one state digest.
func TestAutoFailoverKill9Repeated(t *testing.T) {
	needLinux(t)
	c := startAutoCluster(t, "--failover-holddown", "1s")
	cl, err := client.New(c.addrs(), client.Options{Retry: 20 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cl.Close() })
	ctx, cancel := context.WithTimeout(t.Context(), 4*time.Minute)
	defer cancel()
	firstAck(t, ctx, cl, "auto/warm")
	_, first := c.primaryOf(ctx, t)
	h, finish := runChecked(t, ctx, cl, "auto/", 20*time.Second)
	for round := range 3 {
		<-time.After(1500 * time.Millisecond)
		old, epoch := c.primaryOf(ctx, t)
		if old == nil {
			t.Fatalf("round %d: no primary takes writes", round)
		}
		h.Note("kill -9 %s (the primary of epoch %d)", old.name, epoch)
		killed := time.Now()
		old.p.kill()
		firstAck(t, ctx, cl, fmt.Sprintf("auto/first-after-%d", round))
		t.Logf("round %d: kill -9 %s to the first acknowledged sync write: %v", round, old.name, time.Since(killed))
		var next *procNode
		var now uint64
		testkit.UntilWithin(t, 30*time.Second, "a new primary", func() bool { next, now = c.primaryOf(ctx, t); return next != nil })
		// Both replicas saw the death and were eligible; exactly one won:
		// one epoch opened, one node is the primary, and the other has
		// promised no epoch beyond it (it follows the winner).
		if now != epoch+1 {
			t.Fatalf("round %d: epoch %d after the death of %s in epoch %d: want exactly one new epoch", round, now, old.name, epoch)
		}
		c.exactlyOnePrimary(ctx, t, now)
		h.Note("%s promoted itself to epoch %d", next.name, now)
		old.serving = "replica serving"
		old.start()
	}
	finish()
	p, last := c.primaryOf(ctx, t)
	if last != first+3 {
		t.Fatalf("epoch %d after three deaths from epoch %d: want one epoch per death", last, first)
	}
	c.exactlyOnePrimary(ctx, t, last)
	var rest []string
	for _, n := range c.nodes {
		if n != p {
			rest = append(rest, n.addr)
		}
	}
	converge(t, ctx, p.addr, rest...)
}

// TestAutoFailoverReplicaCutFromThePrimary: the replicas lose their
// streams to the primary (it advertises a proxy, then cut), while the
// primary keeps renewing the election at the log stores: each replica
// says the primary is alive and does not contend, and no new epoch opens.
func TestAutoFailoverReplicaCutFromThePrimary(t *testing.T) {
	needLinux(t)
	c := newFailoverCluster(t, func(i int) string { return fmt.Sprintf("n%d", i) })
	proxy := startTCPProxy(t, c.nodes[0].addr)
	for _, n := range c.nodes {
		n.args = append(n.args, "--auto-failover")
		// Every node knows n0 by the proxy's address, n0 too (it
		// advertises it), so the replicas reach it only through the proxy.
		for i, a := range n.args {
			switch a {
			case "--primary":
				n.args[i+1] = proxy.addr
			case "--peers":
				n.args[i+1] = strings.Replace(n.args[i+1], "n0="+c.nodes[0].addr, "n0="+proxy.addr, 1)
			}
		}
	}
	c.start(t)
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	testkit.UntilWithin(t, 30*time.Second, "n0 to take writes", func() bool { p, _ := c.primaryOf(ctx, t); return p == c.nodes[0] })
	admin2 := walshipv1.NewAdminServiceClient(conn(t, c.nodes[2].addr))
	testkit.UntilWithin(t, 30*time.Second, "n2 to follow n0", func() bool {
		st, err := admin2.Status(ctx, &walshipv1.StatusRequest{})
		return err == nil && st.GetEpoch() > 0 && len(st.GetPeers()) > 0 && st.GetPeers()[0].GetConnected()
	})
	_, epoch := c.primaryOf(ctx, t)
	proxy.setCut(true)
	admin1 := walshipv1.NewAdminServiceClient(conn(t, c.nodes[1].addr))
	var last *walshipv1.StatusResponse
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("n2's last status: %v", last)
		}
	})
	testkit.UntilWithin(t, 30*time.Second, "n2 to lose its stream and see the primary alive at the log stores", func() bool {
		st, err := admin2.Status(ctx, &walshipv1.StatusRequest{})
		last = st
		return err == nil && (len(st.GetPeers()) == 0 || !st.GetPeers()[0].GetConnected()) &&
			strings.Contains(st.GetElection().GetContend(), "the primary n0 is alive")
	})
	// Nothing to wait for but the absence of a promotion: five election
	// leases with n2 cut off.
	<-time.After(5 * time.Second)
	st, err := admin2.Status(ctx, &walshipv1.StatusRequest{})
	if err != nil {
		t.Fatal(err)
	}
	st1, err := admin1.Status(ctx, &walshipv1.StatusRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if p, now := c.primaryOf(ctx, t); p != c.nodes[0] || now != epoch || st.GetRole() != walshipv1.Role_ROLE_REPLICA || st1.GetRole() != walshipv1.Role_ROLE_REPLICA {
		t.Fatalf("a replica cut from the primary only: primary %v in epoch %d (was n0 in %d), n2 %v; n2's election view %v", p, now, epoch, st.GetRole(), st.GetElection())
	}
	t.Logf("n2's election view: %v", st.GetElection())
}

// TestAutoFailoverPaused: with automatic failover paused (walship ctl
// failover pause, in the log stores), the primary's death promotes no
// one: every replica says so; resumed, one promotes itself and the pause
// state survived nothing but the log stores.
func TestAutoFailoverPaused(t *testing.T) {
	needLinux(t)
	c := startAutoCluster(t)
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	testkit.UntilWithin(t, 30*time.Second, "n0 to take writes", func() bool { p, _ := c.primaryOf(ctx, t); return p == c.nodes[0] })
	_, epoch := c.primaryOf(ctx, t)
	t.Logf("ctl failover pause:\n%s", ctl(t, "failover", "pause", "--logstores", c.logstoreAddrs()))
	c.nodes[0].p.kill()
	for _, n := range c.nodes[1:] {
		admin := walshipv1.NewAdminServiceClient(conn(t, n.addr))
		testkit.UntilWithin(t, 30*time.Second, n.name+" to say failover is paused", func() bool {
			st, err := admin.Status(ctx, &walshipv1.StatusRequest{})
			return err == nil && st.GetElection().GetPaused() && strings.Contains(st.GetElection().GetContend(), "paused")
		})
	}
	// Nothing to wait for but the absence of a promotion: five leases.
	<-time.After(5 * time.Second)
	if p, _ := c.primaryOf(ctx, t); p != nil {
		t.Fatalf("%s became the primary while automatic failover was paused", p.name)
	}
	out := ctl(t, "status", "--nodes", strings.Join(c.addrs()[1:], ","))
	if !strings.Contains(out, "ELECTION") || !strings.Contains(out, "paused") {
		t.Fatalf("ctl status shows no paused election:\n%s", out)
	}
	t.Logf("ctl status while paused:\n%s", out)
	t.Logf("ctl failover resume:\n%s", ctl(t, "failover", "resume", "--logstores", c.logstoreAddrs()))
	var next *procNode
	var now uint64
	testkit.UntilWithin(t, 30*time.Second, "a replica to promote itself once resumed", func() bool {
		next, now = c.primaryOf(ctx, t)
		return next != nil
	})
	if now != epoch+1 {
		t.Fatalf("epoch %d after the resume; want %d", now, epoch+1)
	}
}

// TestAutoFailoverSIGSTOP: the primary is paused (SIGSTOP) past its
// leases; a replica promotes itself; writes sent to the paused primary
// meanwhile are never acknowledged after SIGCONT, and it steps down.
func TestAutoFailoverSIGSTOP(t *testing.T) {
	needLinux(t)
	c := startAutoCluster(t)
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	testkit.UntilWithin(t, 30*time.Second, "n0 to take writes", func() bool { p, _ := c.primaryOf(ctx, t); return p == c.nodes[0] })
	kv0 := walshipv1.NewKVServiceClient(conn(t, c.nodes[0].addr))
	c.nodes[0].p.pause()
	results := make(chan error, 10)
	for i := range 10 {
		go func() {
			wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
			defer cancel()
			_, err := kv0.Put(wctx, &walshipv1.PutRequest{Key: fmt.Sprintf("paused/%d", i), Value: []byte("x")})
			results <- err
		}()
	}
	var next *procNode
	testkit.UntilWithin(t, 30*time.Second, "a replica to promote itself", func() bool {
		for _, n := range c.nodes[1:] {
			cctx, cancel := context.WithTimeout(ctx, time.Second)
			st, err := walshipv1.NewAdminServiceClient(conn(t, n.addr)).Status(cctx, &walshipv1.StatusRequest{})
			cancel()
			if err == nil && st.GetRole() == walshipv1.Role_ROLE_PRIMARY && st.GetTakingWrites() {
				next = n
				return true
			}
		}
		return false
	})
	kv := walshipv1.NewKVServiceClient(conn(t, next.addr))
	if _, err := kv.Put(ctx, &walshipv1.PutRequest{Key: "after", Value: []byte("y")}); err != nil {
		t.Fatal(err)
	}
	c.nodes[0].p.signal(syscall.SIGCONT)
	for range 10 {
		if err := <-results; err == nil {
			t.Fatal("the paused old primary acknowledged a write after another promoted itself")
		}
	}
	admin0 := walshipv1.NewAdminServiceClient(conn(t, c.nodes[0].addr))
	testkit.UntilWithin(t, 30*time.Second, "the old primary to step down", func() bool {
		st, err := admin0.Status(ctx, &walshipv1.StatusRequest{})
		return err == nil && st.GetRole() == walshipv1.Role_ROLE_REPLICA
	})
	for i := range 10 {
		g, err := kv.Get(ctx, &walshipv1.GetRequest{Key: fmt.Sprintf("paused/%d", i)})
		if err != nil || g.GetFound() {
			t.Fatalf("paused/%d on the new primary: %v, %v (never acknowledged)", i, g, err)
		}
	}
}

// TestMeasureAutoFailover measures, over WALSHIP_AUTOFAILOVER_RUNS
// cycles (skipped without it; docs/BENCHMARKS.md), kill -9 of the primary
// to the first sync write acknowledged, with automatic failover on the
// log stores at shipped defaults (the hold-down aside: cycles follow one
// another faster than it). Each cycle kills the current primary, waits
// for the first acknowledged write through a client of every node, and
// restarts the killed node, which rejoins as a replica and catches up.
// WALSHIP_AUTOFAILOVER_FLAGS adds flags to every data node.
func TestMeasureAutoFailover(t *testing.T) {
	runs := measureRuns(t, "WALSHIP_AUTOFAILOVER_RUNS", "automatic failover times")
	needLinux(t)
	c := newFailoverCluster(t, func(i int) string { return fmt.Sprintf("n%d", i) })
	for _, n := range c.nodes {
		// The shipped lease and heartbeat, not the failover cluster's.
		n.args = append(withoutFlags(n.args, "--lease-timeout", "--heartbeat-interval"), "--auto-failover", "--failover-holddown", "1s")
		// Tuning to compare with the defaults, e.g. "--lease-timeout 700ms".
		n.args = append(n.args, strings.Fields(os.Getenv("WALSHIP_AUTOFAILOVER_FLAGS"))...)
	}
	c.start(t)
	ctx, cancel := context.WithTimeout(t.Context(), time.Duration(runs)*time.Minute)
	defer cancel()
	cl, err := client.New(c.addrs(), client.Options{Retry: 30 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	var failovers []time.Duration
	for i := range runs {
		firstAck(t, ctx, cl, "m/warm")
		old, _ := c.primaryOf(ctx, t)
		if old == nil {
			t.Fatalf("run %d: no primary", i)
		}
		killed := time.Now()
		old.p.kill()
		firstAck(t, ctx, cl, "m/first")
		failovers = append(failovers, time.Since(killed))
		old.serving = "replica serving"
		old.start()
		p, _ := c.primaryOf(ctx, t)
		if p == nil {
			t.Fatalf("run %d: no primary after the failover", i)
		}
		st := nodeStatusOf(t, ctx, p.addr)
		// Where the time went, from the kill: the promotion's start (the
		// election won), the quorum's promises, the end of the lease wait,
		// the epoch record committed, and the client's first write.
		tl := st.GetLastFailover()
		at := func(unixNano int64) time.Duration { return time.Unix(0, unixNano).Sub(killed).Round(time.Millisecond) }
		t.Logf("run %d: %s to epoch %d: promotion started %v, fenced %v, lease waited %v, opened %v, first ack %v",
			i, p.name, tl.GetEpoch(), at(tl.GetStartedUnixNano()), at(tl.GetFencedUnixNano()), tl.GetLeaseWait().AsDuration().Round(time.Millisecond),
			at(tl.GetOpenedUnixNano()), failovers[len(failovers)-1].Round(time.Millisecond))
		for _, n := range c.nodes {
			if n == p {
				continue
			}
			if _, err := walshipv1.NewKVServiceClient(conn(t, n.addr)).Get(ctx, &walshipv1.GetRequest{Key: "m/x", MinLsn: st.GetVisibleLsn(),
				WaitTimeout: durationpb.New(time.Minute)}, grpc.WaitForReady(true)); err != nil {
				t.Fatalf("run %d: %s did not catch up: %v", i, n.name, err)
			}
		}
		// Past the hold-down, so that every replica may contend again.
		<-time.After(1100 * time.Millisecond)
	}
	fm, fx := medianMax(failovers)
	t.Logf("%d runs: automatic failover (kill -9 to the first acknowledged sync write) median %v, max %v", runs, fm.Round(time.Millisecond), fx.Round(time.Millisecond))
	t.Logf("failovers: %v", failovers)
	if os.Getenv("WALSHIP_AUTOFAILOVER_OUT") != "" {
		_ = os.WriteFile(os.Getenv("WALSHIP_AUTOFAILOVER_OUT"), []byte(fmt.Sprintf("median %v max %v runs %d\n%v\n", fm, fx, runs, failovers)), 0o644)
	}
}

// TestAutoFailoverFlapping: no more than one epoch per real failure, with
// nodes that flap under checked sync load and shipped election settings.
//
//  1. A replica stopped (SIGSTOP) past the election's lease and its
//     stream's timeout, resumed, four times: it loses its stream to the
//     primary each time, but the log stores hear the primary renew, so
//     no epoch opens.
//  2. The primary stopped for 200 ms, a fifth of its lease, five times:
//     it renews again before any log store frees the election, so it
//     stays the primary and no epoch opens.
//  3. The primary killed (kill -9) while a replica flaps: exactly one new
//     epoch, one primary; the killed node restarted rejoins it.
//
// The history is linearizable, every acknowledged write is read back and
// every node ends with one state digest.
func TestAutoFailoverFlapping(t *testing.T) {
	needLinux(t)
	if testing.Short() {
		t.Skip("skipping the flapping nodes test in -short mode")
	}
	c := startAutoCluster(t)
	n0, n1, n2 := c.nodes[0], c.nodes[1], c.nodes[2]
	cl, err := client.New(c.addrs(), client.Options{Retry: 30 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cl.Close() })
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	firstAck(t, ctx, cl, "flap/warm")
	p, epoch := c.primaryOf(ctx, t)
	if p != n0 {
		t.Fatalf("%v is the primary; want n0", p)
	}
	// steady fails the test unless n0 is still the primary of epoch, with
	// no node promised a newer one.
	steady := func(what string) {
		t.Helper()
		testkit.UntilWithin(t, 30*time.Second, "n0 to take writes after "+what, func() bool { p, _ := c.primaryOf(ctx, t); return p == n0 })
		if _, now := c.primaryOf(ctx, t); now != epoch {
			t.Fatalf("after %s: epoch %d, was %d; the primary never failed", what, now, epoch)
		}
		c.exactlyOnePrimary(ctx, t, epoch)
	}
	h, finish := runChecked(t, ctx, cl, "flap/", 20*time.Second)

	h.Note("n2 flaps: stopped 1.5 s, resumed, four times")
	for range 4 {
		n2.p.pause()
		<-time.After(1500 * time.Millisecond)
		n2.p.signal(syscall.SIGCONT)
		<-time.After(300 * time.Millisecond)
	}
	steady("a flapping replica")
	// Why the flapping replica does not contend: the log stores say the
	// primary is alive, whatever its own stream said while it was stopped.
	admin2 := walshipv1.NewAdminServiceClient(conn(t, n2.addr))
	testkit.UntilWithin(t, 30*time.Second, "n2 to say the primary is alive", func() bool {
		st, err := admin2.Status(ctx, &walshipv1.StatusRequest{})
		return err == nil && strings.Contains(st.GetElection().GetContend(), "the primary n0 is alive")
	})

	h.Note("n0 (the primary) flaps: stopped 200 ms, resumed, five times")
	for range 5 {
		n0.p.pause()
		<-time.After(200 * time.Millisecond)
		n0.p.signal(syscall.SIGCONT)
		<-time.After(300 * time.Millisecond)
	}
	steady("a primary stopped for less than its lease")

	h.Note("n1 flaps (stopped 400 ms, resumed 400 ms) while n0 is killed")
	stopFlap, flapped := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(flapped)
		pid := n1.p.cmd.Process.Pid
		defer func() { _ = syscall.Kill(pid, syscall.SIGCONT) }()
		for {
			_ = syscall.Kill(pid, syscall.SIGSTOP)
			select {
			case <-stopFlap:
				return
			case <-time.After(400 * time.Millisecond):
			}
			_ = syscall.Kill(pid, syscall.SIGCONT)
			select {
			case <-stopFlap:
				return
			case <-time.After(400 * time.Millisecond):
			}
		}
	}()
	t.Cleanup(func() {
		select {
		case <-stopFlap:
		default:
			close(stopFlap)
		}
		<-flapped
	})
	n0.p.kill()
	var next *procNode
	var now uint64
	testkit.UntilWithin(t, 60*time.Second, "a new primary", func() bool { next, now = c.primaryOf(ctx, t); return next != nil })
	close(stopFlap)
	<-flapped
	if now != epoch+1 {
		t.Fatalf("epoch %d after the death of n0 in epoch %d amid flapping: want exactly one new epoch", now, epoch)
	}
	c.exactlyOnePrimary(ctx, t, now)
	h.Note("%s promoted itself to epoch %d; n1 stops flapping", next.name, now)
	n0.serving = "replica serving"
	n0.start()
	finish()
	var rest []string
	for _, n := range c.nodes {
		if n != next {
			rest = append(rest, n.addr)
		}
	}
	converge(t, ctx, next.addr, rest...)
	if p, last := c.primaryOf(ctx, t); p != next || last != epoch+1 {
		t.Fatalf("in the end %v is the primary of epoch %d; want %s of epoch %d: one epoch for one failure", p, last, next.name, epoch+1)
	}
	c.exactlyOnePrimary(ctx, t, epoch+1)
}

// TestCheckFailoverAutoKill runs the users' own check of the same case:
// `walship check failover --fault kill --auto-failover` kills the primary
// with its --kill-command (kill -9), promotes no one, waits for a replica
// to promote itself, and reads its workload's history back: it must pass
// (linearizable, nothing acknowledged lost) and say who took over.
func TestCheckFailoverAutoKill(t *testing.T) {
	needLinux(t)
	c := startAutoCluster(t)
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	var p *procNode
	var epoch uint64
	testkit.UntilWithin(t, 30*time.Second, "a primary to take writes", func() bool { p, epoch = c.primaryOf(ctx, t); return p != nil })
	kill := fmt.Sprintf("kill -9 %d", p.p.cmd.Process.Pid)
	cmd := exec.CommandContext(ctx, walshipBin(t), "check", "failover", "--nodes", strings.Join(c.addrs(), ","),
		"--fault", "kill", "--auto-failover", "--kill-command", kill, "--duration", "8s", "--rate", "300", "--prefix", "check-auto/")
	out, err := cmd.CombinedOutput()
	if err != nil || !strings.Contains(string(out), "promoted itself to epoch") || !strings.Contains(string(out), "\nlinearizable: ") {
		t.Fatalf("walship check failover --fault kill --auto-failover: %v\n%s", err, out)
	}
	select {
	case <-p.p.done:
	default:
		t.Fatalf("%s (pid %d) still runs after the check's %q", p.name, p.p.cmd.Process.Pid, kill)
	}
	next, now := c.primaryOf(ctx, t)
	if next == nil || next == p || now != epoch+1 {
		t.Fatalf("after the check: primary %v in epoch %d, want another node in epoch %d", next, now, epoch+1)
	}
	t.Logf("%s", out)
}
