package codec_test

import (
	"flag"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/walship/walship/pkg/codec"
)

var update = flag.Bool("update", false, "rewrite the golden vectors in testdata/ from goldenVectors")

// goldenVectors are the batches whose encodings are pinned in
// testdata/<name>.msgpack and testdata/<name>.json. testdata/README.md
// describes them and docs/FORMAT.md walks through small-txn byte by byte;
// change all three together.
var goldenVectors = []struct {
	name  string
	batch *codec.Batch
}{
	{"empty", &codec.Batch{}},
	{"single-commit", batchOf(1, commit(1))},
	{"small-txn", batchOf(100, put(7, "k1", "v1"), del(7, "k2"), commit(7))},
	{"interleaved", batchOf(1<<40,
		put(1000, "warehouse/3/district/7/customer/1234", "balance=-10.00"),
		put(998, "warehouse/3/stock/42", ""),
		commit(1000),
		del(998, "\x00\xff"),
		commit(998))},
	{"edges", batchOf(math.MaxUint64-1,
		put(math.MaxUint64, "k", strings.Repeat("0123456789", 30)),
		commit(0))},
}

// TestGolden checks both directions for every vector and codec: encoding the
// batch gives the pinned bytes, and decoding the pinned bytes gives the batch.
func TestGolden(t *testing.T) {
	for _, v := range goldenVectors {
		for _, c := range codecs {
			t.Run(v.name+"/"+c.Name(), func(t *testing.T) {
				path := filepath.Join("testdata", v.name+"."+c.Name())
				enc, err := c.AppendBatch(nil, v.batch)
				if err != nil {
					t.Fatal(err)
				}
				if *update {
					if err := os.WriteFile(path, enc, 0o644); err != nil {
						t.Fatal(err)
					}
				}
				golden, err := os.ReadFile(path)
				if err != nil {
					t.Fatalf("%v (run with -update to create)", err)
				}
				if string(enc) != string(golden) {
					t.Errorf("encoding differs from %s:\n got %x\nwant %x", path, enc, golden)
				}
				var got codec.Batch
				if err := c.DecodeBatch(golden, &got); err != nil {
					t.Fatalf("decoding %s: %v", path, err)
				}
				if d := diffBatch(v.batch, &got); d != "" {
					t.Errorf("decoding %s: %s", path, d)
				}
			})
		}
	}
}

// TestFormatDocExample keeps the worked example in docs/FORMAT.md in step
// with the golden vector it quotes.
func TestFormatDocExample(t *testing.T) {
	doc, err := os.ReadFile(filepath.Join("..", "..", "docs", "FORMAT.md"))
	if err != nil {
		t.Fatalf("docs/FORMAT.md not readable: %v", err)
	}
	_, after, ok := strings.Cut(string(doc), "#### Worked example")
	if !ok {
		t.Fatal(`docs/FORMAT.md has no "#### Worked example" section`)
	}
	_, block, ok := strings.Cut(after, "```\n")
	block, _, ok2 := strings.Cut(block, "```")
	if !ok || !ok2 {
		t.Fatal("worked example has no code block")
	}
	golden, err := os.ReadFile(filepath.Join("testdata", "small-txn.msgpack"))
	if err != nil {
		t.Fatal(err)
	}
	if got := unhex(t, strings.Join(strings.Fields(block), "")); string(got) != string(golden) {
		t.Errorf("docs/FORMAT.md worked example is\n%x\nbut testdata/small-txn.msgpack is\n%x", got, golden)
	}
}
