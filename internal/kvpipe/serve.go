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
	"io"
	"sync"

	walshipv1 "github.com/walship/walship/gen/walship/v1"
	"github.com/walship/walship/internal/rpcerr"
	"google.golang.org/grpc/status"
)

// DefaultMaxOps is how many operations of one stream a server runs at
// once by default.
const DefaultMaxOps = 256

// Handler is what a Pipeline's operations run on: a node's unary
// KVService handlers.
type Handler interface {
	Put(context.Context, *walshipv1.PutRequest) (*walshipv1.PutResponse, error)
	Delete(context.Context, *walshipv1.DeleteRequest) (*walshipv1.DeleteResponse, error)
	Txn(context.Context, *walshipv1.TxnRequest) (*walshipv1.TxnResponse, error)
	Get(context.Context, *walshipv1.GetRequest) (*walshipv1.GetResponse, error)
}

// Serve serves one Pipeline stream: it reads operations, runs each on h
// in a goroutine of its own, and sends each answer as it is ready, until
// the client closes its side and every operation is answered. At most
// maxOps operations (DefaultMaxOps if not positive) are running or
// waiting to be sent at once; with that many, Serve reads no further
// request until one is sent, so a client that sends faster than the node
// answers, or that does not read, is held back by the stream's flow
// control, never buffered without bound. One goroutine receives and one
// sends (grpc-go's rule for streams); every operation's goroutine ends
// before Serve returns.
func Serve(stream walshipv1.KVService_PipelineServer, h Handler, maxOps int) error {
	if maxOps <= 0 {
		maxOps = DefaultMaxOps
	}
	ctx := stream.Context()
	// A slot is held from the moment a request is read until its answer
	// is handed to the sender: answers never wait on a full channel for
	// longer than the sender takes to send.
	slots := make(chan struct{}, maxOps)
	answers := make(chan *walshipv1.PipelineResponse, maxOps)
	sent := make(chan error, 1)
	go func() {
		var err error
		for a := range answers {
			if err == nil {
				err = stream.Send(a)
			}
			// After a failed send, keep draining: the operations finish
			// (their outcome is the client's to find out) and end.
			<-slots
		}
		sent <- err
	}()
	var ops sync.WaitGroup
	var recvErr error
	for {
		req, err := stream.Recv()
		if err != nil {
			if !errors.Is(err, io.EOF) {
				recvErr = err
			}
			break
		}
		select {
		case slots <- struct{}{}:
		case <-ctx.Done():
			recvErr = status.FromContextError(ctx.Err()).Err()
		}
		if recvErr != nil {
			break
		}
		ops.Add(1)
		go func() {
			defer ops.Done()
			answers <- Run(ctx, h, req)
		}()
	}
	ops.Wait()
	close(answers)
	if err := <-sent; err != nil && recvErr == nil {
		return err
	}
	return recvErr
}

// Run runs one operation on h and returns its answer: the unary
// handler's response, or its error as the unary call would have failed
// (code, message and details).
func Run(ctx context.Context, h Handler, req *walshipv1.PipelineRequest) *walshipv1.PipelineResponse {
	resp := &walshipv1.PipelineResponse{Id: req.GetId()}
	if t := req.GetTimeout(); t != nil {
		if err := t.CheckValid(); err != nil || t.AsDuration() <= 0 {
			resp.Result = errorResult(rpcerr.Invalid("timeout", "%v: want a positive duration", t.AsDuration()))
			return resp
		}
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, t.AsDuration())
		defer cancel()
	}
	var err error
	switch op := req.GetOp().(type) {
	case *walshipv1.PipelineRequest_Put:
		var r *walshipv1.PutResponse
		if r, err = h.Put(ctx, op.Put); err == nil {
			resp.Result = &walshipv1.PipelineResponse_Put{Put: r}
		}
	case *walshipv1.PipelineRequest_Delete:
		var r *walshipv1.DeleteResponse
		if r, err = h.Delete(ctx, op.Delete); err == nil {
			resp.Result = &walshipv1.PipelineResponse_Delete{Delete: r}
		}
	case *walshipv1.PipelineRequest_Txn:
		var r *walshipv1.TxnResponse
		if r, err = h.Txn(ctx, op.Txn); err == nil {
			resp.Result = &walshipv1.PipelineResponse_Txn{Txn: r}
		}
	case *walshipv1.PipelineRequest_Get:
		var r *walshipv1.GetResponse
		if r, err = h.Get(ctx, op.Get); err == nil {
			resp.Result = &walshipv1.PipelineResponse_Get{Get: r}
		}
	default:
		err = rpcerr.Invalid("op", "none set (want put, delete, txn or get)")
	}
	if err != nil {
		resp.Result = errorResult(err)
	}
	return resp
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
