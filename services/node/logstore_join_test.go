package node

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	walshipv1 "github.com/walship/walship/gen/walship/v1"
	"github.com/walship/walship/internal/testkit"
	"github.com/walship/walship/services/logstore"
	"github.com/walship/walship/services/primary"
	"google.golang.org/grpc"
)

// lsCluster is the cluster of newCluster with three log stores, each run
// as the walship-logstore StatefulSet runs them (deploy/k8s: --join,
// --advertise, --nodes, --peers naming them all), and more added by
// joinLogStore.
type lsCluster struct {
	*cluster
	lsAddrs []string // every log store started, in order
	lsRuns  map[string]*running
	lsLogs  map[string]*logLines
	nodes   []string // the data nodes' addresses (--nodes)
}

// logLines keeps a log store's log, for the tests to read.
type logLines struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *logLines) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if os.Getenv("NODE_LOG") != "" {
		os.Stderr.Write(p)
	}
	return l.b.Write(p)
}

func (l *logLines) has(s string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return strings.Contains(l.b.String(), s)
}

// newLSCluster starts three log stores with --join and the data nodes
// n0..n2 with all three as --logstore, n0 the primary.
func newLSCluster(t *testing.T) *lsCluster {
	t.Helper()
	dir := t.TempDir()
	c := &lsCluster{cluster: &cluster{dir: dir, nodes: map[string]*Node{}, runs: map[string]*running{}}, lsRuns: map[string]*running{}, lsLogs: map[string]*logLines{}}
	for i := range 3 {
		c.members = append(c.members, primary.Member{ID: fmt.Sprintf("n%d", i), Addr: testkit.FreeAddr(t)})
		c.nodes = append(c.nodes, c.members[i].Addr)
	}
	initial := []string{testkit.FreeAddr(t), testkit.FreeAddr(t), testkit.FreeAddr(t)}
	for i, a := range initial {
		c.startLogStore(t, fmt.Sprintf("ls%d", i), a, initial, nil)
	}
	c.ls = initial[0]
	c.tweak = func(cfg *Config) {
		cfg.LogStores = slices.Clone(initial)
		// Commits wait for a majority of the log stores, so that one added
		// counts for them (TestLogStoreJoinAddsIt).
		cfg.Primary.Policy.LogStore = walshipv1.LogStoreAck_LOG_STORE_ACK_SYNC
	}
	c.start(t, "n0", RolePrimary)
	c.start(t, "n1", RoleReplica)
	c.start(t, "n2", RoleReplica)
	return c
}

// startLogStore runs the log store name at addr with --join (asking the
// data nodes), peers as --peers and leaving as Config.Leaving.
func (c *lsCluster) startLogStore(t *testing.T, name, addr string, peers []string, leaving func(context.Context) (bool, string, error)) {
	t.Helper()
	cfg := logstore.DefaultConfig()
	cfg.Listen, cfg.MetricsListen, cfg.DataDir = addr, "", filepath.Join(c.dir, name)
	cfg.StopTimeout = 5 * time.Second
	cfg.Peers = slices.Clone(peers)
	cfg.Join, cfg.Advertise, cfg.Nodes, cfg.Leaving = true, addr, c.nodes, leaving
	l := &logLines{}
	c.lsLogs[addr] = l
	cfg.Logger = slog.New(slog.NewTextHandler(l, &slog.HandlerOptions{Level: slog.LevelDebug})).With("logstore", name)
	s, err := logstore.New(cfg)
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	if !slices.Contains(c.lsAddrs, addr) {
		c.lsAddrs = append(c.lsAddrs, addr)
	}
	c.lsRuns[addr] = run(t, s.Run)
}

// membership is the primary's (ListMembers at n0).
func (c *lsCluster) membership(t *testing.T) *walshipv1.MembershipStatus {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	resp, err := walshipv1.NewAdminServiceClient(c.conn(t, "n0")).ListMembers(ctx, &walshipv1.ListMembersRequest{}, grpc.WaitForReady(true))
	if err != nil {
		t.Fatalf("ListMembers at n0: %v", err)
	}
	return resp.GetMembership()
}

// waitLogStores waits until the primary's contract has exactly want as its
// log stores (in any order), with no change in progress.
func (c *lsCluster) waitLogStores(t *testing.T, what string, want ...string) {
	t.Helper()
	want = slices.Sorted(slices.Values(want))
	var got []string
	testkit.UntilWithin(t, 60*time.Second, what, func() bool {
		m := c.membership(t)
		got = slices.Sorted(slices.Values(m.GetContract().GetLogstores()))
		return m.GetChange() == "" && !m.GetJoint() && len(m.GetContract().GetLogstoreLearners()) == 0 && slices.Equal(got, want)
	})
}

// TestLogStoresJoinFreshCluster: a brand-new cluster whose three log
// stores all run with --join (the StatefulSet's flags) starts, takes
// writes, and changes nothing: the bootstrap contract names them.
func TestLogStoresJoinFreshCluster(t *testing.T) {
	c := newLSCluster(t)
	put(t, c.conn(t, "n0"), "a", "1")
	c.waitLogStores(t, "the three initial log stores", c.lsAddrs...)
	// Each has asked the primary and found itself named: wait for that,
	// then check that nothing changed meanwhile.
	for _, a := range c.lsAddrs {
		testkit.Until(t, a+" to find itself named", func() bool {
			return c.lsLogs[a].has("a log store of the cluster's contract: not asking to join")
		})
	}
	m := c.membership(t)
	if m.GetContract().GetMembersChanged() || m.GetStage() != walshipv1.MembershipStage_MEMBERSHIP_STAGE_UNSPECIFIED {
		t.Fatalf("the fresh cluster's membership changed: members_changed %v, stage %v, contract %v", m.GetContract().GetMembersChanged(), m.GetStage(), m.GetContract())
	}
	put(t, c.conn(t, "n0"), "b", "2")
}

// TestLogStoreJoinAddsIt: a log store started with --join at a new
// address (the StatefulSet scaled 3 → 4) is added: it ends among the
// contract's log stores, and commits then wait for it as for the others
// (with one of the first three down, the majority of four needs it).
func TestLogStoreJoinAddsIt(t *testing.T) {
	c := newLSCluster(t)
	put(t, c.conn(t, "n0"), "a", "1")
	ls3 := testkit.FreeAddr(t)
	c.startLogStore(t, "ls3", ls3, c.lsAddrs, nil)
	c.waitLogStores(t, "ls3 to be added", c.lsAddrs...)
	if !c.membership(t).GetContract().GetMembersChanged() {
		t.Fatal("ls3 is a log store of the contract but members_changed is not set")
	}
	// 3 of 4 are the majority: with ls0 down, a commit needs ls3's ack.
	if err := c.lsRuns[c.lsAddrs[0]].stop(t); err != nil {
		t.Fatalf("stop ls0: %v", err)
	}
	lsn := put(t, c.conn(t, "n0"), "b", "2")
	for _, m := range c.membership(t).GetMembers() {
		if m.GetId() == ls3 && m.GetReachedLsn() < lsn {
			t.Fatalf("ls3 reached LSN %d, below the acknowledged write's %d", m.GetReachedLsn(), lsn)
		}
	}
}

// TestLogStoreScaleDownLeaves: log stores that Leaving says are scaled
// down ask the primary to remove them when told to stop, two at once
// (5 → 3, podManagementPolicy Parallel: one change at a time, the other
// asks again); one that Leaving says restarts stays a log store of the
// contract, and asks nothing when it comes back.
func TestLogStoreScaleDownLeaves(t *testing.T) {
	c := newLSCluster(t)
	put(t, c.conn(t, "n0"), "a", "1")
	var down atomic.Bool
	leaving := func(context.Context) (bool, string, error) {
		if down.Load() {
			return true, "spec.replicas 3 leaves it out (the test says so)", nil
		}
		return false, "spec.replicas 5 keeps it (the test says so)", nil
	}
	initial := slices.Clone(c.lsAddrs)
	ls3, ls4 := testkit.FreeAddr(t), testkit.FreeAddr(t)
	c.startLogStore(t, "ls3", ls3, initial, leaving)
	c.waitLogStores(t, "ls3 to be added", c.lsAddrs...)
	c.startLogStore(t, "ls4", ls4, initial, leaving)
	c.waitLogStores(t, "ls4 to be added", c.lsAddrs...)

	// A restart: still a log store of the contract, before and after.
	if err := c.lsRuns[ls4].stop(t); err != nil {
		t.Fatalf("stop ls4: %v", err)
	}
	if got := c.membership(t).GetContract().GetLogstores(); !slices.Contains(got, ls4) {
		t.Fatalf("log stores after ls4's restart-like stop: %v; want ls4 still among them", got)
	}
	if !c.lsLogs[ls4].has("not a scale-down; staying a log store of the contract") {
		t.Fatal("ls4's restart-like stop did not say it stays")
	}
	c.startLogStore(t, "ls4", ls4, initial, leaving)
	testkit.Until(t, "ls4, restarted, to find itself named", func() bool {
		return c.lsLogs[ls4].has("a log store of the cluster's contract: not asking to join")
	})
	put(t, c.conn(t, "n0"), "b", "2")
	c.waitLogStores(t, "five log stores after ls4's restart", c.lsAddrs...)

	// Scaled down to 3: both told to stop at once.
	down.Store(true)
	var wg sync.WaitGroup
	for _, a := range []string{ls3, ls4} {
		wg.Go(func() {
			if err := c.lsRuns[a].stop(t); err != nil {
				t.Errorf("stop %s: %v", a, err)
			}
		})
	}
	wg.Wait()
	for _, a := range []string{ls3, ls4} {
		if !c.lsLogs[a].has("removed from the cluster's log stores for the scale-down") {
			t.Errorf("%s stopped without saying it was removed", a)
		}
	}
	c.waitLogStores(t, "ls3 and ls4 to be removed", initial...)
	put(t, c.conn(t, "n0"), "c", "3")
}
