package state

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"hash"
)

// DigestSize is the length in bytes of an encoded [Digest].
const DigestSize = 32

// Digest is an order-independent hash of a store's live content: the sum,
// lane by lane modulo 2^64, of the SHA-256 of every live entry (length-prefixed
// key, version, length-prefixed value) read as four little-endian uint64
// lanes.
//
// Addition is commutative and has an inverse, so the store keeps the digest up
// to date in O(1) per write (add the new entry, subtract the one it replaces)
// and two stores with the same keys, values and versions have equal digests
// however they got there. The applied LSN is deliberately not part of it: it
// is reported next to the digest where both matter. The zero Digest is the
// digest of an empty store. Digests are comparable with ==.
type Digest struct {
	lanes [4]uint64
}

// Bytes returns the digest's 32-byte encoding: the four lanes little-endian,
// in order.
func (d Digest) Bytes() [DigestSize]byte {
	var b [DigestSize]byte
	for i, l := range d.lanes {
		binary.LittleEndian.PutUint64(b[i*8:], l)
	}
	return b
}

// String returns the digest as 64 lower-case hex digits of [Digest.Bytes].
func (d Digest) String() string {
	b := d.Bytes()
	return hex.EncodeToString(b[:])
}

// DigestFromBytes decodes the 32-byte encoding produced by [Digest.Bytes], for
// digests received from another node.
func DigestFromBytes(b []byte) (Digest, error) {
	if len(b) != DigestSize {
		return Digest{}, fmt.Errorf("state: digest is %d bytes, want %d", len(b), DigestSize)
	}
	var d Digest
	for i := range d.lanes {
		d.lanes[i] = binary.LittleEndian.Uint64(b[i*8:])
	}
	return d, nil
}

func (d *Digest) add(h [4]uint64) {
	for i := range d.lanes {
		d.lanes[i] += h[i]
	}
}

func (d *Digest) sub(h [4]uint64) {
	for i := range d.lanes {
		d.lanes[i] -= h[i]
	}
}

// entryHasher hashes entries for the digest, reusing one SHA-256 state and
// scratch buffer across the entries of an Apply or a snapshot read.
type entryHasher struct {
	h   hash.Hash
	buf [sha256.Size]byte
	hdr [8]byte
}

func newEntryHasher() *entryHasher { return &entryHasher{h: sha256.New()} }

// sum returns the lanes of SHA-256(u64 len(key) ‖ key ‖ u64 version ‖
// u64 len(value) ‖ value). The length prefixes make the encoding injective,
// so no two distinct entries hash the same input.
func (e *entryHasher) sum(key string, version uint64, value []byte) [4]uint64 {
	e.h.Reset()
	e.u64(uint64(len(key)))
	// Hash the key's bytes in place: converting it would allocate per entry.
	_, _ = e.h.Write(keyBytes(key))
	e.u64(version)
	e.u64(uint64(len(value)))
	_, _ = e.h.Write(value)
	s := e.h.Sum(e.buf[:0])
	var out [4]uint64
	for i := range out {
		out[i] = binary.LittleEndian.Uint64(s[i*8:])
	}
	return out
}

// sumEntry is sum of a stored entry.
func (e *entryHasher) sumEntry(x entry) [4]uint64 { return e.sum(x.key(), x.version, x.value()) }

func (e *entryHasher) u64(v uint64) {
	binary.LittleEndian.PutUint64(e.hdr[:], v)
	_, _ = e.h.Write(e.hdr[:])
}
