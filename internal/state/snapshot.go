package state

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"slices"
)

// ErrCorruptSnapshot is wrapped by every [ReadSnapshot] error caused by the
// content of the snapshot (truncation included), as opposed to an I/O error
// of the underlying reader.
var ErrCorruptSnapshot = errors.New("state: corrupt snapshot")

// Snapshot format constants; docs/FORMAT.md ("State snapshots") is the specification.
const (
	snapMagic      = "WSHPSNAP"
	snapVersion    = 1
	snapHeaderSize = 8 + 4 + 4 + 8 + 8 // magic, version, flags, applied LSN, count
	// snapMinEntry is the size of an entry with empty key and value.
	snapMinEntry    = 4 + 8 + 4
	snapTrailerSize = DigestSize + 4 // digest, CRC-32C
)

// castagnoli is the CRC-32C table; the same polynomial as the WAL checksums.
var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// WriteSnapshot writes v to w in the snapshot format (docs/FORMAT.md). It buffers
// internally; w needs no buffering of its own. It does not sync or close w.
func WriteSnapshot(w io.Writer, v *View) error {
	sw := newSnapWriter(w)
	var hdr [snapHeaderSize]byte
	copy(hdr[:], snapMagic)
	binary.LittleEndian.PutUint32(hdr[8:], snapVersion)
	binary.LittleEndian.PutUint32(hdr[12:], 0) // flags: none defined
	binary.LittleEndian.PutUint64(hdr[16:], v.lsn)
	binary.LittleEndian.PutUint64(hdr[24:], uint64(v.tree.Len()))
	sw.write(hdr[:])

	var scratch [8]byte
	// An entry's lengths are u32s, as the format's are (Apply refuses a
	// longer key or value).
	v.tree.Ascend(func(e entry) bool {
		binary.LittleEndian.PutUint32(scratch[:], e.keyLen)
		sw.write(scratch[:4])
		sw.write(keyBytes(e.key()))
		binary.LittleEndian.PutUint64(scratch[:], e.version)
		sw.write(scratch[:8])
		binary.LittleEndian.PutUint32(scratch[:], e.valLen)
		sw.write(scratch[:4])
		sw.write(e.value())
		return sw.err == nil
	})

	return sw.finish(v.digest.Bytes())
}

// snapWriter buffers what it writes and checksums it a buffer at a time
// as it goes out — CRC-32C over 64 KiB at once runs several times faster
// than over each field of each pair — and keeps the first error, so the
// encoder can write unconditionally and check once.
type snapWriter struct {
	w   io.Writer
	buf []byte
	crc uint32 // of everything flushed
	err error
}

func newSnapWriter(w io.Writer) snapWriter {
	return snapWriter{w: w, buf: make([]byte, 0, 64<<10)}
}

func (s *snapWriter) write(p []byte) {
	if len(s.buf)+len(p) > cap(s.buf) {
		s.flush()
		if len(p) > cap(s.buf) {
			s.out(p)
			return
		}
	}
	s.buf = append(s.buf, p...)
}

// flush writes out what is buffered.
func (s *snapWriter) flush() {
	s.out(s.buf)
	s.buf = s.buf[:0]
}

func (s *snapWriter) out(p []byte) {
	if s.err != nil || len(p) == 0 {
		return
	}
	s.crc = crc32.Update(s.crc, castagnoli, p)
	if _, err := s.w.Write(p); err != nil {
		s.err = fmt.Errorf("state: write snapshot: %w", err)
	}
}

// finish writes the trailer — digest d, then the CRC-32C of everything
// before it — and flushes; it returns the first error.
func (s *snapWriter) finish(d [DigestSize]byte) error {
	s.write(d[:])
	s.flush()
	var crc [4]byte
	binary.LittleEndian.PutUint32(crc[:], s.crc)
	s.write(crc[:])
	s.flush()
	return s.err
}

// ReadSnapshot reads a snapshot written by [WriteSnapshot] and returns a
// Store holding its content at its applied LSN, ready to apply the batch
// that starts at the next LSN. The snapshot must extend exactly to the end
// of r.
//
// maxBytes bounds the snapshot's size: pass the file size when it is known,
// which makes any length field that points past the end fail before
// anything is allocated for it. maxBytes <= 0 means no bound; buffers for
// large fields then grow as data actually arrives, so a forged length costs
// at most about twice the bytes really present.
//
// Everything is verified: header, strictly ascending keys, versions within
// 1..applied LSN, entry count, CRC-32C and digest. Errors caused by the
// bytes read wrap [ErrCorruptSnapshot]; errors of r are returned wrapped
// but not as corruption.
func ReadSnapshot(r io.Reader, maxBytes int64) (*Store, error) {
	// A small snapshot gets a small buffer: readers of many tiny inputs
	// (tests, the fuzzer) should not pay 64 KiB each.
	size := 64 << 10
	if maxBytes > 0 {
		size = int(min(maxBytes, int64(size)))
	}
	sr := snapReader{r: bufio.NewReaderSize(r, size), limit: maxBytes}
	s, err := sr.read()
	if err != nil && !errors.Is(err, ErrCorruptSnapshot) {
		return nil, fmt.Errorf("state: read snapshot: %w", err)
	}
	return s, err // s is nil when err is not
}

// snapReader decodes a snapshot, checksumming and counting what it reads.
type snapReader struct {
	r     *bufio.Reader
	limit int64 // <= 0: none
	off   int64 // bytes read so far
	crc   uint32
	// keyBuf and scratch are reused by every entry.
	keyBuf  []byte
	scratch [12]byte
}

// growChunk is the largest buffer allocated on a length field's word alone
// when there is no size limit; beyond it buffers grow (doubling) with the
// data actually read.
const growChunk = 64 << 10

func corrupt(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{ErrCorruptSnapshot}, args...)...)
}

// need checks, before anything is allocated, that n more bytes plus the
// trailer still fit within the limit.
func (s *snapReader) need(n uint64, what string) error {
	if s.limit <= 0 {
		return nil
	}
	room := uint64(s.limit - s.off)
	if s.off > s.limit || n > room || room-n < snapTrailerSize {
		return corrupt("%s of %d bytes at offset %d runs past the %d-byte limit", what, n, s.off, s.limit)
	}
	return nil
}

func (s *snapReader) full(p []byte) error {
	n, err := io.ReadFull(s.r, p)
	s.off += int64(n)
	s.crc = crc32.Update(s.crc, castagnoli, p[:n])
	switch {
	case err == io.EOF || err == io.ErrUnexpectedEOF:
		return corrupt("truncated at offset %d", s.off)
	case err != nil:
		return err
	}
	return nil
}

// bytes reads an n-byte field into dst (reused if it has room), growing the
// buffer with the data rather than trusting n when there is no limit.
func (s *snapReader) bytes(dst []byte, n uint32) ([]byte, error) {
	if s.limit > 0 || n <= growChunk {
		if uint32(cap(dst)) < n {
			dst = make([]byte, n)
		}
		dst = dst[:n]
		return dst, s.full(dst)
	}
	return s.appendBytes(dst[:0], n)
}

// appendBytes appends the next n bytes to dst. Without a size limit, a
// large n grows dst as the bytes arrive (doubling, from growChunk), so a
// corrupt length costs no more memory than the data behind it.
func (s *snapReader) appendBytes(dst []byte, n uint32) ([]byte, error) {
	if s.limit > 0 || n <= growChunk {
		dst = slices.Grow(dst, int(n))
		m := len(dst)
		dst = dst[:m+int(n)]
		return dst, s.full(dst[m:])
	}
	for end := len(dst) + int(n); len(dst) < end; {
		step := min(end-len(dst), max(len(dst), growChunk))
		dst = slices.Grow(dst, step)
		m := len(dst)
		dst = dst[:m+step]
		if err := s.full(dst[m:]); err != nil {
			return nil, err
		}
	}
	return dst, nil
}

func (s *snapReader) read() (*Store, error) {
	lsn, count, err := s.readHeader()
	if err != nil {
		return nil, err
	}
	t := newTree()
	d, err := s.readEntries(lsn, count, false, func(e entry) error {
		t.ReplaceOrInsert(e)
		return nil
	})
	if err != nil {
		return nil, err
	}
	return newStore(t, lsn, d), nil
}

// readEntries reads the count entries that follow the header and the
// trailer, handing each entry to fn, and returns the digest the trailer
// confirmed. An error of fn stops the read and is returned as is. Unless
// shared, every entry has memory of its own and fn may keep it; shared,
// every entry is read into one buffer, valid only until fn returns.
func (s *snapReader) readEntries(lsn, count uint64, shared bool, fn func(entry) error) (Digest, error) {
	h := newEntryHasher()
	var (
		d     Digest
		prev  []byte  // the previous entry's key (a copy, when shared)
		reuse *[]byte // shared: the one buffer every entry is read into
	)
	if shared {
		// Not nil, so that an empty key and value are empty, not nil,
		// as unshared ones are.
		buf := make([]byte, 0, 256)
		reuse = &buf
	}
	for i := uint64(0); i < count; i++ {
		e, err := s.readEntry(i, lsn, prev, reuse)
		if err != nil {
			return Digest{}, err
		}
		d.add(h.sumEntry(e))
		if err := fn(e); err != nil {
			return Digest{}, err
		}
		if shared {
			prev = append(prev[:0], e.key()...)
		} else {
			prev = keyBytes(e.key())
		}
	}
	if err := s.readTrailer(d); err != nil {
		return Digest{}, err
	}
	return d, nil
}

// readHeader reads and checks the header, and returns the snapshot's
// applied LSN and entry count.
func (s *snapReader) readHeader() (lsn, count uint64, err error) {
	var hdr [snapHeaderSize]byte
	if err := s.need(snapHeaderSize, "header"); err != nil {
		return 0, 0, err
	}
	if err := s.full(hdr[:]); err != nil {
		return 0, 0, err
	}
	if string(hdr[:8]) != snapMagic {
		return 0, 0, corrupt("bad magic %q", hdr[:8])
	}
	if v := binary.LittleEndian.Uint32(hdr[8:]); v != snapVersion {
		return 0, 0, corrupt("unsupported format version %d", v)
	}
	if f := binary.LittleEndian.Uint32(hdr[12:]); f != 0 {
		return 0, 0, corrupt("unknown flags %#x", f)
	}
	lsn = binary.LittleEndian.Uint64(hdr[16:])
	count = binary.LittleEndian.Uint64(hdr[24:])
	if s.limit > 0 && count > uint64(s.limit)/snapMinEntry {
		return 0, 0, corrupt("%d entries cannot fit in %d bytes", count, s.limit)
	}
	return lsn, count, nil
}

// readEntry reads entry i, whose key must follow prev (when i > 0) and
// whose version must be within 1..lsn, into memory of its own, or into
// *reuse (grown as needed) if not nil.
func (s *snapReader) readEntry(i, lsn uint64, prev []byte, reuse *[]byte) (entry, error) {
	if err := s.need(snapMinEntry, "entry"); err != nil {
		return entry{}, err
	}
	if err := s.full(s.scratch[:4]); err != nil {
		return entry{}, err
	}
	keyLen := binary.LittleEndian.Uint32(s.scratch[:4])
	if err := s.need(uint64(keyLen)+8+4, "key"); err != nil {
		return entry{}, err
	}
	var err error
	if s.keyBuf, err = s.bytes(s.keyBuf, keyLen); err != nil {
		return entry{}, err
	}
	if i > 0 && bytes.Compare(s.keyBuf, prev) <= 0 {
		return entry{}, corrupt("entry %d: key %q does not follow %q", i, s.keyBuf, prev)
	}
	if err := s.full(s.scratch[:12]); err != nil {
		return entry{}, err
	}
	version := binary.LittleEndian.Uint64(s.scratch[:8])
	if version == 0 || version > lsn {
		return entry{}, corrupt("entry %d: version %d outside 1..%d", i, version, lsn)
	}
	valLen := binary.LittleEndian.Uint32(s.scratch[8:12])
	if err := s.need(uint64(valLen), "value"); err != nil {
		return entry{}, err
	}
	// One allocation for key and value, as Apply does; a large value
	// without a size limit grows it as the bytes arrive.
	var buf []byte
	if reuse != nil {
		buf = append((*reuse)[:0], s.keyBuf...)
	} else {
		size := int(keyLen) + int(valLen)
		if s.limit <= 0 && valLen > growChunk {
			size = int(keyLen) + growChunk // appendBytes grows it
		}
		buf = make([]byte, int(keyLen), size)
		copy(buf, s.keyBuf)
	}
	if buf, err = s.appendBytes(buf, valLen); err != nil {
		return entry{}, err
	}
	if reuse != nil {
		*reuse = buf
	}
	return newEntryFrom(buf[:len(buf):len(buf)], int(keyLen), version), nil
}

// readTrailer reads the digest and the CRC-32C, checks them against d and
// the bytes read, and checks that nothing follows.
func (s *snapReader) readTrailer(d Digest) error {
	var dig [DigestSize]byte
	if err := s.full(dig[:]); err != nil {
		return err
	}
	want := s.crc
	if err := s.full(s.scratch[:4]); err != nil {
		return err
	}
	if got := binary.LittleEndian.Uint32(s.scratch[:4]); got != want {
		return corrupt("CRC-32C %#08x, computed %#08x", got, want)
	}
	if d.Bytes() != dig {
		return corrupt("digest %x, computed %v", dig, d)
	}
	switch _, err := s.r.ReadByte(); {
	case err == nil:
		return corrupt("trailing data after offset %d", s.off)
	case err != io.EOF:
		return err
	}
	return nil
}
