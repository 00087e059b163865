package primary

import (
	"context"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// shipHold is one stream's ship delay (Config.ShipDelay): once the stream
// finds a batch nothing waits on, it holds it until delay has passed, so
// that the batches written meanwhile go right after it, back to back. The
// hold is measured from the first batch held since the stream was last
// caught up: a stream with a backlog sends at once.
type shipHold struct {
	delay time.Duration
	until time.Time // when the current hold ends; zero while none is under way
	t     *time.Timer
	holds prometheus.Counter // walship_ship_delays_total{to}
}

func newShipHold(delay time.Duration, holds prometheus.Counter) *shipHold {
	t := time.NewTimer(time.Hour)
	t.Stop()
	return &shipHold{delay: delay, t: t, holds: holds}
}

// caughtUp ends the hold: the stream has sent everything, and the next
// batch may be held afresh.
func (h *shipHold) caughtUp() { h.until = time.Time{} }

// stop releases the timer.
func (h *shipHold) stop() { h.t.Stop() }

// wait holds the stream until the hold's end or until one of wake fires
// (a nil channel never does), and reports whether it waited: false means
// send now (no delay configured, or the hold is over). The caller looks
// again after a wait, and checks before calling that nothing waits on the
// batch.
func (h *shipHold) wait(ctx context.Context, a, b, c <-chan struct{}) (bool, error) {
	if h.delay <= 0 {
		return false, nil
	}
	now := time.Now()
	if h.until.IsZero() {
		h.until = now.Add(h.delay)
		h.t.Reset(h.delay)
		h.holds.Inc()
	}
	if !now.Before(h.until) {
		return false, nil
	}
	select {
	case <-a:
	case <-b:
	case <-c:
	case <-h.t.C:
	case <-ctx.Done():
		return false, ctx.Err()
	}
	return true, nil
}
