package replica

import (
	"testing"

	walshipv1 "github.com/walship/walship/gen/walship/v1"
	"github.com/walship/walship/internal/envelope"
	"github.com/walship/walship/internal/keyspace"
	"google.golang.org/protobuf/proto"
)

// TestHeldEpochRecordCounts: a replica reports the contract of the newest
// epoch record in its log, applied or not: one that waits for the
// primary's durable LSN counts at once, and still after a restart (which
// holds back again what the applied marker does not cover); a cut of the
// log that takes it away takes its contract away too.
func TestHeldEpochRecordCounts(t *testing.T) {
	fp := newFakePrimary(t)
	cfg := testConfig(t, t.TempDir(), fp.addr)
	r := start(t, cfg)
	m := newModel(t)
	sess := fp.next(t)

	first := m.txn(put("a", "1"))
	sess.send(t, first)
	r.waitApplied(t, first.LastLsn)
	rec := &walshipv1.EpochRecord{Epoch: 1, FirstLsn: 1, PrimaryId: "p", Contract: &walshipv1.Contract{SyncReplicas: 1,
		Members: []*walshipv1.Member{{Id: "p", Addr: "p:1"}, {Id: "r1", Addr: "r1:1"}, {Id: "r2", Addr: "r2:1"}}}}
	data, err := proto.Marshal(rec)
	if err != nil {
		t.Fatal(err)
	}
	held := m.txn(put(keyspace.EpochRecordKey, string(data)))
	sess.sendDurable(t, first.LastLsn, held)
	sess.heartbeatDurable(t, 1, held.LastLsn, first.LastLsn, true)
	waitAckWhere(t, sess, func(a *walshipv1.ReplicaAck) bool { return a.FlushedLsn == held.LastLsn })
	check := func(when string, want int) {
		t.Helper()
		st := r.status(t)
		if got := len(st.GetContract().GetMembers()); got != want || st.GetVisibleLsn() >= held.LastLsn {
			t.Fatalf("%s: Status reports %d members (contract %v) at visible LSN %d; want %d, the record at LSN %d unapplied",
				when, got, st.GetContract(), st.GetVisibleLsn(), want, held.LastLsn)
		}
		if got := len(r.s.EpochRecord().GetContract().GetMembers()); got != want {
			t.Fatalf("%s: EpochRecord names %d members, want %d", when, got, want)
		}
	}
	check("held", 3)

	sess.end <- nil
	if err := r.stop(t); err != nil {
		t.Fatal(err)
	}
	r = start(t, cfg)
	check("held after a restart", 3)

	// The primary lost the record: the replica cuts it, and its contract.
	sess = fp.next(t)
	sess.diverged(t, first.LastLsn, 2, first.LastLsn)
	sess = fp.next(t)
	if sess.hello.GetNextLsn() != first.LastLsn+1 {
		t.Fatalf("hello after the cut = %v, want next_lsn %d", sess.hello, first.LastLsn+1)
	}
	check("cut", 0)
}

// TestHeldRecordOfTheSameEpoch: a membership change writes several epoch
// records in one epoch (learner, joint, final). The replica reports the
// newest in its log: a held record of the epoch it applied one of counts
// at once, and a newer one counts once applied. (A record once applied
// is the held one too: every written batch is looked into, so no step
// here can show EpochRecord's check of the held record's LSN, which only
// guards a state that applied a record some other way.)
func TestHeldRecordOfTheSameEpoch(t *testing.T) {
	fp := newFakePrimary(t)
	r := start(t, testConfig(t, t.TempDir(), fp.addr))
	m := newModel(t)
	sess := fp.next(t)
	record := func(members ...string) *walshipv1.WalBatch {
		rec := &walshipv1.EpochRecord{Epoch: 1, FirstLsn: 1, PrimaryId: "p", Contract: &walshipv1.Contract{SyncReplicas: 1}}
		for _, id := range members {
			rec.Contract.Members = append(rec.Contract.Members, &walshipv1.Member{Id: id, Addr: id + ":1"})
		}
		data, err := proto.Marshal(rec)
		if err != nil {
			t.Fatal(err)
		}
		return m.txn(put(keyspace.EpochRecordKey, string(data)))
	}
	check := func(when string, want int) {
		t.Helper()
		if got := len(r.s.EpochRecord().GetContract().GetMembers()); got != want {
			t.Fatalf("%s: EpochRecord names %d members, want %d", when, got, want)
		}
	}
	first := record("p", "r1")
	sess.send(t, first)
	r.waitApplied(t, first.LastLsn)
	check("the first record applied", 2)

	second := record("p", "r1", "r2")
	sess.sendDurable(t, first.LastLsn, second)
	sess.heartbeatDurable(t, 1, second.LastLsn, first.LastLsn, true)
	waitAckWhere(t, sess, func(a *walshipv1.ReplicaAck) bool { return a.FlushedLsn == second.LastLsn })
	check("a second record of the epoch held", 3)

	sess.heartbeatDurable(t, 1, second.LastLsn, second.LastLsn, false)
	r.waitApplied(t, second.LastLsn)
	third := record("p", "r2")
	sess.send(t, third)
	r.waitApplied(t, third.LastLsn)
	check("a third record, applied", 2)
}

// TestHeldChangeRecordCounts: a membership change writes the epoch record
// again within the epoch (a joint record, then the final one); a replica
// reports the newer one while it is held, unapplied, and once applied —
// a record of the epoch it already has is not passed over.
func TestHeldChangeRecordCounts(t *testing.T) {
	fp := newFakePrimary(t)
	cfg := testConfig(t, t.TempDir(), fp.addr)
	r := start(t, cfg)
	m := newModel(t)
	sess := fp.next(t)

	members := []*walshipv1.Member{{Id: "p", Addr: "p:1"}, {Id: "r1", Addr: "r1:1"}}
	record := func(c *walshipv1.Contract) string {
		data, err := proto.Marshal(&walshipv1.EpochRecord{Epoch: 1, FirstLsn: 1, PrimaryId: "p", Contract: c})
		if err != nil {
			t.Fatal(err)
		}
		return string(data)
	}
	first := m.txn(put(keyspace.EpochRecordKey, record(&walshipv1.Contract{SyncReplicas: 1, Members: members})))
	sess.send(t, first)
	r.waitApplied(t, first.LastLsn)
	if r.s.EpochRecord().GetContract().GetNext() != nil {
		t.Fatal("the epoch's first record is joint")
	}
	joint := m.txn(put(keyspace.EpochRecordKey, record(&walshipv1.Contract{SyncReplicas: 1, Members: members,
		Next: &walshipv1.Configuration{SyncReplicas: 1, Members: append(members, &walshipv1.Member{Id: "r2", Addr: "r2:1"})}})))
	sess.sendDurable(t, first.LastLsn, joint)
	sess.heartbeatDurable(t, 1, joint.LastLsn, first.LastLsn, true)
	waitAckWhere(t, sess, func(a *walshipv1.ReplicaAck) bool { return a.FlushedLsn == joint.LastLsn })
	if got := len(r.s.EpochRecord().GetContract().GetNext().GetMembers()); got != 3 {
		t.Fatalf("held joint record: EpochRecord's next names %d members (%v), want 3", got, r.s.EpochRecord().GetContract())
	}
	sess.heartbeatDurable(t, 1, joint.LastLsn, joint.LastLsn, true)
	r.waitApplied(t, joint.LastLsn)
	if got := len(r.s.EpochRecord().GetContract().GetNext().GetMembers()); got != 3 {
		t.Fatalf("applied joint record: EpochRecord's next names %d members, want 3", got)
	}
}

// TestSpilledRecordCountsAfterARestart: a replica restarted with batches
// still waiting for the primary's durable LSN, past its memory bound,
// keeps them in the WAL only (spilled); one of them may carry the log's
// newest epoch record, and it counts all the same, before it applies and
// after.
func TestSpilledRecordCountsAfterARestart(t *testing.T) {
	fp := newFakePrimary(t)
	cfg := testConfig(t, t.TempDir(), fp.addr)
	r := start(t, cfg)
	m := newModel(t)
	sess := fp.next(t)
	record := func(members ...string) *walshipv1.WalBatch {
		rec := &walshipv1.EpochRecord{Epoch: 1, FirstLsn: 1, PrimaryId: "p", Contract: &walshipv1.Contract{SyncReplicas: 1}}
		for _, id := range members {
			rec.Contract.Members = append(rec.Contract.Members, &walshipv1.Member{Id: id, Addr: id + ":1"})
		}
		data, err := proto.Marshal(rec)
		if err != nil {
			t.Fatal(err)
		}
		return m.txn(put(keyspace.EpochRecordKey, string(data)))
	}
	check := func(when string, want int) {
		t.Helper()
		if got := len(r.s.EpochRecord().GetContract().GetMembers()); got != want {
			t.Fatalf("%s: EpochRecord names %d members (%v), want %d", when, got, r.s.EpochRecord().GetContract(), want)
		}
	}
	first := record("p", "r1")
	sess.send(t, first)
	r.waitApplied(t, first.LastLsn)
	second := record("p", "r1", "r2")
	third := record("p", "r1", "r2", "r3")
	sess.sendDurable(t, first.LastLsn, second, third)
	sess.heartbeatDurable(t, 1, third.LastLsn, first.LastLsn, true)
	waitAckWhere(t, sess, func(a *walshipv1.ReplicaAck) bool { return a.FlushedLsn == third.LastLsn })
	check("two records held", 4)

	// Room for the second record's batch only: the third's spills.
	sess.end <- nil
	if err := r.stop(t); err != nil {
		t.Fatal(err)
	}
	stored, err := envelope.Marshal(second)
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxUnappliedBytes = int64(len(stored))
	r = start(t, cfg)
	if v := r.metric(t, "walship_replica_spilled_batches_total"); v != 1 {
		t.Fatalf("after restart spilled %v batches, want 1 (the third record's)", v)
	}
	check("held after a restart that spilled the newer record's batch", 4)
	sess = fp.next(t)
	sess.heartbeatDurable(t, 1, third.LastLsn, third.LastLsn, true)
	r.waitApplied(t, third.LastLsn)
	check("both applied", 4)
}
