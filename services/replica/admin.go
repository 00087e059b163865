package replica

import (
	"context"

	walshipv1 "github.com/walship/walship/gen/walship/v1"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// adminServer is the replica's AdminService.
type adminServer struct {
	walshipv1.UnimplementedAdminServiceServer
	s *Server
}

func (a *adminServer) Status(context.Context, *walshipv1.StatusRequest) (*walshipv1.StatusResponse, error) {
	return a.s.Status(), nil
}

// Status reports the replica's positions, state digest, catch-up rung and
// its view of the primary.
func (s *Server) Status() *walshipv1.StatusResponse {
	v := s.store.Load().Snapshot()
	pos := s.positions()
	primaryLast := max(s.lag.primaryLSN(), pos.AppliedLsn)
	return &walshipv1.StatusResponse{
		Role:        walshipv1.Role_ROLE_REPLICA,
		Id:          s.cfg.ID,
		Epoch:       s.epoch.Load(),
		LastLsn:     pos.WrittenLsn,
		DurableLsn:  pos.FlushedLsn,
		VisibleLsn:  v.AppliedLSN(),
		WalBytes:    uint64(s.wal.Size()),
		WalFirstLsn: s.wal.FirstLSN(),
		SnapshotLsn: s.snapshotLSN.Load(),
		StateDigest: v.Digest().String(),
		Keys:        uint64(v.Len()),
		Rung:        walshipv1.CatchUpRung(s.rung.Load()),
		Primary:     s.cfg.Primary,
		Serving:     s.srv.Serving(),
		Peers: []*walshipv1.PeerStatus{{
			Id:         s.cfg.Primary,
			Role:       walshipv1.Role_ROLE_PRIMARY,
			Connected:  s.connected.Load(),
			WrittenLsn: pos.WrittenLsn,
			FlushedLsn: pos.FlushedLsn,
			AppliedLsn: pos.AppliedLsn,
			LagRecords: primaryLast - pos.AppliedLsn,
			LagSeconds: s.lag.seconds(s.now()),
		}},
	}
}

func (a *adminServer) Promote(context.Context, *walshipv1.PromoteRequest) (*walshipv1.PromoteResponse, error) {
	return nil, status.Error(codes.Unimplemented, "promotion is not implemented yet")
}

func (a *adminServer) SetPolicy(context.Context, *walshipv1.SetPolicyRequest) (*walshipv1.SetPolicyResponse, error) {
	return nil, status.Error(codes.FailedPrecondition, "not a primary: set the commit policy on the primary at "+a.s.cfg.Primary)
}
