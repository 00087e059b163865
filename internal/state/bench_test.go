package state

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/walship/walship/pkg/codec"
)

const (
	benchKeys       = 100_000
	benchValueSize  = 100
	benchTxnsPerB   = 10 // txns per batch
	benchPutsPerTxn = 10
)

func benchKeyset() [][]byte {
	keys := make([][]byte, benchKeys)
	for i := range keys {
		keys[i] = fmt.Appendf(nil, "user/%016x", uint64(i)*0x9e3779b97f4a7c15)
	}
	return keys
}

// benchStore returns a store of the benchKeyset keys, each with a value
// of benchValueSize bytes, applied as one transaction, and the keys.
func benchStore(b testing.TB) (*Store, [][]byte) {
	keys := benchKeyset()
	s := New()
	var bt codec.Batch
	value := make([]byte, benchValueSize)
	for i, k := range keys {
		bt.Records = append(bt.Records, codec.Record{LSN: uint64(i + 1), TxnID: 1, Op: codec.OpPut, Key: k, Value: value})
	}
	bt.Records = append(bt.Records, codec.Record{LSN: uint64(len(keys) + 1), TxnID: 1, Op: codec.OpCommit})
	mustApply(b, s, &bt)
	return s, keys
}

// BenchmarkApply applies batches of 10 txns × 10 puts of 100-byte values
// to random keys of a 100k-key store (so mostly overwrites), reusing one
// Batch as a replica's apply loop does. Bytes are key+value bytes put.
func BenchmarkApply(b *testing.B) {
	// Preloaded so the tree has its steady-state depth.
	s, keys := benchStore(b)
	value := make([]byte, benchValueSize)

	rng := rand.New(rand.NewPCG(1, 1))
	var bt codec.Batch
	perBatch := benchTxnsPerB * (benchPutsPerTxn + 1)
	bt.Records = make([]codec.Record, perBatch)
	b.SetBytes(int64(benchTxnsPerB * benchPutsPerTxn * (len(keys[0]) + benchValueSize)))
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		lsn := s.AppliedLSN() + 1
		i := 0
		for range benchTxnsPerB {
			txnID := lsn + benchPutsPerTxn
			for range benchPutsPerTxn {
				bt.Records[i] = codec.Record{LSN: lsn, TxnID: txnID, Op: codec.OpPut, Key: keys[rng.IntN(len(keys))], Value: value}
				i, lsn = i+1, lsn+1
			}
			bt.Records[i] = codec.Record{LSN: lsn, TxnID: txnID, Op: codec.OpCommit}
			i, lsn = i+1, lsn+1
		}
		if err := s.Apply(&bt); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkGet looks up random existing keys of a 100k-key store.
func BenchmarkGet(b *testing.B) {
	s, keys := benchStore(b)
	rng := rand.New(rand.NewPCG(2, 2))
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		if _, _, ok := s.Get(keys[rng.IntN(len(keys))]); !ok {
			b.Fatal("missing key")
		}
	}
}

// BenchmarkWriteSnapshot encodes a 100k-key view.
func BenchmarkWriteSnapshot(b *testing.B) {
	s, _ := benchStore(b)
	v := s.Snapshot()
	w := &countingWriter{}
	b.ReportAllocs()
	for b.Loop() {
		w.n = 0
		if err := WriteSnapshot(w, v); err != nil {
			b.Fatal(err)
		}
		b.SetBytes(w.n)
	}
}

type countingWriter struct{ n int64 }

func (c *countingWriter) Write(p []byte) (int, error) { c.n += int64(len(p)); return len(p), nil }

// BenchmarkReplay applies batches of 4-put transactions of 100-byte values
// over 200,000 keys, the way a restore replays a log: Store.Apply, and a
// Replayer (its Finish included) that a restore uses.
func BenchmarkReplay(b *testing.B) {
	const keys, batches = 200000, 200
	rng := rand.New(rand.NewPCG(1, 2))
	value := make([]byte, 100)
	var all []*codec.Batch
	lsn := uint64(1)
	for range batches {
		bt := &codec.Batch{}
		for range 400 {
			txn := lsn + 4
			for range 4 {
				bt.Records = append(bt.Records, codec.Record{LSN: lsn, TxnID: txn, Op: codec.OpPut, Key: []byte(fmt.Sprintf("k%08d", rng.IntN(keys))), Value: value})
				lsn++
			}
			bt.Records = append(bt.Records, codec.Record{LSN: lsn, TxnID: txn, Op: codec.OpCommit})
			lsn++
		}
		all = append(all, bt)
	}
	records := int(lsn - 1)
	for _, mode := range []string{"apply", "replayer"} {
		b.Run("mode="+mode, func(b *testing.B) {
			for range b.N {
				s := New()
				if mode == "apply" {
					for _, bt := range all {
						if err := s.Apply(bt); err != nil {
							b.Fatal(err)
						}
					}
					continue
				}
				rp := NewReplayer(s)
				for _, bt := range all {
					if err := rp.Apply(bt); err != nil {
						b.Fatal(err)
					}
				}
				rp.Finish()
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*records), "ns/record")
		})
	}
}

// BenchmarkApplyAppend inserts new keys as `walship bench --workload put`
// does: 8 writers, each appending put/RUN/TT/NNNNNNNNNNNN keys in order,
// 100-byte values, one put per transaction, 24 transactions per apply
// (the pipelined cell's group). The store grows by b.N keys, as a
// primary's does over a run; ApplyChanges is what the primary calls.
// ns/op is per put, with the garbage collector's share of the growing
// tree included.
func BenchmarkApplyAppend(b *testing.B) {
	const writers, perApply = 8, 24
	s := New()
	value := make([]byte, benchValueSize)
	var bt codec.Batch
	bt.Records = make([]codec.Record, 2*perApply)
	keys := make([][]byte, 2*perApply)
	var changes []Change
	next := make([]int, writers)
	b.ReportAllocs()
	b.ResetTimer()
	for n := 0; n < b.N; n += perApply {
		lsn := s.AppliedLSN() + 1
		for i := range perApply {
			w := (n + i) % writers
			next[w]++
			keys[i] = fmt.Appendf(keys[i][:0], "put/4f2a9c1e/%02d/%012d", w, next[w])
			bt.Records[2*i] = codec.Record{LSN: lsn, TxnID: lsn + 1, Op: codec.OpPut, Key: keys[i], Value: value}
			bt.Records[2*i+1] = codec.Record{LSN: lsn + 1, TxnID: lsn + 1, Op: codec.OpCommit}
			lsn += 2
		}
		var err error
		if changes, err = s.ApplyChanges(&bt, changes[:0]); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkSnapshotScanner reads a snapshot of 100k keys with 100-byte
// values pair by pair: Scan (each pair in memory of its own) and Visit
// (one buffer). ns/op and allocs/op are per snapshot.
func BenchmarkSnapshotScanner(b *testing.B) {
	s, _ := benchStore(b)
	var buf bytes.Buffer
	if err := WriteSnapshot(&buf, s.Snapshot()); err != nil {
		b.Fatal(err)
	}
	data := buf.Bytes()
	for _, visit := range []bool{false, true} {
		name := "Scan"
		if visit {
			name = "Visit"
		}
		b.Run(name, func(b *testing.B) {
			b.SetBytes(int64(len(data)))
			b.ReportAllocs()
			for b.Loop() {
				sc, err := NewSnapshotScanner(bytes.NewReader(data), int64(len(data)))
				if err != nil {
					b.Fatal(err)
				}
				if _, err := scanOf(sc, visit)(func([]byte, []byte, uint64) error { return nil }); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
