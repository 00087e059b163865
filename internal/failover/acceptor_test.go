package failover

import (
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
