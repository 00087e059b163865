package logstore

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	walshipv1 "github.com/walship/walship/gen/walship/v1"
	"github.com/walship/walship/internal/state"
	"github.com/walship/walship/internal/vfs"
	"google.golang.org/protobuf/proto"
)

// A base snapshot file (docs/FORMAT.md, "Base snapshots in a log store")
// is a state snapshot with what a restore needs to know of it in front:
//
//	prefix   (16 bytes) magic "WSHPBASE", format version u32 = 1,
//	                    meta length u32 (m, at most maxMetaBytes)
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
// little-endian, named base-<LSN, 20 decimal digits>.snap in
// DATA_DIR/snapshots. The meta is written first, so a snapshot streamed in
// goes to disk as it arrives.
const (
	baseMagic      = "WSHPBASE"
	baseVersion    = 1
	basePrefixSize = 8 + 4 + 4
	baseCRCSize    = 4
	// maxMetaBytes bounds the meta: an epoch history of tens of thousands
	// of epochs fits.
	maxMetaBytes = 1 << 20
	// stateHeaderSize and stateTrailerSize are the state snapshot's
	// header and trailer (docs/FORMAT.md, "State snapshots").
	stateHeaderSize  = 32
	stateTrailerSize = state.DigestSize + 4

	basePrefix = "base-"
	baseSuffix = ".snap"
	tmpSuffix  = ".tmp"
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// errBadBase marks a base snapshot file whose bytes are wrong: corruption.
var errBadBase = errors.New("bad base snapshot file")

// baseName is the file name of the base snapshot at lsn; names sort by LSN.
func baseName(lsn uint64) string { return fmt.Sprintf("%s%020d%s", basePrefix, lsn, baseSuffix) }

// parseBaseName returns the LSN of a name made by baseName.
func parseBaseName(name string) (uint64, bool) {
	digits, ok := strings.CutPrefix(name, basePrefix)
	if !ok {
		return 0, false
	}
	if digits, ok = strings.CutSuffix(digits, baseSuffix); !ok || len(digits) != 20 {
		return 0, false
	}
	lsn, err := strconv.ParseUint(digits, 10, 64)
	return lsn, err == nil
}

// encodeBaseMeta returns the prefix, meta and meta CRC of a base snapshot
// file for hdr.
func encodeBaseMeta(hdr *walshipv1.SnapshotHeader) ([]byte, error) {
	meta, err := proto.MarshalOptions{Deterministic: true}.Marshal(hdr)
	if err != nil {
		return nil, fmt.Errorf("encode snapshot meta: %w", err)
	}
	if len(meta) > maxMetaBytes {
		return nil, fmt.Errorf("snapshot meta of %d bytes exceeds %d (a history of %d epochs)", len(meta), maxMetaBytes, len(hdr.GetHistory()))
	}
	b := make([]byte, 0, basePrefixSize+len(meta)+baseCRCSize)
	b = append(b, baseMagic...)
	b = binary.LittleEndian.AppendUint32(b, baseVersion)
	b = binary.LittleEndian.AppendUint32(b, uint32(len(meta)))
	b = append(b, meta...)
	return binary.LittleEndian.AppendUint32(b, crc32.Checksum(b, castagnoli)), nil
}

// decodeBaseMeta reads the prefix, meta and meta CRC at the start of r (of
// size bytes) and returns the meta and the offset of the state snapshot.
// Every error caused by the bytes wraps errBadBase.
func decodeBaseMeta(r io.ReaderAt, size int64) (*walshipv1.SnapshotHeader, int64, error) {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: %s", errBadBase, fmt.Sprintf(format, args...))
	}
	if size < basePrefixSize+baseCRCSize {
		return nil, 0, bad("%d bytes is too short for the prefix", size)
	}
	var pre [basePrefixSize]byte
	if _, err := r.ReadAt(pre[:], 0); err != nil {
		return nil, 0, fmt.Errorf("read snapshot prefix: %w", err)
	}
	if string(pre[:8]) != baseMagic {
		return nil, 0, bad("bad magic %q", pre[:8])
	}
	if v := binary.LittleEndian.Uint32(pre[8:]); v != baseVersion {
		return nil, 0, bad("unsupported format version %d", v)
	}
	m := int64(binary.LittleEndian.Uint32(pre[12:]))
	if m > maxMetaBytes || basePrefixSize+m+baseCRCSize > size {
		return nil, 0, bad("meta length %d does not fit (file of %d bytes, at most %d)", m, size, maxMetaBytes)
	}
	buf := make([]byte, basePrefixSize+m+baseCRCSize)
	if _, err := r.ReadAt(buf, 0); err != nil {
		return nil, 0, fmt.Errorf("read snapshot meta: %w", err)
	}
	body := buf[:basePrefixSize+m]
	if got, want := binary.LittleEndian.Uint32(buf[basePrefixSize+m:]), crc32.Checksum(body, castagnoli); got != want {
		return nil, 0, bad("meta CRC-32C %#08x, computed %#08x", got, want)
	}
	var hdr walshipv1.SnapshotHeader
	if err := proto.Unmarshal(body[basePrefixSize:], &hdr); err != nil {
		return nil, 0, bad("meta: %v", err)
	}
	return &hdr, basePrefixSize + m + baseCRCSize, nil
}

// baseSnap is one stored base snapshot.
type baseSnap struct {
	lsn   uint64
	name  string                    // file name in the snapshot directory
	hdr   *walshipv1.SnapshotHeader // the meta: what GetSnapshot's header says
	bytes int64                     // file size
	// stateOff is where the state snapshot starts in the file.
	stateOff int64
	digest   string
}

// info is the snapshot as Status and PutSnapshot report it.
func (b *baseSnap) info() *walshipv1.SnapshotInfo {
	return &walshipv1.SnapshotInfo{Lsn: b.lsn, Epoch: b.hdr.GetEpoch(), CommitTimeUnixNano: b.hdr.GetCommitTimeUnixNano(),
		Keys: b.hdr.GetKeys(), Bytes: uint64(b.bytes), StateDigest: b.digest}
}

// openBase reads what a listing needs of a stored base snapshot — its meta,
// the state snapshot's header and the digest in its trailer — without
// reading the pairs (Verify and GetSnapshot read those, checking them).
// The file's name must agree with the LSNs inside it. Errors caused by the
// bytes wrap errBadBase.
func openBase(fsys vfs.FS, dir, name string) (*baseSnap, error) {
	lsn, ok := parseBaseName(name)
	if !ok {
		return nil, fmt.Errorf("%w: %s is not a base snapshot name", errBadBase, name)
	}
	f, err := fsys.OpenFile(filepath.Join(dir, name), os.O_RDONLY, 0)
	if err != nil {
		return nil, err
	}
	defer f.Close() // read-only
	fi, err := f.Stat()
	if err != nil {
		return nil, err
	}
	size := fi.Size()
	hdr, off, err := decodeBaseMeta(f, size)
	if err != nil {
		return nil, err
	}
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: %s", errBadBase, fmt.Sprintf(format, args...))
	}
	if hdr.GetLsn() != lsn {
		return nil, bad("meta says LSN %d, the name %d", hdr.GetLsn(), lsn)
	}
	if size-off < stateHeaderSize+stateTrailerSize {
		return nil, bad("the state snapshot is %d bytes, too short", size-off)
	}
	var sh [stateHeaderSize]byte
	if _, err := f.ReadAt(sh[:], off); err != nil {
		return nil, fmt.Errorf("read state header: %w", err)
	}
	if string(sh[:8]) != "WSHPSNAP" {
		return nil, bad("state snapshot: bad magic %q", sh[:8])
	}
	if l, n := binary.LittleEndian.Uint64(sh[16:]), binary.LittleEndian.Uint64(sh[24:]); l != lsn || n != hdr.GetKeys() {
		return nil, bad("state snapshot at LSN %d with %d pairs, the meta says LSN %d with %d", l, n, lsn, hdr.GetKeys())
	}
	var dig [state.DigestSize]byte
	if _, err := f.ReadAt(dig[:], size-stateTrailerSize); err != nil {
		return nil, fmt.Errorf("read state trailer: %w", err)
	}
	d, err := state.DigestFromBytes(dig[:])
	if err != nil {
		return nil, bad("%v", err)
	}
	return &baseSnap{lsn: lsn, name: name, hdr: hdr, bytes: size, stateOff: off, digest: d.String()}, nil
}

// scanBase reads a stored base snapshot's pairs, checking the state
// snapshot whole (order, versions, count, CRC, digest), and calls fn with
// each. An error caused by the bytes wraps errBadBase (and names the file);
// fn's error is returned as is.
func scanBase(fsys vfs.FS, dir string, b *baseSnap, fn func(key, value []byte, version uint64) error) (state.Digest, error) {
	path := filepath.Join(dir, b.name)
	f, err := fsys.OpenFile(path, os.O_RDONLY, 0)
	if err != nil {
		return state.Digest{}, err
	}
	defer f.Close() // read-only
	sc, err := state.NewSnapshotScanner(io.NewSectionReader(f, b.stateOff, b.bytes-b.stateOff), b.bytes-b.stateOff)
	if err != nil {
		return state.Digest{}, wrapBase(path, err)
	}
	if sc.LSN() != b.lsn || sc.Count() != b.hdr.GetKeys() {
		return state.Digest{}, fmt.Errorf("%w: %s: state snapshot at LSN %d with %d pairs, the meta says LSN %d with %d",
			errBadBase, path, sc.LSN(), sc.Count(), b.lsn, b.hdr.GetKeys())
	}
	var fnErr error
	d, err := sc.Scan(func(k, v []byte, ver uint64) error {
		fnErr = fn(k, v, ver)
		return fnErr
	})
	if err != nil && fnErr == nil {
		return state.Digest{}, wrapBase(path, err)
	}
	return d, err
}

// wrapBase words a state snapshot error of a base snapshot file: damage
// wraps errBadBase.
func wrapBase(path string, err error) error {
	if errors.Is(err, state.ErrCorruptSnapshot) {
		return fmt.Errorf("%w: %s: %v", errBadBase, path, err)
	}
	return fmt.Errorf("%s: %w", path, err)
}
