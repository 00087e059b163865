package wal

import (
	"bufio"
	"encoding/binary"
	"fmt"
	"io"
	"math"
	"strconv"
	"strings"

	"github.com/walship/walship/pkg/codec"
)

// On-disk layout; see docs/FORMAT.md, "WAL segments". All integers are little-endian.
const (
	segmentMagic    = "WSHIPWAL"
	formatVersion   = 1
	headerSize      = 32 // magic[8] version u32 reserved u32 first_lsn u64 reserved u32 crc u32
	frameHeaderSize = 24 // length u32 crc u32 first_lsn u64 last_lsn u64

	segmentExt = ".wal"
	resetExt   = ".reset"
	tornExt    = ".torn"
	// unsyncedName is the file a log writes when a write or an fsync of its
	// segments fails: the last LSN known durable, in decimal. Open cuts
	// everything after it (see Log.failUnsynced).
	unsyncedName = "UNSYNCED"

	// indexInterval is the spacing, in bytes, of the in-memory sparse index:
	// a reader seeks to the closest point at or before its LSN and scans at
	// most this many bytes of frames, and the index stays below 16 bytes per
	// 4 KiB of log whatever the entry size.
	indexInterval = 4096
)

// MaxEntrySize is the largest Data an Entry may carry. The bound lets the
// decoder reject a corrupt length before allocating for it.
const MaxEntrySize = 256 << 20

func segmentName(firstLSN uint64) string { return fmt.Sprintf("%016x%s", firstLSN, segmentExt) }
func resetName(firstLSN uint64) string   { return fmt.Sprintf("%016x%s", firstLSN, resetExt) }

// parseName parses "<16 lowercase hex digits><ext>", refusing anything else
// so that stray files (editor backups, *.torn copies) are never mistaken for
// segments.
func parseName(name, ext string) (uint64, bool) {
	hex, ok := strings.CutSuffix(name, ext)
	if !ok || len(hex) != 16 || strings.ToLower(hex) != hex {
		return 0, false
	}
	v, err := strconv.ParseUint(hex, 16, 64)
	if err != nil {
		return 0, false
	}
	return v, true
}

func appendHeader(b []byte, firstLSN uint64) []byte {
	start := len(b)
	b = append(b, segmentMagic...)
	b = binary.LittleEndian.AppendUint32(b, formatVersion)
	b = binary.LittleEndian.AppendUint32(b, 0)
	b = binary.LittleEndian.AppendUint64(b, firstLSN)
	b = binary.LittleEndian.AppendUint32(b, 0)
	return binary.LittleEndian.AppendUint32(b, codec.Checksum(b[start:]))
}

// headerProblem describes why a segment header is unusable. torn is set when
// the damage looks like an interrupted write (short, zeroed, bad checksum):
// those may be cut from the last segment. A header with a valid checksum but
// unexpected contents was written that way and is never repaired.
type headerProblem struct {
	reason string
	torn   bool
}

func checkHeader(b []byte, nameLSN uint64) *headerProblem {
	switch {
	case len(b) < headerSize:
		return &headerProblem{fmt.Sprintf("short segment header (%d of %d bytes)", len(b), headerSize), true}
	case codec.Checksum(b[:28]) != binary.LittleEndian.Uint32(b[28:32]):
		if isZero(b[:headerSize]) {
			return &headerProblem{"zeroed segment header", true}
		}
		return &headerProblem{"segment header checksum mismatch", true}
	case string(b[:8]) != segmentMagic:
		return &headerProblem{fmt.Sprintf("bad magic %q", b[:8]), false}
	case binary.LittleEndian.Uint32(b[8:12]) != formatVersion:
		return &headerProblem{fmt.Sprintf("unsupported format version %d", binary.LittleEndian.Uint32(b[8:12])), false}
	case nameLSN == 0:
		return &headerProblem{"segment first LSN is 0", false}
	case binary.LittleEndian.Uint64(b[16:24]) != nameLSN:
		return &headerProblem{fmt.Sprintf("header first LSN %d does not match file name (LSN %d)", binary.LittleEndian.Uint64(b[16:24]), nameLSN), false}
	}
	return nil
}

func frameSize(e *Entry) int64 { return frameHeaderSize + int64(len(e.Data)) }

// appendFrame appends e's frame to b. The checksum covers the length, both
// LSNs and the data: everything in the frame but itself.
func appendFrame(b []byte, e *Entry) []byte {
	start := len(b)
	b = binary.LittleEndian.AppendUint32(b, uint32(len(e.Data)))
	b = binary.LittleEndian.AppendUint32(b, 0) // checksum, filled below
	b = binary.LittleEndian.AppendUint64(b, e.FirstLSN)
	b = binary.LittleEndian.AppendUint64(b, e.LastLSN)
	b = append(b, e.Data...)
	crc := frameCRC(b[start:start+frameHeaderSize], b[start+frameHeaderSize:])
	binary.LittleEndian.PutUint32(b[start+4:], crc)
	return b
}

func frameCRC(hdr, data []byte) uint32 {
	crc := codec.Checksum(hdr[0:4])
	crc = codec.UpdateChecksum(crc, hdr[8:frameHeaderSize])
	return codec.UpdateChecksum(crc, data)
}

type frameHeader struct {
	length      uint32
	crc         uint32
	first, last uint64
}

func decodeFrameHeader(b []byte) frameHeader {
	return frameHeader{
		length: binary.LittleEndian.Uint32(b[0:4]),
		crc:    binary.LittleEndian.Uint32(b[4:8]),
		first:  binary.LittleEndian.Uint64(b[8:16]),
		last:   binary.LittleEndian.Uint64(b[16:24]),
	}
}

func isZero(b []byte) bool {
	for _, c := range b {
		if c != 0 {
			return false
		}
	}
	return true
}

type indexPoint struct {
	lsn uint64 // first LSN of the frame
	off int64  // offset of the frame in its segment
}

// scanResult is what scanning a segment's frames found.
type scanResult struct {
	lastLSN uint64 // last LSN of the last good frame; firstLSN-1 if none
	end     int64  // offset just past the last good frame
	entries int64
	index   []indexPoint

	// bad is set when something other than a clean end of file follows the
	// last good frame, at offset end.
	bad       bool
	badReason string
	// badFatal marks a frame whose checksum is right but whose LSNs are not:
	// it was written that way, so it is corruption even at the tail.
	badFatal bool
}

// scanFrames reads the frames of a segment of the given size whose header
// was already checked, streaming through a buffer so a segment is never held
// in memory whole. It returns an error only for I/O failures; damage is
// reported in the result.
func scanFrames(r io.ReaderAt, size int64, firstLSN uint64) (scanResult, error) {
	res := scanResult{lastLSN: firstLSN - 1, end: headerSize}
	br := bufio.NewReaderSize(io.NewSectionReader(r, headerSize, size-headerSize), 256<<10)
	var hdr [frameHeaderSize]byte
	lastIndexed := int64(-indexInterval)
	for {
		off := res.end
		rem := size - off
		if rem == 0 {
			return res, nil
		}
		fail := func(fatal bool, format string, args ...any) (scanResult, error) {
			res.bad, res.badFatal, res.badReason = true, fatal, fmt.Sprintf(format, args...)
			return res, nil
		}
		if rem < frameHeaderSize {
			return fail(false, "short frame header (%d of %d bytes)", rem, frameHeaderSize)
		}
		if _, err := io.ReadFull(br, hdr[:]); err != nil {
			return res, fmt.Errorf("read frame at %d: %w", off, err)
		}
		if isZero(hdr[:]) {
			return fail(false, "zeroed frame header")
		}
		h := decodeFrameHeader(hdr[:])
		if h.length > MaxEntrySize || int64(h.length) > rem-frameHeaderSize {
			return fail(false, "frame length %d exceeds the %d bytes left", h.length, rem-frameHeaderSize)
		}
		crc := codec.Checksum(hdr[0:4])
		crc = codec.UpdateChecksum(crc, hdr[8:])
		for left := int(h.length); left > 0; {
			p, err := br.Peek(min(left, br.Size()))
			if err != nil {
				return res, fmt.Errorf("read frame at %d: %w", off, err)
			}
			crc = codec.UpdateChecksum(crc, p)
			_, _ = br.Discard(len(p))
			left -= len(p)
		}
		if crc != h.crc {
			return fail(false, "frame checksum mismatch")
		}
		if h.first != res.lastLSN+1 || h.last < h.first || h.last == math.MaxUint64 {
			return fail(true, "frame LSNs %d..%d do not follow LSN %d", h.first, h.last, res.lastLSN)
		}
		if off-lastIndexed >= indexInterval {
			res.index = append(res.index, indexPoint{lsn: h.first, off: off})
			lastIndexed = off
		}
		res.lastLSN = h.last
		res.end = off + frameHeaderSize + int64(h.length)
		res.entries++
	}
}

// validFrameAfter reports whether a well-formed frame starting at or after
// LSN next begins anywhere in b (at any byte offset, not just where the
// previous frame ended). Recovery uses it to tell a torn tail, after which
// nothing valid can follow, from damage in the middle of the log. The LSN
// and length filters keep the check cheap on real crash debris (zeros, a
// partial frame); on adversarial input, where every offset could be a
// candidate, the checksum work is capped at a few times len(b) and
// exhausted is set: the caller must then assume the worst and refuse.
func validFrameAfter(b []byte, next uint64) (found, exhausted bool) {
	budget := 8*len(b) + 1<<20
	for i := 0; i+frameHeaderSize <= len(b); i++ {
		h := decodeFrameHeader(b[i:])
		if h.first < next || h.last < h.first || h.first == 0 {
			continue
		}
		if h.length > MaxEntrySize || int64(h.length) > int64(len(b)-i-frameHeaderSize) {
			continue
		}
		if budget -= frameHeaderSize + int(h.length); budget < 0 {
			return false, true
		}
		data := b[i+frameHeaderSize : i+frameHeaderSize+int(h.length)]
		if frameCRC(b[i:i+frameHeaderSize], data) == h.crc {
			return true, false
		}
	}
	return false, false
}
