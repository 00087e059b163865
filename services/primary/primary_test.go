package primary

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	walshipv1 "github.com/walship/walship/gen/walship/v1"
	"github.com/walship/walship/internal/recovery"
	"github.com/walship/walship/internal/serve"
	"github.com/walship/walship/internal/state"
	"github.com/walship/walship/internal/vfs"
	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/types/known/durationpb"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// running is a primary served in-process on loopback with real gRPC clients.
type running struct {
	s      *Server
	conn   *grpc.ClientConn
	kv     walshipv1.KVServiceClient
	admin  walshipv1.AdminServiceClient
	cancel context.CancelFunc
	done   chan error
}

func testConfig(t *testing.T, dir string) Config {
	cfg := DefaultConfig()
	cfg.Listen = "127.0.0.1:0"
	cfg.DataDir = dir
	cfg.StopTimeout = 5 * time.Second
	return cfg
}

func start(t *testing.T, cfg Config) *running {
	t.Helper()
	s, err := New(cfg)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	r := &running{s: s, cancel: cancel, done: make(chan error, 1)}
	go func() { r.done <- s.Run(ctx) }()
	conn, err := grpc.NewClient(s.Addr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	r.conn = conn
	r.kv = walshipv1.NewKVServiceClient(conn)
	r.admin = walshipv1.NewAdminServiceClient(conn)
	waitServing(t, conn)
	t.Cleanup(func() { r.stop(t) })
	return r
}

func waitServing(t *testing.T, conn *grpc.ClientConn) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	h := healthpb.NewHealthClient(conn)
	for {
		resp, err := h.Check(ctx, &healthpb.HealthCheckRequest{}, grpc.WaitForReady(true))
		if err == nil && resp.Status == healthpb.HealthCheckResponse_SERVING {
			return
		}
		if ctx.Err() != nil {
			t.Fatalf("primary never became SERVING: %v", err)
		}
		// Health changes are pushed by Watch; one Watch call waits for the next.
		w, werr := h.Watch(ctx, &healthpb.HealthCheckRequest{})
		if werr == nil {
			for {
				m, err := w.Recv()
				if err != nil || m.Status == healthpb.HealthCheckResponse_SERVING {
					break
				}
			}
		}
	}
}

// stop stops the primary gracefully and returns Run's error.
func (r *running) stop(t *testing.T) error {
	t.Helper()
	if r.cancel == nil {
		return nil
	}
	r.cancel()
	r.cancel = nil
	r.conn.Close()
	select {
	case err := <-r.done:
		return err
	case <-time.After(30 * time.Second):
		t.Fatal("Run did not return after cancel")
		return nil
	}
}

// failed waits for Run to return on its own, the primary having failed
// (what says how), and returns Run's error.
func (r *running) failed(t *testing.T, what string) error {
	t.Helper()
	select {
	case err := <-r.done:
		r.cancel = nil
		r.conn.Close()
		return err
	case <-time.After(20 * time.Second):
		t.Fatalf("Run did not return after %s", what)
		return nil
	}
}

// txnGet and txnPut are Txn ops on key.
func txnGet(key string) *walshipv1.TxnOp {
	return &walshipv1.TxnOp{Op: &walshipv1.TxnOp_Get{Get: &walshipv1.GetOp{Key: key}}}
}

func txnPut(key string, value []byte) *walshipv1.TxnOp {
	return &walshipv1.TxnOp{Op: &walshipv1.TxnOp_Put{Put: &walshipv1.PutOp{Key: key, Value: value}}}
}

func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	t.Cleanup(cancel)
	return c
}

func TestPutGetDeleteScan(t *testing.T) {
	r := start(t, testConfig(t, t.TempDir()))
	c := ctx(t)
	put, err := r.kv.Put(c, &walshipv1.PutRequest{Key: "a", Value: []byte("1")})
	if err != nil {
		t.Fatal(err)
	}
	get, err := r.kv.Get(c, &walshipv1.GetRequest{Key: "a", MinLsn: put.Lsn})
	if err != nil {
		t.Fatal(err)
	}
	if !get.Found || string(get.Value) != "1" || get.VersionLsn != put.Lsn || get.AppliedLsn < put.Lsn {
		t.Fatalf("Get after Put(lsn %d) = %v", put.Lsn, get)
	}
	for _, k := range []string{"b", "c", "d"} {
		if _, err := r.kv.Put(c, &walshipv1.PutRequest{Key: k, Value: []byte(k)}); err != nil {
			t.Fatal(err)
		}
	}
	del, err := r.kv.Delete(c, &walshipv1.DeleteRequest{Key: "b"})
	if err != nil || !del.Existed {
		t.Fatalf("Delete b = %v, %v; want existed", del, err)
	}
	del2, err := r.kv.Delete(c, &walshipv1.DeleteRequest{Key: "b"})
	if err != nil || del2.Existed || del2.Lsn <= del.Lsn {
		t.Fatalf("second Delete b = %v, %v; want !existed and a later LSN", del2, err)
	}
	scan, err := r.kv.Scan(c, &walshipv1.ScanRequest{Start: "a", End: "d"})
	if err != nil {
		t.Fatal(err)
	}
	var keys []string
	for _, kv := range scan.Kvs {
		keys = append(keys, kv.Key)
	}
	if strings.Join(keys, ",") != "a,c" || scan.More {
		t.Fatalf("Scan [a,d) = %v more=%v; want a,c", keys, scan.More)
	}
	lim, err := r.kv.Scan(c, &walshipv1.ScanRequest{Limit: 2})
	if err != nil || len(lim.Kvs) != 2 || !lim.More {
		t.Fatalf("Scan limit 2 = %v, %v; want 2 pairs and more", lim, err)
	}
	got, err := r.kv.Get(c, &walshipv1.GetRequest{Key: "b"})
	if err != nil || got.Found {
		t.Fatalf("Get deleted key = %v, %v", got, err)
	}
}

// TestTxnReadsItsOwnWrites: each op of a Txn reads the writes of the ops
// before it, a delete included, and the last op's write, kept for no later
// op, is still committed.
func TestTxnReadsItsOwnWrites(t *testing.T) {
	r := start(t, testConfig(t, t.TempDir()))
	c := ctx(t)
	if _, err := r.kv.Put(c, &walshipv1.PutRequest{Key: "old", Value: []byte("o")}); err != nil {
		t.Fatal(err)
	}
	put := func(k, v string) *walshipv1.TxnOp {
		return &walshipv1.TxnOp{Op: &walshipv1.TxnOp_Put{Put: &walshipv1.PutOp{Key: k, Value: []byte(v)}}}
	}
	del := func(k string) *walshipv1.TxnOp {
		return &walshipv1.TxnOp{Op: &walshipv1.TxnOp_Delete{Delete: &walshipv1.DeleteOp{Key: k}}}
	}
	get := func(k string) *walshipv1.TxnOp {
		return &walshipv1.TxnOp{Op: &walshipv1.TxnOp_Get{Get: &walshipv1.GetOp{Key: k}}}
	}
	resp, err := r.kv.Txn(c, &walshipv1.TxnRequest{Success: []*walshipv1.TxnOp{
		put("a", "1"), del("a"), get("a"), // 0-2: a written, then deleted
		del("old"), get("old"), // 3-4: a stored key deleted
		put("b", "2"), get("b"), put("b", "3"), // 5-7: b written twice, the last by the last op
	}})
	if err != nil {
		t.Fatal(err)
	}
	res := resp.GetResults()
	if len(res) != 8 {
		t.Fatalf("Txn results = %v, want 8", res)
	}
	if !res[1].GetDelete().GetExisted() {
		t.Errorf("delete after put in the txn: existed = false, want true")
	}
	if res[2].GetGet().GetFound() {
		t.Errorf("get after delete in the txn = %v, want not found", res[2].GetGet())
	}
	if !res[3].GetDelete().GetExisted() || res[4].GetGet().GetFound() {
		t.Errorf("delete then get of a stored key = %v, %v; want existed, then not found", res[3], res[4])
	}
	if g := res[6].GetGet(); !g.GetFound() || string(g.GetValue()) != "2" || g.GetVersionLsn() != resp.GetLsn() {
		t.Errorf("get after put in the txn = %v, want 2 at LSN %d", g, resp.GetLsn())
	}
	for k, want := range map[string]string{"a": "", "old": "", "b": "3"} {
		got, err := r.kv.Get(c, &walshipv1.GetRequest{Key: k})
		if err != nil || got.GetFound() != (want != "") || string(got.GetValue()) != want {
			t.Errorf("Get %s after the txn = %v, %v; want %q", k, got, err, want)
		}
	}
}

func TestTxnComparesAndResults(t *testing.T) {
	r := start(t, testConfig(t, t.TempDir()))
	c := ctx(t)
	p1, err := r.kv.Put(c, &walshipv1.PutRequest{Key: "k", Value: []byte("v1")})
	if err != nil {
		t.Fatal(err)
	}
	cmpVersion := func(v uint64) *walshipv1.Compare {
		return &walshipv1.Compare{Key: "k", Target: walshipv1.CompareTarget_COMPARE_TARGET_VERSION,
			Result: walshipv1.CompareResult_COMPARE_RESULT_EQUAL, Operand: &walshipv1.Compare_VersionLsn{VersionLsn: v}}
	}
	putOp := func(k, v string) *walshipv1.TxnOp {
		return &walshipv1.TxnOp{Op: &walshipv1.TxnOp_Put{Put: &walshipv1.PutOp{Key: k, Value: []byte(v)}}}
	}
	getOp := func(k string) *walshipv1.TxnOp {
		return &walshipv1.TxnOp{Op: &walshipv1.TxnOp_Get{Get: &walshipv1.GetOp{Key: k}}}
	}
	// A CAS that holds: put then read its own write inside the txn.
	t1, err := r.kv.Txn(c, &walshipv1.TxnRequest{
		Compares: []*walshipv1.Compare{cmpVersion(p1.Lsn)},
		Success:  []*walshipv1.TxnOp{putOp("k", "v2"), getOp("k"), {Op: &walshipv1.TxnOp_Delete{Delete: &walshipv1.DeleteOp{Key: "other"}}}},
		Failure:  []*walshipv1.TxnOp{getOp("k")},
	})
	if err != nil {
		t.Fatal(err)
	}
	if !t1.Succeeded || len(t1.Results) != 3 {
		t.Fatalf("CAS txn = %v", t1)
	}
	if g := t1.Results[1].GetGet(); g == nil || string(g.Value) != "v2" || g.VersionLsn != t1.Lsn {
		t.Fatalf("get after put inside txn = %v, want v2 at the txn's commit LSN %d", g, t1.Lsn)
	}
	if d := t1.Results[2].GetDelete(); d == nil || d.Existed {
		t.Fatalf("delete of a missing key = %v", d)
	}
	// The same CAS again fails (the version moved) and runs the failure branch.
	t2, err := r.kv.Txn(c, &walshipv1.TxnRequest{
		Compares: []*walshipv1.Compare{cmpVersion(p1.Lsn)},
		Success:  []*walshipv1.TxnOp{putOp("k", "v3")},
		Failure:  []*walshipv1.TxnOp{getOp("k")},
	})
	if err != nil {
		t.Fatal(err)
	}
	if t2.Succeeded || string(t2.Results[0].GetGet().GetValue()) != "v2" || t2.Lsn < t1.Lsn {
		t.Fatalf("stale CAS = %v; want the failure branch reading v2", t2)
	}
	// Value and existence compares.
	for _, tc := range []struct {
		name string
		cmp  *walshipv1.Compare
		want bool
	}{
		{"value equal", &walshipv1.Compare{Key: "k", Target: walshipv1.CompareTarget_COMPARE_TARGET_VALUE, Result: walshipv1.CompareResult_COMPARE_RESULT_EQUAL, Operand: &walshipv1.Compare_Value{Value: []byte("v2")}}, true},
		{"value less", &walshipv1.Compare{Key: "k", Target: walshipv1.CompareTarget_COMPARE_TARGET_VALUE, Result: walshipv1.CompareResult_COMPARE_RESULT_LESS, Operand: &walshipv1.Compare_Value{Value: []byte("v1")}}, false},
		{"exists", &walshipv1.Compare{Key: "k", Target: walshipv1.CompareTarget_COMPARE_TARGET_EXISTS, Result: walshipv1.CompareResult_COMPARE_RESULT_EQUAL, Operand: &walshipv1.Compare_Exists{Exists: true}}, true},
		{"missing exists", &walshipv1.Compare{Key: "nope", Target: walshipv1.CompareTarget_COMPARE_TARGET_EXISTS, Result: walshipv1.CompareResult_COMPARE_RESULT_EQUAL, Operand: &walshipv1.Compare_Exists{Exists: true}}, false},
		{"missing version 0", &walshipv1.Compare{Key: "nope", Target: walshipv1.CompareTarget_COMPARE_TARGET_VERSION, Result: walshipv1.CompareResult_COMPARE_RESULT_EQUAL, Operand: &walshipv1.Compare_VersionLsn{VersionLsn: 0}}, true},
	} {
		resp, err := r.kv.Txn(c, &walshipv1.TxnRequest{Compares: []*walshipv1.Compare{tc.cmp}})
		if err != nil || resp.Succeeded != tc.want {
			t.Errorf("%s: Txn = %v, %v; want succeeded=%v", tc.name, resp, err, tc.want)
		}
	}
}

// TestTxnReadsAreBudgeted: the values a Txn's gets return are counted
// before any response is built. A Txn reading one 1 MiB value a hundred
// times (a 2 KB request) made the primary build and marshal a 100 MiB
// response for gRPC to refuse; it now fails with RESOURCE_EXHAUSTED
// naming the get that crossed the budget (kvread.MaxScanBytes),
// allocating next to nothing, and writes nothing even when its branch
// writes. Reads within the budget, and one large value alone, are served.
func TestTxnReadsAreBudgeted(t *testing.T) {
	cfg := testConfig(t, t.TempDir())
	cfg.MaxValueBytes = 5 << 20
	r := start(t, cfg)
	c := ctx(t)
	for k, n := range map[string]int{"quarter": 256 << 10, "big": 1 << 20, "huge": 5 << 20} {
		if _, err := r.kv.Put(c, &walshipv1.PutRequest{Key: k, Value: make([]byte, n)}); err != nil {
			t.Fatal(err)
		}
	}
	gets := func(n int, key string) []*walshipv1.TxnOp {
		var ops []*walshipv1.TxnOp
		for range n {
			ops = append(ops, txnGet(key))
		}
		return ops
	}
	noCompare := &walshipv1.Compare{Key: "big", Target: walshipv1.CompareTarget_COMPARE_TARGET_EXISTS,
		Result: walshipv1.CompareResult_COMPARE_RESULT_EQUAL, Operand: &walshipv1.Compare_Exists{Exists: false}}
	before, err := r.admin.Status(c, &walshipv1.StatusRequest{})
	if err != nil {
		t.Fatal(err)
	}
	var m0, m1 runtime.MemStats
	runtime.ReadMemStats(&m0)
	for _, tc := range []struct {
		name string
		req  *walshipv1.TxnRequest
		want string
	}{
		{"reads only", &walshipv1.TxnRequest{Success: gets(100, "big")}, "success[1].get"},
		{"past the budget", &walshipv1.TxnRequest{Success: gets(5, "quarter")}, "success[4].get"},
		{"speculative", &walshipv1.TxnRequest{Success: gets(100, "big"), Speculative: true}, "success[1].get"},
		{"failure branch", &walshipv1.TxnRequest{Compares: []*walshipv1.Compare{noCompare}, Failure: gets(100, "big")}, "failure[1].get"},
		{"with a write", &walshipv1.TxnRequest{Success: append([]*walshipv1.TxnOp{txnPut("w", []byte("x"))}, gets(100, "big")...)}, "success[2].get"},
		{"after a large value", &walshipv1.TxnRequest{Success: []*walshipv1.TxnOp{txnGet("huge"), txnGet("quarter")}}, "success[1].get"},
	} {
		_, err := r.kv.Txn(c, tc.req)
		if status.Code(err) != codes.ResourceExhausted || !strings.HasPrefix(status.Convert(err).Message(), tc.want+": ") {
			t.Errorf("%s: Txn = %v; want RESOURCE_EXHAUSTED naming %s", tc.name, err, tc.want)
		}
	}
	runtime.ReadMemStats(&m1)
	if alloc := m1.TotalAlloc - m0.TotalAlloc; alloc > 64<<20 {
		t.Errorf("refusing the Txns allocated %d MiB (client and server)", alloc>>20)
	}
	after, err := r.admin.Status(c, &walshipv1.StatusRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if after.LastLsn != before.LastLsn {
		t.Errorf("a refused Txn wrote: last LSN %d -> %d", before.LastLsn, after.LastLsn)
	}
	big := grpc.MaxCallRecvMsgSize(8 << 20)
	for _, tc := range []struct {
		name string
		ops  []*walshipv1.TxnOp
	}{{"1 MiB of values", gets(4, "quarter")}, {"one large value", gets(1, "huge")}} {
		resp, err := r.kv.Txn(c, &walshipv1.TxnRequest{Success: tc.ops}, big)
		if err != nil || len(resp.Results) != len(tc.ops) {
			t.Errorf("%s: Txn = %v", tc.name, err)
		}
	}
}

// TestConcurrentCounters runs read-modify-write transactions from many
// clients against a few counters; compares must serialize them exactly.
func TestConcurrentCounters(t *testing.T) {
	r := start(t, testConfig(t, t.TempDir()))
	c := ctx(t)
	const workers, incs = 8, 25
	var wg sync.WaitGroup
	var retries sync.Map
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			key := fmt.Sprintf("counter/%d", w%2)
			for i := 0; i < incs; i++ {
				for {
					g, err := r.kv.Get(c, &walshipv1.GetRequest{Key: key})
					if err != nil {
						t.Error(err)
						return
					}
					n := 0
					if g.Found {
						fmt.Sscan(string(g.Value), &n)
					}
					resp, err := r.kv.Txn(c, &walshipv1.TxnRequest{
						Compares: []*walshipv1.Compare{{Key: key, Target: walshipv1.CompareTarget_COMPARE_TARGET_VERSION,
							Result: walshipv1.CompareResult_COMPARE_RESULT_EQUAL, Operand: &walshipv1.Compare_VersionLsn{VersionLsn: g.VersionLsn}}},
						Success: []*walshipv1.TxnOp{{Op: &walshipv1.TxnOp_Put{Put: &walshipv1.PutOp{Key: key, Value: []byte(fmt.Sprint(n + 1))}}}},
						Policy:  &walshipv1.CommitPolicy{Durability: walshipv1.Durability_DURABILITY_ASYNC},
					})
					if err != nil {
						t.Error(err)
						return
					}
					if resp.Succeeded {
						break
					}
					retries.Store(w, true)
				}
			}
		}()
	}
	wg.Wait()
	total := 0
	for k := 0; k < 2; k++ {
		g, err := r.kv.Get(c, &walshipv1.GetRequest{Key: fmt.Sprintf("counter/%d", k)})
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		fmt.Sscan(string(g.Value), &n)
		total += n
	}
	if total != workers*incs {
		t.Fatalf("counters sum to %d, want %d", total, workers*incs)
	}
}

func TestRestartRecoversEveryAcknowledgedWrite(t *testing.T) {
	dir := t.TempDir()
	cfg := testConfig(t, dir)
	cfg.SnapshotEveryBytes = 4 << 10 // several snapshots along the way
	r := start(t, cfg)
	c := ctx(t)
	want := map[string]string{}
	for i := 0; i < 300; i++ {
		k, v := fmt.Sprintf("key/%03d", i%120), fmt.Sprintf("value-%d", i)
		pol := &walshipv1.CommitPolicy{Durability: walshipv1.Durability_DURABILITY_ASYNC}
		if i%2 == 0 {
			pol = nil
		}
		if _, err := r.kv.Put(c, &walshipv1.PutRequest{Key: k, Value: []byte(v), Policy: pol}); err != nil {
			t.Fatal(err)
		}
		want[k] = v
	}
	before, err := r.admin.Status(c, &walshipv1.StatusRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if err := r.stop(t); err != nil {
		t.Fatalf("graceful stop: %v", err)
	}
	r2 := start(t, cfg)
	after, err := r2.admin.Status(c, &walshipv1.StatusRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if after.VisibleLsn != before.VisibleLsn || after.StateDigest != before.StateDigest || after.Keys != uint64(len(want)) {
		t.Fatalf("after restart: visible %d digest %s keys %d; before: visible %d digest %s, want %d keys",
			after.VisibleLsn, after.StateDigest, after.Keys, before.VisibleLsn, before.StateDigest, len(want))
	}
	if after.SnapshotLsn != after.VisibleLsn {
		t.Errorf("clean shutdown should leave a snapshot at the visible LSN %d, snapshot is at %d", after.VisibleLsn, after.SnapshotLsn)
	}
	for k, v := range want {
		g, err := r2.kv.Get(c, &walshipv1.GetRequest{Key: k})
		if err != nil || string(g.Value) != v {
			t.Fatalf("Get %s after restart = %v, %v; want %s", k, g, err, v)
		}
	}
	// New writes continue after the recovered LSN.
	p, err := r2.kv.Put(c, &walshipv1.PutRequest{Key: "after", Value: []byte("x")})
	if err != nil || p.Lsn <= after.VisibleLsn {
		t.Fatalf("Put after restart = %v, %v; want LSN > %d", p, err, after.VisibleLsn)
	}
}

// TestSnapshotIntervalGrowsWithTheState: once the state's snapshot is larger
// than --snapshot-every-bytes, the next snapshot waits for that much WAL —
// after a restart (sized by the loaded snapshot) and after a snapshot taken
// while running.
func TestSnapshotIntervalGrowsWithTheState(t *testing.T) {
	dir := t.TempDir()
	cfg := testConfig(t, dir)
	cfg.SnapshotEveryBytes = 4 << 10
	r := start(t, cfg)
	c := ctx(t)
	value := []byte(strings.Repeat("v", 1<<10))
	for i := range 40 {
		if _, err := r.kv.Put(c, &walshipv1.PutRequest{Key: fmt.Sprintf("key/%02d", i), Value: value}); err != nil {
			t.Fatal(err)
		}
	}
	if err := r.stop(t); err != nil {
		t.Fatal(err)
	}
	snapSize := func(r *running) int64 {
		st, err := r.admin.Status(c, &walshipv1.StatusRequest{})
		if err != nil {
			t.Fatal(err)
		}
		size := recovery.FileSize(vfs.OS, filepath.Join(recovery.SnapshotDir(dir), state.SnapshotName(st.SnapshotLsn)))
		if size <= 40<<10 {
			t.Fatalf("snapshot at LSN %d has %d bytes, want > 40 KiB", st.SnapshotLsn, size)
		}
		return size
	}
	r2 := start(t, cfg)
	if got, want := r2.s.snaps.Interval(), snapSize(r2); got != want {
		t.Fatalf("after restart the snapshot interval is %d bytes, want the loaded snapshot's %d", got, want)
	}
	if _, err := r2.kv.Put(c, &walshipv1.PutRequest{Key: "key/40", Value: value}); err != nil {
		t.Fatal(err)
	}
	if err := r2.s.takeSnapshot(); err != nil {
		t.Fatal(err)
	}
	if got, want := r2.s.snaps.Interval(), snapSize(r2); got != want {
		t.Fatalf("after a snapshot the interval is %d bytes, want its size %d", got, want)
	}
}

func TestSyncReplicationWithoutReplicasFailsAndNeverShowsEarly(t *testing.T) {
	r := start(t, testConfig(t, t.TempDir()))
	c := ctx(t)
	errc := make(chan error, 1)
	go func() {
		_, err := r.kv.Put(c, &walshipv1.PutRequest{Key: "sync", Value: []byte("v"), Policy: &walshipv1.CommitPolicy{
			Replication: walshipv1.ReplicationMode_REPLICATION_MODE_SYNC, SyncTimeout: durationpb.New(300 * time.Millisecond)}})
		errc <- err
	}()
	// While the commit waits for a replica it is in the WAL but not visible.
	if err := r.s.wal.Wait(c, 2, true); err != nil {
		t.Fatal(err)
	}
	g, err := r.kv.Get(c, &walshipv1.GetRequest{Key: "sync"})
	if err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-errc:
		t.Fatalf("sync Put returned early: %v", err)
	default:
	}
	if g.Found {
		t.Fatal("a write waiting for replicas was readable before its writer heard back")
	}
	err = <-errc
	if status.Code(err) != codes.Unavailable || !strings.Contains(err.Error(), "replica") {
		t.Fatalf("sync Put with no replicas = %v; want UNAVAILABLE about replicas", err)
	}
}

func TestBadInput(t *testing.T) {
	cfg := testConfig(t, t.TempDir())
	cfg.MaxValueBytes = 1 << 10
	cfg.MaxTxnOps = 4
	r := start(t, cfg)
	c := ctx(t)
	long := strings.Repeat("k", 4097)
	bad := string([]byte{0xff, 0xfe})
	put := func(k string) *walshipv1.TxnOp { return txnPut(k, nil) }
	cases := []struct {
		name  string
		call  func() error
		field string
	}{
		{"put empty key", func() error { _, err := r.kv.Put(c, &walshipv1.PutRequest{}); return err }, "key"},
		{"put long key", func() error { _, err := r.kv.Put(c, &walshipv1.PutRequest{Key: long}); return err }, "key"},
		{"put invalid utf8", func() error { return rawCall(c, r.conn, "Put", field(1, []byte(bad))) }, "key"},
		{"put big value", func() error {
			_, err := r.kv.Put(c, &walshipv1.PutRequest{Key: "k", Value: make([]byte, 1025)})
			return err
		}, "value"},
		{"put bad durability", func() error {
			_, err := r.kv.Put(c, &walshipv1.PutRequest{Key: "k", Policy: &walshipv1.CommitPolicy{Durability: 9}})
			return err
		}, "policy.durability"},
		{"put sync_replicas too many", func() error {
			_, err := r.kv.Put(c, &walshipv1.PutRequest{Key: "k", Policy: &walshipv1.CommitPolicy{SyncReplicas: 1000}})
			return err
		}, "sync_replicas"},
		{"put negative sync_timeout", func() error {
			_, err := r.kv.Put(c, &walshipv1.PutRequest{Key: "k", Policy: &walshipv1.CommitPolicy{SyncTimeout: durationpb.New(-time.Second)}})
			return err
		}, "sync_timeout"},
		{"delete empty key", func() error { _, err := r.kv.Delete(c, &walshipv1.DeleteRequest{}); return err }, "key"},
		{"get empty key", func() error { _, err := r.kv.Get(c, &walshipv1.GetRequest{}); return err }, "key"},
		{"get bad wait", func() error {
			_, err := r.kv.Get(c, &walshipv1.GetRequest{Key: "k", MinLsn: 1 << 40, WaitTimeout: durationpb.New(time.Hour)})
			return err
		}, "wait_timeout"},
		{"scan end before start", func() error { _, err := r.kv.Scan(c, &walshipv1.ScanRequest{Start: "b", End: "a"}); return err }, "end"},
		{"scan bad start", func() error { return rawCall(c, r.conn, "Scan", field(1, []byte(bad))) }, "start"},
		{"txn nested invalid utf8", func() error {
			ok := field(2, field(1, field(1, []byte("fine"))))
			return rawCall(c, r.conn, "Txn", append(ok, field(2, field(1, field(1, []byte(bad))))...))
		}, "success[1].put.key"},
		{"scan limit", func() error { _, err := r.kv.Scan(c, &walshipv1.ScanRequest{Limit: 10001}); return err }, "limit"},
		{"txn too many ops", func() error {
			_, err := r.kv.Txn(c, &walshipv1.TxnRequest{Success: []*walshipv1.TxnOp{put("a"), put("b"), put("c")}, Failure: []*walshipv1.TxnOp{put("d"), put("e")}})
			return err
		}, "success"},
		{"txn empty op", func() error {
			_, err := r.kv.Txn(c, &walshipv1.TxnRequest{Success: []*walshipv1.TxnOp{{}}})
			return err
		}, "success[0]"},
		{"txn op bad key", func() error {
			_, err := r.kv.Txn(c, &walshipv1.TxnRequest{Failure: []*walshipv1.TxnOp{put("ok"), put("")}})
			return err
		}, "failure[1].put.key"},
		{"txn op big value", func() error {
			_, err := r.kv.Txn(c, &walshipv1.TxnRequest{Success: []*walshipv1.TxnOp{{Op: &walshipv1.TxnOp_Put{Put: &walshipv1.PutOp{Key: "k", Value: make([]byte, 2000)}}}}})
			return err
		}, "success[0].put.value"},
		{"txn compare no target", func() error {
			_, err := r.kv.Txn(c, &walshipv1.TxnRequest{Compares: []*walshipv1.Compare{{Key: "k", Result: walshipv1.CompareResult_COMPARE_RESULT_EQUAL}}})
			return err
		}, "compares[0].target"},
		{"txn compare no result", func() error {
			_, err := r.kv.Txn(c, &walshipv1.TxnRequest{Compares: []*walshipv1.Compare{{Key: "k", Target: walshipv1.CompareTarget_COMPARE_TARGET_VALUE}}})
			return err
		}, "compares[0].result"},
		{"txn compare wrong operand", func() error {
			_, err := r.kv.Txn(c, &walshipv1.TxnRequest{Compares: []*walshipv1.Compare{{Key: "k", Target: walshipv1.CompareTarget_COMPARE_TARGET_VALUE,
				Result: walshipv1.CompareResult_COMPARE_RESULT_EQUAL, Operand: &walshipv1.Compare_Exists{Exists: true}}}})
			return err
		}, "compares[0].value"},
		{"txn compare exists less", func() error {
			_, err := r.kv.Txn(c, &walshipv1.TxnRequest{Compares: []*walshipv1.Compare{{Key: "k", Target: walshipv1.CompareTarget_COMPARE_TARGET_EXISTS,
				Result: walshipv1.CompareResult_COMPARE_RESULT_LESS, Operand: &walshipv1.Compare_Exists{Exists: true}}}})
			return err
		}, "compares[0].result"},
		{"txn compare bad key", func() error {
			_, err := r.kv.Txn(c, &walshipv1.TxnRequest{Compares: []*walshipv1.Compare{{Key: long}}})
			return err
		}, "compares[0].key"},
		{"set policy empty", func() error { _, err := r.admin.SetPolicy(c, &walshipv1.SetPolicyRequest{}); return err }, "policy"},
	}
	before, err := r.admin.Status(c, &walshipv1.StatusRequest{})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range cases {
		err := tc.call()
		if status.Code(err) != codes.InvalidArgument || !strings.Contains(status.Convert(err).Message(), tc.field) {
			t.Errorf("%s: got %v; want InvalidArgument naming %q", tc.name, err, tc.field)
		}
	}
	after, err := r.admin.Status(c, &walshipv1.StatusRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if after.LastLsn != before.LastLsn {
		t.Fatalf("bad input wrote to the WAL: last LSN %d → %d", before.LastLsn, after.LastLsn)
	}
	// A message above the gRPC limit is refused before it reaches the handler.
	_, err = r.kv.Put(c, &walshipv1.PutRequest{Key: "k", Value: make([]byte, 3<<20)})
	if status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("oversized message: %v; want ResourceExhausted", err)
	}
}

func TestSetPolicyChangesDefaults(t *testing.T) {
	r := start(t, testConfig(t, t.TempDir()))
	c := ctx(t)
	resp, err := r.admin.SetPolicy(c, &walshipv1.SetPolicyRequest{Policy: &walshipv1.CommitPolicy{Durability: walshipv1.Durability_DURABILITY_ASYNC}})
	if err != nil {
		t.Fatal(err)
	}
	if resp.Policy.Durability != walshipv1.Durability_DURABILITY_ASYNC || resp.Policy.Replication != walshipv1.ReplicationMode_REPLICATION_MODE_ASYNC {
		t.Fatalf("SetPolicy = %v", resp.Policy)
	}
	st, err := r.admin.Status(c, &walshipv1.StatusRequest{})
	if err != nil || st.DefaultPolicy.Durability != walshipv1.Durability_DURABILITY_ASYNC {
		t.Fatalf("Status after SetPolicy = %v, %v", st, err)
	}
}

// TestFsyncFailureIsFatal injects a failing fsync: the commit waiting for it
// fails, every later write is refused, and Run returns the error.
func TestFsyncFailureIsFatal(t *testing.T) {
	mem := vfs.NewMem()
	cfg := testConfig(t, "/data")
	cfg.FS = mem
	r := start(t, cfg)
	c := ctx(t)
	if _, err := r.kv.Put(c, &walshipv1.PutRequest{Key: "before", Value: []byte("ok")}); err != nil {
		t.Fatal(err)
	}
	injected := errors.New("injected EIO")
	mem.InjectSyncError(func(name string) error {
		if filepath.Ext(name) == ".wal" {
			return injected
		}
		return nil
	})
	_, err := r.kv.Put(c, &walshipv1.PutRequest{Key: "fails", Value: []byte("x")})
	if status.Code(err) != codes.Unavailable || !strings.Contains(err.Error(), "injected EIO") {
		t.Fatalf("Put with failing fsync = %v; want UNAVAILABLE carrying the error", err)
	}
	mem.InjectSyncError(nil)
	_, err = r.kv.Put(c, &walshipv1.PutRequest{Key: "after", Value: []byte("x")})
	if status.Code(err) != codes.Unavailable {
		t.Fatalf("Put after a failed fsync = %v; want UNAVAILABLE (the failure is sticky)", err)
	}
	if err := r.failed(t, "a fatal fsync error"); !errors.Is(err, injected) {
		t.Fatalf("Run returned %v; want the injected error", err)
	}
}

// TestRetentionDirFsyncFailureIsFatal: retention removes a WAL segment
// and the directory fsync after it fails. Whether the removal survives a
// crash is unknown, as after any failed fsync, so the primary stops at
// once — not at the next write, which there may never be: Run returns the
// error.
func TestRetentionDirFsyncFailureIsFatal(t *testing.T) {
	mem := vfs.NewMem()
	cfg := testConfig(t, "/data")
	cfg.FS = mem
	cfg.SegmentBytes = 64 << 10
	cfg.SnapshotEveryBytes = 128 << 10
	cfg.WALRetentionBytes = 256 << 10
	r := start(t, cfg)
	c := ctx(t)
	injected := errors.New("injected EIO")
	removed := mem.FailDirSyncAfterRemove(".wal", injected)
	// Write until retention removes a segment, then no more.
	value := make([]byte, 1024)
	for i := 0; !removed(); i++ {
		if i == 10_000 {
			t.Fatal("10,000 Puts of 1 KiB and retention never removed a segment")
		}
		if _, err := r.kv.Put(c, &walshipv1.PutRequest{Key: fmt.Sprintf("k%d", i%50), Value: value}); err != nil {
			if status.Code(err) != codes.Unavailable {
				t.Fatalf("Put as retention fails = %v; want success or UNAVAILABLE", err)
			}
			break
		}
	}
	if err := r.failed(t, "retention's directory fsync failed"); !errors.Is(err, injected) {
		t.Fatalf("Run returned %v; want the injected error", err)
	}
}

// TestCrashKeepsSyncedCommits crashes the in-memory filesystem (dropping
// everything not synced) after sync and async commits: every sync commit
// survives and what survives is a prefix.
func TestCrashKeepsSyncedCommits(t *testing.T) {
	mem := vfs.NewMem()
	cfg := testConfig(t, "/data")
	cfg.FS = mem
	cfg.AsyncFlushInterval = time.Minute // async commits stay unsynced
	r := start(t, cfg)
	c := ctx(t)
	var syncLSN uint64
	for i := 0; i < 20; i++ {
		p, err := r.kv.Put(c, &walshipv1.PutRequest{Key: fmt.Sprintf("sync/%02d", i), Value: []byte("v")})
		if err != nil {
			t.Fatal(err)
		}
		syncLSN = p.Lsn
	}
	for i := 0; i < 20; i++ {
		if _, err := r.kv.Put(c, &walshipv1.PutRequest{Key: fmt.Sprintf("async/%02d", i), Value: []byte("v"),
			Policy: &walshipv1.CommitPolicy{Durability: walshipv1.Durability_DURABILITY_ASYNC}}); err != nil {
			t.Fatal(err)
		}
	}
	mem.Crash() // the machine dies; what was not synced is gone
	mem.InjectError(func(vfs.Op, string) error { return errors.New("machine is down") })
	r.stop(t)
	mem.InjectError(nil)

	r2 := start(t, cfg)
	st, err := r2.admin.Status(c, &walshipv1.StatusRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if st.VisibleLsn < syncLSN {
		t.Fatalf("after crash visible LSN %d < last sync commit %d", st.VisibleLsn, syncLSN)
	}
	for i := 0; i < 20; i++ {
		g, err := r2.kv.Get(c, &walshipv1.GetRequest{Key: fmt.Sprintf("sync/%02d", i)})
		if err != nil || !g.Found {
			t.Fatalf("sync commit %d lost in crash: %v %v", i, g, err)
		}
	}
	// Async commits: a prefix survives (none here, the flush never ran).
	seenGap := false
	for i := 0; i < 20; i++ {
		g, err := r2.kv.Get(c, &walshipv1.GetRequest{Key: fmt.Sprintf("async/%02d", i)})
		if err != nil {
			t.Fatal(err)
		}
		if !g.Found {
			seenGap = true
		} else if seenGap {
			t.Fatalf("async commit %d survived after a lost one: not a prefix", i)
		}
	}
}

// rawCodec sends pre-encoded request bytes, so a test can send what the
// protobuf runtime would refuse to marshal (invalid UTF-8 in a string).
type rawCodec struct{}

func (rawCodec) Marshal(v any) (mem.BufferSlice, error) {
	return mem.BufferSlice{mem.SliceBuffer(v.([]byte))}, nil
}
func (rawCodec) Unmarshal(mem.BufferSlice, any) error { return nil }
func (rawCodec) Name() string                         { return "proto" }

func rawCall(ctx context.Context, conn *grpc.ClientConn, method string, req []byte) error {
	var resp []byte
	return conn.Invoke(ctx, "/walship.v1.KVService/"+method, req, &resp, grpc.ForceCodecV2(rawCodec{}))
}

// field encodes one length-delimited protobuf field.
func field(num protowire.Number, v []byte) []byte {
	return protowire.AppendBytes(protowire.AppendTag(nil, num, protowire.BytesType), v)
}

func dialBench(b *testing.B, addr string) *grpc.ClientConn {
	return dialBenchWith(b, serve.Dialer{}, addr)
}

// dialBenchWith is dialBench as d dials (TLS).
func dialBenchWith(b *testing.B, d serve.Dialer, addr string) *grpc.ClientConn {
	conn, err := d.Dial(addr)
	if err != nil {
		b.Fatal(err)
	}
	return conn
}

// TestConfigValidate: each bad setting is refused naming its flag (or, for
// settings without one, its field), and the size limits keep every WAL
// entry within one replication stream message.
func TestConfigValidate(t *testing.T) {
	for _, tc := range []struct {
		name string
		edit func(*Config)
		want string
	}{
		{"ok", func(*Config) {}, ""},
		{"largest value", func(c *Config) { c.MaxValueBytes = maxValueLimit }, ""},
		{"largest batch", func(c *Config) { c.MaxBatchBytes = maxBatchLimit }, ""},
		{"no data dir", func(c *Config) { c.DataDir = "" }, "--data-dir"},
		{"no value", func(c *Config) { c.MaxValueBytes = 0 }, "--max-value-bytes"},
		{"value past a stream message", func(c *Config) { c.MaxValueBytes = streamMessageBytes }, "--max-value-bytes"},
		{"value one past the limit", func(c *Config) { c.MaxValueBytes = maxValueLimit + 1 }, "--max-value-bytes"},
		{"no txn ops", func(c *Config) { c.MaxTxnOps = 0 }, "--max-txn-ops"},
		{"most txn ops", func(c *Config) { c.MaxTxnOps = 10000 }, ""},
		{"txn ops past the limit", func(c *Config) { c.MaxTxnOps = 10001 }, "--max-txn-ops"},
		{"small batches", func(c *Config) { c.MaxBatchBytes = 1 << 10 }, "MaxBatchBytes"},
		{"batch past a stream message", func(c *Config) { c.MaxBatchBytes = maxBatchLimit + 1 }, "MaxBatchBytes"},
		{"no heartbeat", func(c *Config) { c.HeartbeatInterval = 0 }, "--heartbeat-interval"},
		{"negative ship delay", func(c *Config) { c.ShipDelay = -time.Millisecond }, "--ship-delay"},
		{"ship delay past the lease", func(c *Config) { c.ShipDelay, c.LeaseTimeout = 200*time.Millisecond, time.Second }, "--ship-delay"},
		{"ship delay past the default lease", func(c *Config) { c.ShipDelay, c.LeaseTimeout = 200*time.Millisecond, 0 }, "--ship-delay"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := DefaultConfig()
			cfg.DataDir = "/tmp/x"
			tc.edit(&cfg)
			err := cfg.Validate()
			if (err == nil) != (tc.want == "") || (err != nil && !strings.Contains(err.Error(), tc.want)) {
				t.Fatalf("Validate = %v, want %q", err, tc.want)
			}
		})
	}
}
