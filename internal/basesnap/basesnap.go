// Package basesnap is the base snapshot file (docs/FORMAT.md, *Base
// snapshots in a log store*): a state snapshot with what a restore needs
// to know of it in front. Log stores keep them in DATA_DIR/snapshots, and
// an archive holds the same bytes.
//
//	prefix   (16 bytes) magic "WSHPBASE", format version u32 = 1,
//	                    meta length u32 (m, at most MaxMetaBytes)
//	meta     (m bytes)  a walship.v1.SnapshotHeader, protobuf: the LSN,
//	                    the epoch and commit time of the batch ending at
//	                    it, the pair count, the cluster id, the epoch
//	                    history up to the LSN
//	meta CRC (4 bytes)  CRC-32C (Castagnoli) of the prefix and the meta
//	state               a state snapshot (docs/FORMAT.md, "State
//	                    snapshots") of the same LSN and pair count, to the
//	                    end of the file; its own trailer holds the digest
//	                    and a CRC-32C of the state part
//
// little-endian. The meta is written first, so a snapshot streamed in goes
// to disk as it arrives.
package basesnap

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"

	walshipv1 "github.com/walship/walship/gen/walship/v1"
	"github.com/walship/walship/internal/state"
	"google.golang.org/protobuf/proto"
)

// Layout constants.
const (
	Magic   = "WSHPBASE"
	Version = 1
	// PrefixSize is the magic, version and meta length; CRCSize the meta CRC.
	PrefixSize = 8 + 4 + 4
	CRCSize    = 4
	// MaxMetaBytes bounds the meta: an epoch history of tens of thousands
	// of epochs fits.
	MaxMetaBytes = 1 << 20
	// StateHeaderSize and StateTrailerSize are the state snapshot's
	// header and trailer (docs/FORMAT.md, "State snapshots").
	StateHeaderSize  = 32
	StateTrailerSize = state.DigestSize + 4
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// ErrBad marks a base snapshot file whose bytes are wrong: corruption.
var ErrBad = errors.New("bad base snapshot file")

// EncodeMeta returns the prefix, meta and meta CRC of a base snapshot
// file for hdr.
func EncodeMeta(hdr *walshipv1.SnapshotHeader) ([]byte, error) {
	meta, err := proto.MarshalOptions{Deterministic: true}.Marshal(hdr)
	if err != nil {
		return nil, fmt.Errorf("encode snapshot meta: %w", err)
	}
	if len(meta) > MaxMetaBytes {
		return nil, fmt.Errorf("snapshot meta of %d bytes exceeds %d (a history of %d epochs)", len(meta), MaxMetaBytes, len(hdr.GetHistory()))
	}
	b := make([]byte, 0, PrefixSize+len(meta)+CRCSize)
	b = append(b, Magic...)
	b = binary.LittleEndian.AppendUint32(b, Version)
	b = binary.LittleEndian.AppendUint32(b, uint32(len(meta)))
	b = append(b, meta...)
	return binary.LittleEndian.AppendUint32(b, crc32.Checksum(b, castagnoli)), nil
}

// DecodeMeta reads the prefix, meta and meta CRC at the start of r (of
// size bytes) and returns the meta and the offset of the state snapshot.
// Every error caused by the bytes wraps ErrBad.
func DecodeMeta(r io.ReaderAt, size int64) (*walshipv1.SnapshotHeader, int64, error) {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: %s", ErrBad, fmt.Sprintf(format, args...))
	}
	if size < PrefixSize+CRCSize {
		return nil, 0, bad("%d bytes is too short for the prefix", size)
	}
	var pre [PrefixSize]byte
	if _, err := r.ReadAt(pre[:], 0); err != nil {
		return nil, 0, fmt.Errorf("read snapshot prefix: %w", err)
	}
	if string(pre[:8]) != Magic {
		return nil, 0, bad("bad magic %q", pre[:8])
	}
	if v := binary.LittleEndian.Uint32(pre[8:]); v != Version {
		return nil, 0, bad("unsupported format version %d", v)
	}
	m := int64(binary.LittleEndian.Uint32(pre[12:]))
	if m > MaxMetaBytes || PrefixSize+m+CRCSize > size {
		return nil, 0, bad("meta length %d does not fit (file of %d bytes, at most %d)", m, size, MaxMetaBytes)
	}
	buf := make([]byte, PrefixSize+m+CRCSize)
	if _, err := r.ReadAt(buf, 0); err != nil {
		return nil, 0, fmt.Errorf("read snapshot meta: %w", err)
	}
	body := buf[:PrefixSize+m]
	if got, want := binary.LittleEndian.Uint32(buf[PrefixSize+m:]), crc32.Checksum(body, castagnoli); got != want {
		return nil, 0, bad("meta CRC-32C %#08x, computed %#08x", got, want)
	}
	var hdr walshipv1.SnapshotHeader
	if err := proto.Unmarshal(body[PrefixSize:], &hdr); err != nil {
		return nil, 0, bad("meta: %v", err)
	}
	return &hdr, PrefixSize + m + CRCSize, nil
}

// Scan reads the state snapshot of a base snapshot file whose meta is hdr
// and whose state starts at off in r (of size bytes in all), checking it
// whole (order, versions, count, CRC, digest and agreement with the meta),
// and calls fn with each pair, whose key and value are valid only until fn
// returns (the scanner reads every pair into one buffer). name is used in
// errors. An error caused by the bytes wraps ErrBad; fn's error is
// returned as is.
func Scan(r io.ReaderAt, size, off int64, hdr *walshipv1.SnapshotHeader, name string, fn func(key, value []byte, version uint64) error) (state.Digest, error) {
	sc, err := state.NewSnapshotScanner(io.NewSectionReader(r, off, size-off), size-off)
	if err != nil {
		return state.Digest{}, Wrap(name, err)
	}
	if sc.LSN() != hdr.GetLsn() || sc.Count() != hdr.GetKeys() {
		return state.Digest{}, fmt.Errorf("%w: %s: state snapshot at LSN %d with %d pairs, the meta says LSN %d with %d",
			ErrBad, name, sc.LSN(), sc.Count(), hdr.GetLsn(), hdr.GetKeys())
	}
	var fnErr error
	d, err := sc.Visit(func(k, v []byte, ver uint64) error {
		fnErr = fn(k, v, ver)
		return fnErr
	})
	if err != nil && fnErr == nil {
		return state.Digest{}, Wrap(name, err)
	}
	return d, err
}

// Wrap words a state snapshot error of a base snapshot file: damage wraps
// ErrBad.
func Wrap(name string, err error) error {
	if errors.Is(err, state.ErrCorruptSnapshot) {
		return fmt.Errorf("%w: %s: %v", ErrBad, name, err)
	}
	return fmt.Errorf("%s: %w", name, err)
}
