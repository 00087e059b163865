package wal

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"testing"

	"github.com/walship/walship/internal/vfs"
)

// FuzzOpenSegment feeds arbitrary bytes to recovery as the only segment of a
// log. Open must either refuse with a *CorruptionError or succeed, in which
// case the (possibly cut) file must be exactly the re-encoding of the
// entries read back, followed only by zeros (a preallocated tail, which is
// kept), and any .torn copy must be the cut bytes without trailing zeros.
// TruncateAfter on the recovered log must then keep exactly the entries up
// to the cut. It must never panic, and never allocate from a length
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
	f.Add(append(bytes.Clone(seg[:len(seg)-3]), make([]byte, 300)...))
	f.Add(append(bytes.Clone(seg), 0, 0, 7, 0, 0))
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
		if !bytes.HasPrefix(onDisk, want) || !isZero(onDisk[len(want):]) {
			t.Fatalf("recovered file (%d bytes) is not the re-encoding of its %d entries (%d bytes) and zeros", len(onDisk), len(got), len(want))
		}
		if !bytes.HasPrefix(data, onDisk) {
			t.Fatal("recovery changed bytes it kept")
		}
		if info := l.Recovery(); info.TornSegment != "" {
			if len(onDisk) != len(want) || info.TornOffset != int64(len(want)) {
				t.Fatalf("torn tail cut at %d, file is %d bytes, entries end at %d", info.TornOffset, len(onDisk), len(want))
			}
			torn, err := vfs.ReadFile(m, fmt.Sprintf("%s.%d.torn", path, info.TornOffset))
			mustNoErr(t, err)
			rest := data[len(want):]
			if int64(len(torn)) != info.TornBytes || !bytes.Equal(torn, rest[:len(torn)]) || !isZero(rest[len(torn):]) || len(torn) == 0 || torn[len(torn)-1] == 0 {
				t.Fatalf("torn copy (%d bytes, TornBytes %d) is not the cut bytes without trailing zeros", len(torn), info.TornBytes)
			}
		} else if len(onDisk) != len(data) {
			t.Fatal("file changed without a reported repair")
		}

		// Cutting the recovered log after one of its entries (or before the
		// first) leaves exactly the entries before the cut.
		if len(got) == 0 {
			return
		}
		k := int(data[len(data)-1]) % (len(got) + 1)
		cutLSN := lsn - 1
		if k > 0 {
			cutLSN = got[k-1].LastLSN
		}
		mustNoErr(t, l.TruncateAfter(cutLSN))
		checkEntries(t, readAll(t, l), got[:k])
		onDisk, err = vfs.ReadFile(m, path)
		mustNoErr(t, err)
		want = appendHeader(nil, lsn)
		for i := range got[:k] {
			want = appendFrame(want, &got[i])
		}
		if !bytes.Equal(onDisk, want) && k < len(got) {
			t.Fatalf("after TruncateAfter(%d) the file (%d bytes) is not the re-encoding of its %d entries (%d bytes)", cutLSN, len(onDisk), k, len(want))
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
