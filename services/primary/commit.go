package primary

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"slices"
	"sync/atomic"
	"time"

	walshipv1 "github.com/walship/walship/gen/walship/v1"
	"github.com/walship/walship/internal/envelope"
	"github.com/walship/walship/internal/rpcerr"
	"github.com/walship/walship/internal/wal"
	"github.com/walship/walship/pkg/codec"
)

// txn is one sequenced transaction on its way through the commit pipeline:
// sequenced (LSNs assigned, writes staged in the overlay) → written (and
// synced, if its policy asks) by the committer or the syncer → acknowledged
// at its policy's level → resolved, after which it can become visible.
type txn struct {
	recs      []codec.Record // puts/deletes then one commit record
	commitLSN uint64
	policy    Policy
	// local receives the writer's verdict, once (decide): nil once the txn
	// is in the WAL (synced if policy.needsLocalSync()), else the WAL's
	// error. Buffered.
	local    chan error
	decided  atomic.Bool
	start    time.Time
	resolved bool // guarded by Server.visMu
	// shown is closed once commitLSN is visible, for a writer that resolved
	// before an earlier transaction did (nil until then). Guarded by visMu.
	shown chan struct{}
}

// decide delivers t's verdict. Only the first counts: when the WAL fails,
// the committer and the syncer may both fail the same transaction.
func (t *txn) decide(err error) {
	if t.decided.CompareAndSwap(false, true) {
		t.local <- err
	}
}

func (t *txn) bytes() int {
	n := 0
	for i := range t.recs {
		n += len(t.recs[i].Key) + len(t.recs[i].Value) + 16
	}
	return n
}

// errStopping is returned to writes that arrive during a graceful stop.
var errStopping = fmt.Errorf("%w: primary is shutting down", rpcerr.ErrUnavailable)

// enqueueLocked hands a sequenced transaction to its writer: the syncer,
// which writes it with the rest of its group right before their fsync, if
// it needs one; the committer, which writes it at once, if not. Called with
// seqMu held.
func (s *Server) enqueueLocked(t *txn) {
	s.queue = append(s.queue, t)
	s.visMu.Lock()
	s.unresolved = append(s.unresolved, t)
	s.visMu.Unlock()
	if t.policy.needsLocalSync() {
		s.queuedSync.Add(1)
		poke(s.syncKick)
		return
	}
	poke(s.kick)
}

// takeQueue takes every queued transaction, leaving spare (emptied) in its
// place. The caller holds writeMu and writes them before releasing it, so
// that entries reach the WAL in LSN order.
func (s *Server) takeQueue(spare []*txn) []*txn {
	s.seqMu.Lock()
	defer s.seqMu.Unlock()
	q := s.queue
	s.queue = spare[:0]
	s.queuedSync.Store(0)
	return q
}

// committer writes the transactions that need no local fsync as soon as
// they are queued (with whatever is queued with them): it takes every
// queued transaction, builds batches of whole transactions, encodes each
// batch once and writes them with one call. It runs the syncer goroutine,
// which writes the transactions that need an fsync as a group right before
// it (writeMu serialises the two writers). Async commits are acknowledged
// after the write and synced by the flush timer within AsyncFlushInterval.
// A WAL error is fatal: every waiting and later commit fails with it and
// committer returns it. When ctx ends (after the gRPC server has drained
// every call), it commits what is left, has the syncer sync it, and
// returns.
func (s *Server) committer(ctx context.Context) error {
	flush := time.NewTimer(time.Hour)
	flush.Stop()
	defer flush.Stop()
	syncCtx, stopSyncer := context.WithCancel(context.Background())
	defer stopSyncer()
	syncerDone := make(chan error, 1)
	go func() { syncerDone <- s.syncer(syncCtx) }()
	// finish stops the syncer after its last fsync and returns the first error.
	finish := func(err error) error {
		stopSyncer()
		if serr := <-syncerDone; err == nil {
			err = serr
		}
		return err
	}
	armed := false
	var spare []*txn
	for {
		stop, due := false, false
		select {
		case <-s.kick:
		case <-flush.C:
			armed, due = false, true
		case <-ctx.Done():
			stop = true
		case cut := <-s.truncate:
			// Retention, serialised with the writes by writeMu.
			s.truncateWAL(cut)
		case err := <-syncerDone:
			// A write or an fsync of the syncer's failed; its waiters
			// have the error.
			s.fail(err, nil)
			return err
		case <-s.failed:
			// Another path failed the log (retention's directory fsync,
			// applying to the state): Run stops the primary.
			s.seqMu.Lock()
			err := s.broken
			s.seqMu.Unlock()
			return finish(err)
		}
		async, needSync, err := s.writeQueue(&spare)
		if err != nil {
			return finish(err)
		}
		if needSync {
			poke(s.syncKick)
		}
		if async && !armed {
			flush.Reset(s.cfg.AsyncFlushInterval)
			armed = true
		}
		if due {
			// The flush window is over: sync what async commits wrote,
			// even while more keep arriving.
			poke(s.flushReq)
		}
		if stop {
			return finish(nil)
		}
	}
}

// syncer owns the WAL's fsyncs. Woken by a transaction that needs one, it
// gathers its group (gatherSiblings), writes what is queued, syncs
// everything written so far and acknowledges the waiting transactions it
// covered; while any still wait (queued or written during that fsync), it
// goes again at once. The next group thus queues while an fsync runs, and
// the next fsync covers all of it (pebble's LogWriter, PostgreSQL's
// walwriter). A flush request (the async window) syncs once. When ctx ends
// it syncs what is left and returns. A failed write or fsync fails every
// waiter and is returned.
func (s *Server) syncer(ctx context.Context) error {
	var spare []*txn
	for {
		stop := false
		select {
		case <-s.syncKick:
		case <-s.flushReq:
		case <-ctx.Done():
			stop = true
		}
		for first := true; first || s.syncWaiting() > 0; first = false {
			if !stop {
				s.gatherSiblings()
			}
			// Async commits queued with the group are acknowledged at the
			// write, as the committer's are, and synced by the fsync below.
			if _, _, err := s.writeQueue(&spare); err != nil {
				return err
			}
			// The write woke the replica and log store streams, and the
			// fsync below would hold this goroutine's P until the runtime
			// notices the syscall: let them send first, so that the
			// replicas' write and fsync overlap the primary's.
			runtime.Gosched()
			s.askReplicaFlush(s.wal.LastLSN())
			err := s.syncWAL()
			// A batch written while the ask above was made, and synced by
			// this fsync, is asked for now: no later fsync will.
			s.askReplicaFlush(s.wal.DurableLSN())
			if acked := s.wakeDurable(err); acked > 0 {
				s.noteCycle(acked + s.syncWaiting())
			}
			if err != nil {
				return err
			}
		}
		if stop {
			return nil
		}
	}
}

// writeQueue takes every queued transaction and writes it, under writeMu,
// with *spare as the queue's next array (the taken one becomes the next
// spare, even when empty). The syncer calls it right before each fsync, so
// that a group of durable commits becomes one entry (up to MaxBatchBytes);
// the committer when a commit needs no fsync. It reports commit's async and
// needSync; a failed write fails the transactions and is returned.
func (s *Server) writeQueue(spare *[]*txn) (async, needSync bool, err error) {
	s.writeMu.Lock()
	defer s.writeMu.Unlock()
	batch := s.takeQueue(*spare)
	defer func() {
		clear(batch)
		*spare = batch
	}()
	if len(batch) == 0 {
		return false, false, nil
	}
	if async, needSync, err = s.commit(batch); err != nil {
		s.fail(err, batch)
		return false, false, err
	}
	// Once per group commit, not once per transaction.
	s.maybeSnapshot()
	return async, needSync, nil
}

// askReplicaFlush asks replicas to flush the batches of the group about to
// be fsynced that hold commits waiting for them (groupWanted). Their
// fsyncs then run alongside the primary's, one per group: the batches were
// shipped as they were written, without asking for an ack, while the group
// gathered. A replica asked per batch would fsync at the group's first
// batch and again for the rest — more flushes of a disk the primary may
// share, each costing CPU, for a later ack of the group's last commit.
// Only batches written (up to upTo) are asked for.
func (s *Server) askReplicaFlush(upTo uint64) {
	s.flushAsk.Advance(min(s.groupWanted.Load(), upTo))
}

// wakeDurable acknowledges the waiting transactions the WAL's durable LSN
// covers, or fails all of them with err, and returns how many it
// acknowledged.
func (s *Server) wakeDurable(err error) int {
	durable := s.wal.DurableLSN()
	s.durMu.Lock()
	defer s.durMu.Unlock()
	n := 0
	for n < len(s.durWait) && (err != nil || s.durWait[n].commitLSN <= durable) {
		s.durWait[n].decide(err)
		n++
	}
	rest := copy(s.durWait, s.durWait[n:])
	clear(s.durWait[rest:])
	s.durWait = s.durWait[:rest]
	if err != nil {
		return 0
	}
	return n
}

func poke(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}

// gatherSiblings is adaptive group commit (PostgreSQL's commit_delay with
// commit_siblings, sized by the disk and by the clients), run by the
// syncer before an fsync. Closed-loop clients acknowledged by the previous
// fsync are typically on their way back with their next commit; an fsync
// started for the first of them makes the rest wait for the one after, and
// the fsyncs, each carrying a few commits, eat the CPU the clients need. So
// when fewer transactions wait than the durable writers of a typical
// recent cycle (gatherTarget), the syncer waits up to one fsync's duration
// (at least minGroupWait, at most maxGroupWait) for the rest.
func (s *Server) gatherSiblings() {
	target := s.gatherTarget()
	waiting := s.syncWaiting()
	if waiting == 0 || waiting >= target {
		return
	}
	wait := min(max(time.Duration(s.lastFsync.Load()), minGroupWait), maxGroupWait)
	t := time.NewTimer(wait)
	defer t.Stop()
	for waiting < target {
		select {
		case <-s.syncKick:
			waiting = s.syncWaiting()
		case <-t.C:
			return
		}
	}
}

// cycleSamples is how many recent fsync cycles gatherTarget looks at, and
// cycleMemory how long their count stays relevant to a syncer that was idle
// (at least; and at least 8 fsyncs, on a disk that takes longer).
const (
	cycleSamples = 5
	cycleMemory  = 10 * time.Millisecond
)

// noteCycle records how many durable writers an fsync cycle had: the
// commits its fsync acknowledged, and those already waiting for the next
// one (sequenced during it). A closed-loop client counts in every cycle,
// whichever group its commit fell in; a client that comes back only now
// and then (one far away, or one that thinks between commits) counts only
// in the cycles it was there for.
func (s *Server) noteCycle(writers int) {
	s.cycles[s.cycleNext%cycleSamples] = writers
	s.cycleNext++
	s.cycleAt = time.Now()
}

// gatherTarget is how many durable commits the syncer gathers before an
// fsync: the median of the recent cycles' writers (noteCycle), rounding
// down. The median, not the peak: waiting for a client that was there in
// one cycle of several costs the others a whole gather window each time it
// has just been acknowledged (BenchmarkCommitDistant: beside one distant
// client, 7 sync committers lost 20-28 % of their rate to a decaying peak,
// 2-10 % with the median). After an idle spell it is 0, so a lone writer
// never waits.
func (s *Server) gatherTarget() int {
	n := min(s.cycleNext, cycleSamples)
	memory := max(cycleMemory, 8*time.Duration(s.lastFsync.Load()))
	if n == 0 || time.Since(s.cycleAt) > memory {
		return 0
	}
	recent := s.cycles // a copy, sorted in place
	slices.Sort(recent[:n])
	return recent[(n-1)/2]
}

// minGroupWait and maxGroupWait bound how long a durable commit waits for
// siblings: on a disk whose fsync takes 0.1 ms, the siblings' round trips
// through gRPC take longer than that. (8 committers on this machine: 7.0
// commits per fsync with 400 µs, 5.2-5.4 with none; commits/s within noise.)
const (
	minGroupWait = 400 * time.Microsecond
	maxGroupWait = time.Millisecond
)

// syncWaiting counts the transactions waiting for an fsync not yet done:
// written and not yet covered by one, or queued for the syncer to write.
func (s *Server) syncWaiting() int {
	durable := s.wal.DurableLSN()
	s.durMu.Lock()
	defer s.durMu.Unlock()
	i := len(s.durWait)
	for i > 0 && s.durWait[i-1].commitLSN > durable {
		i--
	}
	return len(s.durWait) - i + int(s.queuedSync.Load())
}

// commit writes txns (in LSN order) to the WAL, acknowledges those that
// need no fsync and registers the others with the syncer. It reports
// whether any async commit was written (for the flush timer) and whether
// any needs an fsync (for the committer to wake the syncer).
func (s *Server) commit(txns []*txn) (async, needSync bool, err error) {
	entries := s.entries[:0]
	start := 0
	for start < len(txns) {
		end, size := start, 0
		for end < len(txns) && (end == start || size+txns[end].bytes() <= s.cfg.MaxBatchBytes) {
			size += txns[end].bytes()
			end++
		}
		e, err := s.encode(txns[start:end])
		if err != nil {
			return false, false, err
		}
		// Set before the batch can be shipped, so its streams ask replicas
		// and log stores for an immediate ack — or, for a commit the
		// syncer groups, so the syncer asks replicas to flush the group.
		for _, t := range txns[start:end] {
			if t.policy.Replication == walshipv1.ReplicationMode_REPLICATION_MODE_SYNC {
				if t.policy.SyncLevel == walshipv1.SyncLevel_SYNC_LEVEL_APPLY {
					s.applyWanted.Store(e.LastLSN)
				}
				if t.policy.SyncLevel != walshipv1.SyncLevel_SYNC_LEVEL_WRITE && t.policy.needsLocalSync() {
					s.groupWanted.Store(e.LastLSN)
				} else {
					s.replWanted[t.policy.SyncLevel].Store(e.LastLSN)
				}
			}
			if t.policy.LogStore == walshipv1.LogStoreAck_LOG_STORE_ACK_SYNC {
				s.lsWanted.Store(e.LastLSN)
			}
		}
		entries = append(entries, e)
		start = end
	}
	s.entries = entries[:0]
	// Registered before the write, so the syncer cannot miss them.
	s.durMu.Lock()
	for _, t := range txns {
		if t.policy.needsLocalSync() {
			s.durWait = append(s.durWait, t)
			needSync = true
		}
	}
	s.durMu.Unlock()
	if err := s.wal.Append(entries...); err != nil {
		return false, false, fmt.Errorf("wal append: %w", err)
	}
	for _, e := range entries {
		s.walPayloadBytes += uint64(len(e.Data))
		s.index.add(batchMark{lastLSN: e.LastLSN, endByte: s.walPayloadBytes, commit: s.batchTime})
	}
	s.metrics.walBatches.Add(float64(len(entries)))
	for _, t := range txns {
		if !t.policy.needsLocalSync() {
			async = true
			t.decide(nil)
		}
	}
	return async, needSync, nil
}

// encode builds the envelope of one batch: the payload is encoded once and
// the marshalled envelope is what the WAL stores and every peer receives.
func (s *Server) encode(txns []*txn) (wal.Entry, error) {
	s.batch.Reset()
	for _, t := range txns {
		s.batch.Records = append(s.batch.Records, t.recs...)
	}
	encStart := time.Now()
	payload, err := s.cfg.Codec.AppendBatch(s.payload[:0], &s.batch)
	if err != nil {
		return wal.Entry{}, fmt.Errorf("encode batch: %w", err)
	}
	s.metrics.encodeSeconds.Observe(time.Since(encStart).Seconds())
	s.payload = payload
	first, last := s.batch.FirstLSN(), s.batch.LastLSN()
	s.batchTime = time.Now()
	env := &walshipv1.WalBatch{
		Epoch:              s.epoch,
		FirstLsn:           first,
		LastLsn:            last,
		PrevLsn:            first - 1,
		CommitTimeUnixNano: s.batchTime.UnixNano(),
		Codec:              walshipv1.Codec(s.cfg.Codec.ID()),
		Payload:            payload,
		Crc32C:             codec.Checksum(payload),
	}
	data, err := envelope.Marshal(env)
	if err != nil {
		return wal.Entry{}, fmt.Errorf("marshal envelope: %w", err)
	}
	s.metrics.walRecords.Add(float64(len(s.batch.Records)))
	return wal.Entry{FirstLSN: first, LastLSN: last, Data: data}, nil
}

func (s *Server) syncWAL() error {
	if s.wal.DurableLSN() >= s.wal.LastLSN() {
		return nil
	}
	start := time.Now()
	if err := s.wal.Sync(); err != nil {
		s.metrics.fsyncErrors.Inc()
		return fmt.Errorf("wal sync: %w", err)
	}
	took := time.Since(start)
	s.lastFsync.Store(int64(took))
	s.metrics.fsyncSeconds.Observe(took.Seconds())
	return nil
}

// fail makes a WAL error fatal: the given, every queued and every
// fsync-waiting transaction get it, and later writes are refused with it.
func (s *Server) fail(err error, inflight []*txn) {
	s.seqMu.Lock()
	if s.broken == nil {
		s.broken = err
		close(s.failed)
		if s.killAlive != nil {
			s.killAlive()
		}
		var deposed *DeposedError
		if !errors.As(err, &deposed) {
			s.logger.Error("WAL failed; refusing writes until restart", "err", err)
		}
	}
	queued := s.queue
	s.queue = nil
	s.queuedSync.Store(0)
	s.seqMu.Unlock()
	s.wakeDurable(err)
	for _, t := range inflight {
		t.decide(err)
	}
	for _, t := range queued {
		t.decide(err)
	}
	s.srv.SetServing(false)
}

// await waits until t meets its policy, resolves it, and then waits until
// it is visible: the answer to a writer is what makes a later read see its
// write, so no writer hears back before every transaction ahead of it in
// the log has resolved (met its policy or failed) and the visible LSN has
// reached its own. A commit behind one that waits for more (a replica, a
// log store, an fsync it did not ask for) thus waits too: visibility was
// already in LSN order, and its answer now is as well.
//
// It does not give up when the caller's context ends: a sequenced
// transaction is in the log and must resolve for later ones to become
// visible. The wait for replicas and log stores is bounded by the policy's
// sync timeout; the wait for its own write and fsync is not (a disk that
// hangs hangs its commits; one that fails fails them).
func (s *Server) await(t *txn) error {
	err := <-t.local
	if err != nil {
		// The WAL is broken, or the primary deposed; nothing after this
		// becomes visible here.
		return fmt.Errorf("%w: commit LSN %d: outcome unknown: %v", rpcerr.ErrUnavailable, t.commitLSN, err)
	}
	err = s.awaitPeers(t)
	shown, rerr := s.resolve(t)
	if rerr != nil {
		return fmt.Errorf("%w: commit LSN %d is in the log but the primary stopped making commits visible: %v", rpcerr.ErrUnavailable, t.commitLSN, rerr)
	}
	if shown != nil {
		select {
		case <-shown:
		case <-s.failed:
			return fmt.Errorf("%w: commit LSN %d is in the log, but the primary failed before an earlier commit was acknowledged: its outcome is unknown", rpcerr.ErrUnavailable, t.commitLSN)
		}
	}
	return err
}

// awaitPeers waits for the replicas and log stores t's policy requires.
func (s *Server) awaitPeers(t *txn) error {
	if t.policy.Replication != walshipv1.ReplicationMode_REPLICATION_MODE_SYNC &&
		t.policy.LogStore != walshipv1.LogStoreAck_LOG_STORE_ACK_SYNC {
		return nil
	}
	ctx, cancel := context.WithTimeout(s.alive, t.policy.SyncTimeout)
	defer cancel()
	if t.policy.Replication == walshipv1.ReplicationMode_REPLICATION_MODE_SYNC {
		if err := s.peers.waitReplicas(ctx, t.commitLSN, t.policy.SyncReplicas, t.policy.SyncLevel); err != nil {
			return fmt.Errorf("%w: commit LSN %d is durable on the primary but was not confirmed by %d replica(s) at %s within %v: %v",
				rpcerr.ErrUnavailable, t.commitLSN, t.policy.SyncReplicas, levelName(t.policy.SyncLevel), t.policy.SyncTimeout, err)
		}
	}
	if t.policy.LogStore == walshipv1.LogStoreAck_LOG_STORE_ACK_SYNC {
		if err := s.peers.waitLogStores(ctx, t.commitLSN); err != nil {
			return fmt.Errorf("%w: commit LSN %d is durable on the primary but was not confirmed by a log store majority within %v: %v",
				rpcerr.ErrUnavailable, t.commitLSN, t.policy.SyncTimeout, err)
		}
	}
	return nil
}

func levelName(l walshipv1.SyncLevel) string {
	switch l {
	case walshipv1.SyncLevel_SYNC_LEVEL_WRITE:
		return "write"
	case walshipv1.SyncLevel_SYNC_LEVEL_FLUSH:
		return "flush"
	case walshipv1.SyncLevel_SYNC_LEVEL_APPLY:
		return "apply"
	default:
		return l.String()
	}
}

// resolve marks t resolved and makes visible every transaction of the
// resolved prefix: they are applied to the store, released from the
// overlay, and the visible LSN advances. Visibility is a prefix so that a
// reader never sees a commit without every commit before it. It returns a
// channel closed once t is visible, or nil if it is already.
func (s *Server) resolve(t *txn) (<-chan struct{}, error) {
	shown, err := s.resolveLocked(t)
	if err != nil {
		// The sequencer built these records, so this is a bug; stop making
		// anything visible rather than serve a state that skipped a commit.
		// Outside visMu: fail takes seqMu, which sequencing holds while it
		// takes visMu.
		s.logger.Error("cannot apply sequenced records; visibility stopped", "err", err)
		s.fail(err, nil)
		return nil, err
	}
	return shown, nil
}

func (s *Server) resolveLocked(t *txn) (<-chan struct{}, error) {
	s.visMu.Lock()
	defer s.visMu.Unlock()
	t.resolved = true
	n := 0
	for n < len(s.unresolved) && s.unresolved[n].resolved {
		n++
	}
	if n == 0 {
		t.shown = make(chan struct{})
		return t.shown, nil
	}
	s.applyBatch.Reset()
	for _, u := range s.unresolved[:n] {
		s.applyBatch.Records = append(s.applyBatch.Records, u.recs...)
	}
	if err := s.store.Apply(&s.applyBatch); err != nil {
		return nil, fmt.Errorf("apply sequenced records: %w", err)
	}
	last := s.unresolved[n-1].commitLSN
	s.overlay.Release(last)
	s.visible.Advance(last)
	for _, u := range s.unresolved[:n] {
		if u.shown != nil {
			close(u.shown)
		}
	}
	clear(s.unresolved[:n])
	s.unresolved = s.unresolved[n:]
	if t.commitLSN > last {
		t.shown = make(chan struct{})
		return t.shown, nil
	}
	return nil, nil
}
