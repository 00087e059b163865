package realkube

import (
	"slices"
	"testing"

	"github.com/walship/walship/internal/check"
)

// TestLostWrites checks the scenarios' count of lost acknowledged writes
// on small histories (no cluster needed).
func TestLostWrites(t *testing.T) {
	put := func(key, v string, call, ret int64) check.Op {
		return check.Op{Input: check.Input{Kind: check.KindPut, Key: key, Value: v}, Call: call, Return: ret}
	}
	unknown := func(op check.Op) check.Op { op.Output.Unknown = true; return op }
	del := func(key string, call, ret int64) check.Op {
		return check.Op{Input: check.Input{Kind: check.KindDelete, Key: key}, Call: call, Return: ret}
	}
	cas := func(key, v string, ok bool, call, ret int64) check.Op {
		return check.Op{Input: check.Input{Kind: check.KindCAS, Key: key, Value: v}, Output: check.Output{Succeeded: ok}, Call: call, Return: ret}
	}
	read := func(key string, found bool, v string, at int64) check.Op {
		return check.Op{Input: check.Input{Kind: check.KindGet, Key: key}, Output: check.Output{Found: found, Value: v}, Call: at, Return: at + 1}
	}
	for _, tc := range []struct {
		name string
		ops  []check.Op
		lost []string
	}{
		{"last write read back", []check.Op{put("k", "a", 0, 1), put("k", "b", 2, 3), read("k", true, "b", 10)}, nil},
		{"last write gone", []check.Op{put("k", "a", 0, 1), put("k", "b", 2, 3), read("k", true, "a", 10)}, []string{"k"}},
		{"overlapping writes either order", []check.Op{put("k", "a", 0, 5), put("k", "b", 2, 3), read("k", true, "a", 10)}, nil},
		{"an unknown write may land late", []check.Op{put("k", "a", 5, 6), unknown(put("k", "b", 0, 1)), read("k", true, "b", 10)}, nil},
		{"acknowledged delete gone", []check.Op{put("k", "a", 0, 1), del("k", 2, 3), read("k", true, "a", 10)}, []string{"k"}},
		{"acknowledged delete kept", []check.Op{put("k", "a", 0, 1), del("k", 2, 3), read("k", false, "", 10)}, nil},
		{"never written, absent", []check.Op{put("k", "a", 0, 1), read("k", false, "", 10)}, []string{"k"}},
		{"failed CAS writes nothing", []check.Op{put("k", "a", 0, 1), cas("k", "b", false, 2, 3), read("k", true, "a", 10)}, nil},
		{"successful CAS gone", []check.Op{put("k", "a", 0, 1), cas("k", "b", true, 2, 3), read("k", true, "a", 10)}, []string{"k"}},
		{"only unknown writes", []check.Op{unknown(put("k", "a", 0, 1)), read("k", false, "", 10)}, nil},
		{"keys apart", []check.Op{put("k", "a", 0, 1), put("j", "b", 0, 1), read("k", true, "a", 10), read("j", false, "", 10)}, []string{"j"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := lostWrites(tc.ops); !slices.Equal(got, tc.lost) {
				t.Fatalf("lostWrites = %v, want %v", got, tc.lost)
			}
		})
	}
}
