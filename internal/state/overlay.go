package state

import (
	"sync"
	"unsafe"

	"github.com/walship/walship/pkg/codec"
)

// Overlay layers a primary's pending writes (sequenced: given an LSN, but not
// yet applied to the Store) over the Store. The sequencer evaluates the
// [Compare]s of each new transaction against the Overlay, so a transaction
// sees every write sequenced before it even while the Store, which is what
// clients read, still lags behind at the visible LSN.
//
// An Overlay is safe for concurrent use: the sequencer calls Stage and Get
// under its own lock while the applier calls Release from another goroutine.
type Overlay struct {
	base *Store

	mu      sync.Mutex
	pending map[string]pendingWrite
	// order lists staged writes by ascending commit LSN, so Release pops
	// from the front instead of scanning the map.
	order []stagedKey
	head  int // order[:head] has been released
}

// pendingWrite is the newest staged write of a key.
type pendingWrite struct {
	value   []byte // nil for a delete
	lsn     uint64 // commit LSN of the staging transaction: the version
	deleted bool
}

type stagedKey struct {
	key string
	lsn uint64
}

// NewOverlay returns an Overlay with nothing pending over base.
func NewOverlay(base *Store) *Overlay {
	return &Overlay{base: base, pending: make(map[string]pendingWrite)}
}

// Get returns key as a transaction sequenced now would see it: the newest
// pending write of key if there is one (a pending delete reads as not
// found), else the base Store's entry. A pending put's version is the commit
// LSN of its transaction, the version the key will have once applied.
func (o *Overlay) Get(key []byte) (value []byte, version uint64, ok bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	value, version, ok, _ = o.readLocked(key, false)
	return value, version, ok
}

// Read is Get for a reader that must not see a write before it is
// visible: it also returns after, the LSN that must be visible before the
// result may be returned — the commit LSN of the pending write it returns
// (a put or a delete), or, for a key read from the base Store, the Store's
// applied LSN (the Store may have applied, but not yet made visible, the
// write that left it so). Reads of keys no in-flight transaction wrote thus
// wait for nothing beyond the visible LSN.
func (o *Overlay) Read(key []byte) (value []byte, version uint64, ok bool, after uint64) {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.readLocked(key, true)
}

// readLocked is Get and Read under o.mu; withAfter asks for Read's after
// (which costs a read of the Store's applied LSN). The map lookup with
// string(key) does not allocate. The base is read under the lock too:
// Release runs only after the base has applied what it drops, so whichever
// side of a Release we are on, one of the two holds the newest write.
func (o *Overlay) readLocked(key []byte, withAfter bool) (value []byte, version uint64, ok bool, after uint64) {
	if p, found := o.pending[string(key)]; found {
		if p.deleted {
			return nil, 0, false, p.lsn
		}
		return p.value, p.lsn, true, p.lsn
	}
	value, version, ok = o.base.Get(key)
	if withAfter {
		after = o.base.AppliedLSN()
	}
	return value, version, ok, after
}

// Stage records the puts and deletes among recs (one sequenced transaction;
// commit records are skipped, as are unknown ops, which the sequencer never
// produces) as pending, in order. Keys and values are kept, not copied,
// and must not change once staged (a sequenced record is written to the
// WAL and applied later anyway, so the sequencer never reuses one; its
// keys are views of the requests' strings).
// recs must carry LSNs above every LSN staged before.
func (o *Overlay) Stage(recs []codec.Record) {
	if len(recs) == 0 {
		return
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	// Every write of the transaction gets its commit LSN as version, as
	// Store.Apply will give it.
	commit := commitLSN(recs)
	for i := range recs {
		r := &recs[i]
		var p pendingWrite
		switch r.Op {
		case codec.OpPut:
			// Not nil for an empty value (nil is a delete's), and capped,
			// as the store's values are: a reader's append reallocates
			// rather than write into the rest of the request's array.
			v := r.Value[:len(r.Value):len(r.Value)]
			if v == nil {
				v = []byte{}
			}
			p = pendingWrite{value: v, lsn: commit}
		case codec.OpDelete:
			p = pendingWrite{lsn: commit, deleted: true}
		default:
			continue
		}
		k := unsafe.String(unsafe.SliceData(r.Key), len(r.Key))
		o.pending[k] = p
		o.order = append(o.order, stagedKey{key: k, lsn: commit})
	}
}

// Release drops the pending writes of the transactions with commit LSN <=
// upToLSN: a transaction's writes are released together, never some of
// them. Call it once the base Store has applied up to upToLSN, never before,
// or Get would briefly miss those writes.
func (o *Overlay) Release(upToLSN uint64) {
	o.mu.Lock()
	defer o.mu.Unlock()
	for o.head < len(o.order) && o.order[o.head].lsn <= upToLSN {
		s := o.order[o.head]
		o.order[o.head] = stagedKey{} // let the key be collected
		o.head++
		// A later write of the same key supersedes this one and must stay.
		if p, ok := o.pending[s.key]; ok && p.lsn == s.lsn {
			delete(o.pending, s.key)
		}
	}
	// Reclaim the released prefix once it dominates the slice, keeping
	// Release amortised O(1) per write.
	if o.head == len(o.order) {
		o.order, o.head = o.order[:0], 0
	} else if o.head > 1024 && o.head > len(o.order)/2 {
		n := copy(o.order, o.order[o.head:])
		clear(o.order[n:])
		o.order, o.head = o.order[:n], 0
	}
}

// Len returns the number of keys with a pending write.
func (o *Overlay) Len() int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return len(o.pending)
}
