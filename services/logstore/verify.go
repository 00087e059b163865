package logstore

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"path/filepath"
	"slices"
	"sort"
	"time"

	walshipv1 "github.com/walship/walship/gen/walship/v1"
	"github.com/walship/walship/internal/basesnap"
	"github.com/walship/walship/internal/datadir"
	"github.com/walship/walship/internal/envelope"
	"github.com/walship/walship/internal/wal"
)

// Problem kinds Verify reports (VerifyProblem.kind).
const (
	problemGap      = "gap"      // LSNs do not continue (prev_lsn, or a frame holding other LSNs)
	problemCRC      = "crc"      // a frame's or a payload's checksum, or an envelope that does not decode
	problemEpoch    = "epoch"    // an epoch going down along the log, or not the history's
	problemSnapshot = "snapshot" // a base snapshot file that is damaged or not of this log
	problemRead     = "read"     // an I/O error
)

// Verify reads the whole stored log and every stored snapshot and reports
// what can be restored from this log store and every problem found.
func (h *logStoreServer) Verify(ctx context.Context, _ *walshipv1.VerifyRequest) (*walshipv1.VerifyResponse, error) {
	s := h.s
	if err := s.openCall(); err != nil {
		return nil, toStatus(err)
	}
	defer s.active.Done()
	vctx, done := s.callContext(ctx)
	defer done()
	start := time.Now()
	resp, err := s.verify(vctx)
	if err != nil {
		if vctx.Err() != nil && ctx.Err() == nil {
			err = errStopping
		}
		return nil, toStatus(err)
	}
	s.logger.Info("verified the archive", "first_lsn", resp.FirstLsn, "last_lsn", resp.LastLsn, "batches", resp.Batches,
		"snapshots", len(resp.Snapshots), "restorable_from_lsn", resp.RestorableFromLsn, "restorable_to_lsn", resp.RestorableToLsn,
		"problems", len(resp.Problems), "took", time.Since(start))
	return resp, nil
}

// run is an unbroken stretch of intact, continuous batches.
type run struct{ start, end uint64 }

// verifier is one Verify's state.
type verifier struct {
	s       *Server
	segs    []wal.SegmentInfo
	history datadir.History
	resp    *walshipv1.VerifyResponse
	runs    []run
	// ends maps the LSN of each stored snapshot file to where the log
	// holds a batch ending there: the run's index and the batch's epoch
	// (no entry: no intact batch ends there).
	snapLSNs map[uint64]bool
	ends     map[uint64]batchEnd
	// lastKey and lastEnd describe the newest problem of a batch: the
	// same problem in the batches right after it extends it.
	lastKey string
	lastEnd uint64
	// prevLast and prevEpoch are the last batch's; havePrev is false at
	// the start and after a stretch that could not be read. broken is set
	// by a batch that failed a check: the next intact one starts a run.
	prevLast, prevEpoch uint64
	havePrev, broken    bool
}

type batchEnd struct {
	run   int
	epoch uint64
}

func (v *verifier) problem(kind string, lsn uint64, format string, args ...any) {
	v.resp.Problems = append(v.resp.Problems, &walshipv1.VerifyProblem{Kind: kind, Lsn: lsn, Message: fmt.Sprintf(format, args...)})
	v.lastKey = ""
}

// batchProblem reports a problem of the batch e. The same problem (key) in
// the batches that follow it is reported once, for the whole stretch: a
// history at odds with a long log is one problem, not one per batch.
func (v *verifier) batchProblem(e wal.Entry, kind, key, format string, args ...any) {
	what := fmt.Sprintf(format, args...)
	key = kind + "/" + key
	if n := len(v.resp.Problems); n > 0 && key == v.lastKey && e.FirstLSN == v.lastEnd+1 {
		p := v.resp.Problems[n-1]
		segs := "segment " + v.segmentOf(p.Lsn)
		if last := v.segmentOf(e.FirstLSN); last != v.segmentOf(p.Lsn) {
			segs = fmt.Sprintf("segments %s..%s", v.segmentOf(p.Lsn), last)
		}
		p.Message = fmt.Sprintf("%s, LSNs %d..%d: %s", segs, p.Lsn, e.LastLSN, what)
		v.lastEnd = e.LastLSN
		return
	}
	v.problem(kind, e.FirstLSN, "segment %s, LSNs %d..%d: %s", v.segmentOf(e.FirstLSN), e.FirstLSN, e.LastLSN, what)
	v.lastKey, v.lastEnd = key, e.LastLSN
}

// verify checks the log from its first LSN to the durable LSN at the
// start, then every snapshot file. It reads through ordinary WAL readers,
// which run beside the writer: appends are not held up, and what arrives
// meanwhile is left for the next Verify. Its position is pinned, so
// retention does not remove what it is about to read.
func (s *Server) verify(ctx context.Context) (*walshipv1.VerifyResponse, error) {
	names, err := s.snapshotFiles()
	if err != nil {
		return nil, err
	}
	// The pin is taken with the first LSN, so that no retention pass
	// removes it in between.
	s.pins.mu.Lock()
	first := s.wal.FirstLSN()
	p := s.pins.addLocked(first)
	s.pins.mu.Unlock()
	defer s.pins.release(p)
	end := s.durableLSN()
	v := &verifier{
		s:        s,
		segs:     s.wal.SegmentInfos(),
		history:  *s.history.Load(),
		resp:     &walshipv1.VerifyResponse{},
		snapLSNs: map[uint64]bool{},
		ends:     map[uint64]batchEnd{},
	}
	for _, n := range names {
		lsn, _ := parseBaseName(n)
		v.snapLSNs[lsn] = true
	}
	v.resp.History = v.history.Proto()
	if first != 0 {
		v.resp.FirstLsn, v.resp.LastLsn = first, end
		if err := v.checkLog(ctx, p, first, end); err != nil {
			return nil, err
		}
	}
	starts := map[uint64]int{} // restore starting points: LSN -> the run continuing it (-1: none)
	if len(v.runs) > 0 && v.runs[0].start == 1 {
		starts[0] = 0
	}
	for _, n := range names {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		if info, ok := v.checkSnapshot(n); ok {
			v.resp.Snapshots = append(v.resp.Snapshots, info)
			starts[info.Lsn] = v.continuing(info.Lsn)
		}
	}
	v.restorable(starts)
	return v.resp, nil
}

// snapshotFiles lists the base snapshot files, oldest first.
func (s *Server) snapshotFiles() ([]string, error) {
	ents, err := s.fs.ReadDir(s.snapDir())
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("list snapshots: %w", err)
	}
	var names []string
	for _, e := range ents {
		if _, ok := parseBaseName(e.Name()); ok && !e.IsDir() {
			names = append(names, e.Name())
		}
	}
	sort.Strings(names) // names sort by LSN
	return names, nil
}

// segmentOf names the segment file that holds lsn.
func (v *verifier) segmentOf(lsn uint64) string {
	i := sort.Search(len(v.segs), func(i int) bool { return v.segs[i].FirstLSN > lsn }) - 1
	if i < 0 {
		return "?"
	}
	return v.segs[i].Name
}

// checkLog reads every batch from first to end, checking each.
func (v *verifier) checkLog(ctx context.Context, p *pin, first, end uint64) error {
	from := first
	for from <= end {
		next, err := v.checkFrom(ctx, p, from, end)
		if err != nil {
			return err
		}
		from = next
	}
	return nil
}

// checkFrom reads and checks batches from LSN from until end, or until a
// stretch it cannot read; it returns the LSN to go on from (past end when
// done). A damaged frame ends what can be read of its segment: the rest
// of it is skipped, and the next segment read.
func (v *verifier) checkFrom(ctx context.Context, p *pin, from, end uint64) (uint64, error) {
	r, err := v.s.wal.NewReader(from, true)
	if err != nil {
		v.problem(problemRead, from, "segment %s: %v; LSNs %d..%d are not checked", v.segmentOf(from), err, from, end)
		return end + 1, nil
	}
	defer r.Close()
	next := from
	for next <= end {
		e, err := r.Next(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return 0, ctx.Err()
			}
			return v.skipSegment(next, end, err), nil
		}
		v.checkBatch(e)
		next = e.LastLSN + 1
		p.advance(next)
	}
	return next, nil
}

// skipSegment reports what stopped a read at LSN next and returns the
// first LSN of the segment after the one it failed in (past end if none).
func (v *verifier) skipSegment(next, end uint64, err error) uint64 {
	seg := v.segmentOf(next)
	var ce *wal.CorruptionError
	kind := problemRead
	if errors.As(err, &ce) {
		kind, seg = problemCRC, filepath.Base(ce.Segment)
	}
	resume := end + 1
	for _, s := range v.segs {
		if s.FirstLSN > next && s.Name != seg {
			resume = s.FirstLSN
			break
		}
	}
	v.problem(kind, next, "segment %s: %v; LSNs %d..%d are not checked", seg, err, next, min(resume-1, end))
	v.havePrev, v.broken = false, true
	return resume
}

// checkBatch checks one stored entry: its envelope decodes, its payload
// CRC matches, its LSNs are the frame's and continue the previous batch's,
// its epoch does not go down and is the history's for its LSN. An intact
// batch extends the current run; any problem breaks it.
func (v *verifier) checkBatch(e wal.Entry) {
	v.resp.Batches++
	v.resp.Bytes += uint64(len(e.Data))
	ok := true
	var env walshipv1.WalBatch
	if err := envelope.Unmarshal(e.Data, &env); err != nil {
		v.batchProblem(e, problemCRC, "decode", "the stored envelope does not decode: %v", err)
		ok = false
	} else if err := envelope.Verify(&env); err != nil {
		v.batchProblem(e, problemCRC, "payload", "%v", err)
		ok = false
	}
	if ok && (env.FirstLsn != e.FirstLSN || env.LastLsn != e.LastLSN) {
		v.batchProblem(e, problemGap, "frame", "the frame holds an envelope of LSNs %d..%d", env.FirstLsn, env.LastLsn)
		ok = false
	}
	if ok && v.havePrev && env.PrevLsn != v.prevLast {
		v.batchProblem(e, problemGap, "prev", "prev_lsn %d, the batch before ends at LSN %d", env.PrevLsn, v.prevLast)
		ok = false
	}
	if ok && v.havePrev && env.Epoch < v.prevEpoch {
		v.batchProblem(e, problemEpoch, fmt.Sprint("down", env.Epoch, v.prevEpoch), "epoch %d after a batch of epoch %d", env.Epoch, v.prevEpoch)
		ok = false
	}
	if he := v.history.EpochOf(e.FirstLSN); ok && he != 0 && he != env.Epoch {
		v.batchProblem(e, problemEpoch, fmt.Sprint("history", env.Epoch, he), "epoch %d, the history gives these LSNs epoch %d", env.Epoch, he)
		ok = false
	}
	if !ok {
		// The log goes on after it (the frames are intact and continuous),
		// but no restore can pass this batch.
		v.prevLast, v.havePrev, v.broken = e.LastLSN, true, true
		v.prevEpoch = max(v.prevEpoch, env.Epoch)
		return
	}
	if n := len(v.runs); n == 0 || v.broken {
		v.runs = append(v.runs, run{start: e.FirstLSN, end: e.LastLSN})
		v.broken = false
	} else {
		v.runs[n-1].end = e.LastLSN
	}
	if v.snapLSNs[e.LastLSN] {
		v.ends[e.LastLSN] = batchEnd{run: len(v.runs) - 1, epoch: env.Epoch}
	}
	v.prevLast, v.prevEpoch, v.havePrev = e.LastLSN, env.Epoch, true
}

// continuing is the run a restore from a snapshot at lsn replays: the one
// with a batch ending at lsn, or starting at lsn+1 (-1: none).
func (v *verifier) continuing(lsn uint64) int {
	if be, ok := v.ends[lsn]; ok {
		return be.run
	}
	for i, r := range v.runs {
		if r.start == lsn+1 {
			return i
		}
	}
	return -1
}

// checkSnapshot reads one snapshot file whole: its meta and header, every
// pair, the CRC and the digest; and checks it against the log: the epoch
// of the batch ending at its LSN, or the history's for it.
func (v *verifier) checkSnapshot(name string) (*walshipv1.SnapshotInfo, bool) {
	s := v.s
	lsn, _ := parseBaseName(name)
	b, err := openBase(s.fs, s.snapDir(), name)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, false // removed since it was listed (retention)
	}
	if err != nil {
		v.problem(snapshotKind(err), lsn, "snapshot file %s: %v", name, err)
		return nil, false
	}
	d, err := scanBase(s.fs, s.snapDir(), b, func([]byte, []byte, uint64) error { return nil })
	if errors.Is(err, fs.ErrNotExist) {
		return nil, false
	}
	if err != nil {
		v.problem(snapshotKind(err), lsn, "snapshot file %s: %v", name, err)
		return nil, false
	}
	if d.String() != b.digest {
		v.problem(problemSnapshot, lsn, "snapshot file %s: digest %v, its trailer says %s", name, d, b.digest)
		return nil, false
	}
	e := b.hdr.GetEpoch()
	if be, ok := v.ends[lsn]; ok && be.epoch != e {
		v.problem(problemSnapshot, lsn, "snapshot file %s: of epoch %d at LSN %d, the stored batch ending there is of epoch %d", name, e, lsn, be.epoch)
		return nil, false
	}
	if he := v.history.EpochOf(lsn); he != 0 && he != e {
		v.problem(problemSnapshot, lsn, "snapshot file %s: of epoch %d at LSN %d, the history gives it epoch %d", name, e, lsn, he)
		return nil, false
	}
	return b.info(), true
}

// snapshotKind is the problem kind of a snapshot file error: damage, or
// an I/O error.
func snapshotKind(err error) string {
	if errors.Is(err, basesnap.ErrBad) {
		return problemSnapshot
	}
	return problemRead
}

// restorable picks the restorable range: from each starting point (LSN 0
// when the log starts at LSN 1, and every intact snapshot) a restore
// reaches the end of the run that continues it (or only the snapshot's
// own LSN if none does). It reports the range that reaches furthest, from
// its oldest start: on a sound archive, from the oldest snapshot (or 0) to
// the end of the log.
func (v *verifier) restorable(starts map[uint64]int) {
	lsns := make([]uint64, 0, len(starts))
	for l := range starts {
		lsns = append(lsns, l)
	}
	slices.Sort(lsns)
	var bestFrom, bestTo uint64
	found := false
	for _, from := range lsns {
		to := from
		if i := starts[from]; i >= 0 {
			to = v.runs[i].end
		}
		if !found || to > bestTo {
			bestFrom, bestTo, found = from, to, true
		}
	}
	if found && bestTo > 0 {
		v.resp.RestorableFromLsn, v.resp.RestorableToLsn = bestFrom, bestTo
	}
}
