package logstore

import (
	"bytes"
	"errors"
	"io"
	"math"
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
	"github.com/walship/walship/pkg/codec"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"
)

// stateAt applies bs, in order, to a new store up to (and including) the
// batch ending at lsn: the state a snapshot at lsn must hold.
func stateAt(t *testing.T, bs []*walshipv1.WalBatch, lsn uint64) *state.View {
	t.Helper()
	st := state.New()
	for _, b := range bs {
		if b.LastLsn > lsn {
			break
		}
		var cb codec.Batch
		if err := envelope.Decode(b, &cb); err != nil {
			t.Fatal(err)
		}
		if err := st.Apply(&cb); err != nil {
			t.Fatal(err)
		}
	}
	if st.AppliedLSN() != lsn {
		t.Fatalf("no batch ends at LSN %d", lsn)
	}
	return st.Snapshot()
}

// upload is one PutSnapshot stream's messages.
func upload(v *state.View, epoch uint64, history ...*walshipv1.EpochStart) []*walshipv1.PutSnapshotRequest {
	if len(history) == 0 {
		history = []*walshipv1.EpochStart{{Epoch: epoch, FirstLsn: 1}}
	}
	msgs := []*walshipv1.PutSnapshotRequest{{Part: &walshipv1.PutSnapshotRequest_Header{Header: &walshipv1.SnapshotHeader{
		Epoch: epoch, Lsn: v.AppliedLSN(), Keys: uint64(v.Len()), ClusterId: clusterA, History: history}}}}
	var kvs []*walshipv1.KeyValue
	v.Scan(nil, nil, 0, func(k, val []byte, ver uint64) bool {
		kvs = append(kvs, &walshipv1.KeyValue{Key: string(k), Value: bytes.Clone(val), VersionLsn: ver})
		if len(kvs) == 7 {
			msgs = append(msgs, &walshipv1.PutSnapshotRequest{Part: &walshipv1.PutSnapshotRequest_Chunk{Chunk: &walshipv1.SnapshotChunk{Kvs: kvs}}})
			kvs = nil
		}
		return true
	})
	if len(kvs) > 0 {
		msgs = append(msgs, &walshipv1.PutSnapshotRequest{Part: &walshipv1.PutSnapshotRequest_Chunk{Chunk: &walshipv1.SnapshotChunk{Kvs: kvs}}})
	}
	return append(msgs, &walshipv1.PutSnapshotRequest{Part: &walshipv1.PutSnapshotRequest_Trailer{Trailer: &walshipv1.SnapshotTrailer{StateDigest: v.Digest().String()}}})
}

// put sends msgs as one PutSnapshot stream and returns the answer.
func (r *running) put(t *testing.T, msgs []*walshipv1.PutSnapshotRequest) (*walshipv1.SnapshotInfo, error) {
	stream, err := r.ls.PutSnapshot(t.Context())
	if err != nil {
		return nil, err
	}
	for _, m := range msgs {
		if err := stream.Send(m); err != nil {
			if errors.Is(err, io.EOF) {
				break // the log store answered early; CloseAndRecv has it
			}
			return nil, err
		}
	}
	resp, err := stream.CloseAndRecv()
	return resp.GetSnapshot(), err
}

func (r *running) mustPut(t *testing.T, v *state.View, epoch uint64) *walshipv1.SnapshotInfo {
	t.Helper()
	info, err := r.put(t, upload(v, epoch))
	if err != nil {
		t.Fatalf("PutSnapshot at LSN %d: %v", v.AppliedLSN(), err)
	}
	return info
}

// get runs a GetSnapshot and rebuilds the state it streams.
func (r *running) get(t *testing.T, atMost uint64) (*walshipv1.SnapshotHeader, *state.Store, error) {
	t.Helper()
	stream, err := r.ls.GetSnapshot(t.Context(), &walshipv1.GetSnapshotRequest{AtMostLsn: atMost})
	if err != nil {
		t.Fatal(err)
	}
	first, err := stream.Recv()
	if err != nil {
		return nil, nil, err
	}
	hdr := first.GetHeader()
	if hdr == nil {
		t.Fatalf("first message %v is not a header", first)
	}
	b := state.NewBuilder(hdr.Lsn)
	for {
		m, err := stream.Recv()
		if err != nil {
			return hdr, nil, err
		}
		switch p := m.GetPart().(type) {
		case *walshipv1.GetSnapshotResponse_Chunk:
			for _, kv := range p.Chunk.Kvs {
				if err := b.Add([]byte(kv.Key), kv.Value, kv.VersionLsn); err != nil {
					t.Fatal(err)
				}
			}
		case *walshipv1.GetSnapshotResponse_Trailer:
			st, err := b.Finish(hdr.Keys, p.Trailer.StateDigest)
			if err != nil {
				t.Fatalf("rebuilt snapshot: %v", err)
			}
			if _, err := stream.Recv(); !errors.Is(err, io.EOF) {
				t.Fatalf("after the trailer: %v", err)
			}
			return hdr, st, nil
		default:
			t.Fatalf("unexpected %T", p)
		}
	}
}

func snapFiles(t *testing.T, dir string) []string {
	t.Helper()
	ents, err := os.ReadDir(filepath.Join(dir, "snapshots"))
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range ents {
		names = append(names, e.Name())
	}
	return names
}

func TestPutAndGetSnapshot(t *testing.T) {
	dir := t.TempDir()
	r := start(t, testConfig(t, dir))
	bs := chain(t, 1, 1, 30, 20) // LSNs 1..60, a batch per transaction
	r.appendAll(t, bs...)

	if _, _, err := r.get(t, 0); err == nil {
		t.Fatal("GetSnapshot with nothing stored succeeded")
	} else {
		wantCode(t, err, codes.NotFound, "no snapshot")
	}
	v20, v40 := stateAt(t, bs, 20), stateAt(t, bs, 40)
	info := r.mustPut(t, v20, 1)
	want := &walshipv1.SnapshotInfo{Lsn: 20, Epoch: 1, CommitTimeUnixNano: baseTime.UnixNano(), Keys: 10, Bytes: info.Bytes, StateDigest: v20.Digest().String()}
	if !proto.Equal(info, want) || info.Bytes == 0 {
		t.Fatalf("stored %v, want %v", info, want)
	}
	r.mustPut(t, v40, 1)
	// The same LSN again: answered with what is stored.
	if again := r.mustPut(t, v20, 1); !proto.Equal(again, info) {
		t.Fatalf("second upload of LSN 20 answered %v, want %v", again, info)
	}
	if got := r.status(t).Snapshots; len(got) != 2 || got[0].Lsn != 20 || got[1].Lsn != 40 {
		t.Fatalf("Status.snapshots = %v", got)
	}

	for _, tc := range []struct {
		atMost, want uint64
		view         *state.View
	}{{0, 40, v40}, {60, 40, v40}, {40, 40, v40}, {39, 20, v20}, {20, 20, v20}} {
		hdr, st, err := r.get(t, tc.atMost)
		if err != nil {
			t.Fatalf("GetSnapshot(%d): %v", tc.atMost, err)
		}
		wantHdr := &walshipv1.SnapshotHeader{Epoch: 1, Lsn: tc.want, Keys: uint64(tc.view.Len()), ClusterId: clusterA,
			CommitTimeUnixNano: baseTime.UnixNano(), History: []*walshipv1.EpochStart{{Epoch: 1, FirstLsn: 1}}}
		if !proto.Equal(hdr, wantHdr) {
			t.Fatalf("GetSnapshot(%d) header %v, want %v", tc.atMost, hdr, wantHdr)
		}
		if st.Digest() != tc.view.Digest() || st.AppliedLSN() != tc.want {
			t.Fatalf("GetSnapshot(%d) rebuilt LSN %d digest %v, want %d %v", tc.atMost, st.AppliedLSN(), st.Digest(), tc.want, tc.view.Digest())
		}
	}
	_, _, err := r.get(t, 19)
	wantCode(t, err, codes.OutOfRange, "at_most_lsn", "LSN 19", "oldest stored is at LSN 20")

	// A restart finds them again, and removes an interrupted upload.
	infos := r.status(t).Snapshots
	if err := r.stop(); err != nil {
		t.Fatal(err)
	}
	torn := filepath.Join(dir, "snapshots", baseName(50)+tmpSuffix)
	if err := os.WriteFile(torn, []byte("half an upload"), 0o644); err != nil {
		t.Fatal(err)
	}
	r = start(t, testConfig(t, dir))
	if got := r.status(t).Snapshots; len(got) != 2 || !proto.Equal(got[0], infos[0]) || !proto.Equal(got[1], infos[1]) {
		t.Fatalf("after a restart Status.snapshots = %v, want %v", got, infos)
	}
	if names := snapFiles(t, dir); len(names) != 2 || strings.HasSuffix(strings.Join(names, " "), tmpSuffix) {
		t.Fatalf("snapshot dir holds %v after a restart", names)
	}
	if _, st, err := r.get(t, 0); err != nil || st.Digest() != v40.Digest() {
		t.Fatalf("GetSnapshot after a restart: %v", err)
	}
}

// TestPutSnapshotWaitsForItsLSN: a primary uploads a snapshot at its
// visible LSN, which may not have reached the log store yet: the upload
// waits for it.
func TestPutSnapshotWaitsForItsLSN(t *testing.T) {
	r := start(t, testConfig(t, t.TempDir()))
	bs := chain(t, 1, 1, 10, 20)
	r.appendAll(t, bs[:5]...)
	msgs := upload(stateAt(t, bs, 20), 1)
	done := make(chan error, 1)
	go func() {
		_, err := r.put(t, msgs)
		done <- err
	}()
	// The upload waits for LSN 20, which the next batches bring.
	r.appendAll(t, bs[5:]...)
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("PutSnapshot: %v", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("PutSnapshot did not finish")
	}
}

func TestPutSnapshotRefuses(t *testing.T) {
	bs := chain(t, 1, 1, 10, 20)  // LSNs 1..20
	two := batch(t, 1, 21, 2, 20) // LSNs 21..24 in one batch of two transactions
	all := append(append([]*walshipv1.WalBatch(nil), bs...), two)
	v10 := stateAt(t, bs, 10)
	good := upload(v10, 1)
	with := func(f func(msgs []*walshipv1.PutSnapshotRequest) []*walshipv1.PutSnapshotRequest) []*walshipv1.PutSnapshotRequest {
		msgs := make([]*walshipv1.PutSnapshotRequest, len(good))
		for i, m := range good {
			msgs[i] = proto.Clone(m).(*walshipv1.PutSnapshotRequest)
		}
		return f(msgs)
	}
	hdr := func(msgs []*walshipv1.PutSnapshotRequest) *walshipv1.SnapshotHeader { return msgs[0].GetHeader() }
	last := len(good) - 1
	for _, tc := range []struct {
		name string
		msgs []*walshipv1.PutSnapshotRequest
		code codes.Code
		subs []string
	}{
		{"empty stream", nil, codes.InvalidArgument, []string{"header: missing"}},
		{"chunk first", good[1:], codes.InvalidArgument, []string{"header: the first message must be the header, not a chunk"}},
		{"lsn 0", with(func(m []*walshipv1.PutSnapshotRequest) []*walshipv1.PutSnapshotRequest { hdr(m).Lsn = 0; return m }), codes.InvalidArgument, []string{"header.lsn"}},
		{"epoch above the maximum", with(func(m []*walshipv1.PutSnapshotRequest) []*walshipv1.PutSnapshotRequest {
			hdr(m).Epoch = datadir.MaxEpoch + 1
			return m
		}), codes.InvalidArgument, []string{"header.epoch", "above the highest epoch"}},
		{"history above the maximum", with(func(m []*walshipv1.PutSnapshotRequest) []*walshipv1.PutSnapshotRequest {
			hdr(m).History = []*walshipv1.EpochStart{{Epoch: 1, FirstLsn: 1}, {Epoch: math.MaxUint64, FirstLsn: 5}}
			return m
		}), codes.InvalidArgument, []string{"header.history[1].epoch", "above the highest epoch"}},
		{"epoch past the jump", with(func(m []*walshipv1.PutSnapshotRequest) []*walshipv1.PutSnapshotRequest {
			hdr(m).Epoch = 2 + datadir.MaxEpochJump // the log store is at epoch 1
			return m
		}), codes.InvalidArgument, []string{"header.epoch: 1048578 is more than 1048576 (the most one message may move an epoch) above 1"}},
		{"history past the jump", with(func(m []*walshipv1.PutSnapshotRequest) []*walshipv1.PutSnapshotRequest {
			hdr(m).History = []*walshipv1.EpochStart{{Epoch: 1, FirstLsn: 1}, {Epoch: 2 + datadir.MaxEpochJump, FirstLsn: 5}}
			return m
		}), codes.InvalidArgument, []string{"header.history[1].epoch: 1048578 is more than 1048576"}},
		{"no history", with(func(m []*walshipv1.PutSnapshotRequest) []*walshipv1.PutSnapshotRequest {
			hdr(m).History = nil
			return m
		}), codes.InvalidArgument, []string{"header.history: required"}},
		{"history after lsn", with(func(m []*walshipv1.PutSnapshotRequest) []*walshipv1.PutSnapshotRequest {
			hdr(m).History = []*walshipv1.EpochStart{{Epoch: 1, FirstLsn: 11}}
			return m
		}), codes.InvalidArgument, []string{"header.history", "after header.lsn 10"}},
		{"out of order", with(func(m []*walshipv1.PutSnapshotRequest) []*walshipv1.PutSnapshotRequest {
			kvs := m[1].GetChunk().Kvs
			kvs[0], kvs[1] = kvs[1], kvs[0]
			return m
		}), codes.InvalidArgument, []string{"chunk.kvs[1]", "does not follow"}},
		{"no trailer", good[:last], codes.InvalidArgument, []string{"trailer: missing", "5 of 5 pairs"}},
		{"second header", append(append(append([]*walshipv1.PutSnapshotRequest(nil), good[:last]...), good[0]), good[last]), codes.InvalidArgument, []string{"second header"}},
		{"after the trailer", append(append([]*walshipv1.PutSnapshotRequest(nil), good...), good[1]), codes.InvalidArgument, []string{"a chunk after the trailer"}},
		{"wrong count", with(func(m []*walshipv1.PutSnapshotRequest) []*walshipv1.PutSnapshotRequest { hdr(m).Keys = 6; return m }), codes.InvalidArgument, []string{"header.keys", "5 pairs", "announced 6"}},
		{"wrong digest", with(func(m []*walshipv1.PutSnapshotRequest) []*walshipv1.PutSnapshotRequest {
			m[last].GetTrailer().StateDigest = state.Digest{}.String()
			return m
		}), codes.DataLoss, []string{"trailer.state_digest"}},
		{"damaged value", with(func(m []*walshipv1.PutSnapshotRequest) []*walshipv1.PutSnapshotRequest {
			m[1].GetChunk().Kvs[0].Value = []byte("damaged")
			return m
		}), codes.DataLoss, []string{"digest"}},
		// LSN 22 ends the first transaction of the batch 21..24.
		{"inside a batch", with(func(m []*walshipv1.PutSnapshotRequest) []*walshipv1.PutSnapshotRequest { hdr(m).Lsn = 22; return m }),
			codes.FailedPrecondition, []string{"LSN 22 is inside the stored batch 21..24"}},
		{"another history", with(func(m []*walshipv1.PutSnapshotRequest) []*walshipv1.PutSnapshotRequest {
			hdr(m).Epoch = 2
			hdr(m).History = []*walshipv1.EpochStart{{Epoch: 1, FirstLsn: 1}, {Epoch: 2, FirstLsn: 5}}
			return m
		}), codes.FailedPrecondition, []string{"header.history", "epoch 2", "epoch 1", "another history"}},
		{"not durable here", with(func(m []*walshipv1.PutSnapshotRequest) []*walshipv1.PutSnapshotRequest { hdr(m).Lsn = 30; return m }), codes.FailedPrecondition, []string{"LSN 30 is not durable here"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			r := start(t, testConfig(t, dir), func(s *Server) { s.snapshotWait = 50 * time.Millisecond })
			r.appendAll(t, all...)
			_, err := r.put(t, tc.msgs)
			wantCode(t, err, tc.code, tc.subs...)
			if got := r.status(t).Snapshots; len(got) != 0 {
				t.Fatalf("stored %v after a refusal", got)
			}
			if names := snapFiles(t, dir); len(names) != 0 {
				t.Fatalf("snapshot dir holds %v after a refusal", names)
			}
			// The next good upload is stored.
			r.mustPut(t, v10, 1)
		})
	}
}

// TestPutSnapshotFencedEpoch: an upload from a primary whose epoch the
// log store's vote has fenced is refused.
func TestPutSnapshotFencedEpoch(t *testing.T) {
	r := start(t, testConfig(t, t.TempDir()))
	bs := chain(t, 1, 1, 5, 20)
	r.appendAll(t, bs...)
	fence(t, r, 3, "candidate")
	_, err := r.put(t, upload(stateAt(t, bs, 10), 1))
	wantCode(t, err, codes.FailedPrecondition, "header.epoch", "stale epoch 1", "epoch 3")
	// The new primary's upload of the same state is taken: the batch at
	// LSN 10 is still of epoch 1 in its history.
	info, err := r.put(t, upload(stateAt(t, bs, 10), 3, &walshipv1.EpochStart{Epoch: 1, FirstLsn: 1}, &walshipv1.EpochStart{Epoch: 3, FirstLsn: 11}))
	if err != nil || info.Epoch != 1 {
		t.Fatalf("PutSnapshot from epoch 3: %v %v (want the batch's epoch, 1)", info, err)
	}
}

// TestCutDropsSnapshotsAbove: when a new primary cuts a log store's tail
// (entries of a deposed primary), the snapshots of that tail go with it.
func TestCutDropsSnapshotsAbove(t *testing.T) {
	dir := t.TempDir()
	r := start(t, testConfig(t, dir))
	bs := chain(t, 1, 1, 20, 20) // LSNs 1..40, epoch 1
	r.appendAll(t, bs...)
	r.mustPut(t, stateAt(t, bs, 20), 1)
	r.mustPut(t, stateAt(t, bs, 40), 1)
	// A primary of epoch 2 whose history left epoch 1 at LSN 30.
	a := r.append(t)
	if err := a.stream.Send(&walshipv1.AppendRequest{Heartbeat: &walshipv1.Heartbeat{Epoch: 2, TimeUnixNano: 1, ReplyRequested: true},
		Truncate: true, TruncateAfterLsn: 30}); err != nil {
		t.Fatal(err)
	}
	a.waitDurable(30)
	if got := r.status(t).Snapshots; len(got) != 1 || got[0].Lsn != 20 {
		t.Fatalf("after the cut Status.snapshots = %v, want only LSN 20", got)
	}
	if names := snapFiles(t, dir); len(names) != 1 || names[0] != baseName(20) {
		t.Fatalf("after the cut the snapshot dir holds %v", names)
	}
}

// TestDamagedSnapshotIsNotServed: a stored snapshot damaged on disk is not
// listed after a restart (left for an operator; Verify reports it), and one
// damaged while the log store runs fails GetSnapshot with DATA_LOSS before
// a trailer is sent.
func TestDamagedSnapshotIsNotServed(t *testing.T) {
	dir := t.TempDir()
	r := start(t, testConfig(t, dir))
	bs := chain(t, 1, 1, 20, 20)
	r.appendAll(t, bs...)
	r.mustPut(t, stateAt(t, bs, 20), 1)
	r.mustPut(t, stateAt(t, bs, 40), 1)

	// A value byte of the newest: only its CRC and digest show it.
	path := filepath.Join(dir, "snapshots", baseName(40))
	flipByte(t, path, -state.DigestSize-4-1)
	_, _, err := r.get(t, 0)
	wantCode(t, err, codes.DataLoss, "stored snapshot at LSN 40 is damaged", baseName(40))

	// The meta of the older: found at start, not listed.
	if err := r.stop(); err != nil {
		t.Fatal(err)
	}
	flipByte(t, filepath.Join(dir, "snapshots", baseName(20)), basesnap.PrefixSize+1)
	r = start(t, testConfig(t, dir))
	if got := r.status(t).Snapshots; len(got) != 1 || got[0].Lsn != 40 {
		t.Fatalf("Status.snapshots = %v, want only LSN 40 (whose damage only a full read finds)", got)
	}
	if names := snapFiles(t, dir); len(names) != 2 {
		t.Fatalf("the damaged files are gone: %v", names)
	}
}

// flipByte flips one bit of the byte at off (from the end if negative).
func flipByte(t *testing.T, path string, off int64) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if off < 0 {
		off += int64(len(b))
	}
	b[off] ^= 0x10
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
}

// TestSnapshotOfALostTailIsRemovedAtStart: a snapshot past the end of the
// log (its entries were lost, or cut and the removal interrupted) is
// removed when the log store starts.
func TestSnapshotOfALostTailIsRemovedAtStart(t *testing.T) {
	dirA, dirB := t.TempDir(), t.TempDir()
	bs := chain(t, 1, 1, 20, 20)
	a := start(t, testConfig(t, dirA))
	a.appendAll(t, bs...)
	a.mustPut(t, stateAt(t, bs, 40), 1)
	if err := a.stop(); err != nil {
		t.Fatal(err)
	}
	b := start(t, testConfig(t, dirB))
	b.appendAll(t, bs[:10]...) // LSNs 1..20
	if err := b.stop(); err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(filepath.Join(dirA, "snapshots", baseName(40)))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dirB, "snapshots", baseName(40)), data, 0o644); err != nil {
		t.Fatal(err)
	}
	b = start(t, testConfig(t, dirB))
	if got := b.status(t).Snapshots; len(got) != 0 {
		t.Fatalf("Status.snapshots = %v", got)
	}
	if names := snapFiles(t, dirB); len(names) != 0 {
		t.Fatalf("snapshot dir holds %v", names)
	}
}

// fence promises epoch to candidate on r.
func fence(t *testing.T, r *running, epoch uint64, candidate string) {
	t.Helper()
	resp, err := walshipv1.NewEpochServiceClient(r.conn).Fence(t.Context(), &walshipv1.FenceRequest{Epoch: epoch, CandidateId: candidate, CandidateAddr: "127.0.0.1:1"})
	if err != nil || !resp.Granted {
		t.Fatalf("fence %d: %v %v", epoch, resp, err)
	}
}

// TestSnapshotsStayInTheirCluster: once the log store belongs to a cluster
// (here, from its primary's stream), an upload of another cluster or of
// none, or a GetSnapshot of another cluster, is refused, naming the ids,
// and stores nothing.
func TestSnapshotsStayInTheirCluster(t *testing.T) {
	r := start(t, testConfig(t, t.TempDir()))
	ap := r.append(t)
	ap.beat(1, clusterA)
	bs := chain(t, 1, 1, 20, 20)
	ap.send(bs...)
	ap.waitDurable(40)
	r.mustPut(t, stateAt(t, bs, 20), 1)

	other := upload(stateAt(t, bs, 40), 1)
	other[0].GetHeader().ClusterId = clusterB
	if _, err := r.put(t, other); err == nil {
		t.Fatal("an upload of another cluster was stored")
	} else {
		wantCode(t, err, codes.FailedPrecondition, clusterB)
	}
	none := upload(stateAt(t, bs, 40), 1)
	none[0].GetHeader().ClusterId = ""
	if _, err := r.put(t, none); err == nil {
		t.Fatal("an upload that states no cluster was stored")
	} else {
		wantCode(t, err, codes.FailedPrecondition, clusterA, "the snapshot's uploader states no cluster id")
	}
	if st := r.status(t); len(st.Snapshots) != 1 || st.Snapshots[0].Lsn != 20 {
		t.Fatalf("snapshots after a refused upload: %v", st.Snapshots)
	}
	g, err := r.ls.GetSnapshot(t.Context(), &walshipv1.GetSnapshotRequest{ClusterId: clusterB})
	if err == nil {
		_, err = g.Recv()
	}
	wantCode(t, err, codes.FailedPrecondition, clusterA)
}
