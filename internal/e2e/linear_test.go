package e2e

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	walshipv1 "github.com/walship/walship/gen/walship/v1"
	"github.com/walship/walship/internal/check"
	"github.com/walship/walship/internal/testkit"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/types/known/durationpb"
)

// procNode is one walship process of a procCluster, restartable on the
// same address and data directory.
type procNode struct {
	name, serving string
	addr          string
	args          []string
	// env is added to the process's environment (credentials of an
	// archive); metrics is its --metrics-listen address, if it has one.
	env     []string
	metrics string
	// t owns the process: the test that started the cluster, so that a
	// node restarted by a subtest outlives it.
	t *testing.T
	p *proc
}

func (n *procNode) start() { n.p = startProcEnv(n.t, n.env, n.serving, n.args...) }

// procCluster is a log store, a primary and replicas as real processes on
// loopback, each on a fixed port so it can be killed and restarted.
type procCluster struct {
	logstore, primary *procNode
	replicas          []*procNode
}

// startProcCluster starts the cluster; primaryArgs are the primary's
// policy flags.
func startProcCluster(t *testing.T, replicas int, primaryArgs ...string) *procCluster {
	t.Helper()
	dir := t.TempDir()
	c := &procCluster{}
	lsAddr, pAddr := testkit.FreeAddr(t), testkit.FreeAddr(t)
	c.logstore = &procNode{name: "logstore", serving: "log store serving", addr: lsAddr, args: []string{"logstore",
		"--listen", lsAddr, "--metrics-listen", "", "--data-dir", filepath.Join(dir, "ls")}}
	c.primary = &procNode{name: "primary", serving: "primary serving", addr: pAddr, args: append([]string{"primary",
		"--listen", pAddr, "--metrics-listen", "", "--data-dir", filepath.Join(dir, "p"), "--logstore", lsAddr,
		"--heartbeat-interval", "100ms", "--sync-timeout", "3s"}, primaryArgs...)}
	for i := range replicas {
		addr := testkit.FreeAddr(t)
		c.replicas = append(c.replicas, &procNode{name: fmt.Sprintf("r%d", i), serving: "replica serving", addr: addr, args: []string{"replica",
			"--listen", addr, "--metrics-listen", "", "--data-dir", filepath.Join(dir, fmt.Sprintf("r%d", i)),
			"--id", fmt.Sprintf("r%d", i), "--primary", pAddr, "--logstore", lsAddr, "--heartbeat-interval", "100ms"}})
	}
	for _, n := range c.nodes() {
		n.t = t
		n.start()
	}
	return c
}

func (c *procCluster) nodes() []*procNode {
	return append([]*procNode{c.logstore, c.primary}, c.replicas...)
}

// conn dials addr with a short reconnect backoff, so that clients find a
// restarted node within a few hundred milliseconds.
func conn(t *testing.T, addr string) *grpc.ClientConn {
	t.Helper()
	cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithConnectParams(grpc.ConnectParams{Backoff: backoff.Config{BaseDelay: 20 * time.Millisecond, Multiplier: 1.6, MaxDelay: 300 * time.Millisecond}, MinConnectTimeout: time.Second}))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	return cc
}

// checkHistory checks h, and on a violation writes the history and its
// visualisation where the test's log says.
func checkHistory(t *testing.T, h *check.History) check.Result {
	t.Helper()
	res := check.Check(h, 2*time.Minute)
	t.Log(res)
	for cause, n := range h.UnknownCauses() {
		t.Logf("  %d of unknown outcome: %s", n, cause)
	}

	if !res.OK() {
		dir := os.Getenv("WALSHIP_CHECK_OUT")
		if dir == "" {
			dir = t.TempDir()
		}
		base := filepath.Join(dir, fmt.Sprintf("%s-%d", filepath.Base(t.Name()), time.Now().UnixNano()))
		if err := h.Save(base + ".json"); err != nil {
			t.Error(err)
		}
		if err := res.Visualize(base + ".html"); err != nil {
			t.Error(err)
		}
		v := res.Violations()
		t.Fatalf("%s\n%s\n(%d keys in all)\nhistory: %s.json, visualisation: %s.html", res, strings.Join(v[:min(3, len(v))], "\n"), len(v), base, base)
	}
	return res
}

// mostlyDefault leaves three writes in four to the server's defaults and
// gives the rest a random policy.
func mostlyDefault(r *rand.Rand) *walshipv1.CommitPolicy {
	if r.IntN(4) > 0 {
		return nil
	}
	return check.RandomPolicy(r)
}

// TestLinearizableWithoutFaults: real processes (a log store, a primary,
// two replicas), the workload of `walship check linear` under each global
// policy in turn (changed with SetPolicy) and then under random policies
// per write; each history is linearizable and the replica reads are
// read-your-writes and monotonic.
func TestLinearizableWithoutFaults(t *testing.T) {
	needLinux(t)
	c := startProcCluster(t, 2)
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	pc := conn(t, c.primary.addr)
	admin := walshipv1.NewAdminServiceClient(pc)
	w := check.Workload{
		Primary: walshipv1.NewKVServiceClient(pc), Replica: walshipv1.NewKVServiceClient(conn(t, c.replicas[0].addr)),
		KeyWindow: 500 * time.Millisecond,
	}
	sync := walshipv1.ReplicationMode_REPLICATION_MODE_SYNC
	for _, tc := range []struct {
		name   string
		policy *walshipv1.CommitPolicy
		random bool
	}{
		{name: "durability=sync", policy: &walshipv1.CommitPolicy{Durability: walshipv1.Durability_DURABILITY_SYNC, Replication: walshipv1.ReplicationMode_REPLICATION_MODE_ASYNC}},
		{name: "durability=async", policy: &walshipv1.CommitPolicy{Durability: walshipv1.Durability_DURABILITY_ASYNC}},
		{name: "sync-k1-flush", policy: &walshipv1.CommitPolicy{Durability: walshipv1.Durability_DURABILITY_SYNC, Replication: sync, SyncReplicas: 1, SyncLevel: walshipv1.SyncLevel_SYNC_LEVEL_FLUSH}},
		{name: "sync-k2-apply", policy: &walshipv1.CommitPolicy{Replication: sync, SyncReplicas: 2, SyncLevel: walshipv1.SyncLevel_SYNC_LEVEL_APPLY}},
		{name: "sync-k1-write+logstore", policy: &walshipv1.CommitPolicy{Replication: sync, SyncReplicas: 1, SyncLevel: walshipv1.SyncLevel_SYNC_LEVEL_WRITE, Logstore: walshipv1.LogStoreAck_LOG_STORE_ACK_SYNC}},
		{name: "random-per-write", policy: &walshipv1.CommitPolicy{Replication: walshipv1.ReplicationMode_REPLICATION_MODE_ASYNC, Logstore: walshipv1.LogStoreAck_LOG_STORE_ACK_ASYNC}, random: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := admin.SetPolicy(ctx, &walshipv1.SetPolicyRequest{Policy: tc.policy}); err != nil {
				t.Fatal(err)
			}
			w := w
			w.Prefix = tc.name + "/"
			if tc.random {
				w.Policy = check.RandomPolicy
			}
			h, session, err := w.Run(ctx, 2*time.Second, nil)
			if err != nil {
				t.Fatal(err)
			}
			res := checkHistory(t, h)
			if res.Writes < 50 || res.Reads < 50 {
				t.Fatalf("too few operations to mean anything: %s", res)
			}
			if session.Reads == 0 || len(session.Violations) > 0 {
				t.Fatalf("replica reads: %d, violations %v", session.Reads, session.Violations)
			}
		})
	}
}

// kills is how many times TestLinearizableUnderKills kills each node:
// WALSHIP_LINEAR_KILLS for a long run (docs/RUNBOOK.md, "Checking
// linearizability"), else 3.
func kills(t *testing.T) int {
	if v := os.Getenv("WALSHIP_LINEAR_KILLS"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			t.Fatalf("WALSHIP_LINEAR_KILLS=%q: want a positive count", v)
		}
		return n
	}
	return 3
}

// TestLinearizableUnderKills: kill -9 and restart the primary under the
// workload (sync durability, sync replication K=1 at flush, random
// per-write policies on top), then a replica, then the log store; the
// history — with every key read back at the end — is linearizable, and
// the replicas converge on the primary's state digest.
func TestLinearizableUnderKills(t *testing.T) {
	needLinux(t)
	c := startProcCluster(t, 2, "--durability", "sync", "--replication", "sync", "--sync-replicas", "1", "--sync-level", "flush")
	n := kills(t)
	ctx, cancel := context.WithTimeout(t.Context(), time.Duration(n)*time.Minute+3*time.Minute)
	defer cancel()
	pc := conn(t, c.primary.addr)
	defaults, err := walshipv1.NewAdminServiceClient(pc).Status(ctx, &walshipv1.StatusRequest{})
	if err != nil {
		t.Fatal(err)
	}
	for _, victim := range []*procNode{c.primary, c.replicas[0], c.logstore} {
		t.Run(victim.name, func(t *testing.T) {
			// Only a crash of the primary can undo what it acknowledged (a
			// replica or the log store holds nothing the primary lacks);
			// most writes take the server's durable defaults, so that the
			// checker knows their outcome.
			w := check.Workload{Primary: walshipv1.NewKVServiceClient(pc), Prefix: "kill-" + victim.name + "/",
				KeyWindow: time.Second, Policy: mostlyDefault, Defaults: defaults.DefaultPolicy, Crashes: victim == c.primary}
			h := check.NewHistory()
			done := make(chan error, 1)
			go func() {
				_, _, err := w.Run(ctx, time.Duration(n)*1500*time.Millisecond+500*time.Millisecond, h)
				done <- err
			}()
			rnd := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 0))
			for i := range n {
				// Between 0.5 and 1.5 s of load, then the kill.
				pause := time.NewTimer(500*time.Millisecond + time.Duration(rnd.IntN(1000))*time.Millisecond)
				select {
				case <-pause.C:
				case err := <-done:
					t.Fatalf("workload ended before kill %d: %v", i+1, err)
				}
				h.Note("kill -9 %s", victim.name)
				victim.p.kill()
				victim.start()
				h.Note("%s restarted", victim.name)
			}
			if err := <-done; err != nil {
				t.Fatal(err)
			}
			if err := w.ReadBack(ctx, h); err != nil {
				t.Fatal(err)
			}
			res := checkHistory(t, h)
			if res.Writes < 20*n {
				t.Fatalf("too few writes for %d kills: %s", n, res)
			}
		})
	}
	waitConverged(t, ctx, c)
}

// waitConverged waits until every replica has applied the primary's last
// LSN and reports the primary's state digest.
func waitConverged(t *testing.T, ctx context.Context, c *procCluster) {
	t.Helper()
	p, err := walshipv1.NewAdminServiceClient(conn(t, c.primary.addr)).Status(ctx, &walshipv1.StatusRequest{})
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range c.replicas {
		admin := walshipv1.NewAdminServiceClient(conn(t, r.addr))
		kv := walshipv1.NewKVServiceClient(conn(t, r.addr))
		// A read at min_lsn waits on the replica's own watermark.
		if _, err := kv.Get(ctx, &walshipv1.GetRequest{Key: "-", MinLsn: p.VisibleLsn, WaitTimeout: durationpb.New(time.Minute)}, grpc.WaitForReady(true)); err != nil {
			t.Fatalf("%s never applied LSN %d: %v", r.name, p.VisibleLsn, err)
		}
		st, err := admin.Status(ctx, &walshipv1.StatusRequest{})
		if err != nil {
			t.Fatal(err)
		}
		if st.VisibleLsn != p.VisibleLsn || st.StateDigest != p.StateDigest {
			t.Fatalf("%s at LSN %d has digest %s; the idle primary, at %d, %s", r.name, st.VisibleLsn, st.StateDigest, p.VisibleLsn, p.StateDigest)
		}
	}
}
