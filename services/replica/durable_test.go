package replica

import (
	"fmt"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	walshipv1 "github.com/walship/walship/gen/walship/v1"
	"github.com/walship/walship/internal/vfs"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/types/known/durationpb"
)

// TestApplyWaitsForPrimaryDurable: batches sent before the primary made them
// durable are written, flushed and acknowledged at those stages at once,
// but applied (readable) only as far as the primary's durable LSN goes.
func TestApplyWaitsForPrimaryDurable(t *testing.T) {
	fp := newFakePrimary(t)
	cfg := testConfig(t, t.TempDir(), fp.addr)
	r := start(t, cfg)
	m := newModel(t)
	sess := fp.next(t)

	b1 := m.txn(put("a", "1"))
	b2 := m.txn(put("b", "2"))
	b3 := m.txn(put("c", "3"))
	sess.sendDurable(t, 0, b1, b2, b3)
	sess.heartbeatDurable(t, 1, b3.LastLsn, 0, true)
	a := waitAckWhere(t, sess, func(a *walshipv1.ReplicaAck) bool { return a.FlushedLsn == b3.LastLsn })
	if a.WrittenLsn != b3.LastLsn || a.AppliedLsn != 0 {
		t.Fatalf("ack = %v; want written and flushed at %d, nothing applied before the primary's durable LSN", a, b3.LastLsn)
	}
	c := tctx(t)
	_, err := r.kv.Get(c, &walshipv1.GetRequest{Key: "a", MinLsn: b1.LastLsn, WaitTimeout: durationpb.New(50 * time.Millisecond)})
	wantCode(t, "Get before the primary's fsync", err, codes.DeadlineExceeded, "not visible")
	if st := r.status(t); st.VisibleLsn != 0 || st.LastLsn != b3.LastLsn || st.DurableLsn != b3.LastLsn {
		t.Fatalf("Status = %v; want written and durable here at %d, visible 0", st, b3.LastLsn)
	}

	// The primary's fsync covered b1 and b2: exactly those become readable.
	sess.heartbeatDurable(t, 1, b3.LastLsn, b2.LastLsn, true)
	r.waitApplied(t, b2.LastLsn)
	if got, err := r.kv.Get(c, &walshipv1.GetRequest{Key: "b", MinLsn: b2.LastLsn}); err != nil || string(got.Value) != "2" {
		t.Fatalf("Get b = %v, %v", got, err)
	}
	if got, err := r.kv.Get(c, &walshipv1.GetRequest{Key: "c"}); err != nil || got.Found || got.AppliedLsn != b2.LastLsn {
		t.Fatalf("Get c = %v, %v; want not found at applied %d", got, err, b2.LastLsn)
	}

	// A later batch carries the next durable LSN.
	b4 := m.txn(put("d", "4"))
	sess.sendDurable(t, b3.LastLsn, b4)
	r.waitApplied(t, b3.LastLsn)
	sess.heartbeatDurable(t, 1, b4.LastLsn, b4.LastLsn, true)
	r.waitApplied(t, b4.LastLsn)
	if st := r.status(t); st.StateDigest != m.digest() {
		t.Fatalf("digest %s, want %s", st.StateDigest, m.digest())
	}
}

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

// TestDivergedTailIsCut: the replica received a tail the primary never made
// durable; the primary crashed, restarted in a new epoch and answers the
// hello with Diverged. The replica cuts the tail (it never applied it),
// reconnects from the cut and follows the primary's new history.
func TestDivergedTailIsCut(t *testing.T) {
	fp := newFakePrimary(t)
	cfg := testConfig(t, t.TempDir(), fp.addr)
	r := start(t, cfg)
	m := newModel(t)
	sess := fp.next(t)

	b1 := m.txn(put("a", "1"))
	b2 := m.txn(put("b", "2"))
	sess.send(t, b1, b2)
	lost := forkModel(t, m, b1, b2)
	l3 := lost.txn(put("a", "lost"))
	l4 := lost.txn(put("z", "lost"))
	sess.sendDurable(t, b2.LastLsn, l3, l4)
	sess.heartbeatDurable(t, 1, l4.LastLsn, b2.LastLsn, true)
	waitAckWhere(t, sess, func(a *walshipv1.ReplicaAck) bool { return a.FlushedLsn == l4.LastLsn })
	r.waitApplied(t, b2.LastLsn)
	sess.end <- nil

	// The primary restarted in epoch 2 at LSN b2.LastLsn+1.
	sess = fp.next(t)
	if sess.hello.GetNextLsn() != l4.LastLsn+1 || sess.hello.GetEpoch() != 1 {
		t.Fatalf("hello = %v", sess.hello)
	}
	sess.diverged(t, b2.LastLsn, 2, b2.LastLsn)

	sess = fp.next(t)
	if sess.hello.GetNextLsn() != b2.LastLsn+1 {
		t.Fatalf("hello after the cut = %v, want next_lsn %d", sess.hello, b2.LastLsn+1)
	}
	m.epoch = 2
	b3 := m.txn(put("a", "kept"))
	sess.send(t, b3)
	r.waitApplied(t, b3.LastLsn)
	st := r.status(t)
	if st.StateDigest != m.digest() || st.LastLsn != b3.LastLsn || st.Epoch != 2 {
		t.Fatalf("Status = %v; want the new history's digest %s at LSN %d, epoch 2", st, m.digest(), b3.LastLsn)
	}
	if got, err := r.kv.Get(tctx(t), &walshipv1.GetRequest{Key: "z"}); err != nil || got.Found {
		t.Fatalf("Get z (only in the lost tail) = %v, %v", got, err)
	}
	if v := r.metric(t, "walship_replica_diverged_total"); v != 1 {
		t.Fatalf("walship_replica_diverged_total = %v, want 1", v)
	}

	// The cut is durable: a restart replays only the new history.
	if err := r.stop(t); err != nil {
		t.Fatal(err)
	}
	r2 := start(t, cfg)
	if st := r2.status(t); st.StateDigest != m.digest() || st.LastLsn != b3.LastLsn {
		t.Fatalf("Status after restart = %v; want digest %s at %d", st, m.digest(), b3.LastLsn)
	}
}

// TestRestartKeepsUndurableTailPending: a replica restarts holding batches
// the primary never reported durable. It replays its log only up to what it
// had applied (its applied marker), keeps the rest unapplied, and when the
// primary — which lost them in a crash — says Diverged, cuts them.
func TestRestartKeepsUndurableTailPending(t *testing.T) {
	fp, cfg, r, m, b1, l3, _ := divergedReplica(t)
	if err := r.stop(t); err != nil {
		t.Fatal(err)
	}
	r = start(t, cfg)
	if st := r.status(t); st.VisibleLsn != b1.LastLsn || st.LastLsn != l3.LastLsn {
		t.Fatalf("after restart %v; want visible %d (not the undurable tail), last %d", st, b1.LastLsn, l3.LastLsn)
	}
	m.epoch = 2
	sess := fp.next(t)
	sess.diverged(t, b1.LastLsn, 2, b1.LastLsn)
	sess = fp.next(t)
	if sess.hello.GetNextLsn() != b1.LastLsn+1 || fp.snapshotCalls.Load() != 0 {
		t.Fatalf("hello after the cut = %v (%d snapshot calls); want next_lsn %d, no snapshot", sess.hello, fp.snapshotCalls.Load(), b1.LastLsn+1)
	}
	b2 := m.txn(put("a", "new"))
	sess.send(t, b2)
	r.waitApplied(t, b2.LastLsn)
	if st := r.status(t); st.StateDigest != m.digest() || st.LastLsn != b2.LastLsn {
		t.Fatalf("Status = %v; want the primary's digest %s at %d", st, m.digest(), b2.LastLsn)
	}
}

// TestDivergedAfterApplyReseeds: a replica that applied batches the primary
// then lost (forced here through its applied marker; the protocol never
// lets it) can only get back to the primary's history through a snapshot,
// even one older than what it had applied.
func TestDivergedAfterApplyReseeds(t *testing.T) {
	fp, cfg, r, m, b2, sess := reseedBackwards(t, nil, nil)
	if sess.hello.GetNextLsn() != b2.LastLsn+1 || sess.hello.GetEpoch() != 2 || fp.snapshotCalls.Load() != 1 {
		t.Fatalf("hello after re-seed = %v (%d snapshot calls); want next_lsn %d epoch 2 after one snapshot",
			sess.hello, fp.snapshotCalls.Load(), b2.LastLsn+1)
	}
	if st := r.status(t); st.StateDigest != m.digest() || st.LastLsn != b2.LastLsn || st.VisibleLsn != b2.LastLsn {
		t.Fatalf("Status = %v; want the primary's digest %s at %d", st, m.digest(), b2.LastLsn)
	}
	if v := r.metric(t, "walship_replica_diverged_total"); v != 1 {
		t.Fatalf("walship_replica_diverged_total = %v, want 1", v)
	}
	// Nothing of the lost history comes back with a restart.
	if err := r.stop(t); err != nil {
		t.Fatal(err)
	}
	r = start(t, cfg)
	if st := r.status(t); st.StateDigest != m.digest() || st.VisibleLsn != b2.LastLsn {
		t.Fatalf("Status after restart = %v; want digest %s at %d", st, m.digest(), b2.LastLsn)
	}
}

// reseedBackwards runs a replica that applied batches its primary lost
// (divergedReplica, restarted with the applied marker past them), then
// answers its hello with Diverged at epoch 2: the replica re-seeds from a
// snapshot at b2, below what it had applied. It returns the session the
// replica opened after the re-seed.
func reseedBackwards(t *testing.T, fsys vfs.FS, beforeDiverged func()) (*fakePrimary, Config, *running, *model, *walshipv1.WalBatch, *session) {
	t.Helper()
	fp, cfg, r, m, b1, l3, _ := divergedReplicaOn(t, fsys)
	if err := r.stop(t); err != nil {
		t.Fatal(err)
	}
	if fsys == nil {
		fsys = vfs.OS
	}
	if err := vfs.WriteFile(fsys, filepath.Join(cfg.DataDir, "applied"), []byte(fmt.Sprintf("%d\n", l3.LastLsn)), 0o644); err != nil {
		t.Fatal(err)
	}
	r = start(t, cfg) // replays the lost batches
	if st := r.status(t); st.VisibleLsn != l3.LastLsn {
		t.Fatalf("after restart visible %d, want the replayed %d", st.VisibleLsn, l3.LastLsn)
	}
	m.epoch = 2
	b2 := m.txn(put("a", "new"))
	fp.snapshot = snapshotOf(m.ref, 2)
	sess := fp.next(t)
	if beforeDiverged != nil {
		beforeDiverged()
	}
	sess.diverged(t, b1.LastLsn, 2, b2.LastLsn)
	return fp, cfg, r, m, b2, fp.next(t)
}

// TestBackwardReseedForgetsTheLostDurableLSN: after a re-seed below what it
// had applied, the replica applies the new primary's next batch only once
// the new primary reports it durable — not on the durable LSN the old
// primary reported of the history it lost.
func TestBackwardReseedForgetsTheLostDurableLSN(t *testing.T) {
	_, _, r, m, b2, sess := reseedBackwards(t, nil, nil)
	b3 := m.txn(put("b", "next")) // the LSNs the lost history had applied
	sess.sendDurable(t, b2.LastLsn, b3)
	sess.heartbeatDurable(t, 2, b3.LastLsn, b2.LastLsn, true)
	waitAckWhere(t, sess, func(a *walshipv1.ReplicaAck) bool { return a.FlushedLsn >= b3.LastLsn })
	if st := r.status(t); st.VisibleLsn != b2.LastLsn {
		t.Fatalf("visible LSN %d with LSN %d flushed but reported durable only through %d; want %d",
			st.VisibleLsn, b3.LastLsn, b2.LastLsn, b2.LastLsn)
	}
	sess.heartbeatDurable(t, 2, b3.LastLsn, b3.LastLsn, true)
	r.waitApplied(t, b3.LastLsn)
	if st := r.status(t); st.StateDigest != m.digest() {
		t.Fatalf("digest %s, want %s", st.StateDigest, m.digest())
	}
}

// TestFailedBackwardReseedKeepsTheOldEpoch: a re-seed that must undo a
// diverged tail fails before its WAL is reset (saving the snapshot fails).
// The replica keeps its old epoch, so the primary would tell it again that
// it diverged, and it retries the snapshot rather than streaming onto the
// tail it still holds; the retry re-seeds it.
func TestFailedBackwardReseedKeepsTheOldEpoch(t *testing.T) {
	mem := vfs.NewMem()
	var armed, failed atomic.Bool
	mem.InjectError(func(op vfs.Op, name string) error {
		if op == vfs.OpRename && strings.HasSuffix(name, ".snap.tmp") && armed.Load() && failed.CompareAndSwap(false, true) {
			return vfs.ErrInjected
		}
		return nil
	})
	fp, _, r, m, b2, sess := reseedBackwards(t, mem, func() { armed.Store(true) })
	if !failed.Load() {
		t.Fatal("no snapshot save failed; the test did not exercise the failure")
	}
	if got := fp.snapshotCalls.Load(); got != 2 || sess.hello.GetEpoch() != 2 || sess.hello.GetNextLsn() != b2.LastLsn+1 {
		t.Fatalf("after a failed and a retried re-seed: %d snapshot calls, hello %v; want 2 calls, then epoch 2 from LSN %d",
			got, sess.hello, b2.LastLsn+1)
	}
	if st := r.status(t); st.StateDigest != m.digest() || st.VisibleLsn != b2.LastLsn {
		t.Fatalf("Status = %v; want the primary's digest %s at %d", st, m.digest(), b2.LastLsn)
	}
}

// divergedReplica runs a replica that applied b1 (durable on the primary)
// and holds l2 and l3, which the primary sent before its fsync and never
// reported durable.
func divergedReplica(t *testing.T) (*fakePrimary, Config, *running, *model, *walshipv1.WalBatch, *walshipv1.WalBatch, *session) {
	t.Helper()
	return divergedReplicaOn(t, nil)
}

// divergedReplicaOn is divergedReplica on fsys (nil: the real disk).
func divergedReplicaOn(t *testing.T, fsys vfs.FS) (*fakePrimary, Config, *running, *model, *walshipv1.WalBatch, *walshipv1.WalBatch, *session) {
	t.Helper()
	fp := newFakePrimary(t)
	cfg := testConfig(t, t.TempDir(), fp.addr)
	if fsys != nil {
		cfg.FS, cfg.DataDir = fsys, "/data"
	}
	r := start(t, cfg)
	m := newModel(t)
	sess := fp.next(t)
	b1 := m.txn(put("a", "1"))
	sess.send(t, b1)
	lost := forkModel(t, m, b1)
	l2 := lost.txn(put("z", "lost"))
	l3 := lost.txn(put("y", "lost"))
	sess.sendDurable(t, b1.LastLsn, l2, l3)
	sess.heartbeatDurable(t, 1, l3.LastLsn, b1.LastLsn, true)
	waitAckWhere(t, sess, func(a *walshipv1.ReplicaAck) bool { return a.FlushedLsn == l3.LastLsn })
	r.waitApplied(t, b1.LastLsn)
	return fp, cfg, r, m, b1, l3, sess
}

// TestDivergedInsideABatchReseeds: a Diverged whose cut falls inside one of
// the replica's batches cannot be carried out by cutting; the replica
// re-seeds instead of stopping.
func TestDivergedInsideABatchReseeds(t *testing.T) {
	fp, _, r, m, b1, _, sess := divergedReplica(t)
	sess.end <- nil
	m.epoch = 2
	b2 := m.txn(put("a", "new"))
	fp.snapshot = snapshotOf(m.ref, 2)
	sess = fp.next(t)
	sess.diverged(t, b1.LastLsn+1, 2, b2.LastLsn)
	sess = fp.next(t)
	if sess.hello.GetNextLsn() != b2.LastLsn+1 || fp.snapshotCalls.Load() != 1 {
		t.Fatalf("hello = %v (%d snapshot calls); want next_lsn %d after one snapshot", sess.hello, fp.snapshotCalls.Load(), b2.LastLsn+1)
	}
	if st := r.status(t); st.StateDigest != m.digest() || !st.Serving {
		t.Fatalf("Status = %v; want serving the primary's digest %s", st, m.digest())
	}
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
