package datadir

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	walshipv1 "github.com/walship/walship/gen/walship/v1"
	"github.com/walship/walship/internal/vfs"
)

// Start is one line of a History: epoch Epoch wrote the log from FirstLSN
// on (until the next line's FirstLSN).
type Start struct {
	Epoch, FirstLSN uint64
}

// History is the epoch history of a log, in increasing epoch and LSN: the
// primary's record of the epochs it began (PostgreSQL's timeline history,
// Kafka's leader-epoch cache), and a replica's or log store's record of the
// epochs its batches came from. Two logs share every entry up to the end,
// in both histories, of the newest epoch they have in common; the first
// entry after it is where they diverge (see KeepUpTo).
//
// A history whose first line starts past LSN 1 is incomplete: the node was
// seeded from a snapshot and does not know which epochs wrote the log
// before it.
type History []Start

// LoadHistory reads dir's history; a missing file is an empty history.
func LoadHistory(fsys vfs.FS, dir string) (History, error) {
	path := filepath.Join(dir, historyFile)
	b, err := vfs.ReadFile(fsys, path)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read epoch history: %w", err)
	}
	return ParseHistory(path, b)
}

// ParseHistory parses the file form of a history (Marshal); name is used
// in errors.
func ParseHistory(name string, b []byte) (History, error) {
	var h History
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
		if perr == nil && len(h) > 0 && (e <= h[len(h)-1].Epoch || lsn < h[len(h)-1].FirstLSN) {
			perr = errors.New("epochs and first LSNs must increase")
		}
		if perr != nil {
			return nil, fmt.Errorf("read epoch history %s: line %d %q: %v", name, i+1, line, perr)
		}
		h = append(h, Start{Epoch: e, FirstLSN: lsn})
	}
	return h, nil
}

// SaveHistory durably replaces dir's history.
func SaveHistory(fsys vfs.FS, dir string, h History) error {
	if err := vfs.WriteFileAtomic(fsys, filepath.Join(dir, historyFile), h.Marshal()); err != nil {
		return fmt.Errorf("save epoch history: %w", err)
	}
	return nil
}

// Marshal returns the file form: one "epoch first_lsn" line per entry.
func (h History) Marshal() []byte {
	var b strings.Builder
	for _, e := range h {
		fmt.Fprintf(&b, "%d %d\n", e.Epoch, e.FirstLSN)
	}
	return []byte(b.String())
}

// Begin returns the history with a new epoch starting at firstLSN, newer
// than every epoch in it and than seen; ErrNoEpochLeft if there is none.
func (h History) Begin(seen, firstLSN uint64) (History, error) {
	e, err := NextEpoch(max(seen, h.Current().Epoch))
	if err != nil {
		return nil, err
	}
	return h.With(e, firstLSN), nil
}

// With returns h (cut after firstLSN-1) with epoch e starting at firstLSN:
// the history of a log that continues h's up to firstLSN-1 in epoch e.
func (h History) With(e, firstLSN uint64) History {
	h = h.Cut(firstLSN - 1)
	if n := len(h); n > 0 && h[n-1].FirstLSN == firstLSN {
		h = h[:n-1] // that epoch wrote nothing this log keeps
	}
	return append(h[:len(h):len(h)], Start{Epoch: e, FirstLSN: firstLSN})
}

// Current is the newest epoch of the history (the zero Start if empty).
func (h History) Current() Start {
	if len(h) == 0 {
		return Start{}
	}
	return h[len(h)-1]
}

// Note records that the log gets a batch of epoch e starting at first.
// It returns the history and whether it changed (a newer epoch, to be
// saved before the batch is written). Epochs only grow along a log; a
// batch of an older epoch than the newest in h is the caller's to refuse.
func (h History) Note(e, first uint64) (History, bool) {
	if len(h) > 0 && e <= h[len(h)-1].Epoch {
		return h, false
	}
	return h.With(e, first), true
}

// Cut returns h without the epochs that begin after lsn: the history of
// the log cut after lsn.
func (h History) Cut(lsn uint64) History {
	n := len(h)
	for n > 0 && h[n-1].FirstLSN > lsn {
		n--
	}
	return h[:n:n]
}

// Complete reports whether the history reaches back to LSN 1.
func (h History) Complete() bool { return len(h) == 0 || h[0].FirstLSN <= 1 }

// EpochOf returns the epoch that wrote lsn, by this history (0 if lsn is
// before the history's first entry).
func (h History) EpochOf(lsn uint64) uint64 {
	var e uint64
	for _, s := range h {
		if s.FirstLSN > lsn {
			break
		}
		e = s.Epoch
	}
	return e
}

// KeepUpTo returns how much of another log this history's log shares: for
// a log whose newest entry is of epoch e, the last LSN both logs hold the
// same entries up to — the end, in this history, of the newest epoch not
// after e (Kafka's OffsetForLeaderEpoch) — with all set to true when every
// epoch after e is unknown here, so that the other log can keep everything
// it has (it is of this log's current epoch, or older and shorter). known
// is false when this history is incomplete and does not reach back to e:
// nothing can be said, and the other log must be re-seeded.
func (h History) KeepUpTo(e uint64) (lsn uint64, all, known bool) {
	for i, s := range h {
		if s.Epoch > e {
			if i == 0 && !h.Complete() {
				return 0, false, false
			}
			return s.FirstLSN - 1, false, true
		}
	}
	return 0, true, true
}

// Proto is the history as the API carries it.
func (h History) Proto() []*walshipv1.EpochStart {
	out := make([]*walshipv1.EpochStart, len(h))
	for i, e := range h {
		out[i] = &walshipv1.EpochStart{Epoch: e.Epoch, FirstLsn: e.FirstLSN}
	}
	return out
}

// CheckProto checks a history received from a peer: epochs and first
// LSNs at least 1, epochs increasing and within CheckEpoch's bound of
// known (the newest epoch the receiver knows), first LSNs not decreasing.
// The error names the bad entry's index.
func CheckProto(hs []*walshipv1.EpochStart, known, bound uint64) error {
	return HistoryFromProto(hs).Check(known, bound)
}

// Check is [CheckProto] of a history already converted: every history
// that came from a peer is checked before it is compared with another
// (SharedUpTo takes a first LSN of 0 as the end of the log before it).
func (h History) Check(known, bound uint64) error {
	for i, e := range h {
		switch {
		case e.Epoch == 0 || e.FirstLSN == 0:
			return fmt.Errorf("[%d]: epoch and first_lsn must be at least 1 (got epoch %d, first_lsn %d)", i, e.Epoch, e.FirstLSN)
		case CheckEpoch(e.Epoch, known, bound) != nil:
			return fmt.Errorf("[%d].epoch: %v", i, CheckEpoch(e.Epoch, known, bound))
		case i > 0 && (e.Epoch <= h[i-1].Epoch || e.FirstLSN < h[i-1].FirstLSN):
			return fmt.Errorf("[%d]: epochs must increase and first LSNs must not decrease (epoch %d at LSN %d after epoch %d at LSN %d)",
				i, e.Epoch, e.FirstLSN, h[i-1].Epoch, h[i-1].FirstLSN)
		}
	}
	return nil
}

// HistoryFromProto is the history an API message carries.
func HistoryFromProto(hs []*walshipv1.EpochStart) History {
	h := make(History, len(hs))
	for i, e := range hs {
		h[i] = Start{Epoch: e.GetEpoch(), FirstLSN: e.GetFirstLsn()}
	}
	return h
}

// SharedUpTo says how much of another log, whose epoch history is theirs,
// this history's log shares: up to the end of the newest epoch both
// histories hold, in whichever of the two logs it ends first (Kafka's
// KIP-101 and KIP-279: the other log's last epoch alone is not enough — it
// may hold an epoch this log never had, after entries of an older one it
// has only partly). all is true when the other log is in this log's current
// epoch and can keep everything. known is false when this history is
// incomplete and shares no epoch with theirs: nothing can be said, and the
// other log must be re-seeded. An empty theirs is judged by KeepUpTo(0).
func (h History) SharedUpTo(theirs History) (lsn uint64, all, known bool) {
	const open = ^uint64(0)
	end := func(hs History, i int) uint64 {
		if i+1 < len(hs) {
			// max: a history Check refuses (a first LSN of 0) shares
			// nothing, rather than wrapping round to the open end.
			return max(hs[i+1].FirstLSN, 1) - 1
		}
		return open
	}
	for j := len(theirs) - 1; j >= 0; j-- {
		for i := len(h) - 1; i >= 0; i-- {
			if h[i].Epoch != theirs[j].Epoch {
				continue
			}
			ours, their := end(h, i), end(theirs, j)
			if ours == open && their == open {
				return 0, true, true
			}
			return min(ours, their), false, true
		}
	}
	if len(theirs) == 0 {
		return h.KeepUpTo(0)
	}
	if !h.Complete() || !theirs.Complete() {
		return 0, false, false
	}
	return 0, false, true
}
