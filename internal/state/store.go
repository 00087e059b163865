package state

import (
	"bytes"
	"errors"
	"fmt"
	"math"
	"sync"
	"unsafe"

	"github.com/google/btree"

	"github.com/walship/walship/pkg/codec"
)

// Errors returned by [Store.Apply]; test for them with errors.Is.
var (
	// ErrLSNMismatch means a batch does not start right after the store's
	// applied LSN: a gap (records are missing) or an overlap (records were
	// already applied).
	ErrLSNMismatch = errors.New("state: batch does not follow applied LSN")
	// ErrInvalidBatch means a batch is malformed: empty, LSNs not
	// consecutive, an unknown op, a transaction mixing TxnIDs, or no
	// trailing commit.
	ErrInvalidBatch = errors.New("state: invalid batch")
)

// btreeDegree trades tree depth against the copy-on-write cost after a
// Snapshot (the first Apply after one copies every node on the paths it
// touches, up to 2×degree items each). 32 is the common choice for in-memory
// B-trees of short keys.
const btreeDegree = 32

// entry is one live key. Entries are immutable once published: a write
// replaces the entry, it never modifies one, which is what lets readers hold
// on to values without copying.
//
// Its key and value live in one allocation that p points to (the key, then
// the value) and the entry holds their lengths: 24 bytes and one pointer,
// where a string and a slice would take 48 and two. The tree's nodes hold
// entries by value, so this halves what an insert moves and what the
// garbage collector scans in a store of millions of keys.
type entry struct {
	p       *byte
	keyLen  uint32
	valLen  uint32
	version uint64
}

// key returns the entry's key, sharing its memory.
func (e entry) key() string { return unsafe.String(e.p, e.keyLen) }

// value returns the entry's value, sharing its memory: not nil for a
// stored entry, even an empty one, and capped so that an append by a
// careless reader reallocates instead of running into memory it does not
// own. An empty value is cut from the allocation's start, never one past
// its end (a pointer there could keep the next object alive).
func (e entry) value() []byte {
	if e.p == nil {
		return nil
	}
	if e.valLen == 0 {
		return unsafe.Slice(e.p, 0)
	}
	return unsafe.Slice((*byte)(unsafe.Add(unsafe.Pointer(e.p), e.keyLen)), e.valLen)
}

func entryLess(a, b entry) bool { return a.key() < b.key() }

func newTree() *btree.BTreeG[entry] { return btree.NewG(btreeDegree, entryLess) }

// maxEntryPart is the longest key, and the longest value, an entry holds
// (the snapshot format's limit too).
const maxEntryPart = math.MaxUint32

// newEntry copies key and value into one allocation, since both live exactly
// as long as the entry. Their lengths must not exceed maxEntryPart (Apply
// and the Builder check).
func newEntry(key, value []byte, version uint64) entry {
	buf := make([]byte, len(key)+len(value))
	copy(buf, key)
	copy(buf[len(key):], value)
	return newEntryFrom(buf, len(key), version)
}

// newEntryFrom makes an entry owning buf, which holds the key in its first
// keyLen bytes and the value in the rest.
func newEntryFrom(buf []byte, keyLen int, version uint64) entry {
	// buf is never nil (make, or a reader's buffer), even empty, so a
	// stored entry's value() is never nil: only the zero entry's is.
	return entry{p: unsafe.SliceData(buf), keyLen: uint32(keyLen), valLen: uint32(len(buf) - keyLen), version: version}
}

// probe returns a search key aliasing k without copying. It is only used for
// lookups that finish before returning to the caller, so k cannot change
// underneath the tree.
func probe(k []byte) entry {
	return entry{p: unsafe.SliceData(k), keyLen: uint32(len(k))}
}

// keyBytes returns a stored key as a byte slice without copying; readers
// must not modify it (documented on Scan).
func keyBytes(s string) []byte { return unsafe.Slice(unsafe.StringData(s), len(s)) }

// View is an immutable point-in-time image of a [Store]: its content,
// applied LSN and digest as of one Apply. Later writes to the store never
// affect it, so it can be read, scanned, written to a snapshot or streamed
// to a replica at leisure. A View is safe for concurrent use.
type View struct {
	tree   *btree.BTreeG[entry] // never modified once the View is published
	lsn    uint64
	digest Digest
}

// AppliedLSN returns the LSN of the last record reflected in the view, or 0
// for a store that has applied nothing.
func (v *View) AppliedLSN() uint64 { return v.lsn }

// Digest returns the digest of the view's content.
func (v *View) Digest() Digest { return v.digest }

// Len returns the number of live keys.
func (v *View) Len() int { return v.tree.Len() }

// Get returns the value and version (commit LSN of the transaction that last
// wrote it) of key. The
// value is shared with the store: the caller must not modify it, and it
// never changes.
func (v *View) Get(key []byte) (value []byte, version uint64, ok bool) {
	e, ok := v.tree.Get(probe(key))
	if !ok {
		return nil, 0, false
	}
	return e.value(), e.version, true
}

// Scan calls fn for the keys in [start, end) in ascending order, at most
// limit of them (limit <= 0 means no limit), stopping early when fn returns
// false. An empty end means the end of the keyspace. key and value are
// shared with the store: fn must not modify them, but may keep them.
func (v *View) Scan(start, end []byte, limit int, fn func(key, value []byte, version uint64) bool) {
	if len(end) > 0 && bytes.Compare(start, end) >= 0 {
		return
	}
	n := 0
	iter := func(e entry) bool {
		if !fn(keyBytes(e.key()), e.value(), e.version) {
			return false
		}
		n++
		return limit <= 0 || n < limit
	}
	// The bounds are copied, not aliased: fn runs in the middle of the
	// iteration and may well reuse the caller's buffers.
	lo := probe(bytes.Clone(start))
	if len(end) == 0 {
		v.tree.AscendGreaterOrEqual(lo, iter)
		return
	}
	v.tree.AscendRange(lo, probe(bytes.Clone(end)), iter)
}

// Store is the materialised state: an ordered map from key to (value,
// version) built by applying WAL batches in LSN order.
//
// Apply mutates the tree in place under a write lock, so readers see whole
// batches only, and point reads take a read lock. Scans and [Store.Snapshot]
// work on a copy-on-write clone of the tree, taken in O(1) and shared until
// the next Apply, so they hold no lock while they run and see one version
// throughout. Apply calls are serialised; the intended use is one applying
// goroutine and any number of readers.
type Store struct {
	mu     sync.RWMutex
	tree   *btree.BTreeG[entry]
	lsn    uint64
	digest Digest
	// view is the clone handed out by Snapshot since the last Apply, nil if
	// none. Reusing it means a Clone (which makes the next Apply copy the
	// nodes it touches) happens at most once per Apply, however many scans
	// run.
	view   *View
	hasher *entryHasher // used under mu by Apply
}

// New returns an empty store whose applied LSN is 0, so its first batch must
// start at LSN 1.
func New() *Store { return newStore(newTree(), 0, Digest{}) }

func newStore(t *btree.BTreeG[entry], lsn uint64, d Digest) *Store {
	return &Store{tree: t, lsn: lsn, digest: d, hasher: newEntryHasher()}
}

// Snapshot returns the current state as an immutable [View], in O(1).
func (s *Store) Snapshot() *View {
	s.mu.RLock()
	v := s.view
	s.mu.RUnlock()
	if v != nil {
		return v
	}
	// Clone writes to the tree's copy-on-write context, so it needs the
	// write lock.
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.view == nil {
		s.view = &View{tree: s.tree.Clone(), lsn: s.lsn, digest: s.digest}
	}
	return s.view
}

// AppliedLSN returns the LSN of the last applied record (0 if none).
func (s *Store) AppliedLSN() uint64 {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.lsn
}

// Len returns the number of live keys.
func (s *Store) Len() int {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.tree.Len()
}

// Digest returns the digest of the current content in O(1).
func (s *Store) Digest() Digest {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.digest
}

// Get is [View.Get] on the current state.
func (s *Store) Get(key []byte) (value []byte, version uint64, ok bool) {
	s.mu.RLock()
	e, ok := s.tree.Get(probe(key))
	s.mu.RUnlock()
	if !ok {
		return nil, 0, false
	}
	return e.value(), e.version, true
}

// Scan is [View.Scan] on a [Store.Snapshot]: one consistent version
// throughout, however many batches are applied while it runs, and fn may
// call back into the store.
func (s *Store) Scan(start, end []byte, limit int, fn func(key, value []byte, version uint64) bool) {
	s.Snapshot().Scan(start, end, limit, fn)
}

// Apply applies the puts and deletes of b in order and advances the applied
// LSN to b.LastLSN(). All of b becomes visible to readers at once.
//
// b must start at AppliedLSN()+1 (else [ErrLSNMismatch]), have consecutive
// LSNs, known ops, one TxnID per transaction and end with a commit (else
// [ErrInvalidBatch]). The whole batch is validated before anything changes,
// so on error the store is untouched. Keys and values are copied: b may be
// reused as soon as Apply returns.
func (s *Store) Apply(b *codec.Batch) error {
	_, err := s.apply(b, nil, false)
	return err
}

// Change is what applying one put or delete did to its key: the key, the
// value written (or that it was deleted) and the key's value and version just
// before. Its strings and slices are the store's own, immutable entries
// (no copy): the caller must not modify them, and may keep them.
type Change struct {
	Key         string
	Value       []byte // nil for a delete
	Deleted     bool
	Prev        []byte // the value just before (nil if none)
	PrevVersion uint64 // its version (0 if the key did not exist)
	PrevFound   bool   // whether the key existed just before
}

// ApplyChanges is [Store.Apply], and appends to changes one [Change] per
// put or delete of b, in order: the previous values Apply meets anyway
// while it replaces entries, for a change feed that would otherwise look
// each key up again before the apply. A write's previous value is the
// state just before it, so an earlier write of the same batch counts.
// On error nothing is applied and changes is returned as it was.
func (s *Store) ApplyChanges(b *codec.Batch, changes []Change) ([]Change, error) {
	return s.apply(b, changes, true)
}

func (s *Store) apply(b *codec.Batch, changes []Change, collect bool) ([]Change, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := validateBatch(b, s.lsn); err != nil {
		return changes, err
	}
	t, h := s.tree, s.hasher
	d := s.digest
	var commit uint64 // commit LSN of the transaction holding record i
	for i := range b.Records {
		r := &b.Records[i]
		if r.LSN > commit {
			commit = commitLSN(b.Records[i:])
		}
		switch r.Op {
		case codec.OpPut:
			e := newEntry(r.Key, r.Value, commit)
			old, ok := t.ReplaceOrInsert(e)
			if ok {
				d.sub(h.sumEntry(old))
			}
			d.add(h.sumEntry(e))
			if collect {
				changes = append(changes, Change{Key: e.key(), Value: e.value(), Prev: old.value(), PrevVersion: old.version, PrevFound: ok})
			}
		case codec.OpDelete:
			old, ok := t.Delete(probe(r.Key))
			if ok {
				d.sub(h.sumEntry(old))
			}
			if collect {
				c := Change{Key: old.key(), Deleted: true, Prev: old.value(), PrevVersion: old.version, PrevFound: ok}
				if !ok {
					c.Key = string(r.Key) // nothing of the store's to share
				}
				changes = append(changes, c)
			}
		}
	}
	s.lsn, s.digest, s.view = b.LastLSN(), d, nil
	return changes, nil
}

// commitLSN returns the LSN of the first commit record in recs: a key's
// version is the commit LSN of the transaction that last wrote it (etcd's
// mod_revision), so a writer's returned LSN is the version its keys get.
func commitLSN(recs []codec.Record) uint64 {
	for i := range recs {
		if recs[i].Op == codec.OpCommit {
			return recs[i].LSN
		}
	}
	return recs[len(recs)-1].LSN
}

// validateBatch checks everything Apply promises to check, so that applying
// cannot fail halfway.
func validateBatch(b *codec.Batch, applied uint64) error {
	if b == nil || len(b.Records) == 0 {
		return fmt.Errorf("%w: empty batch", ErrInvalidBatch)
	}
	if b.Records[0].LSN != applied+1 {
		return fmt.Errorf("%w: batch starts at LSN %d, applied LSN is %d",
			ErrLSNMismatch, b.Records[0].LSN, applied)
	}
	return CheckBatch(b)
}

// CheckBatch reports whether b is a batch Apply can take at some applied
// LSN: records at consecutive LSNs, each op known, whole transactions (no
// record of one transaction inside another's), ending with a commit. A
// replica checks this before it writes a batch, so that one it could never
// apply is refused rather than stored and then fatal at every restart.
func CheckBatch(b *codec.Batch) error {
	if b == nil || len(b.Records) == 0 {
		return fmt.Errorf("%w: empty batch", ErrInvalidBatch)
	}
	recs := b.Records
	open := false // inside a transaction whose TxnID is txn
	var txn uint64
	for i := range recs {
		r := &recs[i]
		if i > 0 && r.LSN != recs[i-1].LSN+1 {
			return fmt.Errorf("%w: LSN %d follows LSN %d", ErrInvalidBatch, r.LSN, recs[i-1].LSN)
		}
		if !r.Op.Valid() {
			return fmt.Errorf("%w: LSN %d: unknown %v", ErrInvalidBatch, r.LSN, r.Op)
		}
		if uint64(len(r.Key)) > maxEntryPart || uint64(len(r.Value)) > maxEntryPart {
			return fmt.Errorf("%w: LSN %d: a key of %d bytes or a value of %d, past the %d a store holds",
				ErrInvalidBatch, r.LSN, len(r.Key), len(r.Value), uint64(maxEntryPart))
		}
		if open && r.TxnID != txn {
			return fmt.Errorf("%w: LSN %d: txn %d inside txn %d", ErrInvalidBatch, r.LSN, r.TxnID, txn)
		}
		open, txn = r.Op != codec.OpCommit, r.TxnID
	}
	if open {
		return fmt.Errorf("%w: batch ends at LSN %d without a commit", ErrInvalidBatch, b.LastLSN())
	}
	return nil
}
