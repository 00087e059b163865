package node

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	walshipv1 "github.com/walship/walship/gen/walship/v1"
	"github.com/walship/walship/internal/serve"
	"github.com/walship/walship/internal/testkit"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// TestPromotionAfterACandidateThatDied: three data nodes and a log store,
// contract K=1 at flush. n2 promotes, fences the log store, n0 (the
// primary, which steps down) and n1, and dies before it opens (its fences
// are sent by hand; n2 is stopped for good). Every promise now names n2
// for an epoch with no entries, and every log ends in epoch 1, whose
// primary n0 is alive. n1's promotion replaces n0 (log_primary_id): it
// needs N−k+1 = 2 of n1 and n2, and n2 is dead — the dual of
// TestPromotionAfterOneThatGaveUp, which the rule of the own promise
// (n2) passed. Any one member may be excluded while the primary that
// acknowledged holds its commits, so a promotion that has no quorum
// excluding the log's primary excludes a member that did not answer
// instead: n2 here, and n1 promotes with n0's and its own promises.
func TestPromotionAfterACandidateThatDied(t *testing.T) {
	c := newCluster(t)
	c0, c1 := c.conn(t, "n0"), c.conn(t, "n1")
	put(t, c0, "k", "v")
	st0 := status1(t, c0)
	cluster, epoch, top := st0.GetClusterId(), st0.GetEpoch(), st0.GetVisibleLsn()
	testkit.Until(t, "n1 to follow n0 up to its write", func() bool {
		st := status1(t, c1)
		return st.GetPrimary() == c.nodes["n0"].Addr() && st.GetVisibleLsn() >= top
	})
	if err := c.runs["n2"].stop(t); err != nil {
		t.Fatalf("n2 stop: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	ls, err := serve.Dialer{}.Dial(c.ls)
	if err != nil {
		t.Fatal(err)
	}
	defer ls.Close()
	fence := &walshipv1.FenceRequest{Epoch: epoch + 1, CandidateId: "n2", CandidateAddr: c.nodes["n2"].Addr(), ClusterId: cluster}
	for _, cc := range []*grpc.ClientConn{ls, c0, c1} {
		f, err := walshipv1.NewEpochServiceClient(cc).Fence(ctx, fence, grpc.WaitForReady(true))
		if err != nil || !f.GetGranted() {
			t.Fatalf("n2's fence of epoch %d at %s: %v, %v", epoch+1, cc.Target(), f, err)
		}
	}
	testkit.Until(t, "n0 to step down", func() bool { return c.nodes["n0"].Role() == RoleReplica })
	if st := status1(t, c1); st.GetVoteEpoch() != epoch+1 || st.GetPrimaryId() != "n2" || st.GetLogPrimaryId() != "n0" {
		t.Fatalf("n1 after n2's fence: vote epoch %d for %q, log primary %q", st.GetVoteEpoch(), st.GetPrimaryId(), st.GetLogPrimaryId())
	}
	resp, err := walshipv1.NewAdminServiceClient(c1).Promote(ctx, &walshipv1.PromoteRequest{})
	if err != nil {
		t.Fatalf("n1's promotion after n2 fenced everyone and died: %v", err)
	}
	if resp.GetEpoch() != epoch+2 {
		t.Fatalf("n1's promotion: epoch %d, want %d", resp.GetEpoch(), epoch+2)
	}
	testkit.Until(t, "n1 to open as the primary", func() bool { return c.nodes["n1"].Role() == RolePrimary })
	if lsn := put(t, c1, "k2", "v2"); lsn <= top {
		t.Fatalf("write on n1 at LSN %d, not past %d", lsn, top)
	}
}

// TestNoExclusionPastAPrimaryThatLostItsLog: the exclusion of a member
// that did not answer rests on the primary that acknowledged holding its
// writes. n2 is down while n0, the primary, writes k, acknowledged by n1
// alone (K=1). Then n0's machine is replaced (its data directory empty,
// as the runbook's "replace its machine" does, same --id) and n1 stops.
// n2 promotes: excluding n0, the log's primary, it needs n1, which is
// down; excluding n1 instead would count n0's promise — a log that lost
// k — and n2 would open without k. It must be refused: the replaced
// primary's own answer does not reach the newest log epoch answered.
func TestNoExclusionPastAPrimaryThatLostItsLog(t *testing.T) {
	c := newCluster(t)
	c0 := c.conn(t, "n0")
	c1 := c.conn(t, "n1")
	put(t, c0, "k0", "v0")
	if err := c.runs["n2"].stop(t); err != nil {
		t.Fatalf("n2 stop: %v", err)
	}
	top := put(t, c0, "k", "v")
	testkit.Until(t, "n1 to hold k", func() bool { return status1(t, c1).GetVisibleLsn() >= top })
	for _, id := range []string{"n0", "n1"} {
		if err := c.runs[id].stop(t); err != nil {
			t.Fatalf("%s stop: %v", id, err)
		}
	}
	if err := os.RemoveAll(filepath.Join(c.dir, "n0")); err != nil {
		t.Fatal(err)
	}
	c.start(t, "n0", RoleReplica)
	c.start(t, "n2", RoleReplica)
	c2 := c.conn(t, "n2")
	status1(t, c.conn(t, "n0"))
	status1(t, c2)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	resp, err := walshipv1.NewAdminServiceClient(c2).Promote(ctx, &walshipv1.PromoteRequest{})
	if status.Code(err) != codes.FailedPrecondition {
		t.Fatalf("n2's promotion with n1, the only holder of LSN %d, down and n0's log lost: %v, %v; want FailedPrecondition", top, resp, err)
	}
	t.Logf("refused: %v", err)
}
