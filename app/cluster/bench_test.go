package cluster

import (
	"context"
	"fmt"
	"slices"
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

// BenchmarkMixedPolicies measures what answering commits in LSN order
// costs weak commits beside strong ones: committers with async durability
// and async replication run beside one committer whose commits wait for a
// replica to apply them (or, as the baseline, beside none). Each weak
// commit sequenced behind a waiting strong one is answered only once that
// one is. It reports the weak commits' rate and median latency; the
// strong committer's own rate is reported too.
func BenchmarkMixedPolicies(b *testing.B) {
	weak := &walshipv1.CommitPolicy{Durability: walshipv1.Durability_DURABILITY_ASYNC, Replication: walshipv1.ReplicationMode_REPLICATION_MODE_ASYNC}
	strong := &walshipv1.CommitPolicy{Durability: walshipv1.Durability_DURABILITY_SYNC, Replication: walshipv1.ReplicationMode_REPLICATION_MODE_SYNC,
		SyncReplicas: 1, SyncLevel: walshipv1.SyncLevel_SYNC_LEVEL_APPLY}
	for _, strongs := range []int{0, 1} {
		b.Run(fmt.Sprintf("weak=7/strong=%d", strongs), func(b *testing.B) {
			c, err := Start(context.Background(), Config{Dir: b.TempDir(), Replicas: 2, LogStores: 1})
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
			var strongDone atomic.Int64
			stop := make(chan struct{})
			var swg sync.WaitGroup
			for s := range strongs {
				swg.Go(func() {
					for i := 0; ; i++ {
						select {
						case <-stop:
							return
						default:
						}
						if _, err := kv.Put(context.Background(), &walshipv1.PutRequest{Key: fmt.Sprintf("strong/%d/%d", s, i), Value: value, Policy: strong}); err != nil {
							b.Error(err)
							return
						}
						strongDone.Add(1)
					}
				})
			}
			lat := make([][]time.Duration, 7)
			b.ResetTimer()
			start := time.Now()
			var wg sync.WaitGroup
			for w := range 7 {
				wg.Go(func() {
					for {
						i := next.Add(1)
						if i > int64(b.N) {
							return
						}
						t0 := time.Now()
						if _, err := kv.Put(context.Background(), &walshipv1.PutRequest{Key: fmt.Sprintf("weak/%d", i), Value: value, Policy: weak}); err != nil {
							b.Error(err)
							return
						}
						lat[w] = append(lat[w], time.Since(t0))
					}
				})
			}
			wg.Wait()
			elapsed := time.Since(start)
			b.StopTimer()
			close(stop)
			swg.Wait()
			var all []time.Duration
			for _, l := range lat {
				all = append(all, l...)
			}
			slices.Sort(all)
			b.ReportMetric(float64(b.N)/elapsed.Seconds(), "weak-commits/s")
			if len(all) > 0 {
				b.ReportMetric(float64(all[len(all)/2].Microseconds()), "weak-p50-µs")
				b.ReportMetric(float64(all[len(all)*99/100].Microseconds()), "weak-p99-µs")
			}
			b.ReportMetric(float64(strongDone.Load())/elapsed.Seconds(), "strong-commits/s")
		})
	}
}
