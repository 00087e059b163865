package cluster

import (
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"path/filepath"
	"runtime/pprof"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	walshipv1 "github.com/walship/walship/gen/walship/v1"
	"github.com/walship/walship/internal/testkit"
	"github.com/walship/walship/internal/wal"
	"github.com/walship/walship/services/logstore"
	"github.com/walship/walship/services/primary"
	"github.com/walship/walship/services/replica"
	"go.uber.org/goleak"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// fast makes a cluster react in test time: short heartbeats and small
// segments, so retention and staleness show up quickly.
func fast(cfg Config) Config {
	prev := cfg.Primary
	cfg.Primary = func(c *primary.Config) {
		c.HeartbeatInterval = 100 * time.Millisecond
		c.SegmentBytes = 64 << 10
		c.StopTimeout = 5 * time.Second
		if prev != nil {
			prev(c)
		}
	}
	prevR := cfg.Replica
	cfg.Replica = func(i int, c *replica.Config) {
		c.HeartbeatInterval = 100 * time.Millisecond
		c.SegmentBytes = 64 << 10
		c.StopTimeout = 5 * time.Second
		if prevR != nil {
			prevR(i, c)
		}
	}
	prevL := cfg.LogStore
	cfg.LogStore = func(i int, c *logstore.Config) {
		c.SegmentBytes = 64 << 10
		if prevL != nil {
			prevL(i, c)
		}
	}
	return cfg
}

func startCluster(t *testing.T, cfg Config) *Cluster {
	t.Helper()
	if cfg.Dir == "" {
		cfg.Dir = t.TempDir()
	}
	if cfg.Logger == nil {
		// What the cluster logged, for a test that fails.
		var out testkit.Output
		cfg.Logger = slog.New(slog.NewTextHandler(&out, nil))
		t.Cleanup(func() {
			if t.Failed() {
				t.Logf("the cluster's log, last 64 KiB:\n%s", out.Tail(64<<10))
			}
		})
	}
	c, err := Start(context.Background(), fast(cfg))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := c.Stop(); err != nil {
			t.Errorf("stop cluster: %v", err)
		}
	})
	return c
}

// waitConverged waits until every replica is at the primary's visible LSN
// and reports the same state digest.
func waitConverged(t *testing.T, c *Cluster) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	ps, err := c.Status(ctx, c.Primary)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range c.Replicas {
		kv := walshipv1.NewKVServiceClient(c.Conn(r))
		// A read at min_lsn waits (by notification) until the replica applied it.
		if _, err := kv.Get(ctx, &walshipv1.GetRequest{Key: "k", MinLsn: ps.VisibleLsn, WaitTimeout: durationpb.New(45 * time.Second)}); err != nil {
			t.Fatalf("%s never reached LSN %d: %v", r.Name, ps.VisibleLsn, err)
		}
		rs, err := c.Status(ctx, r)
		if err != nil {
			t.Fatal(err)
		}
		if rs.VisibleLsn != ps.VisibleLsn || rs.StateDigest != ps.StateDigest || rs.Keys != ps.Keys {
			t.Fatalf("%s at LSN %d digest %s keys %d; primary at LSN %d digest %s keys %d",
				r.Name, rs.VisibleLsn, rs.StateDigest, rs.Keys, ps.VisibleLsn, ps.StateDigest, ps.Keys)
		}
	}
}

// randomLoad runs concurrent random Put/Delete/Txn under pol and returns
// the highest commit LSN acknowledged.
func randomLoad(t *testing.T, kv walshipv1.KVServiceClient, workers, ops int, pol *walshipv1.CommitPolicy) uint64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	var mu sync.Mutex
	var last uint64
	var wg sync.WaitGroup
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(w), 7))
			for i := 0; i < ops; i++ {
				key := fmt.Sprintf("key/%02d", rng.IntN(40))
				var lsn uint64
				var err error
				switch rng.IntN(4) {
				case 0, 1:
					var r *walshipv1.PutResponse
					r, err = kv.Put(ctx, &walshipv1.PutRequest{Key: key, Value: []byte(fmt.Sprintf("v%d-%d", w, i)), Policy: pol})
					if err == nil {
						lsn = r.Lsn
					}
				case 2:
					var r *walshipv1.DeleteResponse
					r, err = kv.Delete(ctx, &walshipv1.DeleteRequest{Key: key, Policy: pol})
					if err == nil {
						lsn = r.Lsn
					}
				default:
					var r *walshipv1.TxnResponse
					r, err = kv.Txn(ctx, &walshipv1.TxnRequest{
						Compares: []*walshipv1.Compare{{Key: key, Target: walshipv1.CompareTarget_COMPARE_TARGET_EXISTS,
							Result: walshipv1.CompareResult_COMPARE_RESULT_EQUAL, Operand: &walshipv1.Compare_Exists{Exists: true}}},
						Success: []*walshipv1.TxnOp{{Op: &walshipv1.TxnOp_Delete{Delete: &walshipv1.DeleteOp{Key: key}}},
							{Op: &walshipv1.TxnOp_Put{Put: &walshipv1.PutOp{Key: key + "/moved", Value: []byte("m")}}}},
						Failure: []*walshipv1.TxnOp{{Op: &walshipv1.TxnOp_Put{Put: &walshipv1.PutOp{Key: key, Value: []byte("new")}}}},
						Policy:  pol,
					})
					if err == nil {
						lsn = r.Lsn
					}
				}
				if err != nil {
					t.Errorf("worker %d op %d: %v", w, i, err)
					return
				}
				mu.Lock()
				last = max(last, lsn)
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	return last
}

func TestConvergenceInEveryMode(t *testing.T) {
	c := startCluster(t, Config{LogStores: 1, Replicas: 2})
	kv := walshipv1.NewKVServiceClient(c.Conn(c.Primary))
	sync2apply := &walshipv1.CommitPolicy{Replication: walshipv1.ReplicationMode_REPLICATION_MODE_SYNC, SyncReplicas: 2, SyncLevel: walshipv1.SyncLevel_SYNC_LEVEL_APPLY}
	for _, tc := range []struct {
		name string
		pol  *walshipv1.CommitPolicy
	}{
		{"disabled/sync", &walshipv1.CommitPolicy{Replication: walshipv1.ReplicationMode_REPLICATION_MODE_DISABLED}},
		{"async/sync", &walshipv1.CommitPolicy{Replication: walshipv1.ReplicationMode_REPLICATION_MODE_ASYNC}},
		{"async/async", &walshipv1.CommitPolicy{Replication: walshipv1.ReplicationMode_REPLICATION_MODE_ASYNC, Durability: walshipv1.Durability_DURABILITY_ASYNC}},
		{"sync-flush-1/sync", &walshipv1.CommitPolicy{Replication: walshipv1.ReplicationMode_REPLICATION_MODE_SYNC, SyncReplicas: 1, SyncLevel: walshipv1.SyncLevel_SYNC_LEVEL_FLUSH}},
		{"sync-write-2/async", &walshipv1.CommitPolicy{Replication: walshipv1.ReplicationMode_REPLICATION_MODE_SYNC, SyncReplicas: 2, SyncLevel: walshipv1.SyncLevel_SYNC_LEVEL_WRITE, Durability: walshipv1.Durability_DURABILITY_ASYNC}},
		{"sync-apply-2/sync+logstore", &walshipv1.CommitPolicy{Replication: sync2apply.Replication, SyncReplicas: 2, SyncLevel: sync2apply.SyncLevel, Logstore: walshipv1.LogStoreAck_LOG_STORE_ACK_SYNC}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			randomLoad(t, kv, 4, 40, tc.pol)
			waitConverged(t, c)
		})
	}
}

func TestSyncSemanticsWithAReplicaDown(t *testing.T) {
	c := startCluster(t, Config{LogStores: 1, Replicas: 2})
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	kv := walshipv1.NewKVServiceClient(c.Conn(c.Primary))
	syncPol := func(k uint32, level walshipv1.SyncLevel, timeout time.Duration) *walshipv1.CommitPolicy {
		return &walshipv1.CommitPolicy{Replication: walshipv1.ReplicationMode_REPLICATION_MODE_SYNC, SyncReplicas: k, SyncLevel: level, SyncTimeout: durationpb.New(timeout)}
	}

	// Both up: sync at apply on both means the value is readable on every
	// replica the moment Put returns, without min_lsn.
	p, err := kv.Put(ctx, &walshipv1.PutRequest{Key: "applied", Value: []byte("yes"), Policy: syncPol(2, walshipv1.SyncLevel_SYNC_LEVEL_APPLY, 10*time.Second)})
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range c.Replicas {
		g, err := walshipv1.NewKVServiceClient(c.Conn(r)).Get(ctx, &walshipv1.GetRequest{Key: "applied"})
		if err != nil || !g.Found || g.VersionLsn != p.Lsn {
			t.Fatalf("%s right after a sync-apply Put: %v, %v", r.Name, g, err)
		}
	}

	if err := c.StopReplica(1); err != nil {
		t.Fatal(err)
	}
	// K=2 of 2 with one down: blocks for the timeout, then UNAVAILABLE.
	start := time.Now()
	_, err = kv.Put(ctx, &walshipv1.PutRequest{Key: "k2", Value: []byte("v"), Policy: syncPol(2, walshipv1.SyncLevel_SYNC_LEVEL_FLUSH, 400*time.Millisecond)})
	if status.Code(err) != codes.Unavailable {
		t.Fatalf("sync K=2 with a replica down: %v; want UNAVAILABLE", err)
	}
	if waited := time.Since(start); waited < 400*time.Millisecond {
		t.Fatalf("sync K=2 failed after %v, before its 400ms timeout", waited)
	}
	// K=1 of 2 succeeds on the replica that is up; async is unaffected.
	if _, err := kv.Put(ctx, &walshipv1.PutRequest{Key: "k1", Value: []byte("v"), Policy: syncPol(1, walshipv1.SyncLevel_SYNC_LEVEL_FLUSH, 10*time.Second)}); err != nil {
		t.Fatalf("sync K=1 with one of two up: %v", err)
	}
	last, err := kv.Put(ctx, &walshipv1.PutRequest{Key: "async", Value: []byte("v"), Policy: &walshipv1.CommitPolicy{Replication: walshipv1.ReplicationMode_REPLICATION_MODE_ASYNC}})
	if err != nil {
		t.Fatalf("async with a replica down: %v", err)
	}
	// Read-your-writes on the live replica with the LSN the write returned.
	g, err := walshipv1.NewKVServiceClient(c.Conn(c.Replicas[0])).Get(ctx, &walshipv1.GetRequest{Key: "async", MinLsn: last.Lsn})
	if err != nil || !g.Found || g.AppliedLsn < last.Lsn {
		t.Fatalf("read-your-writes on replica-0: %v, %v", g, err)
	}
	// The stopped replica comes back and converges, including the write
	// whose sync wait failed (it was durable on the primary all along).
	if err := c.RestartReplica(ctx, 1); err != nil {
		t.Fatal(err)
	}
	waitConverged(t, c)
	g, err = walshipv1.NewKVServiceClient(c.Conn(c.Replicas[1])).Get(ctx, &walshipv1.GetRequest{Key: "k2"})
	if err != nil || !g.Found {
		t.Fatalf("the write whose sync wait timed out is not on the restarted replica: %v, %v", g, err)
	}
}

func TestReplicaWritesAreRefused(t *testing.T) {
	c := startCluster(t, Config{Replicas: 1})
	_, err := walshipv1.NewKVServiceClient(c.Conn(c.Replicas[0])).Put(t.Context(), &walshipv1.PutRequest{Key: "k", Value: []byte("v")})
	if status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), c.Primary.Addr) {
		t.Fatalf("Put on a replica: %v; want FAILED_PRECONDITION naming the primary %s", err, c.Primary.Addr)
	}
}

// metric returns the value of the named metric (summed over series whose
// labels include want; a histogram counts its observations) in reg.
func metric(t testing.TB, reg *prometheus.Registry, name string, want map[string]string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	sum := 0.0
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	next:
		for _, m := range mf.GetMetric() {
			labels := map[string]string{}
			for _, lp := range m.GetLabel() {
				labels[lp.GetName()] = lp.GetValue()
			}
			for k, v := range want {
				if labels[k] != v {
					continue next
				}
			}
			switch {
			case m.Counter != nil:
				sum += m.Counter.GetValue()
			case m.Gauge != nil:
				sum += m.Gauge.GetValue()
			case m.Histogram != nil:
				sum += float64(m.Histogram.GetSampleCount())
			}
		}
	}
	return sum
}

// fill writes n keys of size bytes each, async, to grow the WAL.
func fill(t *testing.T, kv walshipv1.KVServiceClient, prefix string, n, size int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	val := []byte(strings.Repeat("x", size))
	for i := 0; i < n; i++ {
		if _, err := kv.Put(ctx, &walshipv1.PutRequest{Key: fmt.Sprintf("%s/%04d", prefix, i), Value: val,
			Policy: &walshipv1.CommitPolicy{Durability: walshipv1.Durability_DURABILITY_ASYNC}}); err != nil {
			t.Fatal(err)
		}
	}
}

// TestCatchUpLadder forces each rung: a replica away while the primary's
// tiny WAL retention drops what it needs catches up from the log store; when
// the log store has dropped it too, from the log store's newest snapshot
// and the batches after it, without loading the primary; and with no
// snapshot in the log store (uploads off), from the primary's snapshot.
// Each ends converged.
func TestCatchUpLadder(t *testing.T) {
	for _, tc := range []struct {
		name      string
		logstore  func(int, *logstore.Config)
		uploads   time.Duration // primary.Config.LogStoreSnapshotEvery
		checkUsed func(t *testing.T, c *Cluster)
	}{
		{"logstore", nil, 0, func(t *testing.T, c *Cluster) {
			if read := metric(t, c.LogStores[0].Registry, "walship_logstore_read_bytes_total", nil); read == 0 {
				t.Fatal("the replica caught up but read nothing from the log store")
			}
			if n := metric(t, c.Primary.Registry, "walship_replication_snapshots_sent_total", nil); n != 0 {
				t.Fatalf("%v snapshots sent; the log store rung should have sufficed", n)
			}
		}},
		{"logstore snapshot", func(_ int, c *logstore.Config) { c.RetentionBytes = 128 << 10 }, 0, func(t *testing.T, c *Cluster) {
			if n := metric(t, c.LogStores[0].Registry, "walship_logstore_snapshots_served_total", nil); n == 0 {
				t.Fatal("the replica caught up without the log store's snapshot although no one kept the WAL it needed")
			}
			if n := metric(t, c.Primary.Registry, "walship_replication_snapshots_sent_total", nil); n != 0 {
				t.Fatalf("%v snapshots sent by the primary; the log store's should have sufficed", n)
			}
		}},
		{"primary snapshot", func(_ int, c *logstore.Config) { c.RetentionBytes = 128 << 10 }, -1, func(t *testing.T, c *Cluster) {
			if n := metric(t, c.Primary.Registry, "walship_replication_snapshots_sent_total", nil); n == 0 {
				t.Fatal("the replica caught up without a snapshot although no one kept the WAL it needed")
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := startCluster(t, Config{LogStores: 1, Replicas: 1, LogStore: tc.logstore, Primary: func(p *primary.Config) {
				p.WALRetentionBytes = 256 << 10
				p.SnapshotEveryBytes = 64 << 10
				p.LogStoreSnapshotEvery = tc.uploads
			}})
			kv := walshipv1.NewKVServiceClient(c.Conn(c.Primary))
			fill(t, kv, "before", 20, 100)
			waitConverged(t, c)
			if err := c.StopReplica(0); err != nil {
				t.Fatal(err)
			}
			fill(t, kv, "away", 600, 1000) // ~600 KiB: well past the primary's 256 KiB retention
			st, err := c.Status(t.Context(), c.Primary)
			if err != nil {
				t.Fatal(err)
			}
			if st.WalFirstLsn <= 2 {
				t.Fatalf("primary WAL still starts at LSN %d: retention did not drop anything", st.WalFirstLsn)
			}
			ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
			defer cancel()
			if err := c.RestartReplica(ctx, 0); err != nil {
				t.Fatal(err)
			}
			fill(t, kv, "after", 10, 10)
			waitConverged(t, c)
			tc.checkUsed(t, c)
		})
	}
}

// TestRestartsUnderLoad restarts the replica, the log store and the primary
// while writers run, then checks convergence.
func TestRestartsUnderLoad(t *testing.T) {
	c := startCluster(t, Config{LogStores: 1, Replicas: 2})
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	kv := walshipv1.NewKVServiceClient(c.Conn(c.Primary))
	stop := make(chan struct{})
	var wg sync.WaitGroup
	var errs sync.Map
	for w := 0; w < 4; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				_, err := kv.Put(ctx, &walshipv1.PutRequest{Key: fmt.Sprintf("w%d/%d", w, i%50), Value: []byte(fmt.Sprint(i))})
				if err != nil {
					errs.Store(w, err)
					return
				}
			}
		}()
	}
	if err := c.RestartReplica(ctx, 0); err != nil {
		t.Fatal(err)
	}
	if err := c.RestartLogStore(ctx, 0); err != nil {
		t.Fatal(err)
	}
	if err := c.RestartReplica(ctx, 1); err != nil {
		t.Fatal(err)
	}
	close(stop)
	wg.Wait()
	errs.Range(func(k, v any) bool { t.Errorf("writer %v: %v", k, v); return true })
	waitConverged(t, c)
	// The log store caught up after its restart.
	ps, err := c.Status(ctx, c.Primary)
	if err != nil {
		t.Fatal(err)
	}
	ls := walshipv1.NewLogStoreServiceClient(c.Conn(c.LogStores[0]))
	for {
		st, err := ls.Status(ctx, &walshipv1.LogStoreServiceStatusRequest{})
		if err != nil {
			t.Fatal(err)
		}
		if st.DurableLsn >= ps.DurableLsn {
			break
		}
		// Nudge: a sync-logstore commit waits (by notification) until the
		// log store acks it.
		if _, err := kv.Put(ctx, &walshipv1.PutRequest{Key: "nudge", Value: []byte("x"), Policy: &walshipv1.CommitPolicy{Logstore: walshipv1.LogStoreAck_LOG_STORE_ACK_SYNC}}); err != nil {
			t.Fatalf("log store did not catch up after its restart: %v", err)
		}
	}
	// And the primary restarts with everything.
	if err := c.RestartPrimary(ctx); err != nil {
		t.Fatal(err)
	}
	kv = walshipv1.NewKVServiceClient(c.Conn(c.Primary))
	if _, err := kv.Put(ctx, &walshipv1.PutRequest{Key: "after-primary-restart", Value: []byte("v")}); err != nil {
		t.Fatal(err)
	}
	waitConverged(t, c)
}

// TestSyncCommitFlushesLazyReplicas: replicas and log stores defer their
// fsync (FlushDelay) while nobody waits on them, but a sync commit's streams
// ask for an ack at once at the stage it waits at (write: no flush needed;
// flush and apply: an immediate flush) — with a flush delay and heartbeats
// far longer than the commit's sync timeout, the commit can only succeed
// that way.
func TestSyncCommitFlushesLazyReplicas(t *testing.T) {
	c := startCluster(t, Config{Replicas: 2, LogStores: 1,
		Primary:  func(p *primary.Config) { p.HeartbeatInterval = time.Minute; p.ReplicaTimeout = time.Hour },
		Replica:  func(_ int, r *replica.Config) { r.FlushDelay = time.Second; r.HeartbeatInterval = time.Minute },
		LogStore: func(_ int, l *logstore.Config) { l.FlushDelay = time.Second },
	})
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	kv := walshipv1.NewKVServiceClient(c.Conn(c.Primary))
	// Each stage on its own first (the replicas ack at once at exactly the
	// stage asked for), then apply with log store acks, repeatedly.
	for _, level := range []walshipv1.SyncLevel{walshipv1.SyncLevel_SYNC_LEVEL_WRITE, walshipv1.SyncLevel_SYNC_LEVEL_FLUSH} {
		if _, err := kv.Put(ctx, &walshipv1.PutRequest{Key: "stage/" + level.String(), Value: []byte("v"), Policy: &walshipv1.CommitPolicy{
			Replication: walshipv1.ReplicationMode_REPLICATION_MODE_SYNC, SyncReplicas: 2, SyncLevel: level,
			SyncTimeout: durationpb.New(500 * time.Millisecond)}}); err != nil {
			t.Fatalf("sync commit at %v against replicas with a 1s flush delay: %v", level, err)
		}
	}
	for i := 0; i < 5; i++ {
		p, err := kv.Put(ctx, &walshipv1.PutRequest{Key: fmt.Sprintf("k%d", i), Value: []byte("v"), Policy: &walshipv1.CommitPolicy{
			Replication: walshipv1.ReplicationMode_REPLICATION_MODE_SYNC, SyncReplicas: 2, SyncLevel: walshipv1.SyncLevel_SYNC_LEVEL_APPLY,
			Logstore: walshipv1.LogStoreAck_LOG_STORE_ACK_SYNC, SyncTimeout: durationpb.New(500 * time.Millisecond)}})
		if err != nil {
			t.Fatalf("sync-apply + log store sync commit %d against replicas and a log store with a 1s flush delay: %v", i, err)
		}
		// Applied on both: a read there shows the commit as soon as the
		// replica hears the commit watermark reach it, which the primary
		// sends at once (the wait is for that message, never for the
		// 1 s flush delay or the minute-long heartbeat).
		for _, r := range c.Replicas {
			g, err := walshipv1.NewKVServiceClient(c.Conn(r)).Get(ctx, &walshipv1.GetRequest{Key: fmt.Sprintf("k%d", i), MinLsn: p.Lsn,
				WaitTimeout: durationpb.New(500 * time.Millisecond)})
			if err != nil || g.AppliedLsn < p.Lsn {
				t.Fatalf("%s after a sync-apply commit: %v %v", r.Name, g, err)
			}
		}
	}
}

// TestNodeGoroutinesCarryItsName: a node runs under the pprof label
// node=<name> (pprof.Do puts it on the context and on the goroutine; the
// runtime copies a goroutine's labels to every goroutine it starts), so a
// CPU profile of an in-process cluster splits by node.
func TestNodeGoroutinesCarryItsName(t *testing.T) {
	got := make(chan string, 1)
	n := &Node{Name: "replica-7", run: func(ctx context.Context) error {
		ch := make(chan string, 1)
		go func() { // a goroutine the node starts
			v, _ := pprof.Label(ctx, "node")
			ch <- v
		}()
		got <- <-ch
		<-ctx.Done()
		return nil
	}}
	n.start()
	if v := <-got; v != "replica-7" {
		t.Errorf("label node = %q, want replica-7", v)
	}
	if err := n.stop(); err != nil {
		t.Fatal(err)
	}
}

// TestEmptyLogStoreVouchesForNothing: a log store whose WAL is anchored
// far ahead but holds no batch (a segment header written before a crash)
// reports nothing durable. The primary ships it everything from its own
// first LSN, and a commit that waits for the log store returns only once
// the log store holds it — not at once, on the anchor's word.
func TestEmptyLogStoreVouchesForNothing(t *testing.T) {
	dir := t.TempDir()
	l, err := wal.Open(wal.Options{Dir: filepath.Join(dir, "logstore-0", "wal"), SegmentSize: 64 << 10})
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Reset(1000); err != nil {
		t.Fatal(err)
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	c := startCluster(t, Config{Dir: dir, LogStores: 1})
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	ls := walshipv1.NewLogStoreServiceClient(c.Conn(c.LogStores[0]))
	if st, err := ls.Status(ctx, &walshipv1.LogStoreServiceStatusRequest{}); err != nil || st.FirstLsn != 0 || st.DurableLsn != 0 {
		t.Fatalf("anchored, empty log store: status %v, %v; want first and durable LSN 0", st, err)
	}
	kv := walshipv1.NewKVServiceClient(c.Conn(c.Primary))
	put, err := kv.Put(ctx, &walshipv1.PutRequest{Key: "k", Value: []byte("v"), Policy: &walshipv1.CommitPolicy{
		Logstore: walshipv1.LogStoreAck_LOG_STORE_ACK_SYNC, SyncTimeout: durationpb.New(30 * time.Second)}})
	if err != nil {
		t.Fatal(err)
	}
	st, err := ls.Status(ctx, &walshipv1.LogStoreServiceStatusRequest{})
	if err != nil || st.FirstLsn == 0 || st.FirstLsn > put.Lsn || st.DurableLsn < put.Lsn {
		t.Fatalf("log store after a commit that waited for it (LSN %d): %v, %v; want it to hold that LSN", put.Lsn, st, err)
	}
}

// TestShipDelayOnlyForWhatNoOneWaitsOn: with the longest --ship-delay the
// default lease allows (a tenth of it), a
// commit that waits on a replica or on the log stores is never held back
// by it (no delay is counted while they commit, at every stage), while
// batches no commit waits on are, and still reach the replica and the log
// store.
func TestShipDelayOnlyForWhatNoOneWaitsOn(t *testing.T) {
	c := startCluster(t, Config{LogStores: 1, Replicas: 1, Primary: func(cfg *primary.Config) { cfg.ShipDelay = cfg.LeaseTimeout / 10 }})
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	kv := walshipv1.NewKVServiceClient(c.Conn(c.Primary))
	reg := c.Primary.Registry
	delays := func(to string) float64 {
		return metric(t, reg, "walship_ship_delays_total", map[string]string{"to": to})
	}
	// Settle what the cluster's start wrote (its epoch record) first.
	waitConverged(t, c)
	testkit.Until(t, "the log store has the epoch record", func() bool {
		st, err := c.Status(ctx, c.Primary)
		return err == nil && logStoreFlushed(st) >= st.VisibleLsn
	})
	before := map[string]float64{"replica": delays("replica"), "logstore": delays("logstore")}

	waited := []*walshipv1.CommitPolicy{
		{Replication: walshipv1.ReplicationMode_REPLICATION_MODE_SYNC, SyncLevel: walshipv1.SyncLevel_SYNC_LEVEL_WRITE},
		{Replication: walshipv1.ReplicationMode_REPLICATION_MODE_SYNC, SyncLevel: walshipv1.SyncLevel_SYNC_LEVEL_FLUSH},
		{Replication: walshipv1.ReplicationMode_REPLICATION_MODE_SYNC, SyncLevel: walshipv1.SyncLevel_SYNC_LEVEL_APPLY},
		{Durability: walshipv1.Durability_DURABILITY_ASYNC, Replication: walshipv1.ReplicationMode_REPLICATION_MODE_SYNC, SyncLevel: walshipv1.SyncLevel_SYNC_LEVEL_WRITE},
		{Replication: walshipv1.ReplicationMode_REPLICATION_MODE_SYNC, SyncLevel: walshipv1.SyncLevel_SYNC_LEVEL_FLUSH, Logstore: walshipv1.LogStoreAck_LOG_STORE_ACK_SYNC},
	}
	for i, pol := range waited {
		pol.SyncReplicas, pol.SyncTimeout = 1, durationpb.New(time.Minute)
		if _, err := kv.Put(ctx, &walshipv1.PutRequest{Key: fmt.Sprintf("waited/%d", i), Value: []byte("v"), Policy: pol}); err != nil {
			t.Fatalf("commit %d (%v): %v", i, pol, err)
		}
	}
	if got := delays("replica"); got != before["replica"] {
		t.Errorf("%v ship delays to the replica while every commit waited on it", got-before["replica"])
	}
	// Only the last waited on the log store; the others' batches went
	// before it, so none was held back either... unless the stream
	// lingered on one of them: the log store count is checked after a
	// commit that waits on it alone.
	before["logstore"] = delays("logstore")
	if _, err := kv.Put(ctx, &walshipv1.PutRequest{Key: "logstore", Value: []byte("v"), Policy: &walshipv1.CommitPolicy{
		Logstore: walshipv1.LogStoreAck_LOG_STORE_ACK_SYNC, SyncTimeout: durationpb.New(time.Minute)}}); err != nil {
		t.Fatal(err)
	}
	if got := delays("logstore"); got != before["logstore"] {
		t.Errorf("%v ship delays to the log store while the commit waited on it", got-before["logstore"])
	}

	// Async everything: held back, and there all the same.
	last, err := kv.Put(ctx, &walshipv1.PutRequest{Key: "async", Value: []byte("v"), Policy: &walshipv1.CommitPolicy{
		Replication: walshipv1.ReplicationMode_REPLICATION_MODE_ASYNC, Logstore: walshipv1.LogStoreAck_LOG_STORE_ACK_ASYNC}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := walshipv1.NewKVServiceClient(c.Conn(c.Replicas[0])).Get(ctx, &walshipv1.GetRequest{Key: "async", MinLsn: last.Lsn, WaitTimeout: durationpb.New(30 * time.Second)}); err != nil {
		t.Fatalf("the replica never got the async commit: %v", err)
	}
	testkit.Until(t, "the log store has the async commit", func() bool {
		st, err := c.Status(ctx, c.Primary)
		return err == nil && logStoreFlushed(st) >= last.Lsn
	})
	if delays("replica") <= before["replica"] || delays("logstore") <= before["logstore"] {
		t.Errorf("ship delays: replica %v → %v, log store %v → %v; want both held back", before["replica"], delays("replica"), before["logstore"], delays("logstore"))
	}
}

// logStoreFlushed is the durable LSN the primary's status reports for its
// (first) log store.
func logStoreFlushed(st *walshipv1.StatusResponse) uint64 {
	for _, p := range st.GetPeers() {
		if p.GetRole() == walshipv1.Role_ROLE_LOGSTORE {
			return p.GetFlushedLsn()
		}
	}
	return 0
}

// TestSyncApplyIsReadable: a commit at SYNC_LEVEL_APPLY is answered once
// the replicas that acknowledged it serve it to plain reads (their
// visible LSN), not merely once they applied it. The contract here is 2
// replicas at flush: with one of them down the commit watermark stalls,
// so the live replica applies new commits but serves none of them, and
// an apply-level commit on it fails its sync timeout instead of being
// answered unreadable there. Both up, an apply-level commit is readable
// on both the moment it is answered.
func TestSyncApplyIsReadable(t *testing.T) {
	c := startCluster(t, Config{LogStores: 1, Replicas: 2, Primary: func(p *primary.Config) {
		p.Policy.Replication = walshipv1.ReplicationMode_REPLICATION_MODE_SYNC
		p.Policy.SyncReplicas = 2
		p.Policy.SyncLevel = walshipv1.SyncLevel_SYNC_LEVEL_FLUSH
	}})
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	kv := walshipv1.NewKVServiceClient(c.Conn(c.Primary))
	apply := func(k uint32, timeout time.Duration) *walshipv1.CommitPolicy {
		return &walshipv1.CommitPolicy{Replication: walshipv1.ReplicationMode_REPLICATION_MODE_SYNC, SyncReplicas: k,
			SyncLevel: walshipv1.SyncLevel_SYNC_LEVEL_APPLY, SyncTimeout: durationpb.New(timeout)}
	}
	readable := func(i int, key string, lsn uint64) bool {
		g, err := walshipv1.NewKVServiceClient(c.Conn(c.Replicas[i])).Get(ctx, &walshipv1.GetRequest{Key: key})
		return err == nil && g.Found && g.VersionLsn == lsn
	}
	p, err := kv.Put(ctx, &walshipv1.PutRequest{Key: "both", Value: []byte("v"), Policy: apply(2, 10*time.Second)})
	if err != nil {
		t.Fatal(err)
	}
	for i := range c.Replicas {
		if !readable(i, "both", p.Lsn) {
			t.Fatalf("replica-%d right after a sync-apply Put of both: not readable", i)
		}
	}

	if err := c.StopReplica(1); err != nil {
		t.Fatal(err)
	}
	_, err = kv.Put(ctx, &walshipv1.PutRequest{Key: "one", Value: []byte("v"), Policy: apply(1, 500*time.Millisecond)})
	if status.Code(err) != codes.Unavailable {
		t.Fatalf("sync-apply K=1 while the commit watermark stalls: %v; want UNAVAILABLE", err)
	}
	if !strings.Contains(err.Error(), "at apply") {
		t.Errorf("the error does not name the stage: %v", err)
	}
	// The contract's member comes back: the watermark, and with it the
	// live replica's reads, move on.
	if err := c.RestartReplica(ctx, 1); err != nil {
		t.Fatal(err)
	}
	p, err = kv.Put(ctx, &walshipv1.PutRequest{Key: "again", Value: []byte("v"), Policy: apply(1, 10*time.Second)})
	if err != nil {
		t.Fatal(err)
	}
	if !readable(0, "again", p.Lsn) && !readable(1, "again", p.Lsn) {
		t.Fatal("a sync-apply K=1 Put is readable on neither replica")
	}
}
