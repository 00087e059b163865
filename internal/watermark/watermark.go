// Package watermark provides a monotonic LSN that goroutines can wait on.
// Waiters are woken by the advance that reaches their LSN, never by polling,
// and never by an advance that does not reach it: Wait's waiters sit in a
// min-heap keyed by the LSN they wait for, and an advance wakes only the
// prefix it covers (PostgreSQL's SyncRepWakeQueue does the same for
// commits waiting on replicas). Thousands of reads waiting for a far LSN
// thus cost an advance one comparison, not a wake-up each.
package watermark

import (
	"container/heap"
	"context"
	"sync"
)

// Watermark is a monotonically increasing uint64. The zero value is ready to
// use and reads 0.
type Watermark struct {
	mu sync.Mutex
	v  uint64
	// ch is closed and replaced on every change, for Changed's callers
	// (nil until one asks).
	ch      chan struct{}
	waiters waiters // Wait's, lowest LSN first
}

// waiter is one Wait call that has not reached its LSN.
type waiter struct {
	lsn   uint64
	ready chan struct{} // closed once lsn is reached
	got   uint64        // the value that reached it
	index int           // in the heap; -1 once woken or removed
}

// waiters is a min-heap of waiters by LSN (container/heap).
type waiters []*waiter

func (h waiters) Len() int           { return len(h) }
func (h waiters) Less(i, j int) bool { return h[i].lsn < h[j].lsn }
func (h waiters) Swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].index, h[j].index = i, j
}
func (h *waiters) Push(x any) {
	w := x.(*waiter)
	w.index = len(*h)
	*h = append(*h, w)
}
func (h *waiters) Pop() any {
	old := *h
	w := old[len(old)-1]
	old[len(old)-1] = nil
	*h = old[:len(old)-1]
	w.index = -1
	return w
}

// Load returns the current value.
func (w *Watermark) Load() uint64 {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.v
}

// Advance raises the value to v; a lower v is ignored. It wakes the
// waiters whose LSN v reaches, and Changed's callers.
func (w *Watermark) Advance(v uint64) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if v <= w.v {
		return
	}
	w.setLocked(v)
}

// Reset sets the value to v even if that is lower. It is for the rare
// state that moves backwards (a replica re-seeded after it applied entries
// its primary lost); waiters for values above v keep waiting.
func (w *Watermark) Reset(v uint64) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if v == w.v {
		return
	}
	w.setLocked(v)
}

func (w *Watermark) setLocked(v uint64) {
	w.v = v
	if w.ch != nil {
		close(w.ch)
		w.ch = nil
	}
	for len(w.waiters) > 0 && w.waiters[0].lsn <= v {
		wt := heap.Pop(&w.waiters).(*waiter)
		wt.got = v
		close(wt.ready)
	}
}

// Changed returns the current value and a channel closed by the next
// change, for callers that wait on several things at once. Every such
// caller is woken by every change; a caller that waits only for a value
// uses Wait.
func (w *Watermark) Changed() (uint64, <-chan struct{}) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.ch == nil {
		w.ch = make(chan struct{})
	}
	return w.v, w.ch
}

// Wait blocks until the value is at least v or ctx is done, and returns the
// value it saw, or ctx's error. Only the change that reaches v wakes it.
func (w *Watermark) Wait(ctx context.Context, v uint64) (uint64, error) {
	w.mu.Lock()
	if w.v >= v {
		cur := w.v
		w.mu.Unlock()
		return cur, nil
	}
	wt := &waiter{lsn: v, ready: make(chan struct{})}
	heap.Push(&w.waiters, wt)
	w.mu.Unlock()
	select {
	case <-wt.ready:
		return wt.got, nil
	case <-ctx.Done():
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if wt.index < 0 {
		return wt.got, nil // reached as ctx ended
	}
	heap.Remove(&w.waiters, wt.index)
	return w.v, ctx.Err()
}
