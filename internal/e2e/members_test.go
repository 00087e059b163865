package e2e

import (
	"context"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	walshipv1 "github.com/walship/walship/gen/walship/v1"
	"github.com/walship/walship/internal/testkit"
	"github.com/walship/walship/pkg/client"
)

// TestMembershipChangeKill9: under load checked for linearizability, on
// the failover cluster (members n0, n1, n2; any 1 at flush and a log
// store majority):
//
//  1. `walship ctl members add` makes n3, a running replica, a member
//     (learner, joint, final): members n0, n1, n2, n3;
//  2. with n1 and n3 paused (SIGSTOP), `walship ctl members remove n2`
//     is refused: their streams stay up, but the members left (n1, n3)
//     acknowledge nothing, so they could not acknowledge its joint
//     record;
//  3. with n1 and n3 resumed the removal is taken, and the primary is
//     killed (kill -9) as soon as n1 holds a record of it (the joint
//     one, or already the final one); `walship ctl promote` makes n1 the
//     primary. If its log ends in the joint record it opens under the
//     joint contract and finishes the change (a removal adds no one to
//     wait for) — never C_old alone.
//
// Every acknowledged write is read back, the history is linearizable, and
// the old primary rejoins and converges.
func TestMembershipChangeKill9(t *testing.T) {
	needLinux(t)
	c := startFailoverCluster(t)
	n0, n1, n2 := c.nodes[0], c.nodes[1], c.nodes[2]
	n3 := &procNode{name: "n3", serving: "replica serving", addr: testkit.FreeAddr(t), t: t}
	n3.args = slices.Clone(n1.args)
	setFlag(n3.args, "--id", "n3")
	setFlag(n3.args, "--listen", n3.addr)
	setFlag(n3.args, "--data-dir", filepath.Join(t.TempDir(), "n3"))
	setFlag(n3.args, "--peers", flagValue(n1.args, "--peers")+",n3="+n3.addr)
	n3.start()

	cl, err := client.New([]string{n0.addr, n1.addr, n2.addr, n3.addr}, client.Options{Retry: 20 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cl.Close() })
	ctx, cancel := context.WithTimeout(t.Context(), 4*time.Minute)
	t.Cleanup(cancel)
	h, finish := runChecked(t, ctx, cl, "members/", 10*time.Second)
	<-time.After(time.Second)

	h.Note("add n3")
	t.Logf("ctl members add n3:\n%s", ctl(t, "members", "add", "--member", "n3="+n3.addr, "--nodes", n0.addr))
	if out := ctl(t, "members", "list", "--nodes", n0.addr); !strings.Contains(out, "members n0, n1, n2, n3;") || !strings.Contains(out, "no change in progress") {
		t.Fatalf("after adding n3:\n%s", out)
	}

	h.Note("pause n1 and n3; remove n2: refused")
	n1.p.pause()
	n3.p.pause()
	refused, err := exec.Command(walshipBin(t), "ctl", "members", "remove", "--member", "n2", "--nodes", n0.addr, "--timeout", "2m").CombinedOutput()
	if err == nil || !strings.Contains(string(refused), "acknowledging") || !strings.Contains(string(refused), "n1 has") || !strings.Contains(string(refused), "n3 has") {
		t.Fatalf("ctl members remove n2 with n1 and n3 paused: %v\n%s\nwant a refusal naming n1 and n3: the members left cannot acknowledge", err, refused)
	}
	n1.p.signal(syscall.SIGCONT)
	n3.p.signal(syscall.SIGCONT)

	// A change the primary dies in.
	h.Note("remove n2")
	removing := exec.Command(walshipBin(t), "ctl", "members", "remove", "--member", "n2", "--nodes", n0.addr, "--timeout", "2m")
	var removeOut strings.Builder
	removing.Stdout, removing.Stderr = &removeOut, &removeOut
	if err := removing.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = removing.Process.Kill(); _ = removing.Wait() })
	admin1 := walshipv1.NewAdminServiceClient(conn(t, n1.addr))
	testkit.Until(t, "n1 to hold a record of the removal", func() bool {
		st, err := admin1.Status(ctx, &walshipv1.StatusRequest{})
		return err == nil && (st.GetContract().GetNext() != nil || len(st.GetContract().GetMembers()) == 3)
	})
	h.Note("kill -9 n0 (the primary) during the removal")
	n0.p.kill()
	_ = removing.Wait()
	t.Logf("ctl members remove n2, whose primary was killed:\n%s", removeOut.String())
	t.Logf("ctl promote:\n%s", ctl(t, "promote", "--node", n1.addr, "--wait", "30s"))
	h.Note("n1 promoted")

	var out string
	testkit.Until(t, "n1 to finish or roll back the change", func() bool {
		o, err := exec.Command(walshipBin(t), "ctl", "members", "list", "--nodes", n1.addr).CombinedOutput()
		out = string(o)
		return err == nil && strings.Contains(out, "no change in progress")
	})
	t.Logf("ctl members list after the failover:\n%s", out)
	switch {
	case strings.Contains(out, "members n0, n1, n3;"):
		t.Log("the new primary finished the change")
	case strings.Contains(out, "members n0, n1, n2, n3;"):
		t.Log("the new primary rolled the change back")
	default:
		t.Fatalf("after the failover, neither C_new nor C_old:\n%s", out)
	}
	finish()
	n0.serving = "replica serving"
	n0.start()
	converge(t, ctx, n1.addr, n0.addr, n2.addr, n3.addr)
}

// TestMeasureMembershipChange measures, over WALSHIP_MEMBERS_RUNS cycles
// (skipped without it), the longest gap between two acknowledged writes of
// 4 writers sending sync writes back to back (any 1 at flush and a log
// store majority) while `walship ctl members add` adds n3 and `remove`
// takes it out again, against the longest gap of an equal stretch without
// a change: what a membership change pauses writes for (issue 38's target:
// 100 ms).
func TestMeasureMembershipChange(t *testing.T) {
	runs := measureRuns(t, "WALSHIP_MEMBERS_RUNS", "membership change pauses")
	needLinux(t)
	c := startFailoverCluster(t)
	n0, n1 := c.nodes[0], c.nodes[1]
	n3 := &procNode{name: "n3", serving: "replica serving", addr: testkit.FreeAddr(t), t: t}
	n3.args = slices.Clone(n1.args)
	setFlag(n3.args, "--id", "n3")
	setFlag(n3.args, "--listen", n3.addr)
	setFlag(n3.args, "--data-dir", filepath.Join(t.TempDir(), "n3"))
	setFlag(n3.args, "--peers", flagValue(n1.args, "--peers")+",n3="+n3.addr)
	n3.start()
	ctx, cancel := context.WithTimeout(t.Context(), time.Duration(runs)*time.Minute)
	defer cancel()
	kv := walshipv1.NewKVServiceClient(conn(t, n0.addr))
	testkit.Until(t, "the primary to take a write", func() bool {
		_, err := kv.Put(ctx, &walshipv1.PutRequest{Key: "m/warm", Value: []byte("x")})
		return err == nil
	})
	// gap runs the writers during fn and returns the longest time between
	// two acknowledgements, and how many there were.
	gap := func(fn func()) (time.Duration, int) {
		acks := make(chan time.Time, 1<<16)
		wctx, stop := context.WithCancel(ctx)
		done := make(chan struct{})
		for w := range 4 {
			go func() {
				defer func() { done <- struct{}{} }()
				for i := 0; wctx.Err() == nil; i++ {
					if _, err := kv.Put(wctx, &walshipv1.PutRequest{Key: "m/" + string(rune('a'+w)), Value: []byte("x")}); err == nil {
						acks <- time.Now()
					}
				}
			}()
		}
		start := time.Now()
		fn()
		stop()
		for range 4 {
			<-done
		}
		close(acks)
		var longest time.Duration
		prev, n := start, 0
		for a := range acks {
			longest, prev, n = max(longest, a.Sub(prev)), a, n+1
		}
		return longest, n
	}
	var during, without []time.Duration
	for i := range runs {
		var took time.Duration
		g, n := gap(func() {
			began := time.Now()
			ctl(t, "members", "add", "--member", "n3="+n3.addr, "--nodes", n0.addr)
			ctl(t, "members", "remove", "--member", "n3", "--nodes", n0.addr)
			took = time.Since(began)
		})
		during = append(during, g)
		b, m := gap(func() { <-time.After(took) })
		without = append(without, b)
		t.Logf("run %d: add+remove took %v: longest gap %v (%d writes); without a change %v (%d writes)", i, took.Round(time.Millisecond), g.Round(time.Millisecond), n, b.Round(time.Millisecond), m)
	}
	dm, dx := medianMax(during)
	wm, wx := medianMax(without)
	t.Logf("%d runs: longest write gap during add+remove median %v, max %v; without a change median %v, max %v",
		runs, dm.Round(time.Millisecond), dx.Round(time.Millisecond), wm.Round(time.Millisecond), wx.Round(time.Millisecond))
}

// setFlag sets the value following flag in args.
func setFlag(args []string, flag, value string) {
	if i := slices.Index(args, flag); i >= 0 && i+1 < len(args) {
		args[i+1] = value
	}
}

// flagValue is the value following flag in args ("" if none).
func flagValue(args []string, flag string) string {
	if i := slices.Index(args, flag); i >= 0 && i+1 < len(args) {
		return args[i+1]
	}
	return ""
}
