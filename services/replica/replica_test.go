package replica

import (
	"bytes"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	walshipv1 "github.com/walship/walship/gen/walship/v1"
	"github.com/walship/walship/internal/state"
	"github.com/walship/walship/internal/testkit"
	"github.com/walship/walship/internal/vfs"
	"github.com/walship/walship/internal/wal"
	"github.com/walship/walship/pkg/codec"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
)

func wantCode(t *testing.T, what string, err error, code codes.Code, contains string) {
	t.Helper()
	if status.Code(err) != code || !strings.Contains(status.Convert(err).Message(), contains) {
		t.Errorf("%s: got %v, want %v containing %q", what, err, code, contains)
	}
}

func TestStreamApplyReadStatusAndRestart(t *testing.T) {
	fp := newFakePrimary(t)
	dir := t.TempDir()
	cfg := testConfig(t, dir, fp.addr)
	r := start(t, cfg)
	m := newModel(t)

	sess := fp.next(t)
	if sess.hello.GetReplicaId() != "r1" || sess.hello.GetNextLsn() != 1 || sess.hello.GetEpoch() != 0 {
		t.Fatalf("hello = %v, want id r1, next_lsn 1, epoch 0", sess.hello)
	}
	sess.send(t, m.txn(put("a", "1"), put("b", "2")), m.txn(put("c", "3")), m.txn(del("a"), put("d", "4")))
	last := m.next - 1 // 3 + 2 + 3 = 8

	c := tctx(t)
	got, err := r.kv.Get(c, &walshipv1.GetRequest{Key: "c", MinLsn: last})
	if err != nil || !got.Found || string(got.Value) != "3" || got.VersionLsn != 5 || got.AppliedLsn != last {
		t.Fatalf("Get c = %v, %v; want 3 at version 5, applied %d", got, err, last)
	}
	if got, err := r.kv.Get(c, &walshipv1.GetRequest{Key: "a"}); err != nil || got.Found {
		t.Fatalf("Get deleted a = %v, %v", got, err)
	}
	scan, err := r.kv.Scan(c, &walshipv1.ScanRequest{})
	if err != nil || len(scan.Kvs) != 3 || scan.Kvs[0].Key != "b" || scan.Kvs[2].Key != "d" {
		t.Fatalf("Scan = %v, %v", scan, err)
	}
	if a := sess.waitAck(t, last); a.WrittenLsn != last || a.FlushedLsn != last {
		t.Fatalf("ack = %v, want every stage at %d", a, last)
	}

	st := r.status(t)
	if st.Role != walshipv1.Role_ROLE_REPLICA || st.Id != "r1" || st.LastLsn != last || st.DurableLsn != last ||
		st.VisibleLsn != last || st.StateDigest != m.digest() || st.Keys != 3 || st.Rung != walshipv1.CatchUpRung_CATCH_UP_RUNG_PRIMARY ||
		st.Primary != fp.addr || !st.Serving || st.Epoch != 1 || st.WalFirstLsn != 1 {
		t.Fatalf("Status = %v; want digest %s at LSN %d", st, m.digest(), last)
	}
	if len(st.Peers) != 1 || !st.Peers[0].Connected || st.Peers[0].Role != walshipv1.Role_ROLE_PRIMARY || st.Peers[0].AppliedLsn != last {
		t.Fatalf("Status.peers = %v", st.Peers)
	}
	for name, want := range map[string]float64{
		"walship_replica_applied_records_total": float64(last),
		"walship_replica_connected":             1,
	} {
		if v := r.metric(t, name); v != want {
			t.Errorf("%s = %v, want %v", name, v, want)
		}
	}
	for _, stage := range []string{"write", "flush", "apply"} {
		if v := r.metric(t, "walship_replica_lsn", "stage", stage); v != float64(last) {
			t.Errorf("walship_replica_lsn{stage=%s} = %v, want %d", stage, v, last)
		}
	}
	if v := r.metric(t, "walship_replica_catchup_rung", "rung", "primary"); v != 1 {
		t.Errorf("rung primary = %v", v)
	}
	if v := r.metric(t, "walship_replica_catchup_rung", "rung", "snapshot"); v != 0 {
		t.Errorf("rung snapshot = %v", v)
	}

	// A read-only replica: writes name the primary; admin calls say what it is not.
	_, err = r.kv.Put(c, &walshipv1.PutRequest{Key: "x", Value: []byte("y")})
	wantCode(t, "Put", err, codes.FailedPrecondition, "read-only replica; send writes to the primary at "+fp.addr)
	_, err = r.kv.Delete(c, &walshipv1.DeleteRequest{Key: "x"})
	wantCode(t, "Delete", err, codes.FailedPrecondition, fp.addr)
	_, err = r.kv.Txn(c, &walshipv1.TxnRequest{})
	wantCode(t, "Txn", err, codes.FailedPrecondition, fp.addr)
	_, err = r.admin.Promote(c, &walshipv1.PromoteRequest{})
	wantCode(t, "Promote", err, codes.FailedPrecondition, "runs on its own and cannot become the primary")
	_, err = r.admin.SetPolicy(c, &walshipv1.SetPolicyRequest{})
	wantCode(t, "SetPolicy", err, codes.FailedPrecondition, "not a primary")
	// A read that asks for the primary is not answered here.
	_, err = r.kv.Get(c, &walshipv1.GetRequest{Key: "a", RequirePrimary: true})
	wantCode(t, "Get require_primary", err, codes.FailedPrecondition, "replica r1 is not the primary")
	_, err = r.kv.Scan(c, &walshipv1.ScanRequest{RequirePrimary: true})
	wantCode(t, "Scan require_primary", err, codes.FailedPrecondition, "replica r1 is not the primary")

	// Bad input on reads.
	_, err = r.kv.Get(c, &walshipv1.GetRequest{Key: ""})
	wantCode(t, "Get empty key", err, codes.InvalidArgument, "key")
	_, err = r.kv.Get(c, &walshipv1.GetRequest{Key: strings.Repeat("k", 4097)})
	wantCode(t, "Get long key", err, codes.InvalidArgument, "limit")
	_, err = r.kv.Scan(c, &walshipv1.ScanRequest{Start: "b", End: "a"})
	wantCode(t, "Scan end before start", err, codes.InvalidArgument, "end")
	_, err = r.kv.Scan(c, &walshipv1.ScanRequest{Limit: 1 << 20})
	wantCode(t, "Scan huge limit", err, codes.InvalidArgument, "limit")
	_, err = r.kv.Get(c, &walshipv1.GetRequest{Key: "c", MinLsn: last + 100, WaitTimeout: durationpb.New(20 * time.Millisecond)})
	wantCode(t, "Get future min_lsn", err, codes.DeadlineExceeded, "not visible")

	// Restart: the applied state comes back from disk alone, and the
	// replica asks for exactly what follows it.
	if err := r.stop(t); err != nil {
		t.Fatalf("Run: %v", err)
	}
	r2 := start(t, cfg)
	if got, err := r2.kv.Get(c, &walshipv1.GetRequest{Key: "d"}); err != nil || string(got.Value) != "4" || got.AppliedLsn != last {
		t.Fatalf("Get d after restart = %v, %v", got, err)
	}
	st = r2.status(t)
	if st.StateDigest != m.digest() || st.VisibleLsn != last || st.SnapshotLsn != last || st.Epoch != 1 {
		t.Fatalf("Status after restart = %v; want digest %s, snapshot at %d", st, m.digest(), last)
	}
	sess = fp.next(t)
	if sess.hello.GetNextLsn() != last+1 || sess.hello.GetEpoch() != 1 {
		t.Fatalf("hello after restart = %v, want next_lsn %d epoch 1", sess.hello, last+1)
	}
	sess.send(t, m.txn(put("e", "5")))
	r2.waitApplied(t, m.next-1)
	if st := r2.status(t); st.StateDigest != m.digest() {
		t.Fatalf("digest %s, want %s", st.StateDigest, m.digest())
	}
}

func TestAcksAreCumulativeAndCoalesced(t *testing.T) {
	fp := newFakePrimary(t)
	cfg := testConfig(t, t.TempDir(), fp.addr)
	cfg.HeartbeatInterval = 10 * time.Second // no periodic acks in the way
	r := start(t, cfg)
	m := newModel(t)
	sess := fp.next(t)

	const n = 300
	batches := make([]*walshipv1.WalBatch, n)
	for i := range batches {
		batches[i] = m.txn(put(keyN(i), "v"))
	}
	sess.send(t, batches...)
	last := m.next - 1
	r.waitApplied(t, last)

	var acks []*walshipv1.ReplicaAck
	for {
		a := <-sess.acks // the final ack is sent right after the last apply
		acks = append(acks, a)
		if a.AppliedLsn == last {
			break
		}
	}
	if len(acks) >= n {
		t.Errorf("%d acks for %d batches: not coalesced", len(acks), n)
	}
	var prev *walshipv1.ReplicaAck
	for i, a := range acks {
		if a.WrittenLsn < a.FlushedLsn || a.FlushedLsn < a.AppliedLsn || a.TimeUnixNano == 0 {
			t.Errorf("ack %d = %v: stages out of order", i, a)
		}
		if prev != nil && (a.WrittenLsn < prev.WrittenLsn || a.FlushedLsn < prev.FlushedLsn || a.AppliedLsn < prev.AppliedLsn) {
			t.Errorf("ack %d = %v went backwards from %v", i, a, prev)
		}
		prev = a
	}
	t.Logf("%d batches, %d acks", n, len(acks))
	if st := r.status(t); st.StateDigest != m.digest() {
		t.Fatalf("digest %s, want %s", st.StateDigest, m.digest())
	}

	// A heartbeat asking for a reply gets one at once, not a heartbeat
	// interval later.
	sess.heartbeat(t, 1, last, true)
	select {
	case a := <-sess.acks:
		if a.AppliedLsn != last {
			t.Fatalf("reply ack = %v", a)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("no ack in reply to reply_requested")
	}
}

func TestRefusedBatches(t *testing.T) {
	for _, tc := range []struct {
		reason string
		bad    func(m *model) *walshipv1.WalBatch
	}{
		{reasonCRC, func(m *model) *walshipv1.WalBatch {
			b := m.build(m.next, put("x", "bad"))
			b.Crc32C ^= 1
			return b
		}},
		{reasonGap, func(m *model) *walshipv1.WalBatch { return m.build(m.next+1, put("x", "bad")) }},
		{reasonEpoch, func(m *model) *walshipv1.WalBatch {
			m.epoch--
			defer func() { m.epoch++ }()
			return m.build(m.next, put("x", "bad"))
		}},
		{reasonDecode, func(m *model) *walshipv1.WalBatch {
			b := m.build(m.next, put("x", "bad"))
			b.Payload = bytes.Repeat([]byte{0xc1}, 16) // 0xc1 is never valid MessagePack
			b.Crc32C = codec.Checksum(b.Payload)
			return b
		}},
		{reasonDecode + "/txn inside txn", func(m *model) *walshipv1.WalBatch {
			// Decodes, and matches its envelope, but a record of one
			// transaction sits inside another's: the state cannot apply it.
			first := m.next
			b := codec.Batch{Records: []codec.Record{
				{LSN: first, TxnID: first + 2, Op: codec.OpPut, Key: []byte("x"), Value: []byte("bad")},
				{LSN: first + 1, TxnID: 7, Op: codec.OpPut, Key: []byte("y"), Value: []byte("bad")},
				{LSN: first + 2, TxnID: first + 2, Op: codec.OpCommit},
			}}
			payload, err := codec.MsgPack.AppendBatch(nil, &b)
			if err != nil {
				t.Fatal(err)
			}
			env := m.build(first, put("x", "bad"), put("y", "bad"))
			env.Payload, env.Crc32C = payload, codec.Checksum(payload)
			return env
		}},
	} {
		t.Run(tc.reason, func(t *testing.T) {
			fp := newFakePrimary(t)
			r := start(t, testConfig(t, t.TempDir(), fp.addr))
			m := newModel(t)
			m.epoch = 2
			sess := fp.next(t)
			sess.send(t, m.txn(put("a", "1")))
			good := m.next - 1
			r.waitApplied(t, good)

			sess.send(t, tc.bad(m))
			again := fp.next(t) // the replica dropped the stream and came back
			if again.hello.GetNextLsn() != good+1 || again.hello.GetEpoch() != 2 {
				t.Fatalf("hello after refusal = %v, want next_lsn %d epoch 2", again.hello, good+1)
			}
			st := r.status(t)
			if st.LastLsn != good || st.VisibleLsn != good || st.StateDigest != m.digest() {
				t.Fatalf("after refusal: Status = %v, want everything at %d, digest %s", st, good, m.digest())
			}
			reason, _, _ := strings.Cut(tc.reason, "/")
			if v := r.metric(t, "walship_replica_refused_batches_total", "reason", reason); v != 1 {
				t.Errorf("refused{reason=%s} = %v, want 1", reason, v)
			}
			if got, _ := r.kv.Get(tctx(t), &walshipv1.GetRequest{Key: "x"}); got.GetFound() {
				t.Fatal("a refused batch was applied")
			}
			// The stream resumes where it should.
			again.send(t, m.txn(put("b", "2")))
			r.waitApplied(t, m.next-1)
			if st := r.status(t); st.StateDigest != m.digest() {
				t.Fatalf("digest %s, want %s", st.StateDigest, m.digest())
			}
		})
	}
}

func TestFinishInterruptedReseed(t *testing.T) {
	// A crash after the re-seeded state was saved and before the WAL was
	// reset leaves a WAL ending before the newest snapshot.
	fp := newFakePrimary(t)
	dir := t.TempDir()
	cfg := testConfig(t, dir, fp.addr)
	m := newModel(t)
	r := start(t, cfg)
	sess := fp.next(t)
	sess.send(t, m.txn(put("a", "1")))
	r.waitApplied(t, m.next-1)
	if err := r.stop(t); err != nil {
		t.Fatal(err)
	}
	for range 10 {
		m.txn(put("b", "2"))
	}
	if _, err := state.SaveSnapshot(vfs.OS, (&Server{cfg: cfg}).snapDir(), m.ref.Snapshot()); err != nil {
		t.Fatal(err)
	}
	r2 := start(t, cfg)
	if st := r2.status(t); st.VisibleLsn != m.next-1 || st.StateDigest != m.digest() {
		t.Fatalf("Status = %v, want the snapshot's state at %d", st, m.next-1)
	}
	if sess := fp.next(t); sess.hello.GetNextLsn() != m.next {
		t.Fatalf("hello = %v, want next_lsn %d", sess.hello, m.next)
	}
}

// TestRefusedLogStoreBatchVouchesForNothing: batches the primary sent but
// never reported durable wait, unapplied, when the replica goes to the log
// store; a log store batch that is refused (a gap) makes none of them
// durable — only a batch the log store supplies and the replica writes
// speaks for what is before it.
func TestRefusedLogStoreBatchVouchesForNothing(t *testing.T) {
	fp := newFakePrimary(t)
	m := newModel(t)
	b1, b2 := m.txn(put("a", "1")), m.txn(put("b", "not durable"))
	gap := m.build(m.next+10, put("c", "after a gap"))
	ls := newFakeLogStore(t, func(_ *walshipv1.ReadRequest, st grpc.ServerStreamingServer[walshipv1.ReadResponse]) error {
		return st.Send(&walshipv1.ReadResponse{Batch: gap})
	})
	cfg := testConfig(t, t.TempDir(), fp.addr)
	cfg.LogStores = []string{ls.addr}
	r := start(t, cfg)
	sess := fp.next(t)
	sess.send(t, b1)
	sess.sendDurable(t, b1.LastLsn, b2)
	sess.heartbeatDurable(t, 1, b2.LastLsn, b1.LastLsn, true)
	waitAckWhere(t, sess, func(a *walshipv1.ReplicaAck) bool { return a.FlushedLsn >= b2.LastLsn })
	sess.end <- status.Error(codes.OutOfRange, "gone")
	// The log store's batch is refused; the snapshot rung fails (none is
	// served here); the replica comes back to the primary. Until the log
	// store has been read from (its connection may not be up at the first
	// try), send the replica back down.
	again := fp.next(t)
	for i := 0; len(ls.reads) == 0; i++ {
		if i == 5 {
			t.Fatal("the replica never read from the log store")
		}
		again.end <- status.Error(codes.OutOfRange, "gone")
		again = fp.next(t)
	}
	if st := r.status(t); st.VisibleLsn != b1.LastLsn {
		t.Fatalf("visible LSN %d after a refused log store batch; want %d (LSN %d was never reported durable)", st.VisibleLsn, b1.LastLsn, b2.LastLsn)
	}
	// Once the primary says so, it is applied.
	again.heartbeatDurable(t, 1, b2.LastLsn, b2.LastLsn, true)
	r.waitApplied(t, b2.LastLsn)
}

// TestLogStoreRungReadsFromAnyThatHasTheLSN: of three log stores, one
// says (Status) it no longer keeps the replica's next LSN, one says it
// does but its Read fails OUT_OF_RANGE (retention ran in between), and one
// has it. The rung never reads from the first, falls through the second
// and catches up from the third, then goes back to the primary.
func TestLogStoreRungReadsFromAnyThatHasTheLSN(t *testing.T) {
	fp := newFakePrimary(t)
	m := newModel(t)
	b1, b2, b3 := m.txn(put("a", "1")), m.txn(put("b", "2")), m.txn(put("c", "3"))
	lacking := newFakeLogStore(t, func(req *walshipv1.ReadRequest, _ grpc.ServerStreamingServer[walshipv1.ReadResponse]) error {
		return status.Errorf(codes.OutOfRange, "LSN %d is no longer kept", req.GetFromLsn())
	})
	lacking.first.Store(b3.FirstLsn)
	lacking.durable.Store(b3.LastLsn)
	racing := newFakeLogStore(t, func(req *walshipv1.ReadRequest, _ grpc.ServerStreamingServer[walshipv1.ReadResponse]) error {
		return status.Errorf(codes.OutOfRange, "LSN %d is no longer kept", req.GetFromLsn())
	})
	holding := newFakeLogStore(t, func(req *walshipv1.ReadRequest, st grpc.ServerStreamingServer[walshipv1.ReadResponse]) error {
		for _, b := range []*walshipv1.WalBatch{b1, b2, b3} {
			if b.LastLsn >= req.GetFromLsn() {
				if err := st.Send(&walshipv1.ReadResponse{Batch: b}); err != nil {
					return err
				}
			}
		}
		return nil
	})
	for _, ls := range []*fakeLogStore{racing, holding} {
		ls.durable.Store(b3.LastLsn) // the same end: tried in the order given
	}
	cfg := testConfig(t, t.TempDir(), fp.addr)
	cfg.LogStores = []string{lacking.addr, racing.addr, holding.addr}
	r := start(t, cfg)
	sess := fp.next(t)
	sess.send(t, b1)
	r.waitApplied(t, b1.LastLsn)
	sess.end <- status.Error(codes.OutOfRange, "gone")
	again := fp.next(t)
	if again.hello.GetNextLsn() != b3.LastLsn+1 {
		t.Fatalf("back at the primary from LSN %d; want %d (the log store rung read through LSN %d)", again.hello.GetNextLsn(), b3.LastLsn+1, b3.LastLsn)
	}
	r.waitApplied(t, b3.LastLsn)
	if n := len(lacking.reads); n != 0 {
		t.Errorf("%d reads from the log store that said it lacks LSN %d", n, b2.FirstLsn)
	}
	for _, ls := range []*fakeLogStore{racing, holding} {
		select {
		case req := <-ls.reads:
			if req.GetFromLsn() != b2.FirstLsn {
				t.Errorf("read from LSN %d, want %d", req.GetFromLsn(), b2.FirstLsn)
			}
		default:
			t.Errorf("no read from the log store at %s", ls.addr)
		}
	}
	if fp.snapshotCalls.Load() != 0 {
		t.Error("the replica asked for a snapshot though a log store held the LSN")
	}
}

func TestLagSeconds(t *testing.T) {
	fp := newFakePrimary(t)
	cfg := testConfig(t, t.TempDir(), fp.addr)
	cfg.HeartbeatInterval = 50 * time.Millisecond
	r := start(t, cfg)
	m := newModel(t)
	sess := fp.next(t)
	sess.send(t, m.txn(put("a", "1")))
	applied := m.next - 1
	r.waitApplied(t, applied)

	// The primary's heartbeats, announcing announced.
	var announced atomic.Uint64
	announced.Store(applied)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		tick := time.NewTicker(cfg.HeartbeatInterval)
		defer tick.Stop()
		for {
			select {
			case <-stop:
				return
			case <-tick.C:
				_ = sess.stream.Send(&walshipv1.StreamResponse{Msg: &walshipv1.StreamResponse_Heartbeat{Heartbeat: &walshipv1.Heartbeat{
					Epoch: 1, LastLsn: announced.Load(), TimeUnixNano: time.Now().UnixNano(),
				}}})
			}
		}
	}()
	stopBeats := sync.OnceFunc(func() { close(stop); wg.Wait() })
	defer stopBeats()
	lag := func() float64 { return r.metric(t, "walship_replica_lag_seconds") }

	// Idle and caught up: 0.
	testkit.Until(t, "lag 0 while idle", func() bool { return lag() == 0 })
	// The primary announces LSNs the replica has not got: lag grows.
	announced.Store(applied + 10)
	testkit.Until(t, "lag > 0 behind the announced LSN", func() bool { return lag() > 0 })
	if st := r.status(t); st.Peers[0].LagRecords != 10 || st.Peers[0].LagSeconds <= 0 {
		t.Fatalf("peer = %v, want 10 records behind", st.Peers[0])
	}
	// Caught up again (the primary says so): back to 0.
	announced.Store(applied)
	sess.send(t, m.txn(put("b", "2")))
	announced.Store(m.next - 1)
	r.waitApplied(t, m.next-1)
	testkit.Until(t, "lag 0 after catching up", func() bool { return lag() == 0 })
	// Partitioned: no word from the primary, the lag must not stay 0.
	stopBeats()
	testkit.Until(t, "lag growing while cut off", func() bool { return lag() > 3*cfg.HeartbeatInterval.Seconds() })
}

func TestPeriodicSnapshotTruncatesWAL(t *testing.T) {
	fp := newFakePrimary(t)
	cfg := testConfig(t, t.TempDir(), fp.addr)
	cfg.SnapshotEveryBytes = 64 << 10
	r := start(t, cfg)
	m := newModel(t)
	sess := fp.next(t)
	value := strings.Repeat("v", 4<<10)
	// ~800 KiB of WAL: 12 segments. In waves, each applied before the
	// next, so that several snapshots are taken (the second one lets the
	// WAL be cut back to the first) however the replica coalesces flushes.
	for wave := range 8 {
		for i := range 25 {
			sess.send(t, m.txn(put(keyN((wave*25+i)%50), value)))
		}
		r.waitApplied(t, m.next-1)
	}
	testkit.Until(t, "a snapshot and a truncated WAL", func() bool {
		st := r.status(t)
		return st.SnapshotLsn > 0 && st.WalFirstLsn > 1 && st.WalFirstLsn <= st.SnapshotLsn
	})
	st := r.status(t)
	if st.StateDigest != m.digest() {
		t.Fatalf("digest %s, want %s", st.StateDigest, m.digest())
	}
	if total := uint64(r.s.wal.Stats().BytesWritten); st.WalBytes >= total {
		t.Errorf("WAL holds %d of the %d bytes written; truncation is not keeping it bounded", st.WalBytes, total)
	}
	// The WAL still reaches back to the older kept snapshot, so recovery can
	// fall back to it.
	r.s.snapMu.Lock() // no snapshot (and truncation) in between
	snaps, err := listSnapshots(vfs.OS, r.s.snapDir())
	first := r.s.wal.FirstLSN()
	r.s.snapMu.Unlock()
	if err != nil || len(snaps) == 0 {
		t.Fatalf("snapshots = %v, %v", snaps, err)
	}
	if oldest := snaps[len(snaps)-1]; first > oldest+1 {
		t.Errorf("WAL starts at LSN %d, after the oldest kept snapshot at %d", first, oldest)
	}
	// Restart from the truncated WAL and the snapshot.
	if err := r.stop(t); err != nil {
		t.Fatal(err)
	}
	r2 := start(t, cfg)
	if st := r2.status(t); st.StateDigest != m.digest() || st.VisibleLsn != m.next-1 {
		t.Fatalf("after restart: %v", st)
	}
}

func TestConfigValidate(t *testing.T) {
	for _, tc := range []struct {
		name string
		edit func(*Config)
		want string
	}{
		{"ok", func(*Config) {}, ""},
		{"no data dir", func(c *Config) { c.DataDir = "" }, "--data-dir"},
		{"no id", func(c *Config) { c.ID = "" }, "--id"},
		{"bad id", func(c *Config) { c.ID = "a b" }, "--id"},
		{"long id", func(c *Config) { c.ID = strings.Repeat("a", 65) }, "--id"},
		{"no primary", func(c *Config) { c.Primary = "" }, "--primary"},
		{"small segments", func(c *Config) { c.SegmentBytes = 1 }, "--segment-bytes"},
		{"no snapshots", func(c *Config) { c.SnapshotEveryBytes = 0 }, "--snapshot-every-bytes"},
		{"negative unapplied bound", func(c *Config) { c.MaxUnappliedBytes = -1 }, "--max-unapplied-bytes"},
		{"no heartbeat", func(c *Config) { c.HeartbeatInterval = 0 }, "--heartbeat-interval"},
		{"log stores", func(c *Config) { c.LogStores = []string{"a:1", "b:2"} }, ""},
		{"empty log store", func(c *Config) { c.LogStores = []string{"a:1", ""} }, "--logstore: entry 1 is empty"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := DefaultConfig()
			cfg.DataDir, cfg.ID, cfg.Primary = "/tmp/x", "replica-1.a_b", "127.0.0.1:7401"
			tc.edit(&cfg)
			err := cfg.Validate()
			if (err == nil) != (tc.want == "") || (err != nil && !strings.Contains(err.Error(), tc.want)) {
				t.Fatalf("Validate = %v, want %q", err, tc.want)
			}
		})
	}
}

// TestSnapshotTruncationFsyncFailureIsFatal: a periodic snapshot lets the
// WAL be cut, and the directory fsync after a segment's removal fails. The
// replica stops at once, as after any failed fsync (not at its next batch,
// which on an idle stream may never come): Run returns the error.
func TestSnapshotTruncationFsyncFailureIsFatal(t *testing.T) {
	fp := newFakePrimary(t)
	mem := vfs.NewMem()
	cfg := testConfig(t, "/data", fp.addr)
	cfg.FS = mem
	cfg.SnapshotEveryBytes = 64 << 10
	removed := mem.FailDirSyncAfterRemove(".wal", vfs.ErrInjected)
	r := start(t, cfg)
	m := newModel(t)
	sess := fp.next(t)
	value := strings.Repeat("v", 4<<10)
	// Waves as in TestPeriodicSnapshotTruncatesWAL, until a segment is
	// removed; then no more batches.
	for wave := 0; !removed(); wave++ {
		if wave == 20 {
			t.Fatal("20 waves and no WAL segment removed; the test did not exercise truncation")
		}
		for i := range 25 {
			b := m.txn(put(keyN((wave*25+i)%50), value))
			// Not sess.send: once a removal failed the replica may be gone.
			if err := sess.stream.Send(&walshipv1.StreamResponse{DurableLsn: b.LastLsn, CommitLsn: b.LastLsn, Msg: &walshipv1.StreamResponse_Batch{Batch: b}}); err != nil && !removed() {
				t.Fatalf("send batch %d..%d: %v", b.FirstLsn, b.LastLsn, err)
			}
		}
		// Applied, or a removal under way (the replica may stop mid-wave).
		target := m.next - 1
		testkit.Until(t, fmt.Sprintf("LSN %d applied or a segment removed", target), func() bool {
			return removed() || r.s.appliedLSN() >= target
		})
	}
	select {
	case err := <-r.done:
		r.cancel = nil
		r.conn.Close()
		if !errors.Is(err, vfs.ErrInjected) || !errors.Is(err, wal.ErrBroken) {
			t.Fatalf("Run returned %v, want the injected fsync error", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("Run did not return after the WAL truncation's fsync failed")
	}
}

// TestFailedFsyncIsNotReportedWritten: once the replica's WAL fsync fails,
// it stops, and the positions it reports no longer count what it wrote past
// the durable LSN as written: those pages may never reach the disk.
func TestFailedFsyncIsNotReportedWritten(t *testing.T) {
	fp := newFakePrimary(t)
	mem := vfs.NewMem()
	cfg := testConfig(t, "/data", fp.addr)
	cfg.FS = mem
	r := start(t, cfg)
	m := newModel(t)
	sess := fp.next(t)
	b1 := m.txn(put("a", "1"))
	sess.send(t, b1)
	r.waitApplied(t, b1.LastLsn)
	mem.InjectSyncError(func(name string) error {
		if strings.HasSuffix(name, ".wal") {
			return vfs.ErrInjected
		}
		return nil
	})
	b2 := m.txn(put("b", "2"))
	sess.send(t, b2)
	select {
	case err := <-r.done:
		r.cancel = nil
		r.conn.Close()
		if !errors.Is(err, vfs.ErrInjected) {
			t.Fatalf("Run returned %v, want the injected fsync error", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("Run did not return after a failed fsync")
	}
	if last := r.s.wal.LastLSN(); last != b2.LastLsn {
		t.Fatalf("WAL last LSN %d, want %d: the test needs b2 written before its fsync failed", last, b2.LastLsn)
	}
	if pos := r.s.positions(); pos.WrittenLsn != b1.LastLsn || pos.FlushedLsn != b1.LastLsn {
		t.Fatalf("positions after the failed fsync = %v; want written and flushed %d, not the unsynced %d", pos, b1.LastLsn, b2.LastLsn)
	}
}

// TestRequestLimit: the replica reads a request up to the largest write
// it may be sent (MaxValueBytes plus the largest key plus 1 MiB), which
// it refuses naming the primary; a larger message fails
// RESOURCE_EXHAUSTED on its length prefix. The limit was 72 MiB, the
// size of what the replica sends, so one call could make it hold 72 MiB
// before any handler ran.
func TestRequestLimit(t *testing.T) {
	fp := newFakePrimary(t)
	cfg := testConfig(t, t.TempDir(), fp.addr)
	cfg.MaxValueBytes = 1 << 20
	r := start(t, cfg)
	c := tctx(t)
	_, err := r.kv.Put(c, &walshipv1.PutRequest{Key: "x", Value: make([]byte, 1<<20)})
	wantCode(t, "Put of the largest value", err, codes.FailedPrecondition, "send writes to the primary at "+fp.addr)
	_, err = r.kv.Put(c, &walshipv1.PutRequest{Key: "x", Value: make([]byte, 3<<20)}, grpc.MaxCallSendMsgSize(8<<20))
	wantCode(t, "Put past the request limit", err, codes.ResourceExhausted, "larger than max")
}
