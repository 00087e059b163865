package primary

import (
	"errors"
	"math"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	walshipv1 "github.com/walship/walship/gen/walship/v1"
	"github.com/walship/walship/internal/datadir"
	"github.com/walship/walship/internal/vfs"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// TestFencedPrimaryStepsDown: a candidate's fence of a newer epoch is
// granted by the primary with the end of its (synced) log; the primary
// steps down at once — later writes fail UNAVAILABLE, Run returns a
// DeposedError naming the candidate, and the vote is saved so that a
// restart knows. A fence of its own epoch or older is refused.
func TestFencedPrimaryStepsDown(t *testing.T) {
	dir := t.TempDir()
	cfg := testConfig(t, dir)
	reg := prometheus.NewRegistry()
	cfg.Registry = reg
	r := start(t, cfg)
	c := ctx(t)
	put, err := r.kv.Put(c, &walshipv1.PutRequest{Key: "k", Value: []byte("v")})
	if err != nil {
		t.Fatal(err)
	}
	fence := walshipv1.NewEpochServiceClient(r.conn)
	id := r.s.cluster.ID()
	if resp, err := fence.Fence(c, &walshipv1.FenceRequest{Epoch: r.s.epoch, CandidateId: "c1", CandidateAddr: "x:1", ClusterId: id}); err != nil || resp.Granted {
		t.Fatalf("fence of the primary's own epoch = %v, %v", resp, err)
	}
	// An epoch above the maximum is a bad argument: the primary keeps
	// serving (the epoch after it would wrap to 0).
	if resp, err := fence.Fence(c, &walshipv1.FenceRequest{Epoch: math.MaxUint64, CandidateId: "c1", CandidateAddr: "x:1", ClusterId: id}); status.Code(err) != codes.InvalidArgument ||
		!strings.Contains(status.Convert(err).Message(), "epoch: 18446744073709551615 is above the highest epoch") {
		t.Fatalf("fence of epoch 2^64-1 = %v, %v; want INVALID_ARGUMENT naming epoch", resp, err)
	}
	resp, err := fence.Fence(c, &walshipv1.FenceRequest{Epoch: r.s.epoch + 1, CandidateId: "c1", CandidateAddr: "10.0.0.9:7401", ClusterId: id})
	if err != nil {
		t.Fatal(err)
	}
	if !resp.Granted || !resp.Primary || resp.LastLsn != put.Lsn || resp.LastEpoch != r.s.epoch || len(resp.History) == 0 {
		t.Fatalf("fence = %v", resp)
	}
	// An operator sees the grant: the refused fence does not count.
	if n, err := testutil.GatherAndCount(reg, "walship_fences_granted_total"); err != nil || n != 1 {
		t.Fatalf("walship_fences_granted_total exported %d times, %v", n, err)
	}
	if v := testutil.ToFloat64(r.s.metrics.fences); v != 1 {
		t.Fatalf("walship_fences_granted_total = %v after one granted fence, want 1", v)
	}
	_, err = r.kv.Put(c, &walshipv1.PutRequest{Key: "k", Value: []byte("w")})
	if status.Code(err) != codes.Unavailable {
		t.Fatalf("Put after stepping down = %v; want UNAVAILABLE", err)
	}
	_, err = r.kv.Get(c, &walshipv1.GetRequest{Key: "k"})
	if status.Code(err) != codes.Unavailable {
		t.Fatalf("Get after stepping down = %v; want UNAVAILABLE", err)
	}
	var deposed *DeposedError
	if err := r.failed(t, "the fence"); !errors.As(err, &deposed) || deposed.Vote.Primary != "c1" || deposed.Vote.Addr != "10.0.0.9:7401" {
		t.Fatalf("Run = %v; want a DeposedError naming c1", err)
	}
	if v, err := datadir.LoadVote(vfs.OS, dir); err != nil || v.Primary != "c1" || v.Epoch != resp.Epoch {
		t.Fatalf("vote after stepping down: %v, %v", v, err)
	}
}
