package logstore

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	walshipv1 "github.com/walship/walship/gen/walship/v1"
	"github.com/walship/walship/internal/backoff"
	"github.com/walship/walship/internal/serve"
	"github.com/walship/walship/internal/tlsid"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// A log store follows its StatefulSet (issue 38) the way a data node does
// (services/node, join.go): it does nothing an operator could not do with
// `walship ctl members add|remove --logstore`, and the primary's
// ChangeMembers keeps every guarantee it has there (a learner first, one
// change at a time, joint quorums, canFinish's refusals).
//
// The log store holds no contract of its own (its log is the primary's
// batches), so it asks the primary: AdminService.Status, which every
// identity may call under the default policy, carries the membership at
// the primary and answers a replica's role elsewhere. The initial log
// stores of a fresh cluster run with the same flags: the bootstrap
// contract names them, so they ask for nothing once a primary answers,
// and nothing at all before one does.

// joinRetry is how long a joining log store waits before asking again: no
// primary yet, the primary changing, another change in progress.
const joinRetry = 2 * time.Second

// joinCallTimeout bounds one add_logstore call: the primary answers when
// the change is over, its learner stage included (catch_up_timeout, 5 m
// by default), or with where it is once the deadline nears.
const joinCallTimeout = 6 * time.Minute

// statusCallTimeout bounds one Status call to a data node.
const statusCallTimeout = 3 * time.Second

// DefaultLeaveTimeout bounds a scaled-down log store's removal when
// Config.LeaveTimeout is 0 (serve.Leave).
const DefaultLeaveTimeout = serve.DefaultLeaveTimeout

// leaveCallTimeout bounds one remove_logstore call, so that a primary
// that does not answer leaves time to ask again: the primary first waits
// (up to 5 s) for the log stores left to acknowledge (canFinish), then
// writes two records.
const leaveCallTimeout = 10 * time.Second

// errNoPrimary: no node asked answered as the primary.
var errNoPrimary = errors.New("no primary among the nodes asked")

// named says whether the membership m names addr as a log store: of the
// configuration in force, of the one a change goes to, or a learner (a
// change adding it is in progress: the primary finishes it or drops it).
func named(m *walshipv1.MembershipStatus, addr string) bool {
	c := m.GetContract()
	return slices.Contains(c.GetLogstores(), addr) || slices.Contains(c.GetNext().GetLogstores(), addr) ||
		slices.Contains(c.GetLogstoreLearners(), addr)
}

// nodesToAsk are the data nodes to ask for the primary: the primary of
// the newest epoch this log store has promised first, then --nodes.
func (s *Server) nodesToAsk() []string {
	var addrs []string
	if v := s.vote.Load(); v != nil && v.Addr != "" {
		addrs = append(addrs, v.Addr)
	}
	for _, n := range s.cfg.Nodes {
		if !slices.Contains(addrs, n) {
			addrs = append(addrs, n)
		}
	}
	return addrs
}

// primaryMembership asks the nodes for their Status until one answers as
// the primary, and returns its address and membership.
func (s *Server) primaryMembership(ctx context.Context) (string, *walshipv1.MembershipStatus, error) {
	d := s.cfg.Security.Dialer
	var errs []string
	for _, a := range s.nodesToAsk() {
		st, err := serve.Call(ctx, d, a, statusCallTimeout, func(ctx context.Context, cc *grpc.ClientConn) (*walshipv1.StatusResponse, error) {
			return walshipv1.NewAdminServiceClient(cc).Status(ctx, &walshipv1.StatusRequest{})
		}, d.PeerClass(tlsid.ClassNode))
		switch {
		case err != nil:
			errs = append(errs, fmt.Sprintf("%s: %v", a, status.Convert(err).Message()))
		case st.GetRole() != walshipv1.Role_ROLE_PRIMARY || st.GetMembership() == nil:
			errs = append(errs, fmt.Sprintf("%s: %v", a, st.GetRole()))
		default:
			return a, st.GetMembership(), nil
		}
	}
	return "", nil, fmt.Errorf("%w (%s)", errNoPrimary, strings.Join(errs, "; "))
}

// join asks the primary to add this log store (--join) until its
// membership names it or ctx ends. A log store it names asks nothing.
func (s *Server) join(ctx context.Context) {
	addr := s.cfg.Advertise
	logged := ""
	warn := func(err error) {
		// Once per distinct error: a cluster that has no primary yet, or
		// a long change of someone else's, would otherwise fill the log.
		if msg := err.Error(); msg != logged {
			s.logger.Warn("asking the primary to add this log store (--join); retrying", "advertise", addr, "err", err)
			logged = msg
		}
	}
	for ctx.Err() == nil {
		primary, m, err := s.primaryMembership(ctx)
		switch {
		case err != nil:
			warn(err)
		case len(m.GetContract().GetLogstores()) == 0:
			// A primary still opening its epoch, or one without log
			// stores (which gets none at run time): nothing to ask yet.
			warn(fmt.Errorf("%s: the primary's contract names no log stores yet", primary))
		case named(m, addr):
			s.logger.Info("a log store of the cluster's contract: not asking to join", "advertise", addr, "primary", primary, "epoch", m.GetEpoch())
			return
		default:
			req := &walshipv1.ChangeMembersRequest{Change: &walshipv1.ChangeMembersRequest_AddLogstore{AddLogstore: addr}}
			resp, err := serve.Call(ctx, s.cfg.Security.Dialer, primary, joinCallTimeout, func(ctx context.Context, cc *grpc.ClientConn) (*walshipv1.ChangeMembersResponse, error) {
				return walshipv1.NewAdminServiceClient(cc).ChangeMembers(ctx, req)
			}, s.cfg.Security.Dialer.PeerClass(tlsid.ClassNode))
			switch {
			case err != nil:
				warn(fmt.Errorf("%s: %w", primary, err))
			case resp.GetDone():
				// Checked at the next Status: "abandoned" (the learner
				// stage timed out) asks again.
				s.logger.Info("the primary's change adding this log store is over (--join)", "advertise", addr, "outcome", resp.GetOutcome())
				continue
			}
		}
		backoff.Sleep(ctx, joinRetry)
	}
}

// leaveIfScaledDown is the stop of a log store that Config.Leaving says
// is going away for good: it asks the primary to remove it, within
// LeaveTimeout, while it still serves (the primary ships the change's
// records to it, and a majority of the old log stores must acknowledge
// them). Any other stop leaves the membership as it is; so does a
// failure here: the log store stays in the contract, and the operator
// removes it (walship ctl members remove --logstore), or it rejoins with
// --join if it comes back.
func (s *Server) leaveIfScaledDown() {
	addr := s.cfg.Advertise
	ctx, cancel := serve.Leave(s.cfg.Leaving, s.cfg.LeaveTimeout, s.logger, "log store", "a log store of the contract", "advertise", addr)
	defer cancel()
	if ctx == nil {
		return
	}
	req := &walshipv1.ChangeMembersRequest{Change: &walshipv1.ChangeMembersRequest_RemoveLogstore{RemoveLogstore: addr}}
	d := s.cfg.Security.Dialer
	var last error
	asked := false
	for ctx.Err() == nil {
		primary, m, err := s.primaryMembership(ctx)
		switch {
		case err != nil:
			last = err
		case !named(m, addr) && asked:
			// A removal that outlived one call's deadline.
			s.logger.Info("removed from the cluster's log stores for the scale-down", "primary", primary, "advertise", addr)
			return
		case !named(m, addr):
			s.logger.Info("not a log store of the primary's contract: nothing to remove", "primary", primary, "advertise", addr)
			return
		default:
			asked = true
			// A removal takes two records' acknowledgements; another
			// pod's removal in progress is refused at once
			// (FAILED_PRECONDITION): asked again after it.
			resp, err := serve.Call(ctx, d, primary, leaveCallTimeout, func(ctx context.Context, cc *grpc.ClientConn) (*walshipv1.ChangeMembersResponse, error) {
				return walshipv1.NewAdminServiceClient(cc).ChangeMembers(ctx, req)
			}, d.PeerClass(tlsid.ClassNode))
			switch {
			case err == nil && resp.GetDone():
				s.logger.Info("removed from the cluster's log stores for the scale-down", "primary", primary, "advertise", addr, "outcome", resp.GetOutcome())
				return
			case err == nil:
				last = fmt.Errorf("%s: the removal had not finished when the call's deadline came (stage %v)", primary, resp.GetStage())
			case status.Code(err) == codes.PermissionDenied:
				s.logger.Error("stopping for a scale-down without removing this log store: the primary refuses it (walship ctl members remove --logstore "+addr+")", "primary", primary, "err", err)
				return
			default:
				last = fmt.Errorf("%s: %w", primary, err)
			}
		}
		backoff.Sleep(ctx, 200*time.Millisecond)
	}
	s.logger.Error("stopping for a scale-down without removing this log store from the contract (walship ctl members remove --logstore "+addr+")", "err", last)
}
