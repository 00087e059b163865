package archive

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/walship/walship/internal/datadir"
)

// Object names, relative to the archive's prefix (docs/FORMAT.md,
// *Archive*). Numbers are 16 lowercase hex digits, so names sort by them.
//
//	cluster                                   the cluster id (JSON)
//	history/<epoch>                           the epoch history up to that epoch's start
//	wal/<first>-<last>-<epoch>-<commit>       batches first..last of epoch; commit = the last one's commit time (Unix ns)
//	snapshots/<lsn>-<epoch>-<commit>          a base snapshot at lsn (epoch and commit time of the batch ending there)
const (
	clusterName  = "cluster"
	historyDir   = "history/"
	walDir       = "wal/"
	snapshotsDir = "snapshots/"
)

func hex16(v uint64) string { return fmt.Sprintf("%016x", v) }

// parseHex16 reverses hex16, and only hex16: an object named in upper
// case would be listed but never found again under the name hex16 gives
// its fields.
func parseHex16(s string) (uint64, bool) {
	if len(s) != 16 || strings.ToLower(s) != s {
		return 0, false
	}
	v, err := strconv.ParseUint(s, 16, 64)
	return v, err == nil
}

// ChunkName is the name of a WAL chunk.
func ChunkName(c Chunk) string {
	return walDir + hex16(c.FirstLSN) + "-" + hex16(c.LastLSN) + "-" + hex16(c.Epoch) + "-" + hex16(uint64(c.LastCommit))
}

// parseChunkName reverses ChunkName.
func parseChunkName(name string) (Chunk, bool) {
	rest, ok := strings.CutPrefix(name, walDir)
	if !ok {
		return Chunk{}, false
	}
	f := strings.Split(rest, "-")
	if len(f) != 4 {
		return Chunk{}, false
	}
	var v [4]uint64
	for i := range f {
		if v[i], ok = parseHex16(f[i]); !ok {
			return Chunk{}, false
		}
	}
	c := Chunk{FirstLSN: v[0], LastLSN: v[1], Epoch: v[2], LastCommit: int64(v[3])}
	if c.FirstLSN == 0 || c.LastLSN < c.FirstLSN || c.Epoch == 0 || c.Epoch > datadir.MaxEpoch {
		return Chunk{}, false
	}
	return c, true
}

// SnapshotRef names a base snapshot in the archive.
type SnapshotRef struct {
	LSN, Epoch uint64
	Commit     int64 // commit time of the batch ending at LSN (Unix ns)
	Size       int64 // stored bytes
}

// SnapshotName is the name of a base snapshot.
func SnapshotName(s SnapshotRef) string {
	return snapshotsDir + hex16(s.LSN) + "-" + hex16(s.Epoch) + "-" + hex16(uint64(s.Commit))
}

func parseSnapshotName(name string) (SnapshotRef, bool) {
	rest, ok := strings.CutPrefix(name, snapshotsDir)
	if !ok {
		return SnapshotRef{}, false
	}
	f := strings.Split(rest, "-")
	if len(f) != 3 {
		return SnapshotRef{}, false
	}
	var v [3]uint64
	for i := range f {
		if v[i], ok = parseHex16(f[i]); !ok {
			return SnapshotRef{}, false
		}
	}
	if v[0] == 0 || v[1] == 0 || v[1] > datadir.MaxEpoch {
		return SnapshotRef{}, false
	}
	return SnapshotRef{LSN: v[0], Epoch: v[1], Commit: int64(v[2])}, true
}

// historyName is the name of epoch e's history object.
func historyName(e uint64) string { return historyDir + hex16(e) }

func parseHistoryName(name string) (uint64, bool) {
	rest, ok := strings.CutPrefix(name, historyDir)
	if !ok {
		return 0, false
	}
	e, ok := parseHex16(rest)
	return e, ok && e > 0 && e <= datadir.MaxEpoch
}
