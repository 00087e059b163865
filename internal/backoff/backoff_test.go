package backoff

import (
	"context"
	"testing"
)

func TestDelayGrowsToTheCapAndResets(t *testing.T) {
	var b Backoff
	ctx, cancel := context.WithCancel(context.Background())
	cancel() // Wait returns at once; only the schedule is checked
	want := []int64{int64(Min), int64(2 * Min), int64(4 * Min)}
	for i, w := range want {
		if b.Wait(ctx) {
			t.Fatal("Wait on a done context reported it live")
		}
		if int64(b.next) != w {
			t.Fatalf("step %d: next delay %v, want %v", i, b.next, w)
		}
	}
	for i := 0; i < 10; i++ {
		b.Wait(ctx)
	}
	if b.next != Max {
		t.Fatalf("delay %v, want the cap %v", b.next, Max)
	}
	b.Reset()
	b.Wait(ctx)
	if b.next != Min {
		t.Fatalf("after Reset: %v, want %v", b.next, Min)
	}
}
