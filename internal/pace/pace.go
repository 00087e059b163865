// Package pace is a token bucket in bytes: what paces a learner's
// catch-up (--learner-bytes-per-second), on the primary's stream to it
// and on what it reads from a log store, so that a node catching up from
// far behind spreads its cost over time instead of taking a core from
// the members commits wait on.
//
// The bucket is driven from outside: Take is given the time, and says how
// long to wait; the caller waits (and does what it must meanwhile, such
// as heartbeats). It is not safe for concurrent use: one per stream.
package pace

import (
	"context"
	"time"
)

// DefaultLearnerBytesPerSecond is the default pace of a learner's
// catch-up: none. Pacing spreads a learner's cost over a longer catch-up
// rather than removing it, and a learner paced below the write rate never
// catches up (docs/BENCHMARKS.md, Membership change): it is for a learner
// that shares the members' cores, disks or links, set knowingly.
const DefaultLearnerBytesPerSecond = 0

// Bucket fills at rate bytes/s up to burst; a send takes its size from
// it, going into debt if need be, so that a send larger than the burst
// waits for its size's worth and never forever.
type Bucket struct {
	rate   float64 // bytes per second
	burst  float64
	tokens float64
	at     time.Time // when tokens was last brought up to date
}

// New is a bucket of rate bytes/s (> 0) that starts full at now. Its burst
// is a tenth of a second at rate, but at least minBurst (one largest
// message), so that a stream well below the rate is not held.
func New(rate int64, minBurst int, now time.Time) *Bucket {
	b := float64(max(rate/10, int64(minBurst)))
	return &Bucket{rate: float64(rate), burst: b, tokens: b, at: now}
}

// Take takes n bytes at now and returns how long their sender must wait
// before sending them (0: at once).
func (b *Bucket) Take(now time.Time, n int) time.Duration {
	if el := now.Sub(b.at); el > 0 {
		b.tokens = min(b.burst, b.tokens+el.Seconds()*b.rate)
		b.at = now
	}
	b.tokens -= float64(n)
	if b.tokens >= 0 {
		return 0
	}
	return time.Duration(-b.tokens / b.rate * float64(time.Second))
}

// Wait waits until the n bytes may go (Take at time.Now()), or ctx ends,
// and returns how long it waited. t is the caller's timer, reused.
func (b *Bucket) Wait(ctx context.Context, t *time.Timer, n int) (time.Duration, error) {
	d := b.Take(time.Now(), n)
	if d <= 0 {
		return 0, nil
	}
	t.Reset(d)
	select {
	case <-t.C:
		return d, nil
	case <-ctx.Done():
		t.Stop()
		return 0, ctx.Err()
	}
}
