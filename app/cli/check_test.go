package cli

import (
	"strings"
	"testing"

	"github.com/walship/walship/app/cluster"
	walshipv1 "github.com/walship/walship/gen/walship/v1"
	"github.com/walship/walship/internal/serve"
	"github.com/walship/walship/pkg/client"
)

// TestCheckLinear runs `walship check linear` against an in-process
// cluster, as the README runs it against `walship dev`: it prints a
// linearizable verdict, checks the replica too, and leaves no key behind;
// pointed at a replica instead of the primary it refuses to start.
func TestCheckLinear(t *testing.T) {
	c, err := cluster.Start(t.Context(), cluster.Config{Dir: t.TempDir(), LogStores: 1, Replicas: 1})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := c.Stop(); err != nil {
			t.Error(err)
		}
	})
	code, out, errOut := run(t, "check", "linear", "--primary", c.Primary.Addr, "--replica", c.Replicas[0].Addr,
		"--duration", "1s", "--rate", "2000", "--prefix", "cli-check/")
	if code != 0 || !strings.Contains(out, "\nlinearizable: ") || !strings.Contains(out, ", 0 read-your-writes or monotonic-read violations") {
		t.Fatalf("exit %d\nstdout:\n%s\nstderr:\n%s", code, out, errOut)
	}
	scan, err := walshipv1.NewKVServiceClient(c.Conn(c.Primary)).Scan(t.Context(), &walshipv1.ScanRequest{Start: "cli-check/", End: "cli-check0"})
	if err != nil || len(scan.Kvs) != 0 {
		t.Fatalf("keys left behind: %v, %v", scan, err)
	}
	for _, tc := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"--primary", c.Replicas[0].Addr}, 1, "not the primary"},
		{[]string{"--duration", "2h"}, 2, "--duration: 2h0m0s is not in (0, 1h0m0s]"},
		{[]string{"--rate", "0"}, 2, "--rate: 0 is not in (0, 20000]"},
		{[]string{"--concurrency", "0"}, 2, "--concurrency: 0 is not in 1..64"},
	} {
		code, _, errOut := run(t, append([]string{"check", "linear"}, tc.args...)...)
		if code != tc.code || !strings.Contains(errOut, tc.want) {
			t.Errorf("check linear %v: exit %d, stderr %q; want exit %d mentioning %q", tc.args, code, errOut, tc.code, tc.want)
		}
	}
}

// TestCheckFailover runs `walship check failover` with a switchover
// against an in-process cluster whose nodes are members: the primary
// hands over mid-run, the workload goes on through pkg/client, and the
// history read back is linearizable.
func TestCheckFailover(t *testing.T) {
	c, err := cluster.Start(t.Context(), cluster.Config{Dir: t.TempDir(), LogStores: 1, Replicas: 2, Failover: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := c.Stop(); err != nil {
			t.Error(err)
		}
	})
	nodes := c.Primary.Addr + "," + c.Replicas[0].Addr + "," + c.Replicas[1].Addr
	code, out, errOut := run(t, "check", "failover", "--nodes", nodes, "--duration", "3s", "--rate", "1000", "--prefix", "cli-failover/")
	if code != 0 || !strings.Contains(out, "\nlinearizable: ") || !strings.Contains(out, "switched over to replica-") {
		t.Fatalf("exit %d\nstdout:\n%s\nstderr:\n%s", code, out, errOut)
	}
	// No key left behind, the one written after the fault included; and
	// Status counts none (the epoch record is walship's, not a client's).
	cl, err := client.New(strings.Split(nodes, ","), client.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	scan, err := cl.KV().Scan(t.Context(), &walshipv1.ScanRequest{Start: "cli-failover/", End: "cli-failover0"})
	if err != nil || len(scan.GetKvs()) != 0 {
		t.Fatalf("keys left behind: %v, %v", scan, err)
	}
	addr, err := cl.Primary(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	st, err := nodeStatus(t.Context(), serve.Dialer{}, addr)
	if err != nil || st.GetKeys() != 0 {
		t.Fatalf("the primary's Status counts %d keys (%v); want 0", st.GetKeys(), err)
	}
	if code, _, errOut := run(t, "check", "failover", "--nodes", nodes, "--fault", "kill"); code != 2 || !strings.Contains(errOut, "--kill-command: required") {
		t.Fatalf("--fault kill without a command: exit %d, %q", code, errOut)
	}
}
