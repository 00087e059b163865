package primary

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

// BenchmarkCommit measures commits through the real gRPC server on
// loopback into a WAL on the real disk, with 1, 8 and 64 concurrent
// committers, and reports commits/s and commits per fsync (group commit).
// Compare commits/s with internal/wal's BenchmarkDiskFdatasync, the disk's
// own rate for one 4 KiB append+fdatasync.
func BenchmarkCommit(b *testing.B) {
	for _, durability := range []walshipv1.Durability{walshipv1.Durability_DURABILITY_SYNC, walshipv1.Durability_DURABILITY_ASYNC} {
		for _, committers := range []int{1, 8, 64} {
			name := fmt.Sprintf("durability=%s/committers=%d", durabilityLabel(durability), committers)
			b.Run(name, func(b *testing.B) { benchCommit(b, durability, committers) })
		}
	}
}

func benchCommit(b *testing.B, durability walshipv1.Durability, committers int) {
	cfg := DefaultConfig()
	cfg.Listen = "127.0.0.1:0"
	cfg.DataDir = b.TempDir()
	cfg.Policy.Durability = durability
	cfg.Policy.Replication = walshipv1.ReplicationMode_REPLICATION_MODE_DISABLED
	s, err := New(cfg)
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			b.Error(err)
		}
	}()
	// One connection, as an application holds one gRPC ClientConn; its
	// streams multiplex the committers.
	conn := dialBench(b, s.Addr())
	defer conn.Close()
	kv := walshipv1.NewKVServiceClient(conn)
	value := make([]byte, 100)
	var next atomic.Int64
	syncs0, n0, cpu0 := s.wal.Stats().Syncs, b.N, cpustat.MustSelf()
	b.ResetTimer()
	start := time.Now()
	var wg sync.WaitGroup
	for c := 0; c < committers; c++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := next.Add(1)
				if i > int64(b.N) {
					return
				}
				key := fmt.Sprintf("warehouse/%d/district/%d/customer/%d", i%10, i%7, i)
				if _, err := kv.Put(context.Background(), &walshipv1.PutRequest{Key: key, Value: value}); err != nil {
					b.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	b.StopTimer()
	syncs := s.wal.Stats().Syncs - syncs0
	b.ReportMetric(float64(n0)/elapsed.Seconds(), "commits/s")
	// Cores busy (client and server, one process): well under 2 on this
	// machine means the run is bound by latency, not CPU.
	b.ReportMetric((cpustat.MustSelf()-cpu0).Seconds()/elapsed.Seconds(), "cores")
	if syncs > 0 {
		b.ReportMetric(float64(n0)/float64(syncs), "commits/fsync")
	}
}
