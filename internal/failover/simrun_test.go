package failover

import (
	"flag"
	"fmt"
	"slices"
	"strings"
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
	steps, seeds, opened, acked, stranded := 0, 0, 0, 0, 0
	for seed := uint64(1); steps < *simSteps; seed++ {
		s := newSim(simConfigFor(seed), seed)
		err := s.run()
		steps, seeds, opened, acked, stranded = steps+s.steps, seeds+1, opened+len(s.opened), acked+s.ackedCount(), stranded+s.stranded
		if err != nil {
			t.Fatalf("%v\nreplay: go test -run 'TestSim$' ./internal/failover -seed %d", err, seed)
		}
	}
	d := time.Since(start)
	t.Logf("%d steps over %d seeds in %v (%.0f steps/s): %d epochs opened, %d writes acknowledged, %d stranded promises promoted again",
		steps, seeds, d.Round(time.Millisecond), float64(steps)/d.Seconds(), opened, acked, stranded)
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

// bugFinds is, for each injected bug, the invariants whose violation
// counts as finding it, and whether a cluster can show it at all (a
// contract that waits for log stores only has no N−k+1 rule to break).
var bugFinds = map[simBug]struct {
	inv     []string
	applies func(simConfig) bool
}{
	bugAckKMinus1:         {[]string{"I5", "I6"}, nil},
	bugPromotionNK:        {[]string{"I5", "I6"}, func(c simConfig) bool { return c.K > 0 && !c.LogStoreSync }},
	bugVoteNotDurable:     {[]string{"I1"}, nil},
	bugLowerEpoch:         {[]string{"I1", "I5", "I6", "I7"}, nil},
	bugNoLearn:            {[]string{"liveness"}, nil},
	bugEntriesNoVote:      {[]string{"I2"}, nil},
	bugNoLeaseWait:        {[]string{"I7"}, nil},
	bugRefusedBatchStored: {[]string{"I1"}, nil},
	bugNoWinnerName:       {[]string{"I4"}, nil},
	bugStoreVouches:       {[]string{"I5", "I6"}, func(c simConfig) bool { return c.LogStoreSync }},
}

// TestSimFindsInjectedBugs re-injects, one at a time, failover bugs fixed
// in round 2 (and rules the protocol rests on) into the simulation's model
// and checks that the simulation finds each within -sim.steps steps: a
// violation of the invariant the fix restored, or of liveness.
func TestSimFindsInjectedBugs(t *testing.T) {
	for _, bug := range allBugs {
		t.Run(string(bug), func(t *testing.T) {
			want := bugFinds[bug]
			steps := 0
			for seed := uint64(1); steps < *simSteps; seed++ {
				c := simConfigFor(seed)
				if want.applies != nil && !want.applies(c) {
					continue
				}
				c.Bug = bug
				s := newSim(c, seed)
				err := s.run()
				steps += s.steps
				if err == nil {
					continue
				}
				for _, inv := range want.inv {
					if strings.HasPrefix(s.err.Error(), inv+" ") {
						if bug == bugNoLearn && s.loser() == "" {
							t.Fatalf("seed %d: a liveness failure not of item 8's shape: %v", seed, err)
						}
						t.Logf("found after %d steps (replay: -seed %d -sim.bug %s): %v", steps, seed, bug, firstLine(s.err))
						return
					}
				}
				t.Fatalf("seed %d: want a violation of %v, got: %v", seed, want.inv, err)
			}
			t.Errorf("bug %s not found in %d steps", bug, steps)
		})
	}
}

func firstLine(err error) string {
	l, _, _ := strings.Cut(err.Error(), "\n")
	return l
}

// TestSimItem8 is issue 35's item 8 in the simulation: the primary is
// killed, two replicas promote at once and choose the same epoch; the
// loser keeps its self-vote. Without LearnFromLogStores (the injected
// bug) it dials the dead primary's address for ever and the winner, whose
// contract needs a replica's flush, takes no writes; with it, the loser
// follows the winner. Seed 61 (3 log stores, 3 nodes, K=1 at flush): once
// the faults stop, the operator promotes n0 and n1 at once, both to epoch
// 30; n0 wins and opens, n1 keeps its self-vote.
func TestSimItem8(t *testing.T) {
	const seed = 61
	c := simConfigFor(seed)
	c.Bug = bugNoLearn
	s := newSim(c, seed)
	err := s.run()
	if err == nil || !strings.HasPrefix(s.err.Error(), "liveness") || s.loser() == "" {
		t.Fatalf("with %s: want a liveness failure with a loser, got %v (loser %q)", bugNoLearn, err, s.loser())
	}
	t.Logf("with %s: %s; %s", bugNoLearn, firstLine(s.err), s.loser())
	s = newSim(simConfigFor(seed), seed)
	if err := s.run(); err != nil {
		t.Fatalf("with LearnFromLogStores: %v", err)
	}
}

// TestSimStrandedPromise shows a liveness gap the simulation found that
// the protocol does not heal by itself (sim.operator). Seed 5229 (3 log
// stores, 4 nodes, K=2 at flush): n2 won epoch 18 and waits out the
// lease; n1 promotes to epoch 19, is granted by itself and n3 but by no
// log store, and crashes; n0 is left down. n2 opens epoch 18 and holds
// its lease, but the two replicas its contract needs promised epoch 19:
// they refuse its stream, no log store names a primary of epoch 19 to
// teach them, and no write is acknowledged. Promoting one of them again
// heals it.
func TestSimStrandedPromise(t *testing.T) {
	const seed = 5229
	c := simConfigFor(seed)
	c.Strict = true
	s := newSim(c, seed)
	if err := s.run(); err == nil || !strings.HasPrefix(s.err.Error(), "liveness") {
		t.Fatalf("strict operator: want a liveness failure, got %v", err)
	}
	s = newSim(simConfigFor(seed), seed)
	if err := s.run(); err != nil || s.stranded == 0 {
		t.Fatalf("promoting again: %v, %d promotions", err, s.stranded)
	}
}

// TestSimReplays: a seed replays exactly — the same steps, the same
// events, the same outcome — which is what makes a printed seed worth
// having.
func TestSimReplays(t *testing.T) {
	for _, seed := range []uint64{3, 61, 141, 5229, 6298} {
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
