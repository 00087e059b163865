package logstore

import (
	"fmt"
	"testing"
	"time"

	walshipv1 "github.com/walship/walship/gen/walship/v1"
	"github.com/walship/walship/internal/datadir"
	"github.com/walship/walship/internal/testkit"
	"github.com/walship/walship/internal/vfs"
	"google.golang.org/grpc/codes"
)

// jumpRefusal is how a refusal names an epoch past the jump from known.
func jumpRefusal(field string, e, known uint64) string {
	return fmt.Sprintf("%s: %d is more than 1048576 (the most one message may move an epoch) above %d, the newest epoch known here", field, e, known)
}

// TestEpochJump: a fence, an Append heartbeat or a batch stating an epoch
// more than datadir.MaxEpochJump above the newest the log store knows is
// refused (INVALID_ARGUMENT naming the field and the bound) and promises
// nothing — a log store that knows none yet included. A fuzzer's one
// Append heartbeat of epoch 2^63-1 from a node certificate made a log
// store promise it: the primary was refused, stepped down, and no epoch
// was left for the next. A primary several promotions ahead of the log
// store (it was away) is taken as ever, and the bound moves with the
// promise.
func TestEpochJump(t *testing.T) {
	dir := t.TempDir()
	r := start(t, testConfig(t, dir))
	epochs := walshipv1.NewEpochServiceClient(r.conn)
	fenceAt := func(e uint64) (*walshipv1.FenceResponse, error) {
		return epochs.Fence(t.Context(), &walshipv1.FenceRequest{Epoch: e, CandidateId: "c1", CandidateAddr: "c1:7401"})
	}
	promised := func(want uint64, after string) {
		t.Helper()
		if st := r.status(t); st.VoteEpoch != want || st.Epoch != want {
			t.Fatalf("after %s: the log store promised epoch %d (status epoch %d); want %d", after, st.VoteEpoch, st.Epoch, want)
		}
		if v, err := datadir.LoadVote(vfs.OS, dir); err != nil || v.Epoch != want {
			t.Fatalf("after %s: vote file %v, %v; want epoch %d", after, v, err, want)
		}
	}

	// Knowing no epoch yet: the fuzzer's message, and a fence one past 2^20.
	a := r.append(t)
	a.sendOrEnded(&walshipv1.AppendRequest{Heartbeat: &walshipv1.Heartbeat{Epoch: datadir.MaxEpoch, LastLsn: 1, TimeUnixNano: 1,
		ReplyRequested: true, PrimaryId: "primary", PrimaryAddr: "127.0.0.1:7401"}}, "heartbeat")
	wantCode(t, a.failure(), codes.InvalidArgument, jumpRefusal("heartbeat.epoch", datadir.MaxEpoch, 0))
	_, err := fenceAt(datadir.MaxEpochJump + 1)
	wantCode(t, err, codes.InvalidArgument, jumpRefusal("epoch", datadir.MaxEpochJump+1, 0))
	promised(0, "refusals")

	// A primary of epoch 3 ships; then everything past 3 + 2^20 is refused.
	r.appendAll(t, chain(t, 3, 1, 2, 10)...)
	promised(3, "the primary of epoch 3")
	far := uint64(3 + datadir.MaxEpochJump + 1)
	_, err = fenceAt(far)
	wantCode(t, err, codes.InvalidArgument, jumpRefusal("epoch", far, 3))
	a = r.append(t)
	a.heartbeat(far)
	wantCode(t, a.failure(), codes.InvalidArgument, jumpRefusal("heartbeat.epoch", far, 3))
	a = r.append(t)
	a.heartbeat(3)
	a.sendOrEnded(&walshipv1.AppendRequest{Batch: batch(t, far, 5, 1, 10)}, "batch")
	wantCode(t, a.failure(), codes.InvalidArgument, jumpRefusal("batch.epoch", far, 3))
	promised(3, "refusals at epoch 3")
	if st := r.status(t); st.DurableLsn != 4 || st.LastEpoch != 3 {
		t.Fatalf("after refusals: %v; want LSNs up to 4 of epoch 3 only", st)
	}

	// The primary of epoch 8, five promotions later, ships its batches.
	if ack := r.appendAll(t, batch(t, 8, 5, 1, 10)); ack.DurableLsn != 6 || ack.Epoch != 8 {
		t.Fatalf("ack of the primary of epoch 8: %v", ack)
	}
	promised(8, "the primary of epoch 8")
	// The bound moved with it: 8 + 2^20 + 1 is refused, 8 + 2^20 granted.
	_, err = fenceAt(8 + datadir.MaxEpochJump + 1)
	wantCode(t, err, codes.InvalidArgument, jumpRefusal("epoch", 8+datadir.MaxEpochJump+1, 8))
	if resp, err := fenceAt(8 + datadir.MaxEpochJump); err != nil || !resp.Granted {
		t.Fatalf("fence at the bound = %v, %v", resp, err)
	}
	promised(8+datadir.MaxEpochJump, "a fence at the bound")
}

// TestRefillEpochJump: an emptied log store knows no epoch; it catches
// up with a peer whose log is of an epoch up to datadir.MaxEpochGap above
// that (it asked that peer itself), but not with one further ahead (its
// history is not usable), nor promises it; with its vote file seeded near
// the cluster's epoch (what docs/RUNBOOK.md has an operator do once a
// cluster has had more than 2^30 elections) it refills from that peer as
// ever.
func TestRefillEpochJump(t *testing.T) {
	for _, high := range []uint64{datadir.MaxEpochJump + 5, datadir.MaxEpochGap} {
		adir := t.TempDir()
		if err := datadir.SaveVote(vfs.OS, adir, datadir.Vote{Epoch: high - 1}); err != nil {
			t.Fatal(err)
		}
		a := start(t, testConfig(t, adir))
		a.appendAll(t, chain(t, high, 1, 5, 10)...)
		cfg := testConfig(t, t.TempDir())
		cfg.Peers = []string{a.s.Addr()}
		b := start(t, cfg)
		if st := b.refilled(t); st.DurableLsn != 10 || st.VoteEpoch != high {
			t.Fatalf("an empty log store after a refill from a peer of epoch %d: %v; want its 10 LSNs, promised epoch %d", high, st, high)
		}
	}

	high := uint64(datadir.MaxEpochGap + 5)
	adir := t.TempDir()
	if err := datadir.SaveVote(vfs.OS, adir, datadir.Vote{Epoch: high - 1}); err != nil {
		t.Fatal(err)
	}
	a := start(t, testConfig(t, adir))
	bs := chain(t, high, 1, 5, 10)
	a.appendAll(t, bs...)

	cfg := testConfig(t, t.TempDir())
	cfg.Peers = []string{a.s.Addr()}
	b := start(t, cfg)
	st := b.refilled(t)
	if st.FirstLsn != 0 || st.VoteEpoch != 0 || st.LastEpoch != 0 {
		t.Fatalf("an empty log store after a refill from a peer of epoch %d: %v; want nothing copied nor promised", high, st)
	}

	seeded := t.TempDir()
	if err := datadir.SaveVote(vfs.OS, seeded, datadir.Vote{Epoch: high - 3}); err != nil {
		t.Fatal(err)
	}
	cfg = testConfig(t, seeded)
	cfg.Peers = []string{a.s.Addr()}
	c := start(t, cfg)
	testkit.UntilWithin(t, 30*time.Second, "the seeded log store to refill", func() bool {
		st = c.status(t)
		return !st.Refilling && st.DurableLsn == 10
	})
	if st.VoteEpoch != high || st.LastEpoch != high {
		t.Fatalf("the seeded log store after its refill: %v; want epoch %d", st, high)
	}
}
