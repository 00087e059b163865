package replica

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"sync/atomic"
	"time"

	walshipv1 "github.com/walship/walship/gen/walship/v1"
	"github.com/walship/walship/internal/datadir"
	"github.com/walship/walship/internal/pace"
	"github.com/walship/walship/internal/recovery"
	"github.com/walship/walship/internal/rpcerr"
	"github.com/walship/walship/internal/state"
	"github.com/walship/walship/internal/wal"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"
)

// logStore is one log store dialled: of Config.LogStores, or of the
// contract in the log (logStoreSets).
type logStore struct {
	addr   string
	conn   *grpc.ClientConn
	client walshipv1.LogStoreServiceClient
}

// logStoreStatusTimeout bounds the Status call that asks a log store what
// it holds before the rung reads from it.
const logStoreStatusTimeout = 3 * time.Second

// readLogStore is the logstore rung: it asks every log store what it
// holds and reads from the replica's next LSN from one that holds it — the
// one reaching furthest first, then the next if a read fails or supplies
// nothing. progress reports whether any batch was applied; without
// progress the ladder goes on to a snapshot.
func (s *Server) readLogStore(ctx context.Context) (progress bool, err error) {
	next := s.wal.LastLSN() + 1
	type candidate struct {
		ls *logStore
		st *walshipv1.LogStoreServiceStatusResponse
	}
	var cands []candidate
	var errs []error
	for _, ls := range s.logStoresOf(s.logStoreSets()) {
		st, err := s.logStoreHolds(ctx, ls, next)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		cands = append(cands, candidate{ls, st})
	}
	slices.SortStableFunc(cands, func(a, b candidate) int { return cmp.Compare(b.st.GetDurableLsn(), a.st.GetDurableLsn()) })
	for _, c := range cands {
		if ctx.Err() != nil {
			break
		}
		progress, err := s.readFrom(ctx, c.ls)
		if progress {
			return true, err
		}
		s.logger.Warn("the log store could not supply the LSN this replica needs; trying the next", "logstore", c.ls.addr, "next_lsn", next, "err", err)
		errs = append(errs, err)
	}
	if len(errs) == 0 {
		errs = append(errs, errors.New("no log store is configured"))
	}
	return false, errors.Join(errs...)
}

// logStoreHolds asks ls whether it can supply next: it holds it, and it
// has promised this replica's epoch — one that has not has not heard from
// its primary, and what it holds past the last common point may be a
// deposed primary's tail.
func (s *Server) logStoreHolds(ctx context.Context, ls *logStore, next uint64) (*walshipv1.LogStoreServiceStatusResponse, error) {
	sctx, cancel := context.WithTimeout(ctx, logStoreStatusTimeout)
	defer cancel()
	st, err := ls.client.Status(sctx, &walshipv1.LogStoreServiceStatusRequest{})
	// A log store that states no id, to a replica that has one, holds a
	// log of no cluster's or of an older one's: not taken either.
	mismatch := rpcerr.RequirePeer("replica", s.cluster.ID(), "the log store "+ls.addr, st.GetClusterId())
	switch v := s.Vote(); {
	case err != nil:
		return nil, fmt.Errorf("the log store %s: status: %w", ls.addr, err)
	case mismatch != nil:
		s.metrics.clusterMismatch.Inc()
		return nil, fmt.Errorf("%w (check --logstore)", mismatch)
	case st.GetVoteEpoch() < v.Epoch:
		return nil, fmt.Errorf("the log store %s is at epoch %d, older than this replica's %d: it may hold a deposed primary's tail", ls.addr, st.GetVoteEpoch(), v.Epoch)
	case st.GetFirstLsn() == 0 || st.GetFirstLsn() > next || st.GetDurableLsn() < next:
		return nil, fmt.Errorf("the log store %s holds LSNs %d..%d, not LSN %d", ls.addr, st.GetFirstLsn(), st.GetDurableLsn(), next)
	}
	return st, nil
}

// readFrom reads from the replica's next LSN to ls's end (no follow),
// checking, writing, syncing and applying each batch as if it came from
// the primary.
func (s *Server) readFrom(ctx context.Context, ls *logStore) (progress bool, err error) {
	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	from := s.wal.LastLSN() + 1
	stream, err := ls.client.Read(rctx, &walshipv1.ReadRequest{FromLsn: from, ClusterId: s.cluster.ID()})
	if err != nil {
		return false, err
	}
	recv := silenceGuard(s.silence(), cancel, "the log store "+ls.addr, stream.Recv)
	lp := s.newLearnerPace()
	defer lp.stop()
	applied := 0
	defer func() {
		if applied > 0 {
			s.logger.Info("caught up from the log store", "logstore", ls.addr, "from_lsn", from, "to_lsn", s.appliedLSN(), "batches", applied)
		}
	}()
	for {
		resp, err := recv()
		if errors.Is(err, io.EOF) {
			if applied == 0 {
				return false, fmt.Errorf("the log store %s has nothing from LSN %d on", ls.addr, from)
			}
			return true, nil
		}
		if err != nil {
			return applied > 0, fmt.Errorf("the log store %s: %w", ls.addr, err)
		}
		s.lag.contact(s.now())
		env := resp.GetBatch()
		if env != nil && env.GetLastLsn() <= s.wal.LastLSN() && env.GetFirstLsn() > 0 {
			continue // already held (a store may start a little earlier)
		}
		if err := lp.wait(rctx, env); err != nil {
			return applied > 0, err
		}
		n, err := s.process([]*walshipv1.WalBatch{env}, nil)
		applied += n
		if err != nil {
			return applied > 0, err
		}
	}
}

// learnerPace paces a log store catch-up while this node is not a
// voter (Config.LearnerBytesPerSecond).
type learnerPace struct {
	s       *Server
	b       *pace.Bucket // nil: no limit
	t       *time.Timer
	paced   bool
	batches int
}

func (s *Server) newLearnerPace() *learnerPace {
	lp := &learnerPace{s: s}
	if rate := s.cfg.LearnerBytesPerSecond; rate > 0 {
		lp.b = pace.New(rate, 64<<10, time.Now())
		lp.t = time.NewTimer(time.Hour)
		lp.t.Stop()
	}
	return lp
}

// wait waits until batch may be processed: at once unless a limit is set
// and the newest contract the node holds names members and not it (looked
// at again every 64 batches: the records it reads may change it).
func (lp *learnerPace) wait(ctx context.Context, batch *walshipv1.WalBatch) error {
	if lp.b == nil {
		return nil
	}
	if lp.batches%64 == 0 {
		was := lp.paced
		lp.paced = !votes(lp.s.EpochRecord().GetContract(), lp.s.cfg.ID)
		if lp.paced != was {
			lp.s.logger.Info("log store catch-up pacing", "paced", lp.paced, "bytes_per_second", lp.s.cfg.LearnerBytesPerSecond)
		}
	}
	lp.batches++
	if !lp.paced {
		return nil
	}
	d, err := lp.b.Wait(ctx, lp.t, proto.Size(batch))
	lp.s.metrics.pacedSeconds.Add(d.Seconds())
	return err
}

func (lp *learnerPace) stop() {
	if lp.t != nil {
		lp.t.Stop()
	}
}

// votes reports whether node id's acks count under contract c: c names no
// members (every replica counts), or names id a member of it or of its
// next configuration. A learner's do not.
func votes(c *walshipv1.Contract, id string) bool {
	if len(c.GetMembers()) == 0 {
		return true
	}
	for _, m := range append(c.GetMembers(), c.GetNext().GetMembers()...) {
		if m.GetId() == id {
			return true
		}
	}
	return false
}

// silenceGuard wraps a stream's Recv: one that brings nothing for as long
// as the replication stream's watchdog allows (a peer whose handler stalls
// while TCP and keepalives stay healthy) cancels the stream, and returns
// an error naming who went silent, so that the follower moves on instead of
// waiting forever. The time between Recvs (processing) is not counted. One
// timer serves the whole stream, re-armed around each Recv.
func silenceGuard[M any](silence time.Duration, cancel context.CancelFunc, who string, recv func() (M, error)) func() (M, error) {
	var fired atomic.Bool
	t := time.AfterFunc(time.Hour, func() { fired.Store(true); cancel() })
	t.Stop()
	return func() (M, error) {
		t.Reset(silence)
		m, err := recv()
		t.Stop()
		if err != nil && fired.Load() {
			err = fmt.Errorf("%s sent nothing for %v: %w", who, silence, err)
		}
		return m, err
	}
}

// errSnapshot marks a snapshot stream that broke the protocol.
var errSnapshot = errors.New("bad snapshot stream")

// reseed is the snapshot rung. It first asks the log stores, in turn, for
// a base snapshot newer than this replica's state, and the log stores'
// batches after it: re-seeding without loading the primary, which streams
// its whole state otherwise. Only if no log store can (none configured,
// none stored, not newer, or it fails) does it ask the primary. A re-seed
// that must move the state backwards (after a divergence) asks the
// primary: its state is the one to go back to.
func (s *Server) reseed(ctx context.Context) (bool, error) {
	if !s.follower.reseedBack {
		for _, ls := range s.logStoresOf(s.logStoreSets()) {
			ok, err := s.reseedFromLogStore(ctx, ls.addr, ls.client)
			if ok {
				return true, err
			}
			if ctx.Err() != nil {
				return false, ctx.Err()
			}
			s.logger.Info("not re-seeding from this log store", "logstore", ls.addr, "why", err)
		}
	}
	return s.reseedFromPrimary(ctx)
}

// reseedFromLogStore re-seeds from the newest base snapshot the log store
// at addr holds at or before its durable LSN, if it is newer than this
// replica's state, then reads the log store's batches after it (the log
// store rung, from the snapshot on). It reports whether the replica was
// re-seeded; its error says why not. It takes the log store as an
// argument so that it can be tried on each of several.
func (s *Server) reseedFromLogStore(ctx context.Context, addr string, ls walshipv1.LogStoreServiceClient) (bool, error) {
	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	start := time.Now()
	st, err := ls.Status(rctx, &walshipv1.LogStoreServiceStatusRequest{})
	if err != nil {
		return false, err
	}
	// As on the log store rung: one that has not promised this replica's
	// epoch may hold a deposed primary's tail, and snapshots of it.
	if v := s.Vote(); st.GetVoteEpoch() < v.Epoch {
		return false, fmt.Errorf("the log store %s is at epoch %d, older than this replica's %d", addr, st.GetVoteEpoch(), v.Epoch)
	}
	if err := s.checkPeerCluster(st.GetClusterId(), "cluster_id", "the log store "+addr); err != nil {
		return false, err
	}
	applied := s.appliedLSN()
	newest := uint64(0)
	for _, si := range st.GetSnapshots() {
		if si.GetLsn() <= st.GetDurableLsn() {
			newest = max(newest, si.GetLsn())
		}
	}
	if newest <= applied {
		return false, fmt.Errorf("the log store %s holds no snapshot newer than this replica's applied LSN %d", addr, applied)
	}
	stream, err := ls.GetSnapshot(rctx, &walshipv1.GetSnapshotRequest{AtMostLsn: st.GetDurableLsn(), ClusterId: s.cluster.ID()})
	if err != nil {
		return false, err
	}
	recv := silenceGuard(s.silence(), cancel, "the log store "+addr+"'s snapshot stream", stream.Recv)
	first, err := recv()
	if err != nil {
		return false, fmt.Errorf("snapshot header: %w", err)
	}
	hdr := first.GetHeader()
	if hdr == nil {
		return false, fmt.Errorf("%w: first message is not a header", errSnapshot)
	}
	// The header's epoch is that of the batch ending at its LSN: the
	// newest entry this replica's log will hold. A log whose newest entry
	// is of a newer epoch than that, at a lower LSN, is of another history.
	if err := datadir.CheckEpoch(hdr.GetEpoch(), s.Vote().Epoch, datadir.MaxEpochGap); err != nil {
		return false, fmt.Errorf("the log store's snapshot at LSN %d: header.epoch: %w", hdr.GetLsn(), err)
	}
	if e := s.epoch.Load(); hdr.GetEpoch() < e {
		return false, fmt.Errorf("the log store's snapshot at LSN %d is of epoch %d, this replica's log is at epoch %d", hdr.GetLsn(), hdr.GetEpoch(), e)
	}
	if hdr.GetLsn() <= applied {
		return false, fmt.Errorf("the log store's snapshot at LSN %d is not newer than this replica's applied LSN %d", hdr.GetLsn(), applied)
	}
	if err := s.checkPeerCluster(hdr.GetClusterId(), "header.cluster_id", "the log store "+addr+"'s snapshot"); err != nil {
		return false, err
	}
	if err := s.adoptCluster(hdr.GetClusterId(), "the log store "+addr+"'s snapshot"); err != nil {
		return false, err
	}
	s.logger.Info("re-seeding from the log store's snapshot", "logstore", addr, "lsn", hdr.GetLsn(), "keys", hdr.GetKeys(), "epoch", hdr.GetEpoch())
	store, err := buildSnapshot(s, hdr, recv)
	if err != nil {
		return false, err
	}
	if err := s.install(store, hdr.GetEpoch()); err != nil {
		return false, err
	}
	s.rd.committed(hdr.GetCommitLsn())
	s.logger.Info("re-seeded from the log store's snapshot", "logstore", addr, "lsn", hdr.GetLsn(), "keys", hdr.GetKeys(), "took", time.Since(start))
	// Then what the log store holds after it, rather than from the primary.
	if _, err := s.readLogStore(ctx); err != nil && !errors.Is(err, errFatal) {
		s.logger.Info("read nothing more from the log store after its snapshot", "err", err)
	} else if err != nil {
		return true, err
	}
	return true, nil
}

// snapshotPart is a message of a snapshot stream, the primary's
// (SnapshotResponse) or a log store's (GetSnapshotResponse).
type snapshotPart interface {
	GetChunk() *walshipv1.SnapshotChunk
	GetTrailer() *walshipv1.SnapshotTrailer
}

// buildSnapshot receives the chunks and the trailer that follow hdr and
// builds the store they describe, checking order, count and digest.
func buildSnapshot[M snapshotPart](s *Server, hdr *walshipv1.SnapshotHeader, recv func() (M, error)) (*state.Store, error) {
	b := state.NewBuilder(hdr.GetLsn())
	for {
		m, err := recv()
		if err != nil {
			if errors.Is(err, io.EOF) {
				err = fmt.Errorf("%w: ended without a trailer (%v)", errSnapshot, b)
			}
			return nil, err
		}
		s.lag.contact(s.now())
		if tr := m.GetTrailer(); tr != nil {
			st, err := b.Finish(hdr.GetKeys(), tr.GetStateDigest())
			if err != nil {
				return nil, fmt.Errorf("%w: %w", errSnapshot, err)
			}
			return st, nil
		}
		chunk := m.GetChunk()
		if chunk == nil {
			return nil, fmt.Errorf("%w: a message that is neither a chunk nor a trailer after the header", errSnapshot)
		}
		for _, kv := range chunk.GetKvs() {
			if err := b.Add([]byte(kv.GetKey()), kv.GetValue(), kv.GetVersionLsn()); err != nil {
				return nil, fmt.Errorf("%w: %w", errSnapshot, err)
			}
		}
	}
}

// reseedFromPrimary streams the primary's state, builds a new store from
// it (checking order, count and digest), saves it as a snapshot, resets
// the WAL to continue right after it, and swaps it in for readers.
func (s *Server) reseedFromPrimary(ctx context.Context) (bool, error) {
	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	start := time.Now()
	repl, err := s.replClient()
	if err != nil {
		return false, err
	}
	stream, err := repl.Snapshot(rctx, &walshipv1.SnapshotRequest{ReplicaId: s.cfg.ID, ClusterId: s.cluster.ID()})
	if err != nil {
		return false, err
	}
	recv := silenceGuard(s.silence(), cancel, "the primary's snapshot stream", stream.Recv)
	first, err := recv()
	if err != nil {
		return false, fmt.Errorf("snapshot header: %w", err)
	}
	hdr := first.GetHeader()
	if hdr == nil {
		return false, fmt.Errorf("%w: first message is not a header", errSnapshot)
	}
	if err := s.checkPeerCluster(hdr.GetClusterId(), "header.cluster_id", "the primary's snapshot"); err != nil {
		return false, err
	}
	if err := datadir.CheckEpoch(hdr.GetEpoch(), s.Vote().Epoch, datadir.MaxEpochJump); err != nil {
		return false, &refusal{reason: reasonEpoch, err: fmt.Errorf("snapshot header.epoch: %w", err)}
	}
	if e := s.epoch.Load(); hdr.GetEpoch() < e {
		return false, &refusal{reason: reasonEpoch, err: fmt.Errorf("snapshot from epoch %d, this replica has seen epoch %d", hdr.GetEpoch(), e)}
	}
	if applied := s.appliedLSN(); hdr.GetLsn() < applied && !s.follower.reseedBack {
		// Taking it would move reads backwards; the primary's state will
		// move past ours soon enough.
		return false, fmt.Errorf("%w: snapshot at LSN %d is behind this replica's applied LSN %d", errSnapshot, hdr.GetLsn(), applied)
	}
	if err := s.adoptCluster(hdr.GetClusterId(), "the primary's snapshot"); err != nil {
		return false, err
	}
	s.logger.Info("re-seeding from the primary's snapshot", "lsn", hdr.GetLsn(), "keys", hdr.GetKeys(), "epoch", hdr.GetEpoch())
	st, err := buildSnapshot(s, hdr, recv)
	if err != nil {
		return false, err
	}
	if err := s.install(st, hdr.GetEpoch()); err != nil {
		return false, err
	}
	s.rd.committed(hdr.GetCommitLsn())
	s.logger.Info("re-seeded from the primary's snapshot", "lsn", hdr.GetLsn(), "keys", hdr.GetKeys(), "took", time.Since(start))
	return true, nil
}

// install makes st the replica's state: saved as a snapshot first, then the
// WAL reset to start right after it (New finishes the reset if a crash falls
// in between), then swapped in for readers. The snapshot's epoch is adopted
// last: a replica that still says the old epoch, its WAL not yet reset (a
// step failed, or a crash), is told again that it diverged and re-seeds
// again, where one in the new epoch with the diverged tail still in its
// WAL would be streamed to from its end.
func (s *Server) install(st *state.Store, epoch uint64) error {
	s.snapMu.Lock()
	defer s.snapMu.Unlock()
	lsn := st.AppliedLSN()
	if s.follower.reseedBack {
		// Moving backwards: first lower the applied marker, then remove
		// the newer snapshots — they hold entries the primary lost — so
		// that no restart replays or loads them. Not readable: the new
		// primary has not said that its state at lsn is acknowledged.
		if err := s.writeAppliedMarker(datadir.AppliedMarker{LSN: lsn}, true); err != nil {
			return fmt.Errorf("lower the applied marker to LSN %d: %w", lsn, err)
		}
		if err := state.RemoveSnapshotsAbove(s.fs, s.snapDir(), lsn); err != nil {
			return err
		}
	}
	path, err := state.SaveSnapshot(s.fs, s.snapDir(), st.Snapshot())
	if err != nil && path == "" {
		return fmt.Errorf("save re-seeded state: %w", err)
	}
	s.walMu.Lock()
	err = s.wal.Reset(lsn + 1)
	s.walMu.Unlock()
	if err != nil {
		return fmt.Errorf("%w: reset wal to LSN %d: %w", errFatal, lsn+1, err)
	}
	if err := s.resetHistory(epoch, lsn); err != nil {
		return fmt.Errorf("%w: %w", errFatal, err)
	}
	s.dropUnapplied(len(s.follower.unapplied))
	if s.follower.reseedBack {
		// What the old primary reported durable above lsn was of the
		// history it lost; the new one has said nothing yet.
		s.follower.primaryDurable = lsn
	} else {
		s.follower.primaryDurable = max(s.follower.primaryDurable, lsn)
	}
	s.store.Store(st)
	s.rescanHeldRecords() // nothing is held: the snapshot's record is the newest
	s.feed.Reset(lsn)
	if s.follower.reseedBack {
		s.rd.back(st.Snapshot())
	} else {
		s.rd.reset(st.Snapshot())
	}
	if s.follower.reseedBack {
		s.visible.Reset(lsn)
		s.lag.reset(lsn)
		s.follower.reseedBack = false
	}
	s.visible.Advance(lsn)
	s.lag.advance(lsn)
	// The WAL holds nothing before lsn+1 now, so the older snapshot can no
	// longer be replayed from: the next truncation may keep from lsn+1.
	s.prevSnapshotLSN = lsn
	s.snapshotLSN.Store(lsn)
	s.saveAppliedMarker(true)
	s.snaps.Taken(int64(s.wal.Stats().BytesWritten), recovery.FileSize(s.fs, path))
	return nil
}

// divergedError is a Diverged answer from the primary.
type divergedError struct {
	keep, epoch uint64
}

func (d *divergedError) Error() string {
	return fmt.Sprintf("the primary (epoch %d) does not have this replica's entries after LSN %d: they were lost by a crash before they were durable there", d.epoch, d.keep)
}

// cutDiverged removes the replica's entries after keep. It returns false
// when it cannot — the replica applied some of them (it replayed its own
// log after a restart), or keep falls inside an entry — so that only a
// re-seed can undo them; the entries are kept in an orphan file first
// either way.
func (s *Server) cutDiverged(keep uint64) (bool, error) {
	if applied := s.appliedLSN(); applied > keep {
		// Only a re-seed can undo what was applied; what the log holds
		// past the cut is kept first (best effort: the re-seed resets it).
		s.walMu.Lock()
		if _, err := s.orphanAfter(keep); err != nil {
			s.logger.Warn("cannot keep the entries past the cut in an orphan file before re-seeding", "truncate_after_lsn", keep, "err", err)
		}
		s.walMu.Unlock()
		s.follower.reseedBack = true
		return false, nil
	}
	s.walMu.Lock()
	between, err := s.orphanAfter(keep)
	if err == nil && between {
		err = s.wal.TruncateAfter(keep)
	}
	if err == nil && between {
		h := logHistory(*s.history.Load(), keep)
		if err = datadir.SaveHistory(s.fs, s.cfg.DataDir, h); err == nil {
			s.history.Store(&h)
			s.epoch.Store(h.Current().Epoch)
		}
	}
	s.walMu.Unlock()
	if errors.Is(err, wal.ErrBroken) {
		return false, fmt.Errorf("%w: cut the log after LSN %d: %w", errFatal, keep, err)
	}
	if err != nil || !between {
		// The primary's cut does not fall between this log's entries: the
		// logs differ in a way a cut cannot mend.
		if err == nil {
			err = fmt.Errorf("LSN %d is inside an entry", keep)
		}
		s.logger.Warn("cannot cut the log where the primary says; re-seeding", "truncate_after_lsn", keep, "err", err)
		s.follower.reseedBack = true
		return false, nil
	}
	n := len(s.follower.unapplied)
	for n > 0 && s.follower.unapplied[n-1].env.GetFirstLsn() > keep {
		n--
	}
	s.forgetUnapplied(s.follower.unapplied[n:])
	clear(s.follower.unapplied[n:])
	s.follower.unapplied = s.follower.unapplied[:n]
	s.rescanHeldRecords()
	// A durable LSN above keep was reported of the lost history.
	s.follower.primaryDurable = min(s.follower.primaryDurable, keep)
	return true, nil
}

// orphanAfter copies the log's entries after keep into an orphan file
// before they are cut or re-seeded away (walMu held): nothing cut is ever
// deleted. An entry that holds LSNs on both sides of keep is kept whole.
// between reports whether keep falls between entries (or past the log's
// end): only there can the log be cut.
func (s *Server) orphanAfter(keep uint64) (between bool, err error) {
	from, err := s.entryHolding(keep + 1)
	if err != nil {
		return false, err
	}
	o, n, err := datadir.OrphanTail(s.fs, s.cfg.DataDir, s.wal, from-1, s.now())
	if err != nil {
		return false, err
	}
	if n > 0 {
		s.metrics.orphaned.Add(float64(n))
		s.logger.Warn("cut entries the primary's history does not have; kept in an orphan file", "truncate_after_lsn", keep, "records", n, "orphan", o.Name)
	}
	return from == keep+1, nil
}

// entryHolding returns the first LSN of the log's entry that holds lsn
// (lsn itself past the log's end).
func (s *Server) entryHolding(lsn uint64) (uint64, error) {
	if lsn > s.wal.LastLSN() {
		return lsn, nil
	}
	rd, err := s.wal.NewReader(lsn, false)
	if err != nil {
		return 0, fmt.Errorf("find the entry holding LSN %d: %w", lsn, err)
	}
	defer rd.Close()
	// The entry is written: Next does not wait for it; the timeout only
	// turns a bug into an error.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	e, err := rd.Next(ctx)
	if err != nil {
		return 0, fmt.Errorf("find the entry holding LSN %d: %w", lsn, err)
	}
	return e.FirstLSN, nil
}
