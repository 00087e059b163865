package state

import "github.com/walship/walship/pkg/codec"

// Replayer applies a long run of batches to a store that nobody reads
// meanwhile (a restore): it keeps only the newest write of each key in a
// hash map and touches the ordered tree and the digest once per key, in
// Finish, where Apply touches them once per record. A log that rewrites
// the same keys many times replays several times faster; the result, its
// digest included, is the one Store.Apply would have built.
type Replayer struct {
	s       *Store
	lsn     uint64
	changes map[string]change
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
	return &Replayer{s: s, lsn: s.AppliedLSN(), changes: map[string]change{}}
}

// AppliedLSN is the LSN of the last record applied.
func (r *Replayer) AppliedLSN() uint64 { return r.lsn }

// Apply takes b as Store.Apply does, checking it the same way (on error
// nothing changes); keys and values are copied.
func (r *Replayer) Apply(b *codec.Batch) error {
	if err := validateBatch(b, r.lsn); err != nil {
		return err
	}
	var commit uint64
	for i := range b.Records {
		rec := &b.Records[i]
		if rec.LSN > commit {
			commit = commitLSN(b.Records[i:])
		}
		if rec.Op == codec.OpCommit {
			continue
		}
		c, ok := r.changes[string(rec.Key)] // no copy of the key to look up
		if !ok {
			c.key = string(rec.Key)
		}
		if rec.Op == codec.OpDelete {
			c.e, c.deleted = entry{}, true
		} else {
			c.e, c.deleted = newEntry(rec.Key, rec.Value, commit), false
		}
		r.changes[c.key] = c
	}
	r.lsn = b.LastLSN()
	return nil
}

// Finish applies the newest write of every key to the store and returns it
// at the last LSN applied.
func (r *Replayer) Finish() *Store {
	s := r.s
	s.mu.Lock()
	defer s.mu.Unlock()
	t, h, d := s.tree, s.hasher, s.digest
	for k, c := range r.changes {
		if c.deleted {
			if old, ok := t.Delete(probe(keyBytes(k))); ok {
				d.sub(h.sum(old.key, old.version, old.value))
			}
			continue
		}
		e := c.e
		if old, ok := t.ReplaceOrInsert(e); ok {
			d.sub(h.sum(old.key, old.version, old.value))
		}
		d.add(h.sum(e.key, e.version, e.value))
	}
	s.lsn, s.digest, s.view = r.lsn, d, nil
	r.changes = nil
	return s
}
