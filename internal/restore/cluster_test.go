package restore_test

import (
	"context"
	"net"
	"strings"
	"sync"
	"testing"

	walshipv1 "github.com/walship/walship/gen/walship/v1"
	"github.com/walship/walship/internal/restore"
	"github.com/walship/walship/internal/rpcerr"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

const (
	clusterA = "0a0a0a0a-0a0a-4a0a-8a0a-0a0a0a0a0a0a"
	clusterB = "0b0b0b0b-0b0b-4b0b-8b0b-0b0b0b0b0b0b"
)

// statedLogStore answers Status as a log store of cluster holding LSNs
// 1..2 of epoch 1, and records the cluster id each Read states (it then
// fails the Read: the test is about what was asked).
type statedLogStore struct {
	walshipv1.UnimplementedLogStoreServiceServer
	cluster string
	history []*walshipv1.EpochStart // stated in Status; nil: epoch 1 from LSN 1
	mu      sync.Mutex
	reads   []string
}

func (l *statedLogStore) Status(ctx context.Context, _ *walshipv1.LogStoreServiceStatusRequest) (*walshipv1.LogStoreServiceStatusResponse, error) {
	h := l.history
	if h == nil {
		h = []*walshipv1.EpochStart{{Epoch: 1, FirstLsn: 1}}
	}
	return &walshipv1.LogStoreServiceStatusResponse{FirstLsn: 1, DurableLsn: 2, Epoch: 1, VoteEpoch: 1, LastEpoch: 1,
		History: h, ClusterId: l.cluster}, nil
}

func (l *statedLogStore) Read(req *walshipv1.ReadRequest, _ walshipv1.LogStoreService_ReadServer) error {
	l.mu.Lock()
	l.reads = append(l.reads, req.GetClusterId())
	l.mu.Unlock()
	return status.Error(codes.Unavailable, "the test reads no further")
}

func serveLogStore(t *testing.T, ls walshipv1.LogStoreServiceServer) string {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	g := grpc.NewServer()
	walshipv1.RegisterLogStoreServiceServer(g, ls)
	go func() { _ = g.Serve(lis) }()
	t.Cleanup(g.Stop)
	return lis.Addr().String()
}

// TestRestoreReadsOneCluster: a restore reads one cluster's log. Without
// --cluster-id, log stores that state different clusters are refused
// before anything is read (their LSNs mean different things), and the
// one id they state is stated on every read, as a node states its own.
func TestRestoreReadsOneCluster(t *testing.T) {
	a, b := &statedLogStore{cluster: clusterA}, &statedLogStore{cluster: clusterB}
	addrA, addrB := serveLogStore(t, a), serveLogStore(t, b)
	_, err := restore.Run(t.Context(), restore.Options{LogStores: []string{addrA, addrB}, Target: restore.AtLatest(), DryRun: true})
	if !rpcerr.IsOtherCluster(err) || !strings.Contains(err.Error(), clusterA) || !strings.Contains(err.Error(), clusterB) || !strings.Contains(err.Error(), "--cluster-id") {
		t.Fatalf("restore from log stores of two clusters: %v; want a cluster id mismatch naming both and --cluster-id", err)
	}
	if len(a.reads)+len(b.reads) != 0 {
		t.Fatalf("reads before the refusal: %q, %q", a.reads, b.reads)
	}
	// Named: the other cluster's log store does not count, and reads state
	// the id. (The fakes' Read fails: the test is about what was asked.)
	for _, o := range []restore.Options{
		{LogStores: []string{addrA, addrB}, Target: restore.AtLSN(2), DryRun: true, ClusterID: clusterB},
		{LogStores: []string{addrA}, Target: restore.AtLatest(), DryRun: true},
	} {
		if _, err := restore.Run(t.Context(), o); err == nil || !strings.Contains(err.Error(), "the test reads no further") {
			t.Fatalf("restore from %v (cluster id %q): %v; want the fake's Read failure", o.LogStores, o.ClusterID, err)
		}
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	b.mu.Lock()
	defer b.mu.Unlock()
	if len(a.reads) != 1 || a.reads[0] != clusterA || len(b.reads) != 1 || b.reads[0] != clusterB {
		t.Fatalf("cluster ids the reads stated: %q to %s's log store, %q to %s's; want one each, its own", a.reads, clusterA, b.reads, clusterB)
	}
}

// TestRestoreRefusesBadHistory: a log store whose Status states a history
// that is not one (a first LSN of 0) is not a source: how far its log
// follows the lineage is worked out from that history. Nothing is read
// from it, and the restore says why, naming the entry.
func TestRestoreRefusesBadHistory(t *testing.T) {
	ls := &statedLogStore{cluster: clusterA, history: []*walshipv1.EpochStart{{Epoch: 1, FirstLsn: 1}, {Epoch: 2, FirstLsn: 0}}}
	_, err := restore.Run(t.Context(), restore.Options{LogStores: []string{serveLogStore(t, ls)}, Target: restore.AtLatest(), DryRun: true})
	if err == nil || !strings.Contains(err.Error(), "history[1]: epoch and first_lsn must be at least 1") {
		t.Fatalf("restore from a log store stating a first LSN of 0: %v; want a refusal naming history[1]", err)
	}
	ls.mu.Lock()
	defer ls.mu.Unlock()
	if len(ls.reads) != 0 {
		t.Fatalf("reads from a log store whose history was refused: %q", ls.reads)
	}
}
