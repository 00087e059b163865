package archive

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/walship/walship/internal/basesnap"
	"github.com/walship/walship/internal/state"

	walshipv1 "github.com/walship/walship/gen/walship/v1"
	"github.com/walship/walship/internal/datadir"
	"github.com/walship/walship/internal/envelope"
	"github.com/walship/walship/pkg/codec"
)

const clusterA = "11111111-2222-4333-8444-555555555555"
const clusterB = "99999999-2222-4333-8444-555555555555"

// batch is one transaction of one put at LSN first (put, commit).
func batch(t testing.TB, epoch, first uint64, value string, at int64) ([]byte, *walshipv1.WalBatch) {
	t.Helper()
	b := codec.Batch{Records: []codec.Record{
		{LSN: first, TxnID: first, Op: codec.OpPut, Key: []byte(fmt.Sprintf("k%d", first)), Value: []byte(value)},
		{LSN: first + 1, TxnID: first, Op: codec.OpCommit},
	}}
	payload, err := codec.MsgPack.AppendBatch(nil, &b)
	if err != nil {
		t.Fatal(err)
	}
	env := &walshipv1.WalBatch{Epoch: epoch, FirstLsn: first, LastLsn: first + 1, PrevLsn: first - 1,
		CommitTimeUnixNano: at, Codec: walshipv1.Codec_CODEC_MSGPACK, Payload: payload, Crc32C: codec.Checksum(payload)}
	data, err := envelope.Marshal(env)
	if err != nil {
		t.Fatal(err)
	}
	return data, env
}

// chunkOf builds a chunk of n batches of epoch from LSN first.
func chunkOf(t testing.TB, epoch, first uint64, n int) ([]byte, Chunk) {
	t.Helper()
	var b ChunkBuilder
	for i := 0; i < n; i++ {
		lsn := first + uint64(2*i)
		data, env := batch(t, epoch, lsn, fmt.Sprintf("v%d", lsn), int64(lsn)*1e9)
		if err := b.Add(data, env); err != nil {
			t.Fatal(err)
		}
	}
	data, c := b.Finish()
	return bytes.Clone(data), c
}

func TestChunkRoundTrip(t *testing.T) {
	data, c := chunkOf(t, 3, 11, 5)
	if c.Epoch != 3 || c.FirstLSN != 11 || c.LastLSN != 20 || c.Batches != 5 || c.LastCommit != 19e9 {
		t.Fatalf("chunk %+v", c)
	}
	var lsns []uint64
	got, err := DecodeChunk(data, func(env *walshipv1.WalBatch) error {
		lsns = append(lsns, env.GetFirstLsn())
		return nil
	})
	if err != nil || got != c {
		t.Fatalf("decode: %+v, %v; want %+v", got, err, c)
	}
	if fmt.Sprint(lsns) != "[11 13 15 17 19]" {
		t.Fatalf("batches at %v", lsns)
	}
	if back, ok := parseChunkName(ChunkName(c)); !ok || back != (Chunk{Epoch: 3, FirstLSN: 11, LastLSN: 20, LastCommit: 19e9}) {
		t.Fatalf("name %s parses to %+v, %v", ChunkName(c), back, ok)
	}
}

func TestChunkBuilderRefusesWhatDoesNotContinue(t *testing.T) {
	var b ChunkBuilder
	d1, e1 := batch(t, 2, 1, "a", 1)
	if err := b.Add(d1, e1); err != nil {
		t.Fatal(err)
	}
	d2, e2 := batch(t, 3, 3, "b", 2)
	if err := b.Add(d2, e2); err == nil || !strings.Contains(err.Error(), "epoch") {
		t.Fatalf("a batch of another epoch: %v", err)
	}
	d3, e3 := batch(t, 2, 5, "c", 3)
	if err := b.Add(d3, e3); err == nil || !strings.Contains(err.Error(), "after LSN 2") {
		t.Fatalf("a batch after a gap: %v", err)
	}
}

// TestDecodeChunkFailsOnDamage: every byte flipped and every cut of a
// chunk is refused, never decoded as something else.
func TestDecodeChunkFailsOnDamage(t *testing.T) {
	data, _ := chunkOf(t, 1, 1, 3)
	for i := range data {
		bad := bytes.Clone(data)
		bad[i] ^= 0x40
		if _, err := DecodeChunk(bad, nil); err == nil {
			// A flip inside a protobuf field's value the envelope's
			// own checks cover (commit time is not covered by the CRC)
			// may decode; it must then still be a well-formed chunk.
			if !bytes.Equal(bad[:chunkHeaderSize], data[:chunkHeaderSize]) {
				t.Fatalf("a flip at byte %d of the header decoded", i)
			}
			continue
		} else if !errors.Is(err, ErrBadChunk) {
			t.Fatalf("flip at %d: %v is not ErrBadChunk", i, err)
		}
	}
	for n := 0; n < len(data); n++ {
		if _, err := DecodeChunk(data[:n], nil); !errors.Is(err, ErrBadChunk) {
			t.Fatalf("a chunk cut to %d of %d bytes: %v", n, len(data), err)
		}
	}
	if _, err := DecodeChunk(append(bytes.Clone(data), 0), nil); !errors.Is(err, ErrBadChunk) {
		t.Fatalf("a chunk with a byte more: %v", err)
	}
}

// FuzzDecodeChunk: arbitrary bytes are refused as ErrBadChunk or decode
// to a chunk whose batches continue each other and match its header.
// FuzzParseNames: a name the catalog takes from a listing is the name
// of what it parses to, byte for byte — the name a read of it asks for.
func FuzzParseNames(f *testing.F) {
	f.Add(ChunkName(Chunk{FirstLSN: 1, LastLSN: 8, Epoch: 2, LastCommit: 77}))
	f.Add(SnapshotName(SnapshotRef{LSN: 9, Epoch: 3, Commit: 5}))
	f.Add(historyName(4))
	f.Add("history/00000000000000AB")
	f.Add("wal/0000000000000001-0000000000000008-0000000000000002-000000000000004D")
	f.Fuzz(func(t *testing.T, name string) {
		if c, ok := parseChunkName(name); ok && ChunkName(c) != name {
			t.Fatalf("%q parses as chunk %+v, named %q", name, c, ChunkName(c))
		}
		if r, ok := parseSnapshotName(name); ok && SnapshotName(r) != name {
			t.Fatalf("%q parses as snapshot %+v, named %q", name, r, SnapshotName(r))
		}
		if e, ok := parseHistoryName(name); ok && historyName(e) != name {
			t.Fatalf("%q parses as epoch %d's history, named %q", name, e, historyName(e))
		}
	})
}

func FuzzDecodeChunk(f *testing.F) {
	good, _ := chunkOf(f, 2, 7, 3)
	f.Add(good)
	f.Add(good[:chunkHeaderSize])
	f.Add([]byte(chunkMagic))
	f.Fuzz(func(t *testing.T, data []byte) {
		next := uint64(0)
		c, err := DecodeChunk(data, func(env *walshipv1.WalBatch) error {
			if next != 0 && env.GetFirstLsn() != next {
				t.Fatalf("batch at %d after %d", env.GetFirstLsn(), next-1)
			}
			next = env.GetLastLsn() + 1
			return nil
		})
		if err != nil {
			if !errors.Is(err, ErrBadChunk) {
				t.Fatalf("error %v is not ErrBadChunk", err)
			}
			return
		}
		if next != c.LastLSN+1 || c.Batches == 0 {
			t.Fatalf("decoded %+v, batches end at %d", c, next-1)
		}
	})
}

func testKeyring(t testing.TB, ids ...string) *Keyring {
	t.Helper()
	var b strings.Builder
	for _, id := range ids {
		k := make([]byte, 32)
		rand.Read(k)
		fmt.Fprintf(&b, "# a comment\n%s %s\n", id, base64.StdEncoding.EncodeToString(k))
	}
	kr, err := ParseKeyring([]byte(b.String()))
	if err != nil {
		t.Fatal(err)
	}
	return kr
}

func TestSealOpensOnlyWithItsKeyAndName(t *testing.T) {
	kr := testKeyring(t, "k1")
	for _, size := range []int{0, 1, segmentBytes - 1, segmentBytes, segmentBytes + 1, 3*segmentBytes + 17} {
		plain := make([]byte, size)
		rand.Read(plain)
		sealed, err := kr.Seal("wal/x", plain)
		if err != nil {
			t.Fatal(err)
		}
		if KeyID(sealed) != "k1" {
			t.Fatalf("key id %q", KeyID(sealed))
		}
		open := func(name string, b []byte) ([]byte, error) {
			r, err := kr.openReader(name, bytes.NewReader(b), int64(len(b)))
			if err != nil {
				return nil, err
			}
			var out bytes.Buffer
			_, err = out.ReadFrom(r)
			return out.Bytes(), err
		}
		got, err := open("wal/x", sealed)
		if err != nil || !bytes.Equal(got, plain) {
			t.Fatalf("size %d: open: %v (equal %v)", size, err, bytes.Equal(got, plain))
		}
		if _, err := open("wal/y", sealed); err == nil {
			t.Fatalf("size %d: opened under another name", size)
		}
		// Cut at a segment boundary: the object must not read as a
		// shorter one.
		if size > segmentBytes {
			hdr := len(encMagic) + 1 + len("k1") + saltBytes
			nseg := (size + segmentBytes - 1) / segmentBytes
			cut := sealed[:hdr+(nseg-1)*(segmentBytes+tagBytes)]
			if _, err := open("wal/x", cut); err == nil {
				t.Fatalf("size %d: a truncated object opened", size)
			}
		}
		flipped := bytes.Clone(sealed)
		flipped[len(flipped)-1] ^= 1
		if _, err := open("wal/x", flipped); err == nil {
			t.Fatalf("size %d: a damaged object opened", size)
		}
	}
	other := testKeyring(t, "k2")
	sealed, _ := kr.Seal("n", []byte("secret"))
	if _, err := other.openReader("n", bytes.NewReader(sealed), int64(len(sealed))); err == nil || !strings.Contains(err.Error(), `"k1"`) {
		t.Fatalf("opened with a key file without the key: %v", err)
	}
}

func TestKeyringRotation(t *testing.T) {
	old := testKeyring(t, "2026-01")
	// The file after a rotation holds the old key and a new one after it.
	f := filepath.Join(t.TempDir(), "keys")
	k2 := make([]byte, 32)
	rand.Read(k2)
	if err := os.WriteFile(f, []byte(fmt.Sprintf("2026-01 %s\n2026-07 %s\n", base64.StdEncoding.EncodeToString(old.keys["2026-01"]), base64.StdEncoding.EncodeToString(k2))), 0o600); err != nil {
		t.Fatal(err)
	}
	kr, err := LoadKeyring(f)
	if err != nil {
		t.Fatal(err)
	}
	if kr.Current() != "2026-07" {
		t.Fatalf("current key %s", kr.Current())
	}
	sealedOld, _ := old.Seal("n", []byte("before"))
	r, err := kr.openReader("n", bytes.NewReader(sealedOld), int64(len(sealedOld)))
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	if _, err := out.ReadFrom(r); err != nil || out.String() != "before" {
		t.Fatalf("an object of the old key after the rotation: %q %v", out.String(), err)
	}
	for _, bad := range []string{"", "k1", "k1 notbase64!", "k1 " + base64.StdEncoding.EncodeToString(make([]byte, 16)), "bad/id " + base64.StdEncoding.EncodeToString(make([]byte, 32))} {
		if _, err := ParseKeyring([]byte(bad)); err == nil {
			t.Fatalf("key file %q accepted", bad)
		}
	}
}

func fileArchive(t *testing.T, keys *Keyring) *Archive {
	t.Helper()
	b, err := newFileBucket(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	return New(b, keys, nil)
}

// TestArchiveObjectsRoundTrip: chunks, histories and snapshots come back
// as they went in, plaintext and encrypted.
func TestArchiveObjectsRoundTrip(t *testing.T) {
	for _, enc := range []bool{false, true} {
		t.Run(fmt.Sprintf("encrypted=%v", enc), func(t *testing.T) {
			var keys *Keyring
			if enc {
				keys = testKeyring(t, "k")
			}
			a := fileArchive(t, keys)
			ctx := context.Background()
			if err := a.Claim(ctx, clusterA); err != nil {
				t.Fatal(err)
			}
			data, c := chunkOf(t, 1, 1, 4)
			if err := a.PutChunk(ctx, clusterA, data, c); err != nil {
				t.Fatal(err)
			}
			envs, err := a.GetChunk(ctx, clusterA, c)
			if err != nil || len(envs) != 4 || envs[3].GetLastLsn() != 8 {
				t.Fatalf("get chunk: %d batches, %v", len(envs), err)
			}
			h := datadir.History{{Epoch: 1, FirstLSN: 1}}
			if err := a.PutHistory(ctx, clusterA, 1, h); err != nil {
				t.Fatal(err)
			}
			if got, err := a.GetHistory(ctx, clusterA, 1); err != nil || len(got) != 1 || got[0] != h[0] {
				t.Fatalf("history %v, %v", got, err)
			}
			snap := bytes.Repeat([]byte("snapshot bytes "), 200000) // ~3 MiB: several segments
			f := filepath.Join(t.TempDir(), "snap")
			os.WriteFile(f, snap, 0o600)
			fh, _ := os.Open(f)
			defer fh.Close()
			ref := SnapshotRef{LSN: 8, Epoch: 1, Commit: 7e9}
			if err := a.PutSnapshot(ctx, clusterA, ref, fh, int64(len(snap)), t.TempDir()); err != nil {
				t.Fatal(err)
			}
			got, size, err := a.FetchSnapshot(ctx, clusterA, ref, t.TempDir())
			if err != nil {
				t.Fatal(err)
			}
			defer os.Remove(got.Name())
			defer got.Close()
			var back bytes.Buffer
			back.ReadFrom(got)
			if size != int64(len(snap)) || !bytes.Equal(back.Bytes(), snap) {
				t.Fatalf("snapshot came back as %d bytes (size %d), want %d", back.Len(), size, len(snap))
			}
			cat, err := a.Catalog(ctx, clusterA)
			if err != nil {
				t.Fatal(err)
			}
			if cat.ClusterID != clusterA || len(cat.Chunks) != 1 || len(cat.Snapshots) != 1 || len(cat.Epochs) != 1 || len(cat.Unknown) != 0 {
				t.Fatalf("catalog %+v", cat)
			}
			if enc {
				raw, _, _ := a.bucket.Get(ctx, ChunkName(c))
				var b bytes.Buffer
				b.ReadFrom(raw)
				raw.Close()
				if bytes.Contains(b.Bytes(), []byte("v5")) || KeyID(b.Bytes()) != "k" {
					t.Fatal("an encrypted chunk holds plaintext")
				}
			}
		})
	}
}

// TestCorruptObjectsFailClosed: a flipped, truncated or swapped object is
// a CorruptError naming it and its LSNs, never data.
func TestCorruptObjectsFailClosed(t *testing.T) {
	ctx := context.Background()
	a := fileArchive(t, nil)
	fb := a.bucket.(*fileBucket)
	data, c := chunkOf(t, 1, 1, 4)
	if err := a.PutChunk(ctx, clusterA, data, c); err != nil {
		t.Fatal(err)
	}
	path, _ := fb.path(ChunkName(c))
	orig, _ := os.ReadFile(path)
	for name, damage := range map[string]func([]byte) []byte{
		"flipped":   func(b []byte) []byte { b = bytes.Clone(b); b[len(b)-10] ^= 1; return b },
		"truncated": func(b []byte) []byte { return b[:len(b)-5] },
	} {
		os.WriteFile(path, damage(orig), 0o600)
		_, err := a.GetChunk(ctx, clusterA, c)
		var ce *CorruptError
		if !errors.As(err, &ce) || !strings.Contains(err.Error(), "LSNs 1..8") {
			t.Fatalf("%s: %v", name, err)
		}
	}
	os.WriteFile(path, orig, 0o600)
	if _, err := a.GetChunk(ctx, clusterB, c); err == nil || !strings.Contains(err.Error(), "of cluster") {
		t.Fatalf("a chunk of another cluster: %v", err)
	}
	// An object under another object's name.
	d2, c2 := chunkOf(t, 1, 9, 2)
	if err := a.PutChunk(ctx, clusterA, d2, c2); err != nil {
		t.Fatal(err)
	}
	p2, _ := fb.path(ChunkName(c2))
	other, _ := os.ReadFile(p2)
	os.WriteFile(path, other, 0o600)
	if _, err := a.GetChunk(ctx, clusterA, c); err == nil || !strings.Contains(err.Error(), "its name says") {
		t.Fatalf("a chunk under another's name: %v", err)
	}
	// A history that parses, but whose first LSNs are 0: read as a
	// lineage, it would share every LSN with any log.
	if err := a.put(ctx, historyName(6), clusterA, []byte("5 0\n6 0\n"), nil); err != nil {
		t.Fatal(err)
	}
	var ce *CorruptError
	if _, err := a.GetHistory(ctx, clusterA, 6); !errors.As(err, &ce) || !strings.Contains(err.Error(), "history[0]: epoch and first_lsn must be at least 1") {
		t.Fatalf("a history with first LSNs of 0: %v", err)
	}
}

func TestClaimRefusesAnotherCluster(t *testing.T) {
	ctx := context.Background()
	a := fileArchive(t, nil)
	if err := a.Claim(ctx, clusterA); err != nil {
		t.Fatal(err)
	}
	if err := a.Claim(ctx, clusterA); err != nil {
		t.Fatalf("claiming one's own archive again: %v", err)
	}
	err := a.Claim(ctx, clusterB)
	var me *ClusterMismatchError
	if !errors.As(err, &me) || me.Theirs != clusterA || me.Ours != clusterB {
		t.Fatalf("another cluster's claim: %v", err)
	}
	if _, err := a.Catalog(ctx, clusterB); !errors.As(err, &me) {
		t.Fatalf("another cluster's catalog: %v", err)
	}
}

// TestClusterMarkerChecked: a cluster marker that is not one — junk, or
// JSON whose cluster_id is not a cluster id — is a CorruptError naming
// what is wrong, and the error quotes no more than the marker's start.
func TestClusterMarkerChecked(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		name, want string
		marker     []byte
	}{
		{"junk", "not a cluster marker: 100000 bytes, beginning", bytes.Repeat([]byte{'x', 0}, 50_000)},
		{"not a cluster id", `cluster_id: "walship\n" is not a cluster id`, []byte(`{"cluster_id":"walship\n","format":1}`)},
	} {
		a := fileArchive(t, nil)
		if err := a.put(ctx, clusterName, "", tc.marker, nil); err != nil {
			t.Fatal(err)
		}
		_, err := a.ClusterID(ctx)
		var ce *CorruptError
		if !errors.As(err, &ce) || !strings.Contains(err.Error(), tc.want) || len(err.Error()) > 400 {
			t.Errorf("%s: %.500v; want a CorruptError saying %q, under 400 bytes", tc.name, err, tc.want)
		}
		if err := a.Claim(ctx, clusterA); !errors.As(err, &ce) {
			t.Errorf("%s: claiming the archive: %v; want its CorruptError", tc.name, err)
		}
	}
}

// TestCatalogLineage: chunks of a tail a forced promotion cut are left
// out of the lineage; overlapping uploads of one range are covered once;
// a missing chunk is a gap that ends a run.
func TestCatalogLineage(t *testing.T) {
	c := &Catalog{
		Lineage: datadir.History{{Epoch: 1, FirstLSN: 1}, {Epoch: 3, FirstLSN: 41}},
		Chunks: []Chunk{
			{Epoch: 1, FirstLSN: 1, LastLSN: 20},
			{Epoch: 1, FirstLSN: 11, LastLSN: 30}, // an upload repeated from a batch boundary inside the one before
			{Epoch: 1, FirstLSN: 31, LastLSN: 40},
			{Epoch: 1, FirstLSN: 41, LastLSN: 50}, // epoch 1's tail past 40: cut by epoch 3
			{Epoch: 3, FirstLSN: 41, LastLSN: 60},
			{Epoch: 3, FirstLSN: 71, LastLSN: 80}, // 61..70 missing
		},
		Snapshots: []SnapshotRef{{LSN: 45, Epoch: 1}, {LSN: 76, Epoch: 3}},
	}
	run := c.Cover(0)
	var got []string
	for _, ch := range run.Chunks {
		got = append(got, fmt.Sprintf("%d:%d-%d", ch.Epoch, ch.FirstLSN, ch.LastLSN))
	}
	if run.To != 60 || strings.Join(got, " ") != "1:1-20 1:11-30 1:31-40 3:41-60" {
		t.Fatalf("cover from 0: %v to %d", got, run.To)
	}
	if c.Tail() != 80 {
		t.Fatalf("tail %d", c.Tail())
	}
	w := c.Window()
	if fmt.Sprint(w.Gaps) != "[LSNs 61..70]" {
		t.Fatalf("gaps %v", w.Gaps)
	}
	if len(w.OutOfLineage) != 1 || w.OutOfLineage[0].FirstLSN != 41 || w.OutOfLineage[0].Epoch != 1 {
		t.Fatalf("out of lineage %v", w.OutOfLineage)
	}
	if len(w.SnapshotsOutOfLineage) != 1 || w.SnapshotsOutOfLineage[0].LSN != 45 {
		t.Fatalf("snapshots out of lineage %v", w.SnapshotsOutOfLineage)
	}
	if len(w.Ranges) != 2 || w.Ranges[0].From != 0 || w.Ranges[0].To != 60 || w.Ranges[1].From != 76 || w.Ranges[1].To != 80 {
		t.Fatalf("ranges %+v", w.Ranges)
	}
}

func TestFileBucketPutIsAtomic(t *testing.T) {
	ctx := context.Background()
	fb, err := newFileBucket(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	// An upload whose body ends short leaves nothing behind.
	err = fb.Put(ctx, "wal/a", bytes.NewReader([]byte("abc")), 10, map[string]string{"k": "v"})
	if err == nil {
		t.Fatal("a short body was stored")
	}
	var names []string
	fb.List(ctx, "", "", func(o Object) bool { names = append(names, o.Name); return true })
	if len(names) != 0 {
		t.Fatalf("objects after a failed put: %v", names)
	}
	entries, _ := os.ReadDir(filepath.Join(fb.root, "wal"))
	if len(entries) != 0 {
		t.Fatalf("files after a failed put: %v", entries)
	}
}

// baseSnapshot is the bytes of a base snapshot file at the end of chunk
// c's batches (chunkOf's keys and values).
func baseSnapshot(t *testing.T, epoch, first uint64, n int, commit int64) []byte {
	t.Helper()
	st := state.New()
	for i := 0; i < n; i++ {
		lsn := first + uint64(2*i)
		_, env := batch(t, epoch, lsn, fmt.Sprintf("v%d", lsn), 0)
		var b codec.Batch
		if err := envelope.Decode(env, &b); err != nil {
			t.Fatal(err)
		}
		if err := st.Apply(&b); err != nil {
			t.Fatal(err)
		}
	}
	v := st.Snapshot()
	meta, err := basesnap.EncodeMeta(&walshipv1.SnapshotHeader{Lsn: v.AppliedLSN(), Epoch: epoch, CommitTimeUnixNano: commit,
		Keys: uint64(v.Len()), ClusterId: clusterA, History: []*walshipv1.EpochStart{{Epoch: epoch, FirstLsn: 1}}})
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	buf.Write(meta)
	if err := state.WriteSnapshot(&buf, v); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// TestVerify: a sound archive verifies with no problem and says what is
// restorable; a flipped chunk, a damaged snapshot and a missing chunk are
// each a problem naming the object and the LSN.
func TestVerify(t *testing.T) {
	ctx := context.Background()
	a := fileArchive(t, testKeyring(t, "k"))
	fb := a.bucket.(*fileBucket)
	if err := a.Claim(ctx, clusterA); err != nil {
		t.Fatal(err)
	}
	if err := a.PutHistory(ctx, clusterA, 1, datadir.History{{Epoch: 1, FirstLSN: 1}}); err != nil {
		t.Fatal(err)
	}
	var chunks []Chunk
	for i := 0; i < 4; i++ {
		data, c := chunkOf(t, 1, uint64(1+10*i), 5)
		if err := a.PutChunk(ctx, clusterA, data, c); err != nil {
			t.Fatal(err)
		}
		chunks = append(chunks, c)
	}
	snap := baseSnapshot(t, 1, 1, 10, 19e9)
	ref := SnapshotRef{LSN: 20, Epoch: 1, Commit: 19e9}
	if err := a.PutSnapshot(ctx, clusterA, ref, bytes.NewReader(snap), int64(len(snap)), t.TempDir()); err != nil {
		t.Fatal(err)
	}
	rep, err := a.Verify(ctx, clusterA, 4, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Problems) != 0 || rep.Chunks != 4 || rep.Batches != 20 || len(rep.Snapshots) != 1 || rep.Snapshots[0].Keys != 10 {
		t.Fatalf("a sound archive: %+v", rep)
	}
	if len(rep.Window.Ranges) != 1 || rep.Window.Ranges[0].From != 0 || rep.Window.Ranges[0].To != 40 {
		t.Fatalf("restorable: %+v", rep.Window.Ranges)
	}
	damage := func(name string, f func([]byte) []byte) func() {
		p, _ := fb.path(name)
		orig, _ := os.ReadFile(p)
		os.WriteFile(p, f(orig), 0o600)
		return func() { os.WriteFile(p, orig, 0o600) }
	}
	flip := func(b []byte) []byte { b = bytes.Clone(b); b[len(b)-2] ^= 4; return b }
	undo := damage(ChunkName(chunks[2]), flip)
	rep, _ = a.Verify(ctx, clusterA, 4, t.TempDir())
	undo()
	if len(rep.Problems) != 1 || rep.Problems[0].Kind != "checksum" || rep.Problems[0].LSN != 21 || rep.Window.Ranges[0].To != 20 {
		t.Fatalf("a flipped chunk: %+v, ranges %+v", rep.Problems, rep.Window.Ranges)
	}
	undo = damage(SnapshotName(ref), flip)
	rep, _ = a.Verify(ctx, clusterA, 4, t.TempDir())
	undo()
	if len(rep.Problems) != 1 || rep.Problems[0].LSN != 20 || !strings.Contains(rep.Problems[0].Object, "snapshots/") {
		t.Fatalf("a damaged snapshot: %+v", rep.Problems)
	}
	p, _ := fb.path(ChunkName(chunks[1]))
	os.Remove(p)
	rep, _ = a.Verify(ctx, clusterA, 4, t.TempDir())
	if len(rep.Problems) != 1 || rep.Problems[0].Kind != "gap" || rep.Problems[0].LSN != 11 {
		t.Fatalf("a missing chunk: %+v", rep.Problems)
	}
	// The snapshot at LSN 20 bridges the gap: 20..40 stays restorable.
	if len(rep.Window.Ranges) != 2 || rep.Window.Ranges[1].From != 20 || rep.Window.Ranges[1].To != 40 {
		t.Fatalf("restorable with a gap: %+v", rep.Window.Ranges)
	}
}

// TestRetentionPlan: the window keeps the newest snapshot committed before
// it and everything after; the snapshot count keeps the newest N.
func TestRetentionPlan(t *testing.T) {
	now := time.Unix(10000, 0)
	at := func(s int64) int64 { return time.Unix(s, 0).UnixNano() }
	c := &Catalog{
		Lineage: datadir.History{{Epoch: 1, FirstLSN: 1}},
		Chunks: []Chunk{
			{Epoch: 1, FirstLSN: 1, LastLSN: 100, LastCommit: at(1000)},
			{Epoch: 1, FirstLSN: 101, LastLSN: 200, LastCommit: at(5000)},
			{Epoch: 1, FirstLSN: 201, LastLSN: 300, LastCommit: at(9000)},
		},
		Snapshots: []SnapshotRef{{LSN: 100, Epoch: 1, Commit: at(1000)}, {LSN: 200, Epoch: 1, Commit: at(5000)}, {LSN: 300, Epoch: 1, Commit: at(9000)}},
	}
	for _, tc := range []struct {
		name     string
		window   time.Duration
		keep     int
		keepFrom uint64
		deleted  int
	}{
		{"nothing asked: keep everything", 0, 0, 0, 0},
		{"a window back to 4000s: from the snapshot at 1000s", 6000 * time.Second, 0, 100, 1},
		{"a window back to 6000s: from the snapshot at 5000s", 4000 * time.Second, 0, 200, 3},
		{"a window older than every snapshot: keep everything", 9500 * time.Second, 0, 0, 0},
		{"the newest two snapshots", 0, 2, 200, 3},
		{"three snapshots are all there are", 0, 3, 0, 0},
		{"a window and a count: the older start wins", 4000 * time.Second, 3, 0, 0},
		{"a window and a count: the window wins", 6000 * time.Second, 1, 100, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := c.Expired(now, tc.window, tc.keep)
			if p.KeepFrom != tc.keepFrom || len(p.Delete) != tc.deleted {
				t.Fatalf("plan %+v, want keep from %d, %d deleted", p, tc.keepFrom, tc.deleted)
			}
		})
	}
}
