package primary

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/walship/walship/internal/vfs"
)

// The primary begins a new epoch every time it starts, at the LSN after the
// last one it recovered, and keeps the history in DataDir/epochs, one
// "epoch first_lsn" line per start. Replicas receive batches before the
// primary's fsync; a crash can lose such a tail, and the restarted primary
// then writes different batches at the same LSNs. The history tells which
// entries of a reconnecting replica may be such a lost tail: those at or
// after the first LSN of the first epoch newer than the replica's (the
// epoch of the last batch it wrote). See ReplicaHello and Diverged.

// epochStart is one line of the history.
type epochStart struct {
	epoch, firstLSN uint64
}

type epochHistory []epochStart

func epochsPath(dataDir string) string { return filepath.Join(dataDir, "epochs") }

// loadEpochs reads the history; a missing file is an empty history.
func loadEpochs(fs vfs.FS, path string) (epochHistory, error) {
	b, err := vfs.ReadFile(fs, path)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read epoch history: %w", err)
	}
	var h epochHistory
	for i, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		if line == "" {
			continue
		}
		f := strings.Fields(line)
		var e, lsn uint64
		var perr error
		if len(f) != 2 {
			perr = errors.New(`want "epoch first_lsn"`)
		} else if e, perr = strconv.ParseUint(f[0], 10, 64); perr == nil {
			lsn, perr = strconv.ParseUint(f[1], 10, 64)
		}
		if perr == nil && len(h) > 0 && (e <= h[len(h)-1].epoch || lsn < h[len(h)-1].firstLSN) {
			perr = errors.New("epochs and first LSNs must increase")
		}
		if perr != nil {
			return nil, fmt.Errorf("read epoch history %s: line %d %q: %v", path, i+1, line, perr)
		}
		h = append(h, epochStart{epoch: e, firstLSN: lsn})
	}
	return h, nil
}

func (h epochHistory) marshal() []byte {
	var b strings.Builder
	for _, e := range h {
		fmt.Fprintf(&b, "%d %d\n", e.epoch, e.firstLSN)
	}
	return []byte(b.String())
}

// begin returns the history with a new epoch starting at firstLSN, newer
// than every epoch in it and than seen (the highest epoch in the recovered
// log).
func (h epochHistory) begin(seen, firstLSN uint64) epochHistory {
	e := seen + 1
	if n := len(h); n > 0 {
		e = max(e, h[n-1].epoch+1)
	}
	return append(h[:len(h):len(h)], epochStart{epoch: e, firstLSN: firstLSN})
}

// current is the epoch in force (the last one begun).
func (h epochHistory) current() epochStart { return h[len(h)-1] }

// keepUpTo returns the last LSN a replica whose newest batch is from
// epoch e can be sure to share with this primary: entries it holds from
// the first LSN of the next epoch on were written before a restart that may
// have lost them. ok is false when every epoch after e is unknown to the
// history (the replica is in the current epoch): it can keep everything.
func (h epochHistory) keepUpTo(e uint64) (lsn uint64, ok bool) {
	for _, s := range h {
		if s.epoch > e {
			return s.firstLSN - 1, true
		}
	}
	return 0, false
}
