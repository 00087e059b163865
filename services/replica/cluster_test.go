package replica

import (
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

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

// clusterBeat sends the heartbeat of primary id at addr of cluster,
// epoch and durable LSN last.
func (s *session) clusterBeat(t *testing.T, epoch, last uint64, id, addr, cluster string) {
	t.Helper()
	s.sendOrEnded(t, &walshipv1.StreamResponse{DurableLsn: last, CommitLsn: last, Msg: &walshipv1.StreamResponse_Heartbeat{Heartbeat: &walshipv1.Heartbeat{
		Epoch: epoch, LastLsn: last, TimeUnixNano: time.Now().UnixNano(), ReplyRequested: true, PrimaryId: id, PrimaryAddr: addr, ClusterId: cluster,
	}}}, "heartbeat")
}

// files is every file under dir and its bytes.
func files(t *testing.T, dir string) map[string]string {
	t.Helper()
	out := map[string]string{}
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || filepath.Base(path) == "applied" {
			return err // the applied marker is saved on a timer, not by a peer
		}
		b, err := os.ReadFile(path)
		out[path] = string(b)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// TestClusterAdoptedFromThePrimary: a replica with no cluster id adopts
// its primary's from the heartbeat that opens the stream, durably, says
// it in its next hello and reports it; from then on a primary of another
// cluster is refused — the replica promises it nothing, does not follow
// it and writes nothing it sent — as are a candidate and a reader of
// another cluster, and a node of another cluster naming its primary is
// not believed. A primary or a candidate that states no cluster id is
// refused the same way (a reader that states none reads: it has none
// yet). After a restart it is still of that cluster.
func TestClusterAdoptedFromThePrimary(t *testing.T) {
	fp := newFakePrimary(t)
	dir := t.TempDir()
	r := start(t, testConfig(t, dir, fp.addr))
	m := newModel(t)
	sess := fp.next(t)
	if sess.hello.GetClusterId() != "" {
		t.Fatalf("a new replica's hello states cluster %q", sess.hello.GetClusterId())
	}
	b := m.txn(put("a", "1"))
	sess.clusterBeat(t, 1, 0, "p1", fp.addr, clusterA)
	sess.send(t, b)
	r.waitApplied(t, b.LastLsn)
	if id, err := datadir.LoadCluster(vfs.OS, dir); err != nil || id != clusterA {
		t.Fatalf("cluster file %q, %v", id, err)
	}
	if st := r.status(t); st.ClusterId != clusterA {
		t.Fatalf("Status.cluster_id = %q", st.ClusterId)
	}
	sess.end <- status.Error(codes.Unavailable, "restarting")
	sess = fp.next(t)
	if sess.hello.GetClusterId() != clusterA {
		t.Fatalf("hello after joining states cluster %q", sess.hello.GetClusterId())
	}

	// A primary of another cluster, at a newer epoch, on this stream.
	before := files(t, dir)
	refusals := r.metric(t, "walship_cluster_mismatch_total")
	sess.clusterBeat(t, 7, b.LastLsn+2, "b1", "b1:7401", clusterB)
	sess.send(t, m.txn(put("b", "2")))
	again := fp.next(t) // the replica ended that stream and came back
	if got := r.metric(t, "walship_cluster_mismatch_total") - refusals; got != 1 {
		t.Errorf("walship_cluster_mismatch_total rose by %v, want 1", got)
	}
	if v := r.s.Vote(); v.Epoch != 1 || r.s.primary() != fp.addr {
		t.Fatalf("after a primary of another cluster: vote %v, following %s", v, r.s.primary())
	}
	if st := r.status(t); st.LastLsn != b.LastLsn || st.VisibleLsn != b.LastLsn {
		t.Fatalf("wrote what a primary of another cluster sent: %v", st)
	}
	// A primary that states no cluster id, at a newer epoch.
	again.clusterBeat(t, 8, b.LastLsn+2, "n1", "n1:7401", "")
	again.send(t, m.txn(put("c", "3")))
	again = fp.next(t)
	if got := r.metric(t, "walship_cluster_mismatch_total") - refusals; got != 2 {
		t.Errorf("walship_cluster_mismatch_total rose by %v, want 2", got)
	}
	if v := r.s.Vote(); v.Epoch != 1 || r.s.primary() != fp.addr {
		t.Fatalf("after a primary that states no cluster: vote %v, following %s", v, r.s.primary())
	}
	if st := r.status(t); st.LastLsn != b.LastLsn {
		t.Fatalf("wrote what a primary that states no cluster sent: %v", st)
	}

	// A candidate of another cluster; a reader of another cluster.
	_, err := walshipv1.NewEpochServiceClient(r.conn).Fence(tctx(t), &walshipv1.FenceRequest{Epoch: 9, CandidateId: "b2", CandidateAddr: "b2:1", ClusterId: clusterB})
	wantRefusal(t, err, codes.FailedPrecondition, "cluster id mismatch: this replica r1 belongs to cluster "+clusterA+", the candidate b2 is of cluster "+clusterB)
	_, err = walshipv1.NewEpochServiceClient(r.conn).Fence(tctx(t), &walshipv1.FenceRequest{Epoch: 9, CandidateId: "n2", CandidateAddr: "n2:1"})
	wantRefusal(t, err, codes.FailedPrecondition, "cluster id mismatch: this replica r1 belongs to cluster "+clusterA+", the candidate n2 states no cluster id")
	if rd, err := walshipv1.NewLogStoreServiceClient(r.conn).Read(tctx(t), &walshipv1.ReadRequest{FromLsn: 1, ToLsn: b.LastLsn}); err != nil {
		t.Fatal(err)
	} else if m, err := rd.Recv(); err != nil || m.GetBatch().GetLastLsn() != b.LastLsn {
		t.Fatalf("a read that states no cluster: %v, %v", m, err)
	}
	rd, err := walshipv1.NewLogStoreServiceClient(r.conn).Read(tctx(t), &walshipv1.ReadRequest{FromLsn: 1, ClusterId: clusterB})
	if err == nil {
		_, err = rd.Recv()
	}
	wantRefusal(t, err, codes.FailedPrecondition, "the request is of cluster "+clusterB)
	_, err = walshipv1.NewEpochServiceClient(r.conn).Fence(tctx(t), &walshipv1.FenceRequest{Epoch: 9, CandidateId: "b2", CandidateAddr: "b2:1", ClusterId: "b"})
	wantRefusal(t, err, codes.InvalidArgument, "cluster_id")
	// Candidates no vote file can hold.
	_, err = walshipv1.NewEpochServiceClient(r.conn).Fence(tctx(t), &walshipv1.FenceRequest{Epoch: 9, CandidateId: "a2", CandidateAddr: "a2:1 x", ClusterId: clusterA})
	wantRefusal(t, err, codes.InvalidArgument, "candidate_addr")
	_, err = walshipv1.NewEpochServiceClient(r.conn).Fence(tctx(t), &walshipv1.FenceRequest{Epoch: 9, CandidateId: "-", CandidateAddr: "a2:1", ClusterId: clusterA})
	wantRefusal(t, err, codes.InvalidArgument, "candidate_id")
	if v := r.s.Vote(); v.Epoch != 1 {
		t.Fatalf("vote after a fence of another cluster: %v", v)
	}
	// Its own refusal of another node's stream names its cluster, so that
	// a replica of another cluster does not follow the primary it names.
	snap, err := walshipv1.NewReplicationServiceClient(r.conn).Snapshot(tctx(t), &walshipv1.SnapshotRequest{})
	if err == nil {
		_, err = snap.Recv()
	}
	if _, cluster, ok := primaryFrom(err, r.s.Vote().Epoch); !ok || cluster != clusterA {
		t.Fatalf("Snapshot of a replica = %v; want NotPrimary naming cluster %s", err, clusterA)
	}
	sameFiles(t, "refusing peers of another cluster", files(t, dir), before)

	// A node of another cluster naming its primary is not followed.
	other := listen(t, func(g *grpc.Server) {
		walshipv1.RegisterReplicationServiceServer(g, &notPrimary{vote: datadir.Vote{Epoch: 9, Primary: "b1", Addr: "b1:7401"}, cluster: clusterB})
	})
	r.s.followPrimary(other)
	again.end <- status.Error(codes.Unavailable, "bye")
	testkit.Until(t, "the refusal of a node of another cluster", func() bool {
		return r.metric(t, "walship_cluster_mismatch_total")-refusals >= 6
	})
	if v := r.s.Vote(); v.Epoch != 1 || r.s.primary() != other {
		t.Fatalf("after a node of another cluster named its primary: vote %v, following %s", v, r.s.primary())
	}

	if err := r.stop(t); err != nil {
		t.Fatal(err)
	}
	r = start(t, testConfig(t, dir, fp.addr))
	if st := r.status(t); st.ClusterId != clusterA {
		t.Fatalf("after a restart: cluster_id %q", st.ClusterId)
	}
}

// TestClusterAdoptedFromASnapshot: a replica with no cluster id re-seeded
// from its primary's snapshot adopts the snapshot's cluster id; one of
// another cluster refuses such a snapshot and installs nothing, and so
// does one whose snapshot states no cluster id. The request states the
// replica's id.
func TestClusterAdoptedFromASnapshot(t *testing.T) {
	m := newModel(t)
	ref := m.ref
	m.txn(put("a", "1"))
	m.txn(put("b", "2"))
	for _, tc := range []struct {
		name, own, snap string
		adopted         bool
	}{
		{"adopts", "", clusterA, true},
		{"refuses", clusterB, clusterA, false},
		{"refuses none", clusterB, "", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fp := newFakePrimary(t)
			asked := make(chan string, 10)
			serve := withCluster(snapshotOf(ref.Snapshot(), 1), tc.snap)
			fp.snapshot = func(req *walshipv1.SnapshotRequest, st grpc.ServerStreamingServer[walshipv1.SnapshotResponse]) error {
				select {
				case asked <- req.GetClusterId():
				default: // a retry: the first is the one checked
				}
				return serve(req, st)
			}
			dir := t.TempDir()
			if tc.own != "" {
				if err := datadir.SaveCluster(vfs.OS, dir, tc.own); err != nil {
					t.Fatal(err)
				}
			}
			r := start(t, testConfig(t, dir, fp.addr))
			sess := fp.next(t)
			sess.end <- status.Error(codes.OutOfRange, "gone") // no log store: the snapshot rung
			if tc.adopted {
				r.waitApplied(t, m.next-1)
				if id, err := datadir.LoadCluster(vfs.OS, dir); err != nil || id != tc.snap {
					t.Fatalf("cluster file %q, %v", id, err)
				}
				return
			}
			testkit.Until(t, "the refusal of the snapshot", func() bool { return r.metric(t, "walship_cluster_mismatch_total") >= 1 })
			if st := r.status(t); st.SnapshotLsn != 0 || st.VisibleLsn != 0 || st.ClusterId != tc.own {
				t.Fatalf("after a snapshot of another cluster: %v", st)
			}
			if got := <-asked; got != tc.own {
				t.Fatalf("the snapshot request stated cluster %q, want the replica's %q", got, tc.own)
			}
		})
	}
}

// withCluster stamps cluster into the header snapshot serves.
func withCluster(serve func(*walshipv1.SnapshotRequest, grpc.ServerStreamingServer[walshipv1.SnapshotResponse]) error, cluster string) func(*walshipv1.SnapshotRequest, grpc.ServerStreamingServer[walshipv1.SnapshotResponse]) error {
	return func(req *walshipv1.SnapshotRequest, st grpc.ServerStreamingServer[walshipv1.SnapshotResponse]) error {
		return serve(req, &stamping{ServerStreamingServer: st, cluster: cluster})
	}
}

type stamping struct {
	grpc.ServerStreamingServer[walshipv1.SnapshotResponse]
	cluster string
}

func (s *stamping) Send(m *walshipv1.SnapshotResponse) error {
	if h := m.GetHeader(); h != nil {
		h.ClusterId = s.cluster
	}
	return s.ServerStreamingServer.Send(m)
}

func sameFiles(t *testing.T, what string, got, want map[string]string) {
	t.Helper()
	for p, b := range want {
		if got[p] != b {
			t.Errorf("%s changed %s", what, p)
		}
	}
	for p := range got {
		if _, ok := want[p]; !ok {
			t.Errorf("%s created %s", what, p)
		}
	}
}

func wantRefusal(t *testing.T, err error, code codes.Code, subs ...string) {
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
	if code == codes.FailedPrecondition && !rpcerr.IsOtherCluster(err) {
		t.Fatalf("%v is not recognisable as a cluster mismatch", err)
	}
}
