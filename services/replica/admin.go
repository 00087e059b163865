package replica

import (
	"context"
	"errors"
	"fmt"
	"time"

	walshipv1 "github.com/walship/walship/gen/walship/v1"
	"github.com/walship/walship/internal/datadir"
	"github.com/walship/walship/internal/keyspace"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// adminServer is the replica's AdminService.
type adminServer struct {
	walshipv1.UnimplementedAdminServiceServer
	s *Server
}

func (a *adminServer) Status(context.Context, *walshipv1.StatusRequest) (*walshipv1.StatusResponse, error) {
	resp := a.s.Status()
	if h := a.s.cfg.StatusHook; h != nil {
		h(resp)
	}
	return resp, nil
}

// ready is /readyz's condition: applied within ReadyMaxLag of what the
// primary last reported, and within ReadyMaxLagTime of it in time if that
// is set. With a ReadyMaxLag bound the primary must also have reported
// since the replica started: until then how far behind it is is unknown
// (a replica restarted while cut off from the primary, or from a volume
// days old, would serve that old state as if current). A read-only
// replica follows nothing, so only the LSN bound applies to it.
func (s *Server) ready() error {
	if s.cfg.ReadyMaxLag > 0 && !s.cfg.ReadOnly && !s.lag.heardPrimary() {
		return errors.New("has not heard the primary's last LSN since it started")
	}
	// Behind as reads see it: the state served (at the commit watermark).
	lag, behind := s.readLag()
	if s.cfg.ReadyMaxLag > 0 && lag > s.cfg.ReadyMaxLag {
		return fmt.Errorf("%d LSNs behind the primary (ready within %d)", lag, s.cfg.ReadyMaxLag)
	}
	if s.cfg.ReadyMaxLagTime > 0 && !s.cfg.ReadOnly && behind > s.cfg.ReadyMaxLagTime {
		return fmt.Errorf("%v behind the primary (ready within %v)", behind.Round(time.Millisecond), s.cfg.ReadyMaxLagTime)
	}
	return nil
}

// Status reports the replica's positions, state digest, catch-up rung and
// its view of the primary.
func (s *Server) Status() *walshipv1.StatusResponse {
	v := s.store.Load().Snapshot()
	pos := s.positions()
	primaryLast := max(s.lag.primaryLSN(), pos.AppliedLsn)
	vote := s.Vote()
	var orphans []*walshipv1.OrphanStatus
	if os, err := datadir.ListOrphans(s.fs, s.cfg.DataDir); err == nil {
		for _, o := range os {
			orphans = append(orphans, &walshipv1.OrphanStatus{Name: o.Name, Epoch: o.Epoch, FirstLsn: o.FirstLSN, LastLsn: o.LastLSN,
				Bytes: uint64(o.Bytes), CutTimeUnixNano: o.CutAt.UnixNano()})
		}
	}
	resp := &walshipv1.StatusResponse{
		Role:           walshipv1.Role_ROLE_REPLICA,
		Id:             s.cfg.ID,
		Epoch:          s.epoch.Load(),
		LastLsn:        pos.WrittenLsn,
		DurableLsn:     pos.FlushedLsn,
		VisibleLsn:     v.AppliedLSN(),
		WalBytes:       uint64(s.wal.Size()),
		WalFirstLsn:    s.wal.FirstLSN(),
		SnapshotLsn:    s.snapshotLSN.Load(),
		StateDigest:    v.Digest().String(),
		Keys:           keyspace.UserKeys(v),
		Rung:           walshipv1.CatchUpRung(s.follower.rung.Load()),
		Primary:        s.primary(),
		PrimaryId:      vote.Primary,
		VoteEpoch:      vote.Epoch,
		LogPrimaryId:   s.LogPrimary().Primary,
		LogPrimaryAddr: s.LogPrimary().Addr,
		History:        (*s.history.Load()).Proto(),
		Orphans:        orphans,
		Serving:        s.srv.Serving(),
		ClusterId:      s.cluster.ID(),
		Peers: []*walshipv1.PeerStatus{{
			Id:         s.primary(),
			Role:       walshipv1.Role_ROLE_PRIMARY,
			Connected:  s.follower.connected.Load(),
			WrittenLsn: pos.WrittenLsn,
			FlushedLsn: pos.FlushedLsn,
			AppliedLsn: pos.AppliedLsn,
			LagRecords: primaryLast - pos.AppliedLsn,
			LagSeconds: s.lag.seconds(s.now()),
		}},
	}
	resp.Contract = s.EpochRecord().GetContract()
	return resp
}

func (a *adminServer) Promote(ctx context.Context, req *walshipv1.PromoteRequest) (*walshipv1.PromoteResponse, error) {
	if a.s.cfg.Promote == nil {
		return nil, status.Error(codes.FailedPrecondition, "this replica runs on its own and cannot become the primary: run it as a node (walship replica --peers ...)")
	}
	return a.s.cfg.Promote(ctx, req)
}

func (a *adminServer) SetPolicy(context.Context, *walshipv1.SetPolicyRequest) (*walshipv1.SetPolicyResponse, error) {
	return nil, status.Error(codes.FailedPrecondition, "not a primary: set the commit policy on the primary at "+a.s.primary())
}

// wrongNode says what this node is, to a call it does not serve (a log
// store's Verify, say).
func (s *Server) wrongNode(full bool) string {
	addr := s.cfg.Listen
	if s.srv != nil {
		addr = s.srv.Addr()
	}
	if !full {
		return addr + " is a data node, a replica"
	}
	if s.cfg.ReadOnly {
		return fmt.Sprintf("%s is a data node, the read-only replica %s (it follows no primary)", addr, s.cfg.ID)
	}
	v := s.Vote()
	primary := "the primary is " + s.primary()
	if v.Primary != "" && v.Addr != "" {
		primary = fmt.Sprintf("the primary of epoch %d is %s at %s", v.Epoch, v.Primary, v.Addr)
	}
	return fmt.Sprintf("%s is a data node, the replica %s, not a log store or the primary; %s; the log stores are %s", addr, s.cfg.ID, primary, describeLogStores(s.logStoreSets()))
}

// ListMembers is the primary's: a replica answers where the primary is.
func (a *adminServer) ListMembers(context.Context, *walshipv1.ListMembersRequest) (*walshipv1.ListMembersResponse, error) {
	return nil, a.s.notPrimary()
}

// ChangeMembers is the primary's: a replica answers where the primary is.
func (a *adminServer) ChangeMembers(context.Context, *walshipv1.ChangeMembersRequest) (*walshipv1.ChangeMembersResponse, error) {
	return nil, a.s.notPrimary()
}

// Switchover is the primary's: a replica answers where the primary is.
func (a *adminServer) Switchover(context.Context, *walshipv1.SwitchoverRequest) (*walshipv1.SwitchoverResponse, error) {
	return nil, a.s.notPrimary()
}
