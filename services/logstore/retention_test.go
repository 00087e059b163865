package logstore

import (
	"errors"
	"io"
	"math"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	walshipv1 "github.com/walship/walship/gen/walship/v1"
	"github.com/walship/walship/internal/state"
	"github.com/walship/walship/internal/testkit"
	"github.com/walship/walship/internal/wal"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

// TestKeepRestorable: each rule of the retention cut, on five segments of
// ten LSNs (the last one active) and 100 bytes each.
func TestKeepRestorable(t *testing.T) {
	var segs []wal.SegmentInfo
	for i := uint64(0); i < 5; i++ {
		segs = append(segs, wal.SegmentInfo{FirstLSN: 10*i + 1, LastLSN: 10*i + 10, Bytes: 100, Sealed: i < 4})
	}
	snaps := func(lsns ...uint64) []*baseSnap {
		var out []*baseSnap
		for _, l := range lsns {
			out = append(out, &baseSnap{lsn: l})
		}
		return out
	}
	const none = math.MaxUint64
	for _, tc := range []struct {
		name     string
		cut      int
		snaps    []*baseSnap
		pin      uint64
		archived uint64
		want     int
		wantHeld int64
	}{
		{"no snapshot: the cut stands", 3, nil, none, none, 3, 0},
		{"the log stays from just after the newest snapshot", 3, snaps(15), none, none, 1, 200},
		{"a newer snapshot lets it go", 3, snaps(15, 30), none, none, 3, 0},
		{"a snapshot at a segment's end", 3, snaps(20), none, none, 2, 100},
		{"nothing to cut", 0, snaps(15), none, none, 0, 0},
		{"a reader pinned LSN 25 keeps its segment", 3, nil, 25, none, 2, 0},
		{"a reader pinned LSN 11 keeps the segments from 11", 3, nil, 11, none, 1, 0},
		{"a reader pinned LSN 1 keeps everything", 3, snaps(30), 1, none, 0, 0},
		{"pins and snapshots together", 3, snaps(30), 15, none, 1, 0},
		{"nothing after the archived LSN 25 is cut", 3, nil, none, 25, 2, 100},
		{"an archive that holds it all lets the cut stand", 3, nil, none, 45, 3, 0},
		{"an archive behind a snapshot holds more than it", 3, snaps(30), none, 12, 1, 200},
		{"nothing archived keeps everything", 3, nil, none, 0, 0, 300},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, held := keepRestorable(segs, tc.cut, tc.snaps, tc.pin, tc.archived)
			if got != tc.want || held != tc.wantHeld {
				t.Fatalf("keepRestorable(cut %d) = %d (held %d bytes), want %d (held %d)", tc.cut, got, held, tc.want, tc.wantHeld)
			}
		})
	}
}

// ageClock is a clock tests move forward to age every batch at once.
type ageClock struct{ ns atomic.Int64 }

func (c *ageClock) now() time.Time  { return time.Unix(0, c.ns.Load()) }
func (c *ageClock) set(t time.Time) { c.ns.Store(t.UnixNano()) }

// retentionByAge is a config whose retention removes every sealed segment
// once clock moves two hours past baseTime (the batches' commit time), and
// nothing before; the background pass only runs after appends, so tests
// run the pass that matters themselves.
func retentionByAge(t *testing.T, dir string, clock *ageClock) Config {
	cfg := testConfig(t, dir)
	cfg.SegmentBytes = MinSegmentBytes
	cfg.RetentionAge = time.Hour
	clock.set(baseTime.Add(time.Minute))
	cfg.Now = clock.now
	return cfg
}

// TestRetentionKeepsTheLogAfterASnapshot: with snapshots stored, retention
// cuts the log only to just after the newest one, keeps the log after the
// oldest kept one readable, removes the snapshots it can no longer
// continue, and counts what it kept for them.
func TestRetentionKeepsTheLogAfterASnapshot(t *testing.T) {
	dir := t.TempDir()
	clock := &ageClock{}
	r := start(t, retentionByAge(t, dir, clock))
	bs := chain(t, 1, 1, 60, 500) // LSNs 1..120, ~6 batches a segment
	r.appendAll(t, bs[:10]...)
	r.mustPut(t, stateAt(t, bs, 20), 1)
	r.appendAll(t, bs[10:]...)

	clock.set(baseTime.Add(2 * time.Hour)) // every sealed segment is old now
	if _, err := r.s.enforceRetention(t.Context()); err != nil {
		t.Fatal(err)
	}
	first := r.s.wal.FirstLSN()
	if first <= 1 || first > 21 || r.s.ret.heldBytes.Load() == 0 {
		t.Fatalf("with a snapshot at LSN 20 retention cut the log to start at LSN %d, holding %d bytes", first, r.s.ret.heldBytes.Load())
	}
	if _, err := r.readAll(t, &walshipv1.ReadRequest{FromLsn: 21}); err != nil {
		t.Fatalf("the log after the snapshot: %v", err)
	}

	// A newer snapshot lets retention go on; the older one cannot be
	// continued any more and goes.
	r.mustPut(t, stateAt(t, bs, 100), 1)
	if _, err := r.s.enforceRetention(t.Context()); err != nil {
		t.Fatal(err)
	}
	first = r.s.wal.FirstLSN()
	if first <= 21 || first > 101 || r.s.ret.heldBytes.Load() == 0 {
		t.Fatalf("with a snapshot at LSN 100 retention cut the log to start at LSN %d, holding %d bytes", first, r.s.ret.heldBytes.Load())
	}
	if got := r.status(t).Snapshots; len(got) != 1 || got[0].Lsn != 100 {
		t.Fatalf("Status.snapshots = %v, want only LSN 100", got)
	}
	if names := snapFiles(t, dir); len(names) != 1 || names[0] != baseName(100) {
		t.Fatalf("snapshot dir holds %v", names)
	}
	if _, err := r.readAll(t, &walshipv1.ReadRequest{FromLsn: 101}); err != nil {
		t.Fatalf("the log after the snapshot: %v", err)
	}
}

// TestRetentionWithoutSnapshotsIsUnchanged: with no snapshot, retention
// removes every old sealed segment, as before snapshots were stored.
func TestRetentionWithoutSnapshotsIsUnchanged(t *testing.T) {
	clock := &ageClock{}
	r := start(t, retentionByAge(t, t.TempDir(), clock))
	r.appendAll(t, chain(t, 1, 1, 60, 500)...)
	clock.set(baseTime.Add(2 * time.Hour))
	if _, err := r.s.enforceRetention(t.Context()); err != nil {
		t.Fatal(err)
	}
	if segs := r.s.wal.SegmentInfos(); len(segs) != 1 || r.s.ret.heldBytes.Load() != 0 {
		t.Fatalf("retention left %d segments, holding %d bytes; want only the active one", len(segs), r.s.ret.heldBytes.Load())
	}
}

// TestRetentionKeepsTheNewestSnapshot: snapshots the log cannot continue
// are removed, but never the newest, and never one a reader has pinned.
func TestRetentionKeepsTheNewestSnapshot(t *testing.T) {
	dir := t.TempDir()
	r := start(t, testConfig(t, dir))
	bs := chain(t, 1, 1, 30, 20)
	r.appendAll(t, bs...)
	for _, lsn := range []uint64{10, 20, 30, 40} {
		r.mustPut(t, stateAt(t, bs, lsn), 1)
	}
	s := r.s
	s.pins.mu.Lock()
	p := s.pins.addLocked(21) // a GetSnapshot of the snapshot at 20
	s.dropUnrestorable(100)   // as if the log started after every snapshot
	s.pins.mu.Unlock()
	s.pins.release(p)
	got := r.status(t).Snapshots
	if len(got) != 2 || got[0].Lsn != 20 || got[1].Lsn != 40 {
		t.Fatalf("Status.snapshots = %v, want LSN 20 (pinned) and 40 (the newest)", got)
	}
	if names := snapFiles(t, dir); len(names) != 2 {
		t.Fatalf("snapshot dir holds %v", names)
	}
}

// smallWindowConn dials the log store with fixed 64 KiB flow-control
// windows, so that a stream the test does not read stalls the log store's
// sends (and its reader) early.
func smallWindowConn(t *testing.T, r *running) *grpc.ClientConn {
	t.Helper()
	conn, err := grpc.NewClient(r.s.Addr(), grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithInitialWindowSize(64<<10), grpc.WithInitialConnWindowSize(64<<10),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(64<<20)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

// minPin is the lowest pinned LSN.
func minPin(s *Server) uint64 {
	s.pins.mu.Lock()
	defer s.pins.mu.Unlock()
	return s.pins.minLocked()
}

// TestRetentionSparesAnOpenRead: a Read stream that has not got to the end
// keeps what it is still to send, even past the retention limits; once it
// ends, retention removes it.
func TestRetentionSparesAnOpenRead(t *testing.T) {
	clock := &ageClock{}
	r := start(t, retentionByAge(t, t.TempDir(), clock))
	bs := chain(t, 1, 1, 40, 32<<10) // LSNs 1..80, a segment each
	r.appendAll(t, bs...)

	stream, err := walshipv1.NewLogStoreServiceClient(smallWindowConn(t, r)).Read(t.Context(), &walshipv1.ReadRequest{FromLsn: 1})
	if err != nil {
		t.Fatal(err)
	}
	first, err := stream.Recv()
	if err != nil {
		t.Fatal(err)
	}
	// The log store stalls on the stream's window, its reader pinned
	// somewhere before the end (pins only move forward: the pin during
	// the pass was at most the one after it).
	clock.set(baseTime.Add(2 * time.Hour))
	if _, err := r.s.enforceRetention(t.Context()); err != nil {
		t.Fatal(err)
	}
	if f, p := r.s.wal.FirstLSN(), minPin(r.s); p >= 80 || f > p {
		t.Fatalf("retention cut the log to LSN %d; the open Read is at LSN %d", f, p)
	}
	got := []*walshipv1.WalBatch{first.Batch}
	for {
		m, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("the Read failed after %d batches: %v", len(got), err)
		}
		got = append(got, m.Batch)
	}
	sameBatches(t, got, bs)
	testkit.Until(t, "the Read's pin to go", func() bool { return minPin(r.s) == math.MaxUint64 })
	if _, err := r.s.enforceRetention(t.Context()); err != nil {
		t.Fatal(err)
	}
	if segs := r.s.wal.SegmentInfos(); len(segs) != 1 {
		t.Fatalf("after the Read ended retention left %d segments", len(segs))
	}
}

// TestRetentionSparesAnOpenGetSnapshot: a GetSnapshot stream keeps its
// snapshot, and the log after it, until it ends, even once a newer
// snapshot has let retention go past them.
func TestRetentionSparesAnOpenGetSnapshot(t *testing.T) {
	dir := t.TempDir()
	clock := &ageClock{}
	r := start(t, retentionByAge(t, dir, clock))
	bs := chain(t, 1, 1, 40, 32<<10) // LSNs 1..80
	r.appendAll(t, bs...)
	v40 := stateAt(t, bs, 40) // 20 keys of 32 KiB: more than a window
	r.mustPut(t, v40, 1)

	stream, err := walshipv1.NewLogStoreServiceClient(smallWindowConn(t, r)).GetSnapshot(t.Context(), &walshipv1.GetSnapshotRequest{AtMostLsn: 40})
	if err != nil {
		t.Fatal(err)
	}
	hdr, err := stream.Recv()
	if err != nil || hdr.GetHeader().GetLsn() != 40 {
		t.Fatalf("header %v, %v", hdr, err)
	}
	if p := minPin(r.s); p != 41 {
		t.Fatalf("GetSnapshot pinned LSN %d, want 41", p)
	}
	r.mustPut(t, stateAt(t, bs, 80), 1)
	clock.set(baseTime.Add(2 * time.Hour))
	if _, err := r.s.enforceRetention(t.Context()); err != nil {
		t.Fatal(err)
	}
	if f := r.s.wal.FirstLSN(); f > 41 {
		t.Fatalf("retention cut the log to LSN %d past the snapshot being read", f)
	}
	if _, err := os.Stat(filepath.Join(dir, "snapshots", baseName(40))); err != nil {
		t.Fatalf("the snapshot being read: %v", err)
	}
	b := state.NewBuilder(40)
	for {
		m, err := stream.Recv()
		if err != nil {
			t.Fatalf("GetSnapshot failed: %v", err)
		}
		if tr := m.GetTrailer(); tr != nil {
			st, err := b.Finish(hdr.GetHeader().GetKeys(), tr.StateDigest)
			if err != nil || st.Digest() != v40.Digest() {
				t.Fatalf("rebuilt snapshot: %v", err)
			}
			break
		}
		for _, kv := range m.GetChunk().GetKvs() {
			if err := b.Add([]byte(kv.Key), kv.Value, kv.VersionLsn); err != nil {
				t.Fatal(err)
			}
		}
	}
	testkit.Until(t, "the GetSnapshot's pin to go", func() bool { return minPin(r.s) == math.MaxUint64 })
	if _, err := r.s.enforceRetention(t.Context()); err != nil {
		t.Fatal(err)
	}
	if got := r.status(t).Snapshots; len(got) != 1 || got[0].Lsn != 80 || r.s.wal.FirstLSN() <= 41 {
		t.Fatalf("after the stream ended: snapshots %v, log from LSN %d", got, r.s.wal.FirstLSN())
	}
}
