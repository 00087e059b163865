package logstore

import (
	"context"
	"errors"
	"testing"
	"time"
)

// TestAppendBudgetBoundsQueuedBytes: while the log store's disk does not
// finish an fsync, a primary that keeps sending has at most twice
// MaxMessageBytes of batches queued for the writer (the stream's budget);
// the rest waits in the sender's flow control, not in the log store's
// memory. Once the fsync returns, every batch is written.
func TestAppendBudgetBoundsQueuedBytes(t *testing.T) {
	cfg := testConfig(t, "/data")
	cfg.MaxMessageBytes = 1 << 20 // a budget of 2 MiB
	r, entered, unblock := startStalled(t, cfg)
	const n, size = 96, 64 << 10 // 6 MiB: within gRPC's 8 MiB stream window
	bs := chain(t, 1, 1, n, size)

	a := r.append(t)
	a.send(bs[0])
	waitClosed(t, entered, "the first fsync")
	base := r.s.w.queued.Load() // batch 0, in the writer's round
	a.send(bs[1:]...)
	// The budget holds batch 0 and what is queued behind it: 2 MiB of
	// batches of 64 KiB and a few bytes.
	most := uint64(2*cfg.MaxMessageBytes/size) - 1
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	if _, err := r.s.w.queued.Wait(ctx, base+most-1); err != nil {
		t.Fatalf("the budget's worth of batches never queued: %v", err)
	}
	// No more may: give the receiver half a second to go past the budget.
	short, cancelShort := context.WithTimeout(t.Context(), 500*time.Millisecond)
	defer cancelShort()
	if got, err := r.s.w.queued.Wait(short, base+most+1); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("%d batches of %d bytes queued behind a blocked fsync (%v); the budget allows %d", got-base, size, err, most)
	}
	unblock()
	a.waitDurable(bs[n-1].LastLsn)
}
