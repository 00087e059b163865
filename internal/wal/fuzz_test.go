package wal

import (
	"bytes"
	"encoding/binary"
	"errors"
	"testing"

	"github.com/walship/walship/internal/vfs"
)

// FuzzOpenSegment feeds arbitrary bytes to recovery as the only segment of a
// log. Open must either refuse with a *CorruptionError or succeed, in which
// case the (possibly cut) file must be exactly the re-encoding of the
// entries read back. It must never panic, and never allocate from a length
// field it has not checked against the file size (the fuzzer's memory limit
// catches that).
func FuzzOpenSegment(f *testing.F) {
	seg := appendHeader(nil, 7)
	for _, e := range []Entry{mkEntry(7, 7, 0), mkEntry(8, 10, 5), mkEntry(11, 11, 40)} {
		seg = appendFrame(seg, &e)
	}
	f.Add(seg)
	f.Add(seg[:len(seg)-3])
	f.Add(seg[:headerSize])
	f.Add(seg[:10])
	f.Add(append(bytes.Clone(seg), make([]byte, 30)...))
	bad := bytes.Clone(seg)
	bad[headerSize+frameHeaderSize+2] ^= 1
	f.Add(bad)
	f.Add([]byte{})

	f.Fuzz(func(t *testing.T, data []byte) {
		// Name the file after the LSN its header claims, so that inputs get
		// past the name check and into the frames.
		lsn := uint64(1)
		if len(data) >= 24 {
			if v := binary.LittleEndian.Uint64(data[16:24]); v != 0 {
				lsn = v
			}
		}
		m := vfs.NewMem()
		mustNoErr(t, m.MkdirAll(testDir, 0o755))
		path := testDir + "/" + segmentName(lsn)
		mustNoErr(t, vfs.WriteFile(m, path, data, 0o644))

		l, err := Open(Options{Dir: testDir, FS: m})
		if err != nil {
			var ce *CorruptionError
			if !errors.As(err, &ce) || !errors.Is(err, ErrCorrupt) {
				t.Fatalf("Open failed with a non-corruption error: %v", err)
			}
			return
		}
		defer l.Close()
		got := readAll(t, l)
		if l.Segments() == 0 {
			if _, err := m.Stat(path); err == nil {
				t.Fatal("segment neither used nor removed")
			}
			return
		}
		want := appendHeader(nil, lsn)
		for i := range got {
			want = appendFrame(want, &got[i])
		}
		onDisk, err := vfs.ReadFile(m, path)
		mustNoErr(t, err)
		if !bytes.Equal(onDisk, want) {
			t.Fatalf("recovered file (%d bytes) is not the re-encoding of its %d entries (%d bytes)", len(onDisk), len(got), len(want))
		}
		if !bytes.HasPrefix(data, onDisk) {
			t.Fatal("recovery changed bytes it kept")
		}
	})
}

// TestValidFrameAfterBounded feeds the torn-tail check a tail where every
// offset looks like a frame header with a long length: it must give up
// quickly (and so refuse to repair) instead of checksumming quadratically.
func TestValidFrameAfterBounded(t *testing.T) {
	b := make([]byte, 4<<20)
	for i := 0; i+8 <= len(b); i += 8 {
		binary.LittleEndian.PutUint64(b[i:], 0x0001000000010000)
	}
	found, exhausted := validFrameAfter(b, 1)
	if found || !exhausted {
		t.Fatalf("validFrameAfter = %v, %v; want the budget exhausted", found, exhausted)
	}
}
