package vfs

import (
	"bytes"
	"errors"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"testing"
)

// both runs a test against the real filesystem and the in-memory one, so the
// in-memory model is checked against the semantics it imitates.
func both(t *testing.T, fn func(t *testing.T, fsys FS, dir string)) {
	t.Run("os", func(t *testing.T) { fn(t, OS, t.TempDir()) })
	t.Run("mem", func(t *testing.T) {
		m := NewMem()
		if err := m.MkdirAll("/data", 0o755); err != nil {
			t.Fatal(err)
		}
		fn(t, m, "/data")
	})
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func TestFileSemantics(t *testing.T) {
	both(t, func(t *testing.T, fsys FS, dir string) {
		name := filepath.Join(dir, "a")
		if _, err := fsys.OpenFile(name, os.O_RDONLY, 0); !errors.Is(err, fs.ErrNotExist) {
			t.Fatalf("open missing: %v", err)
		}
		f, err := fsys.OpenFile(name, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o644)
		must(t, err)
		if _, err := fsys.OpenFile(name, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o644); !errors.Is(err, fs.ErrExist) {
			t.Fatalf("O_EXCL on existing file: %v", err)
		}
		n, err := f.Write([]byte("hello world"))
		must(t, err)
		if n != 11 {
			t.Fatalf("wrote %d", n)
		}
		buf := make([]byte, 5)
		if n, err := f.ReadAt(buf, 6); n != 5 || err != nil || string(buf) != "world" {
			t.Fatalf("ReadAt = %d %v %q", n, err, buf)
		}
		if n, err := f.ReadAt(buf, 8); n != 3 || err != io.EOF {
			t.Fatalf("ReadAt past end = %d %v", n, err)
		}
		if pos, err := f.Seek(0, io.SeekStart); pos != 0 || err != nil {
			t.Fatalf("Seek = %d %v", pos, err)
		}
		got, err := io.ReadAll(f)
		must(t, err)
		if string(got) != "hello world" {
			t.Fatalf("ReadAll = %q", got)
		}
		must(t, f.Truncate(5))
		fi, err := f.Stat()
		must(t, err)
		if fi.Size() != 5 || fi.Name() != "a" {
			t.Fatalf("Stat = %s %d", fi.Name(), fi.Size())
		}
		must(t, f.Sync())
		must(t, f.Close())
		if f.Name() != name {
			t.Fatalf("Name = %q", f.Name())
		}

		// O_APPEND writes at the end whatever the offset.
		f, err = fsys.OpenFile(name, os.O_WRONLY|os.O_APPEND, 0)
		must(t, err)
		_, err = f.Write([]byte("!"))
		must(t, err)
		must(t, f.Close())
		got, err = ReadFile(fsys, name)
		must(t, err)
		if string(got) != "hello!" {
			t.Fatalf("after append: %q", got)
		}

		// Writing past the end leaves a zero-filled gap.
		f, err = fsys.OpenFile(name, os.O_WRONLY, 0)
		must(t, err)
		_, err = f.Seek(8, io.SeekStart)
		must(t, err)
		_, err = f.Write([]byte("x"))
		must(t, err)
		must(t, f.Close())
		got, err = ReadFile(fsys, name)
		must(t, err)
		if !bytes.Equal(got, []byte("hello!\x00\x00x")) {
			t.Fatalf("after sparse write: %q", got)
		}

		// WriteAt overwrites and extends at an offset without moving the
		// file offset, and is refused on an O_APPEND file.
		f, err = fsys.OpenFile(name, os.O_RDWR, 0)
		must(t, err)
		_, err = f.Seek(1, io.SeekStart)
		must(t, err)
		if n, err := f.WriteAt([]byte("EL"), 1); n != 2 || err != nil {
			t.Fatalf("WriteAt = %d %v", n, err)
		}
		if n, err := f.WriteAt([]byte("yz"), 11); n != 2 || err != nil {
			t.Fatalf("WriteAt past the end = %d %v", n, err)
		}
		_, err = f.Write([]byte("3")) // at the offset Seek set: WriteAt left it alone
		must(t, err)
		must(t, f.Close())
		got, err = ReadFile(fsys, name)
		must(t, err)
		if !bytes.Equal(got, []byte("h3Llo!\x00\x00x\x00\x00yz")) {
			t.Fatalf("after WriteAt: %q", got)
		}
		f, err = fsys.OpenFile(name, os.O_WRONLY|os.O_APPEND, 0)
		must(t, err)
		if _, err := f.WriteAt([]byte("q"), 0); err == nil {
			t.Fatal("WriteAt on an O_APPEND file succeeded")
		}
		must(t, f.Close())

		must(t, fsys.Rename(name, filepath.Join(dir, "b")))
		must(t, fsys.MkdirAll(filepath.Join(dir, "sub", "deeper"), 0o755))
		must(t, WriteFile(fsys, filepath.Join(dir, "c"), []byte("c"), 0o644))
		must(t, fsys.SyncDir(dir))
		ents, err := fsys.ReadDir(dir)
		must(t, err)
		var names []string
		for _, e := range ents {
			names = append(names, e.Name())
		}
		if !slices.Equal(names, []string{"b", "c", "sub"}) {
			t.Fatalf("ReadDir = %v", names)
		}
		if !ents[2].IsDir() || ents[0].IsDir() {
			t.Fatalf("IsDir wrong: %v", ents)
		}
		if fi, err := fsys.Stat(filepath.Join(dir, "sub")); err != nil || !fi.IsDir() {
			t.Fatalf("Stat dir = %v %v", fi, err)
		}
		if err := fsys.Remove(filepath.Join(dir, "sub")); err == nil {
			t.Fatal("removed a non-empty directory")
		}
		must(t, fsys.Remove(filepath.Join(dir, "b")))
		if _, err := fsys.Stat(filepath.Join(dir, "b")); !errors.Is(err, fs.ErrNotExist) {
			t.Fatalf("Stat removed = %v", err)
		}
		if err := fsys.Remove(filepath.Join(dir, "b")); !errors.Is(err, fs.ErrNotExist) {
			t.Fatalf("Remove missing = %v", err)
		}
	})
}

func TestMemCrashDurability(t *testing.T) {
	type step func(t *testing.T, m *MemFS)
	write := func(name, data string) step {
		return func(t *testing.T, m *MemFS) {
			f, err := m.OpenFile(name, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
			must(t, err)
			_, err = f.Write([]byte(data))
			must(t, err)
			must(t, f.Close())
		}
	}
	syncFile := func(name string) step {
		return func(t *testing.T, m *MemFS) {
			f, err := m.OpenFile(name, os.O_RDONLY, 0)
			must(t, err)
			must(t, f.Sync())
			must(t, f.Close())
		}
	}
	syncDir := func(t *testing.T, m *MemFS) { must(t, m.SyncDir("/d")) }
	truncate := func(name string, size int64) step {
		return func(t *testing.T, m *MemFS) {
			f, err := m.OpenFile(name, os.O_WRONLY, 0)
			must(t, err)
			must(t, f.Truncate(size))
			must(t, f.Close())
		}
	}
	writeAt := func(name string, off int64, data string) step {
		return func(t *testing.T, m *MemFS) {
			f, err := m.OpenFile(name, os.O_WRONLY, 0)
			must(t, err)
			_, err = f.WriteAt([]byte(data), off)
			must(t, err)
			must(t, f.Close())
		}
	}
	remove := func(name string) step { return func(t *testing.T, m *MemFS) { must(t, m.Remove(name)) } }
	rename := func(a, b string) step { return func(t *testing.T, m *MemFS) { must(t, m.Rename(a, b)) } }

	tests := []struct {
		name  string
		steps []step
		want  map[string]string // file -> contents after the crash
	}{
		{"unsynced file and dir vanish", []step{write("/d/a", "x")}, map[string]string{}},
		{"synced data without dir sync vanishes", []step{write("/d/a", "x"), syncFile("/d/a")}, map[string]string{}},
		{"dir sync without data sync keeps an empty file", []step{write("/d/a", "x"), syncDir}, map[string]string{"a": ""}},
		{"fully synced", []step{write("/d/a", "x"), syncFile("/d/a"), syncDir}, map[string]string{"a": "x"}},
		{"unsynced append lost", []step{write("/d/a", "x"), syncFile("/d/a"), syncDir, write("/d/a", "yz")}, map[string]string{"a": "x"}},
		{"unsynced truncate undone", []step{write("/d/a", "xyz"), syncFile("/d/a"), syncDir, truncate("/d/a", 1)}, map[string]string{"a": "xyz"}},
		{"synced truncate kept", []step{write("/d/a", "xyz"), syncFile("/d/a"), syncDir, truncate("/d/a", 1), syncFile("/d/a")}, map[string]string{"a": "x"}},
		{"unsynced remove undone", []step{write("/d/a", "x"), syncFile("/d/a"), syncDir, remove("/d/a")}, map[string]string{"a": "x"}},
		{"synced remove kept", []step{write("/d/a", "x"), syncFile("/d/a"), syncDir, remove("/d/a"), syncDir}, map[string]string{}},
		{"unsynced rename undone", []step{write("/d/a", "x"), syncFile("/d/a"), syncDir, rename("/d/a", "/d/b")}, map[string]string{"a": "x"}},
		{"synced rename kept", []step{write("/d/a", "x"), syncFile("/d/a"), syncDir, rename("/d/a", "/d/b"), syncDir}, map[string]string{"b": "x"}},
		{"rename over existing, synced", []step{write("/d/a", "new"), write("/d/b", "old"), syncFile("/d/a"), syncFile("/d/b"), syncDir, rename("/d/a", "/d/b"), syncDir}, map[string]string{"b": "new"}},
		{"unsynced overwrite of synced bytes reverts", []step{write("/d/a", "abcdef"), syncFile("/d/a"), syncDir, writeAt("/d/a", 2, "XY")}, map[string]string{"a": "abcdef"}},
		{"unsynced overwrite and extension revert", []step{write("/d/a", "abcdef"), syncFile("/d/a"), syncDir, writeAt("/d/a", 4, "XYZW")}, map[string]string{"a": "abcdef"}},
		{"synced overwrite kept", []step{write("/d/a", "abcdef"), syncFile("/d/a"), syncDir, writeAt("/d/a", 2, "XY"), syncFile("/d/a")}, map[string]string{"a": "abXYef"}},
		{"overwrite after a synced overwrite reverts to it", []step{write("/d/a", "abcdef"), syncFile("/d/a"), syncDir, writeAt("/d/a", 2, "XY"), syncFile("/d/a"), writeAt("/d/a", 0, "123456")}, map[string]string{"a": "abXYef"}},
		{"data synced through renamed file", []step{write("/d/a", "x"), syncDir, rename("/d/a", "/d/b"), syncDir, write("/d/b", "y"), syncFile("/d/b")}, map[string]string{"b": "xy"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			m := NewMem()
			must(t, m.MkdirAll("/d", 0o755))
			for _, s := range tc.steps {
				s(t, m)
			}
			m.Crash()
			ents, err := m.ReadDir("/d")
			must(t, err)
			got := map[string]string{}
			for _, e := range ents {
				b, err := ReadFile(m, "/d/"+e.Name())
				must(t, err)
				got[e.Name()] = string(b)
			}
			if len(got) != len(tc.want) {
				t.Fatalf("after crash: %q, want %q", got, tc.want)
			}
			for k, v := range tc.want {
				if got[k] != v {
					t.Fatalf("after crash: %q, want %q", got, tc.want)
				}
			}
		})
	}
}

func TestMemStaleHandle(t *testing.T) {
	m := NewMem()
	f, err := m.OpenFile("/a", os.O_RDWR|os.O_CREATE, 0o644)
	must(t, err)
	m.Crash()
	if _, err := f.Write([]byte("x")); !errors.Is(err, ErrCrashed) {
		t.Fatalf("write on stale handle: %v", err)
	}
	if err := f.Sync(); !errors.Is(err, ErrCrashed) {
		t.Fatalf("sync on stale handle: %v", err)
	}
	must(t, f.Close())
	if err := f.Close(); !errors.Is(err, os.ErrClosed) {
		t.Fatalf("double close: %v", err)
	}
}

// TestMemCrashTorn checks that a torn crash keeps the synced contents and at
// most a prefix of the unsynced suffix, possibly zeroed at its end, and that
// all three outcomes happen across seeds.
func TestMemCrashTorn(t *testing.T) {
	synced := bytes.Repeat([]byte{'s'}, 100)
	unsynced := bytes.Repeat([]byte{'u'}, 300)
	var lost, kept, zeroed int
	for seed := range uint64(200) {
		m := NewMem()
		must(t, WriteFile(m, "/a", synced, 0o644))
		f, err := m.OpenFile("/a", os.O_WRONLY|os.O_APPEND, 0)
		must(t, err)
		must(t, f.Sync())
		must(t, m.SyncDir("/"))
		_, err = f.Write(unsynced)
		must(t, err)
		m.CrashTorn(seed)
		got, err := ReadFile(m, "/a")
		must(t, err)
		if !bytes.HasPrefix(got, synced) || len(got) > len(synced)+len(unsynced) {
			t.Fatalf("seed %d: got %d bytes, not synced+prefix", seed, len(got))
		}
		tail := got[len(synced):]
		us := bytes.TrimRight(tail, "\x00")
		if !bytes.Equal(us, unsynced[:len(us)]) {
			t.Fatalf("seed %d: tail is not a prefix of the unsynced write", seed)
		}
		switch {
		case len(tail) == 0:
			lost++
		case len(us) < len(tail):
			zeroed++
		default:
			kept++
		}
		// The same seed gives the same state.
		m2 := NewMem()
		must(t, WriteFile(m2, "/a", synced, 0o644))
		f2, _ := m2.OpenFile("/a", os.O_WRONLY|os.O_APPEND, 0)
		must(t, f2.Sync())
		must(t, m2.SyncDir("/"))
		_, _ = f2.Write(unsynced)
		m2.CrashTorn(seed)
		got2, _ := ReadFile(m2, "/a")
		if !bytes.Equal(got, got2) {
			t.Fatalf("seed %d not reproducible", seed)
		}
	}
	if lost == 0 || kept == 0 || zeroed == 0 {
		t.Fatalf("outcomes lost=%d kept=%d zeroed=%d: want all three", lost, kept, zeroed)
	}
}

// TestMemCrashTornOverwrite checks the torn-crash model for a file that is
// overwritten in place and extended: the overwritten bytes read back as the
// old or the new ones (a prefix of the new ones, from the first changed
// offset), never as zeros; zeros may only appear in the extension.
func TestMemCrashTornOverwrite(t *testing.T) {
	old := bytes.Repeat([]byte{'s'}, 200)
	over := bytes.Repeat([]byte{'o'}, 50)
	ext := bytes.Repeat([]byte{'u'}, 100)
	var reverted, partial, kept, zeroed int
	for seed := range uint64(300) {
		m := NewMem()
		must(t, WriteFile(m, "/a", old, 0o644))
		f, err := m.OpenFile("/a", os.O_RDWR, 0)
		must(t, err)
		must(t, f.Sync())
		must(t, m.SyncDir("/"))
		_, err = f.WriteAt(over, 50)
		must(t, err)
		_, err = f.WriteAt(ext, 200)
		must(t, err)
		m.CrashTorn(seed)
		got, err := ReadFile(m, "/a")
		must(t, err)
		if len(got) < len(old) {
			t.Fatalf("seed %d: %d bytes, shorter than the synced file", seed, len(got))
		}
		mid := got[50:100]
		k := len(mid) - len(bytes.TrimLeft(mid, "o"))
		if !bytes.Equal(got[:50], old[:50]) || !bytes.Equal(mid[k:], old[50+k:100]) || !bytes.Equal(got[100:200], old[100:]) {
			t.Fatalf("seed %d: synced region is not old bytes with a prefix of the overwrite: %q", seed, got[:200])
		}
		if k > 0 && k < len(mid) && len(got) > 200 {
			t.Fatalf("seed %d: extension kept although the overwrite before it was torn", seed)
		}
		tail := got[200:]
		us := bytes.TrimRight(tail, "\x00")
		if !bytes.Equal(us, ext[:len(us)]) {
			t.Fatalf("seed %d: extension is not a prefix of the write", seed)
		}
		switch {
		case k == 0:
			reverted++
		case k < len(mid):
			partial++
		default:
			kept++
		}
		if len(us) < len(tail) {
			zeroed++
		}
	}
	if reverted == 0 || partial == 0 || kept == 0 || zeroed == 0 {
		t.Fatalf("outcomes reverted=%d partial=%d kept=%d zeroed=%d: want all", reverted, partial, kept, zeroed)
	}
}

func TestMemInjectWriteError(t *testing.T) {
	m := NewMem()
	f, err := m.OpenFile("/a", os.O_RDWR|os.O_CREATE, 0o644)
	must(t, err)
	calls := 0
	m.InjectWriteError(func(name string, off int64, p []byte) (int, error) {
		calls++
		switch calls {
		case 2: // torn: half written, error
			return len(p) / 2, ErrInjected
		case 3: // silently short
			return 1, nil
		}
		return len(p), nil
	})
	if n, err := f.Write([]byte("abcd")); n != 4 || err != nil {
		t.Fatalf("write 1 = %d %v", n, err)
	}
	if n, err := f.Write([]byte("efgh")); n != 2 || !errors.Is(err, ErrInjected) {
		t.Fatalf("write 2 = %d %v", n, err)
	}
	if n, err := f.Write([]byte("ijkl")); n != 1 || err != nil {
		t.Fatalf("write 3 = %d %v", n, err)
	}
	m.InjectWriteError(nil)
	got, err := ReadFile(m, "/a")
	must(t, err)
	if string(got) != "abcdefi" {
		t.Fatalf("contents %q", got)
	}
}

func TestMemInjectSyncError(t *testing.T) {
	m := NewMem()
	f, err := m.OpenFile("/a", os.O_RDWR|os.O_CREATE, 0o644)
	must(t, err)
	must(t, m.SyncDir("/"))
	_, err = f.Write([]byte("x"))
	must(t, err)
	m.InjectSyncError(func(name string) error { return ErrInjected })
	if err := f.Sync(); !errors.Is(err, ErrInjected) {
		t.Fatalf("Sync = %v", err)
	}
	if err := m.SyncDir("/"); !errors.Is(err, ErrInjected) {
		t.Fatalf("SyncDir = %v", err)
	}
	m.InjectSyncError(nil)
	m.Crash()
	got, err := ReadFile(m, "/a")
	must(t, err)
	if len(got) != 0 {
		t.Fatalf("data survived a failed sync: %q", got)
	}
}

// TestMemFailDirSyncAfterRemove: directory fsyncs succeed until a file
// with the suffix is removed, then fail, and the removal is then not
// durable: a crash brings the file back.
func TestMemFailDirSyncAfterRemove(t *testing.T) {
	m := NewMem()
	must(t, m.MkdirAll("/d", 0o755))
	for _, name := range []string{"/d/keep.log", "/d/old.wal"} {
		must(t, WriteFile(m, name, []byte("x"), 0o644))
	}
	removed := m.FailDirSyncAfterRemove(".wal", ErrInjected)
	must(t, m.SyncDir("/d"))
	must(t, m.Remove("/d/keep.log"))
	if removed() {
		t.Fatal("removing keep.log counted as removing a .wal file")
	}
	must(t, m.SyncDir("/d"))
	must(t, m.Remove("/d/old.wal"))
	if !removed() {
		t.Fatal("removing old.wal not reported")
	}
	if err := m.SyncDir("/d"); !errors.Is(err, ErrInjected) {
		t.Fatalf("SyncDir after the removal = %v, want the injected error", err)
	}
	m.InjectError(nil)
	m.Crash()
	if _, err := ReadFile(m, "/d/old.wal"); err != nil {
		t.Fatalf("old.wal after a crash (its removal never synced) = %v, want it back", err)
	}
}

func TestMemInjectError(t *testing.T) {
	m := NewMem()
	m.InjectError(func(op Op, name string) error {
		if op == OpRename {
			return ErrInjected
		}
		return nil
	})
	must(t, WriteFile(m, "/a", []byte("x"), 0o644))
	if err := m.Rename("/a", "/b"); !errors.Is(err, ErrInjected) {
		t.Fatalf("Rename = %v", err)
	}
	if _, err := m.Stat("/a"); err != nil {
		t.Fatalf("failed rename had an effect: %v", err)
	}
	if OpRename.String() != "rename" || Op(99).String() != "Op(99)" {
		t.Fatal("Op.String")
	}
}

// TestMemHoldNextSync: the first sync of a matching file waits for
// release; other files and later syncs do not wait.
func TestMemHoldNextSync(t *testing.T) {
	m := NewMem()
	entered, release := m.HoldNextSync(".wal")
	t.Cleanup(release)
	other, err := m.OpenFile("/x.snap", os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	if err := other.Sync(); err != nil {
		t.Fatalf("a file that does not match: %v", err)
	}
	select {
	case <-entered:
		t.Fatal("entered before a matching sync")
	default:
	}
	f, err := m.OpenFile("/1.wal", os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- f.Sync() }()
	<-entered
	select {
	case err := <-done:
		t.Fatalf("the held sync returned (%v) before release", err)
	default:
	}
	release()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if err := f.Sync(); err != nil {
		t.Fatalf("a later sync: %v", err)
	}
	release() // again: no panic
}
