package archive

import (
	"bytes"
	"errors"
	"io"
	"testing"
	"testing/cryptotest"
)

// Bounds on what FuzzOpenSealed takes from the fuzzer, so that an input
// seals and opens in about a millisecond (two-segment inputs add one
// segment of segmentBytes to the plaintext on top of these).
const (
	fuzzMaxPlain = 4 << 10
	fuzzMaxName  = 256
	fuzzMaxExtra = 64
)

// The damage FuzzOpenSealed does to a sealed object, chosen by its op
// argument (modulo fuzzMutations).
const (
	fuzzMutNone     = iota // the object as sealed
	fuzzMutXor             // stored[pos] ^= val
	fuzzMutSet             // stored[pos] = val
	fuzzMutTruncate        // stored[:pos], pos in 0..len(stored)
	fuzzMutAppend          // stored followed by extra
	fuzzMutDelete          // stored without its byte at pos
	fuzzMutations
)

// fuzzMutate returns a copy of sealed with the damage op, pos, val and
// extra describe; it may equal sealed (an XOR with 0, a truncation to the
// whole length, nothing appended), which the caller finds by comparing.
func fuzzMutate(sealed []byte, op uint8, pos uint32, val byte, extra []byte) []byte {
	s := bytes.Clone(sealed)
	switch op % fuzzMutations {
	case fuzzMutXor:
		s[int(pos%uint32(len(s)))] ^= val
	case fuzzMutSet:
		s[int(pos%uint32(len(s)))] = val
	case fuzzMutTruncate:
		s = s[:int(pos%uint32(len(s)+1))]
	case fuzzMutAppend:
		s = append(s, extra...)
	case fuzzMutDelete:
		i := int(pos % uint32(len(s)))
		s = append(s[:i], s[i+1:]...)
	}
	return s
}

// fuzzHeaderLen is the length of the header Seal writes with key id.
func fuzzHeaderLen(id string) int { return len(encMagic) + 1 + len(id) + saltBytes }

// fuzzUnknownKey reports whether stored has a whole header (magic, key
// id and salt) that names a key kr does not hold, and that key's id:
// exactly the objects whose opening must fail with a KeyError rather
// than as a corrupt object.
func fuzzUnknownKey(kr *Keyring, stored []byte) (string, bool) {
	if len(stored) < len(encMagic)+1 || string(stored[:len(encMagic)]) != encMagic {
		return "", false
	}
	n := int(stored[len(encMagic)])
	if len(stored) < len(encMagic)+1+n+saltBytes {
		return "", false
	}
	id := string(stored[len(encMagic)+1 : len(encMagic)+1+n])
	_, held := kr.keys[id]
	return id, !held
}

// fuzzOpen opens stored as the object name the way Archive.get does —
// Archive.open, for an object whose metadata names its key, then reading
// the plaintext to EOF — but bufSize bytes at a time, and fails t as soon
// as a read releases a byte that is not the next of plain: a reader of
// an authenticated object must never hand out bytes that are not the
// ones sealed, not even before it fails. It returns how many bytes were
// released and the error of the open or of the read that ended it.
func fuzzOpen(t *testing.T, a *Archive, name string, stored, plain []byte, bufSize int) (int, error, error) {
	t.Helper()
	info := Info{Size: int64(len(stored)), Meta: map[string]string{metaKeyID: a.keys.Current()}}
	r, err := a.open(name, info, bytes.NewReader(stored), int64(len(stored)))
	if err != nil {
		return 0, err, nil
	}
	buf := make([]byte, bufSize)
	got, empty := 0, 0
	for {
		n, err := r.Read(buf)
		if n < 0 || n > len(buf) {
			t.Fatalf("open %q: Read returned %d bytes into a buffer of %d", name, n, len(buf))
		}
		if n > len(plain)-got || !bytes.Equal(buf[:n], plain[got:got+n]) {
			t.Fatalf("open %q: after %d bytes of the plaintext, a read released %d bytes that are not its next (plaintext %d bytes)", name, got, n, len(plain))
		}
		got += n
		if errors.Is(err, io.EOF) {
			return got, nil, nil
		}
		if err != nil {
			return got, nil, err
		}
		// A reader that keeps returning nothing would hang io.ReadAll.
		if n == 0 {
			if empty++; empty > 100 {
				t.Fatalf("open %q: %d reads in a row returned nothing and no error", name, empty)
			}
		} else {
			empty = 0
		}
	}
}

// FuzzOpenSealed: an object sealed with the archive's keyring and then
// damaged in any way — a byte flipped or overwritten in the header, the
// salt, a segment or a tag, the object cut short (at a segment boundary
// too) or extended, a byte cut out — never opens, through the path
// production reads take (Archive.open and the reader, to EOF): the open
// or a read fails, without a panic. A reader never releases a byte that
// is not the next of the sealed plaintext, so before it fails it has
// handed out at most an authenticated prefix, never more bytes than the
// plaintext holds. Opening fails with a KeyError exactly when the header
// names a key the keyring does not hold, and as a CorruptError for every
// other bad header. The object as sealed opens to exactly its plaintext,
// and under any other object name it does not open and releases nothing
// (an object cannot be passed off as another).
func FuzzOpenSealed(f *testing.F) {
	const id = "k2" // the current key of the keyring the fuzz target builds
	plain := []byte("a WAL chunk's bytes")
	hdr := fuzzHeaderLen(id)
	sealedLen := uint32(hdr + len(plain) + tagBytes)
	// The object as sealed, read whole, a byte at a time, and empty.
	f.Add(plain, "wal/x", "wal/y", false, uint8(fuzzMutNone), uint32(0), byte(0), []byte(nil), uint16(4095))
	f.Add(plain, "wal/x", "wal/x ", false, uint8(fuzzMutNone), uint32(0), byte(0), []byte(nil), uint16(0))
	f.Add([]byte{}, "", "/", false, uint8(fuzzMutNone), uint32(0), byte(0), []byte(nil), uint16(7))
	// A flipped byte in the header: the magic, the key id's length, the
	// key id, the salt.
	f.Add(plain, "wal/x", "wal/y", false, uint8(fuzzMutXor), uint32(0), byte(1), []byte(nil), uint16(4095))
	f.Add(plain, "wal/x", "wal/y", false, uint8(fuzzMutXor), uint32(len(encMagic)), byte(1), []byte(nil), uint16(4095))
	f.Add(plain, "wal/x", "wal/y", false, uint8(fuzzMutXor), uint32(len(encMagic)+1), byte(0x20), []byte(nil), uint16(4095))
	f.Add(plain, "wal/x", "wal/y", false, uint8(fuzzMutXor), uint32(hdr-1), byte(0x80), []byte(nil), uint16(4095))
	// The header names the keyring's other key (a KeyError must not
	// hide that it is the wrong one: the segment does not authenticate),
	// or a key the keyring does not hold (a KeyError).
	f.Add(plain, "wal/x", "wal/y", false, uint8(fuzzMutSet), uint32(len(encMagic)+2), byte('1'), []byte(nil), uint16(4095))
	f.Add(plain, "wal/x", "wal/y", false, uint8(fuzzMutSet), uint32(len(encMagic)+2), byte('9'), []byte(nil), uint16(4095))
	// A flipped byte in the ciphertext and in the tag.
	f.Add(plain, "wal/x", "wal/y", false, uint8(fuzzMutXor), uint32(hdr+3), byte(1), []byte(nil), uint16(4095))
	f.Add(plain, "wal/x", "wal/y", false, uint8(fuzzMutXor), sealedLen-1, byte(1), []byte(nil), uint16(4095))
	// Truncated: by one byte, to the header, into the salt, to nothing.
	f.Add(plain, "wal/x", "wal/y", false, uint8(fuzzMutTruncate), sealedLen-1, byte(0), []byte(nil), uint16(4095))
	f.Add(plain, "wal/x", "wal/y", false, uint8(fuzzMutTruncate), uint32(hdr), byte(0), []byte(nil), uint16(4095))
	f.Add(plain, "wal/x", "wal/y", false, uint8(fuzzMutTruncate), uint32(hdr-saltBytes/2), byte(0), []byte(nil), uint16(4095))
	f.Add(plain, "wal/x", "wal/y", false, uint8(fuzzMutTruncate), uint32(0), byte(0), []byte(nil), uint16(4095))
	// Appended to, and a byte cut out of the ciphertext.
	f.Add(plain, "wal/x", "wal/y", false, uint8(fuzzMutAppend), uint32(0), byte(0), []byte("x"), uint16(4095))
	f.Add([]byte{}, "n", "m", false, uint8(fuzzMutAppend), uint32(0), byte(0), make([]byte, tagBytes), uint16(4095))
	f.Add(plain, "wal/x", "wal/y", false, uint8(fuzzMutDelete), uint32(hdr), byte(0), []byte(nil), uint16(4095))
	// Two segments: as sealed, cut at the end of the first (it must not
	// read as a shorter object), and a flipped byte in the second (the
	// first, authenticated, may be released before the read fails).
	seg1End := uint32(hdr + segmentBytes + tagBytes)
	f.Add(plain, "snap/x", "snap/y", true, uint8(fuzzMutNone), uint32(0), byte(0), []byte(nil), uint16(65535))
	f.Add(plain, "snap/x", "snap/y", true, uint8(fuzzMutTruncate), seg1End, byte(0), []byte(nil), uint16(65535))
	f.Add(plain, "snap/x", "snap/y", true, uint8(fuzzMutXor), seg1End+1, byte(4), []byte(nil), uint16(65535))
	// Exactly one full segment, cut by one byte.
	f.Add([]byte{}, "snap/x", "snap/y", true, uint8(fuzzMutTruncate), uint32(hdr+segmentBytes+tagBytes-1), byte(0), []byte(nil), uint16(65535))

	f.Fuzz(func(t *testing.T, plain []byte, name, other string, twoSegments bool, op uint8, pos uint32, val byte, extra []byte, readSize uint16) {
		if len(plain) > fuzzMaxPlain || len(name) > fuzzMaxName || len(other) > fuzzMaxName || len(extra) > fuzzMaxExtra {
			t.Skip("input larger than the fuzz bounds")
		}
		// The keys and the salt come from a fixed seed, so that an input
		// seals to the same bytes every run and a failing input from the
		// corpus fails again.
		cryptotest.SetGlobalRandom(t, 1)
		kr := testKeyring(t, "k1", id)
		if twoSegments {
			plain = append(bytes.Repeat([]byte{0xa5}, segmentBytes), plain...)
		}
		sealed, err := kr.Seal(name, plain)
		if err != nil {
			t.Fatalf("seal %d bytes as %q: %v", len(plain), name, err)
		}
		stored := fuzzMutate(sealed, op, pos, val, extra)
		mutated := !bytes.Equal(stored, sealed)
		a := New(nil, kr, nil)
		bufSize := int(readSize) + 1

		got, openErr, readErr := fuzzOpen(t, a, name, stored, plain, bufSize)
		if !mutated {
			if openErr != nil || readErr != nil || got != len(plain) {
				t.Fatalf("the object as sealed (%d bytes of plaintext) opened to %d bytes: open %v, read %v", len(plain), got, openErr, readErr)
			}
		} else if openErr == nil && readErr == nil {
			// The reader released only the plaintext's bytes, in order
			// (fuzzOpen checks every read): fewer is a damaged object
			// read as a shorter one; all of them is a damaged object
			// that authenticated.
			if got != len(plain) {
				t.Fatalf("a damaged object (op %d at %d) opened to the first %d of its %d bytes of plaintext", op%fuzzMutations, pos, got, len(plain))
			}
			t.Fatalf("a damaged object (op %d at %d, %d bytes, sealed %d) opened", op%fuzzMutations, pos, len(stored), len(sealed))
		}

		// An open that fails says which kind of failure it is: only a
		// header naming a key the keyring lacks is a KeyError (fixed by
		// the key file); anything else is a corrupt object.
		unknownID, wantKeyErr := fuzzUnknownKey(kr, stored)
		var ke *KeyError
		var ce *CorruptError
		switch {
		case openErr == nil:
			if wantKeyErr {
				t.Fatalf("the header names key %q, which the keyring does not hold, and the object opened", unknownID)
			}
		case errors.As(openErr, &ke):
			if !wantKeyErr || ke.ID != unknownID {
				t.Fatalf("open: KeyError for key %q; want one only for a key the keyring lacks (header names %q, lacking %v): %v", ke.ID, unknownID, wantKeyErr, openErr)
			}
		case errors.As(openErr, &ce):
			if wantKeyErr {
				t.Fatalf("open: the header names key %q, which the keyring does not hold, want a KeyError: %v", unknownID, openErr)
			}
			if ce.Name != name {
				t.Fatalf("open: CorruptError names object %q, want %q: %v", ce.Name, name, openErr)
			}
		default:
			t.Fatalf("open: error %v (%T) is neither a KeyError nor a CorruptError", openErr, openErr)
		}
		// Under another object name, the object as sealed does not
		// authenticate: its first segment already fails, so nothing is
		// released.
		if other != name {
			got, openErr, readErr := fuzzOpen(t, a, other, sealed, plain, bufSize)
			if openErr == nil && readErr == nil {
				t.Fatalf("an object sealed as %q opened as %q (%d bytes)", name, other, got)
			}
			if got != 0 {
				t.Fatalf("an object sealed as %q, opened as %q, released %d bytes before failing: %v %v", name, other, got, openErr, readErr)
			}
		}
	})
}
