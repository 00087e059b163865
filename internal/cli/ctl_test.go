package cli

import (
	"strings"
	"testing"

	"github.com/walship/walship/internal/cluster"
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
