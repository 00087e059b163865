package codec

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
)

// JSON layout (docs/FORMAT.md, "Batch payload", is the normative text):
//
//	{"v":1,"first_lsn":7,"records":[
//	  {"txn":42,"op":"put","key":"a2V5","value":"dmFs"},
//	  {"txn":42,"op":"delete","key":"a2V5"},
//	  {"txn":42,"op":"commit"}]}
//
// Keys and values are standard base64 with padding (what encoding/json does
// for []byte) so that any bytes round-trip; a rule such as "string if valid
// UTF-8" would make the type of a field depend on its content. TxnIDs are
// absolute, not deltas, because this codec exists for people to read. An
// absent or null key or value is empty.

// jsonVersion is the value of "v". A decoder rejects other values, including
// a missing "v", so that an arbitrary JSON object is not taken for a batch.
const jsonVersion = 1

// JSONCodec encodes batches as JSON with encoding/json. It is slower and
// larger than MsgPackCodec and exists for comparison and debugging. It has no
// state; use the JSON value.
type JSONCodec struct{}

// JSON is the JSON codec. It is a variable only because Go has no struct
// constants; its type has a single value, so it cannot be changed.
var JSON JSONCodec

// Name returns "json".
func (JSONCodec) Name() string { return "json" }

// ID returns IDJSON.
func (JSONCodec) ID() ID { return IDJSON }

type jsonBatch struct {
	Version  int          `json:"v"`
	FirstLSN uint64       `json:"first_lsn"`
	Records  []jsonRecord `json:"records"`
}

type jsonRecord struct {
	TxnID uint64 `json:"txn"`
	Op    string `json:"op"`
	Key   []byte `json:"key,omitempty"`
	Value []byte `json:"value,omitempty"`
}

// AppendBatch appends the JSON encoding of b to dst, without a trailing
// newline. It checks b exactly as MsgPack does. It allocates.
func (JSONCodec) AppendBatch(dst []byte, b *Batch) ([]byte, error) {
	if b == nil {
		return dst, fmt.Errorf("%w: nil batch", ErrInvalidBatch)
	}
	first := b.FirstLSN()
	if err := checkLSNRange(first, len(b.Records)); err != nil {
		return dst, err
	}
	jb := jsonBatch{Version: jsonVersion, FirstLSN: first, Records: make([]jsonRecord, len(b.Records))}
	for i := range b.Records {
		r := &b.Records[i]
		if err := checkRecord(i, r, first); err != nil {
			return dst, err
		}
		jb.Records[i] = jsonRecord{TxnID: r.TxnID, Op: r.Op.String(), Key: r.Key, Value: r.Value}
	}
	p, err := json.Marshal(&jb)
	if err != nil {
		// Unreachable: every field of jsonBatch marshals.
		return dst, fmt.Errorf("codec: json: %w", err)
	}
	return append(dst, p...), nil
}

// DecodeBatch decodes the JSON batch in src into b, reusing b.Records when
// its capacity suffices. Unknown fields, trailing data, an unknown op, a key
// or value on a commit, a value on a delete and an LSN overflow are rejected
// with a *CorruptError wrapping ErrCorrupt; b is then left empty.
func (JSONCodec) DecodeBatch(src []byte, b *Batch) error {
	recs, err := decodeJSON(src, b.Records[:0])
	b.Records = recs
	return err
}

func decodeJSON(src []byte, recs []Record) ([]Record, error) {
	var jb jsonBatch
	dec := json.NewDecoder(bytes.NewReader(src))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&jb); err != nil {
		return recs, jsonError(err, src, dec.InputOffset())
	}
	// Decode stops after the first value; anything but white space after
	// it is trailing garbage.
	rest := src[dec.InputOffset():]
	if trimmed := bytes.TrimLeft(rest, " \t\r\n"); len(trimmed) != 0 {
		at := int64(len(src) - len(trimmed))
		return recs, &CorruptError{Codec: "json", Offset: at, Reason: fmt.Sprintf("%d trailing bytes after the batch", len(trimmed))}
	}
	if jb.Version != jsonVersion {
		return recs, jsonCorrupt("unsupported version %d (field \"v\"), want %d", jb.Version, jsonVersion)
	}
	n := len(jb.Records)
	if n > 0 && uint64(n-1) > math.MaxUint64-jb.FirstLSN {
		return recs, jsonCorrupt("LSN overflow: %d records from first LSN %d pass 2^64-1", n, jb.FirstLSN)
	}
	if cap(recs) < n {
		recs = make([]Record, n)
	} else {
		recs = recs[:n]
	}
	for i := range jb.Records {
		jr := &jb.Records[i]
		r := &recs[i]
		*r = Record{LSN: jb.FirstLSN + uint64(i), TxnID: jr.TxnID}
		switch jr.Op {
		case "put":
			r.Op = OpPut
		case "delete":
			r.Op = OpDelete
			if len(jr.Value) != 0 {
				return recs[:0], jsonCorrupt("record %d: delete has a %d-byte value", i, len(jr.Value))
			}
		case "commit":
			r.Op = OpCommit
			if len(jr.Key) != 0 || len(jr.Value) != 0 {
				return recs[:0], jsonCorrupt("record %d: commit carries a key or value", i)
			}
		default:
			return recs[:0], jsonCorrupt("record %d: unknown op %q", i, jr.Op)
		}
		// Normalise empty to nil, as the MsgPack decoder does.
		if len(jr.Key) != 0 {
			r.Key = jr.Key
		}
		if len(jr.Value) != 0 {
			r.Value = jr.Value
		}
	}
	return recs, nil
}

func jsonCorrupt(format string, args ...any) error {
	return &CorruptError{Codec: "json", Offset: -1, Reason: fmt.Sprintf(format, args...)}
}

// jsonError turns an encoding/json error into a CorruptError, keeping the
// offset when encoding/json reports one and otherwise using where the decoder
// had got to. Both are where encoding/json noticed the problem, which is
// usually just past the offending token rather than at its start.
func jsonError(err error, src []byte, at int64) error {
	var se *json.SyntaxError
	var te *json.UnmarshalTypeError
	switch {
	case errors.Is(err, io.EOF):
		return &CorruptError{Codec: "json", Offset: at, Reason: "empty input"}
	case errors.Is(err, io.ErrUnexpectedEOF):
		return &CorruptError{Codec: "json", Offset: int64(len(src)), Reason: "unexpected end of input"}
	case errors.As(err, &se):
		at = se.Offset
	case errors.As(err, &te):
		at = te.Offset
	}
	return &CorruptError{Codec: "json", Offset: at, Reason: err.Error()}
}
