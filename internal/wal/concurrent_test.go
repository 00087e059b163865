package wal

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/walship/walship/internal/vfs"
)

// waitLSN waits until l's LastLSN reaches lsn, failing the test if that takes
// unreasonably long (a hang, not a performance assertion).
func waitLSN(t *testing.T, l *Log, lsn uint64) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := l.Wait(ctx, lsn, false); err != nil {
		t.Fatalf("waiting for LSN %d: %v", lsn, err)
	}
}

// TestSyncConcurrentWithAppend runs one appender and one syncer goroutine
// hammering a log with tiny segments (a rotation every few appends) and
// checks that every Sync makes durable at least what was appended before it
// was called, and that everything survives a crash after the last Sync.
func TestSyncConcurrentWithAppend(t *testing.T) {
	for _, prealloc := range []int64{-1, 0, 100} {
		t.Run(fmt.Sprintf("prealloc=%d", prealloc), func(t *testing.T) {
			m := vfs.NewMem()
			opts := Options{Dir: testDir, FS: m, SegmentSize: 400, Preallocate: prealloc}
			l, err := Open(opts)
			mustNoErr(t, err)
			rng := rand.New(rand.NewPCG(1, uint64(prealloc)))
			want := randEntries(rng, 1, 3000, 60)

			var appended atomic.Uint64 // LastLSN of the last Append that returned
			var stop atomic.Bool
			var wg sync.WaitGroup
			errs := make(chan error, 2)
			wg.Go(func() {
				defer stop.Store(true)
				for i := 0; i < len(want); {
					n := min(1+i%4, len(want)-i)
					if err := l.Append(want[i : i+n]...); err != nil {
						errs <- fmt.Errorf("append: %w", err)
						return
					}
					i += n
					appended.Store(want[i-1].LastLSN)
				}
			})
			syncs := 0
			wg.Go(func() {
				for !stop.Load() {
					before := appended.Load()
					if err := l.Sync(); err != nil {
						errs <- fmt.Errorf("sync: %w", err)
						return
					}
					syncs++
					if d := l.DurableLSN(); d < before {
						errs <- fmt.Errorf("Sync returned with DurableLSN %d, below LSN %d appended before it", d, before)
						return
					}
				}
			})
			wg.Wait()
			close(errs)
			for err := range errs {
				t.Fatal(err)
			}
			mustNoErr(t, l.Sync())
			if l.Segments() < 50 || syncs == 0 {
				t.Fatalf("%d segments, %d syncs: not the intended workload", l.Segments(), syncs)
			}
			m.Crash()
			_ = l.Close()
			l, err = Open(opts)
			mustNoErr(t, err)
			defer l.Close()
			checkEntries(t, readAll(t, l), want)
		})
	}
}

// TestSyncConcurrentCrash crashes the machine while an appender and a syncer
// run, and checks that every entry reported durable before the crash
// survives and that what survives is a prefix of what was appended.
func TestSyncConcurrentCrash(t *testing.T) {
	runs := 60
	if testing.Short() {
		runs = 15
	}
	for run := range runs {
		prealloc := []int64{-1, 0, 50}[run%3]
		m := vfs.NewMem()
		opts := Options{Dir: testDir, FS: m, SegmentSize: int64(300 + run*10), Preallocate: prealloc}
		l, err := Open(opts)
		mustNoErr(t, err)
		rng := rand.New(rand.NewPCG(uint64(run), 9))
		want := randEntries(rng, 1, 5000, 80)
		// The first segment exists before the race starts (creating one
		// after the crash would be the rebooted machine's doing).
		mustNoErr(t, l.Append(want[0]))
		mustNoErr(t, l.Sync())

		var stop atomic.Bool
		var wg sync.WaitGroup
		wg.Go(func() {
			defer stop.Store(true)
			for i := 1; i < len(want); i++ {
				if l.Append(want[i]) != nil {
					return // the crash broke the log
				}
			}
		})
		wg.Go(func() {
			for !stop.Load() {
				if l.Sync() != nil {
					return
				}
			}
		})
		// The machine dies: from now on every filesystem call fails, even
		// those that do not go through a handle the crash invalidated.
		var dead atomic.Bool
		m.InjectError(func(vfs.Op, string) error {
			if dead.Load() {
				return vfs.ErrInjected
			}
			return nil
		})
		waitLSN(t, l, want[100+rng.IntN(2000)].LastLSN)
		durable := l.DurableLSN()
		dead.Store(true)
		if run%2 == 0 {
			m.Crash()
		} else {
			m.CrashTorn(uint64(run))
		}
		wg.Wait()
		_ = l.Close()
		// The reboot: a name-based call that had passed the hook before the
		// crash may have created a file since, which was never made durable
		// (the directory syncs that could have are serialized with it in the
		// Log, and all fail after the crash).
		m.Crash()
		m.InjectError(nil)
		l, err = Open(opts)
		if err != nil {
			t.Fatalf("run %d: reopen: %v", run, err)
		}
		got := readAll(t, l)
		if err := diffEntries(got, want[:len(got)]); err != nil {
			t.Fatalf("run %d: survivors are not a prefix: %v", run, err)
		}
		if l.LastLSN() < durable {
			t.Fatalf("run %d: LastLSN %d after the crash, DurableLSN was %d", run, l.LastLSN(), durable)
		}
		mustNoErr(t, l.Close())
	}
}

// TestSyncFailureWhileAppending makes fsync fail while an appender and a
// syncer run: the log breaks for both, for good, with the first error.
func TestSyncFailureWhileAppending(t *testing.T) {
	m := vfs.NewMem()
	opts := Options{Dir: testDir, FS: m, SegmentSize: 1000}
	l, err := Open(opts)
	mustNoErr(t, err)
	var stop atomic.Bool
	var wg sync.WaitGroup
	var appendErr, syncErr error
	wg.Go(func() {
		defer stop.Store(true)
		for lsn := uint64(1); lsn < 1e6; lsn++ { // stops at the failure
			if appendErr = l.Append(mkEntry(lsn, lsn, 20)); appendErr != nil {
				return
			}
		}
	})
	wg.Go(func() {
		for !stop.Load() {
			if syncErr = l.Sync(); syncErr != nil {
				return
			}
		}
	})
	waitLSN(t, l, 500)
	durable := l.DurableLSN()
	m.InjectSyncError(func(string) error { return vfs.ErrInjected })
	wg.Wait()
	if !errors.Is(appendErr, ErrBroken) {
		t.Fatalf("Append returned %v, want ErrBroken", appendErr)
	}
	if syncErr != nil && !errors.Is(syncErr, ErrBroken) {
		t.Fatalf("Sync returned %v, want ErrBroken", syncErr)
	}
	m.InjectSyncError(nil)
	for _, err := range []error{l.Sync(), l.Append(mkEntry(l.LastLSN()+1, l.LastLSN()+1, 1)), l.TruncateAfter(1)} {
		if !errors.Is(err, ErrBroken) || !errors.Is(err, vfs.ErrInjected) {
			t.Fatalf("after the failure: %v, want the sticky injected sync error", err)
		}
	}
	m.Crash()
	_ = l.Close()
	l, err = Open(opts)
	mustNoErr(t, err)
	defer l.Close()
	got := readAll(t, l)
	if err := diffEntries(got, seqEntries(1, len(got), 20)); err != nil {
		t.Fatal(err)
	}
	if l.LastLSN() < durable {
		t.Fatalf("LastLSN %d after the crash, DurableLSN was %d", l.LastLSN(), durable)
	}
}

// TestSyncConcurrentWithWriterOps runs a syncer against a writer that
// appends, truncates at both ends, resets and finally closes the log (for
// the race detector and to check that those serialize with Sync).
func TestSyncConcurrentWithWriterOps(t *testing.T) {
	for _, prealloc := range []int64{-1, 0} {
		m := vfs.NewMem()
		opts := Options{Dir: testDir, FS: m, SegmentSize: 500, Preallocate: prealloc}
		l, err := Open(opts)
		mustNoErr(t, err)
		var stop atomic.Bool
		var wg sync.WaitGroup
		var syncErr error
		wg.Go(func() {
			for !stop.Load() {
				if err := l.Sync(); err != nil {
					if !errors.Is(err, ErrClosed) {
						syncErr = err
					}
					return
				}
			}
		})
		rng := rand.New(rand.NewPCG(5, 6))
		var model []Entry
		for range 3000 {
			switch r := rng.IntN(100); {
			case r < 80 || len(model) == 0:
				next := uint64(1)
				if l.Segments() > 0 {
					next = l.LastLSN() + 1
				}
				es := randEntries(rng, next, 1+rng.IntN(3), 100)
				mustNoErr(t, l.Append(es...))
				model = append(model, es...)
			case r < 88:
				_, err := l.TruncateBefore(model[rng.IntN(len(model))].FirstLSN)
				mustNoErr(t, err)
				for len(model) > 0 && model[0].FirstLSN < l.FirstLSN() {
					model = model[1:]
				}
			case r < 98:
				i := rng.IntN(len(model))
				mustNoErr(t, l.TruncateAfter(model[i].LastLSN))
				model = model[:i+1]
			default:
				mustNoErr(t, l.Reset(l.LastLSN()+10))
				model = nil
			}
		}
		mustNoErr(t, l.Close())
		stop.Store(true)
		wg.Wait()
		if syncErr != nil {
			t.Fatal(syncErr)
		}
		m.Crash()
		l, err = Open(opts)
		mustNoErr(t, err)
		checkEntries(t, readAll(t, l), model)
		mustNoErr(t, l.Close())
	}
}

// TestFailedSyncNotRetried fails one fsync, in a Sync that runs while an
// Append is under way, and checks that nothing fsyncs again, not even the
// rotation that Append goes on to, although the fault is gone: a retry could
// succeed for pages the kernel dropped and report them durable.
func TestFailedSyncNotRetried(t *testing.T) {
	m := vfs.NewMem()
	l := openMem(t, m, mxSegSize)
	defer l.Close()
	mustNoErr(t, l.Append(seqEntries(1, 2, mxData)...))
	mustNoErr(t, l.Sync())
	mustNoErr(t, l.Append(mkEntry(3, 3, mxData))) // not synced
	var failed, armed atomic.Bool
	m.InjectSyncError(func(string) error {
		if failed.CompareAndSwap(false, true) {
			return vfs.ErrInjected
		}
		return nil
	})
	var syncErr error
	armed.Store(true)
	m.InjectWriteError(func(_ string, _ int64, p []byte) (int, error) {
		if armed.CompareAndSwap(true, false) {
			syncErr = l.Sync() // "another goroutine", while Append writes LSN 4
		}
		return len(p), nil
	})
	// LSN 4 fills the segment; LSN 5 needs a rotation, which would sync.
	err := l.Append(mkEntry(4, 4, mxData), mkEntry(5, 5, mxData))
	m.InjectWriteError(nil)
	if !errors.Is(syncErr, ErrBroken) || !errors.Is(syncErr, vfs.ErrInjected) {
		t.Fatalf("Sync = %v, want the injected failure", syncErr)
	}
	if !errors.Is(err, ErrBroken) || !errors.Is(err, vfs.ErrInjected) {
		t.Fatalf("Append racing with the failed Sync = %v, want the sticky failure", err)
	}
	wantErr(t, l.Sync(), vfs.ErrInjected)
	if l.DurableLSN() != 2 || l.Stats().Syncs != 2 || l.Segments() != 1 {
		t.Fatalf("after the failure: DurableLSN %d, %d syncs, %d segments; want 2, 2 (a good and a failed one), 1", l.DurableLSN(), l.Stats().Syncs, l.Segments())
	}
}
