package primary

import (
	"context"
	"testing"
	"time"

	walshipv1 "github.com/walship/walship/gen/walship/v1"
	"github.com/walship/walship/internal/testkit"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/types/known/durationpb"
)

// A primary restarted under another --sync-replicas while its log ends in
// a joint record (a membership change cut by the restart): its epoch
// record is joint too, with the flags' k in both halves (startContract),
// and the change goes on under it. The epoch record changes k, so it
// waits, as any contract change at an epoch start does, until enough
// members of the previous contract — the joint record's first half —
// apply it (epochChangeWait): a candidate judging by the joint record
// needs a quorum of that half, which then holds a node that knows the
// new k.

// defaultPut writes key under the primary's default policy (its
// --sync-replicas), waiting at most timeout for the replicas.
func defaultPut(r *running, key string, timeout time.Duration) error {
	c, cancel := context.WithTimeout(context.Background(), timeout+time.Minute)
	defer cancel()
	_, err := r.kv.Put(c, &walshipv1.PutRequest{Key: key, Value: []byte("v"), Policy: &walshipv1.CommitPolicy{SyncTimeout: durationpb.New(timeout)}})
	return err
}

// wantJointK waits until the contract in force is the restarted
// primary's joint epoch record, and checks it has k in both halves and
// goes to the members next.
func wantJointK(t *testing.T, s *Server, k uint32, next string) {
	t.Helper()
	f := s.inForce.Load()
	c := f.contract
	if _, n, _ := memberIDs(c); f.stage != walshipv1.MembershipStage_MEMBERSHIP_STAGE_UNSPECIFIED || c.GetNext() == nil || n != next ||
		c.GetSyncReplicas() != k || c.GetNext().GetSyncReplicas() != k {
		t.Fatalf("the restarted primary's contract in force (stage %v): %v; want its joint epoch record, k %d in both halves, going to %s", f.stage, c, k, next)
	}
}

// TestJointRecordRestartLowersK: members p1, r1, r2 at k = 2, the log
// ending in the joint record of an add of r4 (which never connects); a
// write acknowledged under it. p1 restarts with --sync-replicas 1 while
// r2 is down: its joint epoch record (k = 1 in both halves) is
// acknowledged by r1 alone, but the epoch stays closed until r2 applies
// it too — the joint record's k = 2 promotion quorum is 2 of {r1, r2}
// besides p1, and without r2 it could be r2 and a node that never saw
// k = 1 — then the change is rolled back (r4 does not connect) under
// k = 1, and the acknowledged write is there.
func TestJointRecordRestartLowersK(t *testing.T) {
	c := startMembers(t, 2, "r1", "r2")
	s := c.p.s
	old := stripped(s.contract())
	next := stripped(old)
	next.Members = append(next.Members, &walshipv1.Member{Id: "r4", Addr: closedAddr(t)})
	if _, err := s.writeRecord(ctx(t), s.epochRecord(joint(old, next), walshipv1.MembershipStage_MEMBERSHIP_STAGE_JOINT)); err != nil {
		t.Fatal(err)
	}
	if err := defaultPut(c.p, "acked", time.Minute); err != nil {
		t.Fatalf("a write under the joint record at k = 2: %v", err)
	}
	if err := c.p.stop(t); err != nil {
		t.Fatal(err)
	}
	c.reps["r2"].stop(t)
	c.cfg.Policy.SyncReplicas = 1
	c.cfg.ChangeResumeGrace = 2 * time.Second
	c.startPrimary(t)
	// Once r1 applied it, the record is acknowledged at k = 1: the
	// primary either waits for the previous contract's members (a wait at
	// apply) or, wrongly, opens.
	testkit.Until(t, "r1 to apply the joint epoch record at k = 1, and the primary to wait for the previous contract's members", func() bool {
		rec := c.reps["r1"].s.EpochRecord()
		return rec.GetEpoch() > 1 && rec.GetContract().GetNext().GetSyncReplicas() == 1 &&
			(c.p.s.peers.waiting[walshipv1.SyncLevel_SYNC_LEVEL_APPLY].Load() > 0 || c.p.s.TakingWrites())
	})
	if c.p.s.TakingWrites() {
		t.Fatal("the primary opened its epoch lowering k with r1 alone of the previous contract's {r1, r2} holding the record")
	}
	c.start(t, "r2")
	waitServing(t, c.p.conn)
	testkit.Until(t, "the change to be rolled back", func() bool {
		return counter(t, c.p.s.metrics.changes.WithLabelValues(outcomeRolledBack)) == 1
	})
	f := c.p.s.inForce.Load()
	if m, n, _ := memberIDs(f.contract); m != "p1,r1,r2" || n != "" || f.contract.GetSyncReplicas() != 1 ||
		f.stage != walshipv1.MembershipStage_MEMBERSHIP_STAGE_ROLLED_BACK {
		t.Fatalf("after the roll-back: members %q next %q k %d stage %v", m, n, f.contract.GetSyncReplicas(), f.stage)
	}
	// k = 1 now: r1 alone acknowledges.
	c.reps["r2"].stop(t)
	if err := defaultPut(c.p, "k1", time.Minute); err != nil {
		t.Fatalf("a write at k = 1 with r1 up: %v", err)
	}
	for _, key := range []string{"acked", "k1"} {
		if got, err := c.p.kv.Get(ctx(t), &walshipv1.GetRequest{Key: key}); err != nil || string(got.GetValue()) != "v" {
			t.Fatalf("the acknowledged write %s: %v, %v", key, got, err)
		}
	}
}

// TestJointRecordRestartRaisesK: members p1, r1, r2 at k = 1, the log
// ending in the joint record of an add of r3; a write acknowledged under
// it. p1 restarts with --sync-replicas 2 while r3 is down: its joint
// epoch record has k = 2 in both halves, and while the change waits for
// r3 a write needs 2 of {r1, r2} (the first half) and 2 of {r1, r2, r3}:
// with r2 down it waits, though r1 alone met k = 1. Once r3 connects the
// change is finished under k = 2, and every acknowledged write is there.
func TestJointRecordRestartRaisesK(t *testing.T) {
	c := startMembers(t, 1, "r1", "r2", "r3")
	s := c.p.s
	old := stripped(s.contract())
	next := stripped(old)
	next.Members = append(next.Members, &walshipv1.Member{Id: "r3", Addr: c.reps["r3"].s.Addr()})
	if _, err := s.writeRecord(ctx(t), s.epochRecord(joint(old, next), walshipv1.MembershipStage_MEMBERSHIP_STAGE_JOINT)); err != nil {
		t.Fatal(err)
	}
	if err := defaultPut(c.p, "acked", time.Minute); err != nil {
		t.Fatalf("a write under the joint record at k = 1: %v", err)
	}
	if err := c.p.stop(t); err != nil {
		t.Fatal(err)
	}
	c.reps["r3"].stop(t)
	c.cfg.Policy.SyncReplicas = 2
	c.cfg.ChangeResumeGrace = 10 * time.Minute // the change waits for r3
	c.startPrimary(t)
	waitServing(t, c.p.conn)
	wantJointK(t, c.p.s, 2, "p1,r1,r2,r3")
	if err := defaultPut(c.p, "k2", time.Minute); err != nil {
		t.Fatalf("a write at k = 2 with r1 and r2 up: %v", err)
	}
	c.reps["r2"].stop(t)
	wantStatus(t, defaultPut(c.p, "r1-alone", 300*time.Millisecond), codes.Unavailable)
	c.start(t, "r2")
	c.start(t, "r3")
	testkit.Until(t, "the change to be finished", func() bool {
		return counter(t, c.p.s.metrics.changes.WithLabelValues(outcomeDone)) == 1
	})
	f := c.p.s.inForce.Load()
	if m, n, _ := memberIDs(f.contract); m != "p1,r1,r2,r3" || n != "" || f.contract.GetSyncReplicas() != 2 ||
		f.stage != walshipv1.MembershipStage_MEMBERSHIP_STAGE_FINAL {
		t.Fatalf("after the change: members %q next %q k %d stage %v", m, n, f.contract.GetSyncReplicas(), f.stage)
	}
	for _, key := range []string{"acked", "k2"} {
		if got, err := c.p.kv.Get(ctx(t), &walshipv1.GetRequest{Key: key}); err != nil || string(got.GetValue()) != "v" {
			t.Fatalf("the acknowledged write %s: %v, %v", key, got, err)
		}
	}
}
