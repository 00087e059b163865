package primary

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	walshipv1 "github.com/walship/walship/gen/walship/v1"
	"github.com/walship/walship/internal/datadir"
	"github.com/walship/walship/internal/failover"
	"github.com/walship/walship/internal/rpcerr"
	"github.com/walship/walship/internal/tlsid"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
)

// Membership change at run time (issue 38; docs/ARCHITECTURE.md,
// Membership change), on the primary:
//
//	C_old ─learner record→ C_old + learner ─joint record (next = C_new)→ C_old,new ─final record→ C_new
//
// Each record is a write of the epoch record key in the current epoch
// (its stage says which step), put in force before it is sequenced
// (useContract: acks follow the newest record) and acknowledged under it
// (awaitContract) before the next is written. A removal has no learner
// stage. One change at a time: one goroutine (runChanges) runs them, and
// a request finding one in progress is refused.
//
// A new primary whose log ends in a joint record writes its epoch record
// joint too, waits for it under the joint rule like any epoch record, and
// then finishes the change — or rolls it back, never to C_old in one
// record (TestSimRollbackInOneRecord) — see resumeChange for which. A
// primary whose step failed while it goes on serving does the same by
// itself, with backoff (retryChange).

const (
	defaultMaxLagRecords  = 1000
	defaultCatchUpTimeout = 5 * time.Minute
	maxCatchUpTimeout     = time.Hour
	// defaultResumeGrace is how long a new primary gives the members a
	// joint record adds to connect before it rolls the change back
	// (Config.ChangeResumeGrace).
	defaultResumeGrace = 10 * time.Second
	// defaultRetryBackoff and maxRetryBackoff bound the wait before a
	// primary resumes a change a failed step left unfinished
	// (Config.ChangeRetryBackoff).
	defaultRetryBackoff = time.Second
	maxRetryBackoff     = 30 * time.Second
)

// Outcomes of a change: the outcome label of
// walship_membership_changes_total.
const (
	outcomeDone       = "done"
	outcomeAbandoned  = "abandoned"
	outcomeRolledBack = "rolled_back"
	outcomeFailed     = "failed"
)

var changeOutcomes = []string{outcomeDone, outcomeAbandoned, outcomeRolledBack, outcomeFailed}

// changeRun is one membership change: what it does, and how it ends.
type changeRun struct {
	desc    string
	add     *walshipv1.Member // nil for a removal
	remove  string
	maxLag  uint64
	catchUp time.Duration
	// addLogStore and removeLogStore are the log stores the change adds
	// and removes (both: a replacement).
	addLogStore, removeLogStore string
	// resume is a joint record a new primary found: finish or roll back.
	resume bool
	// retry resumes, with backoff, what a failed step left in force.
	retry bool
	done  chan struct{} // closed when it is over; then outcome and err are set
	// outcome and err are written before done is closed.
	outcome string
	err     error
}

// changes holds the change in progress.
type changes struct {
	mu  sync.Mutex
	cur *changeRun // nil: none in progress
	// note is where cur stands, when it waits to retry ("" otherwise).
	note string
	ch   chan *changeRun
}

// begin takes the slot for r, or says which change holds it.
func (c *changes) begin(r *changeRun) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.cur != nil {
		return status.Errorf(codes.FailedPrecondition, "a membership change is in progress: %s; one change at a time (walship ctl members list shows it)", c.cur.desc)
	}
	c.cur = r
	return nil
}

// end frees r's slot, or hands it to then (nil: frees it), so that no
// other change takes it in between.
func (c *changes) end(r, then *changeRun) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.cur == r {
		c.cur, c.note = then, ""
	}
}

// setNote says where r, holding the slot, stands.
func (c *changes) setNote(r *changeRun, note string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.cur == r {
		c.note = note
	}
}

// inProgress describes the change in progress ("" if none).
func (c *changes) inProgress() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	switch {
	case c.cur == nil:
		return ""
	case c.note != "":
		return c.cur.desc + ": " + c.note
	}
	return c.cur.desc
}

// runChanges runs the changes handed to it one at a time until ctx ends,
// each followed by the retry of what it left unfinished, if it did.
func (s *Server) runChanges(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case r := <-s.changes.ch:
			for r != nil {
				r = s.runOne(ctx, r)
			}
		}
	}
}

// runOne runs r, which holds the slot, and answers its caller. When r
// failed and left a learner or joint contract in force while the primary
// goes on, or a record of it sequenced but unacknowledged, it returns the
// change's retry, which it hands the slot to first (else nil).
func (s *Server) runOne(ctx context.Context, r *changeRun) (then *changeRun) {
	s.metrics.changeInProgress.Set(1)
	outcome, err := s.runChange(ctx, r)
	if err != nil {
		outcome = outcomeFailed
		s.logger.Error("membership change failed", "change", r.desc, "err", err)
	} else {
		s.logger.Info("membership change over", "change", r.desc, "outcome", outcome)
	}
	s.metrics.changes.WithLabelValues(outcome).Inc()
	var inForce *recordInForceError
	if err != nil && ctx.Err() == nil && s.pipe.alive.Err() == nil && (unfinished(s.contract()) || errors.As(err, &inForce)) {
		// A change's last record (final, rolled_back, learner_dropped)
		// sequenced and then unanswered leaves no change in progress, but
		// the change is over only once it is acknowledged: the retry
		// waits for that, and says how it ended.
		desc := strings.TrimPrefix(r.desc, "finish the failed change: ")
		then = &changeRun{retry: true, desc: "finish the failed change: " + desc, done: make(chan struct{})}
		how := "finishes or rolls it back"
		if !unfinished(s.contract()) {
			how = "it is over once that record is acknowledged"
		}
		err = fmt.Errorf("%w; the primary resumes it by itself (%s; walship ctl members list shows it)", err, how)
	} else {
		s.metrics.changeInProgress.Set(0)
	}
	r.outcome, r.err = outcome, err
	s.changes.end(r, then)
	close(r.done)
	return then
}

// unfinished reports whether c is a change's learner or joint contract.
func unfinished(c *walshipv1.Contract) bool {
	return c.GetNext() != nil || len(c.GetLearners()) > 0 || len(c.GetLogstoreLearners()) > 0
}

// submit hands r, which holds the slot, to runChanges.
func (s *Server) submit(ctx context.Context, r *changeRun) error {
	select {
	case s.changes.ch <- r:
		return nil
	case <-ctx.Done():
	case <-s.pipe.alive.Done():
	}
	s.changes.end(r, nil)
	return status.Errorf(codes.Unavailable, "the membership change %s did not start: the primary is stopping or the call ended", r.desc)
}

// runChange runs r to its end and returns its outcome.
func (s *Server) runChange(ctx context.Context, r *changeRun) (string, error) {
	cur := s.contract()
	if r.resume {
		return s.resumeChange(ctx, cur)
	}
	if r.retry {
		return s.retryChange(ctx, r)
	}
	if err := stillApplies(r, cur); err != nil {
		return "", err
	}
	old := stripped(cur)
	var next *walshipv1.Contract
	if r.addLogStore != "" || r.removeLogStore != "" {
		var done bool
		var err error
		if next, done, err = s.logStoreChange(ctx, r, old); err != nil || done {
			return outcomeAbandoned, err
		}
	} else if r.add != nil {
		// The learner stage: shipped to, counting for nothing.
		learning := proto.Clone(old).(*walshipv1.Contract)
		learning.Learners = []*walshipv1.Member{proto.Clone(r.add).(*walshipv1.Member)}
		if err := s.changeStep(ctx, learning, walshipv1.MembershipStage_MEMBERSHIP_STAGE_LEARNER); err != nil {
			return "", err
		}
		if err := s.waitCaughtUp(ctx, r); err != nil {
			s.logger.Warn("the learner did not catch up in time: dropping it", "change", r.desc, "err", err)
			if err := s.changeStep(ctx, old, walshipv1.MembershipStage_MEMBERSHIP_STAGE_LEARNER_DROPPED); err != nil {
				return "", err
			}
			return outcomeAbandoned, nil
		}
		next = proto.Clone(old).(*walshipv1.Contract)
		next.Members = append(next.Members, proto.Clone(r.add).(*walshipv1.Member))
	} else {
		next = proto.Clone(old).(*walshipv1.Contract)
		next.Members = slices.DeleteFunc(next.Members, func(m *walshipv1.Member) bool { return m.GetId() == r.remove })
	}
	next.MembersChanged = true
	if err := failover.ValidChange(failover.ConfigOf(old).Old, failover.ConfigOf(next).Old, s.cfg.ID); err != nil {
		return "", err
	}
	if err := s.changeStep(ctx, joint(old, next), walshipv1.MembershipStage_MEMBERSHIP_STAGE_JOINT); err != nil {
		return "", err
	}
	if err := s.changeStep(ctx, next, walshipv1.MembershipStage_MEMBERSHIP_STAGE_FINAL); err != nil {
		return "", err
	}
	return outcomeDone, nil
}

// logStoreChange runs the learner stage of a log store change r from the
// contract old (an added log store is shipped to, counting for nothing,
// until within r.maxLag of the primary) and returns the contract it goes
// to; done if the learner did not catch up and the change is abandoned.
func (s *Server) logStoreChange(ctx context.Context, r *changeRun, old *walshipv1.Contract) (next *walshipv1.Contract, done bool, err error) {
	if r.addLogStore != "" {
		learning := proto.Clone(old).(*walshipv1.Contract)
		learning.LogstoreLearners = []string{r.addLogStore}
		if err := s.changeStep(ctx, learning, walshipv1.MembershipStage_MEMBERSHIP_STAGE_LEARNER); err != nil {
			return nil, false, err
		}
		if err := s.waitLogStoreCaughtUp(ctx, r); err != nil {
			s.logger.Warn("the log store learner did not catch up in time: dropping it", "change", r.desc, "err", err)
			if err := s.changeStep(ctx, old, walshipv1.MembershipStage_MEMBERSHIP_STAGE_LEARNER_DROPPED); err != nil {
				return nil, false, err
			}
			return nil, true, nil
		}
	}
	next = proto.Clone(old).(*walshipv1.Contract)
	next.Logstores = replaceLogStore(next.GetLogstores(), r.removeLogStore, r.addLogStore)
	return next, false, nil
}

// stillApplies refuses r when the contract in force cur no longer
// allows it: checkChange validated r before it took the one change slot,
// and another change (a --join retry adding the same node, say) may have
// ended in between. Checked before any record is written.
func stillApplies(r *changeRun, cur *walshipv1.Contract) error {
	member := func(id string) bool {
		return slices.ContainsFunc(cur.GetMembers(), func(m *walshipv1.Member) bool { return m.GetId() == id })
	}
	switch {
	case r.add != nil && member(r.add.GetId()):
		return status.Errorf(codes.FailedPrecondition, "%s: %s is a member already (a change that ended meanwhile added it)", r.desc, r.add.GetId())
	case r.remove != "" && !member(r.remove):
		return status.Errorf(codes.FailedPrecondition, "%s: %s is no member any more (a change that ended meanwhile removed it)", r.desc, r.remove)
	case r.addLogStore != "" && slices.Contains(cur.GetLogstores(), r.addLogStore):
		return status.Errorf(codes.FailedPrecondition, "%s: %s is a log store of the contract already", r.desc, r.addLogStore)
	case r.removeLogStore != "" && !slices.Contains(cur.GetLogstores(), r.removeLogStore):
		return status.Errorf(codes.FailedPrecondition, "%s: %s is no log store of the contract any more", r.desc, r.removeLogStore)
	}
	return nil
}

// replaceLogStore is addrs with remove taken out and add put in (in its
// place, or last), each when set.
func replaceLogStore(addrs []string, remove, add string) []string {
	out := slices.Clone(addrs)
	if i := slices.Index(out, remove); remove != "" && i >= 0 {
		if add != "" {
			out[i] = add
			return out
		}
		return slices.Delete(out, i, i+1)
	}
	if add != "" {
		out = append(out, add)
	}
	return out
}

// waitLogStoreCaughtUp waits until r's log store learner has made the
// primary's log durable to within r.maxLag LSNs of its end, on a stream
// that is up and echoing the lease, for at most r.catchUp. A learner that refills from its
// peers first (services/logstore) refuses the primary's stream until it
// is done, and counts as not connected meanwhile.
func (s *Server) waitLogStoreCaughtUp(ctx context.Context, r *changeRun) error {
	ctx, cancel := context.WithTimeout(ctx, r.catchUp)
	defer cancel()
	addr := r.addLogStore
	for {
		moved, changed := s.peers.movedCh(), s.wal.Changed()
		s.peers.mu.Lock()
		var durable uint64
		l := s.peers.logstores[addr]
		connected := l != nil && l.connected
		if l != nil {
			durable = l.durable
		}
		s.peers.mu.Unlock()
		last := s.wal.LastLSN()
		// Echoing the lease too, so that the joint record, which makes it
		// count for the lease, does not leave the lease short.
		if connected && durable+r.maxLag >= last && s.lease.heard(addr) {
			return nil
		}
		select {
		case <-moved: // every ack, echoes included, moves it
		case <-changed:
		case <-ctx.Done():
			if !connected {
				return fmt.Errorf("log store learner %s has no stream up after %v (down, refilling from its peers, or refusing this primary: its log and the primary's say why)", addr, r.catchUp)
			}
			return fmt.Errorf("log store learner %s has made LSN %d of %d durable after %v, more than %d behind", addr, durable, last, r.catchUp, r.maxLag)
		}
	}
}

// retryChange takes up, as a new primary would, the change whose failed
// step left the learner or joint contract in force while this primary
// goes on serving (the record sequenced, then the lease or the gate lost
// for a moment, or a switchover that timed out): otherwise that contract
// stays, and every later change is refused, until the primary restarts
// or hands over. It waits Config.ChangeRetryBackoff, doubled after every
// failed attempt up to maxRetryBackoff, and tries while the primary takes
// writes (its records would be refused otherwise); ListMembers shows
// where it stands. It returns when an attempt has ended the change, or
// ctx ends, or the primary stops.
func (s *Server) retryChange(ctx context.Context, r *changeRun) (string, error) {
	wait := s.cfg.ChangeRetryBackoff
	var last error
	for attempt := 1; ; attempt++ {
		note := fmt.Sprintf("attempt %d in %v", attempt, wait)
		if last != nil {
			note += fmt.Sprintf(" (attempt %d: %v)", attempt-1, last)
		}
		s.changes.setNote(r, note)
		t := time.NewTimer(wait)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return "", ctx.Err()
		case <-s.pipe.alive.Done():
			t.Stop()
			return "", fmt.Errorf("the primary stopped before it finished the change: its next primary does (last attempt: %v)", last)
		}
		if last = s.serving(); last == nil {
			s.changes.setNote(r, fmt.Sprintf("attempt %d", attempt))
			outcome, err := s.resumeStep(ctx)
			if err == nil {
				return outcome, nil
			}
			last = err
		}
		s.logger.Warn("resuming the unfinished membership change failed: retrying", "change", r.desc, "attempt", attempt, "err", last)
		wait = min(2*wait, maxRetryBackoff)
	}
}

// resumeStep takes the change on from the contract in force, which is
// the newest record in the log (writeRecord): it waits until that record
// is acknowledged under its own rule — as a new primary waits for its
// epoch record — then drops a learner (a new primary abandons a learner
// stage) or finishes or rolls back a joint contract (resumeChange). A
// plain contract is a change's last record, written: the change is over.
func (s *Server) resumeStep(ctx context.Context) (string, error) {
	cur := s.contract()
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stop := context.AfterFunc(s.pipe.alive, cancel)
	defer stop()
	// Acks are positions: the log's last LSN acknowledged under cur's rule
	// covers cur's record, which is at or before it.
	if err := s.awaitContract(wctx, s.wal.LastLSN(), cur); err != nil {
		return "", fmt.Errorf("the %s record in force: %w", stageName(s.inForce.Load().stage), err)
	}
	switch {
	case cur.GetNext() != nil:
		return s.resumeChange(ctx, cur)
	case len(cur.GetLearners()) > 0 || len(cur.GetLogstoreLearners()) > 0:
		s.logger.Warn("the learner stage of the failed change is abandoned: dropping the learner", "contract", configLine(cur))
		return outcomeAbandoned, s.changeStep(ctx, stripped(cur), walshipv1.MembershipStage_MEMBERSHIP_STAGE_LEARNER_DROPPED)
	}
	switch s.inForce.Load().stage {
	case walshipv1.MembershipStage_MEMBERSHIP_STAGE_ROLLED_BACK:
		return outcomeRolledBack, nil
	case walshipv1.MembershipStage_MEMBERSHIP_STAGE_LEARNER_DROPPED:
		return outcomeAbandoned, nil
	}
	return outcomeDone, nil
}

// resumeChange finishes or rolls back the joint contract cur, once it is
// acknowledged under the joint rule (a new primary's epoch record, or the
// record a failed step left in force: retryChange). The rule: finish when
// every member the change adds is connected to this primary within
// Config.ChangeResumeGrace — it then counts in C_new as it did when the
// joint record was written — else roll back (a joint record from C_new
// back to C_old, then C_old), so that the cluster does not go on with a
// member it cannot reach. A removal adds no member: it is always
// finished. So is a roll-back (cur.next.rollback): its joint record was
// acknowledged under C_old, the half it returns to, and turned forward
// again it would go back to the member that did not connect.
func (s *Server) resumeChange(ctx context.Context, cur *walshipv1.Contract) (string, error) {
	old := stripped(cur)
	old.Next = nil
	next := proto.Clone(old).(*walshipv1.Contract)
	next.Members = cloneMembers(cur.GetNext().GetMembers())
	if ls := cur.GetNext().GetLogstores(); len(ls) > 0 {
		next.Logstores = slices.Clone(ls)
	}
	next.MembersChanged = true
	if cur.GetNext().GetRollback() {
		s.logger.Info("the contract is a roll-back's joint one: finishing the roll-back", "from", configLine(old), "to", configLine(next))
		return outcomeRolledBack, s.changeStep(ctx, next, walshipv1.MembershipStage_MEMBERSHIP_STAGE_ROLLED_BACK)
	}
	var joining, joiningStores []string
	for _, m := range next.GetMembers() {
		if !slices.ContainsFunc(old.GetMembers(), func(o *walshipv1.Member) bool { return o.GetId() == m.GetId() }) {
			joining = append(joining, m.GetId())
		}
	}
	for _, l := range next.GetLogstores() {
		if !slices.Contains(old.GetLogstores(), l) {
			joiningStores = append(joiningStores, l)
		}
	}
	wctx, cancel := context.WithTimeout(ctx, s.cfg.ChangeResumeGrace)
	err := s.peers.waitConnected(wctx, joining)
	if err == nil {
		err = s.peers.waitLogStoresConnected(wctx, joiningStores)
	}
	cancel()
	if err == nil {
		s.logger.Info("the log ends in a joint record: finishing the membership change", "from", configLine(old), "to", configLine(next))
		return outcomeDone, s.changeStep(ctx, next, walshipv1.MembershipStage_MEMBERSHIP_STAGE_FINAL)
	}
	if ctx.Err() != nil {
		return "", ctx.Err()
	}
	s.logger.Warn("the log ends in a joint record and a member it adds is not connected: rolling the membership change back",
		"from", configLine(old), "to", configLine(next), "err", err)
	back := joint(next, old)
	back.Next.Rollback = true
	if err := s.changeStep(ctx, back, walshipv1.MembershipStage_MEMBERSHIP_STAGE_ROLLBACK_JOINT); err != nil {
		return "", err
	}
	return outcomeRolledBack, s.changeStep(ctx, old, walshipv1.MembershipStage_MEMBERSHIP_STAGE_ROLLED_BACK)
}

// stripped is c without a change in progress: no learners, no next.
func stripped(c *walshipv1.Contract) *walshipv1.Contract {
	out := proto.Clone(c).(*walshipv1.Contract)
	out.Learners, out.LogstoreLearners, out.Next = nil, nil, nil
	return out
}

// joint is the contract of a change from old to next: old, with next as
// its next half.
func joint(old, next *walshipv1.Contract) *walshipv1.Contract {
	j := proto.Clone(old).(*walshipv1.Contract)
	j.Learners, j.LogstoreLearners = nil, nil
	j.MembersChanged = true
	j.Next = &walshipv1.Configuration{Members: cloneMembers(next.GetMembers()), Logstores: slices.Clone(next.GetLogstores()), SyncReplicas: next.GetSyncReplicas()}
	return j
}

// changeStep writes the record of contract c at stage and waits until it
// is acknowledged under c (or the primary fails, or ctx ends).
func (s *Server) changeStep(ctx context.Context, c *walshipv1.Contract, stage walshipv1.MembershipStage) error {
	lsn, err := s.writeRecord(ctx, s.epochRecord(c, stage))
	if err != nil {
		return fmt.Errorf("write the %s record: %w", stageName(stage), err)
	}
	s.logger.Info("membership change record written", "stage", stageName(stage), "lsn", lsn, "contract", configLine(c))
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stop := context.AfterFunc(s.pipe.alive, cancel)
	defer stop()
	if err := s.awaitContract(wctx, lsn, c); err != nil {
		return fmt.Errorf("the %s record at LSN %d: %w", stageName(stage), lsn, err)
	}
	return nil
}

// waitCaughtUp waits until r's learner has reached the primary's log to
// within r.maxLag LSNs of its end, at the contract's level (the level
// its acks will count at), for at most r.catchUp. It counts as a wait at
// that level, so that the streams ask for acks at it.
func (s *Server) waitCaughtUp(ctx context.Context, r *changeRun) error {
	ctx, cancel := context.WithTimeout(ctx, r.catchUp)
	defer cancel()
	level := s.contract().GetSyncLevel()
	if level == walshipv1.SyncLevel_SYNC_LEVEL_UNSPECIFIED {
		level = walshipv1.SyncLevel_SYNC_LEVEL_FLUSH
	}
	waiting := &s.peers.waiting[level]
	waiting.Add(1)
	defer waiting.Add(-1)
	s.peers.announceWait()
	id := r.add.GetId()
	for {
		s.peers.mu.Lock()
		rp := s.peers.replicas[id]
		var reached uint64
		connected := rp != nil && rp.connected
		if rp != nil {
			reached = rp.at(level)
		}
		if s.peers.changed == nil {
			s.peers.changed = make(chan struct{})
		}
		ch := s.peers.changed
		s.peers.mu.Unlock()
		last := s.wal.LastLSN()
		if connected && reached+r.maxLag >= last {
			return nil
		}
		select {
		case <-ch:
		case <-s.wal.Changed():
		case <-ctx.Done():
			if !connected {
				return fmt.Errorf("learner %s is not connected after %v", id, r.catchUp)
			}
			err := fmt.Errorf("learner %s has reached LSN %d of %d (%s) after %v, more than %d behind", id, reached, last, levelName(level), r.catchUp, r.maxLag)
			if rate := s.cfg.LearnerBytesPerSecond; rate > 0 {
				err = fmt.Errorf("%w; its stream is paced at --learner-bytes-per-second %d: a learner catches up only while the WAL grows slower (raise it, or 0 for no limit)", err, rate)
			}
			return err
		}
	}
}

// waitConnected waits until every replica of ids has a stream up.
func (p *peers) waitConnected(ctx context.Context, ids []string) error {
	for {
		p.mu.Lock()
		var missing []string
		for _, id := range ids {
			if r := p.replicas[id]; r == nil || !r.connected {
				missing = append(missing, id)
			}
		}
		if p.changed == nil {
			p.changed = make(chan struct{})
		}
		ch := p.changed
		p.mu.Unlock()
		if len(missing) == 0 {
			return nil
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return fmt.Errorf("not connected: %s", strings.Join(missing, ", "))
		}
	}
}

// waitLogStoresConnected waits until every log store of addrs has a
// stream up.
func (p *peers) waitLogStoresConnected(ctx context.Context, addrs []string) error {
	for {
		moved := p.movedCh()
		p.mu.Lock()
		var missing []string
		for _, a := range addrs {
			if l := p.logstores[a]; l == nil || !l.connected {
				missing = append(missing, a)
			}
		}
		p.mu.Unlock()
		if len(missing) == 0 {
			return nil
		}
		select {
		case <-moved:
		case <-ctx.Done():
			return fmt.Errorf("log stores not connected: %s", strings.Join(missing, ", "))
		}
	}
}

// ChangeMembers validates a change against the contract in force, takes
// the one slot for changes and hands it to runChanges; it returns when
// the change is over or ctx ends first (the change goes on).
func (a *adminServer) ChangeMembers(ctx context.Context, req *walshipv1.ChangeMembersRequest) (*walshipv1.ChangeMembersResponse, error) {
	s := a.s
	if err := s.serving(); err != nil {
		return nil, rpcerr.Status(err)
	}
	r, err := s.checkChange(ctx, req)
	if err != nil {
		return nil, err
	}
	if err := s.changes.begin(r); err != nil {
		return nil, err
	}
	s.logger.Info("membership change requested", "change", r.desc)
	if err := s.submit(ctx, r); err != nil {
		return nil, err
	}
	// Answer a little before the caller's deadline, so that it hears
	// where the change is rather than DEADLINE_EXCEEDED.
	wait := ctx
	if d, ok := ctx.Deadline(); ok {
		var cancel context.CancelFunc
		wait, cancel = context.WithDeadline(ctx, d.Add(-min(time.Second, time.Until(d)/10)))
		defer cancel()
	}
	select {
	case <-r.done:
		if r.err != nil {
			return nil, status.Errorf(codes.Aborted, "membership change %s: %v (walship ctl members list shows where it stopped)", r.desc, r.err)
		}
		return s.changeResponse(true, r.outcome), nil
	case <-wait.Done():
		return s.changeResponse(false, ""), nil
	}
}

func (s *Server) changeResponse(done bool, outcome string) *walshipv1.ChangeMembersResponse {
	resp := &walshipv1.ChangeMembersResponse{Done: done, Outcome: outcome, Membership: s.membership(time.Now())}
	if f := s.inForce.Load(); f != nil {
		resp.Stage = f.stage
	}
	return resp
}

// checkChange refuses a wrong change, changing nothing: an empty or
// malformed request, an id already a member or learner (add) or not a
// member (remove), removing the primary, what failover.ValidChange
// refuses, and a node to add that does not answer or is of another
// cluster. It returns the change to run.
func (s *Server) checkChange(ctx context.Context, req *walshipv1.ChangeMembersRequest) (*changeRun, error) {
	cur := s.contract()
	if len(cur.GetMembers()) == 0 {
		return nil, status.Error(codes.FailedPrecondition, "this primary has no members (--peers): there is no membership to change")
	}
	if cur.GetNext() != nil || len(cur.GetLearners()) > 0 || len(cur.GetLogstoreLearners()) > 0 {
		return nil, status.Errorf(codes.FailedPrecondition, "a membership change is in progress (%s); one change at a time (walship ctl members list shows it)", configLine(cur))
	}
	r := &changeRun{done: make(chan struct{}), maxLag: req.GetMaxLagRecords(), catchUp: defaultCatchUpTimeout}
	if r.maxLag == 0 {
		r.maxLag = defaultMaxLagRecords
	}
	if t := req.GetCatchUpTimeout(); t != nil {
		if err := t.CheckValid(); err != nil {
			return nil, rpcerr.Invalid("catch_up_timeout", "%v", err)
		}
		if r.catchUp = t.AsDuration(); r.catchUp <= 0 || r.catchUp > maxCatchUpTimeout {
			return nil, rpcerr.Invalid("catch_up_timeout", "%v is not in (0, %v]", r.catchUp, maxCatchUpTimeout)
		}
	}
	ids := make([]string, 0, len(cur.GetMembers()))
	for _, m := range cur.GetMembers() {
		ids = append(ids, m.GetId())
	}
	next := stripped(cur)
	switch ch := req.GetChange().(type) {
	case *walshipv1.ChangeMembersRequest_Add:
		m := ch.Add
		switch {
		case m == nil || m.GetId() == "":
			return nil, rpcerr.Invalid("add.id", "required: the node id of the data node to add")
		case datadir.ValidateNodeID(m.GetId()) != nil:
			return nil, rpcerr.Invalid("add.id", "%v", datadir.ValidateNodeID(m.GetId()))
		case m.GetAddr() == "":
			return nil, rpcerr.Invalid("add.addr", "required: the advertised address of %s", m.GetId())
		case slices.Contains(ids, m.GetId()):
			return nil, rpcerr.Invalid("add.id", "%s is already a member (members: %s)", m.GetId(), strings.Join(ids, ", "))
		}
		next.Members = append(next.Members, &walshipv1.Member{Id: m.GetId(), Addr: m.GetAddr()})
		r.add, r.desc = &walshipv1.Member{Id: m.GetId(), Addr: m.GetAddr()}, fmt.Sprintf("add %s at %s", m.GetId(), m.GetAddr())
	case *walshipv1.ChangeMembersRequest_Remove:
		id := ch.Remove
		switch {
		case id == "":
			return nil, rpcerr.Invalid("remove", "required: the node id of the member to remove")
		case id == s.cfg.ID:
			return nil, status.Errorf(codes.FailedPrecondition, "remove: %s is the primary: hand its role over first (walship ctl switchover), then remove it at the new primary", id)
		case !slices.Contains(ids, id):
			return nil, rpcerr.Invalid("remove", "%s is not a member (members: %s)", id, strings.Join(ids, ", "))
		}
		next.Members = slices.DeleteFunc(next.Members, func(m *walshipv1.Member) bool { return m.GetId() == id })
		r.remove, r.desc = id, "remove "+id
	case *walshipv1.ChangeMembersRequest_AddLogstore:
		if err := checkLogStoreAddr("add_logstore", ch.AddLogstore, cur, false); err != nil {
			return nil, err
		}
		r.addLogStore, r.desc = ch.AddLogstore, "add log store "+ch.AddLogstore
	case *walshipv1.ChangeMembersRequest_RemoveLogstore:
		if err := checkLogStoreAddr("remove_logstore", ch.RemoveLogstore, cur, true); err != nil {
			return nil, err
		}
		r.removeLogStore, r.desc = ch.RemoveLogstore, "remove log store "+ch.RemoveLogstore
	case *walshipv1.ChangeMembersRequest_ReplaceLogstore:
		rp := ch.ReplaceLogstore
		if rp.GetOld() == "" && rp.GetNew() == "" {
			return nil, rpcerr.Invalid("replace_logstore", "required: the log store to replace (old) and the one to put in its place (new)")
		}
		if err := checkLogStoreAddr("replace_logstore.old", rp.GetOld(), cur, true); err != nil {
			return nil, err
		}
		if err := checkLogStoreAddr("replace_logstore.new", rp.GetNew(), cur, false); err != nil {
			return nil, err
		}
		r.removeLogStore, r.addLogStore, r.desc = rp.GetOld(), rp.GetNew(), fmt.Sprintf("replace log store %s with %s", rp.GetOld(), rp.GetNew())
	default:
		return nil, rpcerr.Invalid("change", "required: add, remove, add_logstore, remove_logstore or replace_logstore")
	}
	next.Logstores = replaceLogStore(next.GetLogstores(), r.removeLogStore, r.addLogStore)
	if err := failover.ValidChange(failover.ConfigOf(cur).Old, failover.ConfigOf(next).Old, s.cfg.ID); err != nil {
		return nil, status.Errorf(codes.FailedPrecondition, "%s: %v", r.desc, err)
	}
	if err := s.canFinish(ctx, r, next); err != nil {
		return nil, err
	}
	if r.add != nil {
		if err := s.probeNode(ctx, r.add); err != nil {
			return nil, err
		}
	}
	if r.addLogStore != "" {
		field := "add_logstore"
		if r.removeLogStore != "" {
			field = "replace_logstore.new"
		}
		if err := s.probeLogStore(ctx, field, r.addLogStore); err != nil {
			return nil, err
		}
	}
	return r, nil
}

// canFinish refuses a removal that the new configuration next could not
// acknowledge now: its joint record needs k of next's members other than
// the primary, and a majority of next's log stores to make it durable
// (under log store sync, or when it moves log stores) and to keep the
// lease, as soon as it is in force. Removing a healthy member or log
// store while another is down would otherwise leave the joint record
// unacknowledged for good, stall every sync commit behind it (and, for
// log stores, end the lease), with no second change allowed to undo it.
// An added node or log store passes its learner stage first and counts
// here.
//
// A member or log store counts only if it acknowledges: a stream that is
// up is not enough, for a replica whose disk stalls (or whose apply is
// stuck) keeps its stream while it makes nothing durable (or applies
// nothing), and a log store whose disk stalls keeps its stream and
// echoes the lease (services/logstore answers heartbeats during a
// stalled round). A member must reach the primary's durable end, as of
// the request, at the contract's sync level within removalAckBound; a log
// store must echo the lease within half of it (lease.heard) and make that
// end durable within removalAckBound.
func (s *Server) canFinish(ctx context.Context, r *changeRun, next *walshipv1.Contract) error {
	if k := int(next.GetSyncReplicas()); r.remove != "" && k > 0 {
		var voters []string
		for _, m := range next.GetMembers() {
			if m.GetId() != s.cfg.ID {
				voters = append(voters, m.GetId())
			}
		}
		wctx, cancel := context.WithTimeout(ctx, removalAckBound)
		acking, why := s.membersAcknowledging(wctx, s.wal.DurableLSN(), voters, next.GetSyncLevel(), k)
		cancel()
		if acking < k {
			return status.Errorf(codes.FailedPrecondition, "%s: the members left (%s) have %d acknowledging besides the primary, and sync_replicas %d needs %d of them to acknowledge the change at %s (%s): bring the others back first (walship ctl members list)",
				r.desc, strings.Join(idsOf(next.GetMembers()), ", "), acking, k, k, levelName(next.GetSyncLevel()), strings.Join(why, "; "))
		}
	}
	if r.removeLogStore != "" {
		set := next.GetLogstores()
		need := failover.Majority(len(set))
		wctx, cancel := context.WithTimeout(ctx, removalAckBound)
		acking, why := s.logStoresAcknowledging(wctx, s.wal.DurableLSN(), set, r.addLogStore, need)
		cancel()
		if acking < need {
			return status.Errorf(codes.FailedPrecondition, "%s: the log stores left (%s) have %d acknowledging, and the lease and the change's records need %d of them as soon as the change is joint (%s): bring the others back first (walship ctl members list)",
				r.desc, strings.Join(set, ", "), acking, need, strings.Join(why, "; "))
		}
	}
	return nil
}

// removalAckBound is how long canFinish gives a member or log store to
// reach the primary's durable end: a healthy one does in a round (a
// replica's flush or apply, a log store's batch delay and an fsync), a
// stalled disk or a stuck apply never does.
const removalAckBound = 5 * time.Second

// untilAcknowledging calls count at every position update and every
// tick until it finds need acknowledging or ctx ends, and returns its
// last answer: how many acknowledge and, for each of the others, why not.
func (s *Server) untilAcknowledging(ctx context.Context, tick time.Duration, need int, count func() (int, []string)) (int, []string) {
	t := time.NewTicker(tick)
	defer t.Stop()
	for {
		moved := s.peers.movedCh()
		acking, why := count()
		if acking >= need {
			return acking, nil
		}
		select {
		case <-moved:
		case <-t.C:
		case <-ctx.Done():
			return acking, why
		}
	}
}

// membersAcknowledging waits, until ctx ends, for need of the replicas
// ids to reach lsn at level over a stream that is up, as the commits of
// a contract at level count them. It returns how many do, and for each
// of the others why not.
func (s *Server) membersAcknowledging(ctx context.Context, lsn uint64, ids []string, level walshipv1.SyncLevel, need int) (int, []string) {
	// Streams ask their replica for an ack at level now while a wait at
	// it is counted, rather than at their next heartbeat.
	waiting := &s.peers.waiting[level]
	waiting.Add(1)
	defer waiting.Add(-1)
	s.peers.announceWait()
	// Every ack moves a position; the tick only guards against a missed
	// one.
	return s.untilAcknowledging(ctx, s.cfg.HeartbeatInterval, need, func() (int, []string) {
		s.peers.mu.Lock()
		defer s.peers.mu.Unlock()
		acking := 0
		var why []string
		for _, id := range ids {
			r := s.peers.replicas[id]
			switch {
			case r == nil || !r.connected:
				why = append(why, id+" has no stream up")
			case r.at(level) < lsn:
				why = append(why, fmt.Sprintf("%s has %s LSN %d of the primary's %d (%s, or it is far behind)", id, reachedAt(level), r.at(level), lsn, stalledAt(level)))
			default:
				acking++
			}
		}
		return acking, why
	})
}

// reachedAt says what a replica did to an LSN it reached at level.
func reachedAt(level walshipv1.SyncLevel) string {
	switch level {
	case walshipv1.SyncLevel_SYNC_LEVEL_WRITE:
		return "written"
	case walshipv1.SyncLevel_SYNC_LEVEL_FLUSH:
		return "made durable"
	default:
		return "applied"
	}
}

// stalledAt says what holds back a replica that does not reach the
// primary's end at level.
func stalledAt(level walshipv1.SyncLevel) string {
	if level == walshipv1.SyncLevel_SYNC_LEVEL_APPLY {
		return "its apply is stuck"
	}
	return "its disk stalls"
}

// logStoresAcknowledging waits, until ctx ends, for need of set to
// acknowledge: echo the lease within half of it and make lsn durable
// (added, a log store the change adds after its learner stage, counts
// without). It returns how many do, and for each of the others why not.
func (s *Server) logStoresAcknowledging(ctx context.Context, lsn uint64, set []string, added string, need int) (int, []string) {
	// Streams ask their log store for its round now while a wait on log
	// stores is counted, rather than after its delay.
	s.peers.lsWaiting.Add(1)
	defer s.peers.lsWaiting.Add(-1)
	s.peers.announceWait()
	// Echoes of the lease move no position: look again at this pace too.
	return s.untilAcknowledging(ctx, max(s.cfg.LeaseTimeout/8, 10*time.Millisecond), need, func() (int, []string) {
		acking := 0
		var why []string
		_, pos := s.peers.snapshot()
		for _, a := range set {
			var l *logstorePos
			if i := slices.IndexFunc(pos, func(p logstorePos) bool { return p.addr == a }); i >= 0 {
				l = &pos[i]
			}
			switch {
			case a == added:
				acking++
			case l == nil || !l.connected:
				why = append(why, a+" has no stream up")
			case l.durable < lsn:
				why = append(why, fmt.Sprintf("%s has made durable LSN %d of the primary's %d (its disk stalls, or it is far behind)", a, l.durable, lsn))
			case !s.lease.heard(a):
				why = append(why, a+" does not echo the lease")
			default:
				acking++
			}
		}
		return acking, why
	})
}

// idsOf are the ids of ms.
func idsOf(ms []*walshipv1.Member) []string {
	out := make([]string, 0, len(ms))
	for _, m := range ms {
		out = append(out, m.GetId())
	}
	return out
}

// checkLogStoreAddr checks the log store address addr of the request's
// field against the contract cur: it must be one of cur's log stores
// (member) or not (!member). A primary without log stores has none to
// change, and gets none at run time: a first log store brings the lease
// and the epoch's election, which start with the epoch (--logstore).
func checkLogStoreAddr(field, addr string, cur *walshipv1.Contract, member bool) error {
	ls := cur.GetLogstores()
	switch {
	case len(ls) == 0:
		return status.Errorf(codes.FailedPrecondition, "%s: this primary has no log stores (--logstore): the first ones come with an epoch start, not a membership change", field)
	case addr == "":
		return rpcerr.Invalid(field, "required: the log store's address (host:port)")
	case len(addr) > 256 || strings.ContainsAny(addr, " \t\n,"):
		return rpcerr.Invalid(field, "%q is not a log store address (host:port)", addr)
	case member && !slices.Contains(ls, addr):
		return rpcerr.Invalid(field, "%s is not a log store of the contract (log stores: %s)", addr, orNone(ls))
	case !member && slices.Contains(ls, addr):
		return rpcerr.Invalid(field, "%s is already a log store of the contract (log stores: %s)", addr, orNone(ls))
	}
	return nil
}

// probeLogStore asks the log store at addr to add (the request's field)
// for its Status: it must answer as a log store, not be of another
// cluster, and not have promised an epoch newer than this primary's.
func (s *Server) probeLogStore(ctx context.Context, field, addr string) error {
	conn, err := s.dialer().Dial(addr, s.dialer().PeerClass(tlsid.ClassLogStore))
	if err != nil {
		return status.Errorf(codes.FailedPrecondition, "%s: cannot dial %s: %v", field, addr, err)
	}
	defer conn.Close()
	pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	st, err := walshipv1.NewLogStoreServiceClient(conn).Status(pctx, &walshipv1.LogStoreServiceStatusRequest{})
	switch {
	case status.Code(err) == codes.Unimplemented:
		return status.Errorf(codes.FailedPrecondition, "%s: %s is not a log store (%v)", field, addr, status.Convert(err).Message())
	case err != nil:
		return status.Errorf(codes.FailedPrecondition, "%s: %s does not answer (%v): start the log store first (walship logstore, with --peers naming this cluster's log stores so that it refills their log)", field, addr, status.Convert(err).Message())
	case s.otherClusterLogStore(addr, st) != nil:
		s.metrics.clusterMismatch.Inc()
		return status.Errorf(codes.FailedPrecondition, "%s: %v", field, s.otherClusterLogStore(addr, st))
	case st.GetEpoch() > s.epoch:
		return status.Errorf(codes.FailedPrecondition, "%s: the log store %s has promised epoch %d, newer than this primary's %d", field, addr, st.GetEpoch(), s.epoch)
	}
	return nil
}

// probeNode asks the data node m to add for its Status: it must answer,
// be the node m names, not be a primary, and not be of another cluster.
func (s *Server) probeNode(ctx context.Context, m *walshipv1.Member) error {
	conn, err := s.dialer().Dial(m.GetAddr(), s.dialer().PeerClass(tlsid.ClassNode))
	if err != nil {
		return status.Errorf(codes.FailedPrecondition, "add.addr: cannot dial %s: %v", m.GetAddr(), err)
	}
	defer conn.Close()
	pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	st, err := walshipv1.NewAdminServiceClient(conn).Status(pctx, &walshipv1.StatusRequest{})
	switch {
	case err != nil:
		return status.Errorf(codes.FailedPrecondition, "add.addr: %s does not answer (%v): start the data node as a replica of this cluster first", m.GetAddr(), status.Convert(err).Message())
	case rpcerr.CheckCluster("primary "+s.cfg.ID, s.cluster.ID(), "the node "+m.GetId()+" at "+m.GetAddr(), st.GetClusterId()) != nil:
		s.metrics.clusterMismatch.Inc()
		return rpcerr.CheckCluster("primary "+s.cfg.ID, s.cluster.ID(), "the node "+m.GetId()+" at "+m.GetAddr(), st.GetClusterId())
	case st.GetId() != m.GetId():
		return rpcerr.Invalid("add.id", "the node at %s is %q, not %q", m.GetAddr(), st.GetId(), m.GetId())
	case st.GetRole() != walshipv1.Role_ROLE_REPLICA:
		return status.Errorf(codes.FailedPrecondition, "add.addr: %s at %s is a %s, not a replica", m.GetId(), m.GetAddr(), roleName(st.GetRole()))
	}
	return nil
}

func roleName(r walshipv1.Role) string {
	return strings.ToLower(strings.TrimPrefix(r.String(), "ROLE_"))
}

// configLine is c's members, log stores and k, for logs.
func configLine(c *walshipv1.Contract) string {
	var ids []string
	for _, m := range c.GetMembers() {
		ids = append(ids, m.GetId())
	}
	line := fmt.Sprintf("members %s, log stores %s, sync_replicas %d", strings.Join(ids, ","), orNone(c.GetLogstores()), c.GetSyncReplicas())
	if nx := c.GetNext(); nx != nil {
		ids = ids[:0]
		for _, m := range nx.GetMembers() {
			ids = append(ids, m.GetId())
		}
		line += fmt.Sprintf("; joint, to members %s, log stores %s", strings.Join(ids, ","), orNone(nx.GetLogstores()))
	}
	if len(c.GetLearners()) > 0 {
		ids = ids[:0]
		for _, m := range c.GetLearners() {
			ids = append(ids, m.GetId())
		}
		line += "; learners " + strings.Join(ids, ",")
	}
	if len(c.GetLogstoreLearners()) > 0 {
		line += "; log store learners " + strings.Join(c.GetLogstoreLearners(), ",")
	}
	return line
}

// stageName names a stage for logs and messages.
func stageName(st walshipv1.MembershipStage) string {
	return strings.ToLower(strings.TrimPrefix(st.String(), "MEMBERSHIP_STAGE_"))
}
