package primary

import (
	"context"
	"fmt"
	"math"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	walshipv1 "github.com/walship/walship/gen/walship/v1"
	"github.com/walship/walship/internal/datadir"
	"github.com/walship/walship/internal/testkit"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
)

// TestReplicationStreamEndsBeforeHello: a stream closed before its first
// message is a bad argument naming the hello, not UNKNOWN "EOF" (the
// handler returned the receive's io.EOF as it was), and the primary
// keeps serving.
func TestReplicationStreamEndsBeforeHello(t *testing.T) {
	r := start(t, testConfig(t, t.TempDir()))
	c := ctx(t)
	s, err := walshipv1.NewReplicationServiceClient(r.conn).Stream(c)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.CloseSend(); err != nil {
		t.Fatal(err)
	}
	_, err = s.Recv()
	if status.Code(err) != codes.InvalidArgument || !strings.Contains(status.Convert(err).Message(), "hello: the stream ended before its first message") {
		t.Fatalf("a stream closed before its hello: %v; want INVALID_ARGUMENT naming the hello", err)
	}
	if _, err := r.kv.Put(c, &walshipv1.PutRequest{Key: "k", Value: []byte("v")}); err != nil {
		t.Fatalf("Put after the empty stream: %v", err)
	}
}

// TestReplicationStreamBadInput opens replication streams the way a broken
// or hostile replica would; each is refused with the right code naming the
// field, and the primary keeps serving.
func TestReplicationStreamBadInput(t *testing.T) {
	r := start(t, testConfig(t, t.TempDir()))
	c := ctx(t)
	p, err := r.kv.Put(c, &walshipv1.PutRequest{Key: "k", Value: []byte("v")})
	if err != nil {
		t.Fatal(err)
	}
	repl := walshipv1.NewReplicationServiceClient(r.conn)
	hello := func(id string, epoch, next uint64) *walshipv1.StreamRequest {
		return &walshipv1.StreamRequest{Msg: &walshipv1.StreamRequest_Hello{Hello: &walshipv1.ReplicaHello{ReplicaId: id, Epoch: epoch, NextLsn: next}}}
	}
	ack := func(w, f, a uint64) *walshipv1.StreamRequest {
		return &walshipv1.StreamRequest{Msg: &walshipv1.StreamRequest_Ack{Ack: &walshipv1.ReplicaAck{WrittenLsn: w, FlushedLsn: f, AppliedLsn: a}}}
	}
	withHistory := func(hs ...*walshipv1.EpochStart) *walshipv1.StreamRequest {
		m := hello("r1", 1, 1)
		m.GetHello().History = hs
		return m
	}
	withFenced := func(e uint64) *walshipv1.StreamRequest {
		m := hello("r1", 1, 1)
		m.GetHello().FencedEpoch = e
		return m
	}
	for _, tc := range []struct {
		name  string
		msgs  []*walshipv1.StreamRequest
		code  codes.Code
		field string
	}{
		{"history epoch 0", []*walshipv1.StreamRequest{withHistory(&walshipv1.EpochStart{Epoch: 0, FirstLsn: 1})}, codes.InvalidArgument, "hello.history[0]"},
		{"history out of order", []*walshipv1.StreamRequest{withHistory(&walshipv1.EpochStart{Epoch: 2, FirstLsn: 5}, &walshipv1.EpochStart{Epoch: 1, FirstLsn: 9})},
			codes.InvalidArgument, "hello.history[1]"},
		{"ack before hello", []*walshipv1.StreamRequest{ack(1, 1, 1)}, codes.InvalidArgument, "hello"},
		{"empty id", []*walshipv1.StreamRequest{hello("", 1, 1)}, codes.InvalidArgument, "hello.replica_id"},
		{"bad id", []*walshipv1.StreamRequest{hello("a b/c", 1, 1)}, codes.InvalidArgument, "hello.replica_id"},
		{"next_lsn 0", []*walshipv1.StreamRequest{hello("r1", 1, 0)}, codes.InvalidArgument, "hello.next_lsn"},
		{"newer epoch", []*walshipv1.StreamRequest{hello("r1", 7, 1)}, codes.FailedPrecondition, "hello.epoch"},
		{"epoch above the maximum", []*walshipv1.StreamRequest{hello("r1", math.MaxUint64, 1)}, codes.InvalidArgument, "hello.epoch: 18446744073709551615 is above the highest epoch"},
		{"fenced epoch above the maximum", []*walshipv1.StreamRequest{withFenced(math.MaxUint64)}, codes.InvalidArgument, "hello.fenced_epoch: 18446744073709551615 is above"},
		{"history above the maximum", []*walshipv1.StreamRequest{withHistory(&walshipv1.EpochStart{Epoch: 1, FirstLsn: 1}, &walshipv1.EpochStart{Epoch: math.MaxUint64, FirstLsn: 2})},
			codes.InvalidArgument, "hello.history[1].epoch"},
		// The primary is at epoch 1: 2 + 2^20 is one past the jump.
		{"epoch past the jump", []*walshipv1.StreamRequest{hello("r1", 2+datadir.MaxEpochJump, 1)}, codes.InvalidArgument,
			"hello.epoch: 1048578 is more than 1048576 (the most one message may move an epoch) above 1"},
		{"fenced epoch past the jump", []*walshipv1.StreamRequest{withFenced(2 + datadir.MaxEpochJump)}, codes.InvalidArgument, "hello.fenced_epoch: 1048578 is more than 1048576"},
		{"history past the jump", []*walshipv1.StreamRequest{withHistory(&walshipv1.EpochStart{Epoch: 1, FirstLsn: 1}, &walshipv1.EpochStart{Epoch: 2 + datadir.MaxEpochJump, FirstLsn: 2})},
			codes.InvalidArgument, "hello.history[1].epoch: 1048578 is more than 1048576"},
		{"ahead of the primary", []*walshipv1.StreamRequest{hello("r1", 1, p.Lsn+5)}, codes.FailedPrecondition, "hello.next_lsn"},
		{"not a batch boundary", []*walshipv1.StreamRequest{hello("r1", 1, p.Lsn)}, codes.FailedPrecondition, "hello.next_lsn"},
		{"hello twice", []*walshipv1.StreamRequest{hello("r1", 1, 1), hello("r1", 1, 1)}, codes.InvalidArgument, "hello"},
		{"ack out of order", []*walshipv1.StreamRequest{hello("r1", 1, 1), ack(1, 2, 0)}, codes.InvalidArgument, "ack"},
		{"ack beyond the log", []*walshipv1.StreamRequest{hello("r1", 1, 1), ack(p.Lsn+9, 0, 0)}, codes.InvalidArgument, "ack.written_lsn"},
		{"empty message", []*walshipv1.StreamRequest{hello("r1", 1, 1), {}}, codes.InvalidArgument, "msg"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, err := repl.Stream(c)
			if err != nil {
				t.Fatal(err)
			}
			for _, m := range tc.msgs {
				if err := s.Send(m); err != nil {
					break // the server may already have failed the stream
				}
			}
			for {
				_, err = s.Recv()
				if err != nil {
					break
				}
			}
			if status.Code(err) != tc.code || !strings.Contains(status.Convert(err).Message(), tc.field) {
				t.Fatalf("got %v; want %v naming %q", err, tc.code, tc.field)
			}
		})
	}
	// The primary still serves a good replica afterwards.
	s, err := repl.Stream(c)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Send(hello("good", 1, 1)); err != nil {
		t.Fatal(err)
	}
	for {
		m, err := s.Recv()
		if err != nil {
			t.Fatal(err)
		}
		if b := m.GetBatch(); b != nil {
			if b.FirstLsn != 1 || b.LastLsn != p.Lsn {
				t.Fatalf("first batch %d..%d; want 1..%d", b.FirstLsn, b.LastLsn, p.Lsn)
			}
			break
		}
	}
	s.CloseSend()

	snap, err := repl.Snapshot(c, &walshipv1.SnapshotRequest{ReplicaId: "bad id!"})
	if err == nil {
		_, err = snap.Recv()
	}
	if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "replica_id") {
		t.Fatalf("Snapshot with a bad id: %v", err)
	}
}

// TestSilentReplicaIsCutOff: a replica that stops sending (a partition
// drops no FIN) is disconnected after --replica-timeout, so it no longer
// counts for sync commits, Status or the connected metrics.
func TestSilentReplicaIsCutOff(t *testing.T) {
	cfg := testConfig(t, t.TempDir())
	cfg.HeartbeatInterval = 50 * time.Millisecond
	cfg.ReplicaTimeout = 300 * time.Millisecond
	r := start(t, cfg)
	c := ctx(t)
	s, err := walshipv1.NewReplicationServiceClient(r.conn).Stream(c)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Send(&walshipv1.StreamRequest{Msg: &walshipv1.StreamRequest_Hello{Hello: &walshipv1.ReplicaHello{ReplicaId: "quiet", NextLsn: 1}}}); err != nil {
		t.Fatal(err)
	}
	for {
		_, err = s.Recv() // heartbeats, until the primary gives up on us
		if err != nil {
			break
		}
	}
	if status.Code(err) != codes.Unavailable || !strings.Contains(err.Error(), "sent nothing") {
		t.Fatalf("silent replica: %v; want UNAVAILABLE saying it sent nothing", err)
	}
	st, err := r.admin.Status(c, &walshipv1.StatusRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if len(st.Peers) != 1 || st.Peers[0].Id != "quiet" || st.Peers[0].Connected {
		t.Fatalf("peers after the cut-off: %v", st.Peers)
	}
}

// TestStreamedSnapshotIsDurable: with async durability the visible state
// runs ahead of the durable WAL; a snapshot streamed to a replica is made
// durable first (at once, not after the flush window), so a re-seeded
// replica never holds a commit a primary crash could take back.
func TestStreamedSnapshotIsDurable(t *testing.T) {
	cfg := testConfig(t, t.TempDir())
	cfg.Policy.Durability = walshipv1.Durability_DURABILITY_ASYNC
	cfg.AsyncFlushInterval = time.Minute // nothing syncs on its own in this test
	r := start(t, cfg)
	c := ctx(t)
	var last uint64
	for i := range 5 {
		p, err := r.kv.Put(c, &walshipv1.PutRequest{Key: fmt.Sprintf("k%d", i), Value: []byte("v")})
		if err != nil {
			t.Fatal(err)
		}
		last = p.Lsn
	}
	st, err := r.admin.Status(c, &walshipv1.StatusRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if st.VisibleLsn != last || st.DurableLsn >= last {
		t.Fatalf("before the snapshot: visible %d, durable %d; want visible %d and durable behind it", st.VisibleLsn, st.DurableLsn, last)
	}
	snap, err := walshipv1.NewReplicationServiceClient(r.conn).Snapshot(c, &walshipv1.SnapshotRequest{ReplicaId: "r1"})
	if err != nil {
		t.Fatal(err)
	}
	m, err := snap.Recv()
	if err != nil {
		t.Fatal(err)
	}
	h := m.GetHeader()
	if h == nil || h.Lsn != last {
		t.Fatalf("first message %v; want a header at LSN %d", m, last)
	}
	if st, err = r.admin.Status(c, &walshipv1.StatusRequest{}); err != nil {
		t.Fatal(err)
	}
	if st.DurableLsn < h.Lsn {
		t.Fatalf("snapshot header at LSN %d sent while the primary's durable LSN was %d", h.Lsn, st.DurableLsn)
	}
}

// holdSyncCommit commits "cold", then starts a Put of "hot" that waits for
// a replica's write-stage ack, from a replica stream driven by hand, and
// returns once it is in the WAL: the LSNs of both commits, the hot Put's
// result (when it returns) and a function that sends the ack.
func holdSyncCommit(t *testing.T, r *running) (cold, hot uint64, hotErr <-chan error, ack func()) {
	t.Helper()
	c := ctx(t)
	put, err := r.kv.Put(c, &walshipv1.PutRequest{Key: "cold", Value: []byte("c")})
	if err != nil {
		t.Fatal(err)
	}
	s, err := walshipv1.NewReplicationServiceClient(r.conn).Stream(c)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Send(&walshipv1.StreamRequest{Msg: &walshipv1.StreamRequest_Hello{Hello: &walshipv1.ReplicaHello{ReplicaId: "by-hand", Epoch: r.s.epoch, NextLsn: put.Lsn + 1}}}); err != nil {
		t.Fatal(err)
	}
	go func() {
		for {
			if _, err := s.Recv(); err != nil {
				return
			}
		}
	}()
	errs := make(chan error, 1)
	go func() {
		_, err := r.kv.Put(c, &walshipv1.PutRequest{Key: "hot", Value: []byte("h"), Policy: &walshipv1.CommitPolicy{
			Replication: walshipv1.ReplicationMode_REPLICATION_MODE_SYNC, SyncLevel: walshipv1.SyncLevel_SYNC_LEVEL_WRITE,
			SyncTimeout: durationpb.New(time.Minute)}})
		errs <- err
	}()
	hot = put.Lsn + 2 // its put and its commit record
	if err := r.s.wal.Wait(c, hot, false); err != nil {
		t.Fatal(err)
	}
	return put.Lsn, hot, errs, func() {
		t.Helper()
		if err := s.Send(&walshipv1.StreamRequest{Msg: &walshipv1.StreamRequest_Ack{Ack: &walshipv1.ReplicaAck{WrittenLsn: hot}}}); err != nil {
			t.Fatal(err)
		}
	}
}

// waitsFor checks that each Txn does not answer while the commit at LSN
// held waits for its replica: given 100 ms, it ends in DEADLINE_EXCEEDED.
func waitsFor(t *testing.T, r *running, held uint64, reqs ...*walshipv1.TxnRequest) {
	t.Helper()
	for _, req := range reqs {
		short, cancel := context.WithTimeout(ctx(t), 100*time.Millisecond)
		resp, err := r.kv.Txn(short, req)
		cancel()
		if status.Code(err) != codes.DeadlineExceeded {
			t.Fatalf("%v while LSN %d waits for its replica = %v, %v; want it to wait (DEADLINE_EXCEEDED)", req, held, resp, err)
		}
	}
}

// TestReadOnlyTxnWaitsOnlyForWritesItSees: a read-only Txn runs at the
// sequenced state but returns nothing unacknowledged: it waits until the
// in-flight writes of the keys it reads or compares are visible — and only
// those, so a read of other keys returns while a sync commit waits for its
// replica. The replica here is this test, acking by hand.
func TestReadOnlyTxnWaitsOnlyForWritesItSees(t *testing.T) {
	cfg := testConfig(t, t.TempDir())
	cfg.Registry = prometheus.NewRegistry()
	r := start(t, cfg)
	c := ctx(t)
	cold, hot, hotErr, ack := holdSyncCommit(t, r)
	// An operator sees the commit waiting for a replica at stage write.
	waitingAt := func(peers, stage string) float64 {
		t.Helper()
		mfs, err := cfg.Registry.Gather()
		if err != nil {
			t.Fatal(err)
		}
		for _, mf := range mfs {
			for _, m := range mf.GetMetric() {
				if mf.GetName() == "walship_sync_commits_waiting" && labelsAre(m.GetLabel(), "peers", peers, "stage", stage) {
					return m.GetGauge().GetValue()
				}
			}
		}
		t.Fatalf("no walship_sync_commits_waiting{peers=%q,stage=%q}", peers, stage)
		return 0
	}
	// The commit starts to wait after its WAL write; a gauge has no event.
	testkit.Until(t, "walship_sync_commits_waiting{peers=replicas,stage=write} to show the waiting commit",
		func() bool { return waitingAt("replicas", "write") == 1 })
	if n := waitingAt("replicas", "flush") + waitingAt("logstores", "flush"); n != 0 {
		t.Fatalf("%v commits waiting at other stages", n)
	}

	// Other keys: at once, at the visible LSN, below the waiting commit.
	resp, err := r.kv.Txn(c, &walshipv1.TxnRequest{Success: []*walshipv1.TxnOp{txnGet("cold"), txnGet("absent")}})
	if err != nil {
		t.Fatal(err)
	}
	if resp.Lsn >= hot || resp.Lsn < cold || string(resp.Results[0].GetGet().GetValue()) != "c" || resp.Results[1].GetGet().GetFound() {
		t.Fatalf("read of other keys while LSN %d waits: %v", hot, resp)
	}
	// Reading, or comparing, the waiting key: only once it is visible — so
	// not before the commit's replica acks.
	reads := []*walshipv1.TxnRequest{
		{Success: []*walshipv1.TxnOp{txnGet("cold"), txnGet("hot")}},
		{Compares: []*walshipv1.Compare{{Key: "hot", Target: walshipv1.CompareTarget_COMPARE_TARGET_EXISTS, Result: walshipv1.CompareResult_COMPARE_RESULT_EQUAL, Operand: &walshipv1.Compare_Exists{Exists: true}}},
			Success: []*walshipv1.TxnOp{txnGet("cold")}},
	}
	waitsFor(t, r, hot, reads...)
	ack()
	if err := <-hotErr; err != nil {
		t.Fatalf("sync commit acked by hand: %v", err)
	}
	if n := waitingAt("replicas", "write"); n != 0 {
		t.Fatalf("%v commits still waiting after the ack", n)
	}
	for _, req := range reads {
		resp, err := r.kv.Txn(c, req)
		if err != nil || resp.Lsn < hot || !resp.Succeeded {
			t.Fatalf("%v once LSN %d is visible = %v, %v", req, hot, resp, err)
		}
	}
}

// TestCommitsAnswerInLSNOrder: a commit sequenced behind one that waits
// for its replica is in the log at once under its own, weaker policy, but
// its writer hears back only once the commit ahead of it is acknowledged
// and its own write is visible — so a read that starts after the answer
// sees it. That holds for a Put over another key as for Txns that read,
// compare or delete: nothing is answered out of order. The replica here is
// this test, acking by hand.
func TestCommitsAnswerInLSNOrder(t *testing.T) {
	r := start(t, testConfig(t, t.TempDir()))
	c := ctx(t)
	_, hot, hotErr, ack := holdSyncCommit(t, r)
	put := func(k string) *walshipv1.TxnOp { return txnPut(k, []byte("w")) }
	hotExists := &walshipv1.Compare{Key: "hot", Target: walshipv1.CompareTarget_COMPARE_TARGET_EXISTS,
		Result: walshipv1.CompareResult_COMPARE_RESULT_EQUAL, Operand: &walshipv1.Compare_Exists{Exists: true}}

	type answer struct {
		req  *walshipv1.TxnRequest
		resp *walshipv1.TxnResponse
		err  error
	}
	behind := []*walshipv1.TxnRequest{
		{Success: []*walshipv1.TxnOp{put("other")}},
		{Success: []*walshipv1.TxnOp{txnGet("cold"), put("w0")}, Speculative: true},
		{Success: []*walshipv1.TxnOp{txnGet("hot"), put("w1")}},
		{Compares: []*walshipv1.Compare{hotExists}, Success: []*walshipv1.TxnOp{put("w2")}},
	}
	answers := make(chan answer, len(behind))
	for _, req := range behind {
		go func() {
			resp, err := r.kv.Txn(c, req)
			answers <- answer{req, resp, err}
		}()
	}
	// Every one is sequenced and written (the WAL holds its commit) …
	last := hot + 2*uint64(len(behind))
	if err := r.s.wal.Wait(c, last, true); err != nil {
		t.Fatal(err)
	}
	// … and none answers while hot waits (given 200 ms to do so wrongly),
	// nor is anything of them visible.
	select {
	case a := <-answers:
		t.Fatalf("%v answered while LSN %d waits for its replica: %v, %v", a.req, hot, a.resp, a.err)
	case <-time.After(200 * time.Millisecond):
	}
	if v := r.s.pipe.visible.Load(); v >= hot {
		t.Fatalf("visible LSN %d: the held commit %d is visible before its ack", v, hot)
	}
	// A read-only Txn of another key still answers at once, below hot.
	if resp, err := r.kv.Txn(c, &walshipv1.TxnRequest{Success: []*walshipv1.TxnOp{txnGet("cold")}}); err != nil || resp.Lsn >= hot {
		t.Fatalf("read of cold while LSN %d waits = %v, %v", hot, resp, err)
	}

	ack()
	if err := <-hotErr; err != nil {
		t.Fatalf("sync commit acked by hand: %v", err)
	}
	for range behind {
		a := <-answers
		if a.err != nil || a.resp.Lsn <= hot || a.resp.Lsn > last {
			t.Fatalf("%v after hot's ack = %v, %v; want a commit LSN in (%d, %d]", a.req, a.resp, a.err, hot, last)
		}
		if g := a.resp.Results[0].GetGet(); g != nil && string(g.GetValue()) != map[string]string{"cold": "c", "hot": "h"}[a.req.Success[0].GetGet().GetKey()] {
			t.Fatalf("%v read %q", a.req, g.GetValue())
		}
		// Answered means visible: a plain Get (no min_lsn) sees it.
		if v := r.s.pipe.visible.Load(); v < a.resp.Lsn {
			t.Fatalf("%v answered at LSN %d with the visible LSN at %d", a.req, a.resp.Lsn, v)
		}
	}
	for _, k := range []string{"other", "w0", "w1", "w2"} {
		if got, err := r.kv.Get(c, &walshipv1.GetRequest{Key: k}); err != nil || string(got.Value) != "w" {
			t.Fatalf("%s after the answers = %v, %v; want w", k, got, err)
		}
	}
}

// TestSpeculativeReadModifyWrite: a speculative read returns a write whose
// commit still waits for its replica, at once; a Txn guarded by a compare
// on that write's version commits after it (its LSN is higher) and is
// answered and visible only with it; a compare that fails returns its
// failure branch's reads at once too.
func TestSpeculativeReadModifyWrite(t *testing.T) {
	r := start(t, testConfig(t, t.TempDir()))
	c := ctx(t)
	cold, hot, hotErr, ack := holdSyncCommit(t, r)
	versionIs := func(k string, v uint64) *walshipv1.Compare {
		return &walshipv1.Compare{Key: k, Target: walshipv1.CompareTarget_COMPARE_TARGET_VERSION,
			Result: walshipv1.CompareResult_COMPARE_RESULT_EQUAL, Operand: &walshipv1.Compare_VersionLsn{VersionLsn: v}}
	}

	// The pending write, at once (a plain read waits: the test above).
	read, err := r.kv.Txn(c, &walshipv1.TxnRequest{Speculative: true, Success: []*walshipv1.TxnOp{txnGet("hot"), txnGet("cold")}})
	if err != nil {
		t.Fatal(err)
	}
	g := read.Results[0].GetGet()
	if string(g.GetValue()) != "h" || g.GetVersionLsn() != hot || read.Lsn != hot {
		t.Fatalf("speculative read while LSN %d waits = %v; want hot=h at version %d, lsn %d", hot, read, hot, hot)
	}
	if v := r.s.pipe.visible.Load(); v >= hot {
		t.Fatalf("visible LSN %d: the held commit %d is visible before its ack", v, hot)
	}
	// A stale compare fails and the failure branch reads the pending write.
	stale, err := r.kv.Txn(c, &walshipv1.TxnRequest{Speculative: true,
		Compares: []*walshipv1.Compare{versionIs("hot", 0)},
		Success:  []*walshipv1.TxnOp{{Op: &walshipv1.TxnOp_Put{Put: &walshipv1.PutOp{Key: "hot", Value: []byte("lost")}}}},
		Failure:  []*walshipv1.TxnOp{txnGet("hot")}})
	if err != nil || stale.Succeeded || string(stale.Results[0].GetGet().GetValue()) != "h" {
		t.Fatalf("stale compare = %v, %v; want the failure branch with hot=h", stale, err)
	}
	// Read-modify-write on what was read: commits after the pending write
	// (durable locally; the default policy waits for no replica), and is
	// answered — and visible — only with it.
	type answer struct {
		resp *walshipv1.TxnResponse
		err  error
	}
	answered := make(chan answer, 1)
	go func() {
		rmw, err := r.kv.Txn(c, &walshipv1.TxnRequest{Speculative: true,
			Compares: []*walshipv1.Compare{versionIs("hot", g.GetVersionLsn())},
			Success:  []*walshipv1.TxnOp{{Op: &walshipv1.TxnOp_Put{Put: &walshipv1.PutOp{Key: "hot", Value: []byte("h2")}}}}})
		answered <- answer{rmw, err}
	}()
	if err := r.s.wal.Wait(c, hot+2, true); err != nil {
		t.Fatal(err)
	}
	select {
	case a := <-answered:
		t.Fatalf("read-modify-write answered while LSN %d waits for its replica: %v, %v", hot, a.resp, a.err)
	case <-time.After(200 * time.Millisecond):
	}
	if v := r.s.pipe.visible.Load(); v >= hot {
		t.Fatalf("visible LSN %d after the dependent commit: the held commit %d became visible before its ack", v, hot)
	}

	ack()
	if err := <-hotErr; err != nil {
		t.Fatalf("sync commit acked by hand: %v", err)
	}
	a := <-answered
	if a.err != nil || !a.resp.Succeeded || a.resp.Lsn != hot+2 {
		t.Fatalf("read-modify-write over the pending write = %v, %v; want success at LSN %d", a.resp, a.err, hot+2)
	}
	got, err := r.kv.Get(c, &walshipv1.GetRequest{Key: "hot"})
	if err != nil || string(got.Value) != "h2" || got.VersionLsn != a.resp.Lsn {
		t.Fatalf("hot after both commits = %v, %v; want h2 at %d", got, err, a.resp.Lsn)
	}
	if got, err := r.kv.Get(c, &walshipv1.GetRequest{Key: "cold"}); err != nil || got.VersionLsn != cold {
		t.Fatalf("cold = %v, %v; want version %d", got, err, cold)
	}
}

// TestGroupFlushAsked: a durability-sync commit that waits for a replica's
// flush gets it asked for on its own batch — the group is written when
// its fsync is about to start, and asked for before the write, so no
// heartbeat has to follow the batch to ask — and returns on the replica's
// flush ack, not before; a write-stage commit's batch asks for the write
// ack itself.
func TestGroupFlushAsked(t *testing.T) {
	cfg := testConfig(t, t.TempDir())
	// No idle heartbeat (it asks for a reply too) during the test: a flush
	// never asked for hangs it instead.
	cfg.HeartbeatInterval = time.Minute
	r := start(t, cfg)
	c := ctx(t)
	s, err := walshipv1.NewReplicationServiceClient(r.conn).Stream(c)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Send(&walshipv1.StreamRequest{Msg: &walshipv1.StreamRequest_Hello{Hello: &walshipv1.ReplicaHello{ReplicaId: "by-hand", Epoch: r.s.epoch, NextLsn: 1}}}); err != nil {
		t.Fatal(err)
	}
	if m, err := s.Recv(); err != nil || m.GetHeartbeat() == nil {
		t.Fatalf("first message = %v, %v; want the greeting heartbeat", m, err)
	}
	for _, level := range []walshipv1.SyncLevel{walshipv1.SyncLevel_SYNC_LEVEL_FLUSH, walshipv1.SyncLevel_SYNC_LEVEL_WRITE} {
		done := make(chan error, 1)
		go func() {
			_, err := r.kv.Put(c, &walshipv1.PutRequest{Key: "k", Value: []byte(level.String()), Policy: &walshipv1.CommitPolicy{
				Durability: walshipv1.Durability_DURABILITY_SYNC, Replication: walshipv1.ReplicationMode_REPLICATION_MODE_SYNC,
				SyncLevel: level, SyncTimeout: durationpb.New(time.Minute)}})
			done <- err
		}()
		var last uint64
		for last == 0 {
			m, err := s.Recv()
			if err != nil {
				t.Fatalf("%v: %v", level, err)
			}
			if b := m.GetBatch(); b != nil {
				last = b.GetLastLsn()
				if !slices.Contains(m.GetReplyAt(), level) {
					t.Fatalf("%v: the commit's batch asks for a reply at %v", level, m.GetReplyAt())
				}
			}
		}
		select {
		case err := <-done:
			t.Fatalf("%v commit returned before the replica acked: %v", level, err)
		default:
		}
		ack := &walshipv1.ReplicaAck{WrittenLsn: last}
		if level == walshipv1.SyncLevel_SYNC_LEVEL_FLUSH {
			ack.FlushedLsn = last
		}
		if err := s.Send(&walshipv1.StreamRequest{Msg: &walshipv1.StreamRequest_Ack{Ack: ack}}); err != nil {
			t.Fatal(err)
		}
		if err := <-done; err != nil {
			t.Fatalf("%v commit acked by hand: %v", level, err)
		}
	}
}

// labelsAre reports whether the label pairs are exactly kv (name, value, ...).
func labelsAre(got []*dto.LabelPair, kv ...string) bool {
	if len(got) != len(kv)/2 {
		return false
	}
	for i, l := range got {
		if l.GetName() != kv[2*i] || l.GetValue() != kv[2*i+1] {
			return false
		}
	}
	return true
}
