package state

import (
	"bytes"
	"errors"
	"testing"
)

// FuzzReadSnapshot: arbitrary bytes either fail cleanly with
// ErrCorruptSnapshot or decode to a store that re-encodes to the same bytes,
// with and without a size limit.
func FuzzReadSnapshot(f *testing.F) {
	addSnapshotSeeds(f)

	f.Fuzz(func(t *testing.T, data []byte) {
		limited, errL := ReadSnapshot(bytes.NewReader(data), int64(len(data)))
		unlimited, errU := ReadSnapshot(bytes.NewReader(data), 0)
		if (errL == nil) != (errU == nil) {
			t.Fatalf("limited: %v; unlimited: %v", errL, errU)
		}
		if errL != nil {
			if !errors.Is(errL, ErrCorruptSnapshot) || !errors.Is(errU, ErrCorruptSnapshot) {
				t.Fatalf("errors %v / %v do not wrap ErrCorruptSnapshot", errL, errU)
			}
			return
		}
		for _, s := range []*Store{limited, unlimited} {
			v := s.Snapshot()
			if got := encode(t, v); !bytes.Equal(got, data) {
				t.Fatalf("re-encoding differs:\n%x\n%x", got, data)
			}
			if v.Digest() != recomputeDigest(v) {
				t.Fatalf("digest differs from recomputed")
			}
		}
	})
}

// FuzzSnapshotScanner: the streaming scanner accepts exactly what
// ReadSnapshot accepts, with the same pairs, LSN and digest.
func FuzzSnapshotScanner(f *testing.F) {
	addSnapshotSeeds(f)

	f.Fuzz(func(t *testing.T, data []byte) {
		for _, limit := range []int64{int64(len(data)), 0} {
			want, errR := ReadSnapshot(bytes.NewReader(data), limit)
			pairs, lsn, d, errS := scanAll(data, limit)
			if (errR == nil) != (errS == nil) {
				t.Fatalf("limit %d: ReadSnapshot: %v; scanner: %v", limit, errR, errS)
			}
			if errS != nil {
				if !errors.Is(errS, ErrCorruptSnapshot) {
					t.Fatalf("scanner error %v does not wrap ErrCorruptSnapshot", errS)
				}
				continue
			}
			if lsn != want.AppliedLSN() || d != want.Digest() || !equalKV(pairs, dump(want)) {
				t.Fatalf("limit %d: scanner read LSN %d digest %v %d pairs, ReadSnapshot %d %v %d", limit, lsn, d, len(pairs), want.AppliedLSN(), want.Digest(), want.Len())
			}
		}
	})
}

// addSnapshotSeeds seeds a snapshot decoder's fuzz target: an empty and a
// small snapshot, two hand-made ones (keys out of order among them) and a
// bare magic.
func addSnapshotSeeds(f *testing.F) {
	f.Add(encode(f, New().Snapshot()))
	small := New()
	applyTxns(f, small, txn(put("", "e"), put("a", "1"), put("bb", "")), txn(del("a"), put("c", "3")))
	f.Add(encode(f, small.Snapshot()))
	f.Add(rawSnapshot(3, 2, []rawEntry{{"b", "", 3}, {"a", "", 3}}, nil))
	f.Add(rawSnapshot(9, 2, []rawEntry{{"j", "", 6}, {"k", "v", 9}}, nil))
	f.Add([]byte("WSHPSNAP"))
}
