package primary

import (
	"context"
	"fmt"

	walshipv1 "github.com/walship/walship/gen/walship/v1"
	"github.com/walship/walship/internal/changefeed"
	"github.com/walship/walship/internal/rpcerr"
)

// awaitPeers waits for the replicas and log stores t's policy requires.
func (p *pipeline) awaitPeers(t *txn) error {
	if !t.policy.waitsForPeers() {
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

// resolve marks the transactions of calls resolved (those that reached
// the WAL) and makes visible every transaction of the resolved prefix:
// they are applied to the store, released from the overlay, and the
// visible LSN advances. Visibility is a prefix so that a reader never
// sees a commit without every commit before it. Each of them not visible
// yet gets its shown channel, closed once it is.
func (p *pipeline) resolve(calls []call) error {
	err := p.resolveLocked(calls)
	if err != nil {
		// The sequencer built these records, so this is a bug; stop making
		// anything visible rather than serve a state that skipped a commit.
		// Outside visMu: fail takes seqMu, which sequencing holds while it
		// takes visMu.
		p.logger.Error("cannot apply sequenced records; visibility stopped", "err", err)
		p.fail(err, nil)
	}
	return err
}

func (p *pipeline) resolveLocked(calls []call) error {
	some := false
	for i := range calls {
		some = some || calls[i].resolvable()
	}
	if !some {
		return nil
	}
	p.visMu.Lock()
	defer p.visMu.Unlock()
	for i := range calls {
		if c := &calls[i]; c.resolvable() {
			c.t.resolved = true
		}
	}
	n := 0
	for n < len(p.unresolved) && p.unresolved[n].resolved {
		n++
	}
	last := p.visible.Load()
	if n > 0 {
		p.applyBatch.Reset()
		for _, u := range p.unresolved[:n] {
			p.applyBatch.Records = append(p.applyBatch.Records, u.recs...)
		}
		// The apply hands over the previous values the watch feed's
		// transactions carry; commit times come in LSN order.
		changes, err := p.store.ApplyChanges(&p.applyBatch, nil)
		if err != nil {
			return fmt.Errorf("apply sequenced records: %w", err)
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
		last = p.unresolved[n-1].commitLSN
		p.overlay.Release(last)
		p.visible.Advance(last)
		for _, u := range p.unresolved[:n] {
			if u.shown != nil {
				close(u.shown)
			}
		}
		clear(p.unresolved[:n])
		p.unresolved = p.unresolved[n:]
	}
	for i := range calls {
		if c := &calls[i]; c.resolvable() && c.t.commitLSN > last {
			c.t.shown = make(chan struct{})
		}
	}
	return nil
}
