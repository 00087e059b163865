package failover

// A deterministic simulation of the failover protocol (issue 35, item 4;
// FoundationDB's and TigerBeetle's simulation testing). Log stores and
// data nodes — replicas, candidates and a primary — exchange messages
// through a simulated network, and every protocol decision is the core's:
// State.Fence, Heartbeat, Entries, Append, Opens and LearnFromLogStores,
// Judge and AckLSN. One seeded scheduler (math/rand/v2, PCG) chooses every
// step: which message is delivered (in any order, after any delay), which
// is dropped or duplicated, which party ticks, crashes (losing what it
// did not persist: the effects model says what is) or restarts, and who
// starts a promotion. After every step the invariants of
// docs/ARCHITECTURE.md, "Failover invariants", that can be checked are;
// once the faults stop, a primary must take writes within a bound
// (liveness: issue 35, item 8).
//
// Everything the model needs beyond the core is the services' glue,
// simplified, and these are its assumptions:
//   - A primary's stream to a follower (Append to a log store, the
//     replication stream to a replica) is in order without duplicates, may
//     lose its tail, and ends at the first refusal (gRPC's; the log store
//     answers a refusal with an error); the primary starts a new one.
//     Other messages (fences, status, copies, dials) are reordered,
//     delayed, dropped and duplicated freely.
//   - A primary finds where a follower's log parts from its own by the
//     follower's last (epoch, LSN) (Kafka's leader-epoch rule) and sends
//     a cut computed from that answer, which the follower carries out only
//     if its log still ends there (a Diverged answer is for the handshake
//     it answers). The core's own rule for a cut (only epochs older than
//     the sender's) does not stop a stale cut from removing entries the
//     sender holds: the seed that showed it cut an acknowledged write.
//   - A candidate fences every party at once (no survey; under
//     LogStoreChange only the log stores its flags and its log name, as
//     services/node does: sim_logstores_test.go), judges with
//     Judge, waits out the lease as services/node's leaseWait does, checks
//     Opens, copies its donor's log, notes its epoch and writes its epoch
//     record. A replica follows the primary its promise names, dials it,
//     asks its log stores who the primary is after three silent dials
//     (a newer epoch's primary, or LearnFromLogStores for its own epoch),
//     and reads what it lacks from a log store (Entries, with no sender).
//   - Time is the step count; a lease is a number of steps, and a log
//     store's echo of a heartbeat counts from when the heartbeat was sent.
//   - Faults: crashes (a party keeps only its persisted State and log;
//     messages to and from it are lost), restarts, partitions of some or
//     all of one party's links, promotions at random and by an elector on
//     a replica whose primary is silent, sometimes two at once, and fences
//     of another cluster.

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"sort"
	"strings"

	"github.com/walship/walship/internal/datadir"
)

// simBug is a test-only mutation of the model: each re-injects a failover
// bug fixed in round 2 (or a rule the protocol depends on) so that a test
// can show that the simulation finds it.
type simBug string

const (
	// bugAckKMinus1: the primary acknowledges with k−1 sync replicas (and
	// a log store majority less one): the ack quorum no longer meets every
	// promotion quorum (I5; quorum.go's AckLSN).
	bugAckKMinus1 simBug = "ack-k-1"
	// bugPromotionNK: a promotion needs N−k members, not N−k+1 (I5).
	bugPromotionNK simBug = "quorum-n-k"
	// bugVoteNotDurable: a granted fence answers before its promise is
	// persisted; a crash forgets it (I1).
	bugVoteNotDurable simBug = "promise-not-persisted"
	// bugLowerEpoch: an acceptor takes an Append stream or heartbeat of an
	// epoch older than its promise (I1; a deposed primary keeps acking).
	bugLowerEpoch simBug = "accept-lower-epoch"
	// bugNoLearn: a replica does not learn the winner of its epoch from a
	// log store majority (no LearnFromLogStores, 5cf0b32): the loser of
	// two promotions of one epoch dials the old primary for ever (item 8).
	bugNoLearn simBug = "no-learn-from-log-stores"
	// bugEntriesNoVote: entries of a newer epoch do not raise the promise
	// (f254bbc, I2).
	bugEntriesNoVote simBug = "entries-keep-the-promise"
	// bugNoLeaseWait: a candidate opens without waiting out the old
	// primary's lease (I7).
	bugNoLeaseWait simBug = "no-lease-wait"
	// bugRefusedBatchStored: a log store stores the batch of a request
	// whose heartbeat it refused as stale (d6b7c3f).
	bugRefusedBatchStored simBug = "refused-batch-stored"
	// bugNoWinnerName: the heartbeat of an epoch's primary does not make
	// a promise of that epoch name it (3d67323, item 7): a node that
	// granted the epoch to a candidate that lost it names two primaries.
	bugNoWinnerName simBug = "heartbeat-keeps-the-loser"
	// bugStoreVouches: a log store's answer to a batch it refused (a gap,
	// an overlap) reports the batch's end as its position: it vouches for
	// what it does not hold (c706685, 34c3f99).
	bugStoreVouches simBug = "log-store-vouches-for-a-refused-batch"
)

var allBugs = []simBug{bugAckKMinus1, bugPromotionNK, bugVoteNotDurable, bugLowerEpoch, bugNoLearn,
	bugEntriesNoVote, bugNoLeaseWait, bugRefusedBatchStored, bugNoWinnerName, bugStoreVouches}

// simConfig is one simulated cluster and its fault budget.
type simConfig struct {
	LogStores, Nodes int
	K                int  // sync replicas (at flush)
	LogStoreSync     bool // commits wait for a log store majority
	Lease            int64
	FaultSteps       int // steps with faults
	LiveBound        int // steps after the faults stop within which a write must be acknowledged
	Bug              simBug
	// Strict: the operator never promotes again while a primary is up.
	Strict bool
	// Scripted: a test set the cluster up; no party is killed when the
	// faults stop.
	Scripted bool
	// Reconfig: the primary changes the members at run time through
	// joint contract records (sim_members_test.go); Members is how many
	// of the nodes are members at first (the others follow, counting for
	// nothing).
	Reconfig bool
	Members  int
	// EpochStartChange: a new primary's epoch record sometimes carries
	// members of its own (its --peers: one node more or less), as
	// services/node does today; with bugOneStepEpochStart in one step,
	// else as a joint record that it finishes once acknowledged.
	EpochStartChange bool
	// EpochStartWait: with EpochStartChange, the change is made in one
	// step, as services/primary does, and the primary acknowledges
	// nothing from its epoch record on until enough members of the
	// previous configuration hold the record (epochStartWait) — the
	// services/primary fix, with services/replica reporting the newest
	// record its log holds.
	EpochStartWait bool
	// Rollback: a new primary that finds a change an earlier one began
	// rolls it back half the time (a joint record from C_new back to
	// C_old, then C_old) instead of finishing it.
	Rollback bool
	// MemberConfigsOnly: a log store's fence answer names no
	// configuration, as services/node reads the contract from data
	// nodes' answers only; a candidate knows its own log's and its
	// member answerers' configurations.
	MemberConfigsOnly bool
	// SlowLogStores: the primary feeds the log stores a quarter as often
	// as the replicas, so that they lag (only where no commit waits for
	// them: they would hold every acknowledged write otherwise, and
	// hide a quorum rule's bug behind them).
	SlowLogStores bool
	// LogStoreChange: the primary changes the log store set too
	// (sim_logstores_test.go): adds, removes or replaces one, through a
	// learner stage for the one it adds; SpareLogStores of the LogStores
	// log stores are in no configuration at first.
	LogStoreChange bool
	SpareLogStores int
	// ReplicaAsksContract: a replica asks the log stores of its log's
	// configuration who the primary is, not those of its flags, and
	// learns from a majority of one set (services/replica logStoreSets,
	// State.LearnFromLogStoreSets); without it, what services/replica did
	// before (TestSimLogStoresSeed154153).
	ReplicaAsksContract bool
	// JointWaitsLogStores: the final record of a change that moves log
	// stores waits until a majority of each set holds the joint record,
	// whatever the contract waits for, as services/primary does
	// (waitLogStoreSets; without it: TestSimLogStoreChangeK0).
	JointWaitsLogStores bool
	// SplitPartitions: half the partitions split the parties in two
	// groups at random, every link between them cut.
	SplitPartitions bool
	// KeepOut3: in a cluster of 3 nodes too, the primary of the newest
	// epoch is left down when the faults stop (as with 4 or more), so
	// that the 2 left must promote without it: N−k+1 = 2 of the 2
	// members other than it under K=1, which a candidate gets only if it
	// excludes that primary's promise (TestSimKeepOut3).
	KeepOut3 bool
	// PrevFromOwnPromise: a candidate takes the primary its own promise
	// names for the replaced primary, whose promise does not count, as
	// services/node did before fence answers carried the primary of the
	// log's epoch — after a promotion that fenced and gave up, the
	// candidate that gave up (TestSimGaveUpAfterFencing). Without it, the
	// primary of the newest log epoch its answers hold (their
	// State.PrimaryOfLog), as services/node's replacedPrimary does.
	PrevFromOwnPromise bool
	// PrevLogOnly: a candidate whose answers have no quorum with the
	// replaced primary (prev) excluded gives up there, as services/node
	// did when the replaced primary first came from the answers' log
	// primary. Without it, it judges them again excluding, in turn, each
	// member that has not granted its fence: any one member may be
	// excluded while the primary that acknowledged holds what it did
	// (N−k of the N members meet its k+1 holders), and a member that
	// did not answer is the one whose promise the quorum lacks (-seed 16
	// of TestSimKeepOut3: the primary left down opened an epoch whose
	// entry no one else holds).
	PrevLogOnly bool
}

const strandedAfter = 1000

// simConfigs are the clusters a seed picks from: the contract of the item
// 8 report (sync K at flush), and log store sync.
var simConfigs = []simConfig{
	{LogStores: 3, Nodes: 3, K: 1},
	{LogStores: 3, Nodes: 4, K: 2},
	{LogStores: 3, Nodes: 3, K: 0, LogStoreSync: true},
	{LogStores: 5, Nodes: 3, K: 1, LogStoreSync: true},
}

type ent struct{ Epoch, LSN uint64 }

type role uint8

const (
	roleReplica role = iota
	roleCandidate
	rolePrimary
)

func (r role) String() string { return [...]string{"replica", "candidate", "primary"}[r] }

type kind uint8

const (
	mFence kind = iota
	mFenceResp
	mStream // a primary's request on a follower's stream (Append to a log store, the replication stream to a replica)
	mStreamResp
	mSubscribe // a replica dials the primary
	mStatus    // a replica asks a log store who the primary is
	mStatusResp
	mCopy // a candidate copies its donor's log
	mCopyResp
	mNotPrimary // a node a replica dialed is not the primary: it names the one it knows
)

type msg struct {
	kind     kind
	from, to int
	at       int64 // deliverable from this step
	// mFence, mFenceResp, mStream: the epoch stated; mFence's candidate.
	epoch   uint64
	cand    string
	cluster string
	// answers
	granted, refused, primary bool
	vote                      datadir.Vote
	lastEpoch, lastLSN        uint64
	// mStream
	sid, seq   uint64 // the stream, and the request's place in it
	sent       int64  // when the heartbeat was sent (echoed: the lease)
	batch      []ent
	truncate   bool
	truncAfter uint64
	// truncFor is the follower's last (epoch, LSN) the cut was computed
	// from: a Diverged answer is for the handshake it answers.
	truncFor [2]uint64
	// mFenceResp: the promise before the fence, and how long ago a log
	// store last admitted a primary's request (0: not since it started).
	prior uint64
	since int64
	// mFenceResp: the primary of the newest epoch of the answerer's log
	// (State.PrimaryOfLog), the zero Vote if it knows none.
	logPrimary datadir.Vote
	// mCopyResp
	log   []ent
	round int
	// mFenceResp under Reconfig: the configuration the answerer's log is
	// under (an index in sim.cfgs).
	cfg int
}

// follower is what a primary knows of one follower's stream.
type follower struct {
	on       bool // streaming (log stores always; replicas once they dial)
	known    bool // its position is known
	trunc    bool // its tail must be cut after shared
	shared   uint64
	from     [2]uint64 // its last (epoch, LSN) when trunc was decided
	next     uint64
	matched  uint64
	sid      uint64 // the stream: a refusal ends it, the next starts afresh
	seq      uint64 // last request sent
	replySeq uint64 // last reply taken
	echo     int64  // newest heartbeat time it echoed (log stores: the lease)
	sentAt   int64  // when the last request went
}

// window is how many requests a stream has in flight (flow control); a
// stream silent for staleStream steps is taken for broken and restarted.
const (
	window      = 4
	staleStream = 80
)

// fenceExtra is what leaseWait (services/node) reads of a fence answer.
type fenceExtra struct {
	primary bool // it was a primary when it granted
	since   int64
}

// streamPos is where a follower is in a primary's stream.
type streamPos struct {
	epoch, sid, seq uint64
	broken          bool
}

type candidacy struct {
	epoch uint64
	// prev is the replaced primary, whose promise does not count: the
	// primary of the newest log epoch any answer holds (newestLog),
	// named by an answer of that epoch (its PrimaryOfLog); else — or
	// under PrevFromOwnPromise — ownPrev, the primary the candidate's own
	// promise named when it began.
	prev       string
	ownPrev    string
	newestLog  uint64
	start      int64
	answers    []Answer
	extra      []fenceExtra // by answer: what the lease wait reads
	seen       uint64       // the newest epoch any answer stated before the fence
	votes      []bool       // per party: answered
	planned    bool
	donor      int // party index
	donorLSN   uint64
	donorEpoch uint64
	// cfgs (Reconfig) are the configurations it knows of: its own log's
	// and every answer's; the quorum must hold under each.
	cfgs       []int
	leaseUntil int64
	copying    bool
	copySent   int64
}

type party struct {
	idx  int
	id   string
	ls   bool
	up   bool
	st   State // what it acts on
	dur  State // what it persisted
	log  []ent // persisted before it is acknowledged
	role role
	// replica
	following int
	followEp  uint64 // the epoch following was chosen for
	heard     int64
	dials     int
	askRound  int
	askVotes  []datadir.Vote
	askByID   map[string]datadir.Vote // askVotes by log store
	askFrom   []bool
	seen      uint64 // newest epoch it heard of
	lastFrom  map[int]streamPos
	contact   int64   // a log store: when it last admitted a primary's request (volatile)
	cutOff    []int64 // by party: the link to it is cut until then
	// candidate
	cand *candidacy
	// primary
	epoch uint64
	fol   []follower
	acked uint64
}

// sim is one run: the parties, the network, the ghost state the checks
// read, and the scheduler.
type sim struct {
	cfg     simConfig
	seed    uint64
	rng     *rand.Rand
	now     int64
	steps   int
	ps      []*party
	net     []msg
	calm    bool
	calmAt  int64
	keepOut int // a node left down after the faults stop (-1: none)

	// ghost state
	acked      []uint64          // by LSN−1: the epoch of the write acknowledged there, 0 if none
	opened     map[uint64]string // epoch → the candidate that opened it
	openedAt   map[uint64]int64
	maxOpened  uint64
	votes      []uint64 // per party: the newest persisted promise (I1)
	granted    []uint64 // per party: the newest epoch granted in an answer
	liveFrom   uint64   // after the faults stop: an LSN past every write before
	lived      bool
	trace      []string
	verbose    bool // -sim.trace: keep every event, and the detailed ones
	err        error
	stranded   int   // times the operator promoted again (see operator)
	strandedAt int64 // when it last did
	// refusedNow: the stream request being handled was refused.
	refusedNow bool
	// Reconfig (sim_members_test.go): every configuration written, and
	// the entries that are contract records.
	cfgs []Config
	recs []cfgRec
	// changes counts contract records written: joint, final, and final
	// records a new primary wrote to finish a change it found.
	joints, finals, finished int
	// deadRemoved counts joint records that remove a member that is
	// down at the time.
	deadRemoved int
	// rolledBack counts changes a new primary rolled back (Rollback);
	// decided holds the epochs whose primary chose whether to.
	rolledBack int
	decided    map[uint64]bool
	// refusedLead counts candidates that gave up at opening because
	// their caught-up log's configuration does not name them.
	refusedLead int
	// held counts the primary's ack rounds an epoch start change held
	// back (EpochStartWait).
	held int
	// ls: log store set changes (LogStoreChange).
	ls simLogStores
}

const simCluster = "c1"

func newSim(cfg simConfig, seed uint64) *sim {
	s := &sim{cfg: cfg, seed: seed, rng: rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15)),
		opened: map[uint64]string{}, openedAt: map[uint64]int64{}, keepOut: -1, decided: map[uint64]bool{}}
	n := cfg.LogStores + cfg.Nodes
	for i := range n {
		p := &party{idx: i, up: true, lastFrom: map[int]streamPos{}}
		if i < cfg.LogStores {
			p.id, p.ls = fmt.Sprintf("l%d", i), true
		} else {
			p.id = fmt.Sprintf("n%d", i-cfg.LogStores)
		}
		p.st = State{Vote: datadir.Vote{Epoch: 1, Primary: "n0", Addr: "n0"}, LogEpoch: 1, Cluster: simCluster}
		p.dur = p.st
		p.log = []ent{{1, 1}}
		p.following = cfg.LogStores
		p.cutOff = make([]int64, n)
		s.ps = append(s.ps, p)
	}
	s.votes, s.granted = make([]uint64, n), make([]uint64, n)
	if cfg.Reconfig {
		s.initConfig()
	}
	s.opened[1], s.openedAt[1], s.maxOpened = "n0", 0, 1
	p0 := s.ps[cfg.LogStores]
	s.becomePrimary(p0, 1)
	return s
}

func (s *sim) nodeIdx(id string) int {
	for _, p := range s.ps {
		if p.id == id {
			return p.idx
		}
	}
	return -1
}

func (s *sim) has(b simBug) bool { return s.cfg.Bug == b }

func (s *sim) logf(format string, args ...any) {
	if len(s.trace) >= 200 && !s.verbose {
		s.trace = s.trace[1:]
	}
	s.trace = append(s.trace, fmt.Sprintf("%6d ", s.now)+fmt.Sprintf(format, args...))
}

// tracef is an event only -sim.trace records: acks, fence answers,
// verdicts.
func (s *sim) tracef(format string, args ...any) {
	if s.verbose {
		s.logf(format, args...)
	}
}

func (s *sim) fail(inv, format string, args ...any) {
	if s.err == nil {
		s.err = fmt.Errorf("%s violated at step %d: %s", inv, s.steps, fmt.Sprintf(format, args...))
	}
}

func (s *sim) contract() Contract {
	c := Contract{K: s.cfg.K, LogStoreSync: s.cfg.LogStoreSync}
	for _, p := range s.ps {
		if p.ls {
			c.LogStores = append(c.LogStores, p.id)
		} else {
			c.Members = append(c.Members, p.id)
		}
	}
	return c
}

// send queues m with a delay; under faults it may be dropped or sent twice.
func (s *sim) send(m msg) {
	m.at = s.now + 1
	if s.ps[m.from].cutOff[m.to] > s.now {
		return // a partition
	}
	if !s.calm {
		if s.rng.IntN(100) < 3 {
			return // dropped
		}
		m.at += int64(s.rng.IntN(30))
		if s.rng.IntN(100) < 2 && !m.stream() {
			d := m
			d.at += int64(s.rng.IntN(30))
			s.net = append(s.net, d)
		}
	} else {
		m.at += int64(s.rng.IntN(3))
	}
	s.net = append(s.net, m)
}

// stream reports whether m travels on a stream (gRPC's: in order, no
// duplicates; a loss breaks it).
func (m msg) stream() bool { return m.kind == mStream || m.kind == mStreamResp }

// apply carries out a Step's effects — what a service persists before
// answering — and adopts its next state. Under bugVoteNotDurable a
// fence's promise is not persisted.
func (s *sim) apply(p *party, st Step, fence bool) {
	for _, e := range st.Effects {
		switch e := e.(type) {
		case SaveVote:
			if !(fence && s.has(bugVoteNotDurable)) {
				// The services' saveVote: the log's primary the promise
				// replaces is kept first.
				if kept, ok := p.dur.KeepsLogPrimary(e.Vote); ok {
					p.dur.LogPrimary = kept
				}
				p.dur.Vote = e.Vote
			}
		case AdoptCluster:
			p.dur.Cluster = e.ID
		case NoteEpoch:
			p.dur.LogEpoch = e.Epoch
		case CutAfter:
			s.cut(p, e.LSN)
		}
	}
	p.st = st.Next
	for _, e := range st.Effects {
		if _, ok := e.(CutAfter); ok {
			p.st.LogEpoch = lastEpoch(p.log)
			p.dur.LogEpoch = p.st.LogEpoch
		}
	}
	if !fence || !s.has(bugVoteNotDurable) {
		p.dur.Vote = p.st.Vote
	}
	p.st.LogPrimary = p.dur.LogPrimary
	if p.st.Vote.Epoch > p.seen {
		p.seen = p.st.Vote.Epoch
	}
}

// cut orphans p's log after lsn: I6, what is cut was never acknowledged.
func (s *sim) cut(p *party, lsn uint64) {
	if lsn >= uint64(len(p.log)) {
		return
	}
	for _, e := range p.log[lsn:] {
		if s.ackedAt(e.LSN) == e.Epoch {
			s.fail("I6", "%s cut acknowledged write %d (epoch %d)", p.id, e.LSN, e.Epoch)
		}
	}
	s.logf("%s cuts after %d (had %d)", p.id, lsn, len(p.log))
	p.log = slices.Clone(p.log[:lsn])
}

func (s *sim) ackedAt(lsn uint64) uint64 {
	if lsn == 0 || lsn > uint64(len(s.acked)) {
		return 0
	}
	return s.acked[lsn-1]
}

func lastEpoch(log []ent) uint64 {
	if len(log) == 0 {
		return 0
	}
	return log[len(log)-1].Epoch
}

func (p *party) last() (uint64, uint64) { return lastEpoch(p.log), uint64(len(p.log)) }

// appendLog writes entries that follow p's log (I3 is checked here).
// sender is the epoch of the primary that sent them (0: copied, or its
// own): I1, no batch of a sender older than the promise is stored.
func (s *sim) appendLog(p *party, es []ent, sender uint64) {
	if sender != 0 && sender < p.st.Vote.Epoch {
		s.fail("I1", "%s stores a batch of a sender of epoch %d after promising %d", p.id, sender, p.st.Vote.Epoch)
	}
	for _, e := range es {
		if e.LSN != uint64(len(p.log))+1 {
			s.fail("model", "%s writes LSN %d after %d", p.id, e.LSN, len(p.log))
			return
		}
		if e.Epoch < lastEpoch(p.log) {
			s.fail("I3", "%s writes epoch %d after epoch %d", p.id, e.Epoch, lastEpoch(p.log))
		}
		if e.Epoch > p.dur.LogEpoch {
			s.fail("I3", "%s writes epoch %d before its history notes it (%d)", p.id, e.Epoch, p.dur.LogEpoch)
		}
		p.log = append(p.log, e)
	}
}

// sharedUpTo is where a follower whose log ends at (epoch, lsn) parts
// from log: the end of log's entries of epochs up to epoch (Kafka's
// leader-epoch rule), one back if that does not settle it.
func sharedUpTo(log []ent, epoch, lsn uint64) uint64 {
	if lsn == 0 {
		return 0
	}
	if lsn <= uint64(len(log)) && log[lsn-1].Epoch == epoch {
		return lsn
	}
	n := uint64(sort.Search(len(log), func(i int) bool { return log[i].Epoch > epoch }))
	if n >= lsn {
		n = lsn - 1
	}
	return n
}

// --- the primary ----------------------------------------------------------

func (s *sim) becomePrimary(p *party, epoch uint64) {
	p.role, p.epoch, p.cand = rolePrimary, epoch, nil
	p.fol = make([]follower, len(s.ps))
	for i := range s.cfg.LogStores {
		p.fol[i].on = true
	}
	if s.cfg.LogStoreChange {
		s.shipLogStores(p)
	}
	p.acked = 0
	s.logf("%s opens epoch %d at LSN %d", p.id, epoch, len(p.log))
}

func (s *sim) leaseValid(p *party) bool {
	if s.cfg.Reconfig {
		return s.leaseValidHalves(p)
	}
	n := 0
	for i := range s.cfg.LogStores {
		if p.fol[i].echo > 0 && p.fol[i].echo > s.now-s.cfg.Lease {
			n++
		}
	}
	return n >= Majority(s.cfg.LogStores)
}

// primaryTick: maybe take a write, then send every follower its next
// request.
func (s *sim) primaryTick(p *party) {
	if s.cfg.Reconfig && s.leaseValid(p) {
		s.changeMembers(p)
	}
	if s.cfg.LogStoreChange {
		s.shipLogStores(p)
	}
	if s.leaseValid(p) && s.rng.IntN(3) == 0 {
		e := ent{p.epoch, uint64(len(p.log)) + 1}
		s.appendLog(p, []ent{e}, p.epoch)
	}
	for i := range p.fol {
		f := &p.fol[i]
		if !f.on || i == p.idx {
			continue
		}
		if s.cfg.SlowLogStores && s.ps[i].ls && f.known && s.rng.IntN(4) != 0 {
			continue // a log store that lags (its acks gate no commit)
		}
		if f.seq != f.replySeq && s.now-f.sentAt >= staleStream {
			f.replySeq, f.known = f.seq, false // the stream broke: start over
			f.sid++
		}
		idle := f.known && !f.trunc && f.next > uint64(len(p.log))
		if f.seq-f.replySeq >= window || ((idle || f.trunc) && f.seq != f.replySeq) {
			continue // enough on its way (a heartbeat, if nothing is new)
		}
		for range 1 + s.rng.IntN(window-int(f.seq-f.replySeq)) {
			m := msg{kind: mStream, from: p.idx, to: i, epoch: p.epoch, cand: p.id, cluster: simCluster, sent: s.now}
			switch {
			case !f.known:
			case f.trunc:
				m.truncate, m.truncAfter, m.truncFor = true, f.shared, f.from
			case f.next <= uint64(len(p.log)):
				m.batch = []ent{p.log[f.next-1]}
				if !s.ps[i].ls {
					end := min(uint64(len(p.log)), f.next+3)
					m.batch = slices.Clone(p.log[f.next-1 : end])
				}
				f.next += uint64(len(m.batch))
			}
			f.seq++
			m.sid, m.seq, f.sentAt = f.sid, f.seq, s.now
			s.send(m)
			if !f.known || f.trunc || f.next > uint64(len(p.log)) {
				break
			}
		}
	}
}

func (s *sim) primaryReply(p *party, m msg) {
	f := &p.fol[m.from]
	if m.epoch != p.epoch || m.sid != f.sid || m.seq <= f.replySeq {
		return // a reply to an older stream, or out of order
	}
	f.replySeq = m.seq
	if m.refused && m.vote.Epoch > p.epoch {
		if s.ps[m.from].ls {
			// A log store's newer promise deposes the primary
			// (services/primary, logship); a replica's only ends its
			// stream.
			s.stepDown(p, m.vote)
			return
		}
		f.on = false
		return
	}
	if m.refused {
		// The refusal ended the stream: what was sent after it is void.
		f.sid++
		f.replySeq = f.seq
	}
	if !m.refused && m.vote.Epoch <= p.epoch && m.sent > f.echo { // its heartbeat was taken
		// Only an answer that took the request echoes its heartbeat: a
		// refused one (a gap, an overlap) noted no contact at the log
		// store (logStoreAppend), whose fence answer then tells a
		// candidate that the lease ran out; in services/primary a
		// refusal is the stream's error and renews no lease.
		f.echo = m.sent
	}
	if !m.refused && m.vote.Epoch == p.epoch && m.vote.Primary != p.id {
		// I4: the heartbeat of an epoch's primary makes a promise of that
		// epoch name it: no node names two primaries for one epoch.
		s.fail("I4", "%s took the heartbeat of %s, primary of epoch %d, and names %s", s.ps[m.from].id, p.id, p.epoch, m.vote.Primary)
	}
	f.known = true
	sh := sharedUpTo(p.log, m.lastEpoch, m.lastLSN)
	if sh < m.lastLSN {
		f.trunc, f.shared, f.from = true, sh, [2]uint64{m.lastEpoch, m.lastLSN}
		f.next = sh + 1
		return
	}
	f.trunc = false
	f.matched = m.lastLSN // its log is this one's up to there
	if m.refused {
		f.next = m.lastLSN + 1 // resend from its end
	} else {
		f.next = max(f.next, m.lastLSN+1)
	}
	s.primaryAck(p)
}

// primaryAck: the commit rule (AckLSN over the sync replicas; a log store
// majority under log store sync), and only while the lease holds (I7).
func (s *sim) primaryAck(p *party) {
	if !s.leaseValid(p) {
		return
	}
	ack := uint64(len(p.log))
	k := s.cfg.K
	if s.has(bugAckKMinus1) {
		k--
	}
	if s.cfg.Reconfig {
		ack = s.jointAck(p)
		if lsn, ok := s.epochStartWait(p); ok {
			ack = min(ack, lsn-1)
			s.held++
		}
	} else if s.cfg.K > 0 {
		var pos []uint64
		for i := s.cfg.LogStores; i < len(s.ps); i++ {
			if i != p.idx && p.fol[i].on {
				pos = append(pos, p.fol[i].matched)
			}
		}
		if k > 0 {
			ack = min(ack, AckLSN(pos, k))
		}
	}
	if s.cfg.LogStoreSync && !s.cfg.Reconfig {
		var pos []uint64
		for i := range s.cfg.LogStores {
			pos = append(pos, p.fol[i].matched)
		}
		need := Majority(s.cfg.LogStores)
		if s.has(bugAckKMinus1) {
			need--
		}
		if need > 0 {
			ack = min(ack, AckLSN(pos, need))
		}
	}
	if ack > p.acked {
		s.tracef("%s (epoch %d) acknowledges up to LSN %d", p.id, p.epoch, ack)
	}
	for ; p.acked < ack; p.acked++ {
		e := p.log[p.acked]
		if e.Epoch != p.epoch {
			continue // acknowledged by an older primary, or never
		}
		if s.maxOpened > p.epoch {
			s.fail("I7", "%s (epoch %d) acknowledges LSN %d after epoch %d opened", p.id, p.epoch, e.LSN, s.maxOpened)
		}
		if s.cfg.K == 0 && !s.cfg.LogStoreSync {
			// The contract waits for nobody: an ack promises nothing a
			// failover keeps (I5, I6 say nothing); the lease (I7) holds.
			if s.calm && e.LSN >= s.liveFrom {
				s.lived = true
			}
			continue
		}
		if ep := s.ackedAt(e.LSN); ep != 0 && ep != e.Epoch {
			s.fail("I5", "%s acknowledges LSN %d of epoch %d; LSN %d of epoch %d was acknowledged", p.id, e.LSN, e.Epoch, e.LSN, ep)
		}
		for uint64(len(s.acked)) < e.LSN {
			s.acked = append(s.acked, 0)
		}
		s.acked[e.LSN-1] = e.Epoch
		if s.calm && e.LSN >= s.liveFrom {
			s.lived = true
		}
	}
}

func (s *sim) stepDown(p *party, v datadir.Vote) {
	s.logf("%s steps down from epoch %d (%s holds %d)", p.id, p.epoch, v.Primary, v.Epoch)
	p.role, p.fol, p.epoch = roleReplica, nil, 0
	// It has seen the epoch that deposed it: a promotion of its own
	// picks a newer one (services/primary saves that promise as it
	// steps down; services/node's survey sees it too).
	p.seen = max(p.seen, v.Epoch)
	p.heard = s.now
	if i := s.nodeIdx(v.Primary); i >= 0 && i != p.idx {
		p.following = i
	}
}

// forgetLearning undoes a heartbeat's correction of the primary its
// promise of the same epoch names, if it names one (bugNoWinnerName; a
// promise that named none learnt it before 3d67323 too).
func forgetLearning(st *Step, cur datadir.Vote) {
	if st.Next.Vote.Epoch == cur.Epoch && cur.Primary != "" {
		st.Effects = slices.DeleteFunc(st.Effects, func(e Effect) bool { _, ok := e.(SaveVote); return ok })
		st.Next.Vote = cur
	}
}

// --- the acceptors ---------------------------------------------------------

func (s *sim) answerFence(p *party, m msg) {
	before := p.st
	st := p.st.Fence(Fence{Epoch: m.epoch, Candidate: m.cand, Addr: m.cand, Cluster: m.cluster})
	if m.cluster != simCluster {
		if st.Granted || len(st.Effects) > 0 {
			s.fail("I8", "%s changed by a fence of cluster %q: %+v", p.id, m.cluster, st)
		}
		if p.st != before {
			s.fail("I8", "%s changed by a fence of cluster %q", p.id, m.cluster)
		}
		return
	}
	wasPrimary, prior := p.role == rolePrimary, p.st.Known()
	if st.Refused == nil {
		s.apply(p, st, true)
	}
	le, ll := p.last()
	r := msg{kind: mFenceResp, from: p.idx, to: m.from, epoch: m.epoch, granted: st.Granted, vote: p.st.Vote,
		lastEpoch: le, lastLSN: ll, primary: wasPrimary, prior: prior, logPrimary: p.st.PrimaryOfLog()}
	if s.cfg.Reconfig {
		r.cfg = s.cfgOf(p.log)
	}
	if p.ls && p.contact > 0 {
		r.since = s.now - p.contact
	}
	if st.Granted {
		s.granted[p.idx] = max(s.granted[p.idx], m.epoch)
		if wasPrimary && m.epoch > p.epoch {
			s.stepDown(p, p.st.Vote)
		}
		if !p.ls && p.role == roleReplica {
			if i := s.nodeIdx(m.cand); i >= 0 && i != p.idx {
				p.following = i
			}
		}
	}
	s.send(r)
}

// logStoreAppend is a log store's Append handler: the core decides, the
// store persists the effects and the batch, then answers.
func (s *sim) logStoreAppend(p *party, m msg) {
	le, ll := p.last()
	a := Append{Sender: 0, HB: &Heartbeat{Epoch: m.epoch, Primary: m.cand, Addr: m.cand, Cluster: m.cluster}, Last: ll}
	if m.truncate && m.truncFor == [2]uint64{le, ll} {
		a.Truncate, a.TruncateAfter = true, m.truncAfter
	}
	var b *ent
	if len(m.batch) > 0 {
		b = &m.batch[0]
		a.Batch = &Entry{Epoch: b.Epoch, FirstLSN: b.LSN, LastLSN: b.LSN}
		if b.LSN <= ll && p.log[b.LSN-1].Epoch != b.Epoch {
			a.Differs = "another epoch"
		}
	}
	st := p.st
	if s.has(bugLowerEpoch) && m.epoch < st.Vote.Epoch {
		st.Vote.Epoch = m.epoch
	}
	as := st.Append(a)
	if as.Refused != nil && s.has(bugLowerEpoch) {
		as.Next = p.st
	}
	r := msg{kind: mStreamResp, from: p.idx, to: m.from, epoch: m.epoch, sid: m.sid, seq: m.seq, sent: m.sent}
	if as.Refused != nil {
		if s.has(bugRefusedBatchStored) && as.Refused.Reason == StaleEpoch && b != nil && b.LSN == ll+1 && b.Epoch >= le {
			s.appendLog(p, []ent{*b}, m.epoch)
		}
		r.refused, r.vote, s.refusedNow = true, p.st.Vote, true
		r.lastEpoch, r.lastLSN = p.last()
		if s.has(bugStoreVouches) && b != nil && (as.Refused.Reason == Gap || as.Refused.Reason == Overlap) {
			r.lastEpoch, r.lastLSN = b.Epoch, b.LSN // its position, as if it held the batch
		}
		s.send(r)
		return
	}
	if s.has(bugLowerEpoch) {
		as.Next.Vote = maxVote(p.st.Vote, as.Next.Vote)
	}
	if s.has(bugNoWinnerName) {
		forgetLearning(&as.Step, p.st.Vote)
	}
	s.apply(p, as.Step, false)
	p.contact = s.now
	if as.Store {
		p.st.LogEpoch = max(p.st.LogEpoch, b.Epoch)
		s.appendLog(p, []ent{*b}, m.epoch)
	}
	r.vote = p.st.Vote
	r.lastEpoch, r.lastLSN = p.last()
	s.send(r)
}

func maxVote(a, b datadir.Vote) datadir.Vote {
	if b.Epoch > a.Epoch {
		return b
	}
	return a
}

// replicaStream is a replica's side of the replication stream: the
// primary's heartbeat (Heartbeat), a cut of a divergent tail, and entries
// (Entries), each decided by the core.
func (s *sim) replicaStream(p *party, m msg) {
	if p.role != roleReplica && !(p.role == roleCandidate && !p.cand.planned) {
		return // a candidate past its quorum, or a primary, takes no stream
	}
	r := msg{kind: mStreamResp, from: p.idx, to: m.from, epoch: m.epoch, sid: m.sid, seq: m.seq, sent: m.sent}
	reply := func(refused bool) {
		r.refused, r.vote, s.refusedNow = refused, p.st.Vote, refused
		r.lastEpoch, r.lastLSN = p.last()
		s.send(r)
	}
	st := p.st
	if s.has(bugLowerEpoch) && m.epoch < st.Vote.Epoch {
		st.Vote.Epoch = m.epoch
	}
	hs := st.Heartbeat(Heartbeat{Epoch: m.epoch, Primary: m.cand, Addr: m.cand, Cluster: m.cluster})
	if hs.Refused != nil {
		reply(true)
		return
	}
	if s.has(bugLowerEpoch) {
		hs.Next.Vote = maxVote(p.st.Vote, hs.Next.Vote)
	}
	if s.has(bugNoWinnerName) {
		forgetLearning(&hs, p.st.Vote)
	}
	s.apply(p, hs, false)
	p.heard, p.dials, p.following = s.now, 0, m.from
	if le, ll := p.last(); m.truncate && m.truncFor == [2]uint64{le, ll} && m.truncAfter < ll {
		if p.st.LogEpoch >= m.epoch {
			reply(true)
			return
		}
		s.apply(p, Step{Effects: []Effect{CutAfter{LSN: m.truncAfter}}, Next: p.st}, false)
	}
	es := m.batch
	for len(es) > 0 && es[0].LSN <= uint64(len(p.log)) {
		if p.log[es[0].LSN-1].Epoch != es[0].Epoch {
			reply(true)
			return
		}
		es = es[1:]
	}
	if len(es) == 0 {
		reply(false)
		return
	}
	if es[0].LSN != uint64(len(p.log))+1 || es[0].Epoch < p.st.LogEpoch {
		reply(true)
		return
	}
	var in []Entry
	for _, e := range es {
		in = append(in, Entry{Epoch: e.Epoch, FirstLSN: e.LSN, LastLSN: e.LSN})
	}
	est := p.st.Entries(m.epoch, in)
	if est.Refused != nil {
		reply(true)
		return
	}
	if s.has(bugEntriesNoVote) {
		est.Effects = slices.DeleteFunc(est.Effects, func(e Effect) bool { _, ok := e.(SaveVote); return ok })
		est.Next.Vote = p.st.Vote
	}
	s.apply(p, est, false)
	s.appendLog(p, es, m.epoch)
	reply(false)
}

// --- replicas: dialing and learning -----------------------------------------

const dialPeriod = 20

func (s *sim) replicaTick(p *party) {
	if s.now-p.heard < dialPeriod<<min(p.dials, 3) { // backing off
		return
	}
	p.heard = s.now
	if i := s.nodeIdx(p.st.Vote.Primary); i >= 0 && i != p.idx && p.st.Vote.Epoch >= p.followEp {
		p.following = i // the primary its promise names
	}
	if p.following >= 0 && p.following != p.idx {
		s.send(msg{kind: mSubscribe, from: p.idx, to: p.following})
	}
	p.dials++
	if !s.calm && p.dials >= 2 && s.rng.IntN(4) == 0 {
		// An automatic failover's elector: the primary is silent, promote.
		s.promote(p)
		return
	}
	if p.dials%3 == 0 {
		// The replica asks its log stores who the primary is.
		p.askRound++
		p.askVotes, p.askByID, p.askFrom = nil, map[string]datadir.Vote{}, make([]bool, s.cfg.LogStores)
		ls := s.replicaLogStores(p)
		for _, i := range ls {
			s.send(msg{kind: mStatus, from: p.idx, to: i, round: p.askRound})
		}
		// And reads what it lacks from one of them (the ladder's log
		// store rung): entries that come without their primary.
		s.send(msg{kind: mCopy, from: p.idx, to: ls[s.rng.IntN(len(ls))], round: p.askRound})
	}
}

// replicaLogStores are the log stores replica p asks who the primary is
// and reads from: every one, or under LogStoreChange those of its flags
// (services/replica: Config.LogStores), the first configuration's — or,
// with ReplicaAsksContract, those of its log's configuration, both halves
// while joint, learners not (services/replica logStoreSets).
func (s *sim) replicaLogStores(p *party) []int {
	var set []string
	switch {
	case s.cfg.ReplicaAsksContract:
		set = slices.Concat(s.replicaLogStoreSets(p)...)
	case s.cfg.LogStoreChange:
		set = s.cfgs[0].Old.LogStores
	}
	var out []int
	for i := range s.cfg.LogStores {
		if set == nil || slices.Contains(set, s.ps[i].id) {
			out = append(out, i)
		}
	}
	return out
}

// replicaLogStoreSets are, with ReplicaAsksContract, the log store sets
// of p's log's configuration, each counted alone when p learns from them
// (State.LearnFromLogStoreSets): C_old's and, while joint, C_new's.
func (s *sim) replicaLogStoreSets(p *party) [][]string {
	c := s.cfgs[s.cfgOf(p.log)]
	sets := [][]string{c.Old.LogStores}
	if c.Joint && !slices.Equal(slices.Sorted(slices.Values(c.New.LogStores)), slices.Sorted(slices.Values(c.Old.LogStores))) {
		sets = append(sets, c.New.LogStores)
	}
	return sets
}

func (s *sim) statusResp(p *party, m msg) {
	if m.round != p.askRound || p.askFrom == nil || p.askFrom[m.from] || p.role != roleReplica {
		return
	}
	p.askFrom[m.from] = true
	v := m.vote
	p.askVotes = append(p.askVotes, v)
	p.askByID[s.ps[m.from].id] = v
	if v.Epoch > p.st.Vote.Epoch && v.Primary != "" {
		if i := s.nodeIdx(v.Primary); i >= 0 && i != p.idx {
			p.following, p.followEp = i, v.Epoch // a newer epoch's primary: follow it, its heartbeat raises the promise
		}
		return
	}
	if v.Epoch == p.st.Vote.Epoch && p.st.Vote.Primary == "" && learns(p.st.Vote, v) != "" {
		// The primary of the epoch promised, which the promise names not.
		s.learnPrimary(p, v)
		return
	}
	if s.has(bugNoLearn) {
		return
	}
	w, why := p.st.LearnFromLogStores(p.askVotes, len(s.replicaLogStores(p)))
	if s.cfg.ReplicaAsksContract {
		w, why = p.st.LearnFromLogStoreSets(s.replicaLogStoreSets(p), p.askByID)
	}
	if why != "" {
		next := p.st
		next.Vote = w
		s.apply(p, Step{Effects: []Effect{SaveVote{Vote: w, Why: why}}, Next: next}, false)
		if i := s.nodeIdx(w.Primary); i >= 0 && i != p.idx {
			p.following = i
		}
		s.logf("%s learns %s is the primary of epoch %d", p.id, w.Primary, w.Epoch)
	}
}

// learnPrimary is the replica's rule for a NotPrimary answer naming v
// (services/replica, learnPrimary): a newer epoch's primary is followed; a
// primary of the epoch promised, other than the one it follows, is
// learnt (the heartbeat's rule, learns) and followed.
func (s *sim) learnPrimary(p *party, v datadir.Vote) {
	i := s.nodeIdx(v.Primary)
	if p.role != roleReplica || i < 0 || i == p.idx {
		return
	}
	switch {
	case v.Epoch > p.st.Vote.Epoch:
		p.following, p.followEp = i, v.Epoch
	case v.Epoch == p.st.Vote.Epoch && i != p.following:
		if why := learns(p.st.Vote, v); why != "" {
			next := p.st
			next.Vote = v
			s.apply(p, Step{Effects: []Effect{SaveVote{Vote: v, Why: why}}, Next: next}, false)
		}
		p.following, p.followEp = i, v.Epoch
	}
}

// catchUp appends what a log store holds beyond p's log, if p's log is a
// prefix of it: Entries decides (a newer epoch raises the promise, I2).
func (s *sim) catchUp(p *party, from []ent) {
	le, ll := p.last()
	if ll >= uint64(len(from)) || (ll > 0 && from[ll-1].Epoch != le) {
		return
	}
	rest := from[ll:min(len(from), int(ll)+16)]
	if rest[0].Epoch < p.st.LogEpoch {
		return
	}
	var in []Entry
	for _, e := range rest {
		in = append(in, Entry{Epoch: e.Epoch, FirstLSN: e.LSN, LastLSN: e.LSN})
	}
	st := p.st.Entries(0, in)
	if st.Refused != nil {
		return
	}
	if s.has(bugEntriesNoVote) {
		st.Effects = slices.DeleteFunc(st.Effects, func(e Effect) bool { _, ok := e.(SaveVote); return ok })
		st.Next.Vote = p.st.Vote
	}
	s.apply(p, st, false)
	s.appendLog(p, rest, 0)
}

// --- candidates ------------------------------------------------------------

// promote starts a promotion at p: it fences itself, then every party.
func (s *sim) promote(p *party) {
	if s.cfg.Reconfig && !s.leads(p) {
		return // not a member of every half its log knows: it may not lead
	}
	epoch, err := datadir.NextEpoch(max(p.seen, p.st.Known()))
	if err != nil {
		return
	}
	prev := p.st.Vote.Primary
	st := p.st.Fence(Fence{Epoch: epoch, Candidate: p.id, Addr: p.id, Cluster: simCluster})
	if !st.Granted {
		return
	}
	s.apply(p, st, true)
	s.granted[p.idx] = max(s.granted[p.idx], epoch)
	le, ll := p.last()
	c := &candidacy{epoch: epoch, prev: prev, ownPrev: prev, start: s.now, votes: make([]bool, len(s.ps)), seen: max(p.seen, p.st.Known())}
	c.learnPrev(le, p.st.PrimaryOfLog(), s.cfg.PrevFromOwnPromise)
	c.answers = append(c.answers, Answer{ID: p.id, LastEpoch: le, LastLSN: ll})
	c.extra = append(c.extra, fenceExtra{})
	c.votes[p.idx] = true
	p.role, p.cand = roleCandidate, c
	if s.cfg.Reconfig {
		c.cfgs = []int{s.cfgOf(p.log)}
	}
	s.logf("%s promotes to epoch %d (prev %s, log %d@%d)", p.id, epoch, prev, ll, le)
	var fenced []string
	if s.cfg.LogStoreChange {
		fenced = s.fencedLogStores(p)
	}
	for _, q := range s.ps {
		if q.ls && fenced != nil && !slices.Contains(fenced, q.id) {
			continue // a log store neither its flags nor its log's contract name
		}
		if q != p {
			s.send(msg{kind: mFence, from: p.idx, to: q.idx, epoch: epoch, cand: p.id, cluster: simCluster})
		}
	}
}

func (s *sim) fenceResp(p *party, m msg) {
	if m.vote.Epoch > p.seen {
		p.seen = m.vote.Epoch
	}
	c := p.cand
	if p.role != roleCandidate || m.epoch != c.epoch || c.votes[m.from] || c.planned {
		return
	}
	c.votes[m.from] = true
	c.seen = max(c.seen, m.prior, m.lastEpoch)
	c.learnPrev(m.lastEpoch, m.logPrimary, s.cfg.PrevFromOwnPromise)
	if s.cfg.Reconfig {
		s.tracef("%s: fence answer of %s: granted %v, log %d@%d under %s", p.id, s.ps[m.from].id, m.granted, m.lastLSN, m.lastEpoch, s.cfgString(m.cfg))
	}
	if s.cfg.Reconfig && !slices.Contains(c.cfgs, m.cfg) && !(s.ps[m.from].ls && s.cfg.MemberConfigsOnly) {
		c.cfgs = append(c.cfgs, m.cfg) // refused or not, it knows that configuration
	}
	if !m.granted {
		return
	}
	q := s.ps[m.from]
	c.answers = append(c.answers, Answer{ID: q.id, LogStore: q.ls, LastEpoch: m.lastEpoch, LastLSN: m.lastLSN})
	c.extra = append(c.extra, fenceExtra{primary: m.primary, since: m.since})
	var v Verdict
	if s.cfg.Reconfig {
		var ok bool
		if v, ok = s.judgeKnown(c); !ok {
			return
		}
	} else {
		ct := s.contract()
		if s.has(bugPromotionNK) && ct.K > 0 && !ct.LogStoreSync {
			ct.K++
		}
		v = Judge(ct, c.prev, c.answers, c.answers)
		if !v.Quorum && !s.cfg.PrevLogOnly {
			v = s.judgeExcludingAbsent(c, ct, v)
		}
	}
	if !v.Quorum {
		return
	}
	d := c.answers[v.Donor]
	c.planned, c.donor, c.donorLSN, c.donorEpoch = true, s.nodeIdx(d.ID), d.LastLSN, d.LastEpoch
	wait := s.leaseWait(c)
	c.leaseUntil = s.now + wait
	s.logf("%s won epoch %d: donor %s (%d@%d), lease wait %d", p.id, c.epoch, d.ID, d.LastLSN, d.LastEpoch, wait)
}

// judgeExcludingAbsent judges c's answers under ct again, excluding in
// turn each member that has not granted the fence instead of c.prev, and
// returns the first verdict with a quorum (c.prev then names the member
// excluded), else v: the quorum meets every ack quorum whichever one
// member it excludes, so long as the primary that acknowledged holds its
// writes (services/node judgeExcludingAbsent).
func (s *sim) judgeExcludingAbsent(c *candidacy, ct Contract, v Verdict) Verdict {
	if !c.prevHolds() {
		return v
	}
	for _, m := range ct.Members {
		if m == c.prev || slices.ContainsFunc(c.answers, func(a Answer) bool { return !a.LogStore && a.ID == m }) {
			continue
		}
		if w := Judge(ct, m, c.answers, c.answers); w.Quorum {
			s.logf("%s: no quorum excluding %s; one excluding %s, which did not answer", c.answers[0].ID, c.prev, m)
			c.prev = m
			return w
		}
	}
	return v
}

// prevHolds reports whether c.prev granted the fence with a log that
// reaches the newest epoch answered, as a member may be excluded instead
// of it only then (services/node judgeReplacing: a primary that lost its
// log holds nothing it acknowledged; the model's never do, so this only
// keeps it the same rule).
func (c *candidacy) prevHolds() bool {
	return slices.ContainsFunc(c.answers, func(a Answer) bool {
		return !a.LogStore && a.ID == c.prev && a.LastEpoch >= c.newestLog
	})
}

// learnPrev takes an answer whose log ends in epoch lastEpoch, whose
// primary it names as lp (PrimaryOfLog; the zero Vote if unknown), into
// the replaced primary (prev): the primary of the newest log epoch
// answered, once an answer of that epoch names it; the candidate's own
// promise's until then (services/node replacedPrimary). ownOnly keeps
// the own promise's (PrevFromOwnPromise).
func (c *candidacy) learnPrev(lastEpoch uint64, lp datadir.Vote, ownOnly bool) {
	if ownOnly {
		return
	}
	if lastEpoch > c.newestLog {
		c.newestLog, c.prev = lastEpoch, c.ownPrev
	}
	if lastEpoch == c.newestLog && lp.Epoch == lastEpoch && lp.Primary != "" {
		c.prev = lp.Primary
	}
}

// leaseWait is services/node's leaseWait: the lease and a tenth; none if
// the primary of the newest epoch seen granted (it stepped down); else
// less the shortest time since a granting log store last heard from a
// primary.
func (s *sim) leaseWait(c *candidacy) int64 {
	if s.has(bugNoLeaseWait) {
		return 0
	}
	wait := s.cfg.Lease * 11 / 10
	minSince := int64(-1)
	for i, a := range c.answers {
		x := c.extra[i]
		if x.primary && a.LastEpoch >= c.seen {
			return 0
		}
		if a.LogStore && (minSince < 0 || x.since < minSince) {
			minSince = x.since
		}
	}
	if minSince > 0 {
		return max(0, wait-minSince)
	}
	return wait
}

const candTimeout = 200

func (s *sim) candidateTick(p *party) {
	c := p.cand
	switch {
	case !c.planned:
		if s.now-c.start > candTimeout {
			s.logf("%s gives up epoch %d", p.id, c.epoch)
			p.role, p.cand, p.heard = roleReplica, nil, s.now
		}
	case s.now < c.leaseUntil:
	case !p.st.Opens(c.epoch, p.id):
		s.logf("%s superseded in epoch %d by %s %d", p.id, c.epoch, p.st.Vote.Primary, p.st.Vote.Epoch)
		p.role, p.cand, p.heard = roleReplica, nil, s.now
		if i := s.nodeIdx(p.st.Vote.Primary); i >= 0 && i != p.idx {
			p.following = i
		}
	case c.donor == p.idx:
		s.open(p, nil)
	case !c.copying || s.now-c.copySent > candTimeout:
		if c.copying {
			s.logf("%s: no copy from %s", p.id, s.ps[c.donor].id)
			p.role, p.cand, p.heard = roleReplica, nil, s.now
			return
		}
		c.copying, c.copySent = true, s.now
		s.send(msg{kind: mCopy, from: p.idx, to: c.donor, epoch: c.epoch})
	}
}

// open is the catch-up (cut what the donor's log lacks, copy what it has
// beyond) and the start as primary, with the checks of I4 and I5.
func (s *sim) open(p *party, donor []ent) {
	c := p.cand
	if donor != nil {
		if uint64(len(donor)) < c.donorLSN || (c.donorLSN > 0 && donor[c.donorLSN-1].Epoch != c.donorEpoch) {
			s.logf("%s: donor moved", p.id)
			p.role, p.cand, p.heard = roleReplica, nil, s.now
			return
		}
		donor = donor[:c.donorLSN]
		n := 0
		for n < len(p.log) && n < len(donor) && p.log[n] == donor[n] {
			n++
		}
		if n < len(p.log) {
			s.apply(p, Step{Effects: []Effect{CutAfter{LSN: uint64(n)}}, Next: p.st}, false)
		}
		if rest := donor[n:]; len(rest) > 0 {
			var in []Entry
			for _, e := range rest {
				in = append(in, Entry{Epoch: e.Epoch, FirstLSN: e.LSN, LastLSN: e.LSN})
			}
			if rest[0].Epoch < p.st.LogEpoch {
				s.fail("model", "%s copies epoch %d onto %d", p.id, rest[0].Epoch, p.st.LogEpoch)
				return
			}
			st := p.st.Entries(0, in)
			s.apply(p, st, false)
			s.appendLog(p, rest, 0)
		}
	}
	if s.cfg.Reconfig && !s.has(bugNonMemberLeads) && !s.leads(p) {
		// Its log, caught up, is under a configuration that does not
		// name it (it was removed while it lagged): it may not lead.
		s.logf("%s: not a member of %s, its log's configuration: gives up epoch %d", p.id, s.cfgString(s.cfgOf(p.log)), c.epoch)
		s.refusedLead++
		p.role, p.cand, p.heard = roleReplica, nil, s.now
		return
	}
	if s.cfg.LogStoreChange && !s.has(bugNoEachLogStoreHalf) {
		if why := s.fencedEachLogStoreHalf(p); why != "" {
			s.logf("%s: %s: gives up epoch %d", p.id, why, c.epoch)
			s.ls.refused++
			p.role, p.cand, p.heard = roleReplica, nil, s.now
			return
		}
	}
	if !p.st.Opens(c.epoch, p.id) {
		p.role, p.cand, p.heard = roleReplica, nil, s.now
		return
	}
	if o, ok := s.opened[c.epoch]; ok && o != p.id {
		s.fail("I4", "%s and %s both open epoch %d", o, p.id, c.epoch)
	}
	for i, ep := range s.acked {
		lsn := uint64(i) + 1
		if ep != 0 && ep < c.epoch && (lsn > uint64(len(p.log)) || p.log[lsn-1].Epoch != ep) {
			s.fail("I5", "%s opens epoch %d without acknowledged LSN %d of epoch %d", p.id, c.epoch, lsn, ep)
		}
	}
	s.opened[c.epoch], s.openedAt[c.epoch] = p.id, s.now
	s.maxOpened = max(s.maxOpened, c.epoch)
	next := uint64(len(p.log)) + 1
	s.apply(p, Step{Effects: []Effect{NoteEpoch{Epoch: c.epoch, FirstLSN: next}}, Next: State{Vote: p.st.Vote, LogEpoch: c.epoch, Cluster: p.st.Cluster}}, false)
	s.appendLog(p, []ent{{c.epoch, next}}, 0) // the epoch record
	if s.cfg.LogStoreChange {
		s.dropLearnerAtEpochStart(p, ent{c.epoch, next})
	}
	if s.cfg.Reconfig {
		s.epochStartChange(p, ent{c.epoch, next})
	}
	s.becomePrimary(p, c.epoch)
}

// --- the scheduler ---------------------------------------------------------

func (s *sim) deliver(m msg) {
	p := s.ps[m.to]
	if !p.up {
		return
	}
	switch m.kind {
	case mFence:
		s.answerFence(p, m)
	case mFenceResp:
		s.fenceResp(p, m)
	case mStream:
		l, ok := p.lastFrom[m.from]
		if ok && l.epoch == m.epoch && (m.sid < l.sid || (m.sid == l.sid && (m.seq <= l.seq || l.broken))) {
			return // a stream is ordered, and ends at a refusal
		}
		s.refusedNow = false
		if p.ls {
			s.logStoreAppend(p, m)
		} else {
			s.replicaStream(p, m)
		}
		p.lastFrom[m.from] = streamPos{m.epoch, m.sid, m.seq, s.refusedNow}
	case mStreamResp:
		if p.role == rolePrimary {
			s.primaryReply(p, m)
		}
	case mSubscribe:
		switch {
		case p.role == rolePrimary && !p.fol[m.from].on:
			p.fol[m.from] = follower{on: true}
		case p.role != rolePrimary:
			s.send(msg{kind: mNotPrimary, from: p.idx, to: m.from, vote: p.st.Vote})
		}
	case mNotPrimary:
		s.learnPrimary(p, m.vote)
	case mStatus:
		s.send(msg{kind: mStatusResp, from: p.idx, to: m.from, vote: p.st.Vote, round: m.round})
	case mStatusResp:
		s.statusResp(p, m)
	case mCopy:
		s.send(msg{kind: mCopyResp, from: p.idx, to: m.from, epoch: m.epoch, round: m.round, log: slices.Clone(p.log)})
	case mCopyResp:
		if p.role == roleReplica && m.epoch == 0 && m.round == p.askRound {
			s.catchUp(p, m.log)
		}
		if p.role == roleCandidate && p.cand.planned && p.cand.copying && m.epoch == p.cand.epoch && m.from == p.cand.donor {
			s.open(p, m.log)
		}
	}
}

func (s *sim) crash(p *party) {
	s.logf("%s crashes (%s)", p.id, p.role)
	p.up = false
	p.st = p.dur // what was not persisted is lost
	p.role, p.cand, p.fol, p.epoch = roleReplica, nil, nil, 0
	p.lastFrom = map[int]streamPos{}
	p.contact = 0
	s.net = slices.DeleteFunc(s.net, func(m msg) bool { return m.to == p.idx || m.from == p.idx })
}

func (s *sim) restart(p *party) {
	s.logf("%s restarts", p.id)
	p.up, p.heard, p.dials, p.seen = true, s.now, 0, p.st.Known()
	p.following = s.cfg.LogStores // the address it was started with
	if i := s.nodeIdx(p.st.Vote.Primary); i >= 0 && i != p.idx {
		p.following = i
	}
}

func (s *sim) tick(p *party) {
	if !p.up || p.ls {
		return
	}
	switch p.role {
	case rolePrimary:
		s.primaryTick(p)
	case roleReplica:
		s.replicaTick(p)
	case roleCandidate:
		s.candidateTick(p)
	}
}

// step is one scheduler decision.
func (s *sim) step() {
	s.steps++
	s.now++
	r := s.rng.IntN(1000)
	switch {
	case !s.calm && r < 4: // crash
		p := s.ps[s.rng.IntN(len(s.ps))]
		if p.up && s.downCount() < 2 {
			s.crash(p)
		}
	case !s.calm && r < 12: // restart
		p := s.ps[s.rng.IntN(len(s.ps))]
		if !p.up {
			s.restart(p)
		}
	case !s.calm && r < 16: // a promotion, or two at once (item 8)
		s.tryPromote()
		if s.rng.IntN(2) == 0 {
			s.tryPromote()
		}
	case !s.calm && r < 18 && s.cfg.SplitPartitions && s.rng.IntN(2) == 0:
		s.split()
	case !s.calm && r < 18: // a partition: some (or all) links of one party cut
		p := s.ps[s.rng.IntN(len(s.ps))]
		until, all := s.now+20+int64(s.rng.IntN(400)), s.rng.IntN(3) == 0
		var cut []string
		for _, q := range s.ps {
			if q != p && (all || s.rng.IntN(2) == 0) {
				p.cutOff[q.idx], q.cutOff[p.idx] = until, until
				cut = append(cut, q.id)
			}
		}
		s.logf("%s cut off from %s until %d", p.id, strings.Join(cut, ","), until)
	case !s.calm && r < 19: // a fence from another cluster (I8)
		p := s.ps[s.rng.IntN(len(s.ps))]
		if p.up {
			s.answerFence(p, msg{kind: mFence, from: p.idx, to: p.idx, epoch: p.st.Known() + 1, cand: "x", cluster: "other"})
		}
	case r < 300 && (len(s.net) < 64 || r < 50):
		// A node's timer; fewer while messages queue up (nodes are busy
		// with them), so that the network cannot collapse.
		p := s.ps[s.cfg.LogStores+s.rng.IntN(s.cfg.Nodes)]
		s.tick(p)
	default:
		s.deliverOne()
	}
	if s.calm {
		s.operator()
	}
	s.check()
}

func (s *sim) downCount() int {
	n := 0
	for _, p := range s.ps {
		if !p.up {
			n++
		}
	}
	return n
}

// deliverOne delivers a message due now, chosen at random (reordering).
func (s *sim) deliverOne() {
	var due []int
	for i, m := range s.net {
		if m.at <= s.now {
			due = append(due, i)
		}
		if len(due) == 8 {
			break
		}
	}
	if len(due) == 0 {
		return
	}
	i := due[s.rng.IntN(len(due))]
	m := s.net[i]
	if m.stream() {
		// In order within its stream: the first of it still in flight.
		for j, o := range s.net[:i] {
			if o.stream() && o.kind == m.kind && o.from == m.from && o.to == m.to {
				i, m = j, o
				break
			}
		}
	}
	s.net = slices.Delete(s.net, i, i+1)
	s.deliver(m)
}

func (s *sim) tryPromote() {
	p := s.ps[s.cfg.LogStores+s.rng.IntN(s.cfg.Nodes)]
	if p.up && p.role == roleReplica {
		s.promote(p)
	}
}

// operator, once the faults stopped: like an operator running walship ctl
// promote (sometimes on two nodes at once) when no node is the primary
// or promoting. A primary that takes no writes is left alone: "already
// the primary".
//
// One situation the protocol does not heal by itself: a candidacy that
// won a promise from replicas but not from a log store majority (it
// crashed, or was cut off) leaves them promised an epoch newer than the
// primary's; they refuse its stream, the log stores name no primary of
// their epoch, so nothing teaches them, and a primary whose contract needs
// their flush takes no writes. The runbook's remedy is to promote again;
// the operator does so once the primary has taken no write for
// strandedAfter steps and such a replica exists (counted: sim.stranded),
// unless cfg.Strict — a member (Reconfig): promote does nothing at a
// node outside the configuration it knows.
func (s *sim) operator() {
	for _, p := range s.ps {
		if p.up && p.role == rolePrimary && !s.cfg.Strict && s.now-s.calmAt > strandedAfter && s.now-s.strandedAt > strandedAfter {
			for _, q := range s.ps {
				if q.up && !q.ls && q.role == roleReplica && q.st.Vote.Epoch > p.epoch && (!s.cfg.Reconfig || s.leads(q)) {
					s.logf("operator: %s promised epoch %d, newer than primary %s's %d: promote %s again", q.id, q.st.Vote.Epoch, p.id, p.epoch, q.id)
					s.stranded++
					s.strandedAt = s.now
					s.promote(q)
					return
				}
			}
		}
	}
	for _, p := range s.ps {
		if p.up && (p.role == rolePrimary || p.role == roleCandidate) {
			return
		}
	}
	if s.rng.IntN(20) != 0 {
		return
	}
	s.tryPromote()
	if s.rng.IntN(2) == 0 {
		s.tryPromote()
	}
}

// stopFaults: every party comes back but, in the cluster of the item 8
// report, the primary that was killed.
func (s *sim) stopFaults() {
	s.calm, s.calmAt = true, s.now
	for _, p := range s.ps {
		clear(p.cutOff)
	}
	var last *party
	for _, p := range s.ps {
		if p.role == rolePrimary && p.up && (last == nil || p.epoch > last.epoch) {
			last = p
		}
	}
	if s.keepOut < 0 && !s.cfg.Scripted && (s.cfg.Nodes >= 4 || s.cfg.Nodes == 3 && s.cfg.KeepOut3) && s.rng.IntN(2) == 0 {
		if last == nil {
			if i := s.nodeIdx(s.opened[s.maxOpened]); i >= 0 {
				last = s.ps[i]
			}
		}
		if last != nil {
			s.keepOut = last.idx
			if last.up {
				s.crash(last)
			}
		}
	}
	for _, p := range s.ps {
		if !p.up && p.idx != s.keepOut {
			s.restart(p)
		}
	}
	for _, p := range s.ps {
		s.liveFrom = max(s.liveFrom, uint64(len(p.log))+1)
	}
	s.logf("faults stop (%s left down)", s.idOf(s.keepOut))
}

func (s *sim) idOf(i int) string {
	if i < 0 {
		return "none"
	}
	return s.ps[i].id
}

// check is every invariant that can be checked after any step.
func (s *sim) check() {
	for _, p := range s.ps {
		// I1: a promise only grows, and what was answered is durable.
		if p.dur.Vote.Epoch < s.votes[p.idx] {
			s.fail("I1", "%s's persisted promise went from %d to %d", p.id, s.votes[p.idx], p.dur.Vote.Epoch)
		}
		s.votes[p.idx] = p.dur.Vote.Epoch
		if p.dur.Vote.Epoch < s.granted[p.idx] {
			s.fail("I1", "%s granted epoch %d but persisted a promise of %d", p.id, s.granted[p.idx], p.dur.Vote.Epoch)
		}
		// I2: never older than the log's newest epoch.
		if le := lastEpoch(p.log); le > p.dur.Vote.Epoch || p.dur.LogEpoch > p.dur.Vote.Epoch {
			s.fail("I2", "%s's log is at epoch %d (history %d), its promise %d", p.id, le, p.dur.LogEpoch, p.dur.Vote.Epoch)
		}
		// I9: bounded.
		if p.dur.Vote.Epoch > datadir.MaxEpoch {
			s.fail("I9", "%s promised %d", p.id, p.dur.Vote.Epoch)
		}
		// I7: a primary whose lease holds is of the newest epoch opened.
		if p.up && p.role == rolePrimary && p.epoch < s.maxOpened && s.leaseValid(p) {
			s.fail("I7", "%s (epoch %d) holds its lease after epoch %d opened at %d", p.id, p.epoch, s.maxOpened, s.openedAt[s.maxOpened])
		}
	}
}

// run runs the faults, then checks liveness. It returns the steps taken.
func (s *sim) run() error {
	for s.steps < s.cfg.FaultSteps && s.err == nil {
		s.step()
	}
	if s.err != nil {
		return s.report()
	}
	s.stopFaults()
	for s.err == nil && !s.lived && s.steps < s.cfg.FaultSteps+s.cfg.LiveBound {
		s.step()
	}
	if s.err == nil && !s.lived {
		var b strings.Builder
		for _, p := range s.ps {
			fmt.Fprintf(&b, "\n  %s up=%v %s vote=%v log=%d@%d following=%s", p.id, p.up, p.role, p.st.Vote, len(p.log), lastEpoch(p.log), s.idOf(p.following))
			if p.role == rolePrimary {
				fmt.Fprintf(&b, " lease=%v acked=%d followers=%+v", s.leaseValid(p), p.acked, p.fol)
			}
		}
		s.err = fmt.Errorf("liveness violated: no write acknowledged within %d steps after the faults stopped (step %d)%s", s.cfg.LiveBound, s.calmAt, b.String())
	}
	return s.report()
}

// loser names a replica in item 8's state: it promised the epoch of the
// primary that is up, to a candidate that lost it ("" if there is none).
func (s *sim) loser() string {
	for _, p := range s.ps {
		if !p.up || p.role != rolePrimary {
			continue
		}
		for _, q := range s.ps {
			if q.up && !q.ls && q.role == roleReplica && q.st.Vote.Epoch == p.epoch && q.st.Vote.Primary != p.id && q.st.Vote.Primary != "" {
				return fmt.Sprintf("%s promised epoch %d to %s, whose primary is %s", q.id, p.epoch, q.st.Vote.Primary, p.id)
			}
		}
	}
	return ""
}

func (s *sim) report() error {
	if s.err == nil {
		return nil
	}
	return fmt.Errorf("seed %d (%+v, %d messages in flight): %w\nlast events:\n%s", s.seed, s.cfg, len(s.net), s.err, strings.Join(s.trace, "\n"))
}
