package node

import (
	"context"
	"errors"
	"fmt"
	"io"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"time"

	walshipv1 "github.com/walship/walship/gen/walship/v1"
	"github.com/walship/walship/internal/backoff"
	"github.com/walship/walship/internal/datadir"
	"github.com/walship/walship/internal/envelope"
	"github.com/walship/walship/internal/failover"
	"github.com/walship/walship/internal/keyspace"
	"github.com/walship/walship/internal/rpcerr"
	"github.com/walship/walship/internal/serve"
	"github.com/walship/walship/internal/tlsid"
	"github.com/walship/walship/internal/wal"
	"github.com/walship/walship/pkg/codec"
	"github.com/walship/walship/services/primary"
	"github.com/walship/walship/services/replica"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
)

// Promotion is an epoch vote (Neon's safekeeper election; Raft's vote
// with Kafka's leader epochs for the logs):
//
//  1. survey: ask every log store and member where its log ends, without
//     changing anything; a promotion that could not reach its quorum is
//     refused here, before anyone is fenced (a pre-vote), and a dry run
//     ends here with what a promotion would see and risk;
//  2. fence: ask each to promise the new epoch (EpochService.Fence); each
//     that does refuses the old primary from then on;
//  3. quorum: go on only with promises from a majority of the log stores
//     and from enough replicas that every set that could have
//     acknowledged a commit under the contract meets them — N-k+1 of the N
//     sync-eligible members, or none if the contract waits for a log store
//     majority (which every majority meets);
//  4. catch up: copy the tail this node lacks from the most advanced
//     answerer, by (epoch, LSN) — a log store or a replica — after cutting
//     (into an orphan file) any tail of its own that answerer's history
//     does not have;
//  5. wait out the old primary's lease, unless it promised too;
//  6. open: start as primary in the new epoch; it commits its epoch
//     record and takes writes once that meets the contract.
//
// Steps 1-3 run in the Promote call; 4-6 in Run, once the replica role has
// stopped (Promote runs inside it).

// answer is one node's word on its log: from a survey (Status) or a fence.
type answer struct {
	id, addr  string
	logstore  bool
	granted   bool
	err       error
	epoch     uint64 // the epoch it holds (promised)
	holder    string // that epoch's primary
	lastEpoch uint64
	lastLSN   uint64
	history   datadir.History
	primary   bool // it was the primary of its epoch
	// since is how long before it answered it last heard from the primary.
	since time.Duration
	// primaryLast and primaryDurable: what the old primary last reported (replicas).
	primaryLast, primaryDurable uint64
	// contract is the contract of the newest epoch record in the node's
	// log, applied or held (written, waiting for the primary's durable
	// LSN: services/replica heldrecord.go); nil from a log store or a
	// node whose log holds none.
	contract *walshipv1.Contract
	// cluster is the cluster id it stated ("" if none).
	cluster string
	// takingWrites: a member that is the primary and takes writes (survey).
	takingWrites bool
	// logPrimary is the primary of lastEpoch as the node knows it
	// (log_primary_id; "" if it knows none).
	logPrimary string
}

func (a answer) String() string {
	switch {
	case a.err != nil:
		return fmt.Sprintf("%s: %v", a.id, a.err)
	case a.granted:
		return fmt.Sprintf("%s: promised (log ends at LSN %d of epoch %d)", a.id, a.lastLSN, a.lastEpoch)
	default:
		return fmt.Sprintf("%s: holds epoch %d for %s (log ends at LSN %d of epoch %d)", a.id, a.epoch, a.holder, a.lastLSN, a.lastEpoch)
	}
}

// plan is a promotion decided in Promote, carried out by Run.
type plan struct {
	epoch      uint64
	cluster    string // the cluster id the promotion fenced with (or learnt from the promises)
	self       answer
	donor      answer
	leaseUntil time.Time
	timeline   *walshipv1.FailoverTimeline
	// record is the newest epoch record in this node's log when it
	// fenced (applied or held): its catch-up may bring a newer one, or
	// cut it (a held one), leaving the newest at or below the LSN kept
	// (recordUpTo), from the entries after appliedLSN or appliedRecord,
	// the applied state's then.
	record        *walshipv1.EpochRecord
	appliedRecord *walshipv1.EpochRecord
	appliedLSN    uint64
	// prev, answers and forced are what the quorum was judged on: the
	// replaced primary (judgeReplacing may have excluded a member that
	// did not answer instead, and may again under a newer contract), the
	// fence's answers, and whether it was forced without one.
	prev    string
	answers []answer
	forced  bool
}

// verdict is what the answers allow.
type verdict struct {
	quorum        bool
	needed        string
	donor         answer
	atRisk        [2]uint64 // LSN range the old primary may have written that no answer holds
	atRiskDurable uint64
	granted       []string
	refused       []string
}

// contract is the contract a promotion must honour: the newest epoch
// record's in this node's log (applied or held), else — a log that holds
// none — the node's own configuration (--peers and its policy), which a
// promotion checks again once caught up (carryOut).
func (n *Node) contract() *walshipv1.Contract {
	if rep := n.Replica(); rep != nil {
		if rec := rep.EpochRecord(); rec != nil && rec.GetContract() != nil {
			return rec.GetContract()
		}
	}
	lease := n.cfg.Primary.LeaseTimeout
	if lease == 0 {
		lease = primary.DefaultLeaseTimeout
	}
	return primary.ContractOf(n.cfg.Primary.Policy, n.cfg.Members, n.cfg.LogStores, lease)
}

// notLeadingError is a promotion of a node that may not be the primary
// under the newest contract in its log (or the one it will hold once
// caught up): it is not a member of every configuration of it
// (failover.Config.Leads).
type notLeadingError struct {
	id, why string
	// under names the contract and where it is from.
	under string
}

func (e *notLeadingError) Error() string {
	return fmt.Sprintf("cannot promote %s: %s; a node may be the primary only as a member of every configuration of %s", e.id, e.why, e.under)
}

// leads returns a *notLeadingError unless id may be the primary under
// rec, the newest epoch record of its log (failover.Config.Leads): a
// member of its configuration and, while a membership change is in
// progress, of the one it goes to. The promotion quorum counts on it: a
// primary outside a half has only its k acks there, the replaced primary
// may be one of them, and N−k+1 of the others can miss the write
// (docs/ARCHITECTURE.md, Membership change, Leading). No record (a
// cluster without members, whose primary writes none, or a log that has
// not reached one: its catch-up checks again) allows it.
func leads(id string, rec *walshipv1.EpochRecord) error {
	c := rec.GetContract()
	if c == nil {
		return nil
	}
	return leadsUnder(id, c, fmt.Sprintf("the newest contract in its log (epoch %d: %s)", rec.GetEpoch(), describeMembers(c)))
}

// leadsUnder is leads under contract c, described by under.
func leadsUnder(id string, c *walshipv1.Contract, under string) error {
	qc := failover.ConfigOf(c)
	if qc.Leads(id) {
		return nil
	}
	e := &notLeadingError{id: id, under: under}
	switch {
	case slices.Contains(qc.Learners, id):
		e.why = "it is a learner (it counts for nothing and may lack acknowledged commits); it becomes a member once within a bound of the primary (walship ctl members list)"
	case !slices.Contains(qc.Old.Members, id):
		e.why = "it is not a member of the current configuration"
	default:
		e.why = "it is not a member of the configuration the membership change goes to"
	}
	return e
}

// peerlessUnder refuses the promotion of a node started without --peers
// (members) whose log's newest contract record, rec, was set by a
// membership change (members_changed, or a change in progress) or names
// another member (failover.BindsPeerless): the primary it would become
// refuses to start over that log (services/primary elect), so fencing
// first would depose the cluster's primary for no new one. With --peers,
// any list, the log's members win over the flag's once a change set
// them.
func peerlessUnder(id string, members []primary.Member, rec *walshipv1.EpochRecord) error {
	c := rec.GetContract()
	if len(members) > 0 || !failover.BindsPeerless(c, id) {
		return nil
	}
	if !failover.SetByChange(c) {
		return fmt.Errorf("cannot promote %s: it was started without --peers, and the newest contract in its log (epoch %d: %s) names other members, which a primary without --peers does not start under (it would take any replica's ack while a candidate judges by them): start it with --peers",
			id, rec.GetEpoch(), describeMembers(c))
	}
	return fmt.Errorf("cannot promote %s: it was started without --peers, and the newest contract in its log (epoch %d: %s) was set by a membership change, which a primary without --peers does not start under: start it with --peers (its log's members then win over the flag's)",
		id, rec.GetEpoch(), describeMembers(c))
}

// leadsOnceCaughtUp is leads under the contract this node's log will
// hold once caught up to donor, as far as the survey's answers tell: a
// replica whose log reaches the donor's epoch reports a record of the
// donor's log. Entries of one epoch are its primary's alone (I4), so that
// log is a prefix of the donor's, and the candidate's, once caught up,
// holds that record or a newer one. Only the most advanced such replica
// is read, and only if its log is ahead of self's (this node's): a
// replica that lags reports an older record of the same log, which the
// newer one supersedes (one of a run-time add, before the member was
// added), and a log self's reaches holds nothing self has not judged
// already (leads). A candidate that is its own donor copies nothing. A
// member removed while it was down is then refused before it fences
// anyone: a promotion that fenced and gave up leaves the promises naming
// it, and the next candidate judges it the replaced primary. It cannot
// see a newer record that names this node again (removed, then added
// back), or one only the donor holds (carryOut checks again once caught
// up): refusing then costs a retry once it has caught up as a replica,
// never safety. A primary's answer is not read: its Status reports its
// own flags' contract.
func leadsOnceCaughtUp(id string, self answer, answers []answer, donor answer) error {
	ahead := answerAhead(id, self, answers, donor)
	if ahead == nil {
		return nil
	}
	under := fmt.Sprintf("the contract its log will hold once caught up: %s, whose log reaches the newest epoch (%d), reports %s", ahead.id, ahead.lastEpoch, describeMembers(ahead.contract))
	return leadsUnder(id, ahead.contract, under)
}

// answerAhead is the most advanced data node's answer whose log reaches
// the donor's epoch and ends past this node's log (self), with the
// contract its log holds: a record of the log this node will hold once
// caught up (nil if there is none, or this node is its own donor).
func answerAhead(id string, self answer, answers []answer, donor answer) *answer {
	if donor.id == id {
		return nil
	}
	var ahead *answer
	for i, a := range answers {
		if a.err != nil || a.logstore || a.primary || a.id == id || a.contract == nil || a.lastEpoch == 0 || a.lastEpoch != donor.lastEpoch {
			continue
		}
		if ahead == nil || a.lastLSN > ahead.lastLSN {
			ahead = &answers[i]
		}
	}
	if ahead == nil || !logAhead(*ahead, self) {
		return nil
	}
	return ahead
}

// peerlessOnceCaughtUp is peerlessUnder under the contract this node's
// log will hold once caught up, as far as the survey's answers tell
// (answerAhead): a node without --peers whose own log's record was set
// by no change would otherwise fence, catch up to a record a change set,
// and give up (carryOut), leaving promises of an epoch that never opens.
func peerlessOnceCaughtUp(id string, members []primary.Member, self answer, answers []answer, donor answer) error {
	if len(members) > 0 {
		return nil
	}
	ahead := answerAhead(id, self, answers, donor)
	if ahead == nil || !failover.SetByChange(ahead.contract) {
		return nil
	}
	return fmt.Errorf("cannot promote %s: it was started without --peers, and the contract its log will hold once caught up — %s, whose log reaches the newest epoch (%d), reports %s — was set by a membership change, which a primary without --peers does not start under: start it with --peers (its log's members then win over the flag's)",
		id, ahead.id, ahead.lastEpoch, describeMembers(ahead.contract))
}

// logAhead says whether a's log ends past b's, by (epoch, LSN).
func logAhead(a, b answer) bool {
	return a.lastEpoch > b.lastEpoch || a.lastEpoch == b.lastEpoch && a.lastLSN > b.lastLSN
}

// describeMembers names c's members, those it goes to and its learners.
func describeMembers(c *walshipv1.Contract) string {
	ids := func(ms []*walshipv1.Member) string {
		var s []string
		for _, m := range ms {
			s = append(s, m.GetId())
		}
		if len(s) == 0 {
			return "none"
		}
		return strings.Join(s, ", ")
	}
	out := "members " + ids(c.GetMembers())
	if nx := c.GetNext(); nx != nil {
		out += ", changing to " + ids(nx.GetMembers())
	}
	if len(c.GetLearners()) > 0 {
		out += "; learners " + ids(c.GetLearners())
	}
	return out
}

// judgeAll is judge under every contract in cs: the quorum must hold
// under each (the strictest decides); the verdict is the first failing
// one's, or the first's.
func judgeAll(cs []*walshipv1.Contract, prev string, answers []answer, counts func(answer) bool) verdict {
	v := judge(cs[0], prev, answers, counts)
	for _, c := range cs[1:] {
		if w := judge(c, prev, answers, counts); !w.quorum && v.quorum {
			v = w
		}
	}
	return v
}

// judgeReplacing is judgeAll excluding replaced (replacedPrimary); if
// that leaves no quorum, judgeAll excluding instead, in turn, each member
// of cs that answers do not count (down, cut off, refused), until one
// has a quorum. It returns the verdict and the member it excluded. Any
// one member may be excluded: the N−k of the N members that are left
// meet the k+1 holders of every commit acknowledged under the contract —
// the primary that acknowledged it, a member of every half (Leads), and
// k others — while that primary holds it; replaced is only the member
// a failover has most likely lost. When it is alive and answers, the
// member a quorum lacks is one that does not: a candidate that fenced
// everyone and died before opening (TestPromotionAfterACandidateThatDied),
// or a primary that opened an epoch whose entries no answerer holds.
// (Every commit under the contract waits for that primary's fsync:
// primary.Policy.needsLocalSync.) So replaced's own answer must count
// and its log reach the newest epoch answered: a primary that lost its
// log (its machine replaced, the same --id on an empty data directory)
// holds nothing, and its promise with those of members that lack a
// write may be all the quorum has (TestNoExclusionPastAPrimaryThatLostItsLog).
// If replaced is not the primary that acknowledged, that one's writes
// are in replaced's log, whose epoch opened after them.
func judgeReplacing(cs []*walshipv1.Contract, replaced string, answers []answer, counts func(answer) bool) (verdict, string) {
	v := judgeAll(cs, replaced, answers, counts)
	if v.quorum {
		return v, replaced
	}
	counted := map[string]bool{}
	var newest uint64
	holds := false
	for _, a := range answers {
		if a.err == nil {
			newest = max(newest, a.lastEpoch)
		}
		if !a.logstore && counts(a) {
			counted[a.id] = true
		}
	}
	for _, a := range answers {
		if !a.logstore && a.id == replaced && counts(a) && a.lastEpoch == newest {
			holds = true
		}
	}
	if !holds {
		return v, replaced
	}
	tried := map[string]bool{replaced: true}
	for _, c := range cs {
		for _, m := range slices.Concat(c.GetMembers(), c.GetNext().GetMembers()) {
			id := m.GetId()
			if tried[id] || counted[id] {
				continue
			}
			tried[id] = true
			if w := judgeAll(cs, id, answers, counts); w.quorum {
				return w, id
			}
		}
	}
	return v, replaced
}

// logStores are the log stores a promotion asks: this node's and every
// one the contract names, in the configuration a membership change goes
// to as well.
func (n *Node) logStores() []string {
	out := append([]string(nil), n.cfg.LogStores...)
	c := n.contract()
	for _, l := range slices.Concat(c.GetLogstores(), c.GetNext().GetLogstores()) {
		if !slices.Contains(out, l) {
			out = append(out, l)
		}
	}
	return out
}

// peer is a data node a promotion asks, at every address it may be at.
type peer struct {
	id    string
	addrs []string
}

// members are the data nodes a promotion asks, this one among them: those
// the contract names (its configuration and the one a change goes to),
// then those of --peers it does not name. The contract decides who counts
// (judge); --peers adds nodes to ask, whose answers may bring a newer
// contract, and counts only where such a contract names them. A member
// the contract and --peers place at different addresses is asked at both
// (askAt), the contract's first: the contract's may be stale (the member
// moved, and only the primary that wrote the record still names the old
// one), or --peers' (a stale flag); only a node that answers as that
// member counts, once.
func (n *Node) members() []peer {
	var out []peer
	add := func(id, addr string) {
		if addr == "" {
			return
		}
		i := slices.IndexFunc(out, func(p peer) bool { return p.id == id })
		if i < 0 {
			out = append(out, peer{id: id, addrs: []string{addr}})
		} else if !slices.Contains(out[i].addrs, addr) {
			out[i].addrs = append(out[i].addrs, addr)
		}
	}
	c := n.contract()
	for _, m := range slices.Concat(c.GetMembers(), c.GetNext().GetMembers()) {
		add(m.GetId(), m.GetAddr())
	}
	for _, m := range n.cfg.Members {
		add(m.ID, m.Addr)
	}
	return out
}

// askAt asks the member id at each of addrs at once (ask returns the
// response and the id the node there states) and returns the first
// response of a node that states id, with its address; the others are
// cancelled. An address where a node answers as another (a reused one)
// never counts: when no node answers as id, the error names what each
// address said.
func askAt[T any](ctx context.Context, id string, addrs []string, ask func(ctx context.Context, addr string) (T, string, error)) (T, string, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	type result struct {
		resp T
		addr string
		err  error
	}
	ch := make(chan result, len(addrs))
	for _, addr := range addrs {
		go func() {
			resp, got, err := ask(ctx, addr)
			if err == nil && got != id {
				err = fmt.Errorf("the node at %s answers as %q, not %s", addr, got, id)
			} else if err != nil && len(addrs) > 1 {
				err = fmt.Errorf("at %s: %w", addr, err)
			}
			ch <- result{resp, addr, err}
		}()
	}
	var errs []error
	for range addrs {
		r := <-ch
		if r.err == nil {
			return r.resp, r.addr, nil
		}
		errs = append(errs, r.err)
	}
	var zero T
	return zero, addrs[0], errors.Join(errs...)
}

// judge applies the quorum rule (failover.Judge) to answers (those that
// count: granted ones after a fence, reachable ones in a survey) under
// contract c, where prev is the replaced primary's id. Every promotion
// quorum it accepts meets every set that could have acknowledged a commit
// under c (docs/ARCHITECTURE.md, Failover invariants, I5).
//
// While a membership change is in progress (c.next set) the quorum is
// the joint one: a quorum of the current configuration and one of the
// configuration it goes to.
func judge(c *walshipv1.Contract, prev string, answers []answer, counts func(answer) bool) verdict {
	var v verdict
	qc := failover.ConfigOf(c)
	var counted []answer
	var fcounted, fall []failover.Answer
	for _, a := range answers {
		fa := failover.Answer{ID: a.id, LogStore: a.logstore, LastEpoch: a.lastEpoch, LastLSN: a.lastLSN,
			PrimaryLast: a.primaryLast, PrimaryDurable: a.primaryDurable}
		fall = append(fall, fa)
		if !counts(a) {
			v.refused = append(v.refused, a.String())
			continue
		}
		v.granted = append(v.granted, a.id)
		counted, fcounted = append(counted, a), append(fcounted, fa)
	}
	fv := qc.Judge(prev, fcounted, fall)
	v.quorum, v.atRisk, v.atRiskDurable = fv.Quorum, fv.AtRisk, fv.AtRiskDurable
	if fv.Donor >= 0 {
		v.donor = counted[fv.Donor]
	}
	needed := func(fc failover.Contract, fv failover.Verdict) string {
		nls := len(fc.LogStores)
		s := fmt.Sprintf("%d of %d log stores", fv.NeedLogStores, nls)
		if fv.NeedMembers > 0 {
			s += fmt.Sprintf(" and %d of the %d sync-eligible members (contract: any %d at %s)", fv.NeedMembers, fv.Eligible, fc.K, levelName(c.GetSyncLevel()))
		}
		if nls == 0 {
			s = "a log store majority, but no log store is configured"
		}
		return s + fmt.Sprintf("; have %d log stores and %d members", fv.LogStores, fv.Members)
	}
	v.needed = needed(qc.Old, fv.Old)
	if qc.Joint {
		// It follows "needs" (walship ctl promote, a dry run's refusal).
		v.needed = "a quorum of each configuration of the membership change in progress: of the current one, " + v.needed +
			"; and of the one it goes to, " + needed(qc.New, fv.New)
	}
	sort.Strings(v.granted)
	sort.Strings(v.refused)
	return v
}

func levelName(l walshipv1.SyncLevel) string {
	return strings.ToLower(strings.TrimPrefix(l.String(), "SYNC_LEVEL_"))
}

// promote serves AdminService.Promote on the replica (steps 1-3).
func (n *Node) promote(ctx context.Context, req *walshipv1.PromoteRequest) (*walshipv1.PromoteResponse, error) {
	return n.promoteAs(ctx, req, false)
}

// promoteAs is promote; elected says this node holds the election
// (auto.go), whose lease keeps the old primary from taking writes: a
// primary the survey finds serving is then no reason to refuse.
func (n *Node) promoteAs(ctx context.Context, req *walshipv1.PromoteRequest, elected bool) (*walshipv1.PromoteResponse, error) {
	// Above the maximum is refused before anything is asked; how far above
	// every epoch seen it may be, once the survey has seen them (newEpoch).
	if err := datadir.CheckEpoch(req.GetEpoch(), datadir.MaxEpoch, datadir.MaxEpochJump); err != nil {
		return nil, status.Errorf(codes.InvalidArgument, "epoch: %v", err)
	}
	rep := n.Replica()
	if rep == nil {
		return nil, status.Error(codes.FailedPrecondition, "already the primary")
	}
	if n.cfg.Replica.ReadOnly {
		return nil, status.Error(codes.FailedPrecondition, "cannot promote a read-only node (a restored directory): start it with walship primary to make it the primary of a new cluster")
	}
	if len(n.cfg.LogStores) == 0 {
		return nil, status.Error(codes.FailedPrecondition, "cannot promote: no log store is configured (--logstore); an epoch vote needs a log store majority")
	}
	// Only a node that may lead under its log's newest contract record
	// contends at all (a learner, a member joining or leaving in a change
	// in progress does not): nothing is asked or fenced.
	if err := leads(n.cfg.ID, rep.EpochRecord()); err != nil {
		if !req.GetDryRun() {
			n.metrics.promotions.WithLabelValues(resultNotMember).Inc()
		}
		return nil, status.Error(codes.FailedPrecondition, err.Error())
	}
	if err := peerlessUnder(n.cfg.ID, n.cfg.Members, rep.EpochRecord()); err != nil {
		if !req.GetDryRun() {
			n.metrics.promotions.WithLabelValues("refused").Inc()
		}
		return nil, status.Error(codes.FailedPrecondition, err.Error())
	}
	if err := n.startPromoting(req.GetDryRun()); err != nil {
		return nil, err
	}
	handedOff := req.GetDryRun()
	defer func() {
		if !handedOff {
			n.promoting.Store(false)
		}
	}()
	started := time.Now()
	prev := rep.Vote()
	survey, known := n.surveyAll(ctx, n.selfAnswer(rep), prev.Primary)
	cluster, err := n.clusterOf(rep.ClusterID(), survey)
	if err != nil {
		n.metrics.promotions.WithLabelValues("refused").Inc()
		return nil, err
	}
	replaced := replacedPrimary(prev.Primary, survey)
	tl := &walshipv1.FailoverTimeline{PreviousEpoch: prev.Epoch, PreviousPrimary: replaced, StartedUnixNano: started.UnixNano()}
	pre, _ := judgeReplacing(known, replaced, survey, reachable)
	seen := highestEpoch(survey)
	epoch, err := newEpoch(req.GetEpoch(), seen)
	if err != nil {
		return nil, err
	}
	tl.Epoch = epoch
	resp := &walshipv1.PromoteResponse{Epoch: epoch, Timeline: tl}
	pre.report(resp, tl)
	if err := leadsOnceCaughtUp(n.cfg.ID, survey[0], survey, pre.donor); err != nil {
		if !req.GetDryRun() {
			n.metrics.promotions.WithLabelValues(resultNotMember).Inc()
		}
		return nil, status.Errorf(codes.FailedPrecondition, "%v; nothing was fenced", err)
	}
	if err := peerlessOnceCaughtUp(n.cfg.ID, n.cfg.Members, survey[0], survey, pre.donor); err != nil {
		if !req.GetDryRun() {
			n.metrics.promotions.WithLabelValues("refused").Inc()
		}
		return nil, status.Errorf(codes.FailedPrecondition, "%v; nothing was fenced", err)
	}
	self := survey[0]
	serving := servingPrimary(survey, max(prev.Epoch, self.epoch, self.lastEpoch))
	resp.ServingPrimary = serving
	if req.GetDryRun() {
		return resp, nil
	}
	if serving != nil && !req.GetDepose() && !elected {
		n.metrics.promotions.WithLabelValues("refused").Inc()
		return nil, status.Errorf(codes.FailedPrecondition, "%s at %s is the primary of epoch %d and takes writes: a promotion would depose it and lose what it has not shipped; "+
			"use `walship ctl switchover --primary %s --target %s` to hand its role over without losing anything, or depose it (depose: true; force alone does not); nothing was fenced",
			serving.GetId(), serving.GetAddr(), serving.GetEpoch(), serving.GetAddr(), n.cfg.ID)
	}
	n.metrics.phase(phaseSurvey, started)
	if !pre.quorum && !req.GetForce() {
		n.metrics.promotions.WithLabelValues("refused").Inc()
		return nil, status.Errorf(codes.FailedPrecondition, "promotion needs %s; nothing was fenced. Reachable: %s. Not: %s",
			pre.needed, strings.Join(pre.granted, ", "), strings.Join(pre.refused, "; "))
	}
	fencing := time.Now()
	answers, known := n.fenceEpoch(ctx, rep, epoch, replaced, cluster, known, promisesOf(survey))
	tl.FencedUnixNano = time.Now().UnixNano()
	n.metrics.phase(phaseFence, fencing)
	replaced = replacedPrimary(prev.Primary, survey, answers)
	tl.PreviousPrimary = replaced
	v, excluded := judgeReplacing(known, replaced, answers, promised)
	v.report(resp, tl)
	if !v.quorum && !(req.GetForce() && countLogStores(answers) >= failover.Majority(len(n.logStores()))) {
		n.metrics.promotions.WithLabelValues("failed").Inc()
		n.setTimeline(tl)
		return nil, status.Errorf(codes.FailedPrecondition, "promotion to epoch %d needs %s; the epoch is fenced where granted (the old primary may have lost its lease: promote again, or restart it to rejoin). Answers: %s",
			epoch, v.needed, strings.Join(append(v.granted, v.refused...), "; "))
	}
	if cluster == "" {
		// Nobody surveyed had one: a promise may have (a node that
		// joined meanwhile). If they disagree, the next primary decides
		// nothing: it makes a new id only when none is known.
		cluster, _ = datadir.OneClusterID(clusterIDs(answers, promised))
	}
	// Once fenced, this replica follows no one: its log's newest record
	// stays what it is until the catch-up, which may cut it (recordUpTo)
	// or bring a newer one.
	p := &plan{epoch: epoch, cluster: cluster, self: answerOf(answers, n.cfg.ID), donor: v.donor, timeline: tl,
		prev: replaced, answers: answers, forced: !v.quorum}
	var held *walshipv1.EpochRecord
	p.appliedRecord, p.appliedLSN, held = rep.EpochRecords()
	p.record = p.appliedRecord
	if held != nil {
		p.record = held
	}
	wait := n.leaseWait(known, answers, seen)
	p.leaseUntil = time.Now().Add(wait)
	tl.LeaseWait = durationpb.New(wait)
	n.setTimeline(tl)
	select {
	case n.plans <- p:
		handedOff = true // Run clears promoting once it has carried the plan out
	default:
		return nil, status.Error(codes.Aborted, "a promotion is already under way")
	}
	n.logger.Info("promotion fenced; opening as primary", "epoch", epoch, "granted", strings.Join(v.granted, ","), "donor", v.donor.id,
		"donor_last_lsn", v.donor.lastLSN, "lease_wait", wait, "replaced", replaced, "excluded", excluded)
	return resp, nil
}

// servingPrimary is the member of answers that is the primary of epoch
// known or a newer one and takes writes (nil: none is).
func servingPrimary(answers []answer, known uint64) *walshipv1.ServingPrimary {
	for _, a := range answers {
		if a.err == nil && !a.logstore && a.primary && a.takingWrites && a.lastEpoch >= known {
			return &walshipv1.ServingPrimary{Id: a.id, Addr: a.addr, Epoch: a.lastEpoch}
		}
	}
	return nil
}

// startPromoting takes the promoting flag for a promotion; a dry run
// changes nothing: it neither takes nor waits for the flag (the
// election's eligibility checks run one every second), and is refused
// only while a promotion is under way.
func (n *Node) startPromoting(dryRun bool) error {
	if dryRun {
		if n.promoting.Load() {
			return status.Error(codes.Aborted, "a promotion is already under way on this node")
		}
	} else if !n.promoting.CompareAndSwap(false, true) {
		return status.Error(codes.Aborted, "a promotion is already under way on this node")
	}
	return nil
}

// reachable counts the answers of a survey that came back.
func reachable(a answer) bool { return a.err == nil }

// promised counts the answers of a fence that granted it.
func promised(a answer) bool { return a.err == nil && a.granted }

// surveyAll is step 1: self and every other answer to the survey, and the
// contracts they know, this node's first. An answer is believed only
// within datadir.MaxEpochGap of the newest epoch this node knows.
func (n *Node) surveyAll(ctx context.Context, self answer, own string) ([]answer, []*walshipv1.Contract) {
	known := []*walshipv1.Contract{n.contract()}
	survey := append([]answer{self}, n.survey(ctx, max(self.epoch, self.lastEpoch), func(as []answer) bool {
		all := append([]answer{self}, as...)
		v, _ := judgeReplacing(known, replacedPrimary(own, all), all, reachable)
		return v.quorum
	})...)
	// Every contract an answer knows counts: a node that applied a newer
	// epoch record than this one's may know a stricter contract.
	return survey, withContracts(known, survey)
}

// fenceEpoch is step 2: it asks this node and every other to promise
// epoch as a candidate of cluster — those whose promise the survey found
// more than datadir.MaxEpochJump behind it in steps (fenceStepping) —
// and returns their answers and known with the contracts they know.
func (n *Node) fenceEpoch(ctx context.Context, rep *replica.Server, epoch uint64, prev, cluster string, known []*walshipv1.Contract, promises map[string]uint64) ([]answer, []*walshipv1.Contract) {
	fr := &walshipv1.FenceRequest{Epoch: epoch, CandidateId: n.cfg.ID, CandidateAddr: n.advertise(), ClusterId: cluster}
	answers := n.fenceAll(ctx, rep, fr, promises, func(as []answer) bool {
		v, _ := judgeReplacing(known, prev, as, promised)
		return v.quorum
	})
	return answers, withContracts(known, answers)
}

// replacedPrimary is the primary a promotion replaces, whose promise does
// not count toward its quorum (failover.Judge's prev): the primary of the
// newest log epoch the answers believed hold, as one of them names it
// (log_primary_id: entries of an epoch are its primary's alone, so it is
// the primary that may have acknowledged the newest commits); own — the
// primary this node's promise names — if none names it. Not own alone: a
// promotion that fenced and gave up leaves promises naming its candidate
// as the primary of an epoch that never opened, and the primary that
// really was would then count among the members needed, dead or not (the
// wedge of TestPromotionAfterOneThatGaveUp). Any one excluded member
// keeps the quorum meeting every ack quorum while the primary holds its
// commits (failover.Config.Leads); this one is the member a failover has
// most likely lost.
func replacedPrimary(own string, answerSets ...[]answer) string {
	var newest uint64
	name := ""
	for _, as := range answerSets {
		for _, a := range as {
			switch {
			case a.err != nil:
			case a.lastEpoch > newest:
				newest, name = a.lastEpoch, a.logPrimary
			case a.lastEpoch == newest && name == "":
				name = a.logPrimary
			}
		}
	}
	if name == "" {
		return own
	}
	return name
}

// promisesOf maps each answer believed to the epoch it has promised.
func promisesOf(answers []answer) map[string]uint64 {
	m := map[string]uint64{}
	for _, a := range answers {
		if a.err == nil {
			m[a.id] = a.epoch
		}
	}
	return m
}

// clusterOf is the cluster a promotion fences as: this node's id (own),
// or, if it has none, the one the surveyed nodes hold (none: ""). A
// surveyed node of another cluster is marked as an error, so that it
// counts for nothing and the refusal names both ids; nodes that disagree,
// when this one has no id, refuse the promotion before anything is
// fenced.
func (n *Node) clusterOf(own string, survey []answer) (string, error) {
	if own == "" {
		id, err := datadir.OneClusterID(clusterIDs(survey, reachable))
		if err != nil {
			return "", status.Errorf(codes.FailedPrecondition, "%v: this node has no cluster id, so it cannot tell which cluster to promote in; nothing was fenced", rpcerr.Mismatch("%v", err))
		}
		return id, nil
	}
	for i, a := range survey {
		if err := rpcerr.CheckPeer("node", own, a.id, a.cluster); a.err == nil && err != nil {
			survey[i].err = err
			n.logger.Warn("a node the promotion asked belongs to another cluster; it does not count", "peer", a.id, "cluster_id", own, "peer_cluster_id", a.cluster)
		}
	}
	return own, nil
}

// clusterIDs maps the answers that count to the cluster ids they stated.
func clusterIDs(answers []answer, counts func(answer) bool) map[string]string {
	ids := map[string]string{}
	for _, a := range answers {
		if counts(a) {
			ids[a.id] = a.cluster
		}
	}
	return ids
}

// withContracts is known and the contract of every answer that has one.
func withContracts(known []*walshipv1.Contract, answers []answer) []*walshipv1.Contract {
	for _, a := range answers {
		if a.contract != nil {
			known = append(known, a.contract)
		}
	}
	return known
}

// highestEpoch is the newest epoch any answer holds or has in its log,
// of the answers believed: one that is an error (another cluster's, an
// epoch beyond datadir.MaxEpochGap) counts for nothing, its epoch
// included — else the promotion would fence the epoch after it, which
// every node that knows less refuses.
func highestEpoch(answers []answer) uint64 {
	seen := uint64(0)
	for _, a := range answers {
		if a.err == nil {
			seen = max(seen, a.epoch, a.lastEpoch)
		}
	}
	return seen
}

// newEpoch is the epoch to promote to: the one asked for, which must
// exceed every epoch seen by at most datadir.MaxEpochJump (an admin's
// epoch is a message like any other), or the next after them. None is
// left once an epoch seen is the maximum: FAILED_PRECONDITION, never a
// wrap to 0.
func newEpoch(asked, seen uint64) (uint64, error) {
	if asked == 0 {
		e, err := datadir.NextEpoch(seen)
		if err != nil {
			return 0, status.Errorf(codes.FailedPrecondition, "cannot promote: %v; nothing was fenced", err)
		}
		return e, nil
	}
	if asked <= seen {
		return 0, status.Errorf(codes.InvalidArgument, "epoch: %d does not exceed every epoch seen (%d)", asked, seen)
	}
	if err := datadir.CheckEpoch(asked, seen, datadir.MaxEpochJump); err != nil {
		return 0, status.Errorf(codes.InvalidArgument, "epoch: %v; nothing was fenced", err)
	}
	return asked, nil
}

// report puts the verdict in the response and the timeline.
func (v verdict) report(resp *walshipv1.PromoteResponse, tl *walshipv1.FailoverTimeline) {
	resp.Needed, resp.Quorum, resp.HighestLsn = v.needed, v.quorum, v.donor.lastLSN
	resp.AtRiskFromLsn, resp.AtRiskToLsn, resp.AtRiskDurableToLsn = v.atRisk[0], v.atRisk[1], v.atRiskDurable
	tl.Granted, tl.Refused, tl.Donor = v.granted, v.refused, v.donor.id
}

// answerOf is id's answer, or the zero answer if id did not answer.
func answerOf(answers []answer, id string) answer {
	var found answer
	for _, a := range answers {
		if a.id == id {
			found = a
		}
	}
	return found
}

// leaseWait is how long the new primary waits out the old one's lease
// (step 5): the longest lease any known contract (or this node) gives a
// primary, plus a tenth; none if the primary of the newest epoch seen
// promised (it has stepped down: an older primary's promise says nothing
// of a newer one), else less the shortest time since a promising log
// store last heard from a primary. With the primary's side (lease.valid)
// it is docs/ARCHITECTURE.md's Failover invariant 7.
func (n *Node) leaseWait(known []*walshipv1.Contract, answers []answer, seen uint64) time.Duration {
	lease := n.cfg.Primary.LeaseTimeout
	for _, c := range known {
		lease = max(lease, c.GetLeaseTimeout().AsDuration())
	}
	if lease == 0 {
		lease = primary.DefaultLeaseTimeout
	}
	wait := lease * 11 / 10
	oldGranted := false
	minSince := time.Duration(-1)
	for _, a := range answers {
		if a.granted && a.primary && a.lastEpoch >= seen {
			oldGranted = true
		}
		if a.granted && a.logstore && (minSince < 0 || a.since < minSince) {
			minSince = a.since
		}
	}
	if oldGranted {
		return 0
	}
	if minSince > 0 {
		return max(0, wait-minSince)
	}
	return wait
}

func countLogStores(as []answer) int {
	n := 0
	for _, a := range as {
		if a.logstore && a.granted && a.err == nil {
			n++
		}
	}
	return n
}

func (n *Node) setTimeline(tl *walshipv1.FailoverTimeline) {
	n.mu.Lock()
	n.timeline = tl
	n.mu.Unlock()
}

// noteFailure counts p, a promotion that failed after fencing, and
// records err in its timeline. A give-up once caught up (mayOpen) is a
// failure too, never not_member: that result says nothing was fenced,
// and this one left promises behind.
func (n *Node) noteFailure(p *plan, err error) {
	n.metrics.promotions.WithLabelValues("failed").Inc()
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.timeline != nil && n.timeline.GetEpoch() == p.epoch {
		n.timeline.Failure = err.Error()
	}
}

// failUnopened records err as the failure of this node's promotion to
// epoch if it started as that epoch's primary but never opened (a newer
// epoch fenced the log stores first); otherwise it does nothing.
func (n *Node) failUnopened(epoch uint64, err error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	tl := n.timeline
	if tl == nil || tl.GetEpoch() != epoch || tl.GetOpenedUnixNano() != 0 || tl.GetFailure() != "" {
		return
	}
	tl = proto.Clone(tl).(*walshipv1.FailoverTimeline)
	tl.Failure = err.Error()
	n.timeline = tl
	n.metrics.promotions.WithLabelValues("failed").Inc()
}

func (n *Node) advertise() string {
	if n.cfg.Advertise != "" {
		return n.cfg.Advertise
	}
	return n.Addr()
}

// selfAnswer is this replica's own position.
func (n *Node) selfAnswer(rep interface {
	LogPosition() (uint64, uint64, datadir.History)
	Vote() datadir.Vote
	LogPrimary() datadir.Vote
	ClusterID() string
}) answer {
	last, epoch, h := rep.LogPosition()
	v := rep.Vote()
	return answer{id: n.cfg.ID, addr: n.advertise(), lastLSN: last, lastEpoch: epoch, history: h, epoch: v.Epoch, holder: v.Primary, granted: true, cluster: rep.ClusterID(),
		logPrimary: rep.LogPrimary().Primary}
}

// survey asks every log store and other member where its log ends,
// returning once everyone answered, or soon after enough had; an answer
// more than datadir.MaxEpochGap above known is an error.
func (n *Node) survey(ctx context.Context, known uint64, enough func([]answer) bool) []answer {
	type job struct {
		id    string
		addrs []string
		ls    bool
	}
	var jobs []job
	for _, a := range n.logStores() {
		jobs = append(jobs, job{a, []string{a}, true})
	}
	for _, m := range n.members() {
		if m.id != n.cfg.ID {
			jobs = append(jobs, job{m.id, m.addrs, false})
		}
	}
	ch := make(chan answer, len(jobs))
	for _, j := range jobs {
		go func() {
			a := answer{id: j.id, addr: j.addrs[0], logstore: j.ls}
			defer func() { ch <- a }()
			if j.ls {
				st, err := logStoreStatus(ctx, n.dialer(), j.addrs[0])
				if a.err = err; err == nil {
					a.epoch, a.holder, a.lastEpoch, a.lastLSN, a.history = st.GetVoteEpoch(), st.GetPrimaryId(), st.GetLastEpoch(), st.GetDurableLsn(), datadir.HistoryFromProto(st.GetHistory())
					a.cluster, a.logPrimary = st.GetClusterId(), st.GetLogPrimaryId()
				}
			} else {
				st, addr, err := askAt(ctx, j.id, j.addrs, func(ctx context.Context, addr string) (*walshipv1.StatusResponse, string, error) {
					st, err := nodeStatus(ctx, n.dialer(), addr)
					return st, st.GetId(), err
				})
				if a.addr, a.err = addr, err; err == nil {
					a.epoch, a.holder, a.lastEpoch, a.lastLSN, a.history = st.GetVoteEpoch(), st.GetPrimaryId(), st.GetEpoch(), st.GetDurableLsn(), datadir.HistoryFromProto(st.GetHistory())
					a.primary = st.GetRole() == walshipv1.Role_ROLE_PRIMARY
					a.takingWrites = a.primary && st.GetTakingWrites()
					a.contract = st.GetContract()
					a.cluster, a.logPrimary = st.GetClusterId(), st.GetLogPrimaryId()
					if len(st.GetPeers()) > 0 && !a.primary {
						a.primaryLast = st.GetVisibleLsn() + st.GetPeers()[0].GetLagRecords()
					}
				}
			}
			a.checkEpochs(known)
		}()
	}
	return collect(jobs2ids(len(jobs), func(i int) string { return jobs[i].id }), ch, enough)
}

// checkEpochs makes an answer that states an epoch more than
// datadir.MaxEpochGap above known (the newest epoch this node knows, or
// the one it fences) an error: no honest peer gets that far ahead, and
// this promotion would fence the one after it, further than its steps
// bridge. So is one whose history datadir.History.Check refuses.
func (a *answer) checkEpochs(known uint64) {
	if a.err != nil {
		return
	}
	for _, e := range []uint64{a.epoch, a.lastEpoch, a.history.Current().Epoch} {
		if err := datadir.CheckEpoch(e, known, datadir.MaxEpochGap); err != nil {
			a.err = fmt.Errorf("states epoch %w", err)
			return
		}
	}
	// Its history decides what of its log is kept (SharedUpTo): one
	// that does not parse as a history is no answer.
	if err := a.history.Check(known, datadir.MaxEpochGap); err != nil {
		a.err = fmt.Errorf("states history%w", err)
	}
}

// fenceAll fences every log store and member at once (this node through
// its replica directly; the others from the epoch promises says they
// promised, fenceStepping) and returns every answer; one stating an epoch
// more than datadir.MaxEpochGap above the epoch fenced is an error.
func (n *Node) fenceAll(ctx context.Context, rep interface {
	Fence(*walshipv1.FenceRequest) (*walshipv1.FenceResponse, error)
}, req *walshipv1.FenceRequest, promises map[string]uint64, enough func([]answer) bool) []answer {
	type job struct {
		id       string
		addrs    []string
		ls, self bool
	}
	jobs := []job{{id: n.cfg.ID, addrs: []string{n.advertise()}, self: true}}
	for _, a := range n.logStores() {
		jobs = append(jobs, job{id: a, addrs: []string{a}, ls: true})
	}
	for _, m := range n.members() {
		if m.id != n.cfg.ID {
			jobs = append(jobs, job{id: m.id, addrs: m.addrs})
		}
	}
	ch := make(chan answer, len(jobs))
	for _, j := range jobs {
		go func() {
			var resp *walshipv1.FenceResponse
			var err error
			addr := j.addrs[0]
			switch {
			case j.self:
				resp, err = rep.Fence(req)
			case j.ls:
				resp, err = fenceStepping(ctx, n.dialer(), addr, true, req, promises[j.id])
			default:
				resp, addr, err = askAt(ctx, j.id, j.addrs, func(ctx context.Context, addr string) (*walshipv1.FenceResponse, string, error) {
					resp, err := fenceStepping(ctx, n.dialer(), addr, false, req, promises[j.id])
					return resp, resp.GetId(), err
				})
			}
			a := answer{id: j.id, addr: addr, logstore: j.ls, err: err}
			if err == nil {
				a.granted, a.epoch, a.holder = resp.GetGranted(), resp.GetEpoch(), resp.GetPrimaryId()
				a.lastEpoch, a.lastLSN, a.history, a.primary = resp.GetLastEpoch(), resp.GetLastLsn(), datadir.HistoryFromProto(resp.GetHistory()), resp.GetPrimary()
				a.since = resp.GetSincePrimaryContact().AsDuration()
				a.primaryLast, a.primaryDurable = resp.GetPrimaryLastLsn(), resp.GetPrimaryDurableLsn()
				a.contract = resp.GetContract()
				a.cluster, a.logPrimary = resp.GetClusterId(), resp.GetLogPrimaryId()
			}
			a.checkEpochs(req.GetEpoch())
			ch <- a
		}()
	}
	return collect(jobs2ids(len(jobs), func(i int) string { return jobs[i].id }), ch, enough)
}

// collect gathers the answers of ids from ch: all of them, or, once enough
// says the ones so far will do, those that come within answerGrace more
// (a paused or partitioned node does not hold a failover up for its
// timeout); the missing ones are reported as not answering.
func collect(ids []string, ch <-chan answer, enough func([]answer) bool) []answer {
	var out []answer
	got := map[string]bool{}
	var grace <-chan time.Time
	for len(out) < len(ids) {
		select {
		case a := <-ch:
			out = append(out, a)
			got[a.id] = true
			if grace == nil && enough != nil && enough(out) {
				grace = time.After(answerGrace)
			}
			continue
		case <-grace:
		}
		break
	}
	for _, id := range ids {
		if !got[id] {
			out = append(out, answer{id: id, err: fmt.Errorf("no answer within %v of the quorum's", answerGrace)})
		}
	}
	return out
}

// answerGrace is how long a survey or a fence waits for the rest once the
// answers so far reach the quorum.
const answerGrace = 100 * time.Millisecond

func jobs2ids(n int, id func(int) string) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = id(i)
	}
	return out
}

// dialer is how the node dials its peers (its roles' Security.Dialer:
// one identity for both).
func (n *Node) dialer() serve.Dialer { return n.cfg.Primary.Security.Dialer }

// peerClass is the class a promotion's peer must be (under the default
// identity scheme): a log store, or a member, a data node. A server of
// another class at its address neither votes nor donates.
func peerClass(d serve.Dialer, logstore bool) grpc.DialOption {
	if logstore {
		return d.PeerClass(tlsid.ClassLogStore)
	}
	return d.PeerClass(tlsid.ClassNode)
}

func dial(d serve.Dialer, addr string, logstore bool) (*grpc.ClientConn, error) {
	return d.Dial(addr, peerClass(d, logstore), grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(wal.MaxEntrySize+1<<20)))
}

func fence(ctx context.Context, d serve.Dialer, addr string, logstore bool, req *walshipv1.FenceRequest) (*walshipv1.FenceResponse, error) {
	return serve.Call(ctx, d, addr, 3*time.Second, func(ctx context.Context, cc *grpc.ClientConn) (*walshipv1.FenceResponse, error) {
		return walshipv1.NewEpochServiceClient(cc).Fence(ctx, req)
	}, peerClass(d, logstore))
}

// fenceStepping fences the node at addr with req, first at each of
// datadir.EpochSteps from the epoch it has promised (as the survey found
// it) when that is more than datadir.MaxEpochJump behind req's: one
// accepted message may put some nodes that far ahead of the others, and
// the epoch after theirs must still be granted by the others, which
// refuse a fence beyond the jump. Each step is a promise to this
// candidate, superseded by req's; the answer is req's.
func fenceStepping(ctx context.Context, d serve.Dialer, addr string, logstore bool, req *walshipv1.FenceRequest, promised uint64) (*walshipv1.FenceResponse, error) {
	steps := datadir.EpochSteps(promised, req.GetEpoch())
	if len(steps) == 0 {
		return fence(ctx, d, addr, logstore, req)
	}
	return serve.Call(ctx, d, addr, time.Duration(len(steps)+1)*3*time.Second, func(ctx context.Context, cc *grpc.ClientConn) (*walshipv1.FenceResponse, error) {
		client := walshipv1.NewEpochServiceClient(cc)
		for p := promised; ; {
			if p >= req.GetEpoch() || req.GetEpoch()-p <= datadir.MaxEpochJump {
				return client.Fence(ctx, req)
			}
			step := proto.Clone(req).(*walshipv1.FenceRequest)
			step.Epoch = p + datadir.MaxEpochJump
			resp, err := client.Fence(ctx, step)
			if err != nil {
				return nil, fmt.Errorf("fence epoch %d on the way to %d: %w", step.Epoch, req.GetEpoch(), err)
			}
			// Granted, it promised the step; refused, it holds a newer
			// epoch already: either way the next step is from there.
			p = max(step.Epoch, resp.GetEpoch())
		}
	}, peerClass(d, logstore))
}

func logStoreStatus(ctx context.Context, d serve.Dialer, addr string) (*walshipv1.LogStoreServiceStatusResponse, error) {
	return serve.Call(ctx, d, addr, 2*time.Second, func(ctx context.Context, cc *grpc.ClientConn) (*walshipv1.LogStoreServiceStatusResponse, error) {
		return walshipv1.NewLogStoreServiceClient(cc).Status(ctx, &walshipv1.LogStoreServiceStatusRequest{})
	}, peerClass(d, true))
}

func nodeStatus(ctx context.Context, d serve.Dialer, addr string) (*walshipv1.StatusResponse, error) {
	return serve.Call(ctx, d, addr, 2*time.Second, func(ctx context.Context, cc *grpc.ClientConn) (*walshipv1.StatusResponse, error) {
		return walshipv1.NewAdminServiceClient(cc).Status(ctx, &walshipv1.StatusRequest{})
	}, peerClass(d, false))
}

// carryOut does steps 4-6 with the replica role stopped.
func (n *Node) carryOut(ctx context.Context, p *plan) error {
	catchingUp := time.Now()
	log, err := wal.Open(wal.Options{Dir: filepath.Join(n.cfg.DataDir, "wal"), FS: n.fs, SegmentSize: n.cfg.Replica.SegmentBytes, Logger: n.logger})
	if err != nil {
		return fmt.Errorf("open wal: %w", err)
	}
	closed := false
	defer func() {
		if !closed {
			_ = log.Close()
		}
	}()
	own, err := datadir.LoadHistory(n.fs, n.cfg.DataDir)
	if err != nil {
		return err
	}
	own = own.Cut(log.LastLSN())
	hist := p.donor.history
	if p.donor.id == n.cfg.ID {
		hist = own
	}
	// Cut a tail of this node's log that the donor's history does not
	// have (kept in an orphan file).
	cut := false
	if p.donor.id != n.cfg.ID {
		keep, all, known := hist.SharedUpTo(own)
		if !known {
			return fmt.Errorf("this node's log (epoch %d) is older than the donor %s's history reaches back to: re-seed it first", own.Current().Epoch, p.donor.id)
		}
		if !all && keep < log.LastLSN() {
			applied, _ := datadir.LoadApplied(n.fs, n.cfg.DataDir)
			if applied > keep {
				return fmt.Errorf("this node applied LSNs up to %d, past where its history and the donor %s's part (%d): re-seed it first", applied, p.donor.id, keep)
			}
			_, records, err := datadir.OrphanTail(n.fs, n.cfg.DataDir, log, keep, time.Now())
			if err != nil {
				return err
			}
			if err := log.TruncateAfter(keep); err != nil {
				return fmt.Errorf("cut the log after LSN %d: %w", keep, err)
			}
			p.timeline.CutRecords, cut = records, true
		}
	}
	// Copy what the donor has beyond this log.
	rec := p.record
	// The state applied past the cut in memory (its marker on disk did
	// not): its record is unknown; keep p.record's, only stricter.
	if cut && p.appliedLSN <= log.LastLSN() {
		if rec, err = recordUpTo(ctx, log, p.appliedLSN, p.appliedRecord); err != nil {
			return err
		}
	}
	if p.donor.lastLSN > log.LastLSN() {
		own = own.Cut(log.LastLSN())
		note := func(b *codec.Batch) {
			if r := epochRecordIn(b); r != nil {
				rec = r
			}
		}
		records, bytes, err := copyFromRetrying(ctx, n.dialer(), p.donor.addr, p.donor.logstore, log, p.donor.lastLSN, own.Current().Epoch, p.epoch, p.cluster, note)
		if err != nil {
			return n.keepDonorHistory(hist, log.LastLSN(), fmt.Errorf("catch up from %s: %w", p.donor.id, err))
		}
		p.timeline.CaughtUpRecords, p.timeline.CaughtUpBytes = records, bytes
	}
	if err := log.Sync(); err != nil {
		return fmt.Errorf("wal sync: %w", err)
	}
	last := log.LastLSN()
	closed = true
	if err := log.Close(); err != nil {
		return fmt.Errorf("close wal: %w", err)
	}
	if err := mayOpen(n.cfg.ID, p, rec); err != nil {
		return n.keepDonorHistory(hist, last, err)
	}
	if err := peerlessUnder(n.cfg.ID, n.cfg.Members, rec); err != nil {
		return n.keepDonorHistory(hist, last, fmt.Errorf("gave up epoch %d once caught up from %s, before opening it: %w", p.epoch, p.donor.id, err))
	}
	// The cluster id before the epoch: the primary starts in it (or makes
	// one if nobody had any).
	if p.cluster != "" {
		if own, err := datadir.LoadCluster(n.fs, n.cfg.DataDir); err != nil {
			return err
		} else if own == "" {
			if err := datadir.SaveCluster(n.fs, n.cfg.DataDir, p.cluster); err != nil {
				return err
			}
		}
	}
	h := hist.Cut(last).With(p.epoch, last+1)
	if err := datadir.SaveHistory(n.fs, n.cfg.DataDir, h); err != nil {
		return err
	}
	if ctx.Err() != nil {
		return ctx.Err()
	}
	n.metrics.phase(phaseCatchUp, catchingUp)
	listen, metrics := n.listen()
	if err := n.newPrimary(listen, metrics, &primary.Elected{Epoch: p.epoch, History: h}); err != nil {
		return err
	}
	p.timeline.StartLsn = last + 1
	n.setTimeline(p.timeline)
	return nil
}

// recordUpTo is the newest epoch record in log, cut after its last LSN:
// the last one its entries after LSN applied put, else appliedRecord,
// the applied state's (a cut never goes below what was applied). The
// record the promotion fenced with may have been in the tail cut, and
// judging by it would refuse a candidate the log's contract allows.
func recordUpTo(ctx context.Context, log *wal.Log, applied uint64, appliedRecord *walshipv1.EpochRecord) (*walshipv1.EpochRecord, error) {
	rec, last := appliedRecord, log.LastLSN()
	if applied >= last {
		return rec, nil
	}
	if first := log.FirstReadableLSN(); first > applied+1 {
		return nil, fmt.Errorf("read the log after LSN %d for its epoch records: it begins at LSN %d", applied, first)
	}
	r, err := log.NewReader(applied+1, false)
	if err != nil {
		return nil, fmt.Errorf("read the log after LSN %d for its epoch records: %w", applied, err)
	}
	defer r.Close()
	for {
		e, err := r.Next(ctx)
		if err != nil {
			return nil, fmt.Errorf("read the log after LSN %d for its epoch records: %w", applied, err)
		}
		var env walshipv1.WalBatch
		var b codec.Batch
		if err := envelope.DecodeStored(e.Data, &env, &b); err != nil {
			return nil, fmt.Errorf("the log's batch %d..%d: %w", e.FirstLSN, e.LastLSN, err)
		}
		if found := epochRecordIn(&b); found != nil && e.LastLSN > applied {
			rec = found
		}
		if e.LastLSN >= last {
			return rec, nil
		}
	}
}

// mayOpen is nil if this node may open the promotion p once caught up,
// its log's newest epoch record now rec; else why not.
//
// The donor's configuration may be newer than every one p judged by: a
// member removed while it was down still finds itself in its own log.
// The log's newest record decides, before anything of the new epoch is
// saved (a history with it would make this node restart as that epoch's
// primary). The promises p took stay. They are safe: each fenced node
// promised an epoch that never opens — no entry of it exists, no history
// holds it — and the next promotion fences the one after it, which they
// grant; a promise only refuses older epochs (I1, I4), and the old
// primary was deposed by the log store majority anyway. They cost
// liveness: their holders name this node as the newest epoch's primary,
// so the next promotion takes it for the replaced primary, and the real
// old primary stays among the members whose promises the quorum needs
// (N−k+1 of the others): until it answers, a failover can be refused.
func mayOpen(id string, p *plan, rec *walshipv1.EpochRecord) error {
	if err := leads(id, rec); err != nil {
		return fmt.Errorf("gave up epoch %d once caught up from %s, before opening it: %w", p.epoch, p.donor.id, err)
	}
	// A log that held no contract record was judged by --peers (contract),
	// which says nothing of who counts: judge the promises again under the
	// contract the log holds now. A log that held one was judged under it,
	// and every newer contract that opened is held by a node of each of
	// its promotion quorums (services/primary epochChangeWait), which
	// reported it.
	if err := fencedEachLogStoreHalf(rec.GetContract(), p.answers); err != nil {
		return fmt.Errorf("gave up epoch %d once caught up from %s, before opening it: %w", p.epoch, p.donor.id, err)
	}
	if p.record == nil && rec != nil && !p.forced {
		if v, _ := judgeReplacing([]*walshipv1.Contract{rec.GetContract()}, p.prev, p.answers, promised); !v.quorum {
			return fmt.Errorf("gave up epoch %d once caught up from %s, before opening it: this node's log held no contract when it judged the promotion by --peers; "+
				"the contract now in its log (epoch %d: %s) needs %s. Granted: %s",
				p.epoch, p.donor.id, rec.GetEpoch(), describeMembers(rec.GetContract()), v.needed, strings.Join(v.granted, ", "))
		}
	}
	return nil
}

// fencedEachLogStoreHalf is nil if answers hold promises of this epoch
// from a majority of every log store set of contract c (its own and,
// while a change is in progress, the one it goes to); else why not.
//
// The old primary's lease and, under log store sync, its acks need a
// majority of each log store set of the newest contract in its log. A
// candidate fences the log stores of its flags and of its own log's
// contract, which may predate a log store change the donor's log holds:
// when no member's answer is needed (log store sync, or k = 0) none may
// have told it of the change. Once caught up, its log holds the change:
// if its promises do not include a majority of each set, the old primary
// may still renew its lease, and acknowledge, through log stores this
// candidate never fenced, so it does not open. A forced promotion too:
// --force waives members' votes, never the log store majority.
//
// Only a contract a run-time change wrote (members_changed, or joint)
// binds the log stores: before one, a primary leases and acknowledges
// through its --logstore, which a restored cluster, say, changes under
// an old contract, and a candidate fences its own --logstore too.
func fencedEachLogStoreHalf(c *walshipv1.Contract, answers []answer) error {
	if !failover.SetByChange(c) {
		return nil
	}
	for _, set := range [][]string{c.GetLogstores(), c.GetNext().GetLogstores()} {
		if len(set) == 0 {
			continue
		}
		var granted []string
		for _, a := range answers {
			if a.logstore && promised(a) && slices.Contains(set, a.id) {
				granted = append(granted, a.id)
			}
		}
		if need := failover.Majority(len(set)); len(granted) < need {
			return fmt.Errorf("the contract now in its log names log stores %s, and only %d of them (%s) promised this epoch; a majority (%d) of each set must, or the primary it replaces may still hold its lease through the others",
				strings.Join(set, ", "), len(granted), strings.Join(granted, ", "), need)
		}
	}
	return nil
}

// keepDonorHistory is err, after saving hist, the donor's history, cut at
// last, as the history of this node's log: a promotion that stops after
// copying from its donor keeps what it copied, as a replica catching up
// from it would, and its history must say which epochs that is, or the
// next primary finds it diverged and it cuts committed entries into an
// orphan file.
func (n *Node) keepDonorHistory(hist datadir.History, last uint64, err error) error {
	if serr := datadir.SaveHistory(n.fs, n.cfg.DataDir, hist.Cut(last)); serr != nil {
		return errors.Join(err, serr)
	}
	return err
}

// donorPatience is how long a catch-up keeps retrying a donor that is
// unreachable: a node that answered the survey may be restarting its
// server as it changes role (a superseded candidate that now follows the
// newer one), which takes milliseconds.
const donorPatience = 5 * time.Second

// copyFromRetrying is copyFrom, resumed from the log's end after an
// UNAVAILABLE (the donor unreachable, or its stream cut) until
// donorPatience has passed without progress.
func copyFromRetrying(ctx context.Context, d serve.Dialer, addr string, logstore bool, log *wal.Log, last, epoch, opening uint64, cluster string, note func(*codec.Batch)) (records, bytes uint64, err error) {
	var bo backoff.Backoff
	since := time.Now()
	for {
		before := log.LastLSN()
		r, b, e, err := copyFrom(ctx, d, addr, logstore, log, last, epoch, opening, cluster, note)
		records, bytes, epoch = records+r, bytes+b, e
		if err == nil || status.Code(err) != codes.Unavailable {
			return records, bytes, err
		}
		if log.LastLSN() > before {
			since = time.Now()
		}
		if time.Since(since) > donorPatience || !bo.Wait(ctx) {
			return records, bytes, err
		}
	}
}

// copyFrom reads the batches after log's end up to last from addr (a log
// store if logstore, else a replica serving its log, whose certificate
// must be of that class) and appends them, checked; the donor refuses if
// it is not of cluster (when both know theirs). epoch is
// the epoch of log's newest entry; it returns that of the newest one it
// appended (or epoch). opening is the epoch the promotion opens: a
// batch's epoch must be within datadir.MaxEpochJump of it. note, if not
// nil, sees every batch appended, decoded, in order.
func copyFrom(ctx context.Context, d serve.Dialer, addr string, logstore bool, log *wal.Log, last, epoch, opening uint64, cluster string, note func(*codec.Batch)) (records, bytes, newest uint64, err error) {
	newest = epoch
	conn, err := dial(d, addr, logstore)
	if err != nil {
		return 0, 0, newest, err
	}
	defer conn.Close()
	rctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	from := log.LastLSN() + 1
	stream, err := walshipv1.NewLogStoreServiceClient(conn).Read(rctx, &walshipv1.ReadRequest{FromLsn: from, ToLsn: last, ClusterId: cluster})
	if err != nil {
		return 0, 0, newest, err
	}
	for log.LastLSN() < last {
		m, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			return records, bytes, newest, fmt.Errorf("the donor's log ended at LSN %d, before %d", log.LastLSN(), last)
		}
		if err != nil {
			return records, bytes, newest, err
		}
		b := m.GetBatch()
		if b.GetLastLsn() <= log.LastLSN() {
			continue
		}
		// The check a replica's catch-up runs (I3, I9): CRC, epoch within
		// datadir.MaxEpochJump of the one opened and not older than the
		// log's, continuity, and whole transactions a replica can apply.
		var cb codec.Batch
		if err := failover.CheckDonorBatch(b, log.LastLSN()+1, epoch, opening, datadir.MaxEpochJump, &cb); err != nil {
			return records, bytes, newest, fmt.Errorf("the donor's batch %d..%d: %w", b.GetFirstLsn(), b.GetLastLsn(), err)
		}
		epoch, newest = b.GetEpoch(), b.GetEpoch()
		data, err := envelope.Marshal(b)
		if err != nil {
			return records, bytes, newest, err
		}
		if err := log.Append(wal.Entry{FirstLSN: b.GetFirstLsn(), LastLSN: b.GetLastLsn(), Data: data}); err != nil {
			return records, bytes, newest, err
		}
		if note != nil {
			note(&cb)
		}
		records += b.GetLastLsn() - b.GetFirstLsn() + 1
		bytes += uint64(len(data))
	}
	return records, bytes, newest, nil
}

// epochRecordIn is the last epoch record b puts (nil if none, or if it
// does not decode: the replica's apply will say so).
func epochRecordIn(b *codec.Batch) *walshipv1.EpochRecord {
	var found *walshipv1.EpochRecord
	for _, r := range b.Records {
		if r.Op != codec.OpPut || string(r.Key) != keyspace.EpochRecordKey {
			continue
		}
		rec := &walshipv1.EpochRecord{}
		if proto.Unmarshal(r.Value, rec) == nil {
			found = rec
		}
	}
	return found
}
