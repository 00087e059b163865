package logstore

import (
	"encoding/binary"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	walshipv1 "github.com/walship/walship/gen/walship/v1"
	"github.com/walship/walship/internal/basesnap"
	"github.com/walship/walship/internal/state"
	"github.com/walship/walship/internal/vfs"
)

// Base snapshot files (internal/basesnap) are named
// base-<LSN, 20 decimal digits>.snap in DATA_DIR/snapshots, so that names
// sort by LSN.
const (
	basePrefix = "base-"
	baseSuffix = ".snap"
	tmpSuffix  = ".tmp"
)

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
// bytes wrap basesnap.ErrBad.
func openBase(fsys vfs.FS, dir, name string) (*baseSnap, error) {
	lsn, ok := parseBaseName(name)
	if !ok {
		return nil, fmt.Errorf("%w: %s is not a base snapshot name", basesnap.ErrBad, name)
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
	hdr, off, err := basesnap.DecodeMeta(f, size)
	if err != nil {
		return nil, err
	}
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: %s", basesnap.ErrBad, fmt.Sprintf(format, args...))
	}
	if hdr.GetLsn() != lsn {
		return nil, bad("meta says LSN %d, the name %d", hdr.GetLsn(), lsn)
	}
	if size-off < basesnap.StateHeaderSize+basesnap.StateTrailerSize {
		return nil, bad("the state snapshot is %d bytes, too short", size-off)
	}
	var sh [basesnap.StateHeaderSize]byte
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
	if _, err := f.ReadAt(dig[:], size-basesnap.StateTrailerSize); err != nil {
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
// each (its key and value valid only until fn returns). An error caused by
// the bytes wraps basesnap.ErrBad (and names the file); fn's error is
// returned as is.
func scanBase(fsys vfs.FS, dir string, b *baseSnap, fn func(key, value []byte, version uint64) error) (state.Digest, error) {
	path := filepath.Join(dir, b.name)
	f, err := fsys.OpenFile(path, os.O_RDONLY, 0)
	if err != nil {
		return state.Digest{}, err
	}
	defer f.Close() // read-only
	return basesnap.Scan(f, b.bytes, b.stateOff, b.hdr, path, fn)
}
