package codec_test

import (
	"errors"
	"math"
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/walship/walship/pkg/codec"
)

func TestByIDAndName(t *testing.T) {
	tests := []struct {
		id      codec.ID
		name    string
		want    codec.Codec
		wantErr bool
	}{
		{id: codec.IDMsgPack, name: "msgpack", want: codec.MsgPack},
		{id: codec.IDJSON, name: "json", want: codec.JSON},
		{id: 0, name: "", wantErr: true},
		{id: 3, name: "MsgPack", wantErr: true},
		{id: 255, name: "protobuf", wantErr: true},
	}
	for _, tt := range tests {
		got, err := codec.ByID(tt.id)
		if tt.wantErr {
			if !errors.Is(err, codec.ErrUnknownCodec) {
				t.Errorf("ByID(%d) = %v, %v; want ErrUnknownCodec", tt.id, got, err)
			}
		} else if err != nil || got != tt.want || got.ID() != tt.id || got.Name() != tt.name {
			t.Errorf("ByID(%d) = %v, %v; want %v", tt.id, got, err, tt.want)
		}
		got, err = codec.ByName(tt.name)
		if tt.wantErr {
			if !errors.Is(err, codec.ErrUnknownCodec) {
				t.Errorf("ByName(%q) = %v, %v; want ErrUnknownCodec", tt.name, got, err)
			}
		} else if err != nil || got != tt.want || got.ID() != tt.id {
			t.Errorf("ByName(%q) = %v, %v; want %v", tt.name, got, err, tt.want)
		}
		if !tt.wantErr && tt.id.String() != tt.name {
			t.Errorf("ID(%d).String() = %q, want %q", tt.id, tt.id.String(), tt.name)
		}
	}
	if s := codec.ID(9).String(); s != "codec(9)" {
		t.Errorf("ID(9).String() = %q", s)
	}
}

func TestOp(t *testing.T) {
	tests := []struct {
		op    codec.Op
		name  string
		valid bool
	}{
		{0, "op(0)", false},
		{codec.OpPut, "put", true},
		{codec.OpDelete, "delete", true},
		{codec.OpCommit, "commit", true},
		{4, "op(4)", false},
	}
	for _, tt := range tests {
		if tt.op.String() != tt.name || tt.op.Valid() != tt.valid {
			t.Errorf("Op(%d): String %q Valid %v, want %q %v", uint8(tt.op), tt.op.String(), tt.op.Valid(), tt.name, tt.valid)
		}
	}
}

func TestChecksum(t *testing.T) {
	tests := []struct {
		in   string
		want uint32
	}{
		{"", 0},
		{"123456789", 0xe3069283}, // the CRC-32C check value
		{"a", 0xc1d04330},
	}
	for _, tt := range tests {
		if got := codec.Checksum([]byte(tt.in)); got != tt.want {
			t.Errorf("Checksum(%q) = %#08x, want %#08x", tt.in, got, tt.want)
		}
	}
	whole := codec.Checksum([]byte("123456789"))
	if got := codec.UpdateChecksum(codec.Checksum([]byte("1234")), []byte("56789")); got != whole {
		t.Errorf("UpdateChecksum in two parts = %#08x, want %#08x", got, whole)
	}
	p := []byte("123456789")
	if n := testing.AllocsPerRun(100, func() { codec.Checksum(p) }); n != 0 {
		t.Errorf("Checksum allocates %v times", n)
	}
}

// TestRoundTrip covers the edges of the layout: empty batch, every integer
// and length form, TxnID deltas in both directions and the top of the LSN
// range.
func TestRoundTrip(t *testing.T) {
	big := strings.Repeat("v", 70_000) // bin32
	tests := []struct {
		name string
		b    *codec.Batch
	}{
		{"empty", &codec.Batch{}},
		{"lone commit", batchOf(1, commit(1))},
		{"lsn zero", batchOf(0, put(0, "k", "v"), commit(0))},
		{"put delete commit", batchOf(100, put(7, "k1", "v1"), del(7, "k2"), commit(7))},
		{"empty key and value", batchOf(5, put(1, "", ""), del(1, ""), commit(1))},
		{"binary key", batchOf(5, put(1, "\x00\xff\xfe", "\x80"), commit(1))},
		{"bin8 limit", batchOf(5, put(1, strings.Repeat("k", 255), strings.Repeat("v", 256)), commit(1))},
		{"bin16 limit", batchOf(5, put(1, strings.Repeat("k", 65535), strings.Repeat("v", 65536)), commit(1))},
		{"bin32", batchOf(5, put(1, "k", big), commit(1))},
		{"txn deltas", batchOf(9,
			commit(0), commit(127), commit(128), commit(0), commit(math.MaxUint64),
			commit(math.MaxUint64-32), commit(math.MaxUint64-33), commit(1<<16), commit(1<<32+5),
			commit(1<<63), commit(0), commit(1<<63-1), commit(1<<63), commit(1))},
		{"last lsn max", batchOf(math.MaxUint64-2, put(1, "a", "b"), del(1, "a"), commit(1))},
		{"first lsn max", batchOf(math.MaxUint64, commit(1))},
		{"first lsn forms", batchOf(1<<40, commit(1))},
		{"array16", batchOf(1, repeat(commit(3), 16)...)},
		{"array32", batchOf(1, repeat(del(3, "k"), 70_000)...)},
	}
	for _, tt := range tests {
		for _, c := range codecs {
			t.Run(tt.name+"/"+c.Name(), func(t *testing.T) { roundTrip(t, c, tt.b) })
		}
	}
}

func repeat(r codec.Record, n int) []codec.Record {
	recs := make([]codec.Record, n)
	for i := range recs {
		recs[i] = r
	}
	return recs
}

// TestRoundTripRandom is the round-trip property over random valid batches.
func TestRoundTripRandom(t *testing.T) {
	n := 2000
	if testing.Short() {
		n = 200
	}
	rng := rand.New(rand.NewPCG(1, 2))
	for range n {
		b := randomBatch(rng)
		for _, c := range codecs {
			roundTrip(t, c, b)
		}
	}
}

// TestEncodeInvalid checks that both codecs refuse the same invalid batches
// and leave dst unchanged.
func TestEncodeInvalid(t *testing.T) {
	tests := []struct {
		name string
		b    *codec.Batch
		want string
	}{
		{"nil batch", nil, "nil batch"},
		{"unknown op", batchOf(1, codec.Record{TxnID: 1, Op: 4, Key: []byte("k")}), "unknown op 4"},
		{"zero op", batchOf(1, codec.Record{TxnID: 1}), "unknown op 0"},
		{"commit with key", batchOf(1, codec.Record{TxnID: 1, Op: codec.OpCommit, Key: []byte("k")}), "commit has a 1-byte key"},
		{"commit with value", batchOf(1, codec.Record{TxnID: 1, Op: codec.OpCommit, Value: []byte("v")}), "1-byte value, want none"},
		{"delete with value", batchOf(1, codec.Record{TxnID: 1, Op: codec.OpDelete, Key: []byte("k"), Value: []byte("v")}), "delete has a 1-byte value"},
		{"lsn gap", &codec.Batch{Records: []codec.Record{{LSN: 1, Op: codec.OpCommit}, {LSN: 3, Op: codec.OpCommit}}}, "record 1 has LSN 3, want 2"},
		{"lsn not set", &codec.Batch{Records: []codec.Record{{LSN: 1, Op: codec.OpCommit}, {Op: codec.OpCommit}}}, "record 1 has LSN 0, want 2"},
		{"lsn overflow", &codec.Batch{Records: []codec.Record{{LSN: math.MaxUint64, Op: codec.OpCommit}, {LSN: 0, Op: codec.OpCommit}}}, "overflow"},
	}
	for _, tt := range tests {
		for _, c := range codecs {
			t.Run(tt.name+"/"+c.Name(), func(t *testing.T) {
				dst := []byte("prefix")
				got, err := c.AppendBatch(dst, tt.b)
				if !errors.Is(err, codec.ErrInvalidBatch) || !strings.Contains(err.Error(), tt.want) {
					t.Fatalf("AppendBatch error = %v, want ErrInvalidBatch containing %q", err, tt.want)
				}
				if string(got) != "prefix" {
					t.Errorf("AppendBatch changed dst to %q", got)
				}
			})
		}
	}
}

// TestAppendKeepsPrefix checks that AppendBatch appends rather than
// overwrites, and that decoding ignores nothing of the prefix it is not given.
func TestAppendKeepsPrefix(t *testing.T) {
	b := batchOf(10, put(1, "k", "v"), commit(1))
	for _, c := range codecs {
		out, err := c.AppendBatch([]byte("hdr:"), b)
		if err != nil {
			t.Fatal(err)
		}
		if string(out[:4]) != "hdr:" {
			t.Fatalf("%s: prefix overwritten: %q", c.Name(), out[:4])
		}
		var got codec.Batch
		if err := c.DecodeBatch(out[4:], &got); err != nil || !equalBatch(b, &got) {
			t.Fatalf("%s: decode after prefix: %v %s", c.Name(), err, diffBatch(b, &got))
		}
	}
}

// TestDecodeErrorEmptiesBatch checks the documented state after an error:
// no records, capacity kept.
func TestDecodeErrorEmptiesBatch(t *testing.T) {
	for _, c := range codecs {
		var b codec.Batch
		enc, _ := c.AppendBatch(nil, batchOf(1, put(1, "k", "v"), commit(1)))
		if err := c.DecodeBatch(enc, &b); err != nil {
			t.Fatal(err)
		}
		capBefore := cap(b.Records)
		if err := c.DecodeBatch(enc[:len(enc)-1], &b); !errors.Is(err, codec.ErrCorrupt) {
			t.Fatalf("%s: truncated input: err = %v, want ErrCorrupt", c.Name(), err)
		}
		if len(b.Records) != 0 || cap(b.Records) != capBefore {
			t.Errorf("%s: after error len %d cap %d, want 0 and %d", c.Name(), len(b.Records), cap(b.Records), capBefore)
		}
	}
}

// TestMsgPackAllocs pins the allocation targets: encoding into a buffer with
// room and decoding into a Batch with capacity allocate nothing, and a decode
// into an empty Batch allocates once (the records slice).
func TestMsgPackAllocs(t *testing.T) {
	if testing.CoverMode() != "" || raceEnabled {
		t.Skip("instrumented builds allocate: make test runs this test again without -race")
	}
	b := realisticBatch(4096)
	enc, err := codec.MsgPack.AppendBatch(nil, b)
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 0, len(enc))
	if n := testing.AllocsPerRun(20, func() { buf, _ = codec.MsgPack.AppendBatch(buf[:0], b) }); n != 0 {
		t.Errorf("encode into a buffer with room: %v allocs, want 0", n)
	}
	if n := testing.AllocsPerRun(20, func() { _, _ = codec.MsgPack.AppendBatch(nil, b) }); n != 1 {
		t.Errorf("encode into nil: %v allocs, want 1 (grow once to the exact size)", n)
	}
	var out codec.Batch
	if n := testing.AllocsPerRun(20, func() { _ = codec.MsgPack.DecodeBatch(enc, &out) }); n != 0 {
		t.Errorf("decode into a reused batch: %v allocs, want 0", n)
	}
	if n := testing.AllocsPerRun(20, func() { _ = codec.MsgPack.DecodeBatch(enc, &codec.Batch{}) }); n != 1 {
		t.Errorf("decode into a new batch: %v allocs, want 1", n)
	}
}
