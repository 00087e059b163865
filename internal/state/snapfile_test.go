package state

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/walship/walship/internal/vfs"
)

func dirNames(t *testing.T, dir string) []string {
	t.Helper()
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range ents {
		names = append(names, e.Name())
	}
	return names
}

func TestSnapshotName(t *testing.T) {
	if got := SnapshotName(42); got != "snapshot-00000000000000000042.snap" {
		t.Fatalf("SnapshotName(42) = %q", got)
	}
	for name, want := range map[string]bool{
		SnapshotName(0): true, SnapshotName(1<<64 - 1): true,
		"snapshot-42.snap": false, "snapshot-0000000000000000004x.snap": false,
		SnapshotName(7) + ".tmp": false, "snapshot-99999999999999999999.snap": false,
	} {
		if _, ok := parseSnapshotName(name); ok != want {
			t.Errorf("parseSnapshotName(%q) ok = %v, want %v", name, ok, want)
		}
	}
}

func TestSaveAndLoadSnapshots(t *testing.T) {
	dir := t.TempDir()
	// No snapshot yet, and no directory at all.
	for _, d := range []string{dir, filepath.Join(dir, "missing")} {
		s, path, err := LoadLatestSnapshot(vfs.OS, d)
		if err != nil || path != "" || s.AppliedLSN() != 0 || s.Len() != 0 {
			t.Fatalf("LoadLatestSnapshot(%s) = %v %q %v, want empty store", d, s, path, err)
		}
	}

	s := New()
	// A stale temporary file from a crashed save is cleaned up.
	if err := os.WriteFile(filepath.Join(dir, SnapshotName(1)+".tmp"), []byte("junk"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "unrelated"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	var paths []string
	for i := range 4 {
		applyTxns(t, s, txn(put(keyN(i), "v")))
		path, err := SaveSnapshot(vfs.OS, dir, s.Snapshot())
		if err != nil {
			t.Fatalf("SaveSnapshot: %v", err)
		}
		if want := filepath.Join(dir, SnapshotName(s.AppliedLSN())); path != want {
			t.Fatalf("path %q, want %q", path, want)
		}
		paths = append(paths, path)
	}
	want := []string{filepath.Base(paths[2]), filepath.Base(paths[3]), "unrelated"}
	if got := dirNames(t, dir); !slices.Equal(got, want) {
		t.Fatalf("directory holds %q, want %q", got, want)
	}

	got, path, err := LoadLatestSnapshot(vfs.OS, dir)
	if err != nil || path != paths[3] {
		t.Fatalf("LoadLatestSnapshot = %q, %v; want %q", path, err, paths[3])
	}
	if got.AppliedLSN() != s.AppliedLSN() || got.Digest() != s.Digest() || !equalKV(dump(got), dump(s)) {
		t.Fatalf("loaded store differs from saved")
	}
}

func TestLoadLatestSnapshotFallsBack(t *testing.T) {
	newDir := func(t *testing.T) (dir string, older, newer *Store, oldPath, newPath string) {
		dir = t.TempDir()
		s := New()
		applyTxns(t, s, txn(put("a", "1")))
		oldPath, err := SaveSnapshot(vfs.OS, dir, s.Snapshot())
		if err != nil {
			t.Fatal(err)
		}
		older, _ = ReadSnapshot(mustOpen(t, oldPath), 0)
		applyTxns(t, s, txn(put("b", "2")))
		if newPath, err = SaveSnapshot(vfs.OS, dir, s.Snapshot()); err != nil {
			t.Fatal(err)
		}
		return dir, older, s, oldPath, newPath
	}
	damage := func(t *testing.T, path string) {
		data, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		data[len(data)/2] ^= 0x40
		if err := os.WriteFile(path, data, 0o644); err != nil {
			t.Fatal(err)
		}
	}

	t.Run("newest corrupt", func(t *testing.T) {
		dir, older, _, oldPath, newPath := newDir(t)
		damage(t, newPath)
		s, path, err := LoadLatestSnapshot(vfs.OS, dir)
		if err != nil || path != oldPath || s.Digest() != older.Digest() || s.AppliedLSN() != older.AppliedLSN() {
			t.Fatalf("LoadLatestSnapshot = %q, %v; want the older %q", path, err, oldPath)
		}
	})
	t.Run("newest misnamed", func(t *testing.T) {
		dir, _, newer, oldPath, newPath := newDir(t)
		// A valid snapshot under a name claiming a later LSN.
		if err := os.Rename(newPath, filepath.Join(dir, SnapshotName(newer.AppliedLSN()+5))); err != nil {
			t.Fatal(err)
		}
		if _, path, err := LoadLatestSnapshot(vfs.OS, dir); err != nil || path != oldPath {
			t.Fatalf("LoadLatestSnapshot = %q, %v; want %q", path, err, oldPath)
		}
	})
	t.Run("all corrupt", func(t *testing.T) {
		dir, _, _, oldPath, newPath := newDir(t)
		damage(t, oldPath)
		if err := os.Truncate(newPath, 0); err != nil {
			t.Fatal(err)
		}
		s, _, err := LoadLatestSnapshot(vfs.OS, dir)
		if !errors.Is(err, ErrCorruptSnapshot) || s != nil {
			t.Fatalf("LoadLatestSnapshot = %v, %v; want ErrCorruptSnapshot", s, err)
		}
	})
}

func mustOpen(t *testing.T, path string) *os.File {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return f
}

func TestSaveSnapshotFaults(t *testing.T) {
	s := sampleStore(t)
	for _, op := range []vfs.Op{vfs.OpOpen, vfs.OpWrite, vfs.OpSync, vfs.OpClose, vfs.OpRename, vfs.OpSyncDir} {
		t.Run(op.String(), func(t *testing.T) {
			m := vfs.NewMem()
			if err := m.MkdirAll("/snap", 0o755); err != nil {
				t.Fatal(err)
			}
			m.InjectError(func(o vfs.Op, _ string) error {
				if o == op {
					return vfs.ErrInjected
				}
				return nil
			})
			path, err := SaveSnapshot(m, "/snap", s.Snapshot())
			if !errors.Is(err, vfs.ErrInjected) || path != "" {
				t.Fatalf("SaveSnapshot = %q, %v; want the injected error", path, err)
			}
			m.InjectError(nil)
			if op != vfs.OpSyncDir { // the rename happened; only durability failed
				if ents, _ := m.ReadDir("/snap"); len(ents) != 0 {
					t.Fatalf("left behind %d files", len(ents))
				}
			}
			// After a crash there is either no snapshot or the whole one.
			m.Crash()
			got, _, err := LoadLatestSnapshot(m, "/snap")
			if err != nil || (got.AppliedLSN() != 0 && got.Digest() != s.Digest()) {
				t.Fatalf("after crash: %v, LSN %d", err, got.AppliedLSN())
			}
		})
	}
	t.Run("directory missing", func(t *testing.T) {
		_, err := SaveSnapshot(vfs.OS, filepath.Join(t.TempDir(), "missing"), s.Snapshot())
		if !errors.Is(err, fs.ErrNotExist) {
			t.Fatalf("SaveSnapshot = %v; want ErrNotExist", err)
		}
	})
}

// TestSaveSnapshotSurvivesCrash: once SaveSnapshot returns, a crash keeps
// the snapshot, and it replaces the previous one cleanly.
func TestSaveSnapshotSurvivesCrash(t *testing.T) {
	m := vfs.NewMem()
	if err := m.MkdirAll("/snap", 0o755); err != nil {
		t.Fatal(err)
	}
	if err := m.SyncDir("/"); err != nil {
		t.Fatal(err)
	}
	s := New()
	for i := range 3 {
		applyTxns(t, s, txn(put(keyN(i), "v")))
		if _, err := SaveSnapshot(m, "/snap", s.Snapshot()); err != nil {
			t.Fatal(err)
		}
		m.Crash()
		got, path, err := LoadLatestSnapshot(m, "/snap")
		if err != nil || path != filepath.Join("/snap", SnapshotName(s.AppliedLSN())) || got.Digest() != s.Digest() {
			t.Fatalf("round %d after crash: %q, %v", i, path, err)
		}
	}
}

func TestRemoveSnapshotsAbove(t *testing.T) {
	dir := t.TempDir()
	s := New()
	var lsns []uint64
	for i := range 2 {
		applyTxns(t, s, txn(put(keyN(i), "v")))
		if _, err := SaveSnapshot(vfs.OS, dir, s.Snapshot()); err != nil {
			t.Fatal(err)
		}
		lsns = append(lsns, s.AppliedLSN())
	}
	if err := RemoveSnapshotsAbove(vfs.OS, dir, lsns[1]); err != nil {
		t.Fatal(err)
	}
	if got := dirNames(t, dir); len(got) != 2 {
		t.Fatalf("removed a snapshot at or below the LSN: %q", got)
	}
	if err := RemoveSnapshotsAbove(vfs.OS, dir, lsns[0]); err != nil {
		t.Fatal(err)
	}
	want := []string{SnapshotName(lsns[0])}
	if got := dirNames(t, dir); !slices.Equal(got, want) {
		t.Fatalf("directory holds %q, want %q", got, want)
	}
	if _, path, err := LoadLatestSnapshot(vfs.OS, dir); err != nil || filepath.Base(path) != want[0] {
		t.Fatalf("LoadLatestSnapshot = %q, %v", path, err)
	}
}
