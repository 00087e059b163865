package wal

import (
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"testing"

	"github.com/walship/walship/internal/vfs"
)

// crashModel is what the property test knows about the log: model holds the
// entries the log may contain, oldest first; the first durable of them must
// survive any crash.
type crashModel struct {
	model   []Entry
	durable int
}

// TestCrashProperty drives random appends, syncs, truncations (before and
// after an LSN), resets, faults and crashes (clean and mid-operation, with
// torn writes) through the in-memory filesystem, with and without
// preallocation (chunks smaller than, or as large as, the segment), and
// checks after every recovery that:
//   - every entry synced before the crash is there;
//   - what survives is a contiguous run of what was appended, byte-identical,
//     starting at the oldest entry kept;
//   - a failed write or sync is sticky.
func TestCrashProperty(t *testing.T) {
	seeds := 200
	if testing.Short() {
		seeds = 50
	}
	for _, prealloc := range []bool{false, true} {
		t.Run(fmt.Sprintf("prealloc=%v", prealloc), func(t *testing.T) {
			var cs crashStats
			for seed := range uint64(seeds) {
				if err := crashRun(seed, 150, prealloc, &cs); err != nil {
					t.Fatalf("seed %d: %v", seed, err)
				}
			}
			t.Logf("%+v", cs)
			// The runs must have covered what they claim to. (Without
			// preallocation, zero tails come from torn appends whose new
			// size reached the disk but whose data did not.)
			if cs.torn == 0 || cs.truncatedAfter == 0 || cs.zeroTails == 0 {
				t.Fatalf("coverage: %+v", cs)
			}
		})
	}
}

// crashStats counts what the crash runs went through.
type crashStats struct {
	recoveries     int // reopens after a crash
	torn           int // of which cut a torn tail
	zeroTails      int // of which ended the newest segment on a zero-filled tail
	truncatedAfter int // successful TruncateAfter calls that removed entries
}

func crashRun(seed uint64, steps int, prealloc bool, cs *crashStats) (err error) {
	rng := rand.New(rand.NewPCG(seed, 42))
	m := vfs.NewMem()
	segSize := int64(200 + rng.IntN(2000))
	chunk := int64(-1)
	if prealloc {
		chunk = 0 // the whole segment
		if rng.IntN(3) > 0 {
			chunk = int64(16 + rng.IntN(int(segSize)))
		}
	}
	open := func() (*Log, error) {
		return Open(Options{Dir: testDir, FS: m, SegmentSize: segSize, Preallocate: chunk})
	}
	l, err := open()
	if err != nil {
		return err
	}
	defer func() {
		if l != nil {
			_ = l.Close()
		}
	}()
	var cm crashModel
	nextFresh := uint64(1 + rng.IntN(1000)) // first LSN of an unanchored log

	nextLSN := func() uint64 {
		if l.Segments() == 0 {
			return nextFresh
		}
		return l.LastLSN() + 1
	}

	// recoverLog simulates the crash (already done to m) and checks the
	// recovered log. skipOK allows the log to start later than the model
	// (a TruncateBefore was interrupted); resetLSN != 0 allows the log to
	// be the result of an interrupted Reset(resetLSN).
	recoverLog := func(step int, skipOK bool, resetLSN uint64) error {
		_ = l.Close() // the old handles are stale; this only releases them
		m.InjectError(nil)
		m.InjectWriteError(nil)
		m.InjectSyncError(nil)
		var err error
		if l, err = open(); err != nil {
			return fmt.Errorf("step %d: reopen: %w", step, err)
		}
		cs.recoveries++
		if l.Recovery().TornSegment != "" {
			cs.torn++
		}
		if s := l.activeSeg(); s != nil && s.allocated > s.written {
			cs.zeroTails++
		}
		got, err := readAllErr(l)
		if err != nil {
			return fmt.Errorf("step %d: read: %w", step, err)
		}
		if resetLSN != 0 && len(got) == 0 && l.Segments() == 1 && l.LastLSN() == resetLSN-1 {
			cm = crashModel{}
			return nil
		}
		k := 0
		if len(got) > 0 {
			for k < len(cm.model) && cm.model[k].FirstLSN != got[0].FirstLSN {
				k++
			}
			if k > 0 && !skipOK {
				return fmt.Errorf("step %d: log starts at LSN %d, want %s", step, got[0].FirstLSN, span(cm.model))
			}
		}
		if k+len(got) > len(cm.model) {
			return fmt.Errorf("step %d: recovered %s, more than appended %s", step, span(got), span(cm.model))
		}
		if err := diffEntries(got, cm.model[k:k+len(got)]); err != nil {
			return fmt.Errorf("step %d: recovered entries differ: %w", step, err)
		}
		if k+len(got) < cm.durable {
			return fmt.Errorf("step %d: recovered %s, lost synced entries of %s (durable %d)", step, span(got), span(cm.model), cm.durable)
		}
		if l.DurableLSN() != l.LastLSN() {
			return fmt.Errorf("step %d: after Open DurableLSN %d != LastLSN %d", step, l.DurableLSN(), l.LastLSN())
		}
		cm.model = got
		cm.durable = len(got)
		return nil
	}

	// truncateAfterPoint picks an LSN TruncateAfter accepts: the end of an
	// entry of the model, or the LSN before its first entry (index -1).
	truncateAfterPoint := func() (lsn uint64, keep int) {
		i := rng.IntN(len(cm.model)+1) - 1
		if i < 0 {
			return cm.model[0].FirstLSN - 1, 0
		}
		return cm.model[i].LastLSN, i + 1
	}

	for step := range steps {
		switch r := rng.IntN(100); {
		case r < 41:
			es := randEntries(rng, nextLSN(), 1+rng.IntN(5), 300)
			if err := l.Append(es...); err != nil {
				return fmt.Errorf("step %d: append: %w", step, err)
			}
			cm.model = append(cm.model, es...)
		case r < 45:
			if len(cm.model) == 0 {
				continue
			}
			lsn, keep := truncateAfterPoint()
			if err := l.TruncateAfter(lsn); err != nil {
				return fmt.Errorf("step %d: truncate after %d: %w", step, lsn, err)
			}
			if keep < len(cm.model) {
				cs.truncatedAfter++
				cm.model = cm.model[:keep]
				cm.durable = keep // TruncateAfter syncs what it keeps
				if l.LastLSN() != lsn || l.DurableLSN() != lsn {
					return fmt.Errorf("step %d: after TruncateAfter(%d): LastLSN %d DurableLSN %d", step, lsn, l.LastLSN(), l.DurableLSN())
				}
			}
			got, err := readAllErr(l)
			if err == nil {
				err = diffEntries(got, cm.model)
			}
			if err != nil {
				return fmt.Errorf("step %d: after TruncateAfter(%d): %w", step, lsn, err)
			}
		case r < 62:
			if err := l.Sync(); err != nil {
				return fmt.Errorf("step %d: sync: %w", step, err)
			}
			cm.durable = len(cm.model)
			if l.DurableLSN() != l.LastLSN() {
				return fmt.Errorf("step %d: DurableLSN %d != LastLSN %d after Sync", step, l.DurableLSN(), l.LastLSN())
			}
		case r < 67:
			if len(cm.model) == 0 {
				continue
			}
			lsn := cm.model[rng.IntN(len(cm.model))].LastLSN
			if _, err := l.TruncateBefore(lsn); err != nil {
				return fmt.Errorf("step %d: truncate: %w", step, err)
			}
			first := l.FirstLSN()
			for len(cm.model) > 0 && cm.model[0].FirstLSN < first {
				cm.model = cm.model[1:]
				cm.durable = max(0, cm.durable-1)
			}
		case r < 69:
			n := nextLSN() + uint64(rng.IntN(100))
			if err := l.Reset(n); err != nil {
				return fmt.Errorf("step %d: reset: %w", step, err)
			}
			cm = crashModel{}
			if l.LastLSN() != n-1 || l.FirstLSN() != 0 {
				return fmt.Errorf("step %d: after Reset(%d): LastLSN %d FirstLSN %d", step, n, l.LastLSN(), l.FirstLSN())
			}
		case r < 78:
			if err := crashFault(rng, m, l, &cm, nextLSN()); err != nil {
				return fmt.Errorf("step %d: %w", step, err)
			}
			m.CrashTorn(rng.Uint64())
			if err := recoverLog(step, false, 0); err != nil {
				return err
			}
		case r < 88:
			// Crash in the middle of an operation: after a random number of
			// filesystem calls the machine "dies" and every later call fails.
			budget := rng.IntN(8)
			crashed := false
			crashSeed := rng.Uint64()
			m.InjectError(func(op vfs.Op, name string) error {
				if crashed {
					return vfs.ErrInjected
				}
				if budget == 0 {
					crashed = true
					m.CrashTorn(crashSeed)
					return vfs.ErrInjected
				}
				budget--
				return nil
			})
			skipOK, resetLSN := false, uint64(0)
			switch rng.IntN(4) {
			case 0, 1:
				es := randEntries(rng, nextLSN(), 1+rng.IntN(8), 300)
				err = l.Append(es...)
				cm.model = append(cm.model, es...)
			case 2:
				if err = l.Sync(); err == nil {
					cm.durable = len(cm.model)
				}
			case 3:
				switch k := rng.IntN(3); {
				case k == 0 && len(cm.model) > 0:
					skipOK = true
					_, err = l.TruncateBefore(cm.model[rng.IntN(len(cm.model))].LastLSN)
				case k == 1 && len(cm.model) > 0:
					// Whatever happens, what survives is a prefix holding at
					// least the durable entries up to the cut.
					// (A no-op when it keeps everything.)
					lsn, keep := truncateAfterPoint()
					cm.durable = min(cm.durable, keep)
					if err = l.TruncateAfter(lsn); err == nil && keep < len(cm.model) {
						cm.model = cm.model[:keep]
						cm.durable = keep
					}
				default:
					resetLSN = nextLSN() + uint64(rng.IntN(100))
					err = l.Reset(resetLSN)
				}
			}
			if !crashed {
				m.CrashTorn(crashSeed) // the operation finished first
			} else if err == nil {
				return fmt.Errorf("step %d: operation hit a crash but reported success", step)
			}
			if err := recoverLog(step, skipOK, resetLSN); err != nil {
				return err
			}
		default:
			m.CrashTorn(rng.Uint64())
			if err := recoverLog(step, false, 0); err != nil {
				return err
			}
		}
	}
	return nil
}

// crashFault injects one write or sync failure and checks that it breaks the
// log for good.
func crashFault(rng *rand.Rand, m *vfs.MemFS, l *Log, cm *crashModel, next uint64) error {
	es := randEntries(rng, next, 1+rng.IntN(5), 300)
	var err error
	var want error
	switch rng.IntN(3) {
	case 0: // fsync fails
		if err := l.Append(es...); err != nil {
			return fmt.Errorf("append before failing sync: %w", err)
		}
		cm.model = append(cm.model, es...)
		m.InjectSyncError(func(string) error { return vfs.ErrInjected })
		err, want = l.Sync(), vfs.ErrInjected
	case 1: // write fails part way
		m.InjectWriteError(func(_ string, _ int64, p []byte) (int, error) { return rng.IntN(len(p) + 1), vfs.ErrInjected })
		err, want = l.Append(es...), vfs.ErrInjected
		cm.model = append(cm.model, es...)
	case 2: // write is silently short
		m.InjectWriteError(func(_ string, _ int64, p []byte) (int, error) { return rng.IntN(len(p)), nil })
		err, want = l.Append(es...), io.ErrShortWrite
		cm.model = append(cm.model, es...)
	}
	if !errors.Is(err, want) || !errors.Is(err, ErrBroken) {
		return fmt.Errorf("faulted operation returned %v, want %v and ErrBroken", err, want)
	}
	m.InjectSyncError(nil)
	m.InjectWriteError(nil)
	// Sticky: nothing is retried, even though the fault is gone.
	if err2 := l.Sync(); !errors.Is(err2, want) || !errors.Is(err2, ErrBroken) {
		return fmt.Errorf("Sync after a failure returned %v, want the same error", err2)
	}
	if err2 := l.Append(mkEntry(l.LastLSN()+1, l.LastLSN()+1, 1)); !errors.Is(err2, ErrBroken) {
		return fmt.Errorf("Append after a failure returned %v, want ErrBroken", err2)
	}
	if err2 := l.TruncateAfter(0); !errors.Is(err2, ErrBroken) {
		return fmt.Errorf("TruncateAfter after a failure returned %v, want ErrBroken", err2)
	}
	return nil
}
