package kvpipe

import (
	"context"
	"errors"
	"io"
	"runtime"
	"slices"
	"strconv"
	"sync"
	"time"

	walshipv1 "github.com/walship/walship/gen/walship/v1"
	spb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
)

// Mux is a walshipv1.KVServiceClient that sends the Put, Delete, Txn and
// Get calls of concurrent callers as operations of one Pipeline stream
// (Scan, Watch and Pipeline go as they are). Each call returns what the
// unary call would: the response, or an error of the same code, message
// and details. A call whose stream breaks before its answer fails with the
// stream's error — UNAVAILABLE when the connection or the server goes, as
// a unary call cut off mid-flight does: for a write, an unknown outcome
// (a call whose operation was still waiting to be sent goes on a new
// stream instead). The next call opens a new stream. A call's deadline
// is sent as its operation's timeout; a call whose context ends first
// returns at once, and its operation is cancelled on the server, as a
// unary call's would be (a write's outcome is then unknown). At most as
// many operations as the server says it runs at once (its MaxOpsHeader)
// are in progress on a stream; more callers wait, as unary calls wait
// for a stream of a connection that has its most. When the server drains
// the stream (it is stopping gracefully), the calls on it are still
// answered there and later calls go on a new stream. Each call's request is encoded before
// the call waits (the caller may reuse it once the call returns); those
// made while another message is being sent go together in the next one,
// where the server takes several per message (its BatchHeader), and the
// server's answers may come several to a message too. Call options are
// ignored. Safe for concurrent use; Close ends it.
type Mux struct {
	kv walshipv1.KVServiceClient

	mu     sync.Mutex
	cur    *pipe              // the open stream, nil when none
	pipes  map[*pipe]struct{} // every stream not yet ended, drained ones too
	nextID uint64
	closed bool
	wg     sync.WaitGroup // the streams' receivers and senders
}

// NewMux returns a Mux whose streams go through kv.
func NewMux(kv walshipv1.KVServiceClient) *Mux { return &Mux{kv: kv} }

// pipe is one Pipeline stream and the calls waiting for its answers.
type pipe struct {
	stream walshipv1.KVService_PipelineClient
	cancel context.CancelFunc

	// ready is closed once the server's header says how many operations
	// may be in progress (sem's size, set before) and whether it reads
	// several in a message (batch); done once the stream has ended (err
	// set before).
	ready, done chan struct{}
	batch       bool
	// sem holds a place for each operation in progress, one the server
	// has not answered or been told is cancelled: no more than the
	// server runs at once, so that it never stops reading the stream and
	// reads each cancel at once.
	sem chan struct{}

	// qmu guards what waits to be sent. One goroutine at a time sends
	// (grpc-go's rule for streams): a caller that queues when none is
	// sending sends the messages waiting then, its own among them; if
	// more were queued meanwhile, it wakes the stream's sender goroutine
	// (kick) to send them, rather than sending others' messages for as
	// long as callers keep queueing.
	qmu        sync.Mutex
	msgs       []*pending // waiting to be sent, in order
	sending    bool
	kick       chan struct{} // buffered 1: the sender goroutine has the sending
	closeSend  bool          // the server drained the stream: close our side
	sendClosed bool          // our side is closed: nothing more is sent
	onDrain    func()        // called once on the server's drain

	mu      sync.Mutex
	waiting map[uint64]chan answer
	err     error // why the stream ended; nil while it is open
}

type answer struct {
	resp *walshipv1.PipelineResponse
	err  error
	// unsent: the request was never sent (the server drained the
	// stream first, or it ended); the caller sends it again, on a new
	// stream.
	unsent bool
}

// pending is a message waiting to be sent: its operations, encoded — the
// first as it is, each later one as an element of the first's more (the
// wire form of PipelineRequest.more) — and who waits on each.
type pending struct {
	buf     []byte
	entries []queued
}

// queued is an operation waiting to be sent: a caller's, whose answer
// goes to ch, or a cancel (ch nil), after whose sending (or failing to)
// sent is called.
type queued struct {
	id   uint64
	ch   chan answer
	sent func()
}

// encBufs are buffers to encode a request in before it is copied into
// its message.
var encBufs = sync.Pool{New: func() any { return new([]byte) }}

// answerChans are the empty channels of calls done with them, for later
// calls. A call's channel gets one send at most, from whoever takes its
// id out of waiting: once the call has received it, or has taken its
// id out itself, the channel is empty for good.
var answerChans = sync.Pool{New: func() any { return make(chan answer, 1) }}

// errClosed is what a call of a closed Mux returns.
var errClosed = status.Error(codes.Canceled, "walship: pipeline closed")

// Close ends the streams (the open one and any drained one still
// finishing): calls waiting for answers fail with CANCELED (their writes'
// outcome unknown), later calls at once.
func (m *Mux) Close() {
	m.mu.Lock()
	m.closed = true
	m.cur = nil
	for p := range m.pipes {
		p.cancel()
	}
	m.mu.Unlock()
	m.wg.Wait()
}

// open returns the open stream, opening one if there is none.
func (m *Mux) open() (*pipe, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return nil, errClosed
	}
	if m.cur != nil {
		return m.cur, nil
	}
	// The stream outlives every call on it: its context is the Mux's.
	ctx, cancel := context.WithCancel(context.Background())
	stream, err := m.kv.Pipeline(metadata.AppendToOutgoingContext(ctx, BatchHeader, "1"))
	if err != nil {
		cancel()
		return nil, err
	}
	p := &pipe{stream: stream, cancel: cancel, waiting: map[uint64]chan answer{}, ready: make(chan struct{}), done: make(chan struct{}), kick: make(chan struct{}, 1)}
	p.onDrain = func() {
		m.mu.Lock()
		if m.cur == p {
			m.cur = nil // the next call opens a new stream
		}
		m.mu.Unlock()
	}
	m.cur = p
	if m.pipes == nil {
		m.pipes = map[*pipe]struct{}{}
	}
	m.pipes[p] = struct{}{}
	m.wg.Go(func() {
		p.receive()
		m.mu.Lock()
		if m.cur == p {
			m.cur = nil
		}
		delete(m.pipes, p)
		m.mu.Unlock()
		cancel()
	})
	m.wg.Go(p.sender)
	return p, nil
}

// receive learns from the server's header how many operations may be in
// progress, then hands each answer to its caller until the stream ends,
// and then fails every call still waiting with the stream's error.
func (p *pipe) receive() {
	n := DefaultMaxOps
	// No header (an error, an older server): Recv says why or goes on.
	if md, err := p.stream.Header(); err == nil {
		if v := md.Get(MaxOpsHeader); len(v) > 0 {
			if k, err := strconv.Atoi(v[0]); err == nil && k > 0 {
				n = k
			}
		}
		p.batch = slices.Contains(md.Get(BatchHeader), "1")
	}
	p.sem = make(chan struct{}, n)
	close(p.ready)
	for {
		resp, err := p.stream.Recv()
		if err != nil {
			if errors.Is(err, io.EOF) {
				// The server ended the stream with OK while calls wait:
				// it never does, but if it did their outcome is unknown.
				err = status.Error(codes.Unavailable, "walship: pipeline stream ended before answering")
			}
			p.mu.Lock()
			p.err = err
			waiting := p.waiting
			p.waiting = nil
			p.mu.Unlock()
			close(p.done)
			// What was still waiting to be sent never went: its callers
			// send it again, on a new stream. The others' outcome is
			// the stream's error.
			p.onDrain()
			p.qmu.Lock()
			p.sendClosed = true
			msgs := p.msgs
			p.msgs = nil
			p.qmu.Unlock()
			for _, m := range msgs {
				for _, e := range m.entries {
					if e.ch == nil {
						e.sent()
					} else if ch, ok := waiting[e.id]; ok {
						delete(waiting, e.id)
						ch <- answer{unsent: true}
					}
				}
			}
			for _, ch := range waiting {
				ch <- answer{err: err}
			}
			return
		}
		p.dispatch(resp)
		for _, r := range resp.GetMore() {
			p.dispatch(r)
		}
	}
}

// dispatch hands resp to its caller, or, for a drain, closes our side
// of the stream: what was sent is answered here, what comes next goes
// on a new stream.
func (p *pipe) dispatch(resp *walshipv1.PipelineResponse) {
	if resp.GetDrain() != nil {
		p.onDrain()
		p.qmu.Lock()
		p.closeSend = true
		if !p.sending {
			p.sending = true
			p.kick <- struct{}{} // the sender goroutine closes it
		}
		p.qmu.Unlock() // else the one sending closes it
		return
	}
	p.mu.Lock()
	ch, ok := p.waiting[resp.GetId()]
	delete(p.waiting, resp.GetId())
	p.mu.Unlock()
	if ok {
		ch <- answer{resp: resp}
	}
}

// enqueue encodes req and queues it to be sent, its answer to go to e,
// and sends unless another goroutine is sending (which then sends it).
// A request that does not encode (a key that is not UTF-8) is refused as
// gRPC refuses a unary call's, nothing sent: an error is returned and e
// is not queued.
func (p *pipe) enqueue(req *walshipv1.PipelineRequest, e queued) error {
	bp := encBufs.Get().(*[]byte)
	b, err := proto.MarshalOptions{}.MarshalAppend((*bp)[:0], req)
	*bp = b[:0]
	defer encBufs.Put(bp)
	if err != nil {
		return status.Errorf(codes.Internal, "grpc: error while marshaling: %v", err)
	}
	p.qmu.Lock()
	if p.sendClosed {
		p.qmu.Unlock()
		p.unsent([]queued{e})
		return nil
	}
	p.add(b, e)
	if p.sending {
		p.qmu.Unlock()
		return nil
	}
	p.sending = true
	if p.batch && len(p.sem) > 1 {
		// Other calls are in progress: let those about to send queue
		// first and go in this message (as grpc-go's writer yields
		// before writing a small buffer).
		p.qmu.Unlock()
		runtime.Gosched()
		p.qmu.Lock()
	}
	p.round()
	return nil
}

// add puts an encoded operation into the last message waiting, if the
// server takes several and it has room (maxBatchBytes), else into a new
// one. Called with qmu held.
func (p *pipe) add(b []byte, e queued) {
	if n := len(p.msgs); n > 0 && p.batch {
		m := p.msgs[n-1]
		if len(m.buf)+protowire.SizeTag(fieldMore)+protowire.SizeBytes(len(b)) <= maxBatchBytes {
			m.buf = protowire.AppendTag(m.buf, fieldMore, protowire.BytesType)
			m.buf = protowire.AppendBytes(m.buf, b)
			m.entries = append(m.entries, e)
			return
		}
	}
	buf := make([]byte, len(b), max(len(b), 2048))
	copy(buf, b)
	p.msgs = append(p.msgs, &pending{buf: buf, entries: []queued{e}})
}

// round sends the messages waiting; if more were queued meanwhile, it
// hands the sending to the sender goroutine. Called with qmu held and
// sending set; returns with qmu released.
func (p *pipe) round() {
	p.sendWaiting()
	if p.moreToSend() {
		p.kick <- struct{}{} // never full: only the one sending kicks
		p.qmu.Unlock()
		return
	}
	p.sending = false
	p.qmu.Unlock()
}

// sender sends what callers hand it (kick) until nothing waits, then
// leaves the sending to the next caller; it ends with the stream.
func (p *pipe) sender() {
	for {
		select {
		case <-p.kick:
		case <-p.done:
			return // the receiver answers every call waiting
		}
		p.qmu.Lock()
		for p.moreToSend() {
			p.sendWaiting()
		}
		p.sending = false
		p.qmu.Unlock()
	}
}

// moreToSend says whether messages wait to be sent, or our side to be
// closed. Called with qmu held.
func (p *pipe) moreToSend() bool {
	return len(p.msgs) > 0 || (p.closeSend && !p.sendClosed)
}

// sendWaiting sends the messages waiting, closing our side first if the
// server drained the stream. Called with qmu held by the one sending; it
// releases qmu while it sends.
func (p *pipe) sendWaiting() {
	p.closeIfDrained()
	msgs := p.msgs
	p.msgs = nil
	p.qmu.Unlock()
	for _, m := range msgs {
		p.sendPending(m)
	}
	p.qmu.Lock()
}

// closeIfDrained closes our side of a stream the server drained, and
// tells the callers of what was waiting to send it again. Called with qmu
// held by the one sending; it releases qmu meanwhile.
func (p *pipe) closeIfDrained() {
	if !p.closeSend || p.sendClosed {
		return
	}
	p.sendClosed = true
	msgs := p.msgs
	p.msgs = nil
	p.qmu.Unlock()
	_ = p.stream.CloseSend()
	for _, m := range msgs {
		p.unsent(m.entries)
	}
	p.qmu.Lock()
}

// unsent tells the callers of requests that were never sent to send them
// again, and calls the cancels' sent.
func (p *pipe) unsent(q []queued) {
	for _, e := range q {
		if e.ch == nil {
			e.sent()
		} else if p.forget(e.id) {
			e.ch <- answer{unsent: true}
		}
	}
}

// sendPending sends m. Its operations are encoded already: a message
// whose only content is unknown fields marshals as exactly those bytes,
// which the server decodes as its fields (the first operation's, then
// its more). A send that fails as the stream ends (io.EOF) leaves the
// answers to the receiver, which reports why; nothing else can fail.
func (p *pipe) sendPending(m *pending) {
	msg := &walshipv1.PipelineRequest{}
	msg.ProtoReflect().SetUnknown(m.buf)
	_ = p.stream.Send(msg)
	for _, e := range m.entries {
		if e.ch == nil {
			e.sent()
		}
	}
}

// failure is why the stream ended (after done is closed).
func (p *pipe) failure() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.err
}

// do sends req as an operation and waits for its answer. A caller that
// gives up (its context ends) returns at once; the server is sent a
// cancel for its operation, as gRPC resets the stream of a unary call
// whose caller gave up, before any later operation takes its place.
func (m *Mux) do(ctx context.Context, req *walshipv1.PipelineRequest) (*walshipv1.PipelineResponse, error) {
	if err := ctx.Err(); err != nil {
		return nil, status.FromContextError(err).Err()
	}
	for {
		p, ch, err := m.send(ctx, req)
		if err != nil {
			return nil, err
		}
		select {
		case a := <-ch:
			<-p.sem
			answerChans.Put(ch)
			if a.unsent {
				continue // never sent (drained, or the stream ended): on a new stream
			}
			if a.err != nil {
				return nil, a.err
			}
			if e := a.resp.GetError(); e != nil {
				return nil, status.ErrorProto(&spb.Status{Code: e.GetCode(), Message: e.GetMessage(), Details: e.GetDetails()})
			}
			return a.resp, nil
		case <-ctx.Done():
			if !p.forget(req.Id) {
				// Answered, or the stream ended, or it was never sent,
				// as the caller gave up: its answer may still come (ch
				// is not kept).
				<-p.sem
			} else {
				answerChans.Put(ch)
				m.sendCancel(p, req.Id)
			}
			return nil, status.FromContextError(ctx.Err()).Err()
		}
	}
}

// send queues req on the open stream and returns it and the channel of
// its answer: the server's, the stream's end, or that it was never sent
// (the stream was drained or ended first: the caller tries again, on a
// new one). A request that does not encode is refused, nothing sent.
func (m *Mux) send(ctx context.Context, req *walshipv1.PipelineRequest) (*pipe, chan answer, error) {
	p, err := m.open()
	if err != nil {
		return nil, nil, err
	}
	select {
	case <-p.ready:
	case <-ctx.Done():
		return nil, nil, status.FromContextError(ctx.Err()).Err()
	}
	select {
	case p.sem <- struct{}{}:
	case <-p.done:
		return nil, nil, p.failure()
	case <-ctx.Done():
		return nil, nil, status.FromContextError(ctx.Err()).Err()
	}
	ch := answerChans.Get().(chan answer)
	m.mu.Lock()
	m.nextID++
	req.Id = m.nextID
	m.mu.Unlock()
	p.mu.Lock()
	if p.err != nil {
		err := p.err
		p.mu.Unlock()
		<-p.sem
		answerChans.Put(ch)
		return nil, nil, err
	}
	p.waiting[req.Id] = ch
	p.mu.Unlock()
	if dl, ok := ctx.Deadline(); ok {
		req.Timeout = durationpb.New(max(time.Until(dl), time.Nanosecond))
	}
	if err := p.enqueue(req, queued{id: req.Id, ch: ch}); err != nil {
		if p.forget(req.Id) {
			answerChans.Put(ch)
		}
		<-p.sem
		return nil, nil, err
	}
	return p, ch, nil
}

// sendCancel tells the server that operation id's caller gave up, and
// then frees its place: an operation sent later finds the server's place
// free. It does not wait: a stream the server does not read holds it
// until the stream ends (Close).
func (m *Mux) sendCancel(p *pipe, id uint64) {
	m.wg.Go(func() {
		// Unsent once the stream is drained: the server runs it to its end.
		_ = p.enqueue(&walshipv1.PipelineRequest{Id: id, Op: &walshipv1.PipelineRequest_Cancel{Cancel: &walshipv1.PipelineCancel{}}},
			queued{id: id, sent: func() { <-p.sem }})
	})
}

// forget drops id's call from those waiting, and says if it was there.
func (p *pipe) forget(id uint64) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	_, ok := p.waiting[id]
	delete(p.waiting, id)
	return ok
}

// requestBox is a request and the oneof that holds its operation, in
// one allocation where two would do.
type requestBox[O any] struct {
	req walshipv1.PipelineRequest
	op  O
}

// Put is KVService.Put as an operation of the stream.
func (m *Mux) Put(ctx context.Context, in *walshipv1.PutRequest, _ ...grpc.CallOption) (*walshipv1.PutResponse, error) {
	b := &requestBox[walshipv1.PipelineRequest_Put]{op: walshipv1.PipelineRequest_Put{Put: in}}
	b.req.Op = &b.op
	r, err := m.do(ctx, &b.req)
	if err != nil {
		return nil, err
	}
	return r.GetPut(), nil
}

// Delete is KVService.Delete as an operation of the stream.
func (m *Mux) Delete(ctx context.Context, in *walshipv1.DeleteRequest, _ ...grpc.CallOption) (*walshipv1.DeleteResponse, error) {
	b := &requestBox[walshipv1.PipelineRequest_Delete]{op: walshipv1.PipelineRequest_Delete{Delete: in}}
	b.req.Op = &b.op
	r, err := m.do(ctx, &b.req)
	if err != nil {
		return nil, err
	}
	return r.GetDelete(), nil
}

// Txn is KVService.Txn as an operation of the stream.
func (m *Mux) Txn(ctx context.Context, in *walshipv1.TxnRequest, _ ...grpc.CallOption) (*walshipv1.TxnResponse, error) {
	b := &requestBox[walshipv1.PipelineRequest_Txn]{op: walshipv1.PipelineRequest_Txn{Txn: in}}
	b.req.Op = &b.op
	r, err := m.do(ctx, &b.req)
	if err != nil {
		return nil, err
	}
	return r.GetTxn(), nil
}

// Get is KVService.Get as an operation of the stream.
func (m *Mux) Get(ctx context.Context, in *walshipv1.GetRequest, _ ...grpc.CallOption) (*walshipv1.GetResponse, error) {
	b := &requestBox[walshipv1.PipelineRequest_Get]{op: walshipv1.PipelineRequest_Get{Get: in}}
	b.req.Op = &b.op
	r, err := m.do(ctx, &b.req)
	if err != nil {
		return nil, err
	}
	return r.GetGet(), nil
}

// Scan is KVService.Scan, a unary call.
func (m *Mux) Scan(ctx context.Context, in *walshipv1.ScanRequest, opts ...grpc.CallOption) (*walshipv1.ScanResponse, error) {
	return m.kv.Scan(ctx, in, opts...)
}

// Watch is KVService.Watch, a stream of its own.
func (m *Mux) Watch(ctx context.Context, in *walshipv1.WatchRequest, opts ...grpc.CallOption) (walshipv1.KVService_WatchClient, error) {
	return m.kv.Watch(ctx, in, opts...)
}

// Pipeline opens a Pipeline stream of the caller's own.
func (m *Mux) Pipeline(ctx context.Context, opts ...grpc.CallOption) (walshipv1.KVService_PipelineClient, error) {
	return m.kv.Pipeline(ctx, opts...)
}
