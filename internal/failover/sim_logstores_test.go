package failover

import (
	"flag"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"
)

// Log store set changes in the simulation (issue 38). With
// simConfig.LogStoreChange the primary changes the log store set as well
// as the members, as services/primary does (change.go): it adds a log
// store, removes one, or replaces one, the log store it adds first a
// learner (a learner record: shipped to, counting for nothing) until it
// holds the primary's log within logStoreLag and echoes the lease, then a
// joint record (both sets: an ack and the lease need a majority of each,
// a promotion a majority of each), then the final record. A new primary
// drops a learner stage its log ends in (its epoch record carries the
// contract without the learner: services/primary startContract), and
// finishes or rolls back a joint one like a member change.
//
// What the product does that the model follows:
//   - The primary ships to the log stores of its log's configuration,
//     both halves and the learner (logStoreSet), and to no other: a log
//     store removed hears from it no more. Its lease needs a majority of
//     each half (lease.setHalves), its acks under log store sync the same
//     (Config.AckQuorums).
//   - A candidate fences the log stores of its flags (the first
//     configuration's) and of its own log's configuration, both halves
//     (services/node, logStores) — not those of a change its log lacks.
//     A log store's fence answer names no configuration
//     (MemberConfigsOnly).
//   - A replica asks the log stores of its log's configuration who the
//     primary is, and learns from a majority of one set
//     (LearnFromLogStoreSets; ReplicaAsksContract), and reads what it
//     lacks from one of them (services/replica logStoreSets).
//   - The final record of a change that moves log stores follows its
//     joint record only once a majority of each set holds the joint one,
//     whatever the commits wait for (JointWaitsLogStores;
//     services/primary waitLogStoreSets).
//   - Once caught up to its donor, a candidate opens only if its promises
//     include a majority of every log store set of its log's
//     configuration (services/node, fencedEachLogStoreHalf), unless no
//     run-time change wrote it (the first: the flags' own).
//
// Where the model is simpler: a candidate takes no answer after the one
// that made its quorum (services/node waits answerGrace for more), so it
// gives up more often than the product; the learner refill is a copy of
// one peer's log, not services/logstore's.
//
// bugNoEachLogStoreHalf removes that last check: a candidate whose log
// lags behind a change fences the old set, wins with a majority of it,
// catches up to a log under the new one, and opens without a write a
// majority of the new set acknowledged (I5); or another candidate wins
// the same epoch with a majority of the new set, disjoint from its own,
// and both open it (I4).

// bugNoEachLogStoreHalf: a candidate opens without a fenced majority of
// each log store set of its caught-up log's configuration.
const bugNoEachLogStoreHalf simBug = "logstores-not-fenced-each-half"

// simLogStores is the state of the log store changes: the learner stage of
// each learner configuration, and counts.
type simLogStores struct {
	// learner and next: by configuration (index in sim.cfgs), the log
	// store learner it ships to and the contract the change goes to; at,
	// when its record was written.
	learner map[int]string
	next    map[int]Contract
	at      map[int]int64
	// Counts: learner records, learners dropped (too slow, or by a new
	// primary), joint records of a log store change (and of them
	// replacements), candidates that gave up at opening for want of a
	// fenced majority of a log store set.
	learners, dropped, joints, replaced, refused int
}

// logStoreLag is how far behind the primary's log a log store learner may
// be for the change to go on (services/primary, max_lag_records),
// learnerPatience how long the primary waits for it, and
// minLogStoresLeft how few log stores a removal may leave.
const (
	logStoreLag      = 4
	learnerPatience  = 2000
	minLogStoresLeft = 3
)

// logStoreSet is every log store configuration i ships to: both halves,
// then the learner (services/primary, logStoreSet).
func (s *sim) logStoreSet(i int) []string {
	c := s.cfgs[i]
	out := slices.Clone(c.Old.LogStores)
	add := func(ids ...string) {
		for _, id := range ids {
			if id != "" && !slices.Contains(out, id) {
				out = append(out, id)
			}
		}
	}
	if c.Joint {
		add(c.New.LogStores...)
	}
	add(s.ls.learner[i])
	return out
}

// shipLogStores starts a stream to each log store of p's log's
// configuration that has none, and drops the stream to each one that left
// it, its echoes with it (lease.forget). A stream started again gets a new
// id, as a new gRPC stream would.
func (s *sim) shipLogStores(p *party) {
	set := s.logStoreSet(s.cfgOf(p.log))
	for i := range s.cfg.LogStores {
		f := &p.fol[i]
		switch in := slices.Contains(set, s.ps[i].id); {
		case in && !f.on:
			*f = follower{on: true, sid: f.sid + 1}
		case !in && f.on:
			*f = follower{sid: f.sid + 1}
		}
	}
}

// leaseValidHalves is the lease under the configuration of p's log: a
// majority of each half's log stores echoed a heartbeat sent less than a
// lease ago (services/primary, lease.updateLocked).
func (s *sim) leaseValidHalves(p *party) bool {
	c := s.cfgs[s.cfgOf(p.log)]
	halves := [][]string{c.Old.LogStores}
	if c.Joint {
		halves = append(halves, c.New.LogStores)
	}
	for _, h := range halves {
		n := 0
		for i := range s.cfg.LogStores {
			if f := p.fol[i]; slices.Contains(h, s.ps[i].id) && f.echo > 0 && f.echo > s.now-s.cfg.Lease {
				n++
			}
		}
		if n < Majority(len(h)) {
			return false
		}
	}
	return true
}

// fencedLogStores are the log stores a promotion at p fences: its flags'
// (the first configuration's) and those of its own log's configuration,
// both halves (services/node, logStores).
func (s *sim) fencedLogStores(p *party) []string {
	out := slices.Clone(s.cfgs[0].Old.LogStores)
	c := s.cfgs[s.cfgOf(p.log)]
	for _, id := range slices.Concat(c.Old.LogStores, c.New.LogStores) {
		if !slices.Contains(out, id) {
			out = append(out, id)
		}
	}
	return out
}

// fencedEachLogStoreHalf is services/node's check before a candidate
// opens: "" if its promises include a majority of every log store set of
// its log's configuration, once caught up; else why not. The first
// configuration is the flags' (no run-time change wrote it), which binds
// nothing.
func (s *sim) fencedEachLogStoreHalf(p *party) string {
	i := s.cfgOf(p.log)
	if i == 0 {
		return ""
	}
	c := s.cfgs[i]
	sets := [][]string{c.Old.LogStores}
	if c.Joint {
		sets = append(sets, c.New.LogStores)
	}
	for _, set := range sets {
		n := 0
		for _, a := range p.cand.answers {
			if a.LogStore && slices.Contains(set, a.ID) {
				n++
			}
		}
		if n < Majority(len(set)) {
			return fmt.Sprintf("%d of log stores %v promised, its log's %s needs %d", n, set, s.cfgString(i), Majority(len(set)))
		}
	}
	return ""
}

// startLogStoreChange: p adds, removes or replaces a log store of cur, if
// ValidChange and canFinish allow it. A removal goes to the joint record
// at once; a log store added is a learner first.
func (s *sim) startLogStoreChange(p *party, cur Contract) {
	var spares []string
	for i := range s.cfg.LogStores {
		if !slices.Contains(cur.LogStores, s.ps[i].id) {
			spares = append(spares, s.ps[i].id)
		}
	}
	next := cur
	next.LogStores = slices.Clone(cur.LogStores)
	var add, remove string
	switch op := s.rng.IntN(3); {
	case op == 0 && len(spares) > 0:
		add = spares[s.rng.IntN(len(spares))]
		next.LogStores = append(next.LogStores, add)
	case op == 1 && len(cur.LogStores) > minLogStoresLeft:
		remove = cur.LogStores[s.rng.IntN(len(cur.LogStores))]
		next.LogStores = slices.DeleteFunc(next.LogStores, func(id string) bool { return id == remove })
	case op == 2 && len(spares) > 0:
		add = spares[s.rng.IntN(len(spares))]
		j := s.rng.IntN(len(cur.LogStores))
		remove, next.LogStores[j] = cur.LogStores[j], add
	default:
		return
	}
	if ValidChange(cur, next, p.id) != nil || (remove != "" && !s.canFinishLogStores(p, next, add)) {
		return
	}
	if add == "" {
		s.logStoreJoint(p, cur, next)
		return
	}
	s.record(p, Config{Old: cur})
	i := len(s.cfgs) - 1
	if s.ls.learner == nil {
		s.ls.learner, s.ls.next, s.ls.at = map[int]string{}, map[int]Contract{}, map[int]int64{}
	}
	s.ls.learner[i], s.ls.next[i], s.ls.at[i] = add, next, s.now
	s.ls.learners++
	s.shipLogStores(p)
	s.logf("%s: log store learner %s, for log stores %v → %v", p.id, add, cur.LogStores, next.LogStores)
}

// canFinishLogStores is services/primary's canFinish for a change that
// removes a log store: a majority of next's log stores is connected (the
// one it adds counts: it passes its learner stage first), or the lease
// would end as soon as the change is joint.
func (s *sim) canFinishLogStores(p *party, next Contract, add string) bool {
	n := 0
	for _, id := range next.LogStores {
		if f := p.fol[s.nodeIdx(id)]; id == add || (f.on && f.echo > s.now-s.cfg.Lease) {
			n++
		}
	}
	return n >= Majority(len(next.LogStores))
}

// logStoreLearnerStage: if p's log is under learner configuration i
// (record at lsn), the learner stage goes on: once the record is
// acknowledged and the learner holds the log within logStoreLag and
// echoes, the joint record; after learnerPatience, the learner is
// dropped (the old contract again). It reports whether i is one.
func (s *sim) logStoreLearnerStage(p *party, i int, lsn uint64) bool {
	l, ok := s.ls.learner[i]
	if !ok {
		return false
	}
	cur := s.cfgs[i].Old
	f := p.fol[s.nodeIdx(l)]
	switch {
	case p.acked >= lsn && f.on && f.known && f.matched+logStoreLag >= uint64(len(p.log)) && f.echo > s.now-s.cfg.Lease/2:
		s.logStoreJoint(p, cur, s.ls.next[i])
	case s.now-s.ls.at[i] > learnerPatience:
		s.record(p, Config{Old: cur})
		s.ls.dropped++
		s.logf("%s: log store learner %s dropped", p.id, l)
	default:
		s.refill(l, cur)
	}
	return true
}

// refill: the log store learner id reads what it lacks from a log store of
// cur (services/logstore refills from its --peers): entries that come
// without their primary, which catchUp appends if its log is a prefix of
// the peer's (Entries decides, as at a replica).
func (s *sim) refill(id string, cur Contract) {
	if s.rng.IntN(4) != 0 {
		return
	}
	l := s.nodeIdx(id)
	s.send(msg{kind: mCopy, from: l, to: s.nodeIdx(cur.LogStores[s.rng.IntN(len(cur.LogStores))])})
}

// logStoreJoint writes the joint record of a log store change from cur to
// next; changeMembers finishes it.
func (s *sim) logStoreJoint(p *party, cur, next Contract) {
	s.record(p, Config{Old: cur, New: next, Joint: true})
	s.joints++
	s.ls.joints++
	if len(cur.LogStores) == len(next.LogStores) {
		s.ls.replaced++
	}
	s.shipLogStores(p)
	s.logf("%s: joint record, log stores %v → %v", p.id, cur.LogStores, next.LogStores)
}

// jointHeldByLogStores reports whether the final record of joint
// configuration cur (its record at lsn) may follow: always, but with
// JointWaitsLogStores, when cur moves log stores, only once a majority of
// each set holds the record.
func (s *sim) jointHeldByLogStores(p *party, cur Config, lsn uint64) bool {
	if !s.cfg.JointWaitsLogStores || slices.Equal(cur.Old.LogStores, cur.New.LogStores) {
		return true
	}
	for _, set := range [][]string{cur.Old.LogStores, cur.New.LogStores} {
		n := 0
		for _, id := range set {
			if f := p.fol[s.nodeIdx(id)]; f.on && f.matched >= lsn {
				n++
			}
		}
		if n < Majority(len(set)) {
			return false
		}
	}
	return true
}

// split cuts every link between two groups of parties drawn at random
// (SplitPartitions).
func (s *sim) split() {
	until := s.now + 20 + int64(s.rng.IntN(400))
	in := make([]bool, len(s.ps))
	var a, b []string
	for i, p := range s.ps {
		if in[i] = s.rng.IntN(2) == 0; in[i] {
			a = append(a, p.id)
		} else {
			b = append(b, p.id)
		}
	}
	for i, p := range s.ps {
		for j, q := range s.ps {
			if in[i] && !in[j] {
				p.cutOff[q.idx], q.cutOff[p.idx] = until, until
			}
		}
	}
	s.logf("%s split from %s until %d", strings.Join(a, ","), strings.Join(b, ","), until)
}

// dropLearnerAtEpochStart: a new primary whose log ends in a learner
// stage drops the learner: its epoch record e carries the contract
// without it.
func (s *sim) dropLearnerAtEpochStart(p *party, e ent) {
	i := s.cfgOf(p.log)
	if _, ok := s.ls.learner[i]; !ok {
		return
	}
	s.cfgs = append(s.cfgs, Config{Old: s.cfgs[i].Old})
	s.recs = append(s.recs, cfgRec{e: e, cfg: len(s.cfgs) - 1})
	s.ls.dropped++
	s.logf("%s: epoch record drops log store learner %s", p.id, s.ls.learner[i])
}

// simLogStoreConfigs: 3 or 4 members, and log stores of which one or two
// are spare at first, under log store sync with k = 0 and k = 1 (no
// member's promise needed: the case the each-half check is for) and under
// k at flush (where the lease alone is at stake). Half the seeds roll a
// change a new primary finds back rather than finish it.
var simLogStoreConfigs = []simConfig{
	{LogStores: 4, SpareLogStores: 1, Nodes: 3, K: 0, LogStoreSync: true},
	{LogStores: 5, SpareLogStores: 2, Nodes: 3, K: 1, LogStoreSync: true},
	{LogStores: 4, SpareLogStores: 1, Nodes: 3, K: 1},
	{LogStores: 5, SpareLogStores: 2, Nodes: 4, K: 2},
}

func simLogStoreConfigFor(seed uint64) simConfig {
	c := simLogStoreConfigs[seed%uint64(len(simLogStoreConfigs))]
	c.Reconfig, c.LogStoreChange, c.MemberConfigsOnly, c.ReplicaAsksContract = true, true, true, true
	c.JointWaitsLogStores = true
	c.Lease = []int64{100, 50, 200}[seed/4%3]
	c.FaultSteps = []int{3000, 1000, 6000}[seed/12%3]
	c.Rollback = seed/36%2 == 1
	c.LiveBound = 4000
	return c
}

// replacedLogStoreScene is the state TestSimReplacedLogStore starts from:
// 3 members under log store sync (k = 0), log stores l0, l1, l2 and a
// spare l3. n0, the primary of epoch 1, replaced l2 with l3: the learner
// record (LSN 2), the joint record (LSN 3), the final record {l0, l1, l3}
// (LSN 4), then wrote W (LSN 5), which l0 and l3 hold: acknowledged, a
// majority of the final set. l1 holds up to the final record and was then
// cut off from n0 long ago; l2, removed, has heard nothing since; n0
// still holds its lease through l0 and l3. n2 lags: its log ends with the
// learner record (a contract a run-time change wrote, so it judges by it,
// not by its flags) and it is cut off from n0 and l0.
func replacedLogStoreScene(bug simBug) *sim {
	s := scripted(simConfig{LogStores: 4, SpareLogStores: 1, Nodes: 3, K: 0, LogStoreSync: true,
		Reconfig: true, LogStoreChange: true, MemberConfigsOnly: true, Bug: bug})
	old := s.cfgs[0].Old
	nw := old
	nw.LogStores = []string{"l0", "l1", "l3"}
	s.cfgs = append(s.cfgs, Config{Old: old}, Config{Old: old, New: nw, Joint: true}, Config{Old: nw})
	s.ls.learner, s.ls.next, s.ls.at = map[int]string{1: "l3"}, map[int]Contract{1: nw}, map[int]int64{1: 0}
	s.recs = append(s.recs, cfgRec{e: ent{1, 2}, cfg: 1}, cfgRec{e: ent{1, 3}, cfg: 2}, cfgRec{e: ent{1, 4}, cfg: 3})
	log := []ent{{1, 1}, {1, 2}, {1, 3}, {1, 4}, {1, 5}}
	s.now = 1000
	for id, n := range map[string]int{"n0": 5, "n1": 2, "n2": 2, "l0": 5, "l1": 4, "l2": 3, "l3": 5} {
		p := s.ps[s.nodeIdx(id)]
		p.log = slices.Clone(log[:n])
		p.contact = 100
		if id == "l0" || id == "l3" {
			p.contact = s.now
		}
	}
	n0 := s.ps[s.nodeIdx("n0")]
	s.shipLogStores(n0)
	for _, id := range []string{"l0", "l3"} {
		f := &n0.fol[s.nodeIdx(id)]
		f.known, f.matched, f.next, f.echo = true, 5, 6, s.now
	}
	s.acked = []uint64{1, 1, 1, 1, 1}
	return s
}

// TestSimReplacedLogStore is the bug the review found, set up by hand
// (replacedLogStoreScene): n2 promotes, fences the log stores of its flags
// and of its log's contract, l0, l1 and l2, and wins with l1's and l2's
// promises (a majority of {l0, l1, l2}; under log store sync no member's
// promise is needed). Neither has heard from n0 for longer than the lease,
// so it does not wait. It copies l1's log, whose contract is the final
// {l0, l1, l3}. Without the each-half check (bugNoEachLogStoreHalf) it
// opens epoch 2 without W, which l0 and l3 — never fenced — acknowledged
// (I5), while n0 still holds its lease through them. With it, only l1 of
// {l0, l1, l3} promised, and n2 gives up its epoch.
func TestSimReplacedLogStore(t *testing.T) {
	run := func(bug simBug) *sim {
		s := replacedLogStoreScene(bug)
		n2 := s.ps[s.nodeIdx("n2")]
		s.promote(n2)
		hears := map[string]bool{"n2": true, "l1": true, "l2": true}
		for range 2000 {
			s.now++
			var keep []msg
			for _, m := range s.net {
				if hears[s.ps[m.from].id] && hears[s.ps[m.to].id] {
					keep = append(keep, m)
				}
			}
			s.net = nil
			for _, m := range keep {
				s.deliver(m)
			}
			if n2.role != roleCandidate || s.err != nil {
				break
			}
			s.tick(n2)
		}
		return s
	}
	s := run(bugNoEachLogStoreHalf)
	if s.err == nil || !strings.HasPrefix(s.err.Error(), "I5 violated") {
		t.Fatalf("with %s: want I5, got %v (n2 %s, log %v)", bugNoEachLogStoreHalf, s.report(), s.ps[s.nodeIdx("n2")].role, s.ps[s.nodeIdx("n2")].log)
	}
	t.Logf("with %s: %s", bugNoEachLogStoreHalf, firstLine(s.err))
	s = run("")
	if s.err != nil || s.opened[2] != "" || s.ls.refused != 1 {
		t.Fatalf("with the check: want n2 to give up epoch 2, got %v, epoch 2 opened by %q, %d refused", s.report(), s.opened[2], s.ls.refused)
	}
}

// TestSimLogStores runs the simulation with log store set changes (and
// member changes) over consecutive seeds until it has taken a tenth of
// -sim.steps steps, or the one seed -seed names: every invariant holds at
// every step, and once the faults stop a write is acknowledged.
func TestSimLogStores(t *testing.T) {
	if *simSeed != 0 {
		c := simLogStoreConfigFor(*simSeed)
		c.Bug = simBug(*simBugF)
		s := newSim(c, *simSeed)
		s.verbose = *simTrace
		if err := s.run(); err != nil {
			t.Fatalf("%v", err)
		}
		if *simTrace {
			t.Logf("events:\n%s", strings.Join(s.trace, "\n"))
		}
		t.Logf("seed %d: %d steps, %d log store joint records", *simSeed, s.steps, s.ls.joints)
		return
	}
	start := time.Now()
	var steps, seeds, learners, dropped, joints, replaced, refused, acked int
	for seed := *simFirst; steps < *simSteps/10; seed++ {
		s := newSim(simLogStoreConfigFor(seed), seed)
		err := s.run()
		steps, seeds, acked = steps+s.steps, seeds+1, acked+s.ackedCount()
		learners, dropped, joints, replaced, refused = learners+s.ls.learners, dropped+s.ls.dropped, joints+s.ls.joints, replaced+s.ls.replaced, refused+s.ls.refused
		if err != nil {
			t.Fatalf("%v\nreplay: go test -run 'TestSimLogStores$' ./internal/failover -seed %d", err, seed)
		}
	}
	if joints == 0 || replaced == 0 {
		t.Fatalf("%d log store joint records, %d of them replacements: the runs exercise no log store change", joints, replaced)
	}
	t.Logf("%d steps over %d seeds in %v: %d log store learners (%d dropped), %d joint records (%d replacements), "+
		"%d candidates that gave up for want of a fenced majority of a log store set, %d writes acknowledged",
		steps, seeds, time.Since(start).Round(time.Millisecond), learners, dropped, joints, replaced, refused, acked)
}

var simLogStoresBugSteps = flag.Int("sim.ls.bugsteps", 0, "protocol steps TestSimLogStoresSearch may take to find bugNoEachLogStoreHalf (0: skip it)")

// TestSimLogStoresFindsBug: without the each-half check
// (bugNoEachLogStoreHalf) these seeds, found by TestSimLogStoresSearch,
// lose an acknowledged write or open one epoch twice; with it they pass,
// and a candidate gives up for want of a fenced majority of a log store
// set where the bug let it open.
//   - 468: n2, whose log ends under a member change's joint record with
//     log stores {l0, l1, l2}, wins epoch 5 with l1 and l2; its donor
//     l1's log is under {l0, l1, l3} (l2 replaced with l3), whose
//     majority l0 and l3 acknowledged LSN 57; n2 opens without it (I5).
//   - 1472: n0, whose log holds no change (its flags' {l0, l1, l2}),
//     wins epoch 5 with l1 and l2; its donor l2's log is under the joint
//     record {l0, l1, l2} → {l0, l1, l3}; LSN 11, acknowledged by l0 and
//     l3 under the final record, is not in it (I5).
//   - 4389: n0 opens epoch 11 without LSN 64 of epoch 4 (I5).
//
// Seed 7740 was here too: n0, deposed by epoch 2, won epoch 2 itself
// with a majority of a log store set disjoint from the winner's, and
// both opened it (I4). It took a deposed primary promoting to the epoch
// that deposed it, which the model allowed (stepDown did not raise
// seen) and services/node does not (it promotes past every epoch its
// survey saw); 80 million steps from seed 1 found no other I4 since.
func TestSimLogStoresFindsBug(t *testing.T) {
	for _, tc := range []struct {
		seed uint64
		want string
	}{
		{468, "I5 violated at step 2628: n2 opens epoch 5 without acknowledged LSN 57 of epoch 3"},
		{1472, "I5 violated at step 2348: n0 opens epoch 5 without acknowledged LSN 11 of epoch 2"},
		{4389, "I5 violated at step 4354: n0 opens epoch 11 without acknowledged LSN 64 of epoch 4"},
	} {
		c := simLogStoreConfigFor(tc.seed)
		c.Bug = bugNoEachLogStoreHalf
		s := newSim(c, tc.seed)
		if err := s.run(); err == nil || !strings.HasPrefix(s.err.Error(), tc.want) {
			t.Errorf("seed %d with %s: want %q, got %v", tc.seed, bugNoEachLogStoreHalf, tc.want, err)
		}
		s = newSim(simLogStoreConfigFor(tc.seed), tc.seed)
		if err := s.run(); err != nil || s.ls.refused == 0 {
			t.Errorf("seed %d: want no violation and a candidate that gave up, got %v, %d gave up", tc.seed, err, s.ls.refused)
		}
	}
}

// TestSimLogStoresSearch, with -sim.ls.bugsteps N, searches seeds from
// -sim.first for one where the simulation finds bugNoEachLogStoreHalf
// within N steps: a violation of I4, I5, I6 or I7. It took 1.7 million
// steps from seed 1 (seed 468) when written: seven finds in 40 million
// steps, where the real rule passes all 40 million.
func TestSimLogStoresSearch(t *testing.T) {
	if *simLogStoresBugSteps == 0 {
		t.Skip("run with -sim.ls.bugsteps N")
	}
	steps := 0
	for seed := *simFirst; steps < *simLogStoresBugSteps; seed++ {
		c := simLogStoreConfigFor(seed)
		c.Bug = bugNoEachLogStoreHalf
		s := newSim(c, seed)
		err := s.run()
		steps += s.steps
		if err == nil {
			continue
		}
		for _, inv := range []string{"I4", "I5", "I6", "I7"} {
			if strings.HasPrefix(s.err.Error(), inv+" ") {
				t.Logf("found after %d steps (replay: -run 'TestSimLogStores$' -seed %d -sim.bug %s): %v", steps, seed, bugNoEachLogStoreHalf, firstLine(s.err))
				return
			}
		}
		t.Fatalf("seed %d: want a violation of I4, I5, I6 or I7, got: %v", seed, err)
	}
	t.Errorf("%s not found in %d steps", bugNoEachLogStoreHalf, steps)
}

// TestSimLogStoresSeed154153 replays a liveness failure the simulation
// found with the rules of the time (200 M steps from seed 100000, the
// only failure): a replica asked the log stores of its --logstore flags
// who the primary of its epoch is (services/replica askLogStore,
// Config.LogStores, never the contract's), and learnt a winner only from
// a majority of them. Log stores {l0, l1, l2} at first, k = 1 under log store sync;
// n2, then n1, replaced l2 and l1 (now {l0, l3, l4}), and n1 began
// removing n2 (joint {n0, n1, n2} → {n0, n1}). n1 crashed; n0 and n1 both
// promoted to epoch 9; n1 won with l0 and l4, and opened; n0 got l1 and l2
// — removed, so counting for nothing — and gave up, its promise of epoch 9
// naming itself (issue 35's item 8). n0 asks l0, l1, l2: l1 and l2, which
// no primary ships to any more, name n0 for ever, l0 alone names n1, and
// LearnFromLogStores needs 2 of 3. n0 never follows n1, and n1's joint
// record needs k = 1 of the new half's members other than itself: n0. No
// write is acknowledged after the faults stop. The same run, switched at
// step 3500 (n0 stranded) to asking the log stores of the replica's log's
// contract (ReplicaAsksContract), heals: n0 learns n1 from l0, l3 and l4.
// services/replica does so now, and simLogStoreConfigFor models it: 200 M
// steps from seed 100000 find nothing.
func TestSimLogStoresSeed154153(t *testing.T) {
	const seed = 154153
	c := simLogStoreConfigFor(seed)
	c.ReplicaAsksContract = false
	s := newSim(c, seed)
	if err := s.run(); err == nil || !strings.HasPrefix(s.err.Error(), "liveness violated") || s.loser() == "" {
		t.Fatalf("asking the flags' log stores: want a liveness failure with a loser, got %v (loser %q)", err, s.loser())
	}
	t.Logf("asking the flags' log stores: %s; %s", firstLine(s.err), s.loser())
	s = newSim(c, seed)
	for s.steps < s.cfg.FaultSteps {
		s.step()
	}
	s.stopFaults()
	for s.steps < 3500 {
		s.step()
	}
	if s.err != nil || s.lived || s.loser() == "" {
		t.Fatalf("at step 3500: want n0 stranded, got %v, lived %v, loser %q", s.err, s.lived, s.loser())
	}
	s.cfg.ReplicaAsksContract = true
	for s.err == nil && !s.lived && s.steps < s.cfg.FaultSteps+s.cfg.LiveBound {
		s.step()
	}
	if s.err != nil || !s.lived {
		t.Fatalf("asking the contract's log stores from step 3500: err %v, a write acknowledged %v", s.report(), s.lived)
	}
	t.Logf("asking the contract's log stores from step 3500: a write acknowledged by step %d", s.steps)
}

// logStoreChangeK0 runs TestSimLogStoreChangeK0's scenario and returns
// the sim once n2 opened epoch 2 (or after 3000 steps, or at a violation).
// The contract waits for nobody (k = 0, log store async: the default
// policy). n0, the primary of epoch 1 with log stores {l0, l1, l2},
// replaces l2 — which it cannot reach — with l3, n2 being down: the
// learner record, and once l3 caught up the joint record. As n0 ships the
// joint record, a partition cuts {l1, l2, n2} off from {n0, n1, l0, l3}:
// l1 never gets it. n2 restarts there and promotes.
func logStoreChangeK0(fix bool) *sim {
	s := scripted(simConfig{LogStores: 4, SpareLogStores: 1, Nodes: 3, K: 0,
		Reconfig: true, LogStoreChange: true, MemberConfigsOnly: true, JointWaitsLogStores: fix})
	s.calm = true // no fault but the scenario's, no change but this one
	n0, n1, n2 := s.ps[s.nodeIdx("n0")], s.ps[s.nodeIdx("n1")], s.ps[s.nodeIdx("n2")]
	s.crash(n2)
	side := map[string]int{}
	linked := func(a, b string) bool {
		return side[a] == side[b] && !(a == "n0" && b == "l2" || a == "l2" && b == "n0")
	}
	drive := func(steps int, done func() bool) {
		for range steps {
			s.now++
			var keep []msg
			for _, m := range s.net {
				if linked(s.ps[m.from].id, s.ps[m.to].id) {
					keep = append(keep, m)
				}
			}
			s.net = nil
			for _, m := range keep {
				s.deliver(m)
			}
			for _, p := range []*party{n0, n1, n2} {
				s.tick(p)
			}
			s.check()
			if s.err != nil || done() {
				return
			}
		}
	}
	drive(100, func() bool { return false }) // n0 takes its lease and some writes
	old := s.cfgs[0].Old
	next := old
	next.LogStores = []string{"l0", "l1", "l3"}
	s.record(n0, Config{Old: old})
	i := len(s.cfgs) - 1
	s.ls.learner, s.ls.next, s.ls.at = map[int]string{i: "l3"}, map[int]Contract{i: next}, map[int]int64{i: s.now}
	s.shipLogStores(n0)
	drive(2000, func() bool { return s.cfgs[s.cfgOf(n0.log)].Joint })
	for _, id := range []string{"l1", "l2", "n2"} {
		side[id] = 1
	}
	s.restart(n2)
	s.promote(n2)
	drive(3000, func() bool { return s.opened[2] != "" && s.now > s.openedAt[2]+50 })
	return s
}

// TestSimLogStoreChangeK0 is a bug the model of log store changes shows in
// services/primary (found by reasoning over it, shown here by hand; random
// runs find it once partitions split the cluster in two:
// TestSimLogStoreChangeK0Seeds): under a contract that waits
// for nobody, awaitContract waits for nothing, so a change writes its
// joint and final records back to back, and the lease moves to the new
// set at once. n0 leases through l0 and l3, a majority of {l0, l1, l3}.
// n2 fences the log stores of its flags and its log, {l0, l1, l2}, wins
// with l1 and l2, catches up from one of them — neither holds the joint
// record — so its log's contract is the old one, of which it holds a
// majority, and opens: two primaries hold their lease (I7). Waiting, before
// the final record, for a majority of each set to hold the joint record
// (JointWaitsLogStores) closes it: n0 stays joint, whose lease needs
// l1 or l2 too and runs out.
func TestSimLogStoreChangeK0(t *testing.T) {
	s := logStoreChangeK0(false)
	if s.err == nil || !strings.HasPrefix(s.err.Error(), "I7 violated") {
		t.Fatalf("final record right after the joint one: want I7, got %v (epoch 2 opened by %q)", s.report(), s.opened[2])
	}
	t.Logf("final record right after the joint one: %s", firstLine(s.err))
	s = logStoreChangeK0(true)
	if s.err != nil || s.opened[2] != "n2" {
		t.Fatalf("final record once a majority of each set holds the joint one: want n2 to open epoch 2 alone, got %v, epoch 2 opened by %q", s.report(), s.opened[2])
	}
}

// simLogStoreK0ConfigFor is a cluster under a contract that waits for
// nobody (k = 0, log store async: the default policy) whose primary
// changes log stores, with partitions that split the parties in two.
func simLogStoreK0ConfigFor(seed uint64) simConfig {
	c := []simConfig{{LogStores: 4, SpareLogStores: 1, Nodes: 3}, {LogStores: 5, SpareLogStores: 2, Nodes: 3}}[seed%2]
	c.Reconfig, c.LogStoreChange, c.MemberConfigsOnly, c.SplitPartitions = true, true, true, true
	c.Lease = []int64{100, 50, 200}[seed/2%3]
	c.FaultSteps = []int{3000, 1000, 6000}[seed/6%3]
	c.LiveBound = 4000
	return c
}

// TestSimLogStoreChangeK0Seeds: random runs find TestSimLogStoreChangeK0's
// bug too, once partitions split the cluster in two (40 M steps: these
// three seeds; with JointWaitsLogStores none in 40 M). Each fails as
// services/primary does today and passes with the final record waiting
// for a majority of each set.
func TestSimLogStoreChangeK0Seeds(t *testing.T) {
	for _, tc := range []struct {
		seed uint64
		want string
	}{
		{5651, "I7 violated at step 1868: n1 (epoch 6) holds its lease after epoch 7 opened at 1868"},
		{6017, "I7 violated at step 299: n0 (epoch 1) holds its lease after epoch 2 opened at 299"},
		{10477, "I4 violated at step 3001: n2 and n0 both open epoch 4"},
	} {
		s := newSim(simLogStoreK0ConfigFor(tc.seed), tc.seed)
		if err := s.run(); err == nil || !strings.HasPrefix(s.err.Error(), tc.want) {
			t.Errorf("seed %d: want %q, got %v", tc.seed, tc.want, err)
		}
		c := simLogStoreK0ConfigFor(tc.seed)
		c.JointWaitsLogStores = true
		if s := newSim(c, tc.seed); s.run() != nil {
			t.Errorf("seed %d with JointWaitsLogStores: %v", tc.seed, s.report())
		}
	}
}

// simLogStoreDefaultConfigFor is simLogStoreK0ConfigFor as services/primary
// runs it now: the default policy (k = 0, log store async), partitions that
// split the cluster in two, the final record of a change that moves log
// stores only once a majority of each set holds the joint record
// (waitLogStoreSets), replicas asking their contract's log stores, and
// half the seeds rolling back a change a new primary finds.
func simLogStoreDefaultConfigFor(seed uint64) simConfig {
	c := simLogStoreK0ConfigFor(seed)
	c.JointWaitsLogStores, c.ReplicaAsksContract = true, true
	c.Rollback = seed/18%2 == 1
	return c
}

// TestSimLogStoresDefaultPolicy runs simLogStoreDefaultConfigFor over
// consecutive seeds until it has taken a tenth of -sim.steps steps, or
// the one seed -seed names. TestSimLogStores's clusters all wait for
// something (log store sync, or k ≥ 1), where a candidate learns of a
// change from the answers it needs; here nothing does.
func TestSimLogStoresDefaultPolicy(t *testing.T) {
	if *simSeed != 0 {
		s := newSim(simLogStoreDefaultConfigFor(*simSeed), *simSeed)
		s.verbose = *simTrace
		if err := s.run(); err != nil {
			t.Fatalf("%v", err)
		}
		if *simTrace {
			t.Logf("events:\n%s", strings.Join(s.trace, "\n"))
		}
		t.Logf("seed %d: %d steps, %d log store joint records", *simSeed, s.steps, s.ls.joints)
		return
	}
	start := time.Now()
	var steps, seeds, joints, refused int
	for seed := *simFirst; steps < *simSteps/10; seed++ {
		s := newSim(simLogStoreDefaultConfigFor(seed), seed)
		err := s.run()
		steps, seeds, joints, refused = steps+s.steps, seeds+1, joints+s.ls.joints, refused+s.ls.refused
		if err != nil {
			t.Fatalf("%v\nreplay: go test -run 'TestSimLogStoresDefaultPolicy$' ./internal/failover -seed %d", err, seed)
		}
	}
	if joints == 0 {
		t.Fatalf("no log store joint record in %d steps: the runs exercise no log store change", steps)
	}
	t.Logf("%d steps over %d seeds in %v: %d log store joint records, %d candidates that gave up for want of a fenced majority of a log store set",
		steps, seeds, time.Since(start).Round(time.Millisecond), joints, refused)
}
