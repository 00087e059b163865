package changefeed

import (
	"encoding/binary"
	"fmt"
	"sync"

	walshipv1 "github.com/walship/walship/gen/walship/v1"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
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
// length) takes at most, kept free in front of a message's body.
const headroom = 1 + binary.MaxVarintLen64

// message assembles WatchResponses from encoded elements. Its buffer
// comes from the feed's pool while a message is assembled and sent, and
// goes back once sent: 1,000 caught-up watchers share a few buffers
// instead of keeping one each.
type message struct {
	pool  *sync.Pool // of *[]byte
	buf   *[]byte    // headroom, then the body; nil when empty
	txns  int
	bytes int // the transactions' sizes (Txn.size), to bound a message
}

// release returns the buffer to the pool and empties m.
func (m *message) release() {
	if m.buf != nil {
		if cap(*m.buf) <= maxPooledBuffer {
			*m.buf = (*m.buf)[:0]
			m.pool.Put(m.buf)
		}
		m.buf = nil
	}
	m.txns, m.bytes = 0, 0
}

// maxPooledBuffer is the largest message buffer kept for reuse (a
// caught-up watcher's messages are a round of transactions, far smaller;
// a catch-up message may reach maxMessageBytes).
const maxPooledBuffer = 256 << 10

// grab takes a buffer from the pool if m has none.
func (m *message) grab() {
	if m.buf == nil {
		if b, ok := m.pool.Get().(*[]byte); ok {
			m.buf = b
		} else {
			m.buf = new([]byte)
		}
		*m.buf = append((*m.buf)[:0], make([]byte, headroom)...)
	}
}

func (m *message) add(elem []byte, size int) {
	m.grab()
	*m.buf = append(*m.buf, elem...)
	m.txns++
	m.bytes += size
}

// response returns the message as a WatchResponse whose encoding is the
// assembled bytes. It refers to m's buffer until m is released.
func (m *message) response() *walshipv1.WatchResponse {
	m.grab()
	buf := *m.buf
	body := buf[headroom:]
	h := protowire.SizeTag(1) + protowire.SizeVarint(uint64(len(body)))
	hdr := buf[headroom-h : headroom : headroom]
	hdr = protowire.AppendTag(hdr[:0], 1, protowire.BytesType)
	protowire.AppendVarint(hdr, uint64(len(body)))
	r := &walshipv1.WatchResponse{}
	r.ProtoReflect().SetUnknown(buf[headroom-h:])
	return r
}
