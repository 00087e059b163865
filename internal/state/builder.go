package state

import (
	"bytes"
	"fmt"
)

// Builder assembles a Store from pairs received in ascending key order — a
// snapshot streamed by the primary to re-seed a replica. It checks what
// ReadSnapshot checks of a file: strictly ascending keys, versions within
// 1..lsn, and in Finish the count and the digest.
type Builder struct {
	lsn   uint64
	store *Store
	prev  []byte
	n     uint64
	h     *entryHasher
}

// NewBuilder starts a Store at applied LSN lsn.
func NewBuilder(lsn uint64) *Builder {
	s := newStore(newTree(), lsn, Digest{})
	return &Builder{lsn: lsn, store: s, h: newEntryHasher()}
}

// Add adds one pair; key and value are copied.
func (b *Builder) Add(key, value []byte, version uint64) error {
	if b.n > 0 && bytes.Compare(key, b.prev) <= 0 {
		return corrupt("key %q does not follow %q", key, b.prev)
	}
	if version == 0 || version > b.lsn {
		return corrupt("key %q has version %d outside 1..%d", key, version, b.lsn)
	}
	if uint64(len(key)) > maxEntryPart || uint64(len(value)) > maxEntryPart {
		return corrupt("pair %d: %d+%d bytes exceed the snapshot format's 4 GiB limit", b.n, len(key), len(value))
	}
	e := newEntry(key, value, version)
	b.store.tree.ReplaceOrInsert(e)
	b.store.digest.add(b.h.sumEntry(e))
	b.prev = append(b.prev[:0], key...)
	b.n++
	return nil
}

// Finish checks the number of pairs and the digest the sender announced and
// returns the Store.
func (b *Builder) Finish(count uint64, digest string) (*Store, error) {
	if b.n != count {
		return nil, corrupt("received %d pairs, the sender announced %d", b.n, count)
	}
	if got := b.store.digest.String(); got != digest {
		return nil, corrupt("digest %s, the sender announced %s", got, digest)
	}
	return b.store, nil
}

// String describes the builder's progress, for logs.
func (b *Builder) String() string {
	return fmt.Sprintf("snapshot at LSN %d, %d pairs so far", b.lsn, b.n)
}
