package recovery

import (
	"context"
	"log/slog"
	"sync/atomic"
)

// SnapshotSchedule decides when a node writes a state snapshot: once
// everyBytes of WAL were written since the last one, or when asked. One
// goroutine (Run) takes the snapshots; the write path only calls Written,
// which never blocks.
type SnapshotSchedule struct {
	every  int64
	atLast atomic.Int64 // WAL bytes written when the last snapshot was taken
	kick   chan struct{}
}

// NewSnapshotSchedule returns a schedule taking a snapshot every everyBytes
// of WAL.
func NewSnapshotSchedule(everyBytes int64) *SnapshotSchedule {
	return &SnapshotSchedule{every: everyBytes, kick: make(chan struct{}, 1)}
}

// Written reports that the WAL has now had written bytes written in total;
// it wakes Run when a snapshot is due, or at once when force is set.
func (s *SnapshotSchedule) Written(written int64, force bool) {
	if force || written-s.atLast.Load() >= s.every {
		select {
		case s.kick <- struct{}{}:
		default: // one is pending already
		}
	}
}

// Taken records a snapshot taken when the WAL had written bytes written.
func (s *SnapshotSchedule) Taken(written int64) { s.atLast.Store(written) }

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
