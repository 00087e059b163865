package e2e

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	walshipv1 "github.com/walship/walship/gen/walship/v1"
	"github.com/walship/walship/internal/check"
	"github.com/walship/walship/internal/testkit"
	"github.com/walship/walship/pkg/client"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
)

// failoverCluster is three log stores and three data nodes as processes,
// under the contract the failover issue names: K=1 at flush plus a log
// store majority.
type failoverCluster struct {
	logstores []*procNode
	nodes     []*procNode // n0 starts as the primary
}

func startFailoverCluster(t *testing.T) *failoverCluster {
	t.Helper()
	c := newFailoverCluster(t, func(i int) string { return fmt.Sprintf("n%d", i) })
	c.start(t)
	return c
}

// newFailoverCluster lays the failover cluster out (addresses, data
// directories, flags) with its data nodes named by name, without starting it.
func newFailoverCluster(t *testing.T, name func(int) string) *failoverCluster {
	t.Helper()
	dir := t.TempDir()
	c := &failoverCluster{}
	var lsAddrs []string
	for range 3 {
		lsAddrs = append(lsAddrs, testkit.FreeAddr(t))
	}
	for i, addr := range lsAddrs {
		// Every log store gets the whole list as its peers, itself
		// included, as the Kubernetes manifests give it.
		c.logstores = append(c.logstores, &procNode{name: fmt.Sprintf("ls%d", i), serving: "log store serving", addr: addr, args: []string{"logstore",
			"--listen", addr, "--metrics-listen", "", "--data-dir", filepath.Join(dir, fmt.Sprintf("ls%d", i)), "--peers", strings.Join(lsAddrs, ",")}})
	}
	var peers []string
	for i := range 3 {
		addr := testkit.FreeAddr(t)
		peers = append(peers, fmt.Sprintf("%s=%s", name(i), addr))
		c.nodes = append(c.nodes, &procNode{name: name(i), addr: addr})
	}
	for i, n := range c.nodes {
		cmd, serving := "replica", "replica serving"
		if i == 0 {
			cmd, serving = "primary", "primary serving"
		}
		n.serving = serving
		n.args = []string{cmd, "--id", n.name, "--listen", n.addr, "--metrics-listen", "", "--data-dir", filepath.Join(dir, n.name),
			"--peers", strings.Join(peers, ","), "--logstore", strings.Join(lsAddrs, ","), "--primary", c.nodes[0].addr,
			"--durability", "sync", "--replication", "sync", "--sync-replicas", "1", "--sync-level", "flush", "--logstore-ack", "sync",
			"--sync-timeout", "3s", "--heartbeat-interval", "100ms", "--lease-timeout", "500ms"}
	}
	return c
}

// start starts every process of the cluster.
func (c *failoverCluster) start(t *testing.T) {
	t.Helper()
	for _, n := range append(append([]*procNode{}, c.logstores...), c.nodes...) {
		n.t = t
		n.start()
	}
}

func (c *failoverCluster) addrs() []string {
	var out []string
	for _, n := range c.nodes {
		out = append(out, n.addr)
	}
	return out
}

// ctl runs `walship ctl args...` and returns its output.
func ctl(t *testing.T, args ...string) string {
	t.Helper()
	out, err := exec.Command(walshipBin(t), append([]string{"ctl"}, args...)...).CombinedOutput()
	if err != nil {
		t.Fatalf("walship ctl %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

// TestFailoverKill9: under load checked for linearizability, kill -9 the
// primary and promote a replica at once with `walship ctl promote`: every
// write acknowledged under the contract is on the new primary (the read
// back at the end and the checker prove it), the history stays
// linearizable across the failover, the old primary restarted rejoins as
// a replica, and all three data nodes converge on one state digest.
func TestFailoverKill9(t *testing.T) {
	needLinux(t)
	c, cl, ctx, h, finish := failoverUnderLoad(t, "failover/")
	// 1.5 s of load, then the kill.
	<-time.After(1500 * time.Millisecond)
	h.Note("kill -9 n0 (the primary)")
	killed := time.Now()
	c.nodes[0].p.kill()
	out := ctl(t, "promote", "--node", c.nodes[1].addr, "--wait", "30s")
	t.Logf("ctl promote:\n%s", out)
	h.Note("n1 promoted")
	// The first write the new primary acknowledges under the contract.
	if _, err := cl.Put(ctx, "failover/first-after", []byte("x"), nil); err != nil {
		t.Fatal(err)
	}
	t.Logf("failover time (kill -9 to the first acknowledged sync write on n1): %v", time.Since(killed))
	finish()
	// The old primary comes back and rejoins.
	c.nodes[0].serving = "replica serving"
	c.nodes[0].start()
	converge(t, ctx, c.nodes[1].addr, c.nodes[0].addr, c.nodes[2].addr)
}

// converge waits until every replica has applied what the primary at
// primaryAddr has made visible, then checks that each is a replica of the
// primary's epoch with the primary's state digest. It returns each
// replica's Status.
func converge(t *testing.T, ctx context.Context, primaryAddr string, replicas ...string) map[string]*walshipv1.StatusResponse {
	t.Helper()
	p, err := walshipv1.NewAdminServiceClient(conn(t, primaryAddr)).Status(ctx, &walshipv1.StatusRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if p.Role != walshipv1.Role_ROLE_PRIMARY {
		t.Fatalf("%s is %v, not the primary", primaryAddr, p.Role)
	}
	out := map[string]*walshipv1.StatusResponse{}
	for _, addr := range replicas {
		kv := walshipv1.NewKVServiceClient(conn(t, addr))
		if _, err := kv.Get(ctx, &walshipv1.GetRequest{Key: "-", MinLsn: p.VisibleLsn, WaitTimeout: durationpb.New(time.Minute)}, grpc.WaitForReady(true)); err != nil {
			t.Fatalf("%s never applied LSN %d: %v", addr, p.VisibleLsn, err)
		}
		st, err := walshipv1.NewAdminServiceClient(conn(t, addr)).Status(ctx, &walshipv1.StatusRequest{})
		if err != nil {
			t.Fatal(err)
		}
		if st.Role != walshipv1.Role_ROLE_REPLICA || st.Epoch != p.Epoch || st.VisibleLsn != p.VisibleLsn || st.StateDigest != p.StateDigest {
			t.Fatalf("%s (%s): role %v in epoch %d at LSN %d digest %s; the primary in epoch %d at %d, %s",
				st.Id, addr, st.Role, st.Epoch, st.VisibleLsn, st.StateDigest, p.Epoch, p.VisibleLsn, p.StateDigest)
		}
		if len(st.Orphans) > 0 {
			t.Logf("%s keeps %d orphan file(s): %v", st.Id, len(st.Orphans), st.Orphans)
		}
		out[addr] = st
	}
	return out
}

// TestFailoverSIGSTOP: the primary is paused (SIGSTOP) past its lease, a
// replica is promoted, and writes — async and sync — are sent to the
// paused primary meanwhile. After SIGCONT it acknowledges none of them:
// its lease ran out while it was stopped, and the log stores refuse its
// epoch, so it steps down and rejoins as a replica.
func TestFailoverSIGSTOP(t *testing.T) {
	needLinux(t)
	c := startFailoverCluster(t)
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	kv0 := walshipv1.NewKVServiceClient(conn(t, c.nodes[0].addr))
	// Once the primary has opened its epoch (its epoch record met the contract).
	testkit.Until(t, "the primary to take a write", func() bool {
		_, err := kv0.Put(ctx, &walshipv1.PutRequest{Key: "before", Value: []byte("x")}, grpc.WaitForReady(true))
		return err == nil
	})
	c.nodes[0].p.pause()
	stopped := time.Now()
	type result struct {
		policy string
		err    error
	}
	results := make(chan result, 20)
	async := &walshipv1.CommitPolicy{Durability: walshipv1.Durability_DURABILITY_ASYNC, Replication: walshipv1.ReplicationMode_REPLICATION_MODE_ASYNC,
		Logstore: walshipv1.LogStoreAck_LOG_STORE_ACK_ASYNC}
	for i := range 20 {
		pol, name := (*walshipv1.CommitPolicy)(nil), "sync"
		if i%2 == 0 {
			pol, name = async, "async"
		}
		go func() {
			wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
			defer cancel()
			_, err := kv0.Put(wctx, &walshipv1.PutRequest{Key: fmt.Sprintf("paused/%d", i), Value: []byte("x"), Policy: pol})
			results <- result{name, err}
		}()
	}
	t.Logf("ctl promote:\n%s", ctl(t, "promote", "--node", c.nodes[1].addr, "--wait", "30s"))
	kv1 := walshipv1.NewKVServiceClient(conn(t, c.nodes[1].addr))
	if _, err := kv1.Put(ctx, &walshipv1.PutRequest{Key: "after", Value: []byte("y")}); err != nil {
		t.Fatal(err)
	}
	// Paused for longer than its lease (500 ms) whatever the promotion took.
	if d := 1500*time.Millisecond - time.Since(stopped); d > 0 {
		<-time.After(d)
	}
	c.nodes[0].p.signal(syscall.SIGCONT)
	for range 20 {
		r := <-results
		if r.err == nil {
			t.Fatalf("the paused old primary acknowledged a %s write after it was deposed", r.policy)
		}
	}
	admin0 := walshipv1.NewAdminServiceClient(conn(t, c.nodes[0].addr))
	testkit.Until(t, "the old primary to step down", func() bool {
		st, err := admin0.Status(ctx, &walshipv1.StatusRequest{})
		return err == nil && st.Role == walshipv1.Role_ROLE_REPLICA
	})
	for i := range 20 {
		g, err := kv1.Get(ctx, &walshipv1.GetRequest{Key: fmt.Sprintf("paused/%d", i)})
		if err != nil || g.Found {
			t.Fatalf("paused/%d on the new primary: %v, %v (a write the old primary never acknowledged)", i, g, err)
		}
	}
}

// TestMeasureFailover measures, over WALSHIP_FAILOVER_RUNS cycles (skipped
// without it; docs/BENCHMARKS.md), the time from kill -9 of the primary to
// the first sync write the new primary acknowledges, when the promotion is
// triggered at once (AdminService.Promote, as walship ctl promote calls
// it), and the pause of a switchover. Each cycle kills the current primary,
// promotes the next node, restarts the killed one (it rejoins), and
// switches over to it.
func TestMeasureFailover(t *testing.T) {
	runs := measureRuns(t, "WALSHIP_FAILOVER_RUNS", "failover times")
	needLinux(t)
	c := startFailoverCluster(t)
	ctx, cancel := context.WithTimeout(t.Context(), time.Duration(runs)*time.Minute)
	defer cancel()
	cl, err := client.New(c.addrs(), client.Options{Retry: 30 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	var failovers, pauses []time.Duration
	cur := 0
	for i := range runs {
		if _, err := cl.Put(ctx, "m/warm", []byte("x"), nil); err != nil {
			t.Fatal(err)
		}
		next := (cur + 1) % 3
		killed := time.Now()
		c.nodes[cur].p.kill()
		pctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		_, err := walshipv1.NewAdminServiceClient(conn(t, c.nodes[next].addr)).Promote(pctx, &walshipv1.PromoteRequest{}, grpc.WaitForReady(true))
		cancel()
		if err != nil {
			t.Fatalf("run %d: promote %s: %v", i, c.nodes[next].name, err)
		}
		kv := walshipv1.NewKVServiceClient(conn(t, c.nodes[next].addr))
		for {
			if _, err := kv.Put(ctx, &walshipv1.PutRequest{Key: "m/first", Value: []byte("x")}, grpc.WaitForReady(true)); err == nil {
				break
			}
		}
		failovers = append(failovers, time.Since(killed))
		c.nodes[cur].serving = "replica serving"
		c.nodes[cur].start()
		// The restarted node must have caught up before it can take over.
		st, err := walshipv1.NewAdminServiceClient(conn(t, c.nodes[next].addr)).Status(ctx, &walshipv1.StatusRequest{})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := walshipv1.NewKVServiceClient(conn(t, c.nodes[cur].addr)).Get(ctx, &walshipv1.GetRequest{Key: "m/first", MinLsn: st.VisibleLsn,
			WaitTimeout: durationpb.New(time.Minute)}, grpc.WaitForReady(true)); err != nil {
			t.Fatalf("run %d: %s did not catch up: %v", i, c.nodes[cur].name, err)
		}
		resp, err := walshipv1.NewAdminServiceClient(conn(t, c.nodes[next].addr)).Switchover(ctx, &walshipv1.SwitchoverRequest{Target: c.nodes[cur].name}, grpc.WaitForReady(true))
		if err != nil {
			t.Fatalf("run %d: switchover to %s: %v", i, c.nodes[cur].name, err)
		}
		pauses = append(pauses, resp.Paused.AsDuration())
		// cur is the primary again; next rejoins it as a replica, and
		// catches up before the next kill needs it.
		lsn, err := cl.Put(ctx, "m/after-switchover", []byte("x"), nil)
		if err != nil {
			t.Fatal(err)
		}
		for _, n := range c.nodes {
			if n == c.nodes[cur] {
				continue
			}
			if _, err := walshipv1.NewKVServiceClient(conn(t, n.addr)).Get(ctx, &walshipv1.GetRequest{Key: "m/x", MinLsn: lsn,
				WaitTimeout: durationpb.New(time.Minute)}, grpc.WaitForReady(true)); err != nil {
				t.Fatalf("run %d: %s did not catch up after the switchover: %v", i, n.name, err)
			}
		}
	}
	fm, fx := medianMax(failovers)
	pm, px := medianMax(pauses)
	t.Logf("%d runs: failover (kill -9 to the first acknowledged sync write) median %v, max %v; switchover pause median %v, max %v",
		runs, fm.Round(time.Millisecond), fx.Round(time.Millisecond), pm.Round(time.Millisecond), px.Round(time.Millisecond))
	t.Logf("failovers: %v", failovers)
	t.Logf("pauses: %v", pauses)
}

// measureRuns is how many cycles a measurement runs: env's value, or the
// test skips (a measurement, docs/BENCHMARKS.md, not a check).
func measureRuns(t *testing.T, env, what string) int {
	t.Helper()
	runs, _ := strconv.Atoi(os.Getenv(env))
	if runs < 1 {
		t.Skipf("set %s to measure %s (docs/BENCHMARKS.md)", env, what)
	}
	return runs
}

// medianMax returns the median and the maximum of ds.
func medianMax(ds []time.Duration) (median, maximum time.Duration) {
	s := append([]time.Duration(nil), ds...)
	slices.Sort(s)
	return s[len(s)/2], s[len(s)-1]
}

// TestSecondPromotionBeforeTheFirstOpened: under checked load the primary
// is killed and n1 promoted; while n1, fenced, still waits out the old
// primary's lease, n2 is promoted too. n2 wins the newer epoch; n1, which
// promised it meanwhile, keeps that promise — it never opens its epoch,
// ctl promote on it fails saying so, and it follows n2 — and the history
// stays linearizable, with every node on one digest after.
func TestSecondPromotionBeforeTheFirstOpened(t *testing.T) {
	needLinux(t)
	// n2 must be promoted while n1 waits out n0's lease: both waits end
	// 1.1 leases after n0 last reached the log stores, so that lease is
	// the time from the kill for two ctl runs and n2's fence. Half a
	// second of it was too little on a loaded machine (n1 opened first);
	// ten seconds are plenty, and the load runs on past n2's opening.
	c := newFailoverCluster(t, func(i int) string { return fmt.Sprintf("n%d", i) })
	for _, n := range c.nodes {
		n.args = append(withoutFlags(n.args, "--lease-timeout"), "--lease-timeout", "10s")
	}
	c.start(t)
	_, ctx, h, finish := loadOn(t, c, "second/", 3*time.Minute, 20*time.Second)
	<-time.After(1500 * time.Millisecond)
	h.Note("kill -9 n0 (the primary)")
	c.nodes[0].p.kill()
	type ctlResult struct {
		out string
		err error
	}
	first := make(chan ctlResult, 1)
	go func() {
		out, err := exec.Command(walshipBin(t), "ctl", "promote", "--node", c.nodes[1].addr, "--wait", "30s").CombinedOutput()
		first <- ctlResult{string(out), err}
	}()
	// n2 has promised n1's epoch: n1 is fenced and waits out the lease.
	admin2 := walshipv1.NewAdminServiceClient(conn(t, c.nodes[2].addr))
	testkit.Until(t, "n2 to promise n1 the new epoch", func() bool {
		st, err := admin2.Status(ctx, &walshipv1.StatusRequest{})
		return err == nil && st.GetPrimaryId() == "n1"
	})
	h.Note("n1 fenced; n2 promoted before n1 opened")
	t.Logf("ctl promote n2:\n%s", ctl(t, "promote", "--node", c.nodes[2].addr, "--wait", "30s"))
	r := <-first
	t.Logf("ctl promote n1: %v\n%s", r.err, r.out)
	if r.err == nil || !strings.Contains(r.out, "did not open it: superseded") {
		t.Fatalf("ctl promote on n1, superseded before it opened: %v\n%s\nn1's log:\n%s", r.err, r.out, c.nodes[1].p.logs())
	}
	finish()
	c.nodes[0].serving = "replica serving"
	c.nodes[0].start()
	sts := converge(t, ctx, c.nodes[2].addr, c.nodes[0].addr, c.nodes[1].addr)
	if tl := sts[c.nodes[1].addr].GetLastFailover(); tl.GetOpenedUnixNano() != 0 || tl.GetFailure() == "" {
		t.Fatalf("n1's timeline: %v; want a failure and no opening", tl)
	}
}

// switchoverStuck starts, under checked load, a switchover from n0 to n1
// while n1 is paused (SIGSTOP), so that it waits for n1's flush, and
// returns once n0 has stopped taking writes for it. The switchover's
// result arrives on the channel.
func switchoverStuck(t *testing.T, ctx context.Context, c *failoverCluster, timeout time.Duration) <-chan error {
	t.Helper()
	admin0 := walshipv1.NewAdminServiceClient(conn(t, c.nodes[0].addr))
	if st, err := admin0.Status(ctx, &walshipv1.StatusRequest{}); err != nil || !st.GetTakingWrites() {
		t.Fatalf("n0 under load before the switchover: taking_writes %v, %v", st.GetTakingWrites(), err)
	}
	c.nodes[1].p.pause()
	res := make(chan error, 1)
	go func() {
		_, err := admin0.Switchover(ctx, &walshipv1.SwitchoverRequest{Target: "n1", Timeout: durationpb.New(timeout)})
		res <- err
	}()
	testkit.Until(t, "n0 to pause writes for the switchover", func() bool {
		st, err := admin0.Status(ctx, &walshipv1.StatusRequest{})
		return err == nil && st.GetRole() == walshipv1.Role_ROLE_PRIMARY && st.GetServing() && !st.GetTakingWrites()
	})
	return res
}

// failoverUnderLoad starts the failover cluster and 5 s of the checker's
// workload under prefix through a client of every node; finish waits for
// it, reads every key back and checks the history.
func failoverUnderLoad(t *testing.T, prefix string) (*failoverCluster, *client.Client, context.Context, *check.History, func()) {
	t.Helper()
	c := startFailoverCluster(t)
	cl, ctx, h, finish := loadOn(t, c, prefix, 3*time.Minute, 5*time.Second)
	return c, cl, ctx, h, finish
}

// loadOn starts d of the checker's workload under prefix on cluster c
// through a client of every node, within a context of limit; finish
// waits for it, reads every key back and checks the history.
func loadOn(t *testing.T, c *failoverCluster, prefix string, limit, d time.Duration) (*client.Client, context.Context, *check.History, func()) {
	t.Helper()
	cl, err := client.New(c.addrs(), client.Options{Retry: 20 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cl.Close() })
	ctx, cancel := context.WithTimeout(t.Context(), limit)
	t.Cleanup(cancel)
	h, finish := runChecked(t, ctx, cl, prefix, d)
	return cl, ctx, h, finish
}

// runChecked runs the checker's workload for d in the background; the
// returned function waits for it, reads every key back and checks the
// history.
func runChecked(t *testing.T, ctx context.Context, cl *client.Client, prefix string, d time.Duration) (*check.History, func()) {
	t.Helper()
	w := check.Workload{Primary: cl.KV(), Prefix: prefix, KeyWindow: time.Second}
	h := check.NewHistory()
	done := make(chan error, 1)
	go func() {
		_, _, err := w.Run(ctx, d, h)
		done <- err
	}()
	return h, func() {
		t.Helper()
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		if err := w.ReadBack(ctx, h); err != nil {
			t.Fatal(err)
		}
		if res := checkHistory(t, h); res.Writes < 100 {
			t.Fatalf("too few writes: %s", res)
		}
	}
}

// TestKillTheTargetDuringSwitchover: the target of a switchover dies
// (kill -9) while the primary waits for it; the switchover fails (within
// its timeout, or at once if the target had flushed and the Promote call
// finds it dead), the primary takes writes again, nothing acknowledged is
// lost, and the target restarted rejoins.
func TestKillTheTargetDuringSwitchover(t *testing.T) {
	needLinux(t)
	c, cl, ctx, h, finish := failoverUnderLoad(t, "switch-target/")
	<-time.After(time.Second)
	h.Note("switchover to n1, paused")
	res := switchoverStuck(t, ctx, c, 2*time.Second)
	h.Note("kill -9 n1 (the target)")
	c.nodes[1].p.kill()
	// DEADLINE_EXCEEDED if n1 had not flushed the last LSN when it was
	// paused; UNAVAILABLE if it had, and the Promote call found it dead.
	if err := <-res; (status.Code(err) != codes.DeadlineExceeded && status.Code(err) != codes.Unavailable) || !strings.Contains(err.Error(), "switchover to n1") {
		t.Fatalf("switchover to a killed target = %v; want DEADLINE_EXCEEDED or UNAVAILABLE naming it", err)
	}
	h.Note("switchover failed")
	if _, err := cl.Put(ctx, "switch-target/after", []byte("x"), nil); err != nil {
		t.Fatalf("n0 after the failed switchover: %v", err)
	}
	if st, err := walshipv1.NewAdminServiceClient(conn(t, c.nodes[0].addr)).Status(ctx, &walshipv1.StatusRequest{}); err != nil || !st.GetTakingWrites() {
		t.Fatalf("n0 after the failed switchover: taking_writes %v, %v", st.GetTakingWrites(), err)
	}
	finish()
	c.nodes[1].start()
	converge(t, ctx, c.nodes[0].addr, c.nodes[1].addr, c.nodes[2].addr)
}

// TestKillThePrimaryDuringSwitchover: the primary dies (kill -9) while it
// waits for the switchover's target; the target, resumed, is promoted by
// `walship ctl promote` and has every acknowledged write; the history is
// linearizable and the old primary, restarted, rejoins.
func TestKillThePrimaryDuringSwitchover(t *testing.T) {
	needLinux(t)
	c, _, ctx, h, finish := failoverUnderLoad(t, "switch-primary/")
	<-time.After(time.Second)
	h.Note("switchover to n1, paused")
	res := switchoverStuck(t, ctx, c, 10*time.Second)
	h.Note("kill -9 n0 (the primary)")
	c.nodes[0].p.kill()
	if err := <-res; err == nil {
		t.Fatal("a switchover whose primary was killed succeeded")
	}
	c.nodes[1].p.signal(syscall.SIGCONT)
	t.Logf("ctl promote:\n%s", ctl(t, "promote", "--node", c.nodes[1].addr, "--wait", "30s"))
	h.Note("n1 promoted")
	finish()
	c.nodes[0].serving = "replica serving"
	c.nodes[0].start()
	converge(t, ctx, c.nodes[1].addr, c.nodes[0].addr, c.nodes[2].addr)
}
