package replica

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	walshipv1 "github.com/walship/walship/gen/walship/v1"
	"github.com/walship/walship/internal/archive"
	"github.com/walship/walship/internal/datadir"
	"github.com/walship/walship/internal/envelope"
	"github.com/walship/walship/internal/testkit"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// testArchive writes an archive of cluster clusterA in a directory: the
// histories of lineage's epochs, then one chunk per group of batches. It
// returns its config and each chunk's file.
func testArchive(t *testing.T, lineage datadir.History, chunks ...[]*walshipv1.WalBatch) (archive.Config, []string) {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "archive")
	cfg := archive.Config{URL: "file://" + dir}
	a, err := archive.Open(context.Background(), cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	if err := a.Claim(ctx, clusterA); err != nil {
		t.Fatal(err)
	}
	for i := range lineage {
		if err := a.PutHistory(ctx, clusterA, lineage[i].Epoch, lineage[:i+1]); err != nil {
			t.Fatal(err)
		}
	}
	var files []string
	for _, bs := range chunks {
		var b archive.ChunkBuilder
		for _, env := range bs {
			data, err := envelope.Marshal(env)
			if err != nil {
				t.Fatal(err)
			}
			if err := b.Add(data, env); err != nil {
				t.Fatal(err)
			}
		}
		data, c := b.Finish()
		if err := a.PutChunk(ctx, clusterA, data, c); err != nil {
			t.Fatal(err)
		}
		files = append(files, filepath.Join(dir, archive.ChunkName(c)))
	}
	return cfg, files
}

// outOfRange ends the primary's next stream with OUT_OF_RANGE after it
// sent bs: the primary no longer holds what follows. With no log store
// and a primary that serves no snapshot, the replica goes on to the
// archive.
func outOfRange(t *testing.T, f *fakePrimary, bs ...*walshipv1.WalBatch) {
	t.Helper()
	sess := f.next(t)
	sess.send(t, bs...)
	sess.end <- status.Error(codes.OutOfRange, "no longer kept")
}

// TestArchiveRung: a replica that neither the primary (it no longer keeps
// the replica's next LSN and serves no snapshot) nor a log store (none)
// can serve reads the archive's chunks from where it is, passing over
// the batches it holds, each checked as a log store's; a damaged chunk
// stops it before that chunk's first batch; and a replica whose log
// leaves the archive's lineage reads nothing from it.
func TestArchiveRung(t *testing.T) {
	t.Run("chunks", func(t *testing.T) {
		m := newModel(t)
		var bs []*walshipv1.WalBatch
		for i := range 30 {
			bs = append(bs, m.txn(put(keyN(i%7), "v"), put("n", keyN(i))))
		}
		// Chunks overlap what the replica holds and each other, as
		// repeated uploads leave them.
		cfg, _ := testArchive(t, datadir.History{{Epoch: 1, FirstLSN: 1}}, bs[:12], bs[8:20], bs[20:])
		p := newFakePrimary(t)
		rc := testConfig(t, t.TempDir(), p.addr)
		rc.Archive = cfg
		r := start(t, rc)
		outOfRange(t, p, bs[:10]...)
		r.waitApplied(t, bs[29].LastLsn)
		st := r.status(t)
		if st.VisibleLsn != bs[29].LastLsn || st.StateDigest != m.digest() || st.ClusterId != clusterA {
			t.Fatalf("after the archive rung: LSN %d, digest %s, cluster %q; want LSN %d, digest %s, cluster %s",
				st.VisibleLsn, st.StateDigest, st.ClusterId, bs[29].LastLsn, m.digest(), clusterA)
		}
		if n := r.metric(t, "walship_replica_archive_batches_total"); n != 20 {
			t.Fatalf("walship_replica_archive_batches_total = %v, want the 20 batches the replica lacked", n)
		}
		// Then back to the primary, from the archive's end.
		if sess := p.next(t); sess.hello.NextLsn != bs[29].LastLsn+1 {
			t.Fatalf("the stream after the archive rung starts at LSN %d, want %d", sess.hello.NextLsn, bs[29].LastLsn+1)
		}
	})

	t.Run("damaged chunk", func(t *testing.T) {
		m := newModel(t)
		var bs []*walshipv1.WalBatch
		for i := range 20 {
			bs = append(bs, m.txn(put(keyN(i), "v")))
		}
		cfg, files := testArchive(t, datadir.History{{Epoch: 1, FirstLSN: 1}}, bs[:10], bs[10:])
		b, err := os.ReadFile(files[1])
		if err != nil {
			t.Fatal(err)
		}
		b[len(b)-5] ^= 0x40
		if err := os.WriteFile(files[1], b, 0o600); err != nil {
			t.Fatal(err)
		}
		p := newFakePrimary(t)
		rc := testConfig(t, t.TempDir(), p.addr)
		rc.Archive = cfg
		r := start(t, rc)
		outOfRange(t, p, bs[:3]...)
		testkit.Until(t, "the archive rung to fail on the damaged chunk", func() bool {
			return r.metric(t, "walship_replica_archive_errors_total") > 0
		})
		if got := r.s.appliedLSN(); got != bs[9].LastLsn {
			t.Fatalf("applied LSN %d after a damaged chunk; want %d, the end of the intact one before it", got, bs[9].LastLsn)
		}
		p.next(t) // back to the primary
	})

	t.Run("another history", func(t *testing.T) {
		// The replica holds LSNs 11..20 of epoch 2; the archive's lineage
		// gives them to epoch 3 (epoch 2's tail was cut).
		m := newModel(t)
		var common, deposed, lineage []*walshipv1.WalBatch
		for i := range 5 {
			common = append(common, m.txn(put(keyN(i), "v")))
		}
		fork := m.next
		m.epoch = 2
		for i := range 5 {
			deposed = append(deposed, m.txn(put(keyN(i), "deposed")))
		}
		m.epoch, m.next = 3, fork
		for i := range 10 {
			lineage = append(lineage, m.build(m.next, put(keyN(i), "kept")))
			m.next = lineage[i].LastLsn + 1
		}
		cfg, _ := testArchive(t, datadir.History{{Epoch: 1, FirstLSN: 1}, {Epoch: 3, FirstLSN: fork}}, common, lineage)
		p := newFakePrimary(t)
		rc := testConfig(t, t.TempDir(), p.addr)
		rc.Archive = cfg
		r := start(t, rc)
		sess := p.next(t)
		sess.send(t, common...)
		sess.heartbeat(t, 2, common[4].LastLsn, false)
		sess.send(t, deposed...)
		r.waitApplied(t, deposed[4].LastLsn)
		sess.end <- status.Error(codes.OutOfRange, "no longer kept")
		testkit.Until(t, "the archive rung to refuse, or read", func() bool {
			return r.metric(t, "walship_replica_archive_errors_total")+r.metric(t, "walship_replica_archive_batches_total") > 0
		})
		if got := r.s.appliedLSN(); got != deposed[4].LastLsn || r.metric(t, "walship_replica_archive_batches_total") != 0 {
			t.Fatalf("applied LSN %d, %v batches from the archive; a replica off the archive's lineage must read nothing from it",
				got, r.metric(t, "walship_replica_archive_batches_total"))
		}
		p.next(t)
	})
}

// TestArchiveRungWhileThePrimaryIsDown: a new replica whose primary does
// not answer reads the archive meanwhile (only what a log-store majority
// held, so nothing a failover takes back).
func TestArchiveRungWhileThePrimaryIsDown(t *testing.T) {
	m := newModel(t)
	var bs []*walshipv1.WalBatch
	for i := range 10 {
		bs = append(bs, m.txn(put(keyN(i), "v")))
	}
	cfg, _ := testArchive(t, datadir.History{{Epoch: 1, FirstLSN: 1}}, bs)
	rc := testConfig(t, t.TempDir(), testkit.FreeAddr(t)) // nobody there
	rc.Archive = cfg
	r := start(t, rc)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	if got, err := r.s.visible.Wait(ctx, bs[9].LastLsn); err != nil {
		t.Fatalf("applied LSN %d with the primary down; the archive holds LSNs to %d", got, bs[9].LastLsn)
	}
	if st := r.status(t); st.StateDigest != m.digest() {
		t.Fatalf("digest %s after the archive, want %s", st.StateDigest, m.digest())
	}
}
