package primary

import (
	"bytes"
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	walshipv1 "github.com/walship/walship/gen/walship/v1"
	"github.com/walship/walship/internal/testkit"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
)

// TestCommitWatermarkBoundsWatches: under a contract of one replica at
// WRITE, a commit made with a weaker policy (async replication) is
// visible on the primary at once but not acknowledged under the contract:
// watches do not deliver it, and the replication stream's commit_lsn stays
// below it, until the replica acks it; then a heartbeat carries the new
// watermark and the watch delivers the transaction, whole, with its commit
// time and previous values.
func TestCommitWatermarkBoundsWatches(t *testing.T) {
	cfg := testConfig(t, t.TempDir())
	cfg.Policy.Replication = walshipv1.ReplicationMode_REPLICATION_MODE_SYNC
	cfg.Policy.SyncReplicas = 1
	cfg.Policy.SyncLevel = walshipv1.SyncLevel_SYNC_LEVEL_WRITE
	cfg.HeartbeatInterval = 50 * time.Millisecond
	r := start(t, cfg)
	c := ctx(t)
	async := &walshipv1.CommitPolicy{Replication: walshipv1.ReplicationMode_REPLICATION_MODE_ASYNC}
	first, err := r.kv.Put(c, &walshipv1.PutRequest{Key: "w/a", Value: []byte("1"), Policy: async})
	if err != nil {
		t.Fatal(err)
	}

	repl, err := walshipv1.NewReplicationServiceClient(r.conn).Stream(c)
	if err != nil {
		t.Fatal(err)
	}
	if err := repl.Send(&walshipv1.StreamRequest{Msg: &walshipv1.StreamRequest_Hello{Hello: &walshipv1.ReplicaHello{
		ReplicaId: "r1", Epoch: r.s.epoch, NextLsn: 1}}}); err != nil {
		t.Fatal(err)
	}
	commits := make(chan uint64, 1024)
	go func() {
		for {
			m, err := repl.Recv()
			if err != nil {
				close(commits)
				return
			}
			commits <- m.GetCommitLsn()
		}
	}()

	w, err := r.kv.Watch(c, &walshipv1.WatchRequest{Prefix: "w/", StartLsn: 1, PrevValues: true, ProgressInterval: durationpb.New(10 * time.Millisecond)})
	if err != nil {
		t.Fatal(err)
	}
	second, err := r.kv.Put(c, &walshipv1.PutRequest{Key: "w/a", Value: []byte("2"), Policy: async})
	if err != nil {
		t.Fatal(err)
	}
	// Visible on the primary, but the watch reports progress below it.
	if got, err := r.kv.Get(c, &walshipv1.GetRequest{Key: "w/a"}); err != nil || string(got.Value) != "2" {
		t.Fatalf("Get = %v, %v", got, err)
	}
	for range 3 {
		m, err := w.Recv()
		if err != nil {
			t.Fatal(err)
		}
		if m.GetTxns() != nil || m.GetProgress().GetLsn() >= first.Lsn {
			t.Fatalf("watch before the replica acked: %v", m)
		}
	}
	// The replica acks the first commit only.
	if err := repl.Send(&walshipv1.StreamRequest{Msg: &walshipv1.StreamRequest_Ack{Ack: &walshipv1.ReplicaAck{WrittenLsn: first.Lsn}}}); err != nil {
		t.Fatal(err)
	}
	var got *walshipv1.WatchTxn
	for got == nil {
		m, err := w.Recv()
		if err != nil {
			t.Fatal(err)
		}
		if x := m.GetTxns().GetTxns(); len(x) > 0 {
			got = x[0]
		}
		if p := m.GetProgress(); p != nil && p.GetLsn() >= second.Lsn {
			t.Fatalf("progress at %d past the watermark", p.GetLsn())
		}
	}
	if got.Lsn != first.Lsn || len(got.Events) != 1 || string(got.Events[0].Value) != "1" || got.Events[0].PrevFound || got.CommitTimeUnixNano == 0 {
		t.Fatalf("first txn = %v", got)
	}
	testkit.Until(t, fmt.Sprintf("the stream to carry commit_lsn %d", first.Lsn), func() bool {
		for {
			select {
			case l := <-commits:
				if l >= second.Lsn {
					t.Fatalf("commit_lsn %d past what the contract acknowledged", l)
				}
				if l == first.Lsn {
					return true
				}
			default:
				return false
			}
		}
	})
	if err := repl.Send(&walshipv1.StreamRequest{Msg: &walshipv1.StreamRequest_Ack{Ack: &walshipv1.ReplicaAck{WrittenLsn: second.Lsn}}}); err != nil {
		t.Fatal(err)
	}
	for got = nil; got == nil; {
		m, err := w.Recv()
		if err != nil {
			t.Fatal(err)
		}
		if x := m.GetTxns().GetTxns(); len(x) > 0 {
			got = x[0]
		}
	}
	if got.Lsn != second.Lsn || !got.Events[0].PrevFound || string(got.Events[0].PrevValue) != "1" || got.Events[0].PrevVersionLsn != first.Lsn {
		t.Fatalf("second txn = %v", got)
	}
	if r.s.CommitLSN() != second.Lsn {
		t.Fatalf("CommitLSN = %d, want %d", r.s.CommitLSN(), second.Lsn)
	}
}

// TestWatchMetrics: the walship_watch_* metrics move with real watchers
// over real gRPC: watchers open, transactions sent, the ring's oldest LSN
// as it drops transactions, and cut-offs by reason (a prev_values watch
// from below the ring, a watcher that does not read).
func TestWatchMetrics(t *testing.T) {
	cfg := testConfig(t, t.TempDir())
	reg := prometheus.NewRegistry()
	cfg.Registry = reg
	cfg.WatchMaxBytes = 64 << 10
	cfg.WatchStall = 200 * time.Millisecond
	r := start(t, cfg)
	c := ctx(t)
	metric := func(name string, kv ...string) float64 { return gaugeValue(t, reg, name, kv...) }
	oldest := metric("walship_watch_ring_oldest_lsn")
	if n := metric("walship_watch_watchers"); n != 0 {
		t.Fatalf("walship_watch_watchers = %v before any watch", n)
	}

	wctx, stop := context.WithCancel(c)
	w, err := r.kv.Watch(wctx, &walshipv1.WatchRequest{Prefix: "m/"})
	if err != nil {
		t.Fatal(err)
	}
	testkit.Until(t, "walship_watch_watchers to be 1", func() bool { return metric("walship_watch_watchers") == 1 })
	for i := range 2 {
		if _, err := r.kv.Put(c, &walshipv1.PutRequest{Key: fmt.Sprintf("m/%d", i), Value: []byte("v")}); err != nil {
			t.Fatal(err)
		}
	}
	for got := 0; got < 2; {
		m, err := w.Recv()
		if err != nil {
			t.Fatal(err)
		}
		got += len(m.GetTxns().GetTxns())
	}
	if n := metric("walship_watch_sent_transactions_total"); n != 2 {
		t.Fatalf("walship_watch_sent_transactions_total = %v, want 2", n)
	}
	stop()
	testkit.Until(t, "walship_watch_watchers to be 0", func() bool { return metric("walship_watch_watchers") == 0 })

	// 2 MiB through a 64 KiB ring: it drops what is older.
	big := bytes.Repeat([]byte("v"), 128<<10)
	var last uint64
	for i := range 16 {
		p, err := r.kv.Put(c, &walshipv1.PutRequest{Key: fmt.Sprintf("big/%d", i), Value: big})
		if err != nil {
			t.Fatal(err)
		}
		last = p.Lsn
	}
	if got := metric("walship_watch_ring_oldest_lsn"); got <= oldest || got > float64(last) {
		t.Fatalf("walship_watch_ring_oldest_lsn = %v after 2 MiB through a 64 KiB ring; want in (%v, %d]", got, oldest, last)
	}

	// Previous values from below the ring: OUT_OF_RANGE.
	pw, err := r.kv.Watch(c, &walshipv1.WatchRequest{StartLsn: 1, PrevValues: true})
	if err == nil {
		_, err = pw.Recv()
	}
	if status.Code(err) != codes.OutOfRange {
		t.Fatalf("prev_values watch from LSN 1 = %v; want OUT_OF_RANGE", err)
	}
	if n := metric("walship_watch_cutoffs_total", "reason", "out_of_range"); n != 1 {
		t.Fatalf("walship_watch_cutoffs_total{reason=out_of_range} = %v, want 1", n)
	}

	// A watcher that does not read, over small flow-control windows, is
	// cut off once a Send stays blocked for WatchStall.
	conn, err := grpc.NewClient(r.s.Addr(), grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithInitialWindowSize(64<<10), grpc.WithInitialConnWindowSize(64<<10))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	nr, err := walshipv1.NewKVServiceClient(conn).Watch(c, &walshipv1.WatchRequest{Prefix: "big/", StartLsn: 1})
	if err != nil {
		t.Fatal(err)
	}
	testkit.Until(t, "the non-reader to be cut off", func() bool {
		return metric("walship_watch_cutoffs_total", "reason", "stalled") == 1
	})
	for err == nil {
		_, err = nr.Recv()
	}
	if status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("non-reader: %v; want RESOURCE_EXHAUSTED", err)
	}
	testkit.Until(t, "walship_watch_watchers to be 0", func() bool { return metric("walship_watch_watchers") == 0 })
	for _, reason := range []string{"unavailable", "data_loss"} {
		if n := metric("walship_watch_cutoffs_total", "reason", reason); n != 0 {
			t.Fatalf("walship_watch_cutoffs_total{reason=%s} = %v, want 0", reason, n)
		}
	}
}

// TestWatchDeliversEachSyncCommit: under sync durability and a contract
// of the primary alone, a commit is acknowledged (durable) before it is
// visible here, so the watch bound, min(watermark, visible), must follow
// visibility too: each commit is delivered while nothing else moves
// after it.
func TestWatchDeliversEachSyncCommit(t *testing.T) {
	cfg := testConfig(t, t.TempDir())
	cfg.Policy.Durability = walshipv1.Durability_DURABILITY_SYNC
	cfg.Policy.Replication = walshipv1.ReplicationMode_REPLICATION_MODE_DISABLED
	r := start(t, cfg)
	c := ctx(t)
	w, err := r.kv.Watch(c, &walshipv1.WatchRequest{Prefix: "s/", StartLsn: 1, ProgressInterval: durationpb.New(time.Minute)})
	if err != nil {
		t.Fatal(err)
	}
	for i := range 30 {
		put, err := r.kv.Put(c, &walshipv1.PutRequest{Key: "s/a", Value: []byte(fmt.Sprint(i))})
		if err != nil {
			t.Fatal(err)
		}
		m, err := w.Recv()
		if err != nil {
			t.Fatalf("commit %d at LSN %d not delivered: %v", i, put.Lsn, err)
		}
		if x := m.GetTxns().GetTxns(); len(x) != 1 || x[0].Lsn != put.Lsn {
			t.Fatalf("commit %d at LSN %d: got %v", i, put.Lsn, m)
		}
	}
}
