package logstore

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	walshipv1 "github.com/walship/walship/gen/walship/v1"
	"github.com/walship/walship/internal/datadir"
	"github.com/walship/walship/internal/failover"
	"github.com/walship/walship/internal/rpcerr"
	"github.com/walship/walship/internal/wal"
	"google.golang.org/protobuf/types/known/durationpb"
)

// epochServer is the log store's EpochService: its part of the epoch vote.
type epochServer struct {
	walshipv1.UnimplementedEpochServiceServer
	s *Server
}

// fenceResult is the writer's answer to a Fence.
type fenceResult struct {
	resp *walshipv1.FenceResponse
	err  error
}

// Fence promises a newer epoch to a candidate. The writer answers it in
// queue order: every batch queued before it is stored and fsynced first,
// and nothing of an older epoch is accepted after it.
func (h *epochServer) Fence(ctx context.Context, req *walshipv1.FenceRequest) (*walshipv1.FenceResponse, error) {
	s := h.s
	if err := checkFence(req, s.knownEpoch()); err != nil {
		return nil, toStatus(err)
	}
	r := &appendReq{fence: req, fenced: make(chan fenceResult, 1)}
	s.mu.Lock()
	switch {
	case s.fatal != nil:
		s.mu.Unlock()
		return nil, toStatus(refuse(rpcerr.ErrUnavailable, "log store failed: %v", s.fatal))
	case s.stopping, s.w.closed:
		s.mu.Unlock()
		return nil, toStatus(errStopping)
	}
	s.w.queue = append(s.w.queue, r)
	s.w.urgent = true
	s.mu.Unlock()
	select {
	case s.w.kick <- struct{}{}:
	default:
	}
	select {
	case res := <-r.fenced:
		return res.resp, toStatus(res.err)
	case <-ctx.Done():
		// The writer still answers (into the buffered channel): the
		// promise, if made, holds.
		return nil, toStatus(ctx.Err())
	}
}

// checkFence validates a FenceRequest against known, the log store's
// newest epoch (a promise only grows, so one that passes here is still
// within the bound when the writer grants it); the error names the field.
func checkFence(req *walshipv1.FenceRequest, known uint64) error {
	switch {
	case req.GetEpoch() == 0:
		return refuse(rpcerr.ErrInvalid, "epoch: must be at least 1")
	case datadir.CheckEpoch(req.GetEpoch(), known, datadir.MaxEpochJump) != nil:
		return refuse(rpcerr.ErrInvalid, "epoch: %v", datadir.CheckEpoch(req.GetEpoch(), known, datadir.MaxEpochJump))
	case datadir.ValidateNodeID(req.GetCandidateId()) != nil:
		return refuse(rpcerr.ErrInvalid, "candidate_id: %v", datadir.ValidateNodeID(req.GetCandidateId()))
	case req.GetCandidateAddr() != "" && datadir.ValidateAddr(req.GetCandidateAddr()) != nil:
		return refuse(rpcerr.ErrInvalid, "candidate_addr: %v", datadir.ValidateAddr(req.GetCandidateAddr()))
	}
	return rpcerr.CheckClusterID("cluster_id", req.GetClusterId())
}

// handleFence answers a fence on the writer goroutine (walMu held by no
// one else meanwhile) by the failover core's rule (I1, I4, I8): refuse a
// candidate of another cluster, changing nothing; grant it if its epoch is
// newer than the promise — and it states the log store's cluster id, once
// the log store has one — persisting the candidate's cluster id (if the
// log store had none) and the new promise first, and end every Append
// stream of an older epoch so that a deposed primary learns at once; the
// same candidate asking again is granted again. An error is fatal.
func (s *Server) handleFence(r *appendReq) error {
	s.walMu.Lock()
	defer s.walMu.Unlock()
	req := r.fence
	st := s.acceptor().Fence(failover.Fence{Epoch: req.GetEpoch(), Candidate: req.GetCandidateId(), Addr: req.GetCandidateAddr(), Cluster: req.GetClusterId()})
	if st.Refused != nil {
		r.fenced <- fenceResult{err: s.clusterRefused(req.GetClusterId(), "the candidate "+req.GetCandidateId())}
		return nil
	}
	resp := s.fenceState()
	promised := false
	for _, e := range st.Effects {
		var err error
		switch e := e.(type) {
		case failover.AdoptCluster:
			err = s.adoptCluster(e.ID, e.From)
		case failover.SaveVote:
			err, promised = s.saveVote(e.Vote), true
		default:
			err = fmt.Errorf("the log store does not carry out %T", e)
		}
		if err != nil {
			r.fenced <- fenceResult{err: refuse(rpcerr.ErrUnavailable, "log store failed: %v", err)}
			return err
		}
	}
	// The primary's last contact, read once the promise is published: it
	// covers every heartbeat echoed at once before it (echo.go).
	if last := s.lastContact(); !last.IsZero() {
		resp.SincePrimaryContact = durationpb.New(time.Since(last))
	}
	// Any other candidate learns who holds the epoch, as Status tells,
	// which deposes a primary that restarted without a cluster id.
	v := *s.vote.Load()
	resp.Granted, resp.Epoch, resp.PrimaryId, resp.PrimaryAddr = st.Granted, v.Epoch, v.Primary, v.Addr
	if promised {
		s.metrics.fences.Inc()
		resp.ClusterId = s.cluster.ID()
		stale := refuse(rpcerr.ErrStaleEpoch, "fenced: the log store promised epoch %d to %s (%s)", v.Epoch, v.Primary, v.Addr)
		s.mu.Lock()
		for st := range s.streams {
			if st.epoch < v.Epoch {
				st.setErr(stale)
			}
		}
		s.mu.Unlock()
	}
	r.fenced <- fenceResult{resp: resp}
	return nil
}

// acceptor is the log store's part of the protocol as the failover core
// reads it: its promise, its log's newest epoch and its cluster.
func (s *Server) acceptor() failover.State {
	st := failover.State{Vote: *s.vote.Load(), LogEpoch: s.logEpoch.Load(), Cluster: s.cluster.ID()}
	if lp := s.logPrimary.Load(); lp != nil {
		st.LogPrimary = *lp
	}
	return st
}

// clusterRefused is the refusal of peer, which states the cluster id
// theirs, for a message the failover core refused as another cluster's
// (logged and counted by guard.Require).
func (s *Server) clusterRefused(theirs, peer string) error {
	if err := s.guard.Require(theirs, peer); err != nil {
		return err
	}
	return s.guard.Refusal(rpcerr.OtherCluster("log store", s.cluster.ID(), peer, theirs), theirs, peer)
}

// fenceState is the part of a FenceResponse that describes the stored log.
func (s *Server) fenceState() *walshipv1.FenceResponse {
	lp := s.acceptor().PrimaryOfLog()
	return &walshipv1.FenceResponse{
		Id:             s.id(),
		LastEpoch:      s.logEpoch.Load(),
		LastLsn:        s.durableLSN(),
		History:        (*s.history.Load()).Proto(),
		ClusterId:      s.cluster.ID(),
		LogPrimaryId:   lp.Primary,
		LogPrimaryAddr: lp.Addr,
	}
}

// id is how the log store names itself: its listen address.
func (s *Server) id() string {
	if s.srv != nil {
		return s.srv.Addr()
	}
	return s.cfg.Listen
}

// cut removes the stored entries after lsn, keeping them in an orphan
// file (I6): a primary whose history does not have them asked for it, and
// the failover core checked that they are of epochs older than its own.
// Writer only, walMu held. A cut at or past the end is a no-op; one inside
// a batch, or before the first stored LSN, is refused.
func (s *Server) cut(lsn uint64) (refused, fatal error) {
	last := s.durableLSN()
	if lsn >= last {
		return nil, nil
	}
	if lsn < s.wal.FirstLSN()-1 && s.wal.FirstLSN() != 0 {
		return refuse(errOutOfRange, "truncate_after_lsn: %d is before the first stored LSN %d", lsn, s.wal.FirstLSN()), nil
	}
	o, records, err := datadir.OrphanTail(s.fs, s.cfg.DataDir, s.wal, lsn, s.now())
	if err != nil {
		if strings.Contains(err.Error(), "falls inside") {
			return refuse(rpcerr.ErrInvalid, "truncate_after_lsn: %v", err), nil
		}
		return nil, err
	}
	if err := s.wal.TruncateAfter(lsn); err != nil {
		if errors.Is(err, wal.ErrBroken) {
			s.metrics.fsyncErrors.Inc()
		}
		return nil, fmt.Errorf("cut the wal after LSN %d: %w", lsn, err)
	}
	h := s.history.Load().Cut(lsn)
	if err := datadir.SaveHistory(s.fs, s.cfg.DataDir, h); err != nil {
		return nil, err
	}
	s.history.Store(&h)
	s.logEpoch.Store(h.Current().Epoch)
	s.dropSnapshotsAbove(lsn)
	s.forgetArchivedAbove(lsn)
	s.orphanedRecords.Add(records)
	s.metrics.orphaned.Add(float64(records))
	s.logger.Warn("cut stored entries the primary's history does not have; kept in an orphan file",
		"truncate_after_lsn", lsn, "to_lsn", last, "orphan", o.Name, "epoch", o.Epoch)
	return nil, nil
}
