package archive

import (
	"context"
	"fmt"
	"sort"
	"time"

	"github.com/walship/walship/internal/datadir"
)

// Catalog is what an archive holds, from its listing: every object named,
// nothing downloaded but the cluster marker and the newest history.
type Catalog struct {
	// ClusterID is the archive's cluster ("" for an empty archive).
	ClusterID string
	// Lineage is the epoch history of the newest epoch archived: which
	// epoch wrote which LSNs. Chunks of another epoch at those LSNs (a
	// tail that a forced promotion cut) are not part of the history.
	Lineage datadir.History
	// Epochs are the epochs with a history object, ascending.
	Epochs []uint64
	// Chunks are every WAL chunk, by first LSN, then epoch.
	Chunks []Chunk
	// ChunkBytes is their stored size.
	ChunkBytes int64
	// Snapshots are every base snapshot, by LSN.
	Snapshots []SnapshotRef
	// Unknown are objects of no known kind (not written by walship).
	Unknown []string
}

// Catalog lists the archive. It checks the cluster marker against
// cluster, if set.
func (a *Archive) Catalog(ctx context.Context, cluster string) (*Catalog, error) {
	id, err := a.ClusterID(ctx)
	if err != nil {
		return nil, err
	}
	if cluster != "" && id != "" && id != cluster {
		return nil, &ClusterMismatchError{Archive: a.String(), Ours: cluster, Theirs: id}
	}
	c := &Catalog{ClusterID: id}
	sizes := map[string]int64{}
	err = a.bucket.List(ctx, "", "", func(o Object) bool {
		switch {
		case o.Name == clusterName:
		case hasPrefix(o.Name, walDir):
			if ch, ok := parseChunkName(o.Name); ok {
				c.Chunks = append(c.Chunks, ch)
				c.ChunkBytes += o.Size
				return true
			}
			c.Unknown = append(c.Unknown, o.Name)
		case hasPrefix(o.Name, snapshotsDir):
			if s, ok := parseSnapshotName(o.Name); ok {
				s.Size = o.Size
				c.Snapshots = append(c.Snapshots, s)
				return true
			}
			c.Unknown = append(c.Unknown, o.Name)
		case hasPrefix(o.Name, historyDir):
			if e, ok := parseHistoryName(o.Name); ok {
				c.Epochs = append(c.Epochs, e)
				return true
			}
			c.Unknown = append(c.Unknown, o.Name)
		default:
			c.Unknown = append(c.Unknown, o.Name)
		}
		sizes[o.Name] = o.Size
		return true
	})
	if err != nil {
		return nil, err
	}
	sort.Slice(c.Chunks, func(i, j int) bool {
		x, y := c.Chunks[i], c.Chunks[j]
		if x.FirstLSN != y.FirstLSN {
			return x.FirstLSN < y.FirstLSN
		}
		if x.Epoch != y.Epoch {
			return x.Epoch < y.Epoch
		}
		return x.LastLSN < y.LastLSN
	})
	sort.Slice(c.Snapshots, func(i, j int) bool { return c.Snapshots[i].LSN < c.Snapshots[j].LSN })
	sort.Slice(c.Epochs, func(i, j int) bool { return c.Epochs[i] < c.Epochs[j] })
	if len(c.Epochs) > 0 {
		if c.Lineage, err = a.GetHistory(ctx, id, c.Epochs[len(c.Epochs)-1]); err != nil {
			return nil, err
		}
	}
	return c, nil
}

func hasPrefix(s, p string) bool { return len(s) >= len(p) && s[:len(p)] == p }

// InLineage reports whether chunk ch is of the epoch the lineage gives
// its LSNs to.
func (c *Catalog) InLineage(ch Chunk) bool {
	return c.Lineage.EpochOf(ch.FirstLSN) == ch.Epoch && c.Lineage.EpochOf(ch.LastLSN) == ch.Epoch
}

// SnapshotInLineage reports whether snapshot s was taken of the lineage's
// log (the lineage gives its LSN to the epoch it was taken in).
func (c *Catalog) SnapshotInLineage(s SnapshotRef) bool {
	return c.Lineage.EpochOf(s.LSN) == s.Epoch
}

// Run is a sequence of chunks of the lineage that covers every LSN from
// From+1 to To, each starting at or before the LSN after the one before
// it ends (chunks may overlap where an upload was repeated).
type Run struct {
	From, To uint64
	Chunks   []Chunk
}

// Cover returns the chunks of the lineage that hold LSNs from+1 on, as far
// as they go without a gap: the Run ends where no chunk holds the next
// LSN.
func (c *Catalog) Cover(from uint64) Run {
	r := Run{From: from, To: from}
	next := from + 1
	// Chunks are sorted by first LSN and next only grows: a chunk seen
	// and not chosen ends no later than the one chosen, so it never holds
	// a later next.
	for i := 0; ; {
		best := -1
		for ; i < len(c.Chunks) && c.Chunks[i].FirstLSN <= next; i++ {
			ch := c.Chunks[i]
			if ch.LastLSN >= next && c.InLineage(ch) && (best < 0 || ch.LastLSN > c.Chunks[best].LastLSN) {
				best = i
			}
		}
		if best < 0 {
			return r
		}
		ch := c.Chunks[best]
		r.Chunks = append(r.Chunks, ch)
		r.To = ch.LastLSN
		next = ch.LastLSN + 1
	}
}

// Tail is the last LSN of the lineage's chunks (0 if none): where an
// uploader continues.
func (c *Catalog) Tail() uint64 {
	var t uint64
	for _, ch := range c.Chunks {
		if c.InLineage(ch) {
			t = max(t, ch.LastLSN)
		}
	}
	return t
}

// Range is LSNs a restore can reach: every batch boundary from From (a
// base snapshot's LSN, or 0 when the lineage's chunks start at LSN 1) to
// To, and the commit times of both ends (zero where unknown).
type Range struct {
	From, To         uint64
	FromTime, ToTime time.Time
}

// Window is what a restore from the archive can reach, and what in the
// archive is not part of it.
type Window struct {
	// Ranges are the restorable ranges, oldest first, disjoint: more than
	// one when chunks are missing between them.
	Ranges []Range
	// Gaps are LSNs of the lineage no chunk holds, after its first chunk.
	Gaps []Gap
	// OutOfLineage are chunks of an epoch the lineage does not give their
	// LSNs to (a tail a forced promotion cut); they are never restored.
	OutOfLineage []Chunk
	// SnapshotsOutOfLineage likewise.
	SnapshotsOutOfLineage []SnapshotRef
}

// Gap is LSNs no chunk of the lineage holds, between two that are held.
type Gap struct{ From, To uint64 }

func (g Gap) String() string { return fmt.Sprintf("LSNs %d..%d", g.From, g.To) }

// Window computes what a restore can reach: from each start (LSN 0 if
// the lineage's chunks start at LSN 1, and each snapshot of the lineage)
// as far as its chunks go without a gap.
func (c *Catalog) Window() Window {
	var w Window
	for _, ch := range c.Chunks {
		if !c.InLineage(ch) {
			w.OutOfLineage = append(w.OutOfLineage, ch)
		}
	}
	for _, s := range c.Snapshots {
		if !c.SnapshotInLineage(s) {
			w.SnapshotsOutOfLineage = append(w.SnapshotsOutOfLineage, s)
		}
	}
	add := func(from uint64, fromTime time.Time) {
		run := c.Cover(from)
		r := Range{From: from, To: run.To, FromTime: fromTime, ToTime: fromTime}
		if n := len(run.Chunks); n > 0 {
			r.ToTime = unixNano(run.Chunks[n-1].LastCommit)
		}
		if n := len(w.Ranges); n > 0 && w.Ranges[n-1].To >= r.From {
			if r.To > w.Ranges[n-1].To {
				w.Ranges[n-1].To, w.Ranges[n-1].ToTime = r.To, r.ToTime
			}
			return
		}
		w.Ranges = append(w.Ranges, r)
	}
	if run := c.Cover(0); len(run.Chunks) > 0 {
		add(0, time.Time{})
	}
	for _, s := range c.Snapshots {
		if c.SnapshotInLineage(s) {
			add(s.LSN, unixNano(s.Commit))
		}
	}
	end, started := uint64(0), false
	for _, ch := range c.Chunks {
		if !c.InLineage(ch) || (started && ch.LastLSN <= end) {
			continue
		}
		if started && ch.FirstLSN > end+1 {
			w.Gaps = append(w.Gaps, Gap{From: end + 1, To: ch.FirstLSN - 1})
		}
		end, started = max(end, ch.LastLSN), true
	}
	return w
}

func unixNano(ns int64) time.Time {
	if ns == 0 {
		return time.Time{}
	}
	return time.Unix(0, ns)
}
