package bench

import (
	"fmt"
	"math/rand/v2"
	"testing"
)

// TestRandStringIsUniformLetters: randString's strings are n letters
// 'a'..'z', and each letter is as likely at every place of a draw (the
// test counts each letter at each of a draw's 10 places over 2.6 million
// letters, a fixed seed: 10,000 expected per cell, σ ≈ 98).
func TestRandStringIsUniformLetters(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 11))
	var counts [lettersPerDraw][26]int
	for range 26_000 {
		// 100 letters: whole draws, as the put workload's values are.
		s := randString(r, 100)
		if len(s) != 100 {
			t.Fatalf("len %d, want 100", len(s))
		}
		for i, c := range s {
			if c < 'a' || c > 'z' {
				t.Fatalf("byte %d is %q, not a letter", i, c)
			}
			counts[i%lettersPerDraw][c-'a']++
		}
	}
	for place, row := range counts {
		for l, n := range row {
			if n < 9_500 || n > 10_500 {
				t.Errorf("letter %c at place %d of a draw: %d times, want 10,000 ± 500", 'a'+l, place, n)
			}
		}
	}
	for _, n := range []int{0, 1, 9, 10, 11, 23} {
		if s := randString(r, n); len(s) != n {
			t.Errorf("randString(%d) has %d letters", n, len(s))
		}
	}
}

// BenchmarkRandString is one put workload value (100 letters).
func BenchmarkRandString(b *testing.B) {
	r := rand.New(rand.NewPCG(1, 2))
	for b.Loop() {
		randString(r, 100)
	}
}

// TestPutKey: putKey makes what fmt.Sprintf("%s%012d") does.
func TestPutKey(t *testing.T) {
	for _, n := range []int{0, 1, 9, 10, 123456, 999_999_999_999, 1_000_000_000_000, 12_345_678_901_234} {
		if got, want := putKey("put/run/03/", n), fmt.Sprintf("%s%012d", "put/run/03/", n); got != want {
			t.Errorf("putKey(%d) = %q, want %q", n, got, want)
		}
	}
}

// BenchmarkPutKey is one put workload key.
func BenchmarkPutKey(b *testing.B) {
	for i := 0; b.Loop(); i++ {
		putKey("put/4f2a9c1e/03/", i)
	}
}
