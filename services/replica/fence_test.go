package replica

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	walshipv1 "github.com/walship/walship/gen/walship/v1"
	"github.com/walship/walship/internal/datadir"
	"github.com/walship/walship/internal/testkit"
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
	calls   atomic.Int32
}

func (n *notPrimary) Stream(grpc.BidiStreamingServer[walshipv1.StreamRequest, walshipv1.StreamResponse]) error {
	n.calls.Add(1)
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
	mu    sync.Mutex
	vote  datadir.Vote
	calls atomic.Int32
}

func (l *namingLogStore) Status(context.Context, *walshipv1.LogStoreServiceStatusRequest) (*walshipv1.LogStoreServiceStatusResponse, error) {
	l.calls.Add(1)
	l.mu.Lock()
	defer l.mu.Unlock()
	return &walshipv1.LogStoreServiceStatusResponse{VoteEpoch: l.vote.Epoch, PrimaryId: l.vote.Primary, PrimaryAddr: l.vote.Addr}, nil
}

func (l *namingLogStore) set(v datadir.Vote) {
	l.mu.Lock()
	l.vote = v
	l.mu.Unlock()
}

// TestNamedEpochJump: a node that is not the primary naming the primary
// of an epoch more than datadir.MaxEpochJump above the replica's promise
// is not believed, nor is a log store naming one more than
// datadir.MaxEpochGap above it — the replica promises nothing and does
// not follow it, however often it asks — so that one answer cannot move
// it to the last epoch. One naming the epoch at the bound is followed as
// any newer primary: the log store's word covers a cluster that moved on
// by many jumps while the replica was away.
func TestNamedEpochJump(t *testing.T) {
	const promised = 5
	for _, tc := range []struct {
		name  string
		bound uint64
		// source serves, at the address the replica follows, and as its
		// log store ("": none), what names the primary; asked is how
		// often the replica asked it.
		source func(t *testing.T, named datadir.Vote) (follow string, logstore string, asked func() int32)
	}{
		{"a node that is not the primary", datadir.MaxEpochJump, func(t *testing.T, named datadir.Vote) (string, string, func() int32) {
			np := &notPrimary{vote: named}
			return listen(t, func(g *grpc.Server) { walshipv1.RegisterReplicationServiceServer(g, np) }), "", np.calls.Load
		}},
		{"the log store after the primary stays away", datadir.MaxEpochGap, func(t *testing.T, named datadir.Vote) (string, string, func() int32) {
			ls := &namingLogStore{vote: named}
			return listen(t, func(g *grpc.Server) { walshipv1.RegisterReplicationServiceServer(g, unavailablePrimary{}) }),
				listen(t, func(g *grpc.Server) { walshipv1.RegisterLogStoreServiceServer(g, ls) }), ls.calls.Load
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for _, jump := range []uint64{tc.bound + 1, tc.bound} {
				real := newFakePrimary(t)
				named := datadir.Vote{Epoch: promised + jump, Primary: "p9", Addr: real.addr}
				dir := t.TempDir()
				if err := datadir.SaveVote(vfs.OS, dir, datadir.Vote{Epoch: promised}); err != nil {
					t.Fatal(err)
				}
				follow, logstore, asked := tc.source(t, named)
				cfg := testConfig(t, dir, follow)
				if logstore != "" {
					cfg.LogStores = []string{logstore}
				}
				r := start(t, cfg)
				if jump == tc.bound {
					if s := real.next(t); s.hello.GetFencedEpoch() != named.Epoch {
						t.Fatalf("hello to the primary named at the bound: %v", s.hello)
					}
					if v, err := datadir.LoadVote(vfs.OS, dir); err != nil || v != named {
						t.Fatalf("vote %v, %v; want %v", v, err, named)
					}
					continue
				}
				// Asked again after the answer: it was read, and not believed.
				testkit.Until(t, "the replica to ask twice, or follow", func() bool { return asked() >= 2 || r.s.primary() != follow })
				if v, err := datadir.LoadVote(vfs.OS, dir); err != nil || v != (datadir.Vote{Epoch: promised}) {
					t.Fatalf("vote %v, %v after a peer named epoch %d; want epoch %d kept", v, err, named.Epoch, promised)
				}
				if r.s.primary() != follow {
					t.Fatalf("follows %s after a peer named epoch %d at %s", r.s.primary(), named.Epoch, real.addr)
				}
				if err := r.stop(t); err != nil {
					t.Fatal(err)
				}
			}
		})
	}
}

// TestPrimaryAheadVouchedByTheLogStore: a replica that was away while a
// promotion fenced the others in steps sees the new primary's heartbeat
// more than datadir.MaxEpochJump above its promise. It does not take the
// heartbeat's word for it, but asks its log stores at once, which vouch
// for that primary: it promises its epoch and follows it.
func TestPrimaryAheadVouchedByTheLogStore(t *testing.T) {
	const promised = 5
	fp := newFakePrimary(t)
	ahead := datadir.Vote{Epoch: promised + 2*datadir.MaxEpochJump + 1, Primary: "p2", Addr: fp.addr}
	dir := t.TempDir()
	if err := datadir.SaveVote(vfs.OS, dir, datadir.Vote{Epoch: promised}); err != nil {
		t.Fatal(err)
	}
	ls := &namingLogStore{vote: datadir.Vote{Epoch: promised}}
	cfg := testConfig(t, dir, fp.addr)
	cfg.LogStores = []string{listen(t, func(g *grpc.Server) { walshipv1.RegisterLogStoreServiceServer(g, ls) })}
	r := start(t, cfg)
	// Before the log stores know of it, the heartbeat is refused and
	// nothing is promised.
	s := fp.next(t)
	s.clusterBeat(t, ahead.Epoch, 0, ahead.Primary, ahead.Addr, "")
	s = fp.next(t)
	if v := r.s.Vote(); v.Epoch != promised {
		t.Fatalf("vote %v after a heartbeat of epoch %d the log store does not vouch for", v, ahead.Epoch)
	}
	ls.set(ahead)
	s.clusterBeat(t, ahead.Epoch, 0, ahead.Primary, ahead.Addr, "")
	testkit.Until(t, "the replica to promise the epoch the log store vouches for", func() bool { return r.s.Vote() == ahead })
	s = fp.next(t)
	s.clusterBeat(t, ahead.Epoch, 0, ahead.Primary, ahead.Addr, "")
	if s.hello.GetFencedEpoch() != ahead.Epoch {
		t.Fatalf("hello after the log store vouched: %v", s.hello)
	}
	select {
	case <-s.acks: // the heartbeat asked for a reply: taken
	case <-time.After(10 * time.Second):
		t.Fatal("no ack of the vouched-for primary's heartbeat")
	}
}
