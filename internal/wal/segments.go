package wal

// SegmentInfo describes one segment file, for retention policies that pick
// which segments TruncateBefore should remove.
type SegmentInfo struct {
	// Name is the segment file's base name.
	Name string
	// FirstLSN is the first LSN the segment holds (or would hold).
	FirstLSN uint64
	// LastLSN is the last LSN written to the segment; FirstLSN-1 when it
	// holds no entry.
	LastLSN uint64
	// Bytes is the segment's size: header and complete frames written. The
	// active segment's file may be larger by a zero-filled tail (see
	// Options.Preallocate), which is not counted.
	Bytes int64
	// Sealed reports that the segment is no longer the active one: it is
	// synced and will not grow.
	Sealed bool
}

// SegmentInfos describes the segment files, oldest first; the last one is
// the active segment.
func (l *Log) SegmentInfos() []SegmentInfo {
	l.mu.RLock()
	defer l.mu.RUnlock()
	out := make([]SegmentInfo, len(l.segs))
	for i, s := range l.segs {
		out[i] = SegmentInfo{Name: s.name, FirstLSN: s.firstLSN, LastLSN: s.lastLSN, Bytes: s.written, Sealed: s.sealed}
	}
	return out
}
