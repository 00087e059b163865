package replica

import (
	"context"
	"errors"
	"path/filepath"
	"strings"
	"testing"
	"time"

	walshipv1 "github.com/walship/walship/gen/walship/v1"
	"github.com/walship/walship/internal/testkit"
	"github.com/walship/walship/internal/vfs"
	"github.com/walship/walship/services/primary"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
)

// TestRealPrimaryCrashDuringFsync runs a real primary (on the in-memory
// filesystem, so that a crash really loses what was not synced) and a real
// replica. A sync-replication commit reaches the replica before the
// primary's fsync, which the test holds; the replica flushes it but must not
// apply it. The machine dies during the fsync; the primary restarts in a new
// epoch without that commit; the replica is told it diverged, cuts the
// batch, and converges on the primary's new history.
func TestRealPrimaryCrashDuringFsync(t *testing.T) {
	mem := vfs.NewMem()
	addr := testkit.FreeAddr(t)
	pcfg := primary.DefaultConfig()
	pcfg.Listen = addr
	pcfg.DataDir = "/p"
	pcfg.FS = mem
	pcfg.StopTimeout = 5 * time.Second
	pcfg.HeartbeatInterval = 100 * time.Millisecond
	stopPrimary := runPrimary(t, pcfg)
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	kv := walshipv1.NewKVServiceClient(conn)
	admin := walshipv1.NewAdminServiceClient(conn)
	c := tctx(t)

	r := start(t, testConfig(t, t.TempDir(), addr))
	first, err := kv.Put(c, &walshipv1.PutRequest{Key: "kept", Value: []byte("1")}, grpc.WaitForReady(true))
	if err != nil {
		t.Fatal(err)
	}
	r.waitApplied(t, first.Lsn)

	gate := make(chan error)
	mem.InjectSyncError(func(name string) error {
		if strings.HasPrefix(name, "/p/wal/") && filepath.Ext(name) == ".wal" {
			return <-gate
		}
		return nil
	})
	res := make(chan error, 1)
	go func() {
		_, err := kv.Put(c, &walshipv1.PutRequest{Key: "lost", Value: []byte("2"), Policy: &walshipv1.CommitPolicy{
			Replication: walshipv1.ReplicationMode_REPLICATION_MODE_SYNC, SyncReplicas: 1,
			SyncLevel: walshipv1.SyncLevel_SYNC_LEVEL_FLUSH, SyncTimeout: durationpb.New(10 * time.Second)}})
		res <- err
	}()
	lostLSN := first.Lsn + 2 // one put and its commit record
	testkit.Until(t, "the replica flushed the batch the primary has not synced", func() bool {
		return r.s.wal.DurableLSN() >= lostLSN
	})
	if st := r.status(t); st.VisibleLsn != first.Lsn {
		t.Fatalf("replica visible LSN %d; want %d: it must not apply what the primary has not made durable", st.VisibleLsn, first.Lsn)
	}

	mem.Crash()
	mem.InjectError(func(vfs.Op, string) error { return errors.New("machine is down") })
	gate <- errors.New("machine is down")
	if err := <-res; err == nil {
		t.Fatal("a commit whose fsync failed was acknowledged")
	}
	stopPrimary()
	mem.InjectError(nil)
	mem.InjectSyncError(nil)

	stopPrimary = runPrimary(t, pcfg)
	defer stopPrimary()
	// The restarted primary answers NOT_SERVING (nothing done) until its
	// new epoch's record meets the contract.
	var after *walshipv1.PutResponse
	testkit.Until(t, "the restarted primary to take a write", func() bool {
		after, err = kv.Put(c, &walshipv1.PutRequest{Key: "after", Value: []byte("3")}, grpc.WaitForReady(true))
		return err == nil || status.Code(err) != codes.Unavailable || !strings.Contains(err.Error(), "is opening epoch")
	})
	if err != nil {
		t.Fatal(err)
	}
	if after.Lsn != first.Lsn+2 {
		t.Fatalf("first commit after the crash at LSN %d, want %d (the lost LSNs reused)", after.Lsn, first.Lsn+2)
	}
	r.waitApplied(t, after.Lsn)
	pst, err := admin.Status(c, &walshipv1.StatusRequest{})
	if err != nil {
		t.Fatal(err)
	}
	rst := r.status(t)
	if rst.StateDigest != pst.StateDigest || rst.VisibleLsn != pst.VisibleLsn || rst.Epoch != pst.Epoch || pst.Epoch < 2 {
		t.Fatalf("replica %s at %d (epoch %d), primary %s at %d (epoch %d): not converged",
			rst.StateDigest, rst.VisibleLsn, rst.Epoch, pst.StateDigest, pst.VisibleLsn, pst.Epoch)
	}
	if got, err := r.kv.Get(c, &walshipv1.GetRequest{Key: "lost"}); err != nil || got.Found {
		t.Fatalf("Get lost on the replica = %v, %v", got, err)
	}
	if v := r.metric(t, "walship_replica_diverged_total"); v != 1 {
		t.Fatalf("walship_replica_diverged_total = %v, want 1", v)
	}
}

// runPrimary starts a primary and returns a function that stops it.
func runPrimary(t *testing.T, cfg primary.Config) func() {
	t.Helper()
	s, err := primary.New(cfg)
	if err != nil {
		t.Fatalf("primary: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	stopped := false
	return func() {
		if stopped {
			return
		}
		stopped = true
		cancel()
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			t.Fatal("primary did not stop")
		}
	}
}
