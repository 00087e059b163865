package wal

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"sort"
	"sync"

	"github.com/walship/walship/internal/vfs"
)

// readBufSize is the read-ahead of a Reader: catching up over many small
// entries costs one read call per this many bytes rather than two per entry.
const readBufSize = 64 << 10

// Reader reads entries in LSN order, waiting for new ones. Next and Close may
// be called from different goroutines; Next must not be called concurrently
// with itself.
type Reader struct {
	l           *Log
	durableOnly bool

	mu   sync.Mutex // held by Next while it reads, and by Close to release the file
	next uint64     // next LSN wanted
	seg  *segment   // nil until positioned (the log had no segment yet)
	f    vfs.File
	off  int64  // offset of the next frame in seg
	buf  []byte // read-ahead of seg's bytes [bufOff, bufOff+len(buf))
	bOff int64
	gen  uint64 // Log.truncGen the position is valid for
	err  error  // sticky ErrTruncated

	done      chan struct{}
	closeOnce sync.Once
}

// NewReader returns a Reader whose first entry is the one containing fromLSN
// (returned whole: the caller skips the LSNs before fromLSN). With
// durableOnly, only synced entries are returned. It fails with ErrCompacted
// if fromLSN is older than the log's first segment and with ErrFuture if it
// is beyond LastLSN()+1. On a log that has never held a segment any fromLSN
// is accepted; Next fails with ErrCompacted if the first entry appended
// starts after it. A Reader only reads below the log's written (or synced)
// offset, never into a segment's zero-filled tail.
func (l *Log) NewReader(fromLSN uint64, durableOnly bool) (*Reader, error) {
	r := &Reader{l: l, durableOnly: durableOnly, next: fromLSN, done: make(chan struct{})}
	l.mu.RLock()
	defer l.mu.RUnlock()
	if l.closed {
		return nil, ErrClosed
	}
	r.gen = l.truncGen.Load()
	if err := r.locateLocked(); err != nil {
		return nil, err
	}
	return r, nil
}

// locateLocked positions r at the entry containing r.next using the sparse
// index. Callers hold l.mu.
func (r *Reader) locateLocked() error {
	l := r.l
	if len(l.segs) == 0 {
		return nil // wait for the first segment
	}
	if r.next < l.segs[0].firstLSN {
		return fmt.Errorf("wal: LSN %d, first kept LSN is %d: %w", r.next, l.segs[0].firstLSN, ErrCompacted)
	}
	if r.next > l.lastLSN+1 {
		return fmt.Errorf("wal: LSN %d, last LSN is %d: %w", r.next, l.lastLSN, ErrFuture)
	}
	i := sort.Search(len(l.segs), func(i int) bool { return l.segs[i].firstLSN > r.next }) - 1
	seg := l.segs[i]
	k := sort.Search(len(seg.index), func(k int) bool { return seg.index[k].lsn > r.next }) - 1
	r.seg, r.off = seg, headerSize
	if k >= 0 {
		r.off = seg.index[k].off
	}
	return nil
}

// Next returns the next entry, blocking until one is available (appended,
// or synced if the Reader is durableOnly), ctx is done (ctx.Err()), the
// Reader or the Log is closed (ErrClosed), the entry's segment was removed
// (ErrCompacted), or TruncateAfter removed the entry the Reader was to return
// next or one it returned (ErrTruncated, for good: create a new Reader). The
// returned Data is owned by the caller.
func (r *Reader) Next(ctx context.Context) (Entry, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	l := r.l
	for {
		// ctx is only consulted when Next would block, so an entry that is
		// already available is returned even with a done ctx.
		select {
		case <-r.done:
			return Entry{}, ErrClosed
		default:
		}
		if r.err != nil {
			return Entry{}, r.err
		}

		l.mu.RLock()
		if l.closed {
			l.mu.RUnlock()
			return Entry{}, ErrClosed
		}
		if r.gen != l.truncGen.Load() {
			if err := r.afterTruncateLocked(); err != nil {
				l.mu.RUnlock()
				return Entry{}, err
			}
		}
		gen := r.gen
		if r.seg == nil {
			if err := r.locateLocked(); err != nil && !errors.Is(err, ErrFuture) {
				l.mu.RUnlock()
				return Entry{}, err
			}
		}
		seg := r.seg
		var limit int64
		var nextSeg *segment
		if seg != nil {
			if seg.removed {
				l.mu.RUnlock()
				return Entry{}, fmt.Errorf("wal: segment %s removed: %w", seg.name, ErrCompacted)
			}
			limit = seg.written
			if r.durableOnly {
				limit = seg.durable
			}
			if seg.sealed && r.off >= seg.written {
				i := sort.Search(len(l.segs), func(i int) bool { return l.segs[i].firstLSN > seg.firstLSN })
				if i < len(l.segs) {
					nextSeg = l.segs[i]
				}
			}
		}
		ch := l.notify
		l.mu.RUnlock()

		switch {
		case seg != nil && r.off < limit:
			e, err := r.readFrame(limit)
			// A TruncateAfter that ran meanwhile may have changed the bytes
			// read: retry from the position it left.
			if l.truncGen.Load() != gen {
				continue
			}
			if err != nil {
				return Entry{}, err
			}
			if e.LastLSN < r.next {
				continue // before fromLSN: skip
			}
			if e.FirstLSN > r.next {
				return Entry{}, &CorruptionError{Segment: l.path(seg.name), Offset: r.off, Reason: fmt.Sprintf("found LSN %d while reading LSN %d", e.FirstLSN, r.next)}
			}
			r.next = e.LastLSN + 1
			return e, nil
		case nextSeg != nil:
			r.switchTo(nextSeg)
			continue
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return Entry{}, ctx.Err()
		case <-r.done:
			return Entry{}, ErrClosed
		case <-l.closedCh:
			return Entry{}, ErrClosed
		}
	}
}

// afterTruncateLocked handles the TruncateAfter calls made since r was last
// positioned: if one cut below r.next, r's position is gone (ErrTruncated);
// otherwise r is repositioned at r.next, since what it read ahead or the
// segment it was in may be gone. Callers hold l.mu.
func (r *Reader) afterTruncateLocked() error {
	l := r.l
	for i := len(l.cuts) - 1; i >= 0 && l.cuts[i].gen > r.gen; i-- {
		if c := l.cuts[i]; r.next > c.lsn+1 {
			r.err = fmt.Errorf("wal: reader at LSN %d: the log was truncated after LSN %d: %w", r.next, c.lsn, ErrTruncated)
			return r.err
		}
	}
	r.gen = l.truncGen.Load()
	if r.f != nil {
		_ = r.f.Close()
		r.f = nil
	}
	r.seg, r.off, r.buf = nil, 0, r.buf[:0]
	return nil
}

func (r *Reader) switchTo(seg *segment) {
	if r.f != nil {
		_ = r.f.Close()
		r.f = nil
	}
	r.seg, r.off, r.buf = seg, headerSize, r.buf[:0]
}

// readFrame decodes the frame at r.off, which ends at or before limit, and
// advances r.off past it. Only complete frames lie below limit and they are
// never rewritten, so no lock is needed while reading.
func (r *Reader) readFrame(limit int64) (Entry, error) {
	seg := r.seg
	// The path is built only when needed: a tailing reader calls this once
	// per entry, and joining it each time cost a fifth of the call.
	corrupt := func(reason string) error {
		return &CorruptionError{Segment: r.l.path(seg.name), Offset: r.off, Reason: reason}
	}
	if r.f == nil {
		f, err := r.l.fs.OpenFile(r.l.path(seg.name), os.O_RDONLY, 0)
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) {
				return Entry{}, fmt.Errorf("wal: segment %s removed: %w", seg.name, ErrCompacted)
			}
			return Entry{}, fmt.Errorf("wal: open segment %s: %w", seg.name, err)
		}
		r.f = f
		r.buf = r.buf[:0]
	}
	if r.off+frameHeaderSize > limit {
		return Entry{}, corrupt("frame header crosses the end of written data")
	}
	hb, err := r.read(r.off, frameHeaderSize, limit)
	if err != nil {
		return Entry{}, err
	}
	h := decodeFrameHeader(hb)
	end := r.off + frameHeaderSize + int64(h.length)
	if h.length > MaxEntrySize || end > limit {
		return Entry{}, corrupt(fmt.Sprintf("frame length %d crosses the end of written data", h.length))
	}
	hdr := make([]byte, frameHeaderSize)
	copy(hdr, hb)
	db, err := r.read(r.off+frameHeaderSize, int(h.length), limit)
	if err != nil {
		return Entry{}, err
	}
	if frameCRC(hdr, db) != h.crc {
		return Entry{}, corrupt("frame checksum mismatch")
	}
	e := Entry{FirstLSN: h.first, LastLSN: h.last, Data: make([]byte, len(db))}
	copy(e.Data, db)
	r.off = end
	return e, nil
}

// read returns n bytes at off from the read-ahead buffer, refilling it (up to
// limit) when needed. The result is valid until the next call.
func (r *Reader) read(off int64, n int, limit int64) ([]byte, error) {
	if off >= r.bOff && off+int64(n) <= r.bOff+int64(len(r.buf)) {
		return r.buf[off-r.bOff : off-r.bOff+int64(n)], nil
	}
	want := int(min(max(int64(n), readBufSize), limit-off))
	if cap(r.buf) < want {
		r.buf = make([]byte, want)
	}
	r.buf = r.buf[:want]
	m, err := r.f.ReadAt(r.buf, off)
	if m < n {
		r.buf = r.buf[:0]
		if err == nil || err == io.EOF {
			err = io.ErrUnexpectedEOF
		}
		return nil, fmt.Errorf("wal: read segment %s at %d: %w", r.seg.name, off, err)
	}
	r.buf, r.bOff = r.buf[:m], off
	return r.buf[:n], nil
}

// Close releases the Reader; a Next blocked in another goroutine returns
// ErrClosed. It is safe to call more than once.
func (r *Reader) Close() error {
	r.closeOnce.Do(func() { close(r.done) })
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.f != nil {
		err := r.f.Close()
		r.f = nil
		return err
	}
	return nil
}
