package wal

import (
	"fmt"
	"io"
	"os"
	"slices"

	"github.com/walship/walship/internal/vfs"
)

// recover rebuilds the in-memory state from the segment files. See the
// package documentation for what is repaired and what is refused.
func (l *Log) recover() error {
	ents, err := l.fs.ReadDir(l.dir)
	if err != nil {
		return fmt.Errorf("wal: read dir: %w", err)
	}
	var segLSNs, resetLSNs []uint64
	for _, e := range ents {
		if e.IsDir() {
			continue
		}
		if lsn, ok := parseName(e.Name(), segmentExt); ok {
			segLSNs = append(segLSNs, lsn)
		} else if lsn, ok := parseName(e.Name(), resetExt); ok {
			resetLSNs = append(resetLSNs, lsn)
		}
	}
	slices.Sort(segLSNs)

	if len(resetLSNs) > 0 {
		segLSNs, err = l.finishReset(resetLSNs, segLSNs)
		if err != nil {
			return err
		}
	}

	info := &l.recovery
	var prev *segment
	for i, lsn := range segLSNs {
		last := i == len(segLSNs)-1
		seg, err := l.recoverSegment(lsn, prev, last)
		if err != nil {
			return err
		}
		if seg == nil { // the newest segment had a torn header and is gone
			break
		}
		l.segs = append(l.segs, seg)
		l.size += seg.written
		prev = seg
	}

	if seg := l.activeSeg(); seg != nil {
		f, err := l.fs.OpenFile(l.path(seg.name), os.O_RDWR, 0)
		if err != nil {
			return fmt.Errorf("wal: open segment %s: %w", seg.name, err)
		}
		l.active = f
		// What is on disk after a process crash may still be only in the
		// page cache; make it durable before reporting it as such.
		if err := l.fdatasync(f); err != nil {
			return fmt.Errorf("wal: sync segment %s: %w", seg.name, err)
		}
		seg.sealed = false
		seg.durable = seg.written
		l.anchored = true
		l.lastLSN = seg.lastLSN
		l.durableLSN = seg.lastLSN
	}
	if err := l.syncDir(); err != nil {
		return fmt.Errorf("wal: %w", err)
	}

	info.Segments = len(l.segs)
	for _, s := range l.segs {
		info.Entries += s.nEntries
	}
	if len(l.segs) > 0 && l.lastLSN >= l.segs[0].firstLSN {
		info.FirstLSN, info.LastLSN = l.segs[0].firstLSN, l.lastLSN
	}
	l.logger.Info("wal: opened", "dir", l.dir, "segments", info.Segments, "entries", info.Entries,
		"first_lsn", info.FirstLSN, "last_lsn", info.LastLSN)
	return nil
}

// recoverSegment checks one segment and returns its state. prev is the
// previous segment (nil for the first) and last says whether this is the
// newest. It returns nil, nil when the newest segment was removed because its
// header was torn.
func (l *Log) recoverSegment(lsn uint64, prev *segment, last bool) (*segment, error) {
	name := segmentName(lsn)
	path := l.path(name)
	corrupt := func(off int64, format string, args ...any) error {
		return &CorruptionError{Segment: path, Offset: off, Reason: fmt.Sprintf(format, args...)}
	}
	f, err := l.fs.OpenFile(path, os.O_RDONLY, 0)
	if err != nil {
		return nil, fmt.Errorf("wal: open segment %s: %w", name, err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("wal: stat segment %s: %w", name, err)
	}
	size := fi.Size()

	hdr := make([]byte, min(size, headerSize))
	if _, err := f.ReadAt(hdr, 0); err != nil && err != io.EOF {
		return nil, fmt.Errorf("wal: read segment %s: %w", name, err)
	}
	if p := checkHeader(hdr, lsn); p != nil {
		if !p.torn || !last {
			return nil, corrupt(0, "%s", p.reason)
		}
		// A newest segment whose header never fully reached the disk holds
		// nothing, unless frames follow a damaged header.
		if follows, err := validFrameIn(f, 0, size, lsn); err != nil {
			return nil, fmt.Errorf("wal: read segment %s: %w", name, err)
		} else if follows != "" {
			return nil, corrupt(0, "%s, but %s", p.reason, follows)
		}
		if prev != nil && lsn != prev.lastLSN+1 {
			return nil, corrupt(0, "segment starts at LSN %d but the previous one ends at LSN %d (missing segment?)", lsn, prev.lastLSN)
		}
		debris, err := dataEnd(f, 0, size) // preallocated zeros are not debris
		if err != nil {
			return nil, fmt.Errorf("wal: read segment %s: %w", name, err)
		}
		_ = f.Close()
		if err := l.fs.Remove(path); err != nil {
			return nil, fmt.Errorf("wal: remove torn segment %s: %w", name, err)
		}
		l.recovery.RemovedSegment = path
		l.st.torn.Add(1)
		l.st.tornBytes.Add(uint64(debris))
		l.logger.Warn("wal: removed newest segment with a torn header", "segment", path, "bytes", debris, "zero_bytes", size-debris, "reason", p.reason)
		return nil, nil
	}
	if prev != nil && lsn != prev.lastLSN+1 {
		return nil, corrupt(0, "segment starts at LSN %d but the previous one ends at LSN %d (missing segment?)", lsn, prev.lastLSN)
	}

	res, err := scanFrames(f, size, lsn)
	if err != nil {
		return nil, fmt.Errorf("wal: read segment %s: %w", name, err)
	}
	if res.bad && last && !res.badFatal {
		// Zeros from the first invalid frame to the end of the file are the
		// tail preallocation keeps ahead of the data: the clean end of the
		// log, kept for the appends to come.
		end, err := dataEnd(f, res.end, size)
		if err != nil {
			return nil, fmt.Errorf("wal: read segment %s: %w", name, err)
		}
		if end == res.end {
			res.bad = false
		}
	}
	allocated := size
	if res.bad {
		if res.badFatal || !last {
			return nil, corrupt(res.end, "%s", res.badReason)
		}
		follows, err := validFrameIn(f, res.end+1, size, res.lastLSN+1)
		if err != nil {
			return nil, fmt.Errorf("wal: read segment %s: %w", name, err)
		}
		if follows != "" {
			return nil, corrupt(res.end, "%s, and %s", res.badReason, follows)
		}
		if err := l.cutTail(f, path, res.end, size, res.badReason); err != nil {
			return nil, err
		}
		allocated = res.end
	}
	return &segment{
		firstLSN:  lsn,
		name:      name,
		lastLSN:   res.lastLSN,
		written:   res.end,
		durable:   res.end,
		allocated: allocated,
		sealed:    true,
		index:     res.index,
		nEntries:  res.entries,
	}, nil
}

// dataEnd returns the offset just past the last non-zero byte of f in
// [from, size) (from if they are all zero), reading them in bounded pieces.
func dataEnd(f io.ReaderAt, from, size int64) (int64, error) {
	buf := make([]byte, min(size-from, 256<<10))
	end := from
	for off := from; off < size; {
		b := buf[:min(int64(len(buf)), size-off)]
		n, err := f.ReadAt(b, off)
		if err != nil && err != io.EOF {
			return 0, err
		}
		if k := lastNonZero(b[:n]); k > 0 {
			end = off + int64(k)
		}
		if n == 0 {
			break
		}
		off += int64(n)
	}
	return end, nil
}

// validFrameIn checks whether a valid frame for LSN next or later starts
// anywhere in [from, size) of f, returning "" if none does and otherwise why
// the damage cannot be treated as a torn tail. The region is read whole: it
// is bounded by the file's real size, never by a length field.
func validFrameIn(f io.ReaderAt, from, size int64, next uint64) (string, error) {
	if from >= size {
		return "", nil
	}
	b := make([]byte, size-from)
	if _, err := f.ReadAt(b, from); err != nil && err != io.EOF {
		return "", err
	}
	switch found, exhausted := validFrameAfter(b, next); {
	case found:
		return "valid frames follow", nil
	case exhausted:
		return "too many frame-like byte runs follow to rule out valid frames", nil
	}
	return "", nil
}

// cutTail truncates the newest segment to off, keeping a copy of the removed
// bytes up to the last non-zero one next to it for inspection (as etcd's
// repair does; a zero-filled remainder is preallocation, not debris), and
// syncs.
func (l *Log) cutTail(r io.ReaderAt, path string, off, size int64, reason string) error {
	tail := make([]byte, size-off)
	if _, err := r.ReadAt(tail, off); err != nil && err != io.EOF {
		return fmt.Errorf("wal: read torn tail of %s: %w", path, err)
	}
	tail = tail[:lastNonZero(tail)]
	debris := int64(len(tail))
	tornPath := fmt.Sprintf("%s.%d%s", path, off, tornExt)
	if err := vfs.WriteFile(l.fs, tornPath, tail, vfs.FilePerm); err != nil {
		return fmt.Errorf("wal: save torn tail: %w", err)
	}
	f, err := l.fs.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		return fmt.Errorf("wal: open segment %s: %w", path, err)
	}
	defer f.Close()
	if err := f.Truncate(off); err != nil {
		return fmt.Errorf("wal: truncate torn tail of %s: %w", path, err)
	}
	if err := f.Sync(); err != nil {
		return fmt.Errorf("wal: sync segment %s: %w", path, err)
	}
	info := &l.recovery
	info.TornSegment, info.TornOffset, info.TornBytes, info.TornReason = path, off, debris, reason
	l.st.torn.Add(1)
	l.st.tornBytes.Add(uint64(debris))
	l.logger.Warn("wal: cut torn tail", "segment", path, "offset", off, "bytes", debris, "zero_bytes", size-off-debris, "reason", reason, "copy", tornPath)
	return nil
}

// lastNonZero returns the length of b without its trailing zero bytes.
func lastNonZero(b []byte) int {
	n := len(b)
	for n > 0 && b[n-1] == 0 {
		n--
	}
	return n
}

// finishReset handles *.reset markers left by Reset. A complete marker means
// the reset was committed: the old segments are removed and the marker
// becomes the only segment. An incomplete one means it never was: it is
// deleted. It returns the segment LSNs that remain.
func (l *Log) finishReset(resetLSNs, segLSNs []uint64) ([]uint64, error) {
	var valid []uint64
	for _, lsn := range resetLSNs {
		path := l.path(resetName(lsn))
		b, err := vfs.ReadFile(l.fs, path)
		if err != nil {
			return nil, fmt.Errorf("wal: read %s: %w", path, err)
		}
		if len(b) == headerSize && checkHeader(b, lsn) == nil {
			valid = append(valid, lsn)
			continue
		}
		if err := l.fs.Remove(path); err != nil {
			return nil, fmt.Errorf("wal: remove incomplete reset marker: %w", err)
		}
		l.logger.Warn("wal: removed incomplete reset marker", "file", path)
	}
	if len(valid) > 1 {
		return nil, &CorruptionError{Segment: l.path(resetName(valid[1])), Reason: "more than one complete reset marker"}
	}
	if len(valid) == 0 {
		return segLSNs, l.syncDir()
	}
	lsn := valid[0]
	for _, s := range segLSNs {
		if err := l.fs.Remove(l.path(segmentName(s))); err != nil {
			return nil, fmt.Errorf("wal: finish reset: remove segment: %w", err)
		}
	}
	if err := l.syncDir(); err != nil {
		return nil, fmt.Errorf("wal: finish reset: %w", err)
	}
	if err := l.fs.Rename(l.path(resetName(lsn)), l.path(segmentName(lsn))); err != nil {
		return nil, fmt.Errorf("wal: finish reset: %w", err)
	}
	if err := l.syncDir(); err != nil {
		return nil, fmt.Errorf("wal: finish reset: %w", err)
	}
	l.recovery.ResetCompleted = true
	l.logger.Warn("wal: finished an interrupted reset", "next_lsn", lsn)
	return []uint64{lsn}, nil
}
