package logstore

import (
	"math"
	"testing"
	"time"

	walshipv1 "github.com/walship/walship/gen/walship/v1"
	"github.com/walship/walship/internal/datadir"
	"github.com/walship/walship/internal/vfs"
	"google.golang.org/grpc/codes"
)

// TestFence: a fence of a newer epoch is promised durably, answered with
// the end of the stored log and its history, ends the old primary's open
// stream and refuses it afterwards; the candidate's stream of that epoch
// then ships, cuts the stored tail its history does not have (kept in an
// orphan file) and continues. A fence of an epoch not newer is refused,
// naming the holder. Bad requests are refused naming the field.
func TestFence(t *testing.T) {
	dir := t.TempDir()
	r := start(t, testConfig(t, dir))
	fence := walshipv1.NewEpochServiceClient(r.conn)
	// The old primary, epoch 3, has stored LSNs 1-6 and keeps its stream open.
	old := r.append(t)
	old.heartbeat(3)
	old.send(chain(t, 3, 1, 3, 10)...)
	old.waitDurable(6)

	resp, err := fence.Fence(t.Context(), &walshipv1.FenceRequest{Epoch: 4, CandidateId: "r1", CandidateAddr: "10.0.0.2:7401"})
	if err != nil {
		t.Fatal(err)
	}
	if !resp.Granted || resp.Epoch != 4 || resp.LastEpoch != 3 || resp.LastLsn != 6 || len(resp.History) != 1 || resp.PrimaryId != "r1" {
		t.Fatalf("fence = %v", resp)
	}
	if v, err := datadir.LoadVote(vfs.OS, dir); err != nil || v != (datadir.Vote{Epoch: 4, Primary: "r1", Addr: "10.0.0.2:7401"}) {
		t.Fatalf("vote after the fence: %v, %v", v, err)
	}
	wantCode(t, old.failure(), codes.FailedPrecondition, "fenced", "epoch 4", "r1")
	again := r.append(t)
	again.heartbeat(3)
	wantCode(t, again.failure(), codes.FailedPrecondition, "stale epoch 3, log store is at epoch 4", "r1")

	// The same candidate again (a retry whose answer was lost) is granted again.
	if resp, err := fence.Fence(t.Context(), &walshipv1.FenceRequest{Epoch: 4, CandidateId: "r1", CandidateAddr: "10.0.0.2:7401"}); err != nil || !resp.Granted || resp.Epoch != 4 || resp.LastLsn != 6 {
		t.Fatalf("retried fence = %v, %v", resp, err)
	}
	// Not newer: refused, naming who holds it.
	resp, err = fence.Fence(t.Context(), &walshipv1.FenceRequest{Epoch: 4, CandidateId: "r2", CandidateAddr: "x:1"})
	if err != nil || resp.Granted || resp.Epoch != 4 || resp.PrimaryId != "r1" {
		t.Fatalf("second fence at epoch 4 = %v, %v", resp, err)
	}
	for _, bad := range []struct {
		req  *walshipv1.FenceRequest
		want string
	}{
		{&walshipv1.FenceRequest{CandidateId: "r1", CandidateAddr: "a"}, "epoch"},
		{&walshipv1.FenceRequest{Epoch: 9, CandidateId: "no spaces", CandidateAddr: "a"}, "candidate_id"},
		{&walshipv1.FenceRequest{Epoch: 9, CandidateId: "-", CandidateAddr: "a"}, "candidate_id"},
		// Kept in the vote file, a space would make it unreadable.
		{&walshipv1.FenceRequest{Epoch: 9, CandidateId: "r9", CandidateAddr: "h:1 x"}, "candidate_addr"},
		{&walshipv1.FenceRequest{Epoch: math.MaxUint64, CandidateId: "r9", CandidateAddr: "a"}, "epoch: 18446744073709551615 is above the highest epoch"},
		{&walshipv1.FenceRequest{Epoch: datadir.MaxEpoch + 1, CandidateId: "r9", CandidateAddr: "a"}, "epoch: 9223372036854775808 is above the highest epoch"},
	} {
		_, err := fence.Fence(t.Context(), bad.req)
		wantCode(t, err, codes.InvalidArgument, bad.want)
	}

	// A heartbeat naming a primary no vote file can hold is refused,
	// learning nothing: the vote still reads back.
	for field, hb := range map[string]*walshipv1.Heartbeat{
		"heartbeat.primary_addr": {Epoch: 4, PrimaryId: "r1", PrimaryAddr: "10.0.0.2:7401 x"},
		"heartbeat.primary_id":   {Epoch: 4, PrimaryId: "-", PrimaryAddr: "10.0.0.2:7401"},
	} {
		bad := r.append(t)
		bad.sendOrEnded(&walshipv1.AppendRequest{Heartbeat: hb}, "heartbeat")
		wantCode(t, bad.failure(), codes.InvalidArgument, field)
	}
	if v, err := datadir.LoadVote(vfs.OS, dir); err != nil || v != (datadir.Vote{Epoch: 4, Primary: "r1", Addr: "10.0.0.2:7401"}) {
		t.Fatalf("vote after refused heartbeats: %v, %v", v, err)
	}

	// The new primary's history has epoch 3 up to LSN 4 only: it cuts 5-6.
	a := r.append(t)
	a.heartbeat(4)
	a.ack()
	if err := a.stream.Send(&walshipv1.AppendRequest{Truncate: true, TruncateAfterLsn: 4, Heartbeat: &walshipv1.Heartbeat{Epoch: 4, ReplyRequested: true}}); err != nil {
		t.Fatal(err)
	}
	if ack := a.logAck(); ack.DurableLsn != 4 {
		t.Fatalf("ack after the cut = %v, want durable 4", ack)
	}
	a.send(batch(t, 4, 5, 1, 10))
	a.waitDurable(6)
	st := r.status(t)
	if st.LastEpoch != 4 || len(st.History) != 2 || st.History[1].FirstLsn != 5 {
		t.Fatalf("status after the cut and the new epoch's batch: %v", st)
	}
	orphans, err := datadir.ListOrphans(vfs.OS, dir)
	if err != nil || len(orphans) != 1 || orphans[0].FirstLSN != 5 || orphans[0].LastLSN != 6 || orphans[0].Epoch != 3 {
		t.Fatalf("orphans: %v, %v", orphans, err)
	}
	entries, err := datadir.ReadOrphan(vfs.OS, dir, orphans[0].Name)
	if err != nil || len(entries) != 1 || entries[0].FirstLSN != 5 {
		t.Fatalf("orphan entries: %v, %v", entries, err)
	}
	if n := counterValue(t, r.s.metrics.orphaned); n != 2 {
		t.Fatalf("orphaned records = %v, want 2", n)
	}
	// A cut of entries of the stream's own epoch is refused: a primary
	// never cuts what it wrote (TestCut has a cut inside a batch).
	b := r.append(t)
	b.heartbeat(4)
	b.ack()
	if err := b.stream.Send(&walshipv1.AppendRequest{Truncate: true, TruncateAfterLsn: 5, Heartbeat: &walshipv1.Heartbeat{Epoch: 4}}); err != nil {
		t.Fatal(err)
	}
	wantCode(t, b.failure(), codes.InvalidArgument, "truncate_after_lsn: 5 would cut stored entries of epoch 4, not older than the stream's epoch 4")
	// The promise and the history survive a restart.
	if err := r.stop(); err != nil {
		t.Fatal(err)
	}
	r = start(t, testConfig(t, dir))
	if st := r.status(t); st.VoteEpoch != 4 || st.LastEpoch != 4 || st.DurableLsn != 6 || st.PrimaryId != "r1" {
		t.Fatalf("status after a restart: %v", st)
	}
}

// TestCut: a cut must come from a stream that declared an epoch newer than
// every entry it removes. A stream whose first message declares no epoch —
// a bare truncate, a batch alone, a heartbeat of epoch 0 — is refused
// before anything is stored or cut (any node certificate could otherwise
// cut the whole log into orphans/), and so is a cut from the epoch that
// wrote the entries. A cut inside a batch is refused; one at a batch's end
// from a newer epoch keeps the rest in an orphan file.
func TestCut(t *testing.T) {
	dir := t.TempDir()
	r := start(t, testConfig(t, dir))
	r.appendAll(t, chain(t, 1, 1, 3, 10)...) // LSNs 1..6 of epoch 1
	unchanged := func(what string) {
		t.Helper()
		if st := r.status(t); st.DurableLsn != 6 || st.FirstLsn != 1 || st.VoteEpoch != 1 {
			t.Fatalf("%s: status %v, want LSNs 1..6 and epoch 1 promised", what, st)
		}
		if orphans, err := datadir.ListOrphans(vfs.OS, dir); err != nil || len(orphans) != 0 {
			t.Fatalf("%s: orphans %v, %v", what, orphans, err)
		}
	}
	for _, tc := range []struct {
		name string
		req  *walshipv1.AppendRequest
	}{
		{"bare truncate", &walshipv1.AppendRequest{Truncate: true}},
		{"truncate with a heartbeat of epoch 0", &walshipv1.AppendRequest{Truncate: true, Heartbeat: &walshipv1.Heartbeat{ReplyRequested: true}}},
		{"batch alone", &walshipv1.AppendRequest{Batch: batch(t, 1, 7, 1, 10)}},
		{"heartbeat of epoch 0", &walshipv1.AppendRequest{Heartbeat: &walshipv1.Heartbeat{ReplyRequested: true}}},
	} {
		a := r.append(t)
		if err := a.stream.Send(tc.req); err != nil {
			t.Fatal(err)
		}
		if err := a.stream.CloseSend(); err != nil {
			t.Fatal(err)
		}
		wantCode(t, a.failure(), codes.InvalidArgument, "heartbeat.epoch", "first message")
		unchanged(tc.name)
	}
	a := r.append(t)
	a.heartbeat(1)
	a.ack()
	if err := a.stream.Send(&walshipv1.AppendRequest{Truncate: true}); err != nil {
		t.Fatal(err)
	}
	wantCode(t, a.failure(), codes.InvalidArgument, "truncate_after_lsn: 0 would cut stored entries of epoch 1, not older than the stream's epoch 1")
	unchanged("a cut from the epoch that wrote the entries")

	a = r.append(t)
	a.heartbeat(2)
	a.ack()
	if err := a.stream.Send(&walshipv1.AppendRequest{Truncate: true, TruncateAfterLsn: 3}); err != nil {
		t.Fatal(err)
	}
	wantCode(t, a.failure(), codes.InvalidArgument, "falls inside the entry 3..4")

	a = r.append(t)
	a.heartbeat(2)
	a.ack()
	if err := a.stream.Send(&walshipv1.AppendRequest{Truncate: true, TruncateAfterLsn: 2, Heartbeat: &walshipv1.Heartbeat{Epoch: 2, ReplyRequested: true}}); err != nil {
		t.Fatal(err)
	}
	if ack := a.logAck(); ack.DurableLsn != 2 {
		t.Fatalf("ack after the cut = %v, want durable 2", ack)
	}
	if orphans, err := datadir.ListOrphans(vfs.OS, dir); err != nil || len(orphans) != 1 || orphans[0].FirstLSN != 3 || orphans[0].LastLSN != 6 {
		t.Fatalf("orphans after the cut: %v, %v", orphans, err)
	}
}

// TestMissedPromotionNamesTheWinner (issue 35, item 7): a log store that
// missed the promotion of c1 to epoch 4 grants epoch 4 to the old primary
// p1, restarting with its original command line (it proposes the epoch
// after the newest it knows). p1 loses that election — the log stores that
// promised c1 refuse it, and a majority is needed — and rejoins as a
// replica: safe. But the log store kept naming p1 as the primary of epoch
// 4 while c1 streamed to it, so Status (and `walship ctl status`) showed
// two primaries for one epoch. The heartbeat of the epoch's primary names
// it: only the winner of an epoch streams in it.
func TestMissedPromotionNamesTheWinner(t *testing.T) {
	dir := t.TempDir()
	r := start(t, testConfig(t, dir))
	old := r.append(t)
	old.heartbeat(3)
	old.send(chain(t, 3, 1, 2, 10)...)
	old.waitDurable(4)
	resp, err := walshipv1.NewEpochServiceClient(r.conn).Fence(t.Context(), &walshipv1.FenceRequest{Epoch: 4, CandidateId: "p1", CandidateAddr: "p1:7401"})
	if err != nil || !resp.Granted {
		t.Fatalf("the restarted old primary's fence: %v, %v; want granted (this log store missed the promotion)", resp, err)
	}
	winner := r.append(t)
	winner.declared = true
	winner.sendOrEnded(&walshipv1.AppendRequest{Heartbeat: &walshipv1.Heartbeat{Epoch: 4, PrimaryId: "c1", PrimaryAddr: "c1:7401",
		TimeUnixNano: time.Now().UnixNano(), ReplyRequested: true}}, "heartbeat")
	if ack := winner.ack(); ack.Epoch != 4 {
		t.Fatalf("the winner's heartbeat: ack of epoch %d, want 4", ack.Epoch)
	}
	st, err := walshipv1.NewLogStoreServiceClient(r.conn).Status(t.Context(), &walshipv1.LogStoreServiceStatusRequest{})
	if err != nil || st.GetVoteEpoch() != 4 || st.GetPrimaryId() != "c1" || st.GetPrimaryAddr() != "c1:7401" {
		t.Fatalf("status after the winner's heartbeat: epoch %d held by %q at %q, %v; want c1 at c1:7401", st.GetVoteEpoch(), st.GetPrimaryId(), st.GetPrimaryAddr(), err)
	}
	if v, err := datadir.LoadVote(vfs.OS, dir); err != nil || v != (datadir.Vote{Epoch: 4, Primary: "c1", Addr: "c1:7401"}) {
		t.Fatalf("vote: %v, %v; want epoch 4 held by c1", v, err)
	}
}

// TestFenceKeepsTheLogsPrimary: a fence answer, and Status, name the
// primary of the epoch the stored log ends in (log_primary_id), also
// once a candidate that fenced and never opened holds the promise: the
// promise of that epoch, which named the primary whose heartbeat the log
// store took, is kept (DataDir/logprimary) before the newer one replaces
// it, survives a restart, and a further fence does not replace it. Once
// the log ends in a newer epoch, that epoch's primary is named.
func TestFenceKeepsTheLogsPrimary(t *testing.T) {
	dir := t.TempDir()
	r := start(t, testConfig(t, dir))
	fence := walshipv1.NewEpochServiceClient(r.conn)
	old := r.append(t)
	old.declared = true
	old.sendOrEnded(&walshipv1.AppendRequest{Heartbeat: &walshipv1.Heartbeat{Epoch: 3, PrimaryId: "p0", PrimaryAddr: "10.0.0.1:7401", TimeUnixNano: time.Now().UnixNano(), ReplyRequested: true}}, "heartbeat")
	old.send(chain(t, 3, 1, 3, 10)...)
	old.waitDurable(6)
	if st := r.status(t); st.LogPrimaryId != "p0" || st.LogPrimaryAddr != "10.0.0.1:7401" {
		t.Fatalf("status of a log of epoch 3 whose primary streams: %v", st)
	}
	for _, f := range []struct {
		epoch uint64
		cand  string
	}{{4, "ghost"}, {5, "ghost2"}} {
		resp, err := fence.Fence(t.Context(), &walshipv1.FenceRequest{Epoch: f.epoch, CandidateId: f.cand, CandidateAddr: f.cand + ":1"})
		if err != nil || !resp.Granted || resp.PrimaryId != f.cand || resp.LastEpoch != 3 || resp.LogPrimaryId != "p0" || resp.LogPrimaryAddr != "10.0.0.1:7401" {
			t.Fatalf("fence of epoch %d by %s = %v, %v; want granted, the log's primary p0", f.epoch, f.cand, resp, err)
		}
	}
	if lp, err := datadir.LoadLogPrimary(vfs.OS, dir); err != nil || lp != (datadir.Vote{Epoch: 3, Primary: "p0", Addr: "10.0.0.1:7401"}) {
		t.Fatalf("log primary file: %v, %v", lp, err)
	}
	if err := r.stop(); err != nil {
		t.Fatal(err)
	}
	r = start(t, testConfig(t, dir))
	if st := r.status(t); st.VoteEpoch != 5 || st.PrimaryId != "ghost2" || st.LogPrimaryId != "p0" {
		t.Fatalf("status after a restart: %v", st)
	}
	// The primary of epoch 5 streams: its batch ends the log in epoch 5.
	a := r.append(t)
	a.declared = true
	a.sendOrEnded(&walshipv1.AppendRequest{Heartbeat: &walshipv1.Heartbeat{Epoch: 5, PrimaryId: "n5", PrimaryAddr: "n5:1", TimeUnixNano: time.Now().UnixNano(), ReplyRequested: true}}, "heartbeat")
	a.send(batch(t, 5, 7, 1, 10))
	a.waitDurable(7)
	if st := r.status(t); st.LastEpoch != 5 || st.LogPrimaryId != "n5" {
		t.Fatalf("status once the log ends in epoch 5: %v", st)
	}
}
