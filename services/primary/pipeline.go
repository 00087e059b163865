package primary

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/walship/walship/internal/changefeed"
	"github.com/walship/walship/internal/state"
	"github.com/walship/walship/internal/wal"
	"github.com/walship/walship/internal/watermark"
	"github.com/walship/walship/pkg/codec"
)

// pipeline is the primary's write path: everything between a KV call that
// writes and the answer to it. A transaction goes through five stages:
//
//	sequenced     sequence, under seqMu: compares evaluated against every
//	              earlier write (the overlay), LSNs assigned, records
//	              staged in the overlay, the txn queued for a writer and
//	              appended to unresolved (visMu).
//	written       the committer, the one writer, takes the queue and
//	              appends it to the WAL, whole transactions per batch,
//	              each batch encoded once: at once for a txn that needs no
//	              fsync (it is acknowledged locally now), and when the
//	              syncer asks, right before its fsync, for one that does
//	              (so a group commit is one WAL entry). Streams to replicas
//	              and log stores see the entry as soon as it is appended.
//	durable       the syncer's fsync covers it; wakeDurable acknowledges
//	              its local wait.
//	acknowledged  its policy is met: locally (written or durable), then
//	              the replicas and log stores it waits for (awaitPeers,
//	              bounded by its sync timeout), or it failed.
//	visible       resolve: once every earlier txn is acknowledged or
//	              failed too, the resolved prefix is applied to the store,
//	              released from the overlay, and visible advances. Only
//	              then is the writer answered, so a read never returns a
//	              write before its writer heard that it committed.
//
// Goroutines. A KV handler sequences its transaction and waits for it
// (runCalls, calls.go), as a Pipeline worker does a message's writes
// together; neither writes the WAL. The committer (committer) owns the
// WAL's writes: it writes what needs no fsync at once, writes a group
// when the syncer asks, makes retention's cuts and runs the async flush
// timer. The syncer gathers a group (group commit), has the committer
// write it (writeNow) and fsyncs. Replica and log store streams only
// read: the WAL, and the hints in want.
//
// Who touches the WAL: Append and TruncateBefore — the committer alone;
// Sync — the syncer (and a deposed primary's Fence, once nothing more is
// written). Readers (NewReader, LastLSN, DurableLSN, Wait) are safe
// anywhere.
//
// Lock order: seqMu → visMu. durMu is taken alone; no one holds seqMu or
// visMu while waiting for anything but these locks; visMu and durMu are
// leaves (apart from the store's, the overlay's and the watermarks' own
// locks). peers.mu is taken alone.
//
// Wake-ups, each a channel of one pending token (poke): sequence wakes the
// committer (wakeCommitter) or the syncer (wakeSyncer); the syncer asks
// the committer to write its group and waits for the answer (writeNow);
// the committer's flush timer and syncThrough ask the syncer for an fsync
// (flushNow); retention hands the committer a cut (cuts); fail closes
// failed.
type pipeline struct {
	// Fixed before run starts.
	cfg     Config // MaxBatchBytes, Codec, AsyncFlushInterval, WALRetentionBytes
	wal     *wal.Log
	store   *state.Store
	overlay *state.Overlay
	peers   *peers
	epoch   uint64
	logger  *slog.Logger
	metrics *metrics
	index   *lsnIndex // where batches end in bytes and when they were made, for lag
	// written is called once per written group, by the committer: the
	// snapshot schedule's tick.
	written func()
	// stopped is called once, by fail: the primary stops serving.
	stopped func()

	// visible is the end of the resolved prefix: what reads see.
	visible watermark.Watermark
	// feed holds the transactions made visible, for watches (resolve
	// appends them; its bound is set by trackCommit).
	feed *changefeed.Feed
	// feedTxns is resolve's list of transactions for feed, reused
	// (guarded by visMu).
	feedTxns []*changefeed.Txn
	// want are the writer's hints to the streams (wants).
	want wants
	// alive ends when the pipeline fails (or the primary is deposed):
	// waits for peers end with it.
	alive     context.Context
	killAlive context.CancelFunc

	// The sequencer's, under seqMu.
	seqMu    sync.Mutex
	nextLSN  uint64
	nextTxn  uint64
	queue    []*txn // sequenced, not yet taken by a writer
	stopping bool   // a graceful stop: sequence refuses
	broken   error  // set by fail: sequence refuses
	// queuedSync counts the txns in queue that need a local fsync
	// (changed under seqMu, read without it): group commit waits for them
	// too.
	queuedSync atomic.Int64
	// handover is set by a switchover: sequence refuses. Read under seqMu
	// by sequence, so that nothing is sequenced after the LSN a switchover
	// reads (lastSequenced).
	handover atomic.Bool

	// The committer's: it alone takes the queue and writes it, so that
	// entries reach the WAL in LSN order.
	batch           codec.Batch
	payload         []byte
	entries         []wal.Entry
	batchTime       time.Time
	walPayloadBytes uint64

	// The syncer's: the writer registers txns that need an fsync in
	// durWait (LSN order, under durMu) before it writes them; group sizes
	// the group commit.
	durMu     sync.Mutex
	durWait   []*txn
	lastFsync atomic.Int64 // duration of the latest WAL fsync
	group     groupSizer

	// Visibility's, under visMu: the txns not yet visible, in LSN order.
	visMu      sync.Mutex
	unresolved []*txn
	applyBatch codec.Batch

	wakeCommitter chan struct{}
	wakeSyncer    chan struct{}
	writeNow      chan chan<- error // the syncer asks the committer to write its group
	flushNow      chan struct{}
	cuts          chan uint64   // retention cut points, for the committer to make
	failed        chan struct{} // closed by fail, with broken set
}

// newPipeline starts a pipeline on a recovered WAL and store: the state
// is all visible, and the next LSN follows it.
func newPipeline(cfg Config, w *wal.Log, store *state.Store, pe *peers, logger *slog.Logger) *pipeline {
	p := &pipeline{
		cfg:           cfg,
		wal:           w,
		store:         store,
		overlay:       state.NewOverlay(store),
		peers:         pe,
		logger:        logger,
		index:         newLSNIndex(1 << 16),
		written:       func() {},
		stopped:       func() {},
		wakeCommitter: make(chan struct{}, 1),
		wakeSyncer:    make(chan struct{}, 1),
		writeNow:      make(chan chan<- error),
		flushNow:      make(chan struct{}, 1),
		cuts:          make(chan uint64, 1),
		failed:        make(chan struct{}),
	}
	p.alive, p.killAlive = context.WithCancel(context.Background())
	applied := store.AppliedLSN()
	p.nextLSN = applied + 1
	p.nextTxn = applied + 1 // txn ids only need to be unique and increasing
	p.visible.Advance(applied)
	return p
}

// poke leaves a wake-up token in ch unless one is pending already.
func poke(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}

// stop refuses every transaction sequenced from now on (a graceful stop:
// the gRPC server drains the calls in flight).
func (p *pipeline) stop() {
	p.seqMu.Lock()
	p.stopping = true
	p.seqMu.Unlock()
}

// lastSequenced is the LSN of the last sequenced record. With handover
// set first, nothing is sequenced after it.
func (p *pipeline) lastSequenced() uint64 {
	p.seqMu.Lock()
	defer p.seqMu.Unlock()
	return p.nextLSN - 1
}

// err is the error that broke the pipeline, or nil.
func (p *pipeline) err() error {
	p.seqMu.Lock()
	defer p.seqMu.Unlock()
	return p.broken
}

// fail makes err fatal: inflight, every queued and every fsync-waiting
// transaction get it, later ones are refused with it, waits for peers end
// and the committer stops. Only the first error counts.
func (p *pipeline) fail(err error, inflight []*txn) {
	p.seqMu.Lock()
	if p.broken == nil {
		p.broken = err
		close(p.failed)
		p.killAlive()
		var deposed *DeposedError
		if !errors.As(err, &deposed) {
			p.logger.Error("WAL failed; refusing writes until restart", "err", err)
		}
	}
	queued := p.queue
	p.queue = nil
	p.queuedSync.Store(0)
	p.seqMu.Unlock()
	p.wakeDurable(err)
	for _, t := range inflight {
		t.decide(err)
	}
	for _, t := range queued {
		t.decide(err)
	}
	p.stopped()
}
