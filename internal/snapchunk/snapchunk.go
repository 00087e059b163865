// Package snapchunk gathers a state snapshot's pairs into the
// SnapshotChunk messages every snapshot stream carries (a primary
// re-seeding a replica or uploading to a log store, a log store serving
// one), with few allocations: each pair is copied into memory the chunk
// shares with its other pairs, and the chunk's KeyValue messages are
// allocated together. A stream of millions of pairs otherwise allocates
// three objects per pair (the message, the key's string, the value), all
// garbage once the chunk is sent, while the same process takes writes.
package snapchunk

import (
	"unsafe"

	walshipv1 "github.com/walship/walship/gen/walship/v1"
)

// arenaBytes is the size of the blocks pairs are copied into (a pair
// larger than that gets a block of its own).
const arenaBytes = 256 << 10

// kvBlock is how many KeyValue messages are allocated together.
const kvBlock = 512

// Chunker gathers pairs into chunks of about the size New was given.
// Its zero value is not usable: make one with New.
type Chunker struct {
	max   int
	kvs   []*walshipv1.KeyValue
	size  int
	arena []byte               // the block being filled
	slab  []walshipv1.KeyValue // KeyValues not yet handed out
}

// New returns a Chunker whose chunks hold pairs until they reach max
// bytes, counting each pair as its key, its value and 16 bytes.
func New(max int) *Chunker { return &Chunker{max: max} }

// Add adds a pair, copied: key and value may change once Add returns. It
// reports whether the chunk is full (Take it then).
func (c *Chunker) Add(key, value []byte, version uint64) (full bool) {
	n := len(key) + len(value)
	if cap(c.arena)-len(c.arena) < n {
		c.arena = make([]byte, 0, max(n, arenaBytes))
	}
	at := len(c.arena)
	c.arena = append(c.arena, key...)
	c.arena = append(c.arena, value...)
	if len(c.slab) == 0 {
		c.slab = make([]walshipv1.KeyValue, kvBlock)
	}
	kv := &c.slab[0]
	c.slab = c.slab[1:]
	if len(key) > 0 {
		// The block is never written again where a pair has been
		// copied: the string is as immutable as one string(key) makes.
		kv.Key = unsafe.String(&c.arena[at], len(key))
	}
	kv.Value = c.arena[at+len(key) : at+n : at+n]
	kv.VersionLsn = version
	c.kvs = append(c.kvs, kv)
	c.size += n + 16
	return c.size >= c.max
}

// Len is the number of pairs in the chunk so far.
func (c *Chunker) Len() int { return len(c.kvs) }

// Size is the chunk's size so far, as Add counts it.
func (c *Chunker) Size() int { return c.size }

// Take returns the chunk gathered so far, nil if it is empty, and starts
// the next. The chunk is the caller's: nothing of it is written again.
func (c *Chunker) Take() *walshipv1.SnapshotChunk {
	if len(c.kvs) == 0 {
		return nil
	}
	ch := &walshipv1.SnapshotChunk{Kvs: c.kvs}
	c.kvs, c.size = nil, 0
	return ch
}
