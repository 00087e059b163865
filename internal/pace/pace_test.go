package pace

import (
	"testing"
	"time"
)

// TestBucketTake: the bucket starts full, a batch past what it holds waits
// for the missing bytes at the rate (a batch larger than the burst too,
// never forever), and it refills with time up to its burst only.
func TestBucketTake(t *testing.T) {
	t0 := time.Unix(1000, 0)
	const rate = 1 << 20 // 1 MiB/s; burst max(rate/10, 256 KiB) = 256 KiB
	type step struct {
		after time.Duration // since t0
		n     int
		wait  time.Duration
	}
	for _, tc := range []struct {
		name  string
		steps []step
	}{
		{"the burst goes at once", []step{{0, 128 << 10, 0}, {0, 128 << 10, 0}}},
		{"past the burst waits at the rate", []step{{0, 256 << 10, 0}, {0, 512 << 10, 500 * time.Millisecond}}},
		{"a batch larger than the burst waits its excess", []step{{0, 1 << 20, 750 * time.Millisecond}}},
		{"debt is paid before the next batch", []step{{0, 512 << 10, 250 * time.Millisecond}, {250 * time.Millisecond, 256 << 10, 250 * time.Millisecond}}},
		{"it refills at the rate", []step{{0, 256 << 10, 0}, {125 * time.Millisecond, 128 << 10, 0}, {125 * time.Millisecond, 1 << 10, time.Second / 1024}}},
		{"it refills to its burst only", []step{{0, 256 << 10, 0}, {time.Hour, 256 << 10, 0}, {time.Hour, 256 << 10, 250 * time.Millisecond}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := New(rate, 256<<10, t0)
			for i, s := range tc.steps {
				if got := p.Take(t0.Add(s.after), s.n); (got - s.wait).Abs() > time.Microsecond {
					t.Fatalf("step %d: Take(%v, %d) = %v, want %v", i, s.after, s.n, got, s.wait)
				}
			}
		})
	}
}
