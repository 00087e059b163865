package primary

import (
	"context"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/walship/walship/internal/pace"
)

// Learner pacing (Config.LearnerBytesPerSecond, issue 38): a replica whose
// acks count for nothing under the contract in force — a learner, or a
// node not (yet) a member — is sent the WAL at most at that byte rate, so
// that its catch-up from far behind (a new node fed the whole log) spreads
// its cost over time instead of taking a core from the members commits
// wait on. A member's stream is never paced: it pays one atomic load and
// a pointer compare per batch, and only while a limit is set.

// streamPace is one replica stream's pacing: whether the rule in force
// paces it (worked out again only when the rule changes) and its bucket.
type streamPace struct {
	rule    *ackRule // the rule paced was worked out under
	paced   bool
	p       *pace.Bucket // nil until first paced
	t       *time.Timer
	bytes   prometheus.Counter // walship_replication_paced_bytes_total{replica}
	seconds prometheus.Counter // walship_replication_paced_seconds_total{replica}
}

// pace waits, if the replica is paced, until the n bytes of its next batch
// may go. A wait longer than the heartbeat interval carries heartbeats, so
// that the replica does not take the paced stream for a dead one.
func (x *replicaSender) pace(ctx context.Context, n int) error {
	s := x.r.s
	rate := s.cfg.LearnerBytesPerSecond
	if rate <= 0 {
		return nil
	}
	sp := &x.paceState
	if r := s.peers.ruleNow.Load(); r != sp.rule {
		sp.rule = r
		was := sp.paced
		sp.paced = r != nil && r.members != nil && !r.eligible[x.id]
		if sp.paced != was {
			s.logger.Info("replica stream pacing", "replica", x.id, "paced", sp.paced, "bytes_per_second", rate)
		}
	}
	if !sp.paced {
		return nil
	}
	now := time.Now()
	if sp.p == nil {
		sp.p = pace.New(rate, s.cfg.MaxBatchBytes, now)
		sp.t = time.NewTimer(time.Hour)
		sp.t.Stop()
		sp.bytes = s.metrics.pacedBytes.WithLabelValues(x.id)
		sp.seconds = s.metrics.pacedSeconds.WithLabelValues(x.id)
	}
	d := sp.p.Take(now, n)
	if d <= 0 {
		return nil
	}
	sp.bytes.Add(float64(n))
	sp.seconds.Add(d.Seconds())
	sp.t.Reset(d)
	for {
		select {
		case <-sp.t.C:
			return nil
		case <-x.idle.C:
			if err := x.sendHeartbeat(s.wal.DurableLSN(), s.commit.Load(), false); err != nil {
				return err
			}
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// stop releases the timer.
func (sp *streamPace) stop() {
	if sp.t != nil {
		sp.t.Stop()
	}
}
