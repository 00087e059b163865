package replica

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	walshipv1 "github.com/walship/walship/gen/walship/v1"
	"github.com/walship/walship/internal/archive"
	"github.com/walship/walship/internal/datadir"
	"github.com/walship/walship/internal/rpcerr"
)

// The archive rung: when neither the primary nor any log store can serve
// the replica — the primary is unreachable, or cannot stream a snapshot,
// and the log stores have cut its next LSN — it reads the archive
// (Config.Archive, internal/archive): the chunks of the archive's lineage
// from its next LSN on, or, when the archive no longer holds that LSN
// either (or the replica is new), the newest base snapshot of the lineage
// whose chunks reach furthest, then those chunks. Every batch goes
// through the checks a log store's does (CRC, continuity, epochs, decode:
// process), and every object's checksum is checked as it is read. The
// archive holds only LSNs a majority of the log stores held (its uploader
// never goes past the primary's log-store quorum LSN), which no failover
// cuts: a replica caught up from it never holds a tail a new epoch takes
// back. It never moves the replica's state backwards, and reads nothing
// for a replica whose log leaves the archive's lineage (a tail the
// primary of a later epoch will cut, with Diverged).

// errNothingArchived: the archive holds nothing this replica lacks (it is
// caught up with it, or the archive is empty).
var errNothingArchived = errors.New("nothing archived for this replica")

// archiveParallel is how many chunks the rung downloads ahead of the
// replay.
const archiveParallel = 4

// archiveChunkTimeout bounds one chunk's wait: a store that stalls ends
// the rung (the follower goes back to the primary) rather than hold it.
const archiveChunkTimeout = 2 * time.Minute

// readArchive is the archive rung. progress reports whether anything was
// applied or installed.
func (s *Server) readArchive(ctx context.Context) (progress bool, err error) {
	if s.arch == nil {
		return false, errors.New("no archive is configured (--archive)")
	}
	if s.follower.reseedBack {
		// Moving back (after a divergence) is the primary's state to take.
		return false, errors.New("this replica must re-seed from its primary to undo a diverged tail, not from the archive")
	}
	defer func() {
		if err != nil && !errors.Is(err, errFatal) && !errors.Is(err, errNothingArchived) && ctx.Err() == nil {
			s.metrics.archiveErrors.Inc()
		}
	}()
	cat, err := s.arch.Catalog(ctx, s.cluster.ID())
	if err != nil {
		var me *archive.ClusterMismatchError
		if errors.As(err, &me) {
			s.metrics.clusterMismatch.Inc()
			return false, rpcerr.Mismatch("the archive %s belongs to cluster %s, this replica to cluster %s (check --archive)", s.arch, me.Theirs, me.Ours)
		}
		return false, fmt.Errorf("the archive %s: %w", s.arch, err)
	}
	if len(cat.Lineage) == 0 {
		return false, fmt.Errorf("the archive %s holds no epoch history: it cannot tell which batches are the cluster's", s.arch)
	}
	// A source the replica asks itself: believed within the gap bound.
	if err := datadir.CheckProto(cat.Lineage.Proto(), s.vote.Load().Epoch, datadir.MaxEpochGap); err != nil {
		return false, fmt.Errorf("the archive %s: its lineage: %w", s.arch, err)
	}
	if last := s.wal.LastLSN(); last > 0 {
		own := logHistory(*s.history.Load(), last)
		if keep, all, known := cat.Lineage.SharedUpTo(own); !all && (!known || keep < last) {
			return false, fmt.Errorf("this replica's log (history %v) leaves the archive's lineage %v after LSN %d: it holds entries the archive's epochs do not; only a primary can mend that", own, cat.Lineage, keep)
		}
	}
	start, err := s.archiveStart(cat)
	if err != nil {
		return false, err
	}
	if err := s.adoptCluster(cat.ClusterID, "the archive "+s.arch.String()); err != nil {
		return false, err
	}
	if start.snap != nil {
		if err := s.reseedFromArchive(ctx, cat, *start.snap); err != nil {
			return false, err
		}
		progress = true
	}
	n, err := s.readChunks(ctx, cat, start.run)
	return progress || n > 0, err
}

// archiveStart is where the rung starts: the replica's own position or a
// snapshot, with the chunks that continue it.
type archiveStartPoint struct {
	snap *archive.SnapshotRef // nil: from the replica's next LSN
	run  archive.Run
}

// archiveStart picks where to start: of the replica's own position (if
// the archive holds its next LSN) and each snapshot of the lineage newer
// than its state (and of no older epoch than its log's), the one whose
// chunks reach furthest; on a tie the replica's own position (it reads
// what it lacks, as from a log store), unless it holds nothing yet, which
// takes the newest snapshot (a state is less to read than the whole log).
func (s *Server) archiveStart(cat *archive.Catalog) (archiveStartPoint, error) {
	last, applied, epoch := s.wal.LastLSN(), s.appliedLSN(), s.epoch.Load()
	var best *archiveStartPoint
	if run := cat.Cover(last); run.To > last {
		best = &archiveStartPoint{run: run}
	}
	for i := range cat.Snapshots {
		sn := &cat.Snapshots[i]
		if sn.LSN <= applied || sn.LSN <= last || sn.Epoch < epoch || !cat.SnapshotInLineage(*sn) {
			continue
		}
		run := cat.Cover(sn.LSN)
		if best == nil || run.To > best.run.To || (run.To == best.run.To && (best.snap != nil || applied == 0)) {
			best = &archiveStartPoint{snap: sn, run: run}
		}
	}
	if best == nil {
		w := cat.Window()
		return archiveStartPoint{}, fmt.Errorf("%w: the archive %s holds neither LSN %d nor a snapshot newer than this replica's state (LSN %d): restorable %v, %d chunks, %d snapshots",
			errNothingArchived, s.arch, last+1, applied, w.Ranges, len(cat.Chunks), len(cat.Snapshots))
	}
	return *best, nil
}

// reseedFromArchive installs the archive's snapshot ref as the replica's
// state, as a re-seed from a log store's does.
func (s *Server) reseedFromArchive(ctx context.Context, cat *archive.Catalog, ref archive.SnapshotRef) error {
	start := time.Now()
	s.logger.Info("re-seeding from the archive's snapshot", "archive", s.arch.String(), "lsn", ref.LSN, "epoch", ref.Epoch, "bytes", ref.Size)
	// The download goes to a temporary file beside the data (a crash may
	// leave one: removed here, before the next).
	if old, _ := filepath.Glob(filepath.Join(s.cfg.DataDir, archive.SnapshotTempPattern)); len(old) > 0 {
		for _, f := range old {
			_ = os.Remove(f)
		}
	}
	store, hdr, err := s.arch.LoadSnapshot(ctx, cat.ClusterID, ref, s.cfg.DataDir)
	if err != nil {
		return fmt.Errorf("the archive's snapshot at LSN %d: %w", ref.LSN, err)
	}
	// Taken of the lineage's log: its history must not leave the lineage
	// before its LSN (a snapshot of a deposed tail would).
	hist := datadir.HistoryFromProto(hdr.GetHistory())
	if err := hist.Check(cat.Lineage.Current().Epoch, datadir.MaxEpochGap); err != nil {
		return fmt.Errorf("the archive's snapshot at LSN %d: history%w", ref.LSN, err)
	}
	if len(hist) > 0 {
		if shared, all, _ := cat.Lineage.SharedUpTo(hist); !all && shared < hdr.GetLsn() {
			return fmt.Errorf("the archive's snapshot at LSN %d has history %v, which leaves the lineage %v at LSN %d", ref.LSN, hist, cat.Lineage, shared)
		}
	}
	// Checked again now that it is read: nothing else moves the state.
	if applied := s.appliedLSN(); hdr.GetLsn() <= applied {
		return fmt.Errorf("the archive's snapshot at LSN %d is not newer than this replica's applied LSN %d", hdr.GetLsn(), applied)
	}
	if e := s.epoch.Load(); hdr.GetEpoch() < e {
		return fmt.Errorf("the archive's snapshot at LSN %d is of epoch %d, this replica's log is at epoch %d", hdr.GetLsn(), hdr.GetEpoch(), e)
	}
	if err := s.install(store, hdr.GetEpoch()); err != nil {
		return err
	}
	// The archive holds only what a log store majority made durable,
	// which no failover cuts: readable at once (readable.go).
	s.rd.committed(hdr.GetLsn())
	s.metrics.archiveReseeds.Inc()
	s.logger.Info("re-seeded from the archive's snapshot", "archive", s.arch.String(), "lsn", hdr.GetLsn(), "keys", hdr.GetKeys(), "took", time.Since(start))
	return nil
}

// readChunks reads run's batches after the replica's last LSN and
// processes them as a log store's (checked, written, synced, applied), a
// round of at most maxRound batches at a time. It returns how many
// batches it applied.
func (s *Server) readChunks(ctx context.Context, cat *archive.Catalog, run archive.Run) (int, error) {
	from := s.wal.LastLSN() + 1
	if run.To < from {
		return 0, nil
	}
	rd := s.arch.ReadRun(ctx, cat.ClusterID, run.Chunks, from, archiveParallel)
	defer rd.Close()
	applied := 0
	defer func() {
		if applied > 0 {
			s.logger.Info("caught up from the archive", "archive", s.arch.String(), "from_lsn", from, "to_lsn", s.appliedLSN(), "batches", applied)
		}
	}()
	round := make([]*walshipv1.WalBatch, 0, maxRound)
	flush := func() error {
		if len(round) == 0 {
			return nil
		}
		n, err := s.process(round, nil)
		applied += n
		if n > 0 {
			// Only what a log store majority made durable is archived,
			// and no failover cuts that: readable at once (readable.go).
			s.rd.committed(min(s.appliedLSN(), round[len(round)-1].GetLastLsn()))
		}
		s.metrics.archiveBatches.Add(float64(n))
		clear(round)
		round = round[:0]
		return err
	}
	for {
		env, err := s.nextArchived(ctx, rd)
		if errors.Is(err, io.EOF) {
			return applied, flush()
		}
		if err != nil {
			if ferr := flush(); ferr != nil {
				return applied, ferr
			}
			return applied, fmt.Errorf("the archive %s: %w", s.arch, err)
		}
		round = append(round, env)
		if len(round) == maxRound {
			if err := flush(); err != nil {
				return applied, err
			}
		}
	}
}

// nextArchived is rd.Next, given up on after archiveChunkTimeout.
func (s *Server) nextArchived(ctx context.Context, rd *archive.RunReader) (*walshipv1.WalBatch, error) {
	t := time.AfterFunc(archiveChunkTimeout, rd.Close)
	defer t.Stop()
	env, _, err := rd.Next()
	if err != nil && ctx.Err() == nil && errors.Is(err, context.Canceled) {
		err = fmt.Errorf("nothing from the archive for %v: %w", archiveChunkTimeout, err)
	}
	return env, err
}
