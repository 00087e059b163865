package bench

import (
	"math"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// recorder collects what the terminals do. Latencies are kept whole (a
// 20 s run at a few thousand txn/s is a few hundred thousand samples), so
// percentiles are exact.
type recorder struct {
	measuring atomic.Bool
	done      atomic.Int64 // transactions completed since start (warmup included)

	mu       sync.Mutex
	window   []time.Duration // completed in the current progress second
	lat      []time.Duration // completed while measuring
	commits  int64
	aborts   int64
	errors   int64
	byKind   []int64
	kindLat  [][]time.Duration
	firstErr error
}

func newRecorder(kinds int) *recorder {
	return &recorder{byKind: make([]int64, kinds), kindLat: make([][]time.Duration, kinds)}
}

func (r *recorder) ok(kind int, d time.Duration) {
	r.done.Add(1)
	r.mu.Lock()
	r.window = append(r.window, d)
	if r.measuring.Load() {
		r.lat = append(r.lat, d)
		r.commits++
		r.byKind[kind]++
		r.kindLat[kind] = append(r.kindLat[kind], d)
	}
	r.mu.Unlock()
}

func (r *recorder) abort() {
	if r.measuring.Load() {
		r.mu.Lock()
		r.aborts++
		r.mu.Unlock()
	}
}

func (r *recorder) fail(err error) {
	r.mu.Lock()
	if r.measuring.Load() {
		r.errors++
	}
	if r.firstErr == nil {
		r.firstErr = err
	}
	r.mu.Unlock()
}

// tick returns the transactions of the last progress interval and resets it.
func (r *recorder) tick() []time.Duration {
	r.mu.Lock()
	w := r.window
	r.window = nil
	r.mu.Unlock()
	return w
}

// percentile returns the q-quantile (0..1) of ds, sorting ds.
func percentile(ds []time.Duration, q float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	slices.Sort(ds)
	i := int(math.Ceil(q*float64(len(ds)))) - 1
	return ds[max(0, min(i, len(ds)-1))]
}

// percentileF is percentile for float samples.
func percentileF(xs []float64, q float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	slices.Sort(xs)
	i := int(math.Ceil(q*float64(len(xs)))) - 1
	return xs[max(0, min(i, len(xs)-1))]
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

func us(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) }
