package changefeed

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/walship/walship/internal/state"
	"github.com/walship/walship/pkg/codec"
)

// BenchmarkApplyFeed is what a node's apply path spends per transaction
// on the state and the watch feed together, with nobody watching: one
// transaction of one 100-byte put to a random key of a 100,000-key store
// (mostly overwrites), applied as one batch, as the primary's resolve and
// a replica's apply do for each round. apply=state is the store alone
// (the floor); apply=feed adds the feed's transactions, with previous
// values, appended to the ring.
func BenchmarkApplyFeed(b *testing.B) {
	for _, withFeed := range []bool{false, true} {
		name := "apply=state"
		if withFeed {
			name = "apply=feed"
		}
		b.Run(name, func(b *testing.B) { benchApplyFeed(b, withFeed) })
	}
}

func benchApplyFeed(b *testing.B, withFeed bool) {
	const keys, valueSize = 100_000, 100
	keyset := make([][]byte, keys)
	value := make([]byte, valueSize)
	st := state.New()
	var pre codec.Batch
	for i := range keyset {
		keyset[i] = fmt.Appendf(nil, "user/%016x", uint64(i)*0x9e3779b97f4a7c15)
		pre.Records = append(pre.Records, codec.Record{LSN: uint64(i + 1), TxnID: 1, Op: codec.OpPut, Key: keyset[i], Value: value})
	}
	pre.Records = append(pre.Records, codec.Record{LSN: uint64(keys + 1), TxnID: 1, Op: codec.OpCommit})
	if err := st.Apply(&pre); err != nil {
		b.Fatal(err)
	}
	feed := New(st.AppliedLSN(), 0, 0)
	rng := rand.New(rand.NewPCG(1, 1))
	bt := codec.Batch{Records: make([]codec.Record, 2)}
	commitTime := func(lsn uint64) int64 { return int64(lsn) }
	var txns []*Txn
	b.ReportAllocs()
	for b.Loop() {
		lsn := st.AppliedLSN() + 1
		bt.Records[0] = codec.Record{LSN: lsn, TxnID: lsn + 1, Op: codec.OpPut, Key: keyset[rng.IntN(keys)], Value: value}
		bt.Records[1] = codec.Record{LSN: lsn + 1, TxnID: lsn + 1, Op: codec.OpCommit}
		if !withFeed {
			if err := st.Apply(&bt); err != nil {
				b.Fatal(err)
			}
			continue
		}
		changes, err := st.ApplyChanges(&bt, nil)
		if err != nil {
			b.Fatal(err)
		}
		txns = FromChanges(txns[:0], bt.Records, changes, commitTime)
		feed.Append(txns)
	}
}
