package bench

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	walshipv1 "github.com/walship/walship/gen/walship/v1"
	"github.com/walship/walship/internal/testbin"
	"github.com/walship/walship/pkg/codec"
	"github.com/walship/walship/services/primary"
)

// niceOf reads the nice value (field 19) of pid from /proc/<pid>/stat.
func niceOf(t *testing.T, pid int) int {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		t.Fatal(err)
	}
	s := string(b)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	n, err := strconv.Atoi(f[16]) // f[0] is field 3
	if err != nil {
		t.Fatalf("nice in %q: %v", s, err)
	}
	return n
}

// TestProcessesReplicaNice starts a cluster of walship processes with
// --replica-nice: the log store and the replicas run at that nice value,
// the primary at the bench's own.
func TestProcessesReplicaNice(t *testing.T) {
	if testing.Short() {
		t.Skip("starts processes")
	}
	bin := testbin.Walship(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	own := niceOf(t, os.Getpid())
	if own > 19-7 {
		t.Skipf("this test runs at nice %d; it needs room to raise it by 7", own)
	}
	b, err := startProcesses(ctx, bin, t.TempDir(), 2, codec.MsgPack, primary.DefaultPolicy(), 7)
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := b.stop(); err != nil {
			t.Error(err)
		}
	}()
	if len(b.procs) != 4 {
		t.Fatalf("%d processes, want a log store, a primary and 2 replicas", len(b.procs))
	}
	for _, p := range b.procs {
		want := own + 7
		if p.name == "primary" {
			want = own
		}
		if got := niceOf(t, p.cmd.Process.Pid); got != want {
			t.Errorf("%s runs at nice %d, want %d", p.name, got, want)
		}
	}
}

// TestRunProcesses runs tpcb against separate walship processes with
// deprioritised replicas, replicating synchronously: the cluster keeps
// up, stays consistent on every node, and the row says how it ran.
func TestRunProcesses(t *testing.T) {
	if testing.Short() {
		t.Skip("starts processes")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cfg := Config{
		Workload: "tpcb", Params: smallParams(), Terminals: 4, Duration: time.Second, Warmup: 200 * time.Millisecond,
		MaxRetries: 10, Codec: "msgpack", Mode: ModeProcesses, Bin: testbin.Walship(t), ReplicaNice: 5, Replicas: 1,
		Dir: t.TempDir(), SpeculativeReads: true,
		Replication: walshipv1.ReplicationMode_REPLICATION_MODE_SYNC, Durability: walshipv1.Durability_DURABILITY_SYNC,
		SyncReplicas: 1, SyncLevel: walshipv1.SyncLevel_SYNC_LEVEL_APPLY,
	}
	row, err := Run(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if !row.Consistent || row.TxnPerS <= 0 || row.Errors > 0 || len(row.Nodes) != 2 || row.Nodes[0].Digest != row.Nodes[1].Digest {
		t.Fatalf("consistent=%v txn/s=%v errors=%d nodes=%+v notes=%s", row.Consistent, row.TxnPerS, row.Errors, row.Nodes, row.Notes)
	}
	if row.Mode != ModeProcesses || row.ReplicaNice != 5 || row.CPUScope != "primary process" || row.CPUMsPer1000 <= 0 {
		t.Errorf("mode %q, replica nice %d, CPU scope %q, %.1f ms per 1,000 commits", row.Mode, row.ReplicaNice, row.CPUScope, row.CPUMsPer1000)
	}
}
