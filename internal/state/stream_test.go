package state

import (
	"bytes"
	"errors"
	"fmt"
	"slices"
	"testing"
)

// encodeStream writes v through a SnapshotEncoder, pair by pair.
func encodeStream(t testing.TB, v *View) []byte {
	t.Helper()
	var buf bytes.Buffer
	e := NewSnapshotEncoder(&buf, v.AppliedLSN(), uint64(v.Len()))
	v.Scan(nil, nil, 0, func(k, val []byte, ver uint64) bool {
		if err := e.Add(k, val, ver); err != nil {
			t.Fatalf("Add(%q): %v", k, err)
		}
		return true
	})
	d, err := e.Finish(v.Digest().String())
	if err != nil {
		t.Fatalf("Finish: %v", err)
	}
	if d != v.Digest() || e.Pairs() != uint64(v.Len()) {
		t.Fatalf("Finish: digest %v after %d pairs, want %v after %d", d, e.Pairs(), v.Digest(), v.Len())
	}
	return buf.Bytes()
}

// scanOf is sc's Visit if visit, else its Scan.
func scanOf(sc *SnapshotScanner, visit bool) func(func(key, value []byte, version uint64) error) (Digest, error) {
	if visit {
		return sc.Visit
	}
	return sc.Scan
}

// scanAll scans data and returns the pairs, the LSN and the digest. It
// reads data with Scan and again with Visit (whose pairs share one buffer)
// and fails unless both read the same.
func scanAll(data []byte, limit int64) ([]kv, uint64, Digest, error) {
	var (
		out  [2][]kv
		lsn  [2]uint64
		d    [2]Digest
		errs [2]error
	)
	for i, visit := range []bool{false, true} {
		sc, err := NewSnapshotScanner(bytes.NewReader(data), limit)
		if err != nil {
			return nil, 0, Digest{}, err
		}
		d[i], errs[i] = scanOf(sc, visit)(func(k, v []byte, ver uint64) error {
			out[i] = append(out[i], kv{string(k), string(v), ver})
			return nil
		})
		if uint64(len(out[i])) > sc.Count() {
			return nil, 0, Digest{}, errors.New("more pairs than the header announced")
		}
		lsn[i] = sc.LSN()
	}
	if !slices.Equal(out[0], out[1]) || lsn[0] != lsn[1] || d[0] != d[1] || fmt.Sprint(errs[0]) != fmt.Sprint(errs[1]) {
		return nil, 0, Digest{}, fmt.Errorf("Scan read %d pairs at LSN %d, digest %v, error %v; Visit %d at %d, %v, %v",
			len(out[0]), lsn[0], d[0], errs[0], len(out[1]), lsn[1], d[1], errs[1])
	}
	return out[0], lsn[0], d[0], errs[0]
}

// TestSnapshotEncoderMatchesWriteSnapshot: a snapshot written pair by pair
// is byte for byte the one WriteSnapshot writes of the same state, and the
// scanner reads back the pairs, the LSN and the digest.
func TestSnapshotEncoderMatchesWriteSnapshot(t *testing.T) {
	big := New()
	for i := 0; i < 3000; i++ {
		applyTxns(t, big, txn(put(keyN(i), string(bytes.Repeat([]byte{byte(i)}, i%200)))))
	}
	for _, tt := range []struct {
		name string
		s    *Store
	}{{"empty", New()}, {"sample", sampleStore(t)}, {"3000 keys", big}} {
		t.Run(tt.name, func(t *testing.T) {
			v := tt.s.Snapshot()
			data := encodeStream(t, v)
			if want := encode(t, v); !bytes.Equal(data, want) {
				t.Fatalf("encoder wrote %d bytes differing from WriteSnapshot's %d", len(data), len(want))
			}
			for _, limit := range []int64{int64(len(data)), 0} {
				pairs, lsn, d, err := scanAll(data, limit)
				if err != nil {
					t.Fatalf("scan (limit %d): %v", limit, err)
				}
				if lsn != v.AppliedLSN() || d != v.Digest() || !equalKV(pairs, dump(v)) {
					t.Fatalf("scan (limit %d): LSN %d digest %v %d pairs, want %d %v %d", limit, lsn, d, len(pairs), v.AppliedLSN(), v.Digest(), v.Len())
				}
			}
		})
	}
}

func TestSnapshotEncoderRefuses(t *testing.T) {
	for _, tc := range []struct {
		name   string
		run    func(e *SnapshotEncoder) error
		digest bool // the error is a digest mismatch
	}{
		{"out of order", func(e *SnapshotEncoder) error {
			_ = e.Add([]byte("b"), nil, 1)
			return e.Add([]byte("a"), nil, 1)
		}, false},
		{"duplicate", func(e *SnapshotEncoder) error {
			_ = e.Add([]byte("a"), nil, 1)
			return e.Add([]byte("a"), nil, 1)
		}, false},
		{"version 0", func(e *SnapshotEncoder) error { return e.Add([]byte("a"), nil, 0) }, false},
		{"version past lsn", func(e *SnapshotEncoder) error { return e.Add([]byte("a"), nil, 6) }, false},
		{"more pairs than announced", func(e *SnapshotEncoder) error {
			for _, k := range []string{"a", "b", "c"} {
				if err := e.Add([]byte(k), nil, 1); err != nil {
					return err
				}
			}
			return nil
		}, false},
		{"fewer pairs than announced", func(e *SnapshotEncoder) error {
			_, err := e.Finish(Digest{}.String())
			return err
		}, false},
		{"wrong digest", func(e *SnapshotEncoder) error {
			_ = e.Add([]byte("a"), []byte("1"), 1)
			_ = e.Add([]byte("b"), []byte("2"), 5)
			_, err := e.Finish(Digest{}.String())
			return err
		}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.run(NewSnapshotEncoder(&bytes.Buffer{}, 5, 2))
			if !errors.Is(err, ErrCorruptSnapshot) || errors.Is(err, ErrDigestMismatch) != tc.digest {
				t.Fatalf("got %v, want ErrCorruptSnapshot (digest mismatch: %v)", err, tc.digest)
			}
		})
	}
}

// failWriter fails every write.
type failWriter struct{}

var errDisk = errors.New("disk on fire")

func (failWriter) Write([]byte) (int, error) { return 0, errDisk }

func TestSnapshotEncoderWriteError(t *testing.T) {
	e := NewSnapshotEncoder(failWriter{}, 5, 1)
	// The header and pair sit in the buffer; the flush in Finish fails.
	if err := e.Add([]byte("a"), nil, 1); err != nil {
		t.Fatalf("Add: %v", err)
	}
	var digest Digest
	digest.add(newEntryHasher().sum("a", 1, nil))
	_, err := e.Finish(digest.String())
	if !errors.Is(err, errDisk) || errors.Is(err, ErrCorruptSnapshot) {
		t.Fatalf("Finish: %v, want the writer's error, not corruption", err)
	}
}

func TestSnapshotScannerRefusesDamage(t *testing.T) {
	data := encode(t, sampleStore(t).Snapshot())
	flip := func(off int) []byte {
		b := bytes.Clone(data)
		b[off] ^= 1
		return b
	}
	for _, tc := range []struct {
		name string
		data []byte
	}{
		{"bad magic", flip(0)},
		{"flipped value byte", flip(len(data) - snapTrailerSize - 1)},
		{"flipped crc", flip(len(data) - 1)},
		{"truncated", data[:len(data)-3]},
		{"trailing byte", append(bytes.Clone(data), 0)},
		{"out of order", rawSnapshot(3, 2, []rawEntry{{"b", "", 3}, {"a", "", 3}}, nil)},
		{"duplicate key", rawSnapshot(3, 3, []rawEntry{{"a", "1", 3}, {"b", "2", 3}, {"b", "2", 3}}, nil)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for _, limit := range []int64{int64(len(tc.data)), 0} {
				if _, _, _, err := scanAll(tc.data, limit); !errors.Is(err, ErrCorruptSnapshot) {
					t.Fatalf("limit %d: got %v, want ErrCorruptSnapshot", limit, err)
				}
			}
		})
	}
}

func TestSnapshotScannerStopsOnCallbackError(t *testing.T) {
	data := encode(t, sampleStore(t).Snapshot())
	sc, err := NewSnapshotScanner(bytes.NewReader(data), int64(len(data)))
	if err != nil {
		t.Fatal(err)
	}
	stop := errors.New("stop")
	n := 0
	if _, err := sc.Scan(func([]byte, []byte, uint64) error { n++; return stop }); err != stop || n != 1 {
		t.Fatalf("Scan: %v after %d pairs, want the callback's error after 1", err, n)
	}
	if _, err := sc.Scan(func([]byte, []byte, uint64) error { return nil }); err == nil {
		t.Fatal("a second Scan succeeded")
	}
}

// TestScannerEmptyPairIsNotNil: a pair of an empty key and an empty value
// reaches fn as empty, not nil, slices, whether scanned or visited.
func TestScannerEmptyPairIsNotNil(t *testing.T) {
	data := rawSnapshot(3, 1, []rawEntry{{"", "", 3}}, nil)
	for _, visit := range []bool{false, true} {
		sc, err := NewSnapshotScanner(bytes.NewReader(data), int64(len(data)))
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		if _, err := scanOf(sc, visit)(func(k, v []byte, _ uint64) error {
			n++
			if k == nil || v == nil || len(k) != 0 || len(v) != 0 {
				t.Errorf("visit %v: pair (%q, nil %v) = (%q, nil %v), want two empty, not nil, slices", visit, k, k == nil, v, v == nil)
			}
			return nil
		}); err != nil || n != 1 {
			t.Fatalf("visit %v: %v after %d pairs", visit, err, n)
		}
	}
}
