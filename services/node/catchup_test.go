package node

import (
	"net"
	"path/filepath"
	"sync/atomic"
	"testing"

	walshipv1 "github.com/walship/walship/gen/walship/v1"
	"github.com/walship/walship/internal/envelope"
	"github.com/walship/walship/internal/serve"
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

// donorBatch is a batch of LSNs first..first+1 of epoch 1 holding recs
// (one whole transaction when recs is nil), its CRC right.
func donorBatch(t *testing.T, first uint64, recs []codec.Record) *walshipv1.WalBatch {
	t.Helper()
	b := codec.Batch{Records: recs}
	if recs == nil {
		b.Records = []codec.Record{{LSN: first, TxnID: 1, Op: codec.OpPut, Key: []byte("k"), Value: []byte("v")}, {LSN: first + 1, TxnID: 1, Op: codec.OpCommit}}
	}
	payload, err := codec.MsgPack.AppendBatch(nil, &b)
	if err != nil {
		t.Fatal(err)
	}
	return &walshipv1.WalBatch{Epoch: 1, FirstLsn: first, LastLsn: first + 1, PrevLsn: first - 1,
		Codec: walshipv1.Codec(codec.MsgPack.ID()), Payload: payload, Crc32C: codec.Checksum(payload)}
}

// serveDonor serves d's Read on a loopback address.
func serveDonor(t *testing.T, d *flakyDonor) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	g := grpc.NewServer()
	walshipv1.RegisterLogStoreServiceServer(g, d)
	go func() { _ = g.Serve(l) }()
	t.Cleanup(g.Stop)
	return l.Addr().String()
}

// TestCatchUpWaitsOutADonorRestarting: a promotion's catch-up retries a
// donor that is UNAVAILABLE for a moment, and copies its whole log.
func TestCatchUpWaitsOutADonorRestarting(t *testing.T) {
	d := &flakyDonor{}
	for i := range uint64(5) {
		d.batches = append(d.batches, donorBatch(t, 2*i+1, nil))
	}
	d.fail.Store(2)
	addr := serveDonor(t, d)
	log, err := wal.Open(wal.Options{Dir: filepath.Join(t.TempDir(), "wal")})
	if err != nil {
		t.Fatal(err)
	}
	defer log.Close()
	records, _, err := copyFromRetrying(t.Context(), serve.Dialer{}, addr, true, log, 10, 1, 2, "", nil)
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

// TestCatchUpChecksWholeTransactions: a candidate copies a donor's
// batches with the check a replica's catch-up runs
// (failover.CheckDonorBatch): one whose CRC matches but that a replica
// could never apply — a record of one transaction inside another's, or
// a payload that does not hold the envelope's LSNs — is refused, not
// stored to be fatal at every apply of the new primary's log.
func TestCatchUpChecksWholeTransactions(t *testing.T) {
	for _, tc := range []struct {
		name string
		bad  []codec.Record
	}{
		{"a transaction inside another's", []codec.Record{{LSN: 5, TxnID: 2, Op: codec.OpPut, Key: []byte("k"), Value: []byte("v")}, {LSN: 6, TxnID: 3, Op: codec.OpCommit}}},
		{"no commit at the end", []codec.Record{{LSN: 5, TxnID: 2, Op: codec.OpPut, Key: []byte("k"), Value: []byte("v")}, {LSN: 6, TxnID: 2, Op: codec.OpPut, Key: []byte("j"), Value: []byte("w")}}},
		{"LSNs other than the envelope's", []codec.Record{{LSN: 7, TxnID: 2, Op: codec.OpPut, Key: []byte("k"), Value: []byte("v")}, {LSN: 8, TxnID: 2, Op: codec.OpCommit}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			d := &flakyDonor{batches: []*walshipv1.WalBatch{donorBatch(t, 1, nil), donorBatch(t, 3, nil), donorBatch(t, 5, tc.bad), donorBatch(t, 7, nil)}}
			addr := serveDonor(t, d)
			log, err := wal.Open(wal.Options{Dir: filepath.Join(t.TempDir(), "wal")})
			if err != nil {
				t.Fatal(err)
			}
			defer log.Close()
			records, _, err := copyFromRetrying(t.Context(), serve.Dialer{}, addr, true, log, 8, 1, 2, "", nil)
			if err == nil || records != 4 || log.LastLSN() != 4 {
				t.Fatalf("catch-up: %d records, log at LSN %d, %v; want the 4 records before the bad batch and an error", records, log.LastLSN(), err)
			}
		})
	}
}
