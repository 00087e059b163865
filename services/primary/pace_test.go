package primary

import (
	"context"
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	walshipv1 "github.com/walship/walship/gen/walship/v1"
	"github.com/walship/walship/internal/testkit"
)

// TestLearnerStreamIsPaced: with --learner-bytes-per-second set, a replica
// that is not a member (r3) catches up at that pace while a member behind
// by as much (r2) is not paced; added, r3 still catches up (nothing is
// written meanwhile), and as a member its stream is paced no more.
func TestLearnerStreamIsPaced(t *testing.T) {
	const rate = 1 << 20
	c := startMembersWith(t, 1, func(cfg *Config) {
		cfg.LearnerBytesPerSecond = rate
		cfg.MaxBatchBytes = 64 << 10
		// The lease is not what is tested: on a loaded machine a second
		// without a log store echo handled lost it, and a Put with it.
		cfg.LeaseTimeout = time.Minute
	}, "r1")
	value := make([]byte, 16<<10)
	// About a second and a half of catch-up at the pace, past its burst
	// (a tenth of a second, or 64 KiB).
	put := func(prefix string, n int) {
		t.Helper()
		for i := range n {
			if _, err := c.p.kv.Put(ctx(t), &walshipv1.PutRequest{Key: fmt.Sprintf("%s/%03d", prefix, i), Value: value}); err != nil {
				t.Fatal(err)
			}
		}
	}
	put("a", 100)
	last := c.p.s.wal.LastLSN()
	c.start(t, "r2")
	c.start(t, "r3")
	for _, id := range []string{"r2", "r3"} {
		testkit.Until(t, id+" to catch up", func() bool { return c.reps[id].s.Status().GetLastLsn() >= last })
	}
	paced := func(id string) (float64, float64) {
		return counter(t, c.p.s.metrics.pacedBytes.WithLabelValues(id)), counter(t, c.p.s.metrics.pacedSeconds.WithLabelValues(id))
	}
	if b, s := paced("r3"); b == 0 || s == 0 {
		t.Fatalf("r3, not a member, caught up unpaced: paced bytes %v, seconds %v", b, s)
	}
	for _, id := range []string{"r1", "r2"} {
		if b, s := paced(id); b != 0 || s != 0 {
			t.Fatalf("member %s was paced: bytes %v, seconds %v", id, b, s)
		}
	}

	resp, err := c.p.admin.ChangeMembers(ctx(t), &walshipv1.ChangeMembersRequest{
		Change: &walshipv1.ChangeMembersRequest_Add{Add: &walshipv1.Member{Id: "r3", Addr: c.reps["r3"].s.Addr()}}})
	if err != nil || resp.GetOutcome() != outcomeDone {
		t.Fatalf("add r3: %v, %v", resp, err)
	}
	before, _ := paced("r3")
	put("b", 100)
	last = c.p.s.wal.LastLSN()
	testkit.Until(t, "r3 to catch up as a member", func() bool { return c.reps["r3"].s.Status().GetLastLsn() >= last })
	if after, _ := paced("r3"); after != before {
		t.Fatalf("r3 was paced as a member: paced bytes %v, then %v", before, after)
	}
}

// BenchmarkPace is what pacing costs a stream per batch: nothing with no
// limit, an atomic load and a compare for a member's stream, and the
// bucket for a learner's (at a rate it never waits for).
func BenchmarkPace(b *testing.B) {
	for _, bc := range []struct {
		name string
		rate int64
		id   string
	}{{"limit=0", 0, "r1"}, {"member", 8 << 20, "r1"}, {"learner", 1 << 50, "r3"}} {
		b.Run(bc.name, func(b *testing.B) {
			s := &Server{cfg: Config{LearnerBytesPerSecond: bc.rate, MaxBatchBytes: 4 << 20}, logger: slog.New(slog.DiscardHandler), peers: newPeers(),
				metrics: &metrics{pacedBytes: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "b"}, []string{"replica"}),
					pacedSeconds: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "s"}, []string{"replica"})}}
			s.peers.ruleNow.Store(&ackRule{members: [][]string{{"r1", "r2"}}, eligible: map[string]bool{"r1": true, "r2": true}})
			x := &replicaSender{r: &replServer{s: s}, id: bc.id}
			defer x.paceState.stop()
			ctx := context.Background()
			b.ReportAllocs()
			for b.Loop() {
				if err := x.pace(ctx, 1<<10); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
