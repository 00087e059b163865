package failover

import (
	"fmt"

	"github.com/walship/walship/internal/datadir"
)

// State is what an acceptor (a log store, or a replica) has persisted of
// the protocol: its promise, the newest epoch of its log and its cluster.
// A handler never changes a State: it returns the next one in its Step,
// which the caller adopts once the Step's effects are durable.
type State struct {
	// Vote is the promise: the acceptor refuses every sender of an older
	// epoch, and grants no other candidate this one (I1, I4).
	Vote datadir.Vote
	// LogEpoch is the epoch of the newest entry of its log (its history's
	// current epoch): never above Vote.Epoch (I2).
	LogEpoch uint64
	// LogPrimary is the primary of LogEpoch once the promise names
	// another epoch's: a promise of the log's epoch that named its
	// primary, kept (persisted before the promise that replaces it) when
	// a newer epoch is promised. It describes the log only while its
	// Epoch is LogEpoch (PrimaryOfLog). Without it a candidate that
	// fenced and gave up would leave every promise naming itself, and
	// the next candidate could not tell which primary it replaces.
	LogPrimary datadir.Vote
	// Cluster is its cluster id, "" until it has one (I8).
	Cluster string
}

// PrimaryOfLog is the primary of the log's newest epoch (LogEpoch), as
// the acceptor knows it: its promise, while that is of the log's epoch
// and names one, else LogPrimary if it is of that epoch; the zero Vote
// if it knows none. Entries of an epoch are its primary's alone (I4), so
// this names the primary that may have acknowledged what the log ends
// with, and none of a newer epoch that a candidate fenced and never
// opened: fence and Status answers carry it, and a promotion excludes
// that primary's promise (Judge's prev), not the one of the candidate
// the promises name.
func (s State) PrimaryOfLog() datadir.Vote {
	switch {
	case s.LogEpoch == 0:
		return datadir.Vote{}
	case s.Vote.Epoch == s.LogEpoch && s.Vote.Primary != "":
		return s.Vote
	case s.LogPrimary.Epoch == s.LogEpoch && s.LogPrimary.Primary != "":
		return s.LogPrimary
	}
	return datadir.Vote{}
}

// KeepsLogPrimary reports whether promising v replaces the only record
// of the primary of the log's newest epoch — a promise of that epoch
// naming it — and returns that record, to persist as LogPrimary before v
// is. Every path that raises a promise goes through it: the handlers here
// (Step.saveVote) and the services' own (a replica learning a newer
// epoch from a peer, a primary that steps down).
func (s State) KeepsLogPrimary(v datadir.Vote) (datadir.Vote, bool) {
	cur := s.Vote
	if v.Epoch <= cur.Epoch || cur.Epoch != s.LogEpoch || cur.Epoch == 0 || cur.Primary == "" || s.LogPrimary == cur {
		return datadir.Vote{}, false
	}
	return cur, true
}

// Known is the newest epoch the acceptor knows, promised or stored:
// datadir.CheckEpoch bounds what a peer may state from it (I9).
func (s State) Known() uint64 { return max(s.Vote.Epoch, s.LogEpoch) }

// An Effect is something to persist before a Step's answer is sent, in
// the order the Step lists them.
type Effect interface{ isEffect() }

// SaveVote makes Vote the promise, durably (I1). Why says what for, for
// the log. A promise of a newer epoch that replaces one of the log's
// epoch naming its primary keeps that one as LogPrimary, persisted first
// (State.KeepsLogPrimary).
type SaveVote struct {
	Vote datadir.Vote
	Why  string
}

// AdoptCluster saves ID as the acceptor's cluster id (it had none) before
// anything that came with it is acted on (I8). From names the message.
type AdoptCluster struct{ ID, From string }

// NoteEpoch records, durably, that the log continues in Epoch from
// FirstLSN, before the entry that begins it is written (I3).
type NoteEpoch struct{ Epoch, FirstLSN uint64 }

// AdoptHistory makes History, durably, the epoch history of the empty
// log, before its first entry is written: a refill that starts it past
// LSN 1 keeps the epochs of its source's log before that entry.
type AdoptHistory struct{ History datadir.History }

// CutAfter moves the log's entries after LSN into an orphan file (never
// deletes them) and cuts its history there (I6).
type CutAfter struct{ LSN uint64 }

func (SaveVote) isEffect()     {}
func (AdoptCluster) isEffect() {}
func (NoteEpoch) isEffect()    {}
func (CutAfter) isEffect()     {}
func (AdoptHistory) isEffect() {}

// Reason is why a message was refused.
type Reason int

// The reasons a handler refuses a message. Nothing of a refused message
// is persisted: a refusal's Step has no effects.
const (
	// OtherCluster: the message states another cluster's id than the
	// acceptor's, or none once the acceptor has one, for something that
	// would change it (I8).
	OtherCluster Reason = iota + 1
	// EpochAhead: the sender's (or the batch's) epoch is more than the
	// bound above the newest the acceptor knows (I9).
	EpochAhead
	// StaleEpoch: the sender's epoch is older than the promise (I1).
	StaleEpoch
	// StaleBatch: the batch's epoch is older than the log's newest (I3).
	StaleBatch
	// Undeclared: the sender stated no epoch (a truncate or a batch on a
	// stream whose heartbeat declared none).
	Undeclared
	// SenderBehindBatch: the heartbeat that came with the batch is of an
	// older epoch than the batch's: no primary sends that.
	SenderBehindBatch
	// BatchAheadOfSender: the batch's epoch is newer than its sender's.
	BatchAheadOfSender
	// CutOwnEpoch: the truncate would cut entries of the sender's epoch
	// or a newer one — never of an epoch the sender's history lacks (I6).
	CutOwnEpoch
	// Overlap: the batch overlaps the log and is not an exact
	// retransmission of what it holds.
	Overlap
	// Gap: the batch starts past the log's end.
	Gap
	// SourceBehind: a refill's batch, after the acceptor promised an
	// epoch newer than the source's log: the source may hold a tail that
	// epoch's primary cut.
	SourceBehind
	// SourceHistory: a refill's batch is not of the epoch the source's
	// history says wrote its first LSN.
	SourceHistory
)

var reasonNames = map[Reason]string{
	OtherCluster: "other-cluster", EpochAhead: "epoch-ahead", StaleEpoch: "stale-epoch", StaleBatch: "stale-batch",
	Undeclared: "undeclared", SenderBehindBatch: "sender-behind-batch", BatchAheadOfSender: "batch-ahead-of-sender",
	CutOwnEpoch: "cut-own-epoch", Overlap: "overlap", Gap: "gap", SourceBehind: "source-behind", SourceHistory: "source-history",
}

func (r Reason) String() string {
	if n, ok := reasonNames[r]; ok {
		return n
	}
	return fmt.Sprintf("reason(%d)", int(r))
}

// Refusal is a refused message: why, and what the caller needs to say so
// in its own words (each service keeps its messages and gRPC codes).
type Refusal struct {
	Reason Reason
	// Epoch is the epoch refused (the sender's, the batch's); Known the
	// one it was refused against (the promise, the log's epoch).
	Epoch, Known uint64
	// Vote is the promise when refused.
	Vote datadir.Vote
	// Err is the bound's error for EpochAhead.
	Err error
}

func (r *Refusal) Error() string {
	switch r.Reason {
	case EpochAhead:
		return fmt.Sprintf("%v: %v", r.Reason, r.Err)
	case OtherCluster:
		return r.Reason.String()
	case Undeclared:
		return "undeclared: the sender has stated no epoch"
	}
	return fmt.Sprintf("%v: epoch %d, known %d (%s)", r.Reason, r.Epoch, r.Known, r.Vote)
}

// Step is a handler's decision: a refusal (and nothing else), or the
// effects to persist in order before answering, and the state once they
// are.
type Step struct {
	Refused *Refusal
	// Granted: a fence was granted (a new promise or the same candidate's
	// retry).
	Granted bool
	Effects []Effect
	// Next is the state once the effects are persisted. After a CutAfter
	// the log's epoch is the caller's to lower to its cut history's.
	Next State
}

func refused(s State, r *Refusal) Step {
	r.Vote = s.Vote
	return Step{Refused: r, Next: s}
}

// requireCluster reports whether a message stating theirs may change an
// acceptor of ours (rpcerr.RequireCluster's rule).
func requireCluster(ours, theirs string) bool { return ours == "" || ours == theirs }

// adopts reports whether a message of cluster theirs makes the acceptor
// adopt it (it has no id yet).
func (st *Step) adopts(theirs string) bool { return theirs != "" && st.Next.Cluster == "" }

// adopt appends the AdoptCluster effect for theirs; callers check adopts
// first, so that the common path builds no string.
func (st *Step) adopt(theirs, from string) {
	st.Effects = append(st.Effects, AdoptCluster{ID: theirs, From: from})
	st.Next.Cluster = theirs
}

// saveVote makes v the promise of the next state. The caller persists
// the SaveVote effect by the same rule (KeepsLogPrimary on the state it
// holds), so the log's primary it replaces is kept in LogPrimary there as
// here.
func (st *Step) saveVote(v datadir.Vote, why string) {
	if kept, ok := st.Next.KeepsLogPrimary(v); ok {
		st.Next.LogPrimary = kept
	}
	st.Effects = append(st.Effects, SaveVote{Vote: v, Why: why})
	st.Next.Vote = v
}

// Fence is a candidate's request for the promise of Epoch.
type Fence struct {
	Epoch           uint64
	Candidate, Addr string
	Cluster         string
}

// Fence answers a candidate (EpochService.Fence). A candidate of another
// cluster is refused, changing nothing (I8). A newer epoch is granted —
// if the candidate states the acceptor's cluster id once it has one —
// adopting the candidate's cluster id first if the acceptor had none,
// then persisting the promise (I1); the same candidate asking again for
// the epoch it was granted is granted again, with no effect; anyone else
// is answered with the promise as it stands, not granted (I4). Epoch
// bounds and field checks are the caller's, at its edge.
func (s State) Fence(m Fence) Step {
	if m.Cluster != "" && s.Cluster != "" && m.Cluster != s.Cluster {
		return refused(s, &Refusal{Reason: OtherCluster, Epoch: m.Epoch, Known: s.Vote.Epoch})
	}
	retry := m.Epoch == s.Vote.Epoch && m.Candidate == s.Vote.Primary
	grant := m.Epoch > s.Vote.Epoch
	if (grant || retry) && !requireCluster(s.Cluster, m.Cluster) {
		return refused(s, &Refusal{Reason: OtherCluster, Epoch: m.Epoch, Known: s.Vote.Epoch})
	}
	st := Step{Next: s, Granted: grant || retry}
	if grant {
		if st.adopts(m.Cluster) {
			st.adopt(m.Cluster, "the fence of candidate "+m.Candidate)
		}
		st.saveVote(datadir.Vote{Epoch: m.Epoch, Primary: m.Candidate, Addr: m.Addr}, "promised a newer epoch")
	}
	return st
}

// Heartbeat is a primary's heartbeat: the epoch it is primary of, who
// and where it is, and its cluster.
type Heartbeat struct {
	Epoch         uint64
	Primary, Addr string
	Cluster       string
	// Bound is how far above the promise Epoch may be
	// (datadir.MaxEpochJump); 0: checked by the caller already.
	Bound uint64
}

// Heartbeat takes a primary's word, as a replica does on its stream: a
// primary of another cluster (or of none, once the acceptor has one) is
// refused (I8), and so is an epoch more than m.Bound above the promise
// (I9) or older than it (I1: a deposed primary). The primary's cluster id
// is adopted if the acceptor had none; a newer epoch is promised to that
// primary; the primary of the epoch promised, if the promise names none
// (it was made for the log's entries alone), is recorded as its primary.
func (s State) Heartbeat(m Heartbeat) Step {
	if !requireCluster(s.Cluster, m.Cluster) {
		return refused(s, &Refusal{Reason: OtherCluster, Epoch: m.Epoch, Known: s.Vote.Epoch})
	}
	if m.Bound != 0 {
		if err := datadir.CheckEpoch(m.Epoch, s.Vote.Epoch, m.Bound); err != nil {
			return refused(s, &Refusal{Reason: EpochAhead, Epoch: m.Epoch, Known: s.Vote.Epoch, Err: err})
		}
	}
	if m.Epoch < s.Vote.Epoch {
		return refused(s, &Refusal{Reason: StaleEpoch, Epoch: m.Epoch, Known: s.Vote.Epoch})
	}
	st := Step{Next: s}
	if st.adopts(m.Cluster) {
		st.adopt(m.Cluster, "the heartbeat of "+primaryPeer(m.Primary))
	}
	v := datadir.Vote{Epoch: m.Epoch, Primary: m.Primary, Addr: m.Addr}
	if v.Epoch > s.Vote.Epoch {
		st.saveVote(v, "promised a newer epoch")
	} else if why := learns(s.Vote, v); why != "" {
		st.saveVote(v, why)
	}
	return st
}

// EchoNow reports whether an acceptor may answer m at once, ahead of
// the requests its stream queued before it (a log store answers those in
// queue order, after a write and an fsync): only a heartbeat that would
// change nothing — of this cluster, of the epoch promised, naming the
// primary the promise names — from a stream whose declared epoch
// (admitted, taken by Heartbeat or Append already) is that epoch.
//
// The echo renews the primary's lease (I7), which needs only that no newer
// epoch was promised when it was answered: a candidate's wait starts once
// its promise is durable and answered, after any echo answered before it.
// Held behind a long disk round instead, the echo would depose a primary
// whose log store is merely slow: under a bulk load the round can take
// longer than the lease.
func (s State) EchoNow(m Heartbeat, admitted uint64) bool {
	if m.Epoch == 0 || m.Epoch != admitted || m.Epoch != s.Vote.Epoch {
		return false
	}
	st := s.Heartbeat(m)
	return st.Refused == nil && len(st.Effects) == 0
}

// learns says why the heartbeat of v's primary, of the epoch promised
// (cur), names the primary the promise should name ("" if it names it
// already, or names no one). A primary streams only once it has won its
// epoch from a log store majority, and only one candidate wins an epoch
// (I4), so its heartbeat names the epoch's primary: a promise of that
// epoch that names no one (made for the log's entries alone) learns it;
// one that names another candidate — one that fenced this node and lost
// the epoch, such as an old primary restarting with its original command
// line after a promotion it missed, or the loser of two promotions that
// chose the same epoch — is corrected, so that Status, and whoever asks
// this node who the primary is, names the one primary of the epoch.
// Granting is unchanged: it takes a newer epoch.
func learns(cur, v datadir.Vote) string {
	switch {
	case v.Epoch == 0 || v.Epoch != cur.Epoch || (v.Primary == "" && v.Addr == ""):
		return ""
	case cur.Primary == "" && cur.Addr == "":
		return "learnt the primary of the epoch promised"
	case v.Primary != "" && v.Addr != "" && cur.Primary != "" && v.Primary != cur.Primary:
		return "the primary of the epoch promised is another than the candidate it was promised to"
	}
	return ""
}

func primaryPeer(id string) string {
	if id != "" {
		return "the primary " + id
	}
	return "the primary"
}

// Entry is the head of one batch to be written: its epoch and LSNs.
type Entry struct{ Epoch, FirstLSN, LastLSN uint64 }

// Entries decides what writing es (checked, contiguous, in order, the
// log's next entries) needs first, as a replica writes a round: batches
// whose sender — the primary streaming them, 0 for entries that come
// without their primary (a log store's, a snapshot's) — is older than the
// promise are refused (I1: none is written after a fence); entries of an
// epoch newer than the promise raise it first, naming no primary (I2);
// each new epoch is noted in the history before its first entry (I3).
func (s State) Entries(sender uint64, es []Entry) Step {
	if sender != 0 && sender < s.Vote.Epoch {
		return refused(s, &Refusal{Reason: StaleEpoch, Epoch: sender, Known: s.Vote.Epoch})
	}
	st := Step{Next: s}
	var newest uint64
	for _, e := range es {
		newest = max(newest, e.Epoch)
	}
	if newest > s.Vote.Epoch {
		st.saveVote(datadir.Vote{Epoch: newest}, "promised a newer epoch")
	}
	for _, e := range es {
		if e.Epoch > st.Next.LogEpoch {
			st.Effects = append(st.Effects, NoteEpoch{Epoch: e.Epoch, FirstLSN: e.FirstLSN})
			st.Next.LogEpoch = e.Epoch
		}
	}
	return st
}

// Append is one request on a log store's Append stream: a heartbeat, a
// batch or a truncate (a batch comes with a heartbeat or alone).
type Append struct {
	// Sender is the epoch the stream's heartbeats declared before this
	// request (0 if none yet).
	Sender uint64
	HB     *Heartbeat
	Batch  *Entry
	// Truncate asks to cut the log after TruncateAfter.
	Truncate      bool
	TruncateAfter uint64
	// Last is the log's last LSN (0 if it holds nothing): the batch must
	// follow it, and a truncate at or past it is a no-op.
	Last uint64
	// Differs, for a batch that overlaps the log (FirstLSN <= Last), is
	// why it is not an exact retransmission of what the log holds there
	// ("" if it is: accepted, not stored again).
	Differs string
}

// AppendStep is Append's decision: the Step, and the sender's epoch the
// stream declares from now on.
type AppendStep struct {
	Step
	Sender uint64
	// Store: the batch is to be written (after the effects).
	Store bool
	// Why: the reason of an Overlap refusal.
	Why string
}

// Append applies the log store's rules to one request of a primary's
// Append stream. The sender's epoch — what its heartbeats declare — must
// be at least the promise (I1): a deposed primary is refused, batches,
// heartbeats and truncates alike. A batch's own epoch is that of the
// primary that wrote it, at most the sender's; along the log it never goes
// down (I3) unless the batch is an exact retransmission. A truncate cuts
// only entries of epochs older than the sender's (I6). A newer epoch is
// noted in the history, and a newer sender promised (naming it if its
// heartbeat did), before the request is acknowledged — never for a
// refused request. The sender's cluster id is adopted first (I8).
func (s State) Append(m Append) AppendStep {
	as := AppendStep{Sender: m.Sender}
	hb, b := m.HB, m.Batch
	if hb != nil {
		if !requireCluster(s.Cluster, hb.Cluster) {
			as.Step = refused(s, &Refusal{Reason: OtherCluster, Epoch: hb.Epoch, Known: s.Vote.Epoch})
			return as
		}
		as.Sender = max(as.Sender, hb.Epoch)
	}
	sender := as.Sender
	switch {
	case sender == 0:
		as.Step = refused(s, &Refusal{Reason: Undeclared})
		return as
	case sender < s.Vote.Epoch:
		as.Step = refused(s, &Refusal{Reason: StaleEpoch, Epoch: sender, Known: s.Vote.Epoch})
		return as
	case b != nil && hb != nil && hb.Epoch != 0 && hb.Epoch < b.Epoch:
		as.Step = refused(s, &Refusal{Reason: SenderBehindBatch, Epoch: hb.Epoch, Known: b.Epoch})
		return as
	case b != nil && b.Epoch > sender:
		as.Step = refused(s, &Refusal{Reason: BatchAheadOfSender, Epoch: b.Epoch, Known: sender})
		return as
	}
	as.Step = Step{Next: s}
	if hb != nil {
		if as.adopts(hb.Cluster) {
			as.adopt(hb.Cluster, "the heartbeat of "+primaryPeer(hb.Primary))
		}
	}
	if m.Truncate {
		switch {
		case m.TruncateAfter >= m.Last:
		case s.LogEpoch >= sender:
			// The entries a primary cuts are of epochs its history lacks:
			// older than its own, since entries of its epoch came from it
			// and a newer one would have been promised, refusing it.
			as.Step = refused(s, &Refusal{Reason: CutOwnEpoch, Epoch: sender, Known: s.LogEpoch})
		default:
			as.Effects = append(as.Effects, CutAfter{LSN: m.TruncateAfter})
		}
		return as
	}
	if b != nil {
		overlap := m.Last != 0 && b.FirstLSN <= m.Last
		if overlap && m.Differs == "" {
			return as // a retransmission: stored already
		}
		switch {
		case b.Epoch < s.LogEpoch:
			as.Step = refused(s, &Refusal{Reason: StaleBatch, Epoch: b.Epoch, Known: s.LogEpoch})
			return as
		case overlap:
			as.Step = refused(s, &Refusal{Reason: Overlap, Epoch: b.Epoch, Known: m.Last})
			as.Why = m.Differs
			return as
		case m.Last != 0 && b.FirstLSN > m.Last+1:
			as.Step = refused(s, &Refusal{Reason: Gap, Epoch: b.Epoch, Known: m.Last})
			return as
		}
		if b.Epoch > s.LogEpoch {
			as.Effects = append(as.Effects, NoteEpoch{Epoch: b.Epoch, FirstLSN: b.FirstLSN})
			as.Next.LogEpoch = b.Epoch
		}
		as.Store = true
	}
	v := datadir.Vote{Epoch: sender}
	if hb != nil && hb.Epoch == sender {
		v.Primary, v.Addr = hb.Primary, hb.Addr
	}
	if sender > s.Vote.Epoch {
		as.saveVote(v, "promised a newer epoch")
	} else if why := learns(s.Vote, v); why != "" {
		as.saveVote(v, why)
	}
	return as
}

// Refill is one batch a log store copies from a peer (or the archive)
// while it refills: no primary sends it, so it has no sender epoch; it is
// checked against the source's log as the source described it when the
// refill began.
type Refill struct {
	Batch Entry
	// Last and Differs are Append's: the log's last LSN (0 if it holds
	// nothing), and for a batch that overlaps it why it is not an exact
	// retransmission ("" if it is).
	Last    uint64
	Differs string
	// Source names the source, for the log. SourceEpoch is the newest
	// epoch of its log, SourceHistory its epoch history, SourceVote its
	// promise and SourceCluster its cluster id ("" if none).
	Source        string
	SourceEpoch   uint64
	SourceHistory datadir.History
	SourceVote    datadir.Vote
	SourceCluster string
	// AdoptHistory: the log is empty, and with its first batch takes the
	// source's history up to it (the epochs before it too), not only the
	// epochs of what it copies.
	AdoptHistory bool
}

// Refill applies the log's rules to a refill's batch, as Append does to
// a primary's. A promise newer than the source's log stops the refill
// (I1: the source may hold a tail the newer epoch's primary cut); the
// batch must be of the epoch the source's history says wrote it, follow
// the log without a gap or an overlap (an exact retransmission is
// accepted, not stored again) and not be older than the log's newest
// epoch (I3). The source's cluster id is adopted first (I8); on an empty
// log the source's history before the batch is adopted; the batch's epoch
// is noted in the history (NoteEpoch: a no-op for an epoch the history
// holds already) and, if newer than the promise, promised — naming the
// source's primary if the source's promise is of that epoch — before the
// batch is acknowledged.
func (s State) Refill(m Refill) AppendStep {
	b := m.Batch
	if s.Vote.Epoch > m.SourceEpoch {
		return AppendStep{Step: refused(s, &Refusal{Reason: SourceBehind, Epoch: m.SourceEpoch, Known: s.Vote.Epoch})}
	}
	if e := m.SourceHistory.EpochOf(b.FirstLSN); e != b.Epoch {
		return AppendStep{Step: refused(s, &Refusal{Reason: SourceHistory, Epoch: b.Epoch, Known: e})}
	}
	as := AppendStep{Step: Step{Next: s}}
	if overlap := m.Last != 0 && b.FirstLSN <= m.Last; overlap {
		if m.Differs == "" {
			return as // a retransmission: stored already
		}
		as.Step = refused(s, &Refusal{Reason: Overlap, Epoch: b.Epoch, Known: m.Last})
		as.Why = m.Differs
		return as
	}
	switch {
	case b.Epoch < s.LogEpoch:
		return AppendStep{Step: refused(s, &Refusal{Reason: StaleBatch, Epoch: b.Epoch, Known: s.LogEpoch})}
	case m.Last != 0 && b.FirstLSN > m.Last+1:
		return AppendStep{Step: refused(s, &Refusal{Reason: Gap, Epoch: b.Epoch, Known: m.Last})}
	}
	// The source was checked to be of this cluster when the refill chose
	// it; an id that differs now fails the adoption (carried out as
	// datadir.Cluster.Adopt does).
	if m.SourceCluster != "" && m.SourceCluster != s.Cluster {
		as.Effects = append(as.Effects, AdoptCluster{ID: m.SourceCluster, From: "the refill from " + m.Source})
		if s.Cluster == "" {
			as.Next.Cluster = m.SourceCluster
		}
	}
	if m.Last == 0 && m.AdoptHistory {
		if h := m.SourceHistory.Cut(b.FirstLSN); len(h) > 0 {
			as.Effects = append(as.Effects, AdoptHistory{History: h})
			as.Next.LogEpoch = h.Current().Epoch
		}
	}
	as.Effects = append(as.Effects, NoteEpoch{Epoch: b.Epoch, FirstLSN: b.FirstLSN})
	as.Next.LogEpoch = max(as.Next.LogEpoch, b.Epoch)
	if b.Epoch > s.Vote.Epoch {
		v := datadir.Vote{Epoch: b.Epoch}
		if m.SourceVote.Epoch == b.Epoch {
			v.Primary, v.Addr = m.SourceVote.Primary, m.SourceVote.Addr
		}
		as.saveVote(v, "promised the epoch of a refilled batch")
	}
	as.Store = true
	return as
}

// Opens reports whether a candidate (id) that won epoch may open it: only
// if the promise it holds is still its own. While it waited out the old
// primary's lease it may have granted a newer epoch to another candidate
// (a second promotion); it keeps that promise and does not open (I4).
func (s State) Opens(epoch uint64, id string) bool {
	return s.Vote.Epoch == epoch && s.Vote.Primary == id
}

// LearnFromLogStores is the primary an acceptor learns from its log
// stores' promises (their Status answers, votes, of n log stores) for the
// epoch it has promised, and why ("" if none): a primary other than the
// one its promise names, named by a majority of the log stores. A
// majority's promise of an epoch to one primary means that primary won
// the epoch (I4: every majority meets every other, and an acceptor
// grants an epoch to one candidate; the log stores a winner streams to
// name it), so the promise held names a candidate that lost — such as
// this node itself after a promotion that did not open, which would
// otherwise keep dialing the old primary forever (issue 35, item 8).
// A minority, or an answer without an address, teaches nothing; newer
// epochs are the caller's rule.
func (s State) LearnFromLogStores(votes []datadir.Vote, n int) (datadir.Vote, string) {
	cur := s.Vote
	if cur.Epoch == 0 {
		return datadir.Vote{}, ""
	}
	count := map[datadir.Vote]int{}
	for _, v := range votes {
		if v.Epoch == cur.Epoch && v.Primary != "" && v.Addr != "" && v.Primary != cur.Primary {
			count[v]++
		}
	}
	for v, c := range count {
		if c >= Majority(n) {
			return v, "a log store majority names the primary of the epoch promised, another than the candidate it was promised to"
		}
	}
	return datadir.Vote{}, ""
}

// LearnFromLogStoreSets is LearnFromLogStores over each of sets alone —
// the log store sets of the contract the acceptor's log holds: C_old's
// and, while joint, C_new's — with votes by log store: a primary other
// than the promise's, named by a majority of one set. A winner of the
// epoch holds the promises of a majority of each set of the contract it
// opened under (services/node fencedEachLogStoreHalf), and a log store
// promises an epoch to one candidate, so no majority of either set names
// another candidate. An acceptor whose contract is not the winner's (a
// lagging one under C_old,new, the winner under C_new) may see one set's
// majority name one candidate and the other's another: it learns
// neither, and learns the winner once its log moves on. Log stores of no
// set count for nothing.
func (s State) LearnFromLogStoreSets(sets [][]string, votes map[string]datadir.Vote) (datadir.Vote, string) {
	var learnt datadir.Vote
	why := ""
	for _, set := range sets {
		var named []datadir.Vote
		for _, id := range set {
			if v, ok := votes[id]; ok {
				named = append(named, v)
			}
		}
		v, w := s.LearnFromLogStores(named, len(set))
		switch {
		case w == "":
		case why != "" && v != learnt:
			return datadir.Vote{}, "" // two sets' majorities name two primaries
		default:
			learnt, why = v, w
		}
	}
	return learnt, why
}
