package state

import (
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/walship/walship/pkg/codec"
)

// TestDigestFormula pins the digest to its specification (docs/FORMAT.md) with an
// independent implementation, so a change to the hashing is noticed.
func TestDigestFormula(t *testing.T) {
	s := New()
	applyTxns(t, s, txn(put("alpha", "one"), put("", "empty key"), put("beta", ""))) // commit at 4
	want := specDigest([]kv{{"alpha", "one", 4}, {"", "empty key", 4}, {"beta", "", 4}})
	if got := s.Digest(); got != want {
		t.Fatalf("digest lanes %x, want %x", got.lanes, want.lanes)
	}
	if len(s.Digest().String()) != 2*DigestSize {
		t.Errorf("String() = %q, want %d hex digits", s.Digest().String(), 2*DigestSize)
	}
	b := s.Digest().Bytes()
	if d, err := DigestFromBytes(b[:]); err != nil || d != s.Digest() {
		t.Errorf("DigestFromBytes(Bytes()) = %v, %v", d, err)
	}
	if _, err := DigestFromBytes(b[:31]); err == nil {
		t.Errorf("DigestFromBytes of 31 bytes succeeded")
	}
}

func TestDigestEmpty(t *testing.T) {
	s := New()
	if s.Digest() != (Digest{}) {
		t.Fatalf("empty store digest %v, want zero", s.Digest())
	}
	applyTxns(t, s, txn(put("a", "1"), put("b", "2")), txn(put("a", "3")), txn(del("a"), del("b")))
	if s.Digest() != (Digest{}) {
		t.Fatalf("digest after deleting everything %v, want zero", s.Digest())
	}
}

// TestDigestHistoryIndependent: stores that reach the same content (keys,
// values and versions) by different histories and batchings agree.
func TestDigestHistoryIndependent(t *testing.T) {
	// Txns commit at LSNs 4 and 8 in both, giving x@4, y@8, w@8; the txns'
	// other effects, and where in its txn each key's last write is, differ.
	a := New()
	mustApply(t, a, batch(1, txn(put("x", "1"), put("y", "old"), put("z", "gone")))) // 1..4
	mustApply(t, a, batch(5, txn(put("y", "2"), del("z"), put("w", "3"))))           // 5..8

	b := New()
	mustApply(t, b, batch(1, txn(put("x", "1"), put("z", "other"), put("q", "tmp")), // 1..4
		txn(put("w", "3"), del("q"), put("y", "2")))) // 5..8, deleting q instead of z, w before y
	// b now has z and a does not: delete it at a later LSN in both.
	applyTxns(t, a, txn(del("z")))
	applyTxns(t, b, txn(del("z")))

	if got, want := dump(b), dump(a); !equalKV(got, want) || !equalKV(want, []kv{{"w", "3", 8}, {"x", "1", 4}, {"y", "2", 8}}) {
		t.Fatalf("contents differ: %v vs %v", got, want)
	}
	if a.Digest() != b.Digest() {
		t.Fatalf("same content, digests %v and %v", a.Digest(), b.Digest())
	}
	if a.Digest() != recomputeDigest(a.Snapshot()) {
		t.Fatalf("incremental digest differs from recomputed")
	}
}

func equalKV(a, b []kv) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// TestDigestSensitive: changing any one key, value or version changes it.
func TestDigestSensitive(t *testing.T) {
	base := func() *Store {
		s := New()
		applyTxns(t, s, txn(put("a", "1"), put("b", "2"))) // a@3 b@3, LSN 3
		return s
	}
	ref := base().Digest()
	tests := []struct {
		name string
		txn  []codec.Record
	}{
		{"value differs", txn(put("b", "3"))},
		{"only version differs", txn(put("b", "2"))},
		{"extra key", txn(put("c", ""))},
		{"missing key", txn(del("a"))},
		{"key and value swapped boundary", txn(del("b"), put("b2", ""))},
	}
	seen := map[Digest]string{ref: "base"}
	for _, tt := range tests {
		s := base()
		applyTxns(t, s, tt.txn)
		d := s.Digest()
		if other, dup := seen[d]; dup {
			t.Errorf("%s: digest equals that of %s", tt.name, other)
		}
		seen[d] = tt.name
		if d != recomputeDigest(s.Snapshot()) {
			t.Errorf("%s: incremental digest differs from recomputed", tt.name)
		}
	}
}

// TestDigestRandomHistory checks the incremental digest against a full
// recomputation after every batch of a random workload with overwrites and
// deletes, and that a store rebuilt from the final content agrees.
func TestDigestRandomHistory(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	s := New()
	for range 200 {
		var txns [][]codec.Record
		for range 1 + rng.IntN(3) {
			var recs []codec.Record
			for range 1 + rng.IntN(5) {
				k := keyN(rng.IntN(30))
				if rng.IntN(4) == 0 {
					recs = append(recs, del(k))
				} else {
					recs = append(recs, put(k, keyN(rng.IntN(1000))))
				}
			}
			txns = append(txns, recs)
		}
		mustApply(t, s, batch(s.AppliedLSN()+1, txns...))
		if s.Digest() != recomputeDigest(s.Snapshot()) {
			t.Fatalf("at LSN %d incremental digest differs from recomputed", s.AppliedLSN())
		}
	}
	// Rebuild: one batch of txns committing at the same LSNs as the txns
	// that last wrote the final entries, each putting its entries (the
	// ones whose version is its commit LSN) in reverse key order, padded
	// with deletes of a scratch key so that every LSN is used. The
	// original txn held at least those puts before its commit, so they fit
	// between the previous commit and this one.
	final := dump(s)
	byCommit := map[uint64][]kv{}
	var commits []uint64
	for _, e := range final {
		if byCommit[e.ver] == nil {
			commits = append(commits, e.ver)
		}
		byCommit[e.ver] = append(byCommit[e.ver], e)
	}
	slices.Sort(commits)
	if len(commits) == 0 || commits[len(commits)-1] < s.AppliedLSN() {
		commits = append(commits, s.AppliedLSN()) // a final txn of deletes only
	}
	r := New()
	var recs []codec.Record
	lsn := uint64(1)
	for _, c := range commits {
		ents := byCommit[c]
		for lsn < c-uint64(len(ents)) {
			rec := del("~scratch")
			rec.LSN, rec.TxnID = lsn, c
			recs = append(recs, rec)
			lsn++
		}
		for i := len(ents) - 1; i >= 0; i-- {
			rec := put(ents[i].k, ents[i].v)
			rec.LSN, rec.TxnID = lsn, c
			recs = append(recs, rec)
			lsn++
		}
		if lsn != c {
			t.Fatalf("rebuild: txn committing at %d starts its puts at %d", c, lsn-uint64(len(ents)))
		}
		recs = append(recs, codec.Record{LSN: c, TxnID: c, Op: codec.OpCommit})
		lsn++
	}
	mustApply(t, r, &codec.Batch{Records: recs})
	if !equalKV(dump(r), final) {
		t.Fatalf("rebuild has different content")
	}
	if r.Digest() != s.Digest() {
		t.Fatalf("rebuilt digest %v, want %v", r.Digest(), s.Digest())
	}
}
