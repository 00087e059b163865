package replica

import (
	"testing"

	walshipv1 "github.com/walship/walship/gen/walship/v1"
	"github.com/walship/walship/internal/datadir"
	"github.com/walship/walship/internal/keyspace"
	"github.com/walship/walship/internal/vfs"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
)

// TestContractLogStoresNameThePrimary replays, with real gRPC, what the
// simulation found (internal/failover TestSimLogStoresSeed154153): a
// run-time change replaced most of the log stores the replica's
// --logstore flags name; the removed ones, which no primary ships to any
// more, keep naming a candidate that lost epoch 2, and the replica holds
// that loser's promise. Asking its flags' log stores, it never finds a
// majority naming the winner; asking those of the contract in its log, it
// does, and follows the winner.
func TestContractLogStoresNameThePrimary(t *testing.T) {
	for _, tc := range []struct {
		name string
		// contract is the contract of the log's epoch record, over the
		// addresses of log stores l0..l4.
		contract func(l []string) *walshipv1.Contract
	}{
		{"a finished change: l1 and l2 replaced by l3 and l4", func(l []string) *walshipv1.Contract {
			return &walshipv1.Contract{MembersChanged: true, Logstores: []string{l[0], l[3], l[4]}}
		}},
		{"a joint change: l2 being replaced by l4, after l1 by l3", func(l []string) *walshipv1.Contract {
			return &walshipv1.Contract{Logstores: []string{l[0], l[3], l[2]},
				Next: &walshipv1.Configuration{Logstores: []string{l[0], l[3], l[4]}}}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			winner := newFakePrimary(t)
			loserAddr := listen(t, func(g *grpc.Server) { walshipv1.RegisterReplicationServiceServer(g, unavailablePrimary{}) })
			won := datadir.Vote{Epoch: 2, Primary: "n1", Addr: winner.addr}
			lost := datadir.Vote{Epoch: 2, Primary: "n0", Addr: loserAddr}
			var addrs []string
			for i := range 5 {
				v := won
				if i == 1 || i == 2 {
					v = lost // removed: the loser fenced them, no primary ships to them
				}
				ls := &namingLogStore{vote: v}
				addrs = append(addrs, listen(t, func(g *grpc.Server) { walshipv1.RegisterLogStoreServiceServer(g, ls) }))
			}

			// Epoch 1's primary writes the change's record.
			old := newFakePrimary(t)
			dir := t.TempDir()
			cfg := testConfig(t, dir, old.addr)
			r := start(t, cfg)
			m := newModel(t)
			rec := &walshipv1.EpochRecord{Epoch: 1, FirstLsn: 1, PrimaryId: "p", Contract: tc.contract(addrs)}
			rec.Contract.SyncReplicas = 1
			rec.Contract.Members = []*walshipv1.Member{{Id: "n0", Addr: loserAddr}, {Id: "n1", Addr: winner.addr}, {Id: "r1", Addr: "r1:1"}}
			data, err := proto.Marshal(rec)
			if err != nil {
				t.Fatal(err)
			}
			b := m.txn(put(keyspace.EpochRecordKey, string(data)))
			sess := old.next(t)
			sess.send(t, b)
			r.waitApplied(t, b.LastLsn)
			sess.end <- nil
			if err := r.stop(t); err != nil {
				t.Fatal(err)
			}

			// It holds the loser's promise of epoch 2, its flags naming the
			// log stores of before the change.
			if err := datadir.SaveVote(vfs.OS, dir, lost); err != nil {
				t.Fatal(err)
			}
			cfg.Primary = loserAddr
			cfg.LogStores = addrs[:3]
			start(t, cfg)
			if s := winner.next(t); s.hello.GetFencedEpoch() != won.Epoch {
				t.Fatalf("hello to the winner: %v", s.hello)
			}
			if v, err := datadir.LoadVote(vfs.OS, dir); err != nil || v != won {
				t.Fatalf("vote %v, %v; want %v", v, err, won)
			}
		})
	}
}

// TestLogStoreRungReadsTheContractsLogStores: once a run-time change
// moved the log stores, the log store rung reads from the contract's, not
// from a removed one its flags still name.
func TestLogStoreRungReadsTheContractsLogStores(t *testing.T) {
	fp := newFakePrimary(t)
	m := newModel(t)
	var b1, b2, b3 *walshipv1.WalBatch
	moved := newFakeLogStore(t, func(req *walshipv1.ReadRequest, st grpc.ServerStreamingServer[walshipv1.ReadResponse]) error {
		for _, b := range []*walshipv1.WalBatch{b1, b2, b3} {
			if b.LastLsn >= req.GetFromLsn() {
				if err := st.Send(&walshipv1.ReadResponse{Batch: b}); err != nil {
					return err
				}
			}
		}
		return nil
	})
	removed := newFakeLogStore(t, func(req *walshipv1.ReadRequest, _ grpc.ServerStreamingServer[walshipv1.ReadResponse]) error {
		return status.Errorf(codes.OutOfRange, "LSN %d is no longer kept", req.GetFromLsn())
	})
	rec := &walshipv1.EpochRecord{Epoch: 1, FirstLsn: 1, PrimaryId: "p", Contract: &walshipv1.Contract{MembersChanged: true,
		Members: []*walshipv1.Member{{Id: "p", Addr: fp.addr}, {Id: "r1", Addr: "r1:1"}}, Logstores: []string{moved.addr}}}
	data, err := proto.Marshal(rec)
	if err != nil {
		t.Fatal(err)
	}
	b1, b2, b3 = m.txn(put(keyspace.EpochRecordKey, string(data))), m.txn(put("b", "2")), m.txn(put("c", "3"))
	for _, ls := range []*fakeLogStore{moved, removed} {
		ls.durable.Store(b3.LastLsn)
	}
	removed.first.Store(b3.FirstLsn)
	cfg := testConfig(t, t.TempDir(), fp.addr)
	cfg.LogStores = []string{removed.addr}
	r := start(t, cfg)
	sess := fp.next(t)
	sess.send(t, b1)
	r.waitApplied(t, b1.LastLsn)
	sess.end <- status.Error(codes.OutOfRange, "gone")
	again := fp.next(t)
	if again.hello.GetNextLsn() != b3.LastLsn+1 {
		t.Fatalf("back at the primary from LSN %d; want %d (the contract's log store read through LSN %d)", again.hello.GetNextLsn(), b3.LastLsn+1, b3.LastLsn)
	}
	r.waitApplied(t, b3.LastLsn)
	if n := len(removed.reads); n != 0 {
		t.Errorf("%d reads from the removed log store", n)
	}
}
