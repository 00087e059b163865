package primary

import (
	"context"
	"errors"
	"net"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	walshipv1 "github.com/walship/walship/gen/walship/v1"
	"github.com/walship/walship/internal/testkit"
	"github.com/walship/walship/internal/vfs"
	"github.com/walship/walship/services/replica"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	grpcstatus "google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
)

// Membership change tests: a real primary with members p1, r1, r2 (any k
// at flush), a real log store and real replicas (services/replica) on
// loopback; r2 is down unless a test starts it.

// realReplica is a replica served in-process.
type realReplica struct {
	s      *replica.Server
	cancel context.CancelFunc
	done   chan error
}

func startReplica(t *testing.T, id, primary, dir string) *realReplica {
	t.Helper()
	return startReplicaWith(t, id, primary, dir, nil)
}

// startReplicaWith is startReplica with edit applied to the replica's
// Config.
func startReplicaWith(t *testing.T, id, primary, dir string, edit func(*replica.Config)) *realReplica {
	t.Helper()
	cfg := replica.DefaultConfig()
	cfg.Listen, cfg.MetricsListen = "127.0.0.1:0", ""
	cfg.ID, cfg.Primary, cfg.DataDir = id, primary, dir
	cfg.HeartbeatInterval = 100 * time.Millisecond
	cfg.StopTimeout = 5 * time.Second
	if edit != nil {
		edit(&cfg)
	}
	s, err := replica.New(cfg)
	if err != nil {
		t.Fatalf("replica %s: %v", id, err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	r := &realReplica{s: s, cancel: cancel, done: make(chan error, 1)}
	go func() { r.done <- s.Run(ctx) }()
	t.Cleanup(func() { r.stop(t) })
	return r
}

func (r *realReplica) stop(t *testing.T) {
	t.Helper()
	if r.cancel == nil {
		return
	}
	r.cancel()
	r.cancel = nil
	if err := <-r.done; err != nil && !errors.Is(err, context.Canceled) {
		t.Errorf("replica: %v", err)
	}
}

// memberCluster is the primary p1 of members p1, r1, r2 and the replicas
// started.
type memberCluster struct {
	cfg  Config
	p    *running
	reps map[string]*realReplica
	dirs map[string]string
}

// startMembers starts p1 (members p1, r1, r2; sync_replicas k at flush)
// and the replicas ids (members or not).
func startMembers(t *testing.T, k int, ids ...string) *memberCluster {
	t.Helper()
	return startMembersWith(t, k, nil, ids...)
}

// startMembersWith is startMembers with edit applied to p1's Config.
func startMembersWith(t *testing.T, k int, edit func(*Config), ids ...string) *memberCluster {
	t.Helper()
	cfg := testConfig(t, t.TempDir())
	cfg.ID = "p1"
	cfg.LogStores = []string{runLogStore(t, vfs.NewMem())}
	cfg.Members = []Member{{"p1", "127.0.0.1:1"}, {"r1", "127.0.0.1:2"}, {"r2", "127.0.0.1:3"}}
	cfg.Policy.Replication = walshipv1.ReplicationMode_REPLICATION_MODE_SYNC
	cfg.Policy.SyncReplicas = k
	cfg.Policy.SyncLevel = walshipv1.SyncLevel_SYNC_LEVEL_FLUSH
	cfg.Policy.SyncTimeout = time.Minute
	cfg.ChangeResumeGrace = 2 * time.Second
	if edit != nil {
		edit(&cfg)
	}
	c := &memberCluster{cfg: cfg, reps: map[string]*realReplica{}, dirs: map[string]string{}}
	c.startPrimary(t)
	c.cfg.Listen = c.p.s.Addr() // a restart listens where the replicas look
	for _, id := range ids {
		c.start(t, id)
	}
	waitServing(t, c.p.conn)
	return c
}

// startPrimary starts p1 without waiting for it to open.
func (c *memberCluster) startPrimary(t *testing.T) {
	t.Helper()
	s, err := New(c.cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	p := &running{s: s, cancel: cancel, done: make(chan error, 1)}
	go func() { p.done <- s.Run(ctx) }()
	conn, err := grpc.NewClient(s.Addr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	p.conn, p.kv, p.admin = conn, walshipv1.NewKVServiceClient(conn), walshipv1.NewAdminServiceClient(conn)
	t.Cleanup(func() { p.stop(t) })
	c.p = p
}

func (c *memberCluster) start(t *testing.T, id string) *realReplica {
	t.Helper()
	if c.dirs[id] == "" {
		c.dirs[id] = t.TempDir()
	}
	r := startReplica(t, id, c.p.s.Addr(), c.dirs[id])
	c.reps[id] = r
	return r
}

// memberIDs are the contract's members, its next half's and learners.
func memberIDs(c *walshipv1.Contract) (members, next, learners string) {
	ids := func(ms []*walshipv1.Member) string {
		var out []string
		for _, m := range ms {
			out = append(out, m.GetId())
		}
		return strings.Join(out, ",")
	}
	return ids(c.GetMembers()), ids(c.GetNext().GetMembers()), ids(c.GetLearners())
}

func listMembers(t *testing.T, r *running) *walshipv1.MembershipStatus {
	t.Helper()
	resp, err := r.admin.ListMembers(ctx(t), &walshipv1.ListMembersRequest{})
	if err != nil {
		t.Fatal(err)
	}
	return resp.GetMembership()
}

func syncPut(r *running, key string, k uint32, timeout time.Duration) error {
	c, cancel := context.WithTimeout(context.Background(), timeout+time.Minute)
	defer cancel()
	_, err := r.kv.Put(c, &walshipv1.PutRequest{Key: key, Value: []byte("v"), Policy: &walshipv1.CommitPolicy{
		Replication: walshipv1.ReplicationMode_REPLICATION_MODE_SYNC, SyncReplicas: k, SyncTimeout: durationpb.New(timeout)}})
	return err
}

// TestAddMemberCountsForSyncReplicas: a running replica r3 that is not a
// member does not count for sync_replicas; added, it is a learner until it
// has caught up, then a member through a joint record, and then counts: a
// commit for 2 replicas gets r1's and r3's acks, and with r1 and r3
// stopped (r2 is down) a commit waits until r3 is back.
func TestAddMemberCountsForSyncReplicas(t *testing.T) {
	c := startMembers(t, 1, "r1", "r3")
	for i := range 20 {
		if err := syncPut(c.p, "k"+string(rune('a'+i)), 1, time.Minute); err != nil {
			t.Fatal(err)
		}
	}
	// Not a member: 2 of r1, r2 are needed, and r2 is down.
	if err := syncPut(c.p, "two", 2, 200*time.Millisecond); rpcCode(err) != codes.Unavailable {
		t.Fatalf("a commit for 2 replicas with r3 not a member: %v, want UNAVAILABLE", err)
	}

	resp, err := c.p.admin.ChangeMembers(ctx(t), &walshipv1.ChangeMembersRequest{
		Change: &walshipv1.ChangeMembersRequest_Add{Add: &walshipv1.Member{Id: "r3", Addr: c.reps["r3"].s.Addr()}}})
	if err != nil {
		t.Fatal(err)
	}
	if !resp.GetDone() || resp.GetOutcome() != outcomeDone || resp.GetStage() != walshipv1.MembershipStage_MEMBERSHIP_STAGE_FINAL {
		t.Fatalf("add r3: %v", resp)
	}
	ms := listMembers(t, c.p)
	if m, n, l := memberIDs(ms.GetContract()); m != "p1,r1,r2,r3" || n != "" || l != "" || !ms.GetContract().GetMembersChanged() || ms.GetChange() != "" {
		t.Fatalf("after the add: members %q next %q learners %q, %v", m, n, l, ms)
	}
	if got := counter(t, c.p.s.metrics.changes.WithLabelValues(outcomeDone)); got != 1 {
		t.Fatalf("walship_membership_changes_total{outcome=done} = %v", got)
	}
	// The replicas report the final record too.
	testkit.Until(t, "r1 and r3 to hold the final record", func() bool {
		for _, id := range []string{"r1", "r3"} {
			if m, _, _ := memberIDs(c.reps[id].s.EpochRecord().GetContract()); m != "p1,r1,r2,r3" {
				return false
			}
		}
		return true
	})

	if err := syncPut(c.p, "two", 2, time.Minute); err != nil {
		t.Fatalf("a commit for 2 replicas with r1 and r3 members: %v", err)
	}
	c.reps["r1"].stop(t)
	c.reps["r3"].stop(t)
	done := make(chan error, 1)
	go func() { done <- syncPut(c.p, "waits", 1, time.Minute) }()
	testkit.Until(t, "the commit to wait for a replica", func() bool {
		return c.p.s.peers.waiting[walshipv1.SyncLevel_SYNC_LEVEL_FLUSH].Load() > 0
	})
	select {
	case err := <-done:
		t.Fatalf("a commit returned (%v) with every member but the primary down", err)
	default:
	}
	c.start(t, "r3")
	if err := <-done; err != nil {
		t.Fatalf("the commit r3 alone can acknowledge: %v", err)
	}
}

// TestRemoveDownMember: r2, down, is removed without its cooperation;
// afterwards a commit for 2 replicas is refused up front (only r1 is
// left), and so is a switchover to r2.
func TestRemoveDownMember(t *testing.T) {
	c := startMembers(t, 1, "r1")
	resp, err := c.p.admin.ChangeMembers(ctx(t), &walshipv1.ChangeMembersRequest{Change: &walshipv1.ChangeMembersRequest_Remove{Remove: "r2"}})
	if err != nil {
		t.Fatal(err)
	}
	if !resp.GetDone() || resp.GetOutcome() != outcomeDone {
		t.Fatalf("remove r2: %v", resp)
	}
	if m, n, _ := memberIDs(listMembers(t, c.p).GetContract()); m != "p1,r1" || n != "" {
		t.Fatalf("after removing r2: members %q next %q", m, n)
	}
	wantStatus(t, syncPut(c.p, "two", 2, time.Second), codes.InvalidArgument, "sync_replicas: 2 is more than the 1 other members")
	_, err = c.p.admin.Switchover(ctx(t), &walshipv1.SwitchoverRequest{Target: "r2", Timeout: durationpb.New(time.Second)})
	wantStatus(t, err, codes.InvalidArgument, `target: "r2" is not another member of the cluster (--peers): want one of r1`)
	if err := syncPut(c.p, "one", 1, time.Minute); err != nil {
		t.Fatal(err)
	}
}

// TestChangeMembersRefused: each wrong change is refused with a clear
// status naming what is wrong, and changes nothing; a second change while
// one is in progress is refused naming it; a call whose deadline comes
// first hears where the change is, and the change goes on; a learner
// that does not catch up in time is dropped and the change abandoned.
func TestChangeMembersRefused(t *testing.T) {
	c := startMembers(t, 2, "r1", "r2")
	before := proto.Clone(c.p.s.contract()).(*walshipv1.Contract)
	ours := c.p.s.cluster.ID()
	other := fakeNode(t, "r8", walshipv1.Role_ROLE_REPLICA, clusterB)
	silent := fakeNode(t, "r9", walshipv1.Role_ROLE_REPLICA, ours)
	primaryNode := fakeNode(t, "r7", walshipv1.Role_ROLE_PRIMARY, ours)
	closed := closedAddr(t)
	add := func(id, addr string) *walshipv1.ChangeMembersRequest {
		return &walshipv1.ChangeMembersRequest{Change: &walshipv1.ChangeMembersRequest_Add{Add: &walshipv1.Member{Id: id, Addr: addr}}}
	}
	remove := func(id string) *walshipv1.ChangeMembersRequest {
		return &walshipv1.ChangeMembersRequest{Change: &walshipv1.ChangeMembersRequest_Remove{Remove: id}}
	}
	for _, tc := range []struct {
		name string
		req  *walshipv1.ChangeMembersRequest
		code codes.Code
		subs []string
	}{
		{"empty", &walshipv1.ChangeMembersRequest{}, codes.InvalidArgument, []string{"change: required"}},
		{"remove the primary", remove("p1"), codes.FailedPrecondition, []string{"remove: p1 is the primary: hand its role over first"}},
		{"remove a non-member", remove("r5"), codes.InvalidArgument, []string{"remove: r5 is not a member (members: p1, r1, r2)"}},
		{"remove below k", remove("r2"), codes.FailedPrecondition, []string{"remove r2", "1 members besides the primary cannot meet sync_replicas 2"}},
		{"add a member", add("r1", "127.0.0.1:2"), codes.InvalidArgument, []string{"add.id: r1 is already a member"}},
		{"add without an address", add("r5", ""), codes.InvalidArgument, []string{"add.addr: required"}},
		{"add a bad id", add("r 5", "127.0.0.1:2"), codes.InvalidArgument, []string{"add.id:"}},
		{"add an address that does not answer", add("r5", closed), codes.FailedPrecondition, []string{"add.addr: " + closed + " does not answer"}},
		{"add a node of another cluster", add("r8", other), codes.FailedPrecondition, []string{"cluster id mismatch", clusterB, ours}},
		{"add under another id", add("r5", silent), codes.InvalidArgument, []string{"add.id: the node at " + silent + ` is "r9", not "r5"`}},
		{"add a primary", add("r7", primaryNode), codes.FailedPrecondition, []string{"is a primary, not a replica"}},
		{"bad catch-up timeout", &walshipv1.ChangeMembersRequest{Change: add("r9", silent).Change, CatchUpTimeout: durationpb.New(-time.Second)},
			codes.InvalidArgument, []string{"catch_up_timeout:"}},
	} {
		_, err := c.p.admin.ChangeMembers(ctx(t), tc.req)
		wantStatus(t, err, tc.code, tc.subs...)
		if !proto.Equal(c.p.s.contract(), before) {
			t.Fatalf("%s changed the contract to %v", tc.name, c.p.s.contract())
		}
	}

	// r9 answers but never follows: its learner stage runs out. The call's
	// deadline comes first: it hears that the change goes on.
	first := make(chan *walshipv1.ChangeMembersResponse, 1)
	go func() {
		// The server answers a tenth of the time left before the deadline
		// (at most 1 s): 5 s leaves it 0.5 s, which a loaded machine needs
		// (2 s left 0.2 s, and the call once missed it in a full run).
		short, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		resp, err := c.p.admin.ChangeMembers(short, &walshipv1.ChangeMembersRequest{
			Change: add("r9", silent).Change, CatchUpTimeout: durationpb.New(8 * time.Second)})
		if err != nil {
			t.Error(err)
		}
		first <- resp
	}()
	testkit.Until(t, "the learner stage", func() bool {
		_, _, l := memberIDs(c.p.s.contract())
		return l == "r9"
	})
	if ms := listMembers(t, c.p); ms.GetChange() != "add r9 at "+silent || ms.GetStage() != walshipv1.MembershipStage_MEMBERSHIP_STAGE_LEARNER ||
		!slices.ContainsFunc(ms.GetMembers(), func(m *walshipv1.MemberStatus) bool {
			return m.GetId() == "r9" && m.GetVoice() == walshipv1.MemberVoice_MEMBER_VOICE_LEARNER
		}) {
		t.Fatalf("ListMembers during the learner stage: %v", ms)
	}
	if got := gaugeOf(t, c.p.s.metrics.changeInProgress); got != 1 {
		t.Fatalf("walship_membership_change_in_progress = %v during a change", got)
	}
	_, err := c.p.admin.ChangeMembers(ctx(t), remove("r2"))
	wantStatus(t, err, codes.FailedPrecondition, "a membership change is in progress", "r9")

	if resp := <-first; resp.GetDone() || resp.GetStage() != walshipv1.MembershipStage_MEMBERSHIP_STAGE_LEARNER || resp.GetMembership().GetChange() == "" {
		t.Fatalf("the call's deadline came during the learner stage: %v", resp)
	}
	testkit.Until(t, "the change to be abandoned", func() bool { return c.p.s.changes.inProgress() == "" })
	if f := c.p.s.inForce.Load(); f.stage != walshipv1.MembershipStage_MEMBERSHIP_STAGE_LEARNER_DROPPED {
		t.Fatalf("the last record of a learner that never caught up: stage %v", f.stage)
	}
	if m, n, l := memberIDs(c.p.s.contract()); m != "p1,r1,r2" || n != "" || l != "" {
		t.Fatalf("after the abandoned change: members %q next %q learners %q", m, n, l)
	}
	if got := counter(t, c.p.s.metrics.changes.WithLabelValues(outcomeAbandoned)); got != 1 {
		t.Fatalf("walship_membership_changes_total{outcome=abandoned} = %v", got)
	}
}

// fakeNode serves an AdminService whose Status says it is the node id of
// role in cluster; it follows no one.
func fakeNode(t *testing.T, id string, role walshipv1.Role, cluster string) string {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	walshipv1.RegisterAdminServiceServer(srv, &fakeAdmin{st: &walshipv1.StatusResponse{Id: id, Role: role, ClusterId: cluster}})
	go func() { _ = srv.Serve(lis) }()
	t.Cleanup(srv.Stop)
	return lis.Addr().String()
}

type fakeAdmin struct {
	walshipv1.UnimplementedAdminServiceServer
	st *walshipv1.StatusResponse
}

func (f *fakeAdmin) Status(context.Context, *walshipv1.StatusRequest) (*walshipv1.StatusResponse, error) {
	return f.st, nil
}

// closedAddr is a loopback address nothing listens on.
func closedAddr(t *testing.T) string {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := lis.Addr().String()
	lis.Close()
	return addr
}

func rpcCode(err error) codes.Code { return grpcstatus.Code(err) }

func gaugeOf(t *testing.T, g prometheus.Gauge) float64 {
	t.Helper()
	var m dto.Metric
	if err := g.Write(&m); err != nil {
		t.Fatal(err)
	}
	return m.GetGauge().GetValue()
}

// TestNewPrimaryResumesJointRecord: a primary whose log ends in a joint
// record (it stopped between the joint and the final record) opens its
// next epoch under the joint contract — never C_old alone — and then
// finishes the change when the member it adds is connected, or rolls it
// back (a joint record from C_new to C_old, then C_old) when it is not;
// the replicas end holding the record it ends with, and every
// acknowledged write is there.
func TestNewPrimaryResumesJointRecord(t *testing.T) {
	for _, tc := range []struct {
		name, add   string
		outcome     string
		stage       walshipv1.MembershipStage
		wantMembers string
	}{
		{"finish", "r3", outcomeDone, walshipv1.MembershipStage_MEMBERSHIP_STAGE_FINAL, "p1,r1,r2,r3"},
		{"roll back", "r4", outcomeRolledBack, walshipv1.MembershipStage_MEMBERSHIP_STAGE_ROLLED_BACK, "p1,r1,r2"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := startMembers(t, 1, "r1", "r3")
			s := c.p.s
			cur := s.contract()
			next := stripped(cur)
			next.Members = append(next.Members, &walshipv1.Member{Id: tc.add, Addr: "127.0.0.1:4"})
			if tc.add == "r3" {
				next.Members[len(next.Members)-1].Addr = c.reps["r3"].s.Addr()
			}
			if _, err := s.writeRecord(ctx(t), s.epochRecord(joint(cur, next), walshipv1.MembershipStage_MEMBERSHIP_STAGE_JOINT)); err != nil {
				t.Fatal(err)
			}
			if err := syncPut(c.p, "acked", 1, time.Minute); err != nil {
				t.Fatal(err)
			}
			if err := c.p.stop(t); err != nil {
				t.Fatal(err)
			}
			c.startPrimary(t)
			waitServing(t, c.p.conn)
			// Only a primary that opened under the joint contract resumes
			// the change: one under C_old alone would count no outcome.
			testkit.Until(t, "the change to be "+tc.outcome, func() bool {
				return counter(t, c.p.s.metrics.changes.WithLabelValues(tc.outcome)) == 1
			})
			f := c.p.s.inForce.Load()
			if m, n, _ := memberIDs(f.contract); m != tc.wantMembers || n != "" || f.stage != tc.stage {
				t.Fatalf("after the new primary %s: members %q next %q stage %v", tc.name, m, n, f.stage)
			}
			testkit.Until(t, "r1 to hold the last record", func() bool {
				rec := c.reps["r1"].s.EpochRecord()
				m, n, _ := memberIDs(rec.GetContract())
				return rec.GetStage() == tc.stage && m == tc.wantMembers && n == ""
			})
			got, err := c.p.kv.Get(ctx(t), &walshipv1.GetRequest{Key: "acked"})
			if err != nil || string(got.GetValue()) != "v" {
				t.Fatalf("the acknowledged write: %v, %v", got, err)
			}
		})
	}
}

// TestRemovedNodeDoesNotOpen: a primary whose log says a membership
// change left it out (members_changed, without it) does not open its
// epoch: it says why, naming what to do, and takes no write.
func TestRemovedNodeDoesNotOpen(t *testing.T) {
	c := startMembers(t, 1, "r1")
	s := c.p.s
	left := stripped(s.contract())
	left.Members, left.MembersChanged = left.Members[1:], true // r1, r2
	if _, err := s.writeRecord(ctx(t), s.epochRecord(left, walshipv1.MembershipStage_MEMBERSHIP_STAGE_FINAL)); err != nil {
		t.Fatal(err)
	}
	if err := c.p.stop(t); err != nil {
		t.Fatal(err)
	}
	c.startPrimary(t)
	// Run ends with why, before it fences anything (it would depose the
	// cluster's primary for nothing).
	select {
	case err := <-c.p.done:
		if err == nil || !strings.Contains(err.Error(), "this node p1 is not a member of the configuration its log holds (members r1,r2") {
			t.Fatalf("Run: %v", err)
		}
		c.p.done <- err // for the cleanup's stop
	case <-time.After(30 * time.Second):
		t.Fatal("Run of a primary its log's configuration leaves out did not end")
	}
	if c.p.s.TakingWrites() {
		t.Fatal("a primary its log's configuration leaves out takes writes")
	}
}

// TestNewPrimaryResumesRollback: a primary whose log ends in the joint
// record of a roll-back (an add of r4, which never connected, rolled
// back: joint from C_new back to C_old) finishes the roll-back — C_old
// again, stage rolled_back — rather than taking the record for a forward
// change from C_new to C_old and counting it done.
func TestNewPrimaryResumesRollback(t *testing.T) {
	c := startMembers(t, 1, "r1")
	s := c.p.s
	old := stripped(s.contract())
	next := proto.Clone(old).(*walshipv1.Contract)
	next.Members = append(next.Members, &walshipv1.Member{Id: "r4", Addr: closedAddr(t)})
	if _, err := s.writeRecord(ctx(t), s.epochRecord(joint(old, next), walshipv1.MembershipStage_MEMBERSHIP_STAGE_JOINT)); err != nil {
		t.Fatal(err)
	}
	if _, err := s.writeRecord(ctx(t), s.epochRecord(joint(next, old), walshipv1.MembershipStage_MEMBERSHIP_STAGE_ROLLBACK_JOINT)); err != nil {
		t.Fatal(err)
	}
	if err := syncPut(c.p, "acked", 1, time.Minute); err != nil {
		t.Fatal(err)
	}
	if err := c.p.stop(t); err != nil {
		t.Fatal(err)
	}
	c.startPrimary(t)
	waitServing(t, c.p.conn)
	testkit.Until(t, "the roll-back to be finished", func() bool {
		return counter(t, c.p.s.metrics.changes.WithLabelValues(outcomeRolledBack)) == 1
	})
	f := c.p.s.inForce.Load()
	if m, n, _ := memberIDs(f.contract); m != "p1,r1,r2" || n != "" || f.stage != walshipv1.MembershipStage_MEMBERSHIP_STAGE_ROLLED_BACK {
		t.Fatalf("after the new primary resumed the roll-back: members %q next %q stage %v", m, n, f.stage)
	}
	if got := counter(t, c.p.s.metrics.changes.WithLabelValues(outcomeDone)); got != 0 {
		t.Fatalf("walship_membership_changes_total{outcome=done} = %v after a roll-back", got)
	}
	testkit.Until(t, "r1 to hold the rolled_back record", func() bool {
		return c.reps["r1"].s.EpochRecord().GetStage() == walshipv1.MembershipStage_MEMBERSHIP_STAGE_ROLLED_BACK
	})
}

// stepGate is a Config.Gate that closes — the primary losing its
// election for a moment — as soon as the record of stage at is in force,
// so after that record is sequenced and before its commit is answered,
// and stays closed until reopened.
type stepGate struct {
	mu     sync.Mutex
	s      *Server
	at     walshipv1.MembershipStage
	armed  bool
	closed bool
}

func (g *stepGate) gate() error {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.armed && g.s != nil {
		if f := g.s.inForce.Load(); f != nil && f.stage == g.at {
			g.closed = true
		}
	}
	if g.closed {
		return errors.New("lost the election for a moment")
	}
	return nil
}

func (g *stepGate) arm(s *Server, at walshipv1.MembershipStage) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.s, g.at, g.armed = s, at, true
}

func (g *stepGate) reopen() {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.armed, g.closed = false, false
}

// TestFailedStepResumes: a step of a change fails while the primary goes
// on serving — its record sequenced, then the primary's gate closed for
// a moment, so the commit is not answered — and the primary resumes the
// change by itself, by the rule a new primary follows: a learner stage
// is abandoned (the learner dropped), a joint record finished (or rolled
// back). Until then ListMembers says why it waits, and afterwards the
// configuration takes changes again.
func TestFailedStepResumes(t *testing.T) {
	for _, tc := range []struct {
		name    string
		at      walshipv1.MembershipStage
		add     bool // add r3, else remove r2
		outcome string
		stage   walshipv1.MembershipStage
		members string
	}{
		{"remove, joint fails", walshipv1.MembershipStage_MEMBERSHIP_STAGE_JOINT, false, outcomeDone, walshipv1.MembershipStage_MEMBERSHIP_STAGE_FINAL, "p1,r1"},
		{"add, learner fails", walshipv1.MembershipStage_MEMBERSHIP_STAGE_LEARNER, true, outcomeAbandoned, walshipv1.MembershipStage_MEMBERSHIP_STAGE_LEARNER_DROPPED, "p1,r1,r2"},
		{"add, joint fails", walshipv1.MembershipStage_MEMBERSHIP_STAGE_JOINT, true, outcomeDone, walshipv1.MembershipStage_MEMBERSHIP_STAGE_FINAL, "p1,r1,r2,r3"},
		// The final record sequenced, its commit unanswered: it stays in
		// force, and the change is over once it is acknowledged.
		{"remove, final fails", walshipv1.MembershipStage_MEMBERSHIP_STAGE_FINAL, false, outcomeDone, walshipv1.MembershipStage_MEMBERSHIP_STAGE_FINAL, "p1,r1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := &stepGate{}
			c := startMembersWith(t, 1, func(cfg *Config) {
				cfg.Gate = g.gate
				cfg.ChangeRetryBackoff = 100 * time.Millisecond
				// Only the gate is to close: the lease, lost on a loaded
				// machine, refused the step for another reason.
				cfg.LeaseTimeout = time.Minute
			}, "r1", "r3")
			add := &walshipv1.ChangeMembersRequest{Change: &walshipv1.ChangeMembersRequest_Add{Add: &walshipv1.Member{Id: "r3", Addr: c.reps["r3"].s.Addr()}}}
			req := &walshipv1.ChangeMembersRequest{Change: &walshipv1.ChangeMembersRequest_Remove{Remove: "r2"}}
			if tc.add {
				req = add
			}
			g.arm(c.p.s, tc.at)
			_, err := c.p.admin.ChangeMembers(ctx(t), req)
			how := "finishes or rolls it back"
			if tc.at == walshipv1.MembershipStage_MEMBERSHIP_STAGE_FINAL {
				how = "it is over once that record is acknowledged"
			}
			wantStatus(t, err, codes.Aborted, "lost the election for a moment", "the primary resumes it by itself", how)
			testkit.Until(t, "ListMembers to say why the change waits", func() bool {
				return strings.Contains(listMembers(t, c.p).GetChange(), "lost the election for a moment")
			})
			g.reopen()
			testkit.Until(t, "the primary to resume the change", func() bool {
				return counter(t, c.p.s.metrics.changes.WithLabelValues(tc.outcome)) == 1 && c.p.s.changes.inProgress() == ""
			})
			if got := counter(t, c.p.s.metrics.changes.WithLabelValues(outcomeFailed)); got != 1 {
				t.Fatalf("walship_membership_changes_total{outcome=failed} = %v", got)
			}
			f := c.p.s.inForce.Load()
			if m, n, l := memberIDs(f.contract); m != tc.members || n != "" || l != "" || f.stage != tc.stage {
				t.Fatalf("after the change resumed: members %q next %q learners %q stage %v", m, n, l, f.stage)
			}
			testkit.Until(t, "r1 to hold the last record", func() bool {
				return c.reps["r1"].s.EpochRecord().GetStage() == tc.stage
			})
			if tc.outcome == outcomeAbandoned {
				// Nothing is left in progress: the add goes through now.
				resp, err := c.p.admin.ChangeMembers(ctx(t), add)
				if err != nil || resp.GetOutcome() != outcomeDone {
					t.Fatalf("add r3 again: %v, %v", resp, err)
				}
			}
			if err := syncPut(c.p, "after", 1, time.Minute); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// TestPeerlessPrimaryRefusesChangedLog: a node started as primary without
// --peers over a log whose configuration a membership change set
// (members_changed) does not open: it would take any replica's ack for
// "any k" and write no epoch record, while a candidate judges by the
// members the log names and may miss what only another node acknowledged.
// It says why, naming what to do, before it fences anything.
func TestPeerlessPrimaryRefusesChangedLog(t *testing.T) {
	c := startMembers(t, 1, "r1")
	resp, err := c.p.admin.ChangeMembers(ctx(t), &walshipv1.ChangeMembersRequest{Change: &walshipv1.ChangeMembersRequest_Remove{Remove: "r2"}})
	if err != nil || !resp.GetDone() {
		t.Fatalf("remove r2: %v, %v", resp, err)
	}
	if err := c.p.stop(t); err != nil {
		t.Fatal(err)
	}
	c.cfg.Members = nil
	c.startPrimary(t)
	select {
	case err := <-c.p.done:
		if err == nil || !strings.Contains(err.Error(), "started without --peers, but its log holds the configuration a membership change set (members p1,r1") {
			t.Fatalf("Run: %v", err)
		}
		c.p.done <- err // for the cleanup's stop
	case <-time.After(30 * time.Second):
		t.Fatal("Run of a primary without --peers over a changed configuration did not end")
	}
	if c.p.s.TakingWrites() {
		t.Fatal("a primary without --peers over a changed configuration takes writes")
	}
}

// TestPeerlessPrimaryRefusesPeersLog: the same for a log whose members
// came from --peers alone (no change set them): its epoch record names
// p1, r1 and r2 at k = 1, and a candidate among them judges by it, so a
// primary without --peers — writing no epoch record and taking any
// replica's ack, r3's, which is no member, for "any 1" — could have a
// write acknowledged that every promotion quorum of {r1, r2} misses.
func TestPeerlessPrimaryRefusesPeersLog(t *testing.T) {
	c := startMembers(t, 1, "r1")
	if err := c.p.stop(t); err != nil {
		t.Fatal(err)
	}
	c.cfg.Members = nil
	c.startPrimary(t)
	select {
	case err := <-c.p.done:
		if err == nil || !strings.Contains(err.Error(), "started without --peers, but its log's newest epoch record names other members (members p1,r1,r2") {
			t.Fatalf("Run: %v", err)
		}
		c.p.done <- err // for the cleanup's stop
	case <-time.After(30 * time.Second):
		t.Fatal("Run of a primary without --peers over its cluster's log did not end")
	}
	if c.p.s.TakingWrites() {
		t.Fatal("a primary without --peers over its cluster's log takes writes")
	}

	// The way out (RUNBOOK): --peers naming p1 alone, --replication async,
	// writes a record that names p1 alone; over that one a primary
	// without --peers starts.
	c.cfg.Members = []Member{{"p1", "127.0.0.1:1"}}
	c.cfg.Policy.Replication = walshipv1.ReplicationMode_REPLICATION_MODE_ASYNC
	c.startPrimary(t)
	waitServing(t, c.p.conn)
	if err := c.p.stop(t); err != nil {
		t.Fatal(err)
	}
	c.cfg.Members = nil
	c.startPrimary(t)
	waitServing(t, c.p.conn)
}

// TestFailedStepDuringSwitchoverResumes: a learner that never catches up
// is to be dropped while a switchover is handing the primary's role over
// (which then times out): the drop's record is refused before it is
// sequenced, the learner contract stays in force, and once the primary
// serves again it drops the learner by itself.
func TestFailedStepDuringSwitchoverResumes(t *testing.T) {
	c := startMembersWith(t, 1, func(cfg *Config) { cfg.ChangeRetryBackoff = 100 * time.Millisecond }, "r1")
	silent := fakeNode(t, "r9", walshipv1.Role_ROLE_REPLICA, c.p.s.cluster.ID())
	failed := make(chan error, 1)
	go func() {
		_, err := c.p.admin.ChangeMembers(ctx(t), &walshipv1.ChangeMembersRequest{
			Change:         &walshipv1.ChangeMembersRequest_Add{Add: &walshipv1.Member{Id: "r9", Addr: silent}},
			CatchUpTimeout: durationpb.New(time.Second)})
		failed <- err
	}()
	testkit.Until(t, "r1 to hold the learner record", func() bool {
		_, _, l := memberIDs(c.reps["r1"].s.EpochRecord().GetContract())
		return l == "r9"
	})
	c.p.s.pipe.handover.Store(true) // a switchover hands over
	wantStatus(t, <-failed, codes.Aborted, "learner_dropped", "handing over", "the primary resumes it by itself")
	if _, _, l := memberIDs(c.p.s.contract()); l != "r9" {
		t.Fatalf("learners %q in force after the failed drop", l)
	}
	testkit.Until(t, "ListMembers to say why the change waits", func() bool {
		return strings.Contains(listMembers(t, c.p).GetChange(), "handing over")
	})
	c.p.s.pipe.handover.Store(false) // the switchover timed out
	testkit.Until(t, "the primary to drop the learner", func() bool {
		return counter(t, c.p.s.metrics.changes.WithLabelValues(outcomeAbandoned)) == 1 && c.p.s.changes.inProgress() == ""
	})
	f := c.p.s.inForce.Load()
	if m, n, l := memberIDs(f.contract); m != "p1,r1,r2" || n != "" || l != "" || f.stage != walshipv1.MembershipStage_MEMBERSHIP_STAGE_LEARNER_DROPPED {
		t.Fatalf("after the learner was dropped: members %q next %q learners %q stage %v", m, n, l, f.stage)
	}
	if err := syncPut(c.p, "after", 1, time.Minute); err != nil {
		t.Fatal(err)
	}
}
