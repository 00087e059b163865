package replica

import (
	"context"
	"fmt"
	"strconv"
	"time"

	walshipv1 "github.com/walship/walship/gen/walship/v1"
	"github.com/walship/walship/internal/datadir"
	"github.com/walship/walship/internal/failover"
	"github.com/walship/walship/internal/rpcerr"
	"github.com/walship/walship/internal/walserve"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
)

// A replica keeps two epochs apart, as a log store does: the epoch it has
// promised (DataDir/vote: a Fence, a primary of a newer epoch it followed,
// or the newest epoch of its own log), which the primary it streams from
// must be at, and the epoch history of its log (DataDir/epochs), in which
// batch epochs only grow. A new primary ships the batches of earlier
// epochs a lagging replica lacks, byte for byte, under its own epoch.
//
// The promise is never older than the log's epoch: entries of an epoch
// prove that its primary was elected, so every older epoch is deposed, and
// a candidate of one must not count this replica among its promises.
// Entries that arrive without their primary's heartbeat (from the log
// store, or in a snapshot) raise the promise, durably, before they are
// written or served.

// loadEpochs reads the vote and the history at recovery; logEpoch is the
// highest epoch of the replayed batches.
func (s *Server) loadEpochs(logEpoch uint64) error {
	v, err := datadir.LoadVote(s.fs, s.cfg.DataDir)
	if err != nil {
		return err
	}
	lp, err := datadir.LoadLogPrimary(s.fs, s.cfg.DataDir)
	if err != nil {
		return err
	}
	s.logPrimary.Store(&lp)
	h, err := datadir.LoadHistory(s.fs, s.cfg.DataDir)
	if err != nil {
		return err
	}
	h = logHistory(h, s.wal.LastLSN())
	if len(h) == 0 {
		// A directory written before histories were kept: its epoch
		// file was the epoch of its newest batch.
		logEpoch = max(logEpoch, v.Epoch)
	}
	logEpoch = max(logEpoch, h.Current().Epoch)
	v.Epoch = max(v.Epoch, logEpoch)
	s.epoch.Store(logEpoch)
	s.history.Store(&h)
	s.vote.Store(&v)
	addr := s.cfg.Primary
	if v.Addr != "" && v.Primary != s.cfg.ID {
		// The vote's primary, unless that was this node itself (a
		// primary's directory rejoining as a replica).
		addr = v.Addr
	}
	s.primaryAddr.Store(&addr)
	return nil
}

// logHistory is h as the history of a log that ends at last: without the
// epochs that begin after it (a crash may have taken the batches they were
// noted for) — except the line a re-seed began it with. A log seeded by a
// snapshot at LSN L of epoch E holds nothing after L, and its history is
// E from L+1 (resetHistory): that line says which primary's log it shares
// up to L, and is kept until entries after L supersede it. Without it the
// log would claim no epoch (or its promise's, at a restart), and a primary
// would answer its hello with Diverged, or accept it on its epoch alone.
func logHistory(h datadir.History, last uint64) datadir.History {
	if len(h) > 0 && !h.Complete() && h[0].FirstLSN == last+1 {
		return h[:1:1]
	}
	return h.Cut(last)
}

// noteEpoch records, durably, that the log continues in epoch e from first
// (a newer epoch than the newest it holds). Follower only, walMu held or
// the follower being the only writer.
func (s *Server) noteEpoch(e, first uint64) error {
	h, changed := s.history.Load().Note(e, first)
	if !changed {
		return nil
	}
	if err := datadir.SaveHistory(s.fs, s.cfg.DataDir, h); err != nil {
		return err
	}
	s.history.Store(&h)
	if e > s.epoch.Load() {
		s.epoch.Store(e)
		s.logger.Info("the log continues in a newer epoch", "epoch", e, "first_lsn", first)
	}
	return nil
}

// resetHistory makes the history that of a log seeded at lsn by a
// snapshot of epoch e: incomplete before lsn+1. The promise is raised to e
// first (a snapshot comes without its primary's heartbeat).
func (s *Server) resetHistory(e, lsn uint64) error {
	if err := s.promiseLogEpoch(e); err != nil {
		return err
	}
	h := datadir.History{{Epoch: e, FirstLSN: lsn + 1}}
	if err := datadir.SaveHistory(s.fs, s.cfg.DataDir, h); err != nil {
		return err
	}
	s.history.Store(&h)
	s.epoch.Store(e)
	return nil
}

// promiseLocked raises the vote to v, durably, if v is newer. It reports
// whether it did. Callers hold voteMu.
func (s *Server) promiseLocked(v datadir.Vote) (bool, error) {
	if v.Epoch <= s.vote.Load().Epoch {
		return false, nil
	}
	if err := s.saveVoteLocked(v, "promised a newer epoch"); err != nil {
		return false, err
	}
	return true, nil
}

// promiseLogEpoch raises the vote to e, durably, if the log is to hold
// entries of epoch e and the promise is older: the entries name no
// primary, so neither does the vote until that epoch's primary is named
// (learnLocked).
func (s *Server) promiseLogEpoch(e uint64) error {
	if e <= s.vote.Load().Epoch {
		return nil
	}
	s.voteMu.Lock()
	defer s.voteMu.Unlock()
	return s.promiseLogEpochLocked(e)
}

// promiseLogEpochLocked is promiseLogEpoch with voteMu held.
func (s *Server) promiseLogEpochLocked(e uint64) error {
	_, err := s.promiseLocked(datadir.Vote{Epoch: e})
	return err
}

// learnLocked takes a primary's word (its heartbeat, or a peer naming it)
// for who is primary: it raises the vote to v if v is newer, as
// promiseLocked, and names v's primary if v is of the epoch promised and
// the promise names none (it was made for the log's entries alone). It
// reports whether the vote changed. Never for a fence: a candidate must
// not take over an epoch that exists. Callers hold voteMu.
func (s *Server) learnLocked(v datadir.Vote) (bool, error) {
	cur := s.vote.Load()
	if v.Epoch != 0 && v.Epoch == cur.Epoch && cur.Primary == "" && cur.Addr == "" && (v.Primary != "" || v.Addr != "") {
		return true, s.saveVoteLocked(v, "learnt the primary of the epoch promised")
	}
	return s.promiseLocked(v)
}

// saveVoteLocked makes v the vote, durably, logs why, and follows its
// primary. The promise it replaces is kept first if it named the primary
// of the log's epoch (failover.State.KeepsLogPrimary): every path that
// raises the vote — the core's steps, a peer naming a newer primary —
// comes here. Callers hold voteMu.
func (s *Server) saveVoteLocked(v datadir.Vote, why string) error {
	if kept, ok := s.acceptor().KeepsLogPrimary(v); ok {
		if err := datadir.SaveLogPrimary(s.fs, s.cfg.DataDir, kept); err != nil {
			return err
		}
		s.logPrimary.Store(&kept)
	}
	if err := datadir.SaveVote(s.fs, s.cfg.DataDir, v); err != nil {
		return err
	}
	prev := s.vote.Load()
	s.vote.Store(&v)
	s.logger.Info(why, "vote", v.String(), "previous", prev.String())
	if v.Addr != "" && v.Primary != s.cfg.ID {
		// Not itself: a candidate fencing its own replica role stops it
		// before it opens, and one whose promotion failed stays a replica
		// of whoever wins next.
		s.followPrimary(v.Addr)
	}
	return nil
}

// followPrimary makes addr the primary to stream from, ending the current stream
// if it is from somewhere else.
func (s *Server) followPrimary(addr string) {
	if old := s.primaryAddr.Swap(&addr); old != nil && *old == addr {
		return
	}
	s.logger.Info("following a new primary", "primary", addr)
	s.follower.streamMu.Lock()
	if s.follower.streamCancel != nil {
		s.follower.streamCancel()
	}
	s.follower.streamMu.Unlock()
	select {
	case s.follower.newPrimary <- struct{}{}:
	default:
	}
}

// primary is the address the replica follows.
func (s *Server) primary() string { return *s.primaryAddr.Load() }

// replClient returns a client of the primary the replica follows, dialling
// it if it changed.
func (s *Server) replClient() (walshipv1.ReplicationServiceClient, error) {
	addr := s.primary()
	s.follower.connMu.Lock()
	defer s.follower.connMu.Unlock()
	if s.follower.primaryConn != nil && s.follower.connAddr == addr {
		return s.follower.repl, nil
	}
	conn, err := grpc.NewClient(addr, s.follower.dialPrimary...)
	if err != nil {
		return nil, fmt.Errorf("primary %s: %w", addr, err)
	}
	if s.follower.primaryConn != nil {
		_ = s.follower.primaryConn.Close()
	}
	s.follower.primaryConn, s.follower.connAddr, s.follower.repl = conn, addr, walshipv1.NewReplicationServiceClient(conn)
	return s.follower.repl, nil
}

// epochServer is the replica's EpochService.
type epochServer struct {
	walshipv1.UnimplementedEpochServiceServer
	s *Server
}

// Fence promises a newer epoch to a candidate: the replica fsyncs what it
// has written, persists the promise, stops taking batches of older epochs
// (the current stream ends) and follows the candidate from then on. It
// answers with the end of its log either way.
func (h *epochServer) Fence(ctx context.Context, req *walshipv1.FenceRequest) (*walshipv1.FenceResponse, error) {
	switch {
	case req.GetEpoch() == 0:
		return nil, status.Error(codes.InvalidArgument, "epoch: must be at least 1")
	case datadir.CheckEpoch(req.GetEpoch(), h.s.Vote().Epoch, datadir.MaxEpochJump) != nil:
		// Against the promise before Fence takes voteMu: it only grows, so
		// an epoch within the bound now still is when it is granted.
		return nil, status.Errorf(codes.InvalidArgument, "epoch: %v", datadir.CheckEpoch(req.GetEpoch(), h.s.Vote().Epoch, datadir.MaxEpochJump))
	case datadir.ValidateNodeID(req.GetCandidateId()) != nil:
		return nil, status.Errorf(codes.InvalidArgument, "candidate_id: %v", datadir.ValidateNodeID(req.GetCandidateId()))
	case req.GetCandidateAddr() == "":
		return nil, status.Error(codes.InvalidArgument, "candidate_addr: required (the candidate's advertised gRPC address)")
	case datadir.ValidateAddr(req.GetCandidateAddr()) != nil:
		return nil, status.Errorf(codes.InvalidArgument, "candidate_addr: %v", datadir.ValidateAddr(req.GetCandidateAddr()))
	}
	if err := rpcerr.CheckClusterID("cluster_id", req.GetClusterId()); err != nil {
		return nil, err
	}
	return h.s.Fence(req)
}

// Fence is EpochService.Fence (also called directly by a node that
// promotes this replica's data directory). A candidate of another cluster,
// or one that states no cluster id to a replica that has one and would be
// granted, is refused before anything is done; one whose fence is granted
// gives its cluster id to a replica that had none (saved before the
// promise).
func (s *Server) Fence(req *walshipv1.FenceRequest) (*walshipv1.FenceResponse, error) {
	if s.cfg.ReadOnly {
		return nil, status.Errorf(codes.FailedPrecondition, "replica %s is read-only (a restored directory): it promises no epoch", s.cfg.ID)
	}
	s.voteMu.Lock()
	defer s.voteMu.Unlock()
	// The rule is the failover core's (I1, I4, I8): another cluster's
	// candidate, or one stating no id to a replica that has one and would
	// be granted, is refused; one that would not be granted is answered
	// as ever.
	st := s.acceptor().Fence(failover.Fence{Epoch: req.GetEpoch(), Candidate: req.GetCandidateId(), Addr: req.GetCandidateAddr(), Cluster: req.GetClusterId()})
	if st.Refused != nil {
		return nil, s.clusterRefused(req.GetClusterId(), "the candidate "+req.GetCandidateId())
	}
	// walMu: no batch is written between the flush and the promise.
	s.walMu.Lock()
	defer s.walMu.Unlock()
	if err := s.wal.Sync(); err != nil {
		s.metrics.fsyncErrors.Inc()
		return nil, status.Errorf(codes.Unavailable, "replica %s: wal fsync: %v", s.cfg.ID, err)
	}
	resp := s.fenceState()
	promised := false
	for _, e := range st.Effects {
		switch e := e.(type) {
		case failover.AdoptCluster:
			if err := s.adoptCluster(e.ID, e.From); err != nil {
				return nil, status.Errorf(codes.Unavailable, "replica %s: save the cluster id: %v", s.cfg.ID, err)
			}
		case failover.SaveVote:
			if err := s.saveVoteLocked(e.Vote, e.Why); err != nil {
				s.metrics.fsyncErrors.Inc()
				return nil, status.Errorf(codes.Unavailable, "replica %s: save the vote: %v", s.cfg.ID, err)
			}
			promised = true
		}
	}
	v := s.vote.Load()
	resp.Granted, resp.Epoch, resp.PrimaryId, resp.PrimaryAddr, resp.ClusterId = st.Granted, v.Epoch, v.Primary, v.Addr, s.cluster.ID()
	if promised {
		s.metrics.fences.Inc()
	}
	return resp, nil
}

// acceptor is the replica's part of the protocol as the failover core
// reads it: its promise, its log's newest epoch and its cluster.
func (s *Server) acceptor() failover.State {
	st := failover.State{Vote: *s.vote.Load(), LogEpoch: s.epoch.Load(), Cluster: s.cluster.ID()}
	if lp := s.logPrimary.Load(); lp != nil {
		st.LogPrimary = *lp
	}
	return st
}

// LogPrimary is the primary of the newest epoch of the replica's log as
// it knows it (failover.State.PrimaryOfLog; the zero Vote if it knows
// none).
func (s *Server) LogPrimary() datadir.Vote { return s.acceptor().PrimaryOfLog() }

// persist carries out the effects of a failover core step, in order,
// before the step's message is acted on; an error is fatal to the
// follower. Callers hold voteMu if a vote is saved, and walMu (or are the
// only writer) if an epoch is noted.
func (s *Server) persist(effects []failover.Effect) error {
	for _, e := range effects {
		switch e := e.(type) {
		case failover.AdoptCluster:
			if err := s.adoptCluster(e.ID, e.From); err != nil {
				return err
			}
		case failover.SaveVote:
			if err := s.saveVoteLocked(e.Vote, e.Why); err != nil {
				return fmt.Errorf("%w: save the vote: %w", errFatal, err)
			}
		case failover.NoteEpoch:
			if err := s.noteEpoch(e.Epoch, e.FirstLSN); err != nil {
				return fmt.Errorf("%w: %w", errFatal, err)
			}
		default:
			return fmt.Errorf("%w: the replica does not carry out %T", errFatal, e)
		}
	}
	return nil
}

// clusterRefused is the refusal of peer, which states the cluster id
// theirs, for a message the failover core refused as another cluster's
// (logged and counted by guard.Require).
func (s *Server) clusterRefused(theirs, peer string) error {
	if err := s.guard.Require(theirs, peer); err != nil {
		return err
	}
	return s.guard.Refusal(rpcerr.OtherCluster("replica "+s.cfg.ID, s.cluster.ID(), peer, theirs), theirs, peer)
}

// fenceState describes the replica's log for a FenceResponse.
func (s *Server) fenceState() *walshipv1.FenceResponse {
	h := *s.history.Load()
	resp := &walshipv1.FenceResponse{
		Id:                s.cfg.ID,
		LastEpoch:         s.epoch.Load(),
		LastLsn:           s.wal.DurableLSN(),
		History:           h.Proto(),
		AppliedLsn:        s.appliedLSN(),
		PrimaryDurableLsn: s.follower.primaryDurableSeen.Load(),
		PrimaryLastLsn:    s.lag.primaryLSN(),
		ClusterId:         s.cluster.ID(),
	}
	lp := s.LogPrimary()
	resp.LogPrimaryId, resp.LogPrimaryAddr = lp.Primary, lp.Addr
	if c := s.lag.lastContactTime(); !c.IsZero() {
		resp.SincePrimaryContact = durationpb.New(time.Since(c))
	}
	resp.Contract = s.EpochRecord().GetContract()
	return resp
}

// LogPosition describes the replica's log: the end of what it holds
// durably, the epoch of its newest entry, and its history.
func (s *Server) LogPosition() (last, epoch uint64, h datadir.History) {
	return s.wal.DurableLSN(), s.epoch.Load(), *s.history.Load()
}

// Vote is the replica's current promise.
func (s *Server) Vote() datadir.Vote { return *s.vote.Load() }

// notPrimaryReason is the ErrorInfo reason of a refusal by a node that is
// not the primary; its metadata names the one it knows.
const notPrimaryReason = "NOT_PRIMARY"

// NotPrimary is the error a node that is not the primary answers
// replication with: FAILED_PRECONDITION, with an ErrorInfo naming the
// primary it knows (metadata primary_id, primary_addr, epoch) and the
// node's cluster (cluster_id, if it has one), so that a replica that
// asked finds the current primary — unless it is of another cluster.
func NotPrimary(who string, v datadir.Vote, cluster string) error {
	st := status.Newf(codes.FailedPrecondition, "%s is not the primary; the primary of epoch %d is %s at %s", who, v.Epoch, v.Primary, v.Addr)
	md := map[string]string{"primary_id": v.Primary, "primary_addr": v.Addr, "epoch": strconv.FormatUint(v.Epoch, 10)}
	if cluster != "" {
		md["cluster_id"] = cluster
	}
	if d, err := st.WithDetails(&errdetails.ErrorInfo{Reason: notPrimaryReason, Domain: "walship.io", Metadata: md}); err == nil {
		st = d
	}
	return st.Err()
}

// notPrimary is this replica's NotPrimary.
func (s *Server) notPrimary() error {
	return NotPrimary("replica "+s.cfg.ID, s.Vote(), s.cluster.ID())
}

// primaryFrom reads a NotPrimary refusal (ok false for any other error,
// or one naming an epoch more than datadir.MaxEpochJump above known, the
// replica's promise: not believed): the primary it names, and the cluster
// of the node that named it.
func primaryFrom(err error, known uint64) (v datadir.Vote, cluster string, ok bool) {
	st, isStatus := status.FromError(err)
	if !isStatus || st.Code() != codes.FailedPrecondition {
		return datadir.Vote{}, "", false
	}
	for _, d := range st.Details() {
		if ei, isInfo := d.(*errdetails.ErrorInfo); isInfo && ei.GetReason() == notPrimaryReason {
			md := ei.GetMetadata()
			e, err := strconv.ParseUint(md["epoch"], 10, 64)
			if err != nil || datadir.CheckEpoch(e, known, datadir.MaxEpochJump) != nil || md["primary_addr"] == "" {
				return datadir.Vote{}, "", false
			}
			return datadir.Vote{Epoch: e, Primary: md["primary_id"], Addr: md["primary_addr"]}, md["cluster_id"], true
		}
	}
	return datadir.Vote{}, "", false
}

// replServer is the replica's ReplicationService: a replica is not a
// primary, and names the one it knows.
type replServer struct {
	walshipv1.UnimplementedReplicationServiceServer
	s *Server
}

// Stream and Snapshot name the primary this replica knows, and its
// cluster: a replica of another cluster does not take its word for it.
func (r *replServer) Stream(walshipv1.ReplicationService_StreamServer) error {
	return r.s.notPrimary()
}

func (r *replServer) Snapshot(*walshipv1.SnapshotRequest, walshipv1.ReplicationService_SnapshotServer) error {
	return r.s.notPrimary()
}

// logServer serves the replica's own log, as a log store serves its: a
// candidate whose most advanced peer is this replica copies the tail it
// lacks from here.
type logServer struct {
	walshipv1.UnimplementedLogStoreServiceServer
	s *Server
}

// Read streams the replica's durable WAL entries (internal/walserve).
func (l *logServer) Read(req *walshipv1.ReadRequest, stream walshipv1.LogStoreService_ReadServer) error {
	if err := rpcerr.CheckClusterID("cluster_id", req.GetClusterId()); err != nil {
		return err
	}
	if err := l.s.guard.Check(req.GetClusterId(), "the request"); err != nil {
		return err
	}
	return walserve.Read(l.s.wal, "replica "+l.s.cfg.ID, req, stream)
}

// Status of the replica's log, as a log store reports its.
func (l *logServer) Status(context.Context, *walshipv1.LogStoreServiceStatusRequest) (*walshipv1.LogStoreServiceStatusResponse, error) {
	s := l.s
	v := s.Vote()
	return &walshipv1.LogStoreServiceStatusResponse{FirstLsn: s.wal.FirstLSN(), DurableLsn: s.wal.DurableLSN(), Epoch: v.Epoch,
		LastEpoch: s.epoch.Load(), History: (*s.history.Load()).Proto(), VoteEpoch: v.Epoch, PrimaryId: v.Primary, PrimaryAddr: v.Addr,
		ClusterId: s.cluster.ID(), LogPrimaryId: s.LogPrimary().Primary, LogPrimaryAddr: s.LogPrimary().Addr}, nil
}

// isNotPrimary reports whether err is a NotPrimary refusal this replica
// believes.
func (s *Server) isNotPrimary(err error) bool {
	_, _, ok := primaryFrom(err, s.Vote().Epoch)
	return ok
}

// namedAhead reports whether err is a NotPrimary refusal naming an epoch
// more than datadir.MaxEpochJump above the replica's promise: not
// believed, but its log stores may vouch for it (askLogStore).
func (s *Server) namedAhead(err error) bool {
	_, _, named := primaryFrom(err, datadir.MaxEpoch)
	_, _, believed := primaryFrom(err, s.Vote().Epoch)
	return named && !believed
}

// namedByOtherCluster reports whether err is a NotPrimary refusal from a
// node of another cluster than this replica's, or of none once the
// replica has an id (whose word for the primary it must not take),
// logging and counting it.
func (s *Server) namedByOtherCluster(err error) bool {
	_, theirs, ok := primaryFrom(err, s.Vote().Epoch)
	ours := s.cluster.ID()
	if !ok || ours == "" || ours == theirs {
		return false
	}
	s.metrics.clusterMismatch.Inc()
	s.logger.Error("the node this replica follows belongs to another cluster: not taking its word for the primary (check --primary and the data directory); retrying",
		"node", s.primary(), "cluster_id", ours, "node_cluster_id", theirs, "err", err)
	return true
}

// learnPrimary takes a NotPrimary refusal's word for who the primary is,
// if it names a newer epoch than promised (or the same one's primary) and
// comes from a node of this replica's cluster (any, while it has none).
func (s *Server) learnPrimary(err error) bool {
	s.voteMu.Lock()
	defer s.voteMu.Unlock()
	cur := s.vote.Load()
	v, theirs, ok := primaryFrom(err, cur.Epoch)
	if !ok || (s.cluster.ID() != "" && theirs != s.cluster.ID()) {
		return false
	}
	switch {
	case v.Epoch > cur.Epoch:
		if _, err := s.promiseLocked(v); err != nil {
			s.logger.Warn("cannot save the vote for the primary a peer named", "vote", v.String(), "err", err)
			return false
		}
	case v.Epoch == cur.Epoch && v.Addr != s.primary():
		if _, err := s.learnLocked(v); err != nil {
			s.logger.Warn("cannot save the vote for the primary a peer named", "vote", v.String(), "err", err)
		}
		s.followPrimary(v.Addr)
	default:
		return false
	}
	s.logger.Info("a node that is not the primary named the primary", "vote", v.String())
	return true
}

// askLogStore asks the log stores which epoch they have promised and to
// whom, and follows the newest primary named if it is newer than this
// replica's promise (or names the primary of the epoch promised, if the
// promise names none), or — for the epoch promised — the primary a
// majority of one set of them names, if the promise names another
// candidate: one that lost, this node itself after a promotion that did
// not open (failover.State.LearnFromLogStoreSets). It asks the log stores
// of the contract in its log once a change moved them, else those of its
// flags (logStoreSets). A log store of another cluster is not taken at
// its word.
func (s *Server) askLogStore(ctx context.Context) {
	var newest datadir.Vote
	named := map[string]datadir.Vote{}
	sets := s.logStoreSets()
	for _, ls := range s.logStoresOf(sets) {
		actx, cancel := context.WithTimeout(ctx, 2*time.Second)
		st, err := ls.client.Status(actx, &walshipv1.LogStoreServiceStatusRequest{})
		cancel()
		if err != nil || st.GetPrimaryAddr() == "" || datadir.CheckEpoch(st.GetVoteEpoch(), s.Vote().Epoch, datadir.MaxEpochGap) != nil {
			continue
		}
		if ours, theirs := s.cluster.ID(), st.GetClusterId(); ours != "" && ours != theirs {
			s.logger.Error("the log store belongs to another cluster, or states none: not taking its word for the primary (check --logstore)",
				"logstore", ls.addr, "cluster_id", ours, "logstore_cluster_id", theirs)
			continue
		}
		if err := datadir.ValidatePrimary(st.GetPrimaryId(), st.GetPrimaryAddr()); err != nil {
			s.logger.Error("the log store names a primary no vote file can hold: not taking its word for the primary", "logstore", ls.addr, "err", err)
			continue
		}
		v := datadir.Vote{Epoch: st.GetVoteEpoch(), Primary: st.GetPrimaryId(), Addr: st.GetPrimaryAddr()}
		named[ls.addr] = v
		if v.Epoch > newest.Epoch {
			newest = v
		}
	}
	if newest.Epoch == 0 {
		return
	}
	s.voteMu.Lock()
	defer s.voteMu.Unlock()
	if changed, err := s.learnLocked(newest); err == nil && changed {
		s.logger.Info("a log store named the primary", "vote", newest.String())
		return
	}
	if v, why := s.acceptor().LearnFromLogStoreSets(sets, named); why != "" {
		if err := s.saveVoteLocked(v, why); err != nil {
			s.logger.Warn("cannot save the vote for the primary the log stores named", "vote", v.String(), "err", err)
		}
	}
}

// EpochRecord is the newest epoch record in the replica's log (nil if
// none): the one it applied, or a newer one in a batch it wrote and has
// not applied yet (heldrecord.go).
func (s *Server) EpochRecord() *walshipv1.EpochRecord {
	applied, _, held := s.EpochRecords()
	if held != nil {
		return held
	}
	return applied
}
