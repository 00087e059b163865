package primary

import (
	"errors"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	walshipv1 "github.com/walship/walship/gen/walship/v1"
	"github.com/walship/walship/internal/vfs"
)

// TestEarlyShippingAndDivergence follows a replica stream across a crash of
// the primary. Batches go out before the primary's fsync, each message
// carrying the durable LSN; the crash loses the unsynced tail the replica
// already holds; the restarted primary (a new epoch, in its history) answers
// that replica's hello with Diverged at the last LSN it kept, and serves it
// normally from there.
func TestEarlyShippingAndDivergence(t *testing.T) {
	mem := vfs.NewMem()
	cfg := testConfig(t, "/data")
	cfg.FS = mem
	cfg.AsyncFlushInterval = time.Minute // async commits stay unsynced
	r := start(t, cfg)
	c := ctx(t)
	durable, err := r.kv.Put(c, &walshipv1.PutRequest{Key: "a", Value: []byte("synced")})
	if err != nil {
		t.Fatal(err)
	}
	async := &walshipv1.CommitPolicy{Durability: walshipv1.Durability_DURABILITY_ASYNC}
	var lost *walshipv1.PutResponse
	for _, k := range []string{"b", "c"} {
		if lost, err = r.kv.Put(c, &walshipv1.PutRequest{Key: k, Value: []byte("unsynced"), Policy: async}); err != nil {
			t.Fatal(err)
		}
	}
	st, err := r.admin.Status(c, &walshipv1.StatusRequest{})
	if err != nil || st.DurableLsn != durable.Lsn || st.LastLsn != lost.Lsn {
		t.Fatalf("Status = %v, %v; want durable %d, last %d", st, err, durable.Lsn, lost.Lsn)
	}

	repl := walshipv1.NewReplicationServiceClient(r.conn)
	s, err := repl.Stream(c)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Send(helloMsg("r1", 0, 1)); err != nil {
		t.Fatal(err)
	}
	var got uint64
	var epoch uint64
	for got < lost.Lsn {
		m, err := s.Recv()
		if err != nil {
			t.Fatal(err)
		}
		if b := m.GetBatch(); b != nil {
			got, epoch = b.LastLsn, b.Epoch
			if m.DurableLsn > durable.Lsn {
				t.Fatalf("batch %d..%d says durable %d; the primary synced only up to %d", b.FirstLsn, b.LastLsn, m.DurableLsn, durable.Lsn)
			}
		}
	}
	// Early shipping: the replica has the unsynced tail.
	if got != lost.Lsn || epoch != st.Epoch {
		t.Fatalf("received up to %d in epoch %d, want %d in %d", got, epoch, lost.Lsn, st.Epoch)
	}
	// A sync commit now: its batch, then its durable LSN, reach the replica.
	synced, err := r.kv.Put(c, &walshipv1.PutRequest{Key: "d", Value: []byte("synced")})
	if err != nil {
		t.Fatal(err)
	}
	for {
		m, err := s.Recv()
		if err != nil {
			t.Fatal(err)
		}
		if m.DurableLsn >= synced.Lsn {
			break
		}
	}
	s.CloseSend()

	// Lose the async tail after LSN synced... by writing more async and crashing.
	tail, err := r.kv.Put(c, &walshipv1.PutRequest{Key: "e", Value: []byte("unsynced"), Policy: async})
	if err != nil {
		t.Fatal(err)
	}
	mem.Crash()
	mem.InjectError(func(vfs.Op, string) error { return errors.New("machine is down") })
	r.stop(t)
	mem.InjectError(nil)

	r = start(t, cfg)
	c = ctx(t)
	st2, err := r.admin.Status(c, &walshipv1.StatusRequest{})
	if err != nil || st2.LastLsn != synced.Lsn || st2.Epoch != st.Epoch+1 {
		t.Fatalf("Status after the crash = %v, %v; want last LSN %d (the unsynced tail lost), epoch %d", st2, err, synced.Lsn, st.Epoch+1)
	}
	repl = walshipv1.NewReplicationServiceClient(r.conn)
	// A replica holding the lost tail (written in the old epoch) is told to cut it.
	s, err = repl.Stream(c)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Send(helloMsg("r1", st.Epoch, tail.Lsn+1)); err != nil {
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
	if div.TruncateAfterLsn != synced.Lsn || div.Epoch != st2.Epoch {
		t.Fatalf("Diverged = %v; want truncate after %d, epoch %d", div, synced.Lsn, st2.Epoch)
	}
	var mv dto.Metric
	if err := r.s.metrics.replicaDiverged.Write(&mv); err != nil || mv.GetCounter().GetValue() != 1 {
		v := mv.GetCounter().GetValue()
		t.Fatalf("walship_replication_diverged_total = %v, want 1", v)
	}

	// From the cut, the replica is served the new epoch's batches.
	s, err = repl.Stream(c)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Send(helloMsg("r1", st.Epoch, synced.Lsn+1)); err != nil {
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
			if b.FirstLsn != synced.Lsn+1 || b.LastLsn != next.Lsn || b.Epoch != st2.Epoch {
				t.Fatalf("batch %d..%d epoch %d; want %d..%d epoch %d", b.FirstLsn, b.LastLsn, b.Epoch, synced.Lsn+1, next.Lsn, st2.Epoch)
			}
			break
		}
	}
	s.CloseSend()

	// The history survives another restart and keeps its order.
	r.stop(t)
	r = start(t, cfg)
	h, err := loadEpochs(mem, epochsPath(cfg.DataDir))
	if err != nil || len(h) != 3 || h[0].firstLSN != 1 || h[1].firstLSN != synced.Lsn+1 || h[2].firstLSN != next.Lsn+1 {
		t.Fatalf("epoch history = %v, %v", h, err)
	}
}

func helloMsg(id string, epoch, next uint64) *walshipv1.StreamRequest {
	return &walshipv1.StreamRequest{Msg: &walshipv1.StreamRequest_Hello{Hello: &walshipv1.ReplicaHello{ReplicaId: id, Epoch: epoch, NextLsn: next}}}
}

func TestEpochHistory(t *testing.T) {
	var h epochHistory
	h = h.begin(0, 1)  // a fresh primary
	h = h.begin(1, 10) // restarted with LSNs 1..9
	h = h.begin(5, 10) // a log holding a newer epoch than the history (from a snapshot, say)
	h = h.begin(0, 25)
	want := epochHistory{{1, 1}, {2, 10}, {6, 10}, {7, 25}}
	if len(h) != len(want) {
		t.Fatalf("history %v, want %v", h, want)
	}
	for i := range want {
		if h[i] != want[i] {
			t.Fatalf("history %v, want %v", h, want)
		}
	}
	for _, tc := range []struct {
		epoch, keep uint64
		ok          bool
	}{{0, 0, true}, {1, 9, true}, {2, 9, true}, {5, 9, true}, {6, 24, true}, {7, 0, false}} {
		if keep, ok := h.keepUpTo(tc.epoch); keep != tc.keep || ok != tc.ok {
			t.Errorf("keepUpTo(%d) = %d, %v; want %d, %v", tc.epoch, keep, ok, tc.keep, tc.ok)
		}
	}
	mem := vfs.NewMem()
	if err := mem.MkdirAll("/d", 0o755); err != nil {
		t.Fatal(err)
	}
	if err := vfs.WriteFileAtomic(mem, "/d/epochs", h.marshal()); err != nil {
		t.Fatal(err)
	}
	got, err := loadEpochs(mem, "/d/epochs")
	if err != nil || len(got) != len(h) || got[3] != h[3] {
		t.Fatalf("loaded %v, %v; want %v", got, err, h)
	}
	for _, bad := range []string{"1\n", "x 1\n", "2 5\n1 6\n", "1 5\n2 4\n"} {
		if err := vfs.WriteFileAtomic(mem, "/d/epochs", []byte(bad)); err != nil {
			t.Fatal(err)
		}
		if _, err := loadEpochs(mem, "/d/epochs"); err == nil {
			t.Errorf("loadEpochs(%q) = nil error", bad)
		}
	}
}
