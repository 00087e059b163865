package restore

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	walshipv1 "github.com/walship/walship/gen/walship/v1"
	"github.com/walship/walship/internal/archive"
	"github.com/walship/walship/internal/basesnap"
	"github.com/walship/walship/internal/datadir"
	"github.com/walship/walship/internal/state"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// A restore from the archive (Options.Archive) reads what the log stores
// uploaded (internal/archive) and needs no log store at all: the lineage
// is the newest epoch's history object, the base snapshot the newest of
// that lineage at or before the target whose chunks reach it, and the
// batches those chunks, downloaded several at a time ahead of the replay.
// Every object's checksum is checked as it is read, and the batches go
// through the same checks as from a log store (CRC, continuity, epoch
// against the lineage, the target), so a damaged or missing object fails
// the restore (DATA_LOSS naming it and its LSNs) rather than restoring
// another point.

// archiveSource is the archive a restore reads.
type archiveSource struct {
	r    *restorer
	a    *archive.Archive
	cat  *archive.Catalog
	snap *archive.SnapshotRef // nil: replay from LSN 1
	run  archive.Run
	// parallel is how many chunks are downloaded ahead of the replay.
	parallel int
}

// ArchiveParallel is how many chunks a restore downloads at once.
const ArchiveParallel = 8

func runArchive(ctx context.Context, o Options, start time.Time) (*Result, error) {
	cat, err := o.Archive.Catalog(ctx, o.ClusterID)
	if err != nil {
		return nil, err
	}
	if len(cat.Chunks) == 0 && len(cat.Snapshots) == 0 {
		return nil, status.Errorf(codes.OutOfRange, "the archive %s holds no history (nothing has been uploaded to it yet)", o.Archive)
	}
	if len(cat.Lineage) == 0 {
		return nil, status.Errorf(codes.DataLoss, "the archive %s holds chunks but no epoch history (history/ objects): it cannot tell which epoch's batches are the cluster's", o.Archive)
	}
	r := &restorer{o: o, lineage: cat.Lineage}
	src := &archiveSource{r: r, a: o.Archive, cat: cat, parallel: ArchiveParallel}
	r.arch = src
	if err := src.plan(); err != nil {
		return nil, err
	}
	o.Logger.Info("restore planned", "target", o.Target.String(), "lsn", r.p.LSN, "archive", o.Archive.String(),
		"snapshot_from", r.p.SnapshotFrom, "chunks", len(src.run.Chunks), "dry_run", o.DryRun)
	return r.finish(ctx, start)
}

// start is a point a restore can begin from: LSN 0 (nil) or a snapshot.
type start struct {
	snap *archive.SnapshotRef
	run  archive.Run
}

func (st start) lsn() uint64 {
	if st.snap == nil {
		return 0
	}
	return st.snap.LSN
}

// starts are the points a restore may begin from, oldest first, each with
// the chunks that continue it.
func (src *archiveSource) starts() []start {
	var out []start
	if run := src.cat.Cover(0); len(run.Chunks) > 0 {
		out = append(out, start{run: run})
	}
	for i := range src.cat.Snapshots {
		s := &src.cat.Snapshots[i]
		if src.cat.SnapshotInLineage(*s) {
			out = append(out, start{snap: s, run: src.cat.Cover(s.LSN)})
		}
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].lsn() < out[j].lsn() })
	return out
}

// plan resolves the target to a start and the chunks to replay.
func (src *archiveSource) plan() error {
	r, t := src.r, src.r.o.Target
	r.p.Target = t
	starts := src.starts()
	if len(starts) == 0 {
		return status.Errorf(codes.OutOfRange, "restore to %s: nothing in the archive %s is restorable: %s", t, src.a, src.describe())
	}
	var pick *start
	switch {
	case t.Latest:
		for i := range starts {
			if pick == nil || starts[i].run.To >= pick.run.To {
				pick = &starts[i]
			}
		}
		r.p.LSN = pick.run.To
	case t.setLSN:
		for i := range starts {
			if starts[i].lsn() <= t.LSN && starts[i].run.To >= t.LSN {
				pick = &starts[i]
			}
		}
		if pick == nil {
			return status.Errorf(codes.OutOfRange, "--lsn: LSN %d is not restorable from the archive %s: %s", t.LSN, src.a, src.describe())
		}
		r.p.LSN = t.LSN
	default:
		for i := range starts {
			st := &starts[i]
			if st.snap == nil || (st.snap.Commit != 0 && !unixTime(st.snap.Commit).After(t.Time)) {
				pick = st
			}
		}
		if pick == nil {
			return status.Errorf(codes.OutOfRange, "--time: %s is before anything the archive %s can restore: %s",
				t.Time.UTC().Format(time.RFC3339Nano), src.a, src.describe())
		}
		r.p.LSN = pick.run.To // an upper bound; the replay finds the point
	}
	src.snap = pick.snap
	base := pick.lsn()
	if s := pick.snap; s != nil {
		r.p.Snapshot = &walshipv1.SnapshotInfo{Lsn: s.LSN, Epoch: s.Epoch, CommitTimeUnixNano: s.Commit, Bytes: uint64(s.Size)}
		r.p.SnapshotFrom = src.a.String() + "/" + archive.SnapshotName(*s)
		r.p.CommitTime = unixTime(s.Commit)
	}
	// The chunks from the start to the target.
	for _, ch := range pick.run.Chunks {
		if t.setLSN && ch.FirstLSN > r.p.LSN {
			break
		}
		src.run.Chunks = append(src.run.Chunks, ch)
	}
	src.run.From = base
	if len(src.run.Chunks) > 0 && (r.p.LSN > base || !t.Time.IsZero()) {
		r.p.BatchesFrom = src.a.String()
	}
	return nil
}

// describe says what the archive can restore, for errors.
func (src *archiveSource) describe() string {
	w := src.cat.Window()
	var parts []string
	for _, rg := range w.Ranges {
		parts = append(parts, fmt.Sprintf("LSNs %d..%d", rg.From, rg.To))
	}
	s := "restorable: " + strings.Join(parts, ", ")
	if len(parts) == 0 {
		s = "restorable: nothing"
	}
	if len(w.Gaps) > 0 {
		var gaps []string
		for _, g := range w.Gaps {
			gaps = append(gaps, g.String())
		}
		s += "; missing: " + strings.Join(gaps, ", ")
	}
	return fmt.Sprintf("%s (%d chunks, %d snapshots, lineage %v)", s, len(src.cat.Chunks), len(src.cat.Snapshots), src.cat.Lineage)
}

// snapshot downloads the base snapshot into a temporary file, checks it
// (checksum, its meta against its name, the cluster, its history against
// the lineage, the state's CRC and digest) and builds the state.
func (src *archiveSource) snapshot(ctx context.Context) (*state.Store, error) {
	ref, r := *src.snap, src.r
	name := src.a.String() + "/" + archive.SnapshotName(ref)
	tmp := r.o.TmpDir
	if tmp == "" && r.o.DataDir != "" {
		tmp = filepath.Dir(filepath.Clean(r.o.DataDir))
	}
	f, size, err := src.a.FetchSnapshot(ctx, src.cat.ClusterID, ref, tmp)
	if err != nil {
		return nil, dataLoss(err)
	}
	defer os.Remove(f.Name())
	defer f.Close()
	hdr, off, err := basesnap.DecodeMeta(f, size)
	if err != nil {
		return nil, status.Errorf(codes.DataLoss, "snapshot %s (LSN %d): %v", name, ref.LSN, err)
	}
	if err := archive.CheckSnapshotMeta(ref, src.cat.ClusterID, hdr); err != nil {
		return nil, status.Error(codes.DataLoss, err.Error())
	}
	hist := datadir.HistoryFromProto(hdr.GetHistory())
	if err := hist.Check(r.lineage.Current().Epoch, datadir.MaxEpochGap); err != nil {
		return nil, status.Errorf(codes.DataLoss, "snapshot %s: history%v", name, err)
	}
	if len(hist) > 0 {
		if shared, all, _ := r.lineage.SharedUpTo(hist); !all && shared < hdr.GetLsn() {
			return nil, status.Errorf(codes.DataLoss, "snapshot %s has history %v, which leaves the lineage %v at LSN %d", name, hist, r.lineage, shared)
		}
	}
	b := state.NewBuilder(hdr.GetLsn())
	d, err := basesnap.Scan(f, size, off, hdr, name, func(k, v []byte, ver uint64) error {
		if err := b.Add(k, v, ver); err != nil {
			return status.Errorf(codes.DataLoss, "snapshot %s: %v", name, err)
		}
		return ctx.Err()
	})
	if errors.Is(err, basesnap.ErrBad) {
		return nil, status.Errorf(codes.DataLoss, "snapshot %s (LSN %d): %v", name, ref.LSN, err)
	}
	if err != nil {
		return nil, err
	}
	store, err := b.Finish(hdr.GetKeys(), d.String())
	if err != nil {
		return nil, status.Errorf(codes.DataLoss, "snapshot %s: %v", name, err)
	}
	r.p.Snapshot.Keys, r.p.Snapshot.StateDigest = hdr.GetKeys(), d.String()
	return store, nil
}

// dataLoss is err as DATA_LOSS if it is an archive object's damage
// (archive.CorruptError), else err.
func dataLoss(err error) error {
	var ce *archive.CorruptError
	if errors.As(err, &ce) {
		return status.Error(codes.DataLoss, err.Error())
	}
	return err
}

// fetched is one downloaded chunk, or why it could not be.
type fetched struct {
	c    archive.Chunk
	envs []*walshipv1.WalBatch
	err  error
}

// chunkStream is the batches of src.run in LSN order, downloaded up to
// src.parallel chunks ahead; a batch an earlier chunk already held (a
// repeated upload) is passed over.
type chunkStream struct {
	ctx    context.Context
	ahead  chan chan fetched
	cur    []*walshipv1.WalBatch
	next   uint64
	failed error
}

func (src *archiveSource) batches(ctx context.Context, base uint64) batchStream {
	s := &chunkStream{ctx: ctx, ahead: make(chan chan fetched, src.parallel), next: base + 1}
	go func() {
		defer close(s.ahead)
		for _, c := range src.run.Chunks {
			done := make(chan fetched, 1)
			select {
			case s.ahead <- done:
			case <-ctx.Done():
				return
			}
			go func() {
				envs, err := src.a.GetChunk(ctx, src.cat.ClusterID, c)
				done <- fetched{c: c, envs: envs, err: err}
			}()
		}
	}()
	return s
}

func (s *chunkStream) Recv() (*walshipv1.ReadResponse, error) {
	for len(s.cur) == 0 {
		if s.failed != nil {
			return nil, s.failed
		}
		var done chan fetched
		var ok bool
		select {
		case done, ok = <-s.ahead:
		case <-s.ctx.Done():
			return nil, s.ctx.Err()
		}
		if !ok {
			return nil, io.EOF
		}
		var f fetched
		select {
		case f = <-done:
		case <-s.ctx.Done():
			return nil, s.ctx.Err()
		}
		if f.err != nil {
			s.failed = dataLoss(f.err)
			return nil, s.failed
		}
		for _, env := range f.envs {
			switch {
			case env.GetLastLsn() < s.next:
				continue // held by the chunk before
			case env.GetFirstLsn() < s.next:
				s.failed = status.Errorf(codes.DataLoss, "archive chunk %s: batch %d..%d straddles LSN %d, where the chunk before ended: the two do not hold the same batches",
					archive.ChunkName(f.c), env.GetFirstLsn(), env.GetLastLsn(), s.next-1)
				return nil, s.failed
			}
			s.cur = append(s.cur, env)
			s.next = env.GetLastLsn() + 1
		}
	}
	env := s.cur[0]
	s.cur = s.cur[1:]
	return &walshipv1.ReadResponse{Batch: env}, nil
}
