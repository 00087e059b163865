package failover

import (
	"flag"
	"fmt"
	"slices"
	"testing"
	"time"
)

var (
	simSeed  = flag.Uint64("seed", 0, "run the simulation of this seed alone (as a failure prints it)")
	simSteps = flag.Int("sim.steps", 1_000_000, "protocol steps TestSim runs, over as many seeds as it takes")
	simBugF  = flag.String("sim.bug", "", "with -seed: inject this bug (see allBugs)")
)

// simConfigFor is the cluster and budget of a seed.
func simConfigFor(seed uint64) simConfig {
	c := simConfigs[seed%uint64(len(simConfigs))]
	c.Lease, c.FaultSteps, c.LiveBound = 100, 3000, 4000
	return c
}

// TestSim runs the simulation over consecutive seeds until it has taken
// -sim.steps protocol steps (make sim runs more), or the one seed -seed
// names. A failure prints its seed, the invariant and the last events;
// the same command with -seed N replays it exactly.
func TestSim(t *testing.T) {
	if *simSeed != 0 {
		c := simConfigFor(*simSeed)
		c.Bug = simBug(*simBugF)
		s := newSim(c, *simSeed)
		if err := s.run(); err != nil {
			t.Fatalf("%v", err)
		}
		t.Logf("seed %d: %d steps, %d epochs opened, %d writes acknowledged", *simSeed, s.steps, len(s.opened), s.ackedCount())
		return
	}
	start := time.Now()
	steps, seeds, opened, acked := 0, 0, 0, 0
	for seed := uint64(1); steps < *simSteps; seed++ {
		s := newSim(simConfigFor(seed), seed)
		err := s.run()
		steps, seeds, opened, acked = steps+s.steps, seeds+1, opened+len(s.opened), acked+s.ackedCount()
		if err != nil {
			t.Fatalf("%v\nreplay: go test -run 'TestSim$' ./internal/failover -seed %d", err, seed)
		}
	}
	d := time.Since(start)
	t.Logf("%d steps over %d seeds in %v (%.0f steps/s): %d epochs opened, %d writes acknowledged",
		steps, seeds, d.Round(time.Millisecond), float64(steps)/d.Seconds(), opened, acked)
}

func (s *sim) ackedCount() int {
	n := 0
	for _, e := range s.acked {
		if e != 0 {
			n++
		}
	}
	return n
}

// TestSimFindsInjectedBugs re-injects, one at a time, failover bugs fixed
// in round 2 (and rules the protocol rests on) into the simulation's model
// and checks that the simulation finds each within the budget: a
// violation of the invariant the fix restored, or of liveness.
func TestSimFindsInjectedBugs(t *testing.T) {
	budget := *simSteps
	for _, bug := range allBugs {
		t.Run(string(bug), func(t *testing.T) {
			steps := 0
			for seed := uint64(1); steps < budget; seed++ {
				c := simConfigFor(seed)
				c.Bug = bug
				s := newSim(c, seed)
				err := s.run()
				steps += s.steps
				if err != nil {
					t.Logf("found after %d steps (seed %d, replay: -seed %d -sim.bug %s): %v", steps, seed, seed, bug, s.err)
					return
				}
			}
			t.Errorf("bug %s not found in %d steps", bug, steps)
		})
	}
}

// TestSimReplays: a seed replays exactly — the same steps, the same
// events, the same outcome — which is what makes a printed seed worth
// having.
func TestSimReplays(t *testing.T) {
	for _, seed := range []uint64{3, 141, 6298} {
		for _, bug := range []simBug{"", bugNoLearn} {
			run := func() (*sim, error) {
				c := simConfigFor(seed)
				c.Bug = bug
				s := newSim(c, seed)
				return s, s.run()
			}
			a, errA := run()
			b, errB := run()
			if a.steps != b.steps || a.now != b.now || fmt.Sprint(errA) != fmt.Sprint(errB) || !slices.Equal(a.trace, b.trace) || !slices.Equal(a.acked, b.acked) {
				t.Errorf("seed %d bug %q: two runs differ: %d and %d steps, %v and %v", seed, bug, a.steps, b.steps, errA, errB)
			}
		}
	}
}
