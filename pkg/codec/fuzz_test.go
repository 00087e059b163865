package codec_test

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/walship/walship/pkg/codec"
)

func FuzzMsgPackDecode(f *testing.F) {
	for _, s := range []string{
		"93 01 00 dd 00 3d 09 00 92 03", // claims four million records
		"93 01 cf ff ff ff ff ff ff ff ff 92 92 03 00 92 03 00",
		"93 01 00 91 94 01 00 c4 01 6b c6 ff ff ff ff 00",
		"dc 00 03 d0 01 cf 00 00 00 00 00 00 00 64 dd 00 00 00 01 92 cd 00 03 d3 80 00 00 00 00 00 00 00",
	} {
		f.Add(unhex(f, s))
	}
	fuzzDecode(f, codec.MsgPack)
}

func FuzzJSONDecode(f *testing.F) {
	for _, s := range []string{
		`{"v":1,"first_lsn":18446744073709551615,"records":[{"txn":1,"op":"commit"}]}`,
		`{"v":1,"first_lsn":0,"records":[{"txn":1,"op":"put","key":"AP8=","value":null}]}`,
	} {
		f.Add([]byte(s))
	}
	fuzzDecode(f, codec.JSON)
}

// fuzzDecode seeds f with the golden vectors of c and checks the decoding
// property: any input either fails with ErrCorrupt, leaving the batch empty,
// or decodes to a batch that re-encodes, and decodes again, to the same
// batch; the re-encoding is canonical, so encoding that batch once more gives
// the same bytes.
func fuzzDecode(f *testing.F, c codec.Codec) {
	paths, err := filepath.Glob(filepath.Join("testdata", "*."+c.Name()))
	if err != nil || len(paths) == 0 {
		f.Fatalf("no golden vectors for %s: %v", c.Name(), err)
	}
	for _, p := range paths {
		data, err := os.ReadFile(p)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(data)
	}
	f.Fuzz(func(t *testing.T, in []byte) {
		var b codec.Batch
		if err := c.DecodeBatch(in, &b); err != nil {
			if !errors.Is(err, codec.ErrCorrupt) {
				t.Fatalf("error does not wrap ErrCorrupt: %v", err)
			}
			if len(b.Records) != 0 {
				t.Fatalf("%d records left after an error", len(b.Records))
			}
			return
		}
		enc, err := c.AppendBatch(nil, &b)
		if err != nil {
			t.Fatalf("decoded batch does not encode: %v", err)
		}
		var again codec.Batch
		if err := c.DecodeBatch(enc, &again); err != nil {
			t.Fatalf("re-encoding does not decode: %v\n%x", err, enc)
		}
		if d := diffBatch(&b, &again); d != "" {
			t.Fatalf("re-encoding decodes differently: %s", d)
		}
		enc2, err := c.AppendBatch(nil, &again)
		if err != nil || !bytes.Equal(enc, enc2) {
			t.Fatalf("encoding is not canonical: %v\n%x\n%x", err, enc, enc2)
		}
		if c.ID() == codec.IDMsgPack {
			lib, err := libDecode(enc)
			if err != nil {
				t.Fatalf("library cannot decode the re-encoding: %v", err)
			}
			if d := diffBatch(&b, lib); d != "" {
				t.Fatalf("library decodes the re-encoding differently: %s", d)
			}
		}
	})
}
