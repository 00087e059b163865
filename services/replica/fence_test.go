package replica

import (
	"testing"

	walshipv1 "github.com/walship/walship/gen/walship/v1"
	"github.com/walship/walship/internal/datadir"
	"github.com/walship/walship/internal/vfs"
	"google.golang.org/grpc"
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
	vote datadir.Vote
}

func (n *notPrimary) Stream(grpc.BidiStreamingServer[walshipv1.StreamRequest, walshipv1.StreamResponse]) error {
	return NotPrimary("a replica", n.vote)
}
