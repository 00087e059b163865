package primary

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"slices"
	"time"

	walshipv1 "github.com/walship/walship/gen/walship/v1"
	"github.com/walship/walship/internal/envelope"
	"github.com/walship/walship/internal/wal"
	"github.com/walship/walship/pkg/codec"
)

// committer is the WAL's one writer. It writes the transactions that need
// no local fsync as soon as they are queued (with whatever is queued with
// them), and, when the syncer asks (writeNow), those that need one, as a
// group right before its fsync: it takes every queued transaction, builds
// batches of whole transactions, encodes each batch once and writes them
// with one call. It runs the syncer goroutine. Async commits are acknowledged
// after the write and synced by the flush timer within AsyncFlushInterval.
// A WAL error is fatal: every waiting and later commit fails with it and
// committer returns it. When ctx ends (after the gRPC server has drained
// every call), it commits what is left, has the syncer sync it, and
// returns.
func (p *pipeline) committer(ctx context.Context) error {
	flush := time.NewTimer(time.Hour)
	flush.Stop()
	defer flush.Stop()
	syncCtx, stopSyncer := context.WithCancel(context.Background())
	defer stopSyncer()
	syncerDone := make(chan error, 1)
	go func() { syncerDone <- p.syncer(syncCtx) }()
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
		var asked chan<- error
		select {
		case <-p.wakeCommitter:
			// Let the goroutines already runnable go first: the one that
			// woke us readied us to run next, ahead of the handlers
			// with operations in hand (a pipelined stream's), so each
			// write took one or two transactions. After them, one
			// write takes what they sequenced meanwhile.
			runtime.Gosched()
		case asked = <-p.writeNow:
			// The syncer is about to fsync: its group is written now.
		case <-flush.C:
			armed, due = false, true
		case <-ctx.Done():
			stop = true
		case cut := <-p.cuts:
			// Retention: this goroutine alone writes and cuts the WAL.
			p.truncateWAL(cut)
		case err := <-syncerDone:
			// A write or an fsync of the syncer's failed; its waiters
			// have the error.
			p.fail(err, nil)
			return err
		case <-p.failed:
			// Another path failed the log (retention's directory fsync,
			// applying to the state): Run stops the primary.
			return finish(p.err())
		}
		async, needSync, err := p.writeQueue(&spare, asked != nil)
		if asked != nil {
			asked <- err
		} else if needSync {
			poke(p.wakeSyncer)
		}
		if err != nil {
			return finish(err)
		}
		if async && !armed {
			flush.Reset(p.cfg.AsyncFlushInterval)
			armed = true
		}
		if due {
			// The flush window is over: sync what async commits wrote,
			// even while more keep arriving.
			poke(p.flushNow)
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
func (p *pipeline) syncer(ctx context.Context) error {
	asked := make(chan error, 1)
	for {
		stop := false
		select {
		case <-p.wakeSyncer:
		case <-p.flushNow:
		case <-ctx.Done():
			stop = true
		}
		for first := true; first || p.syncWaiting() > 0; first = false {
			if !stop {
				p.gatherSiblings()
			}
			// Async commits queued with the group are acknowledged at the
			// write, as the committer's are, and synced by the fsync below.
			if !stop {
				if err := p.askWrite(ctx, asked); err != nil {
					return err
				}
			}
			// The write woke the replica and log store streams, and the
			// fsync below would hold this goroutine's P until the runtime
			// notices the syscall: let them send first, so that the
			// replicas' write and fsync overlap the primary's.
			runtime.Gosched()
			p.askReplicaFlush(p.wal.LastLSN())
			err := p.syncWAL()
			// A batch written while the ask above was made, and synced by
			// this fsync, is asked for now: no later fsync will.
			p.askReplicaFlush(p.wal.DurableLSN())
			if acked := p.wakeDurable(err); acked > 0 {
				p.group.noteCycle(acked + p.syncWaiting())
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

// askWrite has the committer write what is queued now, and returns the
// write's error. When ctx ends first the committer is stopping (it wrote
// everything before it stopped the syncer): there is nothing to write.
func (p *pipeline) askWrite(ctx context.Context, asked chan error) error {
	select {
	case p.writeNow <- asked:
		return <-asked
	case <-ctx.Done():
		return nil
	}
}

// writeQueue takes every queued transaction and writes it, with *spare as
// the queue's next array (the taken one becomes the next spare, even when
// empty). Only the committer calls it: when a commit needs no fsync, and
// when the syncer asks right before its fsync, so that a group of durable
// commits becomes one entry (up to MaxBatchBytes). It reports commit's
// async and needSync; a failed write fails the transactions and is
// returned. forSync says the syncer asked: its fsync follows the write.
func (p *pipeline) writeQueue(spare *[]*txn, forSync bool) (async, needSync bool, err error) {
	batch := p.takeQueue(*spare)
	defer func() {
		clear(batch)
		*spare = batch
	}()
	if len(batch) == 0 {
		return false, false, nil
	}
	if async, needSync, err = p.commit(batch, forSync); err != nil {
		p.fail(err, batch)
		return false, false, err
	}
	// Once per group commit, not once per transaction.
	p.written()
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
func (p *pipeline) askReplicaFlush(upTo uint64) {
	p.want.askFlush(upTo)
}

// wakeDurable acknowledges the waiting transactions the WAL's durable LSN
// covers, or fails all of them with err, and returns how many it
// acknowledged.
func (p *pipeline) wakeDurable(err error) int {
	durable := p.wal.DurableLSN()
	p.durMu.Lock()
	defer p.durMu.Unlock()
	n := 0
	for n < len(p.durWait) && (err != nil || p.durWait[n].commitLSN <= durable) {
		p.durWait[n].decide(err)
		n++
	}
	rest := copy(p.durWait, p.durWait[n:])
	clear(p.durWait[rest:])
	p.durWait = p.durWait[:rest]
	if err != nil {
		return 0
	}
	return n
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
func (p *pipeline) gatherSiblings() {
	target := p.group.gatherTarget(time.Duration(p.lastFsync.Load()))
	waiting := p.syncWaiting()
	if waiting == 0 || waiting >= target {
		return
	}
	wait := min(max(time.Duration(p.lastFsync.Load()), minGroupWait), maxGroupWait)
	t := time.NewTimer(wait)
	defer t.Stop()
	for waiting < target {
		select {
		case <-p.wakeSyncer:
			waiting = p.syncWaiting()
		case <-t.C:
			return
		}
	}
}

// groupSizer remembers how many durable writers recent fsync cycles had,
// for gatherSiblings. The syncer's alone.
type groupSizer struct {
	cycles [cycleSamples]int
	next   int
	at     time.Time // when the latest cycle was noted
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
func (g *groupSizer) noteCycle(writers int) {
	g.cycles[g.next%cycleSamples] = writers
	g.next++
	g.at = time.Now()
}

// gatherTarget is how many durable commits the syncer gathers before an
// fsync: the median of the recent cycles' writers (noteCycle), rounding
// down. The median, not the peak: waiting for a client that was there in
// one cycle of several costs the others a whole gather window each time it
// has just been acknowledged (BenchmarkCommitDistant measures it; the
// numbers are in docs/BENCHMARKS.md). After an idle spell it is 0, so a
// lone writer never waits.
func (g *groupSizer) gatherTarget(lastFsync time.Duration) int {
	n := min(g.next, cycleSamples)
	memory := max(cycleMemory, 8*lastFsync)
	if n == 0 || time.Since(g.at) > memory {
		return 0
	}
	recent := g.cycles // a copy, sorted in place
	slices.Sort(recent[:n])
	return recent[(n-1)/2]
}

// minGroupWait and maxGroupWait bound how long a durable commit waits for
// siblings: on a disk whose fsync is fast, the siblings' round trips
// through gRPC take longer than the fsync, so waiting only as long as one
// would split every group in two.
const (
	minGroupWait = 400 * time.Microsecond
	maxGroupWait = time.Millisecond
)

// syncWaiting counts the transactions waiting for an fsync not yet done:
// written and not yet covered by one, or queued for the syncer to write.
func (p *pipeline) syncWaiting() int {
	durable := p.wal.DurableLSN()
	p.durMu.Lock()
	defer p.durMu.Unlock()
	i := len(p.durWait)
	for i > 0 && p.durWait[i-1].commitLSN > durable {
		i--
	}
	return len(p.durWait) - i + int(p.queuedSync.Load())
}

// commit writes txns (in LSN order) to the WAL, acknowledges those that
// need no fsync and registers the others with the syncer. It reports
// whether any async commit was written (for the flush timer) and whether
// any needs an fsync (for the committer to wake the syncer).
func (p *pipeline) commit(txns []*txn, forSync bool) (async, needSync bool, err error) {
	entries := p.entries[:0]
	start := 0
	for start < len(txns) {
		end, size := start, 0
		for end < len(txns) && (end == start || size+txns[end].bytes() <= p.cfg.MaxBatchBytes) {
			size += txns[end].bytes()
			end++
		}
		e, err := p.encode(txns[start:end])
		if err != nil {
			return false, false, err
		}
		// Set before the batch can be shipped, so its streams ask replicas
		// and log stores for an immediate ack — or, for a commit the
		// syncer groups, so the syncer asks replicas to flush the group.
		for _, t := range txns[start:end] {
			p.want.note(t.policy, e.LastLSN)
		}
		entries = append(entries, e)
		start = end
	}
	p.entries = entries[:0]
	if forSync {
		// The syncer's fsync of this group follows the write: ask the
		// replicas for their flush of it now, so that each batch carries
		// the ask (reply_at) to them. Asked after the write, as the
		// syncer does for batches written without it, the streams would
		// mostly have sent the batches already and would send each
		// replica a second message, a heartbeat asking for the reply.
		p.askReplicaFlush(entries[len(entries)-1].LastLSN)
	}
	// Registered before the write, so the syncer cannot miss them.
	p.durMu.Lock()
	for _, t := range txns {
		if t.policy.needsLocalSync() {
			p.durWait = append(p.durWait, t)
			needSync = true
		}
	}
	p.durMu.Unlock()
	if err := p.wal.Append(entries...); err != nil {
		return false, false, fmt.Errorf("wal append: %w", err)
	}
	for _, e := range entries {
		p.walPayloadBytes += uint64(len(e.Data))
		p.index.add(batchMark{lastLSN: e.LastLSN, endByte: p.walPayloadBytes, commit: p.batchTime})
	}
	p.metrics.walBatches.Add(float64(len(entries)))
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
func (p *pipeline) encode(txns []*txn) (wal.Entry, error) {
	p.batch.Reset()
	for _, t := range txns {
		p.batch.Records = append(p.batch.Records, t.recs...)
	}
	encStart := time.Now()
	payload, err := p.cfg.Codec.AppendBatch(p.payload[:0], &p.batch)
	if err != nil {
		return wal.Entry{}, fmt.Errorf("encode batch: %w", err)
	}
	p.metrics.encodeSeconds.Observe(time.Since(encStart).Seconds())
	p.payload = payload
	first, last := p.batch.FirstLSN(), p.batch.LastLSN()
	p.batchTime = time.Now()
	for _, t := range txns {
		t.commitTime = p.batchTime.UnixNano()
	}
	env := &walshipv1.WalBatch{
		Epoch:              p.epoch,
		FirstLsn:           first,
		LastLsn:            last,
		PrevLsn:            first - 1,
		CommitTimeUnixNano: p.batchTime.UnixNano(),
		Codec:              walshipv1.Codec(p.cfg.Codec.ID()),
		Payload:            payload,
		Crc32C:             codec.Checksum(payload),
	}
	data, err := envelope.Marshal(env)
	if err != nil {
		return wal.Entry{}, fmt.Errorf("marshal envelope: %w", err)
	}
	p.metrics.walRecords.Add(float64(len(p.batch.Records)))
	return wal.Entry{FirstLSN: first, LastLSN: last, Data: data}, nil
}

func (p *pipeline) syncWAL() error {
	if p.wal.DurableLSN() >= p.wal.LastLSN() {
		return nil
	}
	start := time.Now()
	if err := p.wal.Sync(); err != nil {
		p.metrics.fsyncErrors.Inc()
		return fmt.Errorf("wal sync: %w", err)
	}
	took := time.Since(start)
	p.lastFsync.Store(int64(took))
	p.metrics.fsyncSeconds.Observe(took.Seconds())
	return nil
}

// truncateWAL removes the WAL segments wholly before cut (retention). Only
// the committer calls it: it alone writes the WAL.
func (p *pipeline) truncateWAL(cut uint64) {
	removed, err := p.wal.TruncateBefore(cut)
	if errors.Is(err, wal.ErrBroken) {
		// A failed fsync of the directory or the segments: what is on
		// disk is unknown, as after any failed fsync.
		p.fail(fmt.Errorf("wal retention: %w", err), nil)
		return
	}
	if err != nil {
		p.logger.Warn("wal retention failed", "err", err)
		return
	}
	if removed > 0 {
		p.logger.Info("wal retention removed segments", "segments", removed, "before_lsn", cut, "wal_bytes", p.wal.Size(), "limit", p.cfg.WALRetentionBytes)
	}
}

// syncThrough returns once the WAL is durable through lsn, which must be
// written already (a visible LSN is). With async durability the visible
// state runs ahead of the durable WAL by up to --async-flush-interval; a
// state image that leaves the process (a snapshot file, a snapshot streamed
// to a replica) must not hold a commit a crash could still take back, so
// this asks the syncer for an fsync now instead of waiting for the window.
func (p *pipeline) syncThrough(ctx context.Context, lsn uint64) error {
	if p.wal.DurableLSN() >= lsn {
		return nil
	}
	poke(p.flushNow)
	if err := p.wal.Wait(ctx, lsn, true); err != nil {
		return fmt.Errorf("wait for wal sync to LSN %d: %w", lsn, err)
	}
	return nil
}
