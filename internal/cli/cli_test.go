package cli

import (
	"bytes"
	"context"
	"strings"
	"testing"
)

func run(t *testing.T, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var out, errb bytes.Buffer
	code = Main(context.Background(), args, &out, &errb)
	return code, out.String(), errb.String()
}

func TestHelpAndVersion(t *testing.T) {
	code, out, _ := run(t, "help")
	if code != 0 {
		t.Fatalf("help exit %d", code)
	}
	for _, c := range Commands() {
		if !strings.Contains(out, "  "+c) {
			t.Errorf("help does not list %q:\n%s", c, out)
		}
	}
	if code, out, _ := run(t, "version"); code != 0 || !strings.HasPrefix(out, "walship ") {
		t.Fatalf("version: %d %q", code, out)
	}
	if code, out, _ := run(t, "help", "primary"); code != 0 || !strings.Contains(out, "WALSHIP_DATA_DIR") || !strings.Contains(out, "-durability") {
		t.Fatalf("help primary: %d\n%s", code, out)
	}
}

func TestUsageErrors(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"nope"}, `unknown command "nope"`},
		{[]string{"help", "nope"}, `unknown command "nope"`},
		{[]string{"version", "extra"}, `unexpected argument "extra"`},
		{[]string{"primary", "--durability", "maybe"}, `"maybe" is not one of async, sync`},
		{[]string{"primary", "--no-such-flag"}, "flag provided but not defined"},
		{[]string{"version", "--log-format", "xml"}, `--log-format "xml"`},
	} {
		code, _, errOut := run(t, tc.args...)
		if code != 2 || !strings.Contains(errOut, tc.want) {
			t.Errorf("%v: exit %d, stderr %q; want exit 2 mentioning %q", tc.args, code, errOut, tc.want)
		}
	}
}

func TestEnvironmentFallbackAndFlagPrecedence(t *testing.T) {
	t.Setenv("WALSHIP_SYNC_REPLICAS", "3")
	t.Setenv("WALSHIP_REPLICATION", "sync")
	fs, _ := NewFlagSet("primary", &Env{})
	if err := Parse(fs, []string{"--sync-replicas", "2"}); err != nil {
		t.Fatal(err)
	}
	if got := fs.Lookup("sync-replicas").Value.String(); got != "2" {
		t.Errorf("an explicit flag must win over the environment: sync-replicas = %s", got)
	}
	if got := fs.Lookup("replication").Value.String(); got != "sync" {
		t.Errorf("WALSHIP_REPLICATION not applied: replication = %s", got)
	}
	t.Setenv("WALSHIP_DURABILITY", "sometimes")
	fs, _ = NewFlagSet("primary", &Env{})
	if err := Parse(fs, nil); err == nil || !strings.Contains(err.Error(), "WALSHIP_DURABILITY") {
		t.Fatalf("a bad environment value must name its variable: %v", err)
	}
}

func TestPrimaryConfigErrorsNameTheFlag(t *testing.T) {
	code, _, errOut := run(t, "primary", "--listen", "127.0.0.1:0", "--metrics-listen", "")
	if code != 1 || !strings.Contains(errOut, "--data-dir") {
		t.Fatalf("primary without --data-dir: exit %d, %q", code, errOut)
	}
}

func TestListFlag(t *testing.T) {
	var l []string
	f := listFlag{&l}
	if err := f.Set(" a:1, b:2 ,,"); err != nil || strings.Join(l, "|") != "a:1|b:2" || f.String() != "a:1,b:2" {
		t.Fatalf("listFlag = %q (%v)", l, err)
	}
}
