package node

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	walshipv1 "github.com/walship/walship/gen/walship/v1"
	"github.com/walship/walship/internal/datadir"
	"github.com/walship/walship/internal/serve"
	"github.com/walship/walship/internal/testkit"
	"github.com/walship/walship/internal/vfs"
	"github.com/walship/walship/services/primary"
	"github.com/walship/walship/services/replica"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

const (
	clusterA = "0a0a0a0a-0a0a-4a0a-8a0a-0a0a0a0a0a0a"
	clusterB = "0b0b0b0b-0b0b-4b0b-8b0b-0b0b0b0b0b0b"
)

// loneReplica is a data node that starts as a replica of nobody (no
// members) with the log store ls, its data directory stamped with
// cluster ("" for none).
func loneReplica(t *testing.T, id, ls, cluster string) (*Node, walshipv1.AdminServiceClient) {
	t.Helper()
	dir := filepath.Join(t.TempDir(), id)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if cluster != "" {
		if err := datadir.SaveCluster(vfs.OS, dir, cluster); err != nil {
			t.Fatal(err)
		}
	}
	p := primary.DefaultConfig()
	p.HeartbeatInterval, p.LeaseTimeout, p.StopTimeout = 100*time.Millisecond, 300*time.Millisecond, 5*time.Second
	r := replica.DefaultConfig()
	r.HeartbeatInterval, r.StopTimeout = 100*time.Millisecond, 5*time.Second
	r.Primary = testkit.FreeAddr(t) // nobody: it follows no one until it promotes
	n, err := New(Config{ID: id, DataDir: dir, Listen: "127.0.0.1:0", LogStores: []string{ls}, Role: RoleReplica,
		Primary: p, Replica: r, Registry: serve.NewRegistry(), Logger: testLogger()})
	if err != nil {
		t.Fatal(err)
	}
	run(t, n.Run)
	conn, err := serve.Dialer{}.Dial(n.Addr())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return n, walshipv1.NewAdminServiceClient(conn)
}

// TestPromotionAcrossClusters: a candidate of cluster A whose log store
// belongs to cluster B is refused: the survey counts it for nothing and
// names both ids (nothing fenced), and a forced promotion's fence is
// refused by the log store itself, which changes nothing on disk. A node
// with no cluster id promoting with that log store joins cluster B: it
// fences as B and opens as B's primary.
func TestPromotionAcrossClusters(t *testing.T) {
	lsDir := t.TempDir()
	if err := os.MkdirAll(filepath.Join(lsDir, "ls"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := datadir.SaveCluster(vfs.OS, filepath.Join(lsDir, "ls"), clusterB); err != nil {
		t.Fatal(err)
	}
	ls := startLogStore(t, lsDir)
	vote := func() datadir.Vote {
		v, err := datadir.LoadVote(vfs.OS, filepath.Join(lsDir, "ls"))
		if err != nil {
			t.Fatal(err)
		}
		return v
	}

	_, admin := loneReplica(t, "a1", ls, clusterA)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, err := admin.Promote(ctx, &walshipv1.PromoteRequest{}, grpc.WaitForReady(true))
	if status.Code(err) != codes.FailedPrecondition || !contains(err.Error(), "nothing was fenced", "cluster id mismatch", ls+" belongs to cluster "+clusterB+", this node to cluster "+clusterA) {
		t.Fatalf("Promote of a candidate of another cluster = %v", err)
	}
	_, err = admin.Promote(ctx, &walshipv1.PromoteRequest{Force: true})
	if status.Code(err) != codes.FailedPrecondition || !contains(err.Error(), "this log store belongs to cluster "+clusterB+", the candidate a1 is of cluster "+clusterA) {
		t.Fatalf("forced Promote of a candidate of another cluster = %v", err)
	}
	if v := vote(); v.Epoch != 0 {
		t.Fatalf("the log store of another cluster promised %v", v)
	}

	b1, admin := loneReplica(t, "b1", ls, "")
	resp, err := admin.Promote(ctx, &walshipv1.PromoteRequest{}, grpc.WaitForReady(true))
	if err != nil {
		t.Fatal(err)
	}
	testkit.Until(t, "b1 to open as primary", func() bool { p := b1.Primary(); return p != nil && p.TakingWrites() })
	if st := b1.Primary().Status(); st.ClusterId != clusterB || st.Epoch != resp.Epoch {
		t.Fatalf("b1 after its promotion: cluster %q, epoch %d", st.ClusterId, st.Epoch)
	}
	if v := vote(); v.Epoch != resp.Epoch || v.Primary != "b1" {
		t.Fatalf("log store vote after b1's promotion: %v", v)
	}
}
