package e2e

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	walshipv1 "github.com/walship/walship/gen/walship/v1"
	"github.com/walship/walship/internal/testkit"
)

// TestMeasureLearnerCatchUp measures, over WALSHIP_MEMBERS_RUNS rounds
// (skipped without it), what a learner catching up costs the primary
// (issue 38's target: its commits/s drop by at most 10 %). On the
// failover cluster (members n0, n1, n2; any 1 at flush and a log store
// majority), with a log preloaded to WALSHIP_LEARNER_PRELOAD_MB (default
// 400, a catch-up of about a minute at the default --learner-bytes-per-second)
// of distinct keys, each round runs 4 writers of sync writes back to back
// for WALSHIP_LEARNER_WINDOW (default 40 s: 200 MiB paced at 8 MiB/s take
// 25 s; give go test a -timeout past 10 minutes) twice: (a) with no change, (b) while a fresh, empty n3 is
// started and `walship ctl members add` makes it a learner that catches up
// from nothing, then a member. It logs the commits/s of each, their ratio
// b/a, the primary's CPU per commit, when n3 left the learner stage and the
// commits/s from n3's start until then; n3 is removed and its process and data dropped between
// rounds. It asserts only that the measurement ran: n3 became a member and
// writes were acknowledged.
//
// WALSHIP_LEARNER_RATE sets the nodes' --learner-bytes-per-second (bytes/s;
// unset, the binary's default). WALSHIP_LEARNER_PIN=1 pins n3 to CPU 1 and
// every other process of the cluster, and this test's, to CPU 0: the
// learner then has a core of its own, as on a host of its own.
func TestMeasureLearnerCatchUp(t *testing.T) {
	runs := measureRuns(t, "WALSHIP_MEMBERS_RUNS", "what a learner catching up costs the primary")
	needLinux(t)
	preloadMB := 400
	if v, err := strconv.Atoi(os.Getenv("WALSHIP_LEARNER_PRELOAD_MB")); err == nil && v > 0 {
		preloadMB = v
	}
	window := 40 * time.Second
	if v, err := time.ParseDuration(os.Getenv("WALSHIP_LEARNER_WINDOW")); err == nil && v > 0 {
		window = v
	}
	c := newFailoverCluster(t, func(i int) string { return fmt.Sprintf("n%d", i) })
	n0, n1 := c.nodes[0], c.nodes[1]
	// WALSHIP_LEARNER_PPROF names a directory for the primary's CPU profile
	// of each window (round<i>-<a|b>.pprof).
	profDir := os.Getenv("WALSHIP_LEARNER_PPROF")
	if profDir != "" {
		n0.metrics = testkit.FreeAddr(t)
		setFlag(n0.args, "--metrics-listen", n0.metrics)
		n0.args = append(n0.args, "--pprof")
	}
	if v := os.Getenv("WALSHIP_LEARNER_RATE"); v != "" {
		for _, n := range c.nodes {
			n.args = append(n.args, "--learner-bytes-per-second", v)
		}
	}
	pin := os.Getenv("WALSHIP_LEARNER_PIN") == "1"
	c.start(t)
	if pin {
		pinCPU(t, os.Getpid(), "0")
		for _, n := range append(append([]*procNode{}, c.nodes...), c.logstores...) {
			pinCPU(t, n.p.cmd.Process.Pid, "0")
		}
	}
	n3addr := testkit.FreeAddr(t)
	dir := t.TempDir()
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Minute+time.Duration(runs)*(2*window+3*time.Minute))
	defer cancel()
	kv := walshipv1.NewKVServiceClient(conn(t, n0.addr))
	admin0 := walshipv1.NewAdminServiceClient(conn(t, n0.addr))
	testkit.Until(t, "the primary to take a write", func() bool {
		_, err := kv.Put(ctx, &walshipv1.PutRequest{Key: "lc/warm", Value: []byte("x")})
		return err == nil
	})

	// The preload: distinct keys, so that neither the log nor the state is
	// small, whichever rung the learner catches up on.
	began := time.Now()
	value := make([]byte, 16<<10)
	puts := preloadMB << 20 / len(value)
	var next atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := next.Add(1); i <= int64(puts); i = next.Add(1) {
				// A lease that lapses on a loaded machine refuses a write
				// for a moment: retry it, as a client would.
				for try := 0; ; try++ {
					_, err := kv.Put(ctx, &walshipv1.PutRequest{Key: fmt.Sprintf("pre/%08d", i), Value: value})
					if err == nil {
						break
					}
					if ctx.Err() != nil || try == 20 {
						errs <- err
						return
					}
					<-time.After(100 * time.Millisecond)
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	if err := <-errs; err != nil {
		t.Fatalf("preload: %v", err)
	}
	st, err := admin0.Status(ctx, &walshipv1.StatusRequest{})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("preloaded %d MiB (%d puts of %d KiB) in %v: the primary's WAL %d MiB from LSN %d to %d",
		preloadMB, puts, len(value)>>10, time.Since(began).Round(time.Millisecond), st.GetWalBytes()>>20, st.GetWalFirstLsn(), st.GetLastLsn())

	cluster := append(append([]*procNode{}, c.nodes...), c.logstores...)
	// cpuAll is the CPU time so far of every process of the cluster but n3.
	cpuAll := func() []time.Duration {
		var out []time.Duration
		for _, n := range cluster {
			out = append(out, procCPU(t, n.p.cmd.Process.Pid))
		}
		return out
	}
	// cpuLine names each process's CPU time between before and after.
	cpuLine := func(before, after []time.Duration) string {
		var parts []string
		for i, n := range cluster {
			parts = append(parts, fmt.Sprintf("%s %v", n.name, (after[i]-before[i]).Round(10*time.Millisecond)))
		}
		return strings.Join(parts, ", ")
	}
	// load runs 4 writers for window while fn runs (fn gets the writers'
	// context and their count of acknowledgements, and must return by the
	// window's end or soon after) and returns the commits acknowledged in
	// the window and the primary's CPU time over it.
	load := func(profile string, fn func(wctx context.Context, acks *atomic.Int64)) (int64, time.Duration, string) {
		var acks atomic.Int64
		wctx, stop := context.WithTimeout(ctx, window)
		defer stop()
		profiled := make(chan struct{})
		go func() {
			defer close(profiled)
			if profDir != "" {
				saveProfile(t, fmt.Sprintf("http://%s/debug/pprof/profile?seconds=%d", n0.metrics, int(window.Seconds())-1), filepath.Join(profDir, profile))
			}
		}()
		defer func() { <-profiled }()
		cpu0 := cpuAll()
		var wg sync.WaitGroup
		for w := range 4 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				key := fmt.Sprintf("lc/%d", w)
				for wctx.Err() == nil {
					if _, err := kv.Put(wctx, &walshipv1.PutRequest{Key: key, Value: []byte("x")}); err == nil {
						acks.Add(1)
					}
				}
			}()
		}
		fn(wctx, &acks)
		<-wctx.Done()
		n, cpu1 := acks.Load(), cpuAll()
		wg.Wait()
		return n, cpu1[0] - cpu0[0], cpuLine(cpu0, cpu1)
	}
	perSec := func(n int64) float64 { return float64(n) / window.Seconds() }
	perCommit := func(cpu time.Duration, n int64) time.Duration {
		if n == 0 {
			return 0
		}
		return cpu / time.Duration(n)
	}

	var ratios, catchRatios, afterRatios []float64
	for round := range runs {
		a, cpuA, cpusA := load(fmt.Sprintf("round%d-a.pprof", round), func(context.Context, *atomic.Int64) {})

		n3 := &procNode{name: "n3", serving: "replica serving", addr: n3addr, t: t}
		n3.args = slices.Clone(n1.args)
		n3dir := filepath.Join(dir, fmt.Sprintf("n3-%d", round))
		setFlag(n3.args, "--id", "n3")
		setFlag(n3.args, "--listen", n3.addr)
		setFlag(n3.args, "--data-dir", n3dir)
		setFlag(n3.args, "--peers", flagValue(n1.args, "--peers")+",n3="+n3.addr)
		var (
			started, addStart, learnerLeft, addDone time.Time
			acksStarted, acksLeft                   int64
			addOut                                  []byte
			addErr                                  error
			rungs                                   []string
		)
		addc := make(chan struct{})
		b, cpuB, cpusB := load(fmt.Sprintf("round%d-b.pprof", round), func(wctx context.Context, acks *atomic.Int64) {
			// n3 streams from the primary as soon as it starts, before the
			// add: its catch-up is counted from here.
			started, acksStarted = time.Now(), acks.Load()
			n3.start()
			if pin {
				pinCPU(t, n3.p.cmd.Process.Pid, "1")
			}
			admin3 := walshipv1.NewAdminServiceClient(conn(t, n3.addr))
			addStart = time.Now()
			go func() {
				defer close(addc)
				addOut, addErr = exec.CommandContext(ctx, walshipBin(t), "ctl", "members", "add", "--member", "n3="+n3.addr, "--nodes", n0.addr).CombinedOutput()
				addDone = time.Now()
			}()
			// Note when n3 leaves the learner stage and which rungs it
			// catches up on, a few times a second, for the window.
			tick := time.NewTicker(200 * time.Millisecond)
			defer tick.Stop()
			for learnerLeft.IsZero() {
				select {
				case <-wctx.Done():
					return
				case <-tick.C:
				}
				if s, err := admin3.Status(wctx, &walshipv1.StatusRequest{}); err == nil {
					if r := s.GetRung().String(); len(rungs) == 0 || rungs[len(rungs)-1] != r {
						rungs = append(rungs, r)
					}
				}
				if s, err := admin0.Status(wctx, &walshipv1.StatusRequest{}); err == nil && isVoter(s.GetContract(), "n3") {
					learnerLeft, acksLeft = time.Now(), acks.Load()
				}
			}
		})
		n3CPU := procCPU(t, n3.p.cmd.Process.Pid)
		<-addc
		if addErr != nil {
			t.Fatalf("round %d: walship ctl members add n3: %v\n%s", round, addErr, addOut)
		}
		if out := ctl(t, "members", "list", "--nodes", n0.addr); !strings.Contains(out, "members n0, n1, n2, n3;") {
			t.Fatalf("round %d: after adding n3:\n%s", round, out)
		}
		if a == 0 || b == 0 {
			t.Fatalf("round %d: no write acknowledged (%d without a change, %d with the learner)", round, a, b)
		}
		learner, catching := "after the window", ""
		if !learnerLeft.IsZero() {
			learner = learnerLeft.Sub(addStart).Round(10 * time.Millisecond).String()
			d := learnerLeft.Sub(started)
			rate := float64(acksLeft-acksStarted) / d.Seconds()
			catching = fmt.Sprintf("; from n3's start to its becoming a voter (%v) %.0f commits/s, ratio %.3f",
				d.Round(10*time.Millisecond), rate, rate/perSec(a))
			catchRatios = append(catchRatios, rate/perSec(a))
			// After: n3 a member (a replica more to ship to), its catch-up over.
			if rest := started.Add(window).Sub(learnerLeft); rest > time.Second {
				after := float64(b-acksLeft) / rest.Seconds()
				catching += fmt.Sprintf("; then to the window's end (%v) %.0f commits/s, ratio %.3f", rest.Round(10*time.Millisecond), after, after/perSec(a))
				afterRatios = append(afterRatios, after/perSec(a))
			}
		}
		ratio := float64(b) / float64(a)
		ratios = append(ratios, ratio)
		t.Logf("round %d: %.0f commits/s without a change (primary CPU %v/commit); %.0f with n3 catching up (%v/commit): ratio %.3f; n3 a voter %s after the add (add returned after %v), rungs %v%s",
			round, perSec(a), perCommit(cpuA, a), perSec(b), perCommit(cpuB, b), ratio, learner, addDone.Sub(addStart).Round(10*time.Millisecond), rungs, catching)
		t.Logf("round %d: CPU in the window without a change: %s; with n3: %s, n3 %v", round, cpusA, cpusB, n3CPU.Round(10*time.Millisecond))

		for _, line := range strings.Split(n3.p.logs(), "\n") {
			if strings.Contains(line, "no longer retains") {
				t.Logf("round %d: n3: %s", round, line)
				break
			}
		}
		ctl(t, "members", "remove", "--member", "n3", "--nodes", n0.addr)
		n3.p.kill()
		if err := os.RemoveAll(n3dir); err != nil {
			t.Fatal(err)
		}
	}
	slices.Sort(ratios)
	slices.Sort(catchRatios)
	loadavg, _ := os.ReadFile("/proc/loadavg")
	t.Logf("%d rounds: commits/s over the window with n3 added / without a change: median %.3f, min %.3f, max %.3f (load average %s)",
		runs, ratios[len(ratios)/2], ratios[0], ratios[len(ratios)-1], strings.TrimSpace(string(loadavg)))
	if len(catchRatios) > 0 {
		t.Logf("%d rounds: commits/s while n3 caught up (its start to its becoming a voter) / without a change: median %.3f, min %.3f, max %.3f",
			len(catchRatios), catchRatios[len(catchRatios)/2], catchRatios[0], catchRatios[len(catchRatios)-1])
	}
	if len(afterRatios) > 0 {
		slices.Sort(afterRatios)
		t.Logf("%d rounds: commits/s from n3's becoming a voter to the window's end / without a change: median %.3f, min %.3f, max %.3f",
			len(afterRatios), afterRatios[len(afterRatios)/2], afterRatios[0], afterRatios[len(afterRatios)-1])
	}
}

// pinCPU sets the CPU affinity of every thread of process pid to cpus
// (taskset's list); the threads it starts later inherit it.
func pinCPU(t *testing.T, pid int, cpus string) {
	t.Helper()
	if out, err := exec.Command("taskset", "-a", "-p", "-c", cpus, strconv.Itoa(pid)).CombinedOutput(); err != nil {
		t.Fatalf("taskset %d to CPU %s: %v\n%s", pid, cpus, err, out)
	}
}

// isVoter reports whether the contract (or the next one of a joint
// change) names id among its members rather than only its learners.
func isVoter(c *walshipv1.Contract, id string) bool {
	for _, m := range append(c.GetMembers(), c.GetNext().GetMembers()...) {
		if m.GetId() == id {
			return true
		}
	}
	return false
}

// procCPU is the user+system CPU time of process pid so far, from
// /proc/pid/stat (in clock ticks of 10 ms, Linux's USER_HZ).
func procCPU(t *testing.T, pid int) time.Duration {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		t.Fatal(err)
	}
	// The command name (field 2) may hold spaces; the fields after its
	// closing parenthesis start at field 3 (state); utime and stime are
	// fields 14 and 15.
	f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+1:]))
	var ticks int64
	for _, s := range f[11:13] {
		v, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			t.Fatalf("/proc/%d/stat: %v", pid, err)
		}
		ticks += v
	}
	return time.Duration(ticks) * 10 * time.Millisecond
}

// saveProfile fetches url (a pprof CPU profile) into file; a failure is
// logged, not fatal: the profile is an extra.
func saveProfile(t *testing.T, url, file string) {
	resp, err := http.Get(url)
	if err != nil {
		t.Logf("profile %s: %v", url, err)
		return
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err == nil && resp.StatusCode != http.StatusOK {
		err = fmt.Errorf("%s: %s", resp.Status, b)
	}
	if err == nil {
		err = os.WriteFile(file, b, 0o644)
	}
	if err != nil {
		t.Logf("profile %s: %v", url, err)
	}
}
