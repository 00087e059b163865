package wal

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"math"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
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
	// Preallocate is the size of the zero-filled region kept ahead of the
	// write position in the active segment: when an Append would write past
	// it, the file is first extended by writing zeros up to the next multiple
	// of Preallocate (never past SegmentSize, unless a single oversized entry
	// needs it). Appends then overwrite blocks that are already allocated,
	// so most Syncs need no file size update, which makes fdatasync cheaper
	// (PostgreSQL zero-fills its WAL segments for the same reason). 0 means
	// DefaultPreallocate or SegmentSize, whichever is smaller; a negative
	// value disables preallocation.
	Preallocate int64
	// Logger receives recovery and failure reports; nil discards them.
	Logger *slog.Logger
}

// DefaultPreallocate is the preallocation chunk used when
// Options.Preallocate is 0 (capped at the segment size).
const DefaultPreallocate = 4 << 20

// zeroBufSize bounds the buffer preallocation writes zeros from.
const zeroBufSize = 1 << 20

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
	// of debris were removed (up to the last non-zero byte: a zero-filled
	// remainder, left by preallocation, is removed too but not counted),
	// TornReason what was wrong with the first of them. A copy of the
	// TornBytes bytes is kept in TornSegment + ".<offset>.torn".
	//
	// A newest segment whose bytes after the last valid frame are all zeros
	// is not torn: that is the preallocated end of the log, kept as is.
	TornSegment string
	TornOffset  int64
	TornBytes   int64
	TornReason  string
	// RemovedSegment is the path of a newest segment that was deleted
	// because its header was never completely written.
	RemovedSegment string
	// ResetCompleted reports that an interrupted Reset was finished.
	ResetCompleted bool
	// UnsyncedCut is set when the log had failed to write or fsync its
	// segments before this Open: every entry after UnsyncedCutAfter, the
	// last LSN known durable then, up to UnsyncedLastLSN was cut, since
	// what a failed fsync left is unknown even where it can still be read.
	UnsyncedCut                       bool
	UnsyncedCutAfter, UnsyncedLastLSN uint64
}

// Stats are cumulative counters since Open, for metrics.
type Stats struct {
	Appends         uint64        // Append calls that wrote something
	EntriesAppended uint64        // entries written
	BytesWritten    uint64        // bytes of segment headers and frames written
	Preallocated    uint64        // zero bytes written to preallocate segments (not in BytesWritten)
	Syncs           uint64        // segment fdatasyncs
	SyncDuration    time.Duration // total time spent in segment fdatasyncs
	DirSyncs        uint64        // directory fsyncs
	SegmentsCreated uint64
	SegmentsRemoved uint64
	TornTruncations uint64 // torn tails cut by recovery (0 or 1 per Open)
	TornBytes       uint64 // bytes of debris cut by recovery (see RecoveryInfo.TornBytes)
}

type stats struct {
	appends, entries, bytes, prealloc, syncs, syncNanos, dirSyncs, created, removed, torn, tornBytes atomic.Uint64
}

// segment is the in-memory state of one segment file. Fields from lastLSN
// to index are guarded by Log.mu (the writer, which alone changes them, may
// read them without it).
type segment struct {
	firstLSN uint64
	name     string // base name

	lastLSN uint64       // firstLSN-1 when it holds no entry
	written int64        // bytes of header and complete frames
	durable int64        // prefix of written known to be synced
	sealed  bool         // no longer the active segment; written is final
	removed bool         // deleted by TruncateBefore, TruncateAfter or Reset
	index   []indexPoint // sparse LSN -> offset index

	// allocated is the file's size: written plus the zero-filled tail kept
	// ahead of it by preallocation. Only the writer uses it.
	allocated int64

	nEntries int64 // entries found by recovery (not maintained by Append)
}

// cutPoint records a TruncateAfter, for Readers created before it.
type cutPoint struct {
	gen uint64 // Log.truncGen after the cut
	lsn uint64 // the LSN the log was cut after
}

// Log is a segmented write-ahead log. It has a single writer: Append,
// Reset, TruncateBefore, TruncateAfter and Close must not be called
// concurrently with each other. Sync may be called concurrently with any of
// them (and with itself): a goroutine can Sync while another Appends, and the
// Sync makes durable at least every entry whose Append returned before the
// Sync was called. Sync serializes internally with segment rotation,
// TruncateBefore, TruncateAfter, Reset and Close. Readers, Wait and the
// getters are safe to use concurrently with all of these.
type Log struct {
	fs       vfs.FS
	dir      string
	segSize  int64
	prealloc int64 // preallocation chunk; 0 when disabled
	logger   *slog.Logger

	// syncMu serializes Sync with the operations that replace or shrink the
	// active segment (rotation, TruncateBefore, TruncateAfter, Reset, Close)
	// and guards active (which those change with it held) and dirDirty.
	// Lock order: syncMu, then mu.
	syncMu sync.Mutex

	mu         sync.RWMutex
	segs       []*segment
	anchored   bool   // the next LSN is known (there is a segment)
	lastLSN    uint64 // last LSN written; next Append starts at lastLSN+1
	durableLSN uint64
	size       int64
	closed     bool
	broken     error         // sticky: set by the first failed write or sync
	truncGen   atomic.Uint64 // TruncateAfter calls so far; changed with mu held
	cuts       []cutPoint    // one per TruncateAfter, oldest first
	notify     chan struct{} // closed and replaced when the log changes
	closedCh   chan struct{}

	active   vfs.File // the active segment; changed only with syncMu held
	dirDirty bool     // a segment was created since the last SyncDir; syncMu

	// Writer-only state.
	buf   []byte
	zeros []byte // preallocation's source of zeros

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
	switch {
	case opts.Preallocate == 0:
		l.prealloc = min(DefaultPreallocate, l.segSize)
	case opts.Preallocate > 0:
		l.prealloc = opts.Preallocate
	}
	if l.logger == nil {
		l.logger = slog.New(slog.DiscardHandler)
	}
	if err := l.fs.MkdirAll(l.dir, vfs.DirPerm); err != nil {
		return nil, fmt.Errorf("wal: create dir: %w", err)
	}
	if err := l.recover(); err != nil {
		if l.active != nil {
			_ = l.active.Close()
		}
		return nil, err
	}
	if err := l.cutUnsynced(); err != nil {
		_ = l.Close()
		return nil, err
	}
	return l, nil
}

// cutUnsynced finishes what failUnsynced recorded: it cuts every entry
// after the last LSN known durable when a write or fsync failed, then
// removes the record. Without a record it does nothing.
func (l *Log) cutUnsynced() error {
	path := l.path(unsyncedName)
	data, err := vfs.ReadFile(l.fs, path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("wal: read %s: %w", path, err)
	}
	durable, err := strconv.ParseUint(strings.TrimSpace(string(data)), 10, 64)
	if err != nil {
		return fmt.Errorf("wal: %s does not hold an LSN (%q): %w", path, data, err)
	}
	if last := l.LastLSN(); last > durable {
		if err := l.TruncateAfter(durable); err != nil {
			return fmt.Errorf("wal: cut the entries after LSN %d, the last durable before a failed write or fsync (%s): %w", durable, path, err)
		}
		l.recovery.UnsyncedCut = true
		l.recovery.UnsyncedCutAfter, l.recovery.UnsyncedLastLSN = durable, last
		l.recovery.LastLSN = l.LastLSN()
		l.logger.Warn("wal: cut the entries a failed write or fsync left", "dir", l.dir, "after_lsn", durable, "last_lsn_was", last)
	}
	if err := l.fs.Remove(path); err != nil {
		return fmt.Errorf("wal: remove %s: %w", path, err)
	}
	if err := l.syncDir(); err != nil {
		return fmt.Errorf("wal: %w", err)
	}
	return nil
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

// FirstReadableLSN returns the oldest LSN a Reader can start at: the
// first kept entry's, or, while the log holds no entry (a new log, one
// Reset to start after a snapshot), the LSN its next entry will have.
// Unlike FirstLSN followed by LastLSN, it reads both under one lock, so an
// entry appended in between is not skipped.
func (l *Log) FirstReadableLSN() uint64 {
	l.mu.RLock()
	defer l.mu.RUnlock()
	if len(l.segs) == 0 {
		return l.lastLSN + 1
	}
	return l.segs[0].firstLSN
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

// Size returns the bytes of segment headers and frames the log holds. The
// zero-filled tail that preallocation keeps ahead of the active segment's
// data is not counted.
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
		Preallocated:    l.st.prealloc.Load(),
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

// failUnsynced is fail for a failed write or fsync of the segments. The
// pages it left may still be in the page cache, readable, after the kernel
// dropped them from the write-back queue (PostgreSQL's "fsyncgate"): the
// next Open would read them and its own fdatasync would succeed. So it
// also records, best effort, the last LSN known durable (unsyncedName),
// and Open cuts everything after it. An entry past that LSN was never
// reported durable, so nobody counted on it.
func (l *Log) failUnsynced(err error) error {
	err, first, durable := l.breakLog(err)
	if first {
		if werr := vfs.WriteFileAtomic(l.fs, l.path(unsyncedName), []byte(strconv.FormatUint(durable, 10)+"\n")); werr != nil {
			l.logger.Error("wal: cannot record the last durable LSN after a failed write or fsync; the next Open will trust what it reads", "dir", l.dir, "durable_lsn", durable, "err", werr)
		}
	}
	return err
}

// fail makes the log broken: the on-disk state after a failed write or sync
// is unknown, and retrying a failed fsync can report success for data the
// kernel already dropped, so every later Append, Sync, Reset, TruncateBefore
// and TruncateAfter returns the first such error.
func (l *Log) fail(err error) error {
	err, _, _ = l.breakLog(err)
	return err
}

// breakLog is fail's work: it returns err wrapped in ErrBroken, whether it
// was the first failure, and the durable LSN at that moment.
func (l *Log) breakLog(err error) (wrapped error, first bool, durable uint64) {
	err = fmt.Errorf("%w: %w", ErrBroken, err)
	l.mu.Lock()
	if first = l.broken == nil; first {
		l.broken = err
		l.changedLocked() // wake Wait
	}
	durable = l.durableLSN
	l.mu.Unlock()
	l.logger.Error("wal: log broken", "dir", l.dir, "err", err)
	return err, first, durable
}

// Err returns the error that broke the log (a failed write or sync), or
// nil while it is healthy.
func (l *Log) Err() error { return l.brokenErr() }

// brokenErr returns the error that broke the log, or nil.
func (l *Log) brokenErr() error {
	l.mu.RLock()
	defer l.mu.RUnlock()
	return l.broken
}

func (l *Log) checkWritable() error {
	l.mu.RLock()
	defer l.mu.RUnlock()
	switch {
	case l.broken != nil:
		return l.broken
	case l.closed:
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
// in the active segment are written with a single write call (preceded, when
// they run past the preallocated region, by the write of a zeroed chunk). A
// write error breaks the log (see ErrBroken).
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
		if i > 0 {
			if err := l.brokenErr(); err != nil {
				return err // a concurrent Sync failed
			}
		}
		seg := l.activeSeg()
		switch {
		case seg == nil:
			l.syncMu.Lock()
			err := l.createSegment(entries[i].FirstLSN)
			l.syncMu.Unlock()
			if err != nil {
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
		if err := l.preallocate(seg, seg.written+int64(len(l.buf))); err != nil {
			return err
		}
		n, err := l.active.WriteAt(l.buf, seg.written)
		l.st.bytes.Add(uint64(max(n, 0)))
		if err == nil && n != len(l.buf) {
			err = io.ErrShortWrite
		}
		if err != nil {
			return l.failUnsynced(fmt.Errorf("write segment %s at offset %d: %w", seg.name, seg.written, err))
		}
		l.st.appends.Add(1)
		l.st.entries.Add(uint64(j - i))
		seg.allocated = max(seg.allocated, seg.written+int64(n))

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

// preallocate makes sure the active segment seg is zero-filled up to at
// least end, if preallocation is on: it writes zeros from the current end of
// the file to the next multiple of the chunk size, capped at the segment size
// (or at end, for an oversized entry). The size change reaches the disk with
// the next Sync, once per chunk rather than once per Sync.
func (l *Log) preallocate(seg *segment, end int64) error {
	if l.prealloc <= 0 || end <= seg.allocated {
		return nil
	}
	target := min((end+l.prealloc-1)/l.prealloc*l.prealloc, max(l.segSize, end))
	if l.zeros == nil {
		l.zeros = make([]byte, min(l.prealloc, zeroBufSize))
	}
	for off := seg.allocated; off < target; {
		chunk := l.zeros[:min(int64(len(l.zeros)), target-off)]
		n, err := l.active.WriteAt(chunk, off)
		l.st.prealloc.Add(uint64(max(n, 0)))
		if err == nil && n != len(chunk) {
			err = io.ErrShortWrite
		}
		if err != nil {
			return l.failUnsynced(fmt.Errorf("preallocate segment %s at offset %d: %w", seg.name, off, err))
		}
		off += int64(n)
		seg.allocated = off
	}
	return nil
}

// createSegment starts a new, empty active segment for entries from
// firstLSN. Its directory entry is synced by the next Sync. Callers hold
// syncMu.
func (l *Log) createSegment(firstLSN uint64) error {
	name := segmentName(firstLSN)
	f, err := l.fs.OpenFile(l.path(name), os.O_RDWR|os.O_CREATE|os.O_EXCL, vfs.FilePerm)
	if err != nil {
		return l.failUnsynced(fmt.Errorf("create segment %s: %w", name, err))
	}
	hdr := appendHeader(nil, firstLSN)
	n, err := f.WriteAt(hdr, 0)
	l.st.bytes.Add(uint64(max(n, 0)))
	if err == nil && n != len(hdr) {
		err = io.ErrShortWrite
	}
	if err != nil {
		_ = f.Close()
		return l.failUnsynced(fmt.Errorf("write segment header %s: %w", name, err))
	}
	l.active = f
	l.dirDirty = true
	l.st.created.Add(1)
	l.mu.Lock()
	l.segs = append(l.segs, &segment{firstLSN: firstLSN, name: name, lastLSN: firstLSN - 1, written: headerSize, allocated: headerSize})
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
// loses its preallocated tail and is synced first: then only the newest
// segment can ever have a torn or zero-filled tail, which is what lets
// recovery treat damage anywhere else as corruption. It waits for an
// in-flight Sync.
func (l *Log) rotate(firstLSN uint64) error {
	l.syncMu.Lock()
	defer l.syncMu.Unlock()
	if err := l.brokenErr(); err != nil {
		return err // a concurrent Sync failed
	}
	seg := l.activeSeg()
	shrunk := false
	if seg.allocated > seg.written {
		if err := l.active.Truncate(seg.written); err != nil {
			return l.failUnsynced(fmt.Errorf("truncate segment %s to %d: %w", seg.name, seg.written, err))
		}
		seg.allocated = seg.written
		shrunk = true
	}
	if err := l.syncLocked(shrunk); err != nil {
		return err
	}
	if err := l.active.Close(); err != nil {
		return l.failUnsynced(fmt.Errorf("close segment %s: %w", seg.name, err))
	}
	l.active = nil
	l.mu.Lock()
	seg.sealed = true
	l.changedLocked()
	l.mu.Unlock()
	return l.createSegment(firstLSN)
}

// Sync makes durable at least everything whose Append returned before Sync
// was called: an fdatasync of the active segment, plus a directory fsync if
// a segment was created since the last one. It may run while another
// goroutine Appends; what that Append writes meanwhile is made durable by a
// later Sync. A failure breaks the log (see ErrBroken).
func (l *Log) Sync() error {
	l.syncMu.Lock()
	defer l.syncMu.Unlock()
	if err := l.checkWritable(); err != nil {
		return err
	}
	return l.syncLocked(false)
}

// syncLocked syncs the active segment if it has unsynced bytes (or if force
// is set: its size changed) and the directory if it has unsynced entries,
// then advances the durable marks to what was written when it started.
// Callers hold syncMu, so the active segment cannot change meanwhile, but an
// Append may run concurrently.
func (l *Log) syncLocked(force bool) error {
	l.mu.RLock()
	if l.broken != nil {
		// Never fsync again after a failure (a rotation in an Append that
		// raced with a failed Sync would otherwise): the retry could succeed
		// for pages the kernel dropped, and report them durable.
		err := l.broken
		l.mu.RUnlock()
		return err
	}
	seg := l.activeSeg()
	if seg == nil {
		l.mu.RUnlock()
		return nil
	}
	written, durable, last := seg.written, seg.durable, l.lastLSN
	l.mu.RUnlock()
	if durable < written || force {
		if err := l.fdatasync(l.active); err != nil {
			return l.failUnsynced(fmt.Errorf("sync segment %s: %w", seg.name, err))
		}
	}
	if l.dirDirty {
		if err := l.syncDir(); err != nil {
			return l.failUnsynced(err) // a new segment's entry may not be on disk
		}
	}
	l.mu.Lock()
	if written > seg.durable || last > l.durableLSN {
		seg.durable = max(seg.durable, written)
		l.durableLSN = max(l.durableLSN, last)
		l.changedLocked()
	}
	l.mu.Unlock()
	return nil
}

// fdatasync syncs a segment file, counting it and its duration in Stats.
func (l *Log) fdatasync(f vfs.File) error {
	start := time.Now()
	err := f.Sync()
	l.st.syncs.Add(1)
	l.st.syncNanos.Add(uint64(time.Since(start)))
	return err
}

// syncDir fsyncs the log's directory. Callers hold syncMu (or are Open).
func (l *Log) syncDir() error {
	l.st.dirSyncs.Add(1)
	if err := l.fs.SyncDir(l.dir); err != nil {
		return fmt.Errorf("sync dir %s: %w", l.dir, err)
	}
	l.dirDirty = false
	return nil
}

// TruncateBefore removes, oldest first, every segment other than the active
// one whose entries all end before lsn, and returns how many it removed.
// If it removes anything it first syncs the log, so the entries it keeps
// cannot be lost to a crash. Readers still positioned in a removed segment
// get ErrCompacted.
func (l *Log) TruncateBefore(lsn uint64) (removed int, err error) {
	l.syncMu.Lock()
	defer l.syncMu.Unlock()
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
			if err := l.syncLocked(false); err != nil {
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
		// A failed directory fsync is as fatal as any other: the removal
		// may or may not survive a crash, and retrying can report success
		// for what the kernel dropped.
		if err := l.syncDir(); err != nil {
			return removed, l.fail(fmt.Errorf("truncate before LSN %d: %w", lsn, err))
		}
	}
}

// TruncateAfter removes every entry with an LSN above lsn, for a replica
// whose unsynced or unapplied tail diverged from its primary. lsn must be the
// LastLSN of an entry the log holds, or the LSN just before the log's first
// entry (FirstLSN()-1, or LastLSN() of an empty log): then no entry is kept
// and the next Append starts at lsn+1. Any other lsn (inside an entry, or
// below what the log holds, which wraps ErrCompacted) is an error naming it,
// and nothing is changed. lsn >= LastLSN() is a no-op.
//
// The newer segments are removed newest first, with a directory fsync after
// each, then the segment holding lsn is truncated at the end of its entry
// and fdatasynced; when TruncateAfter returns, LastLSN() and DurableLSN()
// are lsn. A crash at any point leaves a log whose entries are a prefix of
// the old ones, holding every entry up to lsn that was durable. A failed
// write, sync or removal breaks the log (see ErrBroken).
//
// Readers created before the call that have returned an entry above lsn, or
// were asked for one, fail with ErrTruncated; others carry on and see the
// entries appended after the cut. It is a writer call, like Append; it waits
// for an in-flight Sync.
func (l *Log) TruncateAfter(lsn uint64) error {
	l.syncMu.Lock()
	defer l.syncMu.Unlock()
	if err := l.checkWritable(); err != nil {
		return err
	}
	if !l.anchored || lsn >= l.lastLSN {
		return nil
	}
	if first := l.segs[0].firstLSN; lsn < first-1 {
		return fmt.Errorf("wal: truncate after LSN %d: the log holds LSNs from %d on: %w", lsn, first, ErrCompacted)
	}
	// The segment to cut is the newest one whose first LSN is at most lsn,
	// or the first segment when the log is to keep no entry.
	k := max(sort.Search(len(l.segs), func(i int) bool { return l.segs[i].firstLSN > lsn })-1, 0)
	seg := l.segs[k]
	last := k == len(l.segs)-1
	f := l.active
	if !last {
		var err error
		if f, err = l.fs.OpenFile(l.path(seg.name), os.O_RDWR, 0); err != nil {
			return fmt.Errorf("wal: truncate after LSN %d: open segment %s: %w", lsn, seg.name, err)
		}
	}
	cut, err := l.entryEnd(f, seg, lsn)
	if err != nil {
		if !last {
			_ = f.Close()
		}
		return err
	}

	// Commit the new state in memory first, so that Readers that look at
	// the log while the files change know their position may be gone.
	l.mu.Lock()
	removed := slices.Clone(l.segs[k+1:])
	for _, s := range removed {
		s.removed = true
		l.size -= s.written
	}
	l.segs = l.segs[:k+1]
	l.size -= seg.written - cut
	seg.written = cut
	seg.durable = min(seg.durable, cut)
	seg.lastLSN = lsn
	seg.sealed = false
	seg.index = slices.DeleteFunc(seg.index, func(p indexPoint) bool { return p.off >= cut })
	l.lastLSN = lsn
	l.durableLSN = min(l.durableLSN, lsn)
	l.cuts = append(l.cuts, cutPoint{gen: l.truncGen.Add(1), lsn: lsn})
	l.changedLocked()
	l.mu.Unlock()

	if !last {
		if err := l.active.Close(); err != nil {
			_ = f.Close()
			return l.fail(fmt.Errorf("truncate after LSN %d: close segment: %w", lsn, err))
		}
		l.active = f
	}
	for i := len(removed) - 1; i >= 0; i-- {
		name := removed[i].name
		if err := l.fs.Remove(l.path(name)); err != nil {
			return l.fail(fmt.Errorf("truncate after LSN %d: remove segment %s: %w", lsn, name, err))
		}
		l.st.removed.Add(1)
		if err := l.syncDir(); err != nil {
			return l.fail(fmt.Errorf("truncate after LSN %d: %w", lsn, err))
		}
	}
	if err := l.active.Truncate(cut); err != nil {
		return l.fail(fmt.Errorf("truncate after LSN %d: truncate segment %s to %d: %w", lsn, seg.name, cut, err))
	}
	seg.allocated = cut
	if err := l.fdatasync(l.active); err != nil {
		return l.fail(fmt.Errorf("truncate after LSN %d: sync segment %s: %w", lsn, seg.name, err))
	}
	if l.dirDirty { // the segment kept was created since the last directory sync
		if err := l.syncDir(); err != nil {
			return l.fail(fmt.Errorf("truncate after LSN %d: %w", lsn, err))
		}
	}
	l.mu.Lock()
	seg.durable = cut
	l.durableLSN = lsn
	l.changedLocked()
	l.mu.Unlock()
	l.logger.Warn("wal: truncated after LSN", "dir", l.dir, "lsn", lsn, "segments_removed", len(removed), "segment", seg.name, "offset", cut)
	return nil
}

// entryEnd returns the offset in seg (read through f) just past the entry
// whose last LSN is lsn, or the header's end if lsn is seg.firstLSN-1. It
// reads frame headers from the closest index point.
func (l *Log) entryEnd(f io.ReaderAt, seg *segment, lsn uint64) (int64, error) {
	switch {
	case lsn == seg.firstLSN-1:
		return headerSize, nil
	case lsn == seg.lastLSN:
		return seg.written, nil
	}
	path := l.path(seg.name)
	off, next := int64(headerSize), seg.firstLSN
	if i := sort.Search(len(seg.index), func(i int) bool { return seg.index[i].lsn > lsn }) - 1; i >= 0 {
		off, next = seg.index[i].off, seg.index[i].lsn
	}
	var hb [frameHeaderSize]byte
	for off < seg.written {
		if off+frameHeaderSize > seg.written {
			return 0, &CorruptionError{Segment: path, Offset: off, Reason: "frame header crosses the end of written data"}
		}
		if _, err := f.ReadAt(hb[:], off); err != nil {
			return 0, fmt.Errorf("wal: truncate after LSN %d: read segment %s at %d: %w", lsn, seg.name, off, err)
		}
		h := decodeFrameHeader(hb[:])
		end := off + frameHeaderSize + int64(h.length)
		switch {
		case h.first != next || h.last < h.first || end > seg.written:
			return 0, &CorruptionError{Segment: path, Offset: off, Reason: fmt.Sprintf("frame LSNs %d..%d, length %d, while looking for the end of LSN %d", h.first, h.last, h.length, lsn)}
		case h.last == lsn:
			return end, nil
		case h.last > lsn:
			return 0, fmt.Errorf("wal: truncate after LSN %d: it falls inside entry %d..%d (segment %s, offset %d), not at its end", lsn, h.first, h.last, seg.name, off)
		}
		next, off = h.last+1, end
	}
	return 0, fmt.Errorf("wal: truncate after LSN %d: not found in segment %s (LSNs %d..%d)", lsn, seg.name, seg.firstLSN, seg.lastLSN)
}

// Reset discards every entry and restarts the log empty, so that the next
// Append must start at nextLSN (used when a replica is re-seeded from a
// snapshot). It is atomic across crashes: a marker segment is made durable
// first, and Open finishes an interrupted Reset when it finds one. Readers
// get ErrCompacted. It waits for an in-flight Sync.
func (l *Log) Reset(nextLSN uint64) error {
	l.syncMu.Lock()
	defer l.syncMu.Unlock()
	if err := l.checkWritable(); err != nil {
		return err
	}
	if nextLSN == 0 || nextLSN == math.MaxUint64 {
		return fmt.Errorf("wal: reset: invalid next LSN %d", nextLSN)
	}
	marker := resetName(nextLSN)
	f, err := l.fs.OpenFile(l.path(marker), os.O_RDWR|os.O_CREATE|os.O_TRUNC, vfs.FilePerm)
	if err != nil {
		return l.fail(fmt.Errorf("reset: create %s: %w", marker, err))
	}
	hdr := appendHeader(nil, nextLSN)
	if n, err := f.WriteAt(hdr, 0); err != nil || n != len(hdr) {
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
	l.st.created.Add(1)
	l.mu.Lock()
	l.segs = []*segment{{firstLSN: nextLSN, name: name, lastLSN: nextLSN - 1, written: headerSize, durable: headerSize, allocated: headerSize}}
	l.size = headerSize
	l.anchored = true
	l.lastLSN = nextLSN - 1
	l.durableLSN = nextLSN - 1
	l.changedLocked()
	l.mu.Unlock()
	return nil
}

// Wait blocks until LastLSN() (or DurableLSN(), if durable) reaches lsn, ctx
// is done, or the log is closed or broken (then it returns ErrClosed or the
// error that broke it: neither position moves again).
func (l *Log) Wait(ctx context.Context, lsn uint64, durable bool) error {
	for {
		l.mu.RLock()
		have, ch, closed, broken := l.lastLSN, l.notify, l.closed, l.broken
		if durable {
			have = l.durableLSN
		}
		l.mu.RUnlock()
		switch {
		case have >= lsn:
			return nil
		case closed:
			return ErrClosed
		case broken != nil:
			return broken
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// Close syncs the log (unless it is broken) and closes it, leaving the
// active segment's preallocated tail in place. Blocked readers return
// ErrClosed. It returns the sync's error, if any. It waits for an in-flight
// Sync.
func (l *Log) Close() error {
	l.syncMu.Lock()
	defer l.syncMu.Unlock()
	l.mu.RLock()
	closed := l.closed
	l.mu.RUnlock()
	if closed {
		return ErrClosed
	}
	var err error
	if l.brokenErr() == nil {
		err = l.syncLocked(false)
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
