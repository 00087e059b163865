package replica

import (
	"context"

	walshipv1 "github.com/walship/walship/gen/walship/v1"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// kvServer is the replica's KVService: reads at the applied LSN, writes
// refused with the primary's address.
type kvServer struct {
	walshipv1.UnimplementedKVServiceServer
	s *Server
}

func (k *kvServer) Get(ctx context.Context, req *walshipv1.GetRequest) (*walshipv1.GetResponse, error) {
	return k.s.reads.Get(ctx, req)
}

func (k *kvServer) Scan(ctx context.Context, req *walshipv1.ScanRequest) (*walshipv1.ScanResponse, error) {
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
