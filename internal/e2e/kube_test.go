package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	walshipv1 "github.com/walship/walship/gen/walship/v1"
	"github.com/walship/walship/internal/check"
	"github.com/walship/walship/internal/kube"
	"github.com/walship/walship/internal/kubetest"
	"github.com/walship/walship/internal/testkit"
	"github.com/walship/walship/pkg/client"
	"github.com/walship/walship/services/node"
)

// The Kubernetes failover tests: a real API server (internal/kubetest),
// walship processes playing the pods of the data-node StatefulSet with
// the shipped RBAC (deploy/k8s/base/rbac.yaml) and the shipped failover
// defaults, and Pod objects created directly (no kubelet).

const kubeNS = "walship-test"

// kubeUser is the data nodes' service account, as the API server's
// token file knows it (kubeUserGroups: with its groups).
var (
	kubeUser       = fmt.Sprintf("system:serviceaccount:%s:walship", kubeNS)
	kubeUserGroups = kubeUser + fmt.Sprintf("|system:serviceaccounts,system:serviceaccounts:%s,system:authenticated", kubeNS)
)

type kubeCluster struct {
	*failoverCluster
	api     *kubetest.Server
	kubectl string
	proxies []*tcpProxy // per node: its way to the API server
}

// startKubeCluster starts the API server, the namespace, the service
// account and its RBAC, three Pods, three log stores and three data nodes
// running `walship node --kube-lease walship` (walship-0 bootstraps).
func startKubeCluster(t *testing.T, extra ...string) *kubeCluster {
	t.Helper()
	needLinux(t)
	kubectl := kubetest.Kubectl(t)
	api := kubetest.StartT(t, kubeUserGroups)
	c := &kubeCluster{api: api, kubectl: kubectl}
	c.apply(t, fmt.Sprintf(`apiVersion: v1
kind: Namespace
metadata: {name: %s}
---
apiVersion: v1
kind: ServiceAccount
metadata: {name: walship, namespace: %s}
`, kubeNS, kubeNS))
	rbac, err := os.ReadFile(filepath.Join("..", "..", "deploy", "k8s", "base", "rbac.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	// As a user would: the RoleBinding's subject without a namespace is
	// the RoleBinding's own.
	c.kubectlRun(t, string(rbac), "apply", "-n", kubeNS, "-f", "-")
	for i := range 3 {
		c.apply(t, fmt.Sprintf(`apiVersion: v1
kind: Pod
metadata: {name: walship-%d, namespace: %s, labels: {app.kubernetes.io/name: walship}}
spec:
  serviceAccountName: walship
  containers: [{name: node, image: walship}]
`, i, kubeNS))
	}
	fc := newFailoverCluster(t, func(i int) string { return fmt.Sprintf("walship-%d", i) })
	for i, n := range fc.nodes {
		p := startTCPProxy(t, strings.TrimPrefix(api.URL, "https://"))
		c.proxies = append(c.proxies, p)
		kc, err := api.Kubeconfig(kubeUser, "https://"+p.addr)
		if err != nil {
			t.Fatal(err)
		}
		n.args[0] = "node"
		n.serving = "replica serving"
		if i == 0 {
			n.serving = "primary serving"
		}
		n.args = append(n.args, "--initial-primary", "walship-0", "--kube-lease", "walship", "--kubeconfig", kc,
			"--pod-name", n.name, "--pod-namespace", kubeNS)
		n.args = append(n.args, extra...)
	}
	fc.start(t)
	c.failoverCluster = fc
	return c
}

// startKubeWithClient starts the Kubernetes cluster, waits until
// walship-0 is the labelled primary and returns a client of every node
// and a context of d.
func startKubeWithClient(t *testing.T, d time.Duration) (*kubeCluster, *client.Client, context.Context) {
	t.Helper()
	c := startKubeCluster(t)
	c.waitLabels(t, map[string]string{"walship-0": "primary"})
	cl, err := client.New(c.addrs(), client.Options{Retry: 30 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cl.Close() })
	ctx, cancel := context.WithTimeout(t.Context(), d)
	t.Cleanup(cancel)
	return c, cl, ctx
}

func (c *kubeCluster) apply(t *testing.T, yaml string) {
	t.Helper()
	c.kubectlRun(t, yaml, "apply", "-f", "-")
}

func (c *kubeCluster) kubectlRun(t *testing.T, stdin string, args ...string) string {
	t.Helper()
	cmd := exec.Command(c.kubectl, append([]string{"--kubeconfig", c.api.Admin}, args...)...)
	cmd.Stdin = strings.NewReader(stdin)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("kubectl %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

// lease returns the Lease's holder and transitions.
func (c *kubeCluster) lease(t *testing.T) (holder string, transitions int) {
	t.Helper()
	var l struct {
		Spec struct {
			HolderIdentity       string `json:"holderIdentity"`
			LeaseTransitions     int    `json:"leaseTransitions"`
			LeaseDurationSeconds int    `json:"leaseDurationSeconds"`
		} `json:"spec"`
	}
	if err := json.Unmarshal([]byte(c.kubectlRun(t, "", "get", "-n", kubeNS, "lease", "walship", "-o", "json")), &l); err != nil {
		t.Fatal(err)
	}
	return l.Spec.HolderIdentity, l.Spec.LeaseTransitions
}

// roles returns each pod's walship.io/role label.
func (c *kubeCluster) roles(t *testing.T) map[string]string {
	t.Helper()
	var pods struct {
		Items []struct {
			Metadata struct {
				Name   string            `json:"name"`
				Labels map[string]string `json:"labels"`
			} `json:"metadata"`
		} `json:"items"`
	}
	if err := json.Unmarshal([]byte(c.kubectlRun(t, "", "get", "-n", kubeNS, "pods", "-o", "json")), &pods); err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, p := range pods.Items {
		out[p.Metadata.Name] = p.Metadata.Labels["walship.io/role"]
	}
	return out
}

// waitLabels waits until the pods' role labels are want.
func (c *kubeCluster) waitLabels(t *testing.T, want map[string]string) {
	t.Helper()
	var got map[string]string
	defer func() {
		if t.Failed() {
			h, n := c.lease(t)
			t.Logf("labels %v, want %v; Lease holder %q after %d transitions", got, want, h, n)
		}
	}()
	testkit.UntilWithin(t, 30*time.Second, "role labels", func() bool {
		got = c.roles(t)
		for k, v := range want {
			if got[k] != v {
				return false
			}
		}
		return true
	})
}

// TestKubeBootstrapAndLabels: the initial primary takes the Lease and
// labels itself; the replicas label themselves; nothing else holds it.
func TestKubeBootstrapAndLabels(t *testing.T) {
	c := startKubeCluster(t)
	c.waitLabels(t, map[string]string{"walship-0": "primary", "walship-1": "replica", "walship-2": "replica"})
	if h, _ := c.lease(t); h != "walship-0" {
		t.Fatalf("Lease holder %q, want walship-0", h)
	}
}

// TestKubeFailoverKill9: kill -9 the primary under checked sync load: a
// replica takes the Lease, wins the vote and labels itself; every write
// acknowledged under the contract is there (the checker and the read
// back); the old primary restarted rejoins as a replica.
func TestKubeFailoverKill9(t *testing.T) {
	c, cl, ctx := startKubeWithClient(t, 3*time.Minute)
	h, finish := runChecked(t, ctx, cl, "kube/", 8*time.Second)
	<-time.After(1500 * time.Millisecond)
	h.Note("kill -9 walship-0 (the primary)")
	killed := time.Now()
	c.nodes[0].p.kill()
	firstAck(t, ctx, cl, "kube/first-after")
	t.Logf("failover time (kill -9 to the first acknowledged sync write): %v", time.Since(killed))
	finish()
	holder, _ := c.lease(t)
	if holder != "walship-1" && holder != "walship-2" {
		t.Fatalf("Lease holder after the failover: %q", holder)
	}
	c.waitLabels(t, map[string]string{holder: "primary"})
	c.nodes[0].serving = "replica serving"
	c.nodes[0].start()
	c.waitLabels(t, map[string]string{"walship-0": "replica", holder: "primary"})
	var rest []string
	for _, n := range c.nodes {
		if n.name != holder {
			rest = append(rest, n.addr)
		}
	}
	converge(t, ctx, c.byName(holder).addr, rest...)
}

// firstAck puts key until a put is acknowledged: one in flight at a kill
// may fail as of unknown outcome.
func firstAck(t *testing.T, ctx context.Context, cl *client.Client, key string) {
	t.Helper()
	for {
		_, err := cl.Put(ctx, key, []byte("x"), nil)
		if err == nil {
			return
		}
		if ctx.Err() != nil {
			t.Fatal(err)
		}
	}
}

func (c *failoverCluster) byName(name string) *procNode {
	for _, n := range c.nodes {
		if n.name == name {
			return n
		}
	}
	return nil
}

// tcpProxy forwards connections to an address until cut.
type tcpProxy struct {
	addr, to string
	l        net.Listener
	mu       sync.Mutex
	cut      bool
	conns    []net.Conn
}

func startTCPProxy(t *testing.T, to string) *tcpProxy {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &tcpProxy{addr: l.Addr().String(), to: to, l: l}
	t.Cleanup(func() { l.Close(); p.setCut(true) })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go p.serve(c)
		}
	}()
	return p
}

func (p *tcpProxy) serve(c net.Conn) {
	p.mu.Lock()
	if p.cut {
		p.mu.Unlock()
		c.Close()
		return
	}
	p.mu.Unlock()
	up, err := net.Dial("tcp", p.to)
	if err != nil {
		c.Close()
		return
	}
	p.mu.Lock()
	p.conns = append(p.conns, c, up)
	p.mu.Unlock()
	go func() { _, _ = io.Copy(up, c); up.Close() }()
	_, _ = io.Copy(c, up)
	c.Close()
}

// setCut cuts (true: every connection closed, new ones refused) or heals.
func (p *tcpProxy) setCut(cut bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cut = cut
	if cut {
		for _, c := range p.conns {
			c.Close()
		}
		p.conns = nil
	}
}

// TestKubeAPIServerCutForThePrimary: the API server becomes unreachable
// for the primary alone. It stops acknowledging within its renew
// deadline, before its Lease can expire; a replica takes the Lease and
// wins the vote; no write acknowledged by the old primary comes after the
// new primary's first, every write the old one acknowledged is in the
// new one's log before its epoch starts, and the checker's history stays
// linearizable. Healed, the old primary rejoins as a replica.
func TestKubeAPIServerCutForThePrimary(t *testing.T) {
	c, cl, ctx := startKubeWithClient(t, 3*time.Minute)
	h, finish := runChecked(t, ctx, cl, "cut/", 8*time.Second)
	wctx, stopWriters := context.WithCancel(ctx)
	var wg sync.WaitGroup
	writers := make([]*check.PinnedWriter, len(c.nodes))
	for i, n := range c.nodes {
		writers[i] = &check.PinnedWriter{}
		kv := walshipv1.NewKVServiceClient(conn(t, n.addr))
		wg.Add(1)
		go func() { defer wg.Done(); writers[i].Run(wctx, kv, fmt.Sprintf("pinned/%s/", n.name)) }()
	}
	<-time.After(1500 * time.Millisecond)
	h.Note("the API server cut off for walship-0 (the primary)")
	cut := time.Now()
	c.proxies[0].setCut(true)
	var holder string
	testkit.UntilWithin(t, 30*time.Second, "another node to hold the Lease", func() bool {
		holder, _ = c.lease(t)
		return holder != "walship-0"
	})
	newPrim := c.byName(holder)
	// The first write the new primary acknowledges.
	testkit.UntilWithin(t, 30*time.Second, "a write acknowledged by "+holder, func() bool {
		for i, n := range c.nodes {
			if n.name == holder && len(writers[i].Acks()) > 0 {
				return true
			}
		}
		return false
	})
	stopWriters()
	wg.Wait()
	finish()
	old := writers[0].Acks()
	var first check.PinnedAck
	for i, n := range c.nodes {
		if n.name == holder {
			first = writers[i].Acks()[0]
		}
	}
	if len(old) == 0 {
		t.Fatal("the old primary acknowledged nothing before the cut")
	}
	last := old[len(old)-1]
	t.Logf("cut at +0; the old primary's last ack at %v, the new primary's (%s) first at %v",
		last.At.Sub(cut), holder, first.At.Sub(cut))
	if !last.At.Before(first.At) {
		t.Fatalf("two primaries acknowledged at once: the old one's last ack (%v after the cut) is after the new one's first (%v)", last.At.Sub(cut), first.At.Sub(cut))
	}
	if d := last.At.Sub(cut); d >= kube.DefaultLeaseDuration {
		t.Fatalf("the old primary acknowledged %v after it was cut off from the API server, past the Lease's duration (%v)", d, kube.DefaultLeaseDuration)
	}
	// Epochs: the new primary's epoch starts after every LSN the old one
	// acknowledged, and every one of those writes is there.
	st := nodeStatusOf(t, ctx, newPrim.addr)
	var start uint64
	for _, e := range st.GetHistory() {
		if e.GetEpoch() == st.GetEpoch() {
			start = e.GetFirstLsn()
		}
	}
	kv := walshipv1.NewKVServiceClient(conn(t, newPrim.addr))
	for _, a := range old {
		if a.LSN >= start {
			t.Fatalf("the old primary acknowledged LSN %d, at or past the new epoch's first LSN %d", a.LSN, start)
		}
		r, err := kv.Get(ctx, &walshipv1.GetRequest{Key: a.Key})
		if err != nil || !r.GetFound() {
			t.Fatalf("%s (acknowledged by the old primary at LSN %d) is not on the new primary: %v", a.Key, a.LSN, err)
		}
	}
	if first.LSN < start {
		t.Fatalf("the new primary acknowledged LSN %d, before its epoch's first LSN %d", first.LSN, start)
	}
	// Healed: the old primary learns of the new epoch and rejoins.
	c.proxies[0].setCut(false)
	c.waitLabels(t, map[string]string{"walship-0": "replica", holder: "primary"})
	var rest []string
	for _, n := range c.nodes {
		if n.name != holder {
			rest = append(rest, n.addr)
		}
	}
	converge(t, ctx, newPrim.addr, rest...)
}

func nodeStatusOf(t *testing.T, ctx context.Context, addr string) *walshipv1.StatusResponse {
	t.Helper()
	st, err := walshipv1.NewAdminServiceClient(conn(t, addr)).Status(ctx, &walshipv1.StatusRequest{})
	if err != nil {
		t.Fatal(err)
	}
	return st
}

// TestKubeSIGTERMSwitchesOver: SIGTERM of the primary (a pod deleted, a
// node drained) hands over before the process exits: async writes
// included, nothing acknowledged is lost, the pause clients see is
// logged, and the Lease and the label move to the target.
func TestKubeSIGTERMSwitchesOver(t *testing.T) {
	c, cl, ctx := startKubeWithClient(t, 3*time.Minute)
	load := startAlternatingLoad(ctx, cl)
	<-time.After(1500 * time.Millisecond)
	c.nodes[0].p.stop() // SIGTERM; fails the test unless it exits cleanly
	var holder string
	testkit.UntilWithin(t, 30*time.Second, "another node to hold the Lease", func() bool {
		holder, _ = c.lease(t)
		return holder != "walship-0" && holder != ""
	})
	c.waitLabels(t, map[string]string{holder: "primary"})
	<-time.After(500 * time.Millisecond)
	acked, pause := load.stop()
	if !strings.Contains(c.nodes[0].p.logs(), "switched over before stopping") {
		t.Fatalf("the primary did not switch over before it stopped:\n%s", c.nodes[0].p.logs())
	}
	t.Logf("%d writes acknowledged (half async); longest gap between acknowledgements across the switchover: %v", len(acked), pause)
	checkAcked(t, ctx, acked, c.byName(holder).addr, holder)
}

// TestKubeFlappingReplicaCausesNoEpochs: a replica that keeps dying and
// coming back (kill -9, restart) and whose API server connection flaps
// never takes the Lease from a healthy primary: the epoch stays 1 and the
// Lease never changes hands.
func TestKubeFlappingReplicaCausesNoEpochs(t *testing.T) {
	// No holddown, so that only the Lease keeps the replica out; a Lease
	// longer than the defaults, so that a stall of this shared machine's
	// API server (its etcd fsyncs beside the other tests') is not taken
	// for the primary's death: this test is about the replica.
	c := startKubeCluster(t, "--failover-holddown", "0s", "--kube-lease-duration", "8s", "--kube-renew-deadline", "6s")
	c.waitLabels(t, map[string]string{"walship-0": "primary", "walship-2": "replica"})
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	for i := range 4 {
		c.nodes[2].p.kill()
		c.proxies[2].setCut(i%2 == 0)
		c.nodes[2].start()
		c.proxies[2].setCut(false)
		c.waitLabels(t, map[string]string{"walship-2": "replica"})
	}
	// Its connection to the primary flaps too.
	for range 3 {
		c.nodes[2].p.pause()
		<-time.After(1500 * time.Millisecond)
		c.nodes[2].p.signal(syscall.SIGCONT)
		<-time.After(500 * time.Millisecond)
	}
	holder, transitions := c.lease(t)
	if holder != "walship-0" || transitions != 0 {
		t.Fatalf("the Lease changed hands: holder %q after %d transitions", holder, transitions)
	}
	for _, n := range c.nodes {
		if st := nodeStatusOf(t, ctx, n.addr); st.GetEpoch() != 1 && st.GetVoteEpoch() != 1 {
			t.Fatalf("%s: epoch %d (vote %d): a flapping replica caused an epoch", n.name, st.GetEpoch(), st.GetVoteEpoch())
		}
	}
}

// TestKubeMeasureFailover measures, over WALSHIP_KUBE_FAILOVER_RUNS
// cycles (skipped without it; docs/BENCHMARKS.md), automatic failover on
// Kubernetes with the shipped defaults: the time from kill -9 of the
// primary to the first sync write acknowledged by the node that took the
// Lease. Each cycle restarts the killed node (it rejoins) and waits out
// the holddown before the next kill.
func TestKubeMeasureFailover(t *testing.T) {
	runs := measureRuns(t, "WALSHIP_KUBE_FAILOVER_RUNS", "automatic failover times")
	c, cl, ctx := startKubeWithClient(t, time.Duration(runs)*time.Minute)
	var times []time.Duration
	holder := "walship-0"
	for i := range runs {
		if _, err := cl.Put(ctx, "m/warm", []byte("x"), nil); err != nil {
			t.Fatal(err)
		}
		killed := time.Now()
		dead := c.byName(holder)
		dead.p.kill()
		firstAck(t, ctx, cl, "m/first")
		times = append(times, time.Since(killed))
		prev := holder
		holder, _ = c.lease(t)
		if holder == prev {
			t.Fatalf("run %d: %s still holds the Lease", i, prev)
		}
		dead.serving = "replica serving"
		dead.start()
		c.waitLabels(t, map[string]string{prev: "replica", holder: "primary"})
		// Every replica may contend again.
		<-time.After(node.DefaultFailoverHolddown + time.Second)
	}
	med, mx := medianMax(times)
	t.Logf("%d runs, shipped defaults (lease %v, renew deadline %v, retry %v): kill -9 to the first acknowledged sync write median %v, max %v",
		runs, kube.DefaultLeaseDuration, kube.DefaultRenewDeadline, kube.DefaultRetryPeriod, med.Round(time.Millisecond), mx.Round(time.Millisecond))
	t.Logf("runs: %v", times)
}
