package state

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/walship/walship/pkg/codec"
)

// TestReplayerBuildsWhatApplyBuilds: random transactions of puts, deletes
// and rewrites of few keys, on top of a non-empty base, replayed and
// applied: the same content, versions, LSN and digest.
func TestReplayerBuildsWhatApplyBuilds(t *testing.T) {
	for seed := range uint64(20) {
		rng := rand.New(rand.NewPCG(seed, 7))
		applied, base := New(), New()
		for _, s := range []*Store{applied, base} {
			applyTxns(t, s, txn(put("a", "base"), put("z", "base")), txn(put("m", "base")))
		}
		rp := NewReplayer(base)
		for range 200 {
			var txns [][]codec.Record
			for range 1 + rng.IntN(3) {
				var tx []codec.Record
				for range 1 + rng.IntN(4) {
					k := fmt.Sprintf("k%d", rng.IntN(12))
					if rng.IntN(4) == 0 {
						tx = append(tx, del(k))
					} else {
						tx = append(tx, put(k, fmt.Sprintf("v%d", rng.IntN(1000))))
					}
				}
				txns = append(txns, tx)
			}
			b := batch(applied.AppliedLSN()+1, txns...)
			mustApply(t, applied, b)
			if err := rp.Apply(b); err != nil {
				t.Fatal(err)
			}
			// The batch's buffers are the caller's again.
			for i := range b.Records {
				clear(b.Records[i].Key)
				clear(b.Records[i].Value)
			}
		}
		got := rp.Finish()
		if got.AppliedLSN() != applied.AppliedLSN() || got.Digest() != applied.Digest() {
			t.Fatalf("seed %d: replayed to LSN %d digest %s; applied to LSN %d digest %s", seed, got.AppliedLSN(), got.Digest(), applied.AppliedLSN(), applied.Digest())
		}
		if a, b := dump(applied), dump(got); !slices.Equal(a, b) {
			t.Fatalf("seed %d: replayed %v, applied %v", seed, b, a)
		}
	}
}

// TestReplayerRefusesWhatApplyRefuses: a batch that does not follow, or is
// not whole transactions, changes nothing.
func TestReplayerRefusesWhatApplyRefuses(t *testing.T) {
	s := New()
	applyTxns(t, s, txn(put("a", "1")))
	rp := NewReplayer(s)
	for _, tc := range []struct {
		name string
		b    *codec.Batch
		want error
	}{
		{"gap", batch(4, txn(put("b", "2"))), ErrLSNMismatch},
		{"replay of applied", batch(1, txn(put("b", "2"))), ErrLSNMismatch},
		{"no commit", &codec.Batch{Records: []codec.Record{{LSN: 3, TxnID: 4, Op: codec.OpPut, Key: []byte("b")}}}, ErrInvalidBatch},
	} {
		if err := rp.Apply(tc.b); !errors.Is(err, tc.want) {
			t.Errorf("%s: %v, want %v", tc.name, err, tc.want)
		}
	}
	if got := rp.Finish(); got.AppliedLSN() != 2 || len(dump(got)) != 1 {
		t.Fatalf("after refused batches: LSN %d, %v", got.AppliedLSN(), dump(got))
	}
}
