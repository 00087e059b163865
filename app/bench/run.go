package bench

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	walshipv1 "github.com/walship/walship/gen/walship/v1"
	"github.com/walship/walship/internal/backoff"
	"github.com/walship/walship/internal/cpustat"
	"github.com/walship/walship/internal/kvpipe"
	"github.com/walship/walship/internal/serve"
	"github.com/walship/walship/pkg/codec"
	"github.com/walship/walship/services/primary"
	"golang.org/x/sync/errgroup"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/types/known/durationpb"
)

// Config is one benchmark run: one workload in one cell (replication ×
// durability) with one codec.
type Config struct {
	// Security is the in-process cluster's TLS and authorization (zero:
	// plaintext); the bench dials with Security.Dialer, processes too.
	Security serve.Security
	// TLSFlags are the --tls-* flags every data node process gets
	// (ModeProcesses); LogStoreTLSFlags the log store's, whose certificate
	// must be a log store's (a primary checks the class of what it dials).
	TLSFlags, LogStoreTLSFlags []string

	Workload string
	Params   WorkloadParams

	Terminals        int
	Duration, Warmup time.Duration
	// MaxRetries is how often a conflicting transaction runs again before
	// it counts as an abort.
	MaxRetries int
	// Rate, if positive, paces the terminals to this many transactions a
	// second in total (each terminal starts one every Terminals/Rate), so
	// that runs compared for CPU cost carry the same load.
	Rate float64
	// Pipeline, if positive, makes each terminal a client that keeps this
	// many operations in flight on one KVService.Pipeline stream of its
	// own (Terminals × Pipeline closed loops in all) instead of one unary
	// call at a time.
	Pipeline int
	// ReplicaReads sends reads to the replicas (round robin by terminal)
	// with min_lsn = the terminal's last commit.
	ReplicaReads bool
	// SpeculativeReads lets read-write transactions read pending writes on
	// the primary at once (TxnRequest.speculative) instead of waiting until
	// the commits behind them are acknowledged.
	SpeculativeReads bool

	// Codec is the WAL codec of a cluster the run starts (msgpack or json).
	Codec string
	// Policy is every write's commit policy.
	Replication  walshipv1.ReplicationMode
	Durability   walshipv1.Durability
	SyncReplicas int
	SyncLevel    walshipv1.SyncLevel
	SyncTimeout  time.Duration

	// Mode: ModeInProcess, ModeProcesses or ModeExternal.
	Mode string
	// Replicas is how many replicas a started cluster has.
	Replicas int
	// NoLogStore (ModeProcesses, Disabled replication, no replicas) runs
	// the primary alone: what shipping costs it, measured against a cell
	// with a log store.
	NoLogStore bool
	// ReplicasWhenDisabled keeps the replicas running in Disabled cells
	// (by default those cells run without replicas, as the seed's did).
	ReplicasWhenDisabled bool
	// Bin is the walship binary for ModeProcesses.
	Bin string
	// ReplicaNice (ModeProcesses only, 0..19) runs the log store and the
	// replicas at this nice value, so that on one machine they get CPU
	// only when the primary leaves some: an approximation of replicas on
	// hosts of their own. 0 leaves every process at the same priority.
	ReplicaNice int
	// ReplicaIdle (ModeProcesses only, not with ReplicaNice) runs the log
	// store and the replicas under Linux's SCHED_IDLE policy: they run
	// only on a core nothing else wants, and a waking primary or terminal
	// thread preempts them at once (a nice value only weighs their share).
	// The nearest one machine comes to replicas on hosts of their own;
	// what they cannot keep up with shows as lag.
	ReplicaIdle bool
	// ReplicaCPUs (ModeProcesses only) pins the log store and the replicas
	// to these CPUs (a taskset list such as "1" or "2-3"). With the bench
	// itself run under `taskset -c` on the others (which the primary
	// inherits), the primary and its clients and the replicas each have
	// cores of their own, as on separate hosts.
	ReplicaCPUs string
	// PrimaryCPUs (ModeProcesses only) pins the primary to these CPUs.
	// `walship bench --placement separate` pins itself (the clients) there
	// too, and the log store and the replicas to ReplicaCPUs.
	PrimaryCPUs string
	// ProfileDir (ModeProcesses only), if set, receives a CPU profile of
	// the primary process over each run's measured window (the primary
	// runs with --pprof), named after the run.
	ProfileDir string
	// PrimaryFlags and ReplicaFlags (ModeProcesses only) are added to the
	// command lines of the started primary and replicas (after the
	// bench's own, so they override them): to measure a setting such as
	// --ship-delay or --flush-delay.
	PrimaryFlags, ReplicaFlags []string
	// LogStoreFlags (ModeProcesses only) are added to the log store's
	// command line (e.g. an --archive to measure archiving).
	LogStoreFlags []string
	// Dir holds a started cluster's data ("" = a temporary directory).
	Dir string
	// BasePort, if not 0, puts a started cluster on fixed ports, as
	// walship dev's --base-port does: the log store at BasePort, the
	// primary at +1, the replicas from +2, metrics at the same +2000.
	// Each run reuses them once the run before has stopped.
	BasePort int
	// PrimaryAddr, ReplicaAddrs and PrimaryMetrics locate an external cluster.
	PrimaryAddr    string
	ReplicaAddrs   []string
	PrimaryMetrics string

	// Progress receives a line a second; nil is silent.
	Progress io.Writer
	// Logger receives the cluster's logs; nil discards them.
	Logger *slog.Logger
}

// Validate reports the first invalid setting, naming its flag.
func (c *Config) Validate() error {
	var errs []error
	if _, err := newWorkload(c.Workload, c.Params); err != nil {
		errs = append(errs, fmt.Errorf("--workload: %w", err))
	}
	switch {
	case c.Terminals < 1:
		errs = append(errs, fmt.Errorf("--terminals: %d must be positive", c.Terminals))
	case c.Pipeline < 0 || c.Pipeline > 4096:
		errs = append(errs, fmt.Errorf("--pipeline: %d is not in 0..4096", c.Pipeline))
	case c.Pipeline > 0 && c.Rate > 0:
		errs = append(errs, errors.New("--pipeline: not with --rate (which paces one call per terminal)"))
	case c.Duration <= 0:
		errs = append(errs, fmt.Errorf("--duration: %v must be positive", c.Duration))
	case c.Warmup < 0:
		errs = append(errs, fmt.Errorf("--warmup: %v must not be negative", c.Warmup))
	case c.MaxRetries < 0:
		errs = append(errs, fmt.Errorf("--max-retries: %d must not be negative", c.MaxRetries))
	}
	p := c.Params
	switch c.Workload {
	case "tpcc":
		if p.Warehouses < 1 || p.Items < 100 || p.Customers < 10 {
			errs = append(errs, fmt.Errorf("--warehouses %d, --items %d, --customers %d: need at least 1, 100 and 10", p.Warehouses, p.Items, p.Customers))
		}
	case "tpcb":
		if p.Scale < 1 || p.Accounts < 1 {
			errs = append(errs, fmt.Errorf("--scale %d, --accounts %d: must be positive", p.Scale, p.Accounts))
		}
	case "put":
		if p.PutBytes < 0 {
			errs = append(errs, fmt.Errorf("--put-bytes %d: must not be negative", p.PutBytes))
		}
		if p.PutKeys < 0 {
			errs = append(errs, fmt.Errorf("--put-keys %d: must not be negative", p.PutKeys))
		}
	case "ycsb-a":
		if p.Records < 2 || p.ValueBytes < 0 || p.Theta <= 0 || p.Theta >= 1 {
			errs = append(errs, fmt.Errorf("--records %d, --value-bytes %d, --zipf-theta %v: need records >= 2 and theta in (0,1)", p.Records, p.ValueBytes, p.Theta))
		}
	}
	if _, err := codec.ByName(c.Codec); err != nil && c.Mode != ModeExternal {
		errs = append(errs, fmt.Errorf("--codec: %w", err))
	}
	switch c.Mode {
	case ModeInProcess:
	case ModeProcesses:
		if c.Bin == "" {
			errs = append(errs, errors.New("--processes: no walship binary"))
		}
	case ModeExternal:
		if c.PrimaryAddr == "" {
			errs = append(errs, errors.New("--primary: required for an external cluster"))
		}
	default:
		errs = append(errs, fmt.Errorf("mode %q", c.Mode))
	}
	if c.Replication == walshipv1.ReplicationMode_REPLICATION_MODE_SYNC && c.Mode != ModeExternal && c.Replicas < c.SyncReplicas {
		errs = append(errs, fmt.Errorf("--replication sync: --sync-replicas %d but only %d replicas", c.SyncReplicas, c.Replicas))
	}
	switch {
	case c.ReplicaNice != 0 && c.Mode != ModeProcesses:
		errs = append(errs, errors.New("--replica-nice: needs --processes (in one process every node shares the scheduler)"))
	case c.ReplicaNice < 0 || c.ReplicaNice > 19:
		errs = append(errs, fmt.Errorf("--replica-nice: %d is not in 0..19", c.ReplicaNice))
	}
	switch {
	case c.ReplicaIdle && c.Mode != ModeProcesses:
		errs = append(errs, errors.New("--replica-idle: needs --processes (in one process every node shares the scheduler)"))
	case c.ReplicaIdle && c.ReplicaNice != 0:
		errs = append(errs, errors.New("--replica-idle: not with --replica-nice (SCHED_IDLE has no nice value)"))
	}
	switch {
	case c.ReplicaCPUs != "" && c.Mode != ModeProcesses:
		errs = append(errs, errors.New("--replica-cpus: needs --processes (in one process every node shares the scheduler)"))
	case c.ReplicaCPUs != "" && !cpuList.MatchString(c.ReplicaCPUs):
		errs = append(errs, fmt.Errorf("--replica-cpus: %q is not a CPU list such as 1 or 0,2-3", c.ReplicaCPUs))
	}
	switch {
	case c.PrimaryCPUs != "" && c.Mode != ModeProcesses:
		errs = append(errs, errors.New("--primary-cpus: needs --processes (in one process every node shares the scheduler)"))
	case c.PrimaryCPUs != "" && !cpuList.MatchString(c.PrimaryCPUs):
		errs = append(errs, fmt.Errorf("--primary-cpus: %q is not a CPU list such as 0 or 0,2-3", c.PrimaryCPUs))
	}
	if c.NoLogStore && (c.Mode != ModeProcesses || c.Replicas > 0 || c.Replication != walshipv1.ReplicationMode_REPLICATION_MODE_DISABLED) {
		errs = append(errs, errors.New("no log store: only for a primary alone, as a process (--processes, no replicas, --replication disabled)"))
	}
	if len(c.PrimaryFlags) > 0 && c.Mode != ModeProcesses {
		errs = append(errs, errors.New("--primary-flags: needs --processes"))
	}
	if len(c.ReplicaFlags) > 0 && c.Mode != ModeProcesses {
		errs = append(errs, errors.New("--replica-flags: needs --processes"))
	}
	if len(c.LogStoreFlags) > 0 && (c.Mode != ModeProcesses || c.NoLogStore) {
		errs = append(errs, errors.New("--logstore-flags: needs --processes and a log store"))
	}
	if c.ProfileDir != "" && c.Mode != ModeProcesses {
		errs = append(errs, errors.New("--primary-profiles: needs --processes (profile this process with --cpuprofile)"))
	}
	if c.ReplicaReads && c.Mode != ModeExternal && c.Replicas == 0 {
		errs = append(errs, errors.New("--replica-reads: no replicas"))
	}
	return errors.Join(errs...)
}

// cpuList matches a taskset CPU list: numbers and ranges, comma-separated.
var cpuList = regexp.MustCompile(`^[0-9]+(-[0-9]+)?(,[0-9]+(-[0-9]+)?)*$`)

// Cell names a Replication/Durability cell as the seed's table does.
func Cell(rep walshipv1.ReplicationMode, dur walshipv1.Durability) (string, string) {
	return title(policyName(rep.String())), title(policyName(dur.String()))
}

func title(s string) string {
	if s == "" {
		return s
	}
	return strings.ToUpper(s[:1]) + s[1:]
}

// Row is the result of one run: one row of the table and of results.json.
type Row struct {
	Workload       string  `json:"workload"`
	Codec          string  `json:"codec"`
	Replication    string  `json:"replication"`
	Durability     string  `json:"durability"`
	SyncReplicas   int     `json:"sync_replicas"`
	SyncLevel      string  `json:"sync_level"`
	Terminals      int     `json:"terminals"`
	DurationS      float64 `json:"duration_s"`
	TxnPerS        float64 `json:"txn_per_s"`
	P50Ms          float64 `json:"p50_ms"`
	P99Ms          float64 `json:"p99_ms"`
	Commits        int64   `json:"commits"`
	Aborts         int64   `json:"aborts"`
	Retries        int64   `json:"retries"`
	ReplicaLagP99S float64 `json:"replica_lag_p99_s"`
	// ArchiveLagP99S and ArchiveLagMaxS are the primary's
	// walship_archive_lag_seconds over the window, when its log store
	// archives (--logstore-flags "--archive ...").
	ArchiveLagP99S float64 `json:"archive_lag_p99_s,omitempty"`
	ArchiveLagMaxS float64 `json:"archive_lag_max_s,omitempty"`
	WALMBPerS      float64 `json:"wal_mb_per_s"`
	// CommitsPerBatch is the primary's commits per WAL entry (a group
	// commit is one entry): what one message to each replica carries.
	CommitsPerBatch float64 `json:"commits_per_batch,omitempty"`
	// FsyncMs is the primary's mean WAL fsync over the window: on one
	// machine, it shows the replicas' and log store's fsyncs sharing its
	// disk.
	FsyncMs float64 `json:"fsync_ms,omitempty"`
	// PrimaryProfile is the file of the primary's CPU profile over the
	// window (Config.ProfileDir), and PrimaryCPUShares how its samples
	// split between walship's code, gRPC, fsync, the GC and the runtime.
	PrimaryProfile   string             `json:"primary_profile,omitempty"`
	PrimaryCPUShares map[string]float64 `json:"primary_cpu_shares,omitempty"`
	Consistent       bool               `json:"consistent"`
	Notes            string             `json:"notes"`

	// Beyond the list.
	// ReplicaLagP99Records is the p99 of the worst replica's apply lag in
	// records (LSNs), sampled every 100 ms from the primary's Status.
	ReplicaLagP99Records float64 `json:"replica_lag_p99_records"`
	Mode                 string  `json:"mode"`
	ReplicaNice          int     `json:"replica_nice,omitempty"`
	ReplicaIdle          bool    `json:"replica_idle,omitempty"`
	ReplicaCPUs          string  `json:"replica_cpus,omitempty"`
	PrimaryCPUs          string  `json:"primary_cpus,omitempty"`
	SpeculativeReads     bool    `json:"speculative_reads"`
	Replicas             int     `json:"replicas"`
	NoLogStore           bool    `json:"no_log_store,omitempty"`
	// CPURuns are the runs' CPU ms per 1,000 commits, one per round, in
	// the order of Runs.
	CPURuns      []float64          `json:"cpu_runs,omitempty"`
	Errors       int64              `json:"errors"`
	ByKind       map[string]int64   `json:"by_kind"`
	ByKindP99Ms  map[string]float64 `json:"by_kind_p99_ms"`
	CPUMsPer1000 float64            `json:"cpu_ms_per_1000_commits"`
	// ReadSyscallsPerCommit and WriteSyscallsPerCommit (ModeProcesses)
	// are the primary process's read and write system calls (sockets and
	// files) per commit over the measured window, from /proc/<pid>/io: the
	// messages it receives and sends, which replication adds to.
	ReadSyscallsPerCommit  float64 `json:"primary_read_syscalls_per_commit,omitempty"`
	WriteSyscallsPerCommit float64 `json:"primary_write_syscalls_per_commit,omitempty"`
	CPUScope               string  `json:"cpu_scope,omitempty"`
	// CPUCores is the CPU time of the same scope over the measured window
	// divided by its length: how many cores it kept busy. Near the
	// machine's core count the run is CPU-bound, and then the cells'
	// ratios follow their CPU per commit.
	CPUCores float64 `json:"cpu_cores"`
	// CPUUsPerRequest is CPUScope's CPU time over the measured window per
	// request the clients had answered in it (a Put, a transaction), in
	// µs: with --processes, the primary process's.
	CPUUsPerRequest float64 `json:"cpu_us_per_request,omitempty"`
	// ClientCPUUsPerRequest is the bench process's own CPU time per
	// request, when it runs the clients only (--processes, or an external
	// cluster): what a request costs its client.
	ClientCPUUsPerRequest float64 `json:"client_cpu_us_per_request,omitempty"`
	// PeersCPUUsPerRequest is the log store and replica processes' CPU
	// time together per request (--processes): with every node on the
	// same cores, what the rest of the cluster takes from them.
	PeersCPUUsPerRequest float64 `json:"peers_cpu_us_per_request,omitempty"`
	// CPUUsRuns, ClientCPUUsRuns and PeersCPUUsRuns are the runs'
	// figures, one per round, in the order of Runs.
	CPUUsRuns       []float64 `json:"cpu_us_runs,omitempty"`
	ClientCPUUsRuns []float64 `json:"client_cpu_us_runs,omitempty"`
	PeersCPUUsRuns  []float64 `json:"peers_cpu_us_runs,omitempty"`
	// Pipeline is the operations each terminal keeps in flight on one
	// KVService.Pipeline stream (--pipeline); 0: one unary call at a time.
	Pipeline int `json:"pipeline,omitempty"`
	// ServerCommits is the primary's walship_commits_total{result="ok"}
	// increase over the measured window (write transactions only).
	ServerCommits int64       `json:"server_commits"`
	Nodes         []NodeCheck `json:"nodes"`
	// Runs holds every repetition's txn/s when the row is a median.
	Runs []float64 `json:"runs_txn_per_s,omitempty"`
}

// NodeCheck is the consistency check of one node.
type NodeCheck struct {
	Node       string   `json:"node"`
	VisibleLSN uint64   `json:"visible_lsn"`
	Digest     string   `json:"state_digest"`
	Keys       int      `json:"keys"`
	Violations []string `json:"violations,omitempty"`
}

// Label is the row's cell, "Async/Sync".
func (r Row) Label() string { return r.Replication + "/" + r.Durability }

func (c *Config) policy() primary.Policy {
	p := primary.DefaultPolicy()
	p.Replication, p.Durability = c.Replication, c.Durability
	if c.SyncReplicas > 0 {
		p.SyncReplicas = c.SyncReplicas
	}
	if c.SyncLevel != walshipv1.SyncLevel_SYNC_LEVEL_UNSPECIFIED {
		p.SyncLevel = c.SyncLevel
	}
	if c.SyncTimeout > 0 {
		p.SyncTimeout = c.SyncTimeout
	}
	return p
}

func (c *Config) commitPolicy() *walshipv1.CommitPolicy {
	p := c.policy()
	return &walshipv1.CommitPolicy{
		Durability: p.Durability, Replication: p.Replication, SyncReplicas: uint32(p.SyncReplicas),
		SyncLevel: p.SyncLevel, SyncTimeout: durationpb.New(p.SyncTimeout),
	}
}

// Run runs one benchmark: start (or reach) the cluster, load, warm up,
// measure, then check consistency on every node.
func Run(ctx context.Context, cfg Config) (row Row, err error) {
	if err := cfg.Validate(); err != nil {
		return Row{}, err
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	rep, dur := Cell(cfg.Replication, cfg.Durability)
	pol := cfg.policy()
	row = Row{Workload: cfg.Workload, Codec: cfg.Codec, Replication: rep, Durability: dur,
		SyncReplicas: pol.SyncReplicas, SyncLevel: policyName(pol.SyncLevel.String()), Terminals: cfg.Terminals, Pipeline: cfg.Pipeline,
		DurationS: cfg.Duration.Seconds(), Mode: cfg.Mode, ReplicaNice: cfg.ReplicaNice, ReplicaIdle: cfg.ReplicaIdle, ReplicaCPUs: cfg.ReplicaCPUs, PrimaryCPUs: cfg.PrimaryCPUs, SpeculativeReads: cfg.SpeculativeReads,
		ByKind: map[string]int64{}, ByKindP99Ms: map[string]float64{}}
	var notes []string

	replicas := cfg.Replicas
	if cfg.Replication == walshipv1.ReplicationMode_REPLICATION_MODE_DISABLED && !cfg.ReplicasWhenDisabled && !cfg.ReplicaReads {
		replicas = 0
	}
	var b *backend
	if cfg.Mode == ModeExternal {
		b = startExternal(cfg.PrimaryAddr, cfg.ReplicaAddrs, cfg.PrimaryMetrics)
		notes = append(notes, "external cluster: its codec and replicas are its own")
	} else {
		dir := cfg.Dir
		if dir == "" {
			if dir, err = os.MkdirTemp("", "walship-bench-"); err != nil {
				return row, err
			}
			defer os.RemoveAll(dir)
		} else {
			if dir, err = os.MkdirTemp(dir, fmt.Sprintf("%s-%s-%s-%s-", cfg.Workload, cfg.Codec, rep, dur)); err != nil {
				return row, err
			}
		}
		c, _ := codec.ByName(cfg.Codec)
		if cfg.Mode == ModeProcesses {
			b, err = startProcesses(ctx, procCluster{dialer: cfg.Security.Dialer, bin: cfg.Bin, primary: placement{cpus: cfg.PrimaryCPUs},
				peers: placement{cpus: cfg.ReplicaCPUs, nice: cfg.ReplicaNice, idle: cfg.ReplicaIdle},
				pprof: cfg.ProfileDir != "", noLogStore: cfg.NoLogStore, tlsFlags: cfg.TLSFlags, lsTLSFlags: cfg.LogStoreTLSFlags,
				primaryFlags: cfg.PrimaryFlags, replicaFlags: cfg.ReplicaFlags, logstoreFlags: cfg.LogStoreFlags, basePort: cfg.BasePort}, dir, replicas, c, pol)
		} else {
			b, err = startInProcess(ctx, dir, replicas, c, pol, cfg.Logger, cfg.Security, cfg.BasePort)
		}
		if err != nil {
			return row, fmt.Errorf("start cluster: %w", err)
		}
	}
	row.Replicas, row.NoLogStore = len(b.replicas), cfg.NoLogStore
	defer func() {
		if e := b.stop(); e != nil && err == nil {
			err = fmt.Errorf("stop cluster: %w", e)
		}
	}()
	res, err := drive(ctx, cfg, b, &row)
	row.Notes = strings.Join(append(notes, res...), "; ")
	return row, err
}

// drive loads, runs and checks; it fills row and returns notes.
func drive(ctx context.Context, cfg Config, b *backend, row *Row) ([]string, error) {
	c, err := dialBackend(cfg.Security.Dialer, b)
	if err != nil {
		return nil, err
	}
	defer c.close()

	params := cfg.Params
	params.RunID = randomID()
	params.counts = &runCounts{}
	params.loops = cfg.Terminals * max(1, cfg.Pipeline)
	w, err := newWorkload(cfg.Workload, params)
	if err != nil {
		return nil, err
	}
	loadLSN, loaded, err := loadLevel(ctx, w, c)
	if err != nil {
		return nil, err
	}
	notes := []string{loaded}
	label := fmt.Sprintf("%s/%s %s %s", row.Replication, row.Durability, cfg.Codec, cfg.Workload)
	m, err := measure(ctx, cfg, b, c, w, params, loadLSN, label)
	if err != nil {
		return notes, err
	}
	notes = append(notes, m.fill(row, w.kinds(), b)...)
	more, err := checkConsistency(ctx, c, w, row)
	return append(notes, more...), err
}

// conns are a run's client connections: to the primary and to each
// replica.
type conns struct {
	primary  *grpc.ClientConn
	replicas []*grpc.ClientConn
}

func dialBackend(d serve.Dialer, b *backend) (*conns, error) {
	p, err := d.Dial(b.primary)
	if err != nil {
		return nil, err
	}
	c := &conns{primary: p}
	for _, a := range b.replicas {
		r, err := d.Dial(a)
		if err != nil {
			c.close()
			return nil, err
		}
		c.replicas = append(c.replicas, r)
	}
	return c, nil
}

func (c *conns) close() {
	for _, r := range c.replicas {
		r.Close()
	}
	c.primary.Close()
}

// loadLevel loads w through the primary, then waits until every replica
// has the load, so that the run starts level. It returns the load's last
// LSN and a note of how long it took.
func loadLevel(ctx context.Context, w workload, c *conns) (uint64, string, error) {
	start := time.Now()
	l := newLoader(ctx, walshipv1.NewKVServiceClient(c.primary))
	if err := w.load(l.ctx, l); err != nil {
		return 0, "", fmt.Errorf("load: %w", err)
	}
	lsn, err := l.finish(ctx)
	if err != nil {
		return 0, "", err
	}
	for i, rc := range c.replicas {
		if _, err := walshipv1.NewKVServiceClient(rc).Get(ctx, &walshipv1.GetRequest{Key: "bench/loaded", MinLsn: lsn,
			WaitTimeout: durationpb.New(2 * time.Minute)}); err != nil {
			return 0, "", fmt.Errorf("replica %d catching up with the load: %w", i, err)
		}
	}
	return lsn, fmt.Sprintf("loaded %d keys in %.1fs", l.keys, time.Since(start).Seconds()), nil
}

// measurement is what a run measured: the transactions recorded, the
// replica lag sampled, and what was read at each end of the measured
// window.
type measurement struct {
	rec    *recorder
	lag    *lagSamples
	s0, s1 snap
	// profile is the primary's CPU profile of the window, if one was taken.
	profile string
}

// measure runs the terminals through the warmup and the measured window,
// sampling the replicas' lag and reporting progress meanwhile, and stops
// them after their current transaction.
func measure(ctx context.Context, cfg Config, b *backend, c *conns, w workload, params WorkloadParams, loadLSN uint64, label string) (*measurement, error) {
	m := &measurement{rec: newRecorder(len(w.kinds())), lag: &lagSamples{}}
	kv := walshipv1.NewKVServiceClient(c.primary)
	policy := cfg.commitPolicy()
	loops := cfg.Terminals
	var muxes []*kvpipe.Mux
	if cfg.Pipeline > 0 {
		// A client per terminal, each with its stream and Pipeline loops.
		loops = cfg.Terminals * cfg.Pipeline
		for range cfg.Terminals {
			muxes = append(muxes, kvpipe.NewMux(kv))
		}
		defer func() {
			for _, m := range muxes {
				m.Close()
			}
		}()
	}
	sessions := make([]*session, loops)
	for i := range sessions {
		s := &session{kv: kv, policy: policy, maxRetries: cfg.MaxRetries, lastLSN: loadLSN, speculative: cfg.SpeculativeReads}
		if muxes != nil {
			s.kv = muxes[i/cfg.Pipeline]
		}
		if cfg.ReplicaReads && len(c.replicas) > 0 {
			s.read = walshipv1.NewKVServiceClient(c.replicas[i%len(c.replicas)])
		}
		sessions[i] = s
	}
	var stop stopFlag
	g, gctx := errgroup.WithContext(ctx)
	for i, s := range sessions {
		term := w.terminal(i, newRand(params.Seed, i))
		g.Go(func() error {
			runTerminal(gctx, cfg, i, term, s, m.rec, &stop, params.counts)
			return nil
		})
	}

	// Samplers: progress a second, replica lag every 100 ms.
	sampleCtx, stopSampling := context.WithCancel(ctx)
	var sg sync.WaitGroup
	admin := walshipv1.NewAdminServiceClient(c.primary)
	sg.Go(func() { m.lag.sample(sampleCtx, b, admin, m.rec) })
	start := time.Now()
	sg.Go(func() { reportProgress(sampleCtx, cfg, m.rec, start, label) })

	var runErr error
	if !backoff.Sleep(gctx, cfg.Warmup) {
		runErr = gctx.Err()
	}
	if runErr == nil {
		m.s0 = takeSnap(ctx, b, sessions)
		m.rec.measuring.Store(true)
		profiled := profilePrimary(gctx, cfg, b, label)
		if !backoff.Sleep(gctx, cfg.Duration) {
			runErr = gctx.Err()
		}
		m.rec.measuring.Store(false)
		m.s1 = takeSnap(ctx, b, sessions)
		p := <-profiled
		if p.err != nil && runErr == nil {
			runErr = fmt.Errorf("profile of the primary: %w", p.err)
		}
		m.profile = p.path
	}
	stop.set()
	if err := g.Wait(); err != nil && runErr == nil {
		runErr = err
	}
	stopSampling()
	sg.Wait()
	return m, runErr
}

// runTerminal runs terminal i's transactions through s until stop is set
// or ctx ends, recording each in rec; at cfg.Rate, when set, with the
// terminals' starts spread evenly.
func runTerminal(ctx context.Context, cfg Config, i int, term terminal, s *session, rec *recorder, stop *stopFlag, counts *runCounts) {
	var every time.Duration
	nextStart := time.Now()
	if cfg.Rate > 0 {
		every = time.Duration(float64(cfg.Terminals) / cfg.Rate * float64(time.Second))
		nextStart = nextStart.Add(time.Duration(i) * every / time.Duration(cfg.Terminals))
	}
	for !stop.stopped() && ctx.Err() == nil {
		if every > 0 {
			if !backoff.Sleep(ctx, time.Until(nextStart)) {
				return
			}
			nextStart = nextStart.Add(every)
		}
		start := time.Now()
		kind, err := term.next(ctx, s)
		switch {
		case err == nil || errors.Is(err, errRollback):
			rec.ok(kind, time.Since(start))
		case errors.Is(err, errAborted):
			rec.abort()
		case ctx.Err() != nil:
			return
		default:
			rec.fail(err)
			if (kind == 1 && cfg.Workload == "ycsb-a") || cfg.Workload == "put" {
				counts.unknown.Add(1)
			}
		}
	}
}

// lagSamples are the worst replica's lag, sampled while measuring: in
// seconds (when the primary's metrics are known) and in records.
type lagSamples struct {
	mu      sync.Mutex
	seconds []float64
	records []float64
	archive []float64 // the archive's lag in seconds, if it has one
}

// lagSampleEvery spaces the lag samples: each is a scrape of the
// primary's /metrics, work the primary does for the bench and that its
// CPU per commit counts, so not more often than needed for a p99 over a
// window of seconds.
const lagSampleEvery = 250 * time.Millisecond

// sample samples the lag every lagSampleEvery while rec is measuring,
// until ctx ends.
func (l *lagSamples) sample(ctx context.Context, b *backend, admin walshipv1.AdminServiceClient, rec *recorder) {
	t := time.NewTicker(lagSampleEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if !rec.measuring.Load() {
			continue
		}
		if a, ok := archiveLag(ctx, b); ok {
			l.mu.Lock()
			l.archive = append(l.archive, a)
			l.mu.Unlock()
		}
		if len(b.replicas) == 0 {
			continue
		}
		seconds, records, ok := worstApplyLag(ctx, b)
		if !ok {
			seconds, records = -1, worstLagRecords(ctx, admin)
		}
		l.mu.Lock()
		if seconds >= 0 {
			l.seconds = append(l.seconds, seconds)
		}
		l.records = append(l.records, records)
		l.mu.Unlock()
	}
}

// worstApplyLag is the largest apply-stage lag of the primary's lag
// gauges (computed at scrape time), in seconds and in records, from one
// scrape; ok is false when its metrics are unknown.
func worstApplyLag(ctx context.Context, b *backend) (seconds, records float64, ok bool) {
	if b.gather == nil {
		return 0, 0, false
	}
	mfs, err := b.gather(ctx)
	if err != nil {
		return 0, 0, false
	}
	worst := func(name string) (float64, bool) {
		mf, ok := mfs[name]
		if !ok {
			return 0, false
		}
		w := 0.0
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "stage" && l.GetValue() == "apply" {
					w = max(w, m.GetGauge().GetValue())
				}
			}
		}
		return w, true
	}
	seconds, ok1 := worst("walship_replication_lag_seconds")
	records, ok2 := worst("walship_replication_lag_records")
	return seconds, records, ok1 && ok2
}

// archiveLag is the primary's walship_archive_lag_seconds; ok is false
// when it exports none (no log store archives).
func archiveLag(ctx context.Context, b *backend) (float64, bool) {
	if b.gather == nil {
		return 0, false
	}
	mfs, err := b.gather(ctx)
	if err != nil {
		return 0, false
	}
	mf, ok := mfs["walship_archive_lag_seconds"]
	if !ok || len(mf.GetMetric()) == 0 {
		return 0, false
	}
	return mf.GetMetric()[0].GetGauge().GetValue(), true
}

// worstLagRecords is the largest replica lag in records of the primary's
// Status, or 0 when it cannot be read.
func worstLagRecords(ctx context.Context, admin walshipv1.AdminServiceClient) float64 {
	worst := 0.0
	if st, err := admin.Status(ctx, &walshipv1.StatusRequest{}); err == nil {
		for _, p := range st.Peers {
			if p.Role == walshipv1.Role_ROLE_REPLICA {
				worst = max(worst, float64(p.LagRecords))
			}
		}
	}
	return worst
}

// reportProgress takes rec's last second every second and, when
// cfg.Progress is set, writes its rate and p99 there, until ctx ends.
func reportProgress(ctx context.Context, cfg Config, rec *recorder, start time.Time, label string) {
	total := cfg.Warmup + cfg.Duration
	t := time.NewTicker(time.Second)
	defer t.Stop()
	last := time.Now()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		ds := rec.tick()
		now := time.Now()
		rate := float64(len(ds)) / now.Sub(last).Seconds()
		last = now
		if cfg.Progress != nil {
			phase := ""
			if !rec.measuring.Load() && now.Sub(start) < cfg.Warmup {
				phase = "  (warmup)"
			}
			fmt.Fprintf(cfg.Progress, "[%3.0fs/%.0fs] %s  %.0f txn/s  p99 %.1fms%s\n",
				now.Sub(start).Seconds(), total.Seconds(), label, rate, ms(percentile(ds, 0.99)), phase)
		}
	}
}

// snap is what is read at each end of the measured window.
type snap struct {
	at               time.Time
	walBytes, commit float64
	metrics          bool
	// The primary's WAL entries (groups) and fsyncs, when it reports them.
	batches, fsyncs, fsyncSecs float64
	groups                     bool
	cpu                        time.Duration
	cpuOK                      bool
	// The bench process's own CPU time (its clients'), when it runs no
	// node.
	clientCPU   time.Duration
	clientCPUOK bool
	// The log store and replica processes' CPU time, when they are the
	// bench's.
	peersCPU   time.Duration
	peersCPUOK bool
	// The primary process's read and write system calls, when known.
	sysReads, sysWrites uint64
	syscallsOK          bool
	retries             int64
}

// takeSnap reads the primary's WAL bytes and commits (when its metrics
// are known), the CPU time (when known) and the sessions' retries.
func takeSnap(ctx context.Context, b *backend, sessions []*session) snap {
	s := snap{at: time.Now()}
	if b.gather != nil {
		if mfs, err := b.gather(ctx); err == nil {
			var ok1, ok2 bool
			s.walBytes, ok1 = metricSum(mfs, "walship_wal_written_bytes_total", nil)
			s.commit, ok2 = metricSum(mfs, "walship_commits_total", map[string]string{"result": "ok"})
			s.metrics = ok1 && ok2
			var ok3, ok4 bool
			s.batches, ok3 = metricSum(mfs, "walship_wal_batches_total", nil)
			s.fsyncs, s.fsyncSecs, ok4 = histogramSum(mfs, "walship_wal_fsync_duration_seconds")
			s.groups = ok3 && ok4
		}
	}
	if b.cpu != nil {
		if c, err := b.cpu(); err == nil {
			s.cpu, s.cpuOK = c, true
		}
	}
	if b.mode != ModeInProcess {
		if c, err := cpustat.Self(); err == nil {
			s.clientCPU, s.clientCPUOK = c, true
		}
	}
	if b.peersCPU != nil {
		if c, err := b.peersCPU(); err == nil {
			s.peersCPU, s.peersCPUOK = c, true
		}
	}
	if b.syscalls != nil {
		if r, w, err := b.syscalls(); err == nil {
			s.sysReads, s.sysWrites, s.syscallsOK = r, w, true
		}
	}
	for _, x := range sessions {
		s.retries += x.retries.Load()
	}
	return s
}

// profiled is a profile of the primary taken over a measured window: its
// file, or why there is none.
type profiled struct {
	path string
	err  error
}

// profilePrimary starts taking a CPU profile of the primary over the
// measured window into cfg.ProfileDir, named after label and numbered
// after the runs before it; the channel says how it ended (at once, with
// no path, when there is no profile to take).
func profilePrimary(ctx context.Context, cfg Config, b *backend, label string) <-chan profiled {
	done := make(chan profiled, 1)
	if cfg.ProfileDir == "" || b.profile == nil {
		done <- profiled{}
		return done
	}
	name := fmt.Sprintf("%s-%dreplicas", strings.NewReplacer("/", "-", " ", "-").Replace(label), len(b.replicas))
	if cfg.NoLogStore {
		name += "-nologstore"
	}
	f, err := createNumbered(cfg.ProfileDir, name, ".pprof")
	if err != nil {
		done <- profiled{err: err}
		return done
	}
	go func() {
		err := b.profile(ctx, cfg.Duration, f)
		done <- profiled{path: f.Name(), err: errors.Join(err, f.Close())}
	}()
	return done
}

// createNumbered creates dir/name-N.ext for the first N from 1 that is
// not taken: one file per round of a cell.
func createNumbered(dir, name, ext string) (*os.File, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	for n := 1; ; n++ {
		f, err := os.OpenFile(filepath.Join(dir, fmt.Sprintf("%s-%d%s", name, n, ext)), os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
		if !errors.Is(err, fs.ErrExist) {
			return f, err
		}
	}
}

// fill sets row's figures of the measured window and returns notes of
// what is unknown and of errors.
func (m *measurement) fill(row *Row, kinds []string, b *backend) []string {
	var notes []string
	window := m.s1.at.Sub(m.s0.at).Seconds()
	rec := m.rec
	rec.mu.Lock()
	row.Commits, row.Aborts, row.Errors = rec.commits, rec.aborts, rec.errors
	row.TxnPerS = float64(rec.commits) / window
	row.P50Ms, row.P99Ms = ms(percentile(rec.lat, 0.5)), ms(percentile(rec.lat, 0.99))
	for i, k := range kinds {
		row.ByKind[k] = rec.byKind[i]
		row.ByKindP99Ms[k] = ms(percentile(rec.kindLat[i], 0.99))
	}
	firstErr := rec.firstErr
	rec.mu.Unlock()
	row.Retries = m.s1.retries - m.s0.retries
	row.ReplicaLagP99S = percentileF(m.lag.seconds, 0.99)
	row.ReplicaLagP99Records = percentileF(m.lag.records, 0.99)
	if len(m.lag.archive) > 0 {
		row.ArchiveLagP99S = percentileF(m.lag.archive, 0.99)
		row.ArchiveLagMaxS = slices.Max(m.lag.archive)
	}
	if len(b.replicas) > 0 && len(m.lag.seconds) == 0 {
		notes = append(notes, "replica lag in seconds unknown (no primary metrics)")
	}
	if m.s0.metrics && m.s1.metrics {
		row.WALMBPerS = (m.s1.walBytes - m.s0.walBytes) / window / 1e6
		if m.s0.groups && m.s1.groups {
			if n := m.s1.batches - m.s0.batches; n > 0 {
				row.CommitsPerBatch = (m.s1.commit - m.s0.commit) / n
			}
			if n := m.s1.fsyncs - m.s0.fsyncs; n > 0 {
				row.FsyncMs = (m.s1.fsyncSecs - m.s0.fsyncSecs) / n * 1000
			}
		}
		row.ServerCommits = int64(m.s1.commit - m.s0.commit)
	} else {
		notes = append(notes, "WAL MB/s unknown (no primary metrics)")
	}
	if m.s0.cpuOK && m.s1.cpuOK {
		row.CPUCores = (m.s1.cpu - m.s0.cpu).Seconds() / window
		commits := float64(row.ServerCommits)
		if commits == 0 {
			commits = float64(row.Commits)
		}
		if commits > 0 {
			row.CPUMsPer1000 = ms(m.s1.cpu-m.s0.cpu) / commits * 1000
			row.CPUScope = b.cpuScope
		}
		if reqs := row.Commits + row.Aborts; reqs > 0 {
			row.CPUUsPerRequest = us(m.s1.cpu-m.s0.cpu) / float64(reqs)
		}
	}
	if reqs := row.Commits + row.Aborts; m.s0.clientCPUOK && m.s1.clientCPUOK && reqs > 0 {
		row.ClientCPUUsPerRequest = us(m.s1.clientCPU-m.s0.clientCPU) / float64(reqs)
	}
	if reqs := row.Commits + row.Aborts; m.s0.peersCPUOK && m.s1.peersCPUOK && reqs > 0 {
		row.PeersCPUUsPerRequest = us(m.s1.peersCPU-m.s0.peersCPU) / float64(reqs)
	}
	if commits := float64(row.ServerCommits); m.s0.syscallsOK && m.s1.syscallsOK && commits > 0 {
		// Counts, not times: what a change to the message pattern does
		// shows here through the machine's noise.
		row.ReadSyscallsPerCommit = float64(m.s1.sysReads-m.s0.sysReads) / commits
		row.WriteSyscallsPerCommit = float64(m.s1.sysWrites-m.s0.sysWrites) / commits
	}
	if m.profile != "" {
		row.PrimaryProfile = m.profile
		if shares, err := profileShares(m.profile); err != nil {
			notes = append(notes, fmt.Sprintf("profile %s: %v", m.profile, err))
		} else {
			row.PrimaryCPUShares = shares
		}
	}
	if row.Errors > 0 {
		notes = append(notes, fmt.Sprintf("%d errors, first: %v", row.Errors, firstErr))
	}
	return notes
}

// checkConsistency checks that the primary's last LSN reaches every node,
// that every node's full state satisfies the workload's conditions and
// that all digests agree. It fills row's Nodes and Consistent and returns
// a note when the digests differ.
func checkConsistency(ctx context.Context, c *conns, w workload, row *Row) ([]string, error) {
	st, err := walshipv1.NewAdminServiceClient(c.primary).Status(ctx, &walshipv1.StatusRequest{})
	if err != nil {
		return nil, fmt.Errorf("primary status: %w", err)
	}
	last := st.LastLsn
	type node struct {
		name string
		conn *grpc.ClientConn
	}
	nodes := []node{{"primary", c.primary}}
	for i, rc := range c.replicas {
		nodes = append(nodes, node{fmt.Sprintf("replica-%d", i), rc})
	}
	row.Consistent = true
	digests := map[string]bool{}
	for _, n := range nodes {
		nc, err := checkNode(ctx, n.conn, last, w.checker())
		nc.Node = n.name
		if err != nil {
			nc.Violations = append(nc.Violations, err.Error())
		}
		if len(nc.Violations) > 0 {
			row.Consistent = false
		}
		digests[nc.Digest] = true
		row.Nodes = append(row.Nodes, nc)
	}
	if len(digests) > 1 {
		row.Consistent = false
		return []string{"state digests differ between nodes"}, nil
	}
	return nil, nil
}

// checkNode scans the node's whole state at (at least) LSN at and feeds it
// to ck, then reads the node's visible LSN and digest.
func checkNode(ctx context.Context, conn *grpc.ClientConn, at uint64, ck checker) (NodeCheck, error) {
	var nc NodeCheck
	kv := walshipv1.NewKVServiceClient(conn)
	start := ""
	for {
		resp, err := kv.Scan(ctx, &walshipv1.ScanRequest{Start: start, MinLsn: at, Limit: 1000, WaitTimeout: durationpb.New(time.Minute)})
		if err != nil {
			return nc, fmt.Errorf("scan at LSN %d: %w", at, err)
		}
		for _, p := range resp.Kvs {
			ck.add(p.Key, p.Value)
		}
		nc.Keys += len(resp.Kvs)
		if !resp.More || len(resp.Kvs) == 0 {
			break
		}
		start = resp.Kvs[len(resp.Kvs)-1].Key + "\x00"
	}
	nc.Violations = ck.violations()
	st, err := walshipv1.NewAdminServiceClient(conn).Status(ctx, &walshipv1.StatusRequest{})
	if err != nil {
		return nc, err
	}
	nc.VisibleLSN, nc.Digest = st.VisibleLsn, st.StateDigest
	return nc, nil
}

// stopFlag tells the terminals to stop after their current transaction,
// so that no write is cut off with an unknown outcome.
type stopFlag struct{ v atomic.Bool }

func (s *stopFlag) set()          { s.v.Store(true) }
func (s *stopFlag) stopped() bool { return s.v.Load() }

func randomID() string {
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// DefaultBin is the walship binary for ModeProcesses: $WALSHIP_BIN, else
// this executable.
func DefaultBin() string {
	if p := os.Getenv("WALSHIP_BIN"); p != "" {
		return p
	}
	p, err := os.Executable()
	if err != nil {
		return ""
	}
	if abs, err := filepath.Abs(p); err == nil {
		return abs
	}
	return p
}

// RunInterleaved runs every config n times, round by round (each round
// runs every config once, in order), and returns one row per config: the
// run with the median throughput, with every run's throughput in Runs.
// Rounds rather than n runs in a row, because this machine's disk and CPU
// drift over minutes: a ratio between cells is only fair when their runs
// alternate. done is called after each run.
func RunInterleaved(ctx context.Context, cfgs []Config, n int, done func(Row)) ([]Row, error) {
	n = max(n, 1)
	runs := make([][]Row, len(cfgs))
	for round := 0; round < n; round++ {
		for i, cfg := range cfgs {
			r, err := Run(ctx, cfg)
			if err != nil {
				rep, dur := Cell(cfg.Replication, cfg.Durability)
				return medians(runs), fmt.Errorf("%s %s/%s %s: %w", cfg.Workload, rep, dur, cfg.Codec, err)
			}
			if done != nil {
				done(r)
			}
			runs[i] = append(runs[i], r)
		}
	}
	return medians(runs), nil
}

// medians returns, for each config's runs, the one with the median
// throughput (the lower middle one for an even count), annotated with all,
// with the median CPU and system calls per commit of all.
func medians(runs [][]Row) []Row {
	var rows []Row
	for _, rs := range runs {
		if len(rs) == 0 {
			continue
		}
		if len(rs) == 1 {
			rows = append(rows, rs[0])
			continue
		}
		sorted := slices.Clone(rs)
		sort.Slice(sorted, func(i, j int) bool { return sorted[i].TxnPerS < sorted[j].TxnPerS })
		med := sorted[(len(sorted)-1)/2]
		med.Runs, med.CPURuns, med.CPUUsRuns, med.ClientCPUUsRuns, med.PeersCPUUsRuns = nil, nil, nil, nil, nil
		var reads, writes []float64
		for _, r := range rs {
			med.Runs = append(med.Runs, r.TxnPerS)
			med.CPURuns = append(med.CPURuns, r.CPUMsPer1000)
			med.CPUUsRuns = append(med.CPUUsRuns, r.CPUUsPerRequest)
			med.ClientCPUUsRuns = append(med.ClientCPUUsRuns, r.ClientCPUUsPerRequest)
			med.PeersCPUUsRuns = append(med.PeersCPUUsRuns, r.PeersCPUUsPerRequest)
			reads, writes = append(reads, r.ReadSyscallsPerCommit), append(writes, r.WriteSyscallsPerCommit)
			med.Consistent = med.Consistent && r.Consistent
		}
		// Paced runs (--rate) have the same throughput: the costs per
		// commit are medians of their own, not the median run's.
		med.CPUMsPer1000 = medianOf(med.CPURuns)
		med.CPUUsPerRequest, med.ClientCPUUsPerRequest = medianOf(med.CPUUsRuns), medianOf(med.ClientCPUUsRuns)
		med.PeersCPUUsPerRequest = medianOf(med.PeersCPUUsRuns)
		med.ReadSyscallsPerCommit, med.WriteSyscallsPerCommit = medianOf(reads), medianOf(writes)
		rows = append(rows, med)
	}
	return rows
}

// MatrixCells are the seed's table's cells: Replication × Durability.
var MatrixCells = [][2]string{
	{"sync", "sync"}, {"sync", "async"}, {"async", "sync"}, {"async", "async"}, {"disabled", "sync"}, {"disabled", "async"},
}

// medianOf is the median of xs (the mean of the middle two for an even
// count; 0 for none).
func medianOf(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Sorted(slices.Values(xs))
	if n := len(s); n%2 == 0 {
		return (s[n/2-1] + s[n/2]) / 2
	}
	return s[len(s)/2]
}
