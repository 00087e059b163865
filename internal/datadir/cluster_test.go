package datadir

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/walship/walship/internal/vfs"
)

// TestNewClusterID: ids are valid version 4 UUIDs and differ.
func TestNewClusterID(t *testing.T) {
	seen := map[string]bool{}
	for range 100 {
		id := NewClusterID()
		if err := ValidateClusterID(id); err != nil {
			t.Fatal(err)
		}
		if id[14] != '4' || !strings.ContainsRune("89ab", rune(id[19])) {
			t.Fatalf("%s is not a version 4 UUID", id)
		}
		if seen[id] {
			t.Fatalf("%s made twice", id)
		}
		seen[id] = true
	}
}

func TestValidateClusterID(t *testing.T) {
	for _, ok := range []string{"0f1e2d3c-4b5a-4968-8776-655443322110", "00000000-0000-0000-0000-000000000000"} {
		if err := ValidateClusterID(ok); err != nil {
			t.Errorf("%s: %v", ok, err)
		}
	}
	for _, tc := range []struct{ id, want string }{
		{"", "got 0"},
		{"0f1e2d3c-4b5a-4968-8776-65544332211", "want 36 characters"},
		{"0F1E2D3C-4B5A-4968-8776-655443322110", "offset 1 is not a lowercase hex digit"},
		{"0f1e2d3c_4b5a-4968-8776-655443322110", "want '-' at offset 8"},
		{"0f1e2d3c-4b5a-4968-8776-65544332211g", "offset 35"},
		{strings.Repeat("x", 1000), `"xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx"...`},
	} {
		err := ValidateClusterID(tc.id)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("ValidateClusterID(%.40q) = %v; want an error mentioning %q", tc.id, err, tc.want)
		}
	}
}

// TestClusterFile: a missing file is no id; a saved id loads back, from a
// new Cluster too (a restart); a damaged file is an error naming it.
func TestClusterFile(t *testing.T) {
	dir := t.TempDir()
	if id, err := LoadCluster(vfs.OS, dir); err != nil || id != "" {
		t.Fatalf("empty dir: %q, %v", id, err)
	}
	c, err := OpenCluster(vfs.OS, dir)
	if err != nil || c.ID() != "" {
		t.Fatalf("OpenCluster: %v, %v", c, err)
	}
	a, b := NewClusterID(), NewClusterID()
	if adopted, err := c.Adopt(a); err != nil || !adopted || c.ID() != a {
		t.Fatalf("Adopt(%s) = %v, %v; ID %s", a, adopted, err, c.ID())
	}
	if adopted, err := c.Adopt(a); err != nil || adopted {
		t.Fatalf("Adopt of its own id again = %v, %v", adopted, err)
	}
	if _, err := c.Adopt(b); err == nil || !strings.Contains(err.Error(), a) || !strings.Contains(err.Error(), b) {
		t.Fatalf("Adopt of another id = %v; want an error naming both", err)
	}
	if _, err := c.Adopt("nope"); err == nil {
		t.Fatal("adopted a malformed id")
	}
	raw, err := os.ReadFile(filepath.Join(dir, "cluster"))
	if err != nil || string(raw) != a+"\n" {
		t.Fatalf("file holds %q, %v", raw, err)
	}
	if again, err := OpenCluster(vfs.OS, dir); err != nil || again.ID() != a {
		t.Fatalf("after a restart: %v, %v", again, err)
	}
	// A chosen id (a restore stamps a new one) replaces the old.
	if err := SaveCluster(vfs.OS, dir, b); err != nil {
		t.Fatal(err)
	}
	if id, err := LoadCluster(vfs.OS, dir); err != nil || id != b {
		t.Fatalf("after SaveCluster(%s): %q, %v", b, id, err)
	}
	if err := SaveCluster(vfs.OS, dir, "x"); err == nil {
		t.Fatal("saved a malformed id")
	}
	// Hand-written with white space around it: read.
	if err := os.WriteFile(filepath.Join(dir, "cluster"), []byte("  "+a+"\r\n\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if id, err := LoadCluster(vfs.OS, dir); err != nil || id != a {
		t.Fatalf("hand-written file: %q, %v", id, err)
	}
	for _, bad := range []string{"", "\n", a + " " + b, strings.ToUpper(a)} {
		if err := os.WriteFile(filepath.Join(dir, "cluster"), []byte(bad), 0o644); err != nil {
			t.Fatal(err)
		}
		if _, err := LoadCluster(vfs.OS, dir); err == nil || !strings.Contains(err.Error(), filepath.Join(dir, "cluster")) {
			t.Errorf("file %q: %v; want an error naming the file", bad, err)
		}
	}
}

// TestClusterSaveFails: a failed write is reported and nothing is adopted.
func TestClusterSaveFails(t *testing.T) {
	mem := vfs.NewMem()
	if err := mem.MkdirAll("/d", 0o755); err != nil {
		t.Fatal(err)
	}
	c, err := OpenCluster(mem, "/d")
	if err != nil {
		t.Fatal(err)
	}
	boom := errors.New("disk on fire")
	mem.InjectSyncError(func(string) error { return boom })
	if _, err := c.Adopt(NewClusterID()); !errors.Is(err, boom) || c.ID() != "" {
		t.Fatalf("Adopt with failing fsync = %v; ID %q", err, c.ID())
	}
}

func TestOneClusterID(t *testing.T) {
	a, b := NewClusterID(), NewClusterID()
	if id, err := OneClusterID(map[string]string{"x": "", "y": ""}); err != nil || id != "" {
		t.Fatalf("none: %q, %v", id, err)
	}
	if id, err := OneClusterID(map[string]string{"x": "", "y": a, "z": a}); err != nil || id != a {
		t.Fatalf("one: %q, %v", id, err)
	}
	_, err := OneClusterID(map[string]string{"x": a, "y": b, "z": a})
	if err == nil || !strings.Contains(err.Error(), a+" (x, z)") || !strings.Contains(err.Error(), b+" (y)") {
		t.Fatalf("two: %v", err)
	}
}

// FuzzParseCluster: any bytes parse or fail cleanly; what parses is a
// valid id whose file form parses back to it.
func FuzzParseCluster(f *testing.F) {
	f.Add([]byte(NewClusterID() + "\n"))
	f.Add([]byte("0f1e2d3c-4b5a-4968-8776-655443322110"))
	f.Add([]byte(" 0f1e2d3c-4b5a-4968-8776-655443322110 \n\n"))
	f.Add([]byte("0f1e2d3c-4b5a-4968-8776-65544332211"))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, b []byte) {
		id, err := ParseCluster("fuzz", b)
		if err != nil {
			return
		}
		if err := ValidateClusterID(id); err != nil {
			t.Fatalf("parsed %q from %q: %v", id, b, err)
		}
		back, err := ParseCluster("again", []byte(id+"\n"))
		if err != nil || back != id {
			t.Fatalf("%q re-parsed as %q, %v", id, back, err)
		}
	})
}
