// Package testwait is for tests that must wait for a state with no event to
// wait on (a metric, a count behind a lock): it polls the condition until it
// holds or a deadline passes, rather than sleeping a guessed time.
package testwait

import (
	"testing"
	"time"
)

// Until polls cond every 5 ms until it holds, and fails tb naming what it
// waited for if that takes more than 10 seconds.
func Until(tb testing.TB, what string, cond func() bool) {
	tb.Helper()
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	deadline := time.After(10 * time.Second)
	for !cond() {
		select {
		case <-tick.C:
		case <-deadline:
			tb.Fatalf("timed out waiting for %s", what)
		}
	}
}

// For polls cond every 100 ms until it holds, and fails tb naming what it
// waited for if that takes more than timeout: for conditions that cost a
// call to another process.
func For(tb testing.TB, timeout time.Duration, what string, cond func() bool) {
	tb.Helper()
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	deadline := time.After(timeout)
	for !cond() {
		select {
		case <-tick.C:
		case <-deadline:
			tb.Fatalf("timed out after %v waiting for %s", timeout, what)
		}
	}
}
