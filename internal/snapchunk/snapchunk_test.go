package snapchunk

import (
	"bytes"
	"fmt"
	"testing"

	walshipv1 "github.com/walship/walship/gen/walship/v1"
	"google.golang.org/protobuf/proto"
)

// TestChunksHoldCopies adds pairs from one buffer that is overwritten
// after each Add, as a snapshot scanner's shared buffer is, and checks
// every chunk's pairs, their order and the size bound, and that a chunk
// taken is never written again by later Adds.
func TestChunksHoldCopies(t *testing.T) {
	const max = 4 << 10
	c := New(max)
	var (
		chunks []*walshipv1.SnapshotChunk
		frozen [][]byte // each chunk marshalled when taken
	)
	take := func() {
		ch := c.Take()
		if ch == nil {
			return
		}
		b, err := proto.Marshal(ch)
		if err != nil {
			t.Fatal(err)
		}
		chunks, frozen = append(chunks, ch), append(frozen, b)
	}
	var buf []byte
	want := 0
	for i := range 3000 {
		key := fmt.Appendf(buf[:0], "key/%06d", i)
		n := len(key)
		// Values of 0..299 bytes, one of 300 KiB (past a block).
		vlen := i % 300
		if i == 1234 {
			vlen = 300 << 10
		}
		buf = append(key, bytes.Repeat([]byte{byte(i)}, vlen)...)
		if c.Add(buf[:n], buf[n:], uint64(i+1)) {
			if c.Size() < max {
				t.Fatalf("Add said full at %d bytes, under %d", c.Size(), max)
			}
			take()
		} else if c.Size() >= max {
			t.Fatalf("Add said not full at %d bytes", c.Size())
		}
		for j := range buf {
			buf[j] = 0xff // the scanner's buffer is reused
		}
		want++
	}
	take()
	if c.Take() != nil || c.Len() != 0 {
		t.Fatal("Take after Take returned a chunk")
	}
	i := 0
	for ci, ch := range chunks {
		for _, kv := range ch.GetKvs() {
			vlen := i % 300
			if i == 1234 {
				vlen = 300 << 10
			}
			if kv.GetKey() != fmt.Sprintf("key/%06d", i) || !bytes.Equal(kv.GetValue(), bytes.Repeat([]byte{byte(i)}, vlen)) || kv.GetVersionLsn() != uint64(i+1) {
				t.Fatalf("chunk %d: pair %d is %q (%d bytes) at %d", ci, i, kv.GetKey(), len(kv.GetValue()), kv.GetVersionLsn())
			}
			if cap(kv.GetValue()) != len(kv.GetValue()) {
				t.Fatalf("pair %d: value has capacity %d past its %d bytes", i, cap(kv.GetValue()), len(kv.GetValue()))
			}
			i++
		}
		b, err := proto.Marshal(ch)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(b, frozen[ci]) {
			t.Fatalf("chunk %d changed after it was taken", ci)
		}
	}
	if i != want {
		t.Fatalf("%d pairs in the chunks, %d added", i, want)
	}
}

// TestEmptyKeyAndValue: a pair with an empty key or value is kept as one.
func TestEmptyKeyAndValue(t *testing.T) {
	c := New(1 << 20)
	c.Add(nil, nil, 1)
	c.Add([]byte("k"), nil, 2)
	c.Add(nil, []byte("v"), 3)
	ch := c.Take()
	got := fmt.Sprint(len(ch.GetKvs()))
	for _, kv := range ch.GetKvs() {
		got += fmt.Sprintf(" %q=%q@%d", kv.GetKey(), kv.GetValue(), kv.GetVersionLsn())
	}
	if want := `3 ""=""@1 "k"=""@2 ""="v"@3`; got != want {
		t.Fatalf("chunk = %s, want %s", got, want)
	}
}

// BenchmarkChunker is the allocation cost of chunking pairs of a 26-byte
// key and a 100-byte value (the put workload's), per pair.
func BenchmarkChunker(b *testing.B) {
	c := New(1 << 20)
	key, value := []byte("put/4f2a9c1e/03/000000012345"), make([]byte, 100)
	b.ReportAllocs()
	for b.Loop() {
		if c.Add(key, value, 7) {
			c.Take()
		}
	}
}
