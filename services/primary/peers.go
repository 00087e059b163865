package primary

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	walshipv1 "github.com/walship/walship/gen/walship/v1"
	"github.com/walship/walship/internal/failover"
)

// peers tracks the acknowledged positions of replicas and log stores, and
// lets synchronous commits wait for "any k at this stage". Waiting commits
// queue in LSN order, one queue per (stage, k) for replicas and one for log
// stores, and a position update releases exactly the prefix of each queue
// that it covers (PostgreSQL's SyncRepWakeQueue): an ack wakes the commits
// it satisfies and no others.
type peers struct {
	mu        sync.Mutex
	replicas  map[string]*replicaPos
	logstores map[string]*logstorePos
	quorum    int // log store majority; 0 = no log store configured
	// rule is the ack rule of the configuration in force (ackrule.go);
	// ruleNow the same, read without mu (checkSyncReplicas, on every
	// commit). nil before the first setRule: no members.
	rule    ackRule
	ruleNow atomic.Pointer[ackRule]
	// replWaiters and lsWaiters are the waiting commits; guarded by mu.
	replWaiters map[waitClass]*lsnQueue
	lsWaiters   lsnQueue
	// waiting counts sync commits waiting on replicas at each stage (index:
	// the SyncLevel). While one waits at a stage, replica streams ask for
	// an ack at that stage after each batch.
	waiting [walshipv1.SyncLevel_SYNC_LEVEL_APPLY + 1]atomic.Int64
	// lsWaiting counts commits waiting on log stores, likewise.
	lsWaiting atomic.Int64
	// changed is closed (and dropped) by the next replica update, for
	// waitReplica; guarded by mu.
	changed chan struct{}
	// switching counts switchovers waiting for their target to flush
	// (waitReplica), which no stream may hold a batch back from.
	switching atomic.Int64
	// arrived is closed (and dropped) when a wait on peers begins, so that
	// a stream holding a batch back (--ship-delay) sends it at once;
	// guarded by arrivedMu. nil while no stream listens.
	arrivedMu sync.Mutex
	arrived   chan struct{}
	// uploader is the log store asked to upload to the archive (see
	// archiver); guarded by mu.
	uploader string
	// moved is closed (and dropped) by the next update of any replica or
	// log store, for the commit watermark (trackCommit); guarded by mu.
	moved chan struct{}
}

// movedCh returns a channel closed by the next position update. Take it
// before reading the positions.
func (p *peers) movedCh() <-chan struct{} {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.moved == nil {
		p.moved = make(chan struct{})
	}
	return p.moved
}

// movedLocked wakes movedCh's callers.
func (p *peers) movedLocked() {
	if p.moved != nil {
		close(p.moved)
		p.moved = nil
	}
}

// waitsBegin returns a channel closed when the next wait on peers (a sync
// commit's, an epoch's, a switchover's) begins. Take it before looking at
// the counts: a wait counted after the look closes it.
func (p *peers) waitsBegin() <-chan struct{} {
	p.arrivedMu.Lock()
	defer p.arrivedMu.Unlock()
	if p.arrived == nil {
		p.arrived = make(chan struct{})
	}
	return p.arrived
}

// announceWait wakes the streams waiting on waitsBegin; a wait calls it
// after it is counted.
func (p *peers) announceWait() {
	p.arrivedMu.Lock()
	defer p.arrivedMu.Unlock()
	if p.arrived != nil {
		close(p.arrived)
		p.arrived = nil
	}
}

// waitClass is what a sync commit waits for: k replicas at a stage.
// visible (at SYNC_LEVEL_APPLY) counts what replicas serve to plain reads
// rather than what they applied: a commit at apply waits for it, while
// the commit watermark and the epoch record count applied (their
// visibility on replicas follows the watermark, so waiting for it there
// would wait for itself).
type waitClass struct {
	level   walshipv1.SyncLevel
	k       int
	visible bool
}

// anyReplicaWaiting reports whether a sync commit waits on replicas, at
// any stage, or a switchover on its target.
func (p *peers) anyReplicaWaiting() bool {
	if p.switching.Load() > 0 {
		return true
	}
	for i := range p.waiting {
		if p.waiting[i].Load() > 0 {
			return true
		}
	}
	return false
}

// lsnWaiter is one waiting commit; done is closed when it is released.
type lsnWaiter struct {
	lsn  uint64
	done chan struct{}
}

// lsnQueue holds waiters in LSN order. Commits register in about LSN order,
// so add inserts near the end.
type lsnQueue []*lsnWaiter

func (q *lsnQueue) add(lsn uint64) *lsnWaiter {
	w := &lsnWaiter{lsn: lsn, done: make(chan struct{})}
	i := len(*q)
	for i > 0 && (*q)[i-1].lsn > lsn {
		i--
	}
	*q = slices.Insert(*q, i, w)
	return w
}

// release wakes and drops every waiter at or below upto.
func (q *lsnQueue) release(upto uint64) {
	n := 0
	for n < len(*q) && (*q)[n].lsn <= upto {
		close((*q)[n].done)
		n++
	}
	if n > 0 {
		rest := copy(*q, (*q)[n:])
		clear((*q)[rest:])
		*q = (*q)[:rest]
	}
}

// remove drops w (its wait ended without a release); it reports whether w
// was still queued.
func (q *lsnQueue) remove(w *lsnWaiter) bool {
	i := slices.Index(*q, w)
	if i < 0 {
		return false
	}
	*q = slices.Delete(*q, i, i+1)
	return true
}

// replicaPos is what the primary knows of one replica.
type replicaPos struct {
	id                        string
	connected                 bool
	written, flushed, applied uint64
	// visible is the LSN the replica serves plain reads at;
	// reportsVisible, whether it has ever said (older versions do not,
	// and then count applied).
	visible        uint64
	reportsVisible bool
	sentBytes      uint64
	lastAck        time.Time
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
	// archive is the archive the log store says it has ("" for none);
	// archived how far it says the archive goes.
	archive  string
	archived uint64
}

func newPeers() *peers {
	return &peers{replicas: map[string]*replicaPos{}, logstores: map[string]*logstorePos{}, replWaiters: map[waitClass]*lsnQueue{}}
}

// updateReplica changes one replica's entry under the lock and releases
// the waiters its new positions satisfy.
func (p *peers) updateReplica(id string, f func(r *replicaPos)) {
	p.mu.Lock()
	defer p.mu.Unlock()
	r, ok := p.replicas[id]
	if !ok {
		r = &replicaPos{id: id}
		p.replicas[id] = r
	}
	f(r)
	p.movedLocked()
	if p.changed != nil {
		close(p.changed)
		p.changed = nil
	}
	for c, q := range p.replWaiters {
		if len(*q) > 0 {
			q.release(p.replicaQuorumLocked(c))
		}
	}
}

// connectReplica records a new stream of replica id from LSN next and
// returns its session. Until its first ack, only what the hello implies is
// trusted: it has written everything before next, and flushed and applied
// no more than that.
func (p *peers) connectReplica(id string, next uint64) (session uint64) {
	p.updateReplica(id, func(r *replicaPos) {
		r.connected = true
		r.session++
		session = r.session
		r.written, r.flushed, r.applied = next-1, min(r.flushed, next-1), min(r.applied, next-1)
		r.visible = min(r.visible, next-1)
		r.lastAck = time.Now()
	})
	return session
}

// disconnectReplica records the end of a stream, unless a newer one of the
// same replica has begun.
func (p *peers) disconnectReplica(id string, session uint64) {
	p.updateReplica(id, func(r *replicaPos) {
		if r.session == session {
			r.connected = false
		}
	})
}

// updateLogStore changes one log store's entry under the lock and releases
// the waiters a majority now covers.
func (p *peers) updateLogStore(addr string, f func(l *logstorePos)) {
	p.mu.Lock()
	defer p.mu.Unlock()
	l, ok := p.logstores[addr]
	if !ok {
		l = &logstorePos{addr: addr}
		p.logstores[addr] = l
	}
	f(l)
	p.movedLocked()
	if len(p.lsWaiters) > 0 {
		p.lsWaiters.release(p.logStoreQuorumLocked())
	}
}

// logStoreQuorum is logStoreQuorumLocked, locking.
func (p *peers) logStoreQuorum() uint64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.logStoreQuorumLocked()
}

// archiver returns the log store that uploads to the archive: the one
// that does now while its stream is open, else the first of order with
// an archive and an open stream ("" if none). Sticky, so that the job
// moves only when its log store goes away.
func (p *peers) archiver(order []string) string {
	p.mu.Lock()
	defer p.mu.Unlock()
	if l := p.logstores[p.uploader]; l != nil && l.connected && l.archive != "" {
		return p.uploader
	}
	p.uploader = ""
	for _, addr := range order {
		if l := p.logstores[addr]; l != nil && l.connected && l.archive != "" {
			p.uploader = addr
			break
		}
	}
	return p.uploader
}

// archived returns the archive's URL and the highest archived LSN the log
// stores report ("" and 0 when none has an archive).
func (p *peers) archived() (url string, lsn uint64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, l := range p.logstores {
		if l.archive != "" && (url == "" || l.addr == p.uploader) {
			url = l.archive
		}
		lsn = max(lsn, l.archived)
	}
	return url, lsn
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

// pos is r's position for c.
func (r *replicaPos) pos(c waitClass) uint64 {
	if c.visible && c.level == walshipv1.SyncLevel_SYNC_LEVEL_APPLY && r.reportsVisible {
		return r.visible
	}
	return r.at(c.level)
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

// waitReplicas blocks until k connected replicas report lsn at c's stage,
// or ctx ends; the error then says how many did.
func (p *peers) waitReplicas(ctx context.Context, lsn uint64, c waitClass) error {
	waiting := &p.waiting[c.level]
	waiting.Add(1)
	defer waiting.Add(-1)
	p.announceWait()
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.replicaQuorumLocked(c) >= lsn {
		return nil
	}
	q := p.replWaiters[c]
	if q == nil {
		q = &lsnQueue{}
		p.replWaiters[c] = q
	}
	if p.waitLocked(ctx, q, lsn) {
		return nil
	}
	have, connected := 0, 0
	for _, r := range p.replicas {
		if r.connected && p.counts(r.id) {
			connected++
			if r.pos(c) >= lsn {
				have++
			}
		}
	}
	return fmt.Errorf("%d of %d connected replica(s) reached it", have, connected)
}

// waitLocked queues a waiter for lsn on q and waits until a position
// update releases it (true) or ctx ends first (false; the waiter is then
// dequeued). p.mu is held on entry and on return, not while waiting.
func (p *peers) waitLocked(ctx context.Context, q *lsnQueue, lsn uint64) bool {
	w := q.add(lsn)
	p.mu.Unlock()
	select {
	case <-w.done:
		p.mu.Lock()
		return true
	case <-ctx.Done():
		p.mu.Lock()
		return !q.remove(w) // no longer queued: released as ctx ended
	}
}

// errNoLogStore is returned to a commit that asks for log store acks from a
// primary that has none.
var errNoLogStore = errors.New("no log store is configured (--logstore)")

// waitLogStoreSets blocks until a majority of each of sets (log store
// addresses) has made lsn durable, or ctx ends; it asks the streams for
// acks meanwhile, as a commit waiting on log stores does.
func (p *peers) waitLogStoreSets(ctx context.Context, lsn uint64, sets ...[]string) error {
	p.lsWaiting.Add(1)
	defer p.lsWaiting.Add(-1)
	p.announceWait()
	for {
		moved := p.movedCh()
		p.mu.Lock()
		var short []string
		for _, set := range sets {
			have := 0
			for _, addr := range set {
				if l := p.logstores[addr]; l != nil && l.durable >= lsn {
					have++
				}
			}
			if need := failover.Majority(len(set)); have < need {
				short = append(short, fmt.Sprintf("%d of log stores %s have it, %d needed", have, strings.Join(set, ", "), need))
			}
		}
		p.mu.Unlock()
		if len(short) == 0 {
			return nil
		}
		select {
		case <-moved:
		case <-ctx.Done():
			return fmt.Errorf("%s", strings.Join(short, "; "))
		}
	}
}

// waitLogStores blocks until a majority of the configured log stores has
// made lsn durable, or ctx ends.
func (p *peers) waitLogStores(ctx context.Context, lsn uint64) error {
	p.lsWaiting.Add(1)
	defer p.lsWaiting.Add(-1)
	p.announceWait()
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.quorum == 0 {
		return errNoLogStore
	}
	if p.logStoreQuorumLocked() >= lsn || p.waitLocked(ctx, &p.lsWaiters, lsn) {
		return nil
	}
	if p.rule.logstores == nil {
		have := 0
		for _, l := range p.logstores {
			if l.durable >= lsn {
				have++
			}
		}
		return fmt.Errorf("%d of %d log store(s) have it, %d needed", have, len(p.logstores), p.quorum)
	}
	// Each half of the contract in force: while a membership change is
	// joint, a majority of both sets.
	var parts []string
	for i, q := range p.rule.logstores {
		have := 0
		for _, addr := range q.Voters {
			if l := p.logstores[addr]; l != nil && l.durable >= lsn {
				have++
			}
		}
		part := fmt.Sprintf("%d of %d log store(s) have it, %d needed", have, len(q.Voters), q.Need)
		if i > 0 {
			part = "and of the configuration a membership change goes to, " + part
		}
		parts = append(parts, part)
	}
	return errors.New(strings.Join(parts, "; "))
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

// waitReplica blocks until replica id has flushed lsn, or ctx ends.
func (p *peers) waitReplica(ctx context.Context, id string, lsn uint64) error {
	p.switching.Add(1)
	defer p.switching.Add(-1)
	p.announceWait()
	for {
		p.mu.Lock()
		r := p.replicas[id]
		if r != nil && r.connected && r.flushed >= lsn {
			p.mu.Unlock()
			return nil
		}
		if p.changed == nil {
			p.changed = make(chan struct{})
		}
		ch := p.changed
		var flushed uint64
		connected := r != nil && r.connected
		if r != nil {
			flushed = r.flushed
		}
		p.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			if !connected {
				return fmt.Errorf("replica %s is not connected", id)
			}
			return fmt.Errorf("replica %s has flushed LSN %d", id, flushed)
		}
	}
}
