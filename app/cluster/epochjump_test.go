package cluster

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	walshipv1 "github.com/walship/walship/gen/walship/v1"
	"github.com/walship/walship/internal/datadir"
	"github.com/walship/walship/internal/testkit"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// TestOneMessageDoesNotUseUpTheEpochs replays, over mTLS under the
// default policy with the nodes' certificate (which every data node holds
// in Kubernetes), what a gRPC fuzzer found: one Append stream whose
// heartbeat declares epoch 2^63-1, as the primary's own would, made the
// log store promise that epoch; the real primary was refused and stepped
// down, and every later promotion needed an epoch above the maximum. Now
// the log store refuses it (INVALID_ARGUMENT naming the field and the
// bound), as the log store and a replica refuse a fence of that epoch; its
// promise is unchanged, the primary keeps committing through it, and a
// promotion still opens the next epoch.
func TestOneMessageDoesNotUseUpTheEpochs(t *testing.T) {
	sec, err := DevTLS(t.TempDir(), "127.0.0.1")
	if err != nil {
		t.Fatal(err)
	}
	c := startCluster(t, Config{LogStores: 1, Replicas: 1, Failover: true, Security: sec})
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	kv := walshipv1.NewKVServiceClient(c.Conn(c.Primary))
	if _, err := kv.Put(ctx, &walshipv1.PutRequest{Key: "k", Value: []byte("v"), Policy: logStoreSync(10 * time.Second)}); err != nil {
		t.Fatal(err)
	}
	waitConverged(t, c)
	id := clusterID(t, c)
	before := logStoreStatus(t, c, 0)
	st, err := c.Status(ctx, c.Primary)
	if err != nil {
		t.Fatal(err)
	}
	epoch := st.Epoch
	if before.VoteEpoch != epoch {
		t.Fatalf("the log store promised epoch %d, the primary is in epoch %d", before.VoteEpoch, epoch)
	}

	// The fuzzer's message, as the process's node identity sends it.
	app, err := walshipv1.NewLogStoreServiceClient(c.Conn(c.LogStores[0])).Append(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if err := app.Send(&walshipv1.AppendRequest{Heartbeat: &walshipv1.Heartbeat{Epoch: datadir.MaxEpoch, LastLsn: 1, TimeUnixNano: time.Now().UnixNano(),
		ReplyRequested: true, PrimaryId: "primary", PrimaryAddr: c.Primary.Addr, ClusterId: id}}); err != nil {
		t.Fatal(err)
	}
	_, err = app.Recv()
	wantJump(t, "the Append heartbeat", err, "heartbeat.epoch", datadir.MaxEpoch, epoch)
	for _, n := range []*Node{c.LogStores[0], c.Replicas[0]} {
		_, err := walshipv1.NewEpochServiceClient(c.Conn(n)).Fence(ctx, &walshipv1.FenceRequest{Epoch: datadir.MaxEpoch, CandidateId: "replica-0",
			CandidateAddr: c.Replicas[0].Addr, ClusterId: id})
		wantJump(t, "a fence of "+n.Name, err, "epoch", datadir.MaxEpoch, epoch)
	}
	if st := logStoreStatus(t, c, 0); st.VoteEpoch != before.VoteEpoch || st.PrimaryId != before.PrimaryId || st.PrimaryAddr != before.PrimaryAddr {
		t.Fatalf("the log store's promise after the refusals: epoch %d to %s at %s; was epoch %d to %s at %s",
			st.VoteEpoch, st.PrimaryId, st.PrimaryAddr, before.VoteEpoch, before.PrimaryId, before.PrimaryAddr)
	}

	// The primary keeps committing through the log store, in its epoch.
	p, err := kv.Put(ctx, &walshipv1.PutRequest{Key: "k", Value: []byte("after"), Policy: logStoreSync(10 * time.Second)})
	if err != nil {
		t.Fatalf("a log-store-sync commit after the refused message: %v", err)
	}
	if st, err := c.Status(ctx, c.Primary); err != nil || st.Role != walshipv1.Role_ROLE_PRIMARY || !st.TakingWrites || st.Epoch != epoch {
		t.Fatalf("the primary after the refused message: %v, %v", st, err)
	}

	// And failover is not wedged: once the primary is gone, the replica
	// opens the next epoch.
	if err := c.StopNode(c.Primary); err != nil {
		t.Fatal(err)
	}
	resp, err := walshipv1.NewAdminServiceClient(c.Conn(c.Replicas[0])).Promote(ctx, &walshipv1.PromoteRequest{})
	if err != nil || resp.Epoch != epoch+1 {
		t.Fatalf("Promote = %v, %v; want epoch %d", resp, err, epoch+1)
	}
	last := putOn(t, c, c.Replicas[0], "k", "promoted")
	if last <= p.Lsn {
		t.Fatalf("the new primary's write at LSN %d, not after %d", last, p.Lsn)
	}
	testkit.UntilWithin(t, 30*time.Second, "the log store to follow the new primary", func() bool {
		st := logStoreStatus(t, c, 0)
		return st.VoteEpoch == epoch+1 && st.DurableLsn >= last
	})
}

// TestLogStoreAwayForPromotionsFollows: a log store that was down while
// the cluster went through several promotions is several epochs behind
// when it comes back. That is far within datadir.MaxEpochJump: the new
// primary's first heartbeat is taken, and the log store promises its
// epoch and catches up.
func TestLogStoreAwayForPromotionsFollows(t *testing.T) {
	c := startCluster(t, Config{LogStores: 3, Replicas: 2, Failover: true})
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	putOn(t, c, c.Primary, "k", "0")
	before := logStoreStatus(t, c, 0).VoteEpoch
	if err := c.StopNode(c.LogStores[0]); err != nil {
		t.Fatal(err)
	}
	// Every data node in turn becomes the primary: three promotions,
	// with depose (each deposes a primary that serves).
	var last uint64
	for i, n := range []*Node{c.Replicas[0], c.Replicas[1], c.Primary} {
		testkit.UntilWithin(t, 30*time.Second, n.Name+" to promote itself", func() bool {
			_, err := walshipv1.NewAdminServiceClient(c.Conn(n)).Promote(ctx, &walshipv1.PromoteRequest{Depose: true})
			return err == nil
		})
		last = putOn(t, c, n, "k", fmt.Sprint(i+1))
	}
	st, err := c.Status(ctx, c.Primary)
	if err != nil {
		t.Fatal(err)
	}
	if st.Epoch < before+3 {
		t.Fatalf("after three promotions the primary is in epoch %d, from %d", st.Epoch, before)
	}
	if err := c.RestartLogStore(ctx, 0); err != nil {
		t.Fatal(err)
	}
	testkit.UntilWithin(t, 30*time.Second, "logstore-0 to follow the primary of the newest epoch", func() bool {
		ls := logStoreStatus(t, c, 0)
		return ls.VoteEpoch == st.Epoch && ls.DurableLsn >= last
	})
}

// TestPromotionBridgesAJump: one fence of one log store, from a holder
// of the nodes' certificate, at the furthest epoch one message may move
// it (datadir.MaxEpochJump above the cluster's). The log store promises
// it, the primary believes its Status and steps down, and the epoch after
// it is one past the jump for every other node. The promotion fences them
// in steps (datadir.EpochSteps) and opens it; a log store and a replica
// that were down meanwhile come back behind by more than the jump, and
// follow all the same: the primary fences the log store in steps, the
// replica takes its log stores' word for the new primary. Without the
// steps no node would grant the next epoch: failover wedged for good by
// one message.
func TestPromotionBridgesAJump(t *testing.T) {
	c := startCluster(t, Config{LogStores: 3, Replicas: 2, Failover: true})
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	putOn(t, c, c.Primary, "k", "0")
	waitConverged(t, c)
	st, err := c.Status(ctx, c.Primary)
	if err != nil {
		t.Fatal(err)
	}
	epoch := st.Epoch
	id := clusterID(t, c)
	if err := c.StopNode(c.LogStores[2]); err != nil {
		t.Fatal(err)
	}
	if err := c.StopReplica(1); err != nil {
		t.Fatal(err)
	}

	far := epoch + datadir.MaxEpochJump
	resp, err := walshipv1.NewEpochServiceClient(c.Conn(c.LogStores[0])).Fence(ctx, &walshipv1.FenceRequest{Epoch: far, CandidateId: "x", CandidateAddr: "127.0.0.1:1", ClusterId: id})
	if err != nil || !resp.Granted {
		t.Fatalf("fence of logstore-0 at epoch %d: %v, %v", far, resp, err)
	}
	testkit.UntilWithin(t, 30*time.Second, "the primary to step down", func() bool {
		st, err := c.Status(ctx, c.Primary)
		return err == nil && st.Role == walshipv1.Role_ROLE_REPLICA
	})

	var promoted *walshipv1.PromoteResponse
	testkit.UntilWithin(t, 30*time.Second, "replica-0 to promote itself", func() bool {
		promoted, err = walshipv1.NewAdminServiceClient(c.Conn(c.Replicas[0])).Promote(ctx, &walshipv1.PromoteRequest{})
		return err == nil
	})
	if promoted.Epoch != far+1 {
		t.Fatalf("promoted to epoch %d; want %d, the one after the fenced log store's", promoted.Epoch, far+1)
	}
	last := putOn(t, c, c.Replicas[0], "k", "1")
	if st := logStoreStatus(t, c, 1); st.VoteEpoch != far+1 {
		t.Fatalf("logstore-1 after the promotion: promised epoch %d; want %d", st.VoteEpoch, far+1)
	}

	if err := c.RestartLogStore(ctx, 2); err != nil {
		t.Fatal(err)
	}
	if err := c.RestartReplica(ctx, 1); err != nil {
		t.Fatal(err)
	}
	testkit.UntilWithin(t, 30*time.Second, "logstore-2 to follow the new primary", func() bool {
		st := logStoreStatus(t, c, 2)
		return st.VoteEpoch == far+1 && st.DurableLsn >= last
	})
	testkit.UntilWithin(t, 30*time.Second, "replica-1 to follow the new primary", func() bool {
		st, err := c.Status(ctx, c.Replicas[1])
		return err == nil && st.VoteEpoch == far+1 && st.VisibleLsn >= last
	})
}

// putOn writes key=value on n once it takes writes, returning the LSN.
func putOn(t *testing.T, c *Cluster, n *Node, key, value string) uint64 {
	t.Helper()
	kv := walshipv1.NewKVServiceClient(c.Conn(n))
	var lsn uint64
	testkit.UntilWithin(t, 30*time.Second, "a Put on "+n.Name, func() bool {
		ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
		defer cancel()
		p, err := kv.Put(ctx, &walshipv1.PutRequest{Key: key, Value: []byte(value)}, grpc.WaitForReady(true))
		if err == nil {
			lsn = p.Lsn
		}
		return err == nil
	})
	return lsn
}

// wantJump checks err refuses epoch e as more than the jump above known,
// naming field.
func wantJump(t *testing.T, what string, err error, field string, e, known uint64) {
	t.Helper()
	want := fmt.Sprintf("%s: %d is more than 1048576 (the most one message may move an epoch) above %d", field, e, known)
	if status.Code(err) != codes.InvalidArgument || !strings.Contains(status.Convert(err).Message(), want) {
		t.Fatalf("%s: %v; want INVALID_ARGUMENT %q", what, err, want)
	}
}
