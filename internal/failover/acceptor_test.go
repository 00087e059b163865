package failover

import (
	"fmt"
	"testing"

	"github.com/walship/walship/internal/datadir"
)

func TestLearnFromLogStores(t *testing.T) {
	self := datadir.Vote{Epoch: 4, Primary: "r2", Addr: "r2:1"}
	r1 := datadir.Vote{Epoch: 4, Primary: "r1", Addr: "r1:1"}
	for _, tc := range []struct {
		name  string
		cur   datadir.Vote
		votes []datadir.Vote
		n     int
		want  datadir.Vote
	}{
		{"a majority names the winner", self, []datadir.Vote{r1, r1, self}, 3, r1},
		{"a minority does not", self, []datadir.Vote{r1, self, self}, 3, datadir.Vote{}},
		{"one of three answering", self, []datadir.Vote{r1}, 3, datadir.Vote{}},
		{"the one log store", self, []datadir.Vote{r1}, 1, r1},
		{"an older epoch", self, []datadir.Vote{{Epoch: 3, Primary: "p", Addr: "p:1"}, {Epoch: 3, Primary: "p", Addr: "p:1"}}, 3, datadir.Vote{}},
		{"no address", self, []datadir.Vote{{Epoch: 4, Primary: "r1"}, {Epoch: 4, Primary: "r1"}}, 3, datadir.Vote{}},
		{"the promise names it already", r1, []datadir.Vote{r1, r1, r1}, 3, datadir.Vote{}},
		{"no promise", datadir.Vote{}, []datadir.Vote{r1, r1}, 3, datadir.Vote{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, why := State{Vote: tc.cur}.LearnFromLogStores(tc.votes, tc.n)
			if got != tc.want || (why != "") != (tc.want != datadir.Vote{}) {
				t.Fatalf("LearnFromLogStores = %v, %q; want %v", got, why, tc.want)
			}
		})
	}
}

// TestLearnFromLogStoreSets: an acceptor (a replica) learns the primary of the epoch
// it promised from a majority of one set of its log stores, counted in
// that set alone, and nothing when two sets' majorities disagree.
func TestLearnFromLogStoreSets(t *testing.T) {
	lost := datadir.Vote{Epoch: 2, Primary: "n0", Addr: "n0:1"}
	won := datadir.Vote{Epoch: 2, Primary: "n1", Addr: "n1:1"}
	other := datadir.Vote{Epoch: 2, Primary: "n2", Addr: "n2:1"}
	st := State{Vote: lost}
	for _, tc := range []struct {
		name  string
		sets  [][]string
		votes map[string]datadir.Vote
		want  datadir.Vote // zero: learns nothing
	}{
		{"one set, a minority names another", [][]string{{"l0", "l1", "l2"}},
			map[string]datadir.Vote{"l0": won, "l1": lost, "l2": lost}, datadir.Vote{}},
		{"one set, a majority names another", [][]string{{"l0", "l3", "l4"}},
			map[string]datadir.Vote{"l0": won, "l3": won, "l4": lost}, won},
		{"stores of no set do not count", [][]string{{"l0", "l3", "l4"}},
			map[string]datadir.Vote{"l0": won, "l1": won, "l2": won}, datadir.Vote{}},
		{"joint, a majority of each", [][]string{{"l0", "l1", "l2"}, {"l0", "l1", "l3"}},
			map[string]datadir.Vote{"l0": won, "l1": won, "l2": lost, "l3": lost}, won},
		{"joint, a majority of the new set alone", [][]string{{"l0", "l1", "l2"}, {"l2", "l3", "l4"}},
			map[string]datadir.Vote{"l0": lost, "l1": lost, "l3": won, "l4": won}, won},
		{"joint, two majorities name two primaries", [][]string{{"l0", "l1", "l2"}, {"l0", "l3", "l4"}},
			map[string]datadir.Vote{"l1": won, "l2": won, "l3": other, "l4": other}, datadir.Vote{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			v, why := st.LearnFromLogStoreSets(tc.sets, tc.votes)
			if v != tc.want || (why != "") != (tc.want != datadir.Vote{}) {
				t.Fatalf("learns %v (%q), want %v", v, why, tc.want)
			}
		})
	}
}

// TestRefill: a refill's batch is refused once the promise is newer than
// the source's log, when it is not of the epoch the source's history
// says, on an overlap that is not a retransmission, below the log's epoch
// and after a gap; otherwise the source's cluster, the history before it
// (on an empty log), its epoch and a newer promise come first, in order.
func TestRefill(t *testing.T) {
	h := datadir.History{{Epoch: 2, FirstLSN: 1}, {Epoch: 3, FirstLSN: 41}}
	src := Refill{Source: "ls2", SourceEpoch: 3, SourceHistory: h, SourceVote: datadir.Vote{Epoch: 3, Primary: "p3", Addr: "p3:1"}, SourceCluster: "c"}
	with := func(b Entry, last uint64, f func(*Refill)) Refill {
		m := src
		m.Batch, m.Last = b, last
		if f != nil {
			f(&m)
		}
		return m
	}
	for _, tc := range []struct {
		name    string
		s       State
		m       Refill
		refused Reason
		effects []Effect
		store   bool
	}{
		{"promised past the source", State{Vote: datadir.Vote{Epoch: 4}, LogEpoch: 2, Cluster: "c"}, with(Entry{3, 41, 42}, 40, nil), SourceBehind, nil, false},
		{"not the source history's epoch", State{Vote: datadir.Vote{Epoch: 2}, LogEpoch: 2, Cluster: "c"}, with(Entry{2, 41, 42}, 40, nil), SourceHistory, nil, false},
		{"a retransmission", State{Vote: datadir.Vote{Epoch: 3}, LogEpoch: 3, Cluster: "c"}, with(Entry{3, 41, 42}, 42, nil), 0, nil, false},
		{"an overlap", State{Vote: datadir.Vote{Epoch: 3}, LogEpoch: 3, Cluster: "c"}, with(Entry{3, 41, 42}, 42, func(m *Refill) { m.Differs = "holds different data" }), Overlap, nil, false},
		{"below the log's epoch", State{Vote: datadir.Vote{Epoch: 3}, LogEpoch: 3, Cluster: "c"}, with(Entry{2, 39, 40}, 38, nil), StaleBatch, nil, false},
		{"a gap", State{Vote: datadir.Vote{Epoch: 3}, LogEpoch: 2, Cluster: "c"}, with(Entry{3, 43, 44}, 40, nil), Gap, nil, false},
		{"the next batch", State{Vote: datadir.Vote{Epoch: 3}, LogEpoch: 3, Cluster: "c"}, with(Entry{3, 43, 44}, 42, nil), 0,
			[]Effect{NoteEpoch{3, 43}}, true},
		{"a new epoch, promised with the source's primary", State{Vote: datadir.Vote{Epoch: 2}, LogEpoch: 2, Cluster: "c"}, with(Entry{3, 41, 42}, 40, nil), 0,
			[]Effect{NoteEpoch{3, 41}, SaveVote{Vote: datadir.Vote{Epoch: 3, Primary: "p3", Addr: "p3:1"}, Why: "promised the epoch of a refilled batch"}}, true},
		{"an empty log of no cluster", State{}, with(Entry{3, 41, 42}, 0, func(m *Refill) { m.AdoptHistory = true }), 0,
			[]Effect{AdoptCluster{ID: "c", From: "the refill from ls2"}, AdoptHistory{History: h[:2]}, NoteEpoch{3, 41},
				SaveVote{Vote: datadir.Vote{Epoch: 3, Primary: "p3", Addr: "p3:1"}, Why: "promised the epoch of a refilled batch"}}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			as := tc.s.Refill(tc.m)
			switch {
			case tc.refused != 0:
				if as.Refused == nil || as.Refused.Reason != tc.refused || len(as.Effects) > 0 || as.Store {
					t.Fatalf("Refill = %+v; want refused %v, nothing else", as, tc.refused)
				}
				return
			case as.Refused != nil:
				t.Fatalf("refused: %v", as.Refused)
			}
			if as.Store != tc.store || fmt.Sprint(as.Effects) != fmt.Sprint(tc.effects) {
				t.Fatalf("Refill: store %v, effects %v; want %v, %v", as.Store, as.Effects, tc.store, tc.effects)
			}
		})
	}
}
