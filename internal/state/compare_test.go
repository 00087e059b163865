package state

import (
	"errors"
	"fmt"
	"testing"
)

func TestCompareEval(t *testing.T) {
	s := New()
	// "k" = "b" at version 4: put at LSN 3, after two LSNs on a key that
	// ends up deleted, and committed at LSN 4. The version is the commit
	// LSN, so the put's own LSN (kVer-1) does not compare Equal.
	applyTxns(t, s, txn(put("pad", ""), del("pad"), put("k", "b")))
	if _, ver, _ := s.Get([]byte("k")); ver != 4 || ver != s.AppliedLSN() {
		t.Fatalf("setup: version %d", ver)
	}
	const kVer = 4
	val := func(key, v string, op CompareOp) Compare {
		return Compare{Key: []byte(key), Target: TargetValue, Result: op, Value: []byte(v)}
	}
	ver := func(key string, v uint64, op CompareOp) Compare {
		return Compare{Key: []byte(key), Target: TargetVersion, Result: op, Version: v}
	}
	exists := func(key string, e bool, op CompareOp) Compare {
		return Compare{Key: []byte(key), Target: TargetExists, Result: op, Exists: e}
	}
	tests := []struct {
		c    Compare
		want bool
	}{
		// Value of a present key "b" against "a" < "b" < "ba" < "c".
		{val("k", "a", Equal), false}, {val("k", "b", Equal), true}, {val("k", "c", Equal), false},
		{val("k", "a", NotEqual), true}, {val("k", "b", NotEqual), false}, {val("k", "c", NotEqual), true},
		{val("k", "a", Less), false}, {val("k", "b", Less), false}, {val("k", "ba", Less), true},
		{val("k", "a", Greater), true}, {val("k", "b", Greater), false}, {val("k", "ba", Greater), false},
		{val("k", "", Greater), true}, {val("k", "", Equal), false},
		// Value of a missing key: only NotEqual holds, whatever the operand.
		{val("missing", "", Equal), false}, {val("missing", "x", Equal), false},
		{val("missing", "", NotEqual), true}, {val("missing", "x", NotEqual), true},
		{val("missing", "x", Less), false}, {val("missing", "", Greater), false},
		// Version of a present key (4).
		{ver("k", kVer-1, Equal), false}, {ver("k", kVer, Equal), true}, {ver("k", kVer+1, Equal), false},
		{ver("k", kVer-1, NotEqual), true}, {ver("k", kVer, NotEqual), false}, {ver("k", kVer+1, NotEqual), true},
		{ver("k", kVer-1, Less), false}, {ver("k", kVer, Less), false}, {ver("k", kVer+1, Less), true},
		{ver("k", kVer-1, Greater), true}, {ver("k", kVer, Greater), false}, {ver("k", kVer+1, Greater), false},
		// Version of a missing key is 0.
		{ver("missing", 0, Equal), true}, {ver("missing", 1, Equal), false},
		{ver("missing", 0, NotEqual), false}, {ver("missing", 1, NotEqual), true},
		{ver("missing", 1, Less), true}, {ver("missing", 0, Less), false},
		{ver("missing", 0, Greater), false},
		// A deleted key is missing too.
		{ver("pad", 0, Equal), true}, {exists("pad", false, Equal), true},
		// Exists.
		{exists("k", true, Equal), true}, {exists("k", false, Equal), false},
		{exists("k", true, NotEqual), false}, {exists("k", false, NotEqual), true},
		{exists("missing", true, Equal), false}, {exists("missing", false, Equal), true},
		{exists("missing", true, NotEqual), true}, {exists("missing", false, NotEqual), false},
		// Invalid compares never hold.
		{exists("k", true, Less), false}, {exists("missing", true, Greater), false},
		{Compare{Key: []byte("k"), Result: NotEqual}, false},
		{Compare{Key: []byte("k"), Target: TargetVersion}, false},
	}
	for _, tt := range tests {
		name := fmt.Sprintf("%s/%v/%v/%q/%d/%v", tt.c.Key, tt.c.Target, tt.c.Result, tt.c.Value, tt.c.Version, tt.c.Exists)
		t.Run(name, func(t *testing.T) {
			for _, r := range []struct {
				name string
				r    Reader
			}{{"store", s}, {"view", s.Snapshot()}, {"overlay", NewOverlay(s)}} {
				if got := tt.c.Eval(r.r); got != tt.want {
					t.Errorf("Eval(%s) = %v, want %v", r.name, got, tt.want)
				}
			}
		})
	}
}

// TestCompareSeesOverlay: a compare evaluated against an Overlay sees the
// pending write, one against the Store does not.
func TestCompareSeesOverlay(t *testing.T) {
	s := New()
	applyTxns(t, s, txn(put("k", "old")))
	o := NewOverlay(s)
	stage(o, s.AppliedLSN()+1, put("k", "new"))
	c := Compare{Key: []byte("k"), Target: TargetValue, Result: Equal, Value: []byte("new")}
	if !c.Eval(o) || c.Eval(s) {
		t.Fatalf("Eval overlay %v store %v, want true false", c.Eval(o), c.Eval(s))
	}
}

// TestCompareVersionIsWriterLSN: the commit LSN a writer is given is the
// operand that makes a version compare hold on the keys it wrote, whether
// the write is still pending in the Overlay or applied to the Store, and
// not the LSN of the put record.
func TestCompareVersionIsWriterLSN(t *testing.T) {
	s := New()
	applyTxns(t, s, txn(put("base", "")))
	o := NewOverlay(s)
	first := s.AppliedLSN() + 1
	b, commit := stage(o, first, put("a", "1"), put("b", "1"), put("a", "2"))
	eq := func(key string, v uint64) Compare {
		return Compare{Key: []byte(key), Target: TargetVersion, Result: Equal, Version: v}
	}
	for _, when := range []struct {
		name string
		r    Reader
	}{{"pending", o}, {"applied", s}} {
		if when.name == "applied" {
			mustApply(t, s, b)
			o.Release(commit)
		}
		for _, key := range []string{"a", "b"} {
			if !eq(key, commit).Eval(when.r) {
				t.Errorf("%s: version of %s != commit LSN %d", when.name, key, commit)
			}
		}
		// Neither a's first put (at first) nor its second (at first+2).
		if eq("a", first).Eval(when.r) || eq("a", first+2).Eval(when.r) {
			t.Errorf("%s: version of a equals the LSN of a put record", when.name)
		}
	}
}

func TestCompareValidate(t *testing.T) {
	for _, target := range []Target{0, TargetValue, TargetVersion, TargetExists, 9} {
		for _, op := range []CompareOp{0, Equal, NotEqual, Less, Greater, 9} {
			valid := target >= TargetValue && target <= TargetExists && op >= Equal && op <= Greater &&
				!(target == TargetExists && (op == Less || op == Greater))
			err := Compare{Target: target, Result: op}.Validate()
			if valid != (err == nil) {
				t.Errorf("Validate(%v, %v) = %v, want valid %v", target, op, err, valid)
			}
			if err != nil && !errors.Is(err, ErrInvalidCompare) {
				t.Errorf("Validate(%v, %v) = %v, not ErrInvalidCompare", target, op, err)
			}
		}
	}
	if TargetExists.String() != "exists" || Greater.String() != "greater" || Target(9).String() != "target(9)" {
		t.Errorf("String methods: %v %v %v", TargetExists, Greater, Target(9))
	}
}
