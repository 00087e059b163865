// Package walserve serves a node's own WAL as LogStoreService.Read: a
// candidate whose most advanced peer is a replica — or the primary that
// just stepped down — copies the tail it lacks from there.
package walserve

import (
	"errors"

	walshipv1 "github.com/walship/walship/gen/walship/v1"
	"github.com/walship/walship/internal/envelope"
	"github.com/walship/walship/internal/wal"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Read streams log's durable entries from req.from_lsn to req.to_lsn (or
// its durable end). follow is not supported. who names the node in errors.
func Read(log *wal.Log, who string, req *walshipv1.ReadRequest, stream walshipv1.LogStoreService_ReadServer) error {
	if req.GetFollow() {
		return status.Errorf(codes.InvalidArgument, "follow: %s serves its log up to its end only", who)
	}
	from, to := req.GetFromLsn(), req.GetToLsn()
	if from == 0 {
		return status.Error(codes.InvalidArgument, "from_lsn: must be at least 1")
	}
	end := log.DurableLSN()
	if to == 0 || to > end {
		to = end
	}
	if from > to {
		return nil
	}
	rd, err := log.NewReader(from, true)
	if errors.Is(err, wal.ErrCompacted) {
		return status.Errorf(codes.OutOfRange, "from_lsn: LSN %d is no longer in %s's WAL (first LSN %d)", from, who, log.FirstLSN())
	}
	if err != nil {
		return status.Errorf(codes.Internal, "read wal from LSN %d: %v", from, err)
	}
	defer rd.Close()
	for {
		e, err := rd.Next(stream.Context())
		if err != nil {
			return status.FromContextError(err).Err()
		}
		var env walshipv1.WalBatch
		if err := envelope.Unmarshal(e.Data, &env); err != nil {
			return status.Errorf(codes.DataLoss, "%s: wal entry %d..%d: %v", who, e.FirstLSN, e.LastLSN, err)
		}
		if err := stream.Send(&walshipv1.ReadResponse{Batch: &env}); err != nil {
			return err
		}
		if e.LastLSN >= to {
			return nil
		}
	}
}
