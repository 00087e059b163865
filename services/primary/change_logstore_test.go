package primary

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	walshipv1 "github.com/walship/walship/gen/walship/v1"
	"github.com/walship/walship/internal/testkit"
	"github.com/walship/walship/internal/vfs"
	"github.com/walship/walship/services/logstore"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
)

// Log store membership change tests: a real primary p1 of members p1,
// r1, r2 (no replica needed: sync_replicas 0) committing under log store
// sync, and real log stores on loopback, each on a MemFS of its own.

// testLogStore is a log store served in-process.
type testLogStore struct {
	s      *logstore.Server
	fs     *vfs.MemFS
	addr   string
	cancel context.CancelFunc
	done   chan error
}

// startTestLogStore starts a log store on fs at listen ("" for any
// port), refilling from peers when it starts empty.
func startTestLogStore(t *testing.T, fs *vfs.MemFS, listen string, peers ...string) *testLogStore {
	t.Helper()
	cfg := logstore.DefaultConfig()
	cfg.Listen, cfg.MetricsListen, cfg.DataDir, cfg.FS = "127.0.0.1:0", "", "/ls", fs
	if listen != "" {
		cfg.Listen = listen
	}
	cfg.Peers = peers
	cfg.StopTimeout = 5 * time.Second
	s, err := logstore.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	l := &testLogStore{s: s, fs: fs, addr: s.Addr(), cancel: cancel, done: make(chan error, 1)}
	go func() { l.done <- s.Run(ctx) }()
	t.Cleanup(l.stop)
	return l
}

func (l *testLogStore) stop() {
	if l.cancel == nil {
		return
	}
	l.cancel()
	l.cancel = nil
	<-l.done
}

// logStoreCluster is p1 and its log stores by name.
type logStoreCluster struct {
	cfg Config
	p   *running
	ls  map[string]*testLogStore
}

// startLogStoreCluster starts the log stores names (a, b, ...) and p1
// shipping to them, under log store sync.
func startLogStoreCluster(t *testing.T, names ...string) *logStoreCluster {
	t.Helper()
	return startLogStoreClusterWith(t, nil, names...)
}

// startLogStoreClusterWith is startLogStoreCluster with edit applied to
// p1's configuration before it starts.
func startLogStoreClusterWith(t *testing.T, edit func(*Config), names ...string) *logStoreCluster {
	t.Helper()
	c := &logStoreCluster{ls: map[string]*testLogStore{}}
	c.cfg = testConfig(t, t.TempDir())
	c.cfg.ID = "p1"
	for _, n := range names {
		c.ls[n] = startTestLogStore(t, vfs.NewMem(), "")
		c.cfg.LogStores = append(c.cfg.LogStores, c.ls[n].addr)
	}
	c.cfg.Members = []Member{{"p1", "127.0.0.1:1"}, {"r1", "127.0.0.1:2"}, {"r2", "127.0.0.1:3"}}
	c.cfg.Policy.LogStore = walshipv1.LogStoreAck_LOG_STORE_ACK_SYNC
	c.cfg.Policy.SyncTimeout = time.Minute
	c.cfg.LeaseTimeout = 2 * time.Second
	c.cfg.ChangeResumeGrace = 2 * time.Second
	if edit != nil {
		edit(&c.cfg)
	}
	c.start(t)
	return c
}

func (c *logStoreCluster) start(t *testing.T) {
	t.Helper()
	mc := &memberCluster{cfg: c.cfg}
	mc.startPrimary(t)
	c.p = mc.p
	waitServing(t, c.p.conn)
	c.cfg.Listen = c.p.s.Addr()
}

// addrs are the addresses of the log stores names.
func (c *logStoreCluster) addrs(names ...string) []string {
	var out []string
	for _, n := range names {
		out = append(out, c.ls[n].addr)
	}
	return out
}

// lsPut writes key under log store sync, waiting at most timeout for the
// log stores.
func lsPut(r *running, key string, timeout time.Duration) error {
	c, cancel := context.WithTimeout(context.Background(), timeout+time.Minute)
	defer cancel()
	_, err := r.kv.Put(c, &walshipv1.PutRequest{Key: key, Value: []byte("v"), Policy: &walshipv1.CommitPolicy{
		Logstore: walshipv1.LogStoreAck_LOG_STORE_ACK_SYNC, SyncTimeout: durationpb.New(timeout)}})
	return err
}

func changeLogStores(t *testing.T, r *running, req *walshipv1.ChangeMembersRequest) *walshipv1.ChangeMembersResponse {
	t.Helper()
	c, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	resp, err := r.admin.ChangeMembers(c, req)
	if err != nil {
		t.Fatalf("ChangeMembers %v: %v", req, err)
	}
	if !resp.GetDone() || resp.GetOutcome() != outcomeDone || resp.GetStage() != walshipv1.MembershipStage_MEMBERSHIP_STAGE_FINAL {
		t.Fatalf("ChangeMembers %v: %v", req, resp)
	}
	return resp
}

func addLogStore(addr string) *walshipv1.ChangeMembersRequest {
	return &walshipv1.ChangeMembersRequest{Change: &walshipv1.ChangeMembersRequest_AddLogstore{AddLogstore: addr}}
}

func removeLogStore(addr string) *walshipv1.ChangeMembersRequest {
	return &walshipv1.ChangeMembersRequest{Change: &walshipv1.ChangeMembersRequest_RemoveLogstore{RemoveLogstore: addr}}
}

func replaceReq(old, new string) *walshipv1.ChangeMembersRequest {
	return &walshipv1.ChangeMembersRequest{Change: &walshipv1.ChangeMembersRequest_ReplaceLogstore{
		ReplaceLogstore: &walshipv1.LogStoreReplacement{Old: old, New: new}}}
}

// wantLogStores fails unless the contract in force names exactly addrs,
// with no change in progress, and the primary ships to them alone.
func wantLogStores(t *testing.T, s *Server, addrs []string) {
	t.Helper()
	c := s.contract()
	if !slices.Equal(c.GetLogstores(), addrs) || c.GetNext() != nil || len(c.GetLogstoreLearners()) > 0 || !c.GetMembersChanged() {
		t.Fatalf("contract log stores %v next %v learners %v (members_changed %v), want %v",
			c.GetLogstores(), c.GetNext(), c.GetLogstoreLearners(), c.GetMembersChanged(), addrs)
	}
	testkit.Until(t, "the primary to ship to "+strings.Join(addrs, ",")+" alone", func() bool {
		_, ls := s.peers.snapshot()
		var got []string
		for _, l := range ls {
			got = append(got, l.addr)
		}
		want := slices.Clone(addrs)
		slices.Sort(want)
		return slices.Equal(got, want)
	})
}

// holdsAll waits until the log store l has made the primary's whole log
// durable, from LSN 1.
func holdsAll(t *testing.T, s *Server, name string, l *testLogStore) {
	t.Helper()
	testkit.Until(t, name+" to hold the primary's whole log", func() bool {
		st := l.s.Status()
		return st.GetFirstLsn() == 1 && st.GetDurableLsn() >= s.wal.DurableLSN()
	})
}

// TestGrowLogStoresUnderSync: a cluster of one log store grows to three
// by two run-time changes, each new log store empty, refilling from its
// peers, a learner until caught up, then counting: with one of the three
// down commits go on (2 of 3), with two they wait ("1 of 3").
func TestGrowLogStoresUnderSync(t *testing.T) {
	c := startLogStoreCluster(t, "a")
	for i := range 20 {
		if err := lsPut(c.p, "k"+string(rune('a'+i)), time.Minute); err != nil {
			t.Fatal(err)
		}
	}
	c.ls["b"] = startTestLogStore(t, vfs.NewMem(), "", c.ls["a"].addr)
	changeLogStores(t, c.p, addLogStore(c.ls["b"].addr))
	wantLogStores(t, c.p.s, c.addrs("a", "b"))
	if got := counter(t, c.p.s.metrics.changes.WithLabelValues(outcomeDone)); got != 1 {
		t.Fatalf("walship_membership_changes_total{outcome=done} = %v", got)
	}
	c.ls["c"] = startTestLogStore(t, vfs.NewMem(), "", c.ls["a"].addr, c.ls["b"].addr)
	changeLogStores(t, c.p, addLogStore(c.ls["c"].addr))
	wantLogStores(t, c.p.s, c.addrs("a", "b", "c"))
	if err := lsPut(c.p, "three", time.Minute); err != nil {
		t.Fatal(err)
	}
	holdsAll(t, c.p.s, "b", c.ls["b"])
	holdsAll(t, c.p.s, "c", c.ls["c"])
	ms := listMembers(t, c.p)
	for _, n := range []string{"a", "b", "c"} {
		if !slices.ContainsFunc(ms.GetMembers(), func(m *walshipv1.MemberStatus) bool {
			return m.GetId() == c.ls[n].addr && m.GetRole() == walshipv1.Role_ROLE_LOGSTORE && m.GetVoice() == walshipv1.MemberVoice_MEMBER_VOICE_VOTER
		}) {
			t.Fatalf("ListMembers does not show log store %s as a voter: %v", n, ms)
		}
	}

	c.ls["a"].stop()
	if err := lsPut(c.p, "two-of-three", time.Minute); err != nil {
		t.Fatalf("a commit with 2 of the 3 log stores up: %v", err)
	}
	c.ls["b"].stop()
	wantStatus(t, lsPut(c.p, "one-of-three", 300*time.Millisecond), codes.Unavailable, "1 of 3 log store(s) have it, 2 needed")
}

// TestRemoveDeadLogStore: a dead log store is removed without its
// cooperation: the primary stops shipping to it, and commits need 2 of the
// 2 left.
func TestRemoveDeadLogStore(t *testing.T) {
	c := startLogStoreCluster(t, "a", "b", "c")
	if err := lsPut(c.p, "before", time.Minute); err != nil {
		t.Fatal(err)
	}
	c.ls["c"].stop()
	changeLogStores(t, c.p, removeLogStore(c.ls["c"].addr))
	wantLogStores(t, c.p.s, c.addrs("a", "b"))
	if err := lsPut(c.p, "after", time.Minute); err != nil {
		t.Fatal(err)
	}
	if !c.p.s.HasLease() {
		t.Fatal("no lease with both log stores of the contract up")
	}
	c.ls["b"].stop()
	wantStatus(t, lsPut(c.p, "one-of-two", 300*time.Millisecond), codes.Unavailable, "1 of 2 log store(s) have it, 2 needed")
}

// TestReplaceLogStore: a dead log store is replaced with an empty one at
// a new address, which refills from its peers and ends holding the whole
// log in the dead one's place; a primary restarted with the old
// --logstore list keeps the log's log stores (with the dead one counted,
// one more down would stop its commits).
func TestReplaceLogStore(t *testing.T) {
	c := startLogStoreCluster(t, "a", "b", "c")
	for i := range 20 {
		if err := lsPut(c.p, "k"+string(rune('a'+i)), time.Minute); err != nil {
			t.Fatal(err)
		}
	}
	c.ls["c"].stop()
	c.ls["d"] = startTestLogStore(t, vfs.NewMem(), "", c.ls["a"].addr, c.ls["b"].addr)
	changeLogStores(t, c.p, replaceReq(c.ls["c"].addr, c.ls["d"].addr))
	wantLogStores(t, c.p.s, c.addrs("a", "b", "d"))
	if err := lsPut(c.p, "replaced", time.Minute); err != nil {
		t.Fatal(err)
	}
	holdsAll(t, c.p.s, "d", c.ls["d"])

	if err := c.p.stop(t); err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(c.cfg.LogStores, c.addrs("a", "b", "c")) {
		t.Fatalf("--logstore %v", c.cfg.LogStores)
	}
	c.start(t)
	if got := c.p.s.contract().GetLogstores(); !slices.Equal(got, c.addrs("a", "b", "d")) {
		t.Fatalf("the restarted primary's log stores %v, want the log's %v", got, c.addrs("a", "b", "d"))
	}
	c.ls["a"].stop()
	if err := lsPut(c.p, "after-restart", time.Minute); err != nil {
		t.Fatalf("a commit with b and d up after a restart with --logstore a,b,c: %v", err)
	}
}

// TestJointLogStoreCommitNeedsBothSets: while a change from log stores
// {a, b, c} to {a, d, e} is joint, a commit needs a majority of each: with
// d's and e's disks stalled (they still echo the lease) a commit a, b and
// c made durable waits, and one whose time runs out names both counts;
// once e's disk returns, it is acknowledged.
func TestJointLogStoreCommitNeedsBothSets(t *testing.T) {
	c := startLogStoreCluster(t, "a", "b", "c")
	c.ls["d"] = startTestLogStore(t, vfs.NewMem(), "", c.addrs("a", "b", "c")...)
	c.ls["e"] = startTestLogStore(t, vfs.NewMem(), "", c.addrs("a", "b", "c")...)
	s := c.p.s
	old := stripped(s.contract())
	learning := proto.Clone(old).(*walshipv1.Contract)
	learning.LogstoreLearners = c.addrs("d", "e")
	lsn, err := s.writeRecord(ctx(t), s.epochRecord(learning, walshipv1.MembershipStage_MEMBERSHIP_STAGE_LEARNER))
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range []string{"d", "e"} {
		testkit.Until(t, n+" to take the learner record from the primary", func() bool {
			_, ls := s.peers.snapshot()
			return slices.ContainsFunc(ls, func(l logstorePos) bool { return l.addr == c.ls[n].addr && l.connected && l.durable >= lsn }) &&
				s.lease.heard(c.ls[n].addr)
		})
	}
	next := proto.Clone(old).(*walshipv1.Contract)
	next.Logstores = c.addrs("a", "d", "e")
	if _, err := s.writeRecord(ctx(t), s.epochRecord(joint(old, next), walshipv1.MembershipStage_MEMBERSHIP_STAGE_JOINT)); err != nil {
		t.Fatal(err)
	}
	testkit.Until(t, "the lease under the joint contract", s.HasLease)

	enteredD, releaseD := c.ls["d"].fs.HoldNextSync(".wal")
	t.Cleanup(releaseD)
	enteredE, releaseE := c.ls["e"].fs.HoldNextSync(".wal")
	t.Cleanup(releaseE)
	done := make(chan error, 1)
	go func() { done <- lsPut(c.p, "joint", 20*time.Second) }()
	for _, entered := range []<-chan struct{}{enteredD, enteredE} {
		select {
		case <-entered:
		case err := <-done:
			t.Fatalf("the commit returned (%v) before d's and e's disks took it", err)
		}
	}
	testkit.Until(t, "a, b and c to make the commit durable", func() bool {
		for _, n := range []string{"a", "b", "c"} {
			if c.ls[n].s.Status().GetDurableLsn() < s.wal.DurableLSN() {
				return false
			}
		}
		return true
	})
	short, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	if err := s.peers.waitLogStores(short, s.wal.DurableLSN()); err == nil || err.Error() !=
		"3 of 3 log store(s) have it, 2 needed; and of the configuration a membership change goes to, 1 of 3 log store(s) have it, 2 needed" {
		t.Fatalf("a wait for the log stores while d's and e's disks stall: %v", err)
	}
	select {
	case err := <-done:
		t.Fatalf("a commit a majority of the new log stores does not hold returned: %v", err)
	default:
	}
	if !s.HasLease() {
		t.Fatal("the primary lost its lease while the new log stores' disks stalled (they echo it)")
	}
	releaseE()
	if err := <-done; err != nil {
		t.Fatalf("the commit a and e acknowledge in the new set: %v", err)
	}
}

// TestJointLogStoreRecordWaitsUnderAsync: under a contract that waits
// for nobody (log store async, no sync replicas: the default policy), a
// joint record that moves log stores, {a, b, c} to {a, b, d} with c down,
// is done only once a majority of each set holds it: with b's disk
// stalled, a and d holding it is not enough (a is 1 of the old set), for
// the next record moves the lease to the new set, and a candidate that
// fenced b and c would find no joint record there (failover's
// TestSimLogStoreChangeK0). Once b's disk returns, the step is done.
func TestJointLogStoreRecordWaitsUnderAsync(t *testing.T) {
	c := startLogStoreClusterWith(t, func(cfg *Config) { cfg.Policy.LogStore = walshipv1.LogStoreAck_LOG_STORE_ACK_ASYNC }, "a", "b", "c")
	c.ls["d"] = startTestLogStore(t, vfs.NewMem(), "", c.addrs("a", "b", "c")...)
	s := c.p.s
	old := stripped(s.contract())
	if old.GetLogstoreSync() || old.GetSyncReplicas() != 0 {
		t.Fatalf("contract %v, want one that waits for nobody", old)
	}
	learning := proto.Clone(old).(*walshipv1.Contract)
	learning.LogstoreLearners = c.addrs("d")
	lsn, err := s.writeRecord(ctx(t), s.epochRecord(learning, walshipv1.MembershipStage_MEMBERSHIP_STAGE_LEARNER))
	if err != nil {
		t.Fatal(err)
	}
	testkit.Until(t, "d to take the learner record from the primary", func() bool {
		_, ls := s.peers.snapshot()
		return slices.ContainsFunc(ls, func(l logstorePos) bool { return l.addr == c.ls["d"].addr && l.connected && l.durable >= lsn }) &&
			s.lease.heard(c.ls["d"].addr)
	})
	c.ls["c"].stop()
	enteredB, releaseB := c.ls["b"].fs.HoldNextSync(".wal")
	t.Cleanup(releaseB)
	next := proto.Clone(old).(*walshipv1.Contract)
	next.Logstores = c.addrs("a", "b", "d")
	done := make(chan error, 1)
	go func() {
		done <- s.changeStep(ctx(t), joint(old, next), walshipv1.MembershipStage_MEMBERSHIP_STAGE_JOINT)
	}()
	select {
	case <-enteredB:
	case err := <-done:
		t.Fatalf("the joint record's step returned (%v) before b's disk took it", err)
	}
	testkit.Until(t, "a and d to make the joint record durable", func() bool {
		return c.ls["a"].s.Status().GetDurableLsn() >= s.wal.LastLSN() && c.ls["d"].s.Status().GetDurableLsn() >= s.wal.LastLSN()
	})
	select {
	case err := <-done:
		t.Fatalf("the joint record moving log stores was done (%v) while only a held it of the old set {a, b, c}", err)
	default:
	}
	releaseB()
	if err := <-done; err != nil {
		t.Fatalf("the joint record once a and b hold it: %v", err)
	}
}

// TestChangeLogStoresRefused: each wrong log store change is refused with
// a clear status naming the field, and changes nothing; a second change
// while one is in progress is refused naming it.
func TestChangeLogStoresRefused(t *testing.T) {
	c := startLogStoreCluster(t, "a", "b")
	s := c.p.s
	before := proto.Clone(s.contract()).(*walshipv1.Contract)
	ours := s.cluster.ID()
	foreign := startTestLogStore(t, vfs.NewMem(), "")
	foreignFence(t, foreign.addr)
	node := fakeNode(t, "r9", walshipv1.Role_ROLE_REPLICA, ours)
	closed := closedAddr(t)
	a, b := c.ls["a"].addr, c.ls["b"].addr
	for _, tc := range []struct {
		name string
		req  *walshipv1.ChangeMembersRequest
		code codes.Code
		subs []string
	}{
		{"add no address", addLogStore(""), codes.InvalidArgument, []string{"add_logstore: required"}},
		{"add a bad address", addLogStore("a b"), codes.InvalidArgument, []string{`add_logstore: "a b" is not a log store address`}},
		{"add one of the contract", addLogStore(a), codes.InvalidArgument, []string{"add_logstore: " + a + " is already a log store of the contract"}},
		{"add an address that does not answer", addLogStore(closed), codes.FailedPrecondition, []string{"add_logstore: " + closed + " does not answer"}},
		{"add a data node", addLogStore(node), codes.FailedPrecondition, []string{"add_logstore: " + node + " is not a log store"}},
		{"add a log store of another cluster", addLogStore(foreign.addr), codes.FailedPrecondition, []string{"add_logstore:", "cluster id mismatch", clusterB, ours}},
		{"remove no address", removeLogStore(""), codes.InvalidArgument, []string{"remove_logstore: required"}},
		{"remove one not in the contract", removeLogStore(closed), codes.InvalidArgument, []string{"remove_logstore: " + closed + " is not a log store of the contract"}},
		{"replace nothing", &walshipv1.ChangeMembersRequest{Change: &walshipv1.ChangeMembersRequest_ReplaceLogstore{}}, codes.InvalidArgument, []string{"replace_logstore: required"}},
		{"replace one not in the contract", replaceReq(closed, foreign.addr), codes.InvalidArgument, []string{"replace_logstore.old: " + closed + " is not a log store"}},
		{"replace with one of the contract", replaceReq(a, b), codes.InvalidArgument, []string{"replace_logstore.new: " + b + " is already a log store"}},
		{"replace with one that does not answer", replaceReq(a, closed), codes.FailedPrecondition, []string{"replace_logstore.new: " + closed + " does not answer"}},
	} {
		_, err := c.p.admin.ChangeMembers(ctx(t), tc.req)
		wantStatus(t, err, tc.code, tc.subs...)
		if !proto.Equal(s.contract(), before) {
			t.Fatalf("%s changed the contract to %v", tc.name, s.contract())
		}
	}

	// A log store that answers but cannot take the primary's stream in
	// time (it refills from a peer that never answers): the learner stage
	// runs out and the change is abandoned; meanwhile a second change is
	// refused naming it.
	first := make(chan *walshipv1.ChangeMembersResponse, 1)
	fresh := startTestLogStore(t, vfs.NewMem(), "", closed) // its only peer never answers: it refills for ever
	go func() {
		resp, err := c.p.admin.ChangeMembers(ctx(t), &walshipv1.ChangeMembersRequest{
			Change: addLogStore(fresh.addr).Change, CatchUpTimeout: durationpb.New(3 * time.Second)})
		if err != nil {
			t.Error(err)
		}
		first <- resp
	}()
	testkit.Until(t, "the learner stage", func() bool {
		return slices.Equal(s.contract().GetLogstoreLearners(), []string{fresh.addr})
	})
	if ms := listMembers(t, c.p); ms.GetStage() != walshipv1.MembershipStage_MEMBERSHIP_STAGE_LEARNER ||
		!slices.ContainsFunc(ms.GetMembers(), func(m *walshipv1.MemberStatus) bool {
			return m.GetId() == fresh.addr && m.GetVoice() == walshipv1.MemberVoice_MEMBER_VOICE_LEARNER && m.GetRole() == walshipv1.Role_ROLE_LOGSTORE
		}) {
		t.Fatalf("ListMembers during the learner stage: %v", ms)
	}
	_, err := c.p.admin.ChangeMembers(ctx(t), removeLogStore(b))
	wantStatus(t, err, codes.FailedPrecondition, "a membership change is in progress", "log store learners "+fresh.addr)
	if resp := <-first; !resp.GetDone() || resp.GetOutcome() != outcomeAbandoned {
		t.Fatalf("a log store learner that never caught up: %v", resp)
	}
	if got := s.contract().GetLogstores(); !slices.Equal(got, []string{a, b}) || len(s.contract().GetLogstoreLearners()) > 0 {
		t.Fatalf("after the abandoned change: log stores %v learners %v", got, s.contract().GetLogstoreLearners())
	}
	wantShipsTo(t, s, a, b)
}

// wantShipsTo waits until the primary ships to addrs alone.
func wantShipsTo(t *testing.T, s *Server, addrs ...string) {
	t.Helper()
	want := slices.Sorted(slices.Values(addrs))
	testkit.Until(t, "the primary to ship to "+strings.Join(want, ",")+" alone", func() bool {
		_, ls := s.peers.snapshot()
		var got []string
		for _, l := range ls {
			got = append(got, l.addr)
		}
		return slices.Equal(got, want)
	})
}

// foreignFence makes the log store at addr one of cluster clusterB: a
// fence of that cluster's candidate.
func foreignFence(t *testing.T, addr string) {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_, err = walshipv1.NewEpochServiceClient(conn).Fence(ctx(t), &walshipv1.FenceRequest{Epoch: 1, CandidateId: "x1", CandidateAddr: "127.0.0.1:9", ClusterId: clusterB})
	if err != nil {
		t.Fatal(err)
	}
}

// TestNewPrimaryResumesLogStoreJoint: a primary whose log ends in the
// joint record of a log store change opens its next epoch under it (with
// --logstore still the old set) and finishes the change when the log
// store it adds connects, or rolls it back when it does not; every
// acknowledged write is there.
func TestNewPrimaryResumesLogStoreJoint(t *testing.T) {
	for _, tc := range []struct {
		name    string
		up      bool // the log store added is running
		outcome string
		stage   walshipv1.MembershipStage
	}{
		{"finish", true, outcomeDone, walshipv1.MembershipStage_MEMBERSHIP_STAGE_FINAL},
		{"roll back", false, outcomeRolledBack, walshipv1.MembershipStage_MEMBERSHIP_STAGE_ROLLED_BACK},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := startLogStoreCluster(t, "a", "b", "c")
			added := closedAddr(t)
			if tc.up {
				c.ls["d"] = startTestLogStore(t, vfs.NewMem(), "", c.addrs("a", "b", "c")...)
				added = c.ls["d"].addr
			}
			s := c.p.s
			// The primary opens on the echoes of a majority of {a, b, c}:
			// its stream to a or b may still be starting. The joint record
			// below names an added store that echoes nothing (closed, or
			// refilling), so its half {a, b, added} holds the lease on a
			// and b alone; written before both echo, the lease rests on a
			// stream just starting and may lapse (as it should: no
			// majority of that half is heard). ChangeMembers never gets
			// there: it makes a log store count only once it echoes.
			testkit.Until(t, "a and b to echo the primary's heartbeats", func() bool {
				return s.lease.heard(c.ls["a"].addr) && s.lease.heard(c.ls["b"].addr)
			})
			old := stripped(s.contract())
			next := proto.Clone(old).(*walshipv1.Contract)
			next.Logstores = []string{c.ls["a"].addr, c.ls["b"].addr, added}
			if _, err := s.writeRecord(ctx(t), s.epochRecord(joint(old, next), walshipv1.MembershipStage_MEMBERSHIP_STAGE_JOINT)); err != nil {
				t.Fatal(err)
			}
			if err := lsPut(c.p, "acked", time.Minute); err != nil {
				t.Fatal(err)
			}
			if err := c.p.stop(t); err != nil {
				t.Fatal(err)
			}
			c.start(t)
			testkit.Until(t, "the change to be "+tc.outcome, func() bool {
				return counter(t, c.p.s.metrics.changes.WithLabelValues(tc.outcome)) == 1
			})
			want := next.GetLogstores()
			if !tc.up {
				want = old.GetLogstores()
			}
			if f := c.p.s.inForce.Load(); f.stage != tc.stage {
				t.Fatalf("the last record after the new primary's %s: stage %v", tc.name, f.stage)
			}
			wantLogStores(t, c.p.s, want)
			got, err := c.p.kv.Get(ctx(t), &walshipv1.GetRequest{Key: "acked"})
			if err != nil || string(got.GetValue()) != "v" {
				t.Fatalf("the acknowledged write: %v, %v", got, err)
			}
			if err := lsPut(c.p, "after", time.Minute); err != nil {
				t.Fatal(err)
			}
			if tc.up {
				holdsAll(t, c.p.s, "d", c.ls["d"])
			}
		})
	}
}

// TestNewPrimaryResumesLogStoreRollback: a primary whose log ends in the
// joint record of a roll-back — c's replacement by a log store that never
// came, rolled back from {a, b, new} to {a, b, c} — finishes the
// roll-back, {a, b, c} again, even with c down: the roll-back's joint
// record was acknowledged by a and b, a majority of both halves. Read as
// a forward change from {a, b, new} to {a, b, c}, c down would roll it
// "back" to {a, b, new}: a log store that never caught up in c's place.
func TestNewPrimaryResumesLogStoreRollback(t *testing.T) {
	c := startLogStoreCluster(t, "a", "b", "c")
	s := c.p.s
	testkit.Until(t, "a and b to echo the primary's heartbeats", func() bool {
		return s.lease.heard(c.ls["a"].addr) && s.lease.heard(c.ls["b"].addr)
	})
	old := stripped(s.contract())
	next := proto.Clone(old).(*walshipv1.Contract)
	next.Logstores = []string{c.ls["a"].addr, c.ls["b"].addr, closedAddr(t)}
	if _, err := s.writeRecord(ctx(t), s.epochRecord(joint(old, next), walshipv1.MembershipStage_MEMBERSHIP_STAGE_JOINT)); err != nil {
		t.Fatal(err)
	}
	if _, err := s.writeRecord(ctx(t), s.epochRecord(joint(next, old), walshipv1.MembershipStage_MEMBERSHIP_STAGE_ROLLBACK_JOINT)); err != nil {
		t.Fatal(err)
	}
	if err := lsPut(c.p, "acked", time.Minute); err != nil {
		t.Fatal(err)
	}
	if err := c.p.stop(t); err != nil {
		t.Fatal(err)
	}
	c.ls["c"].stop()
	c.start(t)
	testkit.Until(t, "the roll-back to be over", func() bool {
		return counter(t, c.p.s.metrics.changes.WithLabelValues(outcomeRolledBack)) == 1
	})
	if f := c.p.s.inForce.Load(); f.stage != walshipv1.MembershipStage_MEMBERSHIP_STAGE_ROLLED_BACK {
		t.Fatalf("the last record after the new primary resumed the roll-back: stage %v", f.stage)
	}
	wantLogStores(t, c.p.s, old.GetLogstores())
	got, err := c.p.kv.Get(ctx(t), &walshipv1.GetRequest{Key: "acked"})
	if err != nil || string(got.GetValue()) != "v" {
		t.Fatalf("the acknowledged write: %v, %v", got, err)
	}
	if err := lsPut(c.p, "after", time.Minute); err != nil {
		t.Fatal(err)
	}
}
