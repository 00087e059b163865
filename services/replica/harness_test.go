package replica

import (
	"context"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	walshipv1 "github.com/walship/walship/gen/walship/v1"
	"github.com/walship/walship/internal/serve"
	"github.com/walship/walship/internal/state"
	"github.com/walship/walship/pkg/codec"
	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// fakePrimary is a scripted ReplicationService: every Stream call becomes a
// session the test drives by hand (send batches and heartbeats, read acks,
// end it with an error of its choice).
type fakePrimary struct {
	walshipv1.UnimplementedReplicationServiceServer
	addr     string
	sessions chan *session
	// snapshot serves Snapshot; nil answers UNIMPLEMENTED.
	snapshot      func(*walshipv1.SnapshotRequest, grpc.ServerStreamingServer[walshipv1.SnapshotResponse]) error
	snapshotCalls atomic.Int32
}

// session is one replication stream as the primary sees it.
type session struct {
	hello  *walshipv1.ReplicaHello
	stream grpc.BidiStreamingServer[walshipv1.StreamRequest, walshipv1.StreamResponse]
	acks   chan *walshipv1.ReplicaAck
	end    chan error // the stream ends with what is sent here
}

func (f *fakePrimary) Stream(st grpc.BidiStreamingServer[walshipv1.StreamRequest, walshipv1.StreamResponse]) error {
	m, err := st.Recv()
	if err != nil {
		return err
	}
	sess := &session{hello: m.GetHello(), stream: st, acks: make(chan *walshipv1.ReplicaAck, 100000), end: make(chan error, 1)}
	go func() { // exits when the stream ends
		for {
			m, err := st.Recv()
			if err != nil {
				return
			}
			if a := m.GetAck(); a != nil {
				select {
				case sess.acks <- a:
				default:
				}
			}
		}
	}()
	select {
	case f.sessions <- sess:
	case <-st.Context().Done():
		return st.Context().Err()
	}
	select {
	case err := <-sess.end:
		return err
	case <-st.Context().Done():
		return st.Context().Err()
	}
}

func (f *fakePrimary) Snapshot(req *walshipv1.SnapshotRequest, st grpc.ServerStreamingServer[walshipv1.SnapshotResponse]) error {
	f.snapshotCalls.Add(1)
	if f.snapshot == nil {
		return f.UnimplementedReplicationServiceServer.Snapshot(req, st)
	}
	return f.snapshot(req, st)
}

// next waits for the replica's next stream.
func (f *fakePrimary) next(t *testing.T) *session {
	t.Helper()
	select {
	case s := <-f.sessions:
		return s
	case <-time.After(10 * time.Second):
		t.Fatal("the replica did not open a replication stream")
		return nil
	}
}

// send sends batches as a primary that made each durable before sending it.
func (s *session) send(t *testing.T, bs ...*walshipv1.WalBatch) {
	t.Helper()
	for _, b := range bs {
		s.sendDurable(t, b.LastLsn, b)
	}
}

// sendDurable sends batches reporting the primary's durable LSN as durable,
// and as its commit watermark (a contract of the primary's fsync alone).
func (s *session) sendDurable(t *testing.T, durable uint64, bs ...*walshipv1.WalBatch) {
	t.Helper()
	for _, b := range bs {
		s.sendOrEnded(t, &walshipv1.StreamResponse{DurableLsn: durable, CommitLsn: durable, Msg: &walshipv1.StreamResponse_Batch{Batch: b}},
			fmt.Sprintf("batch %d..%d", b.FirstLsn, b.LastLsn))
	}
}

// sendOrEnded sends m. A Send that fails because the replica already
// ended the stream (its refusal of an earlier message can come first) is
// not a failure of the send: it is logged, and a test that expected the
// stream to go on fails on what it checks next.
func (s *session) sendOrEnded(t *testing.T, m *walshipv1.StreamResponse, what string) {
	t.Helper()
	if err := s.stream.Send(m); err != nil {
		if s.stream.Context().Err() == nil {
			t.Fatalf("send %s: %v", what, err)
		}
		t.Logf("send %s: the replica had ended the stream: %v", what, err)
	}
}

// heartbeat sends a heartbeat of a primary whose WAL is durable up to last.
func (s *session) heartbeat(t *testing.T, epoch, last uint64, reply bool) {
	t.Helper()
	s.heartbeatDurable(t, epoch, last, last, reply)
}

func (s *session) heartbeatDurable(t *testing.T, epoch, last, durable uint64, reply bool) {
	t.Helper()
	s.sendOrEnded(t, &walshipv1.StreamResponse{DurableLsn: durable, CommitLsn: durable, Msg: &walshipv1.StreamResponse_Heartbeat{Heartbeat: &walshipv1.Heartbeat{
		Epoch: epoch, LastLsn: last, TimeUnixNano: time.Now().UnixNano(), ReplyRequested: reply,
	}}}, "heartbeat")
}

// waitAck returns the first ack with applied >= lsn.
func (s *session) waitAck(t *testing.T, lsn uint64) *walshipv1.ReplicaAck {
	t.Helper()
	deadline := time.After(10 * time.Second)
	for {
		select {
		case a := <-s.acks:
			if a.AppliedLsn >= lsn {
				return a
			}
		case <-deadline:
			t.Fatalf("no ack with applied_lsn >= %d", lsn)
		}
	}
}

// snapshotOf streams v as the primary's Snapshot does, in chunks of 3.
func snapshotOf(v *state.View, epoch uint64) func(*walshipv1.SnapshotRequest, grpc.ServerStreamingServer[walshipv1.SnapshotResponse]) error {
	return snapshotAt(v, epoch, v.AppliedLSN())
}

// snapshotAt is snapshotOf with the header's commit watermark commit.
func snapshotAt(v *state.View, epoch, commit uint64) func(*walshipv1.SnapshotRequest, grpc.ServerStreamingServer[walshipv1.SnapshotResponse]) error {
	return func(_ *walshipv1.SnapshotRequest, st grpc.ServerStreamingServer[walshipv1.SnapshotResponse]) error {
		if err := st.Send(&walshipv1.SnapshotResponse{Part: &walshipv1.SnapshotResponse_Header{Header: &walshipv1.SnapshotHeader{
			Epoch: epoch, Lsn: v.AppliedLSN(), Keys: uint64(v.Len()), CommitLsn: commit,
		}}}); err != nil {
			return err
		}
		if err := inChunks(v, func(kvs []*walshipv1.KeyValue) error {
			return st.Send(&walshipv1.SnapshotResponse{Part: &walshipv1.SnapshotResponse_Chunk{Chunk: &walshipv1.SnapshotChunk{Kvs: kvs}}})
		}); err != nil {
			return err
		}
		return st.Send(&walshipv1.SnapshotResponse{Part: &walshipv1.SnapshotResponse_Trailer{Trailer: &walshipv1.SnapshotTrailer{StateDigest: v.Digest().String()}}})
	}
}

// inChunks passes v's pairs to send in key order, three at a time (so
// that a snapshot of a few keys still spans several messages).
func inChunks(v *state.View, send func([]*walshipv1.KeyValue) error) error {
	var chunk []*walshipv1.KeyValue
	var err error
	flush := func() {
		if len(chunk) > 0 && err == nil {
			err = send(chunk)
			chunk = nil
		}
	}
	v.Scan(nil, nil, 0, func(k, val []byte, ver uint64) bool {
		chunk = append(chunk, &walshipv1.KeyValue{Key: string(k), Value: val, VersionLsn: ver})
		if len(chunk) == 3 {
			flush()
		}
		return err == nil
	})
	flush()
	return err
}

// fakeLogStore is a scripted LogStoreService.
type fakeLogStore struct {
	walshipv1.UnimplementedLogStoreServiceServer
	addr  string
	read  func(*walshipv1.ReadRequest, grpc.ServerStreamingServer[walshipv1.ReadResponse]) error
	reads chan *walshipv1.ReadRequest
	// voteEpoch is the epoch its Status reports; unless a test lowers it,
	// one past every epoch the tests use (it has heard from their primaries).
	voteEpoch atomic.Uint64
	// snap is the base snapshot it holds (nil: none); snapCalls counts
	// GetSnapshot calls.
	mu        sync.Mutex
	snap      *state.View
	snapEpoch uint64
	snapCalls atomic.Int32
	// first and durable are the LSNs its Status says it holds; unless a
	// test sets them, everything (whatever its Read then does).
	first, durable atomic.Uint64
	// votePrimary and voteAddr: the primary its promise names (mu).
	votePrimary, voteAddr string
}

func (f *fakeLogStore) Status(context.Context, *walshipv1.LogStoreServiceStatusRequest) (*walshipv1.LogStoreServiceStatusResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	st := &walshipv1.LogStoreServiceStatusResponse{VoteEpoch: f.voteEpoch.Load(), FirstLsn: f.first.Load(), DurableLsn: f.durable.Load(),
		PrimaryId: f.votePrimary, PrimaryAddr: f.voteAddr}
	if f.snap != nil {
		st.Snapshots = []*walshipv1.SnapshotInfo{{Lsn: f.snap.AppliedLSN(), Epoch: f.snapEpoch, Keys: uint64(f.snap.Len()), StateDigest: f.snap.Digest().String()}}
	}
	return st, nil
}

// GetSnapshot serves the snapshot it holds, in chunks of 3 pairs.
func (f *fakeLogStore) GetSnapshot(req *walshipv1.GetSnapshotRequest, st grpc.ServerStreamingServer[walshipv1.GetSnapshotResponse]) error {
	f.snapCalls.Add(1)
	f.mu.Lock()
	v, epoch := f.snap, f.snapEpoch
	f.mu.Unlock()
	if v == nil {
		return status.Error(codes.NotFound, "no snapshot is stored")
	}
	if at := req.GetAtMostLsn(); at != 0 && at < v.AppliedLSN() {
		return status.Errorf(codes.OutOfRange, "no snapshot at or before LSN %d", at)
	}
	if err := st.Send(&walshipv1.GetSnapshotResponse{Part: &walshipv1.GetSnapshotResponse_Header{Header: &walshipv1.SnapshotHeader{
		Epoch: epoch, Lsn: v.AppliedLSN(), Keys: uint64(v.Len()), CommitLsn: v.AppliedLSN(), History: []*walshipv1.EpochStart{{Epoch: epoch, FirstLsn: 1}}}}}); err != nil {
		return err
	}
	if err := inChunks(v, func(kvs []*walshipv1.KeyValue) error {
		return st.Send(&walshipv1.GetSnapshotResponse{Part: &walshipv1.GetSnapshotResponse_Chunk{Chunk: &walshipv1.SnapshotChunk{Kvs: kvs}}})
	}); err != nil {
		return err
	}
	return st.Send(&walshipv1.GetSnapshotResponse{Part: &walshipv1.GetSnapshotResponse_Trailer{Trailer: &walshipv1.SnapshotTrailer{StateDigest: v.Digest().String()}}})
}

func (f *fakeLogStore) Read(req *walshipv1.ReadRequest, st grpc.ServerStreamingServer[walshipv1.ReadResponse]) error {
	select {
	case f.reads <- req:
	default:
	}
	return f.read(req, st)
}

func listen(t *testing.T, register func(*grpc.Server)) string {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	g := grpc.NewServer()
	register(g)
	done := make(chan struct{})
	go func() { defer close(done); _ = g.Serve(lis) }()
	t.Cleanup(func() { g.Stop(); <-done })
	return lis.Addr().String()
}

func newFakePrimary(t *testing.T) *fakePrimary {
	f := &fakePrimary{sessions: make(chan *session)}
	f.addr = listen(t, func(g *grpc.Server) { walshipv1.RegisterReplicationServiceServer(g, f) })
	return f
}

func newFakeLogStore(t *testing.T, read func(*walshipv1.ReadRequest, grpc.ServerStreamingServer[walshipv1.ReadResponse]) error) *fakeLogStore {
	f := &fakeLogStore{read: read, reads: make(chan *walshipv1.ReadRequest, 16)}
	f.voteEpoch.Store(1 << 20)
	f.first.Store(1)
	f.durable.Store(1 << 62)
	f.addr = listen(t, func(g *grpc.Server) { walshipv1.RegisterLogStoreServiceServer(g, f) })
	return f
}

func testConfig(t *testing.T, dir, primary string) Config {
	cfg := DefaultConfig()
	cfg.Listen = "127.0.0.1:0"
	cfg.MetricsListen = ""
	cfg.DataDir = dir
	cfg.ID = "r1"
	cfg.Primary = primary
	cfg.HeartbeatInterval = 100 * time.Millisecond
	cfg.StopTimeout = 5 * time.Second
	cfg.SegmentBytes = 64 << 10
	return cfg
}

// running is a replica served in-process with real gRPC clients.
type running struct {
	s      *Server
	reg    *prometheus.Registry
	conn   *grpc.ClientConn
	kv     walshipv1.KVServiceClient
	admin  walshipv1.AdminServiceClient
	cancel context.CancelFunc
	done   chan error
}

func start(t *testing.T, cfg Config) *running {
	t.Helper()
	reg := serve.NewRegistry()
	cfg.Registry = reg
	s, err := New(cfg)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	conn, err := grpc.NewClient(s.Addr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	r := &running{s: s, reg: reg, conn: conn, kv: walshipv1.NewKVServiceClient(conn), admin: walshipv1.NewAdminServiceClient(conn), done: make(chan error, 1)}
	// Not serving until Run starts (nothing accepts calls before Run, so
	// this is checked directly).
	if s.Status().Serving {
		t.Fatal("serving before Run")
	}
	h := healthpb.NewHealthClient(conn)
	ctx, cancel := context.WithCancel(context.Background())
	r.cancel = cancel
	go func() { r.done <- s.Run(ctx) }()
	wctx, stopWatch := context.WithCancel(context.Background())
	defer stopWatch() // an open Watch would hold up the graceful stop
	w, err := h.Watch(wctx, &healthpb.HealthCheckRequest{})
	if err != nil {
		t.Fatal(err)
	}
	for {
		m, err := w.Recv()
		if err != nil {
			t.Fatalf("health watch: %v", err)
		}
		if m.Status == healthpb.HealthCheckResponse_SERVING {
			break
		}
	}
	t.Cleanup(func() { r.stop(t) })
	return r
}

// stop stops the replica gracefully and returns Run's error.
func (r *running) stop(t *testing.T) error {
	t.Helper()
	if r.cancel == nil {
		return nil
	}
	r.cancel()
	r.cancel = nil
	defer r.conn.Close()
	select {
	case err := <-r.done:
		return err
	case <-time.After(20 * time.Second):
		t.Fatal("Run did not return after cancel")
		return nil
	}
}

// waitApplied waits until the replica has applied lsn.
func (r *running) waitApplied(t *testing.T, lsn uint64) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if got, err := r.s.visible.Wait(ctx, lsn); err != nil {
		t.Fatalf("applied LSN %d never reached %d", got, lsn)
	}
}

func (r *running) status(t *testing.T) *walshipv1.StatusResponse {
	t.Helper()
	st, err := r.admin.Status(tctx(t), &walshipv1.StatusRequest{})
	if err != nil {
		t.Fatalf("Status: %v", err)
	}
	return st
}

// metric returns the value of the sample of name whose labels include
// labels (a gauge or counter); it fails if there is none.
func (r *running) metric(t *testing.T, name string, labels ...string) float64 {
	t.Helper()
	v, ok := gather(t, r.reg, name, labels...)
	if !ok {
		t.Fatalf("no metric %s%v", name, labels)
	}
	return v
}

func gather(t *testing.T, reg *prometheus.Registry, name string, labels ...string) (float64, bool) {
	t.Helper()
	fams, err := reg.Gather()
	if err != nil {
		t.Fatalf("gather: %v", err)
	}
	for _, f := range fams {
		if f.GetName() != name {
			continue
		}
	next:
		for _, m := range f.GetMetric() {
			for i := 0; i+1 < len(labels); i += 2 {
				found := false
				for _, lp := range m.GetLabel() {
					if lp.GetName() == labels[i] && lp.GetValue() == labels[i+1] {
						found = true
					}
				}
				if !found {
					continue next
				}
			}
			switch {
			case m.GetGauge() != nil:
				return m.GetGauge().GetValue(), true
			case m.GetCounter() != nil:
				return m.GetCounter().GetValue(), true
			}
		}
	}
	return 0, false
}

func tctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	return c
}

// op is one write of a test transaction: a put, or a delete when del.
type op struct {
	key, value string
	del        bool
}

func put(k, v string) op { return op{key: k, value: v} }
func del(k string) op    { return op{key: k, del: true} }

// model builds envelopes the way the primary does (MsgPack payload,
// CRC-32C, deterministic envelope) and applies them to a reference store.
type model struct {
	t     *testing.T
	epoch uint64
	next  uint64
	ref   *state.Store
}

func newModel(t *testing.T) *model { return &model{t: t, epoch: 1, next: 1, ref: state.New()} }

// txn builds one batch holding one transaction and applies it to the
// reference store.
func (m *model) txn(ops ...op) *walshipv1.WalBatch {
	m.t.Helper()
	b := m.build(m.next, ops...)
	m.apply(b)
	m.next = b.LastLsn + 1
	return b
}

// build returns the batch of one transaction starting at first, without
// applying it.
func (m *model) build(first uint64, ops ...op) *walshipv1.WalBatch {
	m.t.Helper()
	var b codec.Batch
	lsn := first
	commit := first + uint64(len(ops))
	for _, o := range ops {
		r := codec.Record{LSN: lsn, TxnID: commit, Op: codec.OpPut, Key: []byte(o.key), Value: []byte(o.value)}
		if o.del {
			r.Op, r.Value = codec.OpDelete, nil
		}
		b.Records = append(b.Records, r)
		lsn++
	}
	b.Records = append(b.Records, codec.Record{LSN: commit, TxnID: commit, Op: codec.OpCommit})
	payload, err := codec.MsgPack.AppendBatch(nil, &b)
	if err != nil {
		m.t.Fatal(err)
	}
	return &walshipv1.WalBatch{
		Epoch: m.epoch, FirstLsn: first, LastLsn: commit, PrevLsn: first - 1,
		CommitTimeUnixNano: time.Now().UnixNano(), Codec: walshipv1.Codec_CODEC_MSGPACK,
		Payload: payload, Crc32C: codec.Checksum(payload),
	}
}

func (m *model) apply(env *walshipv1.WalBatch) {
	m.t.Helper()
	var b codec.Batch
	if err := codec.MsgPack.DecodeBatch(env.Payload, &b); err != nil {
		m.t.Fatal(err)
	}
	if err := m.ref.Apply(&b); err != nil {
		m.t.Fatal(err)
	}
}

func (m *model) digest() string { return m.ref.Digest().String() }

func keyN(i int) string { return fmt.Sprintf("key-%05d", i) }
