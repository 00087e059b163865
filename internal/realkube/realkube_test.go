package realkube

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// EnvBin names the directory with the cluster's binaries (make kube-node
// and make coredns build them into bin/).
const EnvBin = "WALSHIP_REALKUBE_BIN"

// EnvProxyMinSync sets kube-proxy's minSyncPeriod (a Go duration) for an
// experiment; unset, kube-proxy's default (1 s), as on users' clusters.
const EnvProxyMinSync = "WALSHIP_REALKUBE_PROXY_MIN_SYNC"

// The cluster is shared by the package's tests: starting one takes about
// a minute, most of it kubelet and the node becoming Ready.
var shared struct {
	once sync.Once
	c    *Cluster
	dir  string
	skip string
	err  error
}

func TestMain(m *testing.M) {
	code := m.Run()
	if shared.c != nil {
		shared.c.Close()
		// Close must leave the host as it found it: the next cluster
		// (or the next test run) would trip over a shim, a mount or a
		// rule left behind.
		if left := shared.c.Leftovers(); len(left) > 0 {
			fmt.Fprintf(os.Stderr, "realkube: Close left behind:\n  %s\n", strings.Join(left, "\n  "))
			code = 1
		}
	}
	if shared.dir != "" && code == 0 {
		_ = os.RemoveAll(shared.dir)
	} else if shared.dir != "" {
		fmt.Fprintf(os.Stderr, "realkube: cluster files kept in %s\n", shared.dir)
	}
	os.Exit(code)
}

// missing says what this machine lacks to run the cluster, or "".
func missing() string {
	if os.Geteuid() != 0 {
		return "not root: containerd, kubelet and kube-proxy need root"
	}
	bin := os.Getenv(EnvBin)
	if bin == "" {
		return EnvBin + " is not set: build the cluster with `make kube-node coredns` and set it to bin/"
	}
	for _, b := range []string{"kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubelet", "kube-proxy", "kubectl", "coredns"} {
		if _, err := os.Stat(filepath.Join(bin, b)); err != nil {
			return fmt.Sprintf("%s: %v (make kube-node coredns)", b, err)
		}
	}
	for _, b := range []string{"etcd", "containerd", "containerd-shim-runc-v2", "runc", "ctr", "iptables", "/usr/lib/cni/bridge"} {
		if _, err := exec.LookPath(b); err != nil {
			return fmt.Sprintf("%s: %v (apt-get install etcd-server containerd runc containernetworking-plugins iptables)", b, err)
		}
	}
	return ""
}

// cluster returns the shared cluster, starting it on first use, or skips
// t with what the machine lacks.
func cluster(t *testing.T) *Cluster {
	t.Helper()
	shared.once.Do(func() {
		if shared.skip = missing(); shared.skip != "" {
			return
		}
		dir, err := os.MkdirTemp("", "realkube-")
		if err != nil {
			shared.err = err
			return
		}
		shared.dir = dir
		ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
		defer cancel()
		root, _ := filepath.Abs("../..")
		images, err := BuildImages(ctx, root, dir)
		if err != nil {
			shared.err = err
			return
		}
		cfg := Config{Bin: os.Getenv(EnvBin), Dir: filepath.Join(dir, "cluster"), Images: images}
		if v := os.Getenv(EnvProxyMinSync); v != "" {
			if cfg.ProxyMinSyncPeriod, err = time.ParseDuration(v); err != nil {
				shared.err = fmt.Errorf("%s: %w", EnvProxyMinSync, err)
				return
			}
		}
		shared.c, shared.err = Start(ctx, cfg)
	})
	if shared.skip != "" {
		t.Skip(shared.skip)
	}
	if shared.err != nil {
		t.Fatalf("start the cluster: %v", shared.err)
	}
	return shared.c
}

const devNamespace = "walship-dev"

// TestDevOverlay applies the dev overlay as a user does (through the test
// overlay: images imported, local volumes) and waits for every pod to be
// Ready; every volume (three data nodes, three log stores) must then
// hold one cluster id.
func TestDevOverlay(t *testing.T) {
	c := cluster(t)
	// Data nodes and log stores alike stamp it.
	checkOneClusterID(t, deployDev(t, c))
}

// TestServiceRangeStaysOnHost: a connection to an address of the Service
// range that no Service has (what kube-proxy leaves untranslated while a
// Service has no endpoint) is refused on this host, not routed off it.
// It dials only once the containing rules are in place.
func TestServiceRangeStaysOnHost(t *testing.T) {
	c := cluster(t)
	if err := ServicesContained(); err != nil {
		t.Fatalf("the Service range is not contained (not dialling it): %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	out, err := c.KubectlOutput(ctx, nil, "get", "services", "-A", "-o", "jsonpath={..spec.clusterIP}")
	if err != nil {
		t.Fatal(err)
	}
	used := strings.Fields(string(out))
	var addr string
	for _, ip := range []string{"10.96.255.254", "10.96.255.253", "10.96.254.254"} {
		if !slices.Contains(used, ip) {
			addr = ip
			break
		}
	}
	if addr == "" {
		t.Fatalf("every candidate address has a Service: %v", used)
	}
	conn, err := net.DialTimeout("tcp", net.JoinHostPort(addr, "7401"), 10*time.Second)
	if err == nil {
		conn.Close()
		t.Fatalf("a connection to %s, which no Service has, was accepted", addr)
	}
	if !errors.Is(err, syscall.ECONNREFUSED) {
		t.Fatalf("dial %s: %v; want connection refused on this host", addr, err)
	}
}

var dev struct {
	once sync.Once
	dirs []string
	err  error
}

// deployDev applies the test overlay once for the package (later tests
// find it deployed) and waits for every pod to be Ready. It returns the
// local volumes' directories.
func deployDev(t *testing.T, c *Cluster) []string {
	t.Helper()
	dev.once.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
		defer cancel()
		if dev.dirs, dev.err = c.CreateLocalPVs(ctx, 6, "1Gi"); dev.err != nil {
			return
		}
		if dev.err = c.Kubectl(ctx, nil, "apply", "-k", "testdata/overlay"); dev.err != nil {
			return
		}
		dev.err = waitAllReady(ctx, c, 8*time.Minute)
	})
	if dev.err != nil {
		dump(t, c)
		t.Fatalf("deploy the dev overlay: %v", dev.err)
	}
	return dev.dirs
}

// waitAllReady waits for both StatefulSets of the dev deployment to be
// rolled out and every pod of its namespace to be Ready.
func waitAllReady(ctx context.Context, c *Cluster, timeout time.Duration) error {
	return waitAllReadyIn(ctx, c, devNamespace, timeout)
}

// waitAllReadyIn is waitAllReady in namespace ns.
func waitAllReadyIn(ctx context.Context, c *Cluster, ns string, timeout time.Duration) error {
	for _, sts := range []string{"walship-logstore", "walship"} {
		if err := waitFor(ctx, timeout, "statefulset "+sts, func() error {
			return c.Kubectl(ctx, nil, "-n", ns, "rollout", "status", "statefulset/"+sts, "--timeout=10s")
		}); err != nil {
			return err
		}
	}
	return c.Kubectl(ctx, nil, "-n", ns, "wait", "--for=condition=Ready", "pod", "--all", "--timeout=2m")
}

// dump logs what a failed test needs to see of the dev deployment (dumpNS).
func dump(t *testing.T, c *Cluster) { dumpNS(t, c, devNamespace) }

// dumpNS logs what a failed test needs to see: the pods, namespace ns's
// events and containers' logs, and the node's.
func dumpNS(t *testing.T, c *Cluster, ns string) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for _, args := range [][]string{
		{"get", "pods", "-A", "-o", "wide", "-L", "walship.io/role,walship.io/reads"},
		{"get", "pvc,pv", "-A", "-o", "wide"},
		{"-n", ns, "get", "events", "--sort-by=.lastTimestamp"},
	} {
		out, err := c.KubectlOutput(ctx, nil, args...)
		t.Logf("kubectl %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	out, _ := c.KubectlOutput(ctx, nil, "-n", ns, "get", "pods", "-o", "name")
	pods := strings.Fields(string(out))
	sort.Strings(pods)
	for _, p := range pods {
		logs, err := c.KubectlOutput(ctx, nil, "-n", ns, "logs", p, "--tail=30")
		t.Logf("logs %s: %v\n%s", p, err, logs)
	}
	t.Logf("kubelet:\n%s", c.Logs("kubelet", 6000))
}
