package codec

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"slices"

	"github.com/vmihailenco/msgpack/v5/msgpcode"
)

// MsgPack layout (docs/FORMAT.md, "Batch payload", is the normative text):
//
//	batch   = array(3) [ version=1, first_lsn uint, records array(N) ]
//	commit  = array(2) [ op=3, txn_delta int ]
//	delete  = array(3) [ op=2, txn_delta int, key bin ]
//	put     = array(4) [ op=1, txn_delta int, key bin, value bin ]
//
// Record i has LSN first_lsn+i, so LSNs are not repeated per record. A
// record's TxnID is the previous record's TxnID (0 before the first record)
// plus txn_delta, modulo 2^64: consecutive records of one transaction cost a
// single 0x00 byte, and interleaved transactions a small negative or positive
// fixint. The op decides the array length, so a commit carries no empty key
// and value at all.
//
// The encoder always writes the shortest form of every integer, length and
// array header; the decoder accepts any standard form, because other
// MessagePack writers are free to choose a longer one.

const (
	// msgpackVersion is the first element of every batch. A decoder rejects
	// other values so that a future layout cannot be misread as this one.
	msgpackVersion = 1
	// msgpackBatchLen is the number of elements of the outer array.
	msgpackBatchLen = 3
	// minRecordSize is the fewest bytes a record can take: a commit encoded
	// as fixarray(2), fixint op and fixint txn delta. A record count larger
	// than the remaining bytes divided by this is a lie, rejected before the
	// records slice is allocated.
	minRecordSize = 3
	// maxBinLen is the largest key or value bin32 can describe.
	maxBinLen = math.MaxUint32
)

// MsgPackCodec is the production codec: compact standard MessagePack, encoded
// and decoded by hand so that encoding does not allocate and decoding does
// not copy keys or values. It has no state; use the MsgPack value.
type MsgPackCodec struct{}

// MsgPack is the MessagePack codec. It is a variable only because Go has no
// struct constants; its type has a single value, so it cannot be changed.
var MsgPack MsgPackCodec

// Name returns "msgpack".
func (MsgPackCodec) Name() string { return "msgpack" }

// ID returns IDMsgPack.
func (MsgPackCodec) ID() ID { return IDMsgPack }

// AppendBatch appends the MessagePack encoding of b to dst. It checks b first
// (see Batch) and returns dst unchanged with an error wrapping ErrInvalidBatch
// if a record cannot be represented. It grows dst at most once, to the exact
// encoded size, and not at all when dst has room.
func (MsgPackCodec) AppendBatch(dst []byte, b *Batch) ([]byte, error) {
	if b == nil {
		return dst, fmt.Errorf("%w: nil batch", ErrInvalidBatch)
	}
	size, err := msgpackSize(b.Records)
	if err != nil {
		return dst, err
	}
	dst = slices.Grow(dst, size)

	recs := b.Records
	dst = append(dst, msgpcode.FixedArrayLow|msgpackBatchLen, msgpackVersion)
	dst = appendUint(dst, b.FirstLSN())
	dst = appendArrayLen(dst, len(recs))
	var prevTxn uint64
	for i := range recs {
		r := &recs[i]
		switch r.Op {
		case OpCommit:
			dst = append(dst, msgpcode.FixedArrayLow|2, byte(OpCommit))
			dst = appendInt(dst, int64(r.TxnID-prevTxn))
		case OpDelete:
			dst = append(dst, msgpcode.FixedArrayLow|3, byte(OpDelete))
			dst = appendInt(dst, int64(r.TxnID-prevTxn))
			dst = appendBin(dst, r.Key)
		default: // OpPut: msgpackSize rejected every other op.
			dst = append(dst, msgpcode.FixedArrayLow|4, byte(OpPut))
			dst = appendInt(dst, int64(r.TxnID-prevTxn))
			dst = appendBin(dst, r.Key)
			dst = appendBin(dst, r.Value)
		}
		prevTxn = r.TxnID
	}
	return dst, nil
}

// msgpackSize checks recs and returns the exact size of their encoding. Doing
// both in one pass keeps the encoder at two passes over the records: this
// one, which only reads lengths, and the one that writes.
func msgpackSize(recs []Record) (int, error) {
	var first uint64
	if len(recs) > 0 {
		first = recs[0].LSN
	}
	if err := checkLSNRange(first, len(recs)); err != nil {
		return 0, err
	}
	size := 2 + uintSize(first) + arrayLenSize(len(recs))
	var prevTxn uint64
	for i := range recs {
		r := &recs[i]
		if err := checkRecord(i, r, first); err != nil {
			return 0, err
		}
		size += 2 + intSize(int64(r.TxnID-prevTxn))
		prevTxn = r.TxnID
		switch r.Op {
		case OpDelete:
			size += binSize(len(r.Key))
		case OpPut:
			size += binSize(len(r.Key)) + binSize(len(r.Value))
		}
	}
	return size, nil
}

// checkLSNRange reports whether n records numbered from first fit below 2^64.
func checkLSNRange(first uint64, n int) error {
	if n > 0 && uint64(n-1) > math.MaxUint64-first {
		return fmt.Errorf("%w: %d records from first LSN %d overflow uint64", ErrInvalidBatch, n, first)
	}
	return nil
}

// checkRecord checks the invariants of record i of a batch starting at LSN
// first. Both codecs call it so that they accept exactly the same batches.
func checkRecord(i int, r *Record, first uint64) error {
	if want := first + uint64(i); r.LSN != want {
		return fmt.Errorf("%w: record %d has LSN %d, want %d (LSNs are consecutive)", ErrInvalidBatch, i, r.LSN, want)
	}
	switch r.Op {
	case OpPut:
	case OpDelete:
		if len(r.Value) != 0 {
			return fmt.Errorf("%w: record %d: delete has a %d-byte value", ErrInvalidBatch, i, len(r.Value))
		}
	case OpCommit:
		if len(r.Key) != 0 || len(r.Value) != 0 {
			return fmt.Errorf("%w: record %d: commit has a %d-byte key and a %d-byte value, want none", ErrInvalidBatch, i, len(r.Key), len(r.Value))
		}
	default:
		return fmt.Errorf("%w: record %d: unknown op %d", ErrInvalidBatch, i, uint8(r.Op))
	}
	// Only reachable on 64-bit platforms; bin32 cannot describe more.
	if uint64(len(r.Key)) > maxBinLen || uint64(len(r.Value)) > maxBinLen {
		return fmt.Errorf("%w: record %d: key or value longer than %d bytes", ErrInvalidBatch, i, uint64(maxBinLen))
	}
	return nil
}

func uintSize(v uint64) int {
	switch {
	case v <= uint64(msgpcode.PosFixedNumHigh):
		return 1
	case v <= math.MaxUint8:
		return 2
	case v <= math.MaxUint16:
		return 3
	case v <= math.MaxUint32:
		return 5
	default:
		return 9
	}
}

func intSize(v int64) int {
	switch {
	case v >= 0:
		return uintSize(uint64(v))
	case v >= -32:
		return 1
	case v >= math.MinInt8:
		return 2
	case v >= math.MinInt16:
		return 3
	case v >= math.MinInt32:
		return 5
	default:
		return 9
	}
}

func arrayLenSize(n int) int {
	switch {
	case n <= int(msgpcode.FixedArrayMask):
		return 1
	case n <= math.MaxUint16:
		return 3
	default:
		return 5
	}
}

func binSize(n int) int {
	switch {
	case n <= math.MaxUint8:
		return 2 + n
	case n <= math.MaxUint16:
		return 3 + n
	default:
		return 5 + n
	}
}

// appendUint appends v in the shortest unsigned form.
func appendUint(dst []byte, v uint64) []byte {
	switch {
	case v <= uint64(msgpcode.PosFixedNumHigh):
		return append(dst, byte(v))
	case v <= math.MaxUint8:
		return append(dst, msgpcode.Uint8, byte(v))
	case v <= math.MaxUint16:
		return binary.BigEndian.AppendUint16(append(dst, msgpcode.Uint16), uint16(v))
	case v <= math.MaxUint32:
		return binary.BigEndian.AppendUint32(append(dst, msgpcode.Uint32), uint32(v))
	default:
		return binary.BigEndian.AppendUint64(append(dst, msgpcode.Uint64), v)
	}
}

// appendInt appends v in the shortest form: non-negative values use the
// unsigned forms, as the MessagePack spec recommends.
func appendInt(dst []byte, v int64) []byte {
	switch {
	case v >= 0:
		return appendUint(dst, uint64(v))
	case v >= -32:
		return append(dst, byte(v)) // negative fixint: 0xe0..0xff
	case v >= math.MinInt8:
		return append(dst, msgpcode.Int8, byte(v))
	case v >= math.MinInt16:
		return binary.BigEndian.AppendUint16(append(dst, msgpcode.Int16), uint16(v))
	case v >= math.MinInt32:
		return binary.BigEndian.AppendUint32(append(dst, msgpcode.Int32), uint32(v))
	default:
		return binary.BigEndian.AppendUint64(append(dst, msgpcode.Int64), uint64(v))
	}
}

func appendArrayLen(dst []byte, n int) []byte {
	switch {
	case n <= int(msgpcode.FixedArrayMask):
		return append(dst, msgpcode.FixedArrayLow|byte(n))
	case n <= math.MaxUint16:
		return binary.BigEndian.AppendUint16(append(dst, msgpcode.Array16), uint16(n))
	default:
		return binary.BigEndian.AppendUint32(append(dst, msgpcode.Array32), uint32(n))
	}
}

// appendBin appends p as bin8/16/32. Keys and values are bin, not str,
// because they are arbitrary bytes and a str must be valid UTF-8.
func appendBin(dst []byte, p []byte) []byte {
	switch n := len(p); {
	case n <= math.MaxUint8:
		dst = append(dst, msgpcode.Bin8, byte(n))
	case n <= math.MaxUint16:
		dst = binary.BigEndian.AppendUint16(append(dst, msgpcode.Bin16), uint16(n))
	default:
		dst = binary.BigEndian.AppendUint32(append(dst, msgpcode.Bin32), uint32(n))
	}
	return append(dst, p...)
}

// DecodeBatch decodes the MessagePack batch in src into b, reusing b.Records
// when its capacity suffices; otherwise it allocates one slice of exactly the
// claimed record count, after checking that src is long enough to hold that
// many records. Keys and values are subslices of src (see the package doc).
//
// Malformed input yields a *CorruptError wrapping ErrCorrupt; b is then left
// empty (its capacity kept).
func (MsgPackCodec) DecodeBatch(src []byte, b *Batch) error {
	recs, err := decodeMsgPack(src, b.Records[:0])
	b.Records = recs
	return err
}

func decodeMsgPack(src []byte, recs []Record) ([]Record, error) {
	d := decoder{src: src}

	n, err := d.arrayLen("batch")
	if err != nil {
		return recs, err
	}
	if n != msgpackBatchLen {
		return recs, d.corrupt(0, "batch array has %d elements, want %d", n, msgpackBatchLen)
	}
	at := d.off
	version, err := d.uint("version")
	if err != nil {
		return recs, err
	}
	if version != msgpackVersion {
		return recs, d.corrupt(at, "unsupported version %d, want %d", version, msgpackVersion)
	}
	first, err := d.uint("first LSN")
	if err != nil {
		return recs, err
	}
	at = d.off
	count, err := d.arrayLen("records")
	if err != nil {
		return recs, err
	}
	// Check the claimed count against the input before allocating: each
	// Record is 72 bytes in memory but may be 3 bytes on the wire, and a
	// 10-byte input can claim 2^32-1 of them.
	if left := uint64(len(src) - d.off); count > left/minRecordSize {
		return recs, d.corrupt(at, "record count %d cannot fit in the %d bytes left (a record takes at least %d)", count, left, minRecordSize)
	}
	if count > 0 && count-1 > math.MaxUint64-first {
		return recs, d.corrupt(at, "LSN overflow: %d records from first LSN %d pass 2^64-1", count, first)
	}
	if uint64(cap(recs)) < count {
		recs = make([]Record, count)
	} else {
		recs = recs[:count]
	}

	var txn uint64
	for i := range recs {
		if err := d.record(&recs[i], &txn); err != nil {
			return recs[:0], inRecord(err, i)
		}
		recs[i].LSN = first + uint64(i)
	}
	if d.off != len(src) {
		return recs[:0], d.corrupt(d.off, "%d trailing bytes after the batch", len(src)-d.off)
	}
	return recs, nil
}

// record decodes one record into r. txn holds the previous record's TxnID and
// is advanced to r's.
func (d *decoder) record(r *Record, txn *uint64) error {
	at := d.off
	m, err := d.arrayLen("record")
	if err != nil {
		return err
	}
	if m < 2 || m > 4 {
		return d.corrupt(at, "record array has %d elements, want 2 to 4", m)
	}
	opAt := d.off
	v, err := d.uint("op")
	if err != nil {
		return err
	}
	op := Op(v)
	var want uint64
	switch {
	case v == uint64(OpPut):
		want = 4
	case v == uint64(OpDelete):
		want = 3
	case v == uint64(OpCommit):
		if m != 2 {
			return d.corrupt(at, "commit carries a key or value (%d elements, want 2)", m)
		}
		want = 2
	default:
		return d.corrupt(opAt, "unknown op %d", v)
	}
	if m != want {
		return d.corrupt(at, "%s record has %d elements, want %d", op, m, want)
	}
	delta, err := d.int("txn delta")
	if err != nil {
		return err
	}
	*txn += uint64(delta)
	r.TxnID = *txn
	r.Op = op
	r.Key, r.Value = nil, nil
	if m >= 3 {
		if r.Key, err = d.bin("key"); err != nil {
			return err
		}
	}
	if m == 4 {
		if r.Value, err = d.bin("value"); err != nil {
			return err
		}
	}
	return nil
}

// decoder is a cursor over a MessagePack input. Each read method has an
// inlinable fast path for the forms the encoder writes and an out-of-line slow
// path for the rest and for errors.
type decoder struct {
	src []byte
	off int
}

// corrupt builds a CorruptError. It is kept out of line so that the fast
// paths that call it on failure stay small enough to inline.
//
//go:noinline
func (d *decoder) corrupt(off int, format string, args ...any) error {
	return &CorruptError{Codec: "msgpack", Offset: int64(off), Reason: fmt.Sprintf(format, args...)}
}

// inRecord prefixes the reason of err with the record index, so that an
// error deep in a 4096-record batch says which record was bad.
func inRecord(err error, i int) error {
	var ce *CorruptError
	if errors.As(err, &ce) {
		ce.Reason = fmt.Sprintf("record %d: %s", i, ce.Reason)
	}
	return err
}

// arrayLen reads an array header.
func (d *decoder) arrayLen(what string) (uint64, error) {
	if d.off < len(d.src) {
		if c := d.src[d.off]; c >= msgpcode.FixedArrayLow && c <= msgpcode.FixedArrayHigh {
			d.off++
			return uint64(c & msgpcode.FixedArrayMask), nil
		}
	}
	return d.arrayLenSlow(what)
}

func (d *decoder) arrayLenSlow(what string) (uint64, error) {
	if d.off >= len(d.src) {
		return 0, d.corrupt(d.off, "unexpected end of input reading %s array header", what)
	}
	at := d.off
	c := d.src[at]
	switch c {
	case msgpcode.Array16:
		return d.fixed(2, what)
	case msgpcode.Array32:
		return d.fixed(4, what)
	default:
		if c >= msgpcode.FixedArrayLow && c <= msgpcode.FixedArrayHigh {
			d.off++
			return uint64(c & msgpcode.FixedArrayMask), nil
		}
		return 0, d.corrupt(at, "%s: want an array, found %s", what, describe(c))
	}
}

// fixed reads the n-byte big-endian number that follows the type byte at
// d.off, and moves past both.
func (d *decoder) fixed(n int, what string) (uint64, error) {
	at := d.off
	if len(d.src)-at-1 < n {
		return 0, d.corrupt(at, "unexpected end of input reading %s: %s needs %d more bytes, %d left", what, describe(d.src[at]), n, len(d.src)-at-1)
	}
	p := d.src[at+1 : at+1+n]
	d.off = at + 1 + n
	switch n {
	case 1:
		return uint64(p[0]), nil
	case 2:
		return uint64(binary.BigEndian.Uint16(p)), nil
	case 4:
		return uint64(binary.BigEndian.Uint32(p)), nil
	default:
		return binary.BigEndian.Uint64(p), nil
	}
}

// uint reads an integer that must not be negative.
func (d *decoder) uint(what string) (uint64, error) {
	if d.off < len(d.src) {
		if c := d.src[d.off]; c <= msgpcode.PosFixedNumHigh {
			d.off++
			return uint64(c), nil
		}
	}
	return d.uintSlow(what)
}

func (d *decoder) uintSlow(what string) (uint64, error) {
	at := d.off
	v, neg, err := d.integer(what)
	if err != nil {
		return 0, err
	}
	if neg {
		return 0, d.corrupt(at, "%s is negative (%d)", what, int64(v))
	}
	return v, nil
}

// int reads an integer that must fit in an int64.
func (d *decoder) int(what string) (int64, error) {
	if d.off < len(d.src) {
		if c := d.src[d.off]; c <= msgpcode.PosFixedNumHigh || c >= msgpcode.NegFixedNumLow {
			d.off++
			return int64(int8(c)), nil
		}
	}
	return d.intSlow(what)
}

func (d *decoder) intSlow(what string) (int64, error) {
	at := d.off
	v, neg, err := d.integer(what)
	if err != nil {
		return 0, err
	}
	if !neg && v > math.MaxInt64 {
		return 0, d.corrupt(at, "%s %d overflows int64", what, v)
	}
	return int64(v), nil
}

// integer reads any MessagePack integer form. It returns the value as the
// bits of an int64 when neg is set and as a uint64 otherwise.
func (d *decoder) integer(what string) (v uint64, neg bool, err error) {
	at := d.off
	if at >= len(d.src) {
		return 0, false, d.corrupt(at, "unexpected end of input reading %s", what)
	}
	c := d.src[at]
	switch {
	case c <= msgpcode.PosFixedNumHigh:
		d.off++
		return uint64(c), false, nil
	case c >= msgpcode.NegFixedNumLow:
		d.off++
		return uint64(int64(int8(c))), true, nil
	case c == msgpcode.Uint8:
		v, err = d.fixed(1, what)
	case c == msgpcode.Uint16:
		v, err = d.fixed(2, what)
	case c == msgpcode.Uint32:
		v, err = d.fixed(4, what)
	case c == msgpcode.Uint64:
		v, err = d.fixed(8, what)
	case c == msgpcode.Int8:
		v, err = d.fixed(1, what)
		v = uint64(int64(int8(v)))
	case c == msgpcode.Int16:
		v, err = d.fixed(2, what)
		v = uint64(int64(int16(v)))
	case c == msgpcode.Int32:
		v, err = d.fixed(4, what)
		v = uint64(int64(int32(v)))
	case c == msgpcode.Int64:
		v, err = d.fixed(8, what)
	default:
		return 0, false, d.corrupt(at, "%s: want an integer, found %s", what, describe(c))
	}
	if err != nil {
		return 0, false, err
	}
	signed := c == msgpcode.Int8 || c == msgpcode.Int16 || c == msgpcode.Int32 || c == msgpcode.Int64
	return v, signed && int64(v) < 0, nil
}

// bin reads a bin8/16/32 and returns it as a subslice of the input with its
// capacity clipped, or nil when empty.
func (d *decoder) bin(what string) ([]byte, error) {
	at := d.off
	if at+1 < len(d.src) && d.src[at] == msgpcode.Bin8 {
		n, start := int(d.src[at+1]), at+2
		if n <= len(d.src)-start {
			d.off = start + n
			if n == 0 {
				return nil, nil
			}
			return d.src[start : start+n : start+n], nil
		}
	}
	return d.binSlow(what)
}

func (d *decoder) binSlow(what string) ([]byte, error) {
	at := d.off
	if at >= len(d.src) {
		return nil, d.corrupt(at, "unexpected end of input reading %s", what)
	}
	var n uint64
	var err error
	switch c := d.src[at]; c {
	case msgpcode.Bin8:
		n, err = d.fixed(1, what)
	case msgpcode.Bin16:
		n, err = d.fixed(2, what)
	case msgpcode.Bin32:
		n, err = d.fixed(4, what)
	default:
		return nil, d.corrupt(at, "%s: want bin, found %s", what, describe(c))
	}
	if err != nil {
		return nil, err
	}
	start := d.off
	if left := uint64(len(d.src) - start); n > left {
		return nil, d.corrupt(at, "%s: %d-byte bin but only %d bytes left", what, n, left)
	}
	end := start + int(n)
	d.off = end
	if n == 0 {
		return nil, nil
	}
	return d.src[start:end:end], nil
}

// describe names a MessagePack type byte for error messages.
func describe(c byte) string {
	var name string
	switch {
	case c <= msgpcode.PosFixedNumHigh:
		name = "positive fixint"
	case c >= msgpcode.NegFixedNumLow:
		name = "negative fixint"
	case msgpcode.IsFixedMap(c):
		name = "fixmap"
	case msgpcode.IsFixedArray(c):
		name = "fixarray"
	case msgpcode.IsFixedString(c):
		name = "fixstr"
	default:
		name = typeNames[c]
		if name == "" {
			name = "reserved type"
		}
	}
	return fmt.Sprintf("%s (0x%02x)", name, c)
}

// typeNames names the MessagePack type bytes 0xc0..0xdf. It is read-only.
var typeNames = map[byte]string{
	0xc0: "nil", 0xc2: "false", 0xc3: "true",
	0xc4: "bin8", 0xc5: "bin16", 0xc6: "bin32",
	0xc7: "ext8", 0xc8: "ext16", 0xc9: "ext32",
	0xca: "float32", 0xcb: "float64",
	0xcc: "uint8", 0xcd: "uint16", 0xce: "uint32", 0xcf: "uint64",
	0xd0: "int8", 0xd1: "int16", 0xd2: "int32", 0xd3: "int64",
	0xd4: "fixext1", 0xd5: "fixext2", 0xd6: "fixext4", 0xd7: "fixext8", 0xd8: "fixext16",
	0xd9: "str8", 0xda: "str16", 0xdb: "str32",
	0xdc: "array16", 0xdd: "array32", 0xde: "map16", 0xdf: "map32",
}
