package logstore

import (
	"context"
	"errors"
	"io"
	"math"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	walshipv1 "github.com/walship/walship/gen/walship/v1"
	"github.com/walship/walship/internal/datadir"
	"github.com/walship/walship/internal/envelope"
	"github.com/walship/walship/internal/vfs"
	"github.com/walship/walship/internal/wal"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

func TestAppendAndRead(t *testing.T) {
	r := start(t, testConfig(t, t.TempDir()))
	bs := []*walshipv1.WalBatch{
		batch(t, 1, 1, 1, 10),  // 1..2
		batch(t, 1, 3, 3, 10),  // 3..8
		batch(t, 1, 9, 1, 10),  // 9..10
		batch(t, 1, 11, 2, 10), // 11..14
	}
	resp := r.appendAll(t, bs...)
	if resp.DurableLsn != 14 || resp.Epoch != 1 {
		t.Fatalf("ack = %v, want durable 14 epoch 1", resp)
	}
	for _, tc := range []struct {
		name string
		req  *walshipv1.ReadRequest
		want []*walshipv1.WalBatch
	}{
		{"all", &walshipv1.ReadRequest{FromLsn: 1}, bs},
		{"from 0 is the first kept", &walshipv1.ReadRequest{}, bs},
		{"from inside a batch returns it whole", &walshipv1.ReadRequest{FromLsn: 5}, bs[1:]},
		{"from the last batch's start", &walshipv1.ReadRequest{FromLsn: 11}, bs[3:]},
		{"from the last LSN", &walshipv1.ReadRequest{FromLsn: 14}, bs[3:]},
		{"from the end+1 is empty", &walshipv1.ReadRequest{FromLsn: 15}, nil},
		{"to_lsn stops after its batch", &walshipv1.ReadRequest{FromLsn: 1, ToLsn: 4}, bs[:2]},
		{"to_lsn at a batch end", &walshipv1.ReadRequest{FromLsn: 3, ToLsn: 10}, bs[1:3]},
		{"to_lsn equal to from_lsn", &walshipv1.ReadRequest{FromLsn: 9, ToLsn: 9}, bs[2:3]},
		{"to_lsn beyond the end", &walshipv1.ReadRequest{FromLsn: 9, ToLsn: 100}, bs[2:]},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := r.readAll(t, tc.req)
			if err != nil {
				t.Fatal(err)
			}
			sameBatches(t, got, tc.want)
		})
	}
	st := r.status(t)
	if st.FirstLsn != 1 || st.DurableLsn != 14 || st.Epoch != 1 || st.Segments != 1 || st.StoredBytes == 0 {
		t.Fatalf("status = %v", st)
	}
	if err := r.stop(); err != nil {
		t.Fatalf("Run: %v", err)
	}
}

func TestReadArguments(t *testing.T) {
	r := start(t, testConfig(t, t.TempDir()))
	r.appendAll(t, chain(t, 1, 1, 3, 10)...) // 1..6
	for _, tc := range []struct {
		name string
		req  *walshipv1.ReadRequest
		code codes.Code
		subs []string
	}{
		{"to before from", &walshipv1.ReadRequest{FromLsn: 5, ToLsn: 3}, codes.InvalidArgument, []string{"to_lsn", "3", "5"}},
		{"beyond the end", &walshipv1.ReadRequest{FromLsn: 8}, codes.OutOfRange, []string{"LSN 8", "durable LSN is 6"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := r.readAll(t, tc.req)
			wantCode(t, err, tc.code, tc.subs...)
		})
	}
}

func TestReadEmpty(t *testing.T) {
	r := start(t, testConfig(t, t.TempDir()))
	got, err := r.readAll(t, &walshipv1.ReadRequest{})
	if err != nil || len(got) != 0 {
		t.Fatalf("Read of an empty log store: %d batches, %v", len(got), err)
	}
	got, err = r.readAll(t, &walshipv1.ReadRequest{FromLsn: 1})
	if err != nil || len(got) != 0 {
		t.Fatalf("Read from 1 of an empty log store: %d batches, %v", len(got), err)
	}
	_, err = r.readAll(t, &walshipv1.ReadRequest{FromLsn: 2})
	wantCode(t, err, codes.OutOfRange, "LSN 2")
}

func TestReadFollow(t *testing.T) {
	r := start(t, testConfig(t, t.TempDir()))
	// An empty log store: a follower from 0 waits for the first batch,
	// whatever its LSN (the primary may start mid-log).
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	fromZero, err := r.ls.Read(ctx, &walshipv1.ReadRequest{Follow: true})
	if err != nil {
		t.Fatal(err)
	}
	bs := chain(t, 1, 101, 6, 10) // 101..112
	a := r.append(t)
	a.send(bs[:2]...)
	a.waitDurable(104)

	// A follower from the end, one from inside, and one from an LSN not
	// written yet.
	atEnd, err := r.ls.Read(ctx, &walshipv1.ReadRequest{FromLsn: 105, Follow: true})
	if err != nil {
		t.Fatal(err)
	}
	inside, err := r.ls.Read(ctx, &walshipv1.ReadRequest{FromLsn: 102, Follow: true, ToLsn: 107})
	if err != nil {
		t.Fatal(err)
	}
	future, err := r.ls.Read(ctx, &walshipv1.ReadRequest{FromLsn: 110, Follow: true})
	if err != nil {
		t.Fatal(err)
	}
	a.send(bs[2:]...)
	a.waitDurable(112)

	recvN := func(name string, s walshipv1.LogStoreService_ReadClient, n int) []*walshipv1.WalBatch {
		var got []*walshipv1.WalBatch
		for len(got) < n {
			resp, err := s.Recv()
			if err != nil {
				t.Fatalf("%s: Recv after %d batches: %v", name, len(got), err)
			}
			got = append(got, resp.Batch)
		}
		return got
	}
	sameBatches(t, recvN("from 0", fromZero, 6), bs)
	sameBatches(t, recvN("at end", atEnd, 4), bs[2:])
	sameBatches(t, recvN("future", future, 2), bs[4:])
	sameBatches(t, recvN("inside", inside, 4), bs[:4])
	if _, err := inside.Recv(); !errors.Is(err, io.EOF) {
		t.Fatalf("follower with to_lsn: got %v after its last batch, want EOF", err)
	}
	if err := r.stop(); err != nil {
		t.Fatalf("Run: %v", err)
	}
	// The graceful stop ends followers with UNAVAILABLE.
	for _, s := range []walshipv1.LogStoreService_ReadClient{fromZero, atEnd, future} {
		_, err := s.Recv()
		wantCode(t, err, codes.Unavailable, "stopping")
	}
}

func TestEpochs(t *testing.T) {
	dir := t.TempDir()
	r := start(t, testConfig(t, dir))
	b1 := batch(t, 2, 1, 1, 10)
	if ack := r.appendAll(t, b1); ack.Epoch != 2 {
		t.Fatalf("ack epoch %d, want 2", ack.Epoch)
	}

	// A stale epoch is refused and nothing of it is stored.
	a := r.append(t)
	a.send(batch(t, 1, 3, 1, 10))
	wantCode(t, a.failure(), codes.FailedPrecondition, "stale epoch 1, log store is at epoch 2")
	// ... also in a heartbeat, so an idle deposed primary learns it.
	a = r.append(t)
	a.heartbeat(1)
	wantCode(t, a.failure(), codes.FailedPrecondition, "stale epoch 1")
	if st := r.status(t); st.DurableLsn != 2 || st.Epoch != 2 {
		t.Fatalf("status after stale batch: %v", st)
	}

	// A higher epoch is adopted, and persisted before it is acknowledged.
	ack := r.appendAll(t, batch(t, 5, 3, 1, 10))
	if ack.Epoch != 5 || ack.DurableLsn != 4 {
		t.Fatalf("ack = %v, want epoch 5 durable 4", ack)
	}
	if v, err := datadir.LoadVote(vfs.OS, dir); err != nil || v.Epoch != 5 {
		t.Fatalf("vote file holds %v (%v) after the ack, want epoch 5", v, err)
	}
	a = r.append(t)
	a.send(batch(t, 4, 5, 1, 10))
	wantCode(t, a.failure(), codes.FailedPrecondition, "stale epoch 4, log store is at epoch 5")
	if err := r.stop(); err != nil {
		t.Fatal(err)
	}

	// After a restart the epoch still fences.
	r = start(t, testConfig(t, dir))
	if st := r.status(t); st.Epoch != 5 || st.DurableLsn != 4 {
		t.Fatalf("status after restart: %v", st)
	}
	a = r.append(t)
	a.send(batch(t, 4, 5, 1, 10))
	wantCode(t, a.failure(), codes.FailedPrecondition, "stale epoch 4, log store is at epoch 5")

	// A new primary of epoch 7 catches the log store up: its heartbeat
	// declares the stream's epoch, which the log store promises (so older
	// primaries are refused from then on), and the batches of epoch 5 it
	// ships first (byte for byte as the old primary wrote them) are
	// accepted, and so is an exact retransmission of an epoch 2 batch.
	a = r.append(t)
	a.heartbeat(7)
	if ack := a.ack(); ack.Epoch != 7 || ack.DurableLsn != 4 {
		t.Fatalf("heartbeat ack = %v, want epoch 7 durable 4", ack)
	}
	a.send(b1, batch(t, 5, 5, 1, 10), batch(t, 7, 7, 1, 10))
	if ack := a.waitDurable(8); ack.Epoch != 7 {
		t.Fatalf("ack = %v, want epoch 7", ack)
	}
	if st := r.status(t); st.LastEpoch != 7 || len(st.History) != 3 {
		t.Fatalf("status after the catch-up: %v, want last epoch 7 and a history of epochs 2, 5, 7", st)
	}
	// Now the old epochs are fenced, in batches and in heartbeats, and
	// even an exact retransmission from one: a deposed primary learns it.
	old := r.append(t)
	old.send(b1)
	wantCode(t, old.failure(), codes.FailedPrecondition, "stale epoch 2, log store is at epoch 7")
	old = r.append(t)
	old.send(batch(t, 5, 9, 1, 10))
	wantCode(t, old.failure(), codes.FailedPrecondition, "stale epoch 5, log store is at epoch 7")
	old = r.append(t)
	old.heartbeat(6)
	wantCode(t, old.failure(), codes.FailedPrecondition, "stale epoch 6, log store is at epoch 7")
	// A refused batch of a higher epoch does not raise it.
	gap := r.append(t)
	gap.send(batch(t, 9, 20, 1, 10))
	wantCode(t, gap.failure(), codes.InvalidArgument, "gap")
	if st := r.status(t); st.Epoch != 7 || st.DurableLsn != 8 {
		t.Fatalf("status: %v", st)
	}
}

func TestContinuity(t *testing.T) {
	r := start(t, testConfig(t, t.TempDir()))
	bs := chain(t, 1, 1, 3, 10) // 1..2 3..4 5..6
	r.appendAll(t, bs...)

	t.Run("gap", func(t *testing.T) {
		a := r.append(t)
		a.send(batch(t, 1, 9, 1, 10))
		wantCode(t, a.failure(), codes.InvalidArgument, "gap: batch starts at LSN 9, log store ends at LSN 6")
	})
	t.Run("conflicting overlap", func(t *testing.T) {
		a := r.append(t)
		a.send(batch(t, 1, 3, 1, 11)) // LSNs 3..4, other bytes
		wantCode(t, a.failure(), codes.OutOfRange, "overlap", "3..4", "different data")
	})
	t.Run("overlap across batches", func(t *testing.T) {
		a := r.append(t)
		a.send(batch(t, 1, 3, 2, 10)) // 3..6 stored as 3..4 and 5..6
		wantCode(t, a.failure(), codes.OutOfRange, "overlap", "3..6")
	})
	t.Run("overlap past the end", func(t *testing.T) {
		a := r.append(t)
		a.send(batch(t, 1, 5, 2, 10)) // 5..8
		wantCode(t, a.failure(), codes.OutOfRange, "overlap", "5..8")
	})
	t.Run("retransmission is acknowledged", func(t *testing.T) {
		a := r.append(t)
		a.send(bs[1], bs[2])
		if ack := a.waitDurable(6); ack.DurableLsn != 6 {
			t.Fatalf("ack = %v", ack)
		}
		// and the stream goes on from there, the retransmission and new
		// batches in one round as well.
		more := chain(t, 1, 7, 2, 10)
		a.send(bs[2], more[0], more[0], more[1])
		a.waitDurable(10)
	})
	got, err := r.readAll(t, &walshipv1.ReadRequest{FromLsn: 1})
	if err != nil {
		t.Fatal(err)
	}
	sameBatches(t, got, append(bs, chain(t, 1, 7, 2, 10)...))
}

func TestStartsMidLog(t *testing.T) {
	r := start(t, testConfig(t, t.TempDir()))
	bs := chain(t, 3, 1000, 2, 10)
	if ack := r.appendAll(t, bs...); ack.DurableLsn != 1003 {
		t.Fatalf("ack = %v", ack)
	}
	_, err := r.readAll(t, &walshipv1.ReadRequest{FromLsn: 999})
	wantCode(t, err, codes.OutOfRange, "LSN 999 is no longer kept (first LSN is 1000)")
	got, err := r.readAll(t, &walshipv1.ReadRequest{})
	if err != nil {
		t.Fatal(err)
	}
	sameBatches(t, got, bs)
}

// TestEmptyButAnchored: a WAL that holds a segment header but no batch
// (a crash right after the header was written) is still an empty log store
// and accepts any first LSN.
func TestEmptyButAnchored(t *testing.T) {
	dir := t.TempDir()
	log, err := wal.Open(wal.Options{Dir: filepath.Join(dir, "wal")})
	if err != nil {
		t.Fatal(err)
	}
	if err := log.Reset(1000); err != nil {
		t.Fatal(err)
	}
	if err := log.Close(); err != nil {
		t.Fatal(err)
	}
	r := start(t, testConfig(t, dir))
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	follower, err := r.ls.Read(ctx, &walshipv1.ReadRequest{Follow: true})
	if err != nil {
		t.Fatal(err)
	}
	bs := chain(t, 1, 5, 2, 10)
	if ack := r.appendAll(t, bs...); ack.DurableLsn != 8 {
		t.Fatalf("ack = %v", ack)
	}
	got, err := r.readAll(t, &walshipv1.ReadRequest{})
	if err != nil {
		t.Fatal(err)
	}
	sameBatches(t, got, bs)
	got = nil
	for len(got) < len(bs) {
		resp, err := follower.Recv()
		if err != nil {
			t.Fatalf("follower: %v", err)
		}
		got = append(got, resp.Batch)
	}
	sameBatches(t, got, bs)
}

func TestInvalidBatches(t *testing.T) {
	r := start(t, testConfig(t, t.TempDir()))
	good := func() *walshipv1.WalBatch { return batch(t, 1, 1, 2, 10) } // 1..4
	short := batch(t, 1, 1, 1, 10)                                      // 1..2
	for _, tc := range []struct {
		name string
		req  *walshipv1.AppendRequest
		code codes.Code
		subs []string
	}{
		{"empty request", &walshipv1.AppendRequest{}, codes.InvalidArgument, []string{"batch, heartbeat or truncate required"}},
		{"epoch 0", &walshipv1.AppendRequest{Batch: mod(good(), func(b *walshipv1.WalBatch) { b.Epoch = 0 })}, codes.InvalidArgument, []string{"batch.epoch"}},
		{"epoch above the maximum", &walshipv1.AppendRequest{Batch: mod(good(), func(b *walshipv1.WalBatch) { b.Epoch = math.MaxUint64 }), Heartbeat: &walshipv1.Heartbeat{Epoch: 1}},
			codes.InvalidArgument, []string{"batch.epoch", "above the highest epoch"}},
		{"heartbeat epoch above the maximum", &walshipv1.AppendRequest{Heartbeat: &walshipv1.Heartbeat{Epoch: datadir.MaxEpoch + 1}},
			codes.InvalidArgument, []string{"heartbeat.epoch", "above the highest epoch"}},
		{"first_lsn 0", &walshipv1.AppendRequest{Batch: mod(good(), func(b *walshipv1.WalBatch) { b.FirstLsn = 0 })}, codes.InvalidArgument, []string{"batch.first_lsn"}},
		{"last before first", &walshipv1.AppendRequest{Batch: mod(good(), func(b *walshipv1.WalBatch) { b.FirstLsn, b.PrevLsn = 5, 4 })}, codes.InvalidArgument, []string{"batch.last_lsn: 4 is before first_lsn 5"}},
		{"prev mismatch", &walshipv1.AppendRequest{Batch: mod(good(), func(b *walshipv1.WalBatch) { b.PrevLsn = 7 })}, codes.InvalidArgument, []string{"batch.prev_lsn: 7, want first_lsn-1 = 0"}},
		{"codec unspecified", &walshipv1.AppendRequest{Batch: mod(good(), func(b *walshipv1.WalBatch) { b.Codec = 0 })}, codes.InvalidArgument, []string{"batch.codec"}},
		{"codec unknown", &walshipv1.AppendRequest{Batch: mod(good(), func(b *walshipv1.WalBatch) { b.Codec = 99 })}, codes.InvalidArgument, []string{"batch.codec", "99"}},
		{"codec wrapping to a known one", &walshipv1.AppendRequest{Batch: mod(good(), func(b *walshipv1.WalBatch) { b.Codec = 257 })}, codes.InvalidArgument, []string{"batch.codec"}},
		{"empty payload", &walshipv1.AppendRequest{Batch: mod(good(), func(b *walshipv1.WalBatch) { b.Payload, b.Crc32C = nil, 0 })}, codes.InvalidArgument, []string{"batch.payload: empty"}},
		{"payload LSNs differ", &walshipv1.AppendRequest{Batch: mod(good(), func(b *walshipv1.WalBatch) { b.Payload, b.Crc32C = short.Payload, short.Crc32C })}, codes.InvalidArgument, []string{"batch.payload", "1..4"}},
		{"bad crc", &walshipv1.AppendRequest{Batch: mod(good(), func(b *walshipv1.WalBatch) { b.Crc32C ^= 1 })}, codes.DataLoss, []string{"1..4", "crc32c"}},
		{"flipped payload bit", &walshipv1.AppendRequest{Batch: mod(good(), func(b *walshipv1.WalBatch) { b.Payload[len(b.Payload)/2] ^= 0x10 })}, codes.DataLoss, []string{"LSNs 1..4"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			a := r.append(t)
			if err := a.stream.Send(tc.req); err != nil {
				t.Fatal(err)
			}
			wantCode(t, a.failure(), tc.code, tc.subs...)
		})
	}
	if st := r.status(t); st.DurableLsn != 0 || st.FirstLsn != 0 {
		t.Fatalf("something was stored: %v", st)
	}
	// A batch after a refused one on the same stream is not stored either,
	// while batches before it are stored and acknowledged first.
	a := r.append(t)
	bad := mod(batch(t, 1, 3, 1, 10), func(b *walshipv1.WalBatch) { b.Crc32C ^= 1 })
	a.send(short, bad, batch(t, 1, 3, 1, 10)) // the server may end the stream before the last
	var acked uint64
	var err error
	for err == nil {
		var resp *walshipv1.AppendResponse
		resp, err = a.stream.Recv()
		if resp != nil {
			acked = resp.DurableLsn
		}
	}
	wantCode(t, err, codes.DataLoss, "LSNs 3..4")
	if acked != 2 {
		t.Fatalf("acked durable LSN %d before the error, want 2", acked)
	}
	if st := r.status(t); st.DurableLsn != 2 {
		t.Fatalf("status: %v, want durable 2", st)
	}
}

func mod(b *walshipv1.WalBatch, f func(*walshipv1.WalBatch)) *walshipv1.WalBatch {
	f(b)
	return b
}

func TestHeartbeatAck(t *testing.T) {
	r := start(t, testConfig(t, t.TempDir()))
	a := r.append(t)
	a.heartbeat(1)
	if ack := a.ack(); ack.DurableLsn != 0 || ack.Epoch != 1 || ack.HeartbeatTimeUnixNano == 0 {
		t.Fatalf("heartbeat ack on an empty store = %v, want durable 0, epoch 1 promised, the heartbeat's time echoed", ack)
	}
	r.appendAll(t, chain(t, 1, 1, 2, 10)...)
	a.heartbeat(0) // no epoch stated
	if ack := a.logAck(); ack.DurableLsn != 4 || ack.Epoch != 1 {
		t.Fatalf("heartbeat ack = %v, want durable 4", ack)
	}
}

func TestRestartKeepsDurable(t *testing.T) {
	dir := t.TempDir()
	cfg := testConfig(t, dir)
	cfg.SegmentBytes = MinSegmentBytes
	r := start(t, cfg)
	bs := chain(t, 1, 1, 40, 300) // several segments
	a := r.append(t)
	for _, b := range bs {
		a.send(b)
	}
	a.waitDurable(80)
	if err := r.stop(); err != nil {
		t.Fatal(err)
	}

	cfg.Registry = testConfig(t, dir).Registry
	r = start(t, cfg)
	st := r.status(t)
	if st.DurableLsn != 80 || st.FirstLsn != 1 || st.Segments < 3 {
		t.Fatalf("status after restart: %v", st)
	}
	got, err := r.readAll(t, &walshipv1.ReadRequest{FromLsn: 1})
	if err != nil {
		t.Fatal(err)
	}
	sameBatches(t, got, bs)
	// and appending continues where it ended.
	if ack := r.appendAll(t, batch(t, 1, 81, 1, 10)); ack.DurableLsn != 82 {
		t.Fatalf("ack = %v", ack)
	}
	if err := r.stop(); err != nil {
		t.Fatal(err)
	}

	// Restarted with a lower retention, the log store applies it at once.
	cfg.Registry = testConfig(t, dir).Registry
	cfg.RetentionBytes = 2 * MinSegmentBytes
	r = start(t, cfg)
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	if _, err := r.s.ret.firstKept.Wait(ctx, 2); err != nil {
		t.Fatalf("retention did not run at start: %v", err)
	}
	if st := r.status(t); st.DurableLsn != 82 || st.FirstLsn <= 1 {
		t.Fatalf("status after restart with retention: %v", st)
	}
}

func TestRetentionBytes(t *testing.T) {
	cfg := testConfig(t, t.TempDir())
	cfg.SegmentBytes = MinSegmentBytes
	cfg.RetentionBytes = 3 * MinSegmentBytes
	r := start(t, cfg)
	bs := chain(t, 1, 1, 60, 500) // ~600 bytes each: ~6 per segment, ~10 segments
	a := r.append(t)
	a.send(bs...)
	a.waitDurable(120)

	// The background pass runs after the appends; wait for it to move the
	// first LSN, then run one more pass to be sure it has settled.
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	if _, err := r.s.ret.firstKept.Wait(ctx, 2); err != nil {
		t.Fatalf("retention never removed a segment: %v", err)
	}
	if _, err := r.s.enforceRetention(ctx); err != nil {
		t.Fatal(err)
	}
	st := r.status(t)
	segs := r.s.wal.SegmentInfos()
	active := segs[len(segs)-1].Bytes
	if int64(st.StoredBytes) > cfg.RetentionBytes+active || int64(st.StoredBytes)-segs[0].Bytes > cfg.RetentionBytes {
		t.Fatalf("stored %d bytes in %d segments, retention %d", st.StoredBytes, st.Segments, cfg.RetentionBytes)
	}
	if st.FirstLsn <= 1 || st.FirstLsn != segs[0].FirstLSN || st.DurableLsn != 120 {
		t.Fatalf("status %v after retention", st)
	}
	_, err := r.readAll(t, &walshipv1.ReadRequest{FromLsn: 1})
	wantCode(t, err, codes.OutOfRange, "LSN 1 is no longer kept", "first LSN is")
	_, err = r.readAll(t, &walshipv1.ReadRequest{FromLsn: st.FirstLsn - 1})
	wantCode(t, err, codes.OutOfRange, "no longer kept")
	got, err := r.readAll(t, &walshipv1.ReadRequest{FromLsn: st.FirstLsn})
	if err != nil {
		t.Fatal(err)
	}
	sameBatches(t, got, bs[(st.FirstLsn-1)/2:])
	// A retransmission of a removed batch cannot be checked: refused.
	a2 := r.append(t)
	a2.send(bs[0])
	wantCode(t, a2.failure(), codes.OutOfRange, "overlap", "no longer keeps LSN 1")
}

func TestRetentionAge(t *testing.T) {
	now := baseTime.Add(10 * time.Hour)
	cfg := testConfig(t, t.TempDir())
	cfg.SegmentBytes = MinSegmentBytes
	cfg.RetentionAge = time.Hour
	cfg.Now = func() time.Time { return now }
	r := start(t, cfg)
	var bs []*walshipv1.WalBatch
	lsn := uint64(1)
	for i := 0; i < 40; i++ {
		at := now.Add(-3 * time.Hour) // old
		if i >= 30 {
			at = now.Add(-time.Minute) // recent
		}
		b := batchAt(t, 1, lsn, 1, 500, at)
		bs = append(bs, b)
		lsn = b.LastLsn + 1
	}
	r.appendAll(t, bs...)
	if _, err := r.s.enforceRetention(t.Context()); err != nil {
		t.Fatal(err)
	}
	segs := r.s.wal.SegmentInfos()
	first := segs[0].FirstLSN
	// Everything kept is either recent or in the segment holding the
	// first recent batch (61); every older segment is gone.
	if first <= 1 || first > 61 || segs[0].LastLSN < 61 {
		t.Fatalf("after age retention the log holds %v", segs)
	}
	if st := r.status(t); st.FirstLsn != first {
		t.Fatalf("status first_lsn %d, want %d", st.FirstLsn, first)
	}
	got, err := r.readAll(t, &walshipv1.ReadRequest{})
	if err != nil {
		t.Fatal(err)
	}
	sameBatches(t, got, bs[(first-1)/2:])
}

// TestGroupFsync holds the first fsync while a stream pipelines batches and
// other streams send heartbeats: everything that queued behind it is written
// and fsynced in one round, and each stream gets one ack for it.
func TestGroupFsync(t *testing.T) {
	fs := vfs.NewMem()
	entered := make(chan struct{})
	release := make(chan struct{})
	var once sync.Once
	fs.InjectSyncError(func(name string) error {
		if strings.HasSuffix(name, ".wal") {
			once.Do(func() {
				close(entered)
				<-release
			})
		}
		return nil
	})
	cfg := testConfig(t, "/data")
	cfg.FS = fs
	r := start(t, cfg)
	bs := chain(t, 1, 1, 50, 100)

	a := r.append(t)
	a.send(bs[0])
	select {
	case <-entered:
	case <-time.After(20 * time.Second):
		t.Fatal("the first fsync never started")
	}
	base := r.s.w.queued.Load() // batch 0
	a.send(bs[1:]...)
	const others = 3
	var hbs []*appender
	for i := 0; i < others; i++ {
		h := r.append(t)
		h.heartbeat(1)
		h.heartbeat(1)
		hbs = append(hbs, h)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	if _, err := r.s.w.queued.Wait(ctx, base+uint64(len(bs)-1+2*others)); err != nil {
		t.Fatalf("requests never queued: %v", err)
	}
	close(release)

	// Two rounds, so at most two acks (the first may be coalesced into the
	// second if the stream's sender had not sent it yet).
	acks := 0
	for last := uint64(0); last < 100; acks++ {
		ack := a.ack()
		if ack.DurableLsn != 2 && ack.DurableLsn != 100 {
			t.Fatalf("ack %v: want durable 2 or 100, one per round", ack)
		}
		last = ack.DurableLsn
	}
	if err := a.stream.CloseSend(); err != nil {
		t.Fatal(err)
	}
	if _, err := a.stream.Recv(); !errors.Is(err, io.EOF) {
		t.Fatalf("after %d acks: got %v, want EOF", acks, err)
	}
	for i, h := range hbs {
		if ack := h.ack(); ack.DurableLsn != 100 {
			t.Fatalf("heartbeat stream %d: ack %v", i, ack)
		}
		if err := h.stream.CloseSend(); err != nil {
			t.Fatal(err)
		}
		if _, err := h.stream.Recv(); !errors.Is(err, io.EOF) {
			t.Fatalf("heartbeat stream %d: got %v, want EOF (two heartbeats, one round, one ack)", i, err)
		}
	}
	if n := histogramCount(t, r.s.metrics.fsyncSeconds); n != 2 {
		t.Fatalf("%d group fsyncs for %d batches, want 2", n, len(bs))
	}
	if st := r.s.wal.Stats(); st.Syncs != 2 || st.EntriesAppended != uint64(len(bs)) {
		t.Fatalf("wal stats %+v: want 2 syncs for %d entries", st, len(bs))
	}
}

// TestConcurrentAppendStreams: several streams take turns (an LSN sequencer
// in the test, like two primaries of one epoch racing); whatever order the
// writer sees, the log stays contiguous and every acked batch is readable.
func TestConcurrentAppendStreams(t *testing.T) {
	r := start(t, testConfig(t, t.TempDir()))
	const streams, perStream = 4, 25
	var mu sync.Mutex
	next := uint64(1)
	var sent []*walshipv1.WalBatch
	var wg sync.WaitGroup
	for i := 0; i < streams; i++ {
		a := r.append(t)
		a.heartbeat(1)
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := 0; j < perStream; j++ {
				mu.Lock()
				b := batch(t, 1, next, 1, 50)
				next = b.LastLsn + 1
				sent = append(sent, b)
				err := a.stream.Send(&walshipv1.AppendRequest{Batch: b})
				// Wait for the ack under the lock so the next batch, maybe on
				// another stream, cannot overtake this one.
				var resp *walshipv1.AppendResponse
				for err == nil && (resp == nil || resp.DurableLsn < b.LastLsn) {
					resp, err = a.stream.Recv()
				}
				mu.Unlock()
				if err != nil {
					t.Errorf("stream: %v", err)
					return
				}
			}
		}()
	}
	wg.Wait()
	got, err := r.readAll(t, &walshipv1.ReadRequest{FromLsn: 1})
	if err != nil {
		t.Fatal(err)
	}
	sameBatches(t, got, sent)
}

func TestFsyncFailureIsFatal(t *testing.T) {
	fs := vfs.NewMem()
	cfg := testConfig(t, "/data")
	cfg.FS = fs
	r := start(t, cfg)
	r.appendAll(t, batch(t, 1, 1, 1, 10))
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	follower, err := r.ls.Read(ctx, &walshipv1.ReadRequest{FromLsn: 3, Follow: true})
	if err != nil {
		t.Fatal(err)
	}
	fs.InjectSyncError(func(name string) error {
		if strings.HasSuffix(name, ".wal") {
			return vfs.ErrInjected
		}
		return nil
	})
	a := r.append(t)
	idle := r.append(t)
	idle.heartbeat(1)
	idle.ack()
	a.send(batch(t, 1, 3, 1, 10))
	wantCode(t, a.failure(), codes.Unavailable, "log store failed", "injected")
	wantCode(t, idle.failure(), codes.Unavailable)
	if _, err := follower.Recv(); err == nil {
		t.Fatal("a follower got a batch whose fsync failed")
	}
	if err := r.wait(); !errors.Is(err, vfs.ErrInjected) || !errors.Is(err, wal.ErrBroken) {
		t.Fatalf("Run returned %v, want the injected fsync error", err)
	}
	if n := counterValue(t, r.s.metrics.fsyncErrors); n != 1 {
		t.Fatalf("fsync errors = %v, want 1", n)
	}
	// Reopened, the log store has what was acked and not what failed.
	fs.InjectSyncError(nil)
	fs.Crash()
	cfg.Registry = testConfig(t, "/data").Registry
	r = start(t, cfg)
	if st := r.status(t); st.DurableLsn != 2 {
		t.Fatalf("after the failure and a crash: %v, want durable 2", st)
	}
}

func TestEpochPersistFailureIsFatal(t *testing.T) {
	fs := vfs.NewMem()
	cfg := testConfig(t, "/data")
	cfg.FS = fs
	r := start(t, cfg)
	fs.InjectSyncError(func(name string) error {
		if strings.HasSuffix(name, "epochs.tmp") {
			return vfs.ErrInjected
		}
		return nil
	})
	a := r.append(t)
	a.send(batch(t, 3, 1, 1, 10))
	wantCode(t, a.failure(), codes.Unavailable, "save epoch history")
	if err := r.wait(); !errors.Is(err, vfs.ErrInjected) {
		t.Fatalf("Run returned %v", err)
	}
	if n := counterValue(t, r.s.metrics.fsyncErrors); n != 1 {
		t.Fatalf("fsync errors = %v, want 1", n)
	}
}

func TestCorruptStoredBatchIsNotSent(t *testing.T) {
	dir := t.TempDir()
	// Write the WAL directly: a good batch, then one whose envelope CRC is
	// wrong (the WAL frame itself is intact, so only the re-Verify on read
	// can catch it).
	log, err := wal.Open(wal.Options{Dir: filepath.Join(dir, "wal")})
	if err != nil {
		t.Fatal(err)
	}
	good := batch(t, 1, 1, 1, 10)
	bad := mod(batch(t, 1, 3, 1, 10), func(b *walshipv1.WalBatch) { b.Crc32C ^= 0xff })
	var entries []wal.Entry
	for _, b := range []*walshipv1.WalBatch{good, bad} {
		data, err := envelope.Marshal(b)
		if err != nil {
			t.Fatal(err)
		}
		entries = append(entries, wal.Entry{FirstLSN: b.FirstLsn, LastLSN: b.LastLsn, Data: data})
	}
	if err := log.Append(entries...); err != nil {
		t.Fatal(err)
	}
	if err := log.Close(); err != nil {
		t.Fatal(err)
	}

	r := start(t, testConfig(t, dir))
	got, err := r.readAll(t, &walshipv1.ReadRequest{FromLsn: 1})
	wantCode(t, err, codes.DataLoss, "stored batch LSNs 3..4 is corrupt")
	sameBatches(t, got, []*walshipv1.WalBatch{good})
	got, err = r.readAll(t, &walshipv1.ReadRequest{FromLsn: 4})
	wantCode(t, err, codes.DataLoss, "3..4")
	if len(got) != 0 {
		t.Fatalf("sent %d batches from a corrupt entry", len(got))
	}
}

func TestGracefulStopFinishesInFlight(t *testing.T) {
	fs := vfs.NewMem()
	entered := make(chan struct{})
	release := make(chan struct{})
	var once sync.Once
	cfg := testConfig(t, "/data")
	cfg.FS = fs
	r := start(t, cfg)
	r.appendAll(t, batch(t, 1, 1, 1, 10))
	fs.InjectSyncError(func(name string) error {
		if strings.HasSuffix(name, ".wal") {
			once.Do(func() {
				close(entered)
				<-release
			})
		}
		return nil
	})
	a := r.append(t)
	a.send(batch(t, 1, 3, 1, 10))
	select {
	case <-entered:
	case <-time.After(20 * time.Second):
		t.Fatal("the fsync never started")
	}
	r.cancel() // SIGTERM while the batch is being fsynced
	close(release)
	if ack := a.ack(); ack.DurableLsn != 4 {
		t.Fatalf("in-flight batch ack = %v, want durable 4", ack)
	}
	wantCode(t, a.failure(), codes.Unavailable, "stopping")
	if err := r.stop(); err != nil {
		t.Fatalf("Run: %v", err)
	}
	// Nothing acked is lost, even to a crash right after the stop.
	fs.InjectSyncError(nil)
	fs.Crash()
	cfg.Registry = testConfig(t, "/data").Registry
	r = start(t, cfg)
	if st := r.status(t); st.DurableLsn != 4 {
		t.Fatalf("after restart: %v", st)
	}
}

func TestHealthAdminAndMetrics(t *testing.T) {
	cfg := testConfig(t, t.TempDir())
	reg := cfg.Registry
	r := start(t, cfg)
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	// A health watch is a stream: end it so it does not hold up the
	// graceful stop.
	watchCtx, endWatch := context.WithCancel(ctx)
	watch, err := healthpb.NewHealthClient(r.conn).Watch(watchCtx, &healthpb.HealthCheckRequest{Service: walshipv1.LogStoreService_ServiceDesc.ServiceName})
	if err != nil {
		t.Fatal(err)
	}
	for {
		resp, err := watch.Recv()
		if err != nil {
			t.Fatalf("health watch: %v", err)
		}
		if resp.Status == healthpb.HealthCheckResponse_SERVING {
			break
		}
	}
	endWatch()
	r.appendAll(t, batch(t, 4, 1, 2, 10))
	if _, err := r.readAll(t, &walshipv1.ReadRequest{}); err != nil {
		t.Fatal(err)
	}

	st, err := r.admin.Status(ctx, &walshipv1.StatusRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if st.Role != walshipv1.Role_ROLE_LOGSTORE || st.Epoch != 4 || st.LastLsn != 4 || st.DurableLsn != 4 ||
		st.WalFirstLsn != 1 || st.WalBytes == 0 || !st.Serving {
		t.Fatalf("admin status = %v", st)
	}
	_, err = r.admin.Promote(ctx, &walshipv1.PromoteRequest{})
	wantCode(t, err, codes.FailedPrecondition, "not a primary")
	_, err = r.admin.SetPolicy(ctx, &walshipv1.SetPolicyRequest{Policy: &walshipv1.CommitPolicy{}})
	wantCode(t, err, codes.FailedPrecondition, "not a primary")

	want := map[string]float64{
		"walship_logstore_durable_lsn":            4,
		"walship_logstore_first_lsn":              1,
		"walship_logstore_stored_bytes":           -1,
		"walship_logstore_appended_bytes_total":   -1,
		"walship_logstore_read_bytes_total":       -1,
		"walship_logstore_fsync_duration_seconds": -1,
		"walship_logstore_epoch":                  4,
		"walship_wal_fsync_errors_total":          0,
		"walship_logstore_append_streams":         0,
		"walship_logstore_read_streams":           0,
		"walship_logstore_refilling":              0,
		"walship_logstore_refill_batches_total":   0,
		"walship_logstore_refill_bytes_total":     0,
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for _, mf := range mfs {
		v, ok := want[mf.GetName()]
		if !ok {
			continue
		}
		seen[mf.GetName()] = true
		if mf.GetHelp() == "" {
			t.Errorf("%s has no help", mf.GetName())
		}
		m := mf.GetMetric()[0]
		got := m.GetGauge().GetValue() + m.GetCounter().GetValue()
		if h := m.GetHistogram(); h != nil {
			got = float64(h.GetSampleCount())
		}
		if v >= 0 && got != v {
			t.Errorf("%s = %v, want %v", mf.GetName(), got, v)
		}
		if v < 0 && got <= 0 {
			t.Errorf("%s = %v, want > 0", mf.GetName(), got)
		}
	}
	for name := range want {
		if !seen[name] {
			t.Errorf("metric %s not registered", name)
		}
	}
	if err := r.stop(); err != nil {
		t.Fatal(err)
	}
	mfs, err = reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if _, ok := want[mf.GetName()]; ok {
			t.Errorf("%s still registered after Run returned", mf.GetName())
		}
	}
}

func TestNewRefusesStaleFiles(t *testing.T) {
	dir := t.TempDir()
	if err := vfs.WriteFile(vfs.OS, filepath.Join(dir, "epoch"), []byte("nope\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := New(testConfig(t, dir)); err == nil || !strings.Contains(err.Error(), "epoch file") {
		t.Fatalf("New with a bad epoch file: %v", err)
	}
}

func TestConfigValidate(t *testing.T) {
	for _, tc := range []struct {
		name string
		mod  func(*Config)
		want string
	}{
		{"ok", func(*Config) {}, ""},
		{"no data dir", func(c *Config) { c.DataDir = "" }, "--data-dir"},
		{"no listen", func(c *Config) { c.Listen = "" }, "--listen"},
		{"tiny segments", func(c *Config) { c.SegmentBytes = 100 }, "--segment-bytes"},
		{"negative retention", func(c *Config) { c.RetentionBytes = -1 }, "--retention-bytes"},
		{"negative age", func(c *Config) { c.RetentionAge = -time.Second }, "--retention-age"},
		{"small messages", func(c *Config) { c.MaxMessageBytes = 1000 }, "max message bytes"},
		{"peers", func(c *Config) { c.Peers = []string{"a:1", "127.0.0.1:7400"} }, ""},
		{"empty peer", func(c *Config) { c.Peers = []string{"a:1", ""} }, "--peers: entry 1 is empty"},
		{"peer twice", func(c *Config) { c.Peers = []string{"a:1", "a:1"} }, "--peers: a:1 is listed twice"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := DefaultConfig()
			cfg.DataDir = "/x"
			tc.mod(&cfg)
			err := cfg.Validate()
			if tc.want == "" {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Validate() = %v, want it to name %s", err, tc.want)
			}
		})
	}
	if _, err := New(Config{}); err == nil {
		t.Fatal("New accepted an empty Config")
	}
}

func histogramCount(t *testing.T, h interface{ Write(*dto.Metric) error }) uint64 {
	t.Helper()
	var m dto.Metric
	if err := h.Write(&m); err != nil {
		t.Fatal(err)
	}
	return m.GetHistogram().GetSampleCount()
}

func counterValue(t *testing.T, c interface{ Write(*dto.Metric) error }) float64 {
	t.Helper()
	var m dto.Metric
	if err := c.Write(&m); err != nil {
		t.Fatal(err)
	}
	return m.GetCounter().GetValue()
}

// TestRetentionFsyncFailureIsFatal: retention removes a segment and the
// directory fsync after it fails. The log store stops at once, as after any
// failed fsync: an idle primary's heartbeat is not acked on a log whose
// state on disk is unknown, Run returns the error, and it is counted.
func TestRetentionFsyncFailureIsFatal(t *testing.T) {
	fs := vfs.NewMem()
	cfg := testConfig(t, "/data")
	cfg.FS = fs
	cfg.SegmentBytes = MinSegmentBytes
	cfg.RetentionBytes = 3 * MinSegmentBytes
	r := start(t, cfg)
	removed := fs.FailDirSyncAfterRemove(".wal", vfs.ErrInjected)
	idle := r.append(t) // an idle primary's stream, open throughout
	idle.heartbeat(1)
	idle.ack()
	// Batches one at a time, each acked, until retention removes a segment
	// (~6 batches a segment, 3 segments kept); then no more, so that only
	// retention can find the log broken.
	a := r.append(t)
	for _, b := range chain(t, 1, 1, 60, 500) {
		if removed() {
			break
		}
		a.send(b)
		// Retention runs after each round: it may break the log while
		// this batch's ack is on its way, and fail the stream instead.
		acked := false
		for !acked {
			ack, err := a.stream.Recv()
			if err != nil {
				if !removed() {
					t.Fatalf("Recv ack before retention removed a segment: %v", err)
				}
				break
			}
			acked = ack.DurableLsn >= b.LastLsn
		}
		if !acked {
			break
		}
	}
	if !removed() {
		t.Fatal("60 batches and retention removed no segment; the test did not exercise it")
	}
	if err := r.wait(); !errors.Is(err, vfs.ErrInjected) || !errors.Is(err, wal.ErrBroken) {
		t.Fatalf("Run returned %v, want the injected fsync error", err)
	}
	wantCode(t, idle.failure(), codes.Unavailable, "log store failed")
	if n := counterValue(t, r.s.metrics.fsyncErrors); n != 1 {
		t.Fatalf("fsync errors = %v, want 1", n)
	}
}

// TestRefusedHeartbeatStoresNothing: a request whose heartbeat is refused
// stores nothing of the batch it carries and adopts none of its epoch — a
// stale heartbeat, or one older than the batch's own epoch.
func TestRefusedHeartbeatStoresNothing(t *testing.T) {
	r := start(t, testConfig(t, t.TempDir()))
	r.appendAll(t, batch(t, 2, 1, 1, 10)) // LSNs 1-2 at epoch 2
	for _, tc := range []struct {
		name     string
		batch    *walshipv1.WalBatch
		hbEpoch  uint64
		code     codes.Code
		contains string
	}{
		{"stale heartbeat", batch(t, 2, 3, 1, 10), 1, codes.FailedPrecondition, "stale epoch 1"},
		{"heartbeat older than its batch", batch(t, 3, 3, 1, 10), 2, codes.InvalidArgument, "heartbeat.epoch"},
	} {
		a := r.append(t)
		if err := a.stream.Send(&walshipv1.AppendRequest{Batch: tc.batch, Heartbeat: &walshipv1.Heartbeat{Epoch: tc.hbEpoch, ReplyRequested: true}}); err != nil {
			t.Fatal(err)
		}
		wantCode(t, a.failure(), tc.code, tc.contains)
		if st := r.status(t); st.DurableLsn != 2 || st.Epoch != 2 {
			t.Fatalf("%s: status %v after the refusal, want durable 2 at epoch 2", tc.name, st)
		}
	}
}
