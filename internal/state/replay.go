package state

import (
	"hash/maphash"
	"runtime"
	"sync"

	"github.com/walship/walship/pkg/codec"
)

// Replayer applies a long run of batches to a store that nobody reads
// meanwhile (a restore): it keeps only the newest write of each key in
// hash maps and touches the ordered tree and the digest once per key, in
// Finish, where Apply touches them once per record. The keys are split
// into shards by hash, one per CPU, each with a map of its own, and a
// batch's shards are applied in parallel: the order of the writes of any
// one key is kept, and no two keys' writes interact. The result, its
// digest included, is the one Store.Apply would have built.
type Replayer struct {
	s      *Store
	lsn    uint64
	seed   maphash.Seed
	shards []replayShard
}

// replayShard is the newest write of every key that hashes to it, and
// the records of the batch being applied.
type replayShard struct {
	changes map[string]change
	recs    []shardRec
}

// shardRec is a put or a delete of one record of the batch being applied,
// at its transaction's commit LSN.
type shardRec struct {
	key, value []byte
	version    uint64
	deleted    bool
}

// change is the newest write of a key: a put (the entry) or a delete. key
// is the map's key, allocated once per key: an assignment with it neither
// copies the key again nor keeps an older entry's memory alive.
type change struct {
	key     string
	e       entry
	deleted bool
}

// NewReplayer replays onto s, which belongs to the Replayer until Finish.
func NewReplayer(s *Store) *Replayer {
	r := &Replayer{s: s, lsn: s.AppliedLSN(), seed: maphash.MakeSeed(), shards: make([]replayShard, max(1, runtime.GOMAXPROCS(0)))}
	for i := range r.shards {
		r.shards[i].changes = map[string]change{}
	}
	return r
}

// AppliedLSN is the LSN of the last record applied.
func (r *Replayer) AppliedLSN() uint64 { return r.lsn }

// Apply takes b as Store.Apply does, checking it the same way (on error
// nothing changes); keys and values are copied before it returns.
func (r *Replayer) Apply(b *codec.Batch) error {
	if err := validateBatch(b, r.lsn); err != nil {
		return err
	}
	var commit uint64
	n := uint64(len(r.shards))
	for i := range b.Records {
		rec := &b.Records[i]
		if rec.LSN > commit {
			commit = commitLSN(b.Records[i:])
		}
		if rec.Op == codec.OpCommit {
			continue
		}
		sh := &r.shards[0]
		if n > 1 {
			sh = &r.shards[maphash.Bytes(r.seed, rec.Key)%n]
		}
		sh.recs = append(sh.recs, shardRec{key: rec.Key, value: rec.Value, version: commit, deleted: rec.Op == codec.OpDelete})
	}
	var wg sync.WaitGroup
	for i := 1; i < len(r.shards); i++ {
		wg.Go(r.shards[i].apply)
	}
	r.shards[0].apply()
	wg.Wait()
	r.lsn = b.LastLSN()
	return nil
}

// apply records the shard's writes of the batch, in order.
func (sh *replayShard) apply() {
	for _, rec := range sh.recs {
		c, ok := sh.changes[string(rec.key)] // no copy of the key to look up
		if !ok {
			c.key = string(rec.key)
		}
		if rec.deleted {
			c.e, c.deleted = entry{}, true
		} else {
			c.e, c.deleted = newEntry(rec.key, rec.value, rec.version), false
		}
		sh.changes[c.key] = c
	}
	clear(sh.recs)
	sh.recs = sh.recs[:0]
}

// Finish applies the newest write of every key to the store and returns it
// at the last LSN applied.
func (r *Replayer) Finish() *Store {
	s := r.s
	s.mu.Lock()
	defer s.mu.Unlock()
	t, h, d := s.tree, s.hasher, s.digest
	for i := range r.shards {
		for k, c := range r.shards[i].changes {
			if c.deleted {
				if old, ok := t.Delete(probe(keyBytes(k))); ok {
					d.sub(h.sumEntry(old))
				}
				continue
			}
			if old, ok := t.ReplaceOrInsert(c.e); ok {
				d.sub(h.sumEntry(old))
			}
			d.add(h.sumEntry(c.e))
		}
		r.shards[i].changes = nil
	}
	s.lsn, s.digest, s.view = r.lsn, d, nil
	return s
}
