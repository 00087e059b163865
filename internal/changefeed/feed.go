// Package changefeed is the change stream KVService.Watch serves: a
// bounded, shared ring of recently applied transactions (decoded once,
// with their previous values, for every watcher: fan-out without a copy
// per watcher), the node's WAL for positions older than the ring, and the
// bound no watcher reads past — the commit watermark, so that no event is
// ever delivered that a failover can take back.
//
//	apply ──Build/Append──▶ Feed ring [from .. last] ──▶ watcher 1 ─Send▶
//	                          ▲ bound (commit watermark) ├▶ watcher 2 ─Send▶
//	WAL [first .. ] ──decode──┘ (positions < from)       └▶ ...
//
// A watcher holds a position, never a buffer: one that does not read
// blocks only its own Send (gRPC's flow-control window), and is cut off
// with RESOURCE_EXHAUSTED once a Send has been blocked for the stall
// bound; one that reads slowly and falls out of the ring continues from
// the WAL (or, needing previous values, is cut off with OUT_OF_RANGE).
package changefeed

import (
	"sync"
	"sync/atomic"

	walshipv1 "github.com/walship/walship/gen/walship/v1"
	"github.com/walship/walship/internal/keyspace"
	"github.com/walship/walship/internal/state"
	"github.com/walship/walship/internal/watermark"
	"github.com/walship/walship/pkg/codec"
	"google.golang.org/grpc/mem"
)

// Default bounds of a Feed's ring.
const (
	DefaultMaxBytes = 16 << 20
	DefaultMaxTxns  = 100_000
)

// Event is one write of a transaction; Txn is one transaction. Both are
// immutable once appended, and shared by every watcher.
type Event = walshipv1.WatchEvent

// Txn is one committed transaction.
type Txn struct {
	FirstLSN, LSN uint64
	CommitTime    int64
	size          int

	// changes are the transaction's writes as the store applied them
	// (FromChanges), made into events on first read: a node nobody
	// watches never builds them, and its ring holds this small header
	// and the changes only (the garbage collector scans the ring on
	// every cycle). A Txn read from a WAL (Build) has no changes.
	changes []state.Change
	r       atomic.Pointer[txnRead]
}

// txnRead is what watchers make of a Txn, on the first read, and share.
type txnRead struct {
	events   []*Event // keys of the reserved prefix are left out
	once     sync.Once
	withPrev *walshipv1.WatchTxn // every event, with previous values
	noPrev   *walshipv1.WatchTxn // every event, without

	// enc are the encoded elements of withPrev and noPrev, and partial
	// those of filters that match some of the events (see encode.go):
	// what watchers send, encoded once for all of them.
	enc          [2]lazyElem
	mu           sync.Mutex
	partial      map[filter]mem.Buffer
	partialBytes int
}

// lazyElem is an element encoded on first use.
type lazyElem struct {
	once sync.Once
	b    mem.Buffer
	err  error
}

// read returns what watchers share of t, made by the first of them.
func (t *Txn) read() *txnRead {
	if r := t.r.Load(); r != nil {
		return r
	}
	// Watchers reading t at the same moment may each make one; the
	// first published is everybody's.
	t.r.CompareAndSwap(nil, &txnRead{events: t.makeEvents()})
	return t.r.Load()
}

// Events returns t's events (keys of the reserved prefix left out), with
// previous values if t was applied with them: made once, then shared by
// every watcher.
func (t *Txn) Events() []*Event { return t.read().events }

func (t *Txn) makeEvents() []*Event {
	n := 0
	for i := range t.changes {
		if !reserved(t.changes[i].Key) {
			n++
		}
	}
	if n == 0 {
		return nil
	}
	// One allocation holds the events, one the list of them.
	evs := make([]Event, n)
	out := make([]*Event, n)
	i := 0
	for _, c := range t.changes {
		if reserved(c.Key) {
			continue
		}
		e := &evs[i]
		e.Key, e.Value = c.Key, c.Value
		e.Type = walshipv1.WatchEventType_WATCH_EVENT_TYPE_PUT
		if c.Deleted {
			e.Type = walshipv1.WatchEventType_WATCH_EVENT_TYPE_DELETE
		}
		e.PrevFound, e.PrevValue, e.PrevVersionLsn = c.PrevFound, c.Prev, c.PrevVersion
		out[i] = e
		i++
	}
	return out
}

func reserved(key string) bool { return len(key) > 0 && key[0] == keyspace.ReservedPrefix[0] }

// Full returns every event of t, with or without previous values: built
// once and shared by every watcher that takes all of t.
func (t *Txn) Full(prev bool) *walshipv1.WatchTxn {
	r := t.read()
	r.once.Do(func() {
		r.withPrev = &walshipv1.WatchTxn{Lsn: t.LSN, FirstLsn: t.FirstLSN, CommitTimeUnixNano: t.CommitTime, Events: r.events}
		evs := make([]*Event, len(r.events))
		stripped := false
		for i, e := range r.events {
			evs[i] = stripPrev(e)
			stripped = stripped || evs[i] != e
		}
		if !stripped { // no previous values to leave out: one message (and one encoding) for both
			r.noPrev = r.withPrev
			return
		}
		r.noPrev = &walshipv1.WatchTxn{Lsn: t.LSN, FirstLsn: t.FirstLSN, CommitTimeUnixNano: t.CommitTime, Events: evs}
	})
	if prev {
		return r.withPrev
	}
	return r.noPrev
}

func stripPrev(e *Event) *Event {
	if !e.PrevFound && e.PrevVersionLsn == 0 {
		return e
	}
	return &Event{Type: e.Type, Key: e.Key, Value: e.Value}
}

// eventSize is what one event counts towards a ring's bound.
func eventSize(key string, value []byte) int { return len(key) + len(value) + 64 }

// txnSize is what a transaction counts beyond its events.
const txnSize = 96

// FromChanges appends to dst the transactions of recs (whole
// transactions, in LSN order) that the store applied with changes (what
// [state.Store.ApplyChanges] returned for them: their previous values,
// and their keys and values shared with the store, not copied).
// commitTime gives a transaction's commit time by its commit LSN. The
// events are made only once a watcher reads them.
func FromChanges(dst []*Txn, recs []codec.Record, changes []state.Change, commitTime func(commitLSN uint64) int64) []*Txn {
	n := 0
	for i := range recs {
		if recs[i].Op == codec.OpCommit {
			n++
		}
	}
	txns := make([]Txn, n) // one allocation for the batch's transactions
	start, c, k := 0, 0, 0
	for i := range recs {
		r := &recs[i]
		if r.Op != codec.OpCommit {
			continue
		}
		t := &txns[k]
		k++
		t.FirstLSN, t.LSN, t.CommitTime = recs[start].LSN, r.LSN, commitTime(r.LSN)
		w := i - start // the transaction's writes
		t.changes = changes[c : c+w : c+w]
		if w == 0 {
			t.changes = nil
		}
		c += w
		t.size = txnSize
		for _, ch := range t.changes {
			if !reserved(ch.Key) {
				t.size += eventSize(ch.Key, ch.Value)
			}
		}
		dst = append(dst, t)
		start = i + 1
	}
	return dst
}

// Build turns records read from a WAL (whole transactions, in LSN order)
// into transactions without previous values. commitTime gives a
// transaction's commit time by its commit LSN.
func Build(recs []codec.Record, commitTime func(commitLSN uint64) int64) []*Txn {
	var out []*Txn
	start := 0
	for i := range recs {
		r := &recs[i]
		if r.Op != codec.OpCommit {
			continue
		}
		t := &Txn{FirstLSN: recs[start].LSN, LSN: r.LSN, CommitTime: commitTime(r.LSN)}
		var events []*Event
		// One allocation holds the transaction's keys and values.
		n := 0
		for _, w := range recs[start:i] {
			n += len(w.Key) + len(w.Value)
		}
		buf := make([]byte, 0, n)
		for _, w := range recs[start:i] {
			if len(w.Key) > 0 && w.Key[0] == keyspace.ReservedPrefix[0] {
				continue
			}
			e := &Event{Key: string(w.Key), Type: walshipv1.WatchEventType_WATCH_EVENT_TYPE_PUT}
			if w.Op == codec.OpDelete {
				e.Type = walshipv1.WatchEventType_WATCH_EVENT_TYPE_DELETE
			} else {
				buf = append(buf, w.Value...)
				e.Value = buf[len(buf)-len(w.Value) : len(buf) : len(buf)]
			}
			t.size += eventSize(e.Key, e.Value)
			events = append(events, e)
		}
		t.r.Store(&txnRead{events: events})
		t.size += txnSize
		out = append(out, t)
		start = i + 1
	}
	return out
}

// Feed is a node's ring of recent transactions and the bound watchers read
// up to. The owner appends every applied transaction in LSN order, and
// advances Bound. Safe for concurrent use.
type Feed struct {
	// Bound is the LSN watchers may read up to: the commit watermark, and
	// no further than the node has applied.
	Bound watermark.Watermark

	maxBytes, maxTxns int

	mu    sync.Mutex
	txns  []*Txn // ring, LSN order: txns[head:] then none (compacted on growth)
	head  int
	bytes int
	from  uint64 // every transaction with LSN >= from is in txns
	last  uint64 // the last LSN appended (or reset to)
	// origin is the LSN the node's state was at when the feed began (New
	// or Reset): a watch "from now" waits until the bound reaches it.
	origin uint64
	// changed is closed (and dropped) by the next Append or Reset.
	changed chan struct{}

	// bufs are the buffers messages are assembled in; runs the runs of
	// messages shared by the watchers that read them.
	bufs bufferPool
	runs runCache
}

// New returns a Feed holding nothing, covering LSNs after lsn; maxBytes
// and maxTxns bound its ring (0: the defaults).
func New(lsn uint64, maxBytes, maxTxns int) *Feed {
	if maxBytes <= 0 {
		maxBytes = DefaultMaxBytes
	}
	if maxTxns <= 0 {
		maxTxns = DefaultMaxTxns
	}
	return &Feed{maxBytes: maxBytes, maxTxns: maxTxns, from: lsn + 1, last: lsn, origin: lsn}
}

// Reset forgets every transaction: the node's state jumped to lsn (a
// re-seed from a snapshot), and what is before is not in the ring.
func (f *Feed) Reset(lsn uint64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	clear(f.txns)
	f.txns, f.head, f.bytes = f.txns[:0], 0, 0
	f.from, f.last, f.origin = lsn+1, lsn, lsn
	f.wakeLocked()
}

// Append adds applied transactions, which follow the last one.
func (f *Feed) Append(txns []*Txn) {
	if len(txns) == 0 {
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, t := range txns {
		f.txns = append(f.txns, t)
		f.bytes += t.size
		f.last = t.LSN
	}
	for len(f.txns)-f.head > 1 && (f.bytes > f.maxBytes || len(f.txns)-f.head > f.maxTxns) {
		t := f.txns[f.head]
		f.txns[f.head] = nil
		f.head++
		f.bytes -= t.size
		f.from = t.LSN + 1
	}
	if f.head > len(f.txns)/2 && f.head > 1024 {
		n := copy(f.txns, f.txns[f.head:])
		clear(f.txns[n:])
		f.txns, f.head = f.txns[:n], 0
	}
	f.wakeLocked()
}

func (f *Feed) wakeLocked() {
	if f.changed != nil {
		close(f.changed)
		f.changed = nil
	}
}

// From returns the oldest LSN the ring covers: every transaction whose
// commit LSN is at least From is in it.
func (f *Feed) From() uint64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.from
}

// Origin returns the LSN the node's state was at when the feed began.
func (f *Feed) Origin() uint64 {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.origin
}

// read appends to buf the transactions with commit LSN in [next, upto],
// at most max of them. ok is false if next is older than the ring.
// changed is closed by the next Append or Reset.
func (f *Feed) read(next, upto uint64, max int, buf []*Txn) (out []*Txn, ok bool, changed <-chan struct{}) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.changed == nil {
		f.changed = make(chan struct{})
	}
	if next < f.from {
		return buf, false, f.changed
	}
	ring := f.txns[f.head:]
	// Binary search for the first transaction at or after next.
	lo, hi := 0, len(ring)
	for lo < hi {
		m := (lo + hi) / 2
		if ring[m].LSN < next {
			lo = m + 1
		} else {
			hi = m
		}
	}
	for i := lo; i < len(ring) && ring[i].LSN <= upto && len(buf) < max; i++ {
		buf = append(buf, ring[i])
	}
	return buf, true, f.changed
}
