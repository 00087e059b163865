// Package testkit is what tests of several packages share:
//
//   - waiting for a state that has no event to wait on (a metric, a count
//     behind a lock): [Until] and [UntilWithin] poll the condition until it
//     holds or a deadline passes, rather than sleeping a guessed time;
//   - the walship binary, for tests that run it as a real process
//     ([Walship], [Main]);
//   - Docker, for tests that need hosts of their own ([NewDockerRun]);
//   - a data directory's files, to check a refusal changed nothing
//     ([DirContents], [SameContents]);
//   - loopback addresses for nodes a test starts, and restarts, later
//     ([FreeAddr], internal/freeport's).
//
// The Kubernetes API server that tests run is internal/kubetest's.
package testkit

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

// UntilWithin polls cond every 100 ms until it holds, and fails tb naming
// what it waited for if that takes more than timeout: for conditions that
// cost a call to another process.
func UntilWithin(tb testing.TB, timeout time.Duration, what string, cond func() bool) {
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
