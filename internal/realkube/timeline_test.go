package realkube

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// EnvRuns repeats the measured disruptions (kill -9 of the primary, the
// graceful delete of its pod, the rolling restart) this many times on the
// shared cluster, each under a checked workload of its own, and logs the
// medians: the numbers of docs/BENCHMARKS.md. Unset, each runs once.
const EnvRuns = "WALSHIP_REALKUBE_RUNS"

// runs is EnvRuns, at least 1.
func runs() int {
	n, _ := strconv.Atoi(os.Getenv(EnvRuns))
	return max(n, 1)
}

// summarize logs the median, minimum and maximum of ds, as measured over
// the runs of one scenario.
func summarize(t *testing.T, what string, ds []time.Duration) {
	t.Helper()
	if len(ds) == 0 {
		return
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	round := func(d time.Duration) time.Duration { return d.Round(time.Millisecond) }
	all := make([]string, len(ds))
	for i, d := range ds {
		all[i] = round(d).String()
	}
	t.Logf("%s over %d runs: median %v, min %v, max %v; runs: %s",
		what, len(s), round(s[len(s)/2]), round(s[0]), round(s[len(s)-1]), strings.Join(all, " "))
}

// timeline records, from one instant (a kill, a delete), what the pieces
// between a disruption and a client's next acknowledged write did: the
// data nodes' pods (role label, readiness, restarts), walship-rw's
// EndpointSlice, kube-proxy's rule syncs, and whatever the test notes. It
// is for measuring where the seconds go; nothing asserts on it.
type timeline struct {
	t0     time.Time
	cancel context.CancelFunc
	wg     sync.WaitGroup
	mu     sync.Mutex
	events []tlEvent
}

type tlEvent struct {
	at   time.Time
	what string
}

// startTimeline starts watching from t0 until stop.
func startTimeline(ctx context.Context, c *Cluster, t0 time.Time) *timeline {
	ctx, cancel := context.WithCancel(ctx)
	tl := &timeline{t0: t0, cancel: cancel}
	watch := func(prefix string, args ...string) {
		cmd := exec.CommandContext(ctx, c.bin("kubectl"), append([]string{"--kubeconfig", c.Kubeconfig, "-n", devNamespace}, args...)...)
		out, err := cmd.StdoutPipe()
		if err != nil {
			tl.add(time.Now(), "%s: %v", prefix, err)
			return
		}
		if err := cmd.Start(); err != nil {
			tl.add(time.Now(), "%s: %v", prefix, err)
			return
		}
		tl.wg.Go(func() {
			sc := bufio.NewScanner(out)
			last := ""
			for sc.Scan() {
				if line := strings.TrimSpace(sc.Text()); line != last {
					tl.add(time.Now(), "%s %s", prefix, line)
					last = line
				}
			}
			_ = cmd.Wait()
		})
	}
	watch("pod", "get", "pods", "-l", nodeSelector, "--watch", "-o",
		`jsonpath={.metadata.name} ip={.status.podIP} deleting={.metadata.deletionTimestamp} role={.metadata.labels.walship\.io/role} reads={.metadata.labels.walship\.io/reads} ready={.status.conditions[?(@.type=="Ready")].status} started={.status.containerStatuses[0].started} restarts={.status.containerStatuses[0].restartCount}{"\n"}`)
	// Both Services' slices: kube-proxy applies a change of either only a
	// minSyncPeriod after its last sync. As JSON: kubectl's jsonpath
	// printer shows a slice watch's first list and none of its updates.
	for _, svc := range []string{"walship-rw", "walship-ro"} {
		cmd := exec.CommandContext(ctx, c.bin("kubectl"), "--kubeconfig", c.Kubeconfig, "-n", devNamespace,
			"get", "endpointslices", "-l", "kubernetes.io/service-name="+svc, "--watch", "-o", "json")
		out, err := cmd.StdoutPipe()
		if err == nil {
			err = cmd.Start()
		}
		if err != nil {
			tl.add(time.Now(), "%s endpoints: %v", svc, err)
			continue
		}
		tl.wg.Go(func() {
			defer func() { _ = cmd.Wait() }()
			dec := json.NewDecoder(out)
			last := ""
			for {
				var es struct {
					Endpoints []struct {
						TargetRef  struct{ Name string } `json:"targetRef"`
						Conditions struct {
							Ready, Serving, Terminating *bool
						} `json:"conditions"`
					} `json:"endpoints"`
				}
				if dec.Decode(&es) != nil {
					return
				}
				var b strings.Builder
				for _, e := range es.Endpoints {
					fmt.Fprintf(&b, "%s(ready=%s serving=%s terminating=%s) ", e.TargetRef.Name, deref(e.Conditions.Ready), deref(e.Conditions.Serving), deref(e.Conditions.Terminating))
				}
				if line := b.String(); line != last {
					tl.add(time.Now(), "%s endpoints: %s", svc, line)
					last = line
				}
			}
		})
	}
	if c.ProxyMetrics != "" {
		// kube-proxy's last sync of its rules, as it stamps it.
		tl.wg.Go(func() {
			var last float64
			for ctx.Err() == nil {
				if v, err := proxyLastSync(ctx, c.ProxyMetrics); err == nil && v != last {
					if last != 0 {
						sec, frac := int64(v), v-float64(int64(v))
						tl.add(time.Unix(sec, int64(frac*1e9)), "kube-proxy synced its rules; walship-rw now: %s", rwRules())
					}
					last = v
				}
				select {
				case <-ctx.Done():
				case <-time.After(50 * time.Millisecond):
				}
			}
		})
	}
	return tl
}

// deref prints an EndpointSlice condition, "unset" if nil.
func deref(b *bool) string {
	if b == nil {
		return "unset"
	}
	return strconv.FormatBool(*b)
}

// rwRules returns where kube-proxy's iptables rules send walship-rw's
// connections: the endpoints of its service chain (nat), or that the
// filter table rejects them (no endpoints).
func rwRules() string {
	out, err := exec.Command("iptables-save", "-t", "nat").Output()
	if err != nil {
		return err.Error()
	}
	svc := "/walship-rw:grpc"
	var eps []string
	for _, line := range strings.Split(string(out), "\n") {
		if strings.HasPrefix(line, "-A KUBE-SVC-") && strings.Contains(line, svc+" -> ") {
			f := line[strings.Index(line, svc+" -> ")+len(svc+" -> "):]
			eps = append(eps, strings.Trim(strings.Fields(f)[0], `"`))
		}
	}
	out, err = exec.Command("iptables-save", "-t", "filter").Output()
	if err == nil && strings.Contains(string(out), svc+` has no endpoints`) {
		eps = append(eps, "REJECT (no endpoints)")
	}
	if len(eps) == 0 {
		return "no rules"
	}
	return strings.Join(eps, " ")
}

// merge adds a client's dial trace, from a second before t0.
func (tl *timeline) merge(tr *dialTrace) {
	if tl == nil || tr == nil {
		return
	}
	evs := tr.since(tl.t0.Add(-time.Second))
	tl.mu.Lock()
	defer tl.mu.Unlock()
	tl.events = append(tl.events, evs...)
}

// proxyLastSync reads kube-proxy's kubeproxy_sync_proxy_rules_last_timestamp_seconds.
func proxyLastSync(ctx context.Context, addr string) (float64, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+"/metrics", nil)
	if err != nil {
		return 0, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		// kube-proxy v1.34 labels it by IP family; the cluster is IPv4.
		line := sc.Text()
		if strings.HasPrefix(line, "kubeproxy_sync_proxy_rules_last_timestamp_seconds") && !strings.Contains(line, "IPv6") {
			return strconv.ParseFloat(line[strings.LastIndexByte(line, ' ')+1:], 64)
		}
	}
	return 0, fmt.Errorf("no kubeproxy_sync_proxy_rules_last_timestamp_seconds")
}

func (tl *timeline) add(at time.Time, format string, args ...any) {
	tl.mu.Lock()
	defer tl.mu.Unlock()
	tl.events = append(tl.events, tlEvent{at, fmt.Sprintf(format, args...)})
}

// nodeLogs adds the data nodes' log lines since t0 that mention the
// election, the epoch or the role (their own timestamps).
func (tl *timeline) nodeLogs(ctx context.Context, c *Cluster) {
	pods, err := podsWith(ctx, c, nodeSelector)
	if err != nil {
		tl.add(time.Now(), "pods: %v", err)
		return
	}
	keys := []string{"elect", "epoch", "promot", "primary", "lease", "Lease", "serving", "starting", "recover", "switch"}
	for _, p := range pods {
		out, err := c.KubectlOutput(ctx, nil, "-n", devNamespace, "logs", p, "--since-time="+tl.t0.Add(-time.Second).UTC().Format(time.RFC3339))
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(out), "\n") {
			var rec struct {
				Time time.Time `json:"time"`
				Msg  string    `json:"msg"`
			}
			if json.Unmarshal([]byte(line), &rec) != nil || rec.Time.Before(tl.t0) {
				continue
			}
			if slices.ContainsFunc(keys, func(k string) bool { return strings.Contains(rec.Msg, k) }) {
				tl.add(rec.Time, "%s log: %s", p, rec.Msg)
			}
		}
	}
}

// stop ends the watches and logs the timeline, in order, as offsets from t0.
func (tl *timeline) stop(t *testing.T, title string) {
	t.Helper()
	tl.cancel()
	tl.wg.Wait()
	tl.mu.Lock()
	defer tl.mu.Unlock()
	slices.SortStableFunc(tl.events, func(a, b tlEvent) int { return a.at.Compare(b.at) })
	var b strings.Builder
	for _, e := range tl.events {
		fmt.Fprintf(&b, "\n  %+8.3fs %s", e.at.Sub(tl.t0).Seconds(), e.what)
	}
	t.Logf("%s timeline:%s", title, b.String())
}
