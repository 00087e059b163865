package primary

import (
	"slices"
	"testing"

	walshipv1 "github.com/walship/walship/gen/walship/v1"
)

// TestWants: what a commit's policy asks of the streams for its batch (LSNs
// 5..10): the stages a replica acks at once, whether the syncer asks
// replicas to flush its group, whether a durable LSN beyond the batch is
// urgent, and whether a log store is asked for its round at once — and
// nothing for a batch after it.
func TestWants(t *testing.T) {
	const (
		write = walshipv1.SyncLevel_SYNC_LEVEL_WRITE
		flush = walshipv1.SyncLevel_SYNC_LEVEL_FLUSH
		apply = walshipv1.SyncLevel_SYNC_LEVEL_APPLY

		durSync  = walshipv1.Durability_DURABILITY_SYNC
		durAsync = walshipv1.Durability_DURABILITY_ASYNC
		replSync = walshipv1.ReplicationMode_REPLICATION_MODE_SYNC
		replOff  = walshipv1.ReplicationMode_REPLICATION_MODE_ASYNC
		lsSync   = walshipv1.LogStoreAck_LOG_STORE_ACK_SYNC
		lsAsync  = walshipv1.LogStoreAck_LOG_STORE_ACK_ASYNC
	)
	pol := func(d walshipv1.Durability, r walshipv1.ReplicationMode, level walshipv1.SyncLevel, ls walshipv1.LogStoreAck) Policy {
		p := DefaultPolicy()
		p.Durability, p.Replication, p.SyncLevel, p.LogStore = d, r, level, ls
		return p
	}
	for _, tc := range []struct {
		name     string
		policy   Policy
		replyAt  []walshipv1.SyncLevel // for the batch, no group flush, nobody waiting at write
		flushAsk uint64                // after the syncer starts an fsync through LSN 10
		urgent   bool                  // a durable LSN beyond 4 is urgent
		logStore bool
	}{
		{"async everything", pol(durAsync, replOff, flush, lsAsync), nil, 0, false, false},
		{"sync durability alone", pol(durSync, replOff, flush, lsAsync), nil, 0, false, false},
		{"sync write, async durability", pol(durAsync, replSync, write, lsAsync), []walshipv1.SyncLevel{write}, 0, false, false},
		// A replica at stage write never waits for the group's fsync.
		{"sync write, sync durability", pol(durSync, replSync, write, lsAsync), []walshipv1.SyncLevel{write}, 0, false, false},
		// Sync replication implies the local fsync: the group is asked for.
		{"sync flush", pol(durAsync, replSync, flush, lsAsync), nil, 10, false, false},
		{"sync apply", pol(durSync, replSync, apply, lsAsync), nil, 10, true, false},
		{"sync log store", pol(durAsync, replOff, flush, lsSync), nil, 0, false, true},
		{"sync flush and log store", pol(durSync, replSync, flush, lsSync), nil, 10, false, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var w wants
			w.note(tc.policy, 10)
			if got := w.replyAt(10, false, false, nil); !slices.Equal(got, tc.replyAt) {
				t.Errorf("replyAt(batch) = %v, want %v", got, tc.replyAt)
			}
			if got := w.replyAt(6, false, false, nil); !slices.Equal(got, tc.replyAt) {
				t.Errorf("replyAt(an earlier batch) = %v, want %v (a commit after it waits)", got, tc.replyAt)
			}
			if got := w.replyAt(11, false, false, nil); len(got) != 0 {
				t.Errorf("replyAt(a later batch) = %v, want none", got)
			}
			w.askFlush(10)
			if got := w.flushAsk.Load(); got != tc.flushAsk {
				t.Errorf("flushAsk = %d, want %d", got, tc.flushAsk)
			}
			if got := w.applyUrgent(4); got != tc.urgent {
				t.Errorf("applyUrgent(4) = %v, want %v", got, tc.urgent)
			}
			if w.applyUrgent(10) {
				t.Error("applyUrgent(10) = true once the replica heard the batch is durable")
			}
			if got := w.logStoreNow(10); got != tc.logStore {
				t.Errorf("logStoreNow(10) = %v, want %v", got, tc.logStore)
			}
			if w.logStoreNow(11) {
				t.Error("logStoreNow(11) = true for a batch after every waiting commit")
			}
		})
	}
}

// TestWantsReplyAt: a group whose fsync started asks for flush and apply
// acks; a commit already waiting at stage write asks for write acks of any
// batch; a flush ask covers only what was written.
func TestWantsReplyAt(t *testing.T) {
	var w wants
	all := []walshipv1.SyncLevel{walshipv1.SyncLevel_SYNC_LEVEL_WRITE, walshipv1.SyncLevel_SYNC_LEVEL_FLUSH, walshipv1.SyncLevel_SYNC_LEVEL_APPLY}
	if got := w.replyAt(3, true, true, nil); !slices.Equal(got, all) {
		t.Errorf("replyAt(group flush, write waiting) = %v, want %v", got, all)
	}
	if got := w.replyAt(3, true, false, nil); !slices.Equal(got, all[1:]) {
		t.Errorf("replyAt(group flush) = %v, want %v", got, all[1:])
	}
	if got := w.replyAt(3, false, true, nil); !slices.Equal(got, all[:1]) {
		t.Errorf("replyAt(write waiting) = %v, want %v", got, all[:1])
	}
	p := DefaultPolicy()
	p.Replication, p.SyncLevel = walshipv1.ReplicationMode_REPLICATION_MODE_SYNC, walshipv1.SyncLevel_SYNC_LEVEL_FLUSH
	w.note(p, 20)
	w.askFlush(12) // the syncer's fsync covers what is written: up to 12
	if got := w.flushAsk.Load(); got != 12 {
		t.Errorf("flushAsk = %d after an fsync through 12 of a group ending at 20, want 12", got)
	}
	w.askFlush(30)
	if got := w.flushAsk.Load(); got != 20 {
		t.Errorf("flushAsk = %d after an fsync through 30, want 20 (the last batch that waits)", got)
	}
}
