package e2e

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/walship/walship/internal/testkit"
	"github.com/walship/walship/pkg/client"
)

// TestLogStoreMembershipChange: under load checked for linearizability,
// on the failover cluster (members n0, n1, n2; any 1 at flush and a log
// store majority; log stores ls0, ls1, ls2), with `walship ctl members`:
//
//  1. add ls3 and ls4, empty and started with --peers naming the
//     cluster's log stores: 3 → 5 log stores, each a learner until it has
//     refilled and caught up;
//  2. remove ls4 and ls3: back to 3;
//  3. kill -9 ls2, and replace it with ls5, empty, at a new address.
//
// Every acknowledged write is read back, the history is linearizable, and
// the replicas converge.
func TestLogStoreMembershipChange(t *testing.T) {
	needLinux(t)
	c := startFailoverCluster(t)
	n0 := c.nodes[0]
	var peers []string
	for _, l := range c.logstores {
		peers = append(peers, l.addr)
	}
	dir := t.TempDir()
	newStore := func(name string) *procNode {
		addr := testkit.FreeAddr(t)
		n := &procNode{name: name, serving: "log store serving", addr: addr, t: t, args: []string{"logstore",
			"--listen", addr, "--metrics-listen", "", "--data-dir", filepath.Join(dir, name), "--peers", strings.Join(append(peers, addr), ",")}}
		n.start()
		return n
	}
	ls3, ls4, ls5 := newStore("ls3"), newStore("ls4"), newStore("ls5")

	cl, err := client.New(c.addrs(), client.Options{Retry: 20 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cl.Close() })
	ctx, cancel := context.WithTimeout(t.Context(), 4*time.Minute)
	t.Cleanup(cancel)
	h, finish := runChecked(t, ctx, cl, "logstores/", 30*time.Second)
	<-time.After(time.Second)

	list := func(want ...string) {
		t.Helper()
		out := ctl(t, "members", "list", "--nodes", n0.addr)
		if line := fmt.Sprintf("; log stores %s;", strings.Join(want, ", ")); !strings.Contains(out, line) || !strings.Contains(out, "no change in progress") {
			t.Fatalf("members list, want %q:\n%s", line, out)
		}
	}
	ls0, ls1, ls2 := c.logstores[0].addr, c.logstores[1].addr, c.logstores[2].addr
	for _, step := range []struct {
		note string
		args []string
		want []string
	}{
		{"add ls3", []string{"add", "--logstore", ls3.addr}, []string{ls0, ls1, ls2, ls3.addr}},
		{"add ls4", []string{"add", "--logstore", ls4.addr}, []string{ls0, ls1, ls2, ls3.addr, ls4.addr}},
		{"remove ls4", []string{"remove", "--logstore", ls4.addr}, []string{ls0, ls1, ls2, ls3.addr}},
		{"remove ls3", []string{"remove", "--logstore", ls3.addr}, []string{ls0, ls1, ls2}},
		{"kill -9 ls2; replace it with ls5", []string{"replace", "--logstore", ls2 + "=" + ls5.addr}, []string{ls0, ls1, ls5.addr}},
	} {
		h.Note("%s", step.note)
		if strings.HasPrefix(step.note, "kill") {
			c.logstores[2].p.kill()
		}
		t.Logf("ctl members %s:\n%s", strings.Join(step.args, " "), ctl(t, append(append([]string{"members"}, step.args...), "--nodes", n0.addr)...))
		list(step.want...)
	}
	finish()
	converge(t, ctx, n0.addr, c.nodes[1].addr, c.nodes[2].addr)
}
