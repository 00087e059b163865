package primary

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	walshipv1 "github.com/walship/walship/gen/walship/v1"
)

// peers tracks the acknowledged positions of replicas and log stores, and
// lets synchronous commits wait for "any k at this stage".
type peers struct {
	mu        sync.Mutex
	replicas  map[string]*replicaPos
	logstores map[string]*logstorePos
	quorum    int           // log store majority; 0 = no log store configured
	changed   chan struct{} // closed and replaced on every change
	// waiting counts sync commits waiting on replicas: while it is not 0,
	// replica streams ask for an immediate flush and ack after each batch.
	waiting atomic.Int64
	// waitingApply counts those waiting for replicas to apply: replicas
	// apply only up to the primary's durable LSN, so while it is not 0 each
	// stream sends the new durable LSN the moment the WAL is synced.
	waitingApply atomic.Int64
	// lsWaiting counts commits waiting on log stores, likewise.
	lsWaiting atomic.Int64
}

// replicaPos is what the primary knows of one replica.
type replicaPos struct {
	id                        string
	connected                 bool
	written, flushed, applied uint64
	sentBytes                 uint64
	lastAck                   time.Time
	// session is bumped by every new stream, so the end of an old stream
	// cannot mark a newer one disconnected.
	session uint64
}

// logstorePos is what the primary knows of one log store.
type logstorePos struct {
	addr      string
	connected bool
	durable   uint64
	lastAck   time.Time
}

func newPeers() *peers {
	return &peers{replicas: map[string]*replicaPos{}, logstores: map[string]*logstorePos{}, changed: make(chan struct{})}
}

func (p *peers) notifyLocked() {
	close(p.changed)
	p.changed = make(chan struct{})
}

// update changes one replica's entry under the lock and wakes waiters.
func (p *peers) updateReplica(id string, f func(r *replicaPos)) {
	p.mu.Lock()
	defer p.mu.Unlock()
	r, ok := p.replicas[id]
	if !ok {
		r = &replicaPos{id: id}
		p.replicas[id] = r
	}
	f(r)
	p.notifyLocked()
}

// updateLogStore changes one log store's entry under the lock and wakes waiters.
func (p *peers) updateLogStore(addr string, f func(l *logstorePos)) {
	p.mu.Lock()
	defer p.mu.Unlock()
	l, ok := p.logstores[addr]
	if !ok {
		l = &logstorePos{addr: addr}
		p.logstores[addr] = l
	}
	f(l)
	p.notifyLocked()
}

// addSent counts bytes sent to a replica. It wakes no waiter: sending
// changes no position a commit waits for.
func (p *peers) addSent(id string, n uint64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if r, ok := p.replicas[id]; ok {
		r.sentBytes += n
	}
}

func (r *replicaPos) at(level walshipv1.SyncLevel) uint64 {
	switch level {
	case walshipv1.SyncLevel_SYNC_LEVEL_WRITE:
		return r.written
	case walshipv1.SyncLevel_SYNC_LEVEL_FLUSH:
		return r.flushed
	default:
		return r.applied
	}
}

// waitReplicas blocks until k connected replicas report lsn at level, or ctx
// ends; the error then says how many did.
func (p *peers) waitReplicas(ctx context.Context, lsn uint64, k int, level walshipv1.SyncLevel) error {
	p.waiting.Add(1)
	defer p.waiting.Add(-1)
	if level == walshipv1.SyncLevel_SYNC_LEVEL_APPLY {
		p.waitingApply.Add(1)
		defer p.waitingApply.Add(-1)
	}
	for {
		p.mu.Lock()
		have, connected := 0, 0
		for _, r := range p.replicas {
			if r.connected {
				connected++
				if r.at(level) >= lsn {
					have++
				}
			}
		}
		ch := p.changed
		p.mu.Unlock()
		if have >= k {
			return nil
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return fmt.Errorf("%d of %d connected replica(s) reached it", have, connected)
		}
	}
}

// errNoLogStore is returned to a commit that asks for log store acks from a
// primary that has none.
var errNoLogStore = errors.New("no log store is configured (--logstore)")

// waitLogStores blocks until a majority of the configured log stores has
// made lsn durable, or ctx ends.
func (p *peers) waitLogStores(ctx context.Context, lsn uint64) error {
	p.lsWaiting.Add(1)
	defer p.lsWaiting.Add(-1)
	for {
		p.mu.Lock()
		if p.quorum == 0 {
			p.mu.Unlock()
			return errNoLogStore
		}
		have := 0
		for _, l := range p.logstores {
			if l.durable >= lsn {
				have++
			}
		}
		quorum, total, ch := p.quorum, len(p.logstores), p.changed
		p.mu.Unlock()
		if have >= quorum {
			return nil
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return fmt.Errorf("%d of %d log store(s) have it, %d needed", have, total, quorum)
		}
	}
}

// snapshot returns copies of every peer, sorted by id, for Status and metrics.
func (p *peers) snapshot() ([]replicaPos, []logstorePos) {
	p.mu.Lock()
	defer p.mu.Unlock()
	rs := make([]replicaPos, 0, len(p.replicas))
	for _, r := range p.replicas {
		rs = append(rs, *r)
	}
	ls := make([]logstorePos, 0, len(p.logstores))
	for _, l := range p.logstores {
		ls = append(ls, *l)
	}
	sort.Slice(rs, func(i, j int) bool { return rs[i].id < rs[j].id })
	sort.Slice(ls, func(i, j int) bool { return ls[i].addr < ls[j].addr })
	return rs, ls
}
