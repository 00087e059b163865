package changefeed

import (
	"context"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	walshipv1 "github.com/walship/walship/gen/walship/v1"
	"github.com/walship/walship/internal/envelope"
	"github.com/walship/walship/internal/state"
	"github.com/walship/walship/internal/testkit"
	"github.com/walship/walship/internal/vfs"
	"github.com/walship/walship/internal/wal"
	"github.com/walship/walship/pkg/codec"
	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// node is what a data node holds for watches: state, WAL, feed.
type node struct {
	st   *state.Store
	log  *wal.Log
	feed *Feed
	lsn  uint64
	kv   walshipv1.KVServiceClient
	m    *Metrics
	addr string // the gRPC server's
}

type watchServer struct {
	walshipv1.UnimplementedKVServiceServer
	src Source
}

func (w *watchServer) Watch(req *walshipv1.WatchRequest, stream walshipv1.KVService_WatchServer) error {
	return Serve(w.src, req, stream)
}

// newNode starts a gRPC server whose KVService.Watch serves the node's
// feed; maxBytes bounds the ring.
func newNode(t testing.TB, maxBytes int, stall time.Duration) *node {
	t.Helper()
	return newNodeWith(t, maxBytes, stall)
}

// newNodeWith is newNode with more server options.
func newNodeWith(t testing.TB, maxBytes int, stall time.Duration, sopts ...grpc.ServerOption) *node {
	t.Helper()
	log, err := wal.Open(wal.Options{Dir: "wal", FS: vfs.NewMem(), SegmentSize: 4096})
	if err != nil {
		t.Fatal(err)
	}
	n := &node{st: state.New(), log: log, feed: New(0, maxBytes, 0)}
	n.m = NewMetrics(n.feed)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	g := grpc.NewServer(append([]grpc.ServerOption{grpc.InitialWindowSize(64 << 10), grpc.InitialConnWindowSize(64 << 10)}, sopts...)...)
	walshipv1.RegisterKVServiceServer(g, &watchServer{src: Source{Feed: n.feed, WAL: log, Stall: stall, Metrics: n.m}})
	go func() { _ = g.Serve(lis) }()
	conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithInitialWindowSize(64<<10), grpc.WithInitialConnWindowSize(64<<10))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = conn.Close()
		g.Stop()
		_ = log.Close()
	})
	n.kv = walshipv1.NewKVServiceClient(conn)
	n.addr = lis.Addr().String()
	return n
}

// commit applies one transaction of puts (value "" = delete) as the node
// would: WAL, state (with the previous values), feed; it returns its
// commit LSN. The bound is not moved.
func (n *node) commit(t testing.TB, kvs ...string) uint64 {
	t.Helper()
	return n.commitBatch(t, kvs)[0]
}

// commitBatch is commit of several transactions in one batch (one apply,
// one WAL entry), as a primary resolves them together or a replica
// receives them; it returns their commit LSNs.
func (n *node) commitBatch(t testing.TB, txns ...[]string) []uint64 {
	t.Helper()
	var b codec.Batch
	var lsns []uint64
	for _, kvs := range txns {
		start := len(b.Records)
		for i := 0; i+1 < len(kvs); i += 2 {
			n.lsn++
			r := codec.Record{LSN: n.lsn, TxnID: n.lsn, Op: codec.OpPut, Key: []byte(kvs[i]), Value: []byte(kvs[i+1])}
			if kvs[i+1] == "" {
				r.Op, r.Value = codec.OpDelete, nil
			}
			b.Records = append(b.Records, r)
		}
		n.lsn++
		for i := start; i < len(b.Records); i++ {
			b.Records[i].TxnID = n.lsn
		}
		b.Records = append(b.Records, codec.Record{LSN: n.lsn, TxnID: n.lsn, Op: codec.OpCommit})
		lsns = append(lsns, n.lsn)
	}
	payload, err := codec.MsgPack.AppendBatch(nil, &b)
	if err != nil {
		t.Fatal(err)
	}
	env := &walshipv1.WalBatch{Epoch: 1, FirstLsn: b.FirstLSN(), LastLsn: b.LastLSN(), PrevLsn: b.FirstLSN() - 1,
		CommitTimeUnixNano: int64(n.lsn) * 1000, Codec: walshipv1.Codec(codec.MsgPack.ID()), Payload: payload, Crc32C: codec.Checksum(payload)}
	data, err := envelope.Marshal(env)
	if err != nil {
		t.Fatal(err)
	}
	if err := n.log.Append(wal.Entry{FirstLSN: env.FirstLsn, LastLSN: env.LastLsn, Data: data}); err != nil {
		t.Fatal(err)
	}
	changes, err := n.st.ApplyChanges(&b, nil)
	if err != nil {
		t.Fatal(err)
	}
	n.feed.Append(FromChanges(nil, b.Records, changes, func(uint64) int64 { return env.CommitTimeUnixNano }))
	return lsns
}

// received holds, per stream, transactions received and not yet taken.
var received = map[walshipv1.KVService_WatchClient][]*walshipv1.WatchTxn{}

// recvTxn returns the stream's next transaction, skipping progress.
func recvTxn(t *testing.T, s walshipv1.KVService_WatchClient) *walshipv1.WatchTxn {
	t.Helper()
	for len(received[s]) == 0 {
		m, err := s.Recv()
		if err != nil {
			t.Fatalf("Recv: %v", err)
		}
		received[s] = m.GetTxns().GetTxns()
	}
	x := received[s][0]
	received[s] = received[s][1:]
	return x
}

func events(x *walshipv1.WatchTxn) string {
	var b strings.Builder
	for _, e := range x.Events {
		fmt.Fprintf(&b, "%s=%s", e.Key, e.Value)
		if e.PrevFound {
			fmt.Fprintf(&b, "(was %s@%d)", e.PrevValue, e.PrevVersionLsn)
		}
		b.WriteString(" ")
	}
	return strings.TrimSpace(b.String())
}

func TestWatchBoundOrderBoundariesAndPrev(t *testing.T) {
	n := newNode(t, 0, 0)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	l1 := n.commit(t, "a/1", "x", "b/1", "y")
	l2 := n.commit(t, "a/1", "x2", "a/2", "z", "a/1", "x3")
	l3 := n.commit(t, "a/2", "")
	n.feed.Bound.Advance(l2) // l3 is applied but not acknowledged yet
	s, err := n.kv.Watch(ctx, &walshipv1.WatchRequest{Prefix: "a/", StartLsn: 1, PrevValues: true})
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []struct {
		lsn uint64
		ev  string
	}{{l1, "a/1=x"}, {l2, "a/1=x2(was x@" + fmt.Sprint(l1) + ") a/2=z a/1=x3(was x2@" + fmt.Sprint(l2) + ")"}} {
		x := recvTxn(t, s)
		if x.Lsn != want.lsn || events(x) != want.ev || x.CommitTimeUnixNano != int64(want.lsn)*1000 {
			t.Fatalf("txn %d: %s at %d, want %d: %s", x.Lsn, events(x), x.CommitTimeUnixNano, want.lsn, want.ev)
		}
	}
	// Nothing past the bound: the next message is a progress notification
	// at l2, not l3.
	m, err := s.Recv()
	if err != nil || m.GetProgress().GetLsn() != l2 {
		t.Fatalf("after the bound: %v, %v; want progress at %d", m, err, l2)
	}
	n.feed.Bound.Advance(l3)
	if x := recvTxn(t, s); x.Lsn != l3 || len(x.Events) != 1 || x.Events[0].Type != walshipv1.WatchEventType_WATCH_EVENT_TYPE_DELETE {
		t.Fatalf("after the bound moved: %v", x)
	}
}

// A key that did not exist just before a write has no previous version
// (prev_version_lsn 0, as the API says), also when a delete earlier in
// the same batch, or in the same transaction, removed it.
func TestWatchPrevOfDeletedKeyInOneBatch(t *testing.T) {
	n := newNode(t, 0, 0)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	l := n.commitBatch(t, []string{"k", "v1"}, []string{"k", ""}, []string{"k", "v2"}, []string{"k", "", "k", "v3"})
	n.feed.Bound.Advance(l[3])
	s, err := n.kv.Watch(ctx, &walshipv1.WatchRequest{Key: "k", StartLsn: 1, PrevValues: true})
	if err != nil {
		t.Fatal(err)
	}
	type prev struct {
		found   bool
		value   string
		version uint64
	}
	want := [][]prev{{{}}, {{true, "v1", l[0]}}, {{}}, {{true, "v2", l[2]}, {}}}
	for i, w := range want {
		x := recvTxn(t, s)
		var got []prev
		for _, e := range x.Events {
			got = append(got, prev{e.PrevFound, string(e.PrevValue), e.PrevVersionLsn})
		}
		if x.Lsn != l[i] || fmt.Sprint(got) != fmt.Sprint(w) {
			t.Fatalf("txn %d at %d: previous values %v, want %v", x.Lsn, l[i], got, w)
		}
	}
}

func TestWatchFromWALAndNow(t *testing.T) {
	// A ring of ~one transaction: older positions come from the WAL.
	n := newNode(t, 1, 0)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var lsns []uint64
	for i := range 20 {
		lsns = append(lsns, n.commit(t, fmt.Sprintf("k%02d", i), "v"))
	}
	n.feed.Bound.Advance(lsns[19])
	if n.feed.From() <= lsns[10] {
		t.Fatalf("ring From = %d: it should have dropped old transactions", n.feed.From())
	}
	s, err := n.kv.Watch(ctx, &walshipv1.WatchRequest{StartLsn: lsns[3]})
	if err != nil {
		t.Fatal(err)
	}
	for i := 3; i < 20; i++ {
		if x := recvTxn(t, s); x.Lsn != lsns[i] || events(x) != fmt.Sprintf("k%02d=v", i) {
			t.Fatalf("txn %d: %v", i, x)
		}
	}
	// From now: only what commits after the stream starts.
	now, err := n.kv.Watch(ctx, &walshipv1.WatchRequest{Key: "k99", ProgressInterval: durationpb.New(10 * time.Millisecond)})
	if err != nil {
		t.Fatal(err)
	}
	if m, err := now.Recv(); err != nil || m.GetProgress().GetLsn() != lsns[19] {
		t.Fatalf("first message from now: %v, %v", m, err)
	}
	l := n.commit(t, "k99", "new")
	n.feed.Bound.Advance(l)
	if x := recvTxn(t, now); x.Lsn != l {
		t.Fatalf("from now: %v", x)
	}
}

func TestWatchRefusals(t *testing.T) {
	n := newNode(t, 1, 0)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for range 10 {
		n.commit(t, "k", strings.Repeat("v", 1500)) // several segments
	}
	n.feed.Bound.Advance(n.lsn)
	if _, err := n.log.TruncateBefore(n.lsn - 3); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		req  *walshipv1.WatchRequest
		code codes.Code
		msg  string
	}{
		{"key and prefix", &walshipv1.WatchRequest{Key: "k", Prefix: "k"}, codes.InvalidArgument, "key, prefix"},
		{"reserved prefix", &walshipv1.WatchRequest{Prefix: "\x00w"}, codes.InvalidArgument, "prefix"},
		{"bad key", &walshipv1.WatchRequest{Key: strings.Repeat("k", 5000)}, codes.InvalidArgument, "key"},
		{"bad progress", &walshipv1.WatchRequest{ProgressInterval: durationpb.New(time.Hour)}, codes.InvalidArgument, "progress_interval"},
		{"progress too short", &walshipv1.WatchRequest{ProgressInterval: durationpb.New(time.Millisecond)}, codes.InvalidArgument, "progress_interval"},
		{"malformed progress", &walshipv1.WatchRequest{ProgressInterval: &durationpb.Duration{Seconds: 1, Nanos: -5}}, codes.InvalidArgument, "progress_interval"},
		{"bad wait", &walshipv1.WatchRequest{WaitTimeout: durationpb.New(time.Hour)}, codes.InvalidArgument, "wait_timeout"},
		{"negative wait", &walshipv1.WatchRequest{WaitTimeout: durationpb.New(-time.Second)}, codes.InvalidArgument, "wait_timeout"},
		{"future", &walshipv1.WatchRequest{StartLsn: n.lsn + 5, WaitTimeout: durationpb.New(20 * time.Millisecond)}, codes.OutOfRange, "in the future"},
		{"prev too old", &walshipv1.WatchRequest{StartLsn: 1, PrevValues: true}, codes.OutOfRange, fmt.Sprintf("oldest LSN it serves with prev_values is %d", n.feed.From())},
		{"below retention", &walshipv1.WatchRequest{StartLsn: 1}, codes.OutOfRange, fmt.Sprintf("the oldest LSN this node serves is %d", n.log.FirstLSN())},
	} {
		s, err := n.kv.Watch(ctx, tc.req)
		if err == nil {
			_, err = s.Recv()
		}
		if status.Code(err) != tc.code || !strings.Contains(status.Convert(err).Message(), tc.msg) {
			t.Errorf("%s: %v; want %v naming %q", tc.name, err, tc.code, tc.msg)
		}
	}
}

// A watch "from now" on a node whose commit watermark has not reached
// the state it started from (nothing it holds is readable yet) is
// UNAVAILABLE once its wait_timeout passes, naming the watermark and the
// LSN it waits for.
func TestWatchNowBeforeReadable(t *testing.T) {
	n := newNode(t, 0, 0)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	n.commit(t, "k", "v")
	n.feed.Reset(n.lsn) // the node restarted at n.lsn; the watermark is still 0
	s, err := n.kv.Watch(ctx, &walshipv1.WatchRequest{WaitTimeout: durationpb.New(20 * time.Millisecond)})
	if err == nil {
		_, err = s.Recv()
	}
	want := fmt.Sprintf("the commit watermark (0) has not reached LSN %d", n.lsn)
	if status.Code(err) != codes.Unavailable || !strings.Contains(status.Convert(err).Message(), want) {
		t.Fatalf("watch from now: %v; want UNAVAILABLE naming %q", err, want)
	}
}

// A watcher that never reads is cut off once a Send has been blocked for
// the stall bound; the feed holds nothing for it meanwhile.
func TestWatchNonReaderCutOff(t *testing.T) {
	n := newNode(t, 0, 200*time.Millisecond)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	s, err := n.kv.Watch(ctx, &walshipv1.WatchRequest{StartLsn: 1})
	if err != nil {
		t.Fatal(err)
	}
	big := strings.Repeat("v", 32<<10)
	for range 64 { // 2 MiB: far more than the windows
		n.commit(t, "k", big)
	}
	n.feed.Bound.Advance(n.lsn)
	// Read nothing until the server gave up, then drain what was
	// buffered: the stream ends with the cut-off.
	testkit.Until(t, "the watcher to be cut off", func() bool {
		return testutil.ToFloat64(n.m.cutoffs.WithLabelValues(CutStalled)) == 1
	})
	var got error
	for got == nil {
		_, got = s.Recv()
	}
	if status.Code(got) != codes.ResourceExhausted || !strings.Contains(got.Error(), "did not read") {
		t.Fatalf("non-reader: %v; want RESOURCE_EXHAUSTED", got)
	}
}
