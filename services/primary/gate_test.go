package primary

import (
	"errors"
	"fmt"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	walshipv1 "github.com/walship/walship/gen/walship/v1"
	"github.com/walship/walship/internal/testkit"
	"github.com/walship/walship/internal/vfs"
	"google.golang.org/grpc/codes"
)

// lateGate is a Config.Gate that closes once the primary has made LSN at
// visible — after that commit was admitted and acknowledged, before it is
// answered: an election renewal that came late — and opens again after
// it was asked reopenAfter more times (never with 0).
type lateGate struct {
	mu          sync.Mutex
	s           *Server
	at          uint64 // 0: not armed
	closed      bool
	asked       int // while closed
	reopenAfter int
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
	g.asked++
	if g.reopenAfter > 0 && g.asked > g.reopenAfter {
		g.closed = false
		return nil
	}
	return errors.New("the Lease's renewal is late")
}

func (g *lateGate) arm(s *Server, at uint64) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.s, g.at, g.closed, g.asked = s, at, false, 0
}

// TestCommitWaitsForTheElection: a commit acknowledged under the
// contract while the primary's election renewal is late waits up to
// GateGrace for it: answered once the primary holds the election again,
// UNAVAILABLE with an unknown outcome if it does not within the grace,
// at once without a grace. walship_primary_election_waits_total counts
// both outcomes.
func TestCommitWaitsForTheElection(t *testing.T) {
	for _, tc := range []struct {
		name        string
		grace       time.Duration
		reopenAfter int
		ok          bool
		held, lost  float64
	}{
		{"renewed within the grace", time.Minute, 3, true, 1, 0},
		{"not renewed within the grace", 200 * time.Millisecond, 0, false, 0, 1},
		{"no grace", 0, 3, false, 0, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := &lateGate{reopenAfter: tc.reopenAfter}
			cfg := testConfig(t, t.TempDir())
			cfg.Gate = g.gate
			cfg.GateGrace = tc.grace
			r := start(t, cfg)
			c := ctx(t)
			if _, err := r.kv.Put(c, &walshipv1.PutRequest{Key: "before", Value: []byte("v")}); err != nil {
				t.Fatal(err)
			}
			g.arm(r.s, r.s.pipe.visible.Load()+1)
			resp, err := r.kv.Put(c, &walshipv1.PutRequest{Key: "k", Value: []byte("v")})
			if tc.ok {
				if err != nil {
					t.Fatalf("Put while the renewal was late, renewed within the grace: %v", err)
				}
				if resp.GetLsn() == 0 {
					t.Fatalf("Put answered without its LSN: %v", resp)
				}
			} else {
				wantStatus(t, err, codes.Unavailable, "is in the log", "the Lease's renewal is late", "outcome is unknown")
			}
			if got := counter(t, r.s.metrics.gateWaits.WithLabelValues("held")); got != tc.held {
				t.Errorf("walship_primary_election_waits_total{outcome=held} = %v; want %v", got, tc.held)
			}
			if got := counter(t, r.s.metrics.gateWaits.WithLabelValues("lost")); got != tc.lost {
				t.Errorf("walship_primary_election_waits_total{outcome=lost} = %v; want %v", got, tc.lost)
			}
			// Either way the write is in the log and the state.
			g.mu.Lock()
			g.closed = false
			g.mu.Unlock()
			got, err := r.kv.Get(c, &walshipv1.GetRequest{Key: "k"})
			if err != nil || string(got.GetValue()) != "v" {
				t.Fatalf("Get k after the commit: %v, %v", got, err)
			}
		})
	}
}

// TestCommitsWaitForTheElectionTogether: commits acknowledged together
// while the renewal is late all wait for the gate (one of them polls it,
// the others wait on that one), and every one is answered once it opens.
func TestCommitsWaitForTheElectionTogether(t *testing.T) {
	const n = 16
	var closed atomic.Bool
	mem := vfs.NewMem()
	cfg := testConfig(t, t.TempDir())
	cfg.FS = mem
	cfg.Gate = func() error {
		if closed.Load() {
			return errors.New("the Lease's renewal is late")
		}
		return nil
	}
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
	closed.Store(true)
	mem.InjectSyncError(nil)
	close(held)
	testkit.Until(t, "every commit waiting for the gate", func() bool {
		r.s.gateWatch.mu.Lock()
		defer r.s.gateWatch.mu.Unlock()
		return r.s.gateWatch.waiting == n
	})
	closed.Store(false)
	for range n {
		if err := <-errs; err != nil {
			t.Fatalf("Put acknowledged while the renewal was late, then renewed: %v", err)
		}
	}
	if got := counter(t, r.s.metrics.gateWaits.WithLabelValues("held")); got != n {
		t.Fatalf("walship_primary_election_waits_total{outcome=held} = %v; want %d", got, n)
	}
}
