package primary

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	walshipv1 "github.com/walship/walship/gen/walship/v1"
	"github.com/walship/walship/internal/datadir"
	"github.com/walship/walship/internal/testkit"
	"github.com/walship/walship/internal/vfs"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// TestFencedPrimaryStepsDown: a candidate's fence of a newer epoch is
// granted by the primary with the end of its (synced) log; the primary
// steps down at once — later writes fail UNAVAILABLE, Run returns a
// DeposedError naming the candidate, and the vote is saved so that a
// restart knows. A fence of its own epoch or older is refused.
func TestFencedPrimaryStepsDown(t *testing.T) {
	dir := t.TempDir()
	cfg := testConfig(t, dir)
	reg := prometheus.NewRegistry()
	cfg.Registry = reg
	r := start(t, cfg)
	c := ctx(t)
	put, err := r.kv.Put(c, &walshipv1.PutRequest{Key: "k", Value: []byte("v")})
	if err != nil {
		t.Fatal(err)
	}
	fence := walshipv1.NewEpochServiceClient(r.conn)
	id := r.s.cluster.ID()
	if resp, err := fence.Fence(c, &walshipv1.FenceRequest{Epoch: r.s.epoch, CandidateId: "c1", CandidateAddr: "x:1", ClusterId: id}); err != nil || resp.Granted {
		t.Fatalf("fence of the primary's own epoch = %v, %v", resp, err)
	}
	// An epoch above the maximum is a bad argument: the primary keeps
	// serving (the epoch after it would wrap to 0).
	if resp, err := fence.Fence(c, &walshipv1.FenceRequest{Epoch: math.MaxUint64, CandidateId: "c1", CandidateAddr: "x:1", ClusterId: id}); status.Code(err) != codes.InvalidArgument ||
		!strings.Contains(status.Convert(err).Message(), "epoch: 18446744073709551615 is above the highest epoch") {
		t.Fatalf("fence of epoch 2^64-1 = %v, %v; want INVALID_ARGUMENT naming epoch", resp, err)
	}
	// So is one more than 2^20 above the primary's: it keeps serving.
	far := r.s.epoch + datadir.MaxEpochJump + 1
	if resp, err := fence.Fence(c, &walshipv1.FenceRequest{Epoch: far, CandidateId: "c1", CandidateAddr: "x:1", ClusterId: id}); status.Code(err) != codes.InvalidArgument ||
		!strings.Contains(status.Convert(err).Message(), fmt.Sprintf("epoch: %d is more than 1048576 (the most one message may move an epoch) above %d", far, r.s.epoch)) {
		t.Fatalf("fence of epoch %d = %v, %v; want INVALID_ARGUMENT naming the bound", far, resp, err)
	}
	// So is a candidate address its vote file could not hold.
	if resp, err := fence.Fence(c, &walshipv1.FenceRequest{Epoch: r.s.epoch + 1, CandidateId: "c1", CandidateAddr: "x:1 y", ClusterId: id}); status.Code(err) != codes.InvalidArgument ||
		!strings.Contains(status.Convert(err).Message(), "candidate_addr") {
		t.Fatalf("fence from candidate address %q = %v, %v; want INVALID_ARGUMENT naming candidate_addr", "x:1 y", resp, err)
	}
	if _, err := r.kv.Put(c, &walshipv1.PutRequest{Key: "k", Value: []byte("v")}); err != nil {
		t.Fatalf("Put after the refused fences: %v", err)
	}
	// Exported (gathered now: once deposed, the primary's Run winds down
	// and takes its metrics out of the registry, for the node's next role).
	if n, err := testutil.GatherAndCount(reg, "walship_fences_granted_total"); err != nil || n != 1 {
		t.Fatalf("walship_fences_granted_total exported %d times, %v", n, err)
	}
	resp, err := fence.Fence(c, &walshipv1.FenceRequest{Epoch: r.s.epoch + 1, CandidateId: "c1", CandidateAddr: "10.0.0.9:7401", ClusterId: id})
	if err != nil {
		t.Fatal(err)
	}
	if !resp.Granted || !resp.Primary || resp.LastLsn != put.Lsn+2 || resp.LastEpoch != r.s.epoch || len(resp.History) == 0 {
		t.Fatalf("fence = %v", resp)
	}
	// An operator sees the grant: the refused fences do not count.
	if v := testutil.ToFloat64(r.s.metrics.fences); v != 1 {
		t.Fatalf("walship_fences_granted_total = %v after one granted fence, want 1", v)
	}
	_, err = r.kv.Put(c, &walshipv1.PutRequest{Key: "k", Value: []byte("w")})
	if status.Code(err) != codes.Unavailable {
		t.Fatalf("Put after stepping down = %v; want UNAVAILABLE", err)
	}
	_, err = r.kv.Get(c, &walshipv1.GetRequest{Key: "k"})
	if status.Code(err) != codes.Unavailable {
		t.Fatalf("Get after stepping down = %v; want UNAVAILABLE", err)
	}
	var deposed *DeposedError
	if err := r.failed(t, "the fence"); !errors.As(err, &deposed) || deposed.Vote.Primary != "c1" || deposed.Vote.Addr != "10.0.0.9:7401" {
		t.Fatalf("Run = %v; want a DeposedError naming c1", err)
	}
	if v, err := datadir.LoadVote(vfs.OS, dir); err != nil || v.Primary != "c1" || v.Epoch != resp.Epoch {
		t.Fatalf("vote after stepping down: %v, %v", v, err)
	}
}

// TestLogStoreEpochJump: a log store's answer naming an epoch more than
// datadir.MaxEpochGap above the primary's is not believed — at the
// election (a fence's refusal) or while shipping (Status) — so the
// primary does not step down for it nor promise it: a deposed primary
// saves the epoch that deposed it, and one answer must not move it to the
// last epoch. A newer epoch within the bound deposes it as ever, though
// further ahead than one message may move an epoch: the log store took
// it a jump at a time.
func TestLogStoreEpochJump(t *testing.T) {
	newer := func(jump uint64) fenceFunc {
		return func(req *walshipv1.FenceRequest) (*walshipv1.FenceResponse, error) {
			return &walshipv1.FenceResponse{Epoch: req.Epoch + jump, PrimaryId: "x", PrimaryAddr: "x:1"}, nil
		}
	}
	grant := func(req *walshipv1.FenceRequest) (*walshipv1.FenceResponse, error) {
		return &walshipv1.FenceResponse{Granted: true, Epoch: req.Epoch}, nil
	}
	t.Run("election", func(t *testing.T) {
		// One log store of three names an epoch past the gap: the two
		// others elect the primary, which keeps its own vote.
		dir := t.TempDir()
		cfg := testConfig(t, dir)
		cfg.LogStores = []string{fakeLogStore(t, grant), fakeLogStore(t, newer(datadir.MaxEpochGap+1)), fakeLogStore(t, grant)}
		s, stop, _ := run(t, cfg)
		testkit.Until(t, "the primary to win its epoch", func() bool { return s.epochReady.Load() })
		if v, err := datadir.LoadVote(vfs.OS, dir); err != nil || v.Primary != s.cfg.ID || v.Epoch != s.epoch {
			t.Fatalf("vote %v, %v; want this primary's own, epoch %d", v, err, s.epoch)
		}
		if err := stop(); err != nil {
			t.Fatal(err)
		}
		// Within the bound, the same answer deposes it (it was deposed
		// while it was down).
		cfg.LogStores = []string{fakeLogStore(t, grant), fakeLogStore(t, newer(datadir.MaxEpochGap)), fakeLogStore(t, grant)}
		s, _, wait := run(t, cfg)
		var deposed *DeposedError
		if err := wait(); !errors.As(err, &deposed) || deposed.Vote.Epoch != s.epoch+datadir.MaxEpochGap {
			t.Fatalf("Run = %v; want a DeposedError of epoch %d", err, s.epoch+datadir.MaxEpochGap)
		}
	})
	t.Run("shipping", func(t *testing.T) {
		for _, jump := range []uint64{datadir.MaxEpochGap + 1, datadir.MaxEpochGap} {
			dir := t.TempDir()
			cfg := testConfig(t, dir)
			ls := &statusLogStore{jump: jump}
			cfg.LogStores = []string{ls.serve(t)}
			s, err := New(cfg)
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithCancel(context.Background())
			ended := make(chan error, 1)
			go func() { ended <- s.Run(ctx) }()
			if jump == datadir.MaxEpochGap {
				var deposed *DeposedError
				if err := <-ended; !errors.As(err, &deposed) || deposed.Vote.Epoch != ls.fenced.Load()+jump {
					t.Fatalf("Run = %v; want a DeposedError of epoch %d", err, ls.fenced.Load()+jump)
				}
				cancel()
				continue
			}
			// Asked again after its answer: it was read, and not believed.
			testkit.Until(t, "the primary to ask the log store twice", func() bool { return ls.calls.Load() >= 2 || len(ended) > 0 })
			select {
			case err := <-ended:
				t.Fatalf("Run = %v after a log store named epoch %d; want it still running", err, ls.fenced.Load()+jump)
			default:
			}
			if v, err := datadir.LoadVote(vfs.OS, dir); err != nil || v.Primary != s.cfg.ID || v.Epoch != ls.fenced.Load() {
				t.Fatalf("vote %v, %v; want this primary's own, of the epoch it won (%d)", v, err, ls.fenced.Load())
			}
			cancel()
			if err := <-ended; err != nil {
				t.Fatalf("Run after cancel = %v", err)
			}
		}
	})
}

// statusLogStore grants every fence and answers Status with a promise
// jump epochs above the newest fence (Append is not served: shipping to
// it fails and retries).
type statusLogStore struct {
	walshipv1.UnimplementedEpochServiceServer
	walshipv1.UnimplementedLogStoreServiceServer
	jump   uint64
	fenced atomic.Uint64
	calls  atomic.Int32
}

func (l *statusLogStore) Fence(_ context.Context, req *walshipv1.FenceRequest) (*walshipv1.FenceResponse, error) {
	l.fenced.Store(req.GetEpoch())
	return &walshipv1.FenceResponse{Granted: true, Epoch: req.GetEpoch()}, nil
}

func (l *statusLogStore) Status(context.Context, *walshipv1.LogStoreServiceStatusRequest) (*walshipv1.LogStoreServiceStatusResponse, error) {
	l.calls.Add(1)
	return &walshipv1.LogStoreServiceStatusResponse{Epoch: l.fenced.Load() + l.jump, VoteEpoch: l.fenced.Load() + l.jump, PrimaryId: "x", PrimaryAddr: "x:1"}, nil
}

func (l *statusLogStore) serve(t *testing.T) string {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	g := grpc.NewServer()
	walshipv1.RegisterEpochServiceServer(g, l)
	walshipv1.RegisterLogStoreServiceServer(g, l)
	go func() { _ = g.Serve(lis) }()
	t.Cleanup(g.Stop)
	return lis.Addr().String()
}

// TestLaggingLogStoreFencedInSteps: a log store whose promise is more
// than datadir.MaxEpochJump behind the primary's epoch would refuse its
// heartbeat (one message may not move an epoch that far) — it was away
// while a promotion fenced the others in steps, or it emptied its
// directory in an old cluster. The primary fences it, as itself, at each
// of datadir.EpochSteps first, then ships to it.
func TestLaggingLogStoreFencedInSteps(t *testing.T) {
	dir := t.TempDir()
	const seen = 3 * datadir.MaxEpochJump // the primary begins the epoch after it
	if err := datadir.SaveVote(vfs.OS, dir, datadir.Vote{Epoch: seen, Primary: "primary"}); err != nil {
		t.Fatal(err)
	}
	cfg := testConfig(t, dir)
	ls := &laggingLogStore{promised: 1, appends: make(chan struct{}, 1)}
	cfg.LogStores = []string{ls.serve(t)}
	_, stop, _ := run(t, cfg)
	select {
	case <-ls.appends:
	case <-time.After(30 * time.Second):
		t.Fatalf("no Append stream after the fences %v", ls.fences())
	}
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	// The election's fence, then the steps from the log store's promise,
	// each within the jump of the one before, the last within it of the
	// primary's epoch (its heartbeat's).
	want := []uint64{seen + 1, 1 + datadir.MaxEpochJump, 1 + 2*datadir.MaxEpochJump}
	if got := ls.fences(); !slices.Equal(got[:min(len(got), len(want))], want) {
		t.Fatalf("fences %v; want %v first", got, want)
	}
}

// TestLogStoreHistoryChecked: the history a log store states decides
// what of its log it keeps (SharedUpTo); one that is not a history —
// here a first LSN of 0 after the epoch the primary shares with it,
// which once read as "keeps everything" — is refused, and nothing is
// shipped to that log store, while the same log store stating a sound
// history is shipped to.
func TestLogStoreHistoryChecked(t *testing.T) {
	for _, tc := range []struct {
		name    string
		history []*walshipv1.EpochStart
		ships   bool
	}{
		{"sound", []*walshipv1.EpochStart{{Epoch: 1, FirstLsn: 1}}, true},
		{"first LSN of 0", []*walshipv1.EpochStart{{Epoch: 1, FirstLsn: 1}, {Epoch: 2, FirstLsn: 0}}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := testConfig(t, t.TempDir())
			ls := &laggingLogStore{promised: 1, history: tc.history, appends: make(chan struct{}, 1)}
			cfg.LogStores = []string{ls.serve(t)}
			_, stop, _ := run(t, cfg)
			defer func() {
				if err := stop(); err != nil {
					t.Fatal(err)
				}
			}()
			if tc.ships {
				select {
				case <-ls.appends:
				case <-time.After(30 * time.Second):
					t.Fatal("no Append stream to a log store stating a sound history")
				}
				return
			}
			// Asked again after each refusal, never shipped to.
			testkit.Until(t, "the primary to ask the log store three times", func() bool { return ls.statuses.Load() >= 3 })
			select {
			case <-ls.appends:
				t.Fatalf("an Append stream to a log store stating history %v", tc.history)
			default:
			}
		})
	}
}

// laggingLogStore grants every fence, says in Status that it promised
// epoch promised whatever it granted, and signals each Append stream (it
// serves none).
type laggingLogStore struct {
	walshipv1.UnimplementedEpochServiceServer
	walshipv1.UnimplementedLogStoreServiceServer
	promised uint64
	history  []*walshipv1.EpochStart // stated in Status
	appends  chan struct{}
	statuses atomic.Int32
	mu       sync.Mutex
	fenced   []uint64
}

func (l *laggingLogStore) Fence(_ context.Context, req *walshipv1.FenceRequest) (*walshipv1.FenceResponse, error) {
	l.mu.Lock()
	l.fenced = append(l.fenced, req.GetEpoch())
	l.mu.Unlock()
	return &walshipv1.FenceResponse{Granted: true, Epoch: req.GetEpoch()}, nil
}

func (l *laggingLogStore) fences() []uint64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.fenced)
}

func (l *laggingLogStore) Status(context.Context, *walshipv1.LogStoreServiceStatusRequest) (*walshipv1.LogStoreServiceStatusResponse, error) {
	l.statuses.Add(1)
	return &walshipv1.LogStoreServiceStatusResponse{Epoch: l.promised, VoteEpoch: l.promised, History: l.history,
		FirstLsn: min(uint64(len(l.history)), 1), DurableLsn: 9}, nil
}

func (l *laggingLogStore) Append(grpc.BidiStreamingServer[walshipv1.AppendRequest, walshipv1.AppendResponse]) error {
	select {
	case l.appends <- struct{}{}:
	default:
	}
	return status.Error(codes.Unavailable, "not serving appends")
}

func (l *laggingLogStore) serve(t *testing.T) string {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	g := grpc.NewServer()
	walshipv1.RegisterEpochServiceServer(g, l)
	walshipv1.RegisterLogStoreServiceServer(g, l)
	go func() { _ = g.Serve(lis) }()
	t.Cleanup(g.Stop)
	return lis.Addr().String()
}
