package kube

import (
	"strings"
	"testing"
)

// TestScaledDownTo: a pod whose ordinal the StatefulSet's spec.replicas
// leaves out is scaled down; any other stop (a restart, a rolling update,
// the whole StatefulSet deleted) is not.
func TestScaledDownTo(t *testing.T) {
	for _, tc := range []struct {
		name     string
		pod      string
		replicas int32
		deleting bool
		down     bool
		err      string
	}{
		{"restart", "walship-2", 3, false, false, ""},
		{"highest ordinal scaled down", "walship-3", 3, false, true, ""},
		{"two at once", "walship-4", 3, false, true, ""},
		{"to zero", "walship-0", 0, false, true, ""},
		{"scaled up meanwhile", "walship-3", 5, false, false, ""},
		{"statefulset deleted", "walship-3", 3, true, false, ""},
		{"a dash in the set's name", "my-walship-10", 10, false, true, ""},
		{"not a statefulset pod", "walship", 3, false, false, "not named <statefulset>-<ordinal>"},
		{"a deployment's pod", "walship-7d9f8-abcde", 3, false, false, "not named <statefulset>-<ordinal>"},
		{"a leading zero", "walship-03", 3, false, false, "not named <statefulset>-<ordinal>"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, ord, err := StatefulSetOrdinal(tc.pod)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("StatefulSetOrdinal(%q) = %d, %v; want an error with %q", tc.pod, ord, err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if down, why := ScaledDownTo(ord, tc.replicas, tc.deleting); down != tc.down {
				t.Fatalf("ScaledDownTo(%d, %d, %v) = %v (%s), want %v", ord, tc.replicas, tc.deleting, down, why, tc.down)
			}
		})
	}
}
