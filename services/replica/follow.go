package replica

import (
	"context"
	"errors"
	"time"

	walshipv1 "github.com/walship/walship/gen/walship/v1"
	"github.com/walship/walship/internal/backoff"
	"github.com/walship/walship/internal/rpcerr"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// errFatal marks an error that ends the follower (and Run): the WAL failed.
var errFatal = errors.New("replica: fatal")

func (s *Server) setRung(r walshipv1.CatchUpRung) {
	if walshipv1.CatchUpRung(s.follower.rung.Swap(int32(r))) != r {
		s.logger.Info("catch-up rung", "rung", rungLabel(r), "next_lsn", s.wal.LastLSN()+1)
	}
	s.metrics.setRung(r)
}

// follow walks the catch-up ladder until ctx is done (nil) or the WAL fails
// (the error).
func (s *Server) follow(ctx context.Context) error {
	l := &ladder{rung: walshipv1.CatchUpRung_CATCH_UP_RUNG_PRIMARY, lastPrimary: s.primary()}
	for ctx.Err() == nil {
		s.setRung(l.rung)
		progress, err := s.climb(ctx, l.rung)
		if errors.Is(err, errFatal) {
			s.logger.Error("replica stopped: its WAL failed", "err", err)
			return err
		}
		if ctx.Err() != nil {
			return nil
		}
		next, err := s.afterRung(ctx, l, progress, err)
		if err != nil {
			s.logger.Error("replica stopped: its WAL failed", "err", err)
			return err
		}
		switch next {
		case retrySoon:
			t := time.NewTimer(notYetPrimaryRetry)
			select {
			case <-t.C:
			case <-ctx.Done():
				t.Stop()
				return nil
			}
		case retryAfterBackoff:
			if p := s.primary(); p != l.lastPrimary {
				// A new primary to follow (a fence, a refusal naming it):
				// it may be restarting its server as it changes role; try
				// again soon rather than at the failures' backoff.
				l.lastPrimary = p
				l.bo.Reset()
			}
			if !s.waitRetry(ctx, &l.bo) {
				return nil
			}
		}
	}
	return nil
}

// ladder is where the follower is on the catch-up ladder and how its
// failures stand.
type ladder struct {
	rung        walshipv1.CatchUpRung
	bo          backoff.Backoff
	failures    int    // streams ended by a failure since one made progress
	lastPrimary string // the primary followed when the last failure was waited out
	// primaryDown: the archive rung was taken because the primary kept
	// failing; after it the replica goes back to the primary, not to the
	// log stores (whose tail may not have reached a majority yet, and a
	// failover may be under way). archiveAsked is when that last happened:
	// while the primary stays down the archive is listed again only every
	// archiveWhilePrimaryDown.
	primaryDown  bool
	archiveAsked time.Time
}

// archiveWhilePrimaryDown is how often a replica whose primary does not
// answer looks in the archive for what it lacks (a listing of the whole
// archive each time).
const archiveWhilePrimaryDown = 30 * time.Second

// retry is how soon the follower climbs its next rung.
type retry int

const (
	retryNow          retry = iota // at once: a rung change or a cut is no failure
	retrySoon                      // after notYetPrimaryRetry: a candidate not open yet
	retryAfterBackoff              // after the failures' backoff
)

// climb runs one rung: a stream from the primary, a read from the log
// store, a re-seed or a read of the archive. progress reports whether
// anything was applied.
func (s *Server) climb(ctx context.Context, rung walshipv1.CatchUpRung) (progress bool, err error) {
	switch rung {
	case walshipv1.CatchUpRung_CATCH_UP_RUNG_PRIMARY:
		return s.streamFromPrimary(ctx)
	case walshipv1.CatchUpRung_CATCH_UP_RUNG_LOGSTORE:
		return s.readLogStore(ctx)
	case walshipv1.CatchUpRung_CATCH_UP_RUNG_ARCHIVE:
		return s.readArchive(ctx)
	default:
		return s.reseed(ctx)
	}
}

// afterRung picks the rung to climb next from how the last one ended, and
// how soon. Its error is fatal: the WAL failed cutting a diverged tail.
func (s *Server) afterRung(ctx context.Context, l *ladder, progress bool, err error) (retry, error) {
	var div *divergedError
	switch {
	case errors.As(err, &div):
		return retryNow, s.afterDiverged(l, div)
	case l.rung == walshipv1.CatchUpRung_CATCH_UP_RUNG_LOGSTORE:
		return s.afterLogStore(l, progress, err), nil
	case l.rung == walshipv1.CatchUpRung_CATCH_UP_RUNG_SNAPSHOT:
		return s.afterReseed(l, err), nil
	case l.rung == walshipv1.CatchUpRung_CATCH_UP_RUNG_ARCHIVE:
		return s.afterArchive(l, progress, err), nil
	default:
		return s.afterStream(ctx, l, progress, err), nil
	}
}

// afterDiverged cuts the entries the primary does not have and reconnects,
// or, if it cannot cut them, goes to the snapshot rung. Either way it is
// not a failure: no backoff.
func (s *Server) afterDiverged(l *ladder, div *divergedError) error {
	cut, err := s.cutDiverged(div.keep)
	if err != nil {
		return err
	}
	s.metrics.diverged.Inc()
	if cut {
		s.logger.Warn("cut entries the primary lost in a crash; reconnecting", "truncate_after_lsn", div.keep, "epoch", div.epoch)
		return nil
	}
	s.logger.Warn("cannot cut this replica's log where the primary diverged (it applied past the cut, or the cut is inside a batch); re-seeding from a snapshot",
		"truncate_after_lsn", div.keep, "applied_lsn", s.appliedLSN(), "epoch", div.epoch)
	l.rung = walshipv1.CatchUpRung_CATCH_UP_RUNG_SNAPSHOT
	return nil
}

// afterLogStore goes back to the primary if the log store supplied
// something, and on to a snapshot if not.
func (s *Server) afterLogStore(l *ladder, progress bool, err error) retry {
	if progress {
		l.rung = walshipv1.CatchUpRung_CATCH_UP_RUNG_PRIMARY
		l.bo.Reset()
		return retryNow
	}
	s.logger.Warn("the log store cannot supply the LSN this replica needs; re-seeding from a snapshot",
		"next_lsn", s.wal.LastLSN()+1, "err", err)
	l.rung = walshipv1.CatchUpRung_CATCH_UP_RUNG_SNAPSHOT
	return retryNow
}

// afterReseed goes back to the primary after a re-seed, or after a failed
// one that may fall back to streaming.
func (s *Server) afterReseed(l *ladder, err error) retry {
	if err == nil {
		l.rung = walshipv1.CatchUpRung_CATCH_UP_RUNG_PRIMARY
		l.bo.Reset()
		return retryNow
	}
	if !s.follower.reseedBack {
		if s.arch != nil {
			// Neither the log stores nor the primary could re-seed this
			// replica: the archive may.
			s.logger.Warn("re-seeding from the primary's snapshot failed; trying the archive", "err", err)
			l.rung = walshipv1.CatchUpRung_CATCH_UP_RUNG_ARCHIVE
			return retryNow
		}
		// A forward re-seed can fall back to streaming; one that must undo
		// a diverged tail has to finish first (the primary would stream
		// onto that tail).
		l.rung = walshipv1.CatchUpRung_CATCH_UP_RUNG_PRIMARY
	}
	s.logger.Error("re-seeding from the primary's snapshot failed", "err", err, "retry_rung", rungLabel(l.rung))
	return retryAfterBackoff
}

// afterArchive goes on after the archive rung: if it brought the replica
// forward, to the log stores for what follows the archive (or straight to
// the primary when it was the primary's failures that led here, or there
// is no log store); if not, back to the primary, after the failures'
// backoff.
func (s *Server) afterArchive(l *ladder, progress bool, err error) retry {
	down := l.primaryDown
	l.primaryDown = false
	l.rung = walshipv1.CatchUpRung_CATCH_UP_RUNG_PRIMARY
	if progress {
		if len(s.logStoreSets()) > 0 && !down {
			l.rung = walshipv1.CatchUpRung_CATCH_UP_RUNG_LOGSTORE
		}
		if err != nil {
			s.logger.Warn("the archive rung stopped early", "applied_lsn", s.appliedLSN(), "err", err)
		}
		l.bo.Reset()
		return retryNow
	}
	if errors.Is(err, errNothingArchived) {
		s.logger.Info("nothing in the archive for this replica; back to the primary", "next_lsn", s.wal.LastLSN()+1, "why", err)
	} else {
		s.logger.Warn("the archive cannot serve this replica; back to the primary", "next_lsn", s.wal.LastLSN()+1, "err", err)
	}
	return retryAfterBackoff
}

// afterStream handles the end of a stream from the primary: down a rung if
// the primary no longer retains what the replica needs, to another primary
// if the node named one, and otherwise a failure to retry.
func (s *Server) afterStream(ctx context.Context, l *ladder, progress bool, err error) retry {
	code := status.Code(err)
	var ref *refusal
	switch {
	case rpcerr.IsOtherCluster(err):
		// Pointed at a primary of another cluster (or it at us): never
		// follow it. Only an operator can tell which side is wrong.
		if refuser, _, ok := rpcerr.ClusterIDs(err); ok && refuser != s.cluster.ID() {
			s.metrics.clusterMismatch.Inc() // the primary's refusal (this replica's own is counted where made)
		}
		s.logger.Error("the primary belongs to another cluster: not following it (check --primary and the data directory); retrying",
			"primary", s.primary(), "cluster_id", s.cluster.ID(), "err", err)
	case code == codes.OutOfRange:
		next := walshipv1.CatchUpRung_CATCH_UP_RUNG_SNAPSHOT
		if len(s.logStoreSets()) > 0 {
			next = walshipv1.CatchUpRung_CATCH_UP_RUNG_LOGSTORE
		}
		s.logger.Warn("the primary no longer retains the LSN this replica needs", "next_lsn", s.wal.LastLSN()+1,
			"then", rungLabel(next), "err", err)
		l.rung = next
		return retryNow // a rung change is not a failure: no backoff
	case errors.As(err, &ref):
		s.logger.Error("refused a batch from the primary; reconnecting", "reason", ref.reason, "err", ref.err,
			"next_lsn", s.wal.LastLSN()+1)
		if ref.ahead {
			// A promotion while this replica was away may have fenced the
			// others in steps past the jump: the log stores know.
			s.askLogStore(ctx)
		}
	case s.namedByOtherCluster(err):
		// A node of another cluster named its primary: not ours to follow.
	case s.learnPrimary(err):
		// Asked a node that is not the primary: it named the one it
		// knows, which this replica follows from now on.
		return retryNow
	case s.isNotPrimary(err):
		// The node this replica promised is not the primary yet: a
		// candidate still catching up or waiting out the old primary's
		// lease. Ask again shortly; it opens within a lease.
		return retrySoon
	case s.namedAhead(err):
		// A promotion while this replica was away may have fenced the
		// others in steps past the jump: the log stores know.
		s.logger.Warn("a node that is not the primary names a primary too far ahead to take its word for; asking the log stores", "node", s.primary(), "err", err)
		s.askLogStore(ctx)
	case code == codes.FailedPrecondition:
		// Diverged, ahead of the primary, or in a newer epoch: this needs
		// an operator's judgement, never an automatic wipe.
		s.logger.Error("the primary refuses this replica (diverged, ahead, or a stale primary); retrying",
			"next_lsn", s.wal.LastLSN()+1, "epoch", s.epoch.Load(), "err", err)
	case code == codes.InvalidArgument:
		s.logger.Error("the primary rejected the replication hello", "id", s.cfg.ID, "err", err)
	default:
		if progress {
			l.bo.Reset()
			l.failures = 0
		}
		s.logger.Warn("replication stream ended; reconnecting", "next_lsn", s.wal.LastLSN()+1, "err", err)
		if l.failures++; l.failures%5 == 0 {
			// The primary has been away a while: a failover may have
			// happened while this replica could not be fenced. The log
			// store knows the newest epoch's primary.
			before := s.primary()
			s.askLogStore(ctx)
			if s.arch != nil && s.primary() == before && time.Since(l.archiveAsked) >= archiveWhilePrimaryDown {
				// Meanwhile the archive may hold what this replica lacks
				// (it is new, or it was away): only LSNs a log-store
				// majority held, which no failover takes back.
				s.logger.Info("the primary is still unreachable; reading the archive meanwhile", "primary", before, "next_lsn", s.wal.LastLSN()+1)
				l.rung, l.primaryDown, l.archiveAsked = walshipv1.CatchUpRung_CATCH_UP_RUNG_ARCHIVE, true, time.Now()
				return retryNow
			}
		}
	}
	return retryAfterBackoff
}

// waitRetry waits out bo, or less if the primary to follow changes; it
// reports false when ctx ended.
func (s *Server) waitRetry(ctx context.Context, bo *backoff.Backoff) bool {
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		select {
		case <-s.follower.newPrimary:
			cancel()
		case <-wctx.Done():
		}
	}()
	bo.Wait(wctx)
	return ctx.Err() == nil
}

// notYetPrimaryRetry is how soon a replica asks again a candidate that
// is not the primary yet.
const notYetPrimaryRetry = 20 * time.Millisecond

// silence is how long a stream from the primary or a log store may bring
// nothing before the replica gives up on it: ten heartbeats, at least 5 s.
func (s *Server) silence() time.Duration { return max(10*s.cfg.HeartbeatInterval, 5*time.Second) }
