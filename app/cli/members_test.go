package cli

import (
	"regexp"
	"strings"
	"testing"

	"github.com/walship/walship/app/cluster"
	"github.com/walship/walship/internal/testkit"
)

// TestCtlMembersList: `walship ctl members list` asks the nodes it is
// given until the primary answers (a replica names the primary), and
// prints the configuration: no change in progress, the primary, both
// replicas as voters and the log store, each with how far behind it is;
// `walship ctl status` shows the same block. Given no primary, it exits 1
// naming each node's refusal.
func TestCtlMembersList(t *testing.T) {
	c, err := cluster.Start(t.Context(), cluster.Config{Dir: t.TempDir(), LogStores: 1, Replicas: 2, Failover: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := c.Stop(); err != nil {
			t.Error(err)
		}
	})
	for _, r := range c.Replicas {
		if err := c.WaitServing(t.Context(), r); err != nil {
			t.Fatal(err)
		}
	}
	r0, p, ls := c.Replicas[0].Addr, c.Primary.Addr, c.LogStores[0].Addr
	want := []*regexp.Regexp{
		regexp.MustCompile(`configuration of epoch \d+, primary primary: members primary, replica-0, replica-1; log stores ` + regexp.QuoteMeta(ls) + `; sync_replicas \d`),
		regexp.MustCompile(`(?m)^no change in progress$`),
		regexp.MustCompile(`(?m)^  primary +` + regexp.QuoteMeta(p) + ` +primary +primary +true `),
		regexp.MustCompile(`(?m)^  replica-0 +` + regexp.QuoteMeta(r0) + ` +replica +voter +(true|false) +\d+ +\d+ `),
		regexp.MustCompile(`(?m)^  replica-1 +\S+ +replica +voter `),
		regexp.MustCompile(`(?m)^  ` + regexp.QuoteMeta(ls) + ` +` + regexp.QuoteMeta(ls) + ` +logstore +voter `),
	}
	check := func(what, out string) {
		t.Helper()
		for _, re := range want {
			if !re.MatchString(out) {
				t.Fatalf("%s: no line matching %s:\n%s", what, re, out)
			}
		}
	}
	// The replicas connect and the lag settles; wait until both show.
	var out string
	connected := regexp.MustCompile(`(?m)^  replica-\d +\S+ +replica +voter +true `)
	testkit.Until(t, "both replicas listed connected", func() bool {
		var code int
		code, out, _ = run(t, "ctl", "members", "list", "--nodes", r0+","+p)
		return code == 0 && len(connected.FindAllString(out, -1)) == 2
	})
	t.Logf("walship ctl members list:\n%s", out)
	check("members list", out)
	code, st, errOut := run(t, "ctl", "status", "--nodes", p)
	if code != 0 {
		t.Fatalf("status: exit %d\n%s\n%s", code, st, errOut)
	}
	check("status", st)
	code, out, errOut = run(t, "ctl", "members", "list", "--nodes", r0+","+ls)
	if code != 1 || !strings.Contains(errOut, "no primary among --nodes") ||
		!strings.Contains(errOut, "replica replica-0 is not the primary; the primary of epoch") ||
		!strings.Contains(errOut, ls+" is a log store") {
		t.Fatalf("no primary: exit %d\nstdout:\n%s\nstderr:\n%s", code, out, errOut)
	}
}
