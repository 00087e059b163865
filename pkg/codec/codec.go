// Package codec encodes and decodes walship WAL batches: the payload of every
// WalBatch envelope, written once by the primary and carried unchanged to the
// local WAL, the log stores and every replica.
//
// Two codecs implement [Codec]: [MsgPack], the production format, and [JSON],
// kept for comparison and debugging. The byte layout of both is specified in
// docs/FORMAT.md ("Batch payload"); [ByID] and [ByName] pick one from its wire
// identifier or flag name.
//
// # Ownership
//
// Decoding is zero-copy for MsgPack: the Key and Value of every decoded
// [Record] are subslices of the input passed to DecodeBatch (their capacity is
// clipped to their length, so appending to one never overwrites its
// neighbour). The caller must keep that input alive and unmodified for as long
// as it uses the records, and copy keys or values it wants to keep after the
// input buffer is reused. The JSON codec returns freshly allocated keys and
// values but callers should not rely on that.
//
// # Errors
//
// Every decoding error caused by malformed input is a [*CorruptError] that
// wraps [ErrCorrupt] and names the problem and the byte offset where it was
// found. Encoding a batch that breaks the record invariants fails with an error
// wrapping [ErrInvalidBatch]. No input makes a decoder panic, and a decoder
// never allocates more than the input could justify: a record count is checked
// against the bytes left before any slice is made.
//
// [CRC32C] checksums, used by the envelopes and WAL segments that carry
// batches, are computed by [Checksum] and [UpdateChecksum].
//
// [CRC32C]: https://www.rfc-editor.org/rfc/rfc3720#appendix-B.4
package codec

import (
	"errors"
	"fmt"
	"strconv"
)

// Op is the kind of a record.
type Op uint8

const (
	// OpPut sets Key to Value.
	OpPut Op = 1
	// OpDelete removes Key. Value is empty.
	OpDelete Op = 2
	// OpCommit ends transaction TxnID. Key and Value are empty. Its LSN is the
	// transaction's commit LSN: the LSN a writer is given back.
	OpCommit Op = 3
)

// String returns the op's lower-case name.
func (o Op) String() string {
	switch o {
	case OpPut:
		return "put"
	case OpDelete:
		return "delete"
	case OpCommit:
		return "commit"
	default:
		return fmt.Sprintf("op(%d)", uint8(o))
	}
}

// Valid reports whether o is a known op.
func (o Op) Valid() bool { return o >= OpPut && o <= OpCommit }

// Record is one WAL record. Each record has its own LSN, one more than the
// previous record's.
//
// Key and Value of a decoded record are views: they alias the decoder's input
// (or a slab owned by the Batch) and stay valid only while that input is
// neither modified nor reused. Copy them to keep them longer.
//
// A nil and an empty Key (or Value) are the same record: the codecs do not
// keep the difference.
type Record struct {
	LSN   uint64
	TxnID uint64
	Op    Op
	Key   []byte
	Value []byte
}

// Batch is a contiguous run of records holding whole transactions only: its
// last record is an OpCommit, so a replica can apply a batch atomically.
//
// The codecs check the per-record invariants (known op, no key or value on a
// commit, no value on a delete, consecutive LSNs without overflow) but not the
// whole-transaction rule: that belongs to the WAL writer and the replica
// applier, and leaving it out lets tools encode and inspect partial runs.
type Batch struct {
	Records []Record
}

// FirstLSN returns the LSN of the first record, or 0 for an empty batch.
func (b *Batch) FirstLSN() uint64 {
	if len(b.Records) == 0 {
		return 0
	}
	return b.Records[0].LSN
}

// LastLSN returns the LSN of the last record, or 0 for an empty batch.
func (b *Batch) LastLSN() uint64 {
	if len(b.Records) == 0 {
		return 0
	}
	return b.Records[len(b.Records)-1].LSN
}

// Reset empties b, keeping its capacity for reuse.
func (b *Batch) Reset() { b.Records = b.Records[:0] }

// ID identifies a codec on the wire; the values match walship.v1.Codec.
type ID uint8

// String returns the codec's flag name, or "codec(N)" for an unknown ID.
func (id ID) String() string {
	switch id {
	case IDMsgPack:
		return "msgpack"
	case IDJSON:
		return "json"
	default:
		return "codec(" + strconv.Itoa(int(id)) + ")"
	}
}

const (
	// IDMsgPack is the MessagePack codec.
	IDMsgPack ID = 1
	// IDJSON is the JSON codec.
	IDJSON ID = 2
)

// Codec turns a Batch into bytes and back.
type Codec interface {
	// Name returns the codec's flag name: "msgpack" or "json".
	Name() string
	// ID returns the codec's wire identifier.
	ID() ID
	// AppendBatch appends the encoding of b to dst and returns the extended
	// slice. It fails, returning dst unchanged and an error wrapping
	// ErrInvalidBatch, if b breaks a record invariant. MsgPack does not
	// allocate when dst has room; JSON always allocates.
	AppendBatch(dst []byte, b *Batch) ([]byte, error)
	// DecodeBatch decodes src into b, reusing b's capacity. The decoded keys
	// and values may alias src (see Record).
	DecodeBatch(src []byte, b *Batch) error
}

// Compile-time checks that both codecs implement Codec.
var (
	_ Codec = MsgPackCodec{}
	_ Codec = JSONCodec{}
)

// ByID returns the codec with wire identifier id. The error wraps
// ErrUnknownCodec.
func ByID(id ID) (Codec, error) {
	switch id {
	case IDMsgPack:
		return MsgPack, nil
	case IDJSON:
		return JSON, nil
	default:
		return nil, fmt.Errorf("%w: id %d", ErrUnknownCodec, uint8(id))
	}
}

// ByName returns the codec with flag name name ("msgpack" or "json"; exact,
// lower case, because it is matched against configuration). The error wraps
// ErrUnknownCodec.
func ByName(name string) (Codec, error) {
	switch name {
	case MsgPack.Name():
		return MsgPack, nil
	case JSON.Name():
		return JSON, nil
	default:
		return nil, fmt.Errorf("%w: name %q (want \"msgpack\" or \"json\")", ErrUnknownCodec, name)
	}
}

// ErrCorrupt is wrapped by every decoding error caused by malformed input.
var ErrCorrupt = errors.New("codec: corrupt batch")

// ErrInvalidBatch is wrapped by every encoding error: the batch given to
// AppendBatch breaks a record invariant (see Batch) and cannot be represented.
var ErrInvalidBatch = errors.New("codec: invalid batch")

// ErrUnknownCodec is wrapped by the errors of ByID and ByName.
var ErrUnknownCodec = errors.New("codec: unknown codec")

// CorruptError is the error returned for malformed input. It wraps ErrCorrupt,
// so callers test for it with errors.Is and use errors.As only when they want
// the offset.
type CorruptError struct {
	// Codec is the name of the codec that rejected the input.
	Codec string
	// Offset is the byte offset in the input where the problem was found, or
	// -1 when the decoder cannot tell (the JSON codec's semantic checks, which
	// name the record index in Reason instead).
	Offset int64
	// Reason says what was wrong.
	Reason string
}

// Error returns "codec: corrupt batch: <codec>: <reason> at byte offset N".
func (e *CorruptError) Error() string {
	s := ErrCorrupt.Error() + ": " + e.Codec + ": " + e.Reason
	if e.Offset >= 0 {
		s += " at byte offset " + strconv.FormatInt(e.Offset, 10)
	}
	return s
}

// Unwrap returns ErrCorrupt.
func (e *CorruptError) Unwrap() error { return ErrCorrupt }
