package testkit

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
)

// The walship binary of this test binary: $WALSHIP_BIN when it names a file
// (make test sets it), else cmd/walship built once into a temporary
// directory, which [Main] removes when the tests are done: with `go run`'s
// flags, as `make build` does, so that it shares their build cache.
var (
	binOnce sync.Once
	binPath string
	binDir  string // the temporary directory of a binary built here
	binErr  error
)

// Main runs m's tests and then removes a binary [Walship] built; use it as
// a package's TestMain.
func Main(m *testing.M) {
	code := m.Run()
	if binDir != "" {
		_ = os.RemoveAll(binDir)
	}
	os.Exit(code)
}

// Walship returns the walship binary, failing tb if it cannot be built.
func Walship(tb testing.TB) string {
	tb.Helper()
	binOnce.Do(func() {
		if p := os.Getenv("WALSHIP_BIN"); p != "" {
			if _, err := os.Stat(p); err == nil {
				binPath = p
				return
			}
		}
		dir, err := os.MkdirTemp("", "walship-test-bin-")
		if err != nil {
			binErr = err
			return
		}
		binDir, binPath = dir, filepath.Join(dir, "walship")
		cmd := exec.Command("go", "build", "-o", binPath, "github.com/walship/walship/cmd/walship")
		if out, err := cmd.CombinedOutput(); err != nil {
			binErr = fmt.Errorf("go build walship: %v\n%s", err, out)
		}
	})
	if binErr != nil {
		tb.Fatal(binErr)
	}
	return binPath
}
