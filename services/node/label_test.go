package node

import (
	"testing"
	"time"
)

// TestRoleLabel walks the role label through a promotion, a restart, a
// primary that stops taking writes and one that never opens: a node
// relabels once per hand-over (replica → primary, so that one
// EndpointSlice update moves both Services), and a primary that does not
// take writes loses its label at once when it had taken writes, or after
// promotionLabelGrace when it is still promoting or starting.
func TestRoleLabel(t *testing.T) {
	t0 := time.Unix(1000, 0)
	type step struct {
		at                    time.Duration
		primary, takingWrites bool
		want                  string
	}
	for _, tc := range []struct {
		name  string
		steps []step
	}{
		{"promotion opens within the grace: replica, then primary", []step{
			{0, false, false, "replica"},
			{100 * time.Millisecond, true, false, "replica"},
			{1900 * time.Millisecond, true, false, "replica"},
			{2 * time.Second, true, true, "primary"},
		}},
		{"promotion that does not open: none after the grace", []step{
			{0, false, false, "replica"},
			{100 * time.Millisecond, true, false, "replica"},
			{2100 * time.Millisecond, true, false, ""},
			{5 * time.Second, true, false, ""},
			{6 * time.Second, true, true, "primary"},
		}},
		{"restart as a primary: the label is left as it is until it opens", []step{
			{0, true, false, labelUnknown},
			{1500 * time.Millisecond, true, true, "primary"},
		}},
		{"restart as a primary that does not open: none after the grace", []step{
			{0, true, false, labelUnknown},
			{2 * time.Second, true, false, ""},
		}},
		{"restart as a replica: replica at once", []step{
			{0, false, false, "replica"},
		}},
		{"a primary that stops taking writes: none at once", []step{
			{0, true, true, "primary"},
			{100 * time.Millisecond, true, false, ""},
			{200 * time.Millisecond, true, true, "primary"},
		}},
		{"deposed: replica at once", []step{
			{0, true, true, "primary"},
			{100 * time.Millisecond, false, false, "replica"},
		}},
		{"a second promotion gets a grace of its own", []step{
			{0, false, false, "replica"},
			{100 * time.Millisecond, true, false, "replica"},
			{2200 * time.Millisecond, true, false, ""},
			{3 * time.Second, false, false, "replica"},
			{4 * time.Second, true, false, "replica"},
			{5900 * time.Millisecond, true, false, "replica"},
			{6 * time.Second, true, true, "primary"},
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			last, since := labelUnknown, time.Time{}
			for i, s := range tc.steps {
				got, next := roleLabel(last, s.primary, s.takingWrites, since, t0.Add(s.at))
				if got != s.want {
					t.Fatalf("step %d (+%v, primary %v, taking writes %v, last %q): label %q, want %q", i, s.at, s.primary, s.takingWrites, last, got, s.want)
				}
				last, since = got, next
			}
		})
	}
}
