package testkit

import (
	"sync/atomic"
	"testing"
)

// TestUntilReturnsOnceTheConditionHolds: Until keeps polling while cond is
// false and returns at the first true.
func TestUntilReturnsOnceTheConditionHolds(t *testing.T) {
	var calls atomic.Int32
	Until(t, "the third call", func() bool { return calls.Add(1) >= 3 })
	if n := calls.Load(); n != 3 {
		t.Fatalf("cond called %d times, want 3", n)
	}
}
