package replica

import (
	"fmt"
	"strings"
	"testing"

	walshipv1 "github.com/walship/walship/gen/walship/v1"
	"github.com/walship/walship/internal/keyspace"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
)

// TestLogStoreCatchUpPacedForALearner: with --learner-bytes-per-second
// set, a node whose newest contract names members and not it (a learner)
// reads its gap from a log store at that pace; a member, or a node under
// a contract without members (every replica counts), reads it unpaced.
// Both catch up.
func TestLogStoreCatchUpPacedForALearner(t *testing.T) {
	for _, tc := range []struct {
		name    string
		members []string
		paced   bool
	}{
		{"learner", []string{"p", "r2"}, true},
		{"member", []string{"p", "r1"}, false},
		{"no members", nil, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := newModel(t)
			rec := &walshipv1.EpochRecord{Epoch: 1, FirstLsn: 1, PrimaryId: "p", Contract: &walshipv1.Contract{SyncReplicas: 1}}
			for _, id := range tc.members {
				rec.Contract.Members = append(rec.Contract.Members, &walshipv1.Member{Id: id, Addr: id + ":1"})
			}
			data, err := proto.Marshal(rec)
			if err != nil {
				t.Fatal(err)
			}
			first := m.txn(put(keyspace.EpochRecordKey, string(data)))
			// About a second and a half at 1 MiB/s, past the burst (a
			// tenth of a second).
			var gap []*walshipv1.WalBatch
			for i := range 24 {
				gap = append(gap, m.txn(put(fmt.Sprintf("k%02d", i), strings.Repeat("v", 64<<10))))
			}
			last := gap[len(gap)-1].LastLsn
			ls := newFakeLogStore(t, func(req *walshipv1.ReadRequest, st grpc.ServerStreamingServer[walshipv1.ReadResponse]) error {
				for _, b := range gap {
					if b.LastLsn >= req.GetFromLsn() {
						if err := st.Send(&walshipv1.ReadResponse{Batch: b}); err != nil {
							return err
						}
					}
				}
				return nil
			})
			ls.durable.Store(last)
			fp := newFakePrimary(t)
			cfg := testConfig(t, t.TempDir(), fp.addr)
			cfg.LogStores = []string{ls.addr}
			cfg.LearnerBytesPerSecond = 1 << 20
			r := start(t, cfg)
			sess := fp.next(t)
			sess.send(t, first)
			r.waitApplied(t, first.LastLsn)
			sess.end <- status.Error(codes.OutOfRange, "gone")
			again := fp.next(t)
			if again.hello.GetNextLsn() != last+1 {
				t.Fatalf("back at the primary from LSN %d; want %d (the log store rung read through LSN %d)", again.hello.GetNextLsn(), last+1, last)
			}
			r.waitApplied(t, last)
			if got := r.metric(t, "walship_replica_catchup_paced_seconds_total"); (got > 0) != tc.paced {
				t.Fatalf("paced %v s reading the gap, want paced %v", got, tc.paced)
			}
		})
	}
}
