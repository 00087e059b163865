package node

import (
	"strings"
	"testing"

	walshipv1 "github.com/walship/walship/gen/walship/v1"
)

// TestFencedEachLogStoreHalf: a candidate that fenced log stores A, B, C
// (its own log's set) and caught up to a log whose contract replaced C
// with D opens only if a majority of {A, B, D} promised — during a
// partition that leaves the old primary with A and D, B alone is not
// enough: the old primary still renews its lease (and acknowledges
// under log store sync) through A and D. While the change is joint,
// both sets need one. A contract no run-time change wrote binds nothing
// (a primary then uses its --logstore).
func TestFencedEachLogStoreHalf(t *testing.T) {
	ls := func(id string, granted bool) answer {
		return answer{id: id, addr: id, logstore: true, granted: granted}
	}
	final := &walshipv1.Contract{Logstores: []string{"A", "B", "D"}, MembersChanged: true, LogstoreSync: true}
	joint := &walshipv1.Contract{Logstores: []string{"A", "B", "C"}, MembersChanged: true, LogstoreSync: true,
		Next: &walshipv1.Configuration{Logstores: []string{"A", "B", "D"}}}
	for _, tc := range []struct {
		name    string
		c       *walshipv1.Contract
		answers []answer
		refused string
	}{
		{"partitioned: B and C promised, final {A,B,D}", final, []answer{ls("A", false), ls("B", true), ls("C", true)}, "only 1 of them (B)"},
		{"healed: A, B and C promised, final {A,B,D}", final, []answer{ls("A", true), ls("B", true), ls("C", true)}, ""},
		{"joint: B and C promised", joint, []answer{ls("A", false), ls("B", true), ls("C", true)}, "A, B, D"},
		{"joint: A and B promised", joint, []answer{ls("A", true), ls("B", true), ls("C", false)}, ""},
		{"a data node's promise is not a log store's", final, []answer{ls("B", true), {id: "A", granted: true}}, "only 1 of them"},
		{"no run-time change: --logstore decides", &walshipv1.Contract{Logstores: []string{"A", "B", "D"}}, []answer{ls("X", true), ls("Y", true)}, ""},
		{"no contract", nil, nil, ""},
	} {
		err := fencedEachLogStoreHalf(tc.c, tc.answers)
		switch {
		case tc.refused == "" && err != nil:
			t.Errorf("%s: refused: %v", tc.name, err)
		case tc.refused != "" && (err == nil || !strings.Contains(err.Error(), tc.refused)):
			t.Errorf("%s: %v, want a refusal naming %q", tc.name, err, tc.refused)
		}
	}
}
