package hostile

import (
	"context"
	"errors"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	walshipv1 "github.com/walship/walship/gen/walship/v1"
	"github.com/walship/walship/internal/testkit"
	"github.com/walship/walship/internal/tlsid"
)

func TestMain(m *testing.M) { testkit.Main(m) }

// maxGrowth is the target: under any single-certificate attack a
// server's RSS stays within this of its baseline.
const maxGrowth = 256 << 20

// attackTime is how long each attack runs: a few seconds in CI,
// $WALSHIP_HOSTILE_SECONDS when set (the targets are for 30 s).
func attackTime(tb testing.TB) time.Duration {
	if s := os.Getenv("WALSHIP_HOSTILE_SECONDS"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 {
			tb.Fatalf("WALSHIP_HOSTILE_SECONDS=%q: want a positive number of seconds", s)
		}
		return time.Duration(n) * time.Second
	}
	return 2 * time.Second
}

// TestHostileClients runs each attack against a cluster of real
// processes of its own (a log store, a primary and a replica, mTLS under
// the default policy) for a bounded time while a well-behaved client
// commits and reads back what it wrote. It asserts only what must hold
// whatever the machine's load: the attacked server's RSS stays within
// 256 MiB of its baseline (the cluster idle, the attack's data loaded),
// no server exits, and the well-behaved client never reads a wrong
// answer. Its throughput is BenchmarkWellBehavedClient's to measure.
//
// A fresh cluster per attack: Go keeps the heap an attack grew for a
// while, so the next attack would start from it (and reuse it unseen).
func TestHostileClients(t *testing.T) {
	if testing.Short() {
		t.Skip("starts three processes per attack and attacks them")
	}
	if runtime.GOOS != "linux" {
		t.Skip("reads the servers' RSS from /proc")
	}
	d := attackTime(t)
	for i := range attacks {
		a := &attacks[i]
		t.Run(a.name, func(t *testing.T) {
			c := startCluster(t)
			e := newEnv(t, c.pki)
			if a.data {
				load(waitCtx(t, time.Minute), t, c)
			}
			target := c.proc(a.target)
			baseline, err := target.rss()
			if err != nil {
				t.Fatal(err)
			}
			good := startGoodClient(t, c, 4)
			peak := runAttack(t, e, a, target, d)
			for _, p := range []*proc{c.logstore, c.primary, c.replica} {
				if gone, how := p.exited(); gone {
					t.Fatalf("%s exited during %s (%s):\n%s", p.name, a.name, how, p.logs())
				}
			}
			good.stop(t)
			growth := peak - baseline
			t.Logf("%s: RSS %d MiB before, peak %d MiB (%+d MiB)", target.name, baseline>>20, peak>>20, growth>>20)
			if growth > maxGrowth {
				t.Errorf("%s's RSS grew by %d MiB under %s, more than %d MiB", target.name, growth>>20, a.name, maxGrowth>>20)
			}
		})
	}
}

// runAttack runs a against target for d once its load is in place (or
// after d if it never is), sampling target's RSS; it returns the peak.
func runAttack(tb testing.TB, e *env, a *attack, target *proc, d time.Duration) int64 {
	at := startAttacker(tb, a, target.addr, e)
	defer at.stop()
	var peak int64
	sample := func() {
		if rss, err := target.rss(); err == nil {
			peak = max(peak, rss)
		}
	}
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	// The attack's clock starts once its load is in place.
	start := time.After(d)
	for ramping := true; ramping; {
		select {
		case <-at.ready:
			ramping = false
		case <-at.done:
			tb.Fatalf("the attacker of %s exited:\n%s", a.name, at.out.String())
		case <-start:
			tb.Logf("%s: its load was not in place after %v; attacking as it is", a.name, d)
			ramping = false
		case <-tick.C:
			sample()
		}
	}
	end := time.After(d)
	for running := true; running; {
		select {
		case <-end:
			running = false
		case <-tick.C:
			sample()
		}
	}
	sample()
	return peak
}

// goodClient commits with a certificate of its own, each write followed
// by a read of it on the primary, and counts its commits.
type goodClient struct {
	cancel  context.CancelFunc
	wg      sync.WaitGroup
	commits atomic.Int64
	errs    atomic.Int64
	mu      sync.Mutex
	wrong   []string
}

func startGoodClient(tb testing.TB, c *cluster, workers int) *goodClient {
	kv := walshipv1.NewKVServiceClient(grpcConn(tb, c.primary.addr, c.pki.files(tb, tlsid.ClassClient, "good")))
	ctx, cancel := context.WithCancel(context.Background())
	g := &goodClient{cancel: cancel}
	for w := range workers {
		g.wg.Go(func() {
			for i := 0; ctx.Err() == nil; i++ {
				key, val := fmt.Sprintf("good/%d/%d", w, i%50), fmt.Sprintf("%d", i)
				cctx, ccancel := context.WithTimeout(ctx, 10*time.Second)
				_, err := kv.Put(cctx, &walshipv1.PutRequest{Key: key, Value: []byte(val)})
				if err == nil {
					g.commits.Add(1)
					var got *walshipv1.GetResponse
					if got, err = kv.Get(cctx, &walshipv1.GetRequest{Key: key, RequirePrimary: true}); err == nil && (!got.Found || string(got.Value) != val) {
						g.mu.Lock()
						g.wrong = append(g.wrong, fmt.Sprintf("Get %s after its Put of %q = %v", key, val, got))
						g.mu.Unlock()
					}
				}
				ccancel()
				if err != nil && ctx.Err() == nil && !errors.Is(err, context.Canceled) {
					g.errs.Add(1)
				}
			}
		})
	}
	return g
}

// stop ends the client, failing tb on any wrong answer; errors (a commit
// slowed past its deadline by an attack) are logged, not failed.
func (g *goodClient) stop(tb testing.TB) {
	g.cancel()
	g.wg.Wait()
	tb.Logf("well-behaved client: %d commits, %d errors meanwhile", g.commits.Load(), g.errs.Load())
	for _, w := range g.wrong {
		tb.Errorf("wrong answer: %s", w)
	}
}
