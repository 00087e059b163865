package e2e

import (
	"context"
	"fmt"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	walshipv1 "github.com/walship/walship/gen/walship/v1"
	"github.com/walship/walship/internal/testkit"
	"github.com/walship/walship/pkg/client"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

// TestForcedPromotionLosesWhatTheDryRunSays, as an operator meets it, with
// processes and walship's own commands: under K=1 at flush, with one log
// store that does not have to acknowledge, n1 alone acknowledges the tail
// while n2 and the log store are down; then the primary and n1 die
// (kill -9). With the log store and n2 back, `ctl promote --dry-run` on
// n2 finds no quorum and says the loss is every commit after the last LSN
// an answer holds; `ctl promote --force` opens n2 once n1 is back; what
// survived, read on n2, is exactly the commits up to that LSN; n1 keeps
// the tail in an orphan file, which `ctl orphans list | show | diff` find,
// decode and compare with n2's state.
func TestForcedPromotionLosesWhatTheDryRunSays(t *testing.T) {
	needLinux(t)
	dir := t.TempDir()
	lsAddr := testkit.FreeAddr(t)
	ls := &procNode{t: t, name: "ls", serving: "log store serving", addr: lsAddr, args: []string{"logstore",
		"--listen", lsAddr, "--metrics-listen", "", "--data-dir", filepath.Join(dir, "ls")}}
	var nodes []*procNode
	var peers []string
	for i := range 3 {
		n := &procNode{t: t, name: fmt.Sprintf("n%d", i), addr: testkit.FreeAddr(t), serving: "replica serving"}
		peers = append(peers, n.name+"="+n.addr)
		nodes = append(nodes, n)
	}
	for i, n := range nodes {
		cmd := "replica"
		if i == 0 {
			cmd, n.serving = "primary", "primary serving"
		}
		n.args = []string{cmd, "--id", n.name, "--listen", n.addr, "--metrics-listen", "", "--data-dir", filepath.Join(dir, n.name),
			"--peers", strings.Join(peers, ","), "--logstore", lsAddr, "--primary", nodes[0].addr,
			"--durability", "sync", "--replication", "sync", "--sync-replicas", "1", "--sync-level", "flush", "--logstore-ack", "async",
			"--sync-timeout", "3s", "--heartbeat-interval", "100ms", "--lease-timeout", "3s"}
	}
	ls.start()
	for _, n := range nodes {
		n.start()
	}
	n0, n1, n2 := nodes[0], nodes[1], nodes[2]
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	dial := func(n *procNode) walshipv1.KVServiceClient { return walshipv1.NewKVServiceClient(dialConn(t, n)) }
	put := func(kv walshipv1.KVServiceClient, k string) uint64 {
		t.Helper()
		r, err := kv.Put(ctx, &walshipv1.PutRequest{Key: k, Value: []byte("v-" + k)}, grpc.WaitForReady(true))
		if err != nil {
			t.Fatalf("put %s: %v", k, err)
		}
		return r.GetLsn()
	}
	// The primary answers only once its epoch record meets the contract
	// (n1's flush): wait for its health to say so.
	kv0 := walshipv1.NewKVServiceClient(n0.p.dial(ctx))
	var keptLast uint64
	for i := range 3 {
		keptLast = put(kv0, fmt.Sprintf("kept/%d", i))
	}
	if _, err := dial(n2).Get(ctx, &walshipv1.GetRequest{Key: "kept/0", MinLsn: keptLast}, grpc.WaitForReady(true)); err != nil {
		t.Fatalf("n2 applying LSN %d: %v", keptLast, err)
	}
	n2.p.stop()
	ls.p.stop()
	// Within the primary's 3 s lease: acknowledged by n1's flush alone.
	tail := map[string]uint64{}
	var tailLast uint64
	for i := range 3 {
		k := fmt.Sprintf("tail/%d", i)
		tail[k] = put(kv0, k)
		tailLast = tail[k]
	}
	n0.p.kill()
	n1.p.kill()
	ls.start()
	n2.start()

	// Without a quorum the dry run exits 1: the promotion would fail
	// unless forced. It still says what a forced one would lose.
	out := ctlOut(t, 1, "promote", "--dry-run", "--node", n2.addr)
	t.Logf("ctl promote --dry-run:\n%s", out)
	if !strings.Contains(out, "quorum false") || !strings.Contains(out, fmt.Sprintf("at risk without a quorum: any commit after LSN %d ", keptLast)) {
		t.Fatalf("dry run:\n%s", out)
	}
	// The forced promotion opens once n1, back, flushes its epoch record.
	promote := exec.CommandContext(ctx, walshipBin(t), "ctl", "promote", "--force", "--node", n2.addr, "--wait", "90s")
	var promoteOut strings.Builder
	promote.Stdout, promote.Stderr = &promoteOut, &promoteOut
	if err := promote.Start(); err != nil {
		t.Fatal(err)
	}
	testkit.Until(t, "n2 to fence epoch 2", func() bool {
		st, err := walshipv1.NewAdminServiceClient(dialConn(t, n2)).Status(ctx, &walshipv1.StatusRequest{})
		return err == nil && st.GetVoteEpoch() >= 2
	})
	n1.start()
	if err := promote.Wait(); err != nil {
		t.Fatalf("ctl promote --force: %v\n%s", err, promoteOut.String())
	}
	t.Logf("ctl promote --force:\n%s", promoteOut.String())

	// What survived: every commit up to keptLast, none after.
	cl, err := client.New([]string{n2.addr}, client.Options{Retry: 20 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	for i := range 3 {
		if g, err := cl.Get(ctx, fmt.Sprintf("kept/%d", i)); err != nil || !g.GetFound() {
			t.Fatalf("kept/%d after the forced promotion: %v, %v", i, g, err)
		}
	}
	for k, lsn := range tail {
		if g, err := cl.Get(ctx, k); err != nil || g.GetFound() {
			t.Fatalf("%s (LSN %d, after %d) survived the forced promotion: %v, %v", k, lsn, keptLast, g, err)
		}
	}

	// n1 kept the tail: exactly the LSNs after keptLast.
	var name string
	testkit.Until(t, "n1's orphan file", func() bool {
		out := ctlOut(t, 0, "orphans", "list", "--nodes", n1.addr)
		m := regexp.MustCompile(`orphan-e1-(\d+)-(\d+)-\d+\.wal`).FindStringSubmatch(out)
		if m == nil {
			return false
		}
		name = m[0]
		if m[1] != fmt.Sprint(keptLast+1) || m[2] != fmt.Sprint(tailLast) {
			t.Fatalf("n1's orphan holds LSNs %s..%s; the loss was %d..%d:\n%s", m[1], m[2], keptLast+1, tailLast, out)
		}
		return true
	})
	path := filepath.Join(dir, "n1", "orphans", name)
	out = ctlOut(t, 0, "orphans", "show", "--file", path)
	t.Logf("ctl orphans show:\n%s", out)
	for k, lsn := range tail {
		if !regexp.MustCompile(fmt.Sprintf(`(?m)^%d +\S+ +put +%q +%q$`, lsn, k, "v-"+k)).MatchString(out) {
			t.Fatalf("show does not list %s at LSN %d:\n%s", k, lsn, out)
		}
	}
	out = ctlOut(t, 1, "orphans", "diff", "--file", path, "--nodes", n1.addr+","+n2.addr)
	t.Logf("ctl orphans diff:\n%s", out)
	if !strings.Contains(out, "3 of 3 keys differ") || strings.Count(out, "lost: absent now") != 3 {
		t.Fatalf("diff:\n%s", out)
	}
}

func dialConn(t *testing.T, n *procNode) *grpc.ClientConn {
	t.Helper()
	conn, err := grpc.NewClient(n.addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

// ctlOut runs `walship ctl args...` and returns its output, failing
// unless it exits with code.
func ctlOut(t *testing.T, code int, args ...string) string {
	t.Helper()
	out, err := exec.Command(walshipBin(t), append([]string{"ctl"}, args...)...).CombinedOutput()
	got := 0
	if ee, ok := err.(*exec.ExitError); ok {
		got = ee.ExitCode()
	} else if err != nil {
		t.Fatalf("walship ctl %s: %v", strings.Join(args, " "), err)
	}
	if got != code {
		t.Fatalf("walship ctl %s: exit %d, want %d\n%s", strings.Join(args, " "), got, code, out)
	}
	return string(out)
}
