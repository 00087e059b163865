package bench

import (
	"encoding/binary"
	"errors"
	"fmt"
)

// A row is how the workloads store a table row as a KV value: a count of
// signed integers, the integers as zig-zag varints, then an optional byte
// string (TPC-C's filler and data columns) as a length and its bytes:
//
//	uvarint(n) | varint(f1) ... varint(fn) | uvarint(len(data)) | data
//
// It is client data, opaque to walship; compact so the WAL carries about
// what a row store would.
type row struct {
	f    []int64
	data []byte
}

// errRow is returned for a value that does not decode as a row.
var errRow = errors.New("malformed row")

func (r row) encode() []byte {
	b := make([]byte, 0, 2+len(r.f)*4+len(r.data)+2)
	b = binary.AppendUvarint(b, uint64(len(r.f)))
	for _, v := range r.f {
		b = binary.AppendVarint(b, v)
	}
	b = binary.AppendUvarint(b, uint64(len(r.data)))
	return append(b, r.data...)
}

// decodeRow decodes a row that must have exactly nf integers.
func decodeRow(b []byte, nf int) (row, error) {
	n, k := binary.Uvarint(b)
	if k <= 0 || n != uint64(nf) {
		return row{}, fmt.Errorf("%w: want %d fields, header %d", errRow, nf, n)
	}
	b = b[k:]
	r := row{f: make([]int64, nf)}
	for i := range r.f {
		v, k := binary.Varint(b)
		if k <= 0 {
			return row{}, fmt.Errorf("%w: field %d", errRow, i)
		}
		r.f[i], b = v, b[k:]
	}
	l, k := binary.Uvarint(b)
	if k <= 0 || uint64(len(b)-k) != l {
		return row{}, fmt.Errorf("%w: data length", errRow)
	}
	r.data = b[k:]
	return r, nil
}
