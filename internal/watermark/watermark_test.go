package watermark

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestAdvanceIsMonotonic(t *testing.T) {
	var w Watermark
	for _, tc := range []struct{ advance, want uint64 }{{5, 5}, {3, 5}, {5, 5}, {9, 9}} {
		w.Advance(tc.advance)
		if got := w.Load(); got != tc.want {
			t.Fatalf("after Advance(%d): Load = %d, want %d", tc.advance, got, tc.want)
		}
	}
}

func TestWaitWakesEveryWaiterAtItsLSN(t *testing.T) {
	var w Watermark
	var wg sync.WaitGroup
	got := make([]uint64, 10)
	for i := range got {
		wg.Add(1)
		go func() {
			defer wg.Done()
			v, err := w.Wait(context.Background(), uint64(i+1))
			if err != nil {
				t.Errorf("waiter %d: %v", i, err)
			}
			got[i] = v
		}()
	}
	for v := uint64(1); v <= 10; v++ {
		w.Advance(v)
	}
	wg.Wait()
	for i, v := range got {
		if v < uint64(i+1) {
			t.Errorf("waiter for %d returned at %d", i+1, v)
		}
	}
}

func TestWaitHonoursContext(t *testing.T) {
	var w Watermark
	w.Advance(3)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	v, err := w.Wait(ctx, 4)
	if !errors.Is(err, context.DeadlineExceeded) || v != 3 {
		t.Fatalf("Wait = %d, %v; want 3, DeadlineExceeded", v, err)
	}
	if v, err := w.Wait(context.Background(), 2); err != nil || v != 3 {
		t.Fatalf("Wait for a reached LSN = %d, %v", v, err)
	}
}

func TestResetMovesBackwards(t *testing.T) {
	var w Watermark
	w.Advance(10)
	w.Reset(4)
	if v := w.Load(); v != 4 {
		t.Fatalf("after Reset(4) = %d", v)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	if _, err := w.Wait(ctx, 5); err == nil {
		t.Fatal("Wait(5) returned after a reset to 4")
	}
	w.Advance(5)
	if v, err := w.Wait(context.Background(), 5); err != nil || v != 5 {
		t.Fatalf("Wait(5) = %d, %v", v, err)
	}
}

// doneCounter counts calls of Done: a waiter calls it each time it goes
// (back) to sleep.
type doneCounter struct {
	context.Context
	calls atomic.Int64
}

func (c *doneCounter) Done() <-chan struct{} {
	c.calls.Add(1)
	return c.Context.Done()
}

// TestAdvanceWakesOnlyTheWaitersItReaches: waiters for LSN 1000 and 1001
// sleep through every advance below their LSN (one that woke them all
// made each commit pay for every read waiting on a far LSN); 1000 wakes
// the first half only, 1001 the rest.
func TestAdvanceWakesOnlyTheWaitersItReaches(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var w Watermark
		ctx := &doneCounter{Context: t.Context()}
		const n = 100
		var woken atomic.Int64
		var wg sync.WaitGroup
		for i := range n {
			wg.Go(func() {
				if _, err := w.Wait(ctx, 1000+uint64(i%2)); err != nil {
					t.Errorf("Wait: %v", err)
				}
				woken.Add(1)
			})
		}
		synctest.Wait()
		asleep := ctx.calls.Load()
		for v := uint64(1); v < 1000; v += 37 {
			w.Advance(v)
			synctest.Wait()
		}
		if extra := ctx.calls.Load() - asleep; extra != 0 {
			t.Errorf("advances below the waiters' LSN woke them: %d more sleeps", extra)
		}
		w.Advance(1000)
		synctest.Wait()
		if got := woken.Load(); got != n/2 {
			t.Errorf("Advance(1000) woke %d waiters; want the %d waiting for 1000", got, n/2)
		}
		w.Advance(1001)
		wg.Wait()
	})
}

// TestWaitGivesUpAndLeavesNoWaiter: a waiter whose context ends is
// removed from the heap (a later advance has nothing to wake), and Wait
// then reports the context's error and the value it saw.
func TestWaitGivesUpAndLeavesNoWaiter(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var w Watermark
		w.Advance(7)
		ctx, cancel := context.WithCancel(t.Context())
		var v uint64
		var err error
		done := make(chan struct{})
		go func() {
			defer close(done)
			v, err = w.Wait(ctx, 50)
		}()
		synctest.Wait()
		if n := w.waiters.Len(); n != 1 {
			t.Fatalf("%d waiters registered; want 1", n)
		}
		cancel()
		<-done
		if !errors.Is(err, context.Canceled) || v != 7 {
			t.Fatalf("Wait after cancel = %d, %v; want 7, Canceled", v, err)
		}
		if n := w.waiters.Len(); n != 0 {
			t.Fatalf("%d waiters left after the only one gave up", n)
		}
		w.Advance(60)
		if v, err := w.Wait(context.Background(), 50); err != nil || v != 60 {
			t.Fatalf("Wait(50) after Advance(60) = %d, %v", v, err)
		}
	})
}
