package client_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/walship/walship/app/cluster"
	walshipv1 "github.com/walship/walship/gen/walship/v1"
	"github.com/walship/walship/internal/testkit"
	"github.com/walship/walship/pkg/client"
	"github.com/walship/walship/services/primary"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// TestGetStale: a bounded-staleness read through the client, given every
// node's address (the log store's too), is served by a replica within the
// bound — off the primary — and by the primary when every replica is
// further behind or away; a client that knows only the primary, once it
// is gone, gets an error.
//
// The contract asks both replicas to acknowledge a commit; with
// replica-1 stopped, commits made under a weaker policy are visible on
// the primary but never acknowledged under the contract, so replica-0
// serves reads at the last acknowledged state and lags behind the
// primary by those commits.
func TestGetStale(t *testing.T) {
	c, err := cluster.Start(t.Context(), cluster.Config{Dir: t.TempDir(), LogStores: 1, Replicas: 2,
		Primary: func(p *primary.Config) {
			p.Policy.Replication = walshipv1.ReplicationMode_REPLICATION_MODE_SYNC
			p.Policy.SyncReplicas = 2
			p.Policy.SyncLevel = walshipv1.SyncLevel_SYNC_LEVEL_WRITE
		}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Stop() })
	cl, err := client.New(nodeAddrs(c), client.Options{Retry: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	acked, err := cl.Put(ctx, "k", []byte("acked"), nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range c.Replicas {
		if _, err := cl.GetAt(ctx, r.Addr, "k", acked); err != nil {
			t.Fatalf("%s at LSN %d: %v", r.Name, acked, err)
		}
	}
	// Every replica is caught up: the read is a replica's.
	for range 5 {
		got, err := cl.GetStale(ctx, "k", 10)
		if err != nil || string(got.GetValue()) != "acked" || got.GetAppliedLsn() < acked {
			t.Fatalf("GetStale with every replica caught up = %v, %v; want acked at >= %d", got, err, acked)
		}
	}

	// replica-1 away: later commits are not acknowledged under the
	// contract, and replica-0 serves the state at acked.
	if err := c.StopNode(c.Replicas[1]); err != nil {
		t.Fatal(err)
	}
	async := &walshipv1.CommitPolicy{Replication: walshipv1.ReplicationMode_REPLICATION_MODE_ASYNC}
	var last uint64
	for i := range 20 {
		if last, err = cl.Put(ctx, "k", []byte(fmt.Sprintf("v%d", i)), async); err != nil {
			t.Fatal(err)
		}
	}
	behind := last - acked
	kv0 := walshipv1.NewKVServiceClient(c.Conn(c.Replicas[0]))
	testkit.Until(t, "replica-0 to know it is behind", func() bool {
		_, err := kv0.Get(ctx, &walshipv1.GetRequest{Key: "k", MaxLagLsns: behind - 1})
		return status.Code(err) == codes.FailedPrecondition
	})

	// Within the bound: replica-0's state, stale but no staler than asked.
	got, err := cl.GetStale(ctx, "k", behind+10)
	if err != nil || string(got.GetValue()) != "acked" || got.GetAppliedLsn() != acked {
		t.Fatalf("GetStale within replica-0's lag = %v, %v; want replica-0's acked at %d", got, err, acked)
	}
	// Tighter than every replica: the primary answers, with the latest.
	got, err = cl.GetStale(ctx, "k", behind/2)
	if err != nil || string(got.GetValue()) != "v19" || got.GetAppliedLsn() < last {
		t.Fatalf("GetStale tighter than every replica = %v, %v; want the primary's v19 at >= %d", got, err, last)
	}

	// A client that knows only the primary, which is gone: an error.
	only, err := client.New([]string{c.Primary.Addr}, client.Options{Retry: 300 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer only.Close()
	if _, err := only.Primary(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := only.GetStale(ctx, "k", 10); err != nil {
		t.Fatalf("GetStale on the primary alone: %v", err)
	}
	if err := c.StopNode(c.Primary); err != nil {
		t.Fatal(err)
	}
	if got, err := only.GetStale(ctx, "k", 10); err == nil {
		t.Fatalf("GetStale with the only node known stopped = %v; want an error", got)
	}
}
