package state

import (
	"bytes"
	"encoding/binary"
	"errors"
	"hash/crc32"
	"io"
	"math"
	"runtime"
	"slices"
	"strings"
	"testing"
)

// sampleStore has an empty key, an empty value, a large value and a deleted
// key, at LSN 9: "", alpha and beta at version 4, large at 7.
func sampleStore(t testing.TB) *Store {
	s := New()
	applyTxns(t, s,
		txn(put("", "empty key"), put("alpha", "1"), put("beta", "")),
		txn(put("gone", "x"), put("large", strings.Repeat("v", 100_000))),
		txn(del("gone")),
	)
	return s
}

func encode(t testing.TB, v *View) []byte {
	t.Helper()
	var buf bytes.Buffer
	if err := WriteSnapshot(&buf, v); err != nil {
		t.Fatalf("WriteSnapshot: %v", err)
	}
	return buf.Bytes()
}

func TestSnapshotRoundTrip(t *testing.T) {
	for _, tt := range []struct {
		name string
		s    *Store
	}{{"empty", New()}, {"sample", sampleStore(t)}} {
		t.Run(tt.name, func(t *testing.T) {
			v := tt.s.Snapshot()
			data := encode(t, v)
			for _, limit := range []int64{int64(len(data)), 0} {
				got, err := ReadSnapshot(bytes.NewReader(data), limit)
				if err != nil {
					t.Fatalf("ReadSnapshot(limit %d): %v", limit, err)
				}
				if got.AppliedLSN() != v.AppliedLSN() || got.Len() != v.Len() || got.Digest() != v.Digest() {
					t.Errorf("read LSN %d len %d digest %v, want %d %d %v",
						got.AppliedLSN(), got.Len(), got.Digest(), v.AppliedLSN(), v.Len(), v.Digest())
				}
				if !equalKV(dump(got), dump(v)) {
					t.Errorf("content differs after round trip")
				}
				if again := encode(t, got.Snapshot()); !bytes.Equal(again, data) {
					t.Errorf("re-encoding differs")
				}
			}
		})
	}
}

func TestSnapshotLoadedStoreContinues(t *testing.T) {
	s := sampleStore(t)
	got, err := ReadSnapshot(bytes.NewReader(encode(t, s.Snapshot())), 0)
	if err != nil {
		t.Fatal(err)
	}
	next := txn(put("alpha", "2"), del("beta"))
	if err := got.Apply(batch(s.AppliedLSN(), next)); !errors.Is(err, ErrLSNMismatch) {
		t.Errorf("overlapping batch after load: %v", err)
	}
	applyTxns(t, s, next)
	applyTxns(t, got, next)
	if s.Digest() != got.Digest() || !equalKV(dump(s), dump(got)) {
		t.Errorf("loaded store diverged from the original")
	}
}

func TestSnapshotLayout(t *testing.T) {
	s := New()
	applyTxns(t, s, txn(put("k", "vv"))) // put at LSN 1, commit at 2
	data := encode(t, s.Snapshot())
	want := []byte("WSHPSNAP")
	want = binary.LittleEndian.AppendUint32(want, 1)
	want = binary.LittleEndian.AppendUint32(want, 0)
	want = binary.LittleEndian.AppendUint64(want, 2) // applied LSN
	want = binary.LittleEndian.AppendUint64(want, 1) // entries
	want = binary.LittleEndian.AppendUint32(want, 1)
	want = append(want, 'k')
	want = binary.LittleEndian.AppendUint64(want, 2) // version: the commit LSN
	want = binary.LittleEndian.AppendUint32(want, 2)
	want = append(want, "vv"...)
	d := s.Digest().Bytes()
	want = append(want, d[:]...)
	want = binary.LittleEndian.AppendUint32(want, crc32.Checksum(want, crc32.MakeTable(crc32.Castagnoli)))
	if !bytes.Equal(data, want) {
		t.Fatalf("encoding\n%x\nwant\n%x", data, want)
	}
}

// rawEntry and rawSnapshot build snapshots by hand, with a valid CRC, to
// reach the checks behind it.
type rawEntry struct {
	key, value string
	version    uint64
}

func rawSnapshot(lsn, count uint64, ents []rawEntry, digest *Digest) []byte {
	b := []byte("WSHPSNAP")
	b = binary.LittleEndian.AppendUint32(b, 1)
	b = binary.LittleEndian.AppendUint32(b, 0)
	b = binary.LittleEndian.AppendUint64(b, lsn)
	b = binary.LittleEndian.AppendUint64(b, count)
	var d Digest
	h := newEntryHasher()
	for _, e := range ents {
		b = binary.LittleEndian.AppendUint32(b, uint32(len(e.key)))
		b = append(b, e.key...)
		b = binary.LittleEndian.AppendUint64(b, e.version)
		b = binary.LittleEndian.AppendUint32(b, uint32(len(e.value)))
		b = append(b, e.value...)
		d.add(h.sum(e.key, e.version, []byte(e.value)))
	}
	if digest != nil {
		d = *digest
	}
	db := d.Bytes()
	b = append(b, db[:]...)
	return binary.LittleEndian.AppendUint32(b, crc32.Checksum(b, castagnoli))
}

func TestReadSnapshotRejects(t *testing.T) {
	valid := encode(t, sampleStore(t).Snapshot())
	patch := func(off int, p ...byte) []byte {
		b := slices.Clone(valid)
		copy(b[off:], p)
		return b
	}
	bogus := Digest{lanes: [4]uint64{1}}
	// a and b as one txn (puts at 1 and 2, commit at 3) leaves them.
	ab := []rawEntry{{"a", "", 3}, {"b", "", 3}}
	tests := []struct {
		name string
		data []byte
	}{
		{"empty", nil},
		{"short header", valid[:20]},
		{"bad magic", patch(0, 'X')},
		{"format version 2", patch(8, 2)},
		{"flags", patch(12, 1)},
		{"count too large", patch(24, 0xff)},
		{"flipped value byte", patch(len(valid)-40, valid[len(valid)-40]^1)},
		{"flipped CRC", patch(len(valid)-1, valid[len(valid)-1]^1)},
		{"trailing byte", append(slices.Clone(valid), 0)},
		{"truncated trailer", valid[:len(valid)-1]},
		{"keys descending", rawSnapshot(3, 2, []rawEntry{{"b", "", 3}, {"a", "", 3}}, nil)},
		{"duplicate key", rawSnapshot(3, 2, []rawEntry{{"a", "", 3}, {"a", "", 3}}, nil)},
		{"duplicate empty key", rawSnapshot(3, 2, []rawEntry{{"", "", 3}, {"", "", 3}}, nil)},
		{"version 0", rawSnapshot(3, 1, []rawEntry{{"a", "", 0}}, nil)},
		{"version beyond LSN", rawSnapshot(3, 1, []rawEntry{{"a", "", 4}}, nil)},
		{"fewer entries than count", rawSnapshot(3, 3, ab, nil)},
		{"more entries than count", rawSnapshot(3, 1, ab, nil)},
		{"wrong digest", rawSnapshot(3, 2, ab, &bogus)},
	}
	// Accepted: versions equal to the applied LSN (the last txn's commit),
	// the common case now that a version is a commit LSN, and below it.
	for _, ok := range [][]byte{
		rawSnapshot(3, 2, ab, nil),
		rawSnapshot(5, 2, []rawEntry{{"a", "", 3}, {"b", "", 5}}, nil),
	} {
		if _, err := ReadSnapshot(bytes.NewReader(ok), 0); err != nil {
			t.Fatalf("hand-built snapshot rejected: %v", err)
		}
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			for _, limit := range []int64{int64(len(tt.data)), 0, 1 << 40} {
				s, err := ReadSnapshot(bytes.NewReader(tt.data), limit)
				if !errors.Is(err, ErrCorruptSnapshot) || s != nil {
					t.Errorf("limit %d: ReadSnapshot = %v, %v; want ErrCorruptSnapshot", limit, s, err)
				}
			}
		})
	}
}

// TestReadSnapshotEveryTruncationAndFlip: every proper prefix and every
// single-bit flip of a valid snapshot is rejected as corrupt.
func TestReadSnapshotEveryTruncationAndFlip(t *testing.T) {
	s := New()
	applyTxns(t, s, txn(put("a", "1"), put("bb", "22")), txn(put("", "e")))
	valid := encode(t, s.Snapshot())
	for n := range len(valid) {
		if _, err := ReadSnapshot(bytes.NewReader(valid[:n]), int64(n)); !errors.Is(err, ErrCorruptSnapshot) {
			t.Errorf("prefix of %d bytes: %v", n, err)
		}
	}
	for i := range len(valid) * 8 {
		b := slices.Clone(valid)
		b[i/8] ^= 1 << (i % 8)
		if _, err := ReadSnapshot(bytes.NewReader(b), int64(len(b))); !errors.Is(err, ErrCorruptSnapshot) {
			t.Errorf("bit %d flipped: %v", i, err)
		}
	}
}

// TestReadSnapshotHugeClaims: tiny inputs claiming huge lengths fail without
// a matching allocation, with or without a size limit.
func TestReadSnapshotHugeClaims(t *testing.T) {
	header := func(count uint64) []byte {
		b := []byte("WSHPSNAP")
		b = binary.LittleEndian.AppendUint32(b, 1)
		b = binary.LittleEndian.AppendUint32(b, 0)
		b = binary.LittleEndian.AppendUint64(b, math.MaxUint64)
		return binary.LittleEndian.AppendUint64(b, count)
	}
	hugeKey := binary.LittleEndian.AppendUint32(header(1), math.MaxUint32)
	hugeValue := binary.LittleEndian.AppendUint32(header(1), 1)
	hugeValue = append(hugeValue, 'k')
	hugeValue = binary.LittleEndian.AppendUint64(hugeValue, 1)
	hugeValue = binary.LittleEndian.AppendUint32(hugeValue, math.MaxUint32)
	hugeValue = append(hugeValue, make([]byte, 100)...)
	for _, tt := range []struct {
		name string
		data []byte
	}{
		{"count", header(math.MaxUint64)},
		{"key length", hugeKey},
		{"value length", hugeValue},
	} {
		for _, limit := range []int64{int64(len(tt.data)), 0} {
			var before, after runtime.MemStats
			runtime.ReadMemStats(&before)
			_, err := ReadSnapshot(bytes.NewReader(tt.data), limit)
			runtime.ReadMemStats(&after)
			if !errors.Is(err, ErrCorruptSnapshot) {
				t.Errorf("%s, limit %d: %v, want ErrCorruptSnapshot", tt.name, limit, err)
			}
			// Buffers (64 KiB) plus at most one growth chunk (64 KiB).
			if alloc := after.TotalAlloc - before.TotalAlloc; alloc > 1<<20 {
				t.Errorf("%s, limit %d: allocated %d bytes", tt.name, limit, alloc)
			}
		}
	}
}

// TestReadSnapshotLargeValueUnlimited covers the grow-as-you-read path.
func TestReadSnapshotLargeValueUnlimited(t *testing.T) {
	s := New()
	big := strings.Repeat("0123456789", 250_000) // 2.5 MB: several growth steps
	applyTxns(t, s, txn(put(strings.Repeat("k", 3<<19), big), put("z", big)))
	data := encode(t, s.Snapshot())
	got, err := ReadSnapshot(bytes.NewReader(data), 0)
	if err != nil {
		t.Fatal(err)
	}
	if got.Digest() != s.Digest() || !bytes.Equal(encode(t, got.Snapshot()), data) {
		t.Fatalf("large round trip differs")
	}
	if _, err := ReadSnapshot(bytes.NewReader(data[:len(data)-2_000_000]), 0); !errors.Is(err, ErrCorruptSnapshot) {
		t.Fatalf("truncated large snapshot: %v", err)
	}
}

type failingReader struct{ err error }

func (f failingReader) Read([]byte) (int, error) { return 0, f.err }

type failingWriter struct{ after int }

func (f *failingWriter) Write(p []byte) (int, error) {
	if f.after < len(p) {
		return 0, io.ErrShortWrite
	}
	f.after -= len(p)
	return len(p), nil
}

func TestSnapshotIOErrors(t *testing.T) {
	boom := errors.New("boom")
	_, err := ReadSnapshot(failingReader{boom}, 0)
	if !errors.Is(err, boom) || errors.Is(err, ErrCorruptSnapshot) {
		t.Errorf("read error = %v, want boom and not corruption", err)
	}
	v := sampleStore(t).Snapshot()
	if err := WriteSnapshot(&failingWriter{after: 100}, v); !errors.Is(err, io.ErrShortWrite) {
		t.Errorf("write error = %v, want ErrShortWrite", err)
	}
}
