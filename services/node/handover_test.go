package node

import (
	"testing"

	walshipv1 "github.com/walship/walship/gen/walship/v1"
	"github.com/walship/walship/services/primary"
)

// TestHandOverTarget: a primary told to stop hands over to the connected
// replica among the members that has flushed the most; a replica that is
// not a member (no --peers entry: a switchover to it is refused), a log
// store or a disconnected replica is never chosen, and each "none" says why.
func TestHandOverTarget(t *testing.T) {
	members := []primary.Member{{ID: "n0", Addr: "a0"}, {ID: "n1", Addr: "a1"}, {ID: "n2", Addr: "a2"}}
	rep := func(id string, connected bool, flushed uint64) *walshipv1.PeerStatus {
		return &walshipv1.PeerStatus{Id: id, Role: walshipv1.Role_ROLE_REPLICA, Connected: connected, FlushedLsn: flushed}
	}
	for _, tc := range []struct {
		name    string
		peers   []*walshipv1.PeerStatus
		members []primary.Member
		want    string
		why     string
	}{
		{"the most advanced", []*walshipv1.PeerStatus{rep("n1", true, 10), rep("n2", true, 12)}, members, "n2", ""},
		{"a tie goes to the first member", []*walshipv1.PeerStatus{rep("n2", true, 12), rep("n1", true, 12)}, members, "n1", ""},
		{"a disconnected replica is skipped", []*walshipv1.PeerStatus{rep("n1", true, 10), rep("n2", false, 99)}, members, "n1", ""},
		{"a replica outside --peers is skipped", []*walshipv1.PeerStatus{rep("r9", true, 99), rep("n2", true, 5)}, members, "n2", ""},
		{"a log store is no target", []*walshipv1.PeerStatus{{Id: "n1", Role: walshipv1.Role_ROLE_LOGSTORE, Connected: true, FlushedLsn: 50}}, members, "", "no replica among --peers is connected"},
		{"nothing connected", []*walshipv1.PeerStatus{rep("n1", false, 1)}, members, "", "no replica among --peers is connected"},
		{"no --peers", []*walshipv1.PeerStatus{rep("r0", true, 1)}, nil, "", "no other member to switch over to (--peers)"},
		{"itself alone", []*walshipv1.PeerStatus{rep("r0", true, 1)}, members[:1], "", "no other member to switch over to (--peers)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, _, why := handOverTarget(tc.peers, tc.members, "n0")
			if got != tc.want || why != tc.why {
				t.Fatalf("handOverTarget = %q (why %q), want %q (why %q)", got, why, tc.want, tc.why)
			}
		})
	}
}
