package primary

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	walshipv1 "github.com/walship/walship/gen/walship/v1"
	"github.com/walship/walship/internal/testkit"
	"github.com/walship/walship/internal/vfs"
)

// TestLeaseOutlastsAStalledLogStoreDisk: a log store whose WAL fsync
// hangs for several leases — a slow disk under a bulk load — takes no
// batch, but still echoes the primary's lease heartbeats, so the primary
// keeps answering async writes (it did not before: the echo waited behind
// the stalled round, and the primary refused everything "not heard from a
// log store majority"). Once the disk returns, the batches are durable.
func TestLeaseOutlastsAStalledLogStoreDisk(t *testing.T) {
	fs := vfs.NewMem()
	cfg := testConfig(t, filepath.Join(t.TempDir(), "p"))
	cfg.LogStores = []string{runLogStore(t, fs)}
	cfg.LeaseTimeout = 500 * time.Millisecond
	cfg.Policy.Durability = walshipv1.Durability_DURABILITY_ASYNC
	cfg.Policy.Replication = walshipv1.ReplicationMode_REPLICATION_MODE_ASYNC
	r := start(t, cfg)
	put := func(k string) error {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_, err := r.kv.Put(ctx, &walshipv1.PutRequest{Key: k, Value: []byte("v")})
		return err
	}
	testkit.UntilWithin(t, 30*time.Second, "the primary to answer", func() bool { return put("first") == nil })
	// The lease stream is up: the log store has admitted it.
	testkit.UntilWithin(t, 30*time.Second, "an echo on the lease stream", func() bool { return r.s.leaseEchoes.Load() > 0 })

	entered, unblock := fs.HoldNextSync(".wal")
	t.Cleanup(unblock) // runs first: the log store can stop
	if err := put("stalls-the-log-store"); err != nil {
		t.Fatal(err)
	}
	select {
	case <-entered:
	case <-time.After(20 * time.Second):
		t.Fatal("the log store's fsync never began")
	}
	stalled := time.Now()
	// Time passing is the condition here: four leases.
	testkit.UntilWithin(t, 30*time.Second, "four leases to pass", func() bool { return time.Since(stalled) > 4*cfg.LeaseTimeout })
	if err := put("during-the-stall"); err != nil {
		t.Fatalf("Put %v after the log store's disk stalled for %v: %v", cfg.LeaseTimeout, time.Since(stalled), err)
	}
	if !r.s.HasLease() {
		t.Fatal("the primary lost its lease while its log store's disk stalled")
	}
	unblock()
}

// TestLeaseUnderAJointRecord: putting a joint record in force keeps the
// lease while a majority of each half echoes, and ends it (at once: the
// new half was never heard) while one does not — as when the primary
// opened on the echoes of {b, c} and a's stream is still starting, and
// the joint half {a, b, x} names a store x that never echoes.
func TestLeaseUnderAJointRecord(t *testing.T) {
	old, joint := [][]string{{"a", "b", "c"}}, [][]string{{"a", "b", "c"}, {"a", "b", "x"}}
	l := newLease(time.Minute, old)
	now := time.Now()
	l.renew("b", now)
	l.renew("c", now)
	if !l.valid() {
		t.Fatal("no lease from b and c of {a, b, c}")
	}
	l.setHalves(joint)
	if l.valid() {
		t.Fatal("a lease under {a, b, x} with only b heard")
	}
	l.renew("a", now)
	if !l.valid() {
		t.Fatal("no lease under the joint record once a and b echoed")
	}
	// Echoes are kept across a change of halves: a second joint record
	// while a, b and c echo does not cost the lease.
	l.setHalves(old)
	l.setHalves(joint)
	if !l.valid() {
		t.Fatal("lost the lease when a joint record went in force while a majority of each half echoes")
	}
}
