package node

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	walshipv1 "github.com/walship/walship/gen/walship/v1"
	"github.com/walship/walship/internal/backoff"
	"github.com/walship/walship/internal/serve"
	"github.com/walship/walship/services/primary"
	"github.com/walship/walship/services/replica"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Joining (Config.Join) is how a StatefulSet scaled up grows the cluster:
// its new pod's id is in no one's --peers, and it asks the primary to add
// it. The design is the simplest that is safe: the node does nothing the
// operator could not do with `walship ctl members add`, and the primary's
// ChangeMembers keeps every guarantee it has there (a learner first,
// counted for nothing until within max_lag_records, one change at a time,
// joint quorums). Until the log's contract names it, the node is a plain
// replica: not counted for commits, and never a candidate (eligibility
// and joinState below), so a joiner can take nothing from the cluster by
// starting. Once the contract names it, the log decides, as for every
// member added at run time: --peers no longer matters (a primary keeps the
// log's members once changed at run time).

// joinRetry is how long a joining node waits before asking again: the
// primary unknown or changing, another change in progress, the node not
// caught up enough to be probed.
const joinRetry = 2 * time.Second

// joinCallTimeout bounds one ChangeMembers call: the primary answers when
// the change is over, a learner stage included (its catch_up_timeout, 5 m
// by default), or with where it is once the deadline nears.
const joinCallTimeout = 6 * time.Minute

// joinState says whether node id must still ask to be added, given the
// newest epoch record its log holds: "" when the contract names it as a
// member (done, or a change adding it is in progress: the primary finishes
// or rolls it back, and the node asks again if rolled back), else why it
// is not yet a member. A node with no record has not joined any epoch yet:
// it is not a member, whatever --peers says.
func joinState(id string, rec *walshipv1.EpochRecord) (why string) {
	c := rec.GetContract()
	switch {
	case rec == nil || c == nil:
		return "its log holds no contract yet"
	case hasMember(c.GetMembers(), id), hasMember(c.GetNext().GetMembers(), id):
		return ""
	case hasMember(c.GetLearners(), id):
		return "" // the primary is adding it
	}
	return fmt.Sprintf("the contract of epoch %d does not name it (%s)", rec.GetEpoch(), describeMembers(c))
}

func hasMember(ms []*walshipv1.Member, id string) bool {
	return slices.ContainsFunc(ms, func(m *walshipv1.Member) bool { return m.GetId() == id })
}

// withSelf is ms with id at addr appended if it is not there: the
// members a joined node passes to its primary role, whose config wants
// itself among them. The log's members win over them once changed at run
// time (services/primary startContract), which a join is.
func withSelf(ms []primary.Member, id, addr string) []primary.Member {
	if isMember(ms, id) {
		return ms
	}
	return append(slices.Clip(ms), primary.Member{ID: id, Addr: addr})
}

// join asks the primary to add this node until its log's contract names
// it or ctx ends. A node that is a member already asks nothing.
func (n *Node) join(ctx context.Context) {
	logged := ""
	for ctx.Err() == nil {
		rep := n.Replica()
		if rep == nil {
			return // a primary is a member of its own contract
		}
		why := joinState(n.cfg.ID, rep.EpochRecord())
		if why == "" {
			n.logger.Info("a member of the cluster's contract: not asking to join")
			return
		}
		if rep.EpochRecord() == nil {
			// Nothing to ask yet: the primary probes a node that follows it.
			backoff.Sleep(ctx, joinRetry)
			continue
		}
		resp, err := n.askToJoin(ctx, rep.Vote().Addr)
		switch {
		case err != nil:
			if msg := err.Error(); msg != logged {
				n.logger.Warn("asking the primary to add this node (--join); retrying", "why", why, "err", err)
				logged = msg
			}
		case resp.GetDone():
			n.logger.Info("added to the cluster's members (--join)", "outcome", resp.GetOutcome())
		}
		backoff.Sleep(ctx, joinRetry)
	}
}

// askToJoin sends ChangeMembers add (this node at its --advertise) to the
// primary it follows, then to the --peers, until one takes it: a node that
// is not the primary refuses at once.
func (n *Node) askToJoin(ctx context.Context, primaryAddr string) (*walshipv1.ChangeMembersResponse, error) {
	req := &walshipv1.ChangeMembersRequest{Change: &walshipv1.ChangeMembersRequest_Add{Add: &walshipv1.Member{Id: n.cfg.ID, Addr: n.cfg.Advertise}}}
	addrs := []string{}
	if primaryAddr != "" {
		addrs = append(addrs, primaryAddr)
	}
	for _, m := range n.cfg.Members {
		if m.ID != n.cfg.ID && !slices.Contains(addrs, m.Addr) {
			addrs = append(addrs, m.Addr)
		}
	}
	var last error = fmt.Errorf("no primary to ask: no --peers and no primary known")
	for _, a := range addrs {
		resp, err := serve.Call(ctx, n.dialer(), a, joinCallTimeout, func(ctx context.Context, cc *grpc.ClientConn) (*walshipv1.ChangeMembersResponse, error) {
			return walshipv1.NewAdminServiceClient(cc).ChangeMembers(ctx, req)
		}, peerClass(n.dialer(), false))
		if err == nil {
			return resp, nil
		}
		last = fmt.Errorf("%s: %w", a, err)
		if status.Code(err) != codes.Unavailable && status.Code(err) != codes.FailedPrecondition {
			break
		}
	}
	return nil, last
}

// DefaultLeaveTimeout bounds a scaled-down node's removal when
// Config.LeaveTimeout is 0 (serve.Leave).
const DefaultLeaveTimeout = serve.DefaultLeaveTimeout

// leaveCallTimeout bounds one ChangeMembers remove call, so that a node
// that does not answer leaves time to ask the next.
const leaveCallTimeout = 5 * time.Second

// leaveIfScaledDown is the stop of a node that Config.Leaving says is
// going away for good (a StatefulSet scaled down): it asks the primary to
// remove it, within LeaveTimeout, while its role still runs (a replica
// still acknowledges the change's records). A primary has handed over
// first (SwitchoverOnStop), since the primary cannot remove itself. Any
// other stop (a restart, a rolling update) leaves the membership as it
// is; so does a failure here: the member stays, and the operator removes
// it (walship ctl members remove), or the node rejoins with --join if it
// comes back.
func (n *Node) leaveIfScaledDown(role Role, prim *primary.Server, rep *replica.Server) {
	ctx, cancel := serve.Leave(n.cfg.Leaving, n.cfg.LeaveTimeout, n.logger, "node", "a member")
	defer cancel()
	if ctx == nil {
		return
	}
	var c *walshipv1.Contract
	primaryAddr := ""
	if role == RolePrimary {
		if prim.TakingWrites() {
			// The hand-over failed (logged): no other primary to ask, and
			// a primary cannot remove itself.
			n.logger.Error("stopping for a scale-down without removing this node from the members: it is still the primary (walship ctl members remove --member " + n.cfg.ID + " at the next one)")
			return
		}
		c = prim.Status().GetContract()
	} else {
		c, primaryAddr = rep.EpochRecord().GetContract(), rep.Vote().Addr
	}
	if !hasMember(c.GetMembers(), n.cfg.ID) && !hasMember(c.GetNext().GetMembers(), n.cfg.ID) && !hasMember(c.GetLearners(), n.cfg.ID) {
		n.logger.Info("not a member of the contract: nothing to remove")
		return
	}
	addrs := []string{}
	add := func(a string) {
		if a != "" && a != n.cfg.Advertise && !slices.Contains(addrs, a) {
			addrs = append(addrs, a)
		}
	}
	add(primaryAddr)
	for _, m := range c.GetMembers() {
		if m.GetId() != n.cfg.ID {
			add(m.GetAddr())
		}
	}
	for _, m := range n.cfg.Members {
		if m.ID != n.cfg.ID {
			add(m.Addr)
		}
	}
	req := &walshipv1.ChangeMembersRequest{Change: &walshipv1.ChangeMembersRequest_Remove{Remove: n.cfg.ID}}
	var last error
	for ctx.Err() == nil {
		for _, a := range addrs {
			// A removal takes two records' acknowledgements; a node that
			// is not the primary refuses at once.
			resp, err := serve.Call(ctx, n.dialer(), a, leaveCallTimeout, func(ctx context.Context, cc *grpc.ClientConn) (*walshipv1.ChangeMembersResponse, error) {
				return walshipv1.NewAdminServiceClient(cc).ChangeMembers(ctx, req)
			}, peerClass(n.dialer(), false))
			switch {
			case err == nil && resp.GetDone():
				n.logger.Info("removed from the cluster's members for the scale-down", "primary", a, "outcome", resp.GetOutcome())
				return
			case err == nil:
				last = fmt.Errorf("%s: the removal had not finished when the timeout came (stage %v)", a, resp.GetStage())
			case status.Code(err) == codes.InvalidArgument && strings.Contains(err.Error(), "is not a member"):
				n.logger.Info("not a member at the primary: nothing to remove", "primary", a)
				return
			default:
				last = fmt.Errorf("%s: %w", a, err)
			}
		}
		backoff.Sleep(ctx, 200*time.Millisecond)
	}
	n.logger.Error("stopping for a scale-down without removing this node from the members (walship ctl members remove --member "+n.cfg.ID+")", "err", last)
}
