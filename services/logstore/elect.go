package logstore

import (
	"context"
	"sync"
	"time"

	walshipv1 "github.com/walship/walship/gen/walship/v1"
	"github.com/walship/walship/internal/datadir"
	"github.com/walship/walship/internal/failover"
	"github.com/walship/walship/internal/rpcerr"
	"google.golang.org/protobuf/types/known/durationpb"
)

// electReg is the log store's election register (failover.Register):
// persisted in DataDir/election, with the holder's lease kept in memory on
// this process's monotonic clock only. After a restart the holder is
// judged alive for a lease from the start: the log store cannot know when
// it last renewed, and a failover a lease late is better than one while
// the primary may still be renewing elsewhere.
type electReg struct {
	mu      sync.Mutex
	reg     failover.Register
	renewed time.Time     // when the holder last acquired or renewed (monotonic)
	lease   time.Duration // the lease it asked for then
}

// restartLease is how long after a restart the holder is judged alive
// (see electReg): the shipped default lease, which the log store cannot
// learn from anyone before the holder renews.
const restartLease = 2 * time.Second

// maxElectLease bounds the lease a request may ask for.
const maxElectLease = time.Minute

func (e *electReg) alive(now time.Time) bool {
	return e.reg.Holder != "" && !e.renewed.IsZero() && now.Sub(e.renewed) < e.lease
}

// loadElection reads the register at start.
func (s *Server) loadElection() error {
	r, err := datadir.LoadElection(s.fs, s.cfg.DataDir)
	if err != nil {
		return err
	}
	s.elect.reg = r
	s.elect.renewed, s.elect.lease = time.Now(), restartLease
	return nil
}

// Elect carries out one operation on the election register by the
// failover core's rule (failover.DecideRegister), persisting a change
// before it answers.
func (h *epochServer) Elect(ctx context.Context, req *walshipv1.ElectRequest) (*walshipv1.ElectResponse, error) {
	s := h.s
	op, err := checkElect(req)
	if err != nil {
		return nil, toStatus(err)
	}
	e := &s.elect
	e.mu.Lock()
	defer e.mu.Unlock()
	now := time.Now()
	d := failover.DecideRegister(e.reg, e.alive(now), failover.RegisterRequest{
		Op: op, Candidate: req.GetCandidateId(), Term: req.GetTerm(), Create: req.GetCreate(),
		PauseVersion: req.GetPauseVersion(), Paused: req.GetPaused(),
	})
	if d.Save {
		if err := datadir.SaveElection(s.fs, s.cfg.DataDir, d.Next); err != nil {
			return nil, toStatus(refuse(rpcerr.ErrUnavailable, "log store failed to save the election register: %v", err))
		}
		if d.Next.Paused != e.reg.Paused {
			s.logger.Warn("automatic failover paused or resumed", "paused", d.Next.Paused, "pause_version", d.Next.PauseVersion)
		}
		if d.Next.Holder != e.reg.Holder {
			s.logger.Info("election holder changed", "from", e.reg.Holder, "to", d.Next.Holder, "term", d.Next.Term, "op", op.String())
		}
		e.reg = d.Next
	}
	switch {
	case d.Renewed:
		e.renewed, e.lease = now, req.GetLease().AsDuration()
	case d.Expired:
		e.renewed = time.Time{}
	}
	resp := &walshipv1.ElectResponse{
		Granted: d.Granted, Why: d.Why, Id: s.id(),
		HolderId: e.reg.Holder, Term: e.reg.Term, Alive: e.alive(now),
		PauseVersion: e.reg.PauseVersion, Paused: e.reg.Paused,
	}
	if !e.renewed.IsZero() {
		resp.SinceRenewal = durationpb.New(now.Sub(e.renewed))
	}
	return resp, nil
}

// checkElect validates an ElectRequest; the error names the field.
func checkElect(req *walshipv1.ElectRequest) (failover.RegisterOp, error) {
	var op failover.RegisterOp
	switch req.GetOp() {
	case walshipv1.ElectOp_ELECT_OP_READ:
		return failover.RegRead, nil
	case walshipv1.ElectOp_ELECT_OP_CAMPAIGN:
		op = failover.RegCampaign
	case walshipv1.ElectOp_ELECT_OP_RENEW:
		op = failover.RegRenew
	case walshipv1.ElectOp_ELECT_OP_RELEASE:
		op = failover.RegRelease
	case walshipv1.ElectOp_ELECT_OP_TAKE_OVER:
		op = failover.RegTakeOver
	default:
		return 0, refuse(rpcerr.ErrInvalid, "op: %v is not an operation", req.GetOp())
	}
	switch {
	case datadir.ValidateNodeID(req.GetCandidateId()) != nil:
		return 0, refuse(rpcerr.ErrInvalid, "candidate_id: %v", datadir.ValidateNodeID(req.GetCandidateId()))
	case req.GetTerm() == 0:
		return 0, refuse(rpcerr.ErrInvalid, "term: must be at least 1")
	}
	if op != failover.RegRelease {
		if err := req.GetLease().CheckValid(); err != nil || req.GetLease().AsDuration() <= 0 || req.GetLease().AsDuration() > maxElectLease {
			return 0, refuse(rpcerr.ErrInvalid, "lease: %v is not in (0, %v]", req.GetLease().AsDuration(), maxElectLease)
		}
	}
	return op, nil
}
