package logstore

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"

	walshipv1 "github.com/walship/walship/gen/walship/v1"
	"github.com/walship/walship/internal/archive"
	"github.com/walship/walship/internal/datadir"
	"github.com/walship/walship/internal/envelope"
	"github.com/walship/walship/internal/testkit"
	"github.com/walship/walship/internal/vfs"
	"google.golang.org/grpc/codes"
)

// testArchive writes an archive of cluster clusterA in a directory: the
// histories of lineage's epochs, one chunk per group of batches, and a
// (dummy) base snapshot object at each of snaps. It returns its options
// and each chunk's file.
func testArchive(t *testing.T, lineage datadir.History, snaps []archive.SnapshotRef, chunks ...[]*walshipv1.WalBatch) (ArchiveOptions, []string) {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "archive")
	opts := ArchiveOptions{Config: archive.Config{URL: "file://" + dir}}
	a, err := archive.Open(context.Background(), opts.Config, nil)
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
	for _, ref := range snaps {
		// A refill never reads a snapshot: its name is what counts.
		body := []byte("not read")
		if err := a.PutSnapshot(ctx, clusterA, ref, bytes.NewReader(body), int64(len(body)), t.TempDir()); err != nil {
			t.Fatal(err)
		}
	}
	return opts, files
}

// TestRefillGapFromTheArchive: a log store away longer than its peers'
// retention (they keep LSNs from 61 on, it ends at 20) and the primary's
// (its oldest batch is 101) copies LSNs 21..80 from the archive, then
// 81..100 from its peer, and takes the primary's stream again; its log is
// the peer's, byte for byte, where both hold it. Without the archive the
// gap stays.
func TestRefillGapFromTheArchive(t *testing.T) {
	bs := chain(t, 1, 1, 51, 100) // LSNs 1..102
	opts, _ := testArchive(t, datadir.History{{Epoch: 1, FirstLSN: 1}}, nil, bs[:15], bs[15:40])
	a := start(t, testConfig(t, t.TempDir()))
	a.appendAll(t, bs[30:50]...) // LSNs 61..100 only: its retention cut the rest

	cfg := testConfig(t, t.TempDir())
	b := start(t, cfg)
	b.appendAll(t, bs[:10]...)
	if err := b.stop(); err != nil {
		t.Fatal(err)
	}
	cfg.Peers, cfg.Archive = []string{a.s.Addr()}, opts
	b = start(t, cfg)
	ap := b.append(t)
	ap.heartbeat(1)
	ap.send(bs[50])
	wantCode(t, ap.failure(), codes.Unavailable, "refilling from peers and the archive", "starts at LSN 101")
	st := b.refilled(t)
	if st.FirstLsn != 1 || st.DurableLsn != 100 || st.ClusterId != clusterA {
		t.Fatalf("after the refill: LSNs %d..%d, cluster %q; want 1..100 of %s", st.FirstLsn, st.DurableLsn, st.ClusterId, clusterA)
	}
	got, err := b.readAll(t, &walshipv1.ReadRequest{FromLsn: 1})
	if err != nil {
		t.Fatal(err)
	}
	sameBatches(t, got, bs[:50])
	peer, err := a.readAll(t, &walshipv1.ReadRequest{FromLsn: 61})
	if err != nil {
		t.Fatal(err)
	}
	sameBatches(t, got[30:], peer)
	if n := counterValue(t, b.s.arch.m.refillBatches); n != 30 {
		t.Errorf("walship_logstore_refill_archive_batches_total = %v, want the 30 batches of LSNs 21..80", n)
	}
	if n := counterValue(t, b.s.metrics.refillBatches); n != 40 {
		t.Errorf("walship_logstore_refill_batches_total = %v, want 40 (30 from the archive, 10 from the peer)", n)
	}
	if ack := b.appendAll(t, bs[50]); ack.DurableLsn != 102 {
		t.Fatalf("the primary's stream after the refill: %v", ack)
	}
}

// TestRefillFromTheArchiveWithEveryPeerGone: an empty log store whose
// peers do not answer refills from the archive rather than wait for them:
// from the newest snapshot from which the archive's chunks reach
// furthest, with the lineage's epochs before it, its cluster and a promise
// of its last epoch; then it takes the primary's stream.
func TestRefillFromTheArchiveWithEveryPeerGone(t *testing.T) {
	bs := append(chain(t, 2, 1, 20, 100), chain(t, 3, 41, 10, 100)...) // 1..40 of epoch 2, 41..60 of epoch 3
	lineage := datadir.History{{Epoch: 2, FirstLSN: 1}, {Epoch: 3, FirstLSN: 41}}
	snaps := []archive.SnapshotRef{{LSN: 20, Epoch: 2, Commit: 1}, {LSN: 40, Epoch: 2, Commit: 2}}
	opts, _ := testArchive(t, lineage, snaps, bs[:10], bs[10:20], bs[20:])
	cfg := testConfig(t, t.TempDir())
	cfg.Peers, cfg.Archive = []string{testkit.FreeAddr(t)}, opts
	b := start(t, cfg)
	st := b.refilled(t)
	if st.FirstLsn != 41 || st.DurableLsn != 60 || st.LastEpoch != 3 || st.VoteEpoch != 3 || st.ClusterId != clusterA {
		t.Fatalf("after the refill: %v; want LSNs 41..60 of epoch 3, promised, of cluster %s", st, clusterA)
	}
	if h := datadir.HistoryFromProto(st.History); len(h) != 2 || h[0] != lineage[0] || h[1] != lineage[1] {
		t.Fatalf("history %v after the refill, want the lineage's %v", h, lineage)
	}
	got, err := b.readAll(t, &walshipv1.ReadRequest{FromLsn: 41})
	if err != nil {
		t.Fatal(err)
	}
	sameBatches(t, got, bs[20:])
	if ack := b.appendAll(t, batch(t, 3, 61, 1, 10)); ack.DurableLsn != 62 {
		t.Fatalf("the primary's stream after the refill: %v", ack)
	}
}

// TestRefillFromTheArchiveRefuses: what the archive does not vouch for
// is never copied: a lineage older than the log store's promise, one that
// does not hold the log store's entries, an archive of another cluster,
// and a damaged chunk each leave the log as it was.
func TestRefillFromTheArchiveRefuses(t *testing.T) {
	common := chain(t, 1, 1, 5, 10)  // 1..10
	next := chain(t, 1, 11, 10, 10)  // 11..30 of epoch 1
	other := chain(t, 3, 11, 10, 10) // 11..30 of epoch 3
	for _, tc := range []struct {
		name    string
		lineage datadir.History
		chunks  [][]*walshipv1.WalBatch
		setup   func(t *testing.T, dir string, r *running) // r holds common
		damage  bool
		cannot  bool
	}{
		{name: "older than the promise", lineage: datadir.History{{Epoch: 1, FirstLSN: 1}}, chunks: [][]*walshipv1.WalBatch{next}, cannot: true,
			setup: func(t *testing.T, _ string, r *running) {
				fence := walshipv1.NewEpochServiceClient(r.conn)
				if resp, err := fence.Fence(t.Context(), &walshipv1.FenceRequest{Epoch: 2, CandidateId: "n2", CandidateAddr: "n2:1"}); err != nil || !resp.Granted {
					t.Fatalf("fence: %v, %v", resp, err)
				}
			}},
		{name: "another history", lineage: datadir.History{{Epoch: 1, FirstLSN: 1}, {Epoch: 3, FirstLSN: 11}}, chunks: [][]*walshipv1.WalBatch{other}, cannot: true,
			setup: func(t *testing.T, _ string, r *running) { r.appendAll(t, chain(t, 2, 11, 2, 10)...) }},
		{name: "another cluster", lineage: datadir.History{{Epoch: 1, FirstLSN: 1}}, chunks: [][]*walshipv1.WalBatch{next}, cannot: true},
		{name: "damaged chunk", lineage: datadir.History{{Epoch: 1, FirstLSN: 1}}, chunks: [][]*walshipv1.WalBatch{next}, damage: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			opts, files := testArchive(t, tc.lineage, nil, tc.chunks...)
			if tc.damage {
				b, err := os.ReadFile(files[0])
				if err != nil {
					t.Fatal(err)
				}
				b[len(b)/2] ^= 0x08
				if err := os.WriteFile(files[0], b, 0o600); err != nil {
					t.Fatal(err)
				}
			}
			dir := t.TempDir()
			if tc.name == "another cluster" {
				if err := datadir.SaveCluster(vfs.OS, dir, clusterB); err != nil {
					t.Fatal(err)
				}
			}
			cfg := testConfig(t, dir)
			cfg.Archive = opts
			r := start(t, cfg)
			r.appendAll(t, common...)
			if tc.setup != nil {
				tc.setup(t, dir, r)
			}
			before := r.status(t)
			n, err := r.s.refillArchive(t.Context())
			switch {
			case err == nil || n != 0:
				t.Fatalf("refill from the archive: %d batches, %v; want an error and none", n, err)
			case tc.cannot != errors.Is(err, errArchiveCannot):
				t.Fatalf("refill from the archive: %v; want errArchiveCannot: %v", err, tc.cannot)
			}
			var ce *archive.CorruptError
			if tc.damage && !errors.As(err, &ce) {
				t.Fatalf("a damaged chunk: %v, want a CorruptError", err)
			}
			if tc.name == "another cluster" && counterValue(t, r.s.metrics.clusterMismatch) == 0 {
				t.Fatal("an archive of another cluster was not counted in walship_cluster_mismatch_total")
			}
			if after := r.status(t); after.DurableLsn != before.DurableLsn || after.LastEpoch != before.LastEpoch {
				t.Fatalf("the log after a refused refill: %v; before: %v", after, before)
			}
		})
	}
}
