package cli

import (
	"context"
	"fmt"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/walship/walship/app/cluster"
	walshipv1 "github.com/walship/walship/gen/walship/v1"
)

// TestCtlOrphans: a forced promotion loses the tail replica-0 alone
// acknowledged (cluster.TailLoss), and replica-0 keeps it in an orphan
// file when it rejoins. `ctl orphans list` finds the file in the data
// directory and through the node's Status; `show` decodes every write of
// it (key, value, commit LSN, commit time); `diff` compares each key's
// last write with the new primary's state — rewritten to the same value,
// rewritten to another, still absent — and exits 1 as keys differ.
func TestCtlOrphans(t *testing.T) {
	c, err := cluster.Start(t.Context(), cluster.Config{Dir: t.TempDir(), LogStores: 1, Replicas: 2, Failover: true, Primary: cluster.TailLossConfig})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Stop() })
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	tail := []string{"order/1", "order/2", "order/3"}
	loss, err := c.TailLoss(ctx, []string{"kept"}, tail)
	if err != nil {
		t.Fatal(err)
	}
	o := loss.Orphans[0]
	path := filepath.Join(loss.OrphanDir, "orphans", o.Name)
	lsns := fmt.Sprintf("%d..%d", o.FirstLSN, o.LastLSN)

	code, out, errOut := run(t, "ctl", "orphans", "list", "--data-dir", loss.OrphanDir)
	if code != 0 || !strings.Contains(out, o.Name) || !strings.Contains(out, lsns) {
		t.Fatalf("list --data-dir: exit %d\n%s%s", code, out, errOut)
	}
	code, out, errOut = run(t, "ctl", "orphans", "list", "--nodes", c.Replicas[0].Addr)
	if code != 0 || !strings.Contains(out, o.Name) || !strings.Contains(out, "(replica-0)") || !strings.Contains(out, lsns) {
		t.Fatalf("list --nodes: exit %d\n%s%s", code, out, errOut)
	}

	code, out, errOut = run(t, "ctl", "orphans", "show", "--file", path)
	if code != 0 {
		t.Fatalf("show: exit %d\n%s%s", code, out, errOut)
	}
	for _, cm := range loss.Tail {
		// COMMIT_LSN, an RFC 3339 commit time, put, the key, the value.
		re := regexp.MustCompile(fmt.Sprintf(`(?m)^%d +20\d\d-\d\d-\d\dT[0-9:.]+Z +put +%q +%q$`, cm.LSN, cm.Key, cm.Value))
		if !re.MatchString(out) {
			t.Fatalf("show does not list %s = %s at LSN %d with its commit time:\n%s", cm.Key, cm.Value, cm.LSN, out)
		}
	}
	if !strings.Contains(out, fmt.Sprintf("%d writes", len(tail))) {
		t.Fatalf("show's summary:\n%s", out)
	}

	// The application acts on some of it: order/1 written again as it
	// was, order/2 written otherwise; order/3 stays lost.
	kv := walshipv1.NewKVServiceClient(c.Conn(c.Replicas[1]))
	for k, v := range map[string]string{"order/1": loss.Tail[0].Value, "order/2": "changed"} {
		if _, err := kv.Put(ctx, &walshipv1.PutRequest{Key: k, Value: []byte(v)}); err != nil {
			t.Fatal(err)
		}
	}
	nodes := c.Replicas[0].Addr + "," + c.Replicas[1].Addr
	code, out, errOut = run(t, "ctl", "orphans", "diff", "--file", path, "--nodes", nodes)
	if code != 1 {
		t.Fatalf("diff with differences: exit %d, want 1\n%s%s", code, out, errOut)
	}
	for _, want := range []string{
		`(?m)^"order/1" .* same$`,
		`(?m)^"order/2" .* "changed" +differs$`,
		`(?m)^"order/3" .* absent +lost: absent now$`,
		`2 of 3 keys differ`,
	} {
		if !regexp.MustCompile(want).MatchString(out) {
			t.Fatalf("diff output does not match %s:\n%s", want, out)
		}
	}
	if strings.Contains(out, "walship/epoch") {
		t.Fatalf("diff compares walship's own epoch key:\n%s", out)
	}

	code, _, errOut = run(t, "ctl", "orphans", "show")
	if code != 2 || !strings.Contains(errOut, "--file: required") {
		t.Fatalf("show without --file: exit %d, %s", code, errOut)
	}
}

// TestCtlPromoteDryRunWithoutQuorum: with the tail's holders down, the
// dry run's answers hold nothing of the tail and name no range at risk;
// `ctl promote --dry-run` does not say "at risk: nothing" then, but where
// the loss of a forced promotion starts (after the most advanced log that
// answered) and that its end is unknown. The forced promotion then loses
// exactly the commits after that LSN.
func TestCtlPromoteDryRunWithoutQuorum(t *testing.T) {
	c, err := cluster.Start(t.Context(), cluster.Config{Dir: t.TempDir(), LogStores: 1, Replicas: 2, Failover: true, Primary: cluster.TailLossConfig})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Stop() })
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	loss, err := c.StageTailLoss(ctx, []string{"a", "b"}, []string{"c", "d"})
	if err != nil {
		t.Fatal(err)
	}
	highest := loss.Kept[len(loss.Kept)-1].LSN
	_, out, errOut := run(t, "ctl", "promote", "--dry-run", "--node", c.Replicas[1].Addr)
	if !strings.Contains(out, "quorum false") || strings.Contains(out, "at risk: nothing") ||
		!strings.Contains(out, fmt.Sprintf("at risk without a quorum: any commit after LSN %d that only the members that did not answer hold", highest)) {
		t.Fatalf("dry run without a quorum:\n%s%s", out, errOut)
	}
	if _, err := walshipv1.NewAdminServiceClient(c.Conn(c.Replicas[1])).Promote(ctx, &walshipv1.PromoteRequest{Force: true}); err != nil {
		t.Fatal(err)
	}
	if err := c.FinishTailLoss(ctx, loss); err != nil {
		t.Fatal(err)
	}
	if o := loss.Orphans[0]; o.FirstLSN != highest+1 || o.LastLSN != loss.Tail[len(loss.Tail)-1].LSN {
		t.Fatalf("lost %d..%d; the dry run said after %d", o.FirstLSN, o.LastLSN, highest)
	}
}
