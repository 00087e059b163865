// Package watermark provides a monotonic LSN that goroutines can wait on.
// Waiters are woken by the advance that reaches their LSN, never by polling.
package watermark

import (
	"context"
	"sync"
)

// Watermark is a monotonically increasing uint64. The zero value is ready to
// use and reads 0.
type Watermark struct {
	mu sync.Mutex
	v  uint64
	ch chan struct{} // closed and replaced on every advance
}

// Load returns the current value.
func (w *Watermark) Load() uint64 {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.v
}

// Advance raises the value to v; a lower v is ignored. It wakes every waiter.
func (w *Watermark) Advance(v uint64) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if v <= w.v {
		return
	}
	w.v = v
	if w.ch != nil {
		close(w.ch)
		w.ch = nil
	}
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
	w.v = v
	if w.ch != nil {
		close(w.ch)
		w.ch = nil
	}
}

// Changed returns the current value and a channel closed by the next
// advance, for callers that wait on several things at once.
func (w *Watermark) Changed() (uint64, <-chan struct{}) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.ch == nil {
		w.ch = make(chan struct{})
	}
	return w.v, w.ch
}

// Wait blocks until the value is at least v or ctx is done, and returns the
// value it saw, or ctx's error.
func (w *Watermark) Wait(ctx context.Context, v uint64) (uint64, error) {
	for {
		cur, ch := w.Changed()
		if cur >= v {
			return cur, nil
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return cur, ctx.Err()
		}
	}
}
