package bench

import (
	"context"
	"math"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	walshipv1 "github.com/walship/walship/gen/walship/v1"
)

// TestRun runs each workload for about two seconds against an in-process
// cluster with one replica, replicating synchronously and reading from the
// replica (tpcb: reading the primary speculatively), and checks it made progress and stayed consistent everywhere.
func TestRun(t *testing.T) {
	if testing.Short() {
		t.Skip("starts clusters")
	}
	for _, wl := range Workloads {
		t.Run(wl, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			p := smallParams()
			p.Warehouses, p.Records = 1, 1000
			cfg := Config{
				Workload: wl, Params: p, Terminals: 4, Duration: 1500 * time.Millisecond, Warmup: 300 * time.Millisecond,
				MaxRetries: 10, Codec: "msgpack", Mode: ModeInProcess, Replicas: 1, Dir: t.TempDir(),
				Replication: walshipv1.ReplicationMode_REPLICATION_MODE_SYNC, Durability: walshipv1.Durability_DURABILITY_SYNC,
				SyncReplicas: 1, SyncLevel: walshipv1.SyncLevel_SYNC_LEVEL_APPLY, ReplicaReads: wl != "tpcb",
				SpeculativeReads: true, // tpcb reads the primary: its read-modify-writes read pending writes
			}
			row, err := Run(ctx, cfg)
			if err != nil {
				t.Fatal(err)
			}
			t.Logf("%s: %.0f txn/s, p99 %.1fms, retries %d, aborts %d, lag p99 %.3fs, WAL %.2f MB/s, %s",
				wl, row.TxnPerS, row.P99Ms, row.Retries, row.Aborts, row.ReplicaLagP99S, row.WALMBPerS, row.Notes)
			if !row.Consistent || row.TxnPerS <= 0 || row.Errors > 0 {
				t.Fatalf("consistent=%v txn/s=%v errors=%d nodes=%+v notes=%s", row.Consistent, row.TxnPerS, row.Errors, row.Nodes, row.Notes)
			}
			if len(row.Nodes) != 2 || row.Nodes[0].Digest != row.Nodes[1].Digest || row.WALMBPerS <= 0 {
				t.Errorf("nodes %+v, WAL %v MB/s", row.Nodes, row.WALMBPerS)
			}
			// The replica's lag was sampled from the primary's metrics.
			if strings.Contains(row.Notes, "replica lag in seconds unknown") {
				t.Errorf("no lag sample: %s", row.Notes)
			}
			// CPU: cores busy within the machine, and the same CPU time as
			// the per-commit figure (cores = ms per commit × commits/s).
			if row.CPUCores <= 0 || row.CPUCores > 1.1*float64(runtime.NumCPU()) || row.CPUMsPer1000 <= 0 || row.ServerCommits <= 0 {
				t.Fatalf("CPU %.3f cores, %.1f ms per 1,000 commits, %d server commits", row.CPUCores, row.CPUMsPer1000, row.ServerCommits)
			}
			window := float64(row.Commits) / row.TxnPerS // as TxnPerS was computed
			if fromCommits := row.CPUMsPer1000 / 1000 * float64(row.ServerCommits) / 1000 / window; math.Abs(fromCommits-row.CPUCores) > 0.001*row.CPUCores {
				t.Errorf("CPU cores %.3f, but %.1f ms per 1,000 of %d commits in %.3fs make %.3f", row.CPUCores, row.CPUMsPer1000, row.ServerCommits, window, fromCommits)
			}
			// Per request: the same CPU time over the requests answered;
			// in one process the clients' CPU is not told apart.
			if reqs := row.Commits + row.Aborts; row.CPUUsPerRequest <= 0 || row.ClientCPUUsPerRequest != 0 {
				t.Errorf("%.1f µs per request, client %.1f µs: want >0, and 0 in-process", row.CPUUsPerRequest, row.ClientCPUUsPerRequest)
			} else if fromReqs := row.CPUUsPerRequest * float64(reqs) / 1e6 / window; math.Abs(fromReqs-row.CPUCores) > 0.001*row.CPUCores {
				t.Errorf("CPU cores %.3f, but %.1f µs per request of %d in %.3fs make %.3f", row.CPUCores, row.CPUUsPerRequest, reqs, window, fromReqs)
			}
		})
	}
}

// TestRunPipelined runs the put workload with each terminal pipelining on
// a stream of its own: every Put the terminals saw commit is there, and
// the row says how it ran and what a request cost.
func TestRunPipelined(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a cluster")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cfg := Config{
		Workload: "put", Params: smallParams(), Terminals: 2, Pipeline: 8, Duration: time.Second, Warmup: 200 * time.Millisecond,
		MaxRetries: 10, Codec: "msgpack", Mode: ModeInProcess, Dir: t.TempDir(),
		Replication: walshipv1.ReplicationMode_REPLICATION_MODE_DISABLED, Durability: walshipv1.Durability_DURABILITY_ASYNC,
	}
	row, err := Run(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if !row.Consistent || row.Errors > 0 || row.Commits <= 0 || row.Pipeline != 8 || row.Terminals != 2 || row.CPUUsPerRequest <= 0 {
		t.Fatalf("consistent=%v errors=%d commits=%d pipeline=%d terminals=%d %.1f µs/request nodes=%+v notes=%s",
			row.Consistent, row.Errors, row.Commits, row.Pipeline, row.Terminals, row.CPUUsPerRequest, row.Nodes, row.Notes)
	}
}

func TestConfigValidate(t *testing.T) {
	base := Config{Workload: "tpcb", Params: smallParams(), Terminals: 1, Duration: time.Second, Codec: "msgpack", Mode: ModeInProcess, Replicas: 1}
	if err := base.Validate(); err != nil {
		t.Fatal(err)
	}
	for name, mut := range map[string]func(*Config){
		"workload":      func(c *Config) { c.Workload = "tpch" },
		"terminals":     func(c *Config) { c.Terminals = 0 },
		"pipeline":      func(c *Config) { c.Pipeline = -1 },
		"pipeline rate": func(c *Config) { c.Pipeline, c.Rate = 4, 100 },
		"codec":         func(c *Config) { c.Codec = "xml" },
		"sync":          func(c *Config) { c.Replication, c.SyncReplicas = walshipv1.ReplicationMode_REPLICATION_MODE_SYNC, 2 },
		"external":      func(c *Config) { c.Mode = ModeExternal },
		"processes":     func(c *Config) { c.Mode = ModeProcesses },
		// --replica-nice: only for processes, and only lower priority.
		"replica-nice":       func(c *Config) { c.ReplicaNice = 5 },
		"replica-nice range": func(c *Config) { c.Mode, c.Bin, c.ReplicaNice = ModeProcesses, "walship", 20 },
		"replica-nice minus": func(c *Config) { c.Mode, c.Bin, c.ReplicaNice = ModeProcesses, "walship", -1 },
		// --replica-idle: only for processes, and not with a nice value.
		"replica-idle":      func(c *Config) { c.ReplicaIdle = true },
		"replica-idle nice": func(c *Config) { c.Mode, c.Bin, c.ReplicaIdle, c.ReplicaNice = ModeProcesses, "walship", true, 5 },
		// --replica-cpus: only for processes, and a CPU list.
		"replica-cpus":      func(c *Config) { c.ReplicaCPUs = "1" },
		"replica-cpus list": func(c *Config) { c.Mode, c.Bin, c.ReplicaCPUs = ModeProcesses, "walship", "1;rm" },
		// --primary-cpus and --primary-profiles: only for processes.
		"primary-cpus":      func(c *Config) { c.PrimaryCPUs = "0" },
		"primary-cpus list": func(c *Config) { c.Mode, c.Bin, c.PrimaryCPUs = ModeProcesses, "walship", "0-" },
		"primary-profiles":  func(c *Config) { c.ProfileDir = "/tmp" },
		// Flags for the started nodes: only for processes.
		"primary-flags":  func(c *Config) { c.PrimaryFlags = []string{"--ship-delay", "5ms"} },
		"replica-flags":  func(c *Config) { c.ReplicaFlags = []string{"--flush-delay", "1ms"} },
		"logstore-flags": func(c *Config) { c.LogStoreFlags = []string{"--flush-delay", "1ms"} },
		"logstore-flags without a log store": func(c *Config) {
			c.Mode, c.Bin, c.NoLogStore, c.Replicas, c.Replication = ModeProcesses, "walship", true, 0, walshipv1.ReplicationMode_REPLICATION_MODE_DISABLED
			c.LogStoreFlags = []string{"--flush-delay", "1ms"}
		},
		// The primary alone: only as a process, and without replicas.
		"no log store":          func(c *Config) { c.NoLogStore = true },
		"no log store replicas": func(c *Config) { c.Mode, c.Bin, c.NoLogStore, c.Replicas = ModeProcesses, "walship", true, 1 },
	} {
		c := base
		mut(&c)
		err := c.Validate()
		if err == nil {
			t.Errorf("%s: no error", name)
		} else if flag := strings.Fields(name)[0]; !strings.Contains(err.Error(), flag) {
			t.Errorf("%s: error %q does not name %s", name, err, flag)
		}
	}
	ok := base
	ok.Mode, ok.Bin, ok.ReplicaNice = ModeProcesses, "walship", 19
	if err := ok.Validate(); err != nil {
		t.Errorf("--processes --replica-nice 19: %v", err)
	}
	ok.ReplicaNice, ok.ReplicaIdle = 0, true
	if err := ok.Validate(); err != nil {
		t.Errorf("--processes --replica-idle: %v", err)
	}
	ok.ReplicaCPUs = "0,2-3"
	if err := ok.Validate(); err != nil {
		t.Errorf("--processes --replica-idle --replica-cpus 0,2-3: %v", err)
	}
}

func TestMediansKeepOrderAndAllRuns(t *testing.T) {
	row := func(cell string, tps float64, ok bool) Row {
		return Row{Replication: cell, TxnPerS: tps, Consistent: ok}
	}
	got := medians([][]Row{
		{row("a", 30, true), row("a", 10, true), row("a", 20, true)},
		{row("b", 5, true), row("b", 7, false)},
		{row("c", 1, true)},
		nil,
	})
	if len(got) != 3 {
		t.Fatalf("%d rows, want 3", len(got))
	}
	if got[0].TxnPerS != 20 || !slices.Equal(got[0].Runs, []float64{30, 10, 20}) || !got[0].Consistent {
		t.Errorf("a = %+v; want median 20 with runs in run order", got[0])
	}
	if got[1].TxnPerS != 5 || got[1].Consistent {
		t.Errorf("b = %+v; want the lower middle (5), inconsistent because one run was", got[1])
	}
	if got[2].TxnPerS != 1 || got[2].Runs != nil {
		t.Errorf("c = %+v; a single run is reported as is", got[2])
	}
	// Paced runs: equal throughput, so the costs are medians of their own.
	paced := func(cpu, reads, writes float64) Row {
		return Row{TxnPerS: 1500, CPUMsPer1000: cpu, CPUUsPerRequest: cpu / 10, ClientCPUUsPerRequest: cpu / 100, PeersCPUUsPerRequest: cpu / 50,
			ReadSyscallsPerCommit: reads, WriteSyscallsPerCommit: writes, Consistent: true}
	}
	m := medians([][]Row{{paced(300, 4, 1), paced(200, 3, 3), paced(250, 5, 2)}})[0]
	if m.CPUMsPer1000 != 250 || m.ReadSyscallsPerCommit != 4 || m.WriteSyscallsPerCommit != 2 || !slices.Equal(m.CPURuns, []float64{300, 200, 250}) {
		t.Errorf("paced = CPU %v (runs %v), %v reads, %v writes; want the medians 250, 4, 2", m.CPUMsPer1000, m.CPURuns, m.ReadSyscallsPerCommit, m.WriteSyscallsPerCommit)
	}
	if m.CPUUsPerRequest != 25 || m.ClientCPUUsPerRequest != 2.5 || m.PeersCPUUsPerRequest != 5 || !slices.Equal(m.CPUUsRuns, []float64{30, 20, 25}) ||
		!slices.Equal(m.PeersCPUUsRuns, []float64{6, 4, 5}) {
		t.Errorf("paced = %v µs per request (runs %v), client %v µs, peers %v µs (runs %v); want the medians 25, 2.5 and 5",
			m.CPUUsPerRequest, m.CPUUsRuns, m.ClientCPUUsPerRequest, m.PeersCPUUsPerRequest, m.PeersCPUUsRuns)
	}
	if m := medians([][]Row{{paced(300, 4, 1), paced(200, 2, 3)}})[0]; m.CPUMsPer1000 != 250 || m.ReadSyscallsPerCommit != 3 {
		t.Errorf("two runs: CPU %v, %v reads; want the means of the middle two, 250 and 3", m.CPUMsPer1000, m.ReadSyscallsPerCommit)
	}
}
