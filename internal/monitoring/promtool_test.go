package monitoring

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"testing"
)

// promtool returns promtool's path, or skips the test when it is missing.
func promtool(t *testing.T) string {
	t.Helper()
	p, err := exec.LookPath("promtool")
	if err != nil {
		t.Skip("promtool is not on PATH: install the Debian package `prometheus` (apt-get install -y prometheus) to run this test")
	}
	return p
}

// runPromtool runs promtool with args from the repository root and returns
// its combined output, failing the test when promtool fails.
func runPromtool(t *testing.T, args ...string) string {
	t.Helper()
	cmd := exec.Command(promtool(t), args...)
	cmd.Dir = repoRoot(t)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("promtool %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

var rulesFound = regexp.MustCompile(`SUCCESS: (\d+) rules found`)

func TestPromtoolCheckRules(t *testing.T) {
	out := runPromtool(t, "check", "rules", rulesPath)
	if strings.Contains(out, "duplicate rule") {
		t.Errorf("promtool check rules reports duplicates:\n%s", out)
	}
	// Cross-check the hand-written YAML reader against promtool's count.
	m := rulesFound.FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("promtool check rules: no rule count in output:\n%s", out)
	}
	n, _ := strconv.Atoi(m[1])
	if got := len(loadRules(t)); got != n {
		t.Errorf("parseRules found %d rules, promtool %d", got, n)
	}
}

func TestPromtoolTestRules(t *testing.T) {
	runPromtool(t, "test", "rules", rulesTestPath)
}

func TestPromtoolCheckConfig(t *testing.T) {
	runPromtool(t, "check", "config", promConfig)
}

// grafanaVars stands in for Grafana's template variables so that promtool
// can parse the dashboard's queries.
var grafanaVars = strings.NewReplacer(
	"$__rate_interval", "1m",
	"$__interval", "1m",
	"$__range", "1h",
	"$job", ".*",
	"$namespace", ".*",
	"$replica", ".*",
	"$instance", ".*",
)

// TestDashboardPromQL parses every dashboard query by wrapping them in
// recording rules and running `promtool check rules` on them.
func TestDashboardPromQL(t *testing.T) {
	promtool(t)
	exprs := dashboardExprs(loadDashboard(t))
	keys := make([]string, 0, len(exprs))
	for k := range exprs {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var b strings.Builder
	b.WriteString("groups:\n  - name: dashboard\n    rules:\n")
	for i, k := range keys {
		expr := grafanaVars.Replace(exprs[k])
		if strings.Contains(expr, "$") {
			t.Errorf("%s: unknown template variable in %q", k, exprs[k])
		}
		q, _ := json.Marshal(expr) // a JSON string is a YAML double-quoted scalar
		b.WriteString("      - record: dashboard:expr:" + strconv.Itoa(i) + "\n        expr: " + string(q) + "\n")
	}
	path := filepath.Join(t.TempDir(), "dashboard-rules.yaml")
	if err := os.WriteFile(path, []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(promtool(t), "check", "rules", path).CombinedOutput()
	if err != nil {
		t.Fatalf("dashboard queries do not parse: %v\n%s\nrules:\n%s", err, out, b.String())
	}
}
