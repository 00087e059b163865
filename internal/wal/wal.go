package wal

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/walship/walship/internal/vfs"
)

// DefaultSegmentSize is the segment size used when Options.SegmentSize is 0.
const DefaultSegmentSize = 64 << 20

// Options configures Open.
type Options struct {
	// Dir is the directory holding the segment files. It is created if
	// missing and should hold nothing but this log.
	Dir string
	// FS is the filesystem; nil means vfs.OS.
	FS vfs.FS
	// SegmentSize is the size at which the active segment is closed and a
	// new one started; 0 means DefaultSegmentSize. An entry is never split,
	// so a segment holding a single large entry may be bigger.
	SegmentSize int64
	// Logger receives recovery and failure reports; nil discards them.
	Logger *slog.Logger
}

// Entry is one log record: an opaque payload, stored byte for byte, covering
// the LSNs FirstLSN..LastLSN inclusive.
type Entry struct {
	FirstLSN, LastLSN uint64
	Data              []byte
}

// RecoveryInfo reports what Open found and repaired.
type RecoveryInfo struct {
	Segments int    // segment files in use after recovery
	Entries  int64  // entries found
	FirstLSN uint64 // first LSN of the oldest entry; 0 if the log is empty
	LastLSN  uint64 // last LSN of the newest entry; 0 if the log is empty

	// TornSegment is the path of the segment whose torn tail was cut, or ""
	// if none was. TornOffset is where it was cut, TornBytes how many bytes
	// were removed, TornReason what was wrong with the first of them. A copy
	// of the removed bytes is kept in TornSegment + ".<offset>.torn".
	TornSegment string
	TornOffset  int64
	TornBytes   int64
	TornReason  string
	// RemovedSegment is the path of a newest segment that was deleted
	// because its header was never completely written.
	RemovedSegment string
	// ResetCompleted reports that an interrupted Reset was finished.
	ResetCompleted bool
}

// Stats are cumulative counters since Open, for metrics.
type Stats struct {
	Appends         uint64        // Append calls that wrote something
	EntriesAppended uint64        // entries written
	BytesWritten    uint64        // bytes written to segment files
	Syncs           uint64        // segment fdatasyncs
	SyncDuration    time.Duration // total time spent in segment fdatasyncs
	DirSyncs        uint64        // directory fsyncs
	SegmentsCreated uint64
	SegmentsRemoved uint64
	TornTruncations uint64 // torn tails cut by recovery (0 or 1 per Open)
	TornBytes       uint64 // bytes cut by recovery
}

type stats struct {
	appends, entries, bytes, syncs, syncNanos, dirSyncs, created, removed, torn, tornBytes atomic.Uint64
}

// segment is the in-memory state of one segment file. Fields after name are
// guarded by Log.mu.
type segment struct {
	firstLSN uint64
	name     string // base name

	lastLSN uint64       // firstLSN-1 when it holds no entry
	written int64        // bytes of header and complete frames
	durable int64        // prefix of written known to be synced
	sealed  bool         // no longer the active segment; written is final
	removed bool         // deleted by TruncateBefore or Reset
	index   []indexPoint // sparse LSN -> offset index

	nEntries int64 // entries found by recovery (not maintained by Append)
}

// Log is a segmented write-ahead log. It has a single writer: Append, Sync,
// Reset, TruncateBefore and Close must not be called concurrently with each
// other. Readers and the getters are safe to use concurrently with the
// writer.
type Log struct {
	fs      vfs.FS
	dir     string
	segSize int64
	logger  *slog.Logger

	mu         sync.RWMutex
	segs       []*segment
	anchored   bool   // the next LSN is known (there is a segment)
	lastLSN    uint64 // last LSN written; next Append starts at lastLSN+1
	durableLSN uint64
	size       int64
	closed     bool
	notify     chan struct{} // closed and replaced when the log changes
	closedCh   chan struct{}

	// Writer-only state.
	active   vfs.File
	buf      []byte
	broken   error
	dirDirty bool // a segment was created since the last SyncDir

	recovery RecoveryInfo
	st       stats
}

// Open opens the log in opts.Dir, creating the directory if needed, and
// recovers it: a torn write at the tail of the newest segment is cut off,
// and any other damage makes Open fail with a *CorruptionError.
func Open(opts Options) (*Log, error) {
	if opts.Dir == "" {
		return nil, errors.New("wal: Options.Dir is empty")
	}
	l := &Log{
		fs:       opts.FS,
		dir:      opts.Dir,
		segSize:  opts.SegmentSize,
		logger:   opts.Logger,
		notify:   make(chan struct{}),
		closedCh: make(chan struct{}),
	}
	if l.fs == nil {
		l.fs = vfs.OS
	}
	if l.segSize <= 0 {
		l.segSize = DefaultSegmentSize
	}
	if l.logger == nil {
		l.logger = slog.New(slog.DiscardHandler)
	}
	if err := l.fs.MkdirAll(l.dir, 0o755); err != nil {
		return nil, fmt.Errorf("wal: create dir: %w", err)
	}
	if err := l.recover(); err != nil {
		if l.active != nil {
			_ = l.active.Close()
		}
		return nil, err
	}
	return l, nil
}

func (l *Log) path(name string) string { return filepath.Join(l.dir, name) }

// Recovery reports what Open found and repaired.
func (l *Log) Recovery() RecoveryInfo { return l.recovery }

// LastLSN returns the last LSN written (synced or not); 0 if nothing was
// ever written. After Reset(n) it is n-1.
func (l *Log) LastLSN() uint64 {
	l.mu.RLock()
	defer l.mu.RUnlock()
	return l.lastLSN
}

// DurableLSN returns the last LSN known to be synced.
func (l *Log) DurableLSN() uint64 {
	l.mu.RLock()
	defer l.mu.RUnlock()
	return l.durableLSN
}

// FirstLSN returns the first LSN of the oldest entry kept, or 0 if the log
// holds no entries.
func (l *Log) FirstLSN() uint64 {
	l.mu.RLock()
	defer l.mu.RUnlock()
	if len(l.segs) == 0 || l.lastLSN < l.segs[0].firstLSN {
		return 0
	}
	return l.segs[0].firstLSN
}

// Size returns the bytes the segment files occupy.
func (l *Log) Size() int64 {
	l.mu.RLock()
	defer l.mu.RUnlock()
	return l.size
}

// Segments returns the number of segment files.
func (l *Log) Segments() int {
	l.mu.RLock()
	defer l.mu.RUnlock()
	return len(l.segs)
}

// Stats returns cumulative counters since Open.
func (l *Log) Stats() Stats {
	return Stats{
		Appends:         l.st.appends.Load(),
		EntriesAppended: l.st.entries.Load(),
		BytesWritten:    l.st.bytes.Load(),
		Syncs:           l.st.syncs.Load(),
		SyncDuration:    time.Duration(l.st.syncNanos.Load()),
		DirSyncs:        l.st.dirSyncs.Load(),
		SegmentsCreated: l.st.created.Load(),
		SegmentsRemoved: l.st.removed.Load(),
		TornTruncations: l.st.torn.Load(),
		TornBytes:       l.st.tornBytes.Load(),
	}
}

// changedLocked wakes every waiter. Callers hold mu for writing.
func (l *Log) changedLocked() {
	close(l.notify)
	l.notify = make(chan struct{})
}

// fail makes the log broken: the on-disk state after a failed write or sync
// is unknown, and retrying a failed fsync can report success for data the
// kernel already dropped, so every later write returns this error.
func (l *Log) fail(err error) error {
	l.broken = fmt.Errorf("%w: %w", ErrBroken, err)
	l.logger.Error("wal: log broken", "dir", l.dir, "err", err)
	return l.broken
}

func (l *Log) checkWritable() error {
	if l.broken != nil {
		return l.broken
	}
	l.mu.RLock()
	closed := l.closed
	l.mu.RUnlock()
	if closed {
		return ErrClosed
	}
	return nil
}

func (l *Log) activeSeg() *segment {
	if len(l.segs) == 0 {
		return nil
	}
	return l.segs[len(l.segs)-1]
}

// Append writes entries at the end of the log without syncing them. The
// first must start at LastLSN()+1 (any LSN >= 1 if the log has never held a
// segment) and each must start right after the previous one. Entries that fit
// in the active segment are written with a single write call. A write error
// breaks the log (see ErrBroken).
func (l *Log) Append(entries ...Entry) error {
	if len(entries) == 0 {
		return nil
	}
	if err := l.checkWritable(); err != nil {
		return err
	}
	next := l.lastLSN + 1
	for i := range entries {
		e := &entries[i]
		switch {
		case e.FirstLSN == 0 || e.LastLSN < e.FirstLSN || e.LastLSN == math.MaxUint64:
			return fmt.Errorf("wal: append: entry %d has invalid LSN range %d..%d", i, e.FirstLSN, e.LastLSN)
		case len(e.Data) > MaxEntrySize:
			return fmt.Errorf("wal: append: entry %d is %d bytes, more than MaxEntrySize", i, len(e.Data))
		case (i > 0 || l.anchored) && e.FirstLSN != next:
			return fmt.Errorf("wal: append: entry %d starts at LSN %d, want %d: %w", i, e.FirstLSN, next, ErrNotContiguous)
		}
		next = e.LastLSN + 1
	}

	for i := 0; i < len(entries); {
		seg := l.activeSeg()
		switch {
		case seg == nil:
			if err := l.createSegment(entries[i].FirstLSN); err != nil {
				return err
			}
		case seg.lastLSN >= seg.firstLSN && seg.written+frameSize(&entries[i]) > l.segSize:
			if err := l.rotate(entries[i].FirstLSN); err != nil {
				return err
			}
		}
		seg = l.activeSeg()

		// Frame as many entries as fit into one buffer and one write. The
		// first always goes in: a segment holds at least one entry.
		l.buf = l.buf[:0]
		var points []indexPoint
		lastIndexed := int64(-indexInterval)
		if n := len(seg.index); n > 0 {
			lastIndexed = seg.index[n-1].off
		}
		j := i
		for ; j < len(entries); j++ {
			e := &entries[j]
			off := seg.written + int64(len(l.buf))
			if j > i && off+frameSize(e) > l.segSize {
				break
			}
			if off-lastIndexed >= indexInterval {
				points = append(points, indexPoint{lsn: e.FirstLSN, off: off})
				lastIndexed = off
			}
			l.buf = appendFrame(l.buf, e)
		}
		n, err := l.active.Write(l.buf)
		l.st.bytes.Add(uint64(max(n, 0)))
		if err == nil && n != len(l.buf) {
			err = io.ErrShortWrite
		}
		if err != nil {
			return l.fail(fmt.Errorf("write segment %s: %w", seg.name, err))
		}
		l.st.appends.Add(1)
		l.st.entries.Add(uint64(j - i))

		l.mu.Lock()
		seg.written += int64(n)
		seg.lastLSN = entries[j-1].LastLSN
		seg.index = append(seg.index, points...)
		l.size += int64(n)
		l.lastLSN = seg.lastLSN
		l.changedLocked()
		l.mu.Unlock()
		i = j
	}
	return nil
}

// createSegment starts a new, empty active segment for entries from
// firstLSN. Its directory entry is synced by the next Sync.
func (l *Log) createSegment(firstLSN uint64) error {
	name := segmentName(firstLSN)
	f, err := l.fs.OpenFile(l.path(name), os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o644)
	if err != nil {
		return l.fail(fmt.Errorf("create segment %s: %w", name, err))
	}
	hdr := appendHeader(nil, firstLSN)
	n, err := f.Write(hdr)
	l.st.bytes.Add(uint64(max(n, 0)))
	if err == nil && n != len(hdr) {
		err = io.ErrShortWrite
	}
	if err != nil {
		_ = f.Close()
		return l.fail(fmt.Errorf("write segment header %s: %w", name, err))
	}
	l.active = f
	l.dirDirty = true
	l.st.created.Add(1)
	l.mu.Lock()
	l.segs = append(l.segs, &segment{firstLSN: firstLSN, name: name, lastLSN: firstLSN - 1, written: headerSize})
	l.size += headerSize
	l.anchored = true
	l.lastLSN = firstLSN - 1 // a no-op unless the log was empty and unanchored
	if l.durableLSN < l.lastLSN && len(l.segs) == 1 {
		// A fresh log starting at firstLSN has nothing below it to lose.
		l.durableLSN = l.lastLSN
	}
	l.changedLocked()
	l.mu.Unlock()
	return nil
}

// rotate seals the active segment and starts a new one. The sealed segment
// is synced first: then only the newest segment can ever have a torn tail,
// which is what lets recovery treat damage anywhere else as corruption.
func (l *Log) rotate(firstLSN uint64) error {
	if err := l.syncActive(); err != nil {
		return err
	}
	seg := l.activeSeg()
	if err := l.active.Close(); err != nil {
		return l.fail(fmt.Errorf("close segment %s: %w", seg.name, err))
	}
	l.active = nil
	l.mu.Lock()
	seg.sealed = true
	l.changedLocked()
	l.mu.Unlock()
	return l.createSegment(firstLSN)
}

// Sync makes everything appended so far durable: an fdatasync of the active
// segment, plus a directory fsync if a segment was created since the last
// one. A failure breaks the log (see ErrBroken).
func (l *Log) Sync() error {
	if err := l.checkWritable(); err != nil {
		return err
	}
	return l.syncActive()
}

func (l *Log) syncActive() error {
	seg := l.activeSeg()
	if seg == nil {
		return nil
	}
	written, last := seg.written, l.lastLSN // stable: only the writer changes them
	if seg.durable < written {
		start := time.Now()
		err := l.active.Sync()
		l.st.syncs.Add(1)
		l.st.syncNanos.Add(uint64(time.Since(start)))
		if err != nil {
			return l.fail(fmt.Errorf("sync segment %s: %w", seg.name, err))
		}
	}
	if l.dirDirty {
		if err := l.syncDir(); err != nil {
			return l.fail(err)
		}
		l.dirDirty = false
	}
	l.mu.Lock()
	if seg.durable != written || l.durableLSN != last {
		seg.durable = written
		l.durableLSN = last
		l.changedLocked()
	}
	l.mu.Unlock()
	return nil
}

func (l *Log) syncDir() error {
	l.st.dirSyncs.Add(1)
	if err := l.fs.SyncDir(l.dir); err != nil {
		return fmt.Errorf("sync dir %s: %w", l.dir, err)
	}
	return nil
}

// TruncateBefore removes, oldest first, every segment other than the active
// one whose entries all end before lsn, and returns how many it removed.
// If it removes anything it first syncs the log, so the entries it keeps
// cannot be lost to a crash. Readers still positioned in a removed segment
// get ErrCompacted.
func (l *Log) TruncateBefore(lsn uint64) (removed int, err error) {
	if err := l.checkWritable(); err != nil {
		return 0, err
	}
	for {
		l.mu.RLock()
		ok := len(l.segs) > 1 && l.segs[1].firstLSN <= lsn
		var seg *segment
		if ok {
			seg = l.segs[0]
		}
		l.mu.RUnlock()
		if !ok {
			return removed, nil
		}
		if removed == 0 {
			// Make the segments that stay durable first, the active one's
			// header and directory entry included. Otherwise a crash right
			// after the removal could leave nothing recoverable, and the log
			// would forget where it ends.
			if err := l.syncActive(); err != nil {
				return 0, err
			}
		}
		if err := l.fs.Remove(l.path(seg.name)); err != nil {
			return removed, fmt.Errorf("wal: remove segment %s: %w", seg.name, err)
		}
		l.st.removed.Add(1)
		l.mu.Lock()
		l.segs = l.segs[1:]
		seg.removed = true
		l.size -= seg.written
		l.changedLocked()
		l.mu.Unlock()
		removed++
		// Sync after each removal, not once at the end: if a crash persisted
		// a later removal but not an earlier one, the log would have a hole.
		if err := l.syncDir(); err != nil {
			return removed, fmt.Errorf("wal: %w", err)
		}
	}
}

// Reset discards every entry and restarts the log empty, so that the next
// Append must start at nextLSN (used when a replica is re-seeded from a
// snapshot). It is atomic across crashes: a marker segment is made durable
// first, and Open finishes an interrupted Reset when it finds one. Readers
// get ErrCompacted.
func (l *Log) Reset(nextLSN uint64) error {
	if err := l.checkWritable(); err != nil {
		return err
	}
	if nextLSN == 0 || nextLSN == math.MaxUint64 {
		return fmt.Errorf("wal: reset: invalid next LSN %d", nextLSN)
	}
	marker := resetName(nextLSN)
	f, err := l.fs.OpenFile(l.path(marker), os.O_RDWR|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		return l.fail(fmt.Errorf("reset: create %s: %w", marker, err))
	}
	hdr := appendHeader(nil, nextLSN)
	if n, err := f.Write(hdr); err != nil || n != len(hdr) {
		_ = f.Close()
		return l.fail(fmt.Errorf("reset: write %s: %w", marker, errors.Join(err, io.ErrShortWrite)))
	}
	if err := f.Sync(); err != nil {
		_ = f.Close()
		return l.fail(fmt.Errorf("reset: sync %s: %w", marker, err))
	}
	if err := l.syncDir(); err != nil {
		_ = f.Close()
		return l.fail(fmt.Errorf("reset: %w", err))
	}
	// The reset is now committed; the rest is what Open would redo.
	if l.active != nil {
		_ = l.active.Close()
		l.active = nil
	}
	l.mu.Lock()
	old := l.segs
	l.segs = nil
	for _, s := range old {
		s.removed = true
	}
	l.size = 0
	l.changedLocked()
	l.mu.Unlock()
	for _, s := range old {
		if err := l.fs.Remove(l.path(s.name)); err != nil {
			_ = f.Close()
			return l.fail(fmt.Errorf("reset: remove segment %s: %w", s.name, err))
		}
		l.st.removed.Add(1)
	}
	if err := l.syncDir(); err != nil {
		_ = f.Close()
		return l.fail(fmt.Errorf("reset: %w", err))
	}
	name := segmentName(nextLSN)
	if err := l.fs.Rename(l.path(marker), l.path(name)); err != nil {
		_ = f.Close()
		return l.fail(fmt.Errorf("reset: rename %s: %w", marker, err))
	}
	if err := l.syncDir(); err != nil {
		_ = f.Close()
		return l.fail(fmt.Errorf("reset: %w", err))
	}
	l.active = f
	l.dirDirty = false
	l.st.created.Add(1)
	l.mu.Lock()
	l.segs = []*segment{{firstLSN: nextLSN, name: name, lastLSN: nextLSN - 1, written: headerSize, durable: headerSize}}
	l.size = headerSize
	l.anchored = true
	l.lastLSN = nextLSN - 1
	l.durableLSN = nextLSN - 1
	l.changedLocked()
	l.mu.Unlock()
	return nil
}

// Wait blocks until LastLSN() (or DurableLSN(), if durable) reaches lsn, ctx
// is done, or the log is closed.
func (l *Log) Wait(ctx context.Context, lsn uint64, durable bool) error {
	for {
		l.mu.RLock()
		have, ch, closed := l.lastLSN, l.notify, l.closed
		if durable {
			have = l.durableLSN
		}
		l.mu.RUnlock()
		switch {
		case have >= lsn:
			return nil
		case closed:
			return ErrClosed
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// Close syncs the log (unless it is broken) and closes it. Blocked readers
// return ErrClosed. It returns the sync's error, if any.
func (l *Log) Close() error {
	l.mu.RLock()
	closed := l.closed
	l.mu.RUnlock()
	if closed {
		return ErrClosed
	}
	var err error
	if l.broken == nil {
		err = l.syncActive()
	}
	if l.active != nil {
		if cerr := l.active.Close(); err == nil && cerr != nil {
			err = fmt.Errorf("wal: close: %w", cerr)
		}
		l.active = nil
	}
	l.mu.Lock()
	l.closed = true
	close(l.closedCh)
	l.changedLocked()
	l.mu.Unlock()
	return err
}
