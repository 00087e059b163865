package cli

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/walship/walship/internal/freeport"
	"github.com/walship/walship/internal/testkit"
	"github.com/walship/walship/internal/tlsid"
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
	for _, args := range [][]string{{"version"}, {"--version"}, {"-version"}} {
		if code, out, _ := run(t, args...); code != 0 || !strings.HasPrefix(out, "walship ") || !strings.Contains(out, " go1.") {
			t.Fatalf("%v: %d %q", args, code, out)
		}
	}
	// A group alone lists its commands (exit 2, as any usage error);
	// `help ctl` lists them on stdout.
	for _, args := range [][]string{{"ctl"}, {"check"}, {"ctl", "nope"}, {"ctl", "--nodes", "x"}} {
		code, _, errOut := run(t, args...)
		if code != 2 || !strings.Contains(errOut, "Usage: walship "+args[0]+" <command>") || strings.Contains(errOut, `unknown command "`+args[0]+`"`) {
			t.Errorf("%v: exit %d, stderr:\n%s", args, code, errOut)
		}
		if args[0] == "ctl" && (!strings.Contains(errOut, "  status ") || !strings.Contains(errOut, "  promote ")) {
			t.Errorf("%v: the ctl commands are not listed:\n%s", args, errOut)
		}
	}
	if code, _, errOut := run(t, "ctl", "nope"); !strings.Contains(errOut, `walship ctl: unknown command "nope"`) {
		t.Errorf("ctl nope: exit %d, stderr:\n%s", code, errOut)
	}
	if code, out, _ := run(t, "help", "ctl"); code != 0 || !strings.Contains(out, "  switchover ") {
		t.Errorf("help ctl: exit %d, stdout:\n%s", code, out)
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

// TestLogStorePeers: walship logstore takes its peers from --peers or
// WALSHIP_PEERS, and a bad list is refused naming the flag.
func TestLogStorePeers(t *testing.T) {
	t.Setenv("WALSHIP_PEERS", "ls-0:7400, ls-1:7400,ls-2:7400")
	fs, _ := NewFlagSet("logstore", &Env{})
	if err := Parse(fs, nil); err != nil {
		t.Fatal(err)
	}
	if got := fs.Lookup("peers").Value.String(); got != "ls-0:7400,ls-1:7400,ls-2:7400" {
		t.Errorf("WALSHIP_PEERS not applied: peers = %s", got)
	}
	code, _, errOut := run(t, "logstore", "--listen", "127.0.0.1:0", "--metrics-listen", "", "--data-dir", t.TempDir(), "--peers", "a:1,a:1")
	if code != 1 || !strings.Contains(errOut, "--peers: a:1 is listed twice") {
		t.Fatalf("logstore with a peer listed twice: exit %d, %q", code, errOut)
	}
}

func TestListFlag(t *testing.T) {
	var l []string
	f := listFlag{&l}
	if err := f.Set(" a:1, b:2 ,,"); err != nil || strings.Join(l, "|") != "a:1|b:2" || f.String() != "a:1,b:2" {
		t.Fatalf("listFlag = %q (%v)", l, err)
	}
}

// TestBenchCPUScalingFromZero runs `walship bench --cpu-scaling` with the
// primary alone, then with a log store and replica counts 0 and 1, against
// real processes: every row is measured at the same offered load,
// consistent, with the primary's own CPU per commit. (--placement shared:
// separate would pin this test process to half the CPUs.)
func TestBenchCPUScalingFromZero(t *testing.T) {
	if testing.Short() {
		t.Skip("starts processes")
	}
	t.Setenv("WALSHIP_BIN", testkit.Walship(t))
	code, out, errOut := run(t, "bench", "--workload", "tpcb", "--scale", "1", "--accounts", "100", "--placement", "shared",
		"--cpu-scaling", "--cpu-scaling-replicas", "none,0,1", "--rate", "100", "--terminals", "2",
		"--duration", "1s", "--warmup", "200ms", "--data-dir", t.TempDir())
	if code != 0 {
		t.Fatalf("exit %d\nstdout:\n%s\nstderr (tail):\n%s", code, out, tail(errOut, 2000))
	}
	want := []struct{ replicas, logStore, cell string }{{"0", "no", "Disabled/Sync"}, {"0", "yes", "Disabled/Sync"}, {"1", "yes", "Async/Sync"}}
	rows := 0
	for _, line := range strings.Split(out, "\n") {
		f := strings.Fields(line)
		if len(f) < 10 || f[0] != "tpcb" {
			continue
		}
		if rows < len(want) {
			if w := want[rows]; f[2] != w.replicas || f[3] != w.logStore || f[4] != w.cell || f[len(f)-1] != "true" {
				t.Errorf("row %d: replicas %s, log store %s, cell %s, consistent %s; want %+v:\n%s", rows, f[2], f[3], f[4], f[len(f)-1], w, line)
			}
		}
		rows++
		if ms, err := strconv.ParseFloat(f[7], 64); err != nil || ms <= 0 {
			t.Errorf("row %d: primary CPU ms per 1,000 commits %q", rows, f[7])
		}
	}
	if rows != len(want) {
		t.Fatalf("%d result rows, want %d:\n%s", rows, len(want), out)
	}
	for _, tc := range []struct{ args, want []string }{
		{[]string{"--cpu-scaling", "--cpu-scaling-replicas", "-1"}, []string{`--cpu-scaling-replicas: "-1"`}},
		{[]string{"--placement", "apart"}, []string{`--placement: "apart"`}},
		{[]string{"--placement", "separate", "--primary", "127.0.0.1:1"}, []string{"--placement separate: only for a cluster the bench starts"}},
	} {
		if code, _, errOut := run(t, append([]string{"bench"}, tc.args...)...); code != 2 || !strings.Contains(errOut, tc.want[0]) {
			t.Errorf("%v: exit %d, stderr %q, want 2 and %q", tc.args, code, errOut, tc.want[0])
		}
	}
}

func tail(s string, n int) string {
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}

// TestPlaintextOnlyOnLoopbackOrWhenAsked: without TLS files a server
// refuses a non-loopback address unless --plaintext asks for it, and
// --plaintext with TLS files, half the TLS files, or a negative
// connection age (servers and dev) are refused naming the flag. walship
// dev likewise, for --host and --tls; asked for, its plaintext is said in
// the log.
func TestPlaintextOnlyOnLoopbackOrWhenAsked(t *testing.T) {
	// Over before it starts: a command that got past its check (a bug)
	// stops at once rather than serving until the test times out.
	over, cancel := context.WithCancel(context.Background())
	cancel()
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"logstore", "--listen", "0.0.0.0:0", "--metrics-listen", "", "--data-dir", t.TempDir()}, "needs --plaintext"},
		{[]string{"primary", "--listen", ":0", "--metrics-listen", "", "--data-dir", t.TempDir()}, "needs --plaintext"},
		{[]string{"logstore", "--listen", "127.0.0.1:0", "--metrics-listen", "", "--data-dir", t.TempDir(), "--tls-cert", "c.pem"}, "--tls-key: required"},
		{[]string{"logstore", "--listen", "127.0.0.1:0", "--metrics-listen", "", "--data-dir", t.TempDir(), "--plaintext",
			"--tls-cert", "c", "--tls-key", "k", "--tls-ca", "a"}, "--plaintext: not with"},
		{[]string{"ctl", "status", "--nodes", "127.0.0.1:1", "--tls-cert", "c"}, "--tls-key: required"},
		{[]string{"logstore", "--listen", "127.0.0.1:0", "--metrics-listen", "", "--data-dir", t.TempDir(), "--max-connection-age", "-1s",
			"--tls-cert", "c", "--tls-key", "k", "--tls-ca", "a"}, "--max-connection-age: -1s is negative"},
		{[]string{"dev", "--max-connection-age", "-1s"}, "--max-connection-age: -1s is negative"},
		{[]string{"dev", "--host", "0.0.0.0", "--base-port", "0", "--replicas", "0", "--data-dir", t.TempDir()}, "--host 0.0.0.0: serving plaintext beyond loopback needs --plaintext (or --tls)"},
		{[]string{"dev", "--host", "::", "--base-port", "0", "--replicas", "0", "--data-dir", t.TempDir()}, "needs --plaintext"},
		{[]string{"dev", "--tls", "--plaintext", "--base-port", "0", "--replicas", "0", "--data-dir", t.TempDir()}, "--plaintext: not with --tls"},
	} {
		var out, errb bytes.Buffer
		code := Main(over, tc.args, &out, &errb)
		if errOut := errb.String(); code == 0 || !strings.Contains(errOut, tc.want) {
			t.Errorf("walship %s: exit %d, %q; want an error containing %q", strings.Join(tc.args, " "), code, errOut, tc.want)
		}
	}
	// Asked for, or on loopback: served, and said.
	for _, host := range []string{"0.0.0.0", "127.0.0.1", "localhost", "::1"} {
		var logs bytes.Buffer
		env := &Env{Logger: slog.New(slog.NewTextHandler(&logs, nil))}
		if err := devTransport(env, host, false, host == "0.0.0.0"); err != nil || !strings.Contains(logs.String(), "serving plaintext") {
			t.Errorf("dev on %s with --plaintext %v: %v, log %q; want it served, with the warning", host, host == "0.0.0.0", err, logs.String())
		}
	}
}

// TestSecurityFilesCheckedAtStart: a bad --tls-crl (servers and
// dialers) or an empty --authz-policy stops the command at start, naming
// the flag.
func TestSecurityFilesCheckedAtStart(t *testing.T) {
	dir := t.TempDir()
	ca, err := tlsid.NewCA("cli test CA", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	f, err := ca.WriteFiles(dir, "n", tlsid.Leaf{URI: tlsid.URI("walship.local", tlsid.ClassNode, "n"), IPs: []net.IP{net.ParseIP("127.0.0.1")}})
	if err != nil {
		t.Fatal(err)
	}
	bad, empty := filepath.Join(dir, "bad"), filepath.Join(dir, "empty")
	if err := os.WriteFile(bad, []byte("not a list"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(empty, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	tlsFlags := []string{"--tls-cert", f.Cert, "--tls-key", f.Key, "--tls-ca", f.CA}
	logstore := []string{"logstore", "--listen", "127.0.0.1:0", "--metrics-listen", "", "--data-dir", t.TempDir()}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{append(append(logstore, tlsFlags...), "--tls-crl", bad), "--tls-crl " + bad},
		{append(append(logstore, tlsFlags...), "--authz-policy", empty), "--authz-policy " + empty + ": the file is empty"},
		{append(append([]string{"ctl", "status", "--nodes", "127.0.0.1:1"}, tlsFlags...), "--tls-crl", bad), "--tls-crl " + bad},
	} {
		code, _, errOut := run(t, tc.args...)
		if code == 0 || !strings.Contains(errOut, tc.want) {
			t.Errorf("walship %s: exit %d, %q; want an error containing %q", strings.Join(tc.args, " "), code, errOut, tc.want)
		}
	}
}

// TestMetricsAndProfilesOnLoopback: every server's metrics listener —
// plain HTTP even under TLS — binds loopback unless told otherwise, like
// its gRPC listener; --pprof is refused on a listener beyond loopback
// unless --pprof-public asks for it (then logged), and without a metrics
// listener at all.
func TestMetricsAndProfilesOnLoopback(t *testing.T) {
	for _, cmd := range []string{"primary", "replica", "node", "logstore"} {
		fs, _ := NewFlagSet(cmd, &Env{})
		for _, name := range []string{"listen", "metrics-listen"} {
			if def := fs.Lookup(name).DefValue; !loopback(def) {
				t.Errorf("walship %s --%s defaults to %q, beyond loopback", cmd, name, def)
			}
		}
	}
	over, cancel := context.WithCancel(context.Background())
	cancel()
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--metrics-listen", ":0", "--pprof"}, "--pprof: --metrics-listen :0 is not loopback"},
		{[]string{"--metrics-listen", "0.0.0.0:0", "--pprof"}, "add --pprof-public"},
		{[]string{"--metrics-listen", "", "--pprof"}, "--pprof: needs --metrics-listen"},
		{[]string{"--metrics-listen", "127.0.0.1:0", "--pprof-public"}, "--pprof-public: only with --pprof"},
	} {
		for _, cmd := range []string{"logstore", "primary"} {
			args := append([]string{cmd, "--listen", "127.0.0.1:0", "--data-dir", t.TempDir()}, tc.args...)
			var out, errb bytes.Buffer
			if code := Main(over, args, &out, &errb); code == 0 || !strings.Contains(errb.String(), tc.want) {
				t.Errorf("walship %s: exit %d, %q; want an error containing %q", strings.Join(args, " "), code, errb.String(), tc.want)
			}
		}
	}
	for _, tc := range []struct {
		metrics string
		public  bool
		warned  bool
	}{{"127.0.0.1:0", false, false}, {"localhost:9401", false, false}, {":9401", true, true}} {
		var logs bytes.Buffer
		sf := &securityFlags{pprof: true, pprofPublic: tc.public}
		err := sf.checkPprof(slog.New(slog.NewTextHandler(&logs, nil)), tc.metrics)
		if err != nil || strings.Contains(logs.String(), "beyond loopback") != tc.warned {
			t.Errorf("--pprof on %s (public %v): %v, log %q; want served, warned %v", tc.metrics, tc.public, err, logs.String(), tc.warned)
		}
	}
}

// TestBenchMatrixBasePort: `walship bench --matrix` says up front how long
// it will run, and --base-port puts its clusters on fixed ports: with the
// primary's port taken it fails naming it; with the ports free every
// cell runs on them, one after the other.
func TestBenchMatrixBasePort(t *testing.T) {
	addr, err := freeport.Pick("127.0.0.1")
	if err != nil {
		t.Fatal(err)
	}
	_, p, _ := net.SplitHostPort(addr)
	base, _ := strconv.Atoi(p)
	base = min(base, 30000) // room for +2000
	args := []string{"bench", "--matrix", "--workload", "put", "--terminals", "1", "--replicas", "1", "--placement", "shared",
		"--duration", "200ms", "--warmup", "100ms", "--data-dir", t.TempDir(), "--base-port", strconv.Itoa(base)}
	taken, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(base+1)))
	if err != nil {
		t.Skipf("the primary's port: %v", err)
	}
	code, out, errOut := run(t, args...)
	taken.Close()
	if code != 1 || !strings.Contains(errOut, "6 runs (6 cells x 1 codecs x 1 repeats), each 100ms warm-up + 200ms measured: at least 1.8s") ||
		!strings.Contains(errOut, fmt.Sprintf("127.0.0.1:%d", base+1)) {
		t.Fatalf("with the primary's port taken: exit %d\nstdout:\n%s\nstderr:\n%s", code, out, tail(errOut, 3000))
	}
	code, out, errOut = run(t, args...)
	if code != 0 || strings.Count(out, " true\n") != 6 {
		t.Fatalf("exit %d\nstdout:\n%s\nstderr:\n%s", code, out, tail(errOut, 3000))
	}
	if code, _, errOut := run(t, "bench", "--primary", "127.0.0.1:1", "--base-port", "7400"); code != 2 || !strings.Contains(errOut, "--base-port: only for a cluster the bench starts") {
		t.Fatalf("--base-port with --primary: exit %d, %q", code, errOut)
	}
}

// TestNodeMembershipFlags: WALSHIP_JOIN and WALSHIP_LEAVE_ON_SCALE_DOWN
// set the flags (node.env), --leave-on-scale-down needs --kube-lease, and
// a node outside --peers is refused without --join, naming it.
func TestNodeMembershipFlags(t *testing.T) {
	t.Setenv("WALSHIP_JOIN", "true")
	t.Setenv("WALSHIP_LEAVE_ON_SCALE_DOWN", "true")
	fs, _ := NewFlagSet("node", &Env{})
	if err := Parse(fs, nil); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"join", "leave-on-scale-down"} {
		if got := fs.Lookup(f).Value.String(); got != "true" {
			t.Errorf("--%s from the environment = %s, want true", f, got)
		}
	}
	t.Setenv("WALSHIP_JOIN", "false")
	t.Setenv("WALSHIP_LEAVE_ON_SCALE_DOWN", "false")
	base := []string{"node", "--listen", "127.0.0.1:0", "--metrics-listen", "", "--data-dir", t.TempDir(), "--id", "n3", "--peers", "n0=127.0.0.1:1,n1=127.0.0.1:2"}
	code, _, errOut := run(t, append(base, "--leave-on-scale-down")...)
	if code != 1 || !strings.Contains(errOut, "--leave-on-scale-down: needs --kube-lease") {
		t.Fatalf("node --leave-on-scale-down without --kube-lease: exit %d, %q", code, errOut)
	}
	code, _, errOut = run(t, base...)
	if code != 1 || !strings.Contains(errOut, "is not among them (--join lets it start") {
		t.Fatalf("node outside --peers without --join: exit %d, %q", code, errOut)
	}
}

// TestLogStoreMembershipFlags: WALSHIP_JOIN, WALSHIP_NODES and
// WALSHIP_LEAVE_ON_SCALE_DOWN set the log store's flags (logstore.env);
// --join needs --advertise and --nodes, --leave-on-scale-down a
// StatefulSet pod's name and namespace, each error naming its flag.
func TestLogStoreMembershipFlags(t *testing.T) {
	t.Setenv("WALSHIP_JOIN", "true")
	t.Setenv("WALSHIP_NODES", "a:1,b:2")
	t.Setenv("WALSHIP_LEAVE_ON_SCALE_DOWN", "true")
	fs, _ := NewFlagSet("logstore", &Env{})
	if err := Parse(fs, nil); err != nil {
		t.Fatal(err)
	}
	for f, want := range map[string]string{"join": "true", "leave-on-scale-down": "true", "nodes": "a:1,b:2"} {
		if got := fs.Lookup(f).Value.String(); got != want {
			t.Errorf("--%s from the environment = %s, want %s", f, got, want)
		}
	}
	t.Setenv("WALSHIP_JOIN", "false")
	t.Setenv("WALSHIP_NODES", "")
	t.Setenv("WALSHIP_LEAVE_ON_SCALE_DOWN", "false")
	t.Setenv("POD_NAME", "")
	t.Setenv("POD_NAMESPACE", "")
	base := []string{"logstore", "--listen", "127.0.0.1:0", "--metrics-listen", "", "--data-dir", t.TempDir()}
	for _, tc := range []struct {
		args []string
		want []string
	}{
		{[]string{"--join"}, []string{"--advertise: required with --join", "--nodes: required with --join"}},
		{[]string{"--join", "--advertise", "127.0.0.1:7400"}, []string{"--nodes: required with --join"}},
		{[]string{"--join", "--nodes", "127.0.0.1:7401"}, []string{"--advertise: required with --join"}},
		{[]string{"--join", "--advertise", "a:1,b:2", "--nodes", "127.0.0.1:7401"}, []string{"--advertise:", "a:1,b:2", "is not one address (host:port)"}},
		{[]string{"--leave-on-scale-down"}, []string{"--pod-namespace: required with --leave-on-scale-down", "--pod-name: required with --leave-on-scale-down"}},
		{[]string{"--leave-on-scale-down", "--pod-namespace", "ns", "--pod-name", "walship-logstore"}, []string{"--pod-name: pod", "walship-logstore", "is not named <statefulset>-<ordinal>"}},
		{[]string{"--leave-timeout", "-1s"}, []string{"--leave-timeout: -1s is negative"}},
	} {
		code, _, errOut := run(t, append(slices.Clone(base), tc.args...)...)
		for _, w := range tc.want {
			if code != 1 || !strings.Contains(errOut, w) {
				t.Errorf("logstore %s: exit %d, %q; want an error with %q", strings.Join(tc.args, " "), code, errOut, w)
			}
		}
	}
}
