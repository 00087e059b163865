package wal

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/walship/walship/internal/vfs"
)

func TestAppendValidation(t *testing.T) {
	tests := []struct {
		name    string
		entries []Entry
		want    error // nil: any error
	}{
		{"does not continue the log", []Entry{mkEntry(12, 12, 1)}, ErrNotContiguous},
		{"overlaps the log", []Entry{mkEntry(10, 11, 1)}, ErrNotContiguous},
		{"gap inside the batch", []Entry{mkEntry(11, 11, 1), mkEntry(13, 13, 1)}, ErrNotContiguous},
		{"last before first", []Entry{{FirstLSN: 11, LastLSN: 10}}, nil},
		{"zero LSN", []Entry{{FirstLSN: 0, LastLSN: 0}}, nil},
		{"max LSN", []Entry{{FirstLSN: 11, LastLSN: ^uint64(0)}}, nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			m := vfs.NewMem()
			l := openMem(t, m, 0)
			defer l.Close()
			mustNoErr(t, l.Append(seqEntries(1, 10, 5)...))
			err := l.Append(tc.entries...)
			if err == nil || (tc.want != nil && !errors.Is(err, tc.want)) {
				t.Fatalf("Append = %v, want %v", err, tc.want)
			}
			if errors.Is(err, ErrBroken) {
				t.Fatal("a rejected Append broke the log")
			}
			if l.LastLSN() != 10 {
				t.Fatalf("LastLSN = %d after a rejected Append", l.LastLSN())
			}
			mustNoErr(t, l.Append(mkEntry(11, 11, 1)))
		})
	}
}

func TestEmptyLogStartsAnywhere(t *testing.T) {
	m := vfs.NewMem()
	l := openMem(t, m, 0)
	if l.LastLSN() != 0 || l.FirstLSN() != 0 || l.Segments() != 0 || l.Size() != 0 {
		t.Fatalf("empty log: last %d first %d segs %d size %d", l.LastLSN(), l.FirstLSN(), l.Segments(), l.Size())
	}
	mustNoErr(t, l.Sync()) // nothing to do
	es := []Entry{mkEntry(101, 105, 10), mkEntry(106, 106, 0)}
	mustNoErr(t, l.Append(es...))
	if l.FirstLSN() != 101 || l.LastLSN() != 106 {
		t.Fatalf("FirstLSN %d LastLSN %d", l.FirstLSN(), l.LastLSN())
	}
	mustNoErr(t, l.Close())
	wantErr(t, l.Append(mkEntry(107, 107, 1)), ErrClosed)
	wantErr(t, l.Close(), ErrClosed)
	l = openMem(t, m, 0)
	defer l.Close()
	checkEntries(t, readAll(t, l), es)
}

func TestRotation(t *testing.T) {
	for _, prealloc := range []int64{-1, 0, 300} {
		t.Run(fmt.Sprintf("prealloc=%d", prealloc), func(t *testing.T) { testRotation(t, prealloc) })
	}
}

func testRotation(t *testing.T, prealloc int64) {
	m := vfs.NewMem()
	const segSize = 1000
	opts := Options{Dir: testDir, FS: m, SegmentSize: segSize, Preallocate: prealloc}
	l, err := Open(opts)
	mustNoErr(t, err)
	var want []Entry
	// Small entries fill segments; a batch is split between segments at
	// entry boundaries; an oversized entry gets a segment of its own.
	want = append(want, seqEntries(1, 20, 100)...) // 124-byte frames: 7 per segment
	mustNoErr(t, l.Append(want...))
	big := mkEntry(21, 30, 3000)
	mustNoErr(t, l.Append(big))
	want = append(want, big)
	tail := seqEntries(31, 3, 10)
	mustNoErr(t, l.Append(tail...))
	want = append(want, tail...)

	names := mustReadDir(t, m)
	wantNames := []string{segmentName(1), segmentName(8), segmentName(15), segmentName(21), segmentName(31)}
	if strings.Join(names, ",") != strings.Join(wantNames, ",") {
		t.Fatalf("segments %v, want %v", names, wantNames)
	}
	if l.Segments() != 5 {
		t.Fatalf("Segments = %d", l.Segments())
	}
	// Sealed segments are exactly their frames; the active one may have a
	// zero-filled tail, which Size does not count.
	infos := l.SegmentInfos()
	var size int64
	for i, n := range names {
		fi, err := m.Stat(testDir + "/" + n)
		mustNoErr(t, err)
		size += infos[i].Bytes
		switch {
		case i < len(names)-1 && fi.Size() != infos[i].Bytes:
			t.Fatalf("sealed segment %s is %d bytes, holds %d", n, fi.Size(), infos[i].Bytes)
		case fi.Size() > segSize && n != segmentName(21):
			t.Fatalf("segment %s is %d bytes", n, fi.Size())
		}
	}
	activeSize := func() int64 {
		fi, err := m.Stat(testDir + "/" + segmentName(31))
		mustNoErr(t, err)
		return fi.Size()
	}
	wantActive := infos[4].Bytes // 32 + 3*34
	if prealloc >= 0 {
		wantActive = int64(segSize) // one chunk (the whole segment by default)
		if prealloc > 0 {
			wantActive = 300
		}
	}
	if activeSize() != wantActive {
		t.Fatalf("active segment is %d bytes, want %d", activeSize(), wantActive)
	}
	if l.Size() != size {
		t.Fatalf("Size = %d, segments hold %d", l.Size(), size)
	}
	st := l.Stats()
	if st.BytesWritten != uint64(size) {
		t.Fatalf("BytesWritten %d, Size %d", st.BytesWritten, size)
	}
	if prealloc < 0 && st.Preallocated != 0 || prealloc >= 0 && st.Preallocated == 0 {
		t.Fatalf("Preallocated = %d", st.Preallocated)
	}
	// Rotation synced the sealed segments, not the active one.
	if l.DurableLSN() != 30 || l.LastLSN() != 33 {
		t.Fatalf("DurableLSN %d LastLSN %d", l.DurableLSN(), l.LastLSN())
	}
	checkEntries(t, readAll(t, l), want)
	mustNoErr(t, l.Close())
	l, err = Open(opts)
	mustNoErr(t, err)
	defer l.Close()
	checkEntries(t, readAll(t, l), want)
	if l.Size() != size || l.Segments() != 5 || activeSize() != wantActive {
		t.Fatalf("after reopen Size %d Segments %d active file %d", l.Size(), l.Segments(), activeSize())
	}
	if st := l.Stats(); st.Syncs != 1 || st.TornTruncations != 0 {
		t.Fatalf("Stats after Open = %+v", st)
	}
}

func TestTruncateBefore(t *testing.T) {
	m := vfs.NewMem()
	l := openMem(t, m, mxSegSize)
	defer l.Close()
	want := seqEntries(1, 12, mxData) // segments 1-4, 5-8, 9-12
	mustNoErr(t, l.Append(want...))
	size := l.Size()
	tests := []struct {
		lsn     uint64
		removed int
		first   uint64
	}{
		{1, 0, 1},
		{4, 0, 1},   // segment 1-4 still holds LSN 4
		{5, 1, 5},   // all of 1-4 is below 5
		{5, 0, 5},   // idempotent
		{100, 1, 9}, // the active segment is never removed
	}
	for _, tc := range tests {
		n, err := l.TruncateBefore(tc.lsn)
		mustNoErr(t, err)
		if n != tc.removed || l.FirstLSN() != tc.first {
			t.Fatalf("TruncateBefore(%d) = %d, FirstLSN %d; want %d, %d", tc.lsn, n, l.FirstLSN(), tc.removed, tc.first)
		}
	}
	if l.Segments() != 1 || l.Size() != size-2*mxSegSize {
		t.Fatalf("Segments %d Size %d", l.Segments(), l.Size())
	}
	checkEntries(t, readAll(t, l), want[8:])
	_, err := l.NewReader(8, false)
	wantErr(t, err, ErrCompacted)
	mustNoErr(t, l.Close())
	m.Crash() // removals were synced
	l = openMem(t, m, mxSegSize)
	checkEntries(t, readAll(t, l), want[8:])
}

// TestTruncateBeforeDirSyncFailure: a failed directory fsync after a
// segment's removal breaks the log like any failed fsync (the removal may
// or may not survive a crash), and a waiter for a durable LSN the broken
// log will never reach returns the error instead of waiting on.
func TestTruncateBeforeDirSyncFailure(t *testing.T) {
	m := vfs.NewMem()
	l := openMem(t, m, mxSegSize)
	defer l.Close()
	mustNoErr(t, l.Append(seqEntries(1, 12, mxData)...)) // segments 1-4, 5-8, 9-12
	mustNoErr(t, l.Sync())
	waited := make(chan error, 1)
	wctx, cancel := context.WithTimeout(context.Background(), 10*time.Second) // fails clearly, not by the test's timeout
	defer cancel()
	go func() { waited <- l.Wait(wctx, 13, true) }()
	injected := errors.New("injected EIO")
	m.FailDirSyncAfterRemove(".wal", injected)
	n, err := l.TruncateBefore(9)
	if n != 1 || !errors.Is(err, ErrBroken) || !errors.Is(err, injected) {
		t.Fatalf("TruncateBefore with a failing directory fsync = %d, %v; want 1 removed and ErrBroken carrying the injected error", n, err)
	}
	m.InjectError(nil)
	if err := <-waited; !errors.Is(err, ErrBroken) {
		t.Fatalf("Wait for a durable LSN on the broken log = %v; want ErrBroken", err)
	}
	if err := l.Wait(context.Background(), 13, false); !errors.Is(err, ErrBroken) {
		t.Fatalf("Wait after the log broke = %v; want ErrBroken", err)
	}
	if _, err := l.TruncateBefore(9); !errors.Is(err, ErrBroken) {
		t.Fatalf("TruncateBefore after the log broke = %v; want ErrBroken (sticky)", err)
	}
	wantErr(t, l.Append(mkEntry(13, 13, 1)), ErrBroken)
}

func TestReset(t *testing.T) {
	m := vfs.NewMem()
	l := openMem(t, m, mxSegSize)
	mustNoErr(t, l.Append(seqEntries(1, 12, mxData)...))
	r, err := l.NewReader(3, false)
	mustNoErr(t, err)
	defer r.Close()
	_, err = r.Next(context.Background())
	mustNoErr(t, err)

	mustNoErr(t, l.Reset(1000))
	if l.LastLSN() != 999 || l.DurableLSN() != 999 || l.FirstLSN() != 0 || l.Segments() != 1 {
		t.Fatalf("after Reset: last %d durable %d first %d segs %d", l.LastLSN(), l.DurableLSN(), l.FirstLSN(), l.Segments())
	}
	_, err = r.Next(context.Background())
	wantErr(t, err, ErrCompacted)
	wantErr(t, l.Append(mkEntry(13, 13, 1)), ErrNotContiguous)
	_, err = l.NewReader(5, false)
	wantErr(t, err, ErrCompacted)

	m.Crash() // Reset is durable when it returns
	_ = l.Close()
	l = openMem(t, m, mxSegSize)
	if l.LastLSN() != 999 || l.Segments() != 1 {
		t.Fatalf("after crash: LastLSN %d Segments %d", l.LastLSN(), l.Segments())
	}
	want := seqEntries(1000, 5, 10)
	mustNoErr(t, l.Append(want...))
	mustNoErr(t, l.Close())
	l = openMem(t, m, mxSegSize)
	defer l.Close()
	checkEntries(t, readAll(t, l), want)
	if names := mustReadDir(t, m); len(names) != 1 || names[0] != segmentName(1000) {
		t.Fatalf("files after Reset: %v", names)
	}
}

// TestResetCrashAtomic crashes Reset after each of its filesystem calls and
// checks that recovery yields either the old log or the reset one.
func TestResetCrashAtomic(t *testing.T) {
	for budget := 0; ; budget++ {
		m := vfs.NewMem()
		l := openMem(t, m, mxSegSize)
		old := seqEntries(1, 12, mxData)
		mustNoErr(t, l.Append(old...))
		mustNoErr(t, l.Sync())
		calls, crashed := 0, false
		m.InjectError(func(vfs.Op, string) error {
			if crashed {
				return vfs.ErrInjected
			}
			if calls == budget {
				crashed = true
				m.Crash()
				return vfs.ErrInjected
			}
			calls++
			return nil
		})
		err := l.Reset(500)
		m.InjectError(nil)
		if !crashed {
			mustNoErr(t, err)
			if budget < 5 {
				t.Fatalf("Reset made only %d filesystem calls", budget)
			}
			return
		}
		l = openMem(t, m, mxSegSize)
		got := readAll(t, l)
		if len(got) != 0 || l.LastLSN() != 499 {
			checkEntries(t, got, old) // the reset did not commit: the old log
		}
		mustNoErr(t, l.Close())
	}
}

func TestStats(t *testing.T) {
	m := vfs.NewMem()
	l := openMem(t, m, mxSegSize)
	defer l.Close()
	mustNoErr(t, l.Append(seqEntries(1, 6, mxData)...))
	mustNoErr(t, l.Sync())
	mustNoErr(t, l.Sync()) // nothing new: no fsync
	st := l.Stats()
	if st.EntriesAppended != 6 || st.Appends != 2 || st.SegmentsCreated != 2 || st.Syncs != 2 || st.DirSyncs < 2 {
		t.Fatalf("Stats = %+v", st)
	}
	if st.BytesWritten != uint64(l.Size()) {
		t.Fatalf("BytesWritten %d, Size %d", st.BytesWritten, l.Size())
	}
}

// TestOpenErrors checks failures that are not corruption.
func TestOpenErrors(t *testing.T) {
	if _, err := Open(Options{}); err == nil {
		t.Fatal("Open without Dir succeeded")
	}
	m := vfs.NewMem()
	m.InjectError(func(op vfs.Op, name string) error {
		if op == vfs.OpReadDir {
			return vfs.ErrInjected
		}
		return nil
	})
	_, err := Open(Options{Dir: testDir, FS: m})
	wantErr(t, err, vfs.ErrInjected)
	if errors.Is(err, ErrCorrupt) {
		t.Fatal("an I/O error reported as corruption")
	}
}

func TestOnDiskRoundTrip(t *testing.T) {
	dir := t.TempDir()
	l, err := Open(Options{Dir: dir, SegmentSize: 4096})
	mustNoErr(t, err)
	rng := rand.New(rand.NewPCG(1, 2))
	want := randEntries(rng, 1, 300, 200)
	mustNoErr(t, l.Append(want...))
	mustNoErr(t, l.Sync())
	mustNoErr(t, l.Close())
	l, err = Open(Options{Dir: dir})
	mustNoErr(t, err)
	defer l.Close()
	checkEntries(t, readAll(t, l), want)
	ents, err := os.ReadDir(dir)
	mustNoErr(t, err)
	if len(ents) != l.Segments() || len(ents) < 5 {
		t.Fatalf("%d files, %d segments", len(ents), l.Segments())
	}
}

// TestConcurrentReaders runs a writer and several readers at once (for the
// race detector) and checks every reader sees every entry in order.
func TestConcurrentReaders(t *testing.T) {
	m := vfs.NewMem()
	l := openMem(t, m, 4096)
	defer l.Close()
	rng := rand.New(rand.NewPCG(7, 7))
	want := randEntries(rng, 1, 2000, 100)
	last := want[len(want)-1].LastLSN

	var wg sync.WaitGroup
	errs := make(chan error, 4)
	for i, durable := range []bool{false, false, true, true} {
		r, err := l.NewReader(1, durable)
		mustNoErr(t, err)
		wg.Go(func() {
			defer r.Close()
			var got []Entry
			for len(got) == 0 || got[len(got)-1].LastLSN < last {
				e, err := r.Next(context.Background())
				if err != nil {
					errs <- err
					return
				}
				got = append(got, e)
			}
			if err := diffEntries(got, want); err != nil {
				errs <- errors.New("reader " + string(rune('0'+i)) + ": " + err.Error())
			}
		})
	}
	for i := 0; i < len(want); {
		n := min(1+rng.IntN(20), len(want)-i)
		mustNoErr(t, l.Append(want[i:i+n]...))
		if rng.IntN(3) == 0 {
			mustNoErr(t, l.Sync())
		}
		_ = l.LastLSN() + l.DurableLSN() + l.FirstLSN() + uint64(l.Size()) + uint64(l.Segments())
		i += n
	}
	mustNoErr(t, l.Sync())
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

// TestFailedSyncTailIsCutOnReopen: an fsync fails, and the process stops
// without a crash, so what it wrote is still readable (the page cache).
// The next Open does not take it for durable: it cuts everything after the
// last LSN that was, and the log is healthy again. A failed write does the
// same; a log that never failed keeps all it has.
func TestFailedSyncTailIsCutOnReopen(t *testing.T) {
	for _, tc := range []struct {
		name   string
		inject func(m *vfs.MemFS)
	}{
		{"failed fsync", func(m *vfs.MemFS) {
			m.InjectSyncError(func(name string) error {
				if strings.HasSuffix(name, segmentExt) {
					return vfs.ErrInjected
				}
				return nil
			})
		}},
		{"failed write", func(m *vfs.MemFS) {
			m.InjectError(func(op vfs.Op, name string) error {
				if op == vfs.OpWrite && strings.HasSuffix(name, segmentExt) {
					return vfs.ErrInjected
				}
				return nil
			})
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := vfs.NewMem()
			l := openMem(t, m, mxSegSize)
			// Segments hold 4 entries: 1-4 and 5-8. The failing write stays
			// in the second one (a rotation would sync the entries before it).
			synced := seqEntries(1, 5, mxData)
			mustNoErr(t, l.Append(synced...))
			mustNoErr(t, l.Sync())
			mustNoErr(t, l.Append(seqEntries(6, 2, mxData)...)) // LSNs 6-7: written, not synced
			tc.inject(m)
			err := l.Append(mkEntry(8, 8, 10))
			if err == nil {
				err = l.Sync()
			}
			wantErr(t, err, ErrBroken)
			_ = l.Close()
			m.InjectSyncError(nil)
			m.InjectError(nil)

			l = openMem(t, m, mxSegSize) // no crash: the unsynced pages are still there
			defer l.Close()
			if l.LastLSN() != 5 || l.DurableLSN() != 5 {
				t.Fatalf("after reopening: last %d durable %d; want 5 and 5, the entries after the last durable LSN cut", l.LastLSN(), l.DurableLSN())
			}
			if ri := l.Recovery(); !ri.UnsyncedCut || ri.UnsyncedCutAfter != 5 || ri.UnsyncedLastLSN < 7 {
				t.Fatalf("Recovery = %+v; want the cut after LSN 5 reported", ri)
			}
			checkEntries(t, readAll(t, l), synced)
			// Healthy again, and the record of the failure is gone.
			mustNoErr(t, l.Append(mkEntry(6, 6, 10)))
			mustNoErr(t, l.Sync())
			mustNoErr(t, l.Close())
			l = openMem(t, m, mxSegSize)
			defer l.Close()
			if ri := l.Recovery(); ri.UnsyncedCut || l.LastLSN() != 6 {
				t.Fatalf("a clean reopen: Recovery %+v, last %d; want no cut, last 6", ri, l.LastLSN())
			}
		})
	}
}
