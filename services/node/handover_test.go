package node

import (
	"testing"

	walshipv1 "github.com/walship/walship/gen/walship/v1"
)

// TestHandOverTarget: a primary told to stop hands over to the connected
// replica among the contract's members that has flushed the most; a
// replica that is not a member (a switchover to it is refused), one that
// may not lead under the contract (a learner, a member joining or leaving
// in a change: it would refuse to promote), a log store or a disconnected
// replica is never chosen, and each "none" says why.
func TestHandOverTarget(t *testing.T) {
	members := &walshipv1.Contract{Members: memberList("n0", "n1", "n2")}
	learner := &walshipv1.Contract{Members: memberList("n0", "n1"), Learners: memberList("n2")}
	leaving := &walshipv1.Contract{Members: memberList("n0", "n1", "n2"), Next: &walshipv1.Configuration{Members: memberList("n0", "n1")}}
	joining := &walshipv1.Contract{Members: memberList("n0", "n1"), Next: &walshipv1.Configuration{Members: memberList("n0", "n1", "n2")}}
	rep := func(id string, connected bool, flushed uint64) *walshipv1.PeerStatus {
		return &walshipv1.PeerStatus{Id: id, Role: walshipv1.Role_ROLE_REPLICA, Connected: connected, FlushedLsn: flushed}
	}
	for _, tc := range []struct {
		name    string
		peers   []*walshipv1.PeerStatus
		members *walshipv1.Contract
		want    string
		why     string
	}{
		{"the most advanced", []*walshipv1.PeerStatus{rep("n1", true, 10), rep("n2", true, 12)}, members, "n2", ""},
		{"a tie goes to the first member", []*walshipv1.PeerStatus{rep("n2", true, 12), rep("n1", true, 12)}, members, "n1", ""},
		{"a disconnected replica is skipped", []*walshipv1.PeerStatus{rep("n1", true, 10), rep("n2", false, 99)}, members, "n1", ""},
		{"a replica outside the contract is skipped", []*walshipv1.PeerStatus{rep("r9", true, 99), rep("n2", true, 5)}, members, "n2", ""},
		{"a learner is skipped", []*walshipv1.PeerStatus{rep("n2", true, 99), rep("n1", true, 5)}, learner, "n1", ""},
		{"a member leaving is skipped", []*walshipv1.PeerStatus{rep("n2", true, 99), rep("n1", true, 5)}, leaving, "n1", ""},
		{"a member joining is skipped", []*walshipv1.PeerStatus{rep("n2", true, 99), rep("n1", true, 5)}, joining, "n1", ""},
		{"only a learner connected", []*walshipv1.PeerStatus{rep("n2", true, 99)}, learner, "", "no replica that may lead under the contract is connected"},
		{"a log store is no target", []*walshipv1.PeerStatus{{Id: "n1", Role: walshipv1.Role_ROLE_LOGSTORE, Connected: true, FlushedLsn: 50}}, members, "", "no replica that may lead under the contract is connected"},
		{"nothing connected", []*walshipv1.PeerStatus{rep("n1", false, 1)}, members, "", "no replica that may lead under the contract is connected"},
		{"no contract", []*walshipv1.PeerStatus{rep("r0", true, 1)}, nil, "", "no other member of the contract to switch over to"},
		{"itself alone", []*walshipv1.PeerStatus{rep("r0", true, 1)}, &walshipv1.Contract{Members: memberList("n0")}, "", "no other member of the contract to switch over to"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, _, why := handOverTarget(tc.peers, tc.members, "n0")
			if got != tc.want || why != tc.why {
				t.Fatalf("handOverTarget = %q (why %q), want %q (why %q)", got, why, tc.want, tc.why)
			}
		})
	}
}
