package state

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
)

// ErrDigestMismatch is wrapped by the error of [SnapshotEncoder.Finish]
// when the digest of the pairs written differs from the one the sender
// announced: the pairs were damaged on the way, or the sender's state was
// not what it said. It wraps [ErrCorruptSnapshot].
var ErrDigestMismatch = fmt.Errorf("%w: digest mismatch", ErrCorruptSnapshot)

// SnapshotEncoder writes a snapshot in the snapshot format one pair at a
// time, without a Store: for a snapshot that arrives as a stream (a
// primary's upload to a log store), which must not be held in memory
// whole. It checks what [ReadSnapshot] checks of a file — strictly
// ascending keys, versions within 1..lsn, and in Finish the count and the
// digest — so what it writes reads back. The output is byte for byte what
// [WriteSnapshot] writes for the same state.
type SnapshotEncoder struct {
	sw    snapWriter
	lsn   uint64
	count uint64
	n     uint64
	prev  []byte
	d     Digest
	h     *entryHasher
	// scratch is reused by every pair's length and version fields.
	scratch [8]byte
}

// NewSnapshotEncoder writes the header of a snapshot of count pairs at
// applied LSN lsn to w, which needs no buffering of its own. It does not
// sync or close w.
func NewSnapshotEncoder(w io.Writer, lsn, count uint64) *SnapshotEncoder {
	e := &SnapshotEncoder{sw: newSnapWriter(w), lsn: lsn, count: count, h: newEntryHasher()}
	var hdr [snapHeaderSize]byte
	copy(hdr[:], snapMagic)
	binary.LittleEndian.PutUint32(hdr[8:], snapVersion)
	binary.LittleEndian.PutUint32(hdr[12:], 0) // flags: none defined
	binary.LittleEndian.PutUint64(hdr[16:], lsn)
	binary.LittleEndian.PutUint64(hdr[24:], count)
	e.sw.write(hdr[:])
	return e
}

// Add writes one pair. Pairs must come in strictly ascending key order,
// with versions in 1..lsn, and no more than the count announced; a pair
// that breaks a rule is an error wrapping [ErrCorruptSnapshot] and nothing
// of it is written. An error of the writer is returned (wrapped) by every
// later call.
func (e *SnapshotEncoder) Add(key, value []byte, version uint64) error {
	if e.sw.err != nil {
		return e.sw.err
	}
	switch {
	case e.n >= e.count:
		return corrupt("pair %d (key %q) is more than the %d announced", e.n, key, e.count)
	case e.n > 0 && bytes.Compare(key, e.prev) <= 0:
		return corrupt("pair %d: key %q does not follow %q", e.n, key, e.prev)
	case version == 0 || version > e.lsn:
		return corrupt("pair %d: key %q has version %d outside 1..%d", e.n, key, version, e.lsn)
	case uint64(len(key)) > math.MaxUint32 || uint64(len(value)) > math.MaxUint32:
		return corrupt("pair %d: %d+%d bytes exceed the format's 4 GiB limit", e.n, len(key), len(value))
	}
	binary.LittleEndian.PutUint32(e.scratch[:4], uint32(len(key)))
	e.sw.write(e.scratch[:4])
	e.sw.write(key)
	binary.LittleEndian.PutUint64(e.scratch[:], version)
	e.sw.write(e.scratch[:8])
	binary.LittleEndian.PutUint32(e.scratch[:4], uint32(len(value)))
	e.sw.write(e.scratch[:4])
	e.sw.write(value)
	// The hasher reads the key without copying it, and does not keep it.
	e.d.add(e.h.sum(probe(key).key(), version, value))
	e.prev = append(e.prev[:0], key...)
	e.n++
	return e.sw.err
}

// Finish checks that the count announced was written and that the digest
// of the pairs is digest (the sender's, as Digest.String), then writes the
// trailer and flushes. A digest that differs wraps [ErrDigestMismatch]; a
// short count wraps [ErrCorruptSnapshot]. It returns the digest.
func (e *SnapshotEncoder) Finish(digest string) (Digest, error) {
	if e.sw.err != nil {
		return Digest{}, e.sw.err
	}
	if e.n != e.count {
		return Digest{}, corrupt("received %d pairs, the sender announced %d", e.n, e.count)
	}
	if got := e.d.String(); got != digest {
		return Digest{}, fmt.Errorf("%w: the pairs' digest is %s, the sender announced %s", ErrDigestMismatch, got, digest)
	}
	if err := e.sw.finish(e.d.Bytes()); err != nil {
		return Digest{}, err
	}
	return e.d, nil
}

// Pairs is how many pairs were added so far.
func (e *SnapshotEncoder) Pairs() uint64 { return e.n }

// SnapshotScanner reads a snapshot pair by pair without building a Store:
// for streaming a stored snapshot (a log store's GetSnapshot) or checking
// one (Verify) in bounded memory. It checks everything [ReadSnapshot]
// checks; the CRC and the digest can only be checked at the end, so a
// caller that forwards pairs as they come must treat them as unconfirmed
// until Scan returns nil.
type SnapshotScanner struct {
	sr         snapReader
	lsn, count uint64
	scanned    bool
}

// NewSnapshotScanner reads and checks the header of the snapshot in r.
// maxBytes bounds the snapshot's size as for [ReadSnapshot]: pass the
// size when it is known. Errors caused by the bytes read wrap
// [ErrCorruptSnapshot].
func NewSnapshotScanner(r io.Reader, maxBytes int64) (*SnapshotScanner, error) {
	size := 64 << 10
	if maxBytes > 0 {
		size = int(min(maxBytes, int64(size)))
	}
	s := &SnapshotScanner{sr: snapReader{r: bufio.NewReaderSize(r, size), limit: maxBytes}}
	lsn, count, err := s.sr.readHeader()
	if err != nil {
		return nil, readErr(err)
	}
	s.lsn, s.count = lsn, count
	return s, nil
}

// LSN is the snapshot's applied LSN.
func (s *SnapshotScanner) LSN() uint64 { return s.lsn }

// Count is the number of pairs the header announces.
func (s *SnapshotScanner) Count() uint64 { return s.count }

// Scan reads every pair, calling fn with each in key order (fn may keep
// key and value: each pair has memory of its own), then the trailer, and
// returns the digest once the CRC, the digest and the end of input are
// checked. An error of fn stops the scan and is returned as is. Scan (or
// Visit) may be called once.
func (s *SnapshotScanner) Scan(fn func(key, value []byte, version uint64) error) (Digest, error) {
	return s.scan(false, fn)
}

// Visit is Scan, except that key and value are valid only until fn
// returns: every pair is read into one buffer, so that a scan of a
// snapshot allocates nothing per pair (a primary uploading its snapshot
// to the log stores while it takes writes; a check that keeps nothing).
func (s *SnapshotScanner) Visit(fn func(key, value []byte, version uint64) error) (Digest, error) {
	return s.scan(true, fn)
}

func (s *SnapshotScanner) scan(shared bool, fn func(key, value []byte, version uint64) error) (Digest, error) {
	if s.scanned {
		return Digest{}, errors.New("state: snapshot scanned twice")
	}
	s.scanned = true
	var fnErr error
	d, err := s.sr.readEntries(s.lsn, s.count, shared, func(e entry) error {
		if err := fn(keyBytes(e.key()), e.value(), e.version); err != nil {
			fnErr = err
			return err
		}
		return nil
	})
	if err != nil && fnErr == nil {
		err = readErr(err)
	}
	return d, err
}

// readErr wraps a non-corruption error of the reader as ReadSnapshot does.
func readErr(err error) error {
	if errors.Is(err, ErrCorruptSnapshot) {
		return err
	}
	return fmt.Errorf("state: read snapshot: %w", err)
}
