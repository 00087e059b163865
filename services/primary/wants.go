package primary

import (
	"sync/atomic"

	walshipv1 "github.com/walship/walship/gen/walship/v1"
	"github.com/walship/walship/internal/watermark"
)

// wants are the hints the commit path leaves for the replica and log store
// streams: which batches hold commits that wait for those peers, so that a
// stream asks its peer to answer at once rather than after the peer's
// flush delay. Each is the last LSN of the newest such batch, and only
// grows: the committer sets them (note) as it encodes a batch, in LSN
// order, before the batch can be shipped; the syncer sets flushAsk as it
// starts a group's fsync; the streams read them.
type wants struct {
	// replica[level]: a commit waits for replicas at that stage and no
	// local fsync groups it (async durability, or stage write).
	replica [walshipv1.SyncLevel_SYNC_LEVEL_APPLY + 1]atomic.Uint64
	// group: a durability-sync commit waits for replicas to flush or
	// apply; its batch is asked for when the syncer starts the fsync of
	// its group (flushAsk), so that a replica fsyncs once per group.
	group atomic.Uint64
	// flushAsk is how far the syncer has asked replicas to flush.
	flushAsk watermark.Watermark
	// apply: a commit waits for replicas to apply; a stream that has not
	// yet told its replica that batch is durable does so at once.
	apply atomic.Uint64
	// logStore: a commit waits for a log store majority.
	logStore atomic.Uint64
}

// note records that the batch ending at last holds a commit under p.
func (w *wants) note(p Policy, last uint64) {
	if p.Replication == walshipv1.ReplicationMode_REPLICATION_MODE_SYNC {
		if p.SyncLevel == walshipv1.SyncLevel_SYNC_LEVEL_APPLY {
			w.apply.Store(last)
		}
		if p.SyncLevel != walshipv1.SyncLevel_SYNC_LEVEL_WRITE && p.needsLocalSync() {
			w.group.Store(last)
		} else {
			w.replica[p.SyncLevel].Store(last)
		}
	}
	if p.LogStore == walshipv1.LogStoreAck_LOG_STORE_ACK_SYNC {
		w.logStore.Store(last)
	}
}

// askFlush asks replicas to flush the batches of the group about to be
// fsynced that hold commits waiting for them (group). Their fsyncs then run
// alongside the primary's, one per group: the batches were shipped as they
// were written, without asking for an ack, while the group gathered. A
// replica asked per batch would fsync at the group's first batch and again
// for the rest — more flushes of a disk the primary may share, each
// costing CPU, for a later ack of the group's last commit. Only batches
// written (up to upTo) are asked for.
func (w *wants) askFlush(upTo uint64) {
	w.flushAsk.Advance(min(w.group.Load(), upTo))
}

// replyAt lists the stages at which a sync commit waits (or is about to
// wait) for replicas to reach the batch ending at last: one in it or after
// it that no local fsync groups (replica), a group whose fsync has started
// (flush and apply, when groupFlush), or any commit already waiting at
// stage write (writeWaiting: it may wait on an earlier batch, sent before
// it began to wait). The replica acks at once at those stages and only at
// those, rather than after its flush delay. A group's flush is asked for
// once, not by every batch while commits wait: see askFlush.
func (w *wants) replyAt(last uint64, groupFlush, writeWaiting bool, buf []walshipv1.SyncLevel) []walshipv1.SyncLevel {
	for _, level := range syncStages {
		now := last <= w.replica[level].Load()
		if level == walshipv1.SyncLevel_SYNC_LEVEL_WRITE {
			now = now || writeWaiting
		} else {
			now = now || groupFlush
		}
		if now {
			buf = append(buf, level)
		}
	}
	return buf
}

// applyUrgent reports whether a stream that told its replica of durable
// LSNs up to sentDurable must tell it of a newer one at once: a commit
// that waits for replicas to apply is in a batch beyond it.
func (w *wants) applyUrgent(sentDurable uint64) bool {
	return sentDurable < w.apply.Load()
}

// replicasWaitFrom reports whether a batch from LSN from on holds a
// commit that waits for replicas (at any stage): a stream sends it at
// once, without its ship delay.
func (w *wants) replicasWaitFrom(from uint64) bool {
	if w.group.Load() >= from || w.apply.Load() >= from {
		return true
	}
	for i := range w.replica {
		if w.replica[i].Load() >= from {
			return true
		}
	}
	return false
}

// logStoreNow reports whether the batch ending at last holds, or comes
// before, a commit that waits for a log store majority: the stream asks
// for the log store's round at once.
func (w *wants) logStoreNow(last uint64) bool {
	return last <= w.logStore.Load()
}

// syncStages are the replica stages a sync commit can wait at.
var syncStages = [...]walshipv1.SyncLevel{walshipv1.SyncLevel_SYNC_LEVEL_WRITE, walshipv1.SyncLevel_SYNC_LEVEL_FLUSH, walshipv1.SyncLevel_SYNC_LEVEL_APPLY}
