package archive

import (
	"time"
)

// RetentionPlan is what retention deletes from an archive.
type RetentionPlan struct {
	// KeepFrom is the LSN of the oldest snapshot kept: every point from
	// it on stays restorable. 0 when nothing is deleted.
	KeepFrom uint64
	// Delete are the objects to delete: chunks that end at or before
	// KeepFrom and snapshots before it (of the lineage or not).
	Delete []string
}

// Expired plans the archive's retention at now, by a recovery window
// and by a count of base snapshots (0 leaves either out; both 0 keeps
// everything); an archive keeps what either asks for:
//   - window: every point of the last window stays restorable. A restore
//     of the oldest of them starts from the newest snapshot committed at
//     or before now − window, so that one and everything after it is
//     kept; without such a snapshot nothing is deleted (the archive's
//     oldest point is then inside the window).
//   - keepSnapshots: the newest keepSnapshots snapshots of the lineage,
//     and everything after the oldest of them.
//
// Chunks that end at or before the oldest snapshot kept, and older
// snapshots, are deleted. Epoch histories are kept (they are small, and a
// lineage needs them all).
func (c *Catalog) Expired(now time.Time, window time.Duration, keepSnapshots int) RetentionPlan {
	if window <= 0 && keepSnapshots <= 0 {
		return RetentionPlan{}
	}
	var lineage []SnapshotRef
	for _, s := range c.Snapshots {
		if c.SnapshotInLineage(s) {
			lineage = append(lineage, s)
		}
	}
	start := len(lineage) // index of the oldest snapshot kept; none yet
	if window > 0 {
		cutoff := now.Add(-window).UnixNano()
		w := -1
		for i, s := range lineage {
			if s.Commit != 0 && s.Commit <= cutoff {
				w = i
			}
		}
		if w < 0 {
			return RetentionPlan{}
		}
		start = w
	}
	if keepSnapshots > 0 {
		if len(lineage) <= keepSnapshots {
			return RetentionPlan{}
		}
		start = min(start, len(lineage)-keepSnapshots)
	}
	from := lineage[start]
	// The window must be restorable from the snapshot kept: if no chunk
	// continues it while newer ones exist, delete nothing.
	if run := c.Cover(from.LSN); run.To == from.LSN && c.Tail() > from.LSN {
		return RetentionPlan{}
	}
	plan := RetentionPlan{KeepFrom: from.LSN}
	for _, ch := range c.Chunks {
		if ch.LastLSN <= from.LSN {
			plan.Delete = append(plan.Delete, ChunkName(ch))
		}
	}
	for _, s := range c.Snapshots {
		if s.LSN < from.LSN {
			plan.Delete = append(plan.Delete, SnapshotName(s))
		}
	}
	return plan
}
