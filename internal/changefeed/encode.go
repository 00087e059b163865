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
// and kept on the Txn, and a message is a list of elements. Watchers of
// the same selection that are caught up read the same run of the ring:
// the first of them to read it matches its transactions, picks their
// elements and assembles the run's messages (runCache); every other
// sends those buffers as they are. The server's codec (internal/serve)
// asks a message for its bytes (EncodedBuffers). Per watcher and round
// that leaves one look-up, and gRPC's own framing and socket write,
// instead of walking every transaction (or marshalling every event).
// Under any other codec a message marshals as an empty WatchResponse
// whose unknown fields are the assembled bytes (protobuf writes those
// verbatim; a client decodes the txns field).
//
//	apply ─▶ Txn ─ elem (once per selection) ─┐
//	watcher 1 ─ read run ─ runCache: build ───┼─▶ messages ─▶ stream 1
//	watcher 2 ─ read run ─ (same key): hit ───┘           └▶ stream 2

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
	e := &t.read().enc[i]
	e.once.Do(func() { e.b, e.err = encodeElem(t.Full(i == encWithPrev)) })
	return e.b, e.err
}

// partialElem returns t's element with the events f matches, some but not
// all of t's: encoded once per distinct filter, while what t keeps of them
// stays within t's own size (beyond, each watcher encodes its own; that
// bounds memory when many different filters each match a part of t).
func (t *Txn) partialElem(f filter) (mem.Buffer, error) {
	r := t.read()
	r.mu.Lock()
	b, ok := r.partial[f]
	r.mu.Unlock()
	if ok {
		return b, nil
	}
	evs := make([]*Event, 0, len(r.events))
	for _, e := range r.events {
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
	r.mu.Lock()
	defer r.mu.Unlock()
	if old, ok := r.partial[f]; ok { // another watcher of f was first
		return old, nil
	}
	if r.partialBytes+b.Len() <= t.size {
		if r.partial == nil {
			r.partial = map[filter]mem.Buffer{}
		}
		r.partial[f] = b
		r.partialBytes += b.Len()
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

// message is one WatchResponse of transactions being made of encoded
// elements shared with other watchers. A server codec that knows EncodedBuffers
// (internal/serve's) sends what it returns as it is; any other marshals
// ProtoReflect's message, the same bytes.
type message struct {
	pool  *bufferPool
	elems []mem.Buffer
	first *Txn // the first and last transactions of elems
	last  *Txn
	txns  int
	bytes int // the transactions' sizes (Txn.size), to bound a message

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

// EncodedBuffers returns the message's encoding, copied into a pooled
// buffer that gRPC frees (back to the pool) once its transport wrote it: a
// watcher's own transactions, read from the WAL. (The ring's are sent as
// runs shared by every watcher of the same selection: see runCache.)
func (m *message) EncodedBuffers() mem.BufferSlice {
	return mem.BufferSlice{mem.NewBuffer(m.assemble(), m.pool)}
}

// shared returns the message's encoding in buffers of its own, never
// modified nor freed, to be sent to many watchers. One element is sent as
// it is behind a header of the message's own; more are assembled: gRPC's
// transport gathers a frame's buffers in a list it stops reusing beyond 64
// of them, and a round of ~150-byte transactions is hundreds, so handing
// it every element costs more than one shared copy.
func (m *message) shared() mem.BufferSlice {
	if len(m.elems) == 1 {
		n := uint64(m.elems[0].Len())
		hdr := make([]byte, 0, protowire.SizeTag(1)+protowire.SizeVarint(n))
		hdr = protowire.AppendVarint(protowire.AppendTag(hdr, 1, protowire.BytesType), n)
		return mem.BufferSlice{mem.SliceBuffer(hdr), m.elems[0]}
	}
	bp := m.assemble()
	b := make([]byte, len(*bp))
	copy(b, *bp)
	m.pool.Put(bp)
	return mem.BufferSlice{mem.SliceBuffer(b)}
}

// runKey names a run of the ring read by a watcher and what it selects
// of it: the same filter and first and last transactions (the same *Txn,
// not others of the same LSNs after a Reset) and their number select the
// same transactions in between, and so the same messages.
type runKey struct {
	f           filter
	first, last *Txn
	n           int
}

// run is the messages a run of the ring makes for one selection, built
// once by the first watcher to read it, then sent as they are by every
// other: caught-up watchers of the same keys read the same runs, so the
// per-transaction work (matching, choosing the element, assembling) is
// done once per selection and round, not once per watcher.
type run struct {
	once  sync.Once
	msgs  []runMsg
	err   error
	bytes int
}

// runMsg is one message of a run: its encoding, how many transactions it
// carries, and the LSN of its last one.
type runMsg struct {
	bufs mem.BufferSlice
	txns int
	last uint64
}

// EncodedBuffers returns the message's shared encoding (see
// internal/serve's codec), sent as it is.
func (m *runMsg) EncodedBuffers() mem.BufferSlice { return m.bufs }

// ProtoReflect makes m a proto.Message for codecs that marshal it (not
// internal/serve's): an empty WatchResponse whose unknown fields are the
// encoding, which protobuf marshals verbatim.
func (m *runMsg) ProtoReflect() protoreflect.Message {
	r := &walshipv1.WatchResponse{}
	r.ProtoReflect().SetUnknown(m.bufs.Materialize())
	return r.ProtoReflect()
}

// runCache keeps the runs built for one watcher for the others of the
// same selection at the same place, up to a bound (then forgets them all:
// caught-up watchers ask for the newest runs).
type runCache struct {
	mu    sync.Mutex
	runs  map[runKey]*run
	bytes int
}

// Bounds of a feed's runCache.
const (
	maxRunCacheBytes = 8 << 20
	maxRunCacheRuns  = 4096
)

// get returns the messages of run k, built by build if it is not kept.
// Watchers that ask for k while it is being built wait for it, so that it
// is built once.
func (c *runCache) get(k runKey, build func() ([]runMsg, error)) ([]runMsg, error) {
	c.mu.Lock()
	r, ok := c.runs[k]
	if !ok {
		if c.bytes > maxRunCacheBytes || len(c.runs) >= maxRunCacheRuns {
			clear(c.runs)
			c.bytes = 0
		}
		if c.runs == nil {
			c.runs = map[runKey]*run{}
		}
		r = &run{}
		c.runs[k] = r
	}
	c.mu.Unlock()
	r.once.Do(func() {
		r.msgs, r.err = build()
		for _, m := range r.msgs {
			r.bytes += m.bufs.Len()
		}
		c.mu.Lock()
		if c.runs[k] == r {
			c.bytes += r.bytes
		}
		c.mu.Unlock()
	})
	return r.msgs, r.err
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
