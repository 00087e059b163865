package replica

import (
	"fmt"
	"testing"
	"time"

	walshipv1 "github.com/walship/walship/gen/walship/v1"
)

// waitAckWhere returns the first ack that satisfies ok.
func waitAckWhere(t *testing.T, s *session, ok func(*walshipv1.ReplicaAck) bool) *walshipv1.ReplicaAck {
	t.Helper()
	deadline := time.After(10 * time.Second)
	for {
		select {
		case a := <-s.acks:
			if ok(a) {
				return a
			}
		case <-deadline:
			t.Fatal("no matching ack within 10s")
			return nil
		}
	}
}

// forked returns the primary's history up to the fork and a batch builder
// for a tail that the primary will lose.
func forkModel(t *testing.T, m *model, shared ...*walshipv1.WalBatch) *model {
	t.Helper()
	lost := newModel(t)
	lost.epoch = m.epoch
	for _, b := range shared {
		lost.apply(b)
	}
	lost.next = m.next
	return lost
}

// diverged answers the stream with Diverged and ends it. durable is sent
// along, as a buggy primary might: the replica must not use it.
func (s *session) diverged(t *testing.T, keep, epoch, durable uint64) {
	t.Helper()
	if err := s.stream.Send(&walshipv1.StreamResponse{DurableLsn: durable, Msg: &walshipv1.StreamResponse_Diverged{
		Diverged: &walshipv1.Diverged{TruncateAfterLsn: keep, Epoch: epoch}}}); err != nil {
		t.Fatal(err)
	}
	s.end <- nil
}

// TestUnappliedBatchesSpillToTheWAL: with --max-unapplied-bytes 0 no
// written batch waiting for the primary's durable LSN stays in memory; each
// is read back from the replica's WAL to be applied — in order, after a
// restart too, and a tail the primary lost is still cut.
func TestUnappliedBatchesSpillToTheWAL(t *testing.T) {
	fp := newFakePrimary(t)
	cfg := testConfig(t, t.TempDir(), fp.addr)
	cfg.MaxUnappliedBytes = 0
	r := start(t, cfg)
	m := newModel(t)
	sess := fp.next(t)

	var bs []*walshipv1.WalBatch
	for i := range 12 {
		bs = append(bs, m.txn(put(fmt.Sprintf("k%02d", i), fmt.Sprintf("v%d", i)), put("counter", fmt.Sprint(i))))
	}
	last := bs[len(bs)-1].LastLsn
	sess.sendDurable(t, 0, bs...)
	sess.heartbeatDurable(t, 1, last, 0, true)
	waitAckWhere(t, sess, func(a *walshipv1.ReplicaAck) bool { return a.FlushedLsn == last })
	if v := r.metric(t, "walship_replica_spilled_batches_total"); v != float64(len(bs)) {
		t.Fatalf("spilled %v batches, want %d", v, len(bs))
	}
	if v := r.metric(t, "walship_replica_unapplied_bytes"); v != 0 {
		t.Fatalf("unapplied bytes in memory = %v, want 0", v)
	}
	// Part of them becomes durable on the primary: exactly those apply.
	sess.heartbeatDurable(t, 1, last, bs[4].LastLsn, true)
	r.waitApplied(t, bs[4].LastLsn)
	c := tctx(t)
	if got, err := r.kv.Get(c, &walshipv1.GetRequest{Key: "counter"}); err != nil || string(got.Value) != "4" || got.AppliedLsn != bs[4].LastLsn {
		t.Fatalf("Get counter = %v, %v; want 4 at applied LSN %d", got, err, bs[4].LastLsn)
	}

	// Restart with the rest still waiting: recovery keeps them spilled too.
	sess.end <- nil
	if err := r.stop(t); err != nil {
		t.Fatal(err)
	}
	r = start(t, cfg)
	if v := r.metric(t, "walship_replica_spilled_batches_total"); v != float64(len(bs)-5) {
		t.Fatalf("after restart spilled %v batches, want %d", v, len(bs)-5)
	}
	sess = fp.next(t)
	if sess.hello.GetNextLsn() != last+1 {
		t.Fatalf("hello after restart = %v, want next_lsn %d", sess.hello, last+1)
	}
	// The primary lost bs[9:] in a crash: the replica cuts them and applies
	// the rest of what it read back.
	kept := bs[8].LastLsn
	m2 := forkModel(t, newModel(t), bs[:9]...)
	sess.diverged(t, kept, 2, kept)
	sess = fp.next(t)
	if sess.hello.GetNextLsn() != kept+1 {
		t.Fatalf("hello after the cut = %v, want next_lsn %d", sess.hello, kept+1)
	}
	m2.epoch, m2.next = 2, kept+1
	b := m2.txn(put("counter", "new"))
	sess.send(t, b)
	r.waitApplied(t, b.LastLsn)
	if st := r.status(t); st.StateDigest != m2.digest() || st.LastLsn != b.LastLsn {
		t.Fatalf("Status = %v; want the primary's digest %s at LSN %d", st, m2.digest(), b.LastLsn)
	}
	if v := r.metric(t, "walship_replica_unapplied_bytes"); v != 0 {
		t.Fatalf("unapplied bytes in memory = %v, want 0", v)
	}
}

// TestSpilledAndHeldBatchesInterleave: with room for two batches in memory,
// batches waiting for the primary's durable LSN alternate between held and
// spilled as applying frees room; they still apply in order.
func TestSpilledAndHeldBatchesInterleave(t *testing.T) {
	fp := newFakePrimary(t)
	cfg := testConfig(t, t.TempDir(), fp.addr)
	m := newModel(t)
	var bs []*walshipv1.WalBatch
	for i := range 9 {
		bs = append(bs, m.txn(put(fmt.Sprintf("k%02d", i), fmt.Sprintf("v%02d", i))))
	}
	cfg.MaxUnappliedBytes = int64(2 * len(bs[0].Payload))
	r := start(t, cfg)
	sess := fp.next(t)

	sess.sendDurable(t, 0, bs[:6]...) // 0, 1 held; 2-5 spilled
	sess.heartbeatDurable(t, 1, bs[5].LastLsn, bs[3].LastLsn, true)
	r.waitApplied(t, bs[3].LastLsn)
	sess.sendDurable(t, bs[3].LastLsn, bs[6:]...) // 6, 7 held; 8 spilled
	last := bs[8].LastLsn
	// Flushed here first, so that one apply covers 4-8 and reads 8 back
	// past the held 6 and 7.
	sess.heartbeatDurable(t, 1, last, bs[3].LastLsn, true)
	waitAckWhere(t, sess, func(a *walshipv1.ReplicaAck) bool { return a.FlushedLsn == last })
	sess.heartbeatDurable(t, 1, last, last, true)
	r.waitApplied(t, last)
	if v := r.metric(t, "walship_replica_spilled_batches_total"); v != 5 {
		t.Fatalf("spilled %v batches, want 5 (2-5 and 8)", v)
	}
	if st := r.status(t); st.StateDigest != m.digest() || st.VisibleLsn != last {
		t.Fatalf("Status = %v; want digest %s at %d", st, m.digest(), last)
	}
	// Still following (a failed read-back would have stopped the replica).
	b := m.txn(put("after", "x"))
	sess.send(t, b)
	r.waitApplied(t, b.LastLsn)
}
