package client

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"time"

	walshipv1 "github.com/walship/walship/gen/walship/v1"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
)

// Watcher follows a KVService.Watch across nodes: when its stream ends
// (the node stopped, failed over, cut it off, fell behind) it resumes on
// the same node or another from the LSN after the last transaction or
// progress notification it received, so no transaction is repeated or
// skipped. Every node serves only what the cluster's contract has
// acknowledged, so a transaction received is never taken back by a
// failover. Not safe for concurrent use.
type Watcher struct {
	c      *Client
	ctx    context.Context
	cancel context.CancelFunc
	req    *walshipv1.WatchRequest
	next   uint64 // first LSN not yet received; 0 until the first message
	node   int    // index in c.nodes of the node watched
	stream walshipv1.KVService_WatchClient
	// Resumes counts the streams opened after the first.
	Resumes int
}

// Watch starts a watch of req (its start_lsn is where it begins; 0: now)
// on any node, preferring the one first in the node list. Close it when
// done.
func (c *Client) Watch(ctx context.Context, req *walshipv1.WatchRequest) *Watcher {
	ctx, cancel := context.WithCancel(ctx)
	return &Watcher{c: c, ctx: ctx, cancel: cancel, req: proto.CloneOf(req), next: req.GetStartLsn(), node: -1}
}

// Close ends the watch.
func (w *Watcher) Close() { w.cancel() }

// Next returns the LSN the watch resumes from: one past the last
// transaction or progress notification received (0: none yet, and the
// watch started from now).
func (w *Watcher) Next() uint64 { return w.next }

// Recv returns the next transaction or progress notification. It resumes
// on another node for as long as Options.Retry allows without a message,
// and returns the error of a request no node can serve (INVALID_ARGUMENT,
// a position every node has released).
func (w *Watcher) Recv() (*walshipv1.WatchResponse, error) {
	deadline := time.Now().Add(w.c.opts.Retry)
	wait := 20 * time.Millisecond
	var lastErr error
	for {
		if w.stream == nil {
			if err := w.open(); err != nil {
				lastErr = err
			}
		}
		if w.stream != nil {
			m, err := w.stream.Recv()
			if err == nil {
				switch x := m.GetMsg().(type) {
				case *walshipv1.WatchResponse_Txns:
					if n := len(x.Txns.GetTxns()); n > 0 {
						w.next = x.Txns.GetTxns()[n-1].GetLsn() + 1
					}
				case *walshipv1.WatchResponse_Progress:
					w.next = max(w.next, x.Progress.GetLsn()+1)
				}
				return m, nil
			}
			w.stream = nil
			lastErr = err
		}
		if w.ctx.Err() != nil {
			return nil, w.ctx.Err()
		}
		if !resumable(lastErr) {
			return nil, lastErr
		}
		if time.Now().After(deadline) {
			return nil, lastErr
		}
		w.node++ // the next node, which may be further ahead or still hold the position
		t := time.NewTimer(wait + time.Duration(rand.Int64N(int64(wait))))
		select {
		case <-t.C:
		case <-w.ctx.Done():
			t.Stop()
			return nil, w.ctx.Err()
		}
		wait = min(2*wait, 250*time.Millisecond)
	}
}

// open starts a stream on the current node from w.next.
func (w *Watcher) open() error {
	if w.node < 0 {
		w.node = 0
	} else {
		w.Resumes++
	}
	addr := w.c.nodes[w.node%len(w.c.nodes)]
	conn, err := w.c.conn(addr)
	if err != nil {
		return err
	}
	req := proto.CloneOf(w.req)
	req.StartLsn = w.next
	s, err := walshipv1.NewKVServiceClient(conn).Watch(w.ctx, req)
	if err != nil {
		return err
	}
	w.stream = s
	return nil
}

// resumable reports whether a watch that failed with err may go on
// elsewhere: not a bad request, not the caller's own end.
func resumable(err error) bool {
	if err == nil || errors.Is(err, io.EOF) {
		return true
	}
	switch status.Code(err) {
	case codes.InvalidArgument, codes.Canceled, codes.PermissionDenied, codes.Unauthenticated:
		return false
	}
	return true // UNIMPLEMENTED too: not a data node (a log store), try the next
}

// Watch opens a resuming watch (Client.Watch) as a
// KVService_WatchClient; call options are ignored.
func (r routed) Watch(ctx context.Context, in *walshipv1.WatchRequest, opts ...grpc.CallOption) (grpc.ServerStreamingClient[walshipv1.WatchResponse], error) {
	return &watchStream{w: r.c.Watch(ctx, in), ctx: ctx}, nil
}

// watchStream adapts a Watcher to grpc.ServerStreamingClient.
type watchStream struct {
	w   *Watcher
	ctx context.Context
}

func (s *watchStream) Recv() (*walshipv1.WatchResponse, error) { return s.w.Recv() }
func (s *watchStream) Header() (metadata.MD, error)            { return nil, nil }
func (s *watchStream) Trailer() metadata.MD                    { return nil }
func (s *watchStream) CloseSend() error                        { return nil }
func (s *watchStream) Context() context.Context                { return s.ctx }
func (s *watchStream) SendMsg(any) error                       { return errors.New("walship client: a watch sends nothing") }
func (s *watchStream) RecvMsg(m any) error {
	r, err := s.w.Recv()
	if err != nil {
		return err
	}
	out, ok := m.(*walshipv1.WatchResponse)
	if !ok {
		return errors.New("walship client: RecvMsg wants a *WatchResponse")
	}
	proto.Merge(out, r)
	return nil
}

// GetStale reads key on a data node whose state is at most maxLagLSNs
// behind the primary's (a bounded-staleness read; 0 sets no bound, as
// max_lag_lsns 0 does), off the primary when a replica can serve it: the
// data nodes it knows other than the primary, from a random one so that
// reads spread, each refusing with FAILED_PRECONDITION if it lags more;
// then the primary (a linearizable read, Get). A node that does not
// answer, or is no data node (a log store in the list), is skipped. The
// response's applied_lsn says which state it is.
func (c *Client) GetStale(ctx context.Context, key string, maxLagLSNs uint64) (*walshipv1.GetResponse, error) {
	c.mu.Lock()
	primary := c.primary
	c.mu.Unlock()
	var lastErr error
	for _, addr := range c.replicasFirst() {
		if addr == primary {
			continue // asked last, below, as the primary
		}
		conn, err := c.conn(addr)
		if err != nil {
			lastErr = err
			continue
		}
		r, err := walshipv1.NewKVServiceClient(conn).Get(ctx, &walshipv1.GetRequest{Key: key, MaxLagLsns: maxLagLSNs})
		if err == nil {
			return r, nil
		}
		lastErr = fmt.Errorf("%s: %w", addr, err)
		switch status.Code(err) {
		case codes.FailedPrecondition, codes.Unavailable, codes.DeadlineExceeded, codes.Unimplemented:
			continue // too far behind, not reachable, or no data node: the next node
		}
		return nil, lastErr
	}
	if ctx.Err() != nil {
		return nil, ctx.Err()
	}
	r, err := c.Get(ctx, key)
	switch {
	case err == nil:
		return r, nil
	case lastErr == nil:
		return nil, err
	}
	return nil, fmt.Errorf("walship client: no replica served the read within %d LSNs (last: %v), nor the primary: %w", maxLagLSNs, lastErr, err)
}
