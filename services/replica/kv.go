package replica

import (
	"context"

	walshipv1 "github.com/walship/walship/gen/walship/v1"
	"github.com/walship/walship/internal/changefeed"
	"github.com/walship/walship/internal/kvpipe"
	"github.com/walship/walship/internal/serve"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// kvServer is the replica's KVService: reads at the applied LSN, writes
// refused with the primary's address.
type kvServer struct {
	walshipv1.UnimplementedKVServiceServer
	s *Server
}

// Get and Scan read at the applied LSN, which may trail a write the
// primary has acknowledged (an acknowledgement at flush does not wait for
// apply); a read that asks for the primary (require_primary) is refused,
// naming the primary, so that it is never answered here by mistake — the
// node being promoted stays a replica until its epoch opens.
func (k *kvServer) Get(ctx context.Context, req *walshipv1.GetRequest) (*walshipv1.GetResponse, error) {
	if req.GetRequirePrimary() {
		return nil, k.s.notPrimary()
	}
	return k.s.reads.Get(ctx, req)
}

func (k *kvServer) Scan(ctx context.Context, req *walshipv1.ScanRequest) (*walshipv1.ScanResponse, error) {
	if req.GetRequirePrimary() {
		return nil, k.s.notPrimary()
	}
	return k.s.reads.Scan(ctx, req)
}

func (k *kvServer) readOnly() error {
	return status.Errorf(codes.FailedPrecondition, "this is a read-only replica; send writes to the primary at %s", k.s.primary())
}

func (k *kvServer) Put(context.Context, *walshipv1.PutRequest) (*walshipv1.PutResponse, error) {
	return nil, k.readOnly()
}

func (k *kvServer) Delete(context.Context, *walshipv1.DeleteRequest) (*walshipv1.DeleteResponse, error) {
	return nil, k.readOnly()
}

func (k *kvServer) Txn(context.Context, *walshipv1.TxnRequest) (*walshipv1.TxnResponse, error) {
	return nil, k.readOnly()
}

// Pipeline runs each operation of the stream as its unary call
// (kvpipe.Serve): reads served here, writes refused naming the primary;
// each operation in progress is one of its peer's calls.
func (k *kvServer) Pipeline(stream walshipv1.KVService_PipelineServer) error {
	return kvpipe.Serve(stream, k, kvpipe.Limits{MaxOps: k.s.cfg.MaxPipelineOps, Calls: serve.StreamCalls(stream.Context())})
}

// Watch serves the transactions this replica has applied, up to the
// primary's commit watermark (readable.go).
func (k *kvServer) Watch(req *walshipv1.WatchRequest, stream walshipv1.KVService_WatchServer) error {
	return changefeed.Serve(changefeed.Source{Feed: k.s.feed, WAL: k.s.wal, Stall: k.s.cfg.WatchStall, Metrics: k.s.metrics.watch}, req, stream)
}
