package node

import (
	"context"
	"os"
	"path/filepath"
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

// joinNode starts id with --peers n0..n2 (which leave it out), --join,
// and leaving as Config.Leaving.
func joinNode(t *testing.T, c *cluster, id string, leaving func(context.Context) (bool, string, error)) *Node {
	t.Helper()
	addr := testkit.FreeAddr(t)
	cfg := c.config(id, RoleReplica)
	cfg.Listen, cfg.Advertise, cfg.Join, cfg.Leaving = addr, addr, true, leaving
	cfg.SwitchoverOnStop = true // as on Kubernetes
	n, err := New(cfg)
	if err != nil {
		t.Fatalf("%s with --join: %v", id, err)
	}
	c.nodes[id], c.runs[id] = n, run(t, n.Run)
	return n
}

// membersAt is the contract's members as the primary reports them
// (ListMembers: the primary answers) once no change is in progress, asked
// at the nodes ids; nil if none answers or a change is still under way
// (the final record can be in force before the change has finished).
func membersAt(t *testing.T, c *cluster, ids ...string) []string {
	for _, id := range ids {
		resp, err := walshipv1.NewAdminServiceClient(c.conn(t, id)).ListMembers(t.Context(), &walshipv1.ListMembersRequest{})
		if err != nil || resp.GetMembership().GetContract() == nil {
			continue
		}
		if m := resp.GetMembership(); m.GetChange() != "" || m.GetJoint() {
			return nil
		}
		var got []string
		for _, m := range resp.GetMembership().GetContract().GetMembers() {
			got = append(got, m.GetId())
		}
		return got
	}
	return nil
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
	n3 := joinNode(t, c, "n3", nil)
	testkit.Until(t, "n3 to be a member at the primary", func() bool { return strings.Join(membersAt(t, c, "n0"), ",") == "n0,n1,n2,n3" })
	testkit.Until(t, "n3's log to name it", func() bool { return joinState("n3", n3.Replica().EpochRecord()) == "" })
	put(t, c.conn(t, "n0"), "b", "2")

	// A joined member leads like any other, though --peers leave it out.
	admin := walshipv1.NewAdminServiceClient(c.conn(t, "n0"))
	if _, err := admin.Switchover(t.Context(), &walshipv1.SwitchoverRequest{Target: "n3"}); err != nil {
		t.Fatalf("switchover to the joined n3: %v", err)
	}
	testkit.Until(t, "n3 to take writes", func() bool { p := n3.Primary(); return p != nil && p.TakingWrites() })
	put(t, c.conn(t, "n3"), "c", "3")
}

// TestScaleDownLeaves: a node that Leaving says is scaled down asks the
// primary to remove it when told to stop, as a replica and as the
// primary (after its hand-over); one that Leaving says is restarting
// stays a member.
func TestScaleDownLeaves(t *testing.T) {
	c := newCluster(t)
	put(t, c.conn(t, "n0"), "a", "1")
	scaledDown := func(down bool) func(context.Context) (bool, string, error) {
		return func(context.Context) (bool, string, error) { return down, "the test says so", nil }
	}
	stop := func(id string) {
		t.Helper()
		if err := c.runs[id].stop(t); err != nil {
			t.Fatalf("%s stop: %v", id, err)
		}
	}

	// A restart: still a member.
	joinNode(t, c, "n3", scaledDown(false))
	testkit.Until(t, "n3 to be a member", func() bool { return strings.Join(membersAt(t, c, "n0"), ",") == "n0,n1,n2,n3" })
	stop("n3")
	if got := strings.Join(membersAt(t, c, "n0"), ","); got != "n0,n1,n2,n3" {
		t.Fatalf("members after n3's restart-like stop: %s; want n3 still among them", got)
	}
	dir3 := filepath.Join(c.dir, "n3")
	if err := os.RemoveAll(dir3); err != nil {
		t.Fatal(err)
	}

	// A replica scaled down.
	removed := func(id string) {
		t.Helper()
		testkit.Until(t, id+" to be removed", func() bool { return strings.Join(membersAt(t, c, "n0", "n1", "n2"), ",") == "n0,n1,n2" })
	}
	// n3 is still a member (down): remove it as an operator would.
	if _, err := walshipv1.NewAdminServiceClient(c.conn(t, "n0")).ChangeMembers(t.Context(), &walshipv1.ChangeMembersRequest{Change: &walshipv1.ChangeMembersRequest_Remove{Remove: "n3"}}); err != nil {
		t.Fatalf("remove n3: %v", err)
	}
	joinNode(t, c, "n4", scaledDown(true))
	testkit.Until(t, "n4 to be a member", func() bool { return strings.Join(membersAt(t, c, "n0"), ",") == "n0,n1,n2,n4" })
	stop("n4")
	removed("n4")

	// The primary scaled down: it hands over, then is removed.
	n5 := joinNode(t, c, "n5", scaledDown(true))
	testkit.Until(t, "n5 to be a member", func() bool { return strings.Join(membersAt(t, c, "n0"), ",") == "n0,n1,n2,n5" })
	if _, err := walshipv1.NewAdminServiceClient(c.conn(t, "n0")).Switchover(t.Context(), &walshipv1.SwitchoverRequest{Target: "n5"}); err != nil {
		t.Fatalf("switchover to n5: %v", err)
	}
	testkit.Until(t, "n5 to take writes, followed by the three others", func() bool {
		p := n5.Primary()
		if p == nil || !p.TakingWrites() {
			return false
		}
		connected := 0
		for _, peer := range p.Status().GetPeers() {
			if peer.GetConnected() && peer.GetRole() == walshipv1.Role_ROLE_REPLICA {
				connected++
			}
		}
		return connected == 3
	})
	stop("n5")
	removed("n5")
}
