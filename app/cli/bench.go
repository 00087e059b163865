package cli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime/pprof"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/walship/walship/app/bench"
	"github.com/walship/walship/app/cluster"
	walshipv1 "github.com/walship/walship/gen/walship/v1"
	"github.com/walship/walship/services/primary"
)

// replicasFlag is --replicas: a count of replicas to start, or the
// comma-separated addresses of an existing cluster's replicas.
type replicasFlag struct {
	n     *int
	addrs *[]string
}

func (r replicasFlag) String() string {
	if r.addrs != nil && len(*r.addrs) > 0 {
		return strings.Join(*r.addrs, ",")
	}
	if r.n == nil {
		return ""
	}
	return strconv.Itoa(*r.n)
}

func (r replicasFlag) Set(s string) error {
	if n, err := strconv.Atoi(s); err == nil {
		if n < 0 {
			return fmt.Errorf("%d replicas", n)
		}
		*r.n, *r.addrs = n, nil
		return nil
	}
	return listFlag{r.addrs}.Set(s)
}

// benchOptions are the flags of `walship bench`: the bench.Config of
// every run, and what picks the runs and reports them.
type benchOptions struct {
	cfg         bench.Config
	pol         primary.Policy
	codecs      []string
	matrix      bool
	processes   bool
	cpuScaling  bool
	cpuReplicas []string
	repeat      int
	out, chart  string
	cpuProfile  string
	withTLS     bool
	placement   string
}

func benchFlags(fs *flag.FlagSet, env *Env) func(context.Context) error {
	o := &benchOptions{
		cfg: bench.Config{
			Workload:  "tpcc",
			Terminals: 8, Duration: 60 * time.Second, Warmup: 10 * time.Second, MaxRetries: 10,
			Codec: "msgpack", Replicas: 2, Mode: bench.ModeInProcess, SpeculativeReads: true,
			Params: bench.WorkloadParams{Warehouses: 1, Items: 10000, Customers: 300, Scale: 8, Accounts: 10000,
				Records: 10000, ValueBytes: 1000, Theta: 0.99, Seed: 1, PutBytes: 100},
		},
		pol:         primary.DefaultPolicy(),
		cpuReplicas: []string{"1", "3"},
		repeat:      1,
	}
	o.workloadFlags(fs)
	o.clusterFlags(fs)
	o.runFlags(fs)
	return func(ctx context.Context) error { return o.run(ctx, env) }
}

// workloadFlags are the flags of what the terminals run.
func (o *benchOptions) workloadFlags(fs *flag.FlagSet) {
	cfg := &o.cfg
	fs.StringVar(&cfg.Workload, "workload", cfg.Workload, "workload: "+strings.Join(bench.Workloads, ", "))
	fs.IntVar(&cfg.Params.Warehouses, "warehouses", cfg.Params.Warehouses, "tpcc: warehouses")
	fs.IntVar(&cfg.Params.Items, "items", cfg.Params.Items, "tpcc: items (TPC-C: 100,000)")
	fs.IntVar(&cfg.Params.Customers, "customers", cfg.Params.Customers, "tpcc: customers and initial orders per district (TPC-C: 3,000)")
	fs.IntVar(&cfg.Params.Scale, "scale", cfg.Params.Scale, "tpcb: scale factor: branches, 10 tellers and --accounts accounts each (pgbench advises scale >= clients, else it measures contention on the branch rows)")
	fs.IntVar(&cfg.Params.Accounts, "accounts", cfg.Params.Accounts, "tpcb: accounts per branch (pgbench: 100,000)")
	fs.IntVar(&cfg.Params.Records, "records", cfg.Params.Records, "ycsb-a: records")
	fs.IntVar(&cfg.Params.ValueBytes, "value-bytes", cfg.Params.ValueBytes, "ycsb-a: bytes per record")
	fs.Float64Var(&cfg.Params.Theta, "zipf-theta", cfg.Params.Theta, "ycsb-a: zipfian constant")
	fs.IntVar(&cfg.Params.PutBytes, "put-bytes", cfg.Params.PutBytes, "put: bytes per value")
	fs.IntVar(&cfg.Params.PutKeys, "put-keys", cfg.Params.PutKeys, "put: overwrite keys drawn at random from this many, split between the terminals (as redis-benchmark -r); 0 = every Put a new key")
	fs.Int64Var(&cfg.Params.Seed, "seed", cfg.Params.Seed, "random seed of the data and the terminals")
	fs.IntVar(&cfg.Terminals, "terminals", cfg.Terminals, "concurrent closed-loop clients")
	fs.IntVar(&cfg.Pipeline, "pipeline", 0, "operations each terminal keeps in flight on one KVService.Pipeline stream of its own (0 = one unary call at a time)")
	fs.DurationVar(&cfg.Duration, "duration", cfg.Duration, "measured time per run")
	fs.DurationVar(&cfg.Warmup, "warmup", cfg.Warmup, "unmeasured time before each measurement")
	fs.Float64Var(&cfg.Rate, "rate", 0, "pace the terminals to this many txn/s in total (0 = as fast as they go); --cpu-scaling uses it to compare runs at equal load")
	fs.IntVar(&cfg.MaxRetries, "max-retries", cfg.MaxRetries, "retries of a conflicting transaction before it counts as an abort")
	fs.BoolVar(&cfg.SpeculativeReads, "speculative-reads", cfg.SpeculativeReads, "read-modify-write transactions read pending writes on the primary at once (TxnRequest.speculative; their version compares guard what they read); false: their reads wait until what they saw is acknowledged")
	fs.BoolVar(&cfg.ReplicaReads, "replica-reads", false, "read from the replicas (with min_lsn = the terminal's last commit) instead of the primary")
}

// clusterFlags are the flags of the cluster the runs start or reach, and
// of its commit policy.
func (o *benchOptions) clusterFlags(fs *flag.FlagSet) {
	cfg, pol := &o.cfg, &o.pol
	fs.Var(replicasFlag{&cfg.Replicas, &cfg.ReplicaAddrs}, "replicas", "replicas to start (a number), or an existing cluster's replica addresses (comma-separated, with --primary)")
	fs.StringVar(&cfg.PrimaryAddr, "primary", "", "gRPC address of an existing cluster's primary (default: start a cluster)")
	fs.StringVar(&cfg.PrimaryMetrics, "primary-metrics", "", "with --primary: its /metrics address (host:port), for WAL MB/s")
	fs.StringVar(&cfg.Codec, "codec", cfg.Codec, "WAL codec of the started cluster: msgpack or json")
	durabilityFlag(fs, &pol.Durability)
	replicationFlag(fs, &pol.Replication)
	fs.IntVar(&pol.SyncReplicas, "sync-replicas", pol.SyncReplicas, "k in 'any k replicas' for --replication sync")
	syncLevelFlag(fs, &pol.SyncLevel)
	fs.DurationVar(&pol.SyncTimeout, "sync-timeout", pol.SyncTimeout, "how long a sync commit waits for replicas")
	fs.BoolVar(&cfg.ReplicasWhenDisabled, "replicas-when-disabled", false, "keep the replicas running in Disabled cells (default: none, as in the seed)")
	fs.BoolVar(&o.processes, "processes", false, "run the log store, primary and replicas as separate walship processes (the primary's CPU time is then its own)")
	fs.IntVar(&cfg.ReplicaNice, "replica-nice", 0, "with --processes: run the log store and the replicas at this nice value (1..19), so they get CPU only when the primary leaves some (an approximation of replicas on hosts of their own; lag shows when they fall behind)")
	fs.BoolVar(&cfg.ReplicaIdle, "replica-idle", false, "with --processes: run the log store and the replicas under SCHED_IDLE (Linux, through chrt), so they run only on a core nothing else wants and a waking primary or terminal preempts them at once; their cost shows as lag")
	fs.StringVar(&o.placement, "placement", "", "where a started cluster's nodes run: separate (the primary and the clients on half the CPUs, the log store and the replicas as processes on the other half, as on hosts of their own; the default of --matrix and --cpu-scaling with 2+ CPUs) or shared (every node on the same cores; the default otherwise)")
	fs.StringVar(&cfg.ReplicaCPUs, "replica-cpus", "", "with --processes: pin the log store and the replicas to these CPUs (a taskset list, e.g. 1); --placement separate: the second half of the CPUs")
	fs.StringVar(&cfg.PrimaryCPUs, "primary-cpus", "", "with --processes: pin the primary and the bench's clients to these CPUs (a taskset list, e.g. 0); --placement separate: the first half of the CPUs")
	fs.StringVar(&cfg.ProfileDir, "primary-profiles", "", "with --processes: write a CPU profile of the primary process over each run's measured window into this directory (go tool pprof reads them)")
	fs.Var(fieldsFlag{&cfg.PrimaryFlags}, "primary-flags", "with --processes: flags added to the started primary's command line, space-separated (e.g. \"--ship-delay 5ms\"), to measure a setting")
	fs.Var(fieldsFlag{&cfg.LogStoreFlags}, "logstore-flags", "with --processes: flags added to the started log store's command line, space-separated, {run} replaced by a name of each run's own (e.g. \"--archive s3://BUCKET/PREFIX/{run} --archive-endpoint URL\": each run is a new cluster)")
	fs.Var(fieldsFlag{&cfg.ReplicaFlags}, "replica-flags", "with --processes: flags added to each started replica's command line, space-separated (e.g. \"--flush-delay 5ms\")")
	fs.StringVar(&cfg.Dir, "data-dir", "", "parent of the clusters' data directories (default: temporary, removed)")
	fs.IntVar(&cfg.BasePort, "base-port", 0, "put a started cluster on fixed ports on 127.0.0.1: the log store at this port, the primary at +1, replicas from +2, metrics at the same +2000 (0: any free ports); every run reuses them")
	fs.BoolVar(&o.withTLS, "tls", false, "run the started cluster (in-process or --processes) over mTLS: a throwaway CA, the default authorization policy")
}

// runFlags are the flags of which runs there are, and of where their
// results go.
func (o *benchOptions) runFlags(fs *flag.FlagSet) {
	fs.Var(listFlag{&o.codecs}, "codecs", "run once per codec, e.g. msgpack,json (overrides --codec)")
	fs.BoolVar(&o.matrix, "matrix", false, "run every cell: replication {sync, async, disabled} x durability {sync, async}")
	fs.BoolVar(&o.cpuScaling, "cpu-scaling", false, "measure the primary process's CPU ms per 1,000 commits replicating (--replication, default async) to each --cpu-scaling-replicas count (implies --processes); give --rate so every run carries the same load")
	fs.Var(listFlag{&o.cpuReplicas}, "cpu-scaling-replicas", "replica counts for --cpu-scaling: 0 = no replica (replication disabled, a log store), none = the primary alone (no log store either), N = N replicas and a log store")
	fs.IntVar(&o.repeat, "repeat", o.repeat, "run each cell this many times, in rounds that alternate the cells and codecs, and report the median")
	fs.StringVar(&o.out, "out", "", "write the rows as JSON to this file")
	fs.StringVar(&o.chart, "chart", "", "write an SVG bar chart of txn/s per cell and codec to this file")
	fs.StringVar(&o.cpuProfile, "cpuprofile", "", "write a CPU profile of this process (in-process mode: cluster and clients) to this file")
}

// run runs what the flags ask for and reports it.
func (o *benchOptions) run(ctx context.Context, env *Env) error {
	if o.withTLS {
		stop, err := o.useTLS(env)
		if err != nil {
			return err
		}
		defer stop()
	}
	if err := o.setMode(env); err != nil {
		return err
	}
	o.cfg.SyncReplicas, o.cfg.SyncLevel, o.cfg.SyncTimeout = o.pol.SyncReplicas, o.pol.SyncLevel, o.pol.SyncTimeout
	o.cfg.Progress = env.Stderr
	if len(o.codecs) == 0 {
		o.codecs = []string{o.cfg.Codec}
	}
	if o.cpuProfile != "" {
		stop, err := startCPUProfile(o.cpuProfile)
		if err != nil {
			return err
		}
		defer stop()
	}
	runs, err := o.runs(env)
	if err != nil {
		return err
	}
	if n := len(runs) * o.repeat; n > 1 {
		each := o.cfg.Warmup + o.cfg.Duration
		fmt.Fprintf(env.Stderr, "%d runs (%d cells x %d codecs x %d repeats), each %v warm-up + %v measured: at least %v, plus starting and loading a cluster for each\n",
			n, len(runs)/len(o.codecs), len(o.codecs), o.repeat, o.cfg.Warmup, o.cfg.Duration, time.Duration(n)*each)
	}
	rows, err := bench.RunInterleaved(ctx, runs, o.repeat, func(r bench.Row) {
		cpu := ""
		if r.CPUMsPer1000 > 0 {
			cpu = fmt.Sprintf(", %s CPU %.1f ms per 1,000 commits", r.CPUScope, r.CPUMsPer1000)
		}
		fmt.Fprintf(env.Stderr, "done: %s %s %s (%d replicas): %.1f txn/s, p99 %.2fms%s, consistent=%v\n", r.Workload, r.Label(), r.Codec, r.Replicas, r.TxnPerS, r.P99Ms, cpu, r.Consistent)
	})
	if err != nil && !(errors.Is(err, context.Canceled) && len(rows) > 0) {
		return err
	}
	return o.report(env, rows)
}

// useTLS gives the cluster the bench starts mTLS with a throwaway CA
// (--tls); the returned function removes it.
func (o *benchOptions) useTLS(env *Env) (func(), error) {
	if o.cfg.PrimaryAddr != "" {
		return nil, benchUsage(env, "--tls: only for a cluster the bench starts (for --primary, give --tls-cert, --tls-key and --tls-ca)")
	}
	dir, err := os.MkdirTemp("", "walship-bench-tls-")
	if err != nil {
		return nil, err
	}
	if o.cfg.Security, err = cluster.DevTLS(dir, "127.0.0.1"); err != nil {
		os.RemoveAll(dir)
		return nil, fmt.Errorf("--tls: %w", err)
	}
	flags := func(name string) []string {
		return []string{"--tls-cert", filepath.Join(dir, name+".crt"), "--tls-key", filepath.Join(dir, name+".key"),
			"--tls-ca", filepath.Join(dir, "ca.crt"), "--trust-domain", cluster.DevTrustDomain}
	}
	o.cfg.TLSFlags, o.cfg.LogStoreTLSFlags = flags("node"), flags("logstore")
	return func() {
		os.RemoveAll(dir)
	}, nil
}

// setMode picks how the runs reach their cluster: the one at --primary,
// or one they start as processes (--processes, --cpu-scaling) or in this
// process.
func (o *benchOptions) setMode(env *Env) error {
	if o.cfg.BasePort < 0 || o.cfg.BasePort > 65535-2000-2-o.cfg.Replicas {
		return benchUsage(env, fmt.Sprintf("--base-port: %d leaves no room for the nodes' ports and their metrics' (+2000) below 65536", o.cfg.BasePort))
	}
	if o.cfg.PrimaryAddr != "" {
		o.cfg.Mode = bench.ModeExternal
		if o.processes || o.cpuScaling {
			return benchUsage(env, "--primary: an external cluster cannot be run as --processes or --cpu-scaling")
		}
		if o.cfg.BasePort != 0 {
			return benchUsage(env, "--base-port: only for a cluster the bench starts, not with --primary")
		}
	} else if len(o.cfg.ReplicaAddrs) > 0 {
		return benchUsage(env, "--replicas: addresses need --primary")
	}
	if o.placement == "" {
		o.placement = bench.PlacementShared
		_, _, err := bench.SplitCPUs()
		_, noTaskset := exec.LookPath("taskset")
		if err == nil && noTaskset == nil && (o.matrix || o.cpuScaling) && o.cfg.PrimaryAddr == "" {
			o.placement = bench.PlacementSeparate
		}
	}
	switch o.placement {
	case bench.PlacementShared:
	case bench.PlacementSeparate:
		if o.cfg.PrimaryAddr != "" {
			return benchUsage(env, "--placement separate: only for a cluster the bench starts")
		}
		if _, err := exec.LookPath("taskset"); err != nil {
			return benchUsage(env, "--placement separate: needs taskset (util-linux) to place the nodes: "+err.Error())
		}
		if err := o.placeApart(env); err != nil {
			return err
		}
	default:
		return benchUsage(env, fmt.Sprintf("--placement: %q is neither separate nor shared", o.placement))
	}
	if o.processes || o.cpuScaling || o.placement == bench.PlacementSeparate || o.cfg.PrimaryCPUs != "" {
		o.cfg.Mode, o.cfg.Bin = bench.ModeProcesses, bench.DefaultBin()
	}
	if o.cfg.PrimaryCPUs != "" {
		// The clients share the primary's CPUs: what they cost comes out
		// of the same budget in every cell, replicas or not.
		if err := bench.PinSelf(o.cfg.PrimaryCPUs); err != nil {
			return benchUsage(env, "--primary-cpus: "+err.Error())
		}
	}
	if o.placement == bench.PlacementSeparate {
		fmt.Fprintf(env.Stderr, "placement: primary and clients on CPUs %s, log store and replicas on CPUs %s\n", o.cfg.PrimaryCPUs, o.cfg.ReplicaCPUs)
	}
	return nil
}

// placeApart places the nodes as --placement separate says: the primary
// and this process (its clients) on the first half of the CPUs, the log
// store and the replicas on the rest, unless --primary-cpus or
// --replica-cpus say otherwise.
func (o *benchOptions) placeApart(env *Env) error {
	primaryCPUs, peerCPUs, err := bench.SplitCPUs()
	if err != nil && (o.cfg.PrimaryCPUs == "" || o.cfg.ReplicaCPUs == "") {
		return benchUsage(env, "--placement separate: "+err.Error())
	}
	if o.cfg.PrimaryCPUs == "" {
		o.cfg.PrimaryCPUs = primaryCPUs
	}
	if o.cfg.ReplicaCPUs == "" {
		o.cfg.ReplicaCPUs = peerCPUs
	}
	return nil
}

// startCPUProfile profiles this process into path until the returned
// function is called.
func startCPUProfile(path string) (func(), error) {
	f, err := os.Create(path)
	if err != nil {
		return nil, err
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		return nil, err
	}
	return func() {
		pprof.StopCPUProfile()
		f.Close()
	}, nil
}

// benchCell is one cell of the runs: a replication mode and a durability,
// with a count of replicas.
type benchCell struct {
	rep        walshipv1.ReplicationMode
	dur        walshipv1.Durability
	replicas   int
	noLogStore bool
}

// runs are the runs the flags ask for: each cell with each codec.
func (o *benchOptions) runs(env *Env) ([]bench.Config, error) {
	cells, err := o.cells(env)
	if err != nil {
		return nil, err
	}
	var runs []bench.Config
	for _, codecName := range o.codecs {
		for _, c := range cells {
			run := o.cfg
			run.Codec, run.Replication, run.Durability, run.Replicas, run.NoLogStore = codecName, c.rep, c.dur, c.replicas, c.noLogStore
			if o.cpuScaling {
				run.ReplicasWhenDisabled = true
			}
			runs = append(runs, run)
		}
	}
	return runs, nil
}

// cells are the cells to run: async replication to each --cpu-scaling
// replica count, the --matrix, or the one cell of the policy flags.
func (o *benchOptions) cells(env *Env) ([]benchCell, error) {
	var cells []benchCell
	switch {
	case o.cpuScaling:
		for _, s := range o.cpuReplicas {
			if s == "none" {
				cells = append(cells, benchCell{rep: walshipv1.ReplicationMode_REPLICATION_MODE_DISABLED, dur: o.pol.Durability, noLogStore: true})
				continue
			}
			n, err := strconv.Atoi(s)
			if err != nil || n < 0 {
				return nil, benchUsage(env, fmt.Sprintf("--cpu-scaling-replicas: %q is not a count (0 or more; 0 = the primary with no replica, at the same offered load) or none (no log store either)", s))
			}
			rep := o.pol.Replication
			if n == 0 {
				rep = walshipv1.ReplicationMode_REPLICATION_MODE_DISABLED
			}
			cells = append(cells, benchCell{rep: rep, dur: o.pol.Durability, replicas: n})
		}
	case o.matrix:
		for _, c := range bench.MatrixCells {
			cells = append(cells, benchCell{rep: replicationByName[c[0]], dur: durabilityByName[c[1]], replicas: o.cfg.Replicas})
		}
	default:
		cells = append(cells, benchCell{rep: o.pol.Replication, dur: o.pol.Durability, replicas: o.cfg.Replicas})
	}
	return cells, nil
}

// report writes rows as a table (the CPU-scaling one with --cpu-scaling),
// and to --out and --chart; it fails if a run's consistency check did.
func (o *benchOptions) report(env *Env, rows []bench.Row) error {
	if o.cpuScaling {
		writeCPUScaling(env, rows)
	} else if err := bench.WriteTable(env.Stdout, rows); err != nil {
		return err
	}
	if o.out != "" {
		if err := writeFile(o.out, func(f *os.File) error { return bench.WriteJSON(f, rows) }); err != nil {
			return err
		}
	}
	if o.chart != "" {
		if err := writeFile(o.chart, func(f *os.File) error { return bench.WriteSVG(f, rows) }); err != nil {
			return err
		}
	}
	for _, r := range rows {
		if !r.Consistent {
			return fmt.Errorf("%s %s %s: consistency check failed", r.Workload, r.Label(), r.Codec)
		}
	}
	return nil
}

// benchUsage reports a command-line mistake found after parsing.
func benchUsage(env *Env, msg string) error {
	fmt.Fprintf(env.Stderr, "walship bench: %s\n", msg)
	return errUsage
}

var replicationByName = map[string]walshipv1.ReplicationMode{
	"disabled": walshipv1.ReplicationMode_REPLICATION_MODE_DISABLED,
	"async":    walshipv1.ReplicationMode_REPLICATION_MODE_ASYNC,
	"sync":     walshipv1.ReplicationMode_REPLICATION_MODE_SYNC,
}

var durabilityByName = map[string]walshipv1.Durability{
	"sync":  walshipv1.Durability_DURABILITY_SYNC,
	"async": walshipv1.Durability_DURABILITY_ASYNC,
}

func writeCPUScaling(env *Env, rows []bench.Row) {
	w := tabwriter.NewWriter(env.Stdout, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(w, "workload\tcodec\treplicas\tlog store\tReplication/Durability\ttxn/s\tprimary commits\tprimary CPU ms per 1000 commits\tvs first\treads/commit\twrites/commit\tconsistent\t")
	base := map[string]bench.Row{}
	for _, r := range rows {
		k := r.Workload + "/" + r.Codec
		if _, ok := base[k]; !ok {
			base[k] = r
		}
		ratio := "-"
		if x, ok := bench.CPURatio(r, base[k]); ok {
			ratio = fmt.Sprintf("%.2fx", x)
		}
		ls := "yes"
		if r.NoLogStore {
			ls = "no"
		}
		reads, writes := "-", "-"
		if r.ReadSyscallsPerCommit > 0 || r.WriteSyscallsPerCommit > 0 {
			reads, writes = fmt.Sprintf("%.2f", r.ReadSyscallsPerCommit), fmt.Sprintf("%.2f", r.WriteSyscallsPerCommit)
		}
		fmt.Fprintf(w, "%s\t%s\t%d\t%s\t%s\t%.1f\t%d\t%.1f\t%s\t%s\t%s\t%v\t\n", r.Workload, r.Codec, r.Replicas, ls, r.Label(), r.TxnPerS, r.ServerCommits, r.CPUMsPer1000, ratio, reads, writes, r.Consistent)
	}
	w.Flush()
	if len(rows) > 0 {
		rounds := ""
		if n := len(rows[0].CPURuns); n > 1 {
			rounds = fmt.Sprintf("; medians of %d rounds, vs first paired by round", n)
		}
		fmt.Fprintf(env.Stdout, "\n(CPU: %s, utime+stime from /proc/<pid>/stat over the measured window%s; reads and writes: its read and write system calls, sockets and files, from /proc/<pid>/io)\n", rows[0].CPUScope, rounds)
	}
}

func writeFile(path string, write func(*os.File) error) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := write(f); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
