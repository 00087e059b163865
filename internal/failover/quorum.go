package failover

import "slices"

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
