package primary

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	walshipv1 "github.com/walship/walship/gen/walship/v1"
	"github.com/walship/walship/internal/datadir"
	"github.com/walship/walship/internal/rpcerr"
	"github.com/walship/walship/internal/testkit"
	"github.com/walship/walship/internal/vfs"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

const (
	clusterA = "0a0a0a0a-0a0a-4a0a-8a0a-0a0a0a0a0a0a"
	clusterB = "0b0b0b0b-0b0b-4b0b-8b0b-0b0b0b0b0b0b"
)

// TestClusterIDMadeAndKept: a primary without log stores that has no
// cluster id makes one before it serves, saves it, reports it, stamps it
// in its heartbeats and snapshot headers, and keeps it across a restart.
// A replica, a candidate or a reader of another cluster is refused with
// FAILED_PRECONDITION naming both ids — the candidate without deposing
// the primary — and so is a candidate that states no id (a replica or a
// reader that states none has none yet, and is served); a malformed id
// is INVALID_ARGUMENT naming the field.
func TestClusterIDMadeAndKept(t *testing.T) {
	dir := t.TempDir()
	r := start(t, testConfig(t, dir))
	c := ctx(t)
	st, err := r.admin.Status(c, &walshipv1.StatusRequest{})
	if err != nil {
		t.Fatal(err)
	}
	id := st.ClusterId
	if err := datadir.ValidateClusterID(id); err != nil {
		t.Fatalf("Status.cluster_id: %v", err)
	}
	if onDisk, err := datadir.LoadCluster(vfs.OS, dir); err != nil || onDisk != id {
		t.Fatalf("cluster file %q, %v; Status says %q", onDisk, err, id)
	}
	if _, err := r.kv.Put(c, &walshipv1.PutRequest{Key: "k", Value: []byte("v")}); err != nil {
		t.Fatal(err)
	}
	repl := walshipv1.NewReplicationServiceClient(r.conn)

	// A replica of the same cluster, or of none yet, is served; its first
	// message, a heartbeat, carries the id.
	for _, theirs := range []string{id, ""} {
		m := stream(t, repl, &walshipv1.ReplicaHello{ReplicaId: "r1", Epoch: 1, NextLsn: 1, ClusterId: theirs})
		if hb := m.GetHeartbeat(); hb == nil || hb.ClusterId != id {
			t.Fatalf("first message to a replica of %q: %v", theirs, m)
		}
	}
	refusals := counter(t, r.s.metrics.clusterMismatch)
	s, err := repl.Stream(c)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Send(&walshipv1.StreamRequest{Msg: &walshipv1.StreamRequest_Hello{Hello: &walshipv1.ReplicaHello{ReplicaId: "r9", Epoch: 1, NextLsn: 1, ClusterId: clusterB}}}); err != nil {
		t.Fatal(err)
	}
	_, err = s.Recv()
	wantStatus(t, err, codes.FailedPrecondition, "cluster id mismatch: this primary belongs to cluster "+id+", the replica r9 is of cluster "+clusterB)
	if !rpcerr.IsOtherCluster(err) {
		t.Fatalf("%v is not recognisable as a cluster mismatch", err)
	}
	_, err = walshipv1.NewEpochServiceClient(r.conn).Fence(c, &walshipv1.FenceRequest{Epoch: 99, CandidateId: "b1", CandidateAddr: "b1:1", ClusterId: clusterB})
	wantStatus(t, err, codes.FailedPrecondition, "the candidate b1 is of cluster "+clusterB, id)
	rd, err := walshipv1.NewLogStoreServiceClient(r.conn).Read(c, &walshipv1.ReadRequest{FromLsn: 1, ClusterId: clusterB})
	if err == nil {
		_, err = rd.Recv()
	}
	wantStatus(t, err, codes.FailedPrecondition, "the request is of cluster "+clusterB)
	_, err = walshipv1.NewEpochServiceClient(r.conn).Fence(c, &walshipv1.FenceRequest{Epoch: 99, CandidateId: "n1", CandidateAddr: "n1:1"})
	wantStatus(t, err, codes.FailedPrecondition, "cluster id mismatch: this primary belongs to cluster "+id+", the candidate n1 states no cluster id")
	sn, err := repl.Snapshot(c, &walshipv1.SnapshotRequest{ReplicaId: "r9", ClusterId: clusterB})
	if err == nil {
		_, err = sn.Recv()
	}
	wantStatus(t, err, codes.FailedPrecondition, "the replica r9 is of cluster "+clusterB)
	if got := counter(t, r.s.metrics.clusterMismatch) - refusals; got != 5 {
		t.Errorf("walship_cluster_mismatch_total rose by %v, want 5", got)
	}
	// Not deposed by the candidates of another cluster, or of none.
	if _, err := r.kv.Put(c, &walshipv1.PutRequest{Key: "k", Value: []byte("w")}); err != nil {
		t.Fatalf("Put after refusing a candidate of another cluster: %v", err)
	}
	_, err = walshipv1.NewEpochServiceClient(r.conn).Fence(c, &walshipv1.FenceRequest{Epoch: 99, CandidateId: "b1", CandidateAddr: "b1:1", ClusterId: "B"})
	wantStatus(t, err, codes.InvalidArgument, "cluster_id")
	for _, theirs := range []string{id, ""} {
		snap, err := repl.Snapshot(c, &walshipv1.SnapshotRequest{ReplicaId: "r1", ClusterId: theirs})
		if err != nil {
			t.Fatal(err)
		}
		if m, err := snap.Recv(); err != nil || m.GetHeader().GetClusterId() != id {
			t.Fatalf("snapshot header to a replica of %q: %v, %v; want cluster %s", theirs, m, err, id)
		}
	}

	if err := r.stop(t); err != nil {
		t.Fatal(err)
	}
	r = start(t, testConfig(t, dir))
	if st, err := r.admin.Status(ctx(t), &walshipv1.StatusRequest{}); err != nil || st.ClusterId != id {
		t.Fatalf("after a restart: %v, %v; want cluster %s", st.GetClusterId(), err, id)
	}
}

// TestClusterIDFromLogStores: a primary with no cluster id adopts the one
// its log stores' fence answers hold, before it writes its epoch; log
// stores that disagree, or that refuse it for belonging to another
// cluster (too many for a majority), keep it from starting with
// FAILED_PRECONDITION naming the ids, and nothing of its epoch is saved.
func TestClusterIDFromLogStores(t *testing.T) {
	grant := func(id string) fenceFunc {
		return func(req *walshipv1.FenceRequest) (*walshipv1.FenceResponse, error) {
			return &walshipv1.FenceResponse{Granted: true, Epoch: req.Epoch, ClusterId: id}, nil
		}
	}
	refuse := func(id string) fenceFunc {
		return func(req *walshipv1.FenceRequest) (*walshipv1.FenceResponse, error) {
			return nil, rpcerr.OtherCluster("log store", id, "the candidate "+req.CandidateId, req.ClusterId)
		}
	}
	t.Run("adopts", func(t *testing.T) {
		dir := t.TempDir()
		cfg := testConfig(t, dir)
		cfg.LogStores = []string{fakeLogStore(t, grant(clusterA)), fakeLogStore(t, grant("")), fakeLogStore(t, grant(clusterA))}
		s, stop, _ := run(t, cfg)
		testkit.Until(t, "the cluster id", func() bool { return s.Status().ClusterId == clusterA })
		if id, err := datadir.LoadCluster(vfs.OS, dir); err != nil || id != clusterA {
			t.Fatalf("cluster file %q, %v", id, err)
		}
		if err := stop(); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("log stores disagree", func(t *testing.T) {
		dir := t.TempDir()
		cfg := testConfig(t, dir)
		cfg.LogStores = []string{fakeLogStore(t, grant(clusterA)), fakeLogStore(t, grant(clusterB))}
		_, _, wait := run(t, cfg)
		err := wait()
		if rpcerr.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), clusterA) || !strings.Contains(err.Error(), clusterB) {
			t.Fatalf("Run = %v; want FAILED_PRECONDITION naming both ids", err)
		}
		noEpoch(t, dir)
	})
	t.Run("log stores of another cluster", func(t *testing.T) {
		dir := t.TempDir()
		if err := datadir.SaveCluster(vfs.OS, dir, clusterA); err != nil {
			t.Fatal(err)
		}
		cfg := testConfig(t, dir)
		// One of three may be wrong (it is refused, and the others win);
		// two of three leave no majority.
		cfg.LogStores = []string{fakeLogStore(t, refuse(clusterB)), fakeLogStore(t, refuse(clusterB)), fakeLogStore(t, grant(clusterA))}
		_, _, wait := run(t, cfg)
		err := wait()
		if rpcerr.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), "cluster id mismatch") ||
			!strings.Contains(err.Error(), "this log store belongs to cluster "+clusterB+", the candidate primary is of cluster "+clusterA) {
			t.Fatalf("Run = %v; want FAILED_PRECONDITION naming both ids", err)
		}
		noEpoch(t, dir)
	})
}

// noEpoch checks that a primary that did not start saved nothing of an
// epoch (and no cluster id it did not have).
func noEpoch(t *testing.T, dir string) {
	t.Helper()
	if _, err := os.Stat(filepath.Join(dir, "epochs")); !os.IsNotExist(err) {
		t.Errorf("epoch history saved: %v", err)
	}
	if id, _ := datadir.LoadCluster(vfs.OS, dir); id != "" && id != clusterA {
		t.Errorf("cluster id %q saved", id)
	}
}

type fenceFunc func(*walshipv1.FenceRequest) (*walshipv1.FenceResponse, error)

type fakeFencer struct {
	walshipv1.UnimplementedEpochServiceServer
	fence fenceFunc
}

func (f *fakeFencer) Fence(_ context.Context, req *walshipv1.FenceRequest) (*walshipv1.FenceResponse, error) {
	return f.fence(req)
}

// fakeLogStore serves EpochService.Fence with fence on loopback (nothing
// else: the primary's shipping to it fails and retries) and returns its
// address.
func fakeLogStore(t *testing.T, fence fenceFunc) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	g := grpc.NewServer()
	walshipv1.RegisterEpochServiceServer(g, &fakeFencer{fence: fence})
	go func() { _ = g.Serve(l) }()
	t.Cleanup(g.Stop)
	return l.Addr().String()
}

// run runs a primary that may never serve. stop cancels it and wait
// waits for it to return by itself; each returns Run's error.
func run(t *testing.T, cfg Config) (s *Server, stop, wait func() error) {
	t.Helper()
	s, err := New(cfg)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	ch := make(chan error, 1)
	go func() { ch <- s.Run(ctx) }()
	var res error
	finished := false
	wait = func() error {
		if !finished {
			select {
			case res = <-ch:
			case <-time.After(30 * time.Second):
				t.Fatal("Run did not return")
			}
			finished = true
		}
		return res
	}
	stop = func() error {
		cancel()
		return wait()
	}
	t.Cleanup(func() { _ = stop() })
	return s, stop, wait
}

func counter(t *testing.T, c prometheus.Counter) float64 {
	t.Helper()
	var m dto.Metric
	if err := c.Write(&m); err != nil {
		t.Fatal(err)
	}
	return m.GetCounter().GetValue()
}

// stream opens a replication stream with hello and returns its first
// message.
func stream(t *testing.T, repl walshipv1.ReplicationServiceClient, hello *walshipv1.ReplicaHello) *walshipv1.StreamResponse {
	t.Helper()
	c, cancel := context.WithCancel(ctx(t))
	defer cancel()
	s, err := repl.Stream(c)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Send(&walshipv1.StreamRequest{Msg: &walshipv1.StreamRequest_Hello{Hello: hello}}); err != nil {
		t.Fatal(err)
	}
	m, err := s.Recv()
	if err != nil {
		t.Fatalf("first message: %v", err)
	}
	return m
}

func wantStatus(t *testing.T, err error, code codes.Code, subs ...string) {
	t.Helper()
	st := status.Convert(err)
	if err == nil || st.Code() != code {
		t.Fatalf("got %v, want %v", err, code)
	}
	for _, s := range subs {
		if !strings.Contains(st.Message(), s) {
			t.Fatalf("message %q does not mention %q", st.Message(), s)
		}
	}
}
