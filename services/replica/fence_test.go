package replica

import (
	"context"
	"testing"

	walshipv1 "github.com/walship/walship/gen/walship/v1"
	"github.com/walship/walship/internal/datadir"
	"github.com/walship/walship/internal/vfs"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// TestNotPrimaryNamesThePrimary: a replica pointed at a node that is not
// the primary follows the primary that node names.
func TestNotPrimaryNamesThePrimary(t *testing.T) {
	real := newFakePrimary(t)
	addr := listen(t, func(g *grpc.Server) {
		walshipv1.RegisterReplicationServiceServer(g, &notPrimary{vote: datadir.Vote{Epoch: 5, Primary: "p9", Addr: real.addr}})
	})
	dir := t.TempDir()
	start(t, testConfig(t, dir, addr))
	s := real.next(t)
	if s.hello.GetFencedEpoch() != 5 {
		t.Fatalf("hello to the named primary: %v", s.hello)
	}
	if v, err := datadir.LoadVote(vfs.OS, dir); err != nil || v.Epoch != 5 || v.Addr != real.addr {
		t.Fatalf("vote: %v, %v", v, err)
	}
}

type notPrimary struct {
	walshipv1.UnimplementedReplicationServiceServer
	vote    datadir.Vote
	cluster string
}

func (n *notPrimary) Stream(grpc.BidiStreamingServer[walshipv1.StreamRequest, walshipv1.StreamResponse]) error {
	return NotPrimary("a replica", n.vote, n.cluster)
}

// TestNamelessPromiseLearnsItsPrimary: a promise made for the log's
// entries alone names no primary; a node that is not the primary, or the
// log store, naming the primary of that epoch is followed and recorded —
// as it would be for a newer epoch.
func TestNamelessPromiseLearnsItsPrimary(t *testing.T) {
	for _, tc := range []struct {
		name string
		// serve registers, at the address the replica is told is the
		// primary, what answers it; logstore is given to the replica.
		serve    func(g *grpc.Server, named datadir.Vote)
		logstore func(named datadir.Vote) walshipv1.LogStoreServiceServer
	}{
		{name: "a node that is not the primary names it", serve: func(g *grpc.Server, named datadir.Vote) {
			walshipv1.RegisterReplicationServiceServer(g, &notPrimary{vote: named})
		}},
		{name: "the log store names it after the primary stays away", serve: func(g *grpc.Server, _ datadir.Vote) {
			walshipv1.RegisterReplicationServiceServer(g, unavailablePrimary{})
		}, logstore: func(named datadir.Vote) walshipv1.LogStoreServiceServer {
			return &namingLogStore{vote: named}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			real := newFakePrimary(t)
			named := datadir.Vote{Epoch: 5, Primary: "p9", Addr: real.addr}
			dir := t.TempDir()
			if err := datadir.SaveVote(vfs.OS, dir, datadir.Vote{Epoch: 5}); err != nil {
				t.Fatal(err)
			}
			cfg := testConfig(t, dir, listen(t, func(g *grpc.Server) { tc.serve(g, named) }))
			if tc.logstore != nil {
				ls := tc.logstore(named)
				cfg.LogStores = []string{listen(t, func(g *grpc.Server) { walshipv1.RegisterLogStoreServiceServer(g, ls) })}
			}
			start(t, cfg)
			if s := real.next(t); s.hello.GetFencedEpoch() != 5 {
				t.Fatalf("hello to the named primary: %v", s.hello)
			}
			if v, err := datadir.LoadVote(vfs.OS, dir); err != nil || v != named {
				t.Fatalf("vote %v, %v; want %v", v, err, named)
			}
		})
	}
}

// unavailablePrimary fails every stream as a primary that is down.
type unavailablePrimary struct {
	walshipv1.UnimplementedReplicationServiceServer
}

func (unavailablePrimary) Stream(grpc.BidiStreamingServer[walshipv1.StreamRequest, walshipv1.StreamResponse]) error {
	return status.Error(codes.Unavailable, "down")
}

// namingLogStore answers Status with its promise and the primary it names.
type namingLogStore struct {
	walshipv1.UnimplementedLogStoreServiceServer
	vote datadir.Vote
}

func (l *namingLogStore) Status(context.Context, *walshipv1.LogStoreServiceStatusRequest) (*walshipv1.LogStoreServiceStatusResponse, error) {
	return &walshipv1.LogStoreServiceStatusResponse{VoteEpoch: l.vote.Epoch, PrimaryId: l.vote.Primary, PrimaryAddr: l.vote.Addr}, nil
}
