package primary

import (
	"context"
	"fmt"
	"strings"
	"time"

	walshipv1 "github.com/walship/walship/gen/walship/v1"
	"github.com/walship/walship/internal/keyspace"
	"github.com/walship/walship/internal/rpcerr"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
)

// adminServer is the primary's AdminService.
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

// Status reports the primary's positions, state digest and peers.
func (s *Server) Status() *walshipv1.StatusResponse {
	v := s.store.Snapshot()
	last := s.wal.LastLSN()
	resp := &walshipv1.StatusResponse{
		Role:          walshipv1.Role_ROLE_PRIMARY,
		Id:            s.cfg.ID,
		Epoch:         s.epoch,
		LastLsn:       last,
		DurableLsn:    s.wal.DurableLSN(),
		VisibleLsn:    v.AppliedLSN(),
		WalBytes:      uint64(s.wal.Size()),
		WalFirstLsn:   s.wal.FirstLSN(),
		SnapshotLsn:   s.snapshotLSN.Load(),
		StateDigest:   v.Digest().String(),
		Keys:          keyspace.UserKeys(v),
		DefaultPolicy: s.policy.Load().Proto(),
		Serving:       s.srv.Serving(),
		TakingWrites:  s.TakingWrites(),
		PrimaryId:     s.cfg.ID,
		Primary:       s.Advertise(),
		VoteEpoch:     s.vote.Load().Epoch,
		Contract:      s.contract(),
		History:       s.epochs.Proto(),
		ClusterId:     s.cluster.ID(),
		Membership:    s.membership(time.Now()),
		// The primary of its log's epoch is itself.
		LogPrimaryId:   s.cfg.ID,
		LogPrimaryAddr: s.Advertise(),
	}
	if s.lease.hasStores() {
		resp.LeaseRemaining = durationpb.New(s.lease.remaining())
	}
	if url, archived := s.peers.archived(); url != "" {
		bytes, age := s.pipe.index.lag(archived, time.Now())
		resp.Archive = &walshipv1.ArchiveStatus{Url: url, ArchivedLsn: archived, UploaderAddr: s.peers.archiver(s.logStores()),
			LagSeconds: age.Seconds(), LagBytes: bytes}
	}
	// Every hop's lag as the metrics give it (replCollector): records,
	// bytes and seconds, from the applied LSN of a replica and the
	// durable LSN of a log store.
	replicas, logstores := s.peers.snapshot()
	now := time.Now()
	for _, r := range replicas {
		bytes, age := s.pipe.index.lag(r.applied, now)
		resp.Peers = append(resp.Peers, &walshipv1.PeerStatus{
			Id: r.id, Role: walshipv1.Role_ROLE_REPLICA, Connected: r.connected,
			WrittenLsn: r.written, FlushedLsn: r.flushed, AppliedLsn: r.applied,
			LagRecords: last - min(last, r.applied), SentBytes: r.sentBytes,
			LagSeconds: age.Seconds(), LagBytes: bytes,
		})
	}
	for _, l := range logstores {
		bytes, age := s.pipe.index.lag(l.durable, now)
		resp.Peers = append(resp.Peers, &walshipv1.PeerStatus{
			Id: l.addr, Role: walshipv1.Role_ROLE_LOGSTORE, Connected: l.connected,
			FlushedLsn: l.durable, LagRecords: last - min(last, l.durable),
			LagSeconds: age.Seconds(), LagBytes: bytes,
		})
	}
	return resp
}

func (a *adminServer) Promote(context.Context, *walshipv1.PromoteRequest) (*walshipv1.PromoteResponse, error) {
	return nil, status.Errorf(codes.FailedPrecondition, "already the primary (epoch %d)", a.s.epoch)
}

func (a *adminServer) SetPolicy(_ context.Context, req *walshipv1.SetPolicyRequest) (*walshipv1.SetPolicyResponse, error) {
	if req.GetPolicy() == nil {
		return nil, rpcerr.Invalid("policy", "required")
	}
	if err := validatePolicyEnums(req.GetPolicy()); err != nil {
		return nil, err
	}
	for {
		cur := a.s.policy.Load()
		next, err := cur.Merge(req.GetPolicy())
		if err != nil {
			return nil, rpcerr.Invalid("policy", "%v", err)
		}
		if err := a.s.checkSyncReplicas(next); err != nil {
			return nil, rpcerr.Invalid("policy", "%v", err)
		}
		if a.s.policy.CompareAndSwap(cur, &next) {
			a.s.logger.Info("default commit policy changed", "policy", next.Proto().String())
			return &walshipv1.SetPolicyResponse{Policy: next.Proto()}, nil
		}
	}
}

func (a *adminServer) Switchover(ctx context.Context, req *walshipv1.SwitchoverRequest) (*walshipv1.SwitchoverResponse, error) {
	timeout := 10 * time.Second
	if req.GetTimeout() != nil {
		if err := req.GetTimeout().CheckValid(); err != nil {
			return nil, rpcerr.Invalid("timeout", "%v", err)
		}
		timeout = req.GetTimeout().AsDuration()
		if timeout <= 0 || timeout > 5*time.Minute {
			return nil, rpcerr.Invalid("timeout", "%v is not in (0, 5m]", timeout)
		}
	}
	if req.GetTarget() == "" {
		return nil, rpcerr.Invalid("target", "required: the node id of the replica to hand over to")
	}
	return a.s.Switchover(ctx, req.GetTarget(), timeout)
}

// wrongNode says what this node is, to a call it does not serve (a log
// store's Verify, say).
func (s *Server) wrongNode(full bool) string {
	if !full {
		return s.Advertise() + " is a data node, the primary"
	}
	return fmt.Sprintf("%s is a data node, the primary %s of epoch %d, not a log store; its log stores are %s",
		s.Advertise(), s.cfg.ID, s.epoch, orNone(s.logStores()))
}

// orNone lists addrs, or says there are none.
func orNone(addrs []string) string {
	if len(addrs) == 0 {
		return "none"
	}
	return strings.Join(addrs, ",")
}
