package wal

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"github.com/walship/walship/internal/vfs"
)

func fileSize(t testing.TB, fsys vfs.FS, name string) int64 {
	t.Helper()
	fi, err := fsys.Stat(filepath.Join(testDir, name))
	mustNoErr(t, err)
	return fi.Size()
}

// TestPreallocateChunks checks how the active segment grows: in zero-filled
// chunks ahead of the data, never past the segment size (except for an
// oversized entry, which gets exactly its size), with the zeros counted
// apart from the data, and cut off when the segment is sealed.
func TestPreallocateChunks(t *testing.T) {
	const segSize, chunk = 4000, 1000
	m := vfs.NewMem()
	l, err := Open(Options{Dir: testDir, FS: m, SegmentSize: segSize, Preallocate: chunk})
	mustNoErr(t, err)
	defer l.Close()
	var want []Entry
	for lsn := uint64(1); lsn <= 40; lsn++ {
		e := mkEntry(lsn, lsn, 100) // 124-byte frames: 32 per segment
		segsBefore := l.Segments()
		mustNoErr(t, l.Append(e))
		want = append(want, e)
		infos := l.SegmentInfos()
		active := infos[len(infos)-1]
		if segsBefore > 0 && l.Segments() != segsBefore {
			sealed := infos[len(infos)-2]
			if got := fileSize(t, m, sealed.Name); got != sealed.Bytes {
				t.Fatalf("LSN %d: sealed segment %s is %d bytes, holds %d", lsn, sealed.Name, got, sealed.Bytes)
			}
		}
		wantSize := min((active.Bytes+chunk-1)/chunk*chunk, segSize)
		if got := fileSize(t, m, active.Name); got != wantSize {
			t.Fatalf("LSN %d: active segment is %d bytes holding %d, want %d", lsn, got, active.Bytes, wantSize)
		}
	}
	// Each segment was zero-filled once from its header to the largest size
	// it reached, sealed ones included (their tails were cut at sealing).
	var data, zeros int64
	for _, s := range l.SegmentInfos() {
		data += s.Bytes
		zeros += min((s.Bytes+chunk-1)/chunk*chunk, segSize) - headerSize
	}
	st := l.Stats()
	if l.Size() != data || st.BytesWritten != uint64(data) {
		t.Fatalf("Size %d, BytesWritten %d, segments hold %d", l.Size(), st.BytesWritten, data)
	}
	if st.Preallocated != uint64(zeros) {
		t.Fatalf("Preallocated %d, want %d", st.Preallocated, zeros)
	}

	// An oversized entry fills a segment of exactly its size.
	big := mkEntry(41, 41, 5000)
	mustNoErr(t, l.Append(big))
	want = append(want, big)
	if got := fileSize(t, m, segmentName(41)); got != headerSize+frameHeaderSize+5000 {
		t.Fatalf("oversized entry's segment is %d bytes", got)
	}
	next := mkEntry(42, 42, 10)
	mustNoErr(t, l.Append(next))
	want = append(want, next)
	if got := fileSize(t, m, segmentName(41)); got != headerSize+frameHeaderSize+5000 {
		t.Fatalf("sealed oversized segment is %d bytes", got)
	}
	if got := fileSize(t, m, segmentName(42)); got != chunk {
		t.Fatalf("new active segment is %d bytes, want %d", got, chunk)
	}
	checkEntries(t, readAll(t, l), want)
}

// TestPreallocateReopen closes a log with a zero-filled tail and checks that
// Open takes the tail as the clean end of the log (nothing cut, nothing
// copied, the file kept as is) and that appends continue into it, also with
// preallocation turned off.
func TestPreallocateReopen(t *testing.T) {
	m := vfs.NewMem()
	opts := Options{Dir: testDir, FS: m, SegmentSize: 1 << 20, Preallocate: 8192}
	l, err := Open(opts)
	mustNoErr(t, err)
	want := seqEntries(1, 10, 100)
	mustNoErr(t, l.Append(want...))
	mustNoErr(t, l.Close())
	name := segmentName(1)
	if fileSize(t, m, name) != 8192 {
		t.Fatalf("segment is %d bytes", fileSize(t, m, name))
	}
	for i, prealloc := range []int64{8192, -1} {
		opts.Preallocate = prealloc
		l, err = Open(opts)
		mustNoErr(t, err)
		info := l.Recovery()
		if info.TornSegment != "" || info.RemovedSegment != "" || l.Stats().TornTruncations != 0 {
			t.Fatalf("reopen %d repaired a zero tail: %+v", i, info)
		}
		if n := len(mustReadDir(t, m)); n != 1 {
			t.Fatalf("reopen %d: %d files", i, n)
		}
		if fileSize(t, m, name) != 8192 || l.Size() != headerSize+int64(len(want))*(frameHeaderSize+100) {
			t.Fatalf("reopen %d: file %d bytes, Size %d", i, fileSize(t, m, name), l.Size())
		}
		checkEntries(t, readAll(t, l), want)
		more := seqEntries(uint64(len(want)+1), 5, 100)
		mustNoErr(t, l.Append(more...))
		want = append(want, more...)
		if st := l.Stats(); st.Preallocated != 0 {
			t.Fatalf("reopen %d: appending into the zero tail wrote %d zeros", i, st.Preallocated)
		}
		checkEntries(t, readAll(t, l), want)
		mustNoErr(t, l.Close())
	}
	l, err = Open(opts)
	mustNoErr(t, err)
	defer l.Close()
	checkEntries(t, readAll(t, l), want)
}

// TestPreallocateCrash crashes a preallocating log after a Sync and some
// unsynced appends that stop in the middle of a chunk, at a chunk boundary
// or past segment boundaries, and checks that every synced entry survives
// and that what survives is a prefix of what was appended. A clean crash
// (unsynced writes lost) never needs a repair: overwritten zeros revert to
// zeros, which is the clean end of the log.
func TestPreallocateCrash(t *testing.T) {
	const segSize = 1000
	for _, chunk := range []int64{0, 64, 300} {
		for synced := 0; synced <= 14; synced += 7 {
			for unsynced := 1; unsynced <= 30; unsynced++ {
				for _, seed := range []uint64{0, 1, 2, 3} { // 0: clean crash
					name := fmt.Sprintf("chunk=%d/synced=%d/unsynced=%d/seed=%d", chunk, synced, unsynced, seed)
					m := vfs.NewMem()
					l, err := Open(Options{Dir: testDir, FS: m, SegmentSize: segSize, Preallocate: chunk})
					mustNoErr(t, err)
					all := seqEntries(1, synced+unsynced, 50) // 74-byte frames: 13 per segment
					mustNoErr(t, l.Append(all[:synced]...))
					mustNoErr(t, l.Sync())
					for _, e := range all[synced:] {
						mustNoErr(t, l.Append(e))
					}
					durable := l.DurableLSN()
					if seed == 0 {
						m.Crash()
					} else {
						m.CrashTorn(seed)
					}
					_ = l.Close()
					l, err = Open(Options{Dir: testDir, FS: m, SegmentSize: segSize, Preallocate: chunk})
					if err != nil {
						t.Fatalf("%s: reopen: %v", name, err)
					}
					got := readAll(t, l)
					if err := diffEntries(got, all[:len(got)]); err != nil {
						t.Fatalf("%s: not a prefix: %v", name, err)
					}
					if len(got) < int(durable) {
						t.Fatalf("%s: %d entries survived, %d were durable", name, len(got), durable)
					}
					if info := l.Recovery(); seed == 0 && (info.TornSegment != "" || info.RemovedSegment != "") {
						t.Fatalf("%s: a clean crash needed a repair: %+v", name, info)
					}
					// The log goes on from what survived.
					next := uint64(len(got) + 1)
					mustNoErr(t, l.Append(mkEntry(next, next, 50)))
					mustNoErr(t, l.Close())
					l = openMem(t, m, segSize)
					checkEntries(t, readAll(t, l), append(got, mkEntry(next, next, 50)))
					mustNoErr(t, l.Close())
				}
			}
		}
	}
}

// TestTornFrameThenZeros puts a torn frame in front of a preallocated zero
// tail: recovery cuts it, and the copy it keeps holds the torn bytes only,
// not the zeros after them.
func TestTornFrameThenZeros(t *testing.T) {
	m := vfs.NewMem()
	opts := Options{Dir: testDir, FS: m, SegmentSize: 1 << 20, Preallocate: 64 << 10}
	l, err := Open(opts)
	mustNoErr(t, err)
	want := seqEntries(1, 3, 100)
	mustNoErr(t, l.Append(want...))
	mustNoErr(t, l.Close())
	path := filepath.Join(testDir, segmentName(1))
	end := int64(headerSize + 3*(frameHeaderSize+100))
	torn := appendFrame(nil, &Entry{FirstLSN: 4, LastLSN: 4, Data: payload(4, 100)})[:30]
	if torn[29] == 0 {
		t.Fatal("test frame ends with a zero byte")
	}
	mutate(t, m, path, func(b []byte) []byte { copy(b[end:], torn); return b })

	l, err = Open(opts)
	mustNoErr(t, err)
	info := l.Recovery()
	if info.TornSegment != path || info.TornOffset != end || info.TornBytes != 30 {
		t.Fatalf("RecoveryInfo = %+v, want 30 bytes cut at %d", info, end)
	}
	if st := l.Stats(); st.TornTruncations != 1 || st.TornBytes != 30 {
		t.Fatalf("Stats = %+v", st)
	}
	cp, err := vfs.ReadFile(m, fmt.Sprintf("%s.%d.torn", path, end))
	mustNoErr(t, err)
	if string(cp) != string(torn) {
		t.Fatalf("torn copy is %d bytes, want the 30 torn ones", len(cp))
	}
	if fileSize(t, m, segmentName(1)) != end {
		t.Fatalf("segment is %d bytes after the cut, want %d", fileSize(t, m, segmentName(1)), end)
	}
	checkEntries(t, readAll(t, l), want)
	e := mkEntry(4, 4, 10)
	mustNoErr(t, l.Append(e))
	mustNoErr(t, l.Close())
	l, err = Open(opts)
	mustNoErr(t, err)
	defer l.Close()
	if info := l.Recovery(); info.TornSegment != "" {
		t.Fatalf("second Open repaired again: %+v", info)
	}
	checkEntries(t, readAll(t, l), append(want, e))
}

// readRecFS records, per file, the end of the furthest ReadAt, so a test can
// check what readers touch.
type readRecFS struct {
	*vfs.MemFS
	mu     sync.Mutex
	on     bool
	maxEnd map[string]int64
}

type readRecFile struct {
	vfs.File
	fs *readRecFS
}

func (r *readRecFS) OpenFile(name string, flag int, perm os.FileMode) (vfs.File, error) {
	f, err := r.MemFS.OpenFile(name, flag, perm)
	if err != nil {
		return nil, err
	}
	return &readRecFile{File: f, fs: r}, nil
}

func (f *readRecFile) ReadAt(p []byte, off int64) (int, error) {
	n, err := f.File.ReadAt(p, off)
	f.fs.mu.Lock()
	if f.fs.on {
		name := filepath.Base(f.Name())
		f.fs.maxEnd[name] = max(f.fs.maxEnd[name], off+int64(n))
	}
	f.fs.mu.Unlock()
	return n, err
}

func (r *readRecFS) record(on bool) map[string]int64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.on = on
	out := r.maxEnd
	r.maxEnd = map[string]int64{}
	return out
}

// TestReaderStopsAtWritten checks that Readers (catching up, tailing and
// durable-only), fresh and after a reopen, never read a segment past its
// written data into the zero-filled tail.
func TestReaderStopsAtWritten(t *testing.T) {
	fsys := &readRecFS{MemFS: vfs.NewMem(), maxEnd: map[string]int64{}}
	opts := Options{Dir: testDir, FS: fsys, SegmentSize: 4096, Preallocate: 4096}
	l, err := Open(opts)
	mustNoErr(t, err)
	want := seqEntries(1, 50, 100) // 124-byte frames: 32 per segment, so 2 segments
	mustNoErr(t, l.Append(want[:40]...))
	mustNoErr(t, l.Sync())
	mustNoErr(t, l.Append(want[40:]...))

	check := func(phase string) {
		t.Helper()
		ends := fsys.record(false)
		if len(ends) == 0 {
			t.Fatalf("%s: nothing read", phase)
		}
		for _, s := range l.SegmentInfos() {
			if ends[s.Name] > s.Bytes {
				t.Fatalf("%s: read %s up to %d, past its %d written bytes", phase, s.Name, ends[s.Name], s.Bytes)
			}
		}
		last := l.SegmentInfos()[l.Segments()-1]
		if fileSize(t, fsys, last.Name) <= last.Bytes {
			t.Fatalf("%s: the active segment has no zero tail: the test checks nothing", phase)
		}
	}
	readers := func(phase string) {
		fsys.record(true)
		checkEntries(t, readAll(t, l), want)
		for _, durable := range []bool{false, true} {
			r, err := l.NewReader(1, durable)
			mustNoErr(t, err)
			n := 0
			for {
				ctx, cancel := context.WithCancel(context.Background())
				cancel() // return what is there, then stop instead of waiting
				_, err := r.Next(ctx)
				if err != nil {
					wantErr(t, err, context.Canceled)
					break
				}
				n++
			}
			if wantN := map[bool]int{false: len(want), true: int(l.DurableLSN())}[durable]; n != wantN {
				t.Fatalf("%s: durable=%v reader returned %d entries, want %d", phase, durable, n, wantN)
			}
			mustNoErr(t, r.Close())
		}
		// A tailing reader waits at the end, then returns the next entry.
		r, err := l.NewReader(l.LastLSN()+1, false)
		mustNoErr(t, err)
		ch := goNext(context.Background(), r)
		e := mkEntry(l.LastLSN()+1, l.LastLSN()+1, 100)
		mustNoErr(t, l.Append(e))
		want = append(want, e)
		res := <-ch
		mustNoErr(t, res.err)
		if !sameEntry(res.e, e) {
			t.Fatalf("%s: tailing reader got %d..%d", phase, res.e.FirstLSN, res.e.LastLSN)
		}
		mustNoErr(t, r.Close())
		check(phase)
	}
	readers("fresh")
	mustNoErr(t, l.Close())
	l, err = Open(opts)
	mustNoErr(t, err)
	defer l.Close()
	readers("reopened")
}

// TestTornHeaderWithZeroTail checks that a newest segment whose header never
// reached the disk is removed even when its preallocated zeros did, and that
// the zeros are not counted as debris.
func TestTornHeaderWithZeroTail(t *testing.T) {
	for _, hdrBytes := range []int{0, 20} {
		m := vfs.NewMem()
		l := openMem(t, m, mxSegSize)
		want := seqEntries(1, 6, mxData) // segments 1 (4 entries) and 5
		mustNoErr(t, l.Append(want...))
		mustNoErr(t, l.Close())
		path := filepath.Join(testDir, segmentName(5))
		mutate(t, m, path, func(b []byte) []byte {
			out := make([]byte, len(b)) // the header's first hdrBytes bytes, then zeros
			copy(out, b[:hdrBytes])
			return out
		})
		l = openMem(t, m, mxSegSize)
		info, st := l.Recovery(), l.Stats()
		if info.RemovedSegment != path || st.TornTruncations != 1 {
			t.Fatalf("header bytes %d: RecoveryInfo %+v, Stats %+v", hdrBytes, info, st)
		}
		wantDebris := uint64(lastNonZero(appendHeader(nil, 5)[:hdrBytes]))
		if st.TornBytes != wantDebris {
			t.Fatalf("header bytes %d: TornBytes %d, want %d", hdrBytes, st.TornBytes, wantDebris)
		}
		checkEntries(t, readAll(t, l), want[:4])
		mustNoErr(t, l.Close())
	}
}
