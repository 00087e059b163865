package vfs

import (
	"errors"
	"testing"
)

func TestWriteFileAtomic(t *testing.T) {
	m := NewMem()
	if err := m.MkdirAll("/d", 0o755); err != nil {
		t.Fatal(err)
	}
	if err := WriteFileAtomic(m, "/d/f", []byte("one")); err != nil {
		t.Fatal(err)
	}
	m.Crash()
	if b, err := ReadFile(m, "/d/f"); err != nil || string(b) != "one" {
		t.Fatalf("after crash: %q, %v; want the synced contents", b, err)
	}

	// A failing sync of the temporary file leaves the old contents.
	m.InjectSyncError(func(name string) error {
		if name == "/d/f.tmp" {
			return ErrInjected
		}
		return nil
	})
	if err := WriteFileAtomic(m, "/d/f", []byte("two")); !errors.Is(err, ErrInjected) {
		t.Fatalf("err = %v, want the injected sync failure", err)
	}
	m.Crash()
	if b, err := ReadFile(m, "/d/f"); err != nil || string(b) != "one" {
		t.Fatalf("after a failed replace and a crash: %q, %v; want the old contents", b, err)
	}
}
