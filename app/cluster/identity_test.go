package cluster

import (
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"

	walshipv1 "github.com/walship/walship/gen/walship/v1"
	"github.com/walship/walship/internal/datadir"
	"github.com/walship/walship/internal/rpcerr"
	"github.com/walship/walship/internal/serve"
	"github.com/walship/walship/internal/testkit"
	"github.com/walship/walship/internal/vfs"
	"github.com/walship/walship/services/primary"
	"github.com/walship/walship/services/replica"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// TestNodesOfAnotherClusterAreRefused runs two clusters, A and B, each a
// log store, a primary and a replica. Each makes its own cluster id at
// bootstrap and every node of it adopts it. Then nodes of one are pointed
// at the other, and refused with FAILED_PRECONDITION naming both ids,
// changing nothing:
//   - a candidate of A fencing B's log store, replica and primary (B's
//     primary goes on taking writes);
//   - a replica of B started with A's primary as its primary: A's primary
//     refuses its hello; it neither follows nor promises anything, nor
//     writes anything A's primary has;
//   - A's primary, restarted with B's log store: it cannot win its epoch
//     and stops with FAILED_PRECONDITION naming both ids, and the log
//     store's data directory is byte for byte what it was.
func TestNodesOfAnotherClusterAreRefused(t *testing.T) {
	a := startCluster(t, Config{LogStores: 1, Replicas: 1})
	b := startCluster(t, Config{LogStores: 1, Replicas: 1})
	ctx := t.Context()
	for _, c := range []*Cluster{a, b} {
		if _, err := walshipv1.NewKVServiceClient(c.Conn(c.Primary)).Put(ctx, &walshipv1.PutRequest{Key: "k", Value: []byte(c.cfg.Dir)}); err != nil {
			t.Fatal(err)
		}
		waitConverged(t, c)
	}
	idA, idB := clusterID(t, a), clusterID(t, b)
	if idA == idB {
		t.Fatalf("two clusters made the same id %s", idA)
	}

	// A candidate of A fences B's nodes.
	bVote := logStoreStatus(t, b, 0).VoteEpoch
	for _, n := range []*Node{b.LogStores[0], b.Replicas[0], b.Primary} {
		_, err := walshipv1.NewEpochServiceClient(b.Conn(n)).Fence(ctx, &walshipv1.FenceRequest{Epoch: bVote + 10, CandidateId: "replica-0",
			CandidateAddr: a.Replicas[0].Addr, ClusterId: idA})
		wantMismatch(t, n.Name+" fenced by a candidate of another cluster", err, idB, idA, "the candidate replica-0 is of cluster "+idA)
	}
	if st := logStoreStatus(t, b, 0); st.VoteEpoch != bVote {
		t.Fatalf("B's log store promised epoch %d to a candidate of A", st.VoteEpoch)
	}
	if _, err := walshipv1.NewKVServiceClient(b.Conn(b.Primary)).Put(ctx, &walshipv1.PutRequest{Key: "still", Value: []byte("B")}); err != nil {
		t.Fatalf("B's primary after refusing a candidate of A: %v", err)
	}
	waitConverged(t, b)

	// A replica of B pointed at A's primary: a data directory of B's that
	// holds no vote (one that does follows its vote's primary, whatever
	// --primary says), as a new node of B's configured with A's address.
	bReplicaDir := t.TempDir()
	if err := datadir.SaveCluster(vfs.OS, bReplicaDir, idB); err != nil {
		t.Fatal(err)
	}
	var vote datadir.Vote
	refusedBy := metric(t, a.Primary.Registry, "walship_cluster_mismatch_total", nil)
	rc := replica.DefaultConfig()
	rc.ID, rc.DataDir, rc.Primary = "replica-9", bReplicaDir, a.Primary.Addr
	rc.Listen, rc.MetricsListen, rc.Registry = "127.0.0.1:0", "", serve.NewRegistry()
	rc.HeartbeatInterval, rc.StopTimeout = 100*time.Millisecond, 5*time.Second
	rs, err := replica.New(rc)
	if err != nil {
		t.Fatal(err)
	}
	rctx, stopReplica := context.WithCancel(context.Background())
	rdone := make(chan error, 1)
	go func() { rdone <- rs.Run(rctx) }()
	testkit.Until(t, "A's primary to refuse B's replica", func() bool {
		return metric(t, a.Primary.Registry, "walship_cluster_mismatch_total", nil) > refusedBy &&
			metric(t, rc.Registry, "walship_cluster_mismatch_total", nil) > 0
	})
	if st := rs.Status(); st.ClusterId != idB || st.VoteEpoch != vote.Epoch || st.Primary != a.Primary.Addr || st.Peers[0].Connected || st.LastLsn != 0 {
		t.Fatalf("B's replica pointed at A's primary: %v", st)
	}
	for _, p := range a.PrimaryServer().Status().GetPeers() {
		if p.GetId() == "replica-9" {
			t.Fatalf("A's primary counts B's replica as a peer: %v", p)
		}
	}
	stopReplica()
	if err := <-rdone; err != nil {
		t.Fatal(err)
	}
	if after, err := datadir.LoadVote(vfs.OS, bReplicaDir); err != nil || after != vote {
		t.Fatalf("B's replica's vote went from %v to %v (%v)", vote, after, err)
	}

	// A's primary, pointed at B's log store.
	if err := b.StopNode(b.Primary); err != nil {
		t.Fatal(err)
	}
	if err := a.StopNode(a.Primary); err != nil {
		t.Fatal(err)
	}
	lsDir := filepath.Join(b.cfg.Dir, "logstore-0")
	before := testkit.DirContents(t, lsDir)
	aDir := filepath.Join(a.cfg.Dir, "primary")
	aHistory, err := datadir.LoadHistory(vfs.OS, aDir)
	if err != nil {
		t.Fatal(err)
	}
	pc := primary.DefaultConfig()
	pc.ID, pc.DataDir, pc.LogStores = "primary", aDir, []string{b.LogStores[0].Addr}
	pc.Listen, pc.MetricsListen, pc.Registry, pc.StopTimeout = "127.0.0.1:0", "", serve.NewRegistry(), 5*time.Second
	ps, err := primary.New(pc)
	if err != nil {
		t.Fatal(err)
	}
	pctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	err = ps.Run(pctx)
	if rpcerr.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), "this log store belongs to cluster "+idB+", the candidate primary is of cluster "+idA) {
		t.Fatalf("A's primary with B's log store: Run = %v; want FAILED_PRECONDITION naming both ids", err)
	}
	if h, err := datadir.LoadHistory(vfs.OS, aDir); err != nil || len(h) != len(aHistory) {
		t.Fatalf("A's primary saved an epoch it did not win: %v (was %v), %v", h, aHistory, err)
	}
	testkit.SameContents(t, "B's log store, refusing A's primary,", testkit.DirContents(t, lsDir), before)
}

// clusterID is the id c's primary reports, once every node reports it.
func clusterID(t *testing.T, c *Cluster) string {
	t.Helper()
	st, err := c.Status(t.Context(), c.Primary)
	if err != nil {
		t.Fatal(err)
	}
	id := st.ClusterId
	if err := datadir.ValidateClusterID(id); err != nil {
		t.Fatal(err)
	}
	for _, n := range c.Nodes() {
		testkit.Until(t, n.Name+" to join the cluster", func() bool {
			st, err := c.Status(t.Context(), n)
			return err == nil && st.ClusterId == id
		})
		if got, err := datadir.LoadCluster(vfs.OS, filepath.Join(c.cfg.Dir, n.Name)); err != nil || got != id {
			t.Fatalf("%s's cluster file holds %q (%v), want %s", n.Name, got, err, id)
		}
	}
	return id
}

// wantMismatch checks err is a cluster mismatch refusal, FAILED_PRECONDITION
// naming both ids.
func wantMismatch(t *testing.T, what string, err error, refuser, refused string, subs ...string) {
	t.Helper()
	ours, theirs, ok := rpcerr.ClusterIDs(err)
	if status.Code(err) != codes.FailedPrecondition || !ok || ours != refuser || theirs != refused {
		t.Fatalf("%s: %v; want FAILED_PRECONDITION refusing %s as of %s", what, err, refused, refuser)
	}
	msg := status.Convert(err).Message()
	for _, s := range append(subs, "cluster id mismatch", refuser, refused) {
		if !strings.Contains(msg, s) {
			t.Fatalf("%s: %q does not mention %q", what, msg, s)
		}
	}
}
