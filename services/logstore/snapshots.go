package logstore

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	walshipv1 "github.com/walship/walship/gen/walship/v1"
	"github.com/walship/walship/internal/basesnap"
	"github.com/walship/walship/internal/datadir"
	"github.com/walship/walship/internal/envelope"
	"github.com/walship/walship/internal/rpcerr"
	"github.com/walship/walship/internal/snapchunk"
	"github.com/walship/walship/internal/state"
	"github.com/walship/walship/internal/vfs"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
)

// snapshotDurableWait bounds how long PutSnapshot waits for the log store
// to hold the snapshot's LSN durably. A primary uploads a snapshot at its
// visible LSN, which is durable on the primary but may still be on its way
// here; it arrives within a round trip and a flush delay, so a wait this
// long means the log store is behind (refilling, or cut off), and the
// upload is refused rather than held.
const snapshotDurableWait = 10 * time.Second

// snapshotChunkBytes bounds one SnapshotChunk GetSnapshot sends, as the
// primary's Snapshot does.
const snapshotChunkBytes = 1 << 20

// snapshotList is the log store's stored base snapshots.
type snapshotList struct {
	mu   sync.Mutex
	list []*baseSnap // by LSN, oldest first
	// cutGen counts the cuts of the log (a new primary's truncate): a
	// snapshot checked against the log before a cut is checked again
	// before it is listed.
	cutGen uint64
}

func (l *snapshotList) find(lsn uint64) *baseSnap {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, b := range l.list {
		if b.lsn == lsn {
			return b
		}
	}
	return nil
}

// has reports whether b is still listed.
func (l *snapshotList) has(b *baseSnap) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Contains(l.list, b)
}

func (l *snapshotList) gen() uint64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.cutGen
}

// snapshot returns a copy of the list.
func (l *snapshotList) snapshot() []*baseSnap {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.list)
}

// insertLocked adds b in LSN order.
func (l *snapshotList) insertLocked(b *baseSnap) {
	i, _ := slices.BinarySearchFunc(l.list, b.lsn, func(x *baseSnap, lsn uint64) int {
		switch {
		case x.lsn < lsn:
			return -1
		case x.lsn > lsn:
			return 1
		}
		return 0
	})
	l.list = slices.Insert(l.list, i, b)
}

// infos lists the snapshots as Status reports them.
func (l *snapshotList) infos() []*walshipv1.SnapshotInfo {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := make([]*walshipv1.SnapshotInfo, len(l.list))
	for i, b := range l.list {
		out[i] = b.info()
	}
	return out
}

// bytes is the size of the stored snapshot files.
func (l *snapshotList) bytes() int64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	var n int64
	for _, b := range l.list {
		n += b.bytes
	}
	return n
}

func (l *snapshotList) len() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.list)
}

// snapDir is where base snapshots are stored.
func (s *Server) snapDir() string { return filepath.Join(s.cfg.DataDir, "snapshots") }

// recoverSnapshots lists the stored base snapshots at start. A temporary
// file is an upload a crash or a failure interrupted: removed, and
// reported. A damaged file is not served (Verify reports it) and left for
// an operator. A snapshot of entries the log does not hold any more — past
// its end, or of another epoch at its LSN (a cut whose removal a crash
// interrupted) — is removed.
func (s *Server) recoverSnapshots() error {
	dir := s.snapDir()
	if err := s.fs.MkdirAll(dir, vfs.DirPerm); err != nil {
		return fmt.Errorf("create %s: %w", dir, err)
	}
	ents, err := s.fs.ReadDir(dir)
	if err != nil {
		return fmt.Errorf("list snapshots: %w", err)
	}
	h := *s.history.Load()
	end := s.durableLSN()
	removed := false
	for _, e := range ents {
		name := e.Name()
		if e.IsDir() {
			continue
		}
		if base, ok := strings.CutSuffix(name, tmpSuffix); ok {
			if _, ok := parseBaseName(base); ok {
				var size int64
				if fi, err := e.Info(); err == nil {
					size = fi.Size()
				}
				if err := s.fs.Remove(filepath.Join(dir, name)); err != nil {
					return fmt.Errorf("remove the torn snapshot upload %s: %w", name, err)
				}
				removed = true
				s.logger.Warn("removed a snapshot upload that a crash or a failure interrupted", "file", name, "bytes", size)
			}
			continue
		}
		if _, ok := parseBaseName(name); !ok {
			continue
		}
		b, err := openBase(s.fs, dir, name)
		if err != nil {
			s.logger.Error("a stored base snapshot is damaged; it is not served (walship ctl verify reports it)", "file", name, "err", err)
			continue
		}
		if why := snapshotMismatch(b, end, h); why != "" {
			if err := s.fs.Remove(filepath.Join(dir, name)); err != nil {
				return fmt.Errorf("remove snapshot %s: %w", name, err)
			}
			removed = true
			s.logger.Warn("removed a base snapshot of entries this log no longer holds", "file", name, "why", why)
			continue
		}
		s.snaps.insertLocked(b)
	}
	if removed {
		if err := s.fs.SyncDir(dir); err != nil {
			return fmt.Errorf("sync %s: %w", dir, err)
		}
	}
	return nil
}

// snapshotMismatch says why a stored snapshot does not belong to a log
// that ends at end with history h ("" if it does).
func snapshotMismatch(b *baseSnap, end uint64, h datadir.History) string {
	if b.lsn > end {
		return fmt.Sprintf("it is at LSN %d, the log ends at LSN %d", b.lsn, end)
	}
	if e := h.EpochOf(b.lsn); e != 0 && e != b.hdr.GetEpoch() {
		return fmt.Sprintf("it is of epoch %d at LSN %d, the log of epoch %d", b.hdr.GetEpoch(), b.lsn, e)
	}
	return ""
}

// dropSnapshotsAbove unlists and removes the snapshots above lsn: the log
// was cut after lsn, and they hold entries it no longer has. The writer
// calls it with walMu held; a failure to remove a file is logged (the
// next start removes it).
func (s *Server) dropSnapshotsAbove(lsn uint64) {
	s.snaps.mu.Lock()
	s.snaps.cutGen++
	var drop []*baseSnap
	keep := s.snaps.list[:0]
	for _, b := range s.snaps.list {
		if b.lsn > lsn {
			drop = append(drop, b)
		} else {
			keep = append(keep, b)
		}
	}
	clear(s.snaps.list[len(keep):])
	s.snaps.list = keep
	s.snaps.mu.Unlock()
	s.removeSnapshots(drop, fmt.Sprintf("the log was cut after LSN %d", lsn))
}

// removeSnapshots removes unlisted snapshot files, then syncs the
// directory. A failure is logged: the snapshots are no longer served, and
// a file that survives a crash is removed at the next start or pass.
func (s *Server) removeSnapshots(drop []*baseSnap, why string) {
	if len(drop) == 0 {
		return
	}
	dir := s.snapDir()
	for _, b := range drop {
		if err := s.fs.Remove(filepath.Join(dir, b.name)); err != nil && !errors.Is(err, fs.ErrNotExist) {
			s.logger.Error("cannot remove a base snapshot", "file", b.name, "err", err)
		}
	}
	if err := s.fs.SyncDir(dir); err != nil {
		s.logger.Error("cannot sync the snapshot directory after removing snapshots", "dir", dir, "err", err)
	}
	lsns := make([]uint64, len(drop))
	for i, b := range drop {
		lsns[i] = b.lsn
	}
	s.logger.Info("removed base snapshots", "lsns", lsns, "why", why)
}

// openCall registers a PutSnapshot, GetSnapshot or Verify call, which
// Run waits for before it closes the WAL.
func (s *Server) openCall() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.stopping {
		return errStopping
	}
	s.active.Add(1)
	return nil
}

// callContext is a handler's context, also ended by the graceful stop.
func (s *Server) callContext(parent context.Context) (context.Context, func()) {
	ctx, cancel := context.WithCancel(parent)
	stop := context.AfterFunc(s.stopReads, cancel)
	return ctx, func() { stop(); cancel() }
}

// PutSnapshot stores a base snapshot from a primary.
func (h *logStoreServer) PutSnapshot(stream walshipv1.LogStoreService_PutSnapshotServer) error {
	s := h.s
	if err := s.openCall(); err != nil {
		return toStatus(err)
	}
	defer s.active.Done()
	ctx, done := s.callContext(stream.Context())
	defer done()
	start := time.Now()
	info, existed, err := s.putSnapshot(ctx, stream)
	if err != nil && ctx.Err() != nil && stream.Context().Err() == nil {
		err = errStopping
	}
	s.metrics.snapshotPuts.WithLabelValues(putResult(err, existed)).Inc()
	if err != nil {
		s.logger.Warn("refused a base snapshot", "err", err)
		return toStatus(err)
	}
	if !existed {
		s.logger.Info("stored a base snapshot", "lsn", info.Lsn, "epoch", info.Epoch, "keys", info.Keys, "bytes", info.Bytes, "took", time.Since(start))
	}
	return stream.SendAndClose(&walshipv1.PutSnapshotResponse{Snapshot: info})
}

// putResult is the result label of a PutSnapshot.
func putResult(err error, existed bool) string {
	switch {
	case err == nil && existed:
		return "existed"
	case err == nil:
		return "stored"
	}
	switch status.Code(toStatus(err)) {
	case codes.DataLoss:
		return "corrupt"
	case codes.InvalidArgument, codes.FailedPrecondition:
		return "refused"
	}
	return "error"
}

// putSnapshot checks and stores an uploaded snapshot; existed reports one
// already stored at that LSN (its info is returned, the upload is not read).
func (s *Server) putSnapshot(ctx context.Context, stream walshipv1.LogStoreService_PutSnapshotServer) (_ *walshipv1.SnapshotInfo, existed bool, _ error) {
	// One upload at a time: a primary sends one at a time, and two of one
	// LSN would share a temporary file.
	select {
	case s.putSem <- struct{}{}:
	case <-ctx.Done():
		return nil, false, ctx.Err()
	}
	defer func() { <-s.putSem }()
	first, err := stream.Recv()
	if errors.Is(err, io.EOF) {
		return nil, false, refuse(rpcerr.ErrInvalid, "header: missing (the stream ended before it)")
	}
	if err != nil {
		return nil, false, err
	}
	hdr := first.GetHeader()
	if hdr == nil {
		return nil, false, refuse(rpcerr.ErrInvalid, "header: the first message must be the header, not %s", partName(first.GetPart()))
	}
	if err := checkSnapshotHeader(hdr, s.knownEpoch()); err != nil {
		return nil, false, err
	}
	if err := rpcerr.CheckClusterID("header.cluster_id", hdr.GetClusterId()); err != nil {
		return nil, false, err
	}
	if err := s.guard.Require(hdr.GetClusterId(), "the snapshot's uploader"); err != nil {
		return nil, false, err
	}
	if v := s.vote.Load(); hdr.GetEpoch() < v.Epoch {
		return nil, false, refuse(rpcerr.ErrStaleEpoch, "header.epoch: stale epoch %d, log store is at epoch %d%s", hdr.GetEpoch(), v.Epoch, primaryName(*v))
	}
	if b := s.snaps.find(hdr.GetLsn()); b != nil {
		return b.info(), true, nil
	}
	gen := s.snaps.gen()
	meta, err := s.snapshotMeta(ctx, hdr)
	if err != nil {
		return nil, false, err
	}
	b, err := s.writeSnapshot(stream, meta)
	if err != nil {
		return nil, false, err
	}
	if err := s.listSnapshot(ctx, b, gen); err != nil {
		return nil, false, err
	}
	return b.info(), false, nil
}

// checkSnapshotHeader validates an uploaded header, its epochs against
// known (the log store's newest epoch); the error names the field.
func checkSnapshotHeader(hdr *walshipv1.SnapshotHeader, known uint64) error {
	switch {
	case hdr.GetLsn() == 0:
		return refuse(rpcerr.ErrInvalid, "header.lsn: must be at least 1")
	case hdr.GetEpoch() == 0:
		return refuse(rpcerr.ErrInvalid, "header.epoch: must be at least 1")
	case datadir.CheckEpoch(hdr.GetEpoch(), known, datadir.MaxEpochJump) != nil:
		return refuse(rpcerr.ErrInvalid, "header.epoch: %v", datadir.CheckEpoch(hdr.GetEpoch(), known, datadir.MaxEpochJump))
	case len(hdr.GetHistory()) == 0:
		return refuse(rpcerr.ErrInvalid, "header.history: required (the epochs of the log up to header.lsn)")
	}
	if err := datadir.CheckProto(hdr.GetHistory(), known, datadir.MaxEpochJump); err != nil {
		return refuse(rpcerr.ErrInvalid, "header.history%v", err)
	}
	if h := datadir.HistoryFromProto(hdr.GetHistory()); h.EpochOf(hdr.GetLsn()) == 0 {
		return refuse(rpcerr.ErrInvalid, "header.history: starts at LSN %d, after header.lsn %d", h[0].FirstLSN, hdr.GetLsn())
	}
	return nil
}

// partName names the kind of a snapshot stream message, for errors.
func partName(p any) string {
	switch p.(type) {
	case *walshipv1.PutSnapshotRequest_Header:
		return "a header"
	case *walshipv1.PutSnapshotRequest_Chunk:
		return "a chunk"
	case *walshipv1.PutSnapshotRequest_Trailer:
		return "a trailer"
	}
	return "an empty message"
}

// snapshotMeta is what the log store stores of an uploaded header, once it
// has checked the header against its log: it waits (up to
// snapshotDurableWait) until it holds the header's LSN durably, which must
// end a stored batch, and that batch must be of the epoch the header's
// history gives its LSN — the same entry, so the snapshot is the state of
// this log at that LSN. The epoch and commit time stored are the batch's.
//
// Why only a durable batch end: a restore or a re-seeded replica
// continues from the snapshot with the batch that starts right after it,
// whole; and a snapshot past what the log store holds could be of commits
// a failover later cuts (not durable on a quorum), which this log store
// could then not tell apart from its own log.
func (s *Server) snapshotMeta(ctx context.Context, hdr *walshipv1.SnapshotHeader) (*walshipv1.SnapshotHeader, error) {
	lsn := hdr.GetLsn()
	wctx, cancel := context.WithTimeout(ctx, s.snapshotWait)
	err := s.wal.Wait(wctx, lsn, true)
	cancel()
	if err != nil {
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		if errors.Is(err, context.DeadlineExceeded) {
			return nil, refuse(errPrecondition, "header.lsn: LSN %d is not durable here after %v (durable LSN %d)", lsn, s.snapshotWait, s.durableLSN())
		}
		return nil, s.readErr(err, lsn)
	}
	env, err := s.batchEnding(ctx, lsn)
	if err != nil {
		return nil, err
	}
	if want := datadir.HistoryFromProto(hdr.GetHistory()).EpochOf(lsn); want != env.GetEpoch() {
		return nil, refuse(errPrecondition, "header.history: gives LSN %d to epoch %d, the stored batch %d..%d is of epoch %d: the snapshot is of another history",
			lsn, want, env.GetFirstLsn(), env.GetLastLsn(), env.GetEpoch())
	}
	return &walshipv1.SnapshotHeader{
		Epoch:              env.GetEpoch(),
		Lsn:                lsn,
		Keys:               hdr.GetKeys(),
		ClusterId:          hdr.GetClusterId(),
		CommitTimeUnixNano: env.GetCommitTimeUnixNano(),
		History:            datadir.HistoryFromProto(hdr.GetHistory()).Cut(lsn).Proto(),
	}, nil
}

// batchEnding returns the stored batch that ends at lsn, refusing an LSN
// that is not a batch end the log store holds.
func (s *Server) batchEnding(ctx context.Context, lsn uint64) (*walshipv1.WalBatch, error) {
	if s.wal.FirstLSN() == 0 || lsn > s.durableLSN() {
		return nil, refuse(errPrecondition, "header.lsn: LSN %d is not durable here (durable LSN %d)", lsn, s.durableLSN())
	}
	r, err := s.wal.NewReader(lsn, true)
	if err != nil {
		return nil, s.positionErr(err, lsn)
	}
	defer r.Close()
	e, err := r.Next(ctx)
	if err != nil {
		return nil, s.positionErr(err, lsn)
	}
	if e.LastLSN != lsn {
		return nil, refuse(errPrecondition, "header.lsn: LSN %d is inside the stored batch %d..%d, not at its end", lsn, e.FirstLSN, e.LastLSN)
	}
	var env walshipv1.WalBatch
	if err := envelope.Unmarshal(e.Data, &env); err != nil {
		return nil, refuse(rpcerr.ErrCorrupt, "stored batch LSNs %d..%d is corrupt: %v", e.FirstLSN, e.LastLSN, err)
	}
	return &env, nil
}

// positionErr words a WAL error about a snapshot's LSN: one the log store
// no longer keeps is not a position it can vouch for.
func (s *Server) positionErr(err error, lsn uint64) error {
	if err2 := s.readErr(err, lsn); errors.Is(err2, errOutOfRange) {
		return refuse(errPrecondition, "header.lsn: %v", err2)
	}
	return s.readErr(err, lsn)
}

// writeSnapshot writes the rest of an upload to a temporary file as it
// arrives — meta first, then the pairs through a state.SnapshotEncoder,
// which checks their order and, at the trailer, their count and digest —
// then fsyncs it, renames it into place and fsyncs the directory. Only
// one chunk is in memory at a time. On any failure the temporary file is
// removed.
func (s *Server) writeSnapshot(stream walshipv1.LogStoreService_PutSnapshotServer, meta *walshipv1.SnapshotHeader) (_ *baseSnap, err error) {
	dir := s.snapDir()
	name := baseName(meta.GetLsn())
	tmp := filepath.Join(dir, name+tmpSuffix)
	prefix, err := basesnap.EncodeMeta(meta)
	if err != nil {
		return nil, refuse(rpcerr.ErrInvalid, "header: %v", err)
	}
	f, err := s.fs.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, vfs.FilePerm)
	if err != nil {
		return nil, storeErr(err)
	}
	defer func() {
		if err != nil {
			_ = f.Close()
			_ = s.fs.Remove(tmp)
		}
	}()
	if _, err := f.Write(prefix); err != nil {
		return nil, storeErr(err)
	}
	enc := state.NewSnapshotEncoder(f, meta.GetLsn(), meta.GetKeys())
	digest, err := s.receivePairs(stream, enc, meta.GetKeys())
	if err != nil {
		return nil, err
	}
	if err := f.Sync(); err != nil {
		return nil, storeErr(fmt.Errorf("fsync: %w", err))
	}
	fi, err := f.Stat()
	if err != nil {
		return nil, storeErr(err)
	}
	if err := f.Close(); err != nil {
		return nil, storeErr(err)
	}
	if err := s.fs.Rename(tmp, filepath.Join(dir, name)); err != nil {
		return nil, storeErr(err)
	}
	if err := s.fs.SyncDir(dir); err != nil {
		// Whether the snapshot survives a crash is unknown: it is not
		// stored. (If it does survive, it is whole and fsynced.)
		_ = s.fs.Remove(filepath.Join(dir, name))
		return nil, storeErr(fmt.Errorf("sync dir: %w", err))
	}
	return &baseSnap{lsn: meta.GetLsn(), name: name, hdr: meta, bytes: fi.Size(), stateOff: int64(len(prefix)), digest: digest.String()}, nil
}

// storeErr is a failure to store a snapshot on this log store's disk.
func storeErr(err error) error {
	return fmt.Errorf("%w: store snapshot: %v", rpcerr.ErrUnavailable, err)
}

// receivePairs feeds the chunks of an upload to enc until the trailer,
// and checks that nothing follows it.
func (s *Server) receivePairs(stream walshipv1.LogStoreService_PutSnapshotServer, enc *state.SnapshotEncoder, keys uint64) (state.Digest, error) {
	for {
		m, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			return state.Digest{}, refuse(rpcerr.ErrInvalid, "trailer: missing (the stream ended after %d of %d pairs)", enc.Pairs(), keys)
		}
		if err != nil {
			return state.Digest{}, err
		}
		switch p := m.GetPart().(type) {
		case *walshipv1.PutSnapshotRequest_Chunk:
			for i, kv := range p.Chunk.GetKvs() {
				if err := enc.Add([]byte(kv.GetKey()), kv.GetValue(), kv.GetVersionLsn()); err != nil {
					if errors.Is(err, state.ErrCorruptSnapshot) {
						return state.Digest{}, refuse(rpcerr.ErrInvalid, "chunk.kvs[%d]: %v", i, err)
					}
					return state.Digest{}, storeErr(err)
				}
			}
		case *walshipv1.PutSnapshotRequest_Trailer:
			d, err := enc.Finish(p.Trailer.GetStateDigest())
			switch {
			case errors.Is(err, state.ErrDigestMismatch):
				return state.Digest{}, refuse(rpcerr.ErrCorrupt, "trailer.state_digest: %v", err)
			case errors.Is(err, state.ErrCorruptSnapshot):
				return state.Digest{}, refuse(rpcerr.ErrInvalid, "header.keys: %v", err)
			case err != nil:
				return state.Digest{}, storeErr(err)
			}
			switch m, err := stream.Recv(); {
			case err == nil:
				return state.Digest{}, refuse(rpcerr.ErrInvalid, "trailer: %s after the trailer", partName(m.GetPart()))
			case !errors.Is(err, io.EOF):
				return state.Digest{}, err
			}
			return d, nil
		case *walshipv1.PutSnapshotRequest_Header:
			return state.Digest{}, refuse(rpcerr.ErrInvalid, "header: a second header after %d pairs", enc.Pairs())
		default:
			return state.Digest{}, refuse(rpcerr.ErrInvalid, "part: an empty message after %d pairs", enc.Pairs())
		}
	}
}

// listSnapshot lists a stored snapshot. If the log was cut since the
// snapshot was checked against it, it is checked again first: a snapshot
// of entries the cut removed is removed too.
func (s *Server) listSnapshot(ctx context.Context, b *baseSnap, gen uint64) error {
	for {
		s.snaps.mu.Lock()
		if s.snaps.cutGen == gen {
			s.snaps.insertLocked(b)
			s.snaps.mu.Unlock()
			// A newer snapshot may let retention cut what it held.
			select {
			case s.ret.kick <- struct{}{}:
			default:
			}
			return nil
		}
		gen = s.snaps.cutGen
		s.snaps.mu.Unlock()
		env, err := s.batchEnding(ctx, b.lsn)
		if err == nil && env.GetEpoch() != b.hdr.GetEpoch() {
			err = refuse(errPrecondition, "header.lsn: the log was cut during the upload; LSN %d is now of epoch %d, not %d", b.lsn, env.GetEpoch(), b.hdr.GetEpoch())
		}
		if err != nil {
			s.removeSnapshots([]*baseSnap{b}, "the log was cut during its upload")
			return err
		}
	}
}

// GetSnapshot streams the newest stored snapshot at or before
// at_most_lsn. The snapshot, and the log after it, are pinned against
// retention until the stream ends: a reader that opens its Read from the
// snapshot's LSN + 1 before this stream ends keeps both.
func (h *logStoreServer) GetSnapshot(req *walshipv1.GetSnapshotRequest, stream walshipv1.LogStoreService_GetSnapshotServer) error {
	s := h.s
	if err := s.openCall(); err != nil {
		return toStatus(err)
	}
	defer s.active.Done()
	ctx, done := s.callContext(stream.Context())
	defer done()
	err := s.getSnapshot(ctx, req, stream)
	if err != nil && ctx.Err() != nil && stream.Context().Err() == nil {
		err = errStopping
	}
	return toStatus(err)
}

func (s *Server) getSnapshot(ctx context.Context, req *walshipv1.GetSnapshotRequest, stream walshipv1.LogStoreService_GetSnapshotServer) error {
	if err := rpcerr.CheckClusterID("cluster_id", req.GetClusterId()); err != nil {
		return err
	}
	if err := s.guard.Check(req.GetClusterId(), "the request"); err != nil {
		return err
	}
	b, p, err := s.pinSnapshot(req.GetAtMostLsn())
	if err != nil {
		return err
	}
	defer s.pins.release(p)
	if err := stream.Send(&walshipv1.GetSnapshotResponse{Part: &walshipv1.GetSnapshotResponse_Header{
		Header: proto.Clone(b.hdr).(*walshipv1.SnapshotHeader)}}); err != nil {
		return err
	}
	chunks := snapchunk.New(snapshotChunkBytes)
	flush := func() error {
		size := chunks.Size()
		ch := chunks.Take()
		if ch == nil {
			return nil
		}
		err := stream.Send(&walshipv1.GetSnapshotResponse{Part: &walshipv1.GetSnapshotResponse_Chunk{Chunk: ch}})
		s.metrics.snapshotSentBytes.Add(float64(size))
		return err
	}
	d, err := scanBase(s.fs, s.snapDir(), b, func(k, v []byte, ver uint64) error {
		if chunks.Add(k, v, ver) {
			if err := flush(); err != nil {
				return err
			}
		}
		return ctx.Err()
	})
	if errors.Is(err, basesnap.ErrBad) {
		// Everything sent so far goes unconfirmed: no trailer follows.
		return refuse(rpcerr.ErrCorrupt, "stored snapshot at LSN %d is damaged: %v", b.lsn, err)
	}
	if err != nil {
		return err
	}
	if err := flush(); err != nil {
		return err
	}
	if !s.snaps.has(b) {
		return refuse(rpcerr.ErrUnavailable, "the snapshot at LSN %d was removed while it was read (the log was cut before it); ask again", b.lsn)
	}
	s.metrics.snapshotsServed.Inc()
	return stream.Send(&walshipv1.GetSnapshotResponse{Part: &walshipv1.GetSnapshotResponse_Trailer{
		Trailer: &walshipv1.SnapshotTrailer{StateDigest: d.String()}}})
}

// pinSnapshot picks the newest snapshot at or before atMost (0: the
// newest) and pins it, and the log after it, against retention.
func (s *Server) pinSnapshot(atMost uint64) (*baseSnap, *pin, error) {
	s.pins.mu.Lock()
	defer s.pins.mu.Unlock()
	list := s.snaps.snapshot()
	if len(list) == 0 {
		return nil, nil, refuse(errNotFound, "no snapshot is stored")
	}
	var b *baseSnap
	for _, x := range list {
		if atMost == 0 || x.lsn <= atMost {
			b = x
		}
	}
	if b == nil {
		return nil, nil, refuse(errOutOfRange, "at_most_lsn: no snapshot at or before LSN %d (the oldest stored is at LSN %d)", atMost, list[0].lsn)
	}
	return b, s.pins.addLocked(b.lsn + 1), nil
}
