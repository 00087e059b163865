package logstore

import (
	"testing"
	"time"

	walshipv1 "github.com/walship/walship/gen/walship/v1"
	"github.com/walship/walship/internal/datadir"
	"github.com/walship/walship/internal/testkit"
	"github.com/walship/walship/internal/vfs"
	"google.golang.org/grpc/codes"
)

const (
	clusterA = "0a0a0a0a-0a0a-4a0a-8a0a-0a0a0a0a0a0a"
	clusterB = "0b0b0b0b-0b0b-4b0b-8b0b-0b0b0b0b0b0b"
)

// beat sends a heartbeat of epoch from a primary of cluster.
func (a *appender) beat(epoch uint64, cluster string) {
	a.t.Helper()
	hb := &walshipv1.Heartbeat{Epoch: epoch, TimeUnixNano: time.Now().UnixNano(), ReplyRequested: true, PrimaryId: "p", PrimaryAddr: "p:1", ClusterId: cluster}
	a.declared = true
	a.sendOrEnded(&walshipv1.AppendRequest{Heartbeat: hb}, "heartbeat")
}

// TestClusterIdentity: a log store with no cluster id adopts the first
// granted fence's, durably, and reports it everywhere; from then on a
// candidate, a primary or a reader of another cluster is refused with
// FAILED_PRECONDITION naming both ids, counted, and nothing on disk
// changes — across a restart too. A candidate it would grant, or a primary,
// that states no id is refused the same way (every walship sender states
// its id once it has one: a fence of none is a node of another cluster,
// or of none); a reader that states none reads (a new replica, an emptied
// log store refilling have none yet). A malformed id is INVALID_ARGUMENT
// naming the field.
func TestClusterIdentity(t *testing.T) {
	dir := t.TempDir()
	r := start(t, testConfig(t, dir))
	fence := walshipv1.NewEpochServiceClient(r.conn)
	if st := r.status(t); st.ClusterId != "" {
		t.Fatalf("a new log store reports cluster %q", st.ClusterId)
	}
	resp, err := fence.Fence(t.Context(), &walshipv1.FenceRequest{Epoch: 1, CandidateId: "a1", CandidateAddr: "a1:1", ClusterId: clusterA})
	if err != nil || !resp.Granted || resp.ClusterId != clusterA {
		t.Fatalf("first fence = %v, %v", resp, err)
	}
	if id, err := datadir.LoadCluster(vfs.OS, dir); err != nil || id != clusterA {
		t.Fatalf("cluster file after the fence: %q, %v", id, err)
	}
	if st := r.status(t); st.ClusterId != clusterA {
		t.Fatalf("LogStoreService.Status cluster_id = %q", st.ClusterId)
	}
	if st, err := r.admin.Status(t.Context(), &walshipv1.StatusRequest{}); err != nil || st.ClusterId != clusterA {
		t.Fatalf("AdminService.Status = %v, %v", st, err)
	}
	// Its primary ships.
	a := r.append(t)
	a.beat(1, clusterA)
	a.send(chain(t, 1, 1, 2, 10)...)
	a.waitDurable(4)

	before := testkit.DirContents(t, dir)
	refusals := counterValue(t, r.s.metrics.clusterMismatch)
	_, err = fence.Fence(t.Context(), &walshipv1.FenceRequest{Epoch: 7, CandidateId: "b1", CandidateAddr: "b1:1", ClusterId: clusterB})
	wantCode(t, err, codes.FailedPrecondition, "cluster id mismatch: this log store belongs to cluster "+clusterA+", the candidate b1 is of cluster "+clusterB)
	other := r.append(t)
	other.beat(9, clusterB)
	other.send(batch(t, 9, 7, 1, 10))
	wantCode(t, other.failure(), codes.FailedPrecondition, "this log store belongs to cluster "+clusterA+", the primary p is of cluster "+clusterB)
	_, err = r.readAll(t, &walshipv1.ReadRequest{FromLsn: 1, ClusterId: clusterB})
	wantCode(t, err, codes.FailedPrecondition, "the request is of cluster "+clusterB, clusterA)
	// Stating none: another cluster's node whose directory has no id,
	// say, which would otherwise depose this cluster's primary or cut the
	// log.
	_, err = fence.Fence(t.Context(), &walshipv1.FenceRequest{Epoch: 7, CandidateId: "n1", CandidateAddr: "n1:1"})
	wantCode(t, err, codes.FailedPrecondition, "cluster id mismatch: this log store belongs to cluster "+clusterA+", the candidate n1 states no cluster id")
	// One it would not grant anyway is answered, naming the holder: a
	// primary that restarts from a directory older than cluster ids learns
	// it was deposed, and rejoins. The holder is the primary that streams
	// in epoch 1, p (the fence granted it to a1, but only the winner of an
	// epoch streams in it: failover, learns).
	if resp, err := fence.Fence(t.Context(), &walshipv1.FenceRequest{Epoch: 1, CandidateId: "n1", CandidateAddr: "n1:1"}); err != nil || resp.Granted || resp.Epoch != 1 || resp.PrimaryId != "p" {
		t.Fatalf("a fence of an epoch not newer, stating no cluster: %v, %v; want not granted, naming p at epoch 1", resp, err)
	}
	none := r.append(t)
	none.heartbeat(1)
	none.send(batch(t, 1, 5, 1, 10))
	wantCode(t, none.failure(), codes.FailedPrecondition, "this log store belongs to cluster "+clusterA+", the primary states no cluster id")
	if got := counterValue(t, r.s.metrics.clusterMismatch) - refusals; got != 5 {
		t.Errorf("walship_cluster_mismatch_total rose by %v, want 5", got)
	}
	// Readers of its own cluster, or stating none, read.
	for _, id := range []string{clusterA, ""} {
		if got, err := r.readAll(t, &walshipv1.ReadRequest{FromLsn: 1, ClusterId: id}); err != nil || len(got) != 2 {
			t.Fatalf("read as %q: %d batches, %v", id, len(got), err)
		}
	}
	for _, bad := range []struct {
		err   error
		field string
	}{
		{func() error {
			_, err := fence.Fence(t.Context(), &walshipv1.FenceRequest{Epoch: 8, CandidateId: "x", CandidateAddr: "x:1", ClusterId: "CLUSTER"})
			return err
		}(), "cluster_id"},
		{func() error { a := r.append(t); a.beat(1, "not-a-uuid"); return a.failure() }(), "heartbeat.cluster_id"},
		{func() error { _, err := r.readAll(t, &walshipv1.ReadRequest{FromLsn: 1, ClusterId: "x"}); return err }(), "cluster_id"},
	} {
		wantCode(t, bad.err, codes.InvalidArgument, bad.field, "not a cluster id")
	}
	if st := r.status(t); st.VoteEpoch != 1 || st.DurableLsn != 4 || st.ClusterId != clusterA {
		t.Fatalf("after the refusals: %v", st)
	}
	testkit.SameContents(t, "refusing peers of another cluster", testkit.DirContents(t, dir), before)

	// After a restart: the same id, the same refusals.
	if err := r.stop(); err != nil {
		t.Fatal(err)
	}
	r = start(t, testConfig(t, dir))
	if st := r.status(t); st.ClusterId != clusterA {
		t.Fatalf("after a restart: cluster_id %q", st.ClusterId)
	}
	_, err = walshipv1.NewEpochServiceClient(r.conn).Fence(t.Context(), &walshipv1.FenceRequest{Epoch: 7, CandidateId: "b1", CandidateAddr: "b1:1", ClusterId: clusterB})
	wantCode(t, err, codes.FailedPrecondition, clusterA, clusterB)
	_, err = walshipv1.NewEpochServiceClient(r.conn).Fence(t.Context(), &walshipv1.FenceRequest{Epoch: 7, CandidateId: "n1", CandidateAddr: "n1:1"})
	wantCode(t, err, codes.FailedPrecondition, clusterA, "states no cluster id")
}

// TestClusterAdoptedFromHeartbeat: a log store with no cluster id adopts
// the id of the first primary whose stream it accepts, before it stores
// anything that primary sent; a refused heartbeat (a stale epoch) teaches
// it nothing.
func TestClusterAdoptedFromHeartbeat(t *testing.T) {
	dir := t.TempDir()
	r := start(t, testConfig(t, dir))
	if resp, err := walshipv1.NewEpochServiceClient(r.conn).Fence(t.Context(), &walshipv1.FenceRequest{Epoch: 3, CandidateId: "c", CandidateAddr: "c:1"}); err != nil || !resp.Granted || resp.ClusterId != "" {
		t.Fatalf("fence without a cluster id = %v, %v", resp, err)
	}
	stale := r.append(t)
	stale.beat(2, clusterB)
	wantCode(t, stale.failure(), codes.FailedPrecondition, "stale epoch 2")
	if id, err := datadir.LoadCluster(vfs.OS, dir); err != nil || id != "" {
		t.Fatalf("adopted %q (%v) from a refused heartbeat", id, err)
	}
	a := r.append(t)
	a.beat(3, clusterA)
	a.send(chain(t, 3, 1, 2, 10)...)
	a.waitDurable(4)
	if id, err := datadir.LoadCluster(vfs.OS, dir); err != nil || id != clusterA {
		t.Fatalf("cluster file: %q, %v", id, err)
	}
	b := r.append(t)
	b.beat(3, clusterB)
	wantCode(t, b.failure(), codes.FailedPrecondition, clusterA, clusterB)
}
