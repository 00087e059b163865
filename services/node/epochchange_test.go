package node

import (
	"context"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	walshipv1 "github.com/walship/walship/gen/walship/v1"
	"github.com/walship/walship/internal/serve"
	"github.com/walship/walship/internal/testkit"
	"github.com/walship/walship/internal/vfs"
	"github.com/walship/walship/services/logstore"
	"github.com/walship/walship/services/primary"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// startLogStoreOn runs a log store at addr on fs, so that a test can
// crash its disk (vfs.MemFS.Crash) and start it again where it was.
func startLogStoreOn(t *testing.T, dir, addr string, fs vfs.FS) *running {
	t.Helper()
	cfg := logstore.DefaultConfig()
	cfg.Listen, cfg.MetricsListen, cfg.DataDir, cfg.FS = addr, "", filepath.Join(dir, "ls"), fs
	cfg.StopTimeout = 5 * time.Second
	s, err := logstore.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return run(t, s.Run)
}

// TestEpochStartMemberChangeKeepsAckedWrite: a member change at an epoch
// start must not lose a write that only a new member acknowledged.
// Members {n0, n1}, any 1 at flush, one log store (async). n0 restarts as
// the primary under --peers {n0, n1, n2} while n1 is down: its epoch
// record names the three, and n2 alone would acknowledge it and the
// writes after it. Then the log store loses what it had not synced (W),
// n0 and n2 die, and n1 — which never applied the record, so it judges
// under {n0, n1}, where its own promise and the log store's are a quorum
// — promotes without W.
//
// The record must be acknowledged under the previous contract too (one
// of the old members other than the primary at apply): the primary does
// not open, and W is not acknowledged, until n1 applied it; a promotion
// of n1 afterwards judges under the new contract as well and is refused
// without n2, which holds W.
func TestEpochStartMemberChangeKeepsAckedWrite(t *testing.T) {
	dir := t.TempDir()
	mem := vfs.NewMem()
	lsAddr := testkit.FreeAddr(t)
	ls := startLogStoreOn(t, dir, lsAddr, mem)
	peers := 2 // how many of c.members the next node started names
	c := &cluster{dir: dir, ls: lsAddr, nodes: map[string]*Node{}, runs: map[string]*running{}}
	c.tweak = func(cfg *Config) { cfg.Members = c.members[:peers] }
	for i := range 3 {
		c.members = append(c.members, primary.Member{ID: fmt.Sprintf("n%d", i), Addr: testkit.FreeAddr(t)})
	}
	c.start(t, "n0", RolePrimary)
	c.start(t, "n1", RoleReplica)
	put(t, c.conn(t, "n0"), "before", "v")
	for _, id := range []string{"n1", "n0"} {
		if err := c.runs[id].stop(t); err != nil {
			t.Fatalf("%s stop: %v", id, err)
		}
	}

	// n0 restarts under the new members; n2 joins; n1 stays down.
	peers = 3
	c.start(t, "n0", RolePrimary)
	c.start(t, "n2", RoleReplica)
	c0 := c.conn(t, "n0")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	testkit.Until(t, "the log store to sync n0's epoch 2 record", func() bool {
		st, err := logStoreStatus(ctx, serve.Dialer{}, lsAddr)
		return err == nil && st.GetLastEpoch() == 2
	})
	testkit.Until(t, "n2 to apply the epoch 2 record", func() bool {
		st, err := nodeStatus(ctx, serve.Dialer{}, c.members[2].Addr)
		return err == nil && len(st.GetContract().GetMembers()) == 3
	})
	// From here the log store's disk holds nothing more: W's batch is
	// written there but never synced.
	_, release := mem.HoldNextSync(".wal")
	t.Cleanup(release)
	wctx, wcancel := context.WithTimeout(ctx, 3*time.Second)
	w, err := walshipv1.NewKVServiceClient(c0).Put(wctx, &walshipv1.PutRequest{Key: "w", Value: []byte("v")}, grpc.WaitForReady(true))
	wcancel()
	if err == nil {
		t.Logf("W acknowledged at LSN %d while no old member other than the primary had applied the epoch record", w.GetLsn())
	} else {
		// Only with an old member that applied the record may the epoch
		// open: n1 comes back, applies it, and goes down again.
		if c := status.Code(err); c != codes.Unavailable && c != codes.DeadlineExceeded {
			t.Fatalf("W while n1 is down: %v; want UNAVAILABLE or no answer (the primary is opening)", err)
		}
		if st := status1(t, c0); st.GetTakingWrites() {
			t.Fatalf("n0 takes writes though no old member applied its epoch record: %v", st)
		}
		c.start(t, "n1", RoleReplica)
		testkit.Until(t, "n0 to open epoch 2 once n1 applied its record", func() bool { return status1(t, c0).GetTakingWrites() })
		if err := c.runs["n1"].stop(t); err != nil {
			t.Fatalf("n1 stop: %v", err)
		}
		w, err = walshipv1.NewKVServiceClient(c0).Put(ctx, &walshipv1.PutRequest{Key: "w", Value: []byte("v")})
		if err != nil {
			t.Fatalf("W with n2 up: %v", err)
		}
	}

	// The log store crashes, losing W; n0 and n2 die; the log store
	// comes back without W.
	mem.Crash()
	release()
	_ = ls.stop(t) // its fsync failed: it ends with that error
	for _, id := range []string{"n0", "n2"} {
		_ = c.runs[id].stop(t) // n0 may end with its log store's failure
	}
	ls = startLogStoreOn(t, dir, lsAddr, mem)
	st, err := logStoreStatus(ctx, serve.Dialer{}, lsAddr)
	if err != nil {
		t.Fatal(err)
	}
	if st.GetDurableLsn() >= w.GetLsn() {
		t.Fatalf("the log store kept W (durable LSN %d, W at %d): the test lost nothing", st.GetDurableLsn(), w.GetLsn())
	}

	c.start(t, "n1", RoleReplica)
	resp, err := walshipv1.NewAdminServiceClient(c.conn(t, "n1")).Promote(ctx, &walshipv1.PromoteRequest{}, grpc.WaitForReady(true))
	switch {
	case err == nil && resp.GetHighestLsn() < w.GetLsn():
		t.Fatalf("n1 promoted to epoch %d with its log ending at LSN %d: the acknowledged write W at LSN %d is lost (needed: %s)",
			resp.GetEpoch(), resp.GetHighestLsn(), w.GetLsn(), resp.GetNeeded())
	case err == nil:
		t.Fatalf("n1 promoted with W (%v): nobody it could reach holds W", resp)
	case status.Code(err) != codes.FailedPrecondition:
		t.Fatalf("promote n1: %v; want FAILED_PRECONDITION (n2, which holds W, is down)", err)
	}
	t.Logf("promotion refused: %v", status.Convert(err).Message())
}
