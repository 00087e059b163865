package node

import (
	"context"
	"strings"
	"testing"
	"time"

	walshipv1 "github.com/walship/walship/gen/walship/v1"
	"github.com/walship/walship/internal/serve"
	"github.com/walship/walship/internal/testkit"
	"google.golang.org/grpc"
)

// TestPromotionAfterOneThatGaveUp: three data nodes and a log store,
// contract K=1 at flush. The primary n0 stops for good; n1 promotes,
// fences the log store, n2 and itself, and gives up before it opens (here
// its fences are sent by hand: a catch-up that failed, a newer fence, a
// contract that leaves it out all end so). Every promise now names n1 as
// the primary of an epoch with no entries. n2's promotion needs N−k+1 =
// 2 of the members other than the primary it replaces: taken from its own
// promise (n1), that was n0 — down — and n2, and it was refused (the
// Known limit of docs/ARCHITECTURE.md); from the answers' log primary
// (log_primary_id: n0, the primary of epoch 1, whose entries are the
// newest), it is n1 and n2, and n2 opens and takes writes.
func TestPromotionAfterOneThatGaveUp(t *testing.T) {
	c := newCluster(t)
	c0, c1, c2 := c.conn(t, "n0"), c.conn(t, "n1"), c.conn(t, "n2")
	put(t, c0, "k", "v")
	st0 := status1(t, c0)
	cluster, epoch, top := st0.GetClusterId(), st0.GetEpoch(), st0.GetVisibleLsn()
	testkit.Until(t, "n1 and n2 to follow n0 up to its write", func() bool {
		for _, cc := range []*grpc.ClientConn{c1, c2} {
			if st := status1(t, cc); st.GetPrimary() != c.nodes["n0"].Addr() || st.GetVisibleLsn() < top {
				return false
			}
		}
		return true
	})
	if err := c.runs["n0"].stop(t); err != nil {
		t.Fatalf("n0 stop: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	ls, err := serve.Dialer{}.Dial(c.ls)
	if err != nil {
		t.Fatal(err)
	}
	defer ls.Close()
	fence := &walshipv1.FenceRequest{Epoch: epoch + 1, CandidateId: "n1", CandidateAddr: c.nodes["n1"].Addr(), ClusterId: cluster}
	for _, cc := range []*grpc.ClientConn{ls, c1, c2} {
		f, err := walshipv1.NewEpochServiceClient(cc).Fence(ctx, fence, grpc.WaitForReady(true))
		if err != nil || !f.GetGranted() {
			t.Fatalf("n1's fence of epoch %d at %s: %v, %v", epoch+1, cc.Target(), f, err)
		}
		if f.GetLogPrimaryId() != "n0" {
			t.Fatalf("n1's fence of epoch %d at %s names %q as the primary of the log's epoch, want n0", epoch+1, cc.Target(), f.GetLogPrimaryId())
		}
	}
	if st := status1(t, c2); st.GetVoteEpoch() != epoch+1 || st.GetPrimaryId() != "n1" || st.GetLogPrimaryId() != "n0" {
		t.Fatalf("n2 after n1's fence: vote epoch %d for %q, log primary %q", st.GetVoteEpoch(), st.GetPrimaryId(), st.GetLogPrimaryId())
	}
	resp, err := walshipv1.NewAdminServiceClient(c2).Promote(ctx, &walshipv1.PromoteRequest{})
	if err != nil {
		t.Fatalf("n2's promotion after n1's gave up: %v", err)
	}
	if resp.GetEpoch() != epoch+2 || resp.GetTimeline().GetPreviousPrimary() != "n0" {
		t.Fatalf("n2's promotion: epoch %d (want %d), replacing %q (want n0)", resp.GetEpoch(), epoch+2, resp.GetTimeline().GetPreviousPrimary())
	}
	testkit.Until(t, "n2 to open as the primary", func() bool { return c.nodes["n2"].Role() == RolePrimary })
	if lsn := put(t, c2, "k2", "v2"); lsn <= top {
		t.Fatalf("write on n2 at LSN %d, not past %d", lsn, top)
	}
	if st := status1(t, c2); !strings.Contains(st.GetRole().String(), "PRIMARY") {
		t.Fatalf("n2's role: %v", st.GetRole())
	}
}
