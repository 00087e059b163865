package codec_test

import (
	"bytes"
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/walship/walship/pkg/codec"
)

// codecs lists every codec, for tests that must hold for both.
var codecs = []codec.Codec{codec.MsgPack, codec.JSON}

// equalBatch reports whether a and b hold the same records. Nil and empty
// keys and values are equal: the codecs do not keep the difference.
func equalBatch(a, b *codec.Batch) bool {
	if len(a.Records) != len(b.Records) {
		return false
	}
	for i := range a.Records {
		x, y := &a.Records[i], &b.Records[i]
		if x.LSN != y.LSN || x.TxnID != y.TxnID || x.Op != y.Op ||
			!bytes.Equal(x.Key, y.Key) || !bytes.Equal(x.Value, y.Value) {
			return false
		}
	}
	return true
}

// diffBatch describes the first difference between want and got.
func diffBatch(want, got *codec.Batch) string {
	if len(want.Records) != len(got.Records) {
		return fmt.Sprintf("got %d records, want %d", len(got.Records), len(want.Records))
	}
	for i := range want.Records {
		w, g := want.Records[i], got.Records[i]
		if w.LSN != g.LSN || w.TxnID != g.TxnID || w.Op != g.Op || !bytes.Equal(w.Key, g.Key) || !bytes.Equal(w.Value, g.Value) {
			return fmt.Sprintf("record %d: got %s, want %s", i, fmtRecord(g), fmtRecord(w))
		}
	}
	return ""
}

func fmtRecord(r codec.Record) string {
	return fmt.Sprintf("{lsn=%d txn=%d %s key=%q value=%q}", r.LSN, r.TxnID, r.Op, r.Key, r.Value)
}

// roundTrip encodes b with c, decodes it back and fails t on any difference.
// It returns the encoding.
func roundTrip(t testing.TB, c codec.Codec, b *codec.Batch) []byte {
	t.Helper()
	enc, err := c.AppendBatch(nil, b)
	if err != nil {
		t.Fatalf("%s: AppendBatch: %v", c.Name(), err)
	}
	var got codec.Batch
	if err := c.DecodeBatch(enc, &got); err != nil {
		t.Fatalf("%s: DecodeBatch of own output: %v\ninput %x", c.Name(), err, enc)
	}
	if d := diffBatch(b, &got); d != "" {
		t.Fatalf("%s: round trip: %s", c.Name(), d)
	}
	return enc
}

// batchOf numbers recs consecutively from first, so tests list only what
// matters.
func batchOf(first uint64, recs ...codec.Record) *codec.Batch {
	for i := range recs {
		recs[i].LSN = first + uint64(i)
	}
	return &codec.Batch{Records: recs}
}

func put(txn uint64, key, value string) codec.Record {
	return codec.Record{TxnID: txn, Op: codec.OpPut, Key: []byte(key), Value: []byte(value)}
}

func del(txn uint64, key string) codec.Record {
	return codec.Record{TxnID: txn, Op: codec.OpDelete, Key: []byte(key)}
}

func commit(txn uint64) codec.Record {
	return codec.Record{TxnID: txn, Op: codec.OpCommit}
}

// randomBatch builds an arbitrary valid batch for property tests: any bytes
// in keys and values, lengths around the bin8/bin16 boundaries, TxnIDs that
// jump both ways and LSNs up to the top of the range.
func randomBatch(rng *rand.Rand) *codec.Batch {
	n := rng.IntN(40)
	if rng.IntN(20) == 0 {
		n = 16 + rng.IntN(300) // array16 record counts
	}
	var first uint64
	switch rng.IntN(4) {
	case 0:
		first = rng.Uint64N(200)
	case 1:
		first = math.MaxUint64 - uint64(n) + 1 // last LSN is 2^64-1
	default:
		first = rng.Uint64()
		if n > 0 && first > math.MaxUint64-uint64(n-1) {
			first = math.MaxUint64 - uint64(n-1)
		}
	}
	randLen := func() int {
		switch rng.IntN(10) {
		case 0:
			return 0
		case 1:
			return 250 + rng.IntN(20) // around the bin8 limit
		case 2:
			if rng.IntN(10) == 0 {
				return 65530 + rng.IntN(12) // around the bin16 limit
			}
		}
		return 1 + rng.IntN(40)
	}
	randBytes := func() []byte {
		p := make([]byte, randLen())
		for i := range p {
			p[i] = byte(rng.Uint32())
		}
		return p
	}
	txn := rng.Uint64()
	recs := make([]codec.Record, n)
	for i := range recs {
		switch rng.IntN(5) {
		case 0:
			txn = rng.Uint64()
		case 1:
			txn += uint64(rng.IntN(200)) - 100
		}
		r := codec.Record{LSN: first + uint64(i), TxnID: txn, Op: codec.Op(1 + rng.IntN(3))}
		switch r.Op {
		case codec.OpPut:
			r.Key, r.Value = randBytes(), randBytes()
		case codec.OpDelete:
			r.Key = randBytes()
		}
		recs[i] = r
	}
	return &codec.Batch{Records: recs}
}

// realisticBatch builds n records shaped like walship's workload, from a
// fixed seed so that benchmarks are comparable across runs: TPC-C-like keys of
// 16 to 40 bytes, values of 0 to 300 bytes, transactions of 1 to 8 puts and
// deletes ended by an OpCommit, and the last record always a commit (so
// records=1 is a lone commit: the per-batch overhead).
func realisticBatch(n int) *codec.Batch {
	rng := rand.New(rand.NewPCG(0x5741_4c53, 0x4849_5021))
	const letters = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789 ,.:;-_"
	first := uint64(1_000_000)
	txn := uint64(70_000)
	left := 1 + rng.IntN(8)
	recs := make([]codec.Record, n)
	var sb strings.Builder
	for i := range recs {
		r := codec.Record{LSN: first + uint64(i), TxnID: txn}
		if left == 0 || i == n-1 {
			r.Op = codec.OpCommit
			txn += 1 + uint64(rng.IntN(3)) // other writers' txns in between
			left = 1 + rng.IntN(8)
			recs[i] = r
			continue
		}
		left--
		w := 1 + rng.IntN(10)
		sb.Reset()
		switch rng.IntN(3) {
		case 0:
			fmt.Fprintf(&sb, "warehouse/%d/district/%d/customer/%d", w, 1+rng.IntN(10), 1+rng.IntN(3000))
		case 1:
			fmt.Fprintf(&sb, "warehouse/%d/stock/%d", w, 1+rng.IntN(100_000))
		default:
			fmt.Fprintf(&sb, "warehouse/%d/district/%d/order/%d", w, 1+rng.IntN(10), 1+rng.IntN(30_000))
		}
		r.Key = []byte(sb.String())
		if rng.IntN(8) == 0 {
			r.Op = codec.OpDelete
		} else {
			r.Op = codec.OpPut
			r.Value = make([]byte, rng.IntN(301))
			for j := range r.Value {
				r.Value[j] = letters[rng.IntN(len(letters))]
			}
		}
		recs[i] = r
	}
	return &codec.Batch{Records: recs}
}

func TestRealisticBatchShape(t *testing.T) {
	b := realisticBatch(4096)
	var ops [4]int
	for i, r := range b.Records {
		ops[r.Op]++
		if r.Op == codec.OpCommit {
			continue
		}
		if len(r.Key) < 16 || len(r.Key) > 40 {
			t.Errorf("record %d: key %q is %d bytes, want 16..40", i, r.Key, len(r.Key))
		}
		if len(r.Value) > 300 {
			t.Errorf("record %d: value is %d bytes, want <= 300", i, len(r.Value))
		}
	}
	if b.Records[len(b.Records)-1].Op != codec.OpCommit {
		t.Error("last record is not a commit")
	}
	t.Logf("4096 records: %d puts, %d deletes, %d commits", ops[codec.OpPut], ops[codec.OpDelete], ops[codec.OpCommit])
}
