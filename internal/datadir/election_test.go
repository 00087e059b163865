package datadir

import (
	"testing"

	"github.com/walship/walship/internal/vfs"
)

func TestElectionRoundTrip(t *testing.T) {
	dir := t.TempDir()
	r, err := LoadElection(vfs.OS, dir)
	if err != nil || r != (Election{}) {
		t.Fatalf("missing file: got %+v, %v; want a register never held", r, err)
	}
	for _, want := range []Election{{Holder: "n1", Term: 7}, {Term: 2, PauseVersion: 3, Paused: true}} {
		if err := SaveElection(vfs.OS, dir, want); err != nil {
			t.Fatal(err)
		}
		got, err := LoadElection(vfs.OS, dir)
		if err != nil || got != want {
			t.Fatalf("got %+v, %v; want %+v", got, err, want)
		}
	}
}

func FuzzParseElection(f *testing.F) {
	f.Add([]byte("7 n1 0 0\n"))
	f.Add([]byte("0 - 3 1\n"))
	f.Add([]byte("x n1 0 2"))
	f.Fuzz(func(t *testing.T, b []byte) {
		r, err := ParseElection(b)
		if err != nil {
			return
		}
		// What decodes encodes to what decodes the same.
		dir := t.TempDir()
		if err := SaveElection(vfs.OS, dir, r); err != nil {
			t.Fatal(err)
		}
		back, err := LoadElection(vfs.OS, dir)
		if err != nil || back != r {
			t.Fatalf("%q: decoded %+v, re-read %+v, %v", b, r, back, err)
		}
	})
}
