package cluster

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	walshipv1 "github.com/walship/walship/gen/walship/v1"
	"github.com/walship/walship/services/primary"
)

// BenchmarkReplicaStaleness measures what serving reads at the commit
// watermark costs a replica's staleness: the time from a commit's
// acknowledgement (Put returning, durability sync) until a read of a
// replica with min_lsn at its LSN returns (one loopback round trip
// included) — how long a plain read there still misses it — at up to
// 1,000 commits/s (one committer paced by a 1 ms ticker) in an in-process cluster of a primary,
// two replicas and a log store. contract=durable: no replica in the
// contract (the watermark is the primary's durable LSN, which replicas
// applied up to before); contract=k1-flush: one replica at flush (the
// watermark waits for its ack). It reports the median and p99 (ms).
func BenchmarkReplicaStaleness(b *testing.B) {
	for _, tc := range []struct {
		name string
		pol  func(*primary.Config)
	}{
		{"durable", func(*primary.Config) {}},
		{"k1-flush", func(c *primary.Config) {
			c.Policy.Replication = walshipv1.ReplicationMode_REPLICATION_MODE_SYNC
			c.Policy.SyncReplicas = 1
			c.Policy.SyncLevel = walshipv1.SyncLevel_SYNC_LEVEL_FLUSH
		}},
	} {
		b.Run("contract="+tc.name, func(b *testing.B) { benchStaleness(b, tc.pol) })
	}
}

func benchStaleness(b *testing.B, pol func(*primary.Config)) {
	c, err := Start(context.Background(), Config{Dir: b.TempDir(), Replicas: 2, LogStores: 1, Primary: pol})
	if err != nil {
		b.Fatal(err)
	}
	defer func() {
		if err := c.Stop(); err != nil {
			b.Error(err)
		}
	}()
	kv := walshipv1.NewKVServiceClient(c.Conn(c.Primary))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if _, err := kv.Put(ctx, &walshipv1.PutRequest{Key: "stale/start", Value: []byte("v")}); err != nil {
		b.Fatal(err)
	}
	rkv := walshipv1.NewKVServiceClient(c.Conn(c.Replicas[0]))
	lat := make([]time.Duration, 0, b.N)
	tick := time.NewTicker(time.Millisecond)
	defer tick.Stop()
	b.ResetTimer()
	for i := range b.N {
		<-tick.C
		r, err := kv.Put(ctx, &walshipv1.PutRequest{Key: fmt.Sprintf("stale/%d", i%100), Value: []byte("v")})
		if err != nil {
			b.Fatal(err)
		}
		at := time.Now()
		if _, err := rkv.Get(ctx, &walshipv1.GetRequest{Key: "stale/start", MinLsn: r.Lsn}); err != nil {
			b.Fatal(err)
		}
		lat = append(lat, time.Since(at))
	}
	b.StopTimer()
	slices.Sort(lat)
	b.ReportMetric(float64(lat[len(lat)/2].Microseconds())/1000, "p50_ms")
	b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds())/1000, "p99_ms")
}
