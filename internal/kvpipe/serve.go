// Package kvpipe serves and drives KVService.Pipeline: many independent
// KV operations on one bidirectional stream, each answered as it
// completes, so that a busy client pays gRPC's per-call cost once per
// stream rather than once per write.
//
// The server side (Serve) runs every operation through the node's own
// unary handler — the same validation, lease and admission checks, and
// the same answer or error — and the stream's authorization is the
// method's (KVService/*, as Put's). The client side (Mux) multiplexes
// concurrent callers' calls onto one stream and gives each the same error
// a unary call would get, a broken stream included.
package kvpipe

import (
	"context"
	"errors"
	"fmt"
	"io"
	"runtime"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	walshipv1 "github.com/walship/walship/gen/walship/v1"
	"github.com/walship/walship/internal/rpcerr"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
)

// DefaultMaxOps is how many operations of one stream a server runs at
// once by default.
const DefaultMaxOps = 256

// MaxOpsHeader is the response header in which Serve tells the client how
// many operations it may have in progress on the stream: a client that
// sends no more than that is never held back by a server that stopped
// reading, so its cancels are read at once.
const MaxOpsHeader = "walship-pipeline-max-ops"

// BatchHeader, "1" in a stream's response header, says the server reads
// the operations a request carries in more; "1" in its request header,
// that the client reads the answers a response carries in more.
const BatchHeader = "walship-pipeline-batch"

// maxBatchBytes bounds the operations, or the answers, put into one
// message: well under any peer's message limit (a larger one goes alone).
const maxBatchBytes = 64 << 10

// fieldMore is the field number of PipelineRequest.more and of
// PipelineResponse.more.
const fieldMore = 8

// Handler is what a Pipeline's operations run on: a node's unary
// KVService handlers.
type Handler interface {
	Put(context.Context, *walshipv1.PutRequest) (*walshipv1.PutResponse, error)
	Delete(context.Context, *walshipv1.DeleteRequest) (*walshipv1.DeleteResponse, error)
	Txn(context.Context, *walshipv1.TxnRequest) (*walshipv1.TxnResponse, error)
	Get(context.Context, *walshipv1.GetRequest) (*walshipv1.GetResponse, error)
}

// Grouper is a Handler that runs several writes of one message as a
// group (a primary: it sequences them under one hold and awaits them
// together), where Serve would run each on a worker of its own.
type Grouper interface {
	Handler
	// RunWrites runs ws — Puts, Deletes and Txns, each with the context
	// its own unary call would have — each as its unary handler would:
	// the same checks, its own policy, LSN and outcome. It calls done
	// once for each, done(i, resp, err) with ws[i]'s response or error as
	// the unary handler returns them, from its own goroutine, as soon
	// as each is ready, and returns once every one is done.
	RunWrites(ws []Write, done func(i int, resp proto.Message, err error))
}

// Write is one write of a group for Grouper.RunWrites.
type Write struct {
	Ctx context.Context
	Req *walshipv1.PipelineRequest // its op is a Put, a Delete or a Txn
}

// grouped reports whether req's operation goes in a group.
func grouped(req *walshipv1.PipelineRequest) bool {
	switch req.GetOp().(type) {
	case *walshipv1.PipelineRequest_Put, *walshipv1.PipelineRequest_Delete, *walshipv1.PipelineRequest_Txn:
		return true
	}
	return false
}

// Calls counts a stream's operations against its peer's calls in
// progress (internal/serve's --max-peer-calls), so that a peer holds no
// more through Pipeline streams than through unary calls.
type Calls interface {
	// Limit is the most calls the peer may have in progress.
	Limit() int
	// Acquire counts one more call of the peer, or returns the error a
	// unary call past the limit gets (RESOURCE_EXHAUSTED naming it),
	// after pacing the refusal as the server paces the peer's others.
	Acquire(ctx context.Context) (release func(), err error)
}

// Limits are what Serve may hold for one stream.
type Limits struct {
	// MaxOps is how many operations of the stream run or wait to be sent
	// at once (DefaultMaxOps if not positive).
	MaxOps int
	// Calls, if not nil, counts each operation in progress as one of the
	// peer's calls: the stream's own call stands for the first, and each
	// other takes one more, refused as a unary call past the limit is;
	// the stream holds max(1, operations in progress).
	Calls Calls
}

// Serve serves one Pipeline stream: it reads operations, runs each on h
// on a worker goroutine (workers), and sends each answer as it is ready,
// until the client closes its side and every operation is answered. At most
// lim.MaxOps operations are running or waiting to be sent at once; with
// that many, Serve reads no further request until one is sent, so a
// client that sends faster than the node answers, or that does not read,
// is held back by the stream's flow control, never buffered without
// bound. A graceful stop (the stream's context ending) is sent as a
// drain; the operations sent are still run and answered, unless every
// slot is taken then: Serve cannot wait for the client's next request (a
// cancel may be behind the one it holds), so it reads no further, ends
// the stream UNAVAILABLE and answers the operations still running
// UNAVAILABLE, their outcome unknown (errAbandoned). An operation
// whose timeout passes, or that the client cancels, is answered at once
// (DEADLINE_EXCEEDED, CANCELED) and frees its place, as gRPC answers a
// unary call whose caller gave up; its handler runs on as a unary call's
// does (a write already sequenced still commits) and its result is
// dropped. The operations a request carries in more are taken as if each
// had come in a message of its own, after the request's own (one that
// carries more of its own ends the stream INVALID_ARGUMENT) — except that
// for a Grouper the message's writes run as one group (RunWrites); for a client
// that says it reads them (BatchHeader), the answers ready together go in
// one message. One goroutine receives and one sends (grpc-go's
// rule for streams); every worker, running an abandoned operation or not,
// ends before Serve returns.
func Serve(stream walshipv1.KVService_PipelineServer, h Handler, lim Limits) error {
	maxOps := lim.MaxOps
	if maxOps <= 0 {
		maxOps = DefaultMaxOps
	}
	ctx := stream.Context()
	advertised := maxOps
	if lim.Calls != nil {
		advertised = min(advertised, max(lim.Calls.Limit(), 1))
	}
	if err := stream.SendHeader(metadata.Pairs(MaxOpsHeader, strconv.Itoa(advertised), BatchHeader, "1")); err != nil {
		return err
	}
	batchAnswers := slices.Contains(metadata.ValueFromIncomingContext(ctx, BatchHeader), "1")
	// A slot is held from the moment a request is read until its answer
	// is handed to the sender: answers never wait on a full channel for
	// longer than the sender takes to send. The drain takes no slot (the
	// channel has room for it).
	slots := make(chan struct{}, maxOps)
	answers := make(chan *walshipv1.PipelineResponse, maxOps+1)
	sent := make(chan error, 1)
	go func() { sent <- sendAnswers(stream, answers, slots, batchAnswers) }()
	// Operations outlive the stream's context, which ends when a graceful
	// stop begins (serve's endStreamsOnStop): a stopping server finishes
	// the operations it has, as it finishes unary calls, and tells the
	// client to move on (drain). They end with the stream itself, when
	// receiving fails. Each takes its values from base, which cannot be
	// cancelled, and ends on its own (op is its context): Serve ends
	// them one by one.
	base := context.WithoutCancel(ctx)
	drained := make(chan struct{})
	stopDrain := context.AfterFunc(ctx, func() {
		defer close(drained)
		answers <- &walshipv1.PipelineResponse{Result: &walshipv1.PipelineResponse_Drain{Drain: &walshipv1.PipelineDrain{}}}
	})
	r := &running{byID: map[uint64]*op{}, answers: answers, calls: lim.Calls}
	ops := &workers{jobs: make(chan job)}
	g, _ := h.(Grouper)
	in := &intake{ctx: ctx, base: base, r: r, ops: ops, slots: slots, grouper: g != nil, run: func(j job, w *worker) {
		if j.group != nil {
			r.runGroup(g, j.group, w)
			return
		}
		r.run(j.o, h, j.req, w)
	}}
	var recvErr error
	for {
		req, err := stream.Recv()
		if err != nil {
			if !errors.Is(err, io.EOF) {
				recvErr = err
			}
			break
		}
		for i, m := range req.GetMore() {
			if len(m.GetMore()) > 0 {
				recvErr = rpcerr.Invalid(fmt.Sprintf("more[%d].more", i), "an operation carried in more carries none of its own")
				break
			}
		}
		if recvErr != nil {
			break
		}
		if recvErr = in.take(req); recvErr != nil {
			break
		}
	}
	if recvErr != nil {
		r.abandonAll() // the stream ends
	}
	ops.close()
	if !stopDrain() {
		<-drained
	}
	close(answers)
	if err := <-sent; err != nil && recvErr == nil {
		return err
	}
	return recvErr
}

// intake is where Serve's receiver puts the operations it reads.
type intake struct {
	ctx   context.Context // the stream's: ends when a graceful stop begins
	base  context.Context // the operations' parent
	r     *running
	ops   *workers
	slots chan struct{}
	// grouper: the handler is a Grouper, and a message's writes run as
	// one group.
	grouper bool
	run     func(job, *worker) // made once: a closure per operation allocates
}

// take runs the operations of one request message: its own, then those
// it carries in more, each as if it had come alone — except that, for a
// Grouper, the writes among them (Puts, Deletes, Txns) run as one group
// on one worker, in the message's order. A message with more writes than
// the stream has free slots makes several groups, which run apart (in
// no set order), as does a Get.
func (in *intake) take(req *walshipv1.PipelineRequest) error {
	var group *[]groupOp
	if in.grouper && len(req.GetMore()) > 0 {
		g := make([]groupOp, 0, len(req.GetMore())+1)
		group = &g
	}
	err := in.accept(req, group)
	for _, m := range req.GetMore() {
		if err != nil {
			break
		}
		err = in.accept(m, group)
	}
	in.flush(group)
	return err
}

// accept runs one operation the client sent, once it has a slot (in
// group, if it is given and the operation goes in one), or takes a
// cancel. With every slot taken it runs the group gathered so far and
// waits for a slot, and returns an error if the server stops meanwhile:
// the client's next request may be the one (a cancel, its close) it
// waits for, so the stream ends.
func (in *intake) accept(req *walshipv1.PipelineRequest, group *[]groupOp) error {
	if _, ok := req.GetOp().(*walshipv1.PipelineRequest_Cancel); ok {
		in.r.cancel(req.GetId())
		return nil
	}
	select {
	case in.slots <- struct{}{}:
	default:
		in.flush(group)
		select {
		case in.slots <- struct{}{}:
		case <-in.ctx.Done():
			return errStopReading
		}
	}
	o := in.r.start(in.base, req)
	if group != nil && o.bad == nil && grouped(req) {
		*group = append(*group, groupOp{o: o, req: req})
		return nil
	}
	in.ops.submit(job{o: o, req: req}, in.run)
	return nil
}

// flush hands the operations gathered in group (if any) to a worker and
// empties it.
func (in *intake) flush(group *[]groupOp) {
	if group == nil {
		return
	}
	switch g := *group; len(g) {
	case 0:
		return
	case 1:
		in.ops.submit(job{o: g[0].o, req: g[0].req}, in.run)
	default:
		in.ops.submit(job{group: g}, in.run)
	}
	// The worker owns the slice now.
	*group = nil
}

// sendAnswers sends each answer, freeing its slot once sent, until
// answers is closed, and returns the first error sending. With batch, the
// answers ready together go in one message (at most maxBatchBytes of
// them; a larger one goes alone). After a failed send it goes on
// draining answers: the operations finish (their outcome is the client's
// to find out) and end.
func sendAnswers(stream walshipv1.KVService_PipelineServer, answers <-chan *walshipv1.PipelineResponse, slots <-chan struct{}, batch bool) error {
	var err error
	var more []*walshipv1.PipelineResponse
	var next *walshipv1.PipelineResponse // taken, too large for the last message
	for {
		a := next
		next = nil
		if a == nil {
			var ok bool
			if a, ok = <-answers; !ok {
				return err
			}
		}
		more = more[:0]
		if batch && err == nil {
			if len(slots) > 1 {
				// Others are running: let those about to answer do so
				// and go in this message (as grpc-go's writer yields
				// before writing a small buffer).
				runtime.Gosched()
			}
			size := proto.Size(a)
		gather:
			for {
				select {
				case b, ok := <-answers:
					if !ok {
						break gather // the next receive sees it closed
					}
					n := proto.Size(b)
					n += protowire.SizeTag(fieldMore) + protowire.SizeVarint(uint64(n))
					if size+n > maxBatchBytes {
						next = b
						break gather
					}
					more = append(more, b)
					size += n
				default:
					break gather
				}
			}
			if len(more) > 0 {
				// The message's own slice: gRPC may keep a message it
				// was given, so this is not reused.
				a.More = slices.Clone(more)
			}
		}
		if err == nil {
			err = stream.Send(a)
		}
		for _, x := range append(more, a) {
			if x.GetDrain() == nil {
				<-slots
			}
		}
	}
}

// workers run a stream's operations, each on a goroutine that takes the
// next operation once it has answered one. A goroutine per operation
// would start on a small stack and grow it, copying, on every operation
// (a primary's Put goes through the store's B-tree and protobuf's
// sizing): about a tenth of the primary's CPU per pipelined Put. A worker
// kept across operations keeps its stack. There are as many as
// operations ran at once (abandoned ones included: their handlers run on
// in theirs), and they end with the stream.
type workers struct {
	jobs chan job // unbuffered: taken only by a worker that is idle
	// idle counts the workers that have answered their operation (or
	// are done with it) and are about to take the next from jobs, not
	// yet promised one: a worker counts itself before its answer is
	// handed to the sender, so a client that waits for each answer
	// before sending the next finds one idle, and its operations run on
	// one goroutine.
	idle atomic.Int64
	wg   sync.WaitGroup
}

// job is one operation for a worker, or a group of writes for a
// Grouper.
type job struct {
	o     *op
	req   *walshipv1.PipelineRequest
	group []groupOp
}

// groupOp is one operation of a group.
type groupOp struct {
	o   *op
	req *walshipv1.PipelineRequest
}

// worker is a worker's state for the operation it runs.
type worker struct {
	ws   *workers
	idle bool // counted in ws.idle for this operation
	// runGroup's lists, kept for the worker's next group.
	writes []Write
	ran    []*op
	ends   []opEnd
}

// done counts the worker idle, once per operation: it answered it, or
// gave it up, and takes no further part in it but returning.
func (w *worker) done() {
	if !w.idle {
		w.idle = true
		w.ws.idle.Add(1)
	}
}

// submit runs j on an idle worker, or on a new one if none is. It waits
// only for a worker that is idle to take j (it has answered and is on its
// way back).
func (ws *workers) submit(j job, run func(job, *worker)) {
	for {
		n := ws.idle.Load()
		if n <= 0 {
			ws.wg.Add(1)
			go ws.work(j, run)
			return
		}
		if ws.idle.CompareAndSwap(n, n-1) {
			ws.jobs <- j
			return
		}
	}
}

// work runs first, then every job it is handed, until close.
func (ws *workers) work(first job, run func(job, *worker)) {
	defer ws.wg.Done()
	w := &worker{ws: ws}
	for j, ok := first, true; ok; j, ok = <-ws.jobs {
		w.idle = false
		run(j, w)
		w.done()
	}
}

// close ends the workers once they have finished their operations; no
// submit may follow.
func (ws *workers) close() {
	close(ws.jobs)
	ws.wg.Wait()
}

// running are a stream's operations in progress, by id (ids are the
// client's: several may share one), and the peer's calls they hold.
type running struct {
	answers chan<- *walshipv1.PipelineResponse

	mu sync.Mutex
	// byID holds the operations of each id in progress: the last
	// started, which links to the others (op.sameID).
	byID map[uint64]*op

	calls Calls // nil: not counted
	// holding is how many operations hold a call; the stream's own
	// stands for the first, extra are the peer's others they took, freed
	// as operations end (whichever ends): the peer holds max(1, holding).
	callMu  sync.Mutex
	holding int
	extra   []func()
}

// op is one operation in progress, and the context its handler runs
// with (a context.WithCancel of its own per operation took two
// allocations more): its values are the stream's, its deadline the
// request's timeout, and it ends — Done closed, Err set — when the
// client cancels it, its timeout passes, the stream ends or its handler
// has returned (end). The stream's own end (a graceful stop) does not
// end it. A context.WithCancel, WithDeadline or AfterFunc of it follows
// it through its AfterFunc, without a goroutine; one of a context
// derived from it by WithValue takes a goroutine while it waits (the
// context package looks for AfterFunc on the direct parent only).
type op struct {
	id     uint64
	parent context.Context // values only: never ends
	// timeout is the request's (0: none), and deadline when it passes;
	// bad, if the request's is not a valid positive duration.
	timeout  time.Duration
	deadline time.Time
	bad      error
	sameID   *op // the next operation in progress with the same id (guarded by running.mu)

	mu       sync.Mutex
	answered bool
	release  func() // the peer's call it holds, if any
	// The context's state: err once it ended; done (a chan struct{})
	// made by the first Done, closed by end; afters, the functions
	// AfterFunc registered.
	err    error
	done   atomic.Value
	afters []*afterFunc
}

// afterFunc is a function registered by op.AfterFunc, nil once run or
// stopped.
type afterFunc struct{ f func() }

// closedDone is the Done of an operation that ended before any asked.
var closedDone = make(chan struct{})

func init() { close(closedDone) }

func (o *op) Deadline() (time.Time, bool) { return o.deadline, o.timeout > 0 }

func (o *op) Done() <-chan struct{} {
	if d, ok := o.done.Load().(chan struct{}); ok {
		return d
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	if d, ok := o.done.Load().(chan struct{}); ok {
		return d
	}
	d := make(chan struct{})
	o.done.Store(d)
	return d
}

func (o *op) Err() error {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.err
}

func (o *op) Value(key any) any { return o.parent.Value(key) }

// String names o without reading its state (a context printed in a log
// must not race with its end).
func (o *op) String() string { return "kvpipe.op(" + strconv.FormatUint(o.id, 10) + ")" }

// AfterFunc runs f in a goroutine of its own once o ends: what
// context.AfterFunc, WithCancel and WithDeadline use to follow o
// without a goroutine waiting on Done.
func (o *op) AfterFunc(f func()) (stop func() bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	a := &afterFunc{f: f}
	if o.err != nil {
		go f()
		a.f = nil
	} else {
		o.afters = append(o.afters, a)
	}
	return func() bool {
		o.mu.Lock()
		defer o.mu.Unlock()
		if a.f == nil {
			return false
		}
		a.f = nil
		o.afters = slices.DeleteFunc(o.afters, func(x *afterFunc) bool { return x == a })
		return true
	}
}

// end ends o's context with err, once: later calls do nothing.
func (o *op) end(err error) {
	o.mu.Lock()
	if o.err != nil {
		o.mu.Unlock()
		return
	}
	o.err = err
	if d, ok := o.done.Load().(chan struct{}); ok {
		close(d)
	} else {
		o.done.Store(closedDone)
	}
	afters := o.afters
	o.afters = nil
	for _, a := range afters {
		go a.f()
		a.f = nil
	}
	o.mu.Unlock()
}

func (r *running) start(base context.Context, req *walshipv1.PipelineRequest) *op {
	o := &op{id: req.GetId(), parent: base}
	if t := req.GetTimeout(); t != nil {
		if err := t.CheckValid(); err != nil || t.AsDuration() <= 0 {
			o.bad = rpcerr.Invalid("timeout", "%v: want a positive duration", t.AsDuration())
		} else {
			o.timeout = t.AsDuration()
			o.deadline = time.Now().Add(o.timeout)
		}
	}
	r.mu.Lock()
	o.sameID = r.byID[o.id]
	r.byID[o.id] = o
	r.mu.Unlock()
	return o
}

// cancel abandons the operations of id: a client's cancel.
func (r *running) cancel(id uint64) {
	r.mu.Lock()
	var list []*op
	for o := r.byID[id]; o != nil; o = o.sameID {
		list = append(list, o)
	}
	r.mu.Unlock()
	for _, o := range list {
		o.end(context.Canceled)
		r.answer(o, failed(o.id, context.Canceled))
	}
}

// errStopReading ends a stream whose server stops while every slot of
// it is taken: the request read last is not run (the client learns of
// it as of any operation the stream ended before answering).
var errStopReading = status.Error(codes.Unavailable, "walship: the server is stopping and every operation slot of this stream is taken: it reads no further request")

// errAbandoned answers an operation still running when its stream ends:
// its handler runs on (a write already sequenced commits), so what it
// did is unknown, as for a unary call whose connection broke. UNAVAILABLE
// without a not-applied detail says so to pkg/client: a read is sent
// again, a write reported with its outcome unknown.
var errAbandoned = status.Error(codes.Unavailable, "walship: the pipeline stream ended while this operation ran: its outcome is unknown")

// abandonAll abandons every operation: the stream ends. The answers go
// out if the stream can still send (a stopping server ends a stream it
// can no longer read).
func (r *running) abandonAll() {
	r.mu.Lock()
	var list []*op
	for _, o := range r.byID {
		for ; o != nil; o = o.sameID {
			list = append(list, o)
		}
	}
	r.mu.Unlock()
	for _, o := range list {
		o.end(context.Canceled)
		r.answer(o, failed(o.id, errAbandoned))
	}
}

// done ends o, whose handler has returned, and forgets it.
func (r *running) done(o *op) {
	o.end(context.Canceled)
	r.mu.Lock()
	defer r.mu.Unlock()
	switch p := r.byID[o.id]; {
	case p == o && o.sameID == nil:
		delete(r.byID, o.id)
	case p == o:
		r.byID[o.id] = o.sameID
	default:
		for p != nil && p.sameID != o {
			p = p.sameID
		}
		if p != nil {
			p.sameID = o.sameID
		}
	}
	// A handler may keep o (its context) for longer: o lets go of the
	// others.
	o.sameID = nil
}

// call counts one more operation among the peer's calls: on the
// stream's own call if none holds it, else on one more of the peer's.
// release uncounts one (once per operation: answer's rule).
func (r *running) call(ctx context.Context) (release func(), err error) {
	if r.calls == nil {
		return nil, nil
	}
	r.callMu.Lock()
	if r.holding == 0 {
		r.holding = 1
		r.callMu.Unlock()
		return r.leave, nil
	}
	r.callMu.Unlock()
	rel, err := r.calls.Acquire(ctx)
	if err != nil {
		return nil, err
	}
	r.callMu.Lock()
	if r.holding == 0 {
		rel() // the stream's own came free meanwhile
	} else {
		r.extra = append(r.extra, rel)
	}
	r.holding++
	r.callMu.Unlock()
	return r.leave, nil
}

// leave uncounts an operation: the peer's call the stream holds past its
// own, if any, is freed.
func (r *running) leave() {
	r.callMu.Lock()
	defer r.callMu.Unlock()
	r.holding--
	if n := len(r.extra); n > 0 {
		rel := r.extra[n-1]
		r.extra = r.extra[:n-1]
		rel()
	}
}

// run runs o and hands its answer to the sender: the handler's, or, if
// o's caller gives up first (its timeout, a cancel, the stream's end),
// the unary call's error then, at once. The handler of an abandoned
// operation runs on in this goroutine and its result is dropped. w is
// counted idle before the answer goes (w.done).
func (r *running) run(o *op, h Handler, req *walshipv1.PipelineRequest, w *worker) {
	defer r.done(o)
	e, err := r.begin(o)
	defer e.end()
	if err != nil {
		w.done()
		if err != errAnswered {
			r.answer(o, failed(o.id, err))
		}
		return
	}
	resp := runOp(o, h, req)
	w.done()
	r.answer(o, resp)
}

// runGroup runs a group of writes on g with one call of its RunWrites,
// each write as run runs one: what begin refuses is answered at once,
// and each answer goes as soon as the handler gives it. w is counted
// idle before the last answer goes.
func (r *running) runGroup(g Grouper, ops []groupOp, w *worker) {
	w.writes, w.ran, w.ends = w.writes[:0], w.ran[:0], w.ends[:0]
	for _, x := range ops {
		e, err := r.begin(x.o)
		w.ends = append(w.ends, e)
		if err != nil {
			if err != errAnswered {
				r.answer(x.o, failed(x.o.id, err))
			}
			continue
		}
		w.writes = append(w.writes, Write{Ctx: x.o, Req: x.req})
		w.ran = append(w.ran, x.o)
	}
	if left := len(w.writes); left > 0 {
		g.RunWrites(w.writes, func(i int, resp proto.Message, err error) {
			if left--; left == 0 {
				w.done()
			}
			o := w.ran[i]
			r.answer(o, answerOf(o.id, resp, err))
		})
	}
	for i, x := range ops {
		w.ends[i].end()
		r.done(x.o)
	}
	clear(w.writes)
	clear(w.ran)
	clear(w.ends)
}

// errAnswered is begin's word that its operation was answered meanwhile.
var errAnswered = errors.New("kvpipe: answered")

// opEnd is what begin armed for an operation, to end once its handler
// has returned.
type opEnd struct {
	timer *time.Timer
	fired chan struct{}
}

// end stops the operation's timer, or waits until the answer it fired
// is handed over: the answers channel may close once its operation is
// done.
func (e opEnd) end() {
	if e.timer != nil && !e.timer.Stop() {
		<-e.fired
	}
}

// begin does what comes before o's handler runs: it arms o's timeout
// (whose timer ends o and answers for it when the handler does not
// return by then), counts o among the peer's calls and checks that o's
// caller still waits.
// It returns nil if the handler is to run, errAnswered if o was answered
// meanwhile, or the error to answer o with. The caller ends what it
// returns once the handler has returned (or at once, on an error).
func (r *running) begin(o *op) (opEnd, error) {
	if o.bad != nil {
		return opEnd{}, o.bad
	}
	var e opEnd
	if o.timeout > 0 {
		left := time.Until(o.deadline)
		if left <= 0 {
			// Passed while it waited for a worker: not run.
			o.end(context.DeadlineExceeded)
			return opEnd{}, context.DeadlineExceeded
		}
		fired := make(chan struct{})
		e = opEnd{fired: fired, timer: time.AfterFunc(left, func() {
			defer close(fired)
			o.end(context.DeadlineExceeded)
			r.answer(o, failed(o.id, context.DeadlineExceeded))
		})}
	}
	release, err := r.call(o)
	if err != nil {
		return e, err
	}
	if release != nil && !o.hold(release) {
		return e, errAnswered
	}
	if err := o.Err(); err != nil {
		return e, err
	}
	return e, nil
}

// hold records the peer's call o holds, or frees it if o was answered.
func (o *op) hold(release func()) bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.answered {
		release()
		return false
	}
	o.release = release
	return true
}

// answer hands o's first answer to the sender and frees o's place among
// the peer's calls; later ones are dropped.
func (r *running) answer(o *op, resp *walshipv1.PipelineResponse) {
	o.mu.Lock()
	if o.answered {
		o.mu.Unlock()
		return
	}
	o.answered = true
	release := o.release
	o.release = nil
	o.mu.Unlock()
	if release != nil {
		release()
	}
	r.answers <- resp
}

// failed is the answer to operation id that failed with err.
func failed(id uint64, err error) *walshipv1.PipelineResponse {
	return &walshipv1.PipelineResponse{Id: id, Result: errorResult(err)}
}

// runOp runs one operation on h and returns its answer: the unary
// handler's response, or its error as the unary call would have failed
// (code, message and details).
func runOp(ctx context.Context, h Handler, req *walshipv1.PipelineRequest) *walshipv1.PipelineResponse {
	var resp proto.Message
	var err error
	switch op := req.GetOp().(type) {
	case *walshipv1.PipelineRequest_Put:
		resp, err = h.Put(ctx, op.Put)
	case *walshipv1.PipelineRequest_Delete:
		resp, err = h.Delete(ctx, op.Delete)
	case *walshipv1.PipelineRequest_Txn:
		resp, err = h.Txn(ctx, op.Txn)
	case *walshipv1.PipelineRequest_Get:
		resp, err = h.Get(ctx, op.Get)
	default:
		err = rpcerr.Invalid("op", "none set (want put, delete, txn or get)")
	}
	return answerOf(req.GetId(), resp, err)
}

// answerOf is the answer to operation id whose handler returned resp and
// err.
func answerOf(id uint64, resp proto.Message, err error) *walshipv1.PipelineResponse {
	if err == nil {
		switch r := resp.(type) {
		case *walshipv1.PutResponse:
			a := &answerBox[walshipv1.PipelineResponse_Put]{result: walshipv1.PipelineResponse_Put{Put: r}}
			a.out.Id, a.out.Result = id, &a.result
			return &a.out
		case *walshipv1.DeleteResponse:
			a := &answerBox[walshipv1.PipelineResponse_Delete]{result: walshipv1.PipelineResponse_Delete{Delete: r}}
			a.out.Id, a.out.Result = id, &a.result
			return &a.out
		case *walshipv1.TxnResponse:
			a := &answerBox[walshipv1.PipelineResponse_Txn]{result: walshipv1.PipelineResponse_Txn{Txn: r}}
			a.out.Id, a.out.Result = id, &a.result
			return &a.out
		case *walshipv1.GetResponse:
			a := &answerBox[walshipv1.PipelineResponse_Get]{result: walshipv1.PipelineResponse_Get{Get: r}}
			a.out.Id, a.out.Result = id, &a.result
			return &a.out
		default:
			err = status.Errorf(codes.Internal, "walship: the handler answered a %T", resp)
		}
	}
	return failed(id, err)
}

// answerBox is an answer and the oneof that holds its result, in one
// allocation where two would do (one per answer saved).
type answerBox[R any] struct {
	out    walshipv1.PipelineResponse
	result R
}

// errorResult is err as gRPC would send it for a unary call: a status
// error as it is, a context's error by its code, anything else UNKNOWN.
func errorResult(err error) *walshipv1.PipelineResponse_Error {
	st, ok := status.FromError(err)
	if !ok {
		st = status.FromContextError(err)
	}
	p := st.Proto()
	return &walshipv1.PipelineResponse_Error{Error: &walshipv1.PipelineStatus{Code: p.GetCode(), Message: p.GetMessage(), Details: p.GetDetails()}}
}
