package primary

import (
	"context"
	"fmt"

	walshipv1 "github.com/walship/walship/gen/walship/v1"
	"github.com/walship/walship/internal/changefeed"
	"github.com/walship/walship/internal/rpcerr"
)

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
func (p *pipeline) await(t *txn) error {
	t.local.Wait()
	err := t.localErr
	if err != nil {
		// The WAL is broken, or the primary deposed; nothing after this
		// becomes visible here.
		return fmt.Errorf("%w: commit LSN %d: outcome unknown: %v", rpcerr.ErrUnavailable, t.commitLSN, err)
	}
	err = p.awaitPeers(t)
	shown, rerr := p.resolve(t)
	if rerr != nil {
		return fmt.Errorf("%w: commit LSN %d is in the log but the primary stopped making commits visible: %v", rpcerr.ErrUnavailable, t.commitLSN, rerr)
	}
	if shown != nil {
		select {
		case <-shown:
		case <-p.failed:
			return fmt.Errorf("%w: commit LSN %d is in the log, but the primary failed before an earlier commit was acknowledged: its outcome is unknown", rpcerr.ErrUnavailable, t.commitLSN)
		}
	}
	return err
}

// awaitPeers waits for the replicas and log stores t's policy requires.
func (p *pipeline) awaitPeers(t *txn) error {
	if t.policy.Replication != walshipv1.ReplicationMode_REPLICATION_MODE_SYNC &&
		t.policy.LogStore != walshipv1.LogStoreAck_LOG_STORE_ACK_SYNC {
		return nil
	}
	ctx, cancel := context.WithTimeout(p.alive, t.policy.SyncTimeout)
	defer cancel()
	if t.policy.Replication == walshipv1.ReplicationMode_REPLICATION_MODE_SYNC {
		// At apply: served to plain reads there (waitClass.visible).
		c := waitClass{level: t.policy.SyncLevel, k: t.policy.SyncReplicas, visible: true}
		if err := p.peers.waitReplicas(ctx, t.commitLSN, c); err != nil {
			return fmt.Errorf("%w: commit LSN %d is durable on the primary but was not confirmed by %d replica(s) at %s within %v: %v",
				rpcerr.ErrUnavailable, t.commitLSN, t.policy.SyncReplicas, levelName(t.policy.SyncLevel), t.policy.SyncTimeout, err)
		}
	}
	if t.policy.LogStore == walshipv1.LogStoreAck_LOG_STORE_ACK_SYNC {
		if err := p.peers.waitLogStores(ctx, t.commitLSN); err != nil {
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
func (p *pipeline) resolve(t *txn) (<-chan struct{}, error) {
	shown, err := p.resolveLocked(t)
	if err != nil {
		// The sequencer built these records, so this is a bug; stop making
		// anything visible rather than serve a state that skipped a commit.
		// Outside visMu: fail takes seqMu, which sequencing holds while it
		// takes visMu.
		p.logger.Error("cannot apply sequenced records; visibility stopped", "err", err)
		p.fail(err, nil)
		return nil, err
	}
	return shown, nil
}

func (p *pipeline) resolveLocked(t *txn) (<-chan struct{}, error) {
	p.visMu.Lock()
	defer p.visMu.Unlock()
	t.resolved = true
	n := 0
	for n < len(p.unresolved) && p.unresolved[n].resolved {
		n++
	}
	if n == 0 {
		t.shown = make(chan struct{})
		return t.shown, nil
	}
	p.applyBatch.Reset()
	for _, u := range p.unresolved[:n] {
		p.applyBatch.Records = append(p.applyBatch.Records, u.recs...)
	}
	// The apply hands over the previous values the watch feed's
	// transactions carry; commit times come in LSN order.
	changes, err := p.store.ApplyChanges(&p.applyBatch, nil)
	if err != nil {
		return nil, fmt.Errorf("apply sequenced records: %w", err)
	}
	i := 0
	p.feedTxns = changefeed.FromChanges(p.feedTxns[:0], p.applyBatch.Records, changes, func(lsn uint64) int64 {
		for i < n-1 && p.unresolved[i].commitLSN < lsn {
			i++
		}
		return p.unresolved[i].commitTime
	})
	p.feed.Append(p.feedTxns)
	clear(p.feedTxns) // the ring holds them, not this scratch list
	last := p.unresolved[n-1].commitLSN
	p.overlay.Release(last)
	p.visible.Advance(last)
	for _, u := range p.unresolved[:n] {
		if u.shown != nil {
			close(u.shown)
		}
	}
	clear(p.unresolved[:n])
	p.unresolved = p.unresolved[n:]
	if t.commitLSN > last {
		t.shown = make(chan struct{})
		return t.shown, nil
	}
	return nil, nil
}
