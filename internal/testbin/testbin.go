// Package testbin gives tests that run walship as a real process the
// binary: $WALSHIP_BIN when it names a file (make test sets it), else
// cmd/walship built once per test binary (statically, CGO_ENABLED=0) into a
// temporary directory, which [Main] removes when the tests are done.
package testbin

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
)

var (
	once  sync.Once
	path  string
	built string // the temporary directory of a binary built here
	err   error
)

// Main runs m's tests and then removes a binary Walship built; use it as a
// package's TestMain.
func Main(m *testing.M) {
	code := m.Run()
	if built != "" {
		_ = os.RemoveAll(built)
	}
	os.Exit(code)
}

// Walship returns the walship binary, failing tb if it cannot be built.
func Walship(tb testing.TB) string {
	tb.Helper()
	once.Do(func() {
		if p := os.Getenv("WALSHIP_BIN"); p != "" {
			if _, serr := os.Stat(p); serr == nil {
				path = p
				return
			}
		}
		dir, derr := os.MkdirTemp("", "walship-test-bin-")
		if derr != nil {
			err = derr
			return
		}
		built, path = dir, filepath.Join(dir, "walship")
		cmd := exec.Command("go", "build", "-o", path, "github.com/walship/walship/cmd/walship")
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, berr := cmd.CombinedOutput(); berr != nil {
			err = fmt.Errorf("go build walship: %v\n%s", berr, out)
		}
	})
	if err != nil {
		tb.Fatal(err)
	}
	return path
}
