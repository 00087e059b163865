package primary

import (
	"context"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// TestShipHold: no delay never holds; a hold is counted once, from its
// first batch until its end, whatever wakes it meanwhile; once over, the
// stream sends until it is caught up, and a new hold starts after that; a
// done context ends a hold with its error.
func TestShipHold(t *testing.T) {
	holds := prometheus.NewCounter(prometheus.CounterOpts{Name: "holds"})
	ctx := t.Context()
	woken := make(chan struct{})
	close(woken)

	off := newShipHold(0, holds)
	if waited, err := off.wait(ctx, nil, nil, nil); waited || err != nil {
		t.Fatalf("no delay: waited %v, %v", waited, err)
	}

	h := newShipHold(time.Hour, holds)
	defer h.stop()
	for i := range 2 {
		if waited, err := h.wait(ctx, nil, woken, nil); !waited || err != nil {
			t.Fatalf("wait %d within the hold: waited %v, %v", i, waited, err)
		}
	}
	if n := testutil.ToFloat64(holds); n != 1 {
		t.Fatalf("%v holds counted, want 1 (two waits of one hold)", n)
	}
	h.until = time.Now().Add(-time.Millisecond) // the hour is over
	if waited, err := h.wait(ctx, nil, nil, woken); waited || err != nil {
		t.Fatalf("after the hold: waited %v, %v; want send now", waited, err)
	}
	h.caughtUp()
	if waited, err := h.wait(ctx, woken, nil, nil); !waited || err != nil || testutil.ToFloat64(holds) != 2 {
		t.Fatalf("a new hold: waited %v, %v, %v holds", waited, err, testutil.ToFloat64(holds))
	}
	done, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := h.wait(done, nil, nil, nil); err == nil {
		t.Fatal("a done context did not end the hold")
	}
}
