package wal

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/walship/walship/internal/vfs"
)

// The logs FuzzRecoverDirectory builds start at rdFirstLSN, whose hex digits
// include letters, so that upper-casing a segment's name really changes it.
// Segments are rdSegSize bytes: entries of up to 60 bytes of data put two to
// nine of them in each.
const (
	rdFirstLSN = 0xabc0
	rdSegSize  = 256
)

// rdCase is one input of FuzzRecoverDirectory, in the order of its arguments.
type rdCase struct {
	// shape picks the log: bit 0 gives 2 or 3 segments, bit 1 entries
	// covering up to three LSNs, bit 2 turns preallocation off, and the
	// other bits seed the entry sizes.
	shape uint8
	// target picks the damaged segment, counted from the newest (0 is the
	// newest), op the damage (see rdDamage), pos where, and junk the bytes
	// it writes or appends.
	target, op uint8
	pos        uint16
	junk       []byte
	// reset adds a .reset marker: 0 none, 1 one as Reset writes it for LSN
	// resetLSN, 2 one holding resetData.
	reset     uint8
	resetLSN  uint64
	resetData []byte
	// unsynced adds an UNSYNCED file: 0 none, 1 holding the LSN
	// rdFirstLSN-3+unsyncedN as failUnsynced writes it, 2 holding
	// unsyncedText.
	unsynced     uint8
	unsyncedN    uint64
	unsyncedText string
	// stray adds a file whose name almost parses as a segment or a marker
	// (see rdStrayName).
	stray uint8
}

func (c rdCase) add(f *testing.F) {
	f.Add(c.shape, c.target, c.op, c.pos, c.junk, c.reset, c.resetLSN, c.resetData, c.unsynced, c.unsyncedN, c.unsyncedText, c.stray)
}

// rdDir is a log directory built for an rdCase, with what the test needs to
// know about it.
type rdDir struct {
	m       *vfs.MemFS
	written []Entry  // every entry appended, oldest first
	segs    []string // the segment paths, oldest first
	perSeg  []int    // the number of entries in each segment
	target  int      // index in segs of the segment given op
	damaged bool     // op changed the target's bytes

	marker      string // path of the .reset marker added, or ""
	markerLSN   uint64
	markerBytes []byte
	exactMarker bool // the marker is byte for byte what Reset writes

	stray    string // path of the stray file added, or ""
	unsynced []byte // contents of the UNSYNCED file added, or nil

	before dirSnapshot // every file, just before Open
}

// rdResult is what Open made of a directory without an UNSYNCED file.
type rdResult struct {
	err         error
	entries     []Entry
	first, last uint64 // FirstReadableLSN and LastLSN
}

// FuzzRecoverDirectory: recovery of a whole directory — several segments
// written by the real API, one of them damaged (a byte changed, a cut, junk
// appended, a frame cut out), possibly with a .reset marker, an UNSYNCED
// file and a stray file whose name almost parses — never panics and never
// returns an entry that was not written or a log with a gap. Open either
// refuses with a *CorruptionError naming the damaged segment (or the one
// after it, whose first LSN no longer follows) and changes no segment, or
// opens a log whose entries, read through a Reader from FirstReadableLSN,
// are byte for byte a prefix of those written, with LastLSN at the end of
// that prefix. Only the newest segment may lose entries; damage to an older
// one is always refused; an undamaged directory loses nothing, whatever
// stray or incomplete marker lies next to it; a marker that is exactly what
// Reset writes finishes the reset (an empty log whose next LSN is the
// marker's) and no other kind of file starts one. The repaired log takes an
// Append and reopens with nothing more to repair.
//
// The UNSYNCED file is the record failUnsynced leaves after a failed write
// or fsync: the last LSN known durable, N, in decimal. By design Open cuts
// every entry after N, so the log ends at min(N, the last LSN recovered),
// and removes the file. An N inside an entry or before the log's first LSN,
// or contents that are not a number, make Open fail with an error naming
// the file, and the log is left as recovery found it. Either way recovery
// runs first, so the file never changes whether it refuses.
func FuzzRecoverDirectory(f *testing.F) {
	// Indices of the seeds' shapes: 0 is two segments of single-LSN entries
	// with preallocation, 1 three segments, 2 two segments of multi-LSN
	// entries, 4 two segments without preallocation.
	seeds := []rdCase{
		{},
		{shape: 1},
		{shape: 2},
		{shape: 3 | 4 | 8},
		{shape: 5 | 16 | 64},
		// Damage to the newest segment: a flipped byte in a frame (followed
		// by valid frames or not), a cut inside a frame or inside the
		// header, junk, a cut at a frame boundary, a frame cut out.
		{target: 0, op: 1, pos: 60, junk: []byte{0x40}},
		{shape: 1, target: 0, op: 1, pos: 40, junk: []byte{1}},
		{target: 0, op: 3, pos: 90},
		{target: 0, op: 3, pos: 10},
		{target: 0, op: 4, junk: []byte("not a frame, just junk")},
		{shape: 4, target: 0, op: 4, junk: make([]byte, 30)},
		{target: 0, op: 5, pos: 0},
		{shape: 1, target: 0, op: 6, pos: 0},
		{shape: 2, target: 0, op: 2, pos: 70, junk: []byte{0xff}},
		// Damage to an older segment.
		{target: 1, op: 1, pos: 100, junk: []byte{0x40}},
		{shape: 1, target: 2, op: 1, pos: 20, junk: []byte{8}},
		{target: 1, op: 3, pos: 150},
		{target: 1, op: 4, junk: []byte{0}},
		{shape: 4, target: 1, op: 5, pos: 1},
		{shape: 1, target: 1, op: 5, pos: 2},
		{target: 1, op: 6, pos: 0},
		{shape: 2, target: 1, op: 6, pos: 1},
		// Reset markers: as Reset writes them, with or without damage to
		// the segments they replace, and arbitrary contents.
		{reset: 1, resetLSN: 0x10000},
		{reset: 1, resetLSN: rdFirstLSN + 2, target: 1, op: 1, pos: 50, junk: []byte{1}},
		{reset: 2, resetLSN: 5, resetData: []byte("not a header")},
		{reset: 2, resetLSN: 7, resetData: rdResetMarker(f, 7)},
		{reset: 2, resetLSN: 7, resetData: rdResetMarker(f, 7)[:31]},
		{reset: 2, resetLSN: 0, resetData: rdResetMarker(f, 7)},
		{reset: 2, resetLSN: 8, resetData: rdResetMarker(f, 7)},
		// UNSYNCED: an LSN within the log, just before it, before that,
		// after it, far after it; inside a multi-LSN entry; not a number.
		{unsynced: 1, unsyncedN: 4},
		{shape: 1, unsynced: 1, unsyncedN: 7},
		{unsynced: 1, unsyncedN: 2},
		{unsynced: 1, unsyncedN: 0},
		{unsynced: 1, unsyncedN: 1000},
		{unsynced: 1, unsyncedN: 1 << 62},
		{shape: 2, unsynced: 1, unsyncedN: 4},
		{unsynced: 2, unsyncedText: "junk"},
		{unsynced: 2, unsyncedText: " 43970 \n"},
		{unsynced: 2, unsyncedText: "-1"},
		{unsynced: 2},
		{target: 0, op: 3, pos: 90, unsynced: 1, unsyncedN: 4},
		{reset: 1, resetLSN: 0x10000, unsynced: 1, unsyncedN: 5},
		{reset: 1, resetLSN: rdFirstLSN + 2, unsynced: 1, unsyncedN: 5},
		{target: 1, op: 1, pos: 100, junk: []byte{0x40}, unsynced: 1, unsyncedN: 4},
	}
	for s := range uint8(12) {
		seeds = append(seeds, rdCase{stray: s}, rdCase{shape: 1, stray: s + 12}, rdCase{stray: s + 24})
	}
	for _, c := range seeds {
		c.add(f)
	}

	f.Fuzz(func(t *testing.T, shape, target, op uint8, pos uint16, junk []byte, reset uint8, resetLSN uint64, resetData []byte, unsynced uint8, unsyncedN uint64, unsyncedText string, stray uint8) {
		c := rdCase{shape, target, op, pos, junk, reset, resetLSN, resetData, unsynced, unsyncedN, unsyncedText, stray}
		// The directory without the UNSYNCED file is the reference the
		// directory with it is compared to.
		ref := c
		ref.unsynced = 0
		res := rdCheckRecovery(t, rdBuild(t, ref))
		if c.unsynced%3 != 0 {
			rdCheckUnsynced(t, rdBuild(t, c), res)
		}
	})
}

// rdBuild writes the log c describes with the real API, then damages it and
// adds the files c asks for.
func rdBuild(t *testing.T, c rdCase) *rdDir {
	t.Helper()
	nSegs := 2 + int(c.shape&1)
	spans := c.shape&2 != 0
	prealloc := int64(0)
	if c.shape&4 != 0 {
		prealloc = -1
	}
	rng := rand.New(rand.NewPCG(uint64(c.shape), 0x5eed))

	d := &rdDir{m: vfs.NewMem()}
	l, err := Open(Options{Dir: testDir, FS: d.m, SegmentSize: rdSegSize, Preallocate: prealloc})
	mustNoErr(t, err)
	next := uint64(rdFirstLSN)
	appendOne := func(size int) {
		last := next
		if spans {
			last += uint64(rng.IntN(3))
		}
		e := Entry{FirstLSN: next, LastLSN: last, Data: payload(next, size)}
		mustNoErr(t, l.Append(e))
		if n := l.Segments(); n > len(d.segs) {
			d.segs = append(d.segs, filepath.Join(testDir, segmentName(next)))
			d.perSeg = append(d.perSeg, 0)
		}
		d.perSeg[len(d.perSeg)-1]++
		d.written = append(d.written, e)
		next = last + 1
	}
	for l.Segments() < nSegs {
		appendOne(rng.IntN(61))
	}
	// The newest segment holds at most 32+84 bytes: two more entries of at
	// most 32 bytes each still fit in it.
	for range int(c.shape>>3) % 3 {
		appendOne(rng.IntN(9))
	}
	mustNoErr(t, l.Close())
	if len(d.segs) != nSegs || l.Segments() != nSegs {
		t.Fatalf("built %d segments (%v), want %d", l.Segments(), d.segs, nSegs)
	}

	d.target = nSegs - 1 - int(c.target)%nSegs
	path := d.segs[d.target]
	orig, err := vfs.ReadFile(d.m, path)
	mustNoErr(t, err)
	damaged := rdDamage(bytes.Clone(orig), c.op, c.pos, c.junk)
	d.damaged = !bytes.Equal(orig, damaged)
	mustNoErr(t, vfs.WriteFile(d.m, path, damaged, 0o600))

	switch c.reset % 3 {
	case 1:
		d.markerLSN = 1 + c.resetLSN%(1<<48)
		d.markerBytes = rdResetMarker(t, d.markerLSN)
	case 2:
		d.markerLSN = c.resetLSN % (1 << 48)
		d.markerBytes = c.resetData
	}
	if c.reset%3 != 0 {
		d.marker = filepath.Join(testDir, resetName(d.markerLSN))
		d.exactMarker = d.markerLSN != 0 && bytes.Equal(d.markerBytes, rdResetMarker(t, d.markerLSN))
		mustNoErr(t, vfs.WriteFile(d.m, d.marker, d.markerBytes, 0o600))
	}

	if c.stray%12 != 0 {
		// The stray's name is built from the first LSN of one of the
		// segments or from the LSN after the last entry.
		k := int(c.stray/12) % (nSegs + 1)
		lsn := next
		if k < nSegs {
			lsn = d.written[rdFirstIndex(d, k)].FirstLSN
		}
		name, isMarker := rdStrayName(c.stray%12, lsn)
		// A stray .wal holds a valid segment of entries never written to
		// this log, a stray marker a valid marker: were either taken for
		// the real thing, Open would lose entries, return foreign ones or
		// fail.
		var content []byte
		if isMarker {
			content = rdResetMarker(t, lsn)
		} else {
			content = rdAltSegment(t, lsn)
		}
		d.stray = filepath.Join(testDir, name)
		mustNoErr(t, vfs.WriteFile(d.m, d.stray, content, 0o600))
	}

	switch c.unsynced % 3 {
	case 1:
		// failUnsynced's format: the LSN in decimal and a newline.
		d.unsynced = []byte(strconv.FormatUint(rdFirstLSN-3+c.unsyncedN, 10) + "\n")
	case 2:
		d.unsynced = []byte(c.unsyncedText)
	}
	if d.unsynced != nil {
		mustNoErr(t, vfs.WriteFileAtomic(d.m, filepath.Join(testDir, unsyncedName), d.unsynced))
	}
	d.before = snapshotDir(t, d.m)
	return d
}

// rdDamage applies damage op to the segment b:
//
//	0: none
//	1: xor the byte at pos with junk[0] (1 without junk)
//	2: overwrite the byte at pos with junk[0] (0 without junk)
//	3: cut the file at pos
//	4: append junk
//	5: cut the file at the end of frame pos (0: just the header)
//	6: cut frame pos out, moving the rest of the file up
//
// pos is taken modulo what makes sense for the op.
func rdDamage(b []byte, op uint8, pos uint16, junk []byte) []byte {
	p := int(pos)
	switch op % 7 {
	case 1:
		v := byte(1)
		if len(junk) > 0 {
			v = junk[0]
		}
		b[p%len(b)] ^= v
	case 2:
		v := byte(0)
		if len(junk) > 0 {
			v = junk[0]
		}
		b[p%len(b)] = v
	case 3:
		b = b[:p%(len(b)+1)]
	case 4:
		b = append(b, junk...)
	case 5:
		ends := rdFrameEnds(b)
		b = b[:ends[p%len(ends)]]
	case 6:
		ends := rdFrameEnds(b)
		k := p % (len(ends) - 1)
		b = append(b[:ends[k]], b[ends[k+1]:]...)
	}
	return b
}

// rdFrameEnds returns the offsets where the undamaged segment b's header and
// each of its frames end, stopping at the preallocated zeros.
func rdFrameEnds(b []byte) []int {
	ends := []int{headerSize}
	for off := headerSize; off+frameHeaderSize <= len(b); {
		h := decodeFrameHeader(b[off:])
		if h.first == 0 {
			break
		}
		off += frameHeaderSize + int(h.length)
		ends = append(ends, off)
	}
	return ends
}

// rdStrayName returns a name that is not a segment's or a marker's but
// almost parses as one for lsn, and whether it mimics a marker.
func rdStrayName(kind uint8, lsn uint64) (string, bool) {
	hex := fmt.Sprintf("%016x", lsn)
	switch kind {
	case 1:
		return strings.ToUpper(hex) + segmentExt, false
	case 2:
		return hex[1:] + segmentExt, false // 15 digits
	case 3:
		return "0" + hex + segmentExt, false // 17 digits
	case 4:
		return hex + segmentExt + ".bak", false
	case 5:
		return hex + segmentExt + "~", false
	case 6:
		return hex + strings.ToUpper(segmentExt), false
	case 7:
		return "0x" + hex[2:] + segmentExt, false
	case 8:
		return "+" + hex[1:] + segmentExt, false
	case 9:
		return strings.ToUpper(hex) + resetExt, true
	case 10:
		return "0" + hex + resetExt, true
	}
	return hex + resetExt + ".tmp", true
}

// rdFirstIndex returns the index in d.written of segment k's first entry.
func rdFirstIndex(d *rdDir, k int) int {
	i := 0
	for _, n := range d.perSeg[:k] {
		i += n
	}
	return i
}

// rdResetMarker returns the marker Reset(lsn) writes: the file a Reset
// renames into the log's only segment, read back before any Append.
func rdResetMarker(t testing.TB, lsn uint64) []byte {
	t.Helper()
	m := vfs.NewMem()
	l, err := Open(Options{Dir: testDir, FS: m})
	mustNoErr(t, err)
	mustNoErr(t, l.Reset(lsn))
	mustNoErr(t, l.Close())
	b, err := vfs.ReadFile(m, filepath.Join(testDir, segmentName(lsn)))
	mustNoErr(t, err)
	return b
}

// rdAltSegment returns a valid segment, written by the real API, holding two
// entries from LSN first whose data differs from what rdBuild writes.
func rdAltSegment(t testing.TB, first uint64) []byte {
	t.Helper()
	m := vfs.NewMem()
	l, err := Open(Options{Dir: testDir, FS: m, SegmentSize: rdSegSize, Preallocate: -1})
	mustNoErr(t, err)
	for lsn := first; lsn < first+2; lsn++ {
		data := payload(lsn, 20)
		for i := range data {
			data[i] ^= 0xff
		}
		mustNoErr(t, l.Append(Entry{FirstLSN: lsn, LastLSN: lsn, Data: data}))
	}
	mustNoErr(t, l.Close())
	b, err := vfs.ReadFile(m, filepath.Join(testDir, segmentName(first)))
	mustNoErr(t, err)
	return b
}

// rdReadAll reads every entry of l with a Reader from FirstReadableLSN,
// checking that they follow each other up to LastLSN exactly and that
// nothing can be read past it.
func rdReadAll(t *testing.T, l *Log) []Entry {
	t.Helper()
	// Next returns what is available even with a done context, and the
	// context's error instead of blocking: reading cannot hang.
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	from, last := l.FirstReadableLSN(), l.LastLSN()
	r, err := l.NewReader(from, false)
	if err != nil {
		t.Fatalf("NewReader(%d) on a log ending at LSN %d: %v", from, last, err)
	}
	defer r.Close()
	var out []Entry
	next := from
	for next <= last {
		e, err := r.Next(ctx)
		if err != nil {
			t.Fatalf("reading LSN %d of %d..%d: %v", next, from, last, err)
		}
		if e.FirstLSN != next || e.LastLSN < e.FirstLSN {
			t.Fatalf("read LSNs %d..%d where LSN %d was next", e.FirstLSN, e.LastLSN, next)
		}
		out = append(out, e)
		next = e.LastLSN + 1
	}
	if next != last+1 {
		t.Fatalf("the last entry read ends at LSN %d, LastLSN is %d", next-1, last)
	}
	if e, err := r.Next(ctx); !errors.Is(err, context.Canceled) {
		t.Fatalf("read past LastLSN %d: LSNs %d..%d, %v", last, e.FirstLSN, e.LastLSN, err)
	}
	return out
}

// rdCheckRecovery opens d, which has no UNSYNCED file, checks the outcome
// and returns it.
func rdCheckRecovery(t *testing.T, d *rdDir) rdResult {
	t.Helper()
	newest := len(d.segs) - 1
	l, err := Open(Options{Dir: testDir, FS: d.m, SegmentSize: rdSegSize})
	if err != nil {
		var ce *CorruptionError
		if !errors.As(err, &ce) || !errors.Is(err, ErrCorrupt) {
			t.Fatalf("Open failed with a non-corruption error: %v", err)
		}
		if !d.damaged {
			t.Fatalf("Open refused a log no segment of which was damaged: %v", err)
		}
		if d.exactMarker {
			t.Fatalf("Open refused a log holding a complete reset marker: %v", err)
		}
		named := ce.Segment == d.segs[d.target] || (d.target < newest && ce.Segment == d.segs[d.target+1])
		if !named || !strings.Contains(err.Error(), ce.Segment) {
			t.Fatalf("Open = %v; want the damaged segment %s (or the one after it) named", err, d.segs[d.target])
		}
		// Refusing repairs nothing; only an incomplete marker, dropped
		// before the segments are checked, may be gone.
		want := maps.Clone(d.before)
		if d.marker != "" {
			delete(want, filepath.Base(d.marker))
		}
		if after := snapshotDir(t, d.m); !sameSnapshot(want, after) {
			t.Fatalf("a refused Open changed the files: %v -> %v", rdNames(d.before), rdNames(after))
		}
		return rdResult{err: err}
	}
	info := l.Recovery()
	got := rdReadAll(t, l)
	res := rdResult{entries: got, first: l.FirstReadableLSN(), last: l.LastLSN()}
	if d.marker != "" {
		if _, err := d.m.Stat(d.marker); err == nil {
			t.Fatalf("the marker %s is still there after Open", d.marker)
		}
	}
	if d.stray != "" {
		if b, err := vfs.ReadFile(d.m, d.stray); err != nil || string(b) != d.before[filepath.Base(d.stray)] {
			t.Fatalf("the stray file %s was changed or removed (%v)", d.stray, err)
		}
	}

	if info.ResetCompleted {
		if d.marker == "" {
			t.Fatal("Open finished a reset without a marker")
		}
		b := d.markerBytes
		if len(b) != headerSize || string(b[:8]) != segmentMagic || binary.LittleEndian.Uint64(b[16:24]) != d.markerLSN {
			t.Fatalf("Open finished a reset from a marker (%d bytes) that is not a segment header for LSN %d", len(b), d.markerLSN)
		}
		if len(got) != 0 || res.first != d.markerLSN || res.last != d.markerLSN-1 || l.Segments() != 1 {
			t.Fatalf("after finishing Reset(%d): %d entries, first readable %d, last %d, %d segments; want an empty log at LSN %d",
				d.markerLSN, len(got), res.first, res.last, l.Segments(), d.markerLSN)
		}
		for _, p := range d.segs {
			if _, err := d.m.Stat(p); err == nil && p != filepath.Join(testDir, segmentName(d.markerLSN)) {
				t.Fatalf("segment %s survived a finished reset", p)
			}
		}
	} else {
		if d.exactMarker {
			t.Fatalf("Open did not finish the reset of a complete marker for LSN %d", d.markerLSN)
		}
		if len(got) > len(d.written) {
			t.Fatalf("read %d entries %s, only %d were written", len(got), span(got), len(d.written))
		}
		if err := diffEntries(got, d.written[:len(got)]); err != nil {
			t.Fatalf("the recovered log is not a prefix of what was written: %v", err)
		}
		if res.first != rdFirstLSN {
			t.Fatalf("the recovered log starts at LSN %d, want %d", res.first, rdFirstLSN)
		}
		if d.damaged && d.target != newest {
			t.Fatalf("Open accepted damage to segment %s, which is not the newest", d.segs[d.target])
		}
		if !d.damaged && len(got) != len(d.written) {
			t.Fatalf("no segment was damaged, yet only %d of %d entries were recovered", len(got), len(d.written))
		}
		if kept := rdFirstIndex(d, newest); len(got) < kept {
			t.Fatalf("recovered %d entries; the segments before the newest hold %d", len(got), kept)
		}
		if s := info.TornSegment; s != "" && (s != d.segs[newest] || !d.damaged || d.target != newest) {
			t.Fatalf("Open cut a torn tail from %s; only the damaged newest segment %s may be cut", s, d.segs[newest])
		}
		if s := info.RemovedSegment; s != "" && (s != d.segs[newest] || !d.damaged || d.target != newest) {
			t.Fatalf("Open removed %s; only the damaged newest segment %s may be removed", s, d.segs[newest])
		}
	}

	// The repaired log takes the next entry, and reopens with nothing left
	// to repair.
	e := mkEntry(res.last+1, res.last+1, 5)
	mustNoErr(t, l.Append(e))
	mustNoErr(t, l.Close())
	l, err = Open(Options{Dir: testDir, FS: d.m, SegmentSize: rdSegSize})
	if err != nil {
		t.Fatalf("reopening the repaired log: %v", err)
	}
	defer l.Close()
	if info := l.Recovery(); info.TornSegment != "" || info.RemovedSegment != "" || info.ResetCompleted {
		t.Fatalf("the second Open repaired again: %+v", info)
	}
	checkEntries(t, rdReadAll(t, l), append(got[:len(got):len(got)], e))
	return res
}

// rdCheckUnsynced opens d, which is the directory ref was recovered from
// plus an UNSYNCED file, and checks that the file cuts the log after the LSN
// it holds, or makes Open fail naming it, as the comment of
// FuzzRecoverDirectory describes.
func rdCheckUnsynced(t *testing.T, d *rdDir, ref rdResult) {
	t.Helper()
	path := filepath.Join(testDir, unsyncedName)
	l, err := Open(Options{Dir: testDir, FS: d.m, SegmentSize: rdSegSize})
	if ref.err != nil {
		var ce, refCE *CorruptionError
		errors.As(ref.err, &refCE)
		if !errors.As(err, &ce) || *ce != *refCE {
			t.Fatalf("with UNSYNCED %q, Open = %v; without it, %v", d.unsynced, err, ref.err)
		}
		return
	}

	// Which entries the file keeps, if it holds an LSN the log can be cut
	// after.
	n, perr := strconv.ParseUint(strings.TrimSpace(string(d.unsynced)), 10, 64)
	keep, cuts := len(ref.entries), perr == nil
	if cuts && n < ref.last {
		keep = -1
		if n == ref.first-1 {
			keep = 0
		}
		for i, e := range ref.entries {
			if e.LastLSN == n {
				keep = i + 1
			}
		}
		cuts = keep >= 0
	}

	if !cuts {
		var ce *CorruptionError
		if err == nil {
			_ = l.Close()
			t.Fatalf("Open accepted UNSYNCED %q on a log of LSNs %d..%d", d.unsynced, ref.first, ref.last)
		}
		if errors.As(err, &ce) || !strings.Contains(err.Error(), path) {
			t.Fatalf("UNSYNCED %q: Open = %v; want an error naming %s", d.unsynced, err, path)
		}
		// The refusal cut nothing: without the file, the log is the one
		// recovered without it.
		mustNoErr(t, d.m.Remove(path))
		l, err = Open(Options{Dir: testDir, FS: d.m, SegmentSize: rdSegSize})
		if err != nil {
			t.Fatalf("reopening without the refused UNSYNCED: %v", err)
		}
		defer l.Close()
		checkEntries(t, rdReadAll(t, l), ref.entries)
		if l.LastLSN() != ref.last {
			t.Fatalf("after a refused UNSYNCED %q: LastLSN %d, want %d", d.unsynced, l.LastLSN(), ref.last)
		}
		return
	}

	if err != nil {
		t.Fatalf("UNSYNCED %q on a log of LSNs %d..%d: Open = %v", d.unsynced, ref.first, ref.last, err)
	}
	want, wantLast := ref.entries[:keep], min(n, ref.last)
	checkEntries(t, rdReadAll(t, l), want)
	if l.LastLSN() != wantLast || l.DurableLSN() != wantLast {
		t.Fatalf("UNSYNCED %q: LastLSN %d, DurableLSN %d; want both %d", d.unsynced, l.LastLSN(), l.DurableLSN(), wantLast)
	}
	info := l.Recovery()
	if cut := n < ref.last; info.UnsyncedCut != cut || (cut && (info.UnsyncedCutAfter != n || info.UnsyncedLastLSN != ref.last)) {
		t.Fatalf("UNSYNCED %q on a log ending at LSN %d: Recovery %+v", d.unsynced, ref.last, info)
	}
	if _, err := d.m.Stat(path); err == nil {
		t.Fatal("UNSYNCED is still there after Open")
	}
	// The cut is for good: the next Open cuts nothing more.
	mustNoErr(t, l.Close())
	l, err = Open(Options{Dir: testDir, FS: d.m, SegmentSize: rdSegSize})
	if err != nil {
		t.Fatalf("reopening after the UNSYNCED cut: %v", err)
	}
	defer l.Close()
	if info := l.Recovery(); info.UnsyncedCut || l.LastLSN() != wantLast {
		t.Fatalf("the second Open: Recovery %+v, LastLSN %d; want no cut, LSN %d", info, l.LastLSN(), wantLast)
	}
	checkEntries(t, rdReadAll(t, l), want)
}

// rdNames lists the files of a snapshot with their sizes, for messages.
func rdNames(s dirSnapshot) []string {
	var out []string
	for name, b := range s {
		out = append(out, fmt.Sprintf("%s(%d)", name, len(b)))
	}
	slices.Sort(out)
	return out
}
