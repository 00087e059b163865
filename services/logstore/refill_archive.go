package logstore

import (
	"context"
	"errors"
	"fmt"
	"time"

	walshipv1 "github.com/walship/walship/gen/walship/v1"
	"github.com/walship/walship/internal/archive"
	"github.com/walship/walship/internal/datadir"
)

// A refill that no peer can serve — their retention cut what the log
// store lacks, every peer is gone, or none fits (refilling itself, of an
// older epoch than the promise) — copies what it can from the archive
// (Config.Archive), through the same writer and checks as a peer's
// batches (admitRefill): the archive's chunks are judged against its
// lineage (the newest epoch's history object), every batch must be of the
// epoch the lineage gives its first LSN, and a promise newer than the
// lineage's last epoch stops it, as with a peer whose log ends in an older
// epoch. The lineage must hold this log store's whole log. What follows
// the archive comes from the peers, or the primary, in the next pass.
//
// An empty log store takes the newest start (LSN 1, or a base snapshot of
// the lineage) from which the archive's chunks reach furthest, and with
// its first batch the lineage's epochs before it: the log it ends with is
// as its peers' would be after their retention, not the whole archive.
// One whose peers all answer empty is a new cluster's: it copies nothing
// (an archive with a history at that prefix is another cluster's, or an
// earlier one's).

// errArchiveCannot marks why the archive cannot refill this log store:
// no failure to retry, the refill goes on as if there were no archive.
var errArchiveCannot = errors.New("the archive cannot refill this log store")

// archiveRefillParallel is how many chunks a refill downloads ahead.
const archiveRefillParallel = 4

// refillArchive copies what the archive holds after this log store's log
// (refiller only). It returns how many batches it handed to the writer.
func (s *Server) refillArchive(ctx context.Context) (int, error) {
	a := s.arch.a
	cannot := func(format string, args ...any) (int, error) {
		return 0, fmt.Errorf("%w: %s: %s", errArchiveCannot, a, fmt.Sprintf(format, args...))
	}
	cat, err := a.Catalog(ctx, s.cluster.ID())
	if err != nil {
		var me *archive.ClusterMismatchError
		if errors.As(err, &me) {
			s.metrics.clusterMismatch.Inc()
			return cannot("%v", err)
		}
		return 0, err
	}
	if len(cat.Chunks) == 0 {
		return cannot("it holds no WAL chunk")
	}
	lineage := cat.Lineage
	if len(lineage) == 0 {
		return cannot("it holds no epoch history: which batches are the cluster's cannot be told")
	}
	// The archive is a source this log store asks itself, as a refill
	// peer: what its lineage says is believed only within the gap bound.
	if err := datadir.CheckProto(lineage.Proto(), s.knownEpoch(), datadir.MaxEpochGap); err != nil {
		return cannot("its lineage: %v", err)
	}
	if e, v := lineage.Current().Epoch, s.vote.Load().Epoch; e < v {
		return cannot("its lineage ends in epoch %d, older than this log store's promise (epoch %d): epoch %d's history is not in it yet", e, v, v)
	}
	durable := s.durableLSN()
	empty := s.wal.FirstLSN() == 0
	var run archive.Run
	if empty {
		run = longestRun(cat)
	} else {
		own := *s.history.Load()
		if len(own) == 0 {
			return cannot("this log store's log has no epoch history (written before histories were kept)")
		}
		if keep, all, known := lineage.SharedUpTo(own); !all && (!known || keep < durable) {
			return cannot("its lineage %v does not hold this log store's entries after LSN %d (history %v)", lineage, keep, own)
		}
		run = cat.Cover(durable)
	}
	from := durable + 1
	if empty {
		from = run.From + 1
	}
	if len(run.Chunks) == 0 || run.To < from {
		return cannot("its lineage's chunks hold nothing from LSN %d on (%d chunks)", from, len(cat.Chunks))
	}
	start := time.Now()
	rf := &refill{peer: "the archive " + a.String(), lastEpoch: lineage.Current().Epoch, history: lineage, clusterID: cat.ClusterID,
		adoptHistory: empty, fromArchive: true}
	s.logger.Info("refilling from the archive", "archive", a.String(), "from_lsn", from, "to_lsn", run.To,
		"chunks", len(run.Chunks), "lineage", fmt.Sprint(lineage), "durable_lsn", durable)
	rd := a.ReadRun(ctx, cat.ClusterID, run.Chunks, from, archiveRefillParallel)
	defer rd.Close()
	n, err := s.feed(ctx, rf, func() (*walshipv1.WalBatch, error) {
		env, _, err := rd.Next()
		return env, err
	})
	if err != nil {
		return n, err
	}
	s.logger.Info("refilled from the archive", "archive", a.String(), "from_lsn", from, "durable_lsn", s.durableLSN(),
		"batches", n, "took", time.Since(start))
	return n, nil
}

// longestRun is where an empty log store starts in the archive: of LSN 1
// and each snapshot of the lineage, the newest from which the lineage's
// chunks reach furthest.
func longestRun(cat *archive.Catalog) archive.Run {
	best := cat.Cover(0)
	for _, sn := range cat.Snapshots {
		if !cat.SnapshotInLineage(sn) {
			continue
		}
		if r := cat.Cover(sn.LSN); len(r.Chunks) > 0 && r.To >= best.To {
			best = r
		}
	}
	return best
}
