package monitoring

import (
	"os"
	"path/filepath"
	"testing"
)

// repoRoot walks up from the test's directory to the directory holding go.mod.
func repoRoot(t *testing.T) string {
	t.Helper()
	dir, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			t.Fatal("no go.mod found above the test directory")
		}
		dir = parent
	}
}

// readRepoFile reads a file by its path relative to the repository root.
func readRepoFile(t *testing.T, rel string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(repoRoot(t), filepath.FromSlash(rel)))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

const (
	rulesPath     = "deploy/prometheus/walship-rules.yaml"
	rulesTestPath = "deploy/prometheus/walship-rules_test.yaml"
	promConfig    = "deploy/prometheus/prometheus.yml"
	dashboardPath = "deploy/grafana/walship.json"
	runbookPath   = "docs/RUNBOOK.md"
)
