package codec_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/walship/walship/pkg/codec"
)

// TestJSONCorrupt checks that the JSON codec rejects the same invariant
// violations as MsgPack, plus JSON-specific malformations. Offsets of syntax
// and type errors are encoding/json's: just past the offending token.
func TestJSONCorrupt(t *testing.T) {
	tests := []struct {
		name   string
		in     string
		reason string
		offset int64 // -1: not known; -2: not checked
	}{
		{"empty", ``, "empty input", 0},
		{"truncated", `{"v":1,"first_lsn":1,"rec`, "unexpected end of input", 25},
		{"syntax", `{"v":1,]`, "invalid character", 8},
		{"null", `null`, "unsupported version 0", -1},
		{"empty object", `{}`, "unsupported version 0", -1},
		{"version", `{"v":2,"first_lsn":1,"records":[]}`, "unsupported version 2", -1},
		{"unknown field", `{"v":1,"first_lsn":1,"records":[],"x":1}`, "unknown field", 40},
		{"unknown record field", `{"v":1,"first_lsn":1,"records":[{"txn":1,"op":"commit","lsn":3}]}`, "unknown field", 65},
		{"negative lsn", `{"v":1,"first_lsn":-1,"records":[]}`, "cannot unmarshal", 21},
		{"lsn too big", `{"v":1,"first_lsn":18446744073709551616,"records":[]}`, "cannot unmarshal", 39},
		{"key not base64", `{"v":1,"first_lsn":1,"records":[{"txn":1,"op":"put","key":"!!"}]}`, "illegal base64", -2},
		{"unknown op", `{"v":1,"first_lsn":1,"records":[{"txn":1,"op":"merge","key":"aw=="}]}`, `record 0: unknown op "merge"`, -1},
		{"op number", `{"v":1,"first_lsn":1,"records":[{"txn":1,"op":1}]}`, "cannot unmarshal number", 47},
		{"commit with key", `{"v":1,"first_lsn":1,"records":[{"txn":1,"op":"commit","key":"aw=="}]}`, "record 0: commit carries a key or value", -1},
		{"commit with value", `{"v":1,"first_lsn":1,"records":[{"txn":1,"op":"commit"},{"txn":1,"op":"commit","value":"aw=="}]}`, "record 1: commit carries a key or value", -1},
		{"delete with value", `{"v":1,"first_lsn":1,"records":[{"txn":1,"op":"delete","key":"aw==","value":"aw=="}]}`, "record 0: delete has a 1-byte value", -1},
		{"lsn overflow", `{"v":1,"first_lsn":18446744073709551615,"records":[{"txn":1,"op":"commit"},{"txn":1,"op":"commit"}]}`, "LSN overflow", -1},
		{"trailing", `{"v":1,"first_lsn":1,"records":[]} {}`, "2 trailing bytes", 35},
		{"trailing garbage", `{"v":1,"first_lsn":1,"records":[]}x`, "1 trailing bytes", 34},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var b codec.Batch
			err := codec.JSON.DecodeBatch([]byte(tt.in), &b)
			var ce *codec.CorruptError
			if !errors.Is(err, codec.ErrCorrupt) || !errors.As(err, &ce) {
				t.Fatalf("DecodeBatch(%s) = %v, want a CorruptError", tt.in, err)
			}
			if !strings.Contains(ce.Reason, tt.reason) || (tt.offset != -2 && ce.Offset != tt.offset) || ce.Codec != "json" {
				t.Errorf("DecodeBatch(%s):\n got %q at offset %d\nwant %q at offset %d", tt.in, ce.Reason, ce.Offset, tt.reason, tt.offset)
			}
		})
	}
}

// TestJSONAccepts covers inputs that are valid but not what the encoder
// writes: white space, absent and null keys, empty base64.
func TestJSONAccepts(t *testing.T) {
	tests := []struct {
		name string
		in   string
		want *codec.Batch
	}{
		{"white space", " \n{ \"v\" : 1 , \"first_lsn\" : 3 , \"records\" : [ ] }\n\t", &codec.Batch{}},
		{"null records", `{"v":1,"first_lsn":3,"records":null}`, &codec.Batch{}},
		{"no records", `{"v":1,"first_lsn":3}`, &codec.Batch{}},
		{"put without key or value", `{"v":1,"first_lsn":3,"records":[{"txn":2,"op":"put"}]}`, batchOf(3, put(2, "", ""))},
		{"null and empty", `{"v":1,"first_lsn":3,"records":[{"txn":2,"op":"commit","key":null,"value":""}]}`, batchOf(3, commit(2))},
		{"binary key", `{"v":1,"first_lsn":3,"records":[{"txn":2,"op":"delete","key":"AP8="}]}`, batchOf(3, del(2, "\x00\xff"))},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var b codec.Batch
			if err := codec.JSON.DecodeBatch([]byte(tt.in), &b); err != nil {
				t.Fatal(err)
			}
			if d := diffBatch(tt.want, &b); d != "" {
				t.Fatal(d)
			}
		})
	}
}
