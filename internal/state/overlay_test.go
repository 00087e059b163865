package state

import (
	"sync"
	"testing"
	"unsafe"

	"github.com/walship/walship/pkg/codec"
)

// stage numbers recs from LSN first on as one txn with its commit, as the
// sequencer would, and returns the commit LSN.
func stage(o *Overlay, first uint64, recs ...codec.Record) (*codec.Batch, uint64) {
	b := batch(first, recs)
	o.Stage(b.Records)
	return b, b.LastLSN()
}

type lookup struct {
	key     string
	value   string
	version uint64
	ok      bool
}

func checkReader(t *testing.T, what string, r Reader, want []lookup) {
	t.Helper()
	for _, w := range want {
		v, ver, ok := r.Get([]byte(w.key))
		if ok != w.ok || string(v) != w.value || ver != w.version {
			t.Errorf("%s Get(%q) = %q %d %v, want %q %d %v", what, w.key, v, ver, ok, w.value, w.version, w.ok)
		}
	}
}

func TestOverlay(t *testing.T) {
	s := New()
	applyTxns(t, s, txn(put("a", "base-a"), put("b", "base-b"))) // a@3 b@3, LSN 3
	o := NewOverlay(s)

	// Pending writes have their txn's commit LSN as version, not the LSN of
	// their own record (a's put is at 4, c's newest at 8, d's at 9).
	b1, c1 := stage(o, 4, put("a", "p1"), del("b"), put("c", "p1")) // a@7 b- c@7, commit 7
	b2, c2 := stage(o, 8, put("c", "p2"), put("d", "p2"))           // c@10 d@10, commit 10
	if c1 != 7 || c2 != 10 {
		t.Fatalf("setup: commits %d %d, want 7 10", c1, c2)
	}
	if o.Len() != 4 {
		t.Errorf("Len = %d, want 4 keys pending", o.Len())
	}
	pending := []lookup{
		{"a", "p1", 7, true}, {"b", "", 0, false}, {"c", "p2", 10, true}, {"d", "p2", 10, true}, {"e", "", 0, false},
	}
	checkReader(t, "overlay", o, pending)
	checkReader(t, "store", s, []lookup{
		{"a", "base-a", 3, true}, {"b", "base-b", 3, true}, {"c", "", 0, false},
	})

	// The first txn becomes visible; its entries leave the overlay, the
	// second txn's stay, including c's newer write.
	mustApply(t, s, b1)
	o.Release(c1)
	if o.Len() != 2 {
		t.Errorf("Len after first release = %d, want 2", o.Len())
	}
	checkReader(t, "overlay", o, pending)
	// The store now gives the first txn's keys the version the overlay gave
	// them while pending.
	checkReader(t, "store", s, []lookup{{"a", "p1", 7, true}, {"b", "", 0, false}, {"c", "p1", 7, true}})

	mustApply(t, s, b2)
	o.Release(c2)
	if o.Len() != 0 {
		t.Errorf("Len after releasing all = %d, want 0", o.Len())
	}
	checkReader(t, "overlay", o, pending)
	checkReader(t, "store", s, pending)
	o.Release(c2 + 100) // releasing past everything is harmless
}

// TestOverlayReadAfter: Read says which LSN must be visible before its
// result may be returned: the commit of the pending write it returns (a
// delete too), else the Store's applied LSN.
func TestOverlayReadAfter(t *testing.T) {
	s := New()
	applyTxns(t, s, txn(put("a", "base-a"), put("b", "base-b"))) // LSN 3
	o := NewOverlay(s)
	b1, c1 := stage(o, 4, del("b"), put("c", "p1")) // commit 6
	check := func(what, key string, wantValue string, wantOK bool, wantAfter uint64) {
		t.Helper()
		v, _, ok, after := o.Read([]byte(key))
		if string(v) != wantValue || ok != wantOK || after != wantAfter {
			t.Errorf("%s: Read(%q) = %q %v after %d, want %q %v after %d", what, key, v, ok, after, wantValue, wantOK, wantAfter)
		}
	}
	check("pending", "a", "base-a", true, 3)
	check("pending", "b", "", false, c1)
	check("pending", "c", "p1", true, c1)
	check("pending", "z", "", false, 3)
	// Applied to the Store but not yet released (the window in which the
	// primary applies and then advances its visible LSN): the Store's
	// applied LSN covers the write, delete included.
	mustApply(t, s, b1)
	check("applied", "b", "", false, c1)
	check("applied", "a", "base-a", true, c1)
	o.Release(c1)
	check("released", "b", "", false, c1)
	check("released", "c", "p1", true, c1)
}

// TestOverlayKeepsStagedRecords: a staged record's key and value are
// kept as they are, not copied (Stage's contract: they do not change), a
// value capped at its length, and an empty value reads as empty, not as
// a delete.
func TestOverlayKeepsStagedRecords(t *testing.T) {
	o := NewOverlay(New())
	b, _ := stage(o, 1, put("key", "value"), codec.Record{Op: codec.OpPut, Key: []byte("empty")})
	checkReader(t, "overlay", o, []lookup{{"key", "value", 3, true}, {"empty", "", 3, true}})
	if v, _, _ := o.Get([]byte("key")); &v[0] != &b.Records[0].Value[0] {
		t.Error("the staged value was copied")
	}
	for k := range o.pending {
		if k == "key" && unsafe.StringData(k) != &b.Records[0].Key[0] {
			t.Error("the staged key was copied")
		}
	}
	if v, _, _ := o.Get([]byte("key")); cap(v) != len(v) {
		t.Errorf("a staged value has capacity %d past its %d bytes", cap(v), len(v))
	}
	if v, _, ok := o.Get([]byte("empty")); !ok || v == nil {
		t.Errorf("an empty staged value reads as %v (found %v), want an empty, not nil, value", v, ok)
	}
}

// TestOverlayReleaseBoundary: Release drops exactly the writes of the txns
// committed at or below its LSN, all of a txn's writes at once, and keeps a
// key whose newer write belongs to a later txn.
func TestOverlayReleaseBoundary(t *testing.T) {
	o := NewOverlay(New())
	_, c1 := stage(o, 1, put("a", "1"), put("b", "1")) // LSNs 1, 2: a@3 b@3, commit 3
	_, c2 := stage(o, 4, put("b", "2"), put("c", "2")) // LSNs 4, 5: b@6 c@6, commit 6
	// The LSN of b's put: its txn is not committed there, so nothing goes.
	o.Release(c1 - 1)
	if o.Len() != 3 {
		t.Fatalf("Len after Release(%d) = %d, want 3", c1-1, o.Len())
	}
	checkReader(t, "overlay", o, []lookup{{"a", "1", c1, true}, {"b", "2", c2, true}, {"c", "2", c2, true}})
	o.Release(c1) // the first txn goes; b's write of the second stays
	if o.Len() != 2 {
		t.Fatalf("Len after Release(%d) = %d, want 2", c1, o.Len())
	}
	checkReader(t, "overlay", o, []lookup{{"a", "", 0, false}, {"b", "2", c2, true}, {"c", "2", c2, true}})
	o.Release(c2 - 1)
	if o.Len() != 2 {
		t.Fatalf("Len after Release(%d) = %d, want 2", c2-1, o.Len())
	}
	o.Release(c2)
	if o.Len() != 0 {
		t.Fatalf("Len after Release(%d) = %d, want 0", c2, o.Len())
	}
}

// TestOverlaySameKeyTwiceInTxn: a key written twice in one txn has the
// txn's last write as value and the commit LSN as version, both pending and
// once applied, and one Release at the commit drops it.
func TestOverlaySameKeyTwiceInTxn(t *testing.T) {
	for _, tt := range []struct {
		name string
		recs []codec.Record
		want lookup
	}{
		{"put put", txn(put("k", "1"), put("x", ""), put("k", "2")), lookup{"k", "2", 4, true}},
		{"put delete", txn(put("k", "1"), put("x", ""), del("k")), lookup{"k", "", 0, false}},
		{"delete put", txn(del("k"), put("x", ""), put("k", "2")), lookup{"k", "2", 4, true}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			s := New()
			o := NewOverlay(s)
			b, commit := stage(o, 1, tt.recs...)
			if commit != 4 {
				t.Fatalf("setup: commit %d, want 4", commit)
			}
			want := []lookup{tt.want, {"x", "", commit, true}}
			checkReader(t, "overlay", o, want)
			mustApply(t, s, b)
			checkReader(t, "store", s, want)
			o.Release(commit)
			if o.Len() != 0 {
				t.Fatalf("Len after Release = %d, want 0", o.Len())
			}
			checkReader(t, "overlay after release", o, want)
		})
	}
}

// TestOverlayConcurrent runs a sequencer (Stage, Get) against an applier
// (Apply, Release) for the race detector, checking that a key's newest write
// is always visible through the overlay.
func TestOverlayConcurrent(t *testing.T) {
	const txns = 2000
	s := New()
	o := NewOverlay(s)
	work := make(chan *codec.Batch, 64)
	var wg sync.WaitGroup
	wg.Go(func() {
		for b := range work {
			if err := s.Apply(b); err != nil {
				t.Error(err)
				return
			}
			o.Release(b.LastLSN())
		}
	})
	next := uint64(1)
	seen := map[string]uint64{} // version the overlay last gave each key
	for i := range txns {
		k := keyN(i % 7)
		b, commit := stage(o, next, put(k, keyN(i)))
		next = commit + 1
		work <- b
		if v, ver, ok := o.Get([]byte(k)); !ok || string(v) != keyN(i) || ver != commit {
			t.Fatalf("txn %d: overlay Get(%s) = %q %d %v", i, k, v, ver, ok)
		}
		seen[k] = commit
	}
	close(work)
	wg.Wait()
	if o.Len() != 0 || s.AppliedLSN() != next-1 {
		t.Fatalf("after draining: Len %d AppliedLSN %d, want 0 %d", o.Len(), s.AppliedLSN(), next-1)
	}
	for k, ver := range seen {
		if _, got, ok := s.Get([]byte(k)); !ok || got != ver {
			t.Errorf("store Get(%s) version %d %v, want %d as the overlay said", k, got, ok, ver)
		}
	}
}
