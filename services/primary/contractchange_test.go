package primary

import (
	"slices"
	"testing"

	walshipv1 "github.com/walship/walship/gen/walship/v1"
)

// TestEpochChangeWait: what an epoch record that changes the contract
// must reach under the previous one before the primary opens.
func TestEpochChangeWait(t *testing.T) {
	ct := func(k uint32, lsSync bool, ls []string, ids ...string) *walshipv1.Contract {
		c := &walshipv1.Contract{SyncReplicas: k, LogstoreSync: lsSync, Logstores: ls, SyncLevel: walshipv1.SyncLevel_SYNC_LEVEL_FLUSH}
		for _, id := range ids {
			c.Members = append(c.Members, &walshipv1.Member{Id: id, Addr: id + ":1"})
		}
		return c
	}
	ls1, ls2 := []string{"a", "b", "c"}, []string{"a", "b", "d"}
	level := ct(1, false, ls1, "n0", "n1")
	level.SyncLevel = walshipv1.SyncLevel_SYNC_LEVEL_APPLY
	for _, tc := range []struct {
		name       string
		prev, next *walshipv1.Contract
		self       string
		need       int // 0: no wait
		voters     []string
	}{
		{"no previous record", nil, ct(1, false, ls1, "n0", "n1"), "n0", 0, nil},
		{"unchanged", ct(1, false, ls1, "n0", "n1"), ct(1, false, ls1, "n1", "n0"), "n0", 0, nil},
		{"level only", ct(1, false, ls1, "n0", "n1"), level, "n0", 0, nil},
		{"member added, k 1", ct(1, false, ls1, "n0", "n1"), ct(1, false, ls1, "n0", "n1", "n2"), "n1", 1, []string{"n0"}},
		{"member removed, k 2", ct(2, false, ls1, "n0", "n1", "n2", "n3"), ct(2, false, ls1, "n0", "n1", "n2"), "n0", 2, []string{"n1", "n2", "n3"}},
		{"k lowered", ct(2, false, ls1, "n0", "n1", "n2", "n3"), ct(1, false, ls1, "n0", "n1", "n2", "n3"), "n0", 2, []string{"n1", "n2", "n3"}},
		{"primary not an old member", ct(1, false, ls1, "n0", "n1", "n2"), ct(1, false, ls1, "n1", "n2", "n3"), "n3", 2, []string{"n0", "n1", "n2"}},
		{"new waits for nobody", ct(1, false, ls1, "n0", "n1"), ct(0, false, ls1, "n0", "n1", "n2"), "n0", 0, nil},
		{"new waits for the same log stores", ct(0, false, ls1, "n0", "n1"), ct(1, true, ls1, "n0", "n1", "n2"), "n0", 0, nil},
		{"old k 0: every old member", ct(0, false, ls1, "n0", "n1", "n2"), ct(1, false, ls1, "n0", "n1", "n2"), "n0", 2, []string{"n1", "n2"}},
		{"old log store sync, new log stores: every old member", ct(1, true, ls1, "n0", "n1", "n2"), ct(1, true, ls2, "n0", "n1", "n2"), "n0", 2, []string{"n1", "n2"}},
		{"log store sync dropped", ct(0, true, ls1, "n0", "n1"), ct(1, false, ls1, "n0", "n1", "n2"), "n0", 1, []string{"n1"}},
		{"old contract only the primary", ct(0, false, ls1, "n0"), ct(1, false, ls1, "n0", "n1"), "n0", 0, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w, ok := epochChangeWait(tc.prev, tc.next, tc.self)
			if tc.need == 0 {
				if ok {
					t.Fatalf("wait %+v, want none", w)
				}
				return
			}
			if !ok || w.need != tc.need || !slices.Equal(w.voters, tc.voters) || w.why == "" {
				t.Fatalf("wait %+v (%v), want %d of %v", w, ok, tc.need, tc.voters)
			}
		})
	}
}
