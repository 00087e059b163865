package changefeed

import (
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
// so a transaction's element is encoded once per distinct selection (all
// of its events, with or without previous values, or one filter's subset)
// and kept on the Txn, and a watcher's message is a list of elements. The
// server's codec (internal/serve) asks the message for its bytes
// (EncodedBuffers): watchers of the same selection that are caught up
// read the same run of the ring, and get the same buffer, assembled by
// the first of them (runCache). Per watcher and message that leaves
// gRPC's own framing and the socket write, instead of walking and
// marshalling every event of every transaction. Under any other codec the
// message marshals as an empty WatchResponse whose unknown fields are the
// assembled bytes (protobuf writes those verbatim; a client decodes the
// txns field).
//
//	apply ─▶ Txn ─ elem (once per selection) ─┐
//	watcher 1 ─ [elem elem ...] ─ runCache ───┼─▶ one buffer ─▶ stream 1
//	watcher 2 ─ [elem elem ...] ─ (same key) ─┘               └▶ stream 2

// Encodings kept on a Txn, by what they select.
const (
	encNoPrev = iota
	encWithPrev
)

// elem returns t's element with every event, with or without previous
// values: encoded on first use, then shared by every watcher.
func (t *Txn) elem(prev bool) (mem.Buffer, error) {
	i := encNoPrev
	if prev || t.Full(false) == t.Full(true) {
		i = encWithPrev
	}
	e := &t.enc[i]
	e.once.Do(func() { e.b, e.err = encodeElem(t.Full(i == encWithPrev)) })
	return e.b, e.err
}

// partialElem returns t's element with the events f matches, some but not
// all of t's: encoded once per distinct filter, while what t keeps of them
// stays within t's own size (beyond, each watcher encodes its own; that
// bounds memory when many different filters each match a part of t).
func (t *Txn) partialElem(f filter) (mem.Buffer, error) {
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
	b, err := encodeElem(&walshipv1.WatchTxn{Lsn: t.LSN, FirstLsn: t.FirstLSN, CommitTimeUnixNano: t.CommitTime, Events: evs})
	if err != nil {
		return nil, err
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if old, ok := t.partial[f]; ok { // another watcher of f was first
		return old, nil
	}
	if t.partialBytes+b.Len() <= t.size {
		if t.partial == nil {
			t.partial = map[filter]mem.Buffer{}
		}
		t.partial[f] = b
		t.partialBytes += b.Len()
	}
	return b, nil
}

// encodeElem encodes x as one element of WatchTxns.txns, as a mem.Buffer
// (made an interface value once, not per watcher). It is never modified,
// nor freed (a SliceBuffer's Free does nothing): gRPC may write it to many
// streams at once, after their Sends returned.
func encodeElem(x *walshipv1.WatchTxn) (mem.Buffer, error) {
	n := proto.Size(x)
	b := make([]byte, 0, protowire.SizeTag(1)+protowire.SizeVarint(uint64(n))+n)
	b = protowire.AppendTag(b, 1, protowire.BytesType)
	b = protowire.AppendVarint(b, uint64(n))
	b, err := proto.MarshalOptions{UseCachedSize: true}.MarshalAppend(b, x)
	if err != nil {
		return nil, fmt.Errorf("encode transaction %d: %w", x.GetLsn(), err)
	}
	return mem.SliceBuffer(b), nil
}

// message is one WatchResponse of transactions, made of encoded elements
// shared with other watchers. A server codec that knows EncodedBuffers
// (internal/serve's) sends what it returns as it is; any other marshals
// ProtoReflect's message, the same bytes.
type message struct {
	pool   *bufferPool
	runs   *runCache // nil: the transactions are this watcher's own (read from the WAL)
	filter filter    // nil: the transactions are this watcher's own (read from the WAL)
	elems  []mem.Buffer
	first  *Txn // the first and last transactions of elems
	last   *Txn
	txns   int
	bytes  int // the transactions' sizes (Txn.size), to bound a message

	flat *[]byte // the assembled message, from pool; nil until asked for
	resp *walshipv1.WatchResponse
}

// release empties m once the message was sent (gRPC encoded it and holds
// no reference to what m owns).
func (m *message) release() {
	if m.flat != nil {
		m.pool.Put(m.flat)
		m.flat = nil
	}
	clear(m.elems)
	m.elems, m.resp = m.elems[:0], nil
	m.first, m.last = nil, nil
	m.txns, m.bytes = 0, 0
}

func (m *message) add(elem mem.Buffer, t *Txn) {
	m.elems = append(m.elems, elem)
	if m.first == nil {
		m.first = t
	}
	m.last = t
	m.txns++
	m.bytes += t.size
}

// assemble returns a buffer from the pool holding WatchResponse.txns' tag
// and length, then the elements.
func (m *message) assemble() *[]byte {
	n := 0
	for _, e := range m.elems {
		n += e.Len()
	}
	bp := m.pool.Get(protowire.SizeTag(1) + protowire.SizeVarint(uint64(n)) + n)
	b := protowire.AppendTag((*bp)[:0], 1, protowire.BytesType)
	b = protowire.AppendVarint(b, uint64(n))
	for _, e := range m.elems {
		b = append(b, e.ReadOnlyData()...)
	}
	*bp = b
	return bp
}

// EncodedBuffers returns the message's encoding without a copy per
// watcher. One element is sent as it is behind a header of the message's
// own. More are assembled once per selection and run of the ring — the
// same for every caught-up watcher of the same keys — and shared: gRPC's
// transport gathers a frame's buffers in a list it stops reusing beyond 64
// of them, and a round of ~150-byte transactions is hundreds, so handing
// it every element costs more than one shared copy. A watcher's own
// transactions (from the WAL) are copied into a pooled buffer that gRPC
// frees (back to the pool) once its transport wrote it.
func (m *message) EncodedBuffers() mem.BufferSlice {
	switch {
	case len(m.elems) == 1:
		n := uint64(m.elems[0].Len())
		hdr := make([]byte, 0, protowire.SizeTag(1)+protowire.SizeVarint(n))
		hdr = protowire.AppendVarint(protowire.AppendTag(hdr, 1, protowire.BytesType), n)
		return mem.BufferSlice{mem.SliceBuffer(hdr), m.elems[0]}
	case m.runs != nil:
		return mem.BufferSlice{m.runs.get(runKey{m.filter, m.first, m.last, len(m.elems)}, m.assembleShared)}
	}
	return mem.BufferSlice{mem.NewBuffer(m.assemble(), m.pool)}
}

// assembleShared returns the message assembled in a buffer of its own,
// never modified nor freed once shared.
func (m *message) assembleShared() []byte {
	bp := m.assemble()
	b := make([]byte, len(*bp))
	copy(b, *bp)
	m.pool.Put(bp)
	return b
}

// runKey names a message made of the ring's transactions: the same
// filter and first and last transactions (the same *Txn: not others of the
// same LSNs, after a Reset) select the same ones in between.
type runKey struct {
	f           filter
	first, last *Txn
	n           int
}

// runCache keeps messages assembled for one watcher for the others of the
// same selection at the same place, up to a bound (then forgets them all:
// caught-up watchers ask for the newest runs).
type runCache struct {
	mu    sync.Mutex
	runs  map[runKey]mem.Buffer
	bytes int
}

// Bounds of a feed's runCache.
const (
	maxRunCacheBytes = 8 << 20
	maxRunCacheRuns  = 4096
)

// get returns the run k, assembled by build if it is not kept.
func (c *runCache) get(k runKey, build func() []byte) mem.Buffer {
	c.mu.Lock()
	b, ok := c.runs[k]
	c.mu.Unlock()
	if ok {
		return b
	}
	b = mem.SliceBuffer(build())
	c.mu.Lock()
	defer c.mu.Unlock()
	if old, ok := c.runs[k]; ok { // another watcher was first
		return old
	}
	if c.bytes+b.Len() > maxRunCacheBytes || len(c.runs) >= maxRunCacheRuns {
		clear(c.runs)
		c.bytes = 0
	}
	if c.runs == nil {
		c.runs = map[runKey]mem.Buffer{}
	}
	c.runs[k] = b
	c.bytes += b.Len()
	return b
}

// ProtoReflect makes m a proto.Message for codecs that marshal it: the
// elements assembled behind the header, as an empty WatchResponse's
// unknown fields (protobuf marshals those verbatim). It refers to m's
// buffer until m is released.
func (m *message) ProtoReflect() protoreflect.Message {
	if m.resp == nil {
		m.flat = m.assemble()
		m.resp = &walshipv1.WatchResponse{}
		m.resp.ProtoReflect().SetUnknown(*m.flat)
	}
	return m.resp.ProtoReflect()
}

// bufferPool is a mem.BufferPool of message buffers that, unlike gRPC's,
// does not clear what it hands out: every byte of it is written over.
type bufferPool struct{ p sync.Pool }

// maxPooledBuffer is the largest message buffer kept for reuse (a
// caught-up watcher's messages are a round of transactions, far smaller;
// a catch-up message may reach maxMessageBytes).
const maxPooledBuffer = 256 << 10

// Get returns a buffer of length n.
func (p *bufferPool) Get(n int) *[]byte {
	bp, _ := p.p.Get().(*[]byte)
	if bp == nil || cap(*bp) < n {
		b := make([]byte, n)
		return &b
	}
	*bp = (*bp)[:n]
	return bp
}

// Put returns a buffer to the pool.
func (p *bufferPool) Put(bp *[]byte) {
	if cap(*bp) <= maxPooledBuffer {
		p.p.Put(bp)
	}
}
