package wal

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/walship/walship/internal/vfs"
)

const testDir = "/wal"

func openMem(t testing.TB, m *vfs.MemFS, segSize int64) *Log {
	t.Helper()
	l, err := Open(Options{Dir: testDir, FS: m, SegmentSize: segSize})
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	return l
}

// payload is deterministic data for an entry, so tests can rebuild the
// expected bytes from the LSNs alone.
func payload(first uint64, size int) []byte {
	b := make([]byte, size)
	for i := range b {
		b[i] = byte(first*31 + uint64(i)*7)
	}
	return b
}

func mkEntry(first, last uint64, size int) Entry {
	return Entry{FirstLSN: first, LastLSN: last, Data: payload(first, size)}
}

// seqEntries returns n single-LSN entries starting at first.
func seqEntries(first uint64, n, size int) []Entry {
	out := make([]Entry, n)
	for i := range out {
		out[i] = mkEntry(first+uint64(i), first+uint64(i), size)
	}
	return out
}

func randEntries(rng *rand.Rand, first uint64, n, maxSize int) []Entry {
	out := make([]Entry, n)
	for i := range out {
		span := uint64(rng.IntN(3))
		out[i] = mkEntry(first, first+span, rng.IntN(maxSize+1))
		first += span + 1
	}
	return out
}

// readAll returns every entry of l from its first LSN to its last.
func readAll(t testing.TB, l *Log) []Entry {
	t.Helper()
	got, err := readAllErr(l)
	if err != nil {
		t.Fatalf("readAll: %v", err)
	}
	return got
}

func readAllErr(l *Log) ([]Entry, error) {
	first, last := l.FirstLSN(), l.LastLSN()
	if first == 0 {
		return nil, nil
	}
	r, err := l.NewReader(first, false)
	if err != nil {
		return nil, err
	}
	defer r.Close()
	var out []Entry
	for len(out) == 0 || out[len(out)-1].LastLSN < last {
		e, err := r.Next(context.Background())
		if err != nil {
			return out, err
		}
		out = append(out, e)
	}
	return out, nil
}

func sameEntry(a, b Entry) bool {
	return a.FirstLSN == b.FirstLSN && a.LastLSN == b.LastLSN && bytes.Equal(a.Data, b.Data)
}

func checkEntries(t testing.TB, got, want []Entry) {
	t.Helper()
	if err := diffEntries(got, want); err != nil {
		t.Fatal(err)
	}
}

func diffEntries(got, want []Entry) error {
	if len(got) != len(want) {
		return fmt.Errorf("got %d entries %s, want %d %s", len(got), span(got), len(want), span(want))
	}
	for i := range got {
		if !sameEntry(got[i], want[i]) {
			return fmt.Errorf("entry %d: got LSN %d..%d (%d bytes), want %d..%d (%d bytes)", i,
				got[i].FirstLSN, got[i].LastLSN, len(got[i].Data), want[i].FirstLSN, want[i].LastLSN, len(want[i].Data))
		}
	}
	return nil
}

func span(es []Entry) string {
	if len(es) == 0 {
		return "[]"
	}
	return fmt.Sprintf("[%d..%d]", es[0].FirstLSN, es[len(es)-1].LastLSN)
}

func mustNoErr(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func wantErr(t testing.TB, err, target error) {
	t.Helper()
	if !errors.Is(err, target) {
		t.Fatalf("got error %v, want %v", err, target)
	}
}
