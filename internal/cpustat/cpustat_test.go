package cpustat

import (
	"testing"
	"time"
)

// TestSelfCountsWork: CPU time grows by at least the work done on this
// thread (a busy loop of a measured wall time), and never goes backwards.
func TestSelfCountsWork(t *testing.T) {
	before, err := Self()
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	n := 0
	for time.Since(start) < 50*time.Millisecond {
		n++
	}
	after, err := Self()
	if err != nil {
		t.Fatal(err)
	}
	// The loop ran for 50 ms of wall time; on a loaded machine it may have
	// had less CPU than that, but never none.
	if after <= before {
		t.Fatalf("CPU time went from %v to %v over a %d-iteration busy loop", before, after, n)
	}
}
