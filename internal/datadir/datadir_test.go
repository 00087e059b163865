package datadir

import (
	"bytes"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	walshipv1 "github.com/walship/walship/gen/walship/v1"
	"github.com/walship/walship/internal/vfs"
)

func TestVoteRoundTripAndLegacyEpoch(t *testing.T) {
	dir := t.TempDir()
	if v, err := LoadVote(vfs.OS, dir); err != nil || v != (Vote{}) {
		t.Fatalf("empty dir: %v, %v", v, err)
	}
	if err := os.WriteFile(filepath.Join(dir, "epoch"), []byte("7\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if v, err := LoadVote(vfs.OS, dir); err != nil || v != (Vote{Epoch: 7}) {
		t.Fatalf("legacy epoch file: %v, %v", v, err)
	}
	for _, v := range []Vote{{Epoch: 8}, {Epoch: 9, Primary: "n1", Addr: "10.0.0.1:7401"}, {Epoch: 10, Addr: "h:1"}} {
		if err := SaveVote(vfs.OS, dir, v); err != nil {
			t.Fatal(err)
		}
		if got, err := LoadVote(vfs.OS, dir); err != nil || got != v {
			t.Fatalf("saved %v, loaded %v, %v", v, got, err)
		}
	}
	for _, bad := range []string{"", "x", "1 a b c", "-1"} {
		if err := os.WriteFile(filepath.Join(dir, "vote"), []byte(bad), 0o644); err != nil {
			t.Fatal(err)
		}
		if _, err := LoadVote(vfs.OS, dir); err == nil || !strings.Contains(err.Error(), "vote file") {
			t.Fatalf("vote %q: %v", bad, err)
		}
	}
}

// TestValidateNodeID: a node id is 1..64 of [A-Za-z0-9._-], and every id
// it accepts comes back from a saved vote and election register as
// itself — "-", which those files write for no node, is refused.
func TestValidateNodeID(t *testing.T) {
	dir := t.TempDir()
	for _, id := range []string{"n1", "a.b_c-d", "--", strings.Repeat("x", 64), "-a"} {
		if err := ValidateNodeID(id); err != nil {
			t.Errorf("ValidateNodeID(%q) = %v", id, err)
			continue
		}
		v := Vote{Epoch: 3, Primary: id, Addr: "h:1"}
		if err := SaveVote(vfs.OS, dir, v); err != nil {
			t.Fatal(err)
		}
		if got, err := LoadVote(vfs.OS, dir); err != nil || got != v {
			t.Errorf("vote for %q saved %v, loaded %v, %v", id, v, got, err)
		}
		r := Election{Term: 2, Holder: id}
		if err := SaveElection(vfs.OS, dir, r); err != nil {
			t.Fatal(err)
		}
		if got, err := LoadElection(vfs.OS, dir); err != nil || got != r {
			t.Errorf("election held by %q: saved %+v, loaded %+v, %v", id, r, got, err)
		}
	}
	for id, want := range map[string]string{
		"":                      "is not 1..64",
		strings.Repeat("x", 65): "is not 1..64",
		"a b":                   "is not 1..64",
		"n\u00fc":               "is not 1..64",
		"-":                     "how a vote file writes no node",
	} {
		if err := ValidateNodeID(id); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("ValidateNodeID(%q) = %v; want an error saying %q", id, err, want)
		}
	}
}

// TestValidateAddr: an address is kept in a vote file's line; every one
// accepted survives a saved vote, and what would not (white space, "-",
// control or non-ASCII bytes, over 255 bytes) is refused.
func TestValidateAddr(t *testing.T) {
	dir := t.TempDir()
	for _, addr := range []string{"10.0.0.1:7401", "[::1]:7401", "n0.walship.ns.svc:7401", "h:1", strings.Repeat("a", 255)} {
		if err := ValidateAddr(addr); err != nil {
			t.Errorf("ValidateAddr(%q) = %v", addr, err)
			continue
		}
		v := Vote{Epoch: 3, Primary: "n1", Addr: addr}
		if err := SaveVote(vfs.OS, dir, v); err != nil {
			t.Fatal(err)
		}
		if got, err := LoadVote(vfs.OS, dir); err != nil || got != v {
			t.Errorf("vote naming %q: saved %v, loaded %v, %v", addr, v, got, err)
		}
	}
	for _, addr := range []string{"", "-", "h:1 x", "h:1\n", "h:1\t", "\x00", "h\u00fc:1", strings.Repeat("a", 256)} {
		if err := ValidateAddr(addr); err == nil || !strings.Contains(err.Error(), "is not an address") {
			t.Errorf("ValidateAddr(%q) = %v; want a refusal", addr, err)
		}
	}
}

func TestLogPrimaryRoundTrip(t *testing.T) {
	dir := t.TempDir()
	if v, err := LoadLogPrimary(vfs.OS, dir); err != nil || v != (Vote{}) {
		t.Fatalf("empty dir: %v, %v", v, err)
	}
	v := Vote{Epoch: 4, Primary: "n0", Addr: "10.0.0.1:7401"}
	if err := SaveLogPrimary(vfs.OS, dir, v); err != nil {
		t.Fatal(err)
	}
	if got, err := LoadLogPrimary(vfs.OS, dir); err != nil || got != v {
		t.Fatalf("saved %v, loaded %v, %v", v, got, err)
	}
	if got, err := LoadVote(vfs.OS, dir); err != nil || got != (Vote{}) {
		t.Fatalf("the log primary is not the vote: loaded vote %v, %v", got, err)
	}
	if err := os.WriteFile(filepath.Join(dir, "logprimary"), []byte("x n0"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := LoadLogPrimary(vfs.OS, dir); err == nil || !strings.Contains(err.Error(), "log primary file") {
		t.Fatalf("bad log primary: %v", err)
	}
}

func TestAppliedRoundTrip(t *testing.T) {
	dir := t.TempDir()
	if lsn, err := LoadApplied(vfs.OS, dir); err != nil || lsn != 0 {
		t.Fatalf("empty dir: %d, %v", lsn, err)
	}
	for _, tc := range []struct {
		lsn     uint64
		durable bool
	}{{17, true}, {18, false}, {1 << 40, true}} {
		if err := SaveApplied(vfs.OS, dir, tc.lsn, tc.durable); err != nil {
			t.Fatal(err)
		}
		if lsn, err := LoadApplied(vfs.OS, dir); err != nil || lsn != tc.lsn {
			t.Fatalf("saved %d (durable %v), loaded %d, %v", tc.lsn, tc.durable, lsn, err)
		}
		if _, err := os.Stat(filepath.Join(dir, "applied.tmp")); !os.IsNotExist(err) {
			t.Fatalf("a temporary file is left: %v", err)
		}
	}
	if err := os.WriteFile(filepath.Join(dir, "applied"), []byte("x\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := LoadApplied(vfs.OS, dir); err == nil || !strings.Contains(err.Error(), "not a number") {
		t.Fatalf("a bad marker: %v", err)
	}
}

// TestAppliedMarker: both forms round-trip; the older bare form reads as
// applied but not known readable.
func TestAppliedMarker(t *testing.T) {
	dir := t.TempDir()
	for _, m := range []AppliedMarker{{LSN: 17, Readable: true}, {LSN: 18}, {LSN: 1 << 40, Readable: true}} {
		if err := SaveAppliedMarker(vfs.OS, dir, m, m.Readable); err != nil {
			t.Fatal(err)
		}
		if got, err := LoadAppliedMarker(vfs.OS, dir); err != nil || got != m {
			t.Fatalf("saved %+v, loaded %+v, %v", m, got, err)
		}
	}
	for _, tc := range []struct {
		in   string
		want AppliedMarker
		err  string
	}{
		{"42\n", AppliedMarker{LSN: 42}, ""},
		{"42 readable\n", AppliedMarker{LSN: 42, Readable: true}, ""},
		{"42 durable\n", AppliedMarker{}, "want"},
		{"42 readable x\n", AppliedMarker{}, "want"},
		{"x readable\n", AppliedMarker{}, "not a number"},
		{"", AppliedMarker{}, "want"},
	} {
		got, err := ParseApplied("applied", []byte(tc.in))
		if tc.err == "" && (err != nil || got != tc.want) {
			t.Errorf("%q: %+v, %v; want %+v", tc.in, got, err, tc.want)
		}
		if tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)) {
			t.Errorf("%q: %+v, %v; want an error saying %q", tc.in, got, err, tc.err)
		}
	}
}

// FuzzParseApplied: any bytes parse or fail cleanly; a parsed marker
// marshals to bytes that parse to the same marker.
func FuzzParseApplied(f *testing.F) {
	f.Add([]byte("17\n"))
	f.Add([]byte("17 readable\n"))
	f.Add([]byte("readable 17"))
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := ParseApplied("fuzz", b)
		if err != nil {
			return
		}
		back, err := ParseApplied("again", m.Marshal())
		if err != nil || back != m {
			t.Fatalf("%+v re-parsed as %+v, %v", m, back, err)
		}
	})
}

func TestHistory(t *testing.T) {
	var h History
	for _, b := range []struct{ seen, first uint64 }{{0, 1}, {0, 10}, {5, 20}} { // 1@1, 2@10, 6@20
		var err error
		if h, err = h.Begin(b.seen, b.first); err != nil {
			t.Fatal(err)
		}
	}
	if got := string(h.Marshal()); got != "1 1\n2 10\n6 20\n" {
		t.Fatalf("history %q", got)
	}
	for _, tc := range []struct {
		epoch     uint64
		lsn       uint64
		all, know bool
	}{
		{epoch: 1, lsn: 9, know: true},
		{epoch: 2, lsn: 19, know: true},
		{epoch: 3, lsn: 19, know: true}, // an epoch this log never had: the end of the newest before it
		{epoch: 6, all: true, know: true},
		{epoch: 9, all: true, know: true},
		{epoch: 0, lsn: 0, know: true},
	} {
		lsn, all, known := h.KeepUpTo(tc.epoch)
		if lsn != tc.lsn || all != tc.all || known != tc.know {
			t.Errorf("KeepUpTo(%d) = %d, %v, %v; want %d, %v, %v", tc.epoch, lsn, all, known, tc.lsn, tc.all, tc.know)
		}
	}
	if e := h.EpochOf(15); e != 2 {
		t.Errorf("EpochOf(15) = %d", e)
	}
	if c := h.Cut(15); len(c) != 2 || c.Current() != (Start{2, 10}) {
		t.Errorf("Cut(15) = %v", c)
	}
	// With replaces an epoch that wrote nothing the log keeps.
	if w := h.With(7, 20); len(w) != 3 || w.Current() != (Start{7, 20}) {
		t.Errorf("With(7, 20) = %v", w)
	}
	// A follower's history: seeded at LSN 100 by a snapshot (incomplete).
	f, changed := History(nil).Note(4, 101)
	if !changed || f.Complete() {
		t.Fatalf("seeded history %v, complete %v", f, f.Complete())
	}
	if f2, changed := f.Note(4, 150); changed || len(f2) != 1 {
		t.Fatalf("same epoch noted again: %v, %v", f2, changed)
	}
	if _, _, known := f.KeepUpTo(3); known {
		t.Fatal("an incomplete history judged an epoch before it")
	}
	dir := t.TempDir()
	if err := SaveHistory(vfs.OS, dir, h); err != nil {
		t.Fatal(err)
	}
	if back, err := LoadHistory(vfs.OS, dir); err != nil || string(back.Marshal()) != string(h.Marshal()) {
		t.Fatalf("loaded %v, %v", back, err)
	}
	for _, bad := range []string{"1", "1 x", "2 5\n1 9", "2 5\n3 4"} {
		if _, err := ParseHistory("h", []byte(bad)); err == nil {
			t.Errorf("ParseHistory(%q) = nil error", bad)
		}
	}
}

func TestOrphans(t *testing.T) {
	dir := t.TempDir()
	if os, err := ListOrphans(vfs.OS, dir); err != nil || len(os) != 0 {
		t.Fatalf("none yet: %v, %v", os, err)
	}
	entries := []OrphanEntry{{5, 7, []byte("abc")}, {8, 8, []byte("d")}}
	o, err := SaveOrphan(vfs.OS, dir, 3, entries, time.Unix(100, 5))
	if err != nil {
		t.Fatal(err)
	}
	list, err := ListOrphans(vfs.OS, dir)
	if err != nil || len(list) != 1 {
		t.Fatalf("list: %v, %v", list, err)
	}
	l := list[0]
	if l.Name != o.Name || l.Epoch != 3 || l.FirstLSN != 5 || l.LastLSN != 8 || l.Bytes != o.Bytes || !l.CutAt.Equal(time.Unix(100, 5)) {
		t.Fatalf("listed %+v, saved %+v", l, o)
	}
	back, err := ReadOrphan(vfs.OS, dir, o.Name)
	if err != nil || len(back) != 2 || !bytes.Equal(back[0].Data, []byte("abc")) || back[1].FirstLSN != 8 {
		t.Fatalf("read back %v, %v", back, err)
	}
	// The log's cut entries are the database's: the owner's alone.
	if err := SaveVote(vfs.OS, dir, Vote{Epoch: 3}); err != nil {
		t.Fatal(err)
	}
	for path, want := range map[string]os.FileMode{filepath.Join(dir, "orphans"): 0o700, filepath.Join(dir, "orphans", o.Name): 0o600, filepath.Join(dir, "vote"): 0o600} {
		fi, err := os.Stat(path)
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode().Perm()&^want != 0 {
			t.Errorf("%s: mode %v; want nothing beyond %v", path, fi.Mode(), want)
		}
	}
	if _, err := SaveOrphan(vfs.OS, dir, 3, nil, time.Now()); err == nil {
		t.Fatal("an empty orphan was saved")
	}
}

// FuzzDecodeOrphan: decoding any bytes as an orphan file never panics,
// and what decodes re-encodes to the same bytes.
func FuzzDecodeOrphan(f *testing.F) {
	dir := f.TempDir()
	o, err := SaveOrphan(vfs.OS, dir, 1, []OrphanEntry{{1, 2, []byte("xy")}, {3, 3, nil}}, time.Unix(1, 0))
	if err != nil {
		f.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(dir, "orphans", o.Name))
	if err != nil {
		f.Fatal(err)
	}
	f.Add(b)
	f.Add(orphanMagic)
	f.Add([]byte("walship-orphan-v1\n\x00"))
	f.Fuzz(func(t *testing.T, b []byte) {
		entries, err := decodeOrphan("fuzz", b)
		if err != nil {
			return
		}
		if len(entries) == 0 {
			if !bytes.Equal(b, orphanMagic) {
				t.Fatalf("no entries from %q", b)
			}
			return
		}
		d := t.TempDir()
		o, err := SaveOrphan(vfs.OS, d, 1, entries, time.Unix(1, 0))
		if err != nil {
			t.Fatal(err)
		}
		again, err := os.ReadFile(filepath.Join(d, "orphans", o.Name))
		if err != nil || !bytes.Equal(again, b) {
			t.Fatalf("re-encoded %q, decoded from %q (%v)", again, b, err)
		}
	})
}

// FuzzParseHistory: any bytes parse or fail cleanly; a parsed history
// marshals to a form that parses to the same history.
func FuzzParseHistory(f *testing.F) {
	f.Add([]byte("1 1\n2 10\n"))
	f.Add([]byte("3 5"))
	f.Add([]byte("1 1\n1 2\n"))
	f.Fuzz(func(t *testing.T, b []byte) {
		h, err := ParseHistory("fuzz", b)
		if err != nil {
			return
		}
		back, err := ParseHistory("again", h.Marshal())
		if err != nil || string(back.Marshal()) != string(h.Marshal()) {
			t.Fatalf("%v re-parsed as %v, %v", h, back, err)
		}
	})
}

// TestSharedUpTo: where two logs part, from both histories.
func TestSharedUpTo(t *testing.T) {
	for _, tc := range []struct {
		name        string
		ours, their History
		lsn         uint64
		all, known  bool
	}{
		{"same current epoch", History{{1, 1}, {2, 10}}, History{{1, 1}, {2, 10}}, 0, true, true},
		{"they are behind in an epoch we ended", History{{1, 1}, {2, 10}}, History{{1, 1}}, 9, false, true},
		{"they hold an epoch we never had (KIP-101)", History{{4, 1}, {6, 111}}, History{{4, 1}, {5, 100}}, 99, false, true},
		{"they have less of the shared epoch", History{{4, 1}, {6, 111}}, History{{4, 1}, {5, 50}}, 49, false, true},
		{"they joined mid-epoch from a snapshot", History{{1, 1}, {3, 20}}, History{{1, 15}}, 19, false, true},
		{"nothing shared, both complete", History{{2, 1}}, History{{1, 1}}, 0, false, true},
		{"nothing shared, ours incomplete", History{{5, 100}}, History{{1, 1}}, 0, false, false},
		{"their history unknown", History{{1, 1}, {2, 10}}, nil, 0, false, true},
		// Refused by Check wherever a peer's history arrives; were one
		// to get through, it shares nothing (was: the first LSN of 0
		// wrapped round to the open end, and all was true).
		{"their first LSN of 0 after a shared epoch", History{{1, 1}}, History{{1, 1}, {2, 0}}, 0, false, true},
	} {
		lsn, all, known := tc.ours.SharedUpTo(tc.their)
		if lsn != tc.lsn || all != tc.all || known != tc.known {
			t.Errorf("%s: %d, %v, %v; want %d, %v, %v", tc.name, lsn, all, known, tc.lsn, tc.all, tc.known)
		}
	}
}

// FuzzSharedUpTo: whatever history a peer states, SharedUpTo says all
// only when the peer's log is in this log's current epoch (or holds no
// history). And for a peer whose log is this log's up to some LSN c,
// then nothing or epochs this log never had (a deposed primary's tail,
// KIP-101), it says the logs share at least up to c, and the two logs'
// epochs agree at every LSN up to what it says.
func FuzzSharedUpTo(f *testing.F) {
	f.Add([]byte{0, 0, 1, 9}, []byte{1, 1, 2, 10}, uint8(5), uint8(1))
	f.Add([]byte{3, 0, 1, 110}, []byte{4, 1, 5, 100}, uint8(99), uint8(0))
	f.Add([]byte{0, 0}, []byte{1, 1, 2, 0}, uint8(0), uint8(1))
	f.Add([]byte{4, 99}, []byte{1, 1}, uint8(200), uint8(3))
	f.Fuzz(func(t *testing.T, ob, tb []byte, cut, deposed uint8) {
		// Ours is a history this node could hold: epochs increasing,
		// first LSNs from 1 (or later: seeded) and not decreasing.
		var ours History
		epoch, lsn := uint64(0), uint64(1)
		for i := 0; i+1 < len(ob) && len(ours) < 16; i += 2 {
			epoch += 1 + uint64(ob[i]%4)
			lsn += uint64(ob[i+1])
			ours = append(ours, Start{Epoch: epoch, FirstLSN: lsn})
		}
		// Anything a peer could send.
		var theirs History
		for i := 0; i+1 < len(tb) && len(theirs) < 16; i += 2 {
			theirs = append(theirs, Start{Epoch: uint64(tb[i] % 16), FirstLSN: uint64(tb[i+1])})
		}
		_, all, _ := ours.SharedUpTo(theirs)
		// (An empty theirs is judged by KeepUpTo(0), tested above.)
		if all && len(theirs) > 0 && (len(ours) == 0 || theirs.Current().Epoch != ours.Current().Epoch) {
			t.Fatalf("ours %v, theirs %v: all, though their log's epoch is not our current one", ours, theirs)
		}
		if len(ours) == 0 || !ours.Complete() {
			return
		}
		// A peer whose log is ours up to LSN c, then perhaps epochs we
		// never had.
		c := uint64(cut) + 1
		theirs = nil
		for _, s := range ours {
			if s.FirstLSN <= c {
				theirs = append(theirs, s)
			}
		}
		for k := range uint64(deposed % 3) {
			e := theirs.Current().Epoch + 1
			for slices.ContainsFunc(ours, func(s Start) bool { return s.Epoch == e }) {
				e++
			}
			theirs = append(theirs, Start{Epoch: e, FirstLSN: c + 1 + k})
		}
		got, all, known := ours.SharedUpTo(theirs)
		if all {
			if deposed%3 != 0 || theirs.Current() != ours.Current() {
				t.Fatalf("ours %v, theirs %v: all", ours, theirs)
			}
			return
		}
		if !known || got < c {
			t.Fatalf("ours %v, theirs %v (ours up to %d): shared up to %d, known %v", ours, theirs, c, got, known)
		}
		for _, x := range append([]uint64{got}, firstLSNs(ours, theirs)...) {
			if x >= 1 && x <= got && ours.EpochOf(x) != theirs.EpochOf(x) {
				t.Fatalf("ours %v, theirs %v: shared up to %d, but LSN %d is of epoch %d here and %d there",
					ours, theirs, got, x, ours.EpochOf(x), theirs.EpochOf(x))
			}
		}
	})
}

// firstLSNs are the first LSNs of every line of hs.
func firstLSNs(hs ...History) []uint64 {
	var out []uint64
	for _, h := range hs {
		for _, s := range h {
			out = append(out, s.FirstLSN)
		}
	}
	return out
}

// TestEpochBound: no epoch after MaxEpoch is ever begun — the one after
// every epoch seen never wraps to 0 — and a history or an epoch a peer
// states above it is refused, naming the entry.
func TestEpochBound(t *testing.T) {
	if e, err := NextEpoch(MaxEpoch - 1); err != nil || e != MaxEpoch {
		t.Fatalf("NextEpoch(MaxEpoch-1) = %d, %v", e, err)
	}
	for _, seen := range []uint64{MaxEpoch, MaxEpoch + 1, math.MaxUint64} {
		if e, err := NextEpoch(seen); !errors.Is(err, ErrNoEpochLeft) {
			t.Errorf("NextEpoch(%d) = %d, %v; want ErrNoEpochLeft", seen, e, err)
		}
		if h, err := (History{{Epoch: 1, FirstLSN: 1}}).Begin(seen, 5); !errors.Is(err, ErrNoEpochLeft) {
			t.Errorf("Begin(%d) = %v, %v; want ErrNoEpochLeft", seen, h, err)
		}
	}
	if h, err := (History{{Epoch: MaxEpoch, FirstLSN: 1}}).Begin(0, 5); !errors.Is(err, ErrNoEpochLeft) {
		t.Errorf("Begin after a history at MaxEpoch = %v, %v; want ErrNoEpochLeft", h, err)
	}
	if err := CheckEpoch(MaxEpoch, MaxEpoch-1, MaxEpochJump); err != nil {
		t.Errorf("CheckEpoch(MaxEpoch) = %v", err)
	}
	if err := CheckEpoch(math.MaxUint64, MaxEpoch, MaxEpochJump); err == nil || !strings.Contains(err.Error(), "above the highest epoch") {
		t.Errorf("CheckEpoch(2^64-1) = %v", err)
	}
	err := CheckProto([]*walshipv1.EpochStart{{Epoch: 1, FirstLsn: 1}, {Epoch: math.MaxUint64, FirstLsn: 9}}, MaxEpoch, MaxEpochGap)
	if err == nil || !strings.Contains(err.Error(), "[1].epoch") {
		t.Errorf("CheckProto with an epoch of 2^64-1 = %v", err)
	}
}

// TestEpochJump: an epoch from outside is at most a bound above the
// newest one the receiver knows — a node that knows none included: 2^20
// for what a message makes it promise or write (so that no message moves
// a node's epoch by more, and exhausting the epochs takes 2^43 accepted
// messages, not one), 2^30 for what it believes from the peers it asks.
// Older ones and the bound itself pass, and the error names the bound and
// what the receiver knows.
func TestEpochJump(t *testing.T) {
	for _, c := range []struct {
		e, known, bound uint64
		ok              bool
		what            string
	}{
		{1, 0, MaxEpochJump, true, ""},
		{MaxEpochJump, 0, MaxEpochJump, true, ""},
		{MaxEpochJump + 1, 0, MaxEpochJump, false, "one message may move an epoch"},
		{5, 9, MaxEpochJump, true, ""}, // older: each receiver's own rule (stale) decides
		{9 + MaxEpochJump, 9, MaxEpochJump, true, ""},
		{10 + MaxEpochJump, 9, MaxEpochJump, false, "one message may move an epoch"},
		{MaxEpoch, 0, MaxEpochJump, false, "one message may move an epoch"}, // the message a fuzzer sent a log store
		{MaxEpoch, MaxEpoch - MaxEpochJump, MaxEpochJump, true, ""},
		{10 + MaxEpochJump, 9, MaxEpochGap, true, ""},
		{9 + MaxEpochGap, 9, MaxEpochGap, true, ""},
		{10 + MaxEpochGap, 9, MaxEpochGap, false, "a node catches up by at once"},
		{MaxEpoch, 0, MaxEpochGap, false, "a node catches up by at once"},
	} {
		err := CheckEpoch(c.e, c.known, c.bound)
		if (err == nil) != c.ok {
			t.Errorf("CheckEpoch(%d, known %d, bound %d) = %v; want ok %v", c.e, c.known, c.bound, err, c.ok)
		}
		if want := fmt.Sprintf("%d is more than %d (the most %s) above %d, the newest epoch known here", c.e, c.bound, c.what, c.known); err != nil && err.Error() != want {
			t.Errorf("CheckEpoch(%d, known %d, bound %d) = %q; want %q", c.e, c.known, c.bound, err, want)
		}
	}
	if err := CheckEpoch(math.MaxUint64, math.MaxUint64-1, MaxEpochGap); err == nil || !strings.Contains(err.Error(), "above the highest epoch") {
		t.Errorf("CheckEpoch(2^64-1) just above what is known = %v", err)
	}
	hs := []*walshipv1.EpochStart{{Epoch: 1, FirstLsn: 1}, {Epoch: 3 + MaxEpochJump, FirstLsn: 9}}
	if err := CheckProto(hs, 2, MaxEpochJump); err == nil || !strings.Contains(err.Error(), "[1].epoch") || !strings.Contains(err.Error(), "more than 1048576") {
		t.Errorf("CheckProto with an entry past the jump = %v", err)
	}
	if err := CheckProto(hs, 3, MaxEpochJump); err != nil {
		t.Errorf("CheckProto within the jump = %v", err)
	}
	if err := CheckProto(hs, 2, MaxEpochGap); err != nil {
		t.Errorf("CheckProto within the gap = %v", err)
	}
}

// TestEpochSteps: the fences that bring a node's promise to an epoch
// more than MaxEpochJump above it are each at most the jump above the
// one before (the node's promise first) and below the target, which is
// within the jump of the last; none within the jump; none beyond the
// gap (not bridged).
func TestEpochSteps(t *testing.T) {
	for _, c := range []struct {
		from, to uint64
		n        int
	}{
		{0, 5, 0},
		{5, 5 + MaxEpochJump, 0},
		{5, 6 + MaxEpochJump, 1},
		{5, 5 + 2*MaxEpochJump, 1},
		{5, 6 + 2*MaxEpochJump, 2},
		{0, MaxEpochGap + MaxEpochJump, MaxEpochGap / MaxEpochJump},
		{0, MaxEpochGap + MaxEpochJump + 1, 0},
		{9, 3, 0},
	} {
		steps := EpochSteps(c.from, c.to)
		if len(steps) != c.n {
			t.Errorf("EpochSteps(%d, %d) has %d steps, want %d", c.from, c.to, len(steps), c.n)
			continue
		}
		prev := c.from
		for _, e := range append(steps, c.to) {
			if c.n > 0 && (e <= prev || e-prev > MaxEpochJump) {
				t.Errorf("EpochSteps(%d, %d): %d after %d", c.from, c.to, e, prev)
			}
			prev = e
		}
	}
}
