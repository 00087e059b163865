package bench

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/pprof/profile"
	walshipv1 "github.com/walship/walship/gen/walship/v1"
	"github.com/walship/walship/internal/testkit"
	"github.com/walship/walship/pkg/codec"
	"github.com/walship/walship/services/primary"
)

// statField reads field n (1-based, as proc(5) numbers them) of a stat
// file, /proc/<pid>/stat or /proc/<pid>/task/<tid>/stat, as a number; ok is
// false when the file is gone (the thread exited).
func statField(t *testing.T, path string, n int) (v int, ok bool) {
	t.Helper()
	b, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return 0, false
	}
	if err != nil {
		t.Fatal(err)
	}
	s := string(b)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:]) // f[0] is field 3
	v, err = strconv.Atoi(f[n-3])
	if err != nil {
		t.Fatalf("field %d of %q: %v", n, s, err)
	}
	return v, true
}

// processField is statField of a process that must still run.
func processField(t *testing.T, pid, n int) int {
	t.Helper()
	v, ok := statField(t, fmt.Sprintf("/proc/%d/stat", pid), n)
	if !ok {
		t.Fatalf("process %d has exited", pid)
	}
	return v
}

// niceOf reads the nice value (field 19) of pid.
func niceOf(t *testing.T, pid int) int { return processField(t, pid, 19) }

// Field 41 of a stat file is the scheduling policy; SCHED_IDLE's is 5.
const (
	policyField = 41
	schedIdle   = 5
)

// TestProcessesReplicaNice starts a cluster of walship processes with
// --replica-nice: the log store and the replicas run at that nice value,
// the primary at the bench's own.
func TestProcessesReplicaNice(t *testing.T) {
	if testing.Short() {
		t.Skip("starts processes")
	}
	bin := testkit.Walship(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	own := niceOf(t, os.Getpid())
	if own > 19-7 {
		t.Skipf("this test runs at nice %d; it needs room to raise it by 7", own)
	}
	b, err := startProcesses(ctx, procCluster{bin: bin, peers: placement{nice: 7}}, t.TempDir(), 2, codec.MsgPack, primary.DefaultPolicy())
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

// TestProcessesExtraFlags starts a cluster of walship processes with
// --primary-flags, --replica-flags and --logstore-flags: each node's
// command line ends with its own, after the bench's own flags (so they
// override them), and has no other's; a flag the node does not know
// stops the start with the node's own error.
func TestProcessesExtraFlags(t *testing.T) {
	if testing.Short() {
		t.Skip("starts processes")
	}
	bin := testkit.Walship(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	// {run} in a log store flag becomes the run's own name (its directory's).
	dir, archives := t.TempDir(), t.TempDir()
	pc := procCluster{bin: bin, primaryFlags: []string{"--ship-delay", "7ms"}, replicaFlags: []string{"--flush-delay", "3ms"},
		logstoreFlags: []string{"--archive-interval", "2s", "--archive", "file://" + archives + "/{run}"}}
	b, err := startProcesses(ctx, pc, dir, 1, codec.MsgPack, primary.DefaultPolicy())
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := b.stop(); err != nil {
			t.Error(err)
		}
	}()
	want := map[string]string{"logstore": "--archive-interval 2s --archive file://" + archives + "/" + filepath.Base(dir), "primary": "--ship-delay 7ms", "replica-0": "--flush-delay 3ms"}
	for _, p := range b.procs {
		raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", p.cmd.Process.Pid))
		if err != nil {
			t.Fatal(err)
		}
		args := strings.Join(strings.Split(strings.TrimRight(string(raw), "\x00"), "\x00"), " ")
		w, ok := want[p.name]
		if !ok {
			t.Fatalf("unexpected process %s", p.name)
		}
		for _, f := range []string{"--ship-delay", "--flush-delay", "--archive-interval"} {
			if has := strings.Contains(args, f); has != strings.HasPrefix(w, f) {
				t.Errorf("%s: %s in its command line: %v (%s)", p.name, f, has, args)
			}
		}
		if w != "" && !strings.HasSuffix(args, " "+w+" --log-format json") {
			t.Errorf("%s: command line %q does not end with %q before its log format", p.name, args, w)
		}
	}
	pc.primaryFlags = []string{"--no-such-flag"}
	if b2, err := startProcesses(ctx, pc, t.TempDir(), 0, codec.MsgPack, primary.DefaultPolicy()); err == nil {
		_ = b2.stop()
		t.Fatal("a primary given --no-such-flag started")
	} else if !strings.Contains(err.Error(), "no-such-flag") {
		t.Errorf("start with --no-such-flag: %v (does not name the flag)", err)
	}
}

// TestProcessesReplicaIdle starts a cluster of walship processes with
// --replica-idle: every thread of the log store and the replicas runs
// under SCHED_IDLE, the primary's under the bench's own policy.
func TestProcessesReplicaIdle(t *testing.T) {
	if testing.Short() {
		t.Skip("starts processes")
	}
	if _, err := exec.LookPath("chrt"); err != nil {
		t.Skip("chrt (util-linux) is not installed: --replica-idle runs the replicas through it")
	}
	own := processField(t, os.Getpid(), policyField)
	if own == schedIdle {
		t.Skip("this test itself runs under SCHED_IDLE")
	}
	eachThread(t, startPlaced(t, placement{}, placement{idle: true}), func(thread, dir string, primary bool) {
		want := schedIdle
		if primary {
			want = own
		}
		if got, ok := statField(t, dir+"/stat", policyField); ok && got != want {
			t.Errorf("%s runs under policy %d, want %d", thread, got, want)
		}
	})
}

// startPlaced starts a log store, a primary and a replica as processes,
// the primary placed at primaryAt, the log store and the replica at peers;
// they stop when the test ends.
func startPlaced(t *testing.T, primaryAt, peers placement) *backend {
	t.Helper()
	bin := testkit.Walship(t)
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel() // bounds the start only: the processes stop when the test ends
	b, err := startProcesses(ctx, procCluster{bin: bin, primary: primaryAt, peers: peers}, t.TempDir(), 1, codec.MsgPack, primary.DefaultPolicy())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := b.stop(); err != nil {
			t.Error(err)
		}
	})
	if len(b.procs) != 3 {
		t.Fatalf("%d processes, want a log store, a primary and a replica", len(b.procs))
	}
	return b
}

// eachThread calls fn with the /proc directory of every thread of every
// process of b, named, and whether it is the primary's. Every thread, not
// only the main one: the Go runtime's threads are started by the child
// itself, and must have inherited its placement.
func eachThread(t *testing.T, b *backend, fn func(thread, dir string, primary bool)) {
	t.Helper()
	for _, p := range b.procs {
		pid := p.cmd.Process.Pid
		tasks, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
		if err != nil {
			t.Fatal(err)
		}
		for _, task := range tasks {
			fn(p.name+" thread "+task.Name(), fmt.Sprintf("/proc/%d/task/%s", pid, task.Name()), p.name == "primary")
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
		MaxRetries: 10, Codec: "msgpack", Mode: ModeProcesses, Bin: testkit.Walship(t), ReplicaNice: 5, Replicas: 1,
		Dir: t.TempDir(), SpeculativeReads: true, ProfileDir: t.TempDir(),
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
	// The primary's CPU and the bench process's (the clients') per request.
	if row.CPUUsPerRequest <= 0 || row.ClientCPUUsPerRequest <= 0 || row.PeersCPUUsPerRequest <= 0 {
		t.Errorf("CPU per request: primary %.1f µs, client %.1f µs, log store and replica %.1f µs; want all three",
			row.CPUUsPerRequest, row.ClientCPUUsPerRequest, row.PeersCPUUsPerRequest)
	}
	// Each commit reads its request and sends its answer and batch; the
	// counts bound that from below and sanity from above.
	if row.ReadSyscallsPerCommit <= 0 || row.WriteSyscallsPerCommit <= 0 || row.ReadSyscallsPerCommit > 100 || row.WriteSyscallsPerCommit > 100 {
		t.Errorf("%.2f read and %.2f write system calls per commit", row.ReadSyscallsPerCommit, row.WriteSyscallsPerCommit)
	}
	if row.CommitsPerBatch < 1 || row.FsyncMs <= 0 {
		t.Errorf("%.2f commits per WAL entry, fsyncs of %.3f ms: every commit is in an entry, and sync durability fsyncs", row.CommitsPerBatch, row.FsyncMs)
	}
	checkPrimaryProfile(t, filepath.Join(cfg.ProfileDir, "Sync-Sync-msgpack-tpcb-1replicas-1.pprof"))
	// The shares split every sample of the profile. Which owners appear
	// depends on how many samples a one-second run got on a loaded machine
	// (14 once in CI, none of them a walship leaf): shares_test.go checks
	// the attribution itself.
	sum := 0.0
	for _, v := range row.PrimaryCPUShares {
		sum += v
	}
	if row.PrimaryProfile != filepath.Join(cfg.ProfileDir, "Sync-Sync-msgpack-tpcb-1replicas-1.pprof") || math.Abs(sum-1) > 0.01 {
		t.Errorf("profile %q, shares %v (sum %.3f): want the profile's samples split among owners", row.PrimaryProfile, row.PrimaryCPUShares, sum)
	}
}

// checkPrimaryProfile parses the CPU profile at path and checks that it is
// the primary's: it holds samples in the primary's commit path.
func checkPrimaryProfile(t *testing.T, path string) {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	p, err := profile.Parse(f)
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	if p.DurationNanos <= 0 || len(p.Sample) == 0 {
		t.Fatalf("%s: %v long, %d samples", path, time.Duration(p.DurationNanos), len(p.Sample))
	}
	for _, fn := range p.Function {
		if strings.HasPrefix(fn.Name, "github.com/walship/walship/services/primary.") {
			return
		}
	}
	t.Errorf("%s: no sample in services/primary among %d functions", path, len(p.Function))
}

// cpusAllowed reads the Cpus_allowed_list of a /proc/<pid>/status or
// /proc/<pid>/task/<tid>/status file ("" when it is gone).
func cpusAllowed(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return ""
	}
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "Cpus_allowed_list:"); ok {
			return strings.TrimSpace(v)
		}
	}
	t.Fatalf("%s has no Cpus_allowed_list", path)
	return ""
}

// TestProcessesSeparateCPUs starts a cluster of walship processes placed
// as `walship bench --placement separate` places them: every thread of the
// primary may run only on one CPU, every thread of the log store and the
// replica only on another.
func TestProcessesSeparateCPUs(t *testing.T) {
	if testing.Short() {
		t.Skip("starts processes")
	}
	if _, err := exec.LookPath("taskset"); err != nil {
		t.Skip("taskset (util-linux) is not installed: --placement separate runs the nodes through it")
	}
	primaryCPUs, peerCPUs, err := SplitCPUs()
	if err != nil {
		t.Skipf("this test needs two CPUs to place the nodes apart: %v", err)
	}
	eachThread(t, startPlaced(t, placement{cpus: primaryCPUs}, placement{cpus: peerCPUs}), func(thread, dir string, primary bool) {
		want := peerCPUs
		if primary {
			want = primaryCPUs
		}
		if got := cpusAllowed(t, dir+"/status"); got != "" && got != want {
			t.Errorf("%s may run on CPUs %s, want %s", thread, got, want)
		}
	})
}
