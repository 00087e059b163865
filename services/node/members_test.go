package node

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	walshipv1 "github.com/walship/walship/gen/walship/v1"
	"github.com/walship/walship/internal/datadir"
	"github.com/walship/walship/internal/envelope"
	"github.com/walship/walship/internal/keyspace"
	"github.com/walship/walship/internal/serve"
	"github.com/walship/walship/internal/testkit"
	"github.com/walship/walship/internal/vfs"
	"github.com/walship/walship/internal/wal"
	"github.com/walship/walship/pkg/codec"
	"github.com/walship/walship/services/primary"
	"github.com/walship/walship/services/replica"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
)

// writeEpochRecord puts rec in dir's log as its primary would: the
// epoch's first commit (a transaction of one put of
// keyspace.EpochRecordKey) at LSN first, in a batch of rec's epoch, with
// the history and the vote of a replica that wrote it (not applied yet:
// a replica holds it until the primary says it is durable). It is how
// these tests give a node a contract that no primary here can write yet
// (learners, a joint configuration).
func writeEpochRecord(t *testing.T, dir string, rec *walshipv1.EpochRecord, first uint64) {
	t.Helper()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	data, err := proto.Marshal(rec)
	if err != nil {
		t.Fatal(err)
	}
	commit := first + 1
	b := codec.Batch{Records: []codec.Record{
		{LSN: first, TxnID: commit, Op: codec.OpPut, Key: []byte(keyspace.EpochRecordKey), Value: data},
		{LSN: commit, TxnID: commit, Op: codec.OpCommit},
	}}
	payload, err := codec.MsgPack.AppendBatch(nil, &b)
	if err != nil {
		t.Fatal(err)
	}
	env, err := envelope.Marshal(&walshipv1.WalBatch{Epoch: rec.GetEpoch(), FirstLsn: first, LastLsn: commit, PrevLsn: first - 1,
		CommitTimeUnixNano: time.Now().UnixNano(), Codec: walshipv1.Codec_CODEC_MSGPACK, Payload: payload, Crc32C: codec.Checksum(payload)})
	if err != nil {
		t.Fatal(err)
	}
	log, err := wal.Open(wal.Options{Dir: filepath.Join(dir, "wal"), FS: vfs.OS})
	if err != nil {
		t.Fatal(err)
	}
	if err := log.Append(wal.Entry{FirstLSN: first, LastLSN: commit, Data: env}); err != nil {
		t.Fatal(err)
	}
	if err := log.Sync(); err != nil {
		t.Fatal(err)
	}
	if err := log.Close(); err != nil {
		t.Fatal(err)
	}
	h, err := datadir.LoadHistory(vfs.OS, dir)
	if err != nil {
		t.Fatal(err)
	}
	if h.Current().Epoch != rec.GetEpoch() {
		h = append(h, datadir.Start{Epoch: rec.GetEpoch(), FirstLSN: first})
	}
	if err := datadir.SaveHistory(vfs.OS, dir, h); err != nil {
		t.Fatal(err)
	}
	if err := datadir.SaveVote(vfs.OS, dir, datadir.Vote{Epoch: rec.GetEpoch(), Primary: rec.GetPrimaryId(), Addr: rec.GetPrimaryAddr()}); err != nil {
		t.Fatal(err)
	}
}

func memberList(ids ...string) []*walshipv1.Member {
	var ms []*walshipv1.Member
	for _, id := range ids {
		ms = append(ms, &walshipv1.Member{Id: id, Addr: id + ".invalid:1"})
	}
	return ms
}

// recordReplica starts a data node id as a replica of nobody, with the log
// store ls and a log holding rec (writeEpochRecord), under election el
// (nil: none).
func recordReplica(t *testing.T, id, ls string, rec *walshipv1.EpochRecord, el Election) *Node {
	t.Helper()
	dir := filepath.Join(t.TempDir(), id)
	writeEpochRecord(t, dir, rec, 1)
	return replicaOfNobody(t, id, dir, ls, el)
}

// replicaOfNobody starts the data node id on dir as a replica of nobody,
// with the log store ls, under election el (nil: none).
func replicaOfNobody(t *testing.T, id, dir, ls string, el Election) *Node {
	t.Helper()
	p := primary.DefaultConfig()
	p.HeartbeatInterval, p.LeaseTimeout, p.StopTimeout = 100*time.Millisecond, 300*time.Millisecond, 5*time.Second
	r := replica.DefaultConfig()
	r.HeartbeatInterval, r.StopTimeout = 100*time.Millisecond, 5*time.Second
	r.Primary = testkit.FreeAddr(t) // nobody
	cfg := Config{ID: id, DataDir: dir, Listen: "127.0.0.1:0", LogStores: []string{ls}, Role: RoleReplica,
		Primary: p, Replica: r, Registry: serve.NewRegistry(), Logger: testLogger()}
	if el != nil {
		cfg.Election, cfg.ElectionRetry = el, 20*time.Millisecond
	}
	n, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	run(t, n.Run)
	testkit.Until(t, id+" to report its log's contract", func() bool {
		rep := n.Replica()
		return rep != nil && rep.EpochRecord() != nil
	})
	return n
}

// TestOnlyALeaderPromotes: a node may be the primary only as a member of
// every configuration its log's newest contract record is under
// (failover.Config.Leads). A learner, a member leaving in a membership
// change in progress, and a node the contract does not name at all are
// refused before anything is fenced — manually (Promote, dry runs too)
// and automatically (the election: the node does not contend, and the
// reason it keeps for Status says why) — though the log store alone
// would make the quorum (the contract waits for no replica).
func TestOnlyALeaderPromotes(t *testing.T) {
	ls := startLogStore(t, t.TempDir())
	contract := func(members []*walshipv1.Member) *walshipv1.Contract {
		return &walshipv1.Contract{Members: members, Logstores: []string{ls}}
	}
	learner := contract(memberList("p", "m"))
	learner.Learners = memberList("x")
	leaving := contract(memberList("p", "x", "m"))
	leaving.Next = &walshipv1.Configuration{Members: memberList("p", "m"), Logstores: []string{ls}}
	joining := contract(memberList("p", "m"))
	joining.Next = &walshipv1.Configuration{Members: memberList("p", "m", "x"), Logstores: []string{ls}}
	for _, tc := range []struct {
		name     string
		contract *walshipv1.Contract
		why      string
	}{
		{"a learner", learner, "it is a learner"},
		{"a member leaving in a change", leaving, "not a member of the configuration the membership change goes to"},
		{"a member joining in a change", joining, "not a member of the current configuration"},
		{"a node the contract does not name", contract(memberList("p", "m")), "not a member of the current configuration"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rec := &walshipv1.EpochRecord{Epoch: 1, FirstLsn: 1, PrimaryId: "p", PrimaryAddr: "p.invalid:1", Contract: tc.contract}
			n := recordReplica(t, "x", ls, rec, nil)
			conn, err := serve.Dialer{}.Dial(n.Addr())
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			admin := walshipv1.NewAdminServiceClient(conn)
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			for _, dry := range []bool{true, false} {
				_, err := admin.Promote(ctx, &walshipv1.PromoteRequest{DryRun: dry}, grpc.WaitForReady(true))
				if status.Code(err) != codes.FailedPrecondition || !contains(err.Error(), "cannot promote x", tc.why, "epoch 1") {
					t.Fatalf("Promote (dry run %v) = %v; want FAILED_PRECONDITION naming x, why (%q) and the contract", dry, err, tc.why)
				}
			}
			if n.Role() != RoleReplica {
				t.Fatalf("x is %v after its refused promotion", n.Role())
			}

			// The same node under an election does not contend.
			el := &memElection{id: "x"}
			n = recordReplica(t, "x", ls, rec, el)
			testkit.Until(t, "x to say why it may not contend", func() bool {
				n.mu.Lock()
				defer n.mu.Unlock()
				return strings.Contains(n.notEligible, tc.why)
			})
			if c, _ := el.counts(); c != 0 || n.Role() != RoleReplica {
				t.Fatalf("x campaigned %d times and is %v", c, n.Role())
			}
		})
	}
}

// removal is a cluster of members {n0, n1, n2}, any 1 at flush, where n2
// was removed while it was down: n0 restarted under --peers {n0, n1}, so
// its epoch 2 record names n0 and n1 only (n1 applied it); n0 is down
// again, and n1 and n2 are not running. n2's log still has the epoch 1
// record, which names it. n1 restarts under --peers {n0, n1} too (a
// primary today stamps its flags' members in its epoch record).
func removal(t *testing.T) (c *cluster, contractOf func(id string) []*walshipv1.Member) {
	c = &cluster{dir: t.TempDir(), nodes: map[string]*Node{}, runs: map[string]*running{}}
	for _, id := range []string{"n0", "n1", "n2"} {
		c.members = append(c.members, primary.Member{ID: id, Addr: testkit.FreeAddr(t)})
	}
	peers := map[string][]primary.Member{}
	c.tweak = func(cfg *Config) {
		if p := peers[cfg.ID]; p != nil {
			cfg.Members = p
		}
	}
	c.ls = startLogStore(t, c.dir)
	c.start(t, "n0", RolePrimary)
	c.start(t, "n1", RoleReplica)
	c.start(t, "n2", RoleReplica)
	put(t, c.conn(t, "n0"), "a", "1")
	contractOf = func(id string) []*walshipv1.Member {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		st, err := nodeStatus(ctx, serve.Dialer{}, c.nodes[id].Addr())
		if err != nil {
			return nil
		}
		return st.GetContract().GetMembers()
	}
	testkit.Until(t, "n2 to hold the epoch 1 record", func() bool { return len(contractOf("n2")) == 3 })
	for _, id := range []string{"n2", "n0"} {
		if err := c.runs[id].stop(t); err != nil {
			t.Fatalf("%s stop: %v", id, err)
		}
	}
	peers["n0"], peers["n1"] = c.members[:2], c.members[:2]
	c.start(t, "n0", RolePrimary)
	put(t, c.conn(t, "n0"), "b", "2")
	testkit.Until(t, "n1 to hold the epoch 2 record", func() bool { return len(contractOf("n1")) == 2 })
	return c, contractOf
}

// TestRemovedMemberPromotesNowhere: a member removed while it was down
// still finds itself in its own log's contract, judges under it, and
// would win a quorum; but n1, whose log reaches the newest epoch, reports
// the contract n2's log will hold once caught up, which does not name it
// (failover.Config.Leads), so its promotion is refused before anything
// is fenced, dry runs too. n1 then promotes without n0 (n2 is no
// member whose promise it needs).
func TestRemovedMemberPromotesNowhere(t *testing.T) {
	c, _ := removal(t)
	for _, id := range []string{"n1", "n0"} {
		if err := c.runs[id].stop(t); err != nil {
			t.Fatalf("%s stop: %v", id, err)
		}
	}
	c.start(t, "n1", RoleReplica)
	n2 := c.start(t, "n2", RoleReplica)
	c2 := c.conn(t, "n2")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, dry := range []bool{true, false} {
		_, err := walshipv1.NewAdminServiceClient(c2).Promote(ctx, &walshipv1.PromoteRequest{DryRun: dry}, grpc.WaitForReady(true))
		if status.Code(err) != codes.FailedPrecondition || !contains(err.Error(), "cannot promote n2", "not a member of the current configuration",
			"n1, whose log reaches the newest epoch (2), reports members n0, n1", "nothing was fenced") {
			t.Fatalf("Promote n2 (dry run %v) = %v; want FAILED_PRECONDITION naming n2 and n1's contract", dry, err)
		}
	}
	st, err := logStoreStatus(ctx, serve.Dialer{}, c.ls)
	if err != nil || st.GetVoteEpoch() != 2 || n2.Role() != RoleReplica {
		t.Fatalf("after n2's refused promotion: log store %v, %v; n2 %v; want the log store at epoch 2 and n2 a replica", st, err, n2.Role())
	}
	if got := metricCount(t, n2.cfg.Registry, "walship_promotions_total", "result", resultNotMember); got != 1 {
		t.Fatalf("walship_promotions_total{result=%q} = %d, want 1 (the dry run not counted)", resultNotMember, got)
	}
	n1 := c.nodes["n1"]
	if _, err := walshipv1.NewAdminServiceClient(c.conn(t, "n1")).Promote(ctx, &walshipv1.PromoteRequest{}, grpc.WaitForReady(true)); err != nil {
		t.Fatalf("Promote n1: %v", err)
	}
	testkit.Until(t, "n1 to start as primary", func() bool { return n1.Role() == RolePrimary })
}

// TestRemovedMemberGivesUpOnceCaughtUp: the check once caught up, for
// when no replica's answer tells the contract in advance (the seed 12718
// scenario of the simulation, with real servers). n2 was removed while
// down (removal); then n1 went down, n0 began epoch 3 (same contract, no
// record) and wrote a batch only the log store holds, and died. n2 comes
// back with its old log and is promoted: n1 answers from epoch 2, behind
// the log store's epoch 3, so the survey cannot tell; n2 fences, catches
// up from the log store, finds the epoch 2 record without it, and gives
// up before it starts its epoch, keeping what it copied under the
// donor's history. n0 comes back, n1 promotes past the epoch n2 took,
// and n2 follows it without cutting anything.
func TestRemovedMemberGivesUpOnceCaughtUp(t *testing.T) {
	c, _ := removal(t)
	if err := c.runs["n1"].stop(t); err != nil {
		t.Fatalf("n1 stop: %v", err)
	}
	if err := c.runs["n0"].stop(t); err != nil {
		t.Fatalf("n0 stop: %v", err)
	}
	c.start(t, "n0", RolePrimary)
	c0 := c.conn(t, "n0")
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	testkit.Until(t, "n0 to open epoch 3", func() bool {
		st := status1(t, c0)
		return st.GetEpoch() == 3 && st.GetTakingWrites()
	})
	// Not acknowledged (n1 is down), but written and shipped.
	wctx, wcancel := context.WithTimeout(ctx, 500*time.Millisecond)
	_, _ = walshipv1.NewKVServiceClient(c0).Put(wctx, &walshipv1.PutRequest{Key: "c", Value: []byte("3")})
	wcancel()
	testkit.Until(t, "the log store to hold epoch 3", func() bool {
		st, err := logStoreStatus(ctx, serve.Dialer{}, c.ls)
		return err == nil && st.GetLastEpoch() == 3
	})
	_ = c.runs["n0"].stop(t) // the unacknowledged write may end it with an error

	c.start(t, "n1", RoleReplica)
	n2 := c.start(t, "n2", RoleReplica)
	c2 := c.conn(t, "n2")
	resp, err := walshipv1.NewAdminServiceClient(c2).Promote(ctx, &walshipv1.PromoteRequest{}, grpc.WaitForReady(true))
	if err != nil {
		t.Fatalf("Promote n2: %v (the survey cannot tell it was removed: it should fence and catch up)", err)
	}
	var tl *walshipv1.FailoverTimeline
	testkit.Until(t, "n2's promotion to fail or n2 to start as primary", func() bool {
		if n2.Role() == RolePrimary {
			return true
		}
		st, err := walshipv1.NewAdminServiceClient(c2).Status(ctx, &walshipv1.StatusRequest{})
		tl = st.GetLastFailover()
		return err == nil && tl.GetEpoch() == resp.GetEpoch() && tl.GetFailure() != ""
	})
	if n2.Role() == RolePrimary {
		t.Fatalf("n2, removed from the contract, started as the primary of epoch %d", resp.GetEpoch())
	}
	if !contains(tl.GetFailure(), "gave up epoch", "cannot promote n2", "not a member of the current configuration", "epoch 2: members n0, n1") || tl.GetOpenedUnixNano() != 0 {
		t.Fatalf("n2's timeline: %v; want a failure naming n2 and the contract of epoch 2", tl)
	}
	// It never started its epoch (a restart finds it a replica), and
	// keeps what it copied under the donor's history.
	if h, err := datadir.LoadHistory(vfs.OS, filepath.Join(c.dir, "n2")); err != nil || h.Current().Epoch != 3 {
		t.Fatalf("n2's history after giving up: %v, %v; want epoch 3's last (the donor's), no epoch %d", h, err, resp.GetEpoch())
	}
	// A give-up after fencing is a failure, not a refusal: the promises
	// it took stay (its timeline says why).
	for result, want := range map[string]uint64{"failed": 1, resultNotMember: 0} {
		if got := metricCount(t, n2.cfg.Registry, "walship_promotions_total", "result", result); got != want {
			t.Fatalf("walship_promotions_total{result=%q} = %d, want %d", result, got, want)
		}
	}

	// The promises n2 took are harmless: n0 comes back (a replica now:
	// a newer epoch is promised), n1 promotes to the epoch after, and n2
	// follows it without cutting anything it copied.
	n0 := c.start(t, "n0", RolePrimary)
	testkit.Until(t, "n0 to rejoin as a replica", func() bool {
		_, err := nodeStatus(ctx, serve.Dialer{}, c.members[0].Addr)
		return n0.Role() == RoleReplica && err == nil
	})
	c1 := c.conn(t, "n1")
	if _, err := walshipv1.NewAdminServiceClient(c1).Promote(ctx, &walshipv1.PromoteRequest{}, grpc.WaitForReady(true)); err != nil {
		t.Fatalf("Promote n1 after n2 gave up: %v", err)
	}
	lsn := put(t, c1, "d", "4")
	testkit.Until(t, "n2 to follow n1 up to its write", func() bool {
		st, err := walshipv1.NewAdminServiceClient(c2).Status(ctx, &walshipv1.StatusRequest{})
		return err == nil && st.GetVisibleLsn() >= lsn
	})
	if orphans, err := datadir.ListOrphans(vfs.OS, filepath.Join(c.dir, "n2")); err != nil || len(orphans) != 0 {
		t.Fatalf("n2's orphans after following n1: %v, %v; want none", orphans, err)
	}
}

// TestPeersOutsideTheContractDoNotCount: the contract in the log decides
// who counts for a promotion; --peers only adds nodes to ask. Members
// {n0, n1, n3}, any 1 at flush, n3 never started. n1 loses its disk and
// comes back with --peers {n1, n2}, n2 a node the contract does not name
// (an empty one: it reports no contract). With nothing in its log, n1
// judges by its flags, where n2's promise and its own are a quorum; once
// caught up from the log store, its log holds the contract {n0, n1, n3},
// under which they are not (with n0, the log's primary, left out, both
// n1 and n3 must promise: n3's is missing), and it gives up before it
// starts its epoch.
func TestPeersOutsideTheContractDoNotCount(t *testing.T) {
	c := &cluster{dir: t.TempDir(), nodes: map[string]*Node{}, runs: map[string]*running{}}
	for _, id := range []string{"n0", "n1", "n2", "n3"} {
		c.members = append(c.members, primary.Member{ID: id, Addr: testkit.FreeAddr(t)})
	}
	contract := []primary.Member{c.members[0], c.members[1], c.members[3]}
	peers := map[string][]primary.Member{"n0": contract, "n1": contract}
	c.tweak = func(cfg *Config) { cfg.Members = peers[cfg.ID] }
	c.ls = startLogStore(t, c.dir)
	c.start(t, "n0", RolePrimary)
	c.start(t, "n1", RoleReplica)
	lsn := put(t, c.conn(t, "n0"), "a", "1")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	testkit.Until(t, "the log store to hold the write", func() bool {
		st, err := logStoreStatus(ctx, serve.Dialer{}, c.ls)
		return err == nil && st.GetDurableLsn() >= lsn
	})
	for _, id := range []string{"n1", "n0"} {
		if err := c.runs[id].stop(t); err != nil {
			t.Fatalf("%s stop: %v", id, err)
		}
	}
	if err := os.RemoveAll(filepath.Join(c.dir, "n1")); err != nil {
		t.Fatal(err)
	}

	peers["n1"] = []primary.Member{c.members[1], c.members[2]}
	peers["n2"] = peers["n1"]
	c.start(t, "n2", RoleReplica)
	n1 := c.start(t, "n1", RoleReplica)
	c1 := c.conn(t, "n1")
	resp, err := walshipv1.NewAdminServiceClient(c1).Promote(ctx, &walshipv1.PromoteRequest{}, grpc.WaitForReady(true))
	if err != nil {
		t.Fatalf("Promote n1: %v (its flags make n2 count: the promotion should reach the catch-up)", err)
	}
	var tl *walshipv1.FailoverTimeline
	testkit.Until(t, "n1's promotion to fail or n1 to start as primary", func() bool {
		if n1.Role() == RolePrimary {
			return true
		}
		st, err := walshipv1.NewAdminServiceClient(c1).Status(ctx, &walshipv1.StatusRequest{})
		tl = st.GetLastFailover()
		return err == nil && tl.GetEpoch() == resp.GetEpoch() && tl.GetFailure() != ""
	})
	if n1.Role() == RolePrimary {
		t.Fatalf("n1 started as the primary of epoch %d with the promises of n2, which the contract in its log does not name", resp.GetEpoch())
	}
	if !contains(tl.GetFailure(), "gave up epoch", "members n0, n1", "2 of the 2 sync-eligible members") {
		t.Fatalf("n1's timeline: %v; want a failure naming the contract and what it needs", tl)
	}
	if h, err := datadir.LoadHistory(vfs.OS, filepath.Join(c.dir, "n1")); err != nil || h.Current().Epoch != 1 {
		t.Fatalf("n1's history after giving up: %v, %v; want epoch 1's (the log store's, for what it copied), no epoch %d", h, err, resp.GetEpoch())
	}
}

// TestContractAddressesWinOverPeers: a promotion asks a member the
// contract names at the contract's address as well as at --peers'. n2's
// --peers has n1 at an address where nothing runs (a stale flag): n2's
// promotion still finds n1, whose promise its quorum needs (any 1 at
// flush of {n1, n2}).
func TestContractAddressesWinOverPeers(t *testing.T) {
	c := &cluster{dir: t.TempDir(), nodes: map[string]*Node{}, runs: map[string]*running{}}
	for _, id := range []string{"n0", "n1", "n2"} {
		c.members = append(c.members, primary.Member{ID: id, Addr: testkit.FreeAddr(t)})
	}
	stale := []primary.Member{c.members[0], {ID: "n1", Addr: testkit.FreeAddr(t)}, c.members[2]}
	c.tweak = func(cfg *Config) {
		if cfg.ID == "n2" {
			cfg.Members = stale
		}
	}
	c.ls = startLogStore(t, c.dir)
	c.start(t, "n0", RolePrimary)
	c.start(t, "n1", RoleReplica)
	n2 := c.start(t, "n2", RoleReplica)
	lsn := put(t, c.conn(t, "n0"), "a", "1")
	c2 := c.conn(t, "n2")
	testkit.Until(t, "n2 to follow n0 up to its write", func() bool {
		st := status1(t, c2)
		return st.GetVisibleLsn() >= lsn && len(st.GetContract().GetMembers()) == 3
	})
	if err := c.runs["n0"].stop(t); err != nil {
		t.Fatalf("n0 stop: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	resp, err := walshipv1.NewAdminServiceClient(c2).Promote(ctx, &walshipv1.PromoteRequest{})
	if err != nil {
		t.Fatalf("Promote n2 with a stale --peers address for n1: %v", err)
	}
	testkit.Until(t, "n2 to open as primary", func() bool { p := n2.Primary(); return p != nil && p.TakingWrites() })
	if !slices.Contains(resp.GetTimeline().GetGranted(), "n1") {
		t.Fatalf("n2's promotion: granted %v; want n1 among them", resp.GetTimeline().GetGranted())
	}
}

// TestMovedMemberFoundAtPeersAddress is the mirror of
// TestContractAddressesWinOverPeers: n1 moved to a new address; n1 and n2
// were restarted with --peers naming it, the primary n0 was not (its
// epoch record keeps n1's old address), and n0 dies. n2's promotion needs
// n1's promise (any 1 at flush of {n1, n2}): it asks n1 at both
// addresses and counts the one that answers as n1.
func TestMovedMemberFoundAtPeersAddress(t *testing.T) {
	c := &cluster{dir: t.TempDir(), nodes: map[string]*Node{}, runs: map[string]*running{}}
	for _, id := range []string{"n0", "n1", "n2"} {
		c.members = append(c.members, primary.Member{ID: id, Addr: testkit.FreeAddr(t)})
	}
	moved := []primary.Member{c.members[0], {ID: "n1", Addr: testkit.FreeAddr(t)}, c.members[2]}
	useMoved := false
	c.tweak = func(cfg *Config) {
		if useMoved && cfg.ID != "n0" {
			cfg.Members = moved
			if cfg.ID == "n1" {
				cfg.Listen = moved[1].Addr
			}
		}
	}
	c.ls = startLogStore(t, c.dir)
	c.start(t, "n0", RolePrimary)
	c.start(t, "n1", RoleReplica)
	c.start(t, "n2", RoleReplica)
	lsn := put(t, c.conn(t, "n0"), "a", "1")
	testkit.Until(t, "n2 to follow n0", func() bool {
		st := status1(t, c.conn(t, "n2"))
		return st.GetVisibleLsn() >= lsn && len(st.GetContract().GetMembers()) == 3
	})
	for _, id := range []string{"n1", "n2"} {
		if err := c.runs[id].stop(t); err != nil {
			t.Fatal(err)
		}
	}
	useMoved = true
	c.start(t, "n1", RoleReplica)
	n2 := c.start(t, "n2", RoleReplica)
	lsn = put(t, c.conn(t, "n0"), "b", "2")
	testkit.Until(t, "n2 to follow n0 again", func() bool { return status1(t, c.conn(t, "n2")).GetVisibleLsn() >= lsn })
	if err := c.runs["n0"].stop(t); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	resp, err := walshipv1.NewAdminServiceClient(c.conn(t, "n2")).Promote(ctx, &walshipv1.PromoteRequest{}, grpc.WaitForReady(true))
	if err != nil {
		t.Fatalf("Promote n2 with n1 at its new --peers address, the contract naming the old: %v", err)
	}
	testkit.Until(t, "n2 to open as primary", func() bool { p := n2.Primary(); return p != nil && p.TakingWrites() })
	if !slices.Contains(resp.GetTimeline().GetGranted(), "n1") {
		t.Fatalf("n2's promotion: granted %v; want n1 among them", resp.GetTimeline().GetGranted())
	}
}

// TestAskAtCountsOnlyTheMemberAsked: a member asked at several addresses
// counts once, through the node that answers as it; a node answering
// under another id (an address reused) never counts.
func TestAskAtCountsOnlyTheMemberAsked(t *testing.T) {
	type reply struct {
		id  string
		err error
	}
	down := status.Error(codes.Unavailable, "connection refused")
	tests := []struct {
		name     string
		replies  map[string]reply
		addrs    []string
		wantAddr string
		wantErr  string
	}{
		{"one address", map[string]reply{"a": {id: "n1"}}, []string{"a"}, "a", ""},
		{"reused address", map[string]reply{"a": {id: "n2"}}, []string{"a"}, "", `the node at a answers as "n2", not n1`},
		{"moved: the old address is down", map[string]reply{"a": {err: down}, "b": {id: "n1"}}, []string{"a", "b"}, "b", ""},
		{"moved: the old address reused", map[string]reply{"a": {id: "n2"}, "b": {id: "n1"}}, []string{"a", "b"}, "b", ""},
		{"neither", map[string]reply{"a": {id: "n2"}, "b": {err: down}}, []string{"a", "b"}, "", "connection refused"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			resp, addr, err := askAt(context.Background(), "n1", tt.addrs, func(_ context.Context, addr string) (string, string, error) {
				r := tt.replies[addr]
				return "from " + addr, r.id, r.err
			})
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("askAt: %q, %v; want an error containing %q", resp, err, tt.wantErr)
				}
				return
			}
			if err != nil || addr != tt.wantAddr || resp != "from "+tt.wantAddr {
				t.Fatalf("askAt: %q at %q, %v; want the answer from %s", resp, addr, err, tt.wantAddr)
			}
		})
	}
}

// TestLaggingReplicaDoesNotBlockTheMostAdvanced: two contract records in
// one epoch (a run-time add of x: R1 {p, m}, then R2 {p, m, x}). x holds
// both and is the most advanced log; m lags, holding R1 only. x leads
// under its own newest record and needs no catch-up (it is its own
// donor): m's older record must not refuse it.
func TestLaggingReplicaDoesNotBlockTheMostAdvanced(t *testing.T) {
	ls := startLogStore(t, t.TempDir())
	addrs := map[string]string{"p": testkit.FreeAddr(t), "m": testkit.FreeAddr(t), "x": testkit.FreeAddr(t)}
	mem := func(ids ...string) []*walshipv1.Member {
		var out []*walshipv1.Member
		for _, id := range ids {
			out = append(out, &walshipv1.Member{Id: id, Addr: addrs[id]})
		}
		return out
	}
	r1 := &walshipv1.EpochRecord{Epoch: 1, FirstLsn: 1, PrimaryId: "p", PrimaryAddr: addrs["p"], Contract: &walshipv1.Contract{Members: mem("p", "m"), Logstores: []string{ls}}}
	r2 := &walshipv1.EpochRecord{Epoch: 1, FirstLsn: 1, PrimaryId: "p", PrimaryAddr: addrs["p"], Contract: &walshipv1.Contract{Members: mem("p", "m", "x"), Logstores: []string{ls}}}
	root := t.TempDir()
	startNode := func(id string, recs ...*walshipv1.EpochRecord) *Node {
		dir := filepath.Join(root, id)
		for i, rec := range recs {
			writeEpochRecord(t, dir, rec, uint64(1+2*i))
		}
		p := primary.DefaultConfig()
		p.HeartbeatInterval, p.LeaseTimeout, p.StopTimeout = 100*time.Millisecond, 300*time.Millisecond, 5*time.Second
		r := replica.DefaultConfig()
		r.HeartbeatInterval, r.StopTimeout = 100*time.Millisecond, 5*time.Second
		r.Primary = addrs["p"] // nobody
		// --peers as R2 names them: a node without --peers does not
		// promote over a log naming other members (peerlessUnder).
		peers := []primary.Member{{ID: "p", Addr: addrs["p"]}, {ID: "m", Addr: addrs["m"]}, {ID: "x", Addr: addrs["x"]}}
		n, err := New(Config{ID: id, DataDir: dir, Listen: addrs[id], Members: peers, LogStores: []string{ls}, Role: RoleReplica,
			Primary: p, Replica: r, Registry: serve.NewRegistry(), Logger: testLogger()})
		if err != nil {
			t.Fatal(err)
		}
		run(t, n.Run)
		testkit.Until(t, id+" to report its contract", func() bool { rep := n.Replica(); return rep != nil && rep.EpochRecord() != nil })
		return n
	}
	startNode("m", r1)
	x := startNode("x", r1, r2)
	if got := len(x.Replica().EpochRecord().GetContract().GetMembers()); got != 3 {
		t.Fatalf("x reports %d members, want 3 (R2)", got)
	}
	conn, err := serve.Dialer{}.Dial(x.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	resp, err := walshipv1.NewAdminServiceClient(conn).Promote(ctx, &walshipv1.PromoteRequest{DryRun: true}, grpc.WaitForReady(true))
	t.Logf("dry run of x: quorum %v donor-highest %d err %v", resp.GetQuorum(), resp.GetHighestLsn(), err)
	if err != nil {
		t.Fatalf("x, a member of its own newest record and the most advanced log, refused: %v", err)
	}
}

// TestRecordUpToAfterACut: after a promotion's catch-up cuts its log's
// tail, the log's newest epoch record is the last one at or below the LSN
// kept (in the entries after the applied LSN, else the applied state's),
// not one the tail held.
func TestRecordUpToAfterACut(t *testing.T) {
	dir := t.TempDir()
	recs := make([]*walshipv1.EpochRecord, 3)
	for i := range recs {
		var ms []*walshipv1.Member
		for j := 0; j <= i; j++ {
			ms = append(ms, &walshipv1.Member{Id: fmt.Sprintf("n%d", j), Addr: "a:1"})
		}
		recs[i] = &walshipv1.EpochRecord{Epoch: 1, FirstLsn: 1, PrimaryId: "n0", Contract: &walshipv1.Contract{Members: ms}}
		writeEpochRecord(t, dir, recs[i], uint64(1+2*i)) // LSNs 1-2, 3-4, 5-6
	}
	log, err := wal.Open(wal.Options{Dir: filepath.Join(dir, "wal"), FS: vfs.OS})
	if err != nil {
		t.Fatal(err)
	}
	defer log.Close()
	if err := log.TruncateAfter(4); err != nil {
		t.Fatal(err)
	}
	applied := &walshipv1.EpochRecord{Epoch: 1, PrimaryId: "applied"}
	for _, tt := range []struct {
		applied uint64
		state   *walshipv1.EpochRecord
		want    *walshipv1.EpochRecord
	}{
		{0, nil, recs[1]},
		{2, applied, recs[1]},
		{4, applied, applied},
	} {
		got, err := recordUpTo(context.Background(), log, tt.applied, tt.state)
		if err != nil || !proto.Equal(got, tt.want) {
			t.Fatalf("recordUpTo(applied %d) = %v, %v; want %v", tt.applied, got, err, tt.want)
		}
	}
}

// TestPeerlessNodeDoesNotPromoteOverChangedLog: a node without --peers
// whose log's configuration a membership change set (members_changed)
// is refused before anything is fenced, as the primary it would become
// refuses to start (services/primary elect): promoted, it would fence the
// log stores — deposing the cluster's primary — and then not open.
//
// So is one whose log's members came from --peers alone (no change set
// them) but name another node: the primary would refuse that log too.
func TestPeerlessNodeDoesNotPromoteOverChangedLog(t *testing.T) {
	for _, tc := range []struct {
		name    string
		changed bool
		why     string
	}{
		{"changed", true, "set by a membership change"},
		{"from --peers", false, "names other members"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ls := startLogStore(t, t.TempDir())
			c := &walshipv1.Contract{Members: memberList("p", "x", "m"), Logstores: []string{ls}, MembersChanged: tc.changed}
			rec := &walshipv1.EpochRecord{Epoch: 1, FirstLsn: 1, PrimaryId: "p", PrimaryAddr: "p.invalid:1", Contract: c}
			n := recordReplica(t, "x", ls, rec, nil)
			conn, err := serve.Dialer{}.Dial(n.Addr())
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			for _, dry := range []bool{true, false} {
				_, err := walshipv1.NewAdminServiceClient(conn).Promote(ctx, &walshipv1.PromoteRequest{DryRun: dry}, grpc.WaitForReady(true))
				if status.Code(err) != codes.FailedPrecondition || !contains(err.Error(), "cannot promote x", "without --peers", "epoch 1", tc.why) {
					t.Fatalf("Promote (dry run %v) = %v; want FAILED_PRECONDITION naming x, --peers, the contract and %q", dry, err, tc.why)
				}
			}
			st, err := logStoreStatus(ctx, serve.Dialer{}, ls)
			if err != nil || st.GetVoteEpoch() > 1 || n.Role() != RoleReplica {
				t.Fatalf("after x's refused promotion: log store %v, %v; x %v; want nothing fenced and x a replica", st, err, n.Role())
			}
		})
	}
}

// TestPeerlessNodeRefusedByTheContractAhead: a node without --peers whose
// own log's newest record was set by no change, but whose survey finds a
// member, m, whose log reaches the newest epoch further and holds a
// record a membership change set, is refused before anything is fenced,
// as a node whose own log holds one is: caught up from m, it would give up
// (the primary it would become does not start without --peers), leaving
// promises of an epoch that never opens (seen: the log store promised
// epoch 2 to x, whose timeline said "gave up epoch 2 once caught up from
// m"). sync_replicas 1, so that the survey waits for m's answer. x's own
// record names other members, which refuses a peerless promotion by
// itself now (failover.BindsPeerless); either refusal comes before
// anything is fenced.
func TestPeerlessNodeRefusedByTheContractAhead(t *testing.T) {
	ls := startLogStore(t, t.TempDir())
	changed := &walshipv1.EpochRecord{Epoch: 1, FirstLsn: 1, PrimaryId: "p", PrimaryAddr: "p.invalid:1",
		Contract: &walshipv1.Contract{Members: memberList("p", "x", "m"), Logstores: []string{ls}, SyncReplicas: 1},
		Stage:    walshipv1.MembershipStage_MEMBERSHIP_STAGE_UNSPECIFIED}
	mDir := filepath.Join(t.TempDir(), "m")
	writeEpochRecord(t, mDir, changed, 1)
	final := proto.Clone(changed).(*walshipv1.EpochRecord)
	final.Contract.MembersChanged, final.Stage = true, walshipv1.MembershipStage_MEMBERSHIP_STAGE_FINAL
	writeEpochRecord(t, mDir, final, 3)
	m := replicaOfNobody(t, "m", mDir, ls, nil)
	testkit.Until(t, "m to report the changed contract", func() bool {
		return m.Replica().EpochRecord().GetContract().GetMembersChanged()
	})

	plain := proto.Clone(changed).(*walshipv1.EpochRecord)
	plain.Contract.Members = []*walshipv1.Member{{Id: "p", Addr: "p.invalid:1"}, {Id: "x", Addr: "x.invalid:1"}, {Id: "m", Addr: m.Addr()}}
	x := recordReplica(t, "x", ls, plain, nil)
	conn, err := serve.Dialer{}.Dial(x.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, dry := range []bool{true, false} {
		_, err := walshipv1.NewAdminServiceClient(conn).Promote(ctx, &walshipv1.PromoteRequest{DryRun: dry}, grpc.WaitForReady(true))
		if status.Code(err) != codes.FailedPrecondition || !contains(err.Error(), "cannot promote x", "without --peers") {
			t.Fatalf("Promote (dry run %v) = %v; want FAILED_PRECONDITION naming x and --peers", dry, err)
		}
	}
	st, err := logStoreStatus(ctx, serve.Dialer{}, ls)
	if err != nil || st.GetVoteEpoch() > 1 || x.Role() != RoleReplica {
		t.Fatalf("after x's refused promotion: log store %v, %v; x %v; want nothing fenced and x a replica", st, err, x.Role())
	}
}
