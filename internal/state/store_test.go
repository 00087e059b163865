package state

import (
	"bytes"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/walship/walship/pkg/codec"
)

func TestApplyValidation(t *testing.T) {
	good := func() *codec.Batch { return batch(3, txn(put("b", "2"), del("a"))) }
	tests := []struct {
		name   string
		batch  func() *codec.Batch
		wantIs error
	}{
		{"nil", func() *codec.Batch { return nil }, ErrInvalidBatch},
		{"empty", func() *codec.Batch { return &codec.Batch{} }, ErrInvalidBatch},
		{"gap", func() *codec.Batch { return batch(4, txn(put("b", "2"))) }, ErrLSNMismatch},
		{"overlap", func() *codec.Batch { return batch(2, txn(put("b", "2"))) }, ErrLSNMismatch},
		{"replay of applied", func() *codec.Batch { return batch(1, txn(put("b", "2"))) }, ErrLSNMismatch},
		{"missing commit", func() *codec.Batch {
			b := good()
			b.Records = b.Records[:len(b.Records)-1]
			return b
		}, ErrInvalidBatch},
		{"second txn missing commit", func() *codec.Batch {
			b := batch(3, txn(put("b", "2")), txn(put("c", "3")))
			b.Records = b.Records[:len(b.Records)-1]
			return b
		}, ErrInvalidBatch},
		{"unknown op", func() *codec.Batch {
			b := good()
			b.Records[1].Op = 9
			return b
		}, ErrInvalidBatch},
		{"zero op", func() *codec.Batch {
			b := good()
			b.Records[0].Op = 0
			return b
		}, ErrInvalidBatch},
		{"LSN skips", func() *codec.Batch {
			b := good()
			b.Records[2].LSN++
			return b
		}, ErrInvalidBatch},
		{"LSN repeats", func() *codec.Batch {
			b := good()
			b.Records[1].LSN--
			return b
		}, ErrInvalidBatch},
		{"txn id changes inside txn", func() *codec.Batch {
			b := good()
			b.Records[1].TxnID++
			return b
		}, ErrInvalidBatch},
		{"commit of another txn", func() *codec.Batch {
			b := good()
			b.Records[2].TxnID++
			return b
		}, ErrInvalidBatch},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := New()
			mustApply(t, s, batch(1, txn(put("a", "1")))) // LSN 1..2
			before, lsn, dig := dump(s), s.AppliedLSN(), s.Digest()
			err := s.Apply(tt.batch())
			if !errors.Is(err, tt.wantIs) {
				t.Fatalf("Apply error = %v, want %v", err, tt.wantIs)
			}
			if got := dump(s); !slices.Equal(got, before) {
				t.Errorf("content changed to %v, want %v", got, before)
			}
			if s.AppliedLSN() != lsn || s.Digest() != dig || s.Len() != 1 {
				t.Errorf("LSN %d digest %v len %d, want %d %v 1", s.AppliedLSN(), s.Digest(), s.Len(), lsn, dig)
			}
			// The store is still usable: the right batch applies.
			mustApply(t, s, good())
		})
	}
}

func TestApplyFreshStoreStartsAtOne(t *testing.T) {
	s := New()
	if err := s.Apply(batch(5, txn(put("a", "1")))); !errors.Is(err, ErrLSNMismatch) {
		t.Fatalf("first batch at 5: %v, want ErrLSNMismatch", err)
	}
	mustApply(t, s, batch(1, txn(put("a", "1"))))
	if s.AppliedLSN() != 2 {
		t.Fatalf("AppliedLSN = %d, want 2", s.AppliedLSN())
	}
}

func TestApplySemantics(t *testing.T) {
	s := New()
	// LSNs: 1 put a, 2 put b, 3 put a (same txn overwrite), 4 commit;
	// 5 del b, 6 del missing, 7 put c "", 8 commit; 9 put d, 10 commit.
	// Versions are commit LSNs: a's second write wins with version 4 (its
	// txn's commit, not 3), c gets 8 although written in the same batch as
	// a, and d gets 10.
	mustApply(t, s, batch(1,
		txn(put("a", "1"), put("b", "2"), put("a", "3")),
		txn(del("b"), del("missing"), put("c", "")),
	))
	mustApply(t, s, batch(9, txn(put("d", "4"))))
	want := []kv{{"a", "3", 4}, {"c", "", 8}, {"d", "4", 10}}
	if got := dump(s); !slices.Equal(got, want) {
		t.Fatalf("content = %v, want %v", got, want)
	}
	if s.Len() != 3 || s.AppliedLSN() != 10 {
		t.Fatalf("Len %d AppliedLSN %d, want 3 10", s.Len(), s.AppliedLSN())
	}
	if v, ver, ok := s.Get([]byte("c")); !ok || v == nil || len(v) != 0 || cap(v) != 0 || ver != 8 {
		t.Errorf("Get(c) = %q (nil %v, cap %d) %d %v, want an empty, not nil, value of no capacity at 8", v, v == nil, cap(v), ver, ok)
	}
	if v, _, _ := s.Get([]byte("a")); cap(v) != len(v) {
		t.Errorf("Get(a) has capacity %d past its %d bytes: an append would write into the store", cap(v), len(v))
	}
	if _, _, ok := s.Get([]byte("b")); ok {
		t.Errorf("deleted key b still found")
	}
	if s.Digest() != recomputeDigest(s.Snapshot()) {
		t.Errorf("incremental digest differs from recomputed")
	}
}

// TestApplyVersionIsCommitLSN: every key a transaction writes gets the LSN
// of that transaction's commit record as its version, wherever in the
// transaction and in the batch the write is, however often the key is
// written in it, and whatever deletes precede the write.
func TestApplyVersionIsCommitLSN(t *testing.T) {
	s := New()
	b := batch(1,
		txn(put("a", "1"), put("b", "1"), del("b"), put("b", "2"), put("c", "1")), // 1..5, commit 6
		txn(put("d", "1")),                     // 7, commit 8
		txn(del("x"), del("y"), put("a", "2")), // 9..11, commit 12
	)
	var commits []uint64
	for _, r := range b.Records {
		if r.Op == codec.OpCommit {
			commits = append(commits, r.LSN)
		}
	}
	if want := []uint64{6, 8, 12}; !slices.Equal(commits, want) {
		t.Fatalf("setup: commits at %v, want %v", commits, want)
	}
	mustApply(t, s, b)
	want := []kv{{"a", "2", 12}, {"b", "2", 6}, {"c", "1", 6}, {"d", "1", 8}}
	if got := dump(s); !slices.Equal(got, want) {
		t.Fatalf("content = %v, want %v", got, want)
	}
	// The last applied txn's keys have the applied LSN as version; a key of
	// an earlier txn keeps its own commit LSN.
	applyTxns(t, s, txn(put("c", "2"))) // 13, commit 14
	if _, ver, _ := s.Get([]byte("c")); ver != 14 || ver != s.AppliedLSN() {
		t.Errorf("c version %d, want the applied LSN 14", ver)
	}
	if _, ver, _ := s.Get([]byte("b")); ver != 6 {
		t.Errorf("b version %d, want 6", ver)
	}
	if s.Digest() != recomputeDigest(s.Snapshot()) {
		t.Errorf("incremental digest differs from recomputed")
	}
}

func TestApplyCopiesInput(t *testing.T) {
	s := New()
	b := batch(1, txn(put("key", "value")))
	mustApply(t, s, b)
	copy(b.Records[0].Key, "XXX")
	copy(b.Records[0].Value, "XXXXX")
	if v, _, ok := s.Get([]byte("key")); !ok || string(v) != "value" {
		t.Fatalf("Get after caller reused the batch = %q %v", v, ok)
	}
}

func TestGetValueNeverChanges(t *testing.T) {
	s := New()
	applyTxns(t, s, txn(put("k", "old")))
	v, ver, _ := s.Get([]byte("k"))
	view := s.Snapshot()
	applyTxns(t, s, txn(put("k", "new")), txn(del("k")))
	if string(v) != "old" || ver != 2 { // put at LSN 1, commit at 2
		t.Errorf("earlier Get result changed to %q %d", v, ver)
	}
	if v, _, ok := view.Get([]byte("k")); !ok || string(v) != "old" {
		t.Errorf("view Get = %q %v, want old", v, ok)
	}
	if _, _, ok := s.Get([]byte("k")); ok {
		t.Errorf("store still has deleted key")
	}
	if view.AppliedLSN() != 2 || view.Len() != 1 || s.Len() != 0 {
		t.Errorf("view LSN %d len %d, store len %d", view.AppliedLSN(), view.Len(), s.Len())
	}
}

func TestScan(t *testing.T) {
	s := New()
	var recs []codec.Record
	for _, k := range []string{"", "a", "b", "ba", "bb", "c", "d"} {
		recs = append(recs, put(k, "v"+k))
	}
	mustApply(t, s, batch(1, recs))
	commit := s.AppliedLSN() // the one txn's commit LSN: every key's version
	if commit != uint64(len(recs))+1 {
		t.Fatalf("AppliedLSN = %d, want %d", commit, len(recs)+1)
	}

	tests := []struct {
		name       string
		start, end string
		limit      int
		stopAfter  int // fn returns false on this call (0: never)
		want       []string
	}{
		{"all", "", "", 0, 0, []string{"", "a", "b", "ba", "bb", "c", "d"}},
		{"from b", "b", "", 0, 0, []string{"b", "ba", "bb", "c", "d"}},
		{"prefix b", "b", "c", 0, 0, []string{"b", "ba", "bb"}},
		{"end exclusive", "a", "ba", 0, 0, []string{"a", "b"}},
		{"start between keys", "bab", "z", 0, 0, []string{"bb", "c", "d"}},
		{"limit", "", "", 2, 0, []string{"", "a"}},
		{"limit larger than range", "b", "c", 10, 0, []string{"b", "ba", "bb"}},
		{"negative limit is none", "c", "", -1, 0, []string{"c", "d"}},
		{"stop early", "", "", 0, 3, []string{"", "a", "b"}},
		{"stop before limit", "", "", 5, 1, []string{""}},
		{"empty range", "b", "b", 0, 0, nil},
		{"start after end", "c", "b", 0, 0, nil},
		{"past the end", "e", "", 0, 0, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var got []string
			calls := 0
			s.Scan([]byte(tt.start), []byte(tt.end), tt.limit, func(k, v []byte, ver uint64) bool {
				calls++
				got = append(got, string(k))
				if string(v) != "v"+string(k) || ver != commit {
					t.Errorf("entry %q = %q version %d", k, v, ver)
				}
				return calls != tt.stopAfter
			})
			if !slices.Equal(got, tt.want) {
				t.Errorf("Scan = %q, want %q", got, tt.want)
			}
		})
	}
}

func TestScanBoundsMayBeReused(t *testing.T) {
	s := New()
	applyTxns(t, s, txn(put("a", "1"), put("b", "2"), put("c", "3"), put("d", "4")))
	start, end := []byte("a"), []byte("d")
	var got []string
	s.Scan(start, end, 0, func(k, _ []byte, _ uint64) bool {
		got = append(got, string(k))
		copy(start, "z") // a caller recycling its buffers mid-scan
		copy(end, "a")
		return true
	})
	if want := []string{"a", "b", "c"}; !slices.Equal(got, want) {
		t.Fatalf("Scan = %q, want %q", got, want)
	}
}

// TestScanConsistentWhileApplying has a writer rewrite every key in each
// batch while readers scan: each scan must see one batch's values for all
// keys, never a mix.
func TestScanConsistentWhileApplying(t *testing.T) {
	const keys, rounds, readers = 200, 300, 4
	s := New()
	gen := func(round int) *codec.Batch {
		recs := make([]codec.Record, 0, keys)
		for i := range keys {
			recs = append(recs, put(keyN(i), fmt.Sprint(round)))
		}
		// Split the round into two txns: still one batch, so one value for
		// all keys, but two versions: keys/2 puts and a commit apart.
		return batch(s.AppliedLSN()+1, recs[:keys/2], recs[keys/2:])
	}
	mustApply(t, s, gen(0))

	var done atomic.Bool
	var wg sync.WaitGroup
	errc := make(chan error, readers)
	report := func(err error) { // the first few errors are enough
		select {
		case errc <- err:
		default:
		}
	}
	for range readers {
		wg.Go(func() {
			for n := 0; n < 20 || !done.Load(); n++ {
				var first []byte
				var firstVer, lastVer uint64
				count := 0
				view := s.Snapshot()
				s.Scan(nil, nil, 0, func(k, v []byte, ver uint64) bool {
					if first == nil {
						first, firstVer = v, ver
					}
					if !bytes.Equal(v, first) {
						report(fmt.Errorf("scan saw %q at %s and %q at the first key", v, k, first))
						return false
					}
					// Keys scan in txn order: the first txn's keys all have
					// its commit LSN, the second's the one keys/2+1 later.
					if wantVer := firstVer + uint64(count/(keys/2))*(keys/2+1); ver != wantVer {
						report(fmt.Errorf("scan saw version %d at %s, want %d", ver, k, wantVer))
						return false
					}
					lastVer = max(lastVer, ver)
					count++
					return true
				})
				if count != keys {
					report(fmt.Errorf("scan saw %d keys, want %d", count, keys))
				}
				if view.Len() != keys || lastVer > s.AppliedLSN() {
					report(fmt.Errorf("view len %d, version %d beyond applied %d", view.Len(), lastVer, s.AppliedLSN()))
				}
				if len(errc) > 0 {
					return
				}
			}
		})
	}
	view := s.Snapshot()
	before := dump(view)
	for r := 1; r <= rounds; r++ {
		mustApply(t, s, gen(r))
	}
	done.Store(true)
	wg.Wait()
	close(errc)
	for err := range errc {
		t.Error(err)
	}
	if got := dump(view); !slices.Equal(got, before) {
		t.Errorf("view taken before the writes changed")
	}
	if view.Digest() != recomputeDigest(view) || s.Digest() != recomputeDigest(s.Snapshot()) {
		t.Errorf("digests disagree with recomputation")
	}
}

func TestBuilderRebuildsAStore(t *testing.T) {
	src := New()
	applyTxns(t, src, txn(put("a", "1"), put("b", "2")), txn(put("c", "3"), del("a")))
	v := src.Snapshot()
	b := NewBuilder(v.AppliedLSN())
	var n uint64
	v.Scan(nil, nil, 0, func(k, val []byte, ver uint64) bool {
		if err := b.Add(k, val, ver); err != nil {
			t.Fatal(err)
		}
		n++
		return true
	})
	got, err := b.Finish(n, v.Digest().String())
	if err != nil {
		t.Fatal(err)
	}
	if got.AppliedLSN() != v.AppliedLSN() || got.Digest() != v.Digest() || got.Len() != v.Len() {
		t.Fatalf("rebuilt store: lsn %d digest %s len %d; want %d %s %d", got.AppliedLSN(), got.Digest(), got.Len(), v.AppliedLSN(), v.Digest(), v.Len())
	}
	for _, tc := range []struct {
		name string
		run  func(b *Builder) error
	}{
		{"out of order", func(b *Builder) error {
			_ = b.Add([]byte("b"), nil, 1)
			return b.Add([]byte("a"), nil, 1)
		}},
		{"duplicate", func(b *Builder) error {
			_ = b.Add([]byte("a"), nil, 1)
			return b.Add([]byte("a"), nil, 1)
		}},
		{"version 0", func(b *Builder) error { return b.Add([]byte("a"), nil, 0) }},
		{"version past lsn", func(b *Builder) error { return b.Add([]byte("a"), nil, 99) }},
		{"wrong count", func(b *Builder) error { _, err := b.Finish(1, Digest{}.String()); return err }},
		{"wrong digest", func(b *Builder) error {
			_ = b.Add([]byte("a"), nil, 1)
			_, err := b.Finish(1, Digest{}.String())
			return err
		}},
	} {
		if err := tc.run(NewBuilder(5)); !errors.Is(err, ErrCorruptSnapshot) {
			t.Errorf("%s: %v; want ErrCorruptSnapshot", tc.name, err)
		}
	}
}

// ApplyChanges reports, for each put and delete in order, the key's value
// and version just before it: the state before the batch, or an earlier
// write of the same batch (of the same transaction too); a key that did
// not exist has version 0, even when the batch deleted it before.
func TestApplyChangesPrevious(t *testing.T) {
	s := New()
	applyTxns(t, s, txn(put("a", "a1"), put("b", "b1"))) // LSNs 1, 2; commit 3
	b := batch(4,
		txn(put("a", "a2"), del("b"), del("c")), // commit 7
		txn(put("b", "b2"), put("a", "a3")),     // commit 10
		txn(del("a"), put("a", "a4"), put("d", "")),
	)
	before := len(b.Records)
	got, err := s.ApplyChanges(b, []Change{{Key: "kept"}})
	if err != nil {
		t.Fatal(err)
	}
	if len(b.Records) != before {
		t.Fatalf("batch changed: %d records, was %d", len(b.Records), before)
	}
	type change struct {
		key, value  string
		deleted     bool
		prev        string
		prevVersion uint64
		prevFound   bool
	}
	want := []change{
		{key: "kept"},
		{key: "a", value: "a2", prev: "a1", prevVersion: 3, prevFound: true},
		{key: "b", deleted: true, prev: "b1", prevVersion: 3, prevFound: true},
		{key: "c", deleted: true},
		{key: "b", value: "b2"}, // deleted by commit 7: not found, version 0
		{key: "a", value: "a3", prev: "a2", prevVersion: 7, prevFound: true},
		{key: "a", deleted: true, prev: "a3", prevVersion: 10, prevFound: true},
		{key: "a", value: "a4"}, // deleted earlier in its own transaction
		{key: "d"},
	}
	if len(got) != len(want) {
		t.Fatalf("%d changes, want %d: %+v", len(got), len(want), got)
	}
	for i, c := range got {
		g := change{key: c.Key, value: string(c.Value), deleted: c.Deleted, prev: string(c.Prev), prevVersion: c.PrevVersion, prevFound: c.PrevFound}
		if g != want[i] {
			t.Errorf("change %d = %+v, want %+v", i, g, want[i])
		}
		if c.Deleted && c.Value != nil {
			t.Errorf("change %d: a delete with value %q", i, c.Value)
		}
	}
	// The values are the store's own, shared, not copies.
	if v, _, _ := s.Get([]byte("a")); &v[0] != &got[len(got)-2].Value[0] {
		t.Error("the change's value is a copy of the stored one")
	}
	// A refused batch changes nothing and reports nothing.
	if out, err := s.ApplyChanges(batch(1, txn(put("x", "y"))), got[:1]); !errors.Is(err, ErrLSNMismatch) || len(out) != 1 {
		t.Fatalf("refused batch: %d changes, %v", len(out), err)
	}
}
