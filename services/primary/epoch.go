package primary

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	walshipv1 "github.com/walship/walship/gen/walship/v1"
	"github.com/walship/walship/internal/backoff"
	"github.com/walship/walship/internal/datadir"
	"github.com/walship/walship/internal/failover"
	"github.com/walship/walship/internal/keyspace"
	"github.com/walship/walship/internal/rpcerr"
	"github.com/walship/walship/internal/tlsid"
	"github.com/walship/walship/internal/walserve"
	"github.com/walship/walship/pkg/codec"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	grpcbackoff "google.golang.org/grpc/backoff"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
)

// A primary's epoch. The primary begins a new epoch every time it starts,
// at the LSN after the last one it recovered, and keeps the history of its
// log in DataDir/epochs (PostgreSQL's timeline history). With log stores it
// first wins that epoch from a majority of them (elect): each persists the
// promise and refuses older epochs from then on, so a primary that was
// deposed while it was down finds the newer epoch and rejoins as a replica
// (Run returns a DeposedError) instead of taking writes. A node that
// promoted its data directory has fenced the epoch already (Config.Elected).
//
// Before it takes reads or writes, the primary commits the epoch record
// (keyspace.EpochRecordKey: who, since when, the contract) and waits until it
// meets the contract; acknowledgements of older entries never count as
// commits of the new epoch, and nothing of an older epoch is served before
// the new one is established.

// DeposedError ends a primary that learnt of a newer epoch: a replica or a
// log store had promised it, or a candidate fenced this primary. Vote is
// what it learnt (the primary's address may be unknown).
type DeposedError struct {
	Vote datadir.Vote
	Why  string
}

func (e *DeposedError) Error() string {
	return fmt.Sprintf("deposed: %s (epoch %d, primary %q at %q)", e.Why, e.Vote.Epoch, e.Vote.Primary, e.Vote.Addr)
}

// Is makes a DeposedError an rpcerr.ErrUnavailable for the commits it
// fails: their outcome is unknown.
func (e *DeposedError) Is(target error) bool { return target == rpcerr.ErrUnavailable }

// Elected is an epoch a node has already won for this data directory.
type Elected struct {
	Epoch   uint64
	History datadir.History // the log's history, with Epoch's line last
}

// Member is a data node of the cluster.
type Member struct {
	ID, Addr string
}

// proposeEpoch computes the epoch this run begins at LSN next (not yet
// saved): seen is the highest epoch in the recovered log.
func (s *Server) proposeEpoch(seen, next uint64) error {
	if e := s.cfg.Elected; e != nil {
		if cur := e.History.Current(); cur.Epoch != e.Epoch || cur.FirstLSN != next {
			return fmt.Errorf("elected epoch %d: the history's last line is %v, want epoch %d from LSN %d", e.Epoch, cur, e.Epoch, next)
		}
		s.epochs, s.epoch = e.History, e.Epoch
		return nil
	}
	h, err := datadir.LoadHistory(s.fs, s.cfg.DataDir)
	if err != nil {
		return err
	}
	v, err := datadir.LoadVote(s.fs, s.cfg.DataDir)
	if err != nil {
		return err
	}
	// A directory a replica wrote may hold a vote newer than its log.
	h, err = h.Begin(max(seen, v.Epoch), next)
	if err != nil {
		return fmt.Errorf("begin an epoch at LSN %d: %w", next, err)
	}
	s.epochs, s.epoch = h, h.Current().Epoch
	return nil
}

// elect wins this run's epoch from a majority of the log stores, retrying
// until it does or one of them has promised a newer epoch (a DeposedError)
// or ctx ends, then settles the primary's cluster id (joinCluster) from
// their answers. Without log stores there is nothing to win. Log stores
// of another cluster refuse the fence; once too many have for a majority
// to grant it, elect fails with rpcerr.ErrOtherCluster naming both ids.
//
// The log stores are those of the contract it starts under
// (startContract): while its log ends in a joint record, it needs a
// majority of each half, as a candidate does (failover.JudgeJoint).
func (s *Server) elect(ctx context.Context) error {
	start := s.startContract()
	if prev := s.logContract(); len(start.GetMembers()) == 0 && failover.BindsPeerless(prev, s.cfg.ID) {
		// Without --peers this primary would write no epoch record and
		// take any replica's ack for "any k", while a candidate judges by
		// the members the log's newest record names and may miss what
		// only another node, or fewer than that record's k, acknowledged.
		// Refused before anything is fenced, as below.
		if failover.SetByChange(prev) {
			// Once a membership change has set them, the log holds the
			// members (Contract.members_changed).
			return fmt.Errorf("epoch %d: this node %s was started without --peers, but its log holds the configuration a membership change set (%s): start it with --peers (its log's members then win over the flag's)",
				s.epoch, s.cfg.ID, configLine(prev))
		}
		return fmt.Errorf("epoch %d: this node %s was started without --peers, but its log's newest epoch record names other members (%s), by which a candidate judges: start it with --peers (those members, or a new list: a change at an epoch start, which waits until enough of them hold it)",
			s.epoch, s.cfg.ID, configLine(prev))
	}
	if start.GetMembersChanged() && !failover.ConfigOf(start).Leads(s.cfg.ID) {
		// The members are the log's (a run-time change set them), and
		// they do not name this node in every half: its acks would not
		// meet what a promotion under them needs (failover Config.Leads).
		// Refused before anything is fenced: fencing the log stores first
		// would depose the cluster's primary for nothing.
		return fmt.Errorf("epoch %d: this node %s is not a member of the configuration its log holds (%s): a membership change removed it; start it as a replica, or add it back at the primary (walship ctl members add)",
			s.epoch, s.cfg.ID, configLine(start))
	}
	stores, halves := logStoreSet(start), logStoreHalves(start)
	if s.cfg.Elected != nil || len(stores) == 0 {
		return s.joinCluster(nil)
	}
	var bo backoff.Backoff
	req := &walshipv1.FenceRequest{Epoch: s.epoch, CandidateId: s.cfg.ID, CandidateAddr: s.Advertise(), ClusterId: s.cluster.ID()}
	for {
		grantedBy, newer, answers, ids, foreign := s.fenceLogStores(ctx, stores, req)
		granted, won, lost := len(grantedBy), true, false
		for _, h := range halves {
			n, refused := 0, 0
			for _, a := range h {
				if slices.Contains(grantedBy, a) {
					n++
				}
				if slices.ContainsFunc(foreign, func(f string) bool { return strings.HasPrefix(f, a+": ") }) {
					refused++
				}
			}
			won = won && n >= failover.Majority(len(h))
			lost = lost || refused > len(h)-failover.Majority(len(h))
		}
		if lost {
			s.metrics.clusterMismatch.Add(float64(len(foreign)))
			of := "of cluster " + s.cluster.ID()
			if s.cluster.ID() == "" {
				// Log stores that have an id refuse a fence that states
				// none: a directory without one joins a cluster as a
				// replica, adopting its primary's.
				of = "with no cluster id (start it as a replica to join the log stores' cluster)"
			}
			err := rpcerr.Mismatch("primary %s %s cannot win epoch %d: %d of the %d log stores belong to another cluster, and a majority (%d) must grant it: %s",
				s.cfg.ID, of, s.epoch, len(foreign), len(stores), s.peers.quorum, strings.Join(foreign, "; "))
			s.logger.Error("the log stores belong to another cluster: not starting (check --logstore and the data directory)", "err", err)
			return err
		}
		if newer != nil {
			s.keepLogPrimary(*newer)
			if err := datadir.SaveVote(s.fs, s.cfg.DataDir, *newer); err != nil {
				s.logger.Warn("cannot save the vote of the newer epoch", "err", err)
			}
			return &DeposedError{Vote: *newer, Why: "a log store has promised a newer epoch: this node was deposed while it was down"}
		}
		if won {
			s.logger.Info("won the epoch from the log stores", "epoch", s.epoch, "granted", granted, "of", len(stores))
			return s.joinCluster(ids)
		}
		s.logger.Warn("cannot win the epoch from a majority of the log stores yet; retrying", "epoch", s.epoch,
			"granted", granted, "needed", s.peers.quorum, "answers", strings.Join(answers, "; "))
		if !bo.Wait(ctx) {
			return ctx.Err()
		}
	}
}

// fenceLogStores sends req to every log store of stores at once and
// returns those that granted it, the newest promise a refusal named (nil if none), a line
// per log store, the cluster id each answer stated (by address), and a
// line per log store that refused it for belonging to another cluster.
func (s *Server) fenceLogStores(ctx context.Context, stores []string, req *walshipv1.FenceRequest) (granted []string, newer *datadir.Vote, answers []string, ids map[string]string, foreign []string) {
	type answer struct {
		addr string
		resp *walshipv1.FenceResponse
		err  error
	}
	ch := make(chan answer, len(stores))
	for _, addr := range stores {
		go func() {
			resp, err := s.fenceOne(ctx, addr, req)
			ch <- answer{addr, resp, err}
		}()
	}
	ids = map[string]string{}
	for range stores {
		a := <-ch
		if a.resp != nil {
			ids[a.addr] = a.resp.GetClusterId()
		}
		switch {
		case rpcerr.IsOtherCluster(a.err):
			line := fmt.Sprintf("%s: %s", a.addr, status.Convert(a.err).Message())
			answers, foreign = append(answers, line), append(foreign, line)
		case a.err != nil:
			answers = append(answers, fmt.Sprintf("%s: %v", a.addr, a.err))
		case datadir.CheckEpoch(a.resp.GetEpoch(), req.GetEpoch(), datadir.MaxEpochGap) != nil:
			// Not believed: no honest log store gets that far ahead.
			answers = append(answers, fmt.Sprintf("%s: epoch: %v", a.addr, datadir.CheckEpoch(a.resp.GetEpoch(), req.GetEpoch(), datadir.MaxEpochGap)))
		case a.resp.GetGranted():
			granted = append(granted, a.addr)
			answers = append(answers, a.addr+": granted")
		default:
			v := datadir.Vote{Epoch: a.resp.GetEpoch(), Primary: a.resp.GetPrimaryId(), Addr: a.resp.GetPrimaryAddr()}
			if newer == nil || v.Epoch > newer.Epoch {
				newer = &v
			}
			answers = append(answers, fmt.Sprintf("%s: holds epoch %d for %s", a.addr, v.Epoch, v.Primary))
		}
	}
	sort.Strings(answers)
	sort.Strings(foreign)
	return granted, newer, answers, ids, foreign
}

func (s *Server) fenceOne(ctx context.Context, addr string, req *walshipv1.FenceRequest) (*walshipv1.FenceResponse, error) {
	conn, err := s.dialer().Dial(addr, s.dialer().PeerClass(tlsid.ClassLogStore))
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	fctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	return walshipv1.NewEpochServiceClient(conn).Fence(fctx, req, grpc.WaitForReady(true))
}

// saveEpoch makes this run's epoch durable — the history, then the vote
// for this node — before anything of it is written or sent.
func (s *Server) saveEpoch() error {
	if err := datadir.SaveHistory(s.fs, s.cfg.DataDir, s.epochs); err != nil {
		return err
	}
	v := datadir.Vote{Epoch: s.epoch, Primary: s.cfg.ID, Addr: s.Advertise()}
	s.vote.Store(&v)
	return datadir.SaveVote(s.fs, s.cfg.DataDir, v)
}

// contract is the contract in force: that of the newest contract record
// this run wrote (its epoch record, or a membership change's), else the
// one it will stamp in its epoch record.
func (s *Server) contract() *walshipv1.Contract {
	if c := s.inForce.Load(); c != nil {
		return c.contract
	}
	return s.startContract()
}

// startContract is the durability contract this run stamps in its epoch
// record: that of its flags, except that once a membership change has
// changed the members at run time (members_changed), or while one is in
// progress (the log's newest record is joint), the members are the log's:
// a joint record is never replaced by C_old alone (a new primary finishes
// or rolls it back, change.go), and a finished change is not undone by
// the flags the node was started with. The log stores likewise: the
// log's, not --logstore's, once a change has set members_changed (a
// change moves log stores too). Learners are dropped: a learner stage a
// failover interrupted is abandoned. A roll-back's joint record keeps
// saying it is one (Configuration.rollback), so that it is finished as a
// roll-back.
func (s *Server) startContract() *walshipv1.Contract {
	c := ContractOf(s.cfg.Policy, s.cfg.Members, s.cfg.LogStores, s.cfg.LeaseTimeout)
	if len(c.GetMembers()) == 0 || s.store == nil {
		return c
	}
	rec, err := keyspace.EpochRecord(s.store.Snapshot())
	prev := rec.GetContract()
	if err != nil || !failover.SetByChange(prev) {
		return c
	}
	c.Members, c.MembersChanged = cloneMembers(prev.GetMembers()), true
	if len(prev.GetLogstores()) > 0 {
		c.Logstores = slices.Clone(prev.GetLogstores())
		c.LogstoreSync = s.cfg.Policy.LogStore == walshipv1.LogStoreAck_LOG_STORE_ACK_SYNC
	}
	if nx := prev.GetNext(); nx != nil {
		ls := nx.GetLogstores()
		if len(ls) == 0 {
			ls = c.GetLogstores()
		}
		// A roll-back stays one: a record older than the rollback field
		// says so by its stage.
		rollback := nx.GetRollback() || rec.GetStage() == walshipv1.MembershipStage_MEMBERSHIP_STAGE_ROLLBACK_JOINT
		c.Next = &walshipv1.Configuration{Members: cloneMembers(nx.GetMembers()), Logstores: slices.Clone(ls), SyncReplicas: c.GetSyncReplicas(), Rollback: rollback}
	}
	return c
}

// logContract is the contract of the newest epoch record in the log
// (nil if none).
func (s *Server) logContract() *walshipv1.Contract {
	if s.store == nil {
		return nil
	}
	rec, err := keyspace.EpochRecord(s.store.Snapshot())
	if err != nil {
		return nil
	}
	return rec.GetContract()
}

func cloneMembers(ms []*walshipv1.Member) []*walshipv1.Member {
	out := make([]*walshipv1.Member, 0, len(ms))
	for _, m := range ms {
		out = append(out, &walshipv1.Member{Id: m.GetId(), Addr: m.GetAddr()})
	}
	return out
}

// contractInForce is the newest contract record this run wrote and the
// step of a membership change it is.
type contractInForce struct {
	contract *walshipv1.Contract
	stage    walshipv1.MembershipStage
	// logstores are the contract's (logStoreSet), worked out once.
	logstores []string
}

// useContract makes c the contract in force: acks follow it from now on
// (ackrule.go). A record is put in force before it is sequenced, so that
// no commit after it is acknowledged under the rule before it.
func (s *Server) useContract(c *walshipv1.Contract, stage walshipv1.MembershipStage) {
	before := s.contract()
	s.inForce.Store(&contractInForce{contract: c, stage: stage, logstores: logStoreSet(c)})
	s.peers.setRule(ruleOf(c, s.cfg.ID))
	s.lease.setHalves(logStoreHalves(c))
	s.noteLogStores(before, c)
}

// epochRecord is this epoch's record under contract c, written at the
// membership change step stage.
func (s *Server) epochRecord(c *walshipv1.Contract, stage walshipv1.MembershipStage) *walshipv1.EpochRecord {
	rec := &walshipv1.EpochRecord{Epoch: s.epoch, FirstLsn: s.epochs.Current().FirstLSN, PrimaryId: s.cfg.ID, PrimaryAddr: s.Advertise(),
		Contract: c, TimeUnixNano: time.Now().UnixNano(), Stage: stage}
	for _, e := range s.epochs {
		rec.History = append(rec.History, &walshipv1.EpochStart{Epoch: e.Epoch, FirstLsn: e.FirstLSN})
	}
	return rec
}

// writeRecord puts rec in force and commits it, waiting for the local
// fsync only (awaitContract waits for the rest). It returns its LSN.
func (s *Server) writeRecord(ctx context.Context, rec *walshipv1.EpochRecord) (uint64, error) {
	data, err := proto.Marshal(rec)
	if err != nil {
		return 0, err
	}
	before := s.inForce.Load()
	s.useContract(rec.GetContract(), rec.GetStage())
	res, err := s.exec(ctx, &walshipv1.CommitPolicy{Durability: walshipv1.Durability_DURABILITY_SYNC,
		Replication: walshipv1.ReplicationMode_REPLICATION_MODE_DISABLED, Logstore: walshipv1.LogStoreAck_LOG_STORE_ACK_ASYNC},
		[]op{{kind: codec.OpPut, key: keyspace.EpochRecordKey, value: data}})
	if err != nil {
		// A record sequenced before its commit failed (the lease or the
		// gate lost just after it) is in the log, and acks follow the
		// newest record there: it stays in force, and a membership change
		// goes on from it (retryChange) as a new primary would. Only a
		// record never sequenced gives way to the one before.
		if before == nil {
			return 0, err
		}
		if !s.holdsRecord(rec) {
			s.useContract(before.contract, before.stage)
			return 0, err
		}
		return 0, &recordInForceError{err: err}
	}
	return res.lsn, nil
}

// recordInForceError is a record's failed commit after the record was
// sequenced: it is in the log and stays in force, so the step it was
// is taken — a final record's change is over once it is acknowledged —
// and what follows goes on from it (retryChange).
type recordInForceError struct{ err error }

func (e *recordInForceError) Error() string {
	return e.err.Error() + "; the record is in the log and stays in force"
}

func (e *recordInForceError) Unwrap() error { return e.err }

// holdsRecord reports whether rec is the epoch record in the primary's
// state: once a commit is answered, even with an error, it is visible
// there if it was sequenced and the primary has not failed.
func (s *Server) holdsRecord(rec *walshipv1.EpochRecord) bool {
	got, err := keyspace.EpochRecord(s.store.Snapshot())
	return err == nil && proto.Equal(got, rec)
}

// awaitContract waits until lsn is acknowledged under contract c (in
// force): k of the members of each half at c's level, and, under log
// store sync, a majority of each half's log stores.
func (s *Server) awaitContract(ctx context.Context, lsn uint64, c *walshipv1.Contract) error {
	if k := int(c.GetSyncReplicas()); k > 0 {
		if err := s.peers.waitReplicas(ctx, lsn, waitClass{level: c.GetSyncLevel(), k: k}); err != nil {
			return err
		}
	}
	if c.GetLogstoreSync() {
		if err := s.peers.waitLogStores(ctx, lsn); err != nil {
			return err
		}
	}
	if n := c.GetNext(); len(n.GetLogstores()) > 0 && !sameSet(c.GetLogstores(), n.GetLogstores()) {
		// A joint record that moves log stores is done only once a
		// majority of each set holds it, whatever the commits wait for:
		// the next record moves the lease to the new set, and a candidate
		// that fences a majority of the old set must find the joint
		// record there, or it opens under the old set alone while this
		// primary leases through the new one (failover's
		// TestSimLogStoreChangeK0: under k = 0 and log store async, the
		// default policy, nothing else waits).
		return s.peers.waitLogStoreSets(ctx, lsn, c.GetLogstores(), n.GetLogstores())
	}
	return nil
}

// ContractOf is the contract of a primary whose default policy is p: the
// replica and log store waits of p, the members, the log stores and its
// lease.
func ContractOf(p Policy, members []Member, logstores []string, lease time.Duration) *walshipv1.Contract {
	c := &walshipv1.Contract{SyncLevel: p.SyncLevel, LogstoreSync: p.LogStore == walshipv1.LogStoreAck_LOG_STORE_ACK_SYNC && len(logstores) > 0,
		Logstores: logstores, LeaseTimeout: durationpb.New(lease)}
	if p.Replication == walshipv1.ReplicationMode_REPLICATION_MODE_SYNC {
		c.SyncReplicas = uint32(p.SyncReplicas)
	}
	for _, m := range members {
		c.Members = append(c.Members, &walshipv1.Member{Id: m.ID, Addr: m.Addr})
	}
	return c
}

// openEpoch commits the epoch record, waits until it meets the contract
// and until the primary holds its lease, and opens the primary for reads
// and writes. It returns when ctx ends or the primary fails first.
func (s *Server) openEpoch(ctx context.Context) error {
	if !s.needsRecord() {
		s.useContract(s.startContract(), walshipv1.MembershipStage_MEMBERSHIP_STAGE_UNSPECIFIED)
		if err := s.lease.wait(ctx); err != nil {
			return fmt.Errorf("epoch %d: no lease from the log stores: %w", s.epoch, err)
		}
		s.open()
		return nil
	}
	rec := s.epochRecord(s.startContract(), walshipv1.MembershipStage_MEMBERSHIP_STAGE_UNSPECIFIED)
	// The contract before this record's, as this log has it.
	prev := s.logContract()
	// The record itself waits for the local fsync only; the contract is
	// waited for below, without a timeout: the epoch opens when it can.
	lsn, err := s.writeRecord(ctx, rec)
	if err != nil {
		return fmt.Errorf("commit the epoch record: %w", err)
	}
	res := execResult{lsn: lsn}
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stop := context.AfterFunc(s.pipe.alive, cancel)
	defer stop()
	c := rec.Contract
	if err := s.awaitContract(wctx, res.lsn, c); err != nil {
		return fmt.Errorf("epoch record at LSN %d: %w", res.lsn, err)
	}
	if w, ok := epochChangeWait(prev, c, s.cfg.ID); ok {
		// A changed contract: the record must reach the previous one's
		// members too (contractchange.go).
		s.logger.Info("the epoch record changes the contract: waiting until the previous contract's members apply it",
			"epoch", s.epoch, "lsn", res.lsn, "need", w.need, "of", strings.Join(w.voters, ","), "previous", prev.String())
		if err := s.peers.waitApplied(wctx, res.lsn, w); err != nil {
			return fmt.Errorf("epoch record at LSN %d changes the contract, and %s must apply it: %w", res.lsn, w.why, err)
		}
	}
	if err := s.lease.wait(wctx); err != nil {
		return fmt.Errorf("epoch %d: no lease from the log stores: %w", s.epoch, err)
	}
	s.open()
	s.logger.Info("epoch open", "epoch", s.epoch, "epoch_record_lsn", res.lsn, "contract", c.String())
	if c.GetNext() != nil {
		// The log ended in a joint record: finish it or roll it back.
		r := &changeRun{resume: true, desc: "finish or roll back the change to " + configLine(c) + " this primary's log ended in", done: make(chan struct{})}
		if err := s.changes.begin(r); err == nil {
			return s.submit(ctx, r)
		}
	}
	return nil
}

// open opens the primary for reads and writes, saying so first
// (Config.Opened), so that whoever sees a write taken sees it said.
func (s *Server) open() {
	if s.cfg.Opened != nil {
		s.cfg.Opened()
	}
	s.markOpened()
	s.srv.SetServing(true)
}

// needsRecord reports whether this run writes an epoch record: in a
// cluster of members (where a replica can be promoted and reads the
// contract from it), when the node was elected by a promotion or the
// record in the state names another primary or another contract. A
// primary restarting on its own log under the same contract needs none:
// every entry of it is its own. A primary without members writes none.
func (s *Server) needsRecord() bool {
	if len(s.cfg.Members) == 0 {
		return false
	}
	if s.cfg.Elected != nil {
		return true
	}
	rec, err := keyspace.EpochRecord(s.store.Snapshot())
	if err != nil || rec == nil || rec.GetContract().GetNext() != nil {
		// A joint record is written again, and waited for under the joint
		// rule, before the change it is part of goes on (change.go).
		return true
	}
	return rec.GetPrimaryId() != s.cfg.ID || rec.GetPrimaryAddr() != s.Advertise() || !proto.Equal(rec.GetContract(), s.startContract())
}

// serving reports why the primary cannot answer reads and writes now (nil
// if it can): it has not opened its epoch, it lost its lease, it failed or
// was deposed.
func (s *Server) serving() error {
	_, err := s.refusal()
	return err
}

// Why a primary refuses writes: the reason label of
// walship_primary_refused_writes_total, one per case of refusal.
const (
	refusedFailed   = "failed"   // the primary failed (a fatal error) or was deposed
	refusedOpening  = "opening"  // its epoch record does not meet the contract yet
	refusedHandover = "handover" // a switchover is handing its role over
	refusedNoLease  = "no_lease" // no log store majority heard within its lease
	refusedGated    = "election" // Config.Gate: it does not hold the election
)

// refusedReasons are every reason label, exported at 0 from the start.
var refusedReasons = []string{refusedFailed, refusedOpening, refusedHandover, refusedNoLease, refusedGated}

// refusal is serving's answer with the reason label of its refusal ("" and
// nil when the primary serves).
func (s *Server) refusal() (reason string, err error) {
	switch {
	case s.failedErr() != nil:
		return refusedFailed, notServing("primary cannot serve: %v", s.failedErr())
	case !s.opened.Load():
		return refusedOpening, notServing("primary is opening epoch %d: its epoch record does not meet the contract yet", s.epoch)
	case s.pipe.handover.Load():
		return refusedHandover, notServing("primary is handing over to another node (switchover)")
	case !s.lease.valid():
		return refusedNoLease, notServing("primary has not heard from a log store majority for %v (its lease): it may have been deposed", s.cfg.LeaseTimeout)
	}
	if err := s.gated(); err != nil {
		return refusedGated, notServing("primary does not take reads and writes: %v", err)
	}
	return "", nil
}

// takingWrite is serving for a write: a refusal is counted by its reason,
// so that a primary that takes no writes shows (and pages) however few
// clients retry.
func (s *Server) takingWrite() error {
	reason, err := s.refusal()
	if err != nil {
		s.metrics.refusedWrites.WithLabelValues(reason).Inc()
	}
	return err
}

// servingSnapshots is serving's condition for a re-seeding snapshot
// (ReplicationService.Snapshot): the same, except that a primary still
// opening its epoch streams them too. Its epoch record meets the contract
// only once enough replicas flush it, and a replica that applied entries
// the new primary's history lacks (the tail of a forced promotion) can
// only come back by a snapshot: refusing it until the primary opens left
// a promotion under k = 1 with that replica as the only other one open
// for ever. A snapshot holds what is durable on the primary, as the
// stream's batches a replica applies do, so it promises nothing the
// stream does not.
func (s *Server) servingSnapshots() error {
	if err := s.serving(); err == nil || s.opened.Load() {
		return err
	}
	switch {
	case s.failedErr() != nil:
		return notServing("primary cannot serve: %v", s.failedErr())
	case !s.lease.valid():
		return notServing("primary has not heard from a log store majority for %v (its lease): it may have been deposed", s.cfg.LeaseTimeout)
	}
	if err := s.gated(); err != nil {
		return notServing("primary does not take reads and writes: %v", err)
	}
	return nil
}

// gated is Config.Gate's word (nil without a gate).
func (s *Server) gated() error {
	if s.cfg.Gate == nil {
		return nil
	}
	return s.cfg.Gate()
}

// HasLease reports whether a majority of the log stores echoed the
// primary's heartbeats within its lease (always, without log stores).
func (s *Server) HasLease() bool { return s.lease.valid() }

// TakingWrites reports whether the primary takes reads and writes now.
func (s *Server) TakingWrites() bool { return s.srv.Serving() && s.serving() == nil }

// notServing is UNAVAILABLE for a call refused before it did anything,
// with an ErrorInfo of reason NOT_SERVING, so that a client knows a
// refused write was not applied and may send it elsewhere (pkg/client).
func notServing(format string, args ...any) error {
	st := status.Newf(codes.Unavailable, format, args...)
	if d, err := st.WithDetails(&errdetails.ErrorInfo{Reason: "NOT_SERVING", Domain: "walship.io"}); err == nil {
		st = d
	}
	return st.Err()
}

func (s *Server) failedErr() error { return s.pipe.err() }

// depose ends the primary once: in-flight and later commits fail with an
// unknown outcome, nothing more is shipped, Run returns err. The vote is
// saved first (best effort), so that a restart rejoins.
func (s *Server) depose(err *DeposedError) {
	s.deposeOnce.Do(func() {
		if err.Vote.Epoch > s.vote.Load().Epoch {
			s.keepLogPrimary(err.Vote)
			if serr := datadir.SaveVote(s.fs, s.cfg.DataDir, err.Vote); serr != nil {
				s.logger.Warn("cannot save the vote of the epoch that deposed this primary", "err", serr)
			}
		}
		s.logger.Warn("deposed: stepping down", "why", err.Why, "epoch", s.epoch, "new_epoch", err.Vote.Epoch, "new_primary", err.Vote.Primary)
		s.pipe.fail(err, nil)
	})
}

// keepLogPrimary keeps the promise in the data directory as the primary
// of its log's epoch before v, a newer epoch's, replaces it
// (failover.State.KeepsLogPrimary; best effort, as the vote's save is):
// the node, a replica from now on, then still names itself as the primary
// of the epoch its log ends in, and the next candidate excludes its
// promise rather than that of a candidate that fenced and gave up.
func (s *Server) keepLogPrimary(v datadir.Vote) {
	cur, err := datadir.LoadVote(s.fs, s.cfg.DataDir)
	if err != nil {
		s.logger.Warn("cannot read the vote to keep the log's primary", "err", err)
		return
	}
	h, err := datadir.LoadHistory(s.fs, s.cfg.DataDir)
	if err != nil {
		s.logger.Warn("cannot read the epoch history to keep the log's primary", "err", err)
		return
	}
	lp, err := datadir.LoadLogPrimary(s.fs, s.cfg.DataDir)
	if err != nil {
		s.logger.Warn("cannot read the log's primary", "err", err)
		return
	}
	st := failover.State{Vote: cur, LogEpoch: h.Current().Epoch, LogPrimary: lp}
	if kept, ok := st.KeepsLogPrimary(v); ok {
		if err := datadir.SaveLogPrimary(s.fs, s.cfg.DataDir, kept); err != nil {
			s.logger.Warn("cannot keep the log's primary", "err", err)
		}
	}
}

// Advertise is the address other nodes and clients reach this primary at:
// Config.Advertise, else the address it listens on unless that names no
// host ("" then: unknown, and nodes keep the address they were given).
func (s *Server) Advertise() string {
	if s.cfg.Advertise != "" {
		return s.cfg.Advertise
	}
	addr := s.cfg.Listen
	if s.srv != nil {
		addr = s.srv.Addr()
	}
	host, _, err := net.SplitHostPort(addr)
	if ip := net.ParseIP(host); err != nil || host == "" || (ip != nil && ip.IsUnspecified()) {
		return ""
	}
	return addr
}

// epochServer is the primary's EpochService: a candidate of a newer epoch
// fences this primary too, and it steps down at once.
type epochServer struct {
	walshipv1.UnimplementedEpochServiceServer
	s *Server
}

func (h *epochServer) Fence(ctx context.Context, req *walshipv1.FenceRequest) (*walshipv1.FenceResponse, error) {
	s := h.s
	switch {
	case req.GetEpoch() == 0:
		return nil, status.Error(codes.InvalidArgument, "epoch: must be at least 1")
	case datadir.CheckEpoch(req.GetEpoch(), s.epoch, datadir.MaxEpochJump) != nil:
		return nil, status.Errorf(codes.InvalidArgument, "epoch: %v", datadir.CheckEpoch(req.GetEpoch(), s.epoch, datadir.MaxEpochJump))
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
	// Before anything else: a candidate of another cluster must not
	// depose this primary.
	candidate := "the candidate " + req.GetCandidateId()
	if err := s.guard.Check(req.GetClusterId(), candidate); err != nil {
		return nil, err
	}
	resp := &walshipv1.FenceResponse{Id: s.cfg.ID, Primary: true, LastEpoch: s.epoch, History: s.epochs.Proto(), ClusterId: s.cluster.ID(),
		LogPrimaryId: s.cfg.ID, LogPrimaryAddr: s.Advertise()}
	if req.GetEpoch() <= s.epoch {
		v := s.vote.Load()
		resp.Epoch, resp.PrimaryId, resp.PrimaryAddr, resp.LastLsn = v.Epoch, v.Primary, v.Addr, s.wal.DurableLSN()
		return resp, nil
	}
	// Nor one that states no cluster id (a node of another cluster whose
	// directory has none): every candidate of this one states it.
	if err := s.guard.Require(req.GetClusterId(), candidate); err != nil {
		return nil, err
	}
	v := datadir.Vote{Epoch: req.GetEpoch(), Primary: req.GetCandidateId(), Addr: req.GetCandidateAddr()}
	s.depose(&DeposedError{Vote: v, Why: fmt.Sprintf("fenced by candidate %s", v.Primary)})
	// Nothing is written after the deposition; what was written is synced
	// so that the candidate can take it.
	if err := s.wal.Sync(); err != nil && !errors.Is(err, context.Canceled) {
		s.logger.Warn("wal sync after stepping down", "err", err)
	}
	s.metrics.fences.Inc()
	resp.Granted, resp.Epoch, resp.PrimaryId, resp.PrimaryAddr, resp.LastLsn = true, v.Epoch, v.Primary, v.Addr, s.wal.DurableLSN()
	resp.SincePrimaryContact = durationpb.New(0)
	return resp, nil
}

// lease is how long the primary may answer without hearing again from a
// majority of the log stores: until the send time of the newest heartbeat
// a majority has echoed, plus LeaseTimeout. A candidate fences a majority
// before it promotes itself and then waits out that long (less the time
// since its answerers last heard from this primary), so a deposed primary
// stops answering — reads and writes, sync or async — before the new one
// opens, whatever the network does; it relies only on both machines'
// clocks running at about the same rate (within 10 %), never on their
// agreeing on the time. Without log stores there is no lease to lose.
//
// The majority is of the log stores of the contract in force, of each
// half while a membership change is joint (setHalves): a candidate that
// judges by either half, or by both, fences a majority of a half, which
// meets every majority of it that renews this lease. A learner's echoes
// count for nothing while it is one, but are kept: an echo says the log
// store had promised no newer epoch when it echoed, whatever its part, so
// a joint record that makes it count does not leave the lease short
// until its next echo.
type lease struct {
	timeout time.Duration

	mu sync.Mutex
	// halves are the log store sets a majority of each of which must echo
	// (none: no log stores, always valid).
	halves [][]string
	echo   map[string]time.Time // per log store: send time of its newest echoed heartbeat
	until  time.Time
	ch     chan struct{} // closed when until moves
}

func newLease(timeout time.Duration, halves [][]string) *lease {
	l := &lease{timeout: timeout, echo: map[string]time.Time{}, ch: make(chan struct{})}
	l.setHalves(halves)
	return l
}

// setHalves makes halves the log store sets the lease needs a majority
// of, and works the lease out again: it may end sooner under the new sets
// (a joint configuration adds one), never because of the change alone
// later than its echoes allow.
func (l *lease) setHalves(halves [][]string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.halves = nil
	for _, h := range halves {
		if len(h) > 0 {
			l.halves = append(l.halves, slices.Clone(h))
		}
	}
	l.updateLocked(true)
}

// heard reports whether addr echoed a heartbeat sent within half the
// lease: a log store about to count for it (a learner) is echoing.
func (l *lease) heard(addr string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	t, ok := l.echo[addr]
	return ok && time.Since(t) < l.timeout/2
}

// forget drops the echoes of a log store the primary no longer ships to.
func (l *lease) forget(addr string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	delete(l.echo, addr)
}

// hasStores reports whether the primary has log stores, and so a lease.
func (l *lease) hasStores() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.halves) > 0
}

// renew records that addr echoed a heartbeat sent at sent.
func (l *lease) renew(addr string, sent time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !sent.After(l.echo[addr]) {
		return
	}
	l.echo[addr] = sent
	l.updateLocked(false)
}

// updateLocked works until out from the echoes: the send time of the
// newest heartbeat a majority of every half has echoed, plus the timeout.
// Under one set of halves it only moves forward; reset lets a change of
// halves move it back.
func (l *lease) updateLocked(reset bool) {
	var until time.Time
	for i, h := range l.halves {
		times := make([]time.Time, 0, len(h))
		for _, addr := range h {
			if t, ok := l.echo[addr]; ok {
				times = append(times, t)
			}
		}
		need := failover.Majority(len(h))
		if len(times) < need {
			until = time.Time{}
			break
		}
		sort.Slice(times, func(i, j int) bool { return times[i].After(times[j]) })
		if u := times[need-1].Add(l.timeout); i == 0 || u.Before(until) {
			until = u
		}
	}
	if reset || until.After(l.until) {
		moved := until.After(l.until)
		l.until = until
		if moved {
			close(l.ch)
			l.ch = make(chan struct{})
		}
	}
}

// valid reports whether the primary may still answer: a log store
// majority echoed a heartbeat sent less than the lease ago
// (docs/ARCHITECTURE.md, Failover invariant 7; the candidate's side is
// node's leaseWait).
func (l *lease) valid() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.halves) == 0 || time.Now().Before(l.until)
}

// remaining is how long the lease still holds (0 if it does not).
func (l *lease) remaining() time.Duration {
	l.mu.Lock()
	defer l.mu.Unlock()
	return max(0, time.Until(l.until))
}

// wait returns once the lease is valid, or ctx's error.
func (l *lease) wait(ctx context.Context) error {
	for {
		if l.valid() {
			return nil
		}
		l.mu.Lock()
		ch := l.ch
		l.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// Switchover hands the primary's role to target without losing anything:
// it stops taking reads and writes, waits until every commit in flight is
// resolved and the target has flushed the whole log, and asks the target
// to promote itself. The target fences this primary among the others (it
// steps down and rejoins as the target's replica) and need not wait out
// its lease. Bounded by timeout; on failure the primary serves again.
func (s *Server) Switchover(ctx context.Context, target string, timeout time.Duration) (*walshipv1.SwitchoverResponse, error) {
	// A member of the contract in force (a membership change moves
	// them), of every half while one is in progress (failover Leads).
	var addr string
	c := s.contract()
	for _, m := range c.GetMembers() {
		if m.GetId() == target && target != s.cfg.ID && failover.ConfigOf(c).Leads(target) {
			addr = m.GetAddr()
		}
	}
	if addr == "" {
		return nil, status.Errorf(codes.InvalidArgument, "target: %q is not another member of the cluster (--peers): %s", target, s.otherMembers())
	}
	if err := s.serving(); err != nil {
		return nil, err
	}
	if !s.pipe.handover.CompareAndSwap(false, true) {
		return nil, status.Error(codes.Aborted, "a switchover is already under way")
	}
	start := time.Now()
	ok := false
	defer func() {
		if !ok {
			s.pipe.handover.Store(false)
		}
	}()
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	s.logger.Info("switching over", "target", target)
	// Every commit already sequenced resolves (they are answered as usual);
	// sequence checks handover under seqMu, so none is sequenced after last.
	last := s.pipe.lastSequenced()
	if _, err := s.pipe.visible.Wait(ctx, last); err != nil {
		return nil, status.Errorf(codes.DeadlineExceeded, "switchover to %s: commits up to LSN %d did not resolve within %v", target, last, timeout)
	}
	// The target has flushed the whole log.
	if err := s.peers.waitReplica(ctx, target, last); err != nil {
		return nil, status.Errorf(codes.DeadlineExceeded, "switchover to %s: it did not flush LSN %d within %v: %v", target, last, timeout, err)
	}
	// The target restarts its server as it changes role: reconnect fast.
	conn, err := s.dialer().Dial(addr, s.dialer().PeerClass(tlsid.ClassNode), grpc.WithConnectParams(grpc.ConnectParams{
		Backoff: grpcbackoff.Config{BaseDelay: 5 * time.Millisecond, Multiplier: 1.6, MaxDelay: 100 * time.Millisecond}, MinConnectTimeout: time.Second}))
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	resp, err := walshipv1.NewAdminServiceClient(conn).Promote(ctx, &walshipv1.PromoteRequest{})
	if err != nil {
		return nil, status.Errorf(status.Code(err), "switchover to %s: its promotion failed: %v", target, status.Convert(err).Message())
	}
	ok = true
	// The target fenced this primary; wait until it takes writes, so that
	// the pause reported is the pause clients see. This call holds the
	// stop of the primary the fence deposed (a graceful stop waits for
	// it), and the node's next role may be what the target waits for:
	// once deposed, wait at most deposedWait more.
	admin := walshipv1.NewAdminServiceClient(conn)
	go func() {
		select {
		case <-s.pipe.alive.Done():
			t := time.NewTimer(deposedWait)
			defer t.Stop()
			select {
			case <-t.C:
				cancel()
			case <-ctx.Done():
			}
		case <-ctx.Done():
		}
	}()
	taking := false
	for ctx.Err() == nil {
		st, err := admin.Status(ctx, &walshipv1.StatusRequest{}, grpc.WaitForReady(true))
		if err == nil && st.GetRole() == walshipv1.Role_ROLE_PRIMARY && st.GetTakingWrites() {
			taking = true
			break
		}
		t := time.NewTimer(5 * time.Millisecond)
		select {
		case <-t.C:
		case <-ctx.Done():
		}
	}
	paused := time.Since(start)
	s.logger.Info("switched over", "target", target, "epoch", resp.GetEpoch(), "lsn", last, "paused", paused, "target_taking_writes", taking)
	return &walshipv1.SwitchoverResponse{Epoch: resp.GetEpoch(), Lsn: last, Paused: durationpb.New(paused), TargetTakingWrites: taking}, nil
}

// deposedWait bounds how long a switchover's answer waits for the target
// to take writes once the target's fence has deposed this primary.
const deposedWait = time.Second

// otherMembers says which node ids a switchover may target.
func (s *Server) otherMembers() string {
	var ids []string
	c := s.contract()
	for _, m := range c.GetMembers() {
		if m.GetId() != s.cfg.ID && failover.ConfigOf(c).Leads(m.GetId()) {
			ids = append(ids, m.GetId())
		}
	}
	if len(ids) == 0 {
		return "this primary has no other member (start the data nodes with --peers)"
	}
	return "want one of " + strings.Join(ids, ", ")
}

// Epoch is this run's epoch.
func (s *Server) Epoch() uint64 { return s.epoch }

// logServer serves the primary's own log (durable entries), so that a
// candidate whose most advanced answer is this primary — one that just
// stepped down — can copy its tail.
type logServer struct {
	walshipv1.UnimplementedLogStoreServiceServer
	s *Server
}

func (l *logServer) Read(req *walshipv1.ReadRequest, stream walshipv1.LogStoreService_ReadServer) error {
	if err := rpcerr.CheckClusterID("cluster_id", req.GetClusterId()); err != nil {
		return err
	}
	if err := l.s.guard.Check(req.GetClusterId(), "the request"); err != nil {
		return err
	}
	return walserve.Read(l.s.wal, "primary "+l.s.cfg.ID, req, stream)
}
