package logstore

import (
	"context"
	"errors"
	"fmt"
	"time"

	walshipv1 "github.com/walship/walship/gen/walship/v1"
	"github.com/walship/walship/internal/envelope"
	"github.com/walship/walship/internal/wal"
)

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
			case <-s.retKick:
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
func (s *Server) enforceRetention(ctx context.Context) (int, error) {
	s.retMu.Lock()
	defer s.retMu.Unlock()
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
	if cut == 0 {
		return 0, nil
	}
	s.walMu.Lock()
	removed, err := s.wal.TruncateBefore(segs[cut].FirstLSN)
	s.walMu.Unlock()
	for _, seg := range segs[:removed] {
		delete(s.commitAt, seg.FirstLSN)
	}
	first := s.wal.FirstLSN()
	s.firstKept.Advance(first)
	if removed > 0 {
		s.logger.Info("retention removed segments", "segments", removed, "first_lsn", first, "stored_bytes", s.wal.Size())
	}
	if err != nil {
		return removed, fmt.Errorf("truncate before LSN %d: %w", segs[cut].FirstLSN, err)
	}
	return removed, nil
}

// segmentTime returns the commit time of a sealed segment's newest batch,
// cached: a sealed segment never changes.
func (s *Server) segmentTime(ctx context.Context, seg wal.SegmentInfo) (time.Time, error) {
	if t, ok := s.commitAt[seg.FirstLSN]; ok {
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
	s.commitAt[seg.FirstLSN] = t
	return t, nil
}
