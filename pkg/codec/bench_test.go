package codec_test

import (
	"fmt"
	"testing"

	"github.com/walship/walship/pkg/codec"
)

// BenchmarkCodec measures both codecs over realisticBatch. b.SetBytes is the
// size of the MessagePack encoding for both codecs, so MB/s compares the
// same logical data; each codec's own encoded size is reported as
// bytes/batch.
func BenchmarkCodec(b *testing.B) {
	for _, c := range []codec.Codec{codec.JSON, codec.MsgPack} {
		b.Run(c.Name(), func(b *testing.B) {
			for _, op := range []string{"encode", "decode"} {
				b.Run(op, func(b *testing.B) {
					for _, n := range []int{1, 64, 4096} {
						b.Run(fmt.Sprintf("records=%d", n), func(b *testing.B) {
							benchCodec(b, c, op, realisticBatch(n))
						})
					}
				})
			}
		})
	}
}

func benchCodec(b *testing.B, c codec.Codec, op string, batch *codec.Batch) {
	logical, err := codec.MsgPack.AppendBatch(nil, batch)
	if err != nil {
		b.Fatal(err)
	}
	enc, err := c.AppendBatch(nil, batch)
	if err != nil {
		b.Fatal(err)
	}
	b.SetBytes(int64(len(logical)))
	b.ReportAllocs()
	switch op {
	case "encode":
		buf := make([]byte, 0, len(enc))
		for b.Loop() {
			if buf, err = c.AppendBatch(buf[:0], batch); err != nil {
				b.Fatal(err)
			}
		}
	case "decode":
		var out codec.Batch
		for b.Loop() {
			if err := c.DecodeBatch(enc, &out); err != nil {
				b.Fatal(err)
			}
		}
	}
	b.ReportMetric(float64(len(enc)), "bytes/batch")
}
