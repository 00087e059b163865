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
		s.Run(ctx, slog.New(slog.DiscardHandler), func() error { s.Taken(written, 0); taken <- written; return nil })
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

// TestSnapshotIntervalFollowsSnapshotSize: once a snapshot is larger than
// everyBytes, the next one waits for as much WAL as the snapshot's size, and
// a small snapshot brings the interval back to everyBytes.
func TestSnapshotIntervalFollowsSnapshotSize(t *testing.T) {
	s := NewSnapshotSchedule(100)
	due := func() bool {
		select {
		case <-s.kick:
			return true
		default:
			return false
		}
	}
	steps := []struct {
		taken    [2]int64 // written, snapshot bytes; {-1} = no Taken
		written  int64
		wantDue  bool
		interval int64
	}{
		{[2]int64{-1}, 99, false, 100},
		{[2]int64{-1}, 100, true, 100},
		{[2]int64{100, 500}, 599, false, 500}, // a 500-byte snapshot at 100
		{[2]int64{-1}, 600, true, 500},
		{[2]int64{600, 0}, 699, false, 100}, // size unknown: back to everyBytes
		{[2]int64{-1}, 700, true, 100},
		{[2]int64{700, 40}, 799, false, 100}, // smaller than everyBytes
		{[2]int64{-1}, 800, true, 100},
	}
	for i, st := range steps {
		if st.taken[0] >= 0 {
			s.Taken(st.taken[0], st.taken[1])
		}
		s.Written(st.written, false)
		if got := due(); got != st.wantDue || s.Interval() != st.interval {
			t.Fatalf("step %d: written %d: due %v, interval %d; want %v, %d", i, st.written, got, s.Interval(), st.wantDue, st.interval)
		}
	}
}
