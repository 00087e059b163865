package failover

import (
	"fmt"
	"math/bits"
	"testing"
)

// TestPromotionMeetsEveryAck checks, for every N ≤ 7 sync-eligible members
// and every k ≤ N, that every set of members a promotion may count as its
// quorum (Judge) meets every set of k members that could have acknowledged
// a commit (I5), and that one member fewer would not: N−k+1 is the least
// that works. With log store sync, every log store majority a promotion
// counts meets every majority that acknowledged.
func TestPromotionMeetsEveryAck(t *testing.T) {
	for n := 1; n <= 7; n++ {
		members := []string{"old"}
		for i := range n {
			members = append(members, fmt.Sprintf("r%d", i))
		}
		for k := 1; k <= n; k++ {
			c := Contract{Members: members, LogStores: []string{"l0"}, K: k}
			need := PromotionNeed(n, k, false)
			for promised := uint(0); promised < 1<<n; promised++ {
				answers := []Answer{{ID: "l0", LogStore: true}}
				for i := range n {
					if promised&(1<<i) != 0 {
						answers = append(answers, Answer{ID: members[i+1]})
					}
				}
				v := Judge(c, "old", answers, answers)
				if got := bits.OnesCount(promised); v.Quorum != (got >= need) {
					t.Fatalf("N=%d k=%d: %d promises, quorum %v; need %d", n, k, got, v.Quorum, need)
				}
				for acked := uint(0); acked < 1<<n; acked++ {
					if bits.OnesCount(acked) != k {
						continue
					}
					// The k-th highest of the positions is what the ack rule
					// takes: members in acked are at LSN 1, the others at 0.
					pos := make([]uint64, n)
					for i := range n {
						if acked&(1<<i) != 0 {
							pos[i] = 1
						}
					}
					if AckLSN(pos, k) != 1 {
						t.Fatalf("N=%d k=%d: %d members at LSN 1 do not ack it", n, k, k)
					}
					if v.Quorum && promised&acked == 0 {
						t.Fatalf("N=%d k=%d: promotion quorum %0*b misses ack quorum %0*b", n, k, n, promised, n, acked)
					}
				}
			}
		}
	}
	for n := 1; n <= 7; n++ {
		m := Majority(n)
		for a := uint(0); a < 1<<n; a++ {
			for b := uint(0); b < 1<<n; b++ {
				if bits.OnesCount(a) >= m && bits.OnesCount(b) >= m && a&b == 0 {
					t.Fatalf("%d log stores: majorities %b and %b do not meet", n, a, b)
				}
			}
		}
	}
}

// TestPromotionNeedIsTight: with one promise fewer than N−k+1 there is a
// set of k members that acknowledged a commit and promised nothing.
func TestPromotionNeedIsTight(t *testing.T) {
	for n := 1; n <= 7; n++ {
		for k := 1; k <= n; k++ {
			fewer := PromotionNeed(n, k, false) - 1
			// The promises of members 0..fewer-1 leave n-fewer = k members out.
			if n-fewer < k {
				t.Fatalf("N=%d k=%d: %d promises leave %d members, fewer than k", n, k, fewer, n-fewer)
			}
		}
	}
}

func TestAckLSN(t *testing.T) {
	for _, tc := range []struct {
		pos  []uint64
		k    int
		want uint64
	}{
		{nil, 1, 0},
		{[]uint64{5}, 0, 0},
		{[]uint64{5}, 1, 5},
		{[]uint64{5, 9, 7}, 1, 9},
		{[]uint64{5, 9, 7}, 2, 7},
		{[]uint64{5, 9, 7}, 3, 5},
		{[]uint64{5, 9, 7}, 4, 0},
	} {
		if got := AckLSN(append([]uint64(nil), tc.pos...), tc.k); got != tc.want {
			t.Errorf("AckLSN(%v, %d) = %d, want %d", tc.pos, tc.k, got, tc.want)
		}
	}
}

// TestPromotionExcludingAnyMemberMeetsEveryAck is the rule a promotion's
// replaced primary rests on (services/node replacedPrimary and
// judgeReplacing): whichever one member the promotion excludes, every
// quorum Judge accepts meets every ack quorum — k members other than
// the primary p that acknowledged, plus p, which holds what it
// acknowledged (durability sync). Without p among the holders (a write
// acknowledged before p's own fsync, which p lost in a crash) some
// excluded member other than p leaves a quorum that misses it: only
// excluding p itself protects such a write, and the contract counts it
// as losable.
func TestPromotionExcludingAnyMemberMeetsEveryAck(t *testing.T) {
	for n := 2; n <= 7; n++ {
		members := make([]string, n)
		for i := range n {
			members[i] = fmt.Sprintf("m%d", i)
		}
		for k := 1; k < n; k++ {
			c := Contract{Members: members, LogStores: []string{"l0"}, K: k}
			lostWithoutP := false
			for p := range n {
				for x := range n {
					for promised := uint(0); promised < 1<<n; promised++ {
						answers := []Answer{{ID: "l0", LogStore: true}}
						for i := range n {
							if promised&(1<<i) != 0 {
								answers = append(answers, Answer{ID: members[i]})
							}
						}
						if !Judge(c, members[x], answers, answers).Quorum {
							continue
						}
						for acked := uint(0); acked < 1<<n; acked++ {
							if acked&(1<<p) != 0 || bits.OnesCount(acked) != k {
								continue
							}
							if promised&(acked|1<<p) == 0 {
								t.Fatalf("N=%d k=%d, primary m%d, excluded m%d: promotion quorum %0*b misses the holders %0*b", n, k, p, x, n, promised, n, acked|1<<p)
							}
							if promised&acked == 0 {
								if x == p {
									t.Fatalf("N=%d k=%d, excluded the primary m%d: quorum %0*b misses its k acks %0*b", n, k, p, n, promised, n, acked)
								}
								lostWithoutP = true
							}
						}
					}
				}
			}
			if !lostWithoutP {
				t.Fatalf("N=%d k=%d: excluding a member other than the primary never misses the k acks alone; the test shows nothing", n, k)
			}
		}
	}
}
