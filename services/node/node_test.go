package node

import (
	"context"
	"fmt"
	"log/slog"
	"math"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	walshipv1 "github.com/walship/walship/gen/walship/v1"
	"github.com/walship/walship/internal/datadir"
	"github.com/walship/walship/internal/serve"
	"github.com/walship/walship/internal/testkit"
	"github.com/walship/walship/internal/vfs"
	"github.com/walship/walship/services/logstore"
	"github.com/walship/walship/services/primary"
	"github.com/walship/walship/services/replica"
	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// running is a node or a log store run in-process.
type running struct {
	cancel context.CancelFunc
	done   chan error
}

func (r *running) stop(t *testing.T) error {
	t.Helper()
	if r.cancel == nil {
		return nil
	}
	r.cancel()
	r.cancel = nil
	select {
	case err := <-r.done:
		return err
	case <-time.After(30 * time.Second):
		t.Fatal("did not stop")
		return nil
	}
}

func run(t *testing.T, f func(context.Context) error) *running {
	ctx, cancel := context.WithCancel(context.Background())
	r := &running{cancel: cancel, done: make(chan error, 1)}
	go func() { r.done <- f(ctx) }()
	t.Cleanup(func() { r.stop(t) })
	return r
}

type cluster struct {
	dir     string
	ls      string
	members []primary.Member
	nodes   map[string]*Node
	runs    map[string]*running
	tweak   func(*Config) // if set, changes every node's config
}

func startLogStore(t *testing.T, dir string) string {
	cfg := logstore.DefaultConfig()
	cfg.Listen, cfg.MetricsListen, cfg.DataDir = "127.0.0.1:0", "", filepath.Join(dir, "ls")
	cfg.StopTimeout = 5 * time.Second
	s, err := logstore.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	run(t, s.Run)
	return s.Addr()
}

func (c *cluster) config(id string, role Role) Config {
	p := primary.DefaultConfig()
	p.Policy.Replication = walshipv1.ReplicationMode_REPLICATION_MODE_SYNC
	p.Policy.SyncReplicas = 1
	p.Policy.SyncLevel = walshipv1.SyncLevel_SYNC_LEVEL_FLUSH
	p.Policy.SyncTimeout = 5 * time.Second
	p.HeartbeatInterval = 100 * time.Millisecond
	p.LeaseTimeout = 500 * time.Millisecond
	p.StopTimeout = 5 * time.Second
	r := replica.DefaultConfig()
	r.HeartbeatInterval = 100 * time.Millisecond
	r.StopTimeout = 5 * time.Second
	r.Primary = c.members[0].Addr
	var listen string
	for _, m := range c.members {
		if m.ID == id {
			listen = m.Addr
		}
	}
	cfg := Config{ID: id, DataDir: filepath.Join(c.dir, id), Listen: listen, Members: c.members, LogStores: []string{c.ls},
		Role: role, Primary: p, Replica: r, Registry: serve.NewRegistry(), Logger: testLogger()}
	if c.tweak != nil {
		c.tweak(&cfg)
	}
	return cfg
}

func (c *cluster) start(t *testing.T, id string, role Role) *Node {
	t.Helper()
	n, err := New(c.config(id, role))
	if err != nil {
		t.Fatalf("%s: %v", id, err)
	}
	c.nodes[id] = n
	c.runs[id] = run(t, n.Run)
	return n
}

func newCluster(t *testing.T) *cluster { return newClusterAt(t, 0, nil) }

// newClusterAt is newCluster as if n0 had been the primary of epoch
// (none if 0) and every directory had promised it: n0 restarts as the
// primary of the epoch after it. tweak, if not nil, changes every node's
// config.
func newClusterAt(t *testing.T, epoch uint64, tweak func(*Config)) *cluster {
	dir := t.TempDir()
	c := &cluster{dir: dir, nodes: map[string]*Node{}, runs: map[string]*running{}, tweak: tweak}
	for i := range 3 {
		c.members = append(c.members, primary.Member{ID: fmt.Sprintf("n%d", i), Addr: testkit.FreeAddr(t)})
	}
	if epoch != 0 {
		for _, d := range []string{"ls", "n0", "n1", "n2"} {
			d = filepath.Join(dir, d)
			if err := vfs.OS.MkdirAll(d, vfs.DirPerm); err != nil {
				t.Fatal(err)
			}
			if err := datadir.SaveVote(vfs.OS, d, datadir.Vote{Epoch: epoch, Primary: "n0", Addr: c.members[0].Addr}); err != nil {
				t.Fatal(err)
			}
		}
		if err := datadir.SaveHistory(vfs.OS, filepath.Join(dir, "n0"), datadir.History{{Epoch: epoch, FirstLSN: 1}}); err != nil {
			t.Fatal(err)
		}
	}
	c.ls = startLogStore(t, dir)
	c.start(t, "n0", RolePrimary)
	c.start(t, "n1", RoleReplica)
	c.start(t, "n2", RoleReplica)
	return c
}

func (c *cluster) conn(t *testing.T, id string) *grpc.ClientConn {
	conn, err := serve.Dialer{}.Dial(c.nodes[id].Addr())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

func status1(t *testing.T, conn *grpc.ClientConn) *walshipv1.StatusResponse {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	st, err := walshipv1.NewAdminServiceClient(conn).Status(ctx, &walshipv1.StatusRequest{}, grpc.WaitForReady(true))
	if err != nil {
		t.Fatal(err)
	}
	return st
}

// put writes until the node answers (it may still be opening its epoch).
func put(t *testing.T, conn *grpc.ClientConn, k, v string) uint64 {
	t.Helper()
	var lsn uint64
	testkit.Until(t, fmt.Sprintf("Put %s on %s", k, conn.Target()), func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		r, err := walshipv1.NewKVServiceClient(conn).Put(ctx, &walshipv1.PutRequest{Key: k, Value: []byte(v)}, grpc.WaitForReady(true))
		if err != nil {
			return false
		}
		lsn = r.Lsn
		return true
	})
	return lsn
}

// TestPromoteAndRejoin: three data nodes and a log store, contract K=1 at
// flush. The primary stops; a dry run on n1 says a promotion would reach
// its quorum; Promote fences, and n1 opens as the primary of a new epoch
// with every acknowledged write; n2 follows it; writes to n1 are
// acknowledged under the contract. The old primary, restarted, finds the
// newer epoch at the log store and rejoins as n1's replica, with n1's
// state. With the log store down, a promotion is refused with a message
// naming what it needed, and nothing is fenced.
func TestPromoteAndRejoin(t *testing.T) {
	c := newCluster(t)
	c0, c1, c2 := c.conn(t, "n0"), c.conn(t, "n1"), c.conn(t, "n2")
	var last uint64
	for i := range 20 {
		last = put(t, c0, fmt.Sprintf("k%02d", i), "v0")
	}
	before := status1(t, c0)
	if err := c.runs["n0"].stop(t); err != nil {
		t.Fatalf("n0 stop: %v", err)
	}

	admin1 := walshipv1.NewAdminServiceClient(c1)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	dry, err := admin1.Promote(ctx, &walshipv1.PromoteRequest{DryRun: true})
	if err != nil {
		t.Fatal(err)
	}
	if !dry.Quorum || dry.Epoch != before.Epoch+1 || dry.HighestLsn < last {
		t.Fatalf("dry run = %v", dry)
	}
	resp, err := admin1.Promote(ctx, &walshipv1.PromoteRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if !resp.Quorum || resp.Timeline.GetDonor() == "" {
		t.Fatalf("promote = %v", resp)
	}
	lsn := put(t, c1, "after", "v1")
	st1 := status1(t, c1)
	if st1.Role != walshipv1.Role_ROLE_PRIMARY || st1.Epoch != resp.Epoch || lsn <= last || st1.LastFailover.GetOpenedUnixNano() == 0 || st1.LastFailover.GetStartLsn() == 0 {
		t.Fatalf("n1 after the promotion: %v (put at %d)", st1, lsn)
	}
	// The failover metrics moved: one promotion opened, each of its
	// phases timed once; nothing refused or failed.
	reg := c.nodes["n1"].cfg.Registry
	for _, want := range []struct {
		name, label, value string
		n                  uint64
	}{
		{"walship_promotions_total", "result", "opened", 1},
		{"walship_promotions_total", "result", "refused", 0},
		{"walship_promotions_total", "result", "failed", 0},
		{"walship_promotion_phase_duration_seconds", "phase", phaseSurvey, 1},
		{"walship_promotion_phase_duration_seconds", "phase", phaseFence, 1},
		{"walship_promotion_phase_duration_seconds", "phase", phaseLeaseWait, 1},
		{"walship_promotion_phase_duration_seconds", "phase", phaseCatchUp, 1},
		{"walship_promotion_phase_duration_seconds", "phase", phaseEpochOpen, 1},
	} {
		if got := metricCount(t, reg, want.name, want.label, want.value); got != want.n {
			t.Errorf("%s{%s=%q} = %d after one promotion; want %d", want.name, want.label, want.value, got, want.n)
		}
	}
	t.Logf("promotion phases: %s", phaseSums(t, reg))
	for i := range 20 {
		g, err := walshipv1.NewKVServiceClient(c1).Get(ctx, &walshipv1.GetRequest{Key: fmt.Sprintf("k%02d", i)})
		if err != nil || string(g.Value) != "v0" {
			t.Fatalf("k%02d on the new primary: %v, %v", i, g, err)
		}
	}
	// n2 follows n1 and applies the new epoch.
	if _, err := walshipv1.NewKVServiceClient(c2).Get(ctx, &walshipv1.GetRequest{Key: "after", MinLsn: lsn, WaitTimeout: durationpb.New(15 * time.Second)}); err != nil {
		t.Fatalf("n2 reading the new primary's write: %v", err)
	}
	if st := status1(t, c2); st.Primary != c.nodes["n1"].Addr() || st.VoteEpoch != resp.Epoch {
		t.Fatalf("n2 after the promotion: %v", st)
	}

	// The old primary comes back, finds the newer epoch, rejoins.
	n0 := c.start(t, "n0", RolePrimary)
	c0 = c.conn(t, "n0")
	testkit.Until(t, "n0 to rejoin as n1's replica", func() bool {
		return n0.Role() == RoleReplica
	})
	if _, err := walshipv1.NewKVServiceClient(c0).Get(ctx, &walshipv1.GetRequest{Key: "after", MinLsn: lsn, WaitTimeout: durationpb.New(15 * time.Second)}, grpc.WaitForReady(true)); err != nil {
		t.Fatalf("n0 reading the new primary's write: %v", err)
	}
	_, err = walshipv1.NewKVServiceClient(c0).Put(ctx, &walshipv1.PutRequest{Key: "x", Value: []byte("y")})
	if status.Code(err) != codes.FailedPrecondition {
		t.Fatalf("Put on the rejoined old primary = %v; want FAILED_PRECONDITION naming the primary", err)
	}
	n1last := status1(t, c1)
	testkit.Until(t, "n0 and n2 to converge on n1's digest", func() bool {
		a, b := status1(t, c0), status1(t, c2)
		return a.VisibleLsn == n1last.VisibleLsn && b.VisibleLsn == n1last.VisibleLsn && a.StateDigest == n1last.StateDigest && b.StateDigest == n1last.StateDigest
	})
}

// TestPromotionSupersededBeforeItOpened: once a candidate has waited out
// the old primary's lease and stopped its replica, a newer epoch fences
// the log store (its replica no longer answers, so nothing tells it): it
// starts as the primary of its epoch, finds the log store promised to
// another, steps down, and its timeline says the promotion failed,
// superseded, never opened — what `walship ctl promote` waits on.
func TestPromotionSupersededBeforeItOpened(t *testing.T) {
	mem := vfs.NewMem()
	c := newClusterAt(t, 0, func(cfg *Config) {
		if cfg.ID == "n1" {
			cfg.FS = mem
		}
	})
	c0, c1, c2 := c.conn(t, "n0"), c.conn(t, "n1"), c.conn(t, "n2")
	put(t, c0, "k", "v")
	cluster := status1(t, c0).GetClusterId()
	// Both replicas follow n0 and hold the write before it stops: one that
	// has not heard from it yet names no primary to replace, and the
	// promotion would need n0's own answer.
	top := status1(t, c0).GetVisibleLsn()
	testkit.Until(t, "n1 and n2 to follow n0 up to its write", func() bool {
		for _, cc := range []*grpc.ClientConn{c1, c2} {
			if st := status1(t, cc); st.GetPrimary() != c.nodes["n0"].Addr() || st.GetVisibleLsn() < top {
				return false
			}
		}
		return true
	})
	if err := c.runs["n0"].stop(t); err != nil {
		t.Fatalf("n0 stop: %v", err)
	}
	// The candidate's last write before it starts as primary: its epoch
	// history, with the new epoch.
	entered, release := mem.HoldNextSync("epochs.tmp")
	t.Cleanup(release)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	resp, err := walshipv1.NewAdminServiceClient(c1).Promote(ctx, &walshipv1.PromoteRequest{})
	if err != nil {
		t.Fatal(err)
	}
	select {
	case <-entered:
	case <-ctx.Done():
		t.Fatal("n1 did not save its epoch history for its promotion")
	}
	ls, err := serve.Dialer{}.Dial(c.ls)
	if err != nil {
		t.Fatal(err)
	}
	defer ls.Close()
	f, err := walshipv1.NewEpochServiceClient(ls).Fence(ctx, &walshipv1.FenceRequest{Epoch: resp.GetEpoch() + 1, CandidateId: "n2", CandidateAddr: c.nodes["n2"].Addr(), ClusterId: cluster})
	if err != nil || !f.GetGranted() {
		t.Fatalf("fence of epoch %d at the log store: %v, %v", resp.GetEpoch()+1, f, err)
	}
	release()
	var tl *walshipv1.FailoverTimeline
	testkit.Until(t, "n1's timeline to say its promotion failed", func() bool {
		st, err := walshipv1.NewAdminServiceClient(c1).Status(ctx, &walshipv1.StatusRequest{}, grpc.WaitForReady(true))
		tl = st.GetLastFailover()
		return err == nil && tl.GetEpoch() == resp.GetEpoch() && tl.GetFailure() != ""
	})
	if tl.GetOpenedUnixNano() != 0 || !strings.Contains(tl.GetFailure(), "superseded") {
		t.Fatalf("n1's timeline: %v; want a superseded failure and no opening", tl)
	}
	testkit.Until(t, "n1 to be a replica again", func() bool { return c.nodes["n1"].Role() == RoleReplica })
	reg := c.nodes["n1"].cfg.Registry
	if opened, failed := metricCount(t, reg, "walship_promotions_total", "result", "opened"), metricCount(t, reg, "walship_promotions_total", "result", "failed"); opened != 0 || failed != 1 {
		t.Fatalf("walship_promotions_total: opened %d, failed %d; want 0 and 1", opened, failed)
	}
}

// TestPromotionRefusedWithoutQuorum: with two of three log stores down a
// promotion is refused before anything is fenced, naming what it needed;
// a dry run says so too; an epoch that does not exceed every one seen is a
// bad argument.
func TestPromotionRefusedWithoutQuorum(t *testing.T) {
	dir := t.TempDir()
	c := &cluster{dir: dir, nodes: map[string]*Node{}, runs: map[string]*running{}}
	c.ls = startLogStore(t, dir)
	for i := range 2 {
		c.members = append(c.members, primary.Member{ID: fmt.Sprintf("n%d", i), Addr: testkit.FreeAddr(t)})
	}
	cfg := c.config("n1", RoleReplica)
	cfg.LogStores = append(cfg.LogStores, testkit.FreeAddr(t), testkit.FreeAddr(t)) // nothing listens there
	n, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	c.nodes["n1"] = n
	run(t, n.Run)
	admin := walshipv1.NewAdminServiceClient(c.conn(t, "n1"))
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	dry, err := admin.Promote(ctx, &walshipv1.PromoteRequest{DryRun: true}, grpc.WaitForReady(true))
	if err != nil || dry.Quorum || !strings.Contains(dry.Needed, "2 of 3 log stores") {
		t.Fatalf("dry run with two log stores down = %v, %v", dry, err)
	}
	_, err = admin.Promote(ctx, &walshipv1.PromoteRequest{})
	if status.Code(err) != codes.FailedPrecondition || !contains(err.Error(), "2 of 3 log stores", "nothing was fenced") {
		t.Fatalf("Promote with two log stores down = %v", err)
	}
	if v := n.Replica().Vote(); v.Epoch != 0 {
		t.Fatalf("the refused promotion fenced this node: %v", v)
	}
	_, err = admin.Promote(ctx, &walshipv1.PromoteRequest{Epoch: 0, Force: false, DryRun: false})
	if status.Code(err) != codes.FailedPrecondition {
		t.Fatalf("second refused promotion = %v", err)
	}
}

// TestPromoteArguments: Promote on a replica that has seen epoch 1 with an
// epoch not above it, and Switchover with bad fields, are bad arguments.
func TestPromoteArguments(t *testing.T) {
	c := newCluster(t)
	put(t, c.conn(t, "n0"), "k", "v")
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	_, err := walshipv1.NewAdminServiceClient(c.conn(t, "n1")).Promote(ctx, &walshipv1.PromoteRequest{Epoch: 1})
	if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "epoch: 1 does not exceed") {
		t.Fatalf("Promote to epoch 1 = %v", err)
	}
	admin0 := walshipv1.NewAdminServiceClient(c.conn(t, "n0"))
	for _, tc := range []struct {
		req  *walshipv1.SwitchoverRequest
		want string
	}{
		{&walshipv1.SwitchoverRequest{}, "target"},
		{&walshipv1.SwitchoverRequest{Target: "n1", Timeout: durationpb.New(time.Hour)}, "timeout"},
		{&walshipv1.SwitchoverRequest{Target: "n0"}, "target"},
	} {
		_, err := admin0.Switchover(ctx, tc.req)
		if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Switchover(%v) = %v; want INVALID_ARGUMENT naming %s", tc.req, err, tc.want)
		}
	}
}

// TestPromoteEpochBound: Promote to an epoch above datadir.MaxEpoch is
// a bad argument naming the field, and fences nobody. Promoting to the
// maximum itself works; after it no epoch is left, and every later
// promotion — its dry run too — says so (FAILED_PRECONDITION) instead of
// wrapping to epoch 0 (a promotion to 2^64-1 once made every later one
// and every switchover fail with "epoch 0" while the dry run said quorum
// true). The cluster starts a few epochs below the maximum: no promotion
// jumps there from epoch 1 (TestPromoteEpochJump).
func TestPromoteEpochBound(t *testing.T) {
	c := newClusterAt(t, datadir.MaxEpoch-3, nil)
	put(t, c.conn(t, "n0"), "k", "v")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	admin1, admin2 := walshipv1.NewAdminServiceClient(c.conn(t, "n1")), walshipv1.NewAdminServiceClient(c.conn(t, "n2"))
	testkit.Until(t, "n1 to follow the primary's epoch", func() bool { return c.nodes["n1"].Replica().Vote().Epoch == datadir.MaxEpoch-2 })
	before := c.nodes["n1"].Replica().Vote()
	for _, e := range []uint64{math.MaxUint64, datadir.MaxEpoch + 1} {
		for _, dry := range []bool{true, false} {
			_, err := admin1.Promote(ctx, &walshipv1.PromoteRequest{Epoch: e, DryRun: dry})
			if status.Code(err) != codes.InvalidArgument || !contains(err.Error(), fmt.Sprintf("epoch: %d is above the highest epoch", e)) {
				t.Fatalf("Promote to epoch %d (dry run %v) = %v; want INVALID_ARGUMENT naming epoch", e, dry, err)
			}
		}
	}
	if v := c.nodes["n1"].Replica().Vote(); v != before {
		t.Fatalf("a refused promotion changed n1's vote: %v, was %v", v, before)
	}
	// n0 serves: only a promotion with depose deposes it.
	resp, err := admin1.Promote(ctx, &walshipv1.PromoteRequest{Epoch: datadir.MaxEpoch, Depose: true})
	if err != nil || resp.Epoch != datadir.MaxEpoch {
		t.Fatalf("Promote to the maximum epoch = %v, %v", resp, err)
	}
	put(t, c.conn(t, "n1"), "k", "w")
	testkit.Until(t, "n2 to promise the maximum epoch", func() bool {
		return c.nodes["n2"].Replica() != nil && c.nodes["n2"].Replica().Vote().Epoch == datadir.MaxEpoch
	})
	for _, dry := range []bool{true, false} {
		resp, err := admin2.Promote(ctx, &walshipv1.PromoteRequest{DryRun: dry})
		if status.Code(err) != codes.FailedPrecondition || !contains(err.Error(), "no epoch is left", fmt.Sprint(datadir.MaxEpoch)) {
			t.Fatalf("Promote after the maximum epoch (dry run %v) = %v, %v; want FAILED_PRECONDITION: no epoch is left", dry, resp, err)
		}
	}
	if v := c.nodes["n2"].Replica().Vote(); v.Epoch != datadir.MaxEpoch {
		t.Fatalf("n2's vote after the refused promotion: %v", v)
	}
}

// TestPromoteEpochJump: Promote to an epoch more than
// datadir.MaxEpochJump above every epoch seen is a bad argument naming
// the bound, dry run or not, and fences nobody: one admin call must not
// use up 2^20 epochs of the 2^63 at once. One at the bound is an
// ordinary promotion, which every node follows.
func TestPromoteEpochJump(t *testing.T) {
	c := newCluster(t)
	put(t, c.conn(t, "n0"), "k", "v")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	admin1 := walshipv1.NewAdminServiceClient(c.conn(t, "n1"))
	epoch := status1(t, c.conn(t, "n0")).Epoch
	testkit.Until(t, "n1 to follow the primary's epoch", func() bool { return c.nodes["n1"].Replica().Vote().Epoch == epoch })
	before := c.nodes["n1"].Replica().Vote()
	far := before.Epoch + datadir.MaxEpochJump + 1
	for _, dry := range []bool{true, false} {
		_, err := admin1.Promote(ctx, &walshipv1.PromoteRequest{Epoch: far, DryRun: dry})
		if status.Code(err) != codes.InvalidArgument ||
			!contains(err.Error(), fmt.Sprintf("epoch: %d is more than 1048576 (the most one message may move an epoch) above %d", far, before.Epoch), "nothing was fenced") {
			t.Fatalf("Promote to epoch %d (dry run %v) = %v; want INVALID_ARGUMENT naming the bound", far, dry, err)
		}
	}
	if v := c.nodes["n1"].Replica().Vote(); v != before {
		t.Fatalf("a refused promotion changed n1's vote: %v, was %v", v, before)
	}
	if st := status1(t, c.conn(t, "n0")); st.Role != walshipv1.Role_ROLE_PRIMARY || st.Epoch != before.Epoch {
		t.Fatalf("n0 after the refused promotions: %v in epoch %d; want the primary of epoch %d", st.Role, st.Epoch, before.Epoch)
	}
	resp, err := admin1.Promote(ctx, &walshipv1.PromoteRequest{Epoch: far - 1, Depose: true}) // n0 serves: deposed
	if err != nil || resp.Epoch != far-1 {
		t.Fatalf("Promote to the bound = %v, %v", resp, err)
	}
	put(t, c.conn(t, "n1"), "k", "w")
	testkit.Until(t, "n0 and n2 to follow n1", func() bool {
		for _, id := range []string{"n0", "n2"} {
			if r := c.nodes[id].Replica(); r == nil || r.Vote().Epoch != far-1 {
				return false
			}
		}
		return true
	})
}

func contains(s string, subs ...string) bool {
	for _, sub := range subs {
		if !strings.Contains(s, sub) {
			return false
		}
	}
	return true
}

func testLogger() *slog.Logger {
	if os.Getenv("NODE_LOG") == "" {
		return nil
	}
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

// TestSwitchover: the primary hands over to n1 without losing anything,
// asynchronous commits included; n1 opens without waiting out a lease
// (the old primary promised), and the old primary follows n1.
func TestSwitchover(t *testing.T) {
	c := newCluster(t)
	c0, c1 := c.conn(t, "n0"), c.conn(t, "n1")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	put(t, c0, "first", "x")
	kv0 := walshipv1.NewKVServiceClient(c0)
	async := &walshipv1.CommitPolicy{Durability: walshipv1.Durability_DURABILITY_ASYNC, Replication: walshipv1.ReplicationMode_REPLICATION_MODE_ASYNC}
	for i := range 50 {
		if _, err := kv0.Put(ctx, &walshipv1.PutRequest{Key: fmt.Sprintf("a%02d", i), Value: []byte("async"), Policy: async}); err != nil {
			t.Fatal(err)
		}
	}
	_, err := walshipv1.NewAdminServiceClient(c0).Switchover(ctx, &walshipv1.SwitchoverRequest{Target: "nope"})
	if status.Code(err) != codes.InvalidArgument {
		t.Fatalf("switchover to a non-member = %v", err)
	}
	resp, err := walshipv1.NewAdminServiceClient(c0).Switchover(ctx, &walshipv1.SwitchoverRequest{Target: "n1"})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("switchover: epoch %d, lsn %d, paused %v, target taking writes %v", resp.Epoch, resp.Lsn, resp.Paused.AsDuration(), resp.TargetTakingWrites)
	st := status1(t, c1)
	if st.Role != walshipv1.Role_ROLE_PRIMARY || st.LastFailover.GetLeaseWait().AsDuration() != 0 {
		t.Fatalf("n1 after the switchover: %v", st)
	}
	// The answer waits for n1 to take writes, but at most a second once
	// n0 is deposed (deposedWait): on a loaded machine n1 may still be
	// opening its epoch, and the answer says so.
	if resp.TargetTakingWrites && !st.GetTakingWrites() {
		t.Fatalf("the switchover answered that n1 takes writes; its status after: %v", st)
	}
	testkit.Until(t, "n1 to take writes", func() bool { return status1(t, c1).GetTakingWrites() })
	for i := range 50 {
		g, err := walshipv1.NewKVServiceClient(c1).Get(ctx, &walshipv1.GetRequest{Key: fmt.Sprintf("a%02d", i)})
		if err != nil || string(g.Value) != "async" {
			t.Fatalf("async write a%02d on the new primary: %v, %v", i, g, err)
		}
	}
	testkit.Until(t, "n0 to follow n1", func() bool { return c.nodes["n0"].Role() == RoleReplica })
	// The failover metrics moved on both sides: the target opened one
	// epoch, each phase timed once, and the old primary stepped down.
	for _, want := range []struct {
		node, name, label, value string
		n                        uint64
	}{
		{"n1", "walship_promotions_total", "result", "opened", 1},
		{"n1", "walship_promotion_phase_duration_seconds", "phase", phaseFence, 1},
		{"n1", "walship_promotion_phase_duration_seconds", "phase", phaseCatchUp, 1},
		{"n1", "walship_promotion_phase_duration_seconds", "phase", phaseEpochOpen, 1},
		{"n0", "walship_promotions_total", "result", "opened", 0},
	} {
		if got := metricCount(t, c.nodes[want.node].cfg.Registry, want.name, want.label, want.value); got != want.n {
			t.Errorf("%s: %s{%s=%q} = %d after a switchover; want %d", want.node, want.name, want.label, want.value, got, want.n)
		}
	}
	if got := metricCount(t, c.nodes["n0"].cfg.Registry, "walship_step_downs_total", "", ""); got != 1 {
		t.Errorf("n0: walship_step_downs_total = %d after a switchover; want 1", got)
	}
	lsn := put(t, c1, "after", "y")
	if _, err := walshipv1.NewKVServiceClient(c0).Get(ctx, &walshipv1.GetRequest{Key: "after", MinLsn: lsn, WaitTimeout: durationpb.New(15 * time.Second)}, grpc.WaitForReady(true)); err != nil {
		t.Fatalf("old primary reading the new one's write: %v", err)
	}
}

// TestRestartChoosesTheRoleFromTheVoteAndTheHistory: a node whose vote
// names itself restarts as the primary only if its history shows it opened
// that epoch; one whose promotion was cut short (the vote saved, the
// history not) restarts as a replica, whatever role it was started with.
func TestRestartChoosesTheRoleFromTheVoteAndTheHistory(t *testing.T) {
	for _, tc := range []struct {
		name    string
		history datadir.History
		want    Role
	}{
		{"cut short", datadir.History{{Epoch: 1, FirstLSN: 1}}, RoleReplica},
		{"opened", datadir.History{{Epoch: 1, FirstLSN: 1}, {Epoch: 2, FirstLSN: 5}}, RolePrimary},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			c := &cluster{dir: dir, ls: "127.0.0.1:1", members: []primary.Member{{ID: "n0", Addr: testkit.FreeAddr(t)}, {ID: "n1", Addr: testkit.FreeAddr(t)}}}
			cfg := c.config("n1", RoleReplica)
			if err := os.MkdirAll(cfg.DataDir, 0o755); err != nil {
				t.Fatal(err)
			}
			if err := datadir.SaveVote(vfs.OS, cfg.DataDir, datadir.Vote{Epoch: 2, Primary: "n1", Addr: c.members[1].Addr}); err != nil {
				t.Fatal(err)
			}
			if err := datadir.SaveHistory(vfs.OS, cfg.DataDir, tc.history); err != nil {
				t.Fatal(err)
			}
			n, err := New(cfg)
			if err != nil {
				t.Fatal(err)
			}
			defer func() {
				ctx, cancel := context.WithCancel(context.Background())
				cancel()
				_ = n.Run(ctx)
			}()
			if got := n.Role(); got != tc.want {
				t.Fatalf("role %v, want %v", got, tc.want)
			}
		})
	}
}

// metricCount is a counter's value, or a histogram's count of
// observations, of the series of name with label=value in reg (label ""
// for a metric without labels).
func metricCount(t *testing.T, reg *prometheus.Registry, name, label, value string) uint64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range append(m.GetLabel(), &dto.LabelPair{Name: new(""), Value: new("")}) {
				if l.GetName() == label && l.GetValue() == value {
					if h := m.GetHistogram(); h != nil {
						return h.GetSampleCount()
					}
					return uint64(m.GetCounter().GetValue())
				}
			}
		}
	}
	t.Fatalf("no %s{%s=%q}", name, label, value)
	return 0
}

// phaseSums says how long each promotion phase took in all, from reg.
func phaseSums(t *testing.T, reg *prometheus.Registry) string {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, mf := range mfs {
		if mf.GetName() != "walship_promotion_phase_duration_seconds" {
			continue
		}
		for _, m := range mf.GetMetric() {
			out = append(out, fmt.Sprintf("%s %v", m.GetLabel()[0].GetValue(), time.Duration(m.GetHistogram().GetSampleSum()*float64(time.Second)).Round(time.Microsecond)))
		}
	}
	return strings.Join(out, ", ")
}

// TestAddrDuringRoleChange reads the node's addresses while a promotion
// changes its role: the run goroutine sets them as each role starts, so
// -race finds a read that does not hold the node's lock.
func TestAddrDuringRoleChange(t *testing.T) {
	c := newCluster(t)
	put(t, c.conn(t, "n0"), "a", "1")
	c1 := c.conn(t, "n1")
	if err := c.runs["n0"].stop(t); err != nil {
		t.Fatal(err)
	}
	n1 := c.nodes["n1"]
	var stop atomic.Bool
	done := make(chan struct{})
	go func() {
		defer close(done)
		for !stop.Load() {
			if n1.Addr() == "" {
				t.Error("Addr is empty during the role change")
				return
			}
			_ = n1.MetricsAddr()
		}
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, err := walshipv1.NewAdminServiceClient(c1).Promote(ctx, &walshipv1.PromoteRequest{}, grpc.WaitForReady(true))
	if err == nil {
		testkit.Until(t, "n1 to be the primary", func() bool { return n1.Role() == RolePrimary })
	}
	stop.Store(true)
	<-done
	if err != nil {
		t.Fatalf("Promote n1: %v", err)
	}
}
