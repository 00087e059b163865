package recovery

import (
	"context"
	"log/slog"
	"testing"
)

func TestSnapshotScheduleWakesRunWhenDue(t *testing.T) {
	s := NewSnapshotSchedule(100)
	taken := make(chan int64, 4)
	var written int64
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		s.Run(ctx, slog.New(slog.DiscardHandler), func() error { s.Taken(written); taken <- written; return nil })
	}()
	written = 99
	s.Written(written, false) // not due: nothing to wait for, checked below
	written = 150
	s.Written(written, false)
	if got := <-taken; got != 150 {
		t.Fatalf("snapshot at %d, want 150", got)
	}
	select {
	case got := <-taken:
		t.Fatalf("a snapshot at %d that was not due", got)
	default:
	}
	s.Written(200, false)           // 50 since the last: not due
	s.Written(200, true)            // forced
	if got := <-taken; got != 150 { // take saw the written value it was given above
		t.Fatalf("forced snapshot saw %d", got)
	}
	cancel()
	<-done
}
