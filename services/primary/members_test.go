package primary

import (
	"fmt"
	"strings"
	"testing"

	walshipv1 "github.com/walship/walship/gen/walship/v1"
)

// TestVoices: every data node and log store of a contract once, with what
// it counts for — in both halves while joint (voter), the current only
// (leaving), next only (joining), nothing (learner).
func TestVoices(t *testing.T) {
	m := func(ids ...string) []*walshipv1.Member {
		var out []*walshipv1.Member
		for _, id := range ids {
			out = append(out, &walshipv1.Member{Id: id, Addr: id + ":1"})
		}
		return out
	}
	show := func(ms []*walshipv1.MemberStatus) string {
		var b strings.Builder
		for _, s := range ms {
			fmt.Fprintf(&b, "%s/%s/%s ", s.GetId(), strings.TrimPrefix(s.GetRole().String(), "ROLE_"), strings.TrimPrefix(s.GetVoice().String(), "MEMBER_VOICE_"))
		}
		return strings.TrimSpace(b.String())
	}
	for _, tc := range []struct {
		name string
		c    *walshipv1.Contract
		want string
	}{
		{"plain", &walshipv1.Contract{Members: m("p", "a"), Logstores: []string{"l0"}},
			"p/PRIMARY/PRIMARY a/REPLICA/VOTER l0/LOGSTORE/VOTER"},
		{"learner", &walshipv1.Contract{Members: m("p", "a"), Logstores: []string{"l0"}, Learners: m("b")},
			"p/PRIMARY/PRIMARY a/REPLICA/VOTER l0/LOGSTORE/VOTER b/REPLICA/LEARNER"},
		{"joint: replace a by b, l1 by l2", &walshipv1.Contract{Members: m("p", "a", "c"), Logstores: []string{"l0", "l1"},
			Next: &walshipv1.Configuration{Members: m("p", "b", "c"), Logstores: []string{"l0", "l2"}}},
			"p/PRIMARY/PRIMARY a/REPLICA/LEAVING c/REPLICA/VOTER b/REPLICA/JOINING l0/LOGSTORE/VOTER l1/LOGSTORE/LEAVING l2/LOGSTORE/JOINING"},
		{"a log store named like a node", &walshipv1.Contract{Members: m("p", "x"), Logstores: []string{"x"}},
			"p/PRIMARY/PRIMARY x/REPLICA/VOTER x/LOGSTORE/VOTER"},
	} {
		if got := show(Voices(tc.c, "p")); got != tc.want {
			t.Errorf("%s:\n got %s\nwant %s", tc.name, got, tc.want)
		}
	}
}
