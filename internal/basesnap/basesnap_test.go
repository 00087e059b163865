package basesnap

import (
	"bytes"
	"encoding/binary"
	"errors"
	"hash/crc32"
	"testing"

	walshipv1 "github.com/walship/walship/gen/walship/v1"

	"google.golang.org/protobuf/proto"
)

// TestBaseFileLayout pins the prefix of a base snapshot file
// (docs/FORMAT.md): magic, version, meta length, meta, CRC-32C.
func TestBaseFileLayout(t *testing.T) {
	hdr := &walshipv1.SnapshotHeader{Epoch: 2, Lsn: 40, Keys: 3, ClusterId: "8a0f4a6e-7d3f-4c4b-9a63-2b5f0e1d9c11", CommitTimeUnixNano: 7,
		History: []*walshipv1.EpochStart{{Epoch: 1, FirstLsn: 1}, {Epoch: 2, FirstLsn: 31}}}
	got, err := EncodeMeta(hdr)
	if err != nil {
		t.Fatal(err)
	}
	meta, err := proto.MarshalOptions{Deterministic: true}.Marshal(hdr)
	if err != nil {
		t.Fatal(err)
	}
	want := []byte("WSHPBASE")
	want = binary.LittleEndian.AppendUint32(want, 1)
	want = binary.LittleEndian.AppendUint32(want, uint32(len(meta)))
	want = append(want, meta...)
	want = binary.LittleEndian.AppendUint32(want, crc32.Checksum(want, crc32.MakeTable(crc32.Castagnoli)))
	if !bytes.Equal(got, want) {
		t.Fatalf("prefix\n%x\nwant\n%x", got, want)
	}
	back, off, err := DecodeMeta(bytes.NewReader(append(got, make([]byte, 68)...)), int64(len(got)+68))
	if err != nil || off != int64(len(got)) || !proto.Equal(back, hdr) {
		t.Fatalf("decode: %v at %d, %v", back, off, err)
	}
}

// FuzzDecodeBaseMeta: arbitrary bytes at the start of a base snapshot
// file either fail as damage (ErrBad) or decode to a meta that
// re-encodes to the same prefix.
func FuzzDecodeBaseMeta(f *testing.F) {
	good, err := EncodeMeta(&walshipv1.SnapshotHeader{Epoch: 2, Lsn: 40, Keys: 3, History: []*walshipv1.EpochStart{{Epoch: 1, FirstLsn: 1}}})
	if err != nil {
		f.Fatal(err)
	}
	f.Add(good)
	f.Add([]byte("WSHPBASE"))
	f.Add(append([]byte("WSHPBASE\x01\x00\x00\x00\xff\xff\xff\xff"), 0, 0, 0, 0))
	f.Fuzz(func(t *testing.T, data []byte) {
		hdr, off, err := DecodeMeta(bytes.NewReader(data), int64(len(data)))
		if err != nil {
			if !errors.Is(err, ErrBad) {
				t.Fatalf("error %v is not ErrBad", err)
			}
			return
		}
		if off > int64(len(data)) {
			t.Fatalf("state offset %d past %d bytes", off, len(data))
		}
		again, err := EncodeMeta(hdr)
		if err != nil {
			t.Fatal(err)
		}
		// Protobuf decoding accepts more than one encoding of a message;
		// what is decoded must at least decode the same again.
		back, _, err := DecodeMeta(bytes.NewReader(again), int64(len(again)))
		if err != nil || !proto.Equal(back, hdr) {
			t.Fatalf("re-encoded meta decodes to %v, %v; want %v", back, err, hdr)
		}
	})
}
