package node

import (
	"path/filepath"
	"testing"
	"time"

	walshipv1 "github.com/walship/walship/gen/walship/v1"
	"github.com/walship/walship/internal/testkit"
	"github.com/walship/walship/services/logstore"
	"github.com/walship/walship/services/primary"
)

// TestRoleLabel walks the role label through a promotion, a restart, a
// primary that stops taking writes and one that never opens: a node
// relabels once per hand-over (replica → primary, one patch, which moves
// walship-rw alone: walship-ro selects the reads label), and a primary that does not
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

// TestReadsLabel walks both labels through a hand-over, a restart, a
// primary that stops taking writes and one that is deposed: a promotion
// changes the role alone (walship-rw's EndpointSlice), and the reads
// label goes readsLabelGrace after the new primary takes writes
// (walship-ro's, in a kube-proxy sync of its own).
func TestReadsLabel(t *testing.T) {
	t0 := time.Unix(1000, 0)
	type step struct {
		at                    time.Duration
		primary, takingWrites bool
		role, reads           string
	}
	for _, tc := range []struct {
		name  string
		steps []step
	}{
		{"promotion: the role changes, the reads label a grace later", []step{
			{0, false, false, "replica", readsOn},
			{100 * time.Millisecond, true, false, "replica", readsOn},
			{500 * time.Millisecond, true, true, "primary", readsOn},
			{2400 * time.Millisecond, true, true, "primary", readsOn},
			{2500 * time.Millisecond, true, true, "primary", ""},
			{10 * time.Second, true, true, "primary", ""},
		}},
		{"promotion that does not open: both go after the grace", []step{
			{0, false, false, "replica", readsOn},
			{100 * time.Millisecond, true, false, "replica", readsOn},
			{2100 * time.Millisecond, true, false, "", ""},
			{3 * time.Second, true, true, "primary", ""},
		}},
		{"restart as a primary: both left as they are, the reads label a grace after it opens", []step{
			{0, true, false, labelUnknown, labelUnknown},
			{1 * time.Second, true, true, "primary", labelUnknown},
			{2900 * time.Millisecond, true, true, "primary", labelUnknown},
			{3 * time.Second, true, true, "primary", ""},
		}},
		{"restart as a primary that does not open: none after the grace", []step{
			{0, true, false, labelUnknown, labelUnknown},
			{2 * time.Second, true, false, "", ""},
		}},
		{"restart as a replica: both at once", []step{
			{0, false, false, "replica", readsOn},
		}},
		{"a primary that loses its lease within the grace: none at once, and none back", []step{
			{0, false, false, "replica", readsOn},
			{100 * time.Millisecond, true, true, "primary", readsOn},
			{1 * time.Second, true, false, "", ""},
			{1200 * time.Millisecond, true, true, "primary", ""},
		}},
		{"deposed: replica and reads at once", []step{
			{0, false, false, "replica", readsOn},
			{100 * time.Millisecond, true, true, "primary", readsOn},
			{5 * time.Second, true, true, "primary", ""},
			{6 * time.Second, false, false, "replica", readsOn},
		}},
		{"a second promotion gets a grace of its own", []step{
			{0, false, false, "replica", readsOn},
			{100 * time.Millisecond, true, true, "primary", readsOn},
			{2200 * time.Millisecond, true, true, "primary", ""},
			{3 * time.Second, false, false, "replica", readsOn},
			{4 * time.Second, true, false, "replica", readsOn},
			{4100 * time.Millisecond, true, true, "primary", readsOn},
			{6 * time.Second, true, true, "primary", readsOn},
			{6100 * time.Millisecond, true, true, "primary", ""},
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			last, times := podLabels{labelUnknown, labelUnknown}, labelTimes{}
			for i, s := range tc.steps {
				got, next := nextLabels(last, s.primary, s.takingWrites, times, t0.Add(s.at))
				if want := (podLabels{s.role, s.reads}); got != want {
					t.Fatalf("step %d (+%v, primary %v, taking writes %v, last %+v): labels %+v, want %+v", i, s.at, s.primary, s.takingWrites, last, got, want)
				}
				last, times = got, next
			}
		})
	}
}

// TestLabelsFollowTheOpening: a primary is labelled primary as its epoch
// opens, not at the labels loop's next poll (here an hour away): the
// relabelling is on the clients' way to it.
func TestLabelsFollowTheOpening(t *testing.T) {
	dir := t.TempDir()
	lcfg := logstore.DefaultConfig()
	lcfg.Listen, lcfg.MetricsListen, lcfg.DataDir = "127.0.0.1:0", "", filepath.Join(dir, "ls")
	lcfg.StopTimeout = time.Second
	ls, err := logstore.New(lcfg)
	if err != nil {
		t.Fatal(err)
	}
	run(t, ls.Run)
	c := &cluster{dir: dir, ls: ls.Addr(), nodes: map[string]*Node{}, runs: map[string]*running{},
		members: []primary.Member{{ID: "n0", Addr: testkit.FreeAddr(t)}}}
	cfg := c.config("n0", RolePrimary)
	cfg.Primary.Policy.Replication = walshipv1.ReplicationMode_REPLICATION_MODE_DISABLED
	// It holds the election from the start; the loop polls once, at its
	// start, before the epoch opens.
	el := &memElection{id: "n0", holder: "n0"}
	cfg.Election, cfg.ElectionRetry = el, time.Hour
	n, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	c.nodes["n0"] = n
	run(t, n.Run)
	testkit.Until(t, "the primary to take writes", func() bool { return n.Primary() != nil && n.Primary().TakingWrites() })
	testkit.Until(t, "the pod labelled primary", func() bool { return el.lastLabel() == "primary ?" })
}
