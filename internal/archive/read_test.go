package archive

import (
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"testing"
)

// readAll drains r: the batches' LSN ranges, and the error that ended it.
func readAll(r *RunReader) ([][2]uint64, error) {
	var got [][2]uint64
	for {
		env, _, err := r.Next()
		if err != nil {
			return got, err
		}
		got = append(got, [2]uint64{env.GetFirstLsn(), env.GetLastLsn()})
	}
}

// TestReadRun: a run's batches come in LSN order from the LSN asked for,
// a batch held by an earlier chunk (an upload repeated over an
// overlapping range) once; a chunk whose batches straddle where the ones
// before ended fails as corrupt after the good ones, and so does a
// damaged chunk, never yielding a batch of it.
func TestReadRun(t *testing.T) {
	ctx := context.Background()
	a := fileArchive(t, nil)
	fb := a.bucket.(*fileBucket)
	put := func(data []byte, c Chunk) Chunk {
		t.Helper()
		if err := a.PutChunk(ctx, clusterA, data, c); err != nil {
			t.Fatal(err)
		}
		return c
	}
	c1 := put(chunkOf(t, 1, 1, 5))  // 1..10
	c2 := put(chunkOf(t, 1, 7, 5))  // 7..16, overlapping c1
	c3 := put(chunkOf(t, 1, 17, 2)) // 17..20

	r := a.ReadRun(ctx, clusterA, []Chunk{c1, c2, c3}, 5, 2)
	got, err := readAll(r)
	r.Close()
	if !errors.Is(err, io.EOF) {
		t.Fatalf("read the run: %v", err)
	}
	want := [][2]uint64{{5, 6}, {7, 8}, {9, 10}, {11, 12}, {13, 14}, {15, 16}, {17, 18}, {19, 20}}
	if len(got) != len(want) {
		t.Fatalf("batches %v, want %v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("batches %v, want %v", got, want)
		}
	}

	// Batches from LSN 8 on, where the batches before end at 8.
	short := put(chunkOf(t, 1, 1, 4)) // 1..8
	odd := put(chunkOf(t, 1, 8, 2))   // 8..11
	r = a.ReadRun(ctx, clusterA, []Chunk{short, odd}, 1, 4)
	got, err = readAll(r)
	r.Close()
	var ce *CorruptError
	if !errors.As(err, &ce) || ce.Name != ChunkName(odd) || len(got) != 4 {
		t.Fatalf("a chunk of other batch boundaries: %d batches, %v; want the first chunk's 4, then %s corrupt", len(got), err, ChunkName(odd))
	}

	p, _ := fb.path(ChunkName(c2))
	orig, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	flipped := bytes.Clone(orig)
	flipped[len(flipped)-3] ^= 0x20
	if err := os.WriteFile(p, flipped, 0o600); err != nil {
		t.Fatal(err)
	}
	r = a.ReadRun(ctx, clusterA, []Chunk{c1, c2, c3}, 1, 4)
	got, err = readAll(r)
	r.Close()
	if !errors.As(err, &ce) || ce.Name != ChunkName(c2) || len(got) != 5 {
		t.Fatalf("a damaged chunk: %d batches, %v; want c1's 5, then %s corrupt", len(got), err, ChunkName(c2))
	}
}

// TestLoadSnapshot: a base snapshot comes back as the state it holds, at
// its LSN; a damaged one, or one whose name says another LSN, is corrupt.
func TestLoadSnapshot(t *testing.T) {
	ctx := context.Background()
	a := fileArchive(t, testKeyring(t, "k"))
	snap := baseSnapshot(t, 1, 1, 10, 19e9)
	ref := SnapshotRef{LSN: 20, Epoch: 1, Commit: 19e9}
	if err := a.PutSnapshot(ctx, clusterA, ref, bytes.NewReader(snap), int64(len(snap)), t.TempDir()); err != nil {
		t.Fatal(err)
	}
	tmp := t.TempDir()
	st, hdr, err := a.LoadSnapshot(ctx, clusterA, ref, tmp)
	if err != nil {
		t.Fatal(err)
	}
	if v := st.Snapshot(); v.AppliedLSN() != 20 || v.Len() != 10 || hdr.GetEpoch() != 1 || hdr.GetKeys() != 10 {
		t.Fatalf("loaded LSN %d, %d keys, meta %v", v.AppliedLSN(), v.Len(), hdr)
	}
	if left, _ := os.ReadDir(tmp); len(left) != 0 {
		t.Fatalf("LoadSnapshot left %d files in its temporary directory", len(left))
	}
	// The same bytes named for another LSN.
	other := SnapshotRef{LSN: 22, Epoch: 1, Commit: 19e9}
	if err := a.PutSnapshot(ctx, clusterA, other, bytes.NewReader(snap), int64(len(snap)), t.TempDir()); err != nil {
		t.Fatal(err)
	}
	var ce *CorruptError
	if _, _, err := a.LoadSnapshot(ctx, clusterA, other, tmp); !errors.As(err, &ce) {
		t.Fatalf("a snapshot whose name says another LSN: %v", err)
	}
	p, _ := a.bucket.(*fileBucket).path(SnapshotName(ref))
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	b[len(b)/2] ^= 1
	if err := os.WriteFile(p, b, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, _, err := a.LoadSnapshot(ctx, clusterA, ref, tmp); !errors.As(err, &ce) {
		t.Fatalf("a damaged snapshot: %v", err)
	}
}
