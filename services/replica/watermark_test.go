package replica

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	walshipv1 "github.com/walship/walship/gen/walship/v1"
	"github.com/walship/walship/internal/testkit"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
)

// TestAppliedAboveTheContractIsNeverShown: the primary made a write
// durable that its contract has not acknowledged (commit_lsn is below it);
// the replica applies it, but neither a plain read nor a watch shows it.
// A failover then drops it (the new primary's Diverged cuts it, and the
// replica, having applied it, re-seeds backwards): no reader ever saw it.
// min_lsn reads keep their meaning: they wait for the watermark.
func TestAppliedAboveTheContractIsNeverShown(t *testing.T) {
	fp := newFakePrimary(t)
	r := start(t, testConfig(t, t.TempDir(), fp.addr))
	main := newModel(t)
	b1 := main.txn(put("k", "acked"))
	lost := forkModel(t, main, b1)
	b2 := lost.txn(put("k", "lost"), put("x", "lost"))
	main.epoch = 2
	b3 := main.txn(put("k", "new"))

	sess := fp.next(t)
	c := tctx(t)
	for _, b := range []*walshipv1.WalBatch{b1, b2} {
		sess.sendOrEnded(t, &walshipv1.StreamResponse{DurableLsn: b2.LastLsn, CommitLsn: b1.LastLsn,
			Msg: &walshipv1.StreamResponse_Batch{Batch: b}}, "batch")
	}
	sess.sendOrEnded(t, &walshipv1.StreamResponse{DurableLsn: b2.LastLsn, CommitLsn: b1.LastLsn, Msg: &walshipv1.StreamResponse_Heartbeat{
		Heartbeat: &walshipv1.Heartbeat{Epoch: 1, LastLsn: b2.LastLsn, ReplyRequested: true}}}, "heartbeat")
	r.waitApplied(t, b2.LastLsn) // applied (and acked as applied) above the contract

	// A watch from the start sees b1 only, then progress at b1.
	w, err := r.kv.Watch(c, &walshipv1.WatchRequest{StartLsn: 1, ProgressInterval: durationpb.New(10 * time.Millisecond)})
	if err != nil {
		t.Fatal(err)
	}
	var seen []string
	for {
		m, err := w.Recv()
		if err != nil {
			t.Fatal(err)
		}
		if m.GetTxns() != nil {
			for _, x := range m.GetTxns().GetTxns() {
				for _, e := range x.Events {
					seen = append(seen, e.Key+"="+string(e.Value))
				}
			}
			continue
		}
		if m.GetProgress().GetLsn() != b1.LastLsn {
			t.Fatalf("progress at %d, want the watermark %d", m.GetProgress().GetLsn(), b1.LastLsn)
		}
		break
	}
	if strings.Join(seen, " ") != "k=acked" {
		t.Fatalf("watch saw %v, want only k=acked", seen)
	}
	if got, err := r.kv.Get(c, &walshipv1.GetRequest{Key: "k"}); err != nil || string(got.Value) != "acked" || got.AppliedLsn != b1.LastLsn {
		t.Fatalf("plain Get above the watermark = %v, %v; want acked at %d", got, err, b1.LastLsn)
	}
	if got, err := r.kv.Scan(c, &walshipv1.ScanRequest{}); err != nil || len(got.Kvs) != 1 {
		t.Fatalf("plain Scan = %v, %v; want k only", got, err)
	}
	_, err = r.kv.Get(c, &walshipv1.GetRequest{Key: "k", MinLsn: b2.LastLsn, WaitTimeout: durationpb.New(50 * time.Millisecond)})
	if status.Code(err) != codes.DeadlineExceeded {
		t.Fatalf("Get with min_lsn above the watermark = %v; want DEADLINE_EXCEEDED", err)
	}

	// The failover: the new primary (epoch 2) never had b2.
	fp.snapshot = snapshotOf(main.ref.Snapshot(), 2)
	sess.diverged(t, b1.LastLsn, 2, 0)
	sess2 := fp.next(t)
	sess2.heartbeat(t, 2, b3.LastLsn, true)
	got, err := r.kv.Get(c, &walshipv1.GetRequest{Key: "k", MinLsn: b3.LastLsn})
	if err != nil || string(got.Value) != "new" {
		t.Fatalf("Get after the failover = %v, %v; want new", got, err)
	}
	if got, err := r.kv.Get(c, &walshipv1.GetRequest{Key: "x"}); err != nil || got.Found {
		t.Fatalf("Get x after the failover = %v, %v; want not found", got, err)
	}
	// The watch goes on, or is told its position is gone; it never sees b2.
	for {
		m, err := w.Recv()
		if err != nil {
			if status.Code(err) != codes.OutOfRange {
				t.Fatalf("watch after the re-seed: %v; want OUT_OF_RANGE", err)
			}
			break
		}
		if x := m.GetTxns(); x != nil {
			t.Fatalf("watch after the re-seed sent %v", x)
		}
		if m.GetProgress().GetLsn() >= b3.LastLsn {
			t.Fatalf("watch skipped to %d over a re-seed", m.GetProgress().GetLsn())
		}
	}
}

// TestMaxLag: a read bounded by max_lag fails with FAILED_PRECONDITION
// naming the lag when the replica serves a state further behind.
func TestMaxLag(t *testing.T) {
	fp := newFakePrimary(t)
	r := start(t, testConfig(t, t.TempDir(), fp.addr))
	m := newModel(t)
	sess := fp.next(t)
	b1 := m.txn(put("k", "1"))
	sess.send(t, b1)
	r.waitApplied(t, b1.LastLsn)
	c := tctx(t)
	// The primary says it is 100 LSNs further.
	sess.heartbeatDurable(t, 1, b1.LastLsn+100, b1.LastLsn, false)
	testkit.Until(t, "the replica to hear of the primary's last LSN", func() bool { return r.s.lag.primaryLSN() == b1.LastLsn+100 })
	_, err := r.kv.Get(c, &walshipv1.GetRequest{Key: "k", MaxLagLsns: 10})
	if status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), "100 LSNs behind") {
		t.Fatalf("Get max_lag_lsns 10 = %v; want FAILED_PRECONDITION naming 100 LSNs", err)
	}
	_, err = r.kv.Scan(c, &walshipv1.ScanRequest{MaxLagLsns: 10})
	if status.Code(err) != codes.FailedPrecondition {
		t.Fatalf("Scan max_lag_lsns 10 = %v; want FAILED_PRECONDITION", err)
	}
	if _, err := r.kv.Get(c, &walshipv1.GetRequest{Key: "k", MaxLagLsns: 100}); err != nil {
		t.Fatalf("Get max_lag_lsns 100 = %v", err)
	}
	_, err = r.kv.Get(c, &walshipv1.GetRequest{Key: "k", MaxLagTime: durationpb.New(-time.Second)})
	if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "max_lag_time") {
		t.Fatalf("Get max_lag_time -1s = %v; want INVALID_ARGUMENT naming max_lag_time", err)
	}
	if _, err := r.kv.Get(c, &walshipv1.GetRequest{Key: "k", MaxLagTime: durationpb.New(time.Hour)}); err != nil {
		t.Fatalf("Get max_lag_time 1h = %v", err)
	}
}

// TestReadyMaxLag: --ready-max-lag cuts readiness by how far the state
// reads are served at trails the primary's last report, and a replica is
// not ready before the primary has reported since it started.
func TestReadyMaxLag(t *testing.T) {
	fp := newFakePrimary(t)
	cfg := testConfig(t, t.TempDir(), fp.addr)
	cfg.ReadyMaxLag = 10
	r := start(t, cfg)
	m := newModel(t)
	sess := fp.next(t)
	b1 := m.txn(put("k", "1"))
	sess.send(t, b1)
	r.waitApplied(t, b1.LastLsn)
	// Applied, but how far behind is unknown until the primary says where
	// it is.
	if err := r.s.ready(); err == nil || !strings.Contains(err.Error(), "has not heard the primary") {
		t.Fatalf("ready before a heartbeat = %v; want not ready, naming the primary not heard", err)
	}
	sess.heartbeat(t, 1, b1.LastLsn, false)
	testkit.Until(t, "ready", func() bool { return r.s.ready() == nil })
	// Durable and applied up to b1, but the primary is 100 LSNs further.
	sess.heartbeatDurable(t, 1, b1.LastLsn+100, b1.LastLsn, false)
	testkit.Until(t, "not ready 100 LSNs behind", func() bool {
		err := r.s.ready()
		return err != nil && strings.Contains(err.Error(), "100 LSNs behind the primary (ready within 10)")
	})
	sess.heartbeatDurable(t, 1, b1.LastLsn+5, b1.LastLsn, false)
	testkit.Until(t, "ready 5 LSNs behind", func() bool { return r.s.ready() == nil })
}

// TestReadyMaxLagTime: --ready-max-lag-time takes a replica cut off
// from its primary out of readiness once its lag in time passes the
// bound, and a word from the primary brings it back.
func TestReadyMaxLagTime(t *testing.T) {
	fp := newFakePrimary(t)
	cfg := testConfig(t, t.TempDir(), fp.addr)
	cfg.HeartbeatInterval = 50 * time.Millisecond
	// Well inside the replica's own silence guard (5 s), so the stream
	// stays up while the primary is quiet.
	cfg.ReadyMaxLagTime = time.Second
	r := start(t, cfg)
	m := newModel(t)
	sess := fp.next(t)
	b1 := m.txn(put("k", "1"))
	sess.send(t, b1)
	r.waitApplied(t, b1.LastLsn)
	sess.heartbeat(t, 1, b1.LastLsn, false)
	testkit.Until(t, "ready", func() bool { return r.s.ready() == nil })
	// The primary falls silent: past three heartbeat intervals the silence
	// is the lag, and past a second the replica is not ready.
	testkit.Until(t, "not ready once silent past the bound", func() bool {
		err := r.s.ready()
		return err != nil && strings.Contains(err.Error(), "behind the primary (ready within 1s)")
	})
	sess.heartbeat(t, 1, b1.LastLsn, false)
	testkit.Until(t, "ready again after a heartbeat", func() bool { return r.s.ready() == nil })
	if err := (&Config{ReadyMaxLagTime: -time.Second}).Validate(); err == nil || !strings.Contains(err.Error(), "--ready-max-lag-time") {
		t.Fatalf("Validate with a negative --ready-max-lag-time = %v; want an error naming the flag", err)
	}
}

// TestWatchMetrics: a replica's walship_watch_* metrics move with real
// watchers over real gRPC: watchers open, transactions sent (from its WAL
// and its ring), the ring's oldest LSN, and a prev_values watch from
// below the ring cut off as out_of_range.
func TestWatchMetrics(t *testing.T) {
	fp := newFakePrimary(t)
	cfg := testConfig(t, t.TempDir(), fp.addr)
	cfg.WatchMaxBytes = 1 // the ring keeps the newest transaction only
	r := start(t, cfg)
	m := newModel(t)
	sess := fp.next(t)
	var bs []*walshipv1.WalBatch
	for i := range 3 {
		bs = append(bs, m.txn(put(fmt.Sprintf("w/%d", i), "v")))
	}
	sess.send(t, bs...)
	r.waitApplied(t, bs[2].LastLsn)
	testkit.Until(t, "the watermark to reach the last batch", func() bool { return r.s.feed.Bound.Load() >= bs[2].LastLsn })
	if got := r.metric(t, "walship_watch_ring_oldest_lsn"); got != float64(bs[1].LastLsn+1) {
		t.Fatalf("walship_watch_ring_oldest_lsn = %v, want %d (the ring keeps the last transaction)", got, bs[1].LastLsn+1)
	}

	c := tctx(t)
	wctx, stop := context.WithCancel(c)
	w, err := r.kv.Watch(wctx, &walshipv1.WatchRequest{Prefix: "w/", StartLsn: 1})
	if err != nil {
		t.Fatal(err)
	}
	for got := 0; got < 3; {
		msg, err := w.Recv()
		if err != nil {
			t.Fatal(err)
		}
		got += len(msg.GetTxns().GetTxns())
	}
	if n := r.metric(t, "walship_watch_watchers"); n != 1 {
		t.Fatalf("walship_watch_watchers = %v, want 1", n)
	}
	if n := r.metric(t, "walship_watch_sent_transactions_total"); n != 3 {
		t.Fatalf("walship_watch_sent_transactions_total = %v, want 3", n)
	}
	stop()
	testkit.Until(t, "walship_watch_watchers to be 0", func() bool { return r.metric(t, "walship_watch_watchers") == 0 })

	pw, err := r.kv.Watch(c, &walshipv1.WatchRequest{StartLsn: 1, PrevValues: true})
	if err == nil {
		_, err = pw.Recv()
	}
	if status.Code(err) != codes.OutOfRange {
		t.Fatalf("prev_values watch from LSN 1 = %v; want OUT_OF_RANGE", err)
	}
	if n := r.metric(t, "walship_watch_cutoffs_total", "reason", "out_of_range"); n != 1 {
		t.Fatalf("walship_watch_cutoffs_total{reason=out_of_range} = %v, want 1", n)
	}
	if n := r.metric(t, "walship_watch_cutoffs_total", "reason", "stalled"); n != 0 {
		t.Fatalf("walship_watch_cutoffs_total{reason=stalled} = %v, want 0", n)
	}
}
