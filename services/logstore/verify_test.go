package logstore

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	walshipv1 "github.com/walship/walship/gen/walship/v1"
	"github.com/walship/walship/internal/basesnap"
	"github.com/walship/walship/internal/datadir"
	"github.com/walship/walship/internal/envelope"
	"github.com/walship/walship/internal/state"
	"github.com/walship/walship/internal/vfs"
	"github.com/walship/walship/internal/wal"
	"google.golang.org/protobuf/proto"
)

func (r *running) verify(t *testing.T) *walshipv1.VerifyResponse {
	t.Helper()
	resp, err := r.ls.Verify(t.Context(), &walshipv1.VerifyRequest{})
	if err != nil {
		t.Fatalf("Verify: %v", err)
	}
	return resp
}

// wantProblems checks that resp reports exactly the problems of these
// kinds, at these LSNs, each message holding its substring.
func wantProblems(t *testing.T, resp *walshipv1.VerifyResponse, want ...*walshipv1.VerifyProblem) {
	t.Helper()
	if len(resp.Problems) != len(want) {
		t.Fatalf("problems %v, want %d", resp.Problems, len(want))
	}
	for i, p := range resp.Problems {
		if p.Kind != want[i].Kind || p.Lsn != want[i].Lsn || !strings.Contains(p.Message, want[i].Message) {
			t.Fatalf("problem %d: %v, want kind %s at LSN %d mentioning %q", i, p, want[i].Kind, want[i].Lsn, want[i].Message)
		}
	}
}

func wantRange(t *testing.T, resp *walshipv1.VerifyResponse, from, to uint64) {
	t.Helper()
	if resp.RestorableFromLsn != from || resp.RestorableToLsn != to {
		t.Fatalf("restorable LSNs %d..%d, want %d..%d (problems %v)", resp.RestorableFromLsn, resp.RestorableToLsn, from, to, resp.Problems)
	}
}

// TestVerifyCleanArchive: a sound log and its snapshots: no problem, the
// whole log restorable from LSN 0 (it starts at LSN 1), every snapshot
// listed, the counts and the history.
func TestVerifyCleanArchive(t *testing.T) {
	r := start(t, testConfig(t, t.TempDir()))
	empty := r.verify(t)
	wantProblems(t, empty)
	wantRange(t, empty, 0, 0) // nothing to restore

	bs := chain(t, 1, 1, 30, 20)
	r.appendAll(t, bs...)
	r.mustPut(t, stateAt(t, bs, 20), 1)
	r.mustPut(t, stateAt(t, bs, 60), 1)
	resp := r.verify(t)
	wantProblems(t, resp)
	wantRange(t, resp, 0, 60)
	var bytes uint64
	for _, b := range bs {
		data, _ := envelope.Marshal(b)
		bytes += uint64(len(data))
	}
	st := r.status(t)
	if resp.FirstLsn != 1 || resp.LastLsn != 60 || resp.Batches != 30 || resp.Bytes != bytes ||
		len(resp.Snapshots) != 2 || !proto.Equal(resp.Snapshots[0], st.Snapshots[0]) || !proto.Equal(resp.Snapshots[1], st.Snapshots[1]) ||
		len(resp.History) != 1 || resp.History[0].Epoch != 1 {
		t.Fatalf("Verify = %v", resp)
	}
}

// TestVerifyAfterRetention: a log that no longer starts at LSN 1 is
// restorable from its oldest snapshot on.
func TestVerifyAfterRetention(t *testing.T) {
	clock := &ageClock{}
	r := start(t, retentionByAge(t, t.TempDir(), clock))
	bs := chain(t, 1, 1, 60, 500)
	r.appendAll(t, bs...)
	r.mustPut(t, stateAt(t, bs, 80), 1)
	clock.set(baseTime.Add(2 * time.Hour))
	if _, err := r.s.enforceRetention(t.Context()); err != nil {
		t.Fatal(err)
	}
	resp := r.verify(t)
	wantProblems(t, resp)
	wantRange(t, resp, 80, 120)
	if resp.FirstLsn <= 1 || resp.FirstLsn > 81 {
		t.Fatalf("first LSN %d", resp.FirstLsn)
	}
}

// TestVerifyDamagedFrame: a byte flipped in a sealed segment while the log
// store runs (recovery would refuse to open it: it checks every frame of
// every segment but the newest, whose damaged tail it cuts as torn): the
// frame's CRC fails, the rest of that segment is unchecked, the
// restorable range ends before it.
func TestVerifyDamagedFrame(t *testing.T) {
	dir := t.TempDir()
	cfg := testConfig(t, dir)
	cfg.SegmentBytes = MinSegmentBytes
	r := start(t, cfg)
	bs := chain(t, 1, 1, 60, 500)
	r.appendAll(t, bs...)
	segs := r.s.wal.SegmentInfos()
	victim := segs[2] // sealed, in the middle
	f, err := os.OpenFile(filepath.Join(dir, "wal", victim.Name), os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	// A byte inside the segment's first frame (after the segment header
	// and the frame header).
	if _, err := f.WriteAt([]byte{0xee}, 100); err != nil {
		t.Fatal(err)
	}
	f.Close()
	resp := r.verify(t)
	wantProblems(t, resp, &walshipv1.VerifyProblem{Kind: problemCRC, Lsn: victim.FirstLSN, Message: victim.Name})
	if !strings.Contains(resp.Problems[0].Message, "checksum") {
		t.Fatalf("problem %v does not say checksum", resp.Problems[0])
	}
	wantRange(t, resp, 0, victim.FirstLSN-1)
	if resp.LastLsn != 120 || resp.Batches >= 60 {
		t.Fatalf("Verify = %v", resp)
	}
}

// writeLog writes batches straight into a log store's WAL (and its epoch
// history), bypassing the checks of Append, to plant damage that recovery
// does not look for: it checks frames, not what they hold. A batch whose
// FirstLsn is past the log's end is framed as the LSNs right after it.
func writeLog(t *testing.T, dir string, h datadir.History, bs ...*walshipv1.WalBatch) {
	t.Helper()
	log, err := wal.Open(wal.Options{Dir: filepath.Join(dir, "wal")})
	if err != nil {
		t.Fatal(err)
	}
	for _, b := range bs {
		data, err := envelope.Marshal(b)
		if err != nil {
			t.Fatal(err)
		}
		first, last := b.FirstLsn, b.LastLsn
		if end := log.LastLSN(); end != 0 && first > end+1 {
			first, last = end+1, end+1+last-first
		}
		if err := log.Append(wal.Entry{FirstLSN: first, LastLSN: last, Data: data}); err != nil {
			t.Fatal(err)
		}
	}
	if err := log.Close(); err != nil {
		t.Fatal(err)
	}
	if h != nil {
		if err := datadir.SaveHistory(vfs.OS, dir, h); err != nil {
			t.Fatal(err)
		}
	}
}

// TestVerifyPlantedDamage: damage inside intact frames, which only Verify
// (and a Read that reaches it) sees: a payload whose CRC fails, an epoch
// going down, an epoch the history does not give, a frame holding another
// batch's LSNs.
func TestVerifyPlantedDamage(t *testing.T) {
	for _, tc := range []struct {
		name    string
		history datadir.History
		batches func(t *testing.T) []*walshipv1.WalBatch
		want    *walshipv1.VerifyProblem
		to      uint64
	}{
		{"payload crc", datadir.History{{Epoch: 1, FirstLSN: 1}}, func(t *testing.T) []*walshipv1.WalBatch {
			bs := chain(t, 1, 1, 6, 20)
			bs[3].Crc32C ^= 1
			return bs
		}, &walshipv1.VerifyProblem{Kind: problemCRC, Lsn: 7, Message: "LSNs 7..8"}, 6},
		{"epoch going down", nil, func(t *testing.T) []*walshipv1.WalBatch {
			return append(chain(t, 2, 1, 3, 20), chain(t, 1, 7, 3, 20)...)
		}, &walshipv1.VerifyProblem{Kind: problemEpoch, Lsn: 7, Message: "LSNs 7..12: epoch 1 after a batch of epoch 2"}, 6},
		{"epoch not the history's", datadir.History{{Epoch: 1, FirstLSN: 1}, {Epoch: 2, FirstLSN: 5}}, func(t *testing.T) []*walshipv1.WalBatch {
			return chain(t, 1, 1, 6, 20)
		}, &walshipv1.VerifyProblem{Kind: problemEpoch, Lsn: 5, Message: "LSNs 5..12: epoch 1, the history gives these LSNs epoch 2"}, 4},
		{"frame of other LSNs", datadir.History{{Epoch: 1, FirstLSN: 1}}, func(t *testing.T) []*walshipv1.WalBatch {
			bs := chain(t, 1, 1, 3, 20)
			return append(bs, batch(t, 1, 9, 1, 20)) // framed as LSNs 7..8
		}, &walshipv1.VerifyProblem{Kind: problemGap, Lsn: 7, Message: "holds an envelope of LSNs 9..10"}, 6},
		{"a stretch of the same problem is one", datadir.History{{Epoch: 1, FirstLSN: 1}, {Epoch: 2, FirstLSN: 5}}, func(t *testing.T) []*walshipv1.WalBatch {
			return append(chain(t, 1, 1, 6, 20), chain(t, 2, 13, 2, 20)...)
		}, &walshipv1.VerifyProblem{Kind: problemEpoch, Lsn: 5, Message: "segment 0000000000000001.wal, LSNs 5..12: epoch 1, the history gives these LSNs epoch 2"}, 4},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			writeLog(t, dir, tc.history, tc.batches(t)...)
			r := start(t, testConfig(t, dir))
			resp := r.verify(t)
			wantProblems(t, resp, tc.want)
			wantRange(t, resp, 0, tc.to)
		})
	}
}

// TestVerifyDamagedSnapshot: a value byte flipped in a stored snapshot
// (only a full read finds it): a snapshot problem naming the file, the
// snapshot no longer listed, and the restorable range no longer starting
// from it — nothing restorable at all if the log does not start at LSN 1.
func TestVerifyDamagedSnapshot(t *testing.T) {
	t.Run("the log from LSN 1", func(t *testing.T) {
		dir := t.TempDir()
		r := start(t, testConfig(t, dir))
		bs := chain(t, 1, 1, 30, 20)
		r.appendAll(t, bs...)
		r.mustPut(t, stateAt(t, bs, 20), 1)
		r.mustPut(t, stateAt(t, bs, 40), 1)
		flipByte(t, filepath.Join(dir, "snapshots", baseName(20)), -state.DigestSize-4-1)
		resp := r.verify(t)
		wantProblems(t, resp, &walshipv1.VerifyProblem{Kind: problemSnapshot, Lsn: 20, Message: baseName(20)})
		wantRange(t, resp, 0, 60)
		if len(resp.Snapshots) != 1 || resp.Snapshots[0].Lsn != 40 {
			t.Fatalf("intact snapshots %v", resp.Snapshots)
		}
	})
	t.Run("the log cut by retention", func(t *testing.T) {
		clock := &ageClock{}
		dir := t.TempDir()
		r := start(t, retentionByAge(t, dir, clock))
		bs := chain(t, 1, 1, 60, 500)
		r.appendAll(t, bs...)
		r.mustPut(t, stateAt(t, bs, 80), 1)
		clock.set(baseTime.Add(2 * time.Hour))
		if _, err := r.s.enforceRetention(t.Context()); err != nil {
			t.Fatal(err)
		}
		flipByte(t, filepath.Join(dir, "snapshots", baseName(80)), basesnap.PrefixSize+2)
		resp := r.verify(t)
		wantProblems(t, resp, &walshipv1.VerifyProblem{Kind: problemSnapshot, Lsn: 80, Message: "meta CRC-32C"})
		wantRange(t, resp, 0, 0)
	})
}
