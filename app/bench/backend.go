package bench

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/walship/walship/app/cluster"
	"github.com/walship/walship/internal/cpustat"
	"github.com/walship/walship/internal/serve"
	"github.com/walship/walship/pkg/codec"
	"github.com/walship/walship/services/primary"
	"google.golang.org/grpc"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

// Modes of running the cluster.
const (
	ModeInProcess = "in-process"
	ModeProcesses = "processes"
	ModeExternal  = "external"
)

// backend is the cluster a run drives.
type backend struct {
	mode     string
	primary  string
	replicas []string
	// gather returns the primary's metrics, or nil when they are unknown.
	gather func(ctx context.Context) (map[string]*dto.MetricFamily, error)
	// cpu returns the CPU time (user+system) of what cpuScope names.
	cpu      func() (time.Duration, error)
	cpuScope string
	// peersCPU returns the CPU time of the log store and replica
	// processes together (nil: none runs as a process of the bench's).
	peersCPU func() (time.Duration, error)
	// syscalls returns how many read and write system calls the primary
	// process has made (nil: unknown, or not the primary's alone).
	syscalls func() (reads, writes uint64, err error)
	// profile writes a CPU profile of the primary over the next d to w
	// (nil: the primary serves no profiles).
	profile func(ctx context.Context, d time.Duration, w io.Writer) error
	stop    func() error
	// procs are the started processes (ModeProcesses), log store first.
	procs []*proc
}

// startInProcess starts a log store, a primary and n replicas in this
// process (app/cluster), the way `walship dev` does.
func startInProcess(ctx context.Context, dir string, n int, c codec.Codec, pol primary.Policy, logger *slog.Logger, sec serve.Security, basePort int) (*backend, error) {
	cl, err := cluster.Start(ctx, cluster.Config{
		Dir: dir, LogStores: 1, Replicas: n, BasePort: basePort,
		Primary:  func(cfg *primary.Config) { cfg.Codec, cfg.Policy = c, pol },
		Logger:   logger,
		Security: sec,
	})
	if err != nil {
		return nil, err
	}
	b := &backend{mode: ModeInProcess, primary: cl.Primary.Addr, stop: cl.Stop,
		cpu: cpustat.Self, cpuScope: "whole bench process (cluster and clients)"}
	for _, r := range cl.Replicas {
		b.replicas = append(b.replicas, r.Addr)
	}
	reg := cl.Primary.Registry
	b.gather = func(context.Context) (map[string]*dto.MetricFamily, error) {
		mfs, err := reg.Gather()
		if err != nil {
			return nil, err
		}
		out := make(map[string]*dto.MetricFamily, len(mfs))
		for _, mf := range mfs {
			out[mf.GetName()] = mf
		}
		return out, nil
	}
	return b, nil
}

// startExternal targets a running cluster. metricsAddr (host:port of the
// primary's /metrics) is optional.
func startExternal(primaryAddr string, replicas []string, metricsAddr string) *backend {
	b := &backend{mode: ModeExternal, primary: primaryAddr, replicas: replicas, stop: func() error { return nil }}
	if metricsAddr != "" {
		b.gather = scraper(metricsAddr)
	}
	return b
}

func scraper(addr string) func(ctx context.Context) (map[string]*dto.MetricFamily, error) {
	url := addr
	if !strings.HasPrefix(url, "http") {
		url = "http://" + addr + "/metrics"
	}
	return func(ctx context.Context) (map[string]*dto.MetricFamily, error) {
		var mfs map[string]*dto.MetricFamily
		err := httpGet(ctx, url, "text/plain", func(body io.Reader) (err error) {
			p := expfmt.NewTextParser(model.UTF8Validation)
			mfs, err = p.TextToMetricFamilies(body)
			return err
		})
		return mfs, err
	}
}

// httpGet GETs url (with an Accept header, if given) and hands a 200
// answer's body to read.
func httpGet(ctx context.Context, url, accept string, read func(io.Reader) error) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	if accept != "" {
		req.Header.Set("Accept", accept)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	return read(resp.Body)
}

// profiler returns a function that takes a CPU profile from the
// /debug/pprof/ of the metrics listener at addr (a process run with
// --pprof).
func profiler(addr string) func(ctx context.Context, d time.Duration, w io.Writer) error {
	return func(ctx context.Context, d time.Duration, w io.Writer) error {
		secs := max(1, int(math.Ceil(d.Seconds())))
		url := fmt.Sprintf("http://%s/debug/pprof/profile?seconds=%d", addr, secs)
		return httpGet(ctx, url, "", func(body io.Reader) error {
			_, err := io.Copy(w, body)
			return err
		})
	}
}

// proc is a walship child process.
type proc struct {
	name    string
	cmd     *exec.Cmd
	addr    string
	metrics string
	done    chan struct{}
	mu      sync.Mutex
	tail    []string // last log lines, for errors
}

// placement is where and how a child runs on this machine: pinned to the
// CPUs in cpus (a taskset list, "" = wherever the bench may run), at a nice
// value (nice > 0) or under SCHED_IDLE (idle), or as the bench does (the
// zero value).
type placement struct {
	cpus string
	nice int
	idle bool
}

// command returns the command line that runs bin args placed as p, through
// taskset, chrt or nice, so that every thread of the child is placed from
// its start (Go starts its threads before main could move its own).
func (p placement) command(bin string, args []string) (string, []string) {
	argv := append([]string{bin}, args...)
	switch {
	case p.idle:
		argv = append([]string{"chrt", "--idle", "0"}, argv...)
	case p.nice > 0:
		argv = append([]string{"nice", "-n", strconv.Itoa(p.nice)}, argv...)
	}
	if p.cpus != "" {
		argv = append([]string{"taskset", "-c", p.cpus}, argv...)
	}
	return argv[0], argv[1:]
}

// startProc runs `bin args... --log-format json` placed as at and waits
// for its "<servingMsg>" log line, which carries its addresses.
func startProc(ctx context.Context, d serve.Dialer, bin string, at placement, name, servingMsg string, args ...string) (*proc, error) {
	args = append(args, "--log-format", "json")
	path, argv := at.command(bin, args)
	cmd := exec.Command(path, argv...)
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "WALSHIP_") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	stderr, err := cmd.StderrPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	p := &proc{name: name, cmd: cmd, done: make(chan struct{})}
	type addrs struct{ grpc, metrics string }
	up := make(chan addrs, 1)
	go func() {
		defer close(p.done)
		sc := bufio.NewScanner(stderr)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			line := sc.Text()
			p.mu.Lock()
			p.tail = append(p.tail, line)
			if len(p.tail) > 20 {
				p.tail = p.tail[1:]
			}
			p.mu.Unlock()
			var rec map[string]any
			if json.Unmarshal([]byte(line), &rec) == nil && rec["msg"] == servingMsg {
				a, _ := rec["addr"].(string)
				m, _ := rec["metrics"].(string)
				select {
				case up <- addrs{a, m}:
				default:
				}
			}
		}
		_, _ = io.Copy(io.Discard, stderr)
		_ = cmd.Wait()
	}()
	select {
	case a := <-up:
		p.addr, p.metrics = a.grpc, a.metrics
	case <-p.done:
		return nil, fmt.Errorf("%s exited before serving: %s", name, p.logTail())
	case <-time.After(60 * time.Second):
		p.kill()
		return nil, fmt.Errorf("%s did not log %q within 60s: %s", name, servingMsg, p.logTail())
	case <-ctx.Done():
		p.kill()
		return nil, ctx.Err()
	}
	if err := waitServing(ctx, d, p.addr); err != nil {
		p.kill()
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	return p, nil
}

func (p *proc) logTail() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return strings.Join(p.tail, "\n")
}

func (p *proc) kill() {
	_ = p.cmd.Process.Kill()
	<-p.done
}

// stop sends SIGTERM and waits; past 30 s it kills.
func (p *proc) stop() error {
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(30 * time.Second):
		p.kill()
		return fmt.Errorf("%s: no exit 30s after SIGTERM, killed", p.name)
	}
	if st := p.cmd.ProcessState; st != nil && !st.Success() {
		return fmt.Errorf("%s: %v", p.name, st)
	}
	return nil
}

func waitServing(ctx context.Context, d serve.Dialer, addr string) error {
	conn, err := d.Dial(addr)
	if err != nil {
		return err
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	w, err := healthpb.NewHealthClient(conn).Watch(ctx, &healthpb.HealthCheckRequest{}, grpc.WaitForReady(true))
	if err != nil {
		return fmt.Errorf("health: %w", err)
	}
	for {
		m, err := w.Recv()
		if err != nil {
			return fmt.Errorf("not serving: %w", err)
		}
		if m.Status == healthpb.HealthCheckResponse_SERVING {
			return nil
		}
	}
}

// procCluster is how startProcesses starts its processes: the binary,
// where the primary and where its peers (the log store and the replicas)
// run, whether the primary serves its profiles (Config.ProfileDir), the
// TLS flags the processes get, and the flags the user adds to the
// primary's and the replicas' (Config.PrimaryFlags, ReplicaFlags).
type procCluster struct {
	dialer         serve.Dialer // how the bench dials the processes (their TLS flags' identity)
	bin            string
	primary, peers placement
	pprof          bool
	noLogStore     bool // the primary alone (no replicas then)
	tlsFlags       []string
	lsTLSFlags     []string // the log store's
	primaryFlags   []string
	replicaFlags   []string
	logstoreFlags  []string
	basePort       int // 0: any free ports
}

// addrs are the gRPC and metrics listen addresses of the node at offset
// from the base port (log store 0, primary 1, replicas from 2), or any
// free ports without one.
func (pc procCluster) addrs(offset int) (grpcAddr, metrics string) {
	if pc.basePort == 0 {
		return "127.0.0.1:0", "127.0.0.1:0"
	}
	return fmt.Sprintf("127.0.0.1:%d", pc.basePort+offset), fmt.Sprintf("127.0.0.1:%d", pc.basePort+2000+offset)
}

// startProcesses runs a log store, a primary and n replicas as separate
// `walship` processes, so the primary's CPU time is its own, each placed
// runFlags is flags with every "{run}" replaced by a name of this run's
// own (its directory's): each run starts a new cluster, and something it
// must not share with the runs before — an archive's prefix, which a
// second cluster is refused — can say so.
func runFlags(flags []string, dir string) []string {
	out := make([]string, len(flags))
	for i, f := range flags {
		out[i] = strings.ReplaceAll(f, "{run}", filepath.Base(dir))
	}
	return out
}

// as pc says.
func startProcesses(ctx context.Context, pc procCluster, dir string, n int, c codec.Codec, pol primary.Policy) (*backend, error) {
	var procs []*proc
	stopAll := func() error {
		var errs []error
		for i := len(procs) - 1; i >= 0; i-- {
			errs = append(errs, procs[i].stop())
		}
		return errors.Join(errs...)
	}
	ok := false
	defer func() {
		if !ok {
			_ = stopAll()
		}
	}()
	pl, pm := pc.addrs(1)
	args := []string{"primary", "--listen", pl, "--metrics-listen", pm,
		"--data-dir", filepath.Join(dir, "primary"), "--codec", c.Name()}
	var lsArgs []string
	if !pc.noLogStore {
		ll, lm := pc.addrs(0)
		ls, err := startProc(ctx, pc.dialer, pc.bin, pc.peers, "logstore", "log store serving", append([]string{"logstore", "--listen", ll, "--metrics-listen", lm,
			"--data-dir", filepath.Join(dir, "logstore-0")}, slices.Concat(pc.lsTLSFlags, runFlags(pc.logstoreFlags, dir))...)...)
		if err != nil {
			return nil, err
		}
		procs = append(procs, ls)
		lsArgs = []string{"--logstore", ls.addr}
	}
	args = append(append(args, lsArgs...), "--durability", policyName(pol.Durability.String()), "--replication", policyName(pol.Replication.String()),
		"--sync-replicas", strconv.Itoa(pol.SyncReplicas), "--sync-level", policyName(pol.SyncLevel.String()),
		"--sync-timeout", pol.SyncTimeout.String())
	if pc.pprof {
		args = append(args, "--pprof")
	}
	pr, err := startProc(ctx, pc.dialer, pc.bin, pc.primary, "primary", "primary serving", slices.Concat(args, pc.tlsFlags, pc.primaryFlags)...)
	if err != nil {
		return nil, err
	}
	procs = append(procs, pr)
	b := &backend{mode: ModeProcesses, primary: pr.addr, stop: stopAll, gather: scraper(pr.metrics),
		cpuScope: "primary process"}
	pid := pr.cmd.Process.Pid
	b.cpu = func() (time.Duration, error) { return procCPU(pid) }
	b.syscalls = func() (uint64, uint64, error) { return procSyscalls(pid) }
	if pc.pprof {
		b.profile = profiler(pr.metrics)
	}
	for i := 0; i < n; i++ {
		id := fmt.Sprintf("replica-%d", i)
		rl, rm := pc.addrs(2 + i)
		rp, err := startProc(ctx, pc.dialer, pc.bin, pc.peers, id, "replica serving", append([]string{"replica", "--listen", rl, "--metrics-listen", rm,
			"--data-dir", filepath.Join(dir, id), "--id", id, "--primary", pr.addr}, slices.Concat(lsArgs, pc.tlsFlags, pc.replicaFlags)...)...)
		if err != nil {
			return nil, err
		}
		procs = append(procs, rp)
		b.replicas = append(b.replicas, rp.addr)
	}
	b.procs = procs
	if peers := slices.DeleteFunc(slices.Clone(procs), func(p *proc) bool { return p == pr }); len(peers) > 0 {
		b.peersCPU = func() (time.Duration, error) {
			var sum time.Duration
			for _, p := range peers {
				c, err := procCPU(p.cmd.Process.Pid)
				if err != nil {
					return 0, err
				}
				sum += c
			}
			return sum, nil
		}
	}
	ok = true
	return b, nil
}

// policyName turns DURABILITY_SYNC, REPLICATION_MODE_ASYNC or
// SYNC_LEVEL_FLUSH into the flag value (sync, async, flush).
func policyName(enum string) string {
	return strings.ToLower(enum[strings.LastIndex(enum, "_")+1:])
}

// clockTicks is USER_HZ, the unit of /proc/<pid>/stat times: 100 on every
// Linux architecture Go supports.
const clockTicks = 100

// procCPU reads utime+stime of pid from /proc/<pid>/stat.
func procCPU(pid int) (time.Duration, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	return parseProcStat(string(b))
}

// procSyscalls reads how many read and write system calls pid has made
// (syscr and syscw of /proc/<pid>/io: read, write and their vector and
// positional forms, on sockets and files alike; the kernel counts them
// per thread and sums the live and the ended threads).
func procSyscalls(pid int) (reads, writes uint64, err error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/io", pid))
	if err != nil {
		return 0, 0, err
	}
	return parseProcIO(string(b))
}

func parseProcIO(s string) (reads, writes uint64, err error) {
	var haveR, haveW bool
	for _, line := range strings.Split(s, "\n") {
		k, v, ok := strings.Cut(line, ":")
		if !ok || (k != "syscr" && k != "syscw") {
			continue
		}
		n, err := strconv.ParseUint(strings.TrimSpace(v), 10, 64)
		if err != nil {
			return 0, 0, fmt.Errorf("proc io: %s: %w", k, err)
		}
		if k == "syscr" {
			reads, haveR = n, true
		} else {
			writes, haveW = n, true
		}
	}
	if !haveR || !haveW {
		return 0, 0, errors.New("proc io: no syscr or syscw")
	}
	return reads, writes, nil
}

func parseProcStat(s string) (time.Duration, error) {
	// Fields after the command name, which is in parentheses and may hold spaces.
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0, fmt.Errorf("proc stat: no command name")
	}
	f := strings.Fields(s[i+1:])
	// f[0] is field 3 (state); utime and stime are fields 14 and 15.
	if len(f) < 13 {
		return 0, fmt.Errorf("proc stat: %d fields", len(f))
	}
	u, err1 := strconv.ParseInt(f[11], 10, 64)
	st, err2 := strconv.ParseInt(f[12], 10, 64)
	if err := errors.Join(err1, err2); err != nil {
		return 0, fmt.Errorf("proc stat: %w", err)
	}
	return time.Duration(u+st) * time.Second / clockTicks, nil
}

// histogramSum adds the sample counts and sums of a histogram family's
// series.
func histogramSum(mfs map[string]*dto.MetricFamily, name string) (count, sum float64, ok bool) {
	mf, ok := mfs[name]
	if !ok {
		return 0, 0, false
	}
	for _, m := range mf.GetMetric() {
		if h := m.GetHistogram(); h != nil {
			count += float64(h.GetSampleCount())
			sum += h.GetSampleSum()
		}
	}
	return count, sum, true
}

// metricSum adds the values of a counter or gauge family's series whose
// labels include every pair of match.
func metricSum(mfs map[string]*dto.MetricFamily, name string, match map[string]string) (float64, bool) {
	mf, ok := mfs[name]
	if !ok {
		return 0, false
	}
	sum := 0.0
	for _, m := range mf.GetMetric() {
		labels := map[string]string{}
		for _, l := range m.GetLabel() {
			labels[l.GetName()] = l.GetValue()
		}
		skip := false
		for k, v := range match {
			if labels[k] != v {
				skip = true
			}
		}
		if skip {
			continue
		}
		switch {
		case m.Counter != nil:
			sum += m.GetCounter().GetValue()
		case m.Gauge != nil:
			sum += m.GetGauge().GetValue()
		case m.Untyped != nil:
			sum += m.GetUntyped().GetValue()
		}
	}
	return sum, true
}
