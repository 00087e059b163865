package archive

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sort"
	"sync"

	walshipv1 "github.com/walship/walship/gen/walship/v1"
	"github.com/walship/walship/internal/basesnap"
	"golang.org/x/sync/errgroup"
)

// Problem is one thing wrong with an archive.
type Problem struct {
	// Kind: "checksum" (an object's bytes do not match its metadata, or do
	// not decode), "gap" (LSNs of the lineage no chunk holds), "conflict"
	// (two chunks hold different batches at one LSN), "history" (an epoch
	// history missing or unreadable), "snapshot" (a damaged snapshot),
	// "cluster" (no cluster marker, or an object of another cluster),
	// "read" (an object that could not be read).
	Kind string
	// Object is the object's name ("" for a gap).
	Object string
	// LSN is where it is (a chunk's first LSN, a snapshot's LSN).
	LSN     uint64
	Message string
}

// SnapshotCheck is one snapshot, read whole.
type SnapshotCheck struct {
	SnapshotRef
	Keys   uint64
	Digest string
}

// Report is what Verify found.
type Report struct {
	ClusterID string
	Catalog   *Catalog
	Window    Window
	// Chunks, Batches and Bytes count what was read and checked.
	Chunks, Batches int
	Bytes           int64
	Snapshots       []SnapshotCheck
	Problems        []Problem
}

// Verify reads every object of the archive — each chunk and its batches,
// each snapshot whole, each history — checking its checksum, its
// decoding and that it holds what its name says, then the lineage's
// continuity; it reports what a restore can reach and every problem.
// parallel objects are read at once. tmpDir holds snapshots while they
// are read. Only a failure to list the archive is an error.
func (a *Archive) Verify(ctx context.Context, cluster string, parallel int, tmpDir string) (*Report, error) {
	cat, err := a.Catalog(ctx, cluster)
	if err != nil {
		var ce *CorruptError
		if !errors.As(err, &ce) {
			return nil, err
		}
		return &Report{Problems: []Problem{{Kind: "history", Object: ce.Name, Message: err.Error()}}}, nil
	}
	rep := &Report{ClusterID: cat.ClusterID, Catalog: cat}
	var mu sync.Mutex
	problem := func(p Problem) {
		mu.Lock()
		rep.Problems = append(rep.Problems, p)
		mu.Unlock()
	}
	kindOf := func(err error) string {
		var ce *CorruptError
		if errors.As(err, &ce) {
			return "checksum"
		}
		return "read"
	}
	if cat.ClusterID == "" && (len(cat.Chunks) > 0 || len(cat.Snapshots) > 0) {
		problem(Problem{Kind: "cluster", Object: clusterName, Message: "the archive holds history but no cluster marker: nothing says which cluster it is of"})
	}
	for _, e := range cat.Epochs {
		if _, err := a.GetHistory(ctx, cat.ClusterID, e); err != nil {
			problem(Problem{Kind: "history", Object: historyName(e), Message: err.Error()})
		}
	}
	if len(cat.Chunks) > 0 && len(cat.Lineage) == 0 {
		problem(Problem{Kind: "history", Message: "chunks but no epoch history: which epoch's batches are the cluster's cannot be told"})
	}
	// Batches of the lineage by first LSN: two chunks that hold one LSN
	// must hold the same batch there.
	seen := map[uint64][2]uint64{} // first LSN -> {last LSN, crc}
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(max(1, parallel))
	for _, ch := range cat.Chunks {
		g.Go(func() error {
			envs, err := a.GetChunk(gctx, cat.ClusterID, ch)
			if err != nil {
				if gctx.Err() != nil {
					return gctx.Err()
				}
				problem(Problem{Kind: kindOf(err), Object: ChunkName(ch), LSN: ch.FirstLSN, Message: err.Error()})
				return nil
			}
			var size int64
			for _, env := range envs {
				size += int64(len(env.GetPayload()))
			}
			mu.Lock()
			defer mu.Unlock()
			rep.Chunks++
			rep.Batches += len(envs)
			rep.Bytes += size
			if !cat.InLineage(ch) {
				return nil
			}
			for _, env := range envs {
				mark := [2]uint64{env.GetLastLsn(), uint64(env.GetCrc32C())}
				if prev, ok := seen[env.GetFirstLsn()]; ok && prev != mark {
					rep.Problems = append(rep.Problems, Problem{Kind: "conflict", Object: ChunkName(ch), LSN: env.GetFirstLsn(),
						Message: fmt.Sprintf("batch %d..%d differs from the one another chunk holds at LSN %d", env.GetFirstLsn(), env.GetLastLsn(), env.GetFirstLsn())})
				}
				seen[env.GetFirstLsn()] = mark
			}
			return nil
		})
	}
	for _, sn := range cat.Snapshots {
		g.Go(func() error {
			check, err := a.checkSnapshot(gctx, cat.ClusterID, sn, tmpDir)
			if err != nil {
				if gctx.Err() != nil {
					return gctx.Err()
				}
				kind := "snapshot"
				if kindOf(err) == "read" && !errors.Is(err, basesnap.ErrBad) {
					kind = "read"
				}
				problem(Problem{Kind: kind, Object: SnapshotName(sn), LSN: sn.LSN, Message: err.Error()})
				return nil
			}
			mu.Lock()
			rep.Snapshots = append(rep.Snapshots, check)
			mu.Unlock()
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		return nil, err
	}
	// What a restore can reach only counts objects that read back intact.
	bad := map[string]bool{}
	for _, p := range rep.Problems {
		if p.Object != "" {
			bad[p.Object] = true
		}
	}
	good := *cat
	good.Chunks, good.Snapshots = nil, nil
	for _, ch := range cat.Chunks {
		if !bad[ChunkName(ch)] {
			good.Chunks = append(good.Chunks, ch)
		}
	}
	for _, sn := range cat.Snapshots {
		if !bad[SnapshotName(sn)] {
			good.Snapshots = append(good.Snapshots, sn)
		}
	}
	rep.Window = good.Window()
	// Gaps are judged on the whole listing: a damaged chunk is already a
	// problem of its own.
	for _, gap := range cat.Window().Gaps {
		rep.Problems = append(rep.Problems, Problem{Kind: "gap", LSN: gap.From,
			Message: fmt.Sprintf("no chunk of the lineage holds %s", gap)})
	}
	sort.Slice(rep.Snapshots, func(i, j int) bool { return rep.Snapshots[i].LSN < rep.Snapshots[j].LSN })
	sort.SliceStable(rep.Problems, func(i, j int) bool { return rep.Problems[i].LSN < rep.Problems[j].LSN })
	return rep, nil
}

// checkSnapshot reads snapshot sn whole: checksum, meta against its name
// and cluster, the state's order, count, CRC and digest.
func (a *Archive) checkSnapshot(ctx context.Context, cluster string, sn SnapshotRef, tmpDir string) (SnapshotCheck, error) {
	f, size, err := a.FetchSnapshot(ctx, cluster, sn, tmpDir)
	if err != nil {
		return SnapshotCheck{}, err
	}
	defer os.Remove(f.Name())
	defer f.Close()
	name := SnapshotName(sn)
	hdr, off, err := basesnap.DecodeMeta(f, size)
	if err != nil {
		return SnapshotCheck{}, corrupt(name, "%v", err)
	}
	if err := CheckSnapshotMeta(sn, cluster, hdr); err != nil {
		return SnapshotCheck{}, err
	}
	d, err := basesnap.Scan(f, size, off, hdr, name, func([]byte, []byte, uint64) error { return ctx.Err() })
	if err != nil {
		if errors.Is(err, basesnap.ErrBad) {
			return SnapshotCheck{}, corrupt(name, "%v", err)
		}
		return SnapshotCheck{}, err
	}
	return SnapshotCheck{SnapshotRef: sn, Keys: hdr.GetKeys(), Digest: d.String()}, nil
}

// CheckSnapshotMeta checks a downloaded snapshot's meta against its name
// (sn) and the archive's cluster: a CorruptError if they differ.
func CheckSnapshotMeta(sn SnapshotRef, cluster string, hdr *walshipv1.SnapshotHeader) error {
	name := SnapshotName(sn)
	switch {
	case hdr.GetLsn() != sn.LSN || hdr.GetEpoch() != sn.Epoch || hdr.GetCommitTimeUnixNano() != sn.Commit:
		return corrupt(name, "holds LSN %d of epoch %d (commit %d), its name says LSN %d of epoch %d (commit %d)",
			hdr.GetLsn(), hdr.GetEpoch(), hdr.GetCommitTimeUnixNano(), sn.LSN, sn.Epoch, sn.Commit)
	case cluster != "" && hdr.GetClusterId() != "" && hdr.GetClusterId() != cluster:
		return corrupt(name, "is of cluster %s, the archive of cluster %s", hdr.GetClusterId(), cluster)
	}
	return nil
}
