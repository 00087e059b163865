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
	"github.com/walship/walship/services/replica"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
)

// TestStillApplies: a change validated before it took the one change
// slot is refused, before any record, when a change that ended meanwhile
// made it moot — two requests to add the same node (a --join retry)
// would otherwise list it twice, and a member listed twice meets an ack
// quorum alone.
func TestStillApplies(t *testing.T) {
	cur := &walshipv1.Contract{Members: []*walshipv1.Member{{Id: "p"}, {Id: "a"}, {Id: "x"}}, Logstores: []string{"l0", "l1", "l2"}}
	for _, tc := range []struct {
		name    string
		r       *changeRun
		refused string
	}{
		{"add a node added meanwhile", &changeRun{add: &walshipv1.Member{Id: "x"}, desc: "add x"}, "x is a member already"},
		{"add a new node", &changeRun{add: &walshipv1.Member{Id: "y"}, desc: "add y"}, ""},
		{"remove a member removed meanwhile", &changeRun{remove: "b", desc: "remove b"}, "b is no member"},
		{"remove a member", &changeRun{remove: "a", desc: "remove a"}, ""},
		{"add a log store added meanwhile", &changeRun{addLogStore: "l2", desc: "add log store l2"}, "l2 is a log store"},
		{"replace a log store removed meanwhile", &changeRun{removeLogStore: "l9", addLogStore: "l3", desc: "replace"}, "l9 is no log store"},
		{"replace a log store", &changeRun{removeLogStore: "l2", addLogStore: "l3", desc: "replace"}, ""},
	} {
		err := stillApplies(tc.r, cur)
		switch {
		case tc.refused == "" && err != nil:
			t.Errorf("%s: %v", tc.name, err)
		case tc.refused != "" && (status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), tc.refused)):
			t.Errorf("%s: %v, want FAILED_PRECONDITION naming %q", tc.name, err, tc.refused)
		}
	}
}

// TestRemovalTheRestCannotAcknowledge: members p1, r1, r2, k = 1, r2
// down. Removing r1, the one member up, would leave a joint record that
// only r2 could acknowledge: it is refused, naming why, and nothing
// changes; removing r2, the one down, goes through.
func TestRemovalTheRestCannotAcknowledge(t *testing.T) {
	c := startMembers(t, 1, "r1")
	_, err := c.p.admin.ChangeMembers(ctx(t), &walshipv1.ChangeMembersRequest{Change: &walshipv1.ChangeMembersRequest_Remove{Remove: "r1"}})
	wantStatus(t, err, codes.FailedPrecondition, "have 0 acknowledging besides the primary", "sync_replicas 1", "r2 has no stream up")
	if m, n, _ := memberIDs(listMembers(t, c.p).GetContract()); m != "p1,r1,r2" || n != "" {
		t.Fatalf("after the refused removal: members %q next %q", m, n)
	}
	resp, err := c.p.admin.ChangeMembers(ctx(t), &walshipv1.ChangeMembersRequest{Change: &walshipv1.ChangeMembersRequest_Remove{Remove: "r2"}})
	if err != nil || !resp.GetDone() {
		t.Fatalf("remove r2: %v %v", resp, err)
	}
}

// TestRemovalBesideAStalledLogStore: removing log store c of {a, b, c}
// while b's disk stalls is refused: b's stream is up and it echoes the
// lease (services/logstore answers heartbeats during a stalled round),
// but it makes nothing durable, so {a, b} could not acknowledge the
// change's joint record — under log store sync every commit would wait
// behind it, with no second change allowed to undo it. Once b's disk
// returns, the same removal goes through.
func TestRemovalBesideAStalledLogStore(t *testing.T) {
	c := startLogStoreCluster(t, "a", "b", "c")
	s := c.p.s
	entered, release := c.ls["b"].fs.HoldNextSync(".wal")
	t.Cleanup(release)
	if err := lsPut(c.p, "stalled-on-b", time.Minute); err != nil {
		t.Fatalf("a commit a and c acknowledge: %v", err)
	}
	select {
	case <-entered:
	case <-time.After(time.Minute):
		t.Fatal("b's disk never took the commit")
	}
	testkit.Until(t, "b echoing the lease with its disk stalled", func() bool { return s.lease.heard(c.ls["b"].addr) })
	before := proto.Clone(s.contract()).(*walshipv1.Contract)
	cctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	resp, err := c.p.admin.ChangeMembers(cctx, removeLogStore(c.ls["c"].addr))
	if err == nil {
		t.Fatalf("removing c beside a stalled b: %v, want a refusal", resp)
	}
	wantStatus(t, err, codes.FailedPrecondition, "remove log store "+c.ls["c"].addr, "1 acknowledging", c.ls["b"].addr+" has made durable LSN")
	if !proto.Equal(s.contract(), before) {
		t.Fatalf("the refused removal changed the contract to %v", s.contract())
	}
	release()
	changeLogStores(t, c.p, removeLogStore(c.ls["c"].addr))
	wantLogStores(t, s, c.addrs("a", "b"))
}

// TestRemovalBesideAStalledReplica: members p1, r1, r2, k = 1 at flush,
// and r1's disk stalls in an fsync. Its stream stays up, but it makes
// nothing durable, so removing r2 would leave a joint record that only r1
// could acknowledge in the new half: every sync commit would wait behind
// it, with no second change allowed to undo it. The removal is refused,
// naming r1 and how far it got, and changes nothing: a sync commit r2
// acknowledges still goes through. Once r1's disk returns, the same
// removal goes through.
func TestRemovalBesideAStalledReplica(t *testing.T) {
	c := startMembers(t, 1, "r2")
	s := c.p.s
	mem := vfs.NewMem()
	c.reps["r1"] = startReplicaWith(t, "r1", s.Addr(), "/data", func(cfg *replica.Config) { cfg.FS = mem })
	testkit.Until(t, "r1 to connect", func() bool {
		rs, _ := s.peers.snapshot()
		return slices.ContainsFunc(rs, func(r replicaPos) bool { return r.id == "r1" && r.connected })
	})
	entered, release := mem.HoldNextSync(".wal")
	t.Cleanup(release)
	if err := syncPut(c.p, "stalled-on-r1", 1, time.Minute); err != nil {
		t.Fatalf("a commit r2 acknowledges: %v", err)
	}
	select {
	case <-entered:
	case <-time.After(time.Minute):
		t.Fatal("r1's disk never took the commit")
	}
	before := proto.Clone(s.contract()).(*walshipv1.Contract)
	cctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	remove := &walshipv1.ChangeMembersRequest{Change: &walshipv1.ChangeMembersRequest_Remove{Remove: "r2"}}
	resp, err := c.p.admin.ChangeMembers(cctx, remove)
	if err == nil {
		t.Fatalf("removing r2 beside a stalled r1: %v, want a refusal", resp)
	}
	wantStatus(t, err, codes.FailedPrecondition, "remove r2", "have 0 acknowledging besides the primary", "sync_replicas 1",
		"r1 has made durable LSN", "bring the others back first")
	if !proto.Equal(s.contract(), before) {
		t.Fatalf("the refused removal changed the contract to %v", s.contract())
	}
	if err := syncPut(c.p, "after-refusal", 1, time.Minute); err != nil {
		t.Fatalf("a commit r2 acknowledges after the refused removal: %v", err)
	}
	release()
	resp, err = c.p.admin.ChangeMembers(ctx(t), remove)
	if err != nil || !resp.GetDone() || resp.GetOutcome() != outcomeDone {
		t.Fatalf("remove r2 once r1's disk returned: %v %v", resp, err)
	}
	if m, n, _ := memberIDs(listMembers(t, c.p).GetContract()); m != "p1,r1" || n != "" {
		t.Fatalf("after removing r2: members %q next %q", m, n)
	}
}
