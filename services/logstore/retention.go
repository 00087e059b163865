package logstore

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sync"
	"sync/atomic"
	"time"

	walshipv1 "github.com/walship/walship/gen/walship/v1"
	"github.com/walship/walship/internal/envelope"
	"github.com/walship/walship/internal/wal"
	"github.com/walship/walship/internal/watermark"
)

// retentionState is the retention goroutine's (retention, below), which
// removes old segments and the snapshots the log no longer needs.
//
//   - kick (capacity 1) is pushed by the writer after every round that
//     wrote and by a stored snapshot; the goroutine also ticks with an
//     age limit.
//   - mu makes a pass exclusive (the goroutine's, and tests' direct
//     calls) and guards commitAt.
//   - firstKept publishes FirstLSN after each pass, for waiters;
//     heldBytes is what the last pass kept only so that the log after
//     the newest snapshot stays restorable (Status, metrics).
//
// A pass holds mu, then pins.mu (no reader pins a position meanwhile),
// then walMu for the cut itself, then snaps.mu for the list; the package's
// lock order is in doc.go.
type retentionState struct {
	kick      chan struct{}
	mu        sync.Mutex
	commitAt  map[uint64]time.Time // segment first LSN -> commit time of its newest batch
	firstKept watermark.Watermark
	heldBytes atomic.Int64
}

// retention removes old segments whenever the writer made the log grow and,
// with an age limit, on a ticker (the age of a segment grows without any
// append). It returns the error that broke the log, if a removal's fsync
// failed (fatal, as every failed fsync: Run stops the log store), and nil
// when ctx ends or the log is closed.
func (s *Server) retention(ctx context.Context) error {
	if s.cfg.RetentionBytes == 0 && s.cfg.RetentionAge == 0 {
		return nil
	}
	var tick <-chan time.Time
	if s.cfg.RetentionAge > 0 {
		t := time.NewTicker(min(max(s.cfg.RetentionAge/10, time.Second), time.Minute))
		defer t.Stop()
		tick = t.C
	}
	// A first pass at start: the limits may have been lowered since the
	// log was written.
	for first := true; ; first = false {
		if !first {
			select {
			case <-ctx.Done():
				return nil
			case <-s.ret.kick:
			case <-tick:
			}
		}
		if _, err := s.enforceRetention(ctx); err != nil {
			switch {
			case errors.Is(err, wal.ErrClosed):
				return nil
			case errors.Is(err, wal.ErrBroken):
				s.metrics.fsyncErrors.Inc()
				return err
			}
			s.logger.Warn("retention failed; will retry", "err", err)
		}
	}
}

// enforceRetention removes, oldest first, whole sealed segments while the
// log is bigger than RetentionBytes or while the segment's newest batch is
// older than RetentionAge. The active segment, and anything not yet
// durable, is never removed. It returns the number of segments removed.
//
// A segment's age is that of its newest batch's commit_time_unix_nano (the
// primary's clock when it built the batch): it is the same on every copy of
// the log, survives restarts and copies, and does not depend on file
// timestamps (which the WAL's fdatasync does not even make durable).
//
// With base snapshots stored, what is left must stay restorable (see
// keepRestorable): the log is cut only up to just after a snapshot, and
// the snapshots older than the one the log then starts from are removed.
// Nothing an open Read, GetSnapshot or Verify still needs is cut (pins).
func (s *Server) enforceRetention(ctx context.Context) (int, error) {
	s.ret.mu.Lock()
	defer s.ret.mu.Unlock()
	segs := s.wal.SegmentInfos()
	durable := s.wal.DurableLSN()
	total := s.wal.Size()
	var cutoff time.Time
	if s.cfg.RetentionAge > 0 {
		cutoff = s.now().Add(-s.cfg.RetentionAge)
	}
	cut := 0
	for i := 0; i < len(segs)-1; i++ {
		seg := segs[i]
		if !seg.Sealed || seg.LastLSN > durable || seg.LastLSN < seg.FirstLSN {
			break
		}
		over := s.cfg.RetentionBytes > 0 && total > s.cfg.RetentionBytes
		old := false
		if !over && s.cfg.RetentionAge > 0 {
			at, err := s.segmentTime(ctx, seg)
			if err != nil {
				return 0, err
			}
			old = at.Before(cutoff)
		}
		if !over && !old {
			break
		}
		total -= seg.Bytes
		cut = i + 1
	}

	// Readers register their pins under pins.mu: holding it from here to
	// the end, no reader starts on what this pass removes.
	s.pins.mu.Lock()
	defer s.pins.mu.Unlock()
	snaps := s.snaps.snapshot()
	archived := uint64(math.MaxUint64)
	if s.arch != nil {
		archived = s.archivedLSN()
	}
	cut, held := keepRestorable(segs, cut, snaps, s.pins.minLocked(), archived)
	s.ret.heldBytes.Store(held)
	removed := 0
	var err error
	if cut > 0 {
		s.walMu.Lock()
		removed, err = s.wal.TruncateBefore(segs[cut].FirstLSN)
		s.walMu.Unlock()
		for _, seg := range segs[:removed] {
			delete(s.ret.commitAt, seg.FirstLSN)
		}
	}
	first := s.wal.FirstLSN()
	s.ret.firstKept.Advance(first)
	if removed > 0 {
		s.logger.Info("retention removed segments", "segments", removed, "first_lsn", first, "stored_bytes", s.wal.Size())
	}
	if err != nil {
		return removed, fmt.Errorf("truncate before LSN %d: %w", segs[cut].FirstLSN, err)
	}
	s.dropUnrestorable(first)
	return removed, nil
}

// keepRestorable lowers a retention cut (remove segs[:cut]) so that what
// is left stays restorable, nothing pinned is removed, and nothing after
// archived (the end of what the archive holds; MaxUint64 without an
// archive) is, and returns it with the bytes of the segments it kept for
// the snapshots and the archive.
//
// A restore starts from a base snapshot at LSN s and replays the log from
// s+1, so the log must start at or before s+1 for some stored snapshot:
// it is cut at most to just after the newest one (segments are removed
// whole, so it may start a little earlier). With no snapshot at all,
// nothing is restorable from a snapshot and the cut stands (as before
// snapshots were stored). A pin at LSN p (the first LSN a reader still
// needs) keeps every segment holding an LSN at or after p.
func keepRestorable(segs []wal.SegmentInfo, cut int, snaps []*baseSnap, pinned, archived uint64) (int, int64) {
	want := cut
	if n := len(snaps); n > 0 {
		newest := snaps[n-1].lsn
		for cut > 0 && segs[cut].FirstLSN > newest+1 {
			cut--
		}
	}
	for cut > 0 && segs[cut-1].LastLSN > archived {
		cut--
	}
	var held int64
	for _, seg := range segs[cut:want] {
		held += seg.Bytes
	}
	for cut > 0 && segs[cut-1].LastLSN >= pinned {
		cut--
	}
	return cut, held
}

// dropUnrestorable removes the snapshots a log starting at first cannot
// continue — those older than first-1, from which the log after them is
// gone — except the newest (kept whatever the log holds) and any a reader
// has pinned. Callers hold pins.mu.
func (s *Server) dropUnrestorable(first uint64) {
	if first == 0 {
		return
	}
	s.snaps.mu.Lock()
	var drop []*baseSnap
	keep := s.snaps.list[:0]
	for i, b := range s.snaps.list {
		if b.lsn+1 < first && i < len(s.snaps.list)-1 && !s.pins.atLocked(b.lsn+1) {
			drop = append(drop, b)
		} else {
			keep = append(keep, b)
		}
	}
	clear(s.snaps.list[len(keep):])
	s.snaps.list = keep
	s.snaps.mu.Unlock()
	s.removeSnapshots(drop, fmt.Sprintf("retention: the log starts at LSN %d, after them", first))
}

// pins are the positions of readers — Read, GetSnapshot, Verify streams —
// that retention must not cut: each is the first LSN its reader still
// needs, moving forward as it reads, released when its stream ends (a
// restore reading a snapshot and then the log after it keeps both).
type pins struct {
	mu  sync.Mutex
	set map[*pin]struct{}
}

// pin is one reader's position.
type pin struct{ lsn atomic.Uint64 }

// advance moves the pin forward to lsn.
func (p *pin) advance(lsn uint64) {
	if p != nil && lsn > p.lsn.Load() {
		p.lsn.Store(lsn) // only its reader moves it
	}
}

// addLocked registers a pin at lsn. Callers hold mu.
func (ps *pins) addLocked(lsn uint64) *pin {
	if ps.set == nil {
		ps.set = map[*pin]struct{}{}
	}
	p := &pin{}
	p.lsn.Store(lsn)
	ps.set[p] = struct{}{}
	return p
}

// release drops p (nil is a no-op).
func (ps *pins) release(p *pin) {
	if p == nil {
		return
	}
	ps.mu.Lock()
	delete(ps.set, p)
	ps.mu.Unlock()
}

// minLocked is the lowest pinned LSN (MaxUint64 if none). Callers hold mu.
func (ps *pins) minLocked() uint64 {
	m := uint64(math.MaxUint64)
	for p := range ps.set {
		m = min(m, p.lsn.Load())
	}
	return m
}

// atLocked reports whether a reader is pinned at lsn exactly: a
// GetSnapshot of the snapshot at lsn-1. Callers hold mu.
func (ps *pins) atLocked(lsn uint64) bool {
	for p := range ps.set {
		if p.lsn.Load() == lsn {
			return true
		}
	}
	return false
}

// pinLog pins the log from lsn for a reader about to start there. If
// retention removed lsn already, the reader's NewReader reports it; from
// here on no pass removes it.
func (s *Server) pinLog(lsn uint64) *pin {
	s.pins.mu.Lock()
	defer s.pins.mu.Unlock()
	return s.pins.addLocked(lsn)
}

// segmentTime returns the commit time of a sealed segment's newest batch,
// cached: a sealed segment never changes.
func (s *Server) segmentTime(ctx context.Context, seg wal.SegmentInfo) (time.Time, error) {
	if t, ok := s.ret.commitAt[seg.FirstLSN]; ok {
		return t, nil
	}
	r, err := s.wal.NewReader(seg.LastLSN, true)
	if err != nil {
		return time.Time{}, fmt.Errorf("read segment %s: %w", seg.Name, err)
	}
	defer r.Close()
	e, err := r.Next(ctx)
	if err != nil {
		return time.Time{}, fmt.Errorf("read segment %s: %w", seg.Name, err)
	}
	var env walshipv1.WalBatch
	if err := envelope.Unmarshal(e.Data, &env); err != nil {
		return time.Time{}, fmt.Errorf("read segment %s: LSNs %d..%d: %w", seg.Name, e.FirstLSN, e.LastLSN, err)
	}
	t := time.Unix(0, env.CommitTimeUnixNano)
	s.ret.commitAt[seg.FirstLSN] = t
	return t, nil
}
