package failover

import (
	"fmt"
	"slices"

	walshipv1 "github.com/walship/walship/gen/walship/v1"
)

// The quorum rules, all in this file: what acknowledges a commit, and
// what a promotion needs so that it sees every commit acknowledged (I5).
//
// A commit under the contract "any k at a level" is acknowledged once k of
// the N sync-eligible members report it at that level (AckLSN); with
// "log store sync" once a majority of the log stores has it durably
// (Majority). A promotion needs promises from a log store majority and
// from N−k+1 of the N members other than the old primary (PromotionNeed):
// any k members and any N−k+1 share at least one, so some promise holder
// has every commit acknowledged by k, and having promised, it refuses the
// old primary, which can complete no further commit. Under "log store
// sync" any two majorities meet, so the log store majority suffices.

// AckLSN is the highest LSN that at least k of pos have reached: the
// k-th highest (pos is sorted in place), 0 if fewer than k report. It is
// the primary's ack rule for k replicas at a level, and for a log store
// majority with k = Majority(n).
func AckLSN(pos []uint64, k int) uint64 {
	if k < 1 || len(pos) < k {
		return 0
	}
	slices.Sort(pos)
	return pos[len(pos)-k]
}

// Majority is how many of n log stores make a majority (0 for none).
func Majority(n int) int {
	if n <= 0 {
		return 0
	}
	return n/2 + 1
}

// PromotionNeed is how many of the n sync-eligible members (the old
// primary excluded) must promise a promotion under a contract of k sync
// replicas: n−k+1, so that they meet every k that could have acknowledged
// a commit; none when k is 0 or the contract waits for a log store
// majority (which the promotion's log store majority meets).
func PromotionNeed(n, k int, logstoreSync bool) int {
	if k <= 0 || logstoreSync {
		return 0
	}
	return n - k + 1
}

// Contract is what a promotion must honour (walshipv1.Contract, reduced
// to what the quorum rule reads).
type Contract struct {
	Members      []string // ids of the members whose acks count
	LogStores    []string // addresses of the log stores
	K            int      // sync replicas
	LogStoreSync bool     // commits wait for a log store majority
}

// Answer is one node's word in a survey or a fence, as the quorum rule
// reads it.
type Answer struct {
	ID       string
	LogStore bool
	// LastEpoch and LastLSN: where its log ends.
	LastEpoch, LastLSN uint64
	// PrimaryLast and PrimaryDurable: what the old primary last reported
	// to it (a replica), for the at-risk range.
	PrimaryLast, PrimaryDurable uint64
}

// Verdict is what a set of answers allows.
type Verdict struct {
	Quorum bool
	// LogStores and Members count the answers that count toward the
	// quorum; NeedLogStores and NeedMembers are what it needs; Eligible
	// is how many members could count.
	LogStores, Members, NeedLogStores, NeedMembers, Eligible int
	// Donor is the index in the answers of the most advanced log, by
	// (epoch, LSN) — the first of equals; -1 if none.
	Donor int
	// AtRisk is the LSN range the old primary reported that no answer
	// holds ({0, 0} if none), AtRiskDurable the end of what it had made
	// durable within it (0 if none).
	AtRisk        [2]uint64
	AtRiskDurable uint64
}

// Judge applies the promotion quorum rule under c to answers, those that
// count (granted after a fence, reachable in a survey); prev is the
// replaced primary's id, whose own promise does not count. all are every
// answer, counted or not, for the at-risk range.
func Judge(c Contract, prev string, answers, all []Answer) Verdict {
	v := Verdict{Donor: -1}
	eligible := map[string]bool{}
	for _, m := range c.Members {
		if m != prev {
			eligible[m] = true
		}
	}
	inContract := map[string]bool{}
	for _, l := range c.LogStores {
		inContract[l] = true
	}
	for i, a := range answers {
		switch {
		case a.LogStore && inContract[a.ID]:
			v.LogStores++
		case !a.LogStore && eligible[a.ID]:
			v.Members++
		}
		if d := v.Donor; d < 0 || a.LastEpoch > answers[d].LastEpoch || (a.LastEpoch == answers[d].LastEpoch && a.LastLSN > answers[d].LastLSN) {
			v.Donor = i
		}
	}
	v.Eligible = len(eligible)
	v.NeedLogStores = Majority(len(c.LogStores))
	v.NeedMembers = PromotionNeed(len(eligible), c.K, c.LogStoreSync)
	v.Quorum = len(c.LogStores) > 0 && v.LogStores >= v.NeedLogStores && v.Members >= v.NeedMembers &&
		(c.K == 0 || c.LogStoreSync || len(eligible) > 0)
	var held, last, durable uint64
	if v.Donor >= 0 {
		held = answers[v.Donor].LastLSN
	}
	for _, a := range all {
		last, durable = max(last, a.PrimaryLast), max(durable, a.PrimaryDurable)
	}
	if last > held {
		v.AtRisk = [2]uint64{held + 1, last}
		if durable > held {
			v.AtRiskDurable = min(durable, last)
		}
	}
	return v
}

// Membership change (issue 38) moves the cluster from a contract C_old to
// C_new through a joint contract C_old,new, one record each in the epoch
// log. While the newest contract record is joint, every rule needs both
// halves: a commit is acknowledged when the old half acknowledges it and
// the new half does (JointAckLSN over AckQuorums of each), and a
// promotion needs the promotion quorum of each (JudgeJoint). Any joint
// promotion quorum then contains a promotion quorum of C_old and one of
// C_new, so it meets every ack quorum of C_old (commits before the joint
// record), of the joint contract and of C_new (commits after the final
// record): TestJointPromotionMeetsEveryAck checks it for every pair of
// configurations of up to 5 members and 5 log stores. Learners are in
// neither half: they are shipped to and count for nothing.

// Quorum is one ack rule: the voters whose positions count and how many of
// them must reach an LSN (0: the rule waits for nobody).
type Quorum struct {
	Voters []string
	Need   int
}

// AckQuorums are c's two ack rules for a primary named primary: k of the
// members other than the primary, and (under log store sync) a majority
// of the log stores.
func (c Contract) AckQuorums(primary string) (members, logStores Quorum) {
	for _, m := range c.Members {
		if m != primary {
			members.Voters = append(members.Voters, m)
		}
	}
	members.Need = max(c.K, 0)
	logStores.Voters = slices.Clone(c.LogStores)
	if c.LogStoreSync {
		logStores.Need = Majority(len(c.LogStores))
	}
	return members, logStores
}

// JointAckLSN is the highest LSN that every quorum in qs acknowledges
// (AckLSN over the positions of its voters; a voter pos lacks is at 0),
// capped at last, the primary's own end. Under a joint contract qs holds
// the AckQuorums of both halves; under a plain contract those of one.
func JointAckLSN(pos map[string]uint64, last uint64, qs ...Quorum) uint64 {
	ack := last
	buf := make([]uint64, 0, 8)
	for _, q := range qs {
		if q.Need <= 0 {
			continue
		}
		buf = buf[:0]
		for _, v := range q.Voters {
			buf = append(buf, pos[v])
		}
		ack = min(ack, AckLSN(buf, q.Need))
	}
	return ack
}

// JointVerdict is what a set of answers allows under a joint contract:
// the verdict of each half (Old, New) and both together.
type JointVerdict struct {
	Verdict  // Quorum: both halves have theirs; Donor, AtRisk: over all answers
	Old, New Verdict
}

// JudgeJoint applies the promotion rule under the joint contract
// C_old,new: a quorum of old and a quorum of new (a log store majority
// of each set, N−k+1 of each set's members), so that the promise holders
// meet every commit either half could have acknowledged (I5).
func JudgeJoint(old, new Contract, prev string, answers, all []Answer) JointVerdict {
	o := Judge(old, prev, answers, all)
	n := Judge(new, prev, answers, all)
	v := JointVerdict{Verdict: o, Old: o, New: n}
	v.Quorum = o.Quorum && n.Quorum
	return v
}

// Config is the contract in force as the newest contract record states
// it: Old alone, or, while a change is in progress, Old and New (Joint).
// Learners are shipped to and count for nothing.
type Config struct {
	Old      Contract
	New      Contract
	Joint    bool
	Learners []string
}

// AckQuorums are the ack rules under cfg for a primary named primary: the
// two of Old, and while joint the two of New as well.
func (cfg Config) AckQuorums(primary string) []Quorum {
	m, l := cfg.Old.AckQuorums(primary)
	qs := []Quorum{m, l}
	if cfg.Joint {
		m, l = cfg.New.AckQuorums(primary)
		qs = append(qs, m, l)
	}
	return qs
}

// Judge applies the promotion rule of cfg: Judge under Old, or JudgeJoint
// while a change is in progress.
func (cfg Config) Judge(prev string, answers, all []Answer) JointVerdict {
	if !cfg.Joint {
		v := Judge(cfg.Old, prev, answers, all)
		return JointVerdict{Verdict: v, Old: v}
	}
	return JudgeJoint(cfg.Old, cfg.New, prev, answers, all)
}

// SetByChange reports whether contract c was written by a run-time
// membership change: members_changed set, or a change in progress (next).
// Such a contract's members and log stores bind every node — they win
// over --peers and --logstore — where an older one's came from a
// primary's flags.
func SetByChange(c *walshipv1.Contract) bool {
	return c.GetMembersChanged() || c.GetNext() != nil
}

// BindsPeerless reports whether contract c, the newest in a log, keeps a
// node started without --peers (no members) from taking writes over that
// log: it was set by a run-time change (SetByChange), or it names a
// member other than id in either half. Such a node writes no epoch
// record and takes any replica's ack for "any k", while a candidate that
// c names judges by c: a write only a node outside c, or fewer than c's
// k, acknowledged may be missed by every promotion quorum of c. A
// contract naming id alone binds nobody else: no other node leads under
// it (Config.Leads).
func BindsPeerless(c *walshipv1.Contract, id string) bool {
	if SetByChange(c) {
		return true
	}
	for _, m := range slices.Concat(c.GetMembers(), c.GetNext().GetMembers()) {
		if m.GetId() != id {
			return true
		}
	}
	return false
}

// ConfigOf is the configuration contract c states, as the rules here read
// it: its members, log stores and k; while a membership change is in
// progress (c.next set) the joint configuration, whose ack rule and
// promotion quorum are each half's; its learners apart.
func ConfigOf(c *walshipv1.Contract) Config {
	half := func(members []*walshipv1.Member, logstores []string, k uint32) Contract {
		fc := Contract{LogStores: slices.Clone(logstores), K: int(k), LogStoreSync: c.GetLogstoreSync()}
		for _, m := range members {
			fc.Members = append(fc.Members, m.GetId())
		}
		return fc
	}
	cfg := Config{Old: half(c.GetMembers(), c.GetLogstores(), c.GetSyncReplicas())}
	if nx := c.GetNext(); nx != nil {
		cfg.New, cfg.Joint = half(nx.GetMembers(), nx.GetLogstores(), nx.GetSyncReplicas()), true
	}
	for _, m := range c.GetLearners() {
		cfg.Learners = append(cfg.Learners, m.GetId())
	}
	return cfg
}

// Leads reports whether the node id may be the primary under cfg: only
// as a member of Old and, while a change is in progress, of New. The
// promotion rule counts on it: N−k+1 of the members other than the
// replaced primary meet every k members that acknowledged a commit only
// because the primary that wrote it holds it too, as a member — k+1
// holders, of which the replaced primary is at most one. A primary
// outside a half has only its k acks in that half, the replaced primary
// may be one of them, and a quorum of the others can miss the write.
// So a node that does not lead under its own log's configuration does
// not promote (a member joining or leaving in a change in progress
// included), and a candidate checks Leads again under the configuration
// its log is under once caught up — the donor's, which may be newer than
// every one it judged by: a member removed while it was down promotes
// under its own log's configuration, which still names it — and gives
// up rather than open if it fails; ValidChange keeps a primary in every
// half of a change it starts.
func (cfg Config) Leads(id string) bool {
	return slices.Contains(cfg.Old.Members, id) && (!cfg.Joint || slices.Contains(cfg.New.Members, id))
}

// ValidChange reports whether a membership change may go from old to new
// with primary as the primary in both. Both halves must keep whether
// commits wait at all (k > 0, log store sync): a candidate that has not
// seen the joint record judges under old alone, and its quorum meets the
// joint ack quorums only through old's own ack rule — an old contract
// that waits for nobody protects nothing written while joint
// (TestJointPromotionMeetsEveryAck). k may differ within that; the
// primary stays a member (hand its role over first: Switchover); k must
// leave the new half able to acknowledge (k ≤ its members other than
// the primary), and a contract needs a log store.
func ValidChange(old, new Contract, primary string) error {
	switch {
	case (old.K > 0) != (new.K > 0):
		return fmt.Errorf("sync_replicas cannot go between 0 and more in a membership change (old %d, new %d): change it at an epoch start", old.K, new.K)
	case old.LogStoreSync != new.LogStoreSync:
		return fmt.Errorf("logstore_sync cannot change in a membership change: change it at an epoch start")
	case !slices.Contains(new.Members, primary):
		return fmt.Errorf("members: the new configuration leaves out the primary %q: hand its role over first (switchover)", primary)
	case new.K > len(new.Members)-1:
		return fmt.Errorf("members: %d members besides the primary cannot meet sync_replicas %d", len(new.Members)-1, new.K)
	case len(new.LogStores) == 0:
		return fmt.Errorf("logstores: the new configuration has none")
	case duplicate(new.Members) != "":
		return fmt.Errorf("members: %q twice in the new configuration", duplicate(new.Members))
	case duplicate(new.LogStores) != "":
		return fmt.Errorf("logstores: %q twice in the new configuration", duplicate(new.LogStores))
	}
	return nil
}

// duplicate is an element of xs that appears twice, or "": a member or a
// log store counted twice would meet an ack quorum alone.
func duplicate(xs []string) string {
	for i, x := range xs {
		if slices.Contains(xs[i+1:], x) {
			return x
		}
	}
	return ""
}
