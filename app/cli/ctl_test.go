package cli

import (
	"slices"
	"strings"
	"testing"

	"github.com/walship/walship/app/cluster"
	walshipv1 "github.com/walship/walship/gen/walship/v1"
	"github.com/walship/walship/internal/serve"
	"github.com/walship/walship/internal/testkit"
)

// TestCtlStatusShowsClusters: `walship ctl status` shows each node's
// cluster id, and warns, listing them, when the nodes it was given belong
// to different clusters.
func TestCtlStatusShowsClusters(t *testing.T) {
	start := func() (*cluster.Cluster, string) {
		c, err := cluster.Start(t.Context(), cluster.Config{Dir: t.TempDir(), LogStores: 1})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			if err := c.Stop(); err != nil {
				t.Error(err)
			}
		})
		st, err := c.Status(t.Context(), c.Primary)
		if err != nil {
			t.Fatal(err)
		}
		return c, st.ClusterId
	}
	a, idA := start()
	b, idB := start()
	code, out, errOut := run(t, "ctl", "status", "--nodes", a.Primary.Addr+","+a.LogStores[0].Addr)
	if code != 0 || !strings.Contains(out, "CLUSTER") || strings.Count(out, idA) != 2 || strings.Contains(out, "warning") {
		t.Fatalf("one cluster: exit %d\nstdout:\n%s\nstderr:\n%s", code, out, errOut)
	}
	// Every hop of the primary's, with its lag in records, bytes and
	// seconds.
	_, peers, _ := strings.Cut(out, "peers of primary")
	if !strings.Contains(peers, "LAG BYTES") || !strings.Contains(peers, "LAG SECONDS") || !strings.Contains(peers, a.LogStores[0].Addr+" ") {
		t.Fatalf("no peers block naming the log store with its lag:\n%s", out)
	}
	code, out, errOut = run(t, "ctl", "status", "--nodes", a.Primary.Addr+","+b.Primary.Addr)
	if code != 0 || !strings.Contains(out, "warning: these nodes belong to 2 different clusters") ||
		!strings.Contains(out, idA+": "+a.Primary.Addr) || !strings.Contains(out, idB+": "+b.Primary.Addr) {
		t.Fatalf("two clusters: exit %d\nstdout:\n%s\nstderr:\n%s", code, out, errOut)
	}
}

// TestCtlStatusShowsRefilling: a log store copying what it missed from its
// peers says so in `walship ctl status`, where it takes no writes yet.
func TestCtlStatusShowsRefilling(t *testing.T) {
	// Its only peer is not there: it waits to refill.
	addr := serveLogStore(t, t.TempDir(), testkit.FreeAddr(t))
	code, out, errOut := run(t, "ctl", "status", "--nodes", addr)
	var row string
	for _, line := range strings.Split(out, "\n") {
		if strings.HasPrefix(line, addr) {
			row = line
		}
	}
	if code != 0 || !strings.Contains(row, "logstore") || !strings.Contains(row, "refilling") {
		t.Fatalf("exit %d, row %q\nstdout:\n%s\nstderr:\n%s", code, row, out, errOut)
	}
}

// TestCtlStatusUnreachable: a node that does not answer fails `walship ctl
// status` (exit 1, so that a script notices), its row keeps every column
// (the rows after it stay aligned with the header), and why is printed
// below the table.
func TestCtlStatusUnreachable(t *testing.T) {
	c, err := cluster.Start(t.Context(), cluster.Config{Dir: t.TempDir(), LogStores: 1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := c.Stop(); err != nil {
			t.Error(err)
		}
	})
	gone := testkit.FreeAddr(t)
	code, out, errOut := run(t, "ctl", "status", "--nodes", c.Primary.Addr+","+gone+","+c.LogStores[0].Addr)
	if code != 1 || !strings.Contains(errOut, "1 of 3 nodes unreachable") || !strings.Contains(out, "\n"+gone+" unreachable: ") {
		t.Fatalf("exit %d\nstdout:\n%s\nstderr:\n%s", code, out, errOut)
	}
	lines := strings.Split(out, "\n")
	starts := func(line string) []int {
		var at []int
		for i := range line {
			if line[i] != ' ' && (i == 0 || line[i-1] == ' ') {
				at = append(at, i)
			}
		}
		return at
	}
	header := starts(lines[0])
	if len(header) != 15 {
		t.Fatalf("header has %d columns:\n%s", len(header), out)
	}
	for _, line := range lines[1:4] {
		if got := starts(line); !slices.Equal(got, header) {
			t.Errorf("row %q: columns start at %v, the header's at %v\n%s", line, got, header, out)
		}
	}
}

// TestCtlPromoteRefusesServingPrimary: `walship ctl promote` does not
// depose a primary that takes writes: its dry run names it and exits 1,
// and the promotion is refused (the server's FAILED_PRECONDITION) with
// the switchover to use instead, the primary untouched; --force too (it
// waives votes, only --depose deposes). Once the primary
// is gone the dry run passes; without a log store majority it exits 1
// (quorum false), where it said "at risk: nothing" and exited 0.
func TestCtlPromoteRefusesServingPrimary(t *testing.T) {
	c, err := cluster.Start(t.Context(), cluster.Config{Dir: t.TempDir(), LogStores: 1, Replicas: 1, Failover: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := c.Stop(); err != nil {
			t.Error(err)
		}
	})
	p, r := c.Primary.Addr, c.Replicas[0].Addr
	if err := c.WaitServing(t.Context(), c.Replicas[0]); err != nil {
		t.Fatal(err)
	}
	switchover := "use `walship ctl switchover --primary " + p + " --target replica-0`"
	code, out, errOut := run(t, "ctl", "promote", "--node", r, "--dry-run")
	if code != 1 || !strings.Contains(out, "serving primary: primary at "+p+" takes writes in epoch 1") || !strings.Contains(errOut, "would be refused") ||
		!strings.Contains(out, switchover) {
		t.Fatalf("dry run with a serving primary: exit %d\nstdout:\n%s\nstderr:\n%s", code, out, errOut)
	}
	code, out, errOut = run(t, "ctl", "promote", "--node", r, "--wait", "5s")
	if code != 1 || !strings.Contains(errOut, "FailedPrecondition") || !strings.Contains(errOut, "primary at "+p+" is the primary of epoch 1 and takes writes") ||
		!strings.Contains(errOut, switchover) {
		t.Fatalf("promotion with a serving primary: exit %d\nstdout:\n%s\nstderr:\n%s", code, out, errOut)
	}
	// --force waives a dead replica's vote; it is no licence to depose a
	// primary that takes writes: that needs --depose.
	code, out, errOut = run(t, "ctl", "promote", "--node", r, "--dry-run", "--force")
	if code != 1 || !strings.Contains(errOut, "would be refused") {
		t.Fatalf("forced dry run with a serving primary: exit %d\nstdout:\n%s\nstderr:\n%s", code, out, errOut)
	}
	code, out, errOut = run(t, "ctl", "promote", "--node", r, "--force", "--wait", "5s")
	if code != 1 || !strings.Contains(errOut, "FailedPrecondition") || !strings.Contains(errOut, "depose it (depose: true; force alone does not)") {
		t.Fatalf("forced promotion with a serving primary: exit %d\nstdout:\n%s\nstderr:\n%s", code, out, errOut)
	}
	if st, err := nodeStatus(t.Context(), serve.Dialer{}, p); err != nil || st.GetRole() != walshipv1.Role_ROLE_PRIMARY || !st.GetTakingWrites() || st.GetEpoch() != 1 {
		t.Fatalf("the primary after the refused promotions: %v, %v", st, err)
	}
	code, out, errOut = run(t, "ctl", "promote", "--node", r, "--dry-run", "--depose")
	if code != 0 || !strings.Contains(out, "serving primary: primary at "+p) {
		t.Fatalf("dry run with --depose and a serving primary: exit %d\nstdout:\n%s\nstderr:\n%s", code, out, errOut)
	}

	if err := c.StopNode(c.Primary); err != nil {
		t.Fatal(err)
	}
	code, out, errOut = run(t, "ctl", "promote", "--node", r, "--dry-run")
	if code != 0 || strings.Contains(out, "serving primary") || !strings.Contains(out, "quorum true") {
		t.Fatalf("dry run without a primary: exit %d\nstdout:\n%s\nstderr:\n%s", code, out, errOut)
	}
	if err := c.StopNode(c.LogStores[0]); err != nil {
		t.Fatal(err)
	}
	code, out, errOut = run(t, "ctl", "promote", "--node", r, "--dry-run")
	if code != 1 || !strings.Contains(out, "quorum false") || !strings.Contains(errOut, "would fail: it needs 1 of 1 log stores") {
		t.Fatalf("dry run without a log store majority: exit %d\nstdout:\n%s\nstderr:\n%s", code, out, errOut)
	}
}
