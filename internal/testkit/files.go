package testkit

import (
	"io/fs"
	"os"
	"path/filepath"
	"testing"
)

// DirContents is every file under dir and its bytes, for checking later
// that a refused request left a data directory as it was (SameContents).
func DirContents(tb testing.TB, dir string) map[string]string {
	tb.Helper()
	out := map[string]string{}
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		b, err := os.ReadFile(path)
		out[path] = string(b)
		return err
	})
	if err != nil {
		tb.Fatal(err)
	}
	return out
}

// SameContents fails tb for every file of want that got changed or lost,
// and every file got has that want had not; what names the action.
func SameContents(tb testing.TB, what string, got, want map[string]string) {
	tb.Helper()
	for p, b := range want {
		if got[p] != b {
			tb.Errorf("%s changed %s", what, p)
		}
	}
	for p := range got {
		if _, ok := want[p]; !ok {
			tb.Errorf("%s created %s", what, p)
		}
	}
}
