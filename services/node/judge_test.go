package node

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	walshipv1 "github.com/walship/walship/gen/walship/v1"
	"github.com/walship/walship/internal/datadir"
)

// TestJudge: the promotion quorum, as a table of who answered under which
// contract, and the donor and the range at risk it picks.
func TestJudge(t *testing.T) {
	members := func(ids ...string) []*walshipv1.Member {
		var ms []*walshipv1.Member
		for _, id := range ids {
			ms = append(ms, &walshipv1.Member{Id: id, Addr: id + ":1"})
		}
		return ms
	}
	ls := []string{"ls0", "ls1", "ls2"}
	k1 := &walshipv1.Contract{SyncReplicas: 1, SyncLevel: walshipv1.SyncLevel_SYNC_LEVEL_FLUSH, Members: members("p", "r1", "r2"), Logstores: ls}
	k2 := &walshipv1.Contract{SyncReplicas: 2, SyncLevel: walshipv1.SyncLevel_SYNC_LEVEL_FLUSH, Members: members("p", "r1", "r2", "r3"), Logstores: ls}
	lsSync := &walshipv1.Contract{SyncReplicas: 1, LogstoreSync: true, Members: members("p", "r1", "r2"), Logstores: ls}
	async := &walshipv1.Contract{Members: members("p", "r1", "r2"), Logstores: ls}
	noLS := &walshipv1.Contract{Members: members("p", "r1")}
	// A membership change in progress: r3 joins, r2 leaves, ls2 is
	// replaced by ls3; k=1 in both halves.
	joint := &walshipv1.Contract{SyncReplicas: 1, SyncLevel: walshipv1.SyncLevel_SYNC_LEVEL_FLUSH, Members: members("p", "r1", "r2"), Logstores: ls,
		Next:     &walshipv1.Configuration{SyncReplicas: 1, Members: members("p", "r1", "r3"), Logstores: []string{"ls0", "ls1", "ls3"}},
		Learners: members("r9")}
	a := func(id string, ls bool, epoch, lsn uint64) answer {
		return answer{id: id, logstore: ls, granted: true, lastEpoch: epoch, lastLSN: lsn}
	}
	for _, tc := range []struct {
		name    string
		c       *walshipv1.Contract
		answers []answer
		quorum  bool
		donor   string
		needed  string
	}{
		{"k=1 of 2: both replicas and 2 of 3 log stores", k1,
			[]answer{a("r1", false, 3, 10), a("r2", false, 3, 12), a("ls0", true, 3, 9), a("ls1", true, 3, 9)}, true, "r2", "2 of 3 log stores and 2 of the 2"},
		{"k=1 of 2: one replica cannot see what the other may have acked", k1,
			[]answer{a("r1", false, 3, 10), a("ls0", true, 3, 9), a("ls1", true, 3, 9), a("ls2", true, 3, 9)}, false, "r1", "2 of the 2 sync-eligible"},
		{"k=2 of 3: two replicas suffice", k2,
			[]answer{a("r1", false, 3, 10), a("r3", false, 3, 11), a("ls0", true, 3, 9), a("ls2", true, 3, 9)}, true, "r3", "2 of the 3"},
		{"1 of 3 log stores is no majority", k1,
			[]answer{a("r1", false, 3, 10), a("r2", false, 3, 10), a("ls0", true, 3, 9)}, false, "r1", "2 of 3 log stores"},
		{"a log store majority covers a log-store-sync contract alone", lsSync,
			[]answer{a("r1", false, 3, 10), a("ls0", true, 3, 14), a("ls1", true, 3, 12)}, true, "ls0", "2 of 3 log stores;"},
		{"async contract: the log stores fence", async,
			[]answer{a("r2", false, 3, 8), a("ls1", true, 3, 7), a("ls2", true, 3, 7)}, true, "r2", "2 of 3 log stores;"},
		{"the donor is the highest (epoch, LSN), not the highest LSN", k1,
			[]answer{a("r1", false, 4, 5), a("r2", false, 3, 50), a("ls0", true, 3, 9), a("ls1", true, 4, 5)}, true, "r1", ""},
		{"no log store: no vote", noLS, []answer{a("r1", false, 1, 1)}, false, "r1", "no log store is configured"},
		{"a log store the contract does not name does not count", k1,
			[]answer{a("r1", false, 3, 10), a("r2", false, 3, 10), a("ls0", true, 3, 9), a("lsX", true, 3, 9)}, false, "r1", "2 of 3 log stores"},
		{"joint: both halves' quorums", joint,
			[]answer{a("r1", false, 3, 10), a("r2", false, 3, 10), a("r3", false, 3, 11), a("ls0", true, 3, 9), a("ls1", true, 3, 9)}, true, "r3", "of the one it goes to, 2 of 3 log stores and 2 of the 2"},
		{"joint: the old half's quorum alone is not enough", joint,
			[]answer{a("r1", false, 3, 10), a("r2", false, 3, 10), a("ls0", true, 3, 9), a("ls2", true, 3, 9)}, false, "r1",
			// It follows "needs" (walship ctl promote: "quorum false (needs …)").
			"a quorum of each configuration of the membership change in progress: of the current one, 2 of 3 log stores"},
		{"joint: the new half's quorum alone is not enough", joint,
			[]answer{a("r1", false, 3, 10), a("r3", false, 3, 10), a("ls0", true, 3, 9), a("ls3", true, 3, 9)}, false, "r1", "have 1 log stores and 1 members; and of the one it goes to"},
		{"a learner counts for nothing", joint,
			[]answer{a("r1", false, 3, 10), a("r9", false, 3, 10), a("r3", false, 3, 10), a("ls0", true, 3, 9), a("ls1", true, 3, 9)}, false, "r1", "have 2 log stores and 1 members"},
		{"refusals and errors do not count", k1,
			[]answer{a("r1", false, 3, 10), {id: "r2", granted: false, epoch: 5}, a("ls0", true, 3, 9), a("ls1", true, 3, 9)}, false, "r1", "have 2 log stores and 1 members"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			v := judge(tc.c, "p", tc.answers, func(a answer) bool { return a.err == nil && a.granted })
			if v.quorum != tc.quorum || v.donor.id != tc.donor || !strings.Contains(v.needed, tc.needed) {
				t.Fatalf("quorum %v donor %q needed %q; want %v %q containing %q", v.quorum, v.donor.id, v.needed, tc.quorum, tc.donor, tc.needed)
			}
		})
	}
	// The range at risk: what the old primary reported that no answer holds.
	r1 := a("r1", false, 3, 10)
	r1.primaryLast, r1.primaryDurable = 14, 12
	v := judge(k1, "p", []answer{r1, a("r2", false, 3, 11), a("ls0", true, 3, 9), a("ls1", true, 3, 9)}, func(a answer) bool { return a.granted })
	if v.atRisk != [2]uint64{12, 14} || v.atRiskDurable != 12 {
		t.Fatalf("at risk %v (durable to %d); want 12..14, durable to 12", v.atRisk, v.atRiskDurable)
	}

	// Under several known contracts (a node that applied a newer epoch
	// record knows a stricter one) the quorum must hold under each.
	one := []answer{a("r1", false, 3, 10), a("ls0", true, 3, 9), a("ls1", true, 3, 9)}
	count := func(a answer) bool { return a.granted }
	if v := judgeAll([]*walshipv1.Contract{async}, "p", one, count); !v.quorum {
		t.Fatalf("async alone with one replica: %+v, want a quorum", v)
	}
	if v := judgeAll([]*walshipv1.Contract{async, k1}, "p", one, count); v.quorum || !strings.Contains(v.needed, "2 of the 2") {
		t.Fatalf("async and k=1 of 2 with one replica: %+v, want k=1's refusal", v)
	}
	if v := judgeAll([]*walshipv1.Contract{k1, async}, "p", one, count); v.quorum {
		t.Fatalf("k=1 of 2 and async with one replica: %+v, want a refusal", v)
	}
}

// TestSuperseded: a candidate opens the epoch it fenced only if its vote
// is still its own promise of that epoch.
func TestSuperseded(t *testing.T) {
	for _, tc := range []struct {
		vote datadir.Vote
		want bool // superseded
	}{
		{datadir.Vote{Epoch: 2, Primary: "n1"}, false},
		{datadir.Vote{Epoch: 3, Primary: "n2", Addr: "b:1"}, true}, // promised a newer epoch meanwhile
		{datadir.Vote{Epoch: 2, Primary: "n2"}, true},              // the same epoch, another candidate
		{datadir.Vote{Epoch: 1, Primary: "n1"}, true},              // never saved its own promise
	} {
		err := superseded(tc.vote, 2, "n1")
		if (err != nil) != tc.want {
			t.Errorf("superseded(%v, 2, n1) = %v, want superseded %v", tc.vote, err, tc.want)
		}
	}
}

// TestUnbelievedAnswerSetsNoEpoch: an answer whose epoch is more than
// datadir.MaxEpochGap above what the candidate knows is an error, and its
// epoch does not count among those seen: the candidate promotes to the
// epoch after the ones it believes, which the others grant, not to the
// one after the answer's, which they refuse and no steps bridge.
func TestUnbelievedAnswerSetsNoEpoch(t *testing.T) {
	answers := []answer{
		{id: "n1", granted: true, epoch: 5, lastEpoch: 5},
		{id: "ls0", logstore: true, epoch: 5 + datadir.MaxEpochGap + 1, lastEpoch: 5},
		{id: "ls1", logstore: true, epoch: 5, lastEpoch: 5},
	}
	for i := range answers[1:] {
		answers[i+1].checkEpochs(5)
	}
	if answers[1].err == nil || answers[2].err != nil {
		t.Fatalf("answers after the check: %v", answers)
	}
	if seen := highestEpoch(answers); seen != 5 {
		t.Fatalf("highest epoch seen = %d; want 5, the unbelieved answer's not counted", seen)
	}
}

// TestAnswerWithBadHistory: an answer whose history is not one (a first
// LSN of 0, epochs out of order) is an error, naming the entry: its
// history would decide what of its log is kept.
func TestAnswerWithBadHistory(t *testing.T) {
	for _, tc := range []struct {
		history datadir.History
		want    string // "" for no error
	}{
		{datadir.History{{Epoch: 1, FirstLSN: 1}, {Epoch: 4, FirstLSN: 30}}, ""},
		{datadir.History{{Epoch: 1, FirstLSN: 1}, {Epoch: 4, FirstLSN: 0}}, "history[1]: epoch and first_lsn must be at least 1"},
		{datadir.History{{Epoch: 4, FirstLSN: 1}, {Epoch: 3, FirstLSN: 30}}, "history[1]: epochs must increase"},
	} {
		a := answer{id: "ls0", logstore: true, epoch: 5, lastEpoch: tc.history.Current().Epoch, history: tc.history}
		a.checkEpochs(5)
		if got := fmt.Sprint(a.err); (tc.want == "") != (a.err == nil) || !strings.Contains(got, tc.want) {
			t.Errorf("history %v: err %v; want %q", tc.history, a.err, tc.want)
		}
	}
}

// TestLeadsOnceCaughtUp: which replica's contract a candidate x is judged
// by before it fences. R1 names {p, m}; R2, a run-time add, {p, m, x}. Only
// the most advanced replica of the donor's epoch counts, and only if its
// log is ahead of x's; a candidate that is its own donor copies nothing.
func TestLeadsOnceCaughtUp(t *testing.T) {
	members := func(ids ...string) []*walshipv1.Member {
		var ms []*walshipv1.Member
		for _, id := range ids {
			ms = append(ms, &walshipv1.Member{Id: id, Addr: id + ":1"})
		}
		return ms
	}
	r1 := &walshipv1.Contract{Members: members("p", "m"), Logstores: []string{"ls"}}
	r2 := &walshipv1.Contract{Members: members("p", "m", "x"), Logstores: []string{"ls"}}
	at := func(id string, lsn uint64, c *walshipv1.Contract) answer {
		return answer{id: id, lastEpoch: 1, lastLSN: lsn, contract: c}
	}
	logStore := answer{id: "ls", logstore: true, lastEpoch: 1, lastLSN: 9}
	tests := []struct {
		name    string
		self    answer
		answers []answer
		donor   string
		refused string // "" if x may go on
	}{
		{"x its own donor; m lags with R1", at("x", 3, r2), []answer{at("m", 1, r1)}, "x", ""},
		{"the donor a log store; m lags behind x", at("x", 3, r2), []answer{at("m", 1, r1), logStore}, "ls", ""},
		{"the donor a log store; m level with x", at("x", 3, r2), []answer{at("m", 3, r2), logStore}, "ls", ""},
		{"m ahead of x, with R2", at("x", 1, r1), []answer{at("m", 5, r2), at("p2", 2, r1), logStore}, "ls", ""},
		{"m ahead of x, with R1 (x removed, or not yet added)", at("x", 0, nil), []answer{at("m", 5, r1), logStore}, "ls", "m, whose log reaches the newest epoch (1), reports members p, m"},
		{"the most advanced decides, not a laggard", at("x", 0, nil), []answer{at("m", 2, r1), at("q", 5, r2), logStore}, "ls", ""},
		{"a replica of an older epoch says nothing", at("x", 0, nil), []answer{{id: "m", lastEpoch: 0, lastLSN: 5, contract: r1}, logStore}, "ls", ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			answers := append([]answer{tt.self}, tt.answers...)
			err := leadsOnceCaughtUp("x", tt.self, answers, answerOf(answers, tt.donor))
			if tt.refused == "" && err != nil {
				t.Fatalf("leadsOnceCaughtUp: %v; want x to go on", err)
			}
			if tt.refused != "" && (err == nil || !strings.Contains(err.Error(), tt.refused)) {
				t.Fatalf("leadsOnceCaughtUp: %v; want a refusal naming %q", err, tt.refused)
			}
		})
	}
}

// TestJudgeReplacing: the replaced primary first; when that has no
// quorum, a member whose answer does not count, only while the replaced
// primary's own answer counts with a log of the newest epoch answered;
// under a joint contract one member is excluded from both halves.
func TestJudgeReplacing(t *testing.T) {
	members := func(ids ...string) []*walshipv1.Member {
		var ms []*walshipv1.Member
		for _, id := range ids {
			ms = append(ms, &walshipv1.Member{Id: id, Addr: id + ":1"})
		}
		return ms
	}
	ls := []string{"ls0"}
	k1 := &walshipv1.Contract{SyncReplicas: 1, Members: members("p", "r1", "r2"), Logstores: ls}
	joint := &walshipv1.Contract{SyncReplicas: 1, Members: members("p", "r1", "r2"), Logstores: ls,
		Next: &walshipv1.Configuration{SyncReplicas: 1, Members: members("p", "r1", "r3"), Logstores: ls}}
	a := func(id string, epoch uint64) answer {
		return answer{id: id, logstore: id == "ls0", granted: true, lastEpoch: epoch, lastLSN: 10}
	}
	down := func(id string) answer { return answer{id: id, err: errors.New("down")} }
	for _, tc := range []struct {
		name     string
		c        *walshipv1.Contract
		replaced string
		answers  []answer
		quorum   bool
		excluded string
	}{
		{"the replaced primary suffices", k1, "p", []answer{a("ls0", 1), a("r1", 1), a("r2", 1)}, true, "p"},
		{"p answers, r2 is down: r2 excluded", k1, "p", []answer{a("ls0", 1), a("p", 1), a("r1", 1), down("r2")}, true, "r2"},
		{"p's log lost: no exclusion past it", k1, "p", []answer{a("ls0", 1), a("p", 0), a("r1", 1), down("r2")}, false, "p"},
		{"p down too: nothing to exclude", k1, "p", []answer{a("ls0", 1), down("p"), a("r1", 1), down("r2")}, false, "p"},
		{"joint, r2 down: excluded from both halves", joint, "p", []answer{a("ls0", 1), a("p", 1), a("r1", 1), down("r2"), a("r3", 1)}, true, "r2"},
		{"joint, r2 and r3 down: one member per promotion", joint, "p", []answer{a("ls0", 1), a("p", 1), a("r1", 1), down("r2"), down("r3")}, false, "p"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			v, excluded := judgeReplacing([]*walshipv1.Contract{tc.c}, tc.replaced, tc.answers, promised)
			if v.quorum != tc.quorum || excluded != tc.excluded {
				t.Fatalf("quorum %v excluding %q (needed %s), want %v excluding %q", v.quorum, excluded, v.needed, tc.quorum, tc.excluded)
			}
		})
	}
}
