package cluster

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	walshipv1 "github.com/walship/walship/gen/walship/v1"
	"github.com/walship/walship/internal/cpustat"
)

// BenchmarkReplicatedCommit measures durable commits (durability sync)
// through the real gRPC server of an in-process cluster — a primary, two
// replicas (none for replication disabled) and a log store, as `walship
// bench` starts — with 1 and 8 concurrent committers, in each replication
// mode. It reports commits/s and the
// process's CPU time per commit (user+system, every node and the
// committers together): on two shared cores the replication modes differ
// mostly in that CPU, and the throughput of a latency-bound run is noisy.
func BenchmarkReplicatedCommit(b *testing.B) {
	for _, m := range []struct {
		name  string
		repl  walshipv1.ReplicationMode
		level walshipv1.SyncLevel
	}{
		{"disabled", walshipv1.ReplicationMode_REPLICATION_MODE_DISABLED, 0},
		{"async", walshipv1.ReplicationMode_REPLICATION_MODE_ASYNC, 0},
		{"sync-write", walshipv1.ReplicationMode_REPLICATION_MODE_SYNC, walshipv1.SyncLevel_SYNC_LEVEL_WRITE},
		{"sync-flush", walshipv1.ReplicationMode_REPLICATION_MODE_SYNC, walshipv1.SyncLevel_SYNC_LEVEL_FLUSH},
		{"sync-apply", walshipv1.ReplicationMode_REPLICATION_MODE_SYNC, walshipv1.SyncLevel_SYNC_LEVEL_APPLY},
	} {
		pol := &walshipv1.CommitPolicy{Replication: m.repl, Durability: walshipv1.Durability_DURABILITY_SYNC, SyncReplicas: 1, SyncLevel: m.level}
		for _, n := range []int{1, 8} {
			b.Run(fmt.Sprintf("replication=%s/committers=%d", m.name, n), func(b *testing.B) { benchReplicated(b, pol, n) })
		}
	}
}

func benchReplicated(b *testing.B, pol *walshipv1.CommitPolicy, committers int) {
	replicas := 2
	if pol.Replication == walshipv1.ReplicationMode_REPLICATION_MODE_DISABLED {
		replicas = 0
	}
	c, err := Start(context.Background(), Config{Dir: b.TempDir(), Replicas: replicas, LogStores: 1})
	if err != nil {
		b.Fatal(err)
	}
	defer func() {
		if err := c.Stop(); err != nil {
			b.Error(err)
		}
	}()
	kv := walshipv1.NewKVServiceClient(c.Conn(c.Primary))
	value := make([]byte, 100)
	var next atomic.Int64
	fsyncs := func(nodes ...*Node) (n float64) {
		for _, node := range nodes {
			n += metric(b, node.Registry, "walship_wal_fsync_duration_seconds", nil)
		}
		return n
	}
	primary0, replicas0 := fsyncs(c.Primary), fsyncs(c.Replicas...)
	batches0 := metric(b, c.Primary.Registry, "walship_wal_batches_total", nil)
	cpu0 := cpustat.MustSelf()
	b.ResetTimer()
	start := time.Now()
	var wg sync.WaitGroup
	for range committers {
		wg.Go(func() {
			for {
				i := next.Add(1)
				if i > int64(b.N) {
					return
				}
				key := fmt.Sprintf("warehouse/%d/district/%d/customer/%d", i%10, i%7, i)
				if _, err := kv.Put(context.Background(), &walshipv1.PutRequest{Key: key, Value: value, Policy: pol}); err != nil {
					b.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	b.StopTimer()
	b.ReportMetric(float64(b.N)/elapsed.Seconds(), "commits/s")
	b.ReportMetric(float64((cpustat.MustSelf()-cpu0).Microseconds())/float64(b.N), "cpu-µs/commit")
	// fsyncs per commit: the primary's, and the replicas' together (each
	// costs the disk a flush and, on this VM, ~100 µs of CPU).
	b.ReportMetric((fsyncs(c.Primary)-primary0)/float64(b.N), "primary-fsyncs/commit")
	if replicas > 0 {
		b.ReportMetric((fsyncs(c.Replicas...)-replicas0)/float64(b.N), "replica-fsyncs/commit")
	}
	// A WAL batch is one message to each replica and log store.
	if n := metric(b, c.Primary.Registry, "walship_wal_batches_total", nil) - batches0; n > 0 {
		b.ReportMetric(float64(b.N)/n, "commits/batch")
	}
}
