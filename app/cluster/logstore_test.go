package cluster

import (
	"context"
	"errors"
	"io"
	"os"
	"strings"
	"testing"
	"time"

	walshipv1 "github.com/walship/walship/gen/walship/v1"
	"github.com/walship/walship/internal/testkit"
	"github.com/walship/walship/services/primary"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
)

// logStoreSync is a commit that waits for a log store majority, up to
// timeout.
func logStoreSync(timeout time.Duration) *walshipv1.CommitPolicy {
	return &walshipv1.CommitPolicy{Logstore: walshipv1.LogStoreAck_LOG_STORE_ACK_SYNC, SyncTimeout: durationpb.New(timeout)}
}

// wantUnavailable checks that err is UNAVAILABLE with every substring.
func wantUnavailable(t *testing.T, err error, subs ...string) {
	t.Helper()
	if status.Code(err) != codes.Unavailable {
		t.Fatalf("got %v, want UNAVAILABLE", err)
	}
	for _, s := range subs {
		if !strings.Contains(status.Convert(err).Message(), s) {
			t.Fatalf("%v does not say %q", err, s)
		}
	}
}

// lsStatus is log store i's LogStoreService status.
func lsStatus(t *testing.T, c *Cluster, i int) *walshipv1.LogStoreServiceStatusResponse {
	t.Helper()
	st, err := walshipv1.NewLogStoreServiceClient(c.Conn(c.LogStores[i])).Status(t.Context(), &walshipv1.LogStoreServiceStatusRequest{})
	if err != nil {
		t.Fatalf("%s: %v", c.LogStores[i].Name, err)
	}
	return st
}

// readLogStore returns log store i's batches from LSN from to to.
func readLogStore(t *testing.T, c *Cluster, i int, from, to uint64) []*walshipv1.WalBatch {
	t.Helper()
	stream, err := walshipv1.NewLogStoreServiceClient(c.Conn(c.LogStores[i])).Read(t.Context(), &walshipv1.ReadRequest{FromLsn: from, ToLsn: to})
	if err != nil {
		t.Fatal(err)
	}
	var out []*walshipv1.WalBatch
	for {
		resp, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			return out
		}
		if err != nil {
			t.Fatalf("%s: read from LSN %d: %v", c.LogStores[i].Name, from, err)
		}
		out = append(out, resp.Batch)
	}
}

// TestLogStoreQuorum: with three log stores, --logstore-ack sync commits
// go on with one down. With two down, a sync commit fails UNAVAILABLE
// after its sync timeout, naming how many log stores have it; the primary
// then loses its lease (no word from a majority) and refuses every write
// at once, async ones too, as NOT_SERVING. When one comes back the lease
// and sync commits come back, and the log store that was away the longest
// catches up.
func TestLogStoreQuorum(t *testing.T) {
	const lease = 3 * time.Second // longer than the sync timeout below, to see each in turn
	c := startCluster(t, Config{LogStores: 3, Primary: func(p *primary.Config) { p.LeaseTimeout = lease }})
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	kv := walshipv1.NewKVServiceClient(c.Conn(c.Primary))
	put := func(key string, pol *walshipv1.CommitPolicy) (*walshipv1.PutResponse, error) {
		return kv.Put(ctx, &walshipv1.PutRequest{Key: key, Value: []byte("v"), Policy: pol})
	}
	if _, err := put("all-up", logStoreSync(10*time.Second)); err != nil {
		t.Fatal(err)
	}

	// One down: a majority (2 of 3) still acknowledges.
	if err := c.StopNode(c.LogStores[0]); err != nil {
		t.Fatal(err)
	}
	var last uint64
	for i := range 20 {
		start := time.Now()
		p, err := put("one-down", logStoreSync(5*time.Second))
		if err != nil {
			t.Fatalf("sync commit %d with one log store of three down: %v", i, err)
		}
		if d := time.Since(start); d > 2*time.Second {
			t.Errorf("sync commit %d with one log store down took %v", i, d)
		}
		last = p.Lsn
	}
	if !c.PrimaryServer().HasLease() {
		t.Fatal("the primary lost its lease with two log stores of three up")
	}

	// Two down: no majority.
	if err := c.StopNode(c.LogStores[1]); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	_, err := put("two-down", logStoreSync(time.Second))
	if took := time.Since(start); took < time.Second {
		t.Errorf("the commit failed after %v, before its 1s sync timeout", took)
	}
	wantUnavailable(t, err, "not confirmed by a log store majority within 1s", "1 of 3 log store(s) have it, 2 needed")
	testkit.UntilWithin(t, 2*lease, "the primary to lose its lease", func() bool { return !c.PrimaryServer().HasLease() })
	_, err = put("no-lease", &walshipv1.CommitPolicy{Durability: walshipv1.Durability_DURABILITY_ASYNC})
	wantUnavailable(t, err, "has not heard from a log store majority")
	if st, err := c.Status(ctx, c.Primary); err != nil || st.LeaseRemaining.AsDuration() != 0 {
		t.Fatalf("primary status without a lease: %v, %v", st, err)
	}

	// One comes back: the lease and sync commits with it.
	if err := c.RestartLogStore(ctx, 1); err != nil {
		t.Fatal(err)
	}
	testkit.UntilWithin(t, 30*time.Second, "a sync commit with two log stores up again", func() bool {
		p, err := put("back", logStoreSync(5*time.Second))
		if err == nil {
			last = p.Lsn
		}
		return err == nil
	})
	// The one that was away since the start catches up.
	if err := c.RestartLogStore(ctx, 0); err != nil {
		t.Fatal(err)
	}
	testkit.UntilWithin(t, 30*time.Second, "logstore-0 to catch up", func() bool { return lsStatus(t, c, 0).DurableLsn >= last })
}

// TestEmptiedLogStoreRefills: a log store that lost its disk comes back
// empty while the primary keeps only its recent WAL. It refills from its
// peers — a Read from LSN 1 returns what they hold, byte for byte — and
// then takes the primary's stream again.
func TestEmptiedLogStoreRefills(t *testing.T) {
	c := startCluster(t, Config{LogStores: 3, Primary: retainLittle})
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	kv := walshipv1.NewKVServiceClient(c.Conn(c.Primary))
	fill(t, kv, "before", 600, 1000) // ~600 KiB: well past the primary's 256 KiB retention
	p, err := kv.Put(ctx, &walshipv1.PutRequest{Key: "synced", Value: []byte("v"), Policy: logStoreSync(10 * time.Second)})
	if err != nil {
		t.Fatal(err)
	}
	if st, err := c.Status(ctx, c.Primary); err != nil || st.WalFirstLsn <= 2 {
		t.Fatalf("primary WAL from LSN %d (%v): retention dropped nothing, the primary alone could refill", st.GetWalFirstLsn(), err)
	}

	if err := c.StopNode(c.LogStores[0]); err != nil {
		t.Fatal(err)
	}
	if err := os.RemoveAll(c.LogStoreDir(0)); err != nil {
		t.Fatal(err)
	}
	if err := c.RestartLogStore(ctx, 0); err != nil {
		t.Fatal(err)
	}
	testkit.UntilWithin(t, 30*time.Second, "the emptied log store to refill", func() bool {
		st := lsStatus(t, c, 0)
		return !st.Refilling && st.DurableLsn >= p.Lsn
	})
	st := lsStatus(t, c, 0)
	if st.FirstLsn != 1 {
		t.Fatalf("refilled log store starts at LSN %d, want 1 (its peers keep everything)", st.FirstLsn)
	}
	got, want := readLogStore(t, c, 0, 1, p.Lsn), readLogStore(t, c, 1, 1, p.Lsn)
	if len(got) != len(want) {
		t.Fatalf("refilled log store: %d batches to LSN %d, its peer %d", len(got), p.Lsn, len(want))
	}
	for i := range got {
		if !proto.Equal(got[i], want[i]) {
			t.Fatalf("batch %d: refilled %d..%d, peer %d..%d (or different bytes)", i, got[i].FirstLsn, got[i].LastLsn, want[i].FirstLsn, want[i].LastLsn)
		}
	}
	if n := metric(t, c.LogStores[0].Registry, "walship_logstore_refill_batches_total", nil); n == 0 {
		t.Fatal("refilled without copying a batch from a peer")
	}
	// And the primary ships to it again.
	after := shippedAgain(t, c, kv, 0)
	if after <= p.Lsn {
		t.Fatalf("LSN %d after the refill", after)
	}
}

// TestLogStoreAwayPastRetentionRefills: a log store that was away while
// the primary's WAL retention dropped what it missed is no longer stuck:
// the primary ships it what it has, the log store sees the gap, refills
// the missing batches from a peer, and the primary ships to it again.
func TestLogStoreAwayPastRetentionRefills(t *testing.T) {
	c := startCluster(t, Config{LogStores: 3, Primary: retainLittle})
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	kv := walshipv1.NewKVServiceClient(c.Conn(c.Primary))
	fill(t, kv, "before", 20, 100)
	p, err := kv.Put(ctx, &walshipv1.PutRequest{Key: "all-three", Value: []byte("v"), Policy: logStoreSync(10 * time.Second)})
	if err != nil {
		t.Fatal(err)
	}
	testkit.UntilWithin(t, 30*time.Second, "logstore-0 to hold the commit", func() bool { return lsStatus(t, c, 0).DurableLsn >= p.Lsn })
	if err := c.StopNode(c.LogStores[0]); err != nil {
		t.Fatal(err)
	}
	fill(t, kv, "away", 600, 1000)
	st, err := c.Status(ctx, c.Primary)
	if err != nil {
		t.Fatal(err)
	}
	if away := lsStatus(t, c, 1).DurableLsn; st.WalFirstLsn <= p.Lsn+1 || away < st.WalFirstLsn {
		t.Fatalf("primary WAL from LSN %d, logstore-0 ends at %d: no gap", st.WalFirstLsn, p.Lsn)
	}
	if err := c.RestartLogStore(ctx, 0); err != nil {
		t.Fatal(err)
	}
	after := shippedAgain(t, c, kv, 0)
	if n := metric(t, c.LogStores[0].Registry, "walship_logstore_refill_batches_total", nil); n == 0 {
		t.Fatal("caught up past the primary's retention without a refill")
	}
	if got := readLogStore(t, c, 0, p.Lsn, after); len(got) == 0 || got[0].FirstLsn > p.Lsn {
		t.Fatalf("logstore-0 does not hold the LSNs after its gap: %d batches", len(got))
	}
}

// retainLittle makes the primary keep a small WAL, so that a log store
// away for a little while falls behind it.
func retainLittle(p *primary.Config) {
	p.WALRetentionBytes = 256 << 10
	p.SnapshotEveryBytes = 64 << 10
}

// shippedAgain commits and waits until log store i holds the commit: the
// primary ships to it again. It returns the commit's LSN.
func shippedAgain(t *testing.T, c *Cluster, kv walshipv1.KVServiceClient, i int) uint64 {
	t.Helper()
	p, err := kv.Put(t.Context(), &walshipv1.PutRequest{Key: "after", Value: []byte("v"), Policy: logStoreSync(10 * time.Second)})
	if err != nil {
		t.Fatal(err)
	}
	testkit.UntilWithin(t, 30*time.Second, c.LogStores[i].Name+" to take the primary's stream again", func() bool {
		return lsStatus(t, c, i).DurableLsn >= p.Lsn
	})
	return p.Lsn
}
