package changefeed

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"time"

	walshipv1 "github.com/walship/walship/gen/walship/v1"
	"github.com/walship/walship/internal/envelope"
	"github.com/walship/walship/internal/keyspace"
	"github.com/walship/walship/internal/wal"
	"github.com/walship/walship/pkg/codec"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
)

// Limits of a watch.
const (
	DefaultProgress = time.Second
	MinProgress     = 10 * time.Millisecond
	MaxProgress     = time.Minute
	DefaultWait     = 5 * time.Second
	MaxWait         = 5 * time.Minute
	// DefaultStall is how long one Send may stay blocked (the watcher
	// does not read, and gRPC's flow-control window is full) before the
	// watcher is cut off.
	DefaultStall = 10 * time.Second
	// readAhead is how many transactions a watcher takes from the ring at
	// once, and sends in one message at most.
	readAhead = 256
	// maxMessageBytes bounds the events of one message (one transaction
	// may exceed it alone).
	maxMessageBytes = 1 << 20
)

// Source is what a node serves watches from.
type Source struct {
	Feed *Feed
	// WAL is the node's log, read for positions older than the ring.
	WAL *wal.Log
	// Stall bounds a blocked Send (0: DefaultStall).
	Stall time.Duration
	// Metrics, if set, count the node's watches.
	Metrics *Metrics
}

// filter is what one watcher selects.
type filter struct {
	key, prefix string
	exact       bool
	prev        bool
}

func (f *filter) match(key string) bool {
	if f.exact {
		return key == f.key
	}
	return strings.HasPrefix(key, f.prefix)
}

// elem returns t's encoded element for this watcher (see encode.go): the
// shared one of all events when every event matches, else the shared one
// of this filter's subset (nil if none matches).
func (f *filter) elem(t *Txn) (mem.Buffer, error) {
	n, events := 0, t.Events()
	for _, e := range events {
		if f.match(e.Key) {
			n++
		}
	}
	switch {
	case n == 0:
		return nil, nil
	case n == len(events):
		return t.elem(f.prev)
	}
	return t.partialElem(*f)
}

func duration(field string, d *durationpb.Duration, def, lo, hi time.Duration) (time.Duration, error) {
	if d == nil {
		return def, nil
	}
	if err := d.CheckValid(); err != nil {
		return 0, status.Errorf(codes.InvalidArgument, "%s: %v", field, err)
	}
	v := d.AsDuration()
	if v < lo || v > hi {
		return 0, status.Errorf(codes.InvalidArgument, "%s: %v is not in [%v, %v]", field, v, lo, hi)
	}
	return v, nil
}

// Stream is the sending side of a Watch. SendMsg is sent a
// *WatchResponse, or a proto.Message that also carries its encoding
// (EncodedBuffers() mem.BufferSlice) for the server's codec to send as it
// is: a message of transactions encoded once for every watcher.
type Stream interface {
	Context() context.Context
	SendMsg(m any) error
}

// Serve runs one Watch until the stream ends or fails.
func Serve(src Source, req *walshipv1.WatchRequest, stream Stream) error {
	f := filter{key: req.GetKey(), prefix: req.GetPrefix(), prev: req.GetPrevValues()}
	switch {
	case f.key != "" && f.prefix != "":
		return status.Error(codes.InvalidArgument, "key, prefix: set one of them, not both (a key watches that key, a prefix every key under it)")
	case f.key != "":
		if err := keyspace.ValidateKey("key", f.key); err != nil {
			return err
		}
		f.exact = true
	case f.prefix != "" && f.prefix[0] == keyspace.ReservedPrefix[0]:
		return status.Error(codes.InvalidArgument, "prefix: keys starting with U+0000 are reserved for walship itself")
	}
	progress, err := duration("progress_interval", req.GetProgressInterval(), DefaultProgress, MinProgress, MaxProgress)
	if err != nil {
		return err
	}
	wait, err := duration("wait_timeout", req.GetWaitTimeout(), DefaultWait, 0, MaxWait)
	if err != nil {
		return err
	}
	src.Metrics.opened(1)
	defer src.Metrics.opened(-1)
	ctx := stream.Context()
	next := req.GetStartLsn()
	if next == 0 {
		// "Now" is the state reads see here; a node that has not made
		// what it recovered readable yet (no commit watermark covers it)
		// has none.
		if o := src.Feed.Origin(); src.Feed.Bound.Load() < o {
			wctx, cancel := context.WithTimeout(ctx, wait)
			got, err := src.Feed.Bound.Wait(wctx, o)
			cancel()
			if err != nil {
				if ctx.Err() != nil {
					return status.FromContextError(ctx.Err()).Err()
				}
				return src.Metrics.cut(CutUnavailable, status.Errorf(codes.Unavailable, "no state is readable here yet: the commit watermark (%d) has not reached LSN %d, where this node started (waited %v)", got, o, wait))
			}
		}
		next = src.Feed.Bound.Load() + 1
	} else if b := src.Feed.Bound.Load(); next-1 > b {
		wctx, cancel := context.WithTimeout(ctx, wait)
		got, err := src.Feed.Bound.Wait(wctx, next-1)
		cancel()
		if err != nil {
			if ctx.Err() != nil {
				return status.FromContextError(ctx.Err()).Err()
			}
			return src.Metrics.cut(CutOutOfRange, status.Errorf(codes.OutOfRange, "start_lsn: %d is in the future: this node's commit watermark is %d (waited %v); resume at most from %d here, or on a node further ahead", next, got, wait, got+1))
		}
	}
	if f.prev && next < src.Feed.From() {
		return src.Metrics.cut(CutOutOfRange, status.Errorf(codes.OutOfRange, "start_lsn: %d is older than this node keeps previous values for: the oldest LSN it serves with prev_values is %d", next, src.Feed.From()))
	}
	w := &watcher{src: src, f: f, stream: stream, next: next, progress: progress}
	return w.run(ctx)
}

// watcher is one Watch: a position and a filter.
type watcher struct {
	src      Source
	f        filter
	stream   Stream
	next     uint64 // first LSN not yet delivered
	progress time.Duration
	lastSent time.Time
	buf      []*Txn
	msg      message // its list of elements reused from one message to the next
	// sending is when the Send under way began (unix ns; 0: none);
	// resume is the first LSN not yet sent, for the cut-off's message.
	sending atomic.Int64
	resume  atomic.Uint64
}

// run runs the watch (loop) on a goroutine of its own, the stream's only
// sender, and watches its Sends: one blocked past the stall bound (the
// client does not read, and gRPC's flow-control window is full) cuts the
// watcher off. Returning ends the stream, which ends the blocked Send and
// with it the goroutine; nothing is buffered per watcher meanwhile.
func (w *watcher) run(ctx context.Context) error {
	stall := w.src.Stall
	if stall <= 0 {
		stall = DefaultStall
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- w.loop(ctx) }()
	tick := time.NewTicker(max(stall/4, time.Millisecond))
	defer tick.Stop()
	for {
		select {
		case err := <-done:
			return err
		case <-tick.C:
			if since := w.sending.Load(); since != 0 && time.Since(time.Unix(0, since)) > stall {
				return w.src.Metrics.cut(CutStalled, status.Errorf(codes.ResourceExhausted, "watcher did not read for %v: cut off; resume from LSN %d", stall, w.resume.Load()))
			}
		}
	}
}

// send sends m (a *WatchResponse, or a *message of encoded
// transactions), noting while it is blocked.
func (w *watcher) send(m proto.Message) error {
	w.sending.Store(time.Now().UnixNano())
	err := w.stream.SendMsg(m)
	w.sending.Store(0)
	w.lastSent = time.Now()
	return err
}

// loop sends, in LSN order, every matching transaction from w.next on
// that the bound allows, and a progress notification whenever nothing
// was sent for the progress interval.
func (w *watcher) loop(ctx context.Context) error {
	feed := w.src.Feed
	timer := time.NewTimer(w.progress)
	defer timer.Stop()
	w.lastSent = time.Now()
	for {
		w.resume.Store(w.next)
		if err := w.maybeProgress(); err != nil {
			return err
		}
		bound, boundChanged := feed.Bound.Changed()
		if w.next > bound {
			timer.Reset(time.Until(w.lastSent.Add(w.progress)))
			select {
			case <-ctx.Done():
				return status.FromContextError(ctx.Err()).Err()
			case <-boundChanged:
			case <-timer.C:
			}
			continue
		}
		txns, ok, _ := feed.read(w.next, bound, readAhead, w.buf[:0])
		if !ok {
			if w.f.prev {
				return w.src.Metrics.cut(CutOutOfRange, status.Errorf(codes.OutOfRange, "watcher fell behind what this node keeps previous values for: resume from LSN %d (the oldest it serves with prev_values is %d), or without prev_values", w.next, feed.From()))
			}
			if err := w.history(ctx); err != nil {
				return err
			}
			continue
		}
		if err := w.sendTxns(txns, true); err != nil {
			return err
		}
		if len(txns) < readAhead {
			w.next = max(w.next, bound+1) // nothing else committed up to bound
		}
		clear(txns)
		w.buf = txns[:0]
	}
}

// sendTxns sends the matching transactions of txns (LSN order, from
// w.next on), as few messages as maxMessageBytes allows, and moves w.next
// past them. Those from the ring are sent as the run of messages every
// watcher of the same selection that read the same run shares (built by
// the first: see runCache); those from the WAL, the watcher's own, are
// assembled for it.
func (w *watcher) sendTxns(txns []*Txn, fromRing bool) error {
	if len(txns) == 0 {
		return nil
	}
	if !fromRing {
		msgs, err := buildRun(w.f, txns, &w.src.Feed.bufs, &w.msg, false)
		if err != nil {
			return status.Errorf(codes.Internal, "%v; resume from LSN %d", err, w.next)
		}
		return w.sendRun(msgs, txns)
	}
	k := runKey{f: w.f, first: txns[0], last: txns[len(txns)-1], n: len(txns)}
	msgs, err := w.src.Feed.runs.get(k, func() ([]runMsg, error) {
		var m message
		return buildRun(w.f, txns, &w.src.Feed.bufs, &m, true)
	})
	if err != nil {
		return status.Errorf(codes.Internal, "%v; resume from LSN %d", err, w.next)
	}
	return w.sendRun(msgs, txns)
}

// sendRun sends msgs, the messages of txns, and moves w.next past txns.
func (w *watcher) sendRun(msgs []runMsg, txns []*Txn) error {
	for i := range msgs {
		if err := w.send(&msgs[i]); err != nil {
			return err
		}
		w.src.Metrics.sentTxns(msgs[i].txns)
		w.next = msgs[i].last + 1
	}
	w.next = max(w.next, txns[len(txns)-1].LSN+1)
	return nil
}

// buildRun returns the messages that send f's transactions of txns, each
// of at most maxMessageBytes (one transaction may exceed it alone), made
// in m: shared (buffers of their own, to be sent to many watchers), or
// one watcher's (assembled on sending, in a pooled buffer).
func buildRun(f filter, txns []*Txn, pool *bufferPool, m *message, shared bool) ([]runMsg, error) {
	m.pool = pool
	defer m.release()
	var out []runMsg
	flush := func() {
		if m.txns == 0 {
			return
		}
		rm := runMsg{txns: m.txns, last: m.last.LSN}
		if shared {
			rm.bufs = m.shared()
		} else {
			rm.bufs = m.EncodedBuffers()
		}
		out = append(out, rm)
		m.release()
	}
	for _, t := range txns {
		elem, err := f.elem(t)
		if err != nil {
			return nil, err
		}
		if elem == nil {
			continue
		}
		if m.txns > 0 && m.bytes+t.size > maxMessageBytes {
			flush()
		}
		m.add(elem, t)
	}
	flush()
	return out, nil
}

// maybeProgress sends a progress notification if nothing was sent for the
// progress interval.
func (w *watcher) maybeProgress() error {
	if time.Since(w.lastSent) < w.progress {
		return nil
	}
	return w.send(&walshipv1.WatchResponse{Msg: &walshipv1.WatchResponse_Progress{Progress: &walshipv1.WatchProgress{Lsn: w.next - 1}}})
}

// history sends from the node's WAL until w.next is in the ring: the
// watcher started, or fell, behind it. Previous values are not kept there.
func (w *watcher) history(ctx context.Context) error {
	feed, log := w.src.Feed, w.src.WAL
	if log == nil {
		return w.src.Metrics.cut(CutOutOfRange, status.Errorf(codes.OutOfRange, "start_lsn: LSN %d is no longer held here: the oldest LSN this node serves is %d", w.next, feed.From()))
	}
	rd, err := log.NewReader(w.next, false)
	if err != nil {
		return w.historyErr(err)
	}
	defer rd.Close()
	var env walshipv1.WalBatch
	var b codec.Batch
	for w.next < feed.From() {
		w.resume.Store(w.next)
		if err := w.maybeProgress(); err != nil {
			return err
		}
		e, err := rd.Next(ctx)
		if err != nil {
			return w.historyErr(err)
		}
		if e.LastLSN < w.next {
			continue
		}
		if err := envelope.DecodeStored(e.Data, &env, &b); err != nil {
			return w.src.Metrics.cut(CutDataLoss, status.Errorf(codes.DataLoss, "read LSNs %d..%d from the log: %v", e.FirstLSN, e.LastLSN, err))
		}
		txns := Build(b.Records, func(uint64) int64 { return env.GetCommitTimeUnixNano() })
		for len(txns) > 0 && txns[0].LSN < w.next {
			txns = txns[1:]
		}
		if len(txns) == 0 {
			continue
		}
		// The log may hold what the watermark does not cover yet.
		if _, err := feed.Bound.Wait(ctx, txns[len(txns)-1].LSN); err != nil {
			return status.FromContextError(err).Err()
		}
		if err := w.sendTxns(txns, false); err != nil {
			return err
		}
	}
	return nil
}

// historyErr maps an error reading the node's WAL.
func (w *watcher) historyErr(err error) error {
	switch {
	case errors.Is(err, wal.ErrCompacted):
		oldest := w.src.WAL.FirstLSN()
		if oldest == 0 {
			oldest = w.src.Feed.From()
		}
		return w.src.Metrics.cut(CutOutOfRange, status.Errorf(codes.OutOfRange, "start_lsn: LSN %d is no longer held here (retention, or a re-seed from a snapshot): the oldest LSN this node serves is %d", w.next, oldest))
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return status.FromContextError(err).Err()
	default:
		return w.src.Metrics.cut(CutUnavailable, status.Errorf(codes.Unavailable, "read the log from LSN %d: %v; resume from there", w.next, err))
	}
}

var _ = fmt.Sprintf
