package wal

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/walship/walship/internal/vfs"
)

// The truncation log: twelve 2-LSN entries of 100 bytes (LSNs 1..24), four
// per segment, so segments start at LSNs 1, 9 and 17.
func truncEntries() []Entry {
	var es []Entry
	for lsn := uint64(1); lsn < 25; lsn += 2 {
		es = append(es, mkEntry(lsn, lsn+1, mxData))
	}
	return es
}

func buildTruncLog(t *testing.T, prealloc int64) (*vfs.MemFS, *Log, Options, []Entry) {
	t.Helper()
	m := vfs.NewMem()
	opts := Options{Dir: testDir, FS: m, SegmentSize: mxSegSize, Preallocate: prealloc}
	l, err := Open(opts)
	mustNoErr(t, err)
	want := truncEntries()
	mustNoErr(t, l.Append(want...))
	if l.Segments() != 3 {
		t.Fatalf("%d segments", l.Segments())
	}
	return m, l, opts, want
}

func TestTruncateAfter(t *testing.T) {
	tests := []struct {
		lsn      uint64
		keep     int // entries kept
		segments int
	}{
		{24, 12, 3},  // LastLSN: no-op
		{100, 12, 3}, // beyond: no-op
		{22, 11, 3},  // inside the active segment
		{16, 8, 2},   // the end of a sealed segment: only newer ones go
		{12, 6, 2},   // inside a sealed segment
		{2, 1, 1},    // the first entry
		{0, 0, 1},    // the anchor: no entry left
	}
	for _, prealloc := range []int64{-1, 0} {
		for _, tc := range tests {
			t.Run(fmt.Sprintf("prealloc=%d/lsn=%d", prealloc, tc.lsn), func(t *testing.T) {
				m, l, opts, want := buildTruncLog(t, prealloc)
				defer func() { _ = l.Close() }()
				noop := tc.keep == len(want)
				st := l.Stats()
				mustNoErr(t, l.TruncateAfter(tc.lsn))
				want = want[:tc.keep]
				wantLast := min(tc.lsn, 24)
				if noop {
					if st2 := l.Stats(); st2.Syncs != st.Syncs || st2.SegmentsRemoved != 0 {
						t.Fatalf("a no-op TruncateAfter did I/O: %+v", st2)
					}
				} else if l.LastLSN() != wantLast || l.DurableLSN() != wantLast {
					t.Fatalf("LastLSN %d DurableLSN %d, want %d", l.LastLSN(), l.DurableLSN(), wantLast)
				}
				if l.Segments() != tc.segments || len(mustReadDir(t, m)) != tc.segments {
					t.Fatalf("%d segments, %d files, want %d", l.Segments(), len(mustReadDir(t, m)), tc.segments)
				}
				wantFirst := uint64(1)
				if len(want) == 0 {
					wantFirst = 0
				}
				if l.FirstLSN() != wantFirst {
					t.Fatalf("FirstLSN %d", l.FirstLSN())
				}
				checkEntries(t, readAll(t, l), want)
				// Size counts what is kept; sealed files are exact, the cut
				// one is cut exactly at the end of its last entry kept.
				var size int64
				for i, s := range l.SegmentInfos() {
					size += s.Bytes
					if f := fileSize(t, m, s.Name); f != s.Bytes && (!noop || i < l.Segments()-1) {
						t.Fatalf("segment %s is %d bytes, holds %d", s.Name, f, s.Bytes)
					}
				}
				if l.Size() != size {
					t.Fatalf("Size %d, segments hold %d", l.Size(), size)
				}

				// The cut is durable; the log goes on from it, across
				// segments, and reopens.
				if !noop {
					m.Crash()
					_ = l.Close()
					var err error
					l, err = Open(opts)
					mustNoErr(t, err)
					checkEntries(t, readAll(t, l), want)
				}
				next := wantLast + 1
				more := []Entry{mkEntry(next, next+4, 7), mkEntry(next+5, next+5, 300), mkEntry(next+6, next+7, 1)}
				mustNoErr(t, l.Append(more...))
				want = append(want, more...)
				checkEntries(t, readAll(t, l), want)
				mustNoErr(t, l.Close())
				l, err := Open(opts)
				mustNoErr(t, err)
				checkEntries(t, readAll(t, l), want)
			})
		}
	}
}

func TestTruncateAfterRefused(t *testing.T) {
	_, l, _, want := buildTruncLog(t, 0)
	defer l.Close()
	// Inside an entry (5..6), in a sealed and in the active segment.
	for _, lsn := range []uint64{5, 19} {
		err := l.TruncateAfter(lsn)
		if err == nil || !strings.Contains(err.Error(), "LSN "+strconv.FormatUint(lsn, 10)) || !strings.Contains(err.Error(), "inside entry") {
			t.Fatalf("TruncateAfter(%d) = %v, want an error naming the LSN and the entry", lsn, err)
		}
		if errors.Is(err, ErrBroken) {
			t.Fatal("a refused TruncateAfter broke the log")
		}
	}
	// Below what the log holds.
	n, err := l.TruncateBefore(9)
	mustNoErr(t, err)
	if n != 1 {
		t.Fatalf("TruncateBefore removed %d", n)
	}
	err = l.TruncateAfter(7)
	wantErr(t, err, ErrCompacted)
	if !strings.Contains(err.Error(), "LSN 7") {
		t.Fatalf("error %q does not name the LSN", err)
	}
	if l.LastLSN() != 24 || l.Segments() != 2 {
		t.Fatalf("a refused TruncateAfter changed the log: LastLSN %d, %d segments", l.LastLSN(), l.Segments())
	}
	checkEntries(t, readAll(t, l), want[4:])
	// The new anchor is accepted.
	mustNoErr(t, l.TruncateAfter(8))
	if l.LastLSN() != 8 || l.FirstLSN() != 0 || l.Segments() != 1 {
		t.Fatalf("after TruncateAfter(8): LastLSN %d FirstLSN %d segments %d", l.LastLSN(), l.FirstLSN(), l.Segments())
	}
	wantErr(t, l.Append(mkEntry(10, 10, 1)), ErrNotContiguous)
	mustNoErr(t, l.Append(mkEntry(9, 9, 1)))

	// An empty log that has never held a segment has nothing to cut.
	l2 := openMem(t, vfs.NewMem(), 0)
	defer l2.Close()
	mustNoErr(t, l2.TruncateAfter(5))
	mustNoErr(t, l2.Append(mkEntry(3, 3, 1)))
}

// TestTruncateAfterCrash crashes TruncateAfter after each of its filesystem
// calls (cleanly and with torn writes) and checks that the recovered log is
// a prefix of the old one that still holds every entry up to the LSN.
func TestTruncateAfterCrash(t *testing.T) {
	for _, prealloc := range []int64{-1, 0} {
		for _, lsn := range []uint64{0, 2, 8, 12, 16, 20} {
			for _, torn := range []bool{false, true} {
				for budget := 0; ; budget++ {
					name := fmt.Sprintf("prealloc=%d/lsn=%d/torn=%v/budget=%d", prealloc, lsn, torn, budget)
					m, l, opts, old := buildTruncLog(t, prealloc)
					mustNoErr(t, l.TruncateAfter(20)) // 10 entries, durable
					old = old[:10]
					more := []Entry{mkEntry(21, 22, 50), mkEntry(23, 23, 50)} // not synced
					mustNoErr(t, l.Append(more...))
					old = append(old, more...)
					calls, crashed := 0, false
					m.InjectError(func(vfs.Op, string) error {
						if crashed {
							return vfs.ErrInjected
						}
						if calls == budget {
							crashed = true
							if torn {
								m.CrashTorn(uint64(budget))
							} else {
								m.Crash()
							}
							return vfs.ErrInjected
						}
						calls++
						return nil
					})
					err := l.TruncateAfter(lsn)
					m.InjectError(nil)
					if !crashed {
						mustNoErr(t, err)
						if budget < 3 {
							t.Fatalf("%s: TruncateAfter made only %d filesystem calls", name, budget)
						}
						_ = l.Close()
						break
					}
					if err == nil {
						t.Fatalf("%s: TruncateAfter hit a crash but reported success", name)
					}
					_ = l.Close()
					l, err = Open(opts)
					if err != nil {
						t.Fatalf("%s: reopen: %v", name, err)
					}
					got := readAll(t, l)
					if err := diffEntries(got, old[:len(got)]); err != nil {
						t.Fatalf("%s: not a prefix of the old log: %v", name, err)
					}
					if l.LastLSN() < lsn {
						t.Fatalf("%s: LastLSN %d, lost entries up to %d", name, l.LastLSN(), lsn)
					}
					// Finishing the job after the crash gives the intended log.
					mustNoErr(t, l.TruncateAfter(lsn))
					checkEntries(t, readAll(t, l), old[:lsn/2])
					mustNoErr(t, l.Close())
				}
			}
		}
	}
}

func TestTruncateAfterReaders(t *testing.T) {
	_, l, _, old := buildTruncLog(t, 0)
	defer l.Close()
	ctx := context.Background()
	// Readers that have read up to LSN n (so their next LSN is n+1).
	readTo := func(durable bool, n uint64) *Reader {
		t.Helper()
		r, err := l.NewReader(1, durable)
		mustNoErr(t, err)
		for n > 0 {
			e, err := r.Next(ctx)
			mustNoErr(t, err)
			if e.LastLSN == n {
				break
			}
		}
		return r
	}
	mustNoErr(t, l.Sync())
	beyond := readTo(false, 20)
	durableBeyond := readTo(true, 24)
	atCut := readTo(false, 12) // has read ahead past the cut
	before := readTo(false, 4)
	unread, err := l.NewReader(15, false) // asked for a removed LSN
	mustNoErr(t, err)
	tail, err := l.NewReader(25, false)
	mustNoErr(t, err)
	tailCh := goNext(ctx, tail) // blocked at the old end
	for _, r := range []*Reader{beyond, durableBeyond, atCut, before, unread, tail} {
		defer r.Close()
	}

	mustNoErr(t, l.TruncateAfter(12))
	wantErr(t, (<-tailCh).err, ErrTruncated)
	for i, r := range []*Reader{beyond, durableBeyond, unread} {
		_, err := r.Next(ctx)
		wantErr(t, err, ErrTruncated)
		if _, err := r.Next(ctx); !errors.Is(err, ErrTruncated) {
			t.Fatalf("reader %d: ErrTruncated is not sticky: %v", i, err)
		}
	}
	_, err = l.NewReader(15, false)
	wantErr(t, err, ErrFuture)

	// New entries reuse the removed LSNs with other data. Readers at or
	// before the cut read on into them; so does a reader created now.
	fresh := []Entry{mkEntry(13, 13, 5), mkEntry(14, 16, 500), mkEntry(17, 17, 5)}
	mustNoErr(t, l.Append(fresh...))
	now, err := l.NewReader(13, false)
	mustNoErr(t, err)
	defer now.Close()
	for name, c := range map[string]struct {
		r    *Reader
		want []Entry
	}{
		"at the cut":     {atCut, fresh},
		"before the cut": {before, append(old[2:6:6], fresh...)},
		"created after":  {now, fresh},
	} {
		var got []Entry
		for range c.want {
			e, err := c.r.Next(ctx)
			if err != nil {
				t.Fatalf("reader %s: %v", name, err)
			}
			got = append(got, e)
		}
		if err := diffEntries(got, c.want); err != nil {
			t.Fatalf("reader %s: %v", name, err)
		}
	}
	// A tailing reader created after the cut sees the next append.
	tail2, err := l.NewReader(18, false)
	mustNoErr(t, err)
	defer tail2.Close()
	ch := goNext(ctx, tail2)
	e := mkEntry(18, 18, 9)
	mustNoErr(t, l.Append(e))
	res := <-ch
	mustNoErr(t, res.err)
	if !sameEntry(res.e, e) {
		t.Fatalf("tailing reader got %d..%d", res.e.FirstLSN, res.e.LastLSN)
	}
}

// TestTruncateAfterConcurrentReaders runs readers while the writer appends
// and cuts the log (for the race detector), and checks that no Next that
// starts after a TruncateAfter returned hands out an entry it removed.
// Every entry's data names the epoch (number of cuts before it) it was
// written in.
func TestTruncateAfterConcurrentReaders(t *testing.T) {
	m := vfs.NewMem()
	l := openMem(t, m, 2048)
	defer l.Close()
	type cut struct{ epoch, lsn uint64 }
	var (
		mu    sync.Mutex
		cuts  []cut // cuts[i] ended epoch i
		epoch atomic.Uint64
	)
	entry := func(first, last uint64, size int) Entry {
		d := make([]byte, 8+size)
		copy(d, strconv.AppendUint(nil, epoch.Load(), 10))
		return Entry{FirstLSN: first, LastLSN: last, Data: d}
	}
	entryEpoch := func(e Entry) uint64 {
		v, err := strconv.ParseUint(strings.TrimRight(string(e.Data[:8]), "\x00"), 10, 64)
		if err != nil {
			t.Errorf("bad entry data: %v", err)
		}
		return v
	}
	// removedBy reports whether a cut in epochs (from, to] removed e.
	removedBy := func(e Entry, from, to uint64) bool {
		mu.Lock()
		defer mu.Unlock()
		for _, c := range cuts {
			if c.epoch >= from && c.epoch < to && e.LastLSN > c.lsn {
				return true
			}
		}
		return false
	}
	mustNoErr(t, l.Append(entry(1, 1, 10)))

	done := make(chan struct{})
	var wg sync.WaitGroup
	errs := make(chan error, 4)
	for range 3 {
		wg.Go(func() {
			ctx := context.Background()
			r, err := l.NewReader(1, false)
			if err != nil {
				errs <- err
				return
			}
			defer func() { r.Close() }()
			for {
				select {
				case <-done:
					return
				default:
				}
				started := epoch.Load()
				cctx, cancel := context.WithCancel(ctx)
				cancel()
				e, err := r.Next(cctx)
				switch {
				case errors.Is(err, context.Canceled):
					continue
				case errors.Is(err, ErrTruncated) || errors.Is(err, ErrCompacted):
					r.Close()
					if r, err = l.NewReader(l.FirstLSN(), false); err != nil {
						errs <- err
						return
					}
					continue
				case err != nil:
					errs <- err
					return
				}
				if ep := entryEpoch(e); ep < started && removedBy(e, ep, started) {
					errs <- fmt.Errorf("reader returned LSN %d..%d of epoch %d, removed before Next started in epoch %d", e.FirstLSN, e.LastLSN, ep, started)
					return
				}
			}
		})
	}
	rng := rand.New(rand.NewPCG(3, 4))
	var ends []uint64 // entry ends, for picking cut points
	ends = append(ends, 1)
	for range 2000 {
		if rng.IntN(10) == 0 && len(ends) > 1 {
			i := rng.IntN(len(ends))
			lsn := ends[i]
			mustNoErr(t, l.TruncateAfter(lsn))
			ends = ends[:i+1]
			mu.Lock()
			cuts = append(cuts, cut{epoch.Load(), lsn})
			mu.Unlock()
			epoch.Add(1)
			continue
		}
		next := l.LastLSN() + 1
		span := uint64(rng.IntN(3))
		mustNoErr(t, l.Append(entry(next, next+span, rng.IntN(300))))
		ends = append(ends, next+span)
		if rng.IntN(5) == 0 {
			mustNoErr(t, l.Sync())
		}
	}
	close(done)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

// TestFirstReadableLSN: a log that holds no entry yet — new, or Reset to
// start after a snapshot, as a restored data directory's — can still be
// read from the LSN its next entry will have, and a reader placed there
// gets that entry. FirstLSN is 0 there, and a reader from FirstLSN (or 1)
// is refused: how a primary on a restored directory failed to ship to an
// empty log store.
func TestFirstReadableLSN(t *testing.T) {
	l := openMem(t, vfs.NewMem(), 0)
	defer l.Close()
	if got := l.FirstReadableLSN(); got != 1 {
		t.Fatalf("new log: FirstReadableLSN %d, want 1", got)
	}
	mustNoErr(t, l.Reset(9))
	if l.FirstLSN() != 0 {
		t.Fatalf("after Reset(9): FirstLSN %d, want 0", l.FirstLSN())
	}
	if got := l.FirstReadableLSN(); got != 9 {
		t.Fatalf("after Reset(9): FirstReadableLSN %d, want 9", got)
	}
	_, err := l.NewReader(1, false)
	wantErr(t, err, ErrCompacted)
	r, err := l.NewReader(l.FirstReadableLSN(), false)
	mustNoErr(t, err)
	defer r.Close()
	mustNoErr(t, l.Append(mkEntry(9, 10, 8)))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	e, err := r.Next(ctx)
	mustNoErr(t, err)
	if e.FirstLSN != 9 || e.LastLSN != 10 {
		t.Fatalf("the reader got LSNs %d..%d, want 9..10", e.FirstLSN, e.LastLSN)
	}
	if got := l.FirstReadableLSN(); got != 9 || l.FirstLSN() != 9 {
		t.Fatalf("with entries: FirstReadableLSN %d, FirstLSN %d, want 9 and 9", got, l.FirstLSN())
	}
}
