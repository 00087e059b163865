package primary

import (
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	walshipv1 "github.com/walship/walship/gen/walship/v1"
	"github.com/walship/walship/internal/testkit"
	"github.com/walship/walship/internal/vfs"
	"github.com/walship/walship/internal/watermark"
	"google.golang.org/grpc/codes"
)

// lateGate is a Config.Gate with its Config.GateChanged: an election
// whose renewal comes late. Armed, it closes once the primary has made
// LSN at visible — after that commit was admitted and acknowledged,
// before it is answered — and stays closed until renew opens it.
type lateGate struct {
	mu      sync.Mutex
	s       *Server
	at      uint64 // 0: not armed
	closed  bool
	waits   int // GateChanged calls: one per look of a waiting commit
	renewed watermark.Watermark
}

func (g *lateGate) gate() error {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.at != 0 && !g.closed && g.s.pipe.visible.Load() >= g.at {
		g.closed, g.at = true, 0
	}
	if !g.closed {
		return nil
	}
	return errors.New("the Lease's renewal is late")
}

func (g *lateGate) changed() <-chan struct{} {
	g.mu.Lock()
	g.waits++
	g.mu.Unlock()
	_, ch := g.renewed.Changed()
	return ch
}

// renew is a renewal that came through; it opens the gate only with open
// (a renewal that took too long comes and leaves Held false).
func (g *lateGate) renew(open bool) {
	g.mu.Lock()
	if open {
		g.closed = false
	}
	g.mu.Unlock()
	g.renewed.Advance(g.renewed.Load() + 1)
}

func (g *lateGate) arm(s *Server, at uint64) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.s, g.at, g.closed = s, at, false
}

// waitsAtLeast waits until waiting commits have looked at the gate n
// times in all.
func (g *lateGate) waitsAtLeast(t *testing.T, n int) {
	t.Helper()
	testkit.Until(t, fmt.Sprintf("%d looks at the closed gate", n), func() bool {
		g.mu.Lock()
		defer g.mu.Unlock()
		return g.waits >= n
	})
}

// TestCommitWaitsForTheElection: a commit acknowledged under the
// contract while the primary's election renewal is late waits up to
// GateGrace for it, looking again at each renewal: answered once the
// primary holds the election again, UNAVAILABLE with an unknown outcome
// if it does not within the grace, at once without a grace.
// walship_primary_election_waits_total counts both outcomes.
func TestCommitWaitsForTheElection(t *testing.T) {
	for _, tc := range []struct {
		name       string
		grace      time.Duration
		renew      bool
		ok         bool
		held, lost float64
	}{
		{"renewed within the grace", time.Minute, true, true, 1, 0},
		{"not renewed within the grace", 200 * time.Millisecond, false, false, 0, 1},
		{"no grace", 0, false, false, 0, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := &lateGate{}
			cfg := testConfig(t, t.TempDir())
			cfg.Gate = g.gate
			cfg.GateGrace = tc.grace
			cfg.GateChanged = g.changed
			r := start(t, cfg)
			c := ctx(t)
			if _, err := r.kv.Put(c, &walshipv1.PutRequest{Key: "before", Value: []byte("v")}); err != nil {
				t.Fatal(err)
			}
			g.arm(r.s, r.s.pipe.visible.Load()+1)
			type answer struct {
				resp *walshipv1.PutResponse
				err  error
			}
			done := make(chan answer, 1)
			go func() {
				resp, err := r.kv.Put(c, &walshipv1.PutRequest{Key: "k", Value: []byte("v")})
				done <- answer{resp, err}
			}()
			if tc.renew {
				// A renewal that leaves the gate closed: the commit looks
				// again and goes on waiting. The next one opens it.
				g.waitsAtLeast(t, 1)
				g.renew(false)
				g.waitsAtLeast(t, 2)
				g.renew(true)
			}
			a := <-done
			if tc.ok {
				if a.err != nil {
					t.Fatalf("Put while the renewal was late, renewed within the grace: %v", a.err)
				}
				if a.resp.GetLsn() == 0 {
					t.Fatalf("Put answered without its LSN: %v", a.resp)
				}
			} else {
				wantStatus(t, a.err, codes.Unavailable, "is in the log", "the Lease's renewal is late", "outcome is unknown")
			}
			if got := counter(t, r.s.metrics.gateWaits.WithLabelValues("held")); got != tc.held {
				t.Errorf("walship_primary_election_waits_total{outcome=held} = %v; want %v", got, tc.held)
			}
			if got := counter(t, r.s.metrics.gateWaits.WithLabelValues("lost")); got != tc.lost {
				t.Errorf("walship_primary_election_waits_total{outcome=lost} = %v; want %v", got, tc.lost)
			}
			// Either way the write is in the log and the state.
			g.renew(true)
			got, err := r.kv.Get(c, &walshipv1.GetRequest{Key: "k"})
			if err != nil || string(got.GetValue()) != "v" {
				t.Fatalf("Get k after the commit: %v, %v", got, err)
			}
		})
	}
}

// TestCommitsWaitForTheElectionTogether: commits acknowledged together
// while the renewal is late all wait for the gate, and one renewal
// answers every one.
func TestCommitsWaitForTheElectionTogether(t *testing.T) {
	const n = 16
	g := &lateGate{}
	mem := vfs.NewMem()
	cfg := testConfig(t, t.TempDir())
	cfg.FS = mem
	cfg.Gate = g.gate
	cfg.GateChanged = g.changed
	cfg.GateGrace = time.Minute
	r := start(t, cfg)
	c := ctx(t)
	syncPolicy := &walshipv1.CommitPolicy{Durability: walshipv1.Durability_DURABILITY_SYNC}
	if _, err := r.kv.Put(c, &walshipv1.PutRequest{Key: "before", Value: []byte("v"), Policy: syncPolicy}); err != nil {
		t.Fatal(err)
	}
	// The n commits are sequenced while the WAL's fsync is held, the gate
	// closes, then the fsync goes through: every one is acknowledged
	// under the contract with the gate closed.
	held := make(chan struct{})
	mem.InjectSyncError(func(name string) error {
		if filepath.Ext(name) == ".wal" {
			<-held
		}
		return nil
	})
	r.s.pipe.seqMu.Lock()
	txn0 := r.s.pipe.nextTxn
	r.s.pipe.seqMu.Unlock()
	errs := make(chan error, n)
	for i := range n {
		go func() {
			_, err := r.kv.Put(c, &walshipv1.PutRequest{Key: fmt.Sprintf("k%d", i), Value: []byte("v"), Policy: syncPolicy})
			errs <- err
		}()
	}
	testkit.Until(t, "every Put sequenced", func() bool {
		r.s.pipe.seqMu.Lock()
		defer r.s.pipe.seqMu.Unlock()
		return r.s.pipe.nextTxn >= txn0+n
	})
	g.mu.Lock()
	g.closed = true
	g.mu.Unlock()
	mem.InjectSyncError(nil)
	close(held)
	g.waitsAtLeast(t, n)
	g.renew(true)
	for range n {
		if err := <-errs; err != nil {
			t.Fatalf("Put acknowledged while the renewal was late, then renewed: %v", err)
		}
	}
	if got := counter(t, r.s.metrics.gateWaits.WithLabelValues("held")); got != n {
		t.Fatalf("walship_primary_election_waits_total{outcome=held} = %v; want %d", got, n)
	}
}

// TestGroupWaitsOneGrace: the writes of one Pipeline message,
// acknowledged together while the election's renewal is late and never
// renewed, wait for the gate one grace in all, not one each after the
// other: each is answered UNAVAILABLE (its outcome unknown) about one
// grace after the gate closed. (The bound checked, 3 graces for 4
// writes, leaves 2 graces of slack for a slow machine; one grace each
// would take 4.)
func TestGroupWaitsOneGrace(t *testing.T) {
	const grace = 2 * time.Second
	g := &lateGate{}
	cfg := testConfig(t, t.TempDir())
	cfg.Gate = g.gate
	cfg.GateGrace = grace
	cfg.GateChanged = g.changed
	r, s := startPipeline(t, cfg)
	g.arm(r.s, r.s.pipe.visible.Load()+1)
	msg := pipeOp(1, &walshipv1.PutRequest{Key: "k1", Value: []byte("v")})
	for id := uint64(2); id <= 4; id++ {
		msg.More = append(msg.More, pipeOp(id, &walshipv1.PutRequest{Key: fmt.Sprintf("k%d", id), Value: []byte("v")}))
	}
	start := time.Now()
	if err := s.Send(msg); err != nil {
		t.Fatal(err)
	}
	for range 4 {
		a, err := s.Recv()
		if err != nil {
			t.Fatal(err)
		}
		e := a.GetError()
		if codes.Code(e.GetCode()) != codes.Unavailable || !strings.Contains(e.GetMessage(), "outcome is unknown") {
			t.Fatalf("answer %v; want UNAVAILABLE, outcome unknown", a)
		}
	}
	if took := time.Since(start); took > 3*grace {
		t.Fatalf("4 writes of one message answered after %v with a grace of %v: they waited one after the other", took, grace)
	}
}
