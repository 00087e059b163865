package node

import (
	"strings"
	"testing"

	walshipv1 "github.com/walship/walship/gen/walship/v1"
	"github.com/walship/walship/internal/testkit"
)

// TestJoinState: whether a --join node still asks to be added, from the
// newest epoch record its log holds.
func TestJoinState(t *testing.T) {
	mem := func(ids ...string) []*walshipv1.Member {
		var ms []*walshipv1.Member
		for _, id := range ids {
			ms = append(ms, &walshipv1.Member{Id: id, Addr: id + ":7401"})
		}
		return ms
	}
	rec := func(c *walshipv1.Contract) *walshipv1.EpochRecord {
		return &walshipv1.EpochRecord{Epoch: 3, Contract: c}
	}
	for _, tc := range []struct {
		name string
		rec  *walshipv1.EpochRecord
		want string // "" : asks nothing; else a part of why it asks
	}{
		{"no record yet", nil, "holds no contract yet"},
		{"a record without a contract", rec(nil), "holds no contract yet"},
		{"not named", rec(&walshipv1.Contract{Members: mem("n0", "n1", "n2")}), "does not name it (members n0, n1, n2"},
		{"a member (a restart, or added)", rec(&walshipv1.Contract{Members: mem("n0", "n1", "n2", "n3")}), ""},
		{"a learner (being added)", rec(&walshipv1.Contract{Members: mem("n0", "n1", "n2"), Learners: mem("n3")}), ""},
		{"joining in a joint record", rec(&walshipv1.Contract{Members: mem("n0", "n1", "n2"), Next: &walshipv1.Configuration{Members: mem("n0", "n1", "n2", "n3")}}), ""},
		{"leaving in a joint record", rec(&walshipv1.Contract{Members: mem("n0", "n1", "n2", "n3"), Next: &walshipv1.Configuration{Members: mem("n0", "n1", "n2")}}), ""},
		{"dropped learner", rec(&walshipv1.Contract{Members: mem("n0", "n1", "n2"), Learners: mem("x")}), "does not name it"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := joinState("n3", tc.rec)
			if (got == "") != (tc.want == "") || !strings.Contains(got, tc.want) {
				t.Fatalf("joinState = %q, want %q", got, tc.want)
			}
		})
	}
}

// TestNewRefusesAnOutsiderWithoutJoin: --peers that leave the node out
// refuse it unless --join, which needs --advertise (the address the
// primary adds it at).
func TestNewRefusesAnOutsiderWithoutJoin(t *testing.T) {
	c := newCluster(t)
	addr := testkit.FreeAddr(t)
	for _, tc := range []struct {
		name      string
		join      bool
		advertise string
		want      string
	}{
		{"no --join", false, addr, `--peers: this node's --id "n3" is not among them (--join lets it start`},
		{"--join without --advertise", true, "", "--advertise: required with --join"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := c.config("n3", RoleReplica)
			cfg.Listen, cfg.Advertise, cfg.Join = addr, tc.advertise, tc.join
			if _, err := New(cfg); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("New = %v, want an error with %q", err, tc.want)
			}
		})
	}
}

// TestJoinAddsTheNode: a StatefulSet scaled from 3 to 4, in process: n3
// starts with --peers n0..n2 and --join, catches up as a replica that
// counts for nothing and may not contend, and asks the primary to add it;
// it ends a member of the contract the primary writes (ListMembers), and
// it can then be switched over to (its primary role has its own id among
// the members though --peers leave it out).
func TestJoinAddsTheNode(t *testing.T) {
	c := newCluster(t)
	put(t, c.conn(t, "n0"), "a", "1")
	addr := testkit.FreeAddr(t)
	cfg := c.config("n3", RoleReplica)
	cfg.Listen, cfg.Advertise, cfg.Join = addr, addr, true
	n3, err := New(cfg)
	if err != nil {
		t.Fatalf("n3 with --join: %v", err)
	}
	c.nodes["n3"], c.runs["n3"] = n3, run(t, n3.Run)
	admin := walshipv1.NewAdminServiceClient(c.conn(t, "n0"))
	members := func() []string {
		resp, err := admin.ListMembers(t.Context(), &walshipv1.ListMembersRequest{})
		if err != nil {
			return nil
		}
		var ids []string
		for _, m := range resp.GetMembership().GetContract().GetMembers() {
			ids = append(ids, m.GetId())
		}
		return ids
	}
	testkit.Until(t, "n3 to be a member at the primary", func() bool { return strings.Join(members(), ",") == "n0,n1,n2,n3" })
	testkit.Until(t, "n3's log to name it", func() bool { return joinState("n3", n3.Replica().EpochRecord()) == "" })
	put(t, c.conn(t, "n0"), "b", "2")

	// A joined member leads like any other, though --peers leave it out.
	if _, err := admin.Switchover(t.Context(), &walshipv1.SwitchoverRequest{Target: "n3"}); err != nil {
		t.Fatalf("switchover to the joined n3: %v", err)
	}
	testkit.Until(t, "n3 to take writes", func() bool { p := n3.Primary(); return p != nil && p.TakingWrites() })
	put(t, c.conn(t, "n3"), "c", "3")
}
