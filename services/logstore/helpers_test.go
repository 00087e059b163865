package logstore

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	walshipv1 "github.com/walship/walship/gen/walship/v1"
	"github.com/walship/walship/pkg/codec"
	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// baseTime is the commit time of test batches unless a test chooses one.
var baseTime = time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)

func testConfig(t testing.TB, dir string) Config {
	t.Helper()
	cfg := DefaultConfig()
	cfg.Listen = "127.0.0.1:0"
	cfg.MetricsListen = ""
	cfg.DataDir = dir
	cfg.RetentionBytes = 0
	cfg.FlushDelay = 0 // tests count rounds and fsyncs exactly
	cfg.StopTimeout = 5 * time.Second
	cfg.Registry = prometheus.NewRegistry()
	return cfg
}

// running is a log store served in-process on loopback with real gRPC clients.
type running struct {
	t      testing.TB
	s      *Server
	cfg    Config
	conn   *grpc.ClientConn
	ls     walshipv1.LogStoreServiceClient
	admin  walshipv1.AdminServiceClient
	cancel context.CancelFunc
	done   chan error
	err    error
	ended  bool
}

// start serves a log store; opts change the Server before it runs.
func start(t testing.TB, cfg Config, opts ...func(*Server)) *running {
	t.Helper()
	s, err := New(cfg)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	for _, o := range opts {
		o(s)
	}
	ctx, cancel := context.WithCancel(context.Background())
	r := &running{t: t, s: s, cfg: cfg, cancel: cancel, done: make(chan error, 1)}
	go func() { r.done <- s.Run(ctx) }()
	conn, err := grpc.NewClient(s.Addr(), grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(64<<20), grpc.MaxCallSendMsgSize(64<<20)))
	if err != nil {
		t.Fatal(err)
	}
	r.conn = conn
	r.ls = walshipv1.NewLogStoreServiceClient(conn)
	r.admin = walshipv1.NewAdminServiceClient(conn)
	t.Cleanup(func() { r.stop() })
	return r
}

// stop cancels Run and returns its error (once; later calls return the same).
func (r *running) stop() error {
	if r.ended {
		return r.err
	}
	r.ended = true
	r.cancel()
	select {
	case r.err = <-r.done:
	case <-time.After(20 * time.Second):
		r.t.Errorf("Run did not return within 20s of cancel")
	}
	r.conn.Close()
	return r.err
}

// wait returns Run's error once it returns by itself (a fatal failure).
func (r *running) wait() error {
	r.t.Helper()
	select {
	case r.err = <-r.done:
	case <-time.After(20 * time.Second):
		r.t.Fatalf("Run did not return")
	}
	r.ended = true
	r.cancel()
	r.conn.Close()
	return r.err
}

// batch builds a real envelope: txns whole transactions (a put and a
// commit each, so 2 LSNs per transaction) from LSN first, encoded once with
// MessagePack.
func batch(t testing.TB, epoch, first uint64, txns, valueBytes int) *walshipv1.WalBatch {
	t.Helper()
	return batchAt(t, epoch, first, txns, valueBytes, baseTime)
}

func batchAt(t testing.TB, epoch, first uint64, txns, valueBytes int, at time.Time) *walshipv1.WalBatch {
	t.Helper()
	var b codec.Batch
	lsn := first
	for i := 0; i < txns; i++ {
		v := []byte(strings.Repeat(fmt.Sprint(lsn%10), valueBytes))
		b.Records = append(b.Records,
			codec.Record{LSN: lsn, TxnID: lsn, Op: codec.OpPut, Key: []byte(fmt.Sprintf("key-%d", lsn)), Value: v},
			codec.Record{LSN: lsn + 1, TxnID: lsn, Op: codec.OpCommit})
		lsn += 2
	}
	payload, err := codec.MsgPack.AppendBatch(nil, &b)
	if err != nil {
		t.Fatal(err)
	}
	return &walshipv1.WalBatch{
		Epoch:              epoch,
		FirstLsn:           first,
		LastLsn:            lsn - 1,
		PrevLsn:            first - 1,
		CommitTimeUnixNano: at.UnixNano(),
		Codec:              walshipv1.Codec_CODEC_MSGPACK,
		Payload:            payload,
		Crc32C:             codec.Checksum(payload),
	}
}

// chain builds n consecutive batches of one transaction each from LSN first.
func chain(t testing.TB, epoch, first uint64, n, valueBytes int) []*walshipv1.WalBatch {
	var out []*walshipv1.WalBatch
	for i := 0; i < n; i++ {
		b := batch(t, epoch, first, 1, valueBytes)
		out = append(out, b)
		first = b.LastLsn + 1
	}
	return out
}

// appender is a client Append stream.
type appender struct {
	t      testing.TB
	stream walshipv1.LogStoreService_AppendClient
	cancel context.CancelFunc
	// declared: a heartbeat stated the sender's epoch, as the first
	// message of a stream must (send declares the batch's otherwise).
	declared bool
}

func (r *running) append(t testing.TB) *appender {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	stream, err := r.ls.Append(ctx)
	if err != nil {
		cancel()
		t.Fatalf("Append: %v", err)
	}
	a := &appender{t: t, stream: stream, cancel: cancel}
	t.Cleanup(cancel)
	return a
}

// send sends bs; on a stream that has not declared its epoch yet the first
// carries a heartbeat declaring its own, as a primary's first message does.
func (a *appender) send(bs ...*walshipv1.WalBatch) {
	a.t.Helper()
	for _, b := range bs {
		req := &walshipv1.AppendRequest{Batch: b}
		if !a.declared {
			req.Heartbeat, a.declared = &walshipv1.Heartbeat{Epoch: b.Epoch}, true
		}
		a.sendOrEnded(req, fmt.Sprintf("batch %d..%d", b.FirstLsn, b.LastLsn))
	}
}

func (a *appender) heartbeat(epoch uint64) {
	a.t.Helper()
	a.declared = true
	a.sendOrEnded(&walshipv1.AppendRequest{Heartbeat: &walshipv1.Heartbeat{Epoch: epoch, TimeUnixNano: time.Now().UnixNano(), ReplyRequested: true}}, "heartbeat")
}

// sendOrEnded sends m. io.EOF means the log store already ended the
// stream (a refusal of an earlier message can arrive before this Send):
// not a failure of the send, the stream's status says why (failure), and
// a test that expected the stream to go on fails on what it checks next.
func (a *appender) sendOrEnded(m *walshipv1.AppendRequest, what string) {
	a.t.Helper()
	if err := a.stream.Send(m); err != nil && !errors.Is(err, io.EOF) {
		a.t.Fatalf("Send %s: %v", what, err)
	}
}

// ack receives the next ack.
func (a *appender) ack() *walshipv1.AppendResponse {
	a.t.Helper()
	resp, err := a.stream.Recv()
	if err != nil {
		a.t.Fatalf("Recv ack: %v", err)
	}
	return resp
}

// logAck receives acks until one speaks of the log, for a test that
// expects a durable LSN above 0: a heartbeat echoed at once (echo.go)
// may come first, alone, with durable_lsn 0.
func (a *appender) logAck() *walshipv1.AppendResponse {
	a.t.Helper()
	for {
		if resp := a.ack(); resp.DurableLsn != 0 {
			return resp
		}
	}
}

// echoOf receives acks until the one that echoes the heartbeat sent at
// t: the heartbeat before it may have been answered twice, at once and by
// the writer.
func (a *appender) echoOf(t int64) *walshipv1.AppendResponse {
	a.t.Helper()
	for {
		if resp := a.ack(); resp.HeartbeatTimeUnixNano >= t {
			return resp
		}
	}
}

// waitDurable receives acks until one reports lsn durable.
func (a *appender) waitDurable(lsn uint64) *walshipv1.AppendResponse {
	a.t.Helper()
	for {
		resp := a.ack()
		if resp.DurableLsn >= lsn {
			return resp
		}
	}
}

// failure receives acks until the stream fails and returns its error.
func (a *appender) failure() error {
	a.t.Helper()
	for {
		_, err := a.stream.Recv()
		if err != nil {
			if errors.Is(err, io.EOF) {
				a.t.Fatalf("stream ended without an error")
			}
			return err
		}
	}
}

// appendAll appends bs on a new stream and waits for their durable ack.
func (r *running) appendAll(t testing.TB, bs ...*walshipv1.WalBatch) *walshipv1.AppendResponse {
	t.Helper()
	a := r.append(t)
	// The sender is a primary of the newest epoch among them: it may ship
	// the batches of earlier epochs too.
	epoch := uint64(0)
	for _, b := range bs {
		epoch = max(epoch, b.Epoch)
	}
	// It states the log store's cluster, as a primary of that cluster does
	// (none if the log store has none yet).
	a.sendOrEnded(&walshipv1.AppendRequest{Heartbeat: &walshipv1.Heartbeat{Epoch: epoch, ClusterId: r.status(t).GetClusterId()}}, "heartbeat")
	a.declared = true
	a.send(bs...)
	resp := a.waitDurable(bs[len(bs)-1].LastLsn)
	if err := a.stream.CloseSend(); err != nil {
		t.Fatal(err)
	}
	if _, err := a.stream.Recv(); !errors.Is(err, io.EOF) {
		t.Fatalf("after CloseSend: got %v, want EOF", err)
	}
	return resp
}

// readAll runs a Read and returns what it sent and how it ended.
func (r *running) readAll(t testing.TB, req *walshipv1.ReadRequest) ([]*walshipv1.WalBatch, error) {
	t.Helper()
	stream, err := r.ls.Read(t.Context(), req)
	if err != nil {
		t.Fatal(err)
	}
	var got []*walshipv1.WalBatch
	for {
		resp, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			return got, nil
		}
		if err != nil {
			return got, err
		}
		got = append(got, resp.Batch)
	}
}

func sameBatches(t testing.TB, got, want []*walshipv1.WalBatch) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("got %d batches %s, want %d %s", len(got), ranges(got), len(want), ranges(want))
	}
	for i := range got {
		if !proto.Equal(got[i], want[i]) {
			t.Fatalf("batch %d: got %d..%d, want %d..%d (or contents differ)", i, got[i].FirstLsn, got[i].LastLsn, want[i].FirstLsn, want[i].LastLsn)
		}
	}
}

func ranges(bs []*walshipv1.WalBatch) string {
	var s []string
	for _, b := range bs {
		s = append(s, fmt.Sprintf("%d..%d", b.FirstLsn, b.LastLsn))
	}
	return "[" + strings.Join(s, " ") + "]"
}

// wantCode checks err's gRPC code and that its message holds every substring.
func wantCode(t testing.TB, err error, code codes.Code, subs ...string) {
	t.Helper()
	if err == nil {
		t.Fatalf("got no error, want %v %q", code, subs)
	}
	st, _ := status.FromError(err)
	if st.Code() != code {
		t.Fatalf("got %v (%q), want %v", st.Code(), st.Message(), code)
	}
	for _, s := range subs {
		if !strings.Contains(st.Message(), s) {
			t.Fatalf("message %q does not mention %q", st.Message(), s)
		}
	}
}

func (r *running) status(t testing.TB) *walshipv1.LogStoreServiceStatusResponse {
	t.Helper()
	st, err := r.ls.Status(t.Context(), &walshipv1.LogStoreServiceStatusRequest{})
	if err != nil {
		t.Fatal(err)
	}
	return st
}
