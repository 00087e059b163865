package primary

import (
	"errors"
	"path/filepath"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	walshipv1 "github.com/walship/walship/gen/walship/v1"
	"github.com/walship/walship/internal/datadir"
	"github.com/walship/walship/internal/vfs"
	"google.golang.org/protobuf/types/known/durationpb"
)

// TestEarlyShippingAndDivergence follows a replica stream across a crash of
// the primary. Batches go out before the primary's fsync, marked not
// durable, and the durable LSN follows. A crash during an fsync loses the
// tail the replica already holds; the restarted primary (a new epoch, in its history) answers that
// replica's hello with Diverged at the last LSN it kept, and serves it
// normally from there.
func TestEarlyShippingAndDivergence(t *testing.T) {
	mem := vfs.NewMem()
	cfg := testConfig(t, "/data")
	cfg.FS = mem
	cfg.AsyncFlushInterval = time.Minute // async commits stay unsynced
	r := start(t, cfg)
	c := ctx(t)
	first, err := r.kv.Put(c, &walshipv1.PutRequest{Key: "a", Value: []byte("synced")})
	if err != nil {
		t.Fatal(err)
	}

	repl := walshipv1.NewReplicationServiceClient(r.conn)
	s, err := repl.Stream(c)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Send(helloMsg("r1", 0, 1)); err != nil {
		t.Fatal(err)
	}
	recvBatch := func() *walshipv1.StreamResponse {
		t.Helper()
		for {
			m, err := s.Recv()
			if err != nil {
				t.Fatal(err)
			}
			if m.GetBatch() != nil {
				return m
			}
		}
	}
	if m := recvBatch(); m.GetBatch().LastLsn != first.Lsn || m.DurableLsn < first.Lsn {
		t.Fatalf("first batch %v with durable %d; want up to %d, sent once durable", m.GetBatch(), m.DurableLsn, first.Lsn)
	}
	// Batches go out once written, before the fsync: an async commit's
	// batch says it is not durable yet, and so does the sync commit's that
	// follows; then a heartbeat carries the durable LSN that covers both.
	async, err := r.kv.Put(c, &walshipv1.PutRequest{Key: "b", Value: []byte("async"),
		Policy: &walshipv1.CommitPolicy{Durability: walshipv1.Durability_DURABILITY_ASYNC}})
	if err != nil {
		t.Fatal(err)
	}
	if m := recvBatch(); m.GetBatch().LastLsn != async.Lsn || m.DurableLsn != first.Lsn {
		t.Fatalf("batch %v with durable %d; want up to %d, sent before its fsync (durable %d)", m.GetBatch(), m.DurableLsn, async.Lsn, first.Lsn)
	}
	durable, err := r.kv.Put(c, &walshipv1.PutRequest{Key: "c", Value: []byte("synced")})
	if err != nil {
		t.Fatal(err)
	}
	for {
		m, err := s.Recv()
		if err != nil {
			t.Fatal(err)
		}
		if b := m.GetBatch(); b != nil && b.LastLsn != durable.Lsn {
			t.Fatalf("batch %v, want the one up to %d", b, durable.Lsn)
		}
		if m.DurableLsn >= durable.Lsn {
			break
		}
	}

	// Hold the next fsync of the WAL.
	gate := make(chan error)
	mem.InjectSyncError(func(name string) error {
		if filepath.Ext(name) == ".wal" {
			return <-gate
		}
		return nil
	})
	wait := &walshipv1.CommitPolicy{Replication: walshipv1.ReplicationMode_REPLICATION_MODE_SYNC, SyncReplicas: 1,
		SyncLevel: walshipv1.SyncLevel_SYNC_LEVEL_FLUSH, SyncTimeout: durationpb.New(10 * time.Second)}
	res := make(chan error, 1)
	go func() {
		_, err := r.kv.Put(c, &walshipv1.PutRequest{Key: "d", Value: []byte("lost"), Policy: wait})
		res <- err
	}()
	m := recvBatch() // while the primary's fsync is held
	lost := m.GetBatch()
	if m.DurableLsn != durable.Lsn || lost.FirstLsn != durable.Lsn+1 {
		t.Fatalf("early batch %d..%d says durable %d; want %d..., durable %d", lost.FirstLsn, lost.LastLsn, m.DurableLsn, durable.Lsn+1, durable.Lsn)
	}
	if err := s.Send(&walshipv1.StreamRequest{Msg: &walshipv1.StreamRequest_Ack{Ack: &walshipv1.ReplicaAck{
		WrittenLsn: lost.LastLsn, FlushedLsn: lost.LastLsn}}}); err != nil {
		t.Fatal(err)
	}
	st, err := r.admin.Status(c, &walshipv1.StatusRequest{})
	if err != nil || st.DurableLsn != durable.Lsn || st.LastLsn != lost.LastLsn {
		t.Fatalf("Status = %v, %v; want durable %d, last %d", st, err, durable.Lsn, lost.LastLsn)
	}
	// The machine dies during the fsync: the commit was never acknowledged.
	mem.Crash()
	mem.InjectError(func(vfs.Op, string) error { return errors.New("machine is down") })
	gate <- errors.New("machine is down")
	if err := <-res; err == nil {
		t.Fatal("a commit whose fsync failed was acknowledged")
	}
	s.CloseSend()
	r.stop(t)
	mem.InjectError(nil)
	mem.InjectSyncError(nil)

	r = start(t, cfg)
	c = ctx(t)
	st2, err := r.admin.Status(c, &walshipv1.StatusRequest{})
	if err != nil || st2.LastLsn != durable.Lsn || st2.Epoch != st.Epoch+1 {
		t.Fatalf("Status after the crash = %v, %v; want last LSN %d (the unsynced tail lost), epoch %d", st2, err, durable.Lsn, st.Epoch+1)
	}
	repl = walshipv1.NewReplicationServiceClient(r.conn)
	// The replica holding the lost tail (written in the old epoch) is told to cut it.
	s, err = repl.Stream(c)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Send(helloMsg("r1", st.Epoch, lost.LastLsn+1)); err != nil {
		t.Fatal(err)
	}
	var div *walshipv1.Diverged
	for div == nil {
		m, err := s.Recv()
		if err != nil {
			t.Fatalf("stream ended without Diverged: %v", err)
		}
		div = m.GetDiverged()
	}
	if div.TruncateAfterLsn != durable.Lsn || div.Epoch != st2.Epoch {
		t.Fatalf("Diverged = %v; want truncate after %d, epoch %d", div, durable.Lsn, st2.Epoch)
	}
	var mv dto.Metric
	if err := r.s.metrics.replicaDiverged.Write(&mv); err != nil || mv.GetCounter().GetValue() != 1 {
		t.Fatalf("walship_replication_diverged_total = %v, %v; want 1", mv.GetCounter().GetValue(), err)
	}

	// From the cut, the replica is served the new epoch's batches.
	s, err = repl.Stream(c)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Send(helloMsg("r1", st.Epoch, durable.Lsn+1)); err != nil {
		t.Fatal(err)
	}
	next, err := r.kv.Put(c, &walshipv1.PutRequest{Key: "f", Value: []byte("new epoch")})
	if err != nil {
		t.Fatal(err)
	}
	for {
		m, err := s.Recv()
		if err != nil {
			t.Fatal(err)
		}
		if m.GetDiverged() != nil {
			t.Fatal("Diverged for a replica that holds nothing past the cut")
		}
		if b := m.GetBatch(); b != nil {
			if b.FirstLsn != durable.Lsn+1 || b.LastLsn != next.Lsn || b.Epoch != st2.Epoch {
				t.Fatalf("batch %d..%d epoch %d; want %d..%d epoch %d", b.FirstLsn, b.LastLsn, b.Epoch, durable.Lsn+1, next.Lsn, st2.Epoch)
			}
			break
		}
	}
	s.CloseSend()

	// The history survives another restart and keeps its order.
	r.stop(t)
	start(t, cfg)
	h, err := datadir.LoadHistory(mem, cfg.DataDir)
	if err != nil || len(h) != 3 || h[0].FirstLSN != 1 || h[1].FirstLSN != durable.Lsn+1 || h[2].FirstLSN != next.Lsn+1 {
		t.Fatalf("epoch history = %v, %v", h, err)
	}
}

func helloMsg(id string, epoch, next uint64) *walshipv1.StreamRequest {
	return &walshipv1.StreamRequest{Msg: &walshipv1.StreamRequest_Hello{Hello: &walshipv1.ReplicaHello{ReplicaId: id, Epoch: epoch, NextLsn: next}}}
}
