package cluster

import (
	"context"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	walshipv1 "github.com/walship/walship/gen/walship/v1"
	"github.com/walship/walship/services/primary"
)

// TestAsyncContractWatermarkWaitsForLogStores: under a contract of the
// primary's fsync alone (no sync replica, no log store ack), a promotion
// needs no member, only a log store majority, so only what a majority of
// the log stores holds survives a failover. The commit watermark — what
// watches and replica reads show — must not pass it: with the only log
// store stopped, a write the primary made durable is visible on the
// primary but never watched.
func TestAsyncContractWatermarkWaitsForLogStores(t *testing.T) {
	c := startCluster(t, Config{LogStores: 1, Replicas: 1, Primary: func(p *primary.Config) {
		p.Policy.Replication = walshipv1.ReplicationMode_REPLICATION_MODE_ASYNC
		p.Policy.SyncReplicas = 1 // counts only under sync replication
		p.Policy.LogStore = walshipv1.LogStoreAck_LOG_STORE_ACK_ASYNC
		p.LeaseTimeout = time.Minute // the primary keeps taking writes with its log store gone
	}})
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	kv := walshipv1.NewKVServiceClient(c.Conn(c.Primary))
	watch := func(from uint64) walshipv1.KVService_WatchClient {
		w, err := kv.Watch(ctx, &walshipv1.WatchRequest{Prefix: "cm/", StartLsn: from, ProgressInterval: durationpb.New(20 * time.Millisecond)})
		if err != nil {
			t.Fatal(err)
		}
		return w
	}
	first, err := kv.Put(ctx, &walshipv1.PutRequest{Key: "cm/a", Value: []byte("1")})
	if err != nil {
		t.Fatal(err)
	}
	// With the log store up, the write is watched.
	if m, err := watch(first.Lsn).Recv(); err != nil || len(m.GetTxns().GetTxns()) == 0 {
		t.Fatalf("watch from LSN %d with the log store up: %v, %v", first.Lsn, m, err)
	}
	if err := c.StopNode(c.LogStores[0]); err != nil {
		t.Fatal(err)
	}
	second, err := kv.Put(ctx, &walshipv1.PutRequest{Key: "cm/a", Value: []byte("2")})
	if err != nil {
		t.Fatal(err)
	}
	if g, err := kv.Get(ctx, &walshipv1.GetRequest{Key: "cm/a"}); err != nil || string(g.Value) != "2" {
		t.Fatalf("Get on the primary = %v, %v; want 2", g, err)
	}
	w := watch(first.Lsn + 1) // the next position: a watch from further ahead waits for the watermark
	for range 10 {
		m, err := w.Recv()
		if err != nil {
			t.Fatal(err)
		}
		if m.GetTxns() != nil || m.GetProgress().GetLsn() >= second.Lsn {
			t.Fatalf("the watch reached LSN %d, which no log store holds: %v", second.Lsn, m)
		}
	}
}
