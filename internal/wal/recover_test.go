package wal

import (
	"encoding/binary"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/walship/walship/internal/vfs"
	"github.com/walship/walship/pkg/codec"
)

// The matrix log: three segments of four 100-byte single-LSN entries each,
// LSNs 1..12. Every frame is 124 bytes, so frame k of a segment is at
// offset 32+124k.
const (
	mxData     = 100
	mxFrame    = frameHeaderSize + mxData
	mxPerSeg   = 4
	mxSegSize  = headerSize + mxPerSeg*mxFrame
	mxEntries  = 12
	mxSegments = 3
)

func mxSeg(i int) string { return filepath.Join(testDir, segmentName(uint64(i*mxPerSeg+1))) }
func mxOff(k int) int64  { return int64(headerSize + k*mxFrame) }

func buildMatrixLog(t *testing.T) (*vfs.MemFS, []Entry) {
	t.Helper()
	m := vfs.NewMem()
	l := openMem(t, m, mxSegSize)
	want := seqEntries(1, mxEntries, mxData)
	mustNoErr(t, l.Append(want...))
	mustNoErr(t, l.Close())
	if n := len(mustReadDir(t, m)); n != mxSegments {
		t.Fatalf("matrix log has %d segments, want %d", n, mxSegments)
	}
	return m, want
}

func mustReadDir(t *testing.T, m *vfs.MemFS) []string {
	t.Helper()
	ents, err := m.ReadDir(testDir)
	mustNoErr(t, err)
	var names []string
	for _, e := range ents {
		names = append(names, e.Name())
	}
	return names
}

// mutate applies fn to the contents of a file.
func mutate(t *testing.T, m *vfs.MemFS, name string, fn func([]byte) []byte) {
	t.Helper()
	b, err := vfs.ReadFile(m, name)
	mustNoErr(t, err)
	mustNoErr(t, vfs.WriteFile(m, name, fn(b), 0o644))
}

func flip(off int64) func([]byte) []byte {
	return func(b []byte) []byte { b[off] ^= 0x40; return b }
}
func cut(n int64) func([]byte) []byte { return func(b []byte) []byte { return b[:int64(len(b))-n] } }
func truncTo(n int64) func([]byte) []byte {
	return func(b []byte) []byte { return b[:n] }
}
func zero(from, to int64) func([]byte) []byte {
	return func(b []byte) []byte { clear(b[from:to]); return b }
}
func appendBytes(p []byte) func([]byte) []byte {
	return func(b []byte) []byte { return append(b, p...) }
}

// rewriteFrame replaces frame k's LSNs and recomputes its checksum, making a
// frame that is well-formed but out of sequence.
func rewriteFrame(k int, first, last uint64) func([]byte) []byte {
	return func(b []byte) []byte {
		f := b[mxOff(k) : mxOff(k)+mxFrame]
		binary.LittleEndian.PutUint64(f[8:], first)
		binary.LittleEndian.PutUint64(f[16:], last)
		binary.LittleEndian.PutUint32(f[4:], frameCRC(f[:frameHeaderSize], f[frameHeaderSize:]))
		return b
	}
}

func TestRecoveryMatrix(t *testing.T) {
	type change struct {
		file string
		fn   func([]byte) []byte // nil removes the file
	}
	tests := []struct {
		name    string
		changes []change
		// On success: the surviving entries are want[firstIdx:firstIdx+survive].
		firstIdx, survive int
		tornBytes         int64  // expected RecoveryInfo.TornBytes
		removedSeg        bool   // expected RecoveryInfo.RemovedSegment != ""
		errSeg            string // on refusal: the segment and offset named
		errOff            int64
		errReason         string
	}{
		{name: "clean", survive: 12},
		{name: "torn last frame data", changes: []change{{mxSeg(2), cut(50)}}, survive: 11, tornBytes: mxFrame - 50},
		// The 10 bytes left of the header end with first_lsn's high zero
		// byte, which is not debris.
		{name: "torn last frame header", changes: []change{{mxSeg(2), truncTo(mxOff(3) + 10)}}, survive: 11, tornBytes: 9},
		{name: "bad crc in last frame is a torn write", changes: []change{{mxSeg(2), flip(mxOff(3) + 60)}}, survive: 11, tornBytes: mxFrame},
		// Zeros to the end of the newest segment are its preallocated tail:
		// the clean end of the log, nothing to cut.
		{name: "zeroed last frame is a clean end", changes: []change{{mxSeg(2), zero(mxOff(3), mxOff(4))}}, survive: 11},
		{name: "zeroed tail is a clean end", changes: []change{{mxSeg(2), appendBytes(make([]byte, 4096))}}, survive: 12},
		{name: "zeroed torn frame header is a clean end", changes: []change{{mxSeg(2), appendBytes(make([]byte, 10))}}, survive: 12},
		{name: "torn frame followed by zeros", changes: []change{{mxSeg(2), appendBytes(append(appendFrame(nil, &Entry{FirstLSN: 13, LastLSN: 13, Data: []byte("torn")})[:20], make([]byte, 8192)...))}}, survive: 12, tornBytes: 17},
		{name: "garbage followed by zeros", changes: []change{{mxSeg(2), appendBytes(append([]byte("junk\x00\x00junk"), make([]byte, 4096)...))}}, survive: 12, tornBytes: 10},
		{name: "garbage tail", changes: []change{{mxSeg(2), appendBytes([]byte("not a frame at all, just junk bytes"))}}, survive: 12, tornBytes: 35},
		{name: "short garbage tail", changes: []change{{mxSeg(2), appendBytes([]byte{1, 2, 3})}}, survive: 12, tornBytes: 3},
		{name: "truncated header of last segment", changes: []change{{mxSeg(2), truncTo(20)}}, survive: 8, removedSeg: true},
		{name: "empty last segment", changes: []change{{mxSeg(2), truncTo(0)}}, survive: 8, removedSeg: true},
		{name: "zeroed header of header-only last segment", changes: []change{{mxSeg(2), func(b []byte) []byte { return make([]byte, headerSize) }}}, survive: 8, removedSeg: true},
		{name: "oldest segment missing is retention", changes: []change{{mxSeg(0), nil}}, firstIdx: 4, survive: 8},
		{name: "stray files are ignored", changes: []change{{filepath.Join(testDir, "notes.txt"), func([]byte) []byte { return []byte("x") }}, {mxSeg(0) + ".32.torn", func([]byte) []byte { return []byte("x") }}}, survive: 12},

		{name: "bad crc in the middle of the last segment", changes: []change{{mxSeg(2), flip(mxOff(1) + 60)}}, errSeg: mxSeg(2), errOff: mxOff(1), errReason: "checksum"},
		{name: "bad crc in the first segment", changes: []change{{mxSeg(0), flip(mxOff(0) + 60)}}, errSeg: mxSeg(0), errOff: mxOff(0), errReason: "checksum"},
		{name: "bad crc in the last frame of a non-last segment", changes: []change{{mxSeg(1), flip(mxOff(3) + 60)}}, errSeg: mxSeg(1), errOff: mxOff(3), errReason: "checksum"},
		{name: "bad length mid-segment", changes: []change{{mxSeg(2), func(b []byte) []byte { binary.LittleEndian.PutUint32(b[mxOff(1):], 1<<30); return b }}}, errSeg: mxSeg(2), errOff: mxOff(1), errReason: "length"},
		{name: "short length mid-segment", changes: []change{{mxSeg(1), func(b []byte) []byte { binary.LittleEndian.PutUint32(b[mxOff(1):], 10); return b }}}, errSeg: mxSeg(1), errOff: mxOff(1), errReason: "checksum"},
		{name: "zeroed frame in the middle of the last segment", changes: []change{{mxSeg(2), zero(mxOff(1), mxOff(2))}}, errSeg: mxSeg(2), errOff: mxOff(1), errReason: "zeroed"},
		{name: "truncated header of a non-last segment", changes: []change{{mxSeg(1), truncTo(20)}}, errSeg: mxSeg(1), errOff: 0, errReason: "short segment header"},
		{name: "bad header crc of a non-last segment", changes: []change{{mxSeg(0), flip(18)}}, errSeg: mxSeg(0), errOff: 0, errReason: "header checksum"},
		{name: "bad header crc of the last segment with frames after it", changes: []change{{mxSeg(2), flip(18)}}, errSeg: mxSeg(2), errOff: 0, errReason: "valid frames follow"},
		{name: "torn tail of a non-last segment", changes: []change{{mxSeg(1), cut(50)}}, errSeg: mxSeg(1), errOff: mxOff(3), errReason: "length"},
		{name: "zeroed tail of a non-last segment", changes: []change{{mxSeg(0), appendBytes(make([]byte, 100))}}, errSeg: mxSeg(0), errOff: mxOff(4), errReason: "zeroed"},
		{name: "segment missing in the middle", changes: []change{{mxSeg(1), nil}}, errSeg: mxSeg(2), errOff: 0, errReason: "missing segment"},
		{name: "well-formed frame out of sequence at the tail", changes: []change{{mxSeg(2), rewriteFrame(3, 20, 20)}}, errSeg: mxSeg(2), errOff: mxOff(3), errReason: "do not follow"},
		{name: "unsupported version", changes: []change{{mxSeg(2), func(b []byte) []byte {
			binary.LittleEndian.PutUint32(b[8:], 99)
			binary.LittleEndian.PutUint32(b[28:], codec.Checksum(b[:28]))
			return b
		}}}, errSeg: mxSeg(2), errOff: 0, errReason: "version"},
		{name: "segment renamed", changes: []change{{mxSeg(2), nil}, {filepath.Join(testDir, segmentName(9)), func([]byte) []byte {
			b := appendHeader(nil, 10)
			return b
		}}}, errSeg: filepath.Join(testDir, segmentName(9)), errOff: 0, errReason: "does not match file name"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			m, want := buildMatrixLog(t)
			for _, c := range tc.changes {
				if c.fn == nil {
					mustNoErr(t, m.Remove(c.file))
					continue
				}
				if _, err := m.Stat(c.file); err != nil {
					mustNoErr(t, vfs.WriteFile(m, c.file, nil, 0o644))
				}
				mutate(t, m, c.file, c.fn)
			}
			before := snapshotDir(t, m)
			l, err := Open(Options{Dir: testDir, FS: m, SegmentSize: mxSegSize})
			if tc.errSeg != "" {
				var ce *CorruptionError
				if !errors.As(err, &ce) || !errors.Is(err, ErrCorrupt) {
					t.Fatalf("Open = %v, want a *CorruptionError", err)
				}
				if ce.Segment != tc.errSeg || ce.Offset != tc.errOff || !strings.Contains(ce.Reason, tc.errReason) {
					t.Fatalf("Open = %v, want segment %s offset %d reason containing %q", err, tc.errSeg, tc.errOff, tc.errReason)
				}
				if !strings.Contains(err.Error(), tc.errSeg) {
					t.Fatalf("error %q does not name the file", err)
				}
				// Refusing must not repair anything.
				if after := snapshotDir(t, m); !sameSnapshot(before, after) {
					t.Fatal("a refused Open changed the files")
				}
				return
			}
			if err != nil {
				t.Fatalf("Open: %v", err)
			}
			info := l.Recovery()
			if info.TornBytes != tc.tornBytes || (info.RemovedSegment != "") != tc.removedSeg {
				t.Fatalf("RecoveryInfo = %+v, want TornBytes %d, removed segment %v", info, tc.tornBytes, tc.removedSeg)
			}
			if st := l.Stats(); (st.TornTruncations != 0) != (tc.tornBytes != 0 || tc.removedSeg) || (tc.tornBytes != 0 && st.TornBytes != uint64(tc.tornBytes)) {
				t.Fatalf("Stats = %+v, want TornBytes %d", st, tc.tornBytes)
			}
			if info.Entries != int64(tc.survive) {
				t.Fatalf("RecoveryInfo.Entries = %d, want %d", info.Entries, tc.survive)
			}
			survivors := want[tc.firstIdx : tc.firstIdx+tc.survive]
			checkEntries(t, readAll(t, l), survivors)
			if tc.tornBytes > 0 {
				torn, err := vfs.ReadFile(m, info.TornSegment+"."+strconv.FormatInt(info.TornOffset, 10)+".torn")
				mustNoErr(t, err)
				if int64(len(torn)) != tc.tornBytes {
					t.Fatalf("torn copy has %d bytes, want %d", len(torn), tc.tornBytes)
				}
			}
			// The log continues where the survivors end, and a second Open
			// finds nothing to repair.
			next := survivors[len(survivors)-1].LastLSN + 1
			mustNoErr(t, l.Append(mkEntry(next, next, 10)))
			mustNoErr(t, l.Close())
			l = openMem(t, m, mxSegSize)
			if info := l.Recovery(); info.TornBytes != 0 || info.RemovedSegment != "" {
				t.Fatalf("second Open repaired again: %+v", info)
			}
			checkEntries(t, readAll(t, l), append(survivors[:len(survivors):len(survivors)], mkEntry(next, next, 10)))
			mustNoErr(t, l.Close())
		})
	}
}

type dirSnapshot map[string]string

func snapshotDir(t *testing.T, m *vfs.MemFS) dirSnapshot {
	t.Helper()
	s := dirSnapshot{}
	for _, n := range mustReadDir(t, m) {
		b, err := vfs.ReadFile(m, filepath.Join(testDir, n))
		mustNoErr(t, err)
		s[n] = string(b)
	}
	return s
}

func sameSnapshot(a, b dirSnapshot) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			return false
		}
	}
	return true
}

// TestRecoveryOnDisk runs a torn-tail repair through the real filesystem,
// without preallocation.
func TestRecoveryOnDisk(t *testing.T) {
	dir := t.TempDir()
	l, err := Open(Options{Dir: dir, SegmentSize: mxSegSize, Preallocate: -1})
	mustNoErr(t, err)
	want := seqEntries(1, 6, mxData)
	mustNoErr(t, l.Append(want...))
	mustNoErr(t, l.Close())
	last := filepath.Join(dir, segmentName(5))
	b, err := os.ReadFile(last)
	mustNoErr(t, err)
	mustNoErr(t, os.WriteFile(last, b[:len(b)-7], 0o644))
	l, err = Open(Options{Dir: dir, SegmentSize: mxSegSize, Preallocate: -1})
	mustNoErr(t, err)
	defer l.Close()
	if info := l.Recovery(); info.TornSegment != last || info.TornOffset != mxOff(1) || info.TornBytes != mxFrame-7 {
		t.Fatalf("RecoveryInfo = %+v", info)
	}
	if st := l.Stats(); st.TornTruncations != 1 || st.TornBytes != mxFrame-7 {
		t.Fatalf("Stats = %+v", st)
	}
	checkEntries(t, readAll(t, l), want[:5])
	if fi, err := os.Stat(last); err != nil || fi.Size() != mxOff(1) {
		t.Fatalf("segment not truncated: %v %v", fi.Size(), err)
	}
}

// TestFilesArePrivate: the WAL's directory (and any parent Open makes),
// its segments, a reset marker and a torn tail's copy are the owner's
// alone: 0700 and 0600 (the umask can only take bits away). A directory
// that already exists with a wider mode, as older versions made it, is
// opened as it is and keeps its mode.
func TestFilesArePrivate(t *testing.T) {
	root := t.TempDir()
	dir := filepath.Join(root, "node", "wal")
	l, err := Open(Options{Dir: dir, SegmentSize: mxSegSize, Preallocate: -1})
	mustNoErr(t, err)
	mustNoErr(t, l.Append(seqEntries(1, 6, mxData)...))
	mustNoErr(t, l.Close())
	last := filepath.Join(dir, segmentName(5))
	b, err := os.ReadFile(last)
	mustNoErr(t, err)
	mustNoErr(t, os.WriteFile(last, b[:len(b)-7], 0o600))
	l, err = Open(Options{Dir: dir, SegmentSize: mxSegSize, Preallocate: -1})
	mustNoErr(t, err)
	mustNoErr(t, l.Reset(100))
	mustNoErr(t, l.Append(seqEntries(100, 2, mxData)...))
	mustNoErr(t, l.Close())
	private := func(path string, want os.FileMode) {
		t.Helper()
		fi, err := os.Stat(path)
		mustNoErr(t, err)
		if extra := fi.Mode().Perm() &^ want; extra != 0 {
			t.Errorf("%s: mode %v grants %v beyond %v", path, fi.Mode(), extra, want)
		}
	}
	private(filepath.Join(root, "node"), 0o700)
	private(dir, 0o700)
	names, err := os.ReadDir(dir)
	mustNoErr(t, err)
	kinds := map[string]bool{}
	for _, n := range names {
		private(filepath.Join(dir, n.Name()), 0o600)
		kinds[filepath.Ext(n.Name())] = true
	}
	if !kinds[segmentExt] || !kinds[tornExt] {
		t.Fatalf("files %v: want segments and a torn tail's copy", names)
	}

	// An older version's 0755 directory opens, and keeps its mode.
	old := filepath.Join(root, "old")
	mustNoErr(t, os.Mkdir(old, 0o755))
	mustNoErr(t, os.Chmod(old, 0o755))
	l, err = Open(Options{Dir: old, SegmentSize: mxSegSize, Preallocate: -1})
	mustNoErr(t, err)
	mustNoErr(t, l.Append(seqEntries(1, 2, mxData)...))
	mustNoErr(t, l.Close())
	if fi, err := os.Stat(old); err != nil || fi.Mode().Perm() != 0o755 {
		t.Fatalf("an existing 0755 directory: %v, %v; want it kept", fi.Mode(), err)
	}
	private(filepath.Join(old, segmentName(1)), 0o600)
}
