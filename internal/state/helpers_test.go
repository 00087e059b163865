package state

import (
	"fmt"
	"testing"

	"github.com/walship/walship/pkg/codec"
)

func put(k, v string) codec.Record {
	return codec.Record{Op: codec.OpPut, Key: []byte(k), Value: []byte(v)}
}

func del(k string) codec.Record { return codec.Record{Op: codec.OpDelete, Key: []byte(k)} }

// batch numbers the records of txns from LSN first on, gives each txn the
// LSN of its commit as TxnID and appends the commits.
func batch(first uint64, txns ...[]codec.Record) *codec.Batch {
	b := &codec.Batch{}
	lsn := first
	for _, t := range txns {
		id := lsn + uint64(len(t))
		for _, r := range t {
			r.LSN, r.TxnID = lsn, id
			b.Records = append(b.Records, r)
			lsn++
		}
		b.Records = append(b.Records, codec.Record{LSN: lsn, TxnID: id, Op: codec.OpCommit})
		lsn++
	}
	return b
}

func txn(recs ...codec.Record) []codec.Record { return recs }

func mustApply(t testing.TB, s *Store, b *codec.Batch) {
	t.Helper()
	if err := s.Apply(b); err != nil {
		t.Fatalf("Apply(%d..%d): %v", b.FirstLSN(), b.LastLSN(), err)
	}
}

// applyTxns applies txns, one batch each, after s's applied LSN.
func applyTxns(t testing.TB, s *Store, txns ...[]codec.Record) {
	t.Helper()
	for _, tx := range txns {
		mustApply(t, s, batch(s.AppliedLSN()+1, tx))
	}
}

type kv struct {
	k, v string
	ver  uint64
}

// dump lists a reader's content through Scan.
func dump(v interface {
	Scan(start, end []byte, limit int, fn func(key, value []byte, version uint64) bool)
}) []kv {
	var out []kv
	v.Scan(nil, nil, 0, func(k, val []byte, ver uint64) bool {
		out = append(out, kv{string(k), string(val), ver})
		return true
	})
	return out
}

// recomputeDigest computes a view's digest from scratch, to check the
// incremental one.
func recomputeDigest(v *View) Digest {
	var d Digest
	h := newEntryHasher()
	v.tree.Ascend(func(e entry) bool {
		d.add(h.sumEntry(e))
		return true
	})
	return d
}

func keyN(i int) string { return fmt.Sprintf("key-%08d", i) }
