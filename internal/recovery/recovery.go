// Package recovery opens a node's durable state — the newest snapshot and
// the WAL after it — and replays the WAL into an in-memory store. The
// primary and the replicas recover the same way, from the same layout:
//
//	<data-dir>/wal/        WAL segments (internal/wal)
//	<data-dir>/snapshots/  state snapshots (internal/state)
package recovery

import (
	"context"
	"fmt"
	"log/slog"
	"math"
	"path/filepath"

	walshipv1 "github.com/walship/walship/gen/walship/v1"
	"github.com/walship/walship/internal/envelope"
	"github.com/walship/walship/internal/state"
	"github.com/walship/walship/internal/vfs"
	"github.com/walship/walship/internal/wal"
	"github.com/walship/walship/pkg/codec"
)

// Options says where and how to recover.
type Options struct {
	DataDir      string
	FS           vfs.FS
	SegmentBytes int64
	Logger       *slog.Logger
	// LimitReplay makes Open apply WAL batches only up to ReplayUpTo (or
	// the snapshot's LSN, if that is higher) and return the rest, unapplied,
	// in Result.Pending: a replica's log may end in batches its primary has
	// not yet made durable, which it must not make readable.
	LimitReplay bool
	ReplayUpTo  uint64
	// PendingDataBytes bounds the Data kept of Result.Pending entries: once
	// their Data adds up to more, later entries come with LSNs only (Data
	// nil) and their owner reads them from the WAL when it needs them. 0
	// keeps none.
	PendingDataBytes int64
}

// Result is a recovered node.
type Result struct {
	Store         *state.Store
	WAL           *wal.Log
	SnapshotPath  string
	SnapshotLSN   uint64
	SnapshotBytes int64  // size of the snapshot file (0 without one)
	Replayed      int    // WAL batches applied after the snapshot
	Epoch         uint64 // highest epoch found in the replayed batches
	// Pending are the WAL batches after the replay limit, in order, not
	// applied (only with Options.LimitReplay).
	Pending []wal.Entry
}

// SnapshotDir is where a node keeps its snapshots.
func SnapshotDir(dataDir string) string { return filepath.Join(dataDir, "snapshots") }

// Open loads the newest valid snapshot, opens (and repairs a torn tail of)
// the WAL, and replays every WAL batch after the snapshot. Every batch in the
// WAL counts as committed from here on.
func Open(o Options) (*Result, error) {
	if o.FS == nil {
		o.FS = vfs.OS
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	snapDir := SnapshotDir(o.DataDir)
	if err := o.FS.MkdirAll(snapDir, vfs.DirPerm); err != nil {
		return nil, fmt.Errorf("create %s: %w", snapDir, err)
	}
	store, snapPath, err := state.LoadLatestSnapshot(o.FS, snapDir)
	if err != nil {
		return nil, fmt.Errorf("load snapshot: %w", err)
	}
	log, err := wal.Open(wal.Options{Dir: filepath.Join(o.DataDir, "wal"), FS: o.FS, SegmentSize: o.SegmentBytes, Logger: o.Logger})
	if err != nil {
		return nil, fmt.Errorf("open wal: %w", err)
	}
	if ri := log.Recovery(); ri.TornSegment != "" {
		o.Logger.Warn("cut a torn WAL tail", "segment", ri.TornSegment, "offset", ri.TornOffset, "bytes", ri.TornBytes, "reason", ri.TornReason)
	}
	res := &Result{Store: store, WAL: log, SnapshotPath: snapPath, SnapshotLSN: store.AppliedLSN(), SnapshotBytes: FileSize(o.FS, snapPath)}
	limit := uint64(math.MaxUint64)
	if o.LimitReplay {
		limit = max(o.ReplayUpTo, res.SnapshotLSN)
	}
	if err := res.replay(limit, o.PendingDataBytes); err != nil {
		_ = log.Close()
		return nil, err
	}
	o.Logger.Info("recovered", "snapshot", snapPath, "snapshot_lsn", res.SnapshotLSN, "replayed_batches", res.Replayed,
		"applied_lsn", store.AppliedLSN(), "wal_first_lsn", log.FirstLSN(), "wal_last_lsn", log.LastLSN(), "wal_bytes", log.Size())
	return res, nil
}

func (r *Result) replay(limit uint64, pendingData int64) error {
	log, applied := r.WAL, r.Store.AppliedLSN()
	switch {
	case log.LastLSN() == 0 && applied > 0:
		// Only a snapshot (or a WAL reset to it): start the log right after it.
		if log.FirstLSN() == 0 {
			if err := log.Reset(applied + 1); err != nil {
				return fmt.Errorf("start wal after snapshot at LSN %d: %w", applied, err)
			}
		}
		return nil
	case log.LastLSN() == 0:
		return nil
	case log.LastLSN() < applied:
		return fmt.Errorf("wal ends at LSN %d, before snapshot %s at LSN %d: the WAL lost synced data", log.LastLSN(), r.SnapshotPath, applied)
	case log.FirstLSN() > applied+1:
		return fmt.Errorf("wal starts at LSN %d but snapshot %q ends at LSN %d: LSNs %d..%d are missing",
			log.FirstLSN(), r.SnapshotPath, applied, applied+1, log.FirstLSN()-1)
	case log.LastLSN() == applied:
		return nil
	}
	rd, err := log.NewReader(applied+1, false)
	if err != nil {
		return fmt.Errorf("replay wal from LSN %d: %w", applied+1, err)
	}
	defer rd.Close()
	var env walshipv1.WalBatch
	var b codec.Batch
	for r.Store.AppliedLSN() < log.LastLSN() {
		e, err := rd.Next(context.Background())
		if err != nil {
			return fmt.Errorf("replay wal at LSN %d: %w", r.Store.AppliedLSN()+1, err)
		}
		if e.LastLSN <= r.Store.AppliedLSN() {
			continue
		}
		if e.LastLSN > limit {
			// Everything from here on stays in the log, unapplied.
			if pendingData -= int64(len(e.Data)); pendingData < 0 {
				e.Data = nil
			}
			r.Pending = append(r.Pending, e)
			if e.LastLSN == log.LastLSN() {
				break
			}
			continue
		}
		if err := envelope.DecodeStored(e.Data, &env, &b); err != nil {
			return fmt.Errorf("replay wal entry %d..%d: %w", e.FirstLSN, e.LastLSN, err)
		}
		if err := r.Store.Apply(&b); err != nil {
			return fmt.Errorf("replay wal entry %d..%d: %w", e.FirstLSN, e.LastLSN, err)
		}
		r.Epoch = max(r.Epoch, env.Epoch)
		r.Replayed++
	}
	return nil
}

// FileSize returns the size of the file at path, or 0 if it cannot be
// stat'ed (or path is empty): for sizing the next snapshot interval, where
// 0 falls back to the configured interval.
func FileSize(fsys vfs.FS, path string) int64 {
	if path == "" {
		return 0
	}
	fi, err := fsys.Stat(path)
	if err != nil {
		return 0
	}
	return fi.Size()
}
