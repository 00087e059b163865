package changefeed

import (
	"encoding/binary"
	"fmt"
	"sync"

	walshipv1 "github.com/walship/walship/gen/walship/v1"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
)

// Fan-out without a copy per watcher. Protobuf's wire format is
// concatenative: a WatchResponse carrying txns is
//
//	0x0a len(body) body            (WatchResponse.txns, field 1)
//	body = elem elem ...           (WatchTxns.txns, field 1, repeated)
//	elem = 0x0a len(txn) txn       (one encoded WatchTxn)
//
// so a transaction's element is encoded once per distinct selection (all of
// its events, with or without previous values, or one filter's subset) and
// kept on the Txn; a watcher's message is those elements copied one after
// another behind a header, sent as the unknown fields of an empty
// WatchResponse (which gRPC's proto codec writes out verbatim, and a
// client decodes as the txns field). Per watcher and message that is one
// memmove and gRPC's own framing, instead of walking and marshalling every
// event of every transaction.

// Encodings kept on a Txn, by what they select.
const (
	encNoPrev = iota
	encWithPrev
)

// elem returns t's element with every event, with or without previous
// values: encoded on first use, then shared by every watcher.
func (t *Txn) elem(prev bool) ([]byte, error) {
	i := encNoPrev
	if prev || t.Full(false) == t.Full(true) {
		i = encWithPrev
	}
	e := &t.enc[i]
	e.once.Do(func() { e.b, e.err = appendElem(nil, t.Full(prev)) })
	return e.b, e.err
}

// partialElem returns t's element with the events f matches, some but not
// all of t's: encoded once per distinct filter, while what t keeps of them
// stays within t's own size (beyond, each watcher encodes its own; that
// bounds memory when many different filters each match a part of t).
func (t *Txn) partialElem(f filter) ([]byte, error) {
	t.mu.Lock()
	b, ok := t.partial[f]
	t.mu.Unlock()
	if ok {
		return b, nil
	}
	evs := make([]*Event, 0, len(t.Events))
	for _, e := range t.Events {
		if f.match(e.Key) {
			if !f.prev {
				e = stripPrev(e)
			}
			evs = append(evs, e)
		}
	}
	b, err := appendElem(nil, &walshipv1.WatchTxn{Lsn: t.LSN, FirstLsn: t.FirstLSN, CommitTimeUnixNano: t.CommitTime, Events: evs})
	if err != nil {
		return nil, err
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if old, ok := t.partial[f]; ok { // another watcher of f was first
		return old, nil
	}
	if t.partialBytes+len(b) <= t.size {
		if t.partial == nil {
			t.partial = map[filter][]byte{}
		}
		t.partial[f] = b
		t.partialBytes += len(b)
	}
	return b, nil
}

// appendElem appends x as one element of WatchTxns.txns.
func appendElem(b []byte, x *walshipv1.WatchTxn) ([]byte, error) {
	n := proto.Size(x)
	if b == nil {
		b = make([]byte, 0, protowire.SizeTag(1)+protowire.SizeVarint(uint64(n))+n)
	}
	b = protowire.AppendTag(b, 1, protowire.BytesType)
	b = protowire.AppendVarint(b, uint64(n))
	b, err := proto.MarshalOptions{UseCachedSize: true}.MarshalAppend(b, x)
	if err != nil {
		return nil, fmt.Errorf("encode transaction %d: %w", x.GetLsn(), err)
	}
	return b, nil
}

// headroom is what a message's header (WatchResponse.txns' tag and
// length) takes at most.
const headroom = 1 + binary.MaxVarintLen64

// message is one WatchResponse of transactions, made of encoded elements
// shared with other watchers. A server codec that knows EncodedBuffers
// (internal/serve's) sends the elements as they are, behind a header of
// the message's own: no copy per watcher but the transport's. Any other
// codec marshals ProtoReflect's message: the elements assembled once, in
// a buffer from the feed's pool, as the unknown fields of an empty
// WatchResponse.
type message struct {
	pool  *sync.Pool // of *[]byte
	elems [][]byte
	txns  int
	bytes int // the transactions' sizes (Txn.size), to bound a message

	flat *[]byte // the assembled message, from pool; nil until asked for
	resp *walshipv1.WatchResponse
}

// release returns the buffer to the pool and empties m, once the message
// was sent (gRPC encoded it and holds no reference to what m owns).
func (m *message) release() {
	if m.flat != nil {
		if cap(*m.flat) <= maxPooledBuffer {
			*m.flat = (*m.flat)[:0]
			m.pool.Put(m.flat)
		}
		m.flat = nil
	}
	clear(m.elems)
	m.elems, m.resp = m.elems[:0], nil
	m.txns, m.bytes = 0, 0
}

// maxPooledBuffer is the largest message buffer kept for reuse (a
// caught-up watcher's messages are a round of transactions, far smaller;
// a catch-up message may reach maxMessageBytes).
const maxPooledBuffer = 256 << 10

func (m *message) add(elem []byte, size int) {
	m.elems = append(m.elems, elem)
	m.txns++
	m.bytes += size
}

// header returns WatchResponse.txns' tag and the body's length.
func (m *message) header(b []byte) []byte {
	n := 0
	for _, e := range m.elems {
		n += len(e)
	}
	b = protowire.AppendTag(b, 1, protowire.BytesType)
	return protowire.AppendVarint(b, uint64(n))
}

// EncodedBuffers returns the message's encoding: a header of its own,
// then the shared elements, uncopied. gRPC holds them until the transport
// wrote them, after the Send returned: nothing in it is ever modified.
func (m *message) EncodedBuffers() mem.BufferSlice {
	out := make(mem.BufferSlice, 0, 1+len(m.elems))
	out = append(out, mem.SliceBuffer(m.header(make([]byte, 0, headroom))))
	for _, e := range m.elems {
		out = append(out, mem.SliceBuffer(e))
	}
	return out
}

// ProtoReflect makes m a proto.Message for codecs that marshal it: the
// elements assembled behind the header, as an empty WatchResponse's
// unknown fields (protobuf marshals those verbatim). It refers to m's
// buffer until m is released.
func (m *message) ProtoReflect() protoreflect.Message {
	if m.resp == nil {
		if b, ok := m.pool.Get().(*[]byte); ok {
			m.flat = b
		} else {
			m.flat = new([]byte)
		}
		b := m.header((*m.flat)[:0])
		for _, e := range m.elems {
			b = append(b, e...)
		}
		*m.flat = b
		m.resp = &walshipv1.WatchResponse{}
		m.resp.ProtoReflect().SetUnknown(b)
	}
	return m.resp.ProtoReflect()
}
