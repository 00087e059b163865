package logstore

import (
	"context"
	"fmt"

	walshipv1 "github.com/walship/walship/gen/walship/v1"
	"github.com/walship/walship/internal/datadir"
	"github.com/walship/walship/internal/rpcerr"
	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
)

// Status reports what the log store holds.
func (h *logStoreServer) Status(ctx context.Context, _ *walshipv1.LogStoreServiceStatusRequest) (*walshipv1.LogStoreServiceStatusResponse, error) {
	// A log store listed among its own peers knows itself by this.
	_ = grpc.SetHeader(ctx, metadata.Pairs(instanceHeader, h.s.fill.instance))
	return h.s.Status(), nil
}

// Status reports what the log store holds.
func (s *Server) Status() *walshipv1.LogStoreServiceStatusResponse {
	v := s.vote.Load()
	lp := s.acceptor().PrimaryOfLog()
	return &walshipv1.LogStoreServiceStatusResponse{
		LogPrimaryId:   lp.Primary,
		LogPrimaryAddr: lp.Addr,
		FirstLsn:       s.wal.FirstLSN(),
		DurableLsn:     s.durableLSN(),
		Epoch:          s.epoch.Load(),
		StoredBytes:    uint64(s.wal.Size()),
		Segments:       uint32(s.wal.Segments()),
		LastEpoch:      s.logEpoch.Load(),
		History:        (*s.history.Load()).Proto(),
		VoteEpoch:      v.Epoch,
		PrimaryId:      v.Primary,
		PrimaryAddr:    v.Addr,
		ClusterId:      s.cluster.ID(),
		Refilling:      s.fill.refilling.Load(),
		Snapshots:      s.snaps.infos(),
		Archive:        s.archiveStatus(),
	}
}

// archiveStatus is the archive's part of Status (nil without one).
func (s *Server) archiveStatus() *walshipv1.ArchiveStatus {
	if s.arch == nil {
		return nil
	}
	return s.arch.status()
}

// durableLSN is the last LSN the log store holds durably, as it reports it
// to primaries: 0 while it holds no batch, even if its WAL is anchored at
// some LSN (a segment header written before a crash, or a Reset) — holding
// nothing, it vouches for nothing, and a primary counting its acks must not
// take the anchor for stored commits.
func (s *Server) durableLSN() uint64 {
	if s.wal.FirstLSN() == 0 {
		return 0
	}
	return s.wal.DurableLSN()
}

// adminServer is the log store's AdminService.
type adminServer struct {
	walshipv1.UnimplementedAdminServiceServer
	s *Server
}

func (a *adminServer) Status(context.Context, *walshipv1.StatusRequest) (*walshipv1.StatusResponse, error) {
	s := a.s
	durable := s.wal.DurableLSN()
	v := s.vote.Load()
	lp := s.acceptor().PrimaryOfLog()
	resp := &walshipv1.StatusResponse{
		LogPrimaryId:   lp.Primary,
		LogPrimaryAddr: lp.Addr,
		Role:           walshipv1.Role_ROLE_LOGSTORE,
		Id:             s.id(),
		PrimaryId:      v.Primary,
		Primary:        v.Addr,
		VoteEpoch:      v.Epoch,
		History:        (*s.history.Load()).Proto(),
		Epoch:          s.epoch.Load(),
		LastLsn:        s.wal.LastLSN(),
		DurableLsn:     durable,
		VisibleLsn:     durable, // Read serves durable batches only
		WalBytes:       uint64(s.wal.Size()),
		WalFirstLsn:    s.wal.FirstLSN(),
		Serving:        s.srv.Serving(),
		ClusterId:      s.cluster.ID(),
		Refilling:      s.fill.refilling.Load(),
		Archive:        s.archiveStatus(),
	}
	orphans, err := datadir.ListOrphans(s.fs, s.cfg.DataDir)
	if err != nil {
		return nil, toStatus(err)
	}
	resp.Orphans = orphanStatus(orphans)
	return resp, nil
}

// orphanStatus lists orphan files for Status.
func orphanStatus(os []datadir.Orphan) []*walshipv1.OrphanStatus {
	out := make([]*walshipv1.OrphanStatus, len(os))
	for i, o := range os {
		out[i] = &walshipv1.OrphanStatus{Name: o.Name, Epoch: o.Epoch, FirstLsn: o.FirstLSN, LastLsn: o.LastLSN,
			Bytes: uint64(o.Bytes), CutTimeUnixNano: o.CutAt.UnixNano()}
	}
	return out
}

func (a *adminServer) Promote(context.Context, *walshipv1.PromoteRequest) (*walshipv1.PromoteResponse, error) {
	return nil, toStatus(refuse(rpcerr.ErrWrongRole, "not a primary or a replica: a log store cannot be promoted"))
}

func (a *adminServer) SetPolicy(context.Context, *walshipv1.SetPolicyRequest) (*walshipv1.SetPolicyResponse, error) {
	return nil, toStatus(refuse(rpcerr.ErrWrongRole, "not a primary: a log store has no commit policy"))
}

// ListMembers is the primary's: a log store names the primary it knows.
func (a *adminServer) ListMembers(context.Context, *walshipv1.ListMembersRequest) (*walshipv1.ListMembersResponse, error) {
	return nil, toStatus(refuse(rpcerr.ErrWrongRole, "%s: list the members at the primary", a.s.wrongNode(true)))
}

// ChangeMembers is the primary's: a log store names the primary it knows.
func (a *adminServer) ChangeMembers(context.Context, *walshipv1.ChangeMembersRequest) (*walshipv1.ChangeMembersResponse, error) {
	return nil, toStatus(refuse(rpcerr.ErrWrongRole, "%s: change the members at the primary", a.s.wrongNode(true)))
}

// wrongNode says what this node is, to a call it does not serve (KVService
// or a switchover, which data nodes serve), and where the primary is.
func (s *Server) wrongNode(full bool) string {
	v := s.vote.Load()
	if !full {
		return s.id() + " is a log store, not a data node"
	}
	if v.Primary == "" || v.Addr == "" {
		return s.id() + " is a log store, not a data node; it knows of no primary yet"
	}
	return fmt.Sprintf("%s is a log store, not a data node; the primary of epoch %d is %s at %s", s.id(), v.Epoch, v.Primary, v.Addr)
}
