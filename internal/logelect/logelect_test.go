package logelect

import (
	"context"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/walship/walship/internal/testkit"
	"github.com/walship/walship/services/logstore"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// stores runs n real log stores on loopback until the test ends.
func stores(t *testing.T, n int) []string {
	t.Helper()
	var addrs []string
	for i := range n {
		cfg := logstore.DefaultConfig()
		cfg.Listen, cfg.MetricsListen = "127.0.0.1:0", ""
		cfg.DataDir = filepath.Join(t.TempDir(), "ls", string(rune('a'+i)))
		cfg.StopTimeout = 2 * time.Second
		cfg.Registry = prometheus.NewRegistry()
		s, err := logstore.New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- s.Run(ctx) }()
		t.Cleanup(func() {
			cancel()
			if err := <-done; err != nil {
				t.Error(err)
			}
		})
		addrs = append(addrs, s.Addr())
	}
	return addrs
}

func client(t *testing.T, id string, addrs []string) *Client {
	t.Helper()
	c, err := New(Config{ID: id, LogStores: addrs, LeaseDuration: 600 * time.Millisecond, RenewDeadline: 400 * time.Millisecond, RetryPeriod: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// campaign runs c's campaign until the returned stop is called; leading
// says whether its lead runs.
func campaign(t *testing.T, c *Client, create bool) (leading *atomic.Bool, stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	leading = &atomic.Bool{}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for ctx.Err() == nil {
			_ = c.Campaign(ctx, create, func(lctx context.Context) {
				leading.Store(true)
				<-lctx.Done()
				leading.Store(false)
			})
		}
	}()
	stopped := false
	stop = func() {
		if !stopped {
			stopped = true
			cancel()
			<-done
		}
	}
	t.Cleanup(stop)
	return leading, stop
}

func TestElectionOnLogStores(t *testing.T) {
	addrs := stores(t, 3)
	ctx := context.Background()
	a, b, op := client(t, "a", addrs), client(t, "b", addrs), client(t, "", addrs)

	// Never held: only a creating campaign takes it.
	if exists, err := b.Exists(ctx); err != nil || exists {
		t.Fatalf("Exists before any campaign: %v, %v", exists, err)
	}
	if _, ok := b.acquire(ctx, false); ok {
		t.Fatal("a replica took an election never held")
	}
	aLeads, stopA := campaign(t, a, true)
	testkit.Until(t, "a to lead", aLeads.Load)
	if !a.Held() {
		t.Fatal("a leads but does not hold the election")
	}
	// Its next renewal closes Renewed's channel (what a commit waiting out
	// a late renewal waits on).
	select {
	case <-a.Renewed():
	case <-time.After(time.Minute):
		t.Fatal("a renews the election, but Renewed's channel did not close in a minute")
	}

	// While a renews, b cannot win, paused or not.
	v, err := b.Read(ctx)
	if err != nil || !v.Alive || v.Holder != "a" || v.AliveAt != 3 {
		t.Fatalf("b's view while a renews: %+v, %v", v, err)
	}
	if _, ok := b.acquire(ctx, false); ok {
		t.Fatal("b won while a renews")
	}
	if _, err := op.SetPaused(ctx, true); err != nil {
		t.Fatal(err)
	}
	bLeads, stopB := campaign(t, b, false)

	// a's stop releases it; paused, b still does not take it.
	stopA()
	if a.Held() {
		t.Fatal("a still holds after its campaign ended")
	}
	testkit.Until(t, "b to see no live holder", func() bool { v, err := b.Read(ctx); return err == nil && !v.Alive && v.Paused })
	for range 10 {
		if _, ok := b.acquire(ctx, false); ok || bLeads.Load() {
			t.Fatal("b won while paused")
		}
	}
	// Resumed, b takes it.
	if v, err := op.SetPaused(ctx, false); err != nil || v.Paused {
		t.Fatalf("resume: %+v, %v", v, err)
	}
	testkit.Until(t, "b to lead", bLeads.Load)

	// A take-over wins whoever holds it; b's renewals then fail and b
	// loses it.
	if err := a.TakeOver(ctx); err != nil {
		t.Fatal(err)
	}
	if !a.Held() {
		t.Fatal("a does not hold after its take-over")
	}
	testkit.Until(t, "b to lose it", func() bool { return !bLeads.Load() && !b.Held() })
	stopB()
}

// TestDeadHolderPassesAfterLease: a holder that stops renewing without
// releasing (kill -9) is judged dead by the log stores a lease after its
// last renewal; then exactly one of two candidates wins.
func TestDeadHolderPassesAfterLease(t *testing.T) {
	addrs := stores(t, 3)
	a := client(t, "a", addrs)
	aLeads, _ := campaign(t, a, true)
	testkit.Until(t, "a to lead", aLeads.Load)
	// a dies: its connections close, so it renews nowhere and releases
	// nothing.
	_ = a.Close()
	b, c := client(t, "b", addrs), client(t, "c", addrs)
	bLeads, stopB := campaign(t, b, false)
	cLeads, stopC := campaign(t, c, false)
	testkit.Until(t, "b or c to lead", func() bool { return bLeads.Load() || cLeads.Load() })
	if bLeads.Load() && cLeads.Load() {
		t.Fatal("both b and c lead")
	}
	stopB()
	stopC()
}
