package recovery

import (
	"context"
	"log/slog"
	"sync/atomic"
)

// SnapshotSchedule decides when a node writes a state snapshot: once the
// WAL written since the last one reaches everyBytes or the size of the last
// snapshot, whichever is more, or when asked. Sizing the interval by the
// state (Redis's auto-aof-rewrite-percentage 100 with a 64 MiB minimum has
// the same shape) bounds a restart's replay to about one snapshot's worth of
// WAL while keeping snapshots from costing more disk writes than the WAL
// itself: a fixed interval would rewrite a 4 GiB state every 64 MiB of
// commits. One goroutine (Run) takes the snapshots; the write path only
// calls Written, which never blocks.
type SnapshotSchedule struct {
	every    int64
	atLast   atomic.Int64 // WAL bytes written when the last snapshot was taken
	interval atomic.Int64 // WAL bytes between snapshots: max(every, last snapshot's size)
	kick     chan struct{}
}

// NewSnapshotSchedule returns a schedule taking a snapshot every everyBytes
// of WAL, or every snapshot's size of WAL once snapshots are larger.
func NewSnapshotSchedule(everyBytes int64) *SnapshotSchedule {
	s := &SnapshotSchedule{every: everyBytes, kick: make(chan struct{}, 1)}
	s.interval.Store(everyBytes)
	return s
}

// Written reports that the WAL has now had written bytes written in total;
// it wakes Run when a snapshot is due, or at once when force is set.
func (s *SnapshotSchedule) Written(written int64, force bool) {
	if force || written-s.atLast.Load() >= s.interval.Load() {
		select {
		case s.kick <- struct{}{}:
		default: // one is pending already
		}
	}
}

// Taken records a snapshot of snapshotBytes bytes (0 if unknown), taken or
// loaded when the WAL had written bytes written.
func (s *SnapshotSchedule) Taken(written, snapshotBytes int64) {
	s.interval.Store(max(s.every, snapshotBytes))
	s.atLast.Store(written)
}

// Interval returns how many WAL bytes the next snapshot waits for.
func (s *SnapshotSchedule) Interval() int64 { return s.interval.Load() }

// Run calls take whenever a snapshot is due, until ctx ends; take's errors
// are logged (the next one is tried when more WAL arrives).
func (s *SnapshotSchedule) Run(ctx context.Context, logger *slog.Logger, take func() error) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-s.kick:
		}
		if err := take(); err != nil {
			logger.Warn("snapshot failed", "err", err)
		}
	}
}
