package failover

import (
	"fmt"
	"strings"
	"testing"
)

// jointCase is one pair of configurations over a universe of voters (data
// members or log stores): bit i of a mask is voter ids[i].
type jointCase struct {
	ids      []string
	logStore bool // the voters are log stores (else members)
	old, new Contract
}

// quorumMasks are the minimal sets of voters that satisfy a rule, the rule
// evaluated on every subset of the universe (the real functions, not a
// formula); ok reports whether a subset satisfies it.
func minimal(u int, ok func(mask uint) bool) []uint {
	is := make([]bool, 1<<u)
	for m := uint(0); m < 1<<u; m++ {
		is[m] = ok(m)
	}
	var out []uint
	for m := uint(0); m < 1<<u; m++ {
		if !is[m] {
			continue
		}
		min := true
		for r := m; r != 0; r &= r - 1 {
			if is[m&^(r&-r)] {
				min = false
				break
			}
		}
		if min {
			out = append(out, m)
		}
	}
	return out
}

// acks are the minimal voter sets whose acknowledgement commits under qs
// (JointAckLSN: those in the set at LSN 1, the others at 0).
func (jc jointCase) acks(qs []Quorum) []uint {
	return minimal(len(jc.ids), func(m uint) bool {
		pos := map[string]uint64{}
		for i, id := range jc.ids {
			if m&(1<<i) != 0 {
				pos[id] = 1
			}
		}
		return JointAckLSN(pos, 1, qs...) == 1
	})
}

// promotions are the minimal voter sets whose promises make a promotion
// quorum under cfg (Config.Judge; the old primary "p" is replaced; for
// members, one log store "l0" always promises).
func (jc jointCase) promotions(cfg Config) []uint {
	return minimal(len(jc.ids), func(m uint) bool {
		var answers []Answer
		if !jc.logStore {
			answers = append(answers, Answer{ID: "l0", LogStore: true})
		}
		for i, id := range jc.ids {
			if m&(1<<i) != 0 {
				answers = append(answers, Answer{ID: id, LogStore: jc.logStore})
			}
		}
		return cfg.Judge("p", answers, answers).Quorum
	})
}

// waits: the rule waits for someone (an ack quorum of no voter at all
// protects nothing and needs no promotion to meet it).
func waits(qs []Quorum) bool {
	for _, q := range qs {
		if q.Need > 0 {
			return true
		}
	}
	return false
}

func meetAll(t *testing.T, what string, jc jointCase, ps, as []uint) {
	t.Helper()
	for _, p := range ps {
		for _, a := range as {
			if p&a == 0 {
				t.Fatalf("%s: old %v k=%d, new %v k=%d (%v): promotion quorum %s misses ack quorum %s",
					what, jc.old.Members, jc.old.K, jc.new.Members, jc.new.K, jc.ids, set(jc.ids, p), set(jc.ids, a))
			}
		}
	}
}

// missesOne: some promotion quorum in ps misses some ack quorum in as.
func missesOne(ps, as []uint) bool {
	for _, p := range ps {
		for _, a := range as {
			if p&a == 0 {
				return true
			}
		}
	}
	return false
}

func set(ids []string, m uint) []string {
	var out []string
	for i, id := range ids {
		if m&(1<<i) != 0 {
			out = append(out, id)
		}
	}
	return out
}

// jointCases: every pair of configurations of 1..5 voters each, by how
// many voters are only in the old one (a), in both (b) and only in the
// new one (c); for members every k ≤ N of each half (0 included), for
// log stores a majority of each under log store sync.
func jointCases(logStore bool) []jointCase {
	var out []jointCase
	for b := 0; b <= 5; b++ {
		for a := 0; a+b <= 5; a++ {
			for c := 0; b+c <= 5; c++ {
				if a+b == 0 || b+c == 0 {
					continue
				}
				var ids, old, new []string
				for i := range a + b + c {
					id := fmt.Sprintf("v%d", i)
					ids = append(ids, id)
					if i < a+b {
						old = append(old, id)
					}
					if i >= a {
						new = append(new, id)
					}
				}
				if logStore {
					out = append(out, jointCase{ids: ids, logStore: true,
						old: Contract{Members: []string{"p"}, LogStores: old, LogStoreSync: true},
						new: Contract{Members: []string{"p"}, LogStores: new, LogStoreSync: true}})
					continue
				}
				for ko := 0; ko <= len(old); ko++ {
					for kn := 0; kn <= len(new); kn++ {
						out = append(out, jointCase{ids: ids,
							old: Contract{Members: append([]string{"p"}, old...), LogStores: []string{"l0"}, K: ko},
							new: Contract{Members: append([]string{"p"}, new...), LogStores: []string{"l0"}, K: kn}})
					}
				}
			}
		}
	}
	return out
}

// TestJointPromotionMeetsEveryAck: for every pair of configurations of up
// to 5 members (every k ≤ N of each) and of up to 5 log stores (log store
// sync), every promotion quorum under the joint contract meets every ack
// quorum of the old contract (commits before the joint record), of the
// joint one and of the new one (commits after the final record); and the
// two steps of a change are safe: a promotion under the old contract
// alone (a candidate that has not seen the joint record) and one under
// the new contract alone (the final record written once the joint record
// committed) meet every joint ack quorum, for every change ValidChange
// allows (it refuses going from k = 0 to more, which this check would
// fail: the test asserts so). Last, the test can fail: for
// some pair a promotion under the old contract alone misses an ack
// quorum of the new one — why a change cannot go from C_old to C_new in
// one record.
func TestJointPromotionMeetsEveryAck(t *testing.T) {
	oneStepUnsafe := false
	for _, logStore := range []bool{false, true} {
		cases := jointCases(logStore)
		for _, jc := range cases {
			old := Config{Old: jc.old}
			joint := Config{Old: jc.old, New: jc.new, Joint: true}
			new := Config{Old: jc.new}
			jointP := jc.promotions(joint)
			for _, ack := range []struct {
				name string
				qs   []Quorum
			}{
				{"old acks", old.AckQuorums("p")},
				{"joint acks", joint.AckQuorums("p")},
				{"new acks", new.AckQuorums("p")},
			} {
				if waits(ack.qs) {
					meetAll(t, "joint promotion, "+ack.name, jc, jointP, jc.acks(ack.qs))
				}
			}
			if jqs := joint.AckQuorums("p"); waits(jqs) {
				as := jc.acks(jqs)
				if ValidChange(jc.old, jc.new, "p") == nil {
					meetAll(t, "old promotion, joint acks", jc, jc.promotions(old), as)
					meetAll(t, "new promotion, joint acks", jc, jc.promotions(new), as)
				} else if jc.old.K == 0 && jc.new.K > 0 && !missesOne(jc.promotions(old), as) {
					t.Fatalf("old %v k=0, new %v k=%d: refused, yet every old promotion meets every joint ack",
						jc.old.Members, jc.new.Members, jc.new.K)
				}
			}
			if nqs := new.AckQuorums("p"); waits(nqs) && !oneStepUnsafe {
				oneStepUnsafe = missesOne(jc.promotions(old), jc.acks(nqs))
			}
		}
		t.Logf("log stores %v: %d configuration pairs", logStore, len(cases))
	}
	if !oneStepUnsafe {
		t.Fatal("no pair where an old promotion quorum misses a new ack quorum: the check cannot fail")
	}
}

// TestJointAckLSN: under a joint contract a commit waits for both halves.
func TestJointAckLSN(t *testing.T) {
	cfg := Config{
		Old:   Contract{Members: []string{"p", "a", "b"}, LogStores: []string{"l0", "l1", "l2"}, K: 1, LogStoreSync: true},
		New:   Contract{Members: []string{"p", "b", "c", "d"}, LogStores: []string{"l1", "l2", "l3"}, K: 2, LogStoreSync: true},
		Joint: true,
	}
	pos := map[string]uint64{"a": 9, "b": 3, "c": 7, "d": 5, "l0": 9, "l1": 8, "l2": 2, "l3": 6, "learner": 100}
	// Old: k=1 of {a,b} → 9; majority of {l0,l1,l2} → 8.
	// New: k=2 of {b,c,d} → 5; majority of {l1,l2,l3} → 6.
	for _, tc := range []struct {
		name string
		qs   []Quorum
		want uint64
	}{
		{"old", Config{Old: cfg.Old}.AckQuorums("p"), 8},
		{"new", Config{Old: cfg.New}.AckQuorums("p"), 5},
		{"joint", cfg.AckQuorums("p"), 5},
	} {
		if got := JointAckLSN(pos, 100, tc.qs...); got != tc.want {
			t.Errorf("%s: JointAckLSN = %d, want %d", tc.name, got, tc.want)
		}
	}
	if got := JointAckLSN(pos, 4, cfg.AckQuorums("p")...); got != 4 {
		t.Errorf("capped at the primary's end: got %d, want 4", got)
	}
	// A member missing from pos (not connected) is at 0.
	delete(pos, "c")
	if got := JointAckLSN(pos, 100, cfg.AckQuorums("p")...); got != 3 {
		t.Errorf("c not connected: got %d, want 3", got)
	}
}

func TestValidChange(t *testing.T) {
	base := Contract{Members: []string{"p", "a", "b"}, LogStores: []string{"l0", "l1", "l2"}, K: 1}
	with := func(f func(*Contract)) Contract { c := base; f(&c); return c }
	for _, tc := range []struct {
		name string
		new  Contract
		want string // a word the error names; "" for none
	}{
		{"add a member", with(func(c *Contract) { c.Members = []string{"p", "a", "b", "c"} }), ""},
		{"remove a member", with(func(c *Contract) { c.Members = []string{"p", "a"} }), ""},
		{"replace a log store", with(func(c *Contract) { c.LogStores = []string{"l0", "l1", "l9"} }), ""},
		{"raise k with members", with(func(c *Contract) { c.Members = []string{"p", "a", "b", "c"}; c.K = 2 }), ""},
		{"k to 0", with(func(c *Contract) { c.K = 0 }), "sync_replicas"},
		{"log store sync", with(func(c *Contract) { c.LogStoreSync = true }), "logstore_sync"},
		{"remove the primary", with(func(c *Contract) { c.Members = []string{"a", "b"} }), "primary"},
		{"below k", with(func(c *Contract) { c.Members = []string{"p"} }), "sync_replicas 1"},
		{"no log store", with(func(c *Contract) { c.LogStores = nil }), "logstores"},
		{"a member twice", with(func(c *Contract) { c.Members = []string{"p", "a", "b", "a"} }), `members: "a" twice`},
		{"a log store twice", with(func(c *Contract) { c.LogStores = []string{"l0", "l1", "l2", "l1"} }), `logstores: "l1" twice`},
	} {
		err := ValidChange(base, tc.new, "p")
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("%s: %v", tc.name, err)
		case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("%s: got %v, want an error naming %q", tc.name, err, tc.want)
		}
	}
}

func TestConfigLeads(t *testing.T) {
	old := Contract{Members: []string{"p", "a", "b"}, LogStores: []string{"l0"}, K: 1}
	new := Contract{Members: []string{"p", "a", "c"}, LogStores: []string{"l0"}, K: 1}
	for _, tc := range []struct {
		cfg  Config
		id   string
		want bool
	}{
		{Config{Old: old}, "a", true},
		{Config{Old: old}, "c", false}, // removed, or never added
		{Config{Old: old, New: new, Joint: true}, "p", true},
		{Config{Old: old, New: new, Joint: true}, "b", false}, // leaving
		{Config{Old: old, New: new, Joint: true}, "c", false}, // joining
		{Config{Old: old, Learners: []string{"d"}}, "d", false},
	} {
		if got := tc.cfg.Leads(tc.id); got != tc.want {
			t.Errorf("%+v: Leads(%q) = %v, want %v", tc.cfg, tc.id, got, tc.want)
		}
	}
}

// TestLeadsMeetsEveryAck: the promotion rule counts on the primary that
// acknowledged a write holding it as a member (Config.Leads). For every
// pair of configurations of up to 4 members besides "p" (every k of
// each half; a log store that always promises), under the old, the joint
// and the new configuration, and every primary q and replaced primary r
// (r ≠ q: a primary acknowledges, later another is replaced), every
// promotion quorum replacing r meets every set that holds a write q
// acknowledged — its acks and q itself — if q leads; and for some q that
// does not lead, one misses it (seed 12718's loss).
func TestLeadsMeetsEveryAck(t *testing.T) {
	nonLeaderMisses, checked := false, 0
	for _, jc := range jointCases(false) {
		if len(jc.ids) > 4 {
			continue
		}
		u := append([]string{"p"}, jc.ids...)
		for _, cfg := range []Config{{Old: jc.old}, {Old: jc.old, New: jc.new, Joint: true}, {Old: jc.new}} {
			promotions := map[string][]uint{}
			for _, r := range u {
				promotions[r] = minimal(len(u), func(m uint) bool {
					answers := []Answer{{ID: "l0", LogStore: true}}
					for i, id := range u {
						if m&(1<<i) != 0 {
							answers = append(answers, Answer{ID: id})
						}
					}
					return cfg.Judge(r, answers, answers).Quorum
				})
			}
			for qi, q := range u {
				qs := cfg.AckQuorums(q)
				if !waits(qs) {
					continue
				}
				acks := minimal(len(u), func(m uint) bool {
					pos := map[string]uint64{}
					for i, id := range u {
						if m&(1<<i) != 0 {
							pos[id] = 1
						}
					}
					return JointAckLSN(pos, 1, qs...) == 1
				})
				for _, r := range u {
					if r == q {
						continue
					}
					for _, a := range acks {
						holders := a | 1<<qi
						for _, p := range promotions[r] {
							checked++
							if p&holders != 0 {
								continue
							}
							if cfg.Leads(q) {
								t.Fatalf("%+v: primary %s leads, replaced %s: promotion %v misses holders %v", cfg, q, r, set(u, p), set(u, holders))
							}
							nonLeaderMisses = true
						}
					}
				}
			}
		}
	}
	if !nonLeaderMisses {
		t.Fatal("no primary outside a half whose write a promotion misses: the check cannot fail")
	}
	t.Logf("%d (promotion, holders) pairs checked", checked)
}
