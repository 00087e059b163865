package monitoring

import (
	"context"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"io"
	"maps"
	"math"
	"math/rand/v2"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	walshipv1 "github.com/walship/walship/gen/walship/v1"
	"github.com/walship/walship/internal/tlsid"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
)

// TestClusterObservability runs a real cluster (a log store, a primary and
// two replicas, each its own process) scraped by a real Prometheus loaded
// with deploy/prometheus/walship-rules.yaml, and checks, against live data:
//
//   - promtool check metrics finds no problem in any service's /metrics;
//   - the walship_* families the services export are exactly knownMetrics
//     (type and label names), and docs/METRICS.md when it exists;
//   - every dashboard panel query and template variable returns data;
//   - every rule evaluates without error and the recording rules produce data;
//   - lag is honest: it stays at 0 while the primary is idle, grows past the
//     WalshipReplicaLagHigh threshold for a SIGSTOPped replica (the alert's
//     real expression returns it, and only it), and returns to 0 once the
//     replica runs again.
func TestClusterObservability(t *testing.T) {
	if testing.Short() {
		t.Skip("runs a cluster and Prometheus for about a minute; skipped with -short")
	}
	if runtime.GOOS != "linux" {
		t.Skip("stops a replica with SIGSTOP: needs Linux")
	}
	promBin, err := exec.LookPath("prometheus")
	if err != nil {
		t.Skip("prometheus is not on PATH: install the Debian package `prometheus` (apt-get install -y prometheus) to run this test")
	}
	began := time.Now()
	ctx, cancel := context.WithTimeout(t.Context(), 4*time.Minute)
	defer cancel()

	// The cluster. Temp dirs are created first so that their removal runs
	// after the processes are killed (Cleanup is last-in, first-out).
	dir := t.TempDir()
	bin := walshipBin(t)
	t.Logf("walship binary ready after %v", time.Since(began).Round(time.Millisecond))
	// mTLS everywhere, as in production: the TLS metrics are exported.
	tlsFor := tlsFlags(t, filepath.Join(dir, "tls"))
	ls := startWalship(t, bin, "logstore", "log store serving", append([]string{"logstore",
		"--data-dir", filepath.Join(dir, "logstore"), "--listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0",
		// An archive in a directory, so that the archive's metrics and
		// panels are there too.
		"--archive", "file://" + filepath.Join(dir, "archive"), "--archive-interval", "200ms"}, tlsFor(tlsid.ClassLogStore, "ls")...)...)
	// --replica-timeout: the stalled replica must stay connected long
	// enough for WalshipReplicaLagHigh (10s) and then be cut off
	// (checkStalledLag, checkCutOff). --auto-failover: the primary holds
	// the log stores' election, so that its gauges are exported too.
	primary := startWalship(t, bin, "primary", "primary serving", append([]string{"primary",
		"--data-dir", filepath.Join(dir, "primary"), "--listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0",
		"--logstore", ls.addr, "--heartbeat-interval", "200ms", "--replica-timeout", replicaTimeout.String(), "--auto-failover"}, tlsFor(tlsid.ClassNode, "primary")...)...)
	var replicas []*proc
	for i := range 2 {
		id := fmt.Sprintf("replica-%d", i)
		replicas = append(replicas, startWalship(t, bin, id, "replica serving", append([]string{"replica",
			"--id", id, "--data-dir", filepath.Join(dir, id), "--listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0",
			"--primary", primary.addr, "--logstore", ls.addr, "--heartbeat-interval", "200ms",
			// The replicas read the archive (the archive rung), so that
			// its metrics are exported too.
			"--archive", "file://" + filepath.Join(dir, "archive")}, tlsFor(tlsid.ClassNode, id)...)...))
	}
	all := append([]*proc{ls, primary}, replicas...)

	// Prometheus, scraping every second.
	cfg := filepath.Join(dir, "prometheus.yml")
	if err := os.WriteFile(cfg, []byte(scrapeConfig(filepath.Join(repoRoot(t), filepath.FromSlash(rulesPath)),
		map[string][]*proc{"walship-node": append([]*proc{primary}, replicas...), "walship-logstore": {ls}})), 0o644); err != nil {
		t.Fatal(err)
	}
	_, prom := startPrometheus(t, promBin, cfg, filepath.Join(dir, "prometheus-data"))
	t.Logf("prometheus ready after %v", time.Since(began).Round(time.Millisecond))
	failWithLogs := func(t *testing.T) {
		t.Helper()
		if t.Failed() {
			for _, p := range all {
				t.Logf("--- %s log (last 4 KiB):\n%s", p.name, tail(p.logs(), 4096))
			}
		}
	}
	t.Cleanup(func() { failWithLogs(t) })

	// Everything scraped, both replicas and the log store streaming.
	waitFor(t, prom, 60*time.Second, "all targets up, replicas and log store connected", map[string]int{
		`up{namespace="test"} == 1`:                                   4,
		`walship_replication_replica_connected == 1`:                  2,
		`walship_replica_connected == 1`:                              2,
		`walship_replication_logstore_connected == 1`:                 1,
		`walship_replica_catchup_rung{rung="primary"} == 1`:           2,
		`walship_logstore_append_streams{job="walship-logstore"} > 0`: 1,
	})

	// Load: ~10 s of commits with a mix of policies.
	clientTLS, err := tlsid.Load(tlsFiles(filepath.Join(dir, "tls"), "load"), nil)
	if err != nil {
		t.Fatal(err)
	}
	conn, err := grpc.NewClient(primary.addr, grpc.WithTransportCredentials(clientTLS.Credentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	// One call the policy refuses (a client may not SetPolicy), so that
	// the primary exports its refusals.
	if _, err := walshipv1.NewAdminServiceClient(conn).SetPolicy(ctx, &walshipv1.SetPolicyRequest{}); status.Code(err) != codes.PermissionDenied {
		t.Fatalf("a client's SetPolicy: %v; want PERMISSION_DENIED", err)
	}
	// A client whose certificate the processes' --tls-crl revokes does
	// not get past the handshake.
	revokedTLS, err := tlsid.Load(tlsFiles(filepath.Join(dir, "tls"), "revoked"), nil)
	if err != nil {
		t.Fatal(err)
	}
	revokedConn, err := grpc.NewClient(primary.addr, grpc.WithTransportCredentials(revokedTLS.Credentials()))
	if err != nil {
		t.Fatal(err)
	}
	rctx, rcancel := context.WithTimeout(ctx, 10*time.Second)
	_, err = walshipv1.NewAdminServiceClient(revokedConn).Status(rctx, &walshipv1.StatusRequest{})
	rcancel()
	revokedConn.Close()
	if status.Code(err) != codes.Unavailable {
		t.Fatalf("a revoked client's Status: %v; want UNAVAILABLE (no handshake)", err)
	}
	kv := walshipv1.NewKVServiceClient(conn)
	// Stopped by cancelling, not by a deadline: a call that fails because
	// the load ended then always sees its context done, so only real
	// failures count.
	loadCtx, stopLoad := context.WithCancel(ctx)
	load := startLoad(loadCtx, kv, loadMix, 0)
	select {
	case <-time.After(10 * time.Second):
	case <-ctx.Done():
	}
	loadEnd := time.Now()
	stopLoad()
	load.wait()
	t.Logf("load: %s (until %v)", load, time.Since(began).Round(time.Millisecond))
	if err := load.err(); err != nil {
		t.Errorf("load: %v", err)
	}
	if load.ok.Load() < 100 {
		t.Errorf("load: only %d commits in 10s", load.ok.Load())
	}

	// The expositions after load, every labelled child created.
	expositions := map[string]string{} // process name -> /metrics body
	for _, p := range all {
		expositions[p.name] = scrape(t, p)
	}

	t.Run("promtool check metrics", func(t *testing.T) {
		checkMetricsLint(t, all, expositions)
	})
	t.Run("exported metrics are knownMetrics", func(t *testing.T) {
		checkExportedMetrics(t, exportedFamilies(t, expositions))
	})
	t.Run("METRICS.md lists the exported metrics", func(t *testing.T) {
		checkMetricsDoc(t, exportedFamilies(t, expositions))
	})
	t.Run("dashboard panels have data", func(t *testing.T) {
		checkDashboardData(t, ctx, prom, loadEnd)
	})
	t.Run("dashboard variables have values", func(t *testing.T) {
		checkDashboardVariables(t, ctx, prom, primary, ls, replicas)
	})
	t.Run("lag stays 0 while the primary is idle", func(t *testing.T) {
		checkIdleLag(t, ctx, prom)
	})

	// A stalled replica, under a steady trickle of writes that lasts
	// until it has recovered.
	writerCtx, stopWriter := context.WithCancel(ctx)
	writer := startLoad(writerCtx, kv, trickle, 20*time.Millisecond)
	defer func() {
		stopWriter()
		writer.wait()
		t.Logf("steady writer: %s", writer)
		if err := writer.err(); err != nil {
			t.Errorf("steady writer: %v", err)
		}
	}()
	// The stalled replica is SIGSTOPped: its TCP connection stays open, it
	// just says nothing. Whatever fails, it is resumed (SIGCONT) before the
	// recovery check, or by the deferred call if the test stops early (its
	// Cleanup SIGKILLs it in any case, which works on a stopped process,
	// unlike SIGTERM).
	stalled := replicas[1]
	stalled.signal(t, syscall.SIGSTOP)
	stoppedAt := time.Now()
	t.Logf("SIGSTOP %s (pid %d) at %v", stalled.name, stalled.cmd.Process.Pid, stoppedAt.Sub(began).Round(time.Millisecond))
	var resumedAt time.Time
	resume := func() {
		if resumedAt.IsZero() {
			if err := stalled.cmd.Process.Signal(syscall.SIGCONT); err != nil {
				t.Errorf("%s: SIGCONT: %v", stalled.name, err)
			}
			resumedAt = time.Now()
			t.Logf("SIGCONT %s after %v stopped", stalled.name, resumedAt.Sub(stoppedAt).Round(time.Millisecond))
		}
	}
	defer resume()
	t.Run("lag grows for a stalled replica and WalshipReplicaLagHigh's expression fires", func(t *testing.T) {
		checkStalledLag(t, ctx, prom, stalled, stoppedAt)
	})
	t.Run("a silent replica is cut off and WalshipReplicaDisconnected's expression fires", func(t *testing.T) {
		checkCutOff(t, ctx, prom, stalled, stoppedAt)
	})
	resume()
	t.Run("lag returns to 0 after the replica resumes", func(t *testing.T) {
		checkRecoveredLag(t, ctx, prom, stalled, resumedAt)
	})
	t.Run("rules evaluate and recording rules have data", func(t *testing.T) {
		checkRules(t, ctx, prom)
	})
	// Last, the log store stopped: the primary loses its lease and takes
	// no writes. The writer would see them refused: it stops first.
	stopWriter()
	writer.wait()
	t.Run("a primary without a log store majority takes no writes and WalshipPrimaryNotTakingWrites's expression fires", func(t *testing.T) {
		ls.signal(t, syscall.SIGSTOP)
		defer func() {
			if err := ls.cmd.Process.Signal(syscall.SIGCONT); err != nil {
				t.Errorf("%s: SIGCONT: %v", ls.name, err)
			}
		}()
		checkNotTakingWrites(t, ctx, prom, kv, primary)
	})
	t.Logf("total %v", time.Since(began).Round(time.Millisecond))
}

// checkNotTakingWrites: with its only log store stopped, the primary's
// writes are refused (counted under no_lease), walship_primary_taking_writes
// drops to 0, the real WalshipPrimaryNotTakingWrites expression (without
// its for:) returns the primary and only it, and the recording rule the
// alert's grpc_address annotation reads names the primary's gRPC address.
func checkNotTakingWrites(t *testing.T, ctx context.Context, prom *promClient, kv walshipv1.KVServiceClient, primary *proc) {
	expr := alertExpr(t, "WalshipPrimaryNotTakingWrites")
	stopped := time.Now()
	poll(t, 30*time.Second, "a Put refused UNAVAILABLE", func() (bool, string) {
		pctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		defer cancel()
		_, err := kv.Put(pctx, &walshipv1.PutRequest{Key: "no-lease", Value: []byte("x")})
		return status.Code(err) == codes.Unavailable && strings.Contains(err.Error(), "log store majority"), fmt.Sprint(err)
	})
	t.Logf("writes refused %v after the log store stopped", time.Since(stopped).Round(time.Millisecond))
	var fired []sample
	poll(t, 30*time.Second, "WalshipPrimaryNotTakingWrites's expression returns the primary", func() (bool, string) {
		res, err := prom.query(ctx, expr, time.Time{})
		fired = res
		return err == nil && len(res) > 0, fmt.Sprint(res, err)
	})
	if len(fired) != 1 || fired[0].Metric["instance"] != primary.metrics {
		t.Errorf("WalshipPrimaryNotTakingWrites's expression: %v, want exactly the primary %s", fired, primary.metrics)
	}
	poll(t, 30*time.Second, "refused writes counted under no_lease", func() (bool, string) {
		res, err := prom.query(ctx, `walship_primary_refused_writes_total{reason="no_lease"} > 0`, time.Time{})
		return err == nil && len(res) == 1, fmt.Sprint(res, err)
	})
	res, err := prom.query(ctx, fmt.Sprintf(`walship:server_info:last1h{instance=%q}`, primary.metrics), time.Time{})
	if err != nil || len(res) != 1 || res[0].Metric["grpc_address"] != primary.addr || res[0].Metric["id"] == "" {
		t.Errorf("walship:server_info:last1h of the primary: %v, %v; want its gRPC address %s and its id", res, err, primary.addr)
	}
}

// scrapeConfig is a Prometheus configuration scraping the jobs every second
// with the label namespace="test" (the dashboard filters on it) and loading
// the rule file.
func scrapeConfig(rules string, jobs map[string][]*proc) string {
	var b strings.Builder
	q := strconv.Quote
	b.WriteString("global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n  evaluation_interval: 1s\n")
	b.WriteString("rule_files:\n  - " + q(rules) + "\n")
	b.WriteString("scrape_configs:\n")
	for _, job := range slices.Sorted(maps.Keys(jobs)) {
		var targets []string
		for _, p := range jobs[job] {
			targets = append(targets, q(p.metrics))
		}
		b.WriteString("  - job_name: " + q(job) + "\n    static_configs:\n")
		b.WriteString("      - targets: [" + strings.Join(targets, ", ") + "]\n        labels:\n          namespace: test\n")
	}
	return b.String()
}

// waitFor polls until every query returns exactly the given number of series.
func waitFor(t *testing.T, prom *promClient, d time.Duration, what string, want map[string]int) {
	t.Helper()
	poll(t, d, what, func() (bool, string) {
		for _, q := range slices.Sorted(maps.Keys(want)) {
			got, err := prom.query(context.Background(), q, time.Time{})
			if err != nil {
				return false, err.Error()
			}
			if len(got) != want[q] {
				return false, fmt.Sprintf("%s: %d series, want %d: %v", q, len(got), want[q], got)
			}
		}
		return true, ""
	})
}

func tail(s string, n int) string {
	if len(s) > n {
		return "..." + s[len(s)-n:]
	}
	return s
}

// A load worker's policy: what it sends and how.
type loadKind struct {
	name   string
	txn    bool
	policy *walshipv1.CommitPolicy
}

// loadMix is the main load, one worker per entry: local durability sync and
// async, replication async, and sync replication to any 1 replica at flush.
var loadMix = []loadKind{
	{"put durability=sync replication=async", false, &walshipv1.CommitPolicy{
		Durability: walshipv1.Durability_DURABILITY_SYNC, Replication: walshipv1.ReplicationMode_REPLICATION_MODE_ASYNC}},
	{"put durability=async replication=async", false, &walshipv1.CommitPolicy{
		Durability: walshipv1.Durability_DURABILITY_ASYNC, Replication: walshipv1.ReplicationMode_REPLICATION_MODE_ASYNC}},
	{"txn durability=sync replication=sync k=1 flush", true, &walshipv1.CommitPolicy{
		Durability: walshipv1.Durability_DURABILITY_SYNC, Replication: walshipv1.ReplicationMode_REPLICATION_MODE_SYNC,
		SyncReplicas: 1, SyncLevel: walshipv1.SyncLevel_SYNC_LEVEL_FLUSH, SyncTimeout: durationpb.New(10 * time.Second)}},
	{"txn durability=async replication=async", true, &walshipv1.CommitPolicy{
		Durability: walshipv1.Durability_DURABILITY_ASYNC, Replication: walshipv1.ReplicationMode_REPLICATION_MODE_ASYNC}},
}

// trickle is the steady writer while a replica is stalled: async commits
// only, which do not wait for replicas.
var trickle = loadMix[1:2]

type loadRun struct {
	wg       sync.WaitGroup
	ok, fail atomic.Int64
	mu       sync.Mutex
	first    error
}

// startLoad runs one worker per kind until ctx ends, each pausing pace
// between commits.
func startLoad(ctx context.Context, kv walshipv1.KVServiceClient, kinds []loadKind, pace time.Duration) *loadRun {
	l := &loadRun{}
	for w, k := range kinds {
		l.wg.Go(func() {
			rnd := rand.New(rand.NewPCG(uint64(w), uint64(time.Now().UnixNano())))
			for i := 0; ctx.Err() == nil; i++ {
				key := fmt.Sprintf("load/%d/%d", w, i%500)
				val := make([]byte, 16+rnd.IntN(500))
				for j := range val {
					val[j] = 'a' + byte(rnd.IntN(26))
				}
				cctx, cancel := context.WithTimeout(ctx, 20*time.Second)
				var err error
				if k.txn {
					_, err = kv.Txn(cctx, &walshipv1.TxnRequest{Policy: k.policy, Success: []*walshipv1.TxnOp{
						{Op: &walshipv1.TxnOp_Put{Put: &walshipv1.PutOp{Key: key, Value: val}}},
						{Op: &walshipv1.TxnOp_Put{Put: &walshipv1.PutOp{Key: key + "/b", Value: val[:8]}}},
						{Op: &walshipv1.TxnOp_Get{Get: &walshipv1.GetOp{Key: key}}},
					}}, grpc.WaitForReady(true))
				} else {
					_, err = kv.Put(cctx, &walshipv1.PutRequest{Key: key, Value: val, Policy: k.policy}, grpc.WaitForReady(true))
				}
				cancel()
				switch {
				case err == nil:
					l.ok.Add(1)
				case ctx.Err() != nil:
					return // stopped mid-call
				default:
					l.fail.Add(1)
					l.mu.Lock()
					if l.first == nil {
						l.first = fmt.Errorf("%s: %v", k.name, err)
					}
					l.mu.Unlock()
				}
				if pace > 0 {
					select {
					case <-ctx.Done():
					case <-time.After(pace):
					}
				}
			}
		})
	}
	return l
}

func (l *loadRun) wait() { l.wg.Wait() }

func (l *loadRun) String() string {
	return fmt.Sprintf("%d commits ok, %d failed", l.ok.Load(), l.fail.Load())
}

// err reports failed commits, with the first failure.
func (l *loadRun) err() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if n := l.fail.Load(); n > 0 {
		return fmt.Errorf("%d commit(s) failed; first: %v", n, l.first)
	}
	return nil
}

// scrape fetches a process's /metrics.
func scrape(t *testing.T, p *proc) string {
	t.Helper()
	resp, err := http.Get("http://" + p.metrics + "/metrics")
	if err != nil {
		t.Fatalf("%s: GET /metrics: %v", p.name, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("%s: GET /metrics: HTTP %d, %v", p.name, resp.StatusCode, err)
	}
	return string(b)
}

// promtoolLintAllowed lists exact `promtool check metrics` messages that are
// promtool false positives and therefore accepted. Each needs a reason.
// Empty: promtool reports nothing on walship's services today.
var promtoolLintAllowed = map[string]string{}

func checkMetricsLint(t *testing.T, procs []*proc, expositions map[string]string) {
	tool := promtool(t)
	for msg, why := range promtoolLintAllowed {
		if strings.TrimSpace(why) == "" {
			t.Errorf("promtoolLintAllowed[%q] has no reason", msg)
		}
	}
	for _, p := range procs {
		cmd := exec.Command(tool, "check", "metrics")
		cmd.Stdin = strings.NewReader(expositions[p.name])
		out, err := cmd.CombinedOutput()
		var problems []string
		for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
			if line = strings.TrimSpace(line); line != "" && promtoolLintAllowed[line] == "" {
				problems = append(problems, line)
			}
		}
		if len(problems) > 0 || (err != nil && len(strings.TrimSpace(string(out))) == 0) {
			t.Errorf("promtool check metrics on %s's /metrics (%s): %v\n%s", p.name, p.metrics, err, strings.Join(problems, "\n"))
		}
	}
}

// exportedFamilies merges the walship_* families of the expositions.
func exportedFamilies(t *testing.T, expositions map[string]string) map[string]*family {
	t.Helper()
	out := map[string]*family{}
	for _, name := range slices.Sorted(maps.Keys(expositions)) {
		fams, err := parseExposition(expositions[name])
		if err != nil {
			t.Fatalf("%s's /metrics: %v", name, err)
		}
		for n, f := range fams {
			if !strings.HasPrefix(n, "walship_") {
				continue
			}
			if prev, ok := out[n]; ok {
				if prev.Type != f.Type {
					t.Errorf("%s is a %s on one service and a %s on %s", n, prev.Type, f.Type, name)
				}
				maps.Copy(prev.Labels, f.Labels)
				continue
			}
			out[n] = f
		}
	}
	return out
}

func checkExportedMetrics(t *testing.T, exported map[string]*family) {
	for _, n := range slices.Sorted(maps.Keys(exported)) {
		f := exported[n]
		labels := slices.Sorted(maps.Keys(f.Labels))
		m, ok := lookupMetric(n)
		if !ok {
			t.Errorf("%s (%s, labels %v) is exported but not in knownMetrics (metrics_test.go)", n, f.Type, labels)
			continue
		}
		if m.Type != f.Type {
			t.Errorf("%s: exported as a %s, knownMetrics says %s", n, f.Type, m.Type)
		}
		if want := slices.Sorted(slices.Values(m.Labels)); !slices.Equal(labels, want) {
			t.Errorf("%s: exported with labels %v, knownMetrics says %v", n, labels, want)
		}
	}
	for _, m := range knownMetrics {
		if exported[m.Name] == nil {
			t.Errorf("knownMetrics lists %s, but no service exports it", m.Name)
		}
	}
}

const metricsDocPath = "docs/METRICS.md"

var (
	docRowRe           = regexp.MustCompile("(?m)^\\|\\s*`(walship_[a-z0-9_]+)`\\s*\\|([^|]*)\\|([^|]*)\\|")
	metricNameLabelsRe = regexp.MustCompile("`[a-zA-Z_][a-zA-Z0-9_]*`")
)

func checkMetricsDoc(t *testing.T, exported map[string]*family) {
	b, err := os.ReadFile(filepath.Join(repoRoot(t), filepath.FromSlash(metricsDocPath)))
	if err != nil {
		t.Fatal(err)
	}
	doc := string(b)
	// The tables: | `name` | type | labels | meaning |
	rows := docRowRe.FindAllStringSubmatch(doc, -1)
	if len(rows) == 0 {
		t.Errorf("%s: no metric table rows (| `walship_...` | type | labels | meaning |)", metricsDocPath)
	}
	for _, m := range rows {
		name, typ := m[1], strings.TrimSpace(m[2])
		labels := slices.Sorted(slices.Values(metricNameLabelsRe.FindAllString(m[3], -1)))
		for i := range labels {
			labels[i] = strings.Trim(labels[i], "`")
		}
		f := exported[name]
		if f == nil {
			continue // reported below
		}
		if typ != f.Type {
			t.Errorf("%s: %s says %s, exported as a %s", name, metricsDocPath, typ, f.Type)
		}
		if got := slices.Sorted(maps.Keys(f.Labels)); !slices.Equal(labels, got) {
			t.Errorf("%s: %s lists labels %v, exported with %v", name, metricsDocPath, labels, got)
		}
	}
	documented := metricNamesIn(doc)
	for _, n := range slices.Sorted(maps.Keys(exported)) {
		if !documented[n] {
			t.Errorf("%s is exported but %s does not mention it", n, metricsDocPath)
		}
	}
	for _, n := range slices.Sorted(maps.Keys(documented)) {
		if exported[n] == nil {
			t.Errorf("%s mentions %s, which no service exports", metricsDocPath, n)
		}
	}
}

// liveVars stand in for Grafana's template variables: "All" for the query
// variables (their allValue is .*), and intervals suited to a 1s scrape.
var liveVars = strings.NewReplacer(
	"$__rate_interval", "15s",
	"$__interval", "1s",
	"$__range", "1m",
	"${datasource}", "",
	"$job", ".*",
	"$namespace", ".*",
	"$replica", ".*",
	"$instance", ".*",
)

// emptyPanelsAllowed lists the titles of panels whose queries may return
// nothing on a healthy cluster under load, each with the reason. Keep it
// small: a panel that is empty in this test is probably empty in production.
// Empty today: the panels about failures (Failed commits/s, Fsync errors)
// end in `or vector(0)` or use counters the services create at 0, so they
// return 0, which checkDashboardData requires for them.
var emptyPanelsAllowed = map[string]string{
	"Promotion phase durations": "no promotion happens in this test (services/node's TestPromoteAndRejoin checks every phase is observed)",
}

// zeroPanels are panels about failures that must read 0 on a healthy cluster.
var zeroPanels = []string{"Failed commits/s", "Fsync errors (range)", "fsync errors", "Writes refused/s"}

func checkDashboardData(t *testing.T, ctx context.Context, prom *promClient, at time.Time) {
	d := loadDashboard(t)
	if len(emptyPanelsAllowed) > 3 {
		t.Errorf("emptyPanelsAllowed has %d entries; keep it to a few, each a panel about a failure", len(emptyPanelsAllowed))
	}
	titles := map[string]bool{}
	for _, p := range allPanels(d.Panels) {
		titles[p.Title] = true
	}
	for title, why := range emptyPanelsAllowed {
		if !titles[title] {
			t.Errorf("emptyPanelsAllowed: no panel titled %q", title)
		}
		if strings.TrimSpace(why) == "" {
			t.Errorf("emptyPanelsAllowed[%q]: no reason given", title)
		}
	}
	for _, title := range zeroPanels {
		if !titles[title] {
			t.Errorf("zeroPanels: no panel titled %q", title)
		}
	}
	n := 0
	for _, p := range allPanels(d.Panels) {
		for _, tg := range p.Targets {
			n++
			where := fmt.Sprintf("panel %d %q target %s", p.ID, p.Title, tg.RefID)
			expr := liveVars.Replace(tg.Expr)
			if strings.Contains(expr, "$") {
				t.Errorf("%s: unknown template variable in %q", where, tg.Expr)
				continue
			}
			res, err := prom.query(ctx, expr, at)
			if err != nil {
				t.Errorf("%s: %v", where, err)
				continue
			}
			finite := slices.ContainsFunc(res, func(s sample) bool { return !math.IsNaN(s.Value) && !math.IsInf(s.Value, 0) })
			switch {
			case emptyPanelsAllowed[p.Title] != "":
				t.Logf("%s (allowed to be empty: %s): %d series", where, emptyPanelsAllowed[p.Title], len(res))
			case len(res) == 0:
				t.Errorf("%s: no data after 10s of load\n  query: %s", where, expr)
			case !finite:
				t.Errorf("%s: no finite value after 10s of load (%v)\n  query: %s", where, res, expr)
			}
			if slices.Contains(zeroPanels, p.Title) {
				for _, s := range res {
					if s.Value != 0 {
						t.Errorf("%s: %v on a healthy cluster, want 0\n  query: %s", where, s, expr)
					}
				}
			}
		}
	}
	t.Logf("%d panel queries evaluated at the end of the load", n)
}

var labelValuesRe = regexp.MustCompile(`^label_values\((.+),\s*([a-zA-Z_][a-zA-Z0-9_]*)\)$`)

func checkDashboardVariables(t *testing.T, ctx context.Context, prom *promClient, primary, ls *proc, replicas []*proc) {
	want := map[string][]string{
		"namespace": {"test"},
		"job":       {"walship-logstore", "walship-node"},
	}
	for _, p := range append([]*proc{primary}, append(replicas, ls)...) {
		want["instance"] = append(want["instance"], p.metrics)
	}
	slices.Sort(want["instance"])
	for _, r := range replicas {
		want["replica"] = append(want["replica"], r.name)
	}
	for _, v := range loadDashboard(t).Templating.List {
		if v.Type != "query" {
			continue
		}
		m := labelValuesRe.FindStringSubmatch(v.queryString())
		if m == nil {
			t.Errorf("variable %s: query %q is not label_values(selector, label)", v.Name, v.queryString())
			continue
		}
		data, err := prom.get(ctx, "/api/v1/label/"+m[2]+"/values", url.Values{
			"match[]": {liveVars.Replace(m[1])},
			"start":   {promTime(time.Now().Add(-5 * time.Minute))},
			"end":     {promTime(time.Now())},
		})
		if err != nil {
			t.Errorf("variable %s: %v", v.Name, err)
			continue
		}
		var values []string
		if err := json.Unmarshal(data, &values); err != nil {
			t.Errorf("variable %s: %v", v.Name, err)
			continue
		}
		slices.Sort(values)
		if !slices.Equal(values, want[v.Name]) {
			t.Errorf("variable %s (%s): values %v, want %v", v.Name, v.queryString(), values, want[v.Name])
		}
	}
}

// checkIdleLag waits 10s after the load and checks the last 8s of it: lag
// in seconds, bytes and records stays at 0 on both sides while the primary
// is idle.
func checkIdleLag(t *testing.T, ctx context.Context, prom *promClient) {
	idleFrom := time.Now()
	at := idleFrom.Add(10 * time.Second)
	// Wait until Prometheus holds samples of both lag views scraped after at.
	poll(t, 30*time.Second, "10s of idle samples", func() (bool, string) {
		for _, q := range []string{`min(timestamp(walship_replication_lag_seconds))`, `min(timestamp(walship_replica_lag_seconds))`} {
			res, err := prom.query(ctx, q, time.Time{})
			if err != nil {
				return false, err.Error()
			}
			if len(res) != 1 || res[0].Value < float64(at.UnixMilli())/1000 {
				return false, fmt.Sprintf("%s = %v, want >= %s", q, res, promTime(at))
			}
		}
		return true, ""
	})
	// Bound on lag in seconds: a lag that grew while idle would reach 8s
	// here. Not lower: a replica counts itself cut off (and reports the
	// silence as lag) after 3 heartbeat intervals, 0.6s, without a word
	// from the primary; on a busy 2-core CI machine a process can be
	// descheduled about that long.
	const bound = 1.0
	for _, c := range []struct {
		expr     string
		series   int
		min, max float64
	}{
		{`max_over_time(walship_replication_lag_seconds[8s])`, 6, 0, bound}, // 2 replicas x 3 stages
		{`max_over_time(walship_replica_lag_seconds[8s])`, 2, 0, bound},
		{`max_over_time(walship_replication_lag_bytes[8s])`, 6, 0, 0},
		{`max_over_time(walship_replication_lag_records[8s])`, 6, 0, 0},
		{`max_over_time(walship_replication_logstore_lag_records[8s])`, 1, 0, 0},
		{`min_over_time(walship_replication_replica_connected[8s])`, 2, 1, 1},
		{`min_over_time(walship_replica_connected[8s])`, 2, 1, 1},
	} {
		res, err := prom.query(ctx, c.expr, at)
		if err != nil {
			t.Error(err)
			continue
		}
		if len(res) != c.series {
			t.Errorf("idle: %s: %d series, want %d: %v", c.expr, len(res), c.series, res)
		}
		for _, s := range res {
			if !(s.Value >= c.min && s.Value <= c.max) {
				t.Errorf("idle: %s: %v, want within [%g, %g] while the primary is idle", c.expr, s, c.min, c.max)
			}
		}
		t.Logf("idle: %s: %v", c.expr, res)
	}
	// The window must really hold samples (1s scrapes: about 8).
	res, err := prom.query(ctx, `count_over_time(walship_replication_lag_seconds{stage="apply"}[8s]) < 4 or count_over_time(walship_replica_lag_seconds[8s]) < 4`, at)
	if err != nil || len(res) > 0 {
		t.Errorf("idle: too few samples in the 8s window: %v %v", res, err)
	}
}

// alertExpr returns the expression of the named alert from the rule file.
func alertExpr(t *testing.T, name string) string {
	t.Helper()
	for _, r := range loadRules(t) {
		if r.Kind == "alert" && r.Name == name {
			return r.Expr
		}
	}
	t.Fatalf("%s: no alert %s", rulesPath, name)
	return ""
}

// replicaTimeout is the primary's --replica-timeout: above the 10s of
// WalshipReplicaLagHigh's threshold plus a few scrapes, so that the
// stalled replica is still connected when its lag passes 10s.
const replicaTimeout = 16 * time.Second

// checkStalledLag waits, under the steady writer, for the lag of the
// stopped replica as seen by the primary to pass 1s, then for the real
// WalshipReplicaLagHigh expression (threshold 10s, without its for:) to
// return it, and only it, while the primary still counts it connected.
func checkStalledLag(t *testing.T, ctx context.Context, prom *promClient, r *proc, stoppedAt time.Time) {
	expr := alertExpr(t, "WalshipReplicaLagHigh")
	if !strings.Contains(expr, "> 10") {
		t.Errorf("WalshipReplicaLagHigh: expression no longer has the 10s threshold this test waits for:\n%s", expr)
	}
	lagQ := fmt.Sprintf(`walship_replication_lag_seconds{replica=%q,stage="apply"}`, r.name)
	poll(t, 30*time.Second, lagQ+" > 1", func() (bool, string) {
		res, err := prom.query(ctx, lagQ+" > 1", time.Time{})
		if err != nil {
			return false, err.Error()
		}
		return len(res) == 1, fmt.Sprint(res)
	})
	t.Logf("%s > 1 after %v", lagQ, time.Since(stoppedAt).Round(time.Millisecond))

	var fired []sample
	poll(t, 40*time.Second, "WalshipReplicaLagHigh's expression returns "+r.name, func() (bool, string) {
		res, err := prom.query(ctx, expr, time.Time{})
		if err != nil {
			return false, err.Error()
		}
		fired = res
		cur, _ := prom.query(ctx, lagQ, time.Time{})
		return len(res) > 0, fmt.Sprintf("expression: %v; %s: %v", res, lagQ, cur)
	})
	t.Logf("WalshipReplicaLagHigh's expression true after %v: %v", time.Since(stoppedAt).Round(time.Millisecond), fired)
	if len(fired) != 1 || fired[0].Metric["replica"] != r.name || fired[0].Metric["seen_by"] != "primary" || fired[0].Value <= 10 {
		t.Errorf("WalshipReplicaLagHigh's expression: %v, want exactly one series, replica=%q seen_by=primary, value > 10", fired, r.name)
	}
	// The replica that kept running was not held back by its stalled peer.
	window := time.Since(stoppedAt).Round(time.Second) - time.Second
	res, err := prom.query(ctx, fmt.Sprintf(`max_over_time(walship_replication_lag_seconds{replica!=%q,stage="apply"}[%ds])`, r.name, int(window.Seconds())), time.Time{})
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range res {
		if s.Value > 2 {
			t.Errorf("while %s was stopped, %v: the running replica fell behind", r.name, s)
		}
	}
	t.Logf("running replica during the stall: %v", res)
}

// checkCutOff keeps the replica stopped until the primary cuts it off
// (--replica-timeout without a word from it, a steady trickle of writes
// going on): the primary must then report it disconnected, the real
// WalshipReplicaDisconnected expression (without its for:) must return it,
// and WalshipReplicaLagHigh's must no longer (a disconnected replica pages
// once, through WalshipReplicaDisconnected).
func checkCutOff(t *testing.T, ctx context.Context, prom *promClient, r *proc, stoppedAt time.Time) {
	disc := alertExpr(t, "WalshipReplicaDisconnected")
	lagHigh := alertExpr(t, "WalshipReplicaLagHigh")
	connQ := fmt.Sprintf(`walship_replication_replica_connected{replica=%q}`, r.name)
	wait := time.Until(stoppedAt.Add(replicaTimeout + 8*time.Second))
	var fired []sample
	poll(t, wait, fmt.Sprintf("primary cuts off %s, silent under writes for more than --replica-timeout %v", r.name, replicaTimeout), func() (bool, string) {
		res, err := prom.query(ctx, disc, time.Time{})
		if err != nil {
			return false, err.Error()
		}
		fired = res
		conn, _ := prom.query(ctx, connQ, time.Time{})
		// Sent bytes that stop growing mean the primary's Send to the
		// stopped replica is blocked on HTTP/2 flow control.
		sentQ := fmt.Sprintf(`walship_replication_sent_bytes_total{replica=%q} - walship_replication_sent_bytes_total{replica=%q} offset 5s`, r.name, r.name)
		sent, _ := prom.query(ctx, sentQ, time.Time{})
		return len(res) > 0, fmt.Sprintf("%v stopped; WalshipReplicaDisconnected's expression: %v; %s: %v; bytes sent to it in the last 5s: %v",
			time.Since(stoppedAt).Round(time.Millisecond), res, connQ, conn, sent)
	})
	t.Logf("WalshipReplicaDisconnected's expression true %v after SIGSTOP: %v", time.Since(stoppedAt).Round(time.Millisecond), fired)
	if len(fired) != 1 || fired[0].Metric["replica"] != r.name || fired[0].Metric["seen_by"] != "primary" {
		t.Errorf("WalshipReplicaDisconnected's expression: %v, want exactly one series, replica=%q seen_by=primary", fired, r.name)
	}
	res, err := prom.query(ctx, lagHigh, time.Time{})
	if err != nil {
		t.Fatal(err)
	}
	if len(res) > 0 {
		t.Errorf("WalshipReplicaLagHigh's expression still returns %v once %s is disconnected: it would page twice", res, r.name)
	}
}

// checkRecoveredLag waits, after the replica was resumed (SIGCONT) at
// resumedAt, for its lag (both views) to return below 1s, its stream to be
// up on both sides, and the alert expression to be empty again.
func checkRecoveredLag(t *testing.T, ctx context.Context, prom *promClient, r *proc, resumedAt time.Time) {
	if resumedAt.IsZero() {
		t.Fatalf("%s was not stopped and resumed", r.name)
	}
	expr := alertExpr(t, "WalshipReplicaLagHigh")
	instance := fmt.Sprintf(`instance=%q`, r.metrics)
	checks := map[string]string{
		fmt.Sprintf(`max(walship_replication_lag_seconds{replica=%q})`, r.name):    "< 1",
		fmt.Sprintf(`walship_replica_lag_seconds{%s}`, instance):                   "< 1",
		fmt.Sprintf(`walship_replication_replica_connected{replica=%q}`, r.name):   "== 1",
		fmt.Sprintf(`walship_replica_connected{%s}`, instance):                     "== 1",
		fmt.Sprintf(`walship_replica_catchup_rung{%s, rung="primary"}`, instance):  "== 1",
		fmt.Sprintf(`max(walship_replication_lag_records{replica=%q})`, r.name):    "< 1000",
		fmt.Sprintf(`count(%s) or vector(0)`, strings.ReplaceAll(expr, "\n", " ")): "== 0",
	}
	poll(t, 30*time.Second, r.name+" recovered", func() (bool, string) {
		for _, q := range slices.Sorted(maps.Keys(checks)) {
			res, err := prom.query(ctx, q, time.Time{})
			if err != nil {
				return false, err.Error()
			}
			ok := len(res) == 1
			if ok {
				v, cond := res[0].Value, checks[q]
				limit, _ := strconv.ParseFloat(strings.Fields(cond)[1], 64)
				switch strings.Fields(cond)[0] {
				case "<":
					ok = v < limit
				case "==":
					ok = v == limit
				}
			}
			if !ok {
				return false, fmt.Sprintf("%s: %v, want %s", q, res, checks[q])
			}
		}
		return true, ""
	})
	t.Logf("%s recovered %v after SIGCONT", r.name, time.Since(resumedAt).Round(time.Millisecond))
}

// checkRules waits until every rule has been evaluated, requires none to
// have failed, and requires the recording rules to have produced data.
func checkRules(t *testing.T, ctx context.Context, prom *promClient) {
	type ruleState struct {
		Name      string `json:"name"`
		Type      string `json:"type"`
		Health    string `json:"health"`
		LastError string `json:"lastError"`
	}
	var records []string
	poll(t, 45*time.Second, "every rule evaluated", func() (bool, string) {
		data, err := prom.get(ctx, "/api/v1/rules", nil)
		if err != nil {
			return false, err.Error()
		}
		var d struct {
			Groups []struct {
				Name  string      `json:"name"`
				Rules []ruleState `json:"rules"`
			} `json:"groups"`
		}
		if err := json.Unmarshal(data, &d); err != nil {
			return false, err.Error()
		}
		records = records[:0]
		n := 0
		for _, g := range d.Groups {
			for _, r := range g.Rules {
				n++
				if r.Health == "err" {
					t.Fatalf("rule %s (group %s) fails to evaluate: %s", r.Name, g.Name, r.LastError)
				}
				if r.Health != "ok" {
					return false, fmt.Sprintf("rule %s (group %s): health %q", r.Name, g.Name, r.Health)
				}
				if r.Type == "recording" {
					records = append(records, r.Name)
				}
			}
		}
		if want := len(loadRules(t)); n != want {
			return false, fmt.Sprintf("Prometheus has %d rules loaded, the rule file %d", n, want)
		}
		return true, ""
	})
	if len(records) == 0 {
		t.Fatal("no recording rules loaded")
	}
	// The recording group runs every 30s: wait for an evaluation that saw
	// the load (rates over 5m, so the load of the last minute is in them).
	for _, rec := range records {
		poll(t, 45*time.Second, "recording rule "+rec+" has data", func() (bool, string) {
			res, err := prom.query(ctx, rec, time.Time{})
			if err != nil {
				return false, err.Error()
			}
			return slices.ContainsFunc(res, func(s sample) bool { return s.Value > 0 }), fmt.Sprint(res)
		})
	}
	t.Logf("recording rules with data: %v", records)
}

// tlsFlags makes a CA, a client certificate ("load"), a revoked one
// ("revoked") and the CA's revocation list in dir, and returns a function
// giving the --tls-* flags of a process of class named name, with a
// certificate of its own (reached at 127.0.0.1) and the list.
func tlsFlags(t *testing.T, dir string) func(class, name string) []string {
	t.Helper()
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	ca, err := tlsid.NewCA("monitoring test CA", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	issue := func(class, name string) tlsid.Files {
		f, err := ca.WriteFiles(dir, name, tlsid.Leaf{URI: tlsid.URI("test", class, name), IPs: []net.IP{net.ParseIP("127.0.0.1")}})
		if err != nil {
			t.Fatal(err)
		}
		return f
	}
	issue(tlsid.ClassClient, "load")
	revoked, err := os.ReadFile(issue(tlsid.ClassClient, "revoked").Cert)
	if err != nil {
		t.Fatal(err)
	}
	blk, _ := pem.Decode(revoked)
	if blk == nil {
		t.Fatal("revoked.crt: no PEM")
	}
	rc, err := x509.ParseCertificate(blk.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	crl, err := ca.CRL(time.Now().Add(time.Hour), rc)
	if err != nil {
		t.Fatal(err)
	}
	crlPath := filepath.Join(dir, "crl.pem")
	if err := os.WriteFile(crlPath, crl, 0o600); err != nil {
		t.Fatal(err)
	}
	return func(class, name string) []string {
		f := issue(class, name)
		return []string{"--tls-cert", f.Cert, "--tls-key", f.Key, "--tls-ca", f.CA, "--tls-crl", crlPath, "--trust-domain", "test"}
	}
}

// tlsFiles names the files tlsFlags wrote for name.
func tlsFiles(dir, name string) tlsid.Files {
	return tlsid.Files{Cert: filepath.Join(dir, name+".crt"), Key: filepath.Join(dir, name+".key"), CA: filepath.Join(dir, "ca.crt")}
}
