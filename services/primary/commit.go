package primary

import (
	"context"
	"fmt"
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
// synced, if its policy asks) by the committer → acknowledged at its policy's
// level → resolved, after which it can become visible.
type txn struct {
	recs      []codec.Record // puts/deletes then one commit record
	commitLSN uint64
	policy    Policy
	// local receives the verdict, once (decide): nil once the txn is in the
	// WAL (synced if policy.needsLocalSync()), else the WAL's error. Buffered.
	local    chan error
	decided  atomic.Bool
	start    time.Time
	resolved bool // guarded by Server.visMu
}

// decide delivers t's verdict. Only the first counts: when the WAL fails,
// the writer and the sync token's holder may both fail the same
// transaction, and its own goroutine may be the writer.
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

// enqueueLocked queues a sequenced transaction for writing. Called with
// seqMu held; the caller then calls lead.
func (s *Server) enqueueLocked(t *txn) {
	s.queue = append(s.queue, t)
	s.visMu.Lock()
	s.unresolved = append(s.unresolved, t)
	s.visMu.Unlock()
}

// lead is group commit without a handoff (LevelDB's and RocksDB's writer
// queue): the writer that finds the write token free takes every queued
// transaction, builds batches of whole transactions, encodes each batch once
// and writes them with one call; a writer that finds it held leaves its
// transaction to the holder, which looks at the queue again after it lets
// go. Then a writer whose commit needs an fsync takes the sync token the
// same way and syncs everything written so far for everyone (see
// syncWritten). Taking turns under two tokens, rather than handing each
// commit to a committer and a syncer goroutine, saves two goroutine wake-ups
// per commit, which on this 2-core machine are most of a durable commit's
// time besides the fsync itself; writes still overlap fsyncs, as in
// pebble's LogWriter: while one writer syncs, the next ones write, and the
// next fsync covers them all.
func (s *Server) lead(t *txn) {
	s.writeQueued()
	if t.policy.needsLocalSync() {
		s.syncWritten()
	}
}

// writeQueued writes the queue while it finds the write token free and the
// queue not empty. Async commits it wrote are acknowledged, and the flush
// timer armed; if any written commit needs an fsync, it then syncs.
//
// The queue is looked at again after every release of the token, even one
// that found it empty: a writer that queued while the token was held, and
// failed to take it, relies on that.
func (s *Server) writeQueued() {
	needSync := false
	for s.queued() && s.writeMu.TryLock() {
		s.seqMu.Lock()
		batch := s.queue
		if len(batch) > 0 {
			s.queue, s.spare = s.spare[:0], nil
		}
		s.seqMu.Unlock()
		if len(batch) == 0 {
			s.writeMu.Unlock()
			continue
		}
		async, durable, err := s.commit(batch)
		if err != nil {
			s.fail(err, batch)
			s.writeMu.Unlock()
			s.reportFatal(err)
			return
		}
		// Once per group commit, not once per transaction.
		s.maybeSnapshot()
		clear(batch)
		s.spare = batch
		s.writeMu.Unlock()
		if async && s.flushArmed.CompareAndSwap(false, true) {
			poke(s.armFlush)
		}
		needSync = needSync || durable
	}
	if needSync {
		s.syncWritten()
	}
}

func (s *Server) queued() bool {
	s.seqMu.Lock()
	defer s.seqMu.Unlock()
	return len(s.queue) > 0
}

// syncWritten syncs once for every written commit waiting for an fsync,
// if it finds the sync token free. A writer that finds it held leaves its
// commit to the holder, which counts the waiters again after it lets go and,
// if commits were written during its fsync, wakes one of their writers to
// lead the next one (releaseSync); the holder itself returns to its client.
// Only written commits are counted, so nobody syncs for a commit still being
// written: its writer syncs after writing it.
func (s *Server) syncWritten() {
	if s.syncWaiting() == 0 || !s.syncMu.TryLock() {
		return
	}
	s.gatherSiblings()
	err := s.syncWAL()
	s.wakeDurable(err)
	s.releaseSync()
	if err != nil {
		s.reportFatal(err)
	}
}

// releaseSync lets go of the sync token and, if written commits still wait
// for an fsync, wakes one waiting writer to take it.
func (s *Server) releaseSync() {
	s.syncMu.Unlock()
	if s.syncWaiting() > 0 {
		poke(s.syncFree)
	}
}

// awaitLocal waits for the committer's verdict on t; a writer waiting for
// an fsync takes the sync token when it is passed on.
func (s *Server) awaitLocal(t *txn) error {
	if !t.policy.needsLocalSync() {
		return <-t.local
	}
	for {
		select {
		case err := <-t.local:
			return err
		case <-s.syncFree:
			s.syncWritten()
		}
	}
}

// reportFatal hands a WAL error to the committer goroutine, which fails
// every waiter and stops the primary.
func (s *Server) reportFatal(err error) {
	select {
	case s.fatal <- err:
	default:
	}
}

// committer runs the WAL's background duties: the async flush window (a
// commit acknowledged after its write is synced within AsyncFlushInterval),
// sync requests (snapshots), retention cuts, and the end: a fatal WAL error
// from a writer fails every waiting and later commit and is returned; when
// ctx ends (after the gRPC server has drained every call) it writes and
// syncs what is left and returns.
func (s *Server) committer(ctx context.Context) error {
	flush := time.NewTimer(time.Hour)
	flush.Stop()
	defer flush.Stop()
	for {
		select {
		case <-s.armFlush:
			flush.Reset(s.cfg.AsyncFlushInterval)
		case <-flush.C:
			// The flush window is over: sync what async commits wrote, even
			// while more keep arriving. Disarmed first, so a commit written
			// from now on arms the next window or is covered by this sync.
			s.flushArmed.Store(false)
			s.syncAll()
		case <-s.kick:
			s.syncAll()
		case cut := <-s.truncate:
			// Retention: the WAL has one writer at a time.
			s.writeMu.Lock()
			s.truncateWAL(cut)
			s.writeMu.Unlock()
			// Writers that found the token held left their commits queued.
			s.writeQueued()
		case err := <-s.fatal:
			s.fail(err, nil)
			return err
		case <-ctx.Done():
			s.writeQueued()
			if err := s.syncAll(); err != nil {
				s.fail(err, nil)
				return err
			}
			return nil
		}
	}
}

// syncAll syncs everything written so far, whoever waits for it.
func (s *Server) syncAll() error {
	s.syncMu.Lock()
	err := s.syncWAL()
	s.wakeDurable(err)
	s.releaseSync()
	if err != nil {
		s.reportFatal(err)
	}
	return err
}

// wakeDurable acknowledges the waiting transactions the WAL's durable LSN
// covers, or fails all of them with err.
func (s *Server) wakeDurable(err error) {
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
}

func poke(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}

// gatherSiblings is adaptive group commit (PostgreSQL's commit_delay with
// commit_siblings, sized by the disk), run by the sync token's holder before
// its fsync.
// Closed-loop clients acknowledged by the previous fsync are typically on
// their way back with their next commit; an fsync started for the first of
// them makes the rest wait for the one after, and the fsyncs, each carrying
// a few commits, eat the CPU the clients need. So when fewer transactions
// wait than the recent peak of concurrent durable writers, the holder waits
// up to 3/4 of the last fsync's duration (at least minGroupWait, at most
// maxGroupWait) for the rest. The peak decays by one per fsync that finds fewer writers,
// so a lone writer soon never waits.
func (s *Server) gatherSiblings() {
	now := int(s.syncWriters.Load())
	if now >= s.peakWriters {
		s.peakWriters = now
	} else {
		s.peakWriters--
	}
	waiting := s.syncWaiting()
	if waiting == 0 || waiting >= s.peakWriters {
		return
	}
	wait := min(max(time.Duration(s.lastFsync.Load())*3/4, minGroupWait), maxGroupWait)
	t := time.NewTimer(wait)
	defer t.Stop()
	for waiting < s.peakWriters {
		select {
		case <-s.syncKick:
			waiting = s.syncWaiting()
		case <-t.C:
			return
		}
	}
}

// minGroupWait and maxGroupWait bound how long a durable commit waits for
// siblings. 8 committers on this machine (fsync ~0.12 ms): no wait gave
// 19-20k commits/s at 2.3 commits per fsync; a fixed 30 µs 21k at 3.5; 60 µs
// 19k at 4.2; 100 µs 18-18.5k at 4.7-5.0; a whole fsync 15-17.7k at 5.2;
// 400 µs (the old minimum) 12-12.8k at 6.3.
const (
	minGroupWait = 75 * time.Microsecond
	maxGroupWait = 750 * time.Microsecond
)

// syncWaiting counts the written transactions waiting for an fsync not yet
// done.
func (s *Server) syncWaiting() int {
	durable, last := s.wal.DurableLSN(), s.wal.LastLSN()
	s.durMu.Lock()
	defer s.durMu.Unlock()
	n := 0
	for _, t := range s.durWait {
		if t.commitLSN > last {
			break
		}
		if t.commitLSN > durable {
			n++
		}
	}
	return n
}

// commit writes txns (in LSN order) to the WAL, acknowledges those that
// need no fsync and registers the others for one. It reports whether any
// async commit was written (for the flush timer) and whether any needs an
// fsync. Called with writeMu held.
func (s *Server) commit(txns []*txn) (async, durable bool, err error) {
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
		// and log stores for an immediate flush.
		for _, t := range txns[start:end] {
			if t.policy.Replication == walshipv1.ReplicationMode_REPLICATION_MODE_SYNC {
				s.replWanted.Store(e.LastLSN)
			}
			if t.policy.LogStore == walshipv1.LogStoreAck_LOG_STORE_ACK_SYNC {
				s.lsWanted.Store(e.LastLSN)
			}
		}
		entries = append(entries, e)
		start = end
	}
	s.entries = entries[:0]
	// Registered before the write, so an fsync that covers them wakes them.
	s.durMu.Lock()
	for _, t := range txns {
		if t.policy.needsLocalSync() {
			s.durWait = append(s.durWait, t)
			durable = true
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
	if durable {
		// A writer gathering siblings for its fsync counts again.
		poke(s.syncKick)
	}
	for _, t := range txns {
		if !t.policy.needsLocalSync() {
			async = true
			t.decide(nil)
		}
	}
	return async, durable, nil
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
	s.logger.Error("WAL failed; refusing writes until restart", "err", err)
	s.seqMu.Lock()
	if s.broken == nil {
		s.broken = err
	}
	queued := s.queue
	s.queue = nil
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

// await waits until t meets its policy, then resolves it so it can become
// visible. It does not give up when the caller's context ends: a sequenced
// transaction is in the log and must resolve for later ones to become
// visible; the wait is bounded by the policy's sync timeout.
func (s *Server) await(t *txn) error {
	err := s.awaitLocal(t)
	if err != nil {
		// The WAL is broken; nothing after this becomes visible.
		return fmt.Errorf("%w: commit LSN %d not durable: %v", rpcerr.ErrUnavailable, t.commitLSN, err)
	}
	err = s.awaitPeers(t)
	s.resolve(t)
	return err
}

// awaitPeers waits for the replicas and log stores t's policy requires.
func (s *Server) awaitPeers(t *txn) error {
	if t.policy.Replication != walshipv1.ReplicationMode_REPLICATION_MODE_SYNC &&
		t.policy.LogStore != walshipv1.LogStoreAck_LOG_STORE_ACK_SYNC {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), t.policy.SyncTimeout)
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
// reader never sees a commit without every commit before it.
func (s *Server) resolve(t *txn) {
	s.visMu.Lock()
	defer s.visMu.Unlock()
	t.resolved = true
	n := 0
	for n < len(s.unresolved) && s.unresolved[n].resolved {
		n++
	}
	if n == 0 {
		return
	}
	s.applyBatch.Reset()
	for _, u := range s.unresolved[:n] {
		s.applyBatch.Records = append(s.applyBatch.Records, u.recs...)
	}
	if err := s.store.Apply(&s.applyBatch); err != nil {
		// The sequencer built these records, so this is a bug; stop making
		// anything visible rather than serve a state that skipped a commit.
		s.logger.Error("cannot apply sequenced records; visibility stopped", "err", err)
		s.fail(fmt.Errorf("apply sequenced records: %w", err), nil)
		return
	}
	last := s.unresolved[n-1].commitLSN
	clear(s.unresolved[:n])
	s.unresolved = s.unresolved[n:]
	s.overlay.Release(last)
	s.visible.Advance(last)
}
