package envelope

import (
	"errors"
	"testing"

	walshipv1 "github.com/walship/walship/gen/walship/v1"
	"github.com/walship/walship/pkg/codec"
	"google.golang.org/protobuf/proto"
)

func sample(t testing.TB) *walshipv1.WalBatch {
	b := &codec.Batch{Records: []codec.Record{
		{LSN: 5, TxnID: 9, Op: codec.OpPut, Key: []byte("warehouse/1"), Value: []byte("v")},
		{LSN: 6, TxnID: 9, Op: codec.OpDelete, Key: []byte("warehouse/2")},
		{LSN: 7, TxnID: 9, Op: codec.OpCommit},
	}}
	payload, err := codec.MsgPack.AppendBatch(nil, b)
	if err != nil {
		t.Fatal(err)
	}
	return &walshipv1.WalBatch{Epoch: 1, FirstLsn: 5, LastLsn: 7, PrevLsn: 4, CommitTimeUnixNano: 1e18,
		Codec: walshipv1.Codec_CODEC_MSGPACK, Payload: payload, Crc32C: codec.Checksum(payload)}
}

func TestRoundTripAndChecks(t *testing.T) {
	good := sample(t)
	data, err := Marshal(good)
	if err != nil {
		t.Fatal(err)
	}
	again, _ := Marshal(good)
	if string(data) != string(again) {
		t.Fatal("Marshal is not deterministic")
	}
	var env walshipv1.WalBatch
	var b codec.Batch
	if err := DecodeStored(data, &env, &b); err != nil {
		t.Fatal(err)
	}
	if !proto.Equal(&env, good) || len(b.Records) != 3 || b.LastLSN() != 7 {
		t.Fatalf("round trip: %v %v", &env, b)
	}
	for _, tc := range []struct {
		name   string
		mutate func(e *walshipv1.WalBatch)
	}{
		{"bad crc", func(e *walshipv1.WalBatch) { e.Crc32C++ }},
		{"first lsn 0", func(e *walshipv1.WalBatch) { e.FirstLsn, e.PrevLsn = 0, 0 }},
		{"last before first", func(e *walshipv1.WalBatch) { e.LastLsn = 4 }},
		{"prev mismatch", func(e *walshipv1.WalBatch) { e.PrevLsn = 3 }},
		{"unknown codec", func(e *walshipv1.WalBatch) { e.Codec = 9 }},
		{"range differs from payload", func(e *walshipv1.WalBatch) { e.LastLsn = 8 }},
		{"no commit at the end", func(e *walshipv1.WalBatch) {
			p, _ := codec.MsgPack.AppendBatch(nil, &codec.Batch{Records: []codec.Record{{LSN: 5, TxnID: 1, Op: codec.OpPut, Key: []byte("k")}}})
			e.Payload, e.Crc32C, e.LastLsn = p, codec.Checksum(p), 5
		}},
	} {
		e := proto.Clone(good).(*walshipv1.WalBatch)
		tc.mutate(e)
		if err := Decode(e, &b); !errors.Is(err, codec.ErrCorrupt) {
			t.Errorf("%s: %v; want ErrCorrupt", tc.name, err)
		}
	}
	if err := Verify(nil); !errors.Is(err, codec.ErrCorrupt) {
		t.Errorf("nil envelope: %v", err)
	}
	if err := DecodeStored([]byte{0xff, 0xff}, &env, &b); !errors.Is(err, codec.ErrCorrupt) {
		t.Errorf("garbage: %v", err)
	}
}

// FuzzDecodeStored: any stored bytes either fail cleanly with ErrCorrupt or
// decode to an envelope whose payload decodes to its own LSN range and
// re-marshals to bytes that decode the same.
func FuzzDecodeStored(f *testing.F) {
	data, err := Marshal(sample(f))
	if err != nil {
		f.Fatal(err)
	}
	f.Add(data)
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, data []byte) {
		var env walshipv1.WalBatch
		var b codec.Batch
		if err := DecodeStored(data, &env, &b); err != nil {
			if !errors.Is(err, codec.ErrCorrupt) {
				t.Fatalf("error does not wrap ErrCorrupt: %v", err)
			}
			return
		}
		if b.FirstLSN() != env.FirstLsn || b.LastLSN() != env.LastLsn {
			t.Fatalf("accepted a payload with LSNs %d..%d in an envelope of %d..%d", b.FirstLSN(), b.LastLSN(), env.FirstLsn, env.LastLsn)
		}
		again, err := Marshal(&env)
		if err != nil {
			t.Fatal(err)
		}
		var env2 walshipv1.WalBatch
		var b2 codec.Batch
		if err := DecodeStored(again, &env2, &b2); err != nil || !proto.Equal(&env, &env2) {
			t.Fatalf("re-marshalled envelope does not decode the same: %v", err)
		}
	})
}
