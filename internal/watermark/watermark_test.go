package watermark

import (
	"context"
	"errors"
	"sync"
	"testing"
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
