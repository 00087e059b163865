package node

import (
	"net"
	"path/filepath"
	"sync/atomic"
	"testing"

	walshipv1 "github.com/walship/walship/gen/walship/v1"
	"github.com/walship/walship/internal/envelope"
	"github.com/walship/walship/internal/wal"
	"github.com/walship/walship/pkg/codec"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// flakyDonor serves a log's Read, but fails the first calls UNAVAILABLE,
// as a node restarting its server (changing role) is for a moment.
type flakyDonor struct {
	walshipv1.UnimplementedLogStoreServiceServer
	batches []*walshipv1.WalBatch
	fail    atomic.Int32
	calls   atomic.Int32
}

func (d *flakyDonor) Read(req *walshipv1.ReadRequest, st grpc.ServerStreamingServer[walshipv1.ReadResponse]) error {
	d.calls.Add(1)
	if d.fail.Add(-1) >= 0 {
		return status.Error(codes.Unavailable, "restarting")
	}
	for _, b := range d.batches {
		if b.LastLsn >= req.FromLsn {
			if err := st.Send(&walshipv1.ReadResponse{Batch: b}); err != nil {
				return err
			}
		}
	}
	return nil
}

// TestCatchUpWaitsOutADonorRestarting: a promotion's catch-up retries a
// donor that is UNAVAILABLE for a moment, and copies its whole log.
func TestCatchUpWaitsOutADonorRestarting(t *testing.T) {
	d := &flakyDonor{}
	for i := range uint64(5) {
		var b codec.Batch
		b.Records = []codec.Record{{LSN: 2*i + 1, TxnID: 1, Op: codec.OpPut, Key: []byte("k"), Value: []byte("v")}, {LSN: 2*i + 2, TxnID: 1, Op: codec.OpCommit}}
		payload, err := codec.MsgPack.AppendBatch(nil, &b)
		if err != nil {
			t.Fatal(err)
		}
		d.batches = append(d.batches, &walshipv1.WalBatch{Epoch: 1, FirstLsn: 2*i + 1, LastLsn: 2*i + 2, PrevLsn: 2 * i,
			Codec: walshipv1.Codec(codec.MsgPack.ID()), Payload: payload, Crc32C: codec.Checksum(payload)})
	}
	d.fail.Store(2)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	g := grpc.NewServer()
	walshipv1.RegisterLogStoreServiceServer(g, d)
	go func() { _ = g.Serve(l) }()
	defer g.Stop()
	log, err := wal.Open(wal.Options{Dir: filepath.Join(t.TempDir(), "wal")})
	if err != nil {
		t.Fatal(err)
	}
	defer log.Close()
	records, _, err := copyFromRetrying(t.Context(), l.Addr().String(), true, log, 10, 1, 2, "")
	if err != nil || records != 10 || log.LastLSN() != 10 || d.calls.Load() != 3 {
		t.Fatalf("catch-up: %d records, log at LSN %d, %d calls, %v; want 10 records after 2 refusals", records, log.LastLSN(), d.calls.Load(), err)
	}
	var env walshipv1.WalBatch
	var b codec.Batch
	rd, err := log.NewReader(9, false)
	if err != nil {
		t.Fatal(err)
	}
	defer rd.Close()
	e, err := rd.Next(t.Context())
	if err != nil || envelope.DecodeStored(e.Data, &env, &b) != nil || env.LastLsn != 10 {
		t.Fatalf("the copied log's last batch: %v, %v", &env, err)
	}
}
