// Package realkube runs a single-node Kubernetes cluster for tests, from
// parts that install on a machine with no registry: Debian's etcd,
// containerd, runc and CNI plugins, the control plane, kubelet and
// kube-proxy built from k8s.io/kubernetes (tools/kube, `make kube-node`),
// and CoreDNS (tools/coredns, `make coredns`). Images are built locally
// (BuildImages) and imported; nothing is pulled.
//
// Everything runs as a process of its own, in a directory of its own:
// containerd has its own socket, root and state (not Docker's); the pods
// are on a bridge of their own (realkube0, 10.244.0.0/16); Services are
// 10.96.0.0/16, with kube-proxy in iptables mode. CoreDNS runs on the host,
// behind the kube-dns Service (10.96.0.10), which has no selector and an
// EndpointSlice pointing at it, so it needs no image.
//
// Authentication is by static token: every component is "admin" in
// system:masters. The kubelet lets anyone in (anonymous, AlwaysAllow) so
// that `kubectl logs` and `exec` work without client certificates. A test
// cluster only: it listens on the host's address.
package realkube

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/walship/walship/internal/freeport"
)

// Addresses of the cluster's networks. They must not overlap the host's
// (Docker's bridge is 172.17.0.0/16).
const (
	PodCIDR     = "10.244.0.0/16"
	ServiceCIDR = "10.96.0.0/16"
	DNSIP       = "10.96.0.10"
	NodeName    = "realkube"
	bridgeName  = "realkube0"
	adminToken  = "walship-realkube-admin"
)

// Config says where the binaries are and where the cluster lives.
type Config struct {
	// Bin holds kube-apiserver, kube-controller-manager, kube-scheduler,
	// kubelet, kube-proxy, kubectl and coredns.
	Bin string
	// Dir holds every component's data, config and logs; Close removes
	// what the components mounted under it but leaves the files.
	Dir string
	// Images are OCI archives (BuildImages) imported before kubelet starts.
	Images []string
	// ProxyMinSyncPeriod is kube-proxy's iptables minSyncPeriod; 0 leaves
	// its default, 1 s, which is what users' clusters run. An experiment
	// knob: how much of a hand-over's client gap is kube-proxy holding a
	// Service's change back after another's.
	ProxyMinSyncPeriod time.Duration
}

// Cluster is a running single-node cluster.
type Cluster struct {
	// Kubeconfig is an admin kubeconfig.
	Kubeconfig string
	// HostIP is the node's address, where the API server and CoreDNS listen.
	HostIP string
	// ProxyMetrics is kube-proxy's metrics address (host:port).
	ProxyMetrics string

	cfg     Config
	ctdSock string
	apiPort string
	procs   []*process
}

type process struct {
	name string
	cmd  *exec.Cmd
	done chan struct{}
}

// Start starts the cluster and waits for the node to be Ready. On error
// it stops what it started.
func Start(ctx context.Context, cfg Config) (c *Cluster, err error) {
	c = &Cluster{cfg: cfg}
	defer func() {
		if err != nil {
			c.Close()
			c = nil
		}
	}()
	for _, d := range []string{"etcd", "certs", "logs", "containerd", "cni/conf", "cni/ipam", "kubelet", "pods"} {
		if err := os.MkdirAll(filepath.Join(cfg.Dir, d), 0o755); err != nil {
			return nil, err
		}
	}
	if c.HostIP, err = hostIP(); err != nil {
		return nil, err
	}
	// Before anything can dial a Service: traffic to the Service range
	// that kube-proxy did not translate stays on this host.
	if err := containServices(); err != nil {
		return nil, err
	}
	ports := map[string]string{}
	for _, name := range []string{"etcd-client", "etcd-peer", "apiserver", "kubelet", "kubelet-healthz", "proxy-healthz", "proxy-metrics", "dns"} {
		addr, err := freeport.Pick("127.0.0.1")
		if err != nil {
			return nil, err
		}
		_, p, _ := net.SplitHostPort(addr)
		ports[name] = p
	}
	dir := cfg.Dir
	path := func(p ...string) string { return filepath.Join(append([]string{dir}, p...)...) }

	// etcd and the API server.
	etcdURL := "http://127.0.0.1:" + ports["etcd-client"]
	peerURL := "http://127.0.0.1:" + ports["etcd-peer"]
	if err := c.run(ctx, "etcd", "etcd", "--data-dir", path("etcd"),
		"--listen-client-urls", etcdURL, "--advertise-client-urls", etcdURL,
		"--listen-peer-urls", peerURL, "--initial-advertise-peer-urls", peerURL,
		"--initial-cluster", "default="+peerURL, "--log-level", "warn"); err != nil {
		return nil, err
	}
	tokens := path("tokens.csv")
	if err := os.WriteFile(tokens, []byte(adminToken+",admin,uid-admin,\"system:masters\"\n"), 0o600); err != nil {
		return nil, err
	}
	saKey := path("certs", "sa.key")
	if err := writeKey(saKey); err != nil {
		return nil, err
	}
	c.apiPort = ports["apiserver"]
	c.ProxyMetrics = "127.0.0.1:" + ports["proxy-metrics"]
	apiURL := "https://" + c.HostIP + ":" + c.apiPort
	if err := c.run(ctx, "kube-apiserver", c.bin("kube-apiserver"), "--etcd-servers", etcdURL,
		"--bind-address", "0.0.0.0", "--advertise-address", c.HostIP, "--secure-port", ports["apiserver"],
		// Self-signed, for the advertise address, the kubernetes Service's
		// IP and its names: the pods' in-cluster clients verify it.
		"--cert-dir", path("certs"),
		"--token-auth-file", tokens, "--authorization-mode", "Node,RBAC",
		"--service-account-issuer", "https://kubernetes.default.svc",
		"--service-account-key-file", saKey, "--service-account-signing-key-file", saKey,
		"--service-cluster-ip-range", ServiceCIDR, "--allow-privileged",
		// The node's name does not resolve on the host: kubectl logs and
		// exec reach the kubelet by its address.
		"--kubelet-preferred-address-types", "InternalIP",
		"--v", "0"); err != nil {
		return nil, err
	}
	ca := path("certs", "apiserver.crt")
	if err := waitFor(ctx, 2*time.Minute, "kube-apiserver /readyz", func() error { return ready(apiURL, ca) }); err != nil {
		return nil, err
	}
	c.Kubeconfig = path("admin.kubeconfig")
	if err := os.WriteFile(c.Kubeconfig, kubeconfig(apiURL, ca), 0o600); err != nil {
		return nil, err
	}

	// The controllers.
	if err := c.run(ctx, "kube-controller-manager", c.bin("kube-controller-manager"),
		"--kubeconfig", c.Kubeconfig, "--leader-elect=false",
		"--service-account-private-key-file", saKey, "--root-ca-file", ca,
		"--use-service-account-credentials=false", "--controllers", "*",
		"--cluster-cidr", PodCIDR, "--service-cluster-ip-range", ServiceCIDR,
		"--bind-address", "127.0.0.1", "--secure-port", "0", "--v", "0"); err != nil {
		return nil, err
	}
	if err := c.run(ctx, "kube-scheduler", c.bin("kube-scheduler"),
		"--kubeconfig", c.Kubeconfig, "--leader-elect=false",
		"--bind-address", "127.0.0.1", "--secure-port", "0", "--v", "0"); err != nil {
		return nil, err
	}

	// containerd, with the pod network and the images.
	c.ctdSock = path("containerd", "containerd.sock")
	if err := os.WriteFile(path("containerd", "config.toml"), []byte(containerdConfig(dir, c.ctdSock)), 0o644); err != nil {
		return nil, err
	}
	if err := os.WriteFile(path("cni", "conf", "10-realkube.conflist"), []byte(cniConfig(path("cni", "ipam"))), 0o644); err != nil {
		return nil, err
	}
	if err := c.run(ctx, "containerd", "containerd", "--config", path("containerd", "config.toml")); err != nil {
		return nil, err
	}
	if err := waitFor(ctx, time.Minute, "containerd", func() error {
		return c.ctr(ctx, nil, "version")
	}); err != nil {
		return nil, err
	}
	for _, img := range cfg.Images {
		if err := c.ctr(ctx, nil, "images", "import", img); err != nil {
			return nil, err
		}
	}

	// The node.
	if err := os.WriteFile(path("kubelet", "config.yaml"), []byte(kubeletConfig(c, ports)), 0o644); err != nil {
		return nil, err
	}
	if err := c.run(ctx, "kubelet", c.bin("kubelet"), "--config", path("kubelet", "config.yaml"),
		"--kubeconfig", c.Kubeconfig, "--root-dir", path("kubelet"),
		"--hostname-override", NodeName, "--node-ip", c.HostIP, "--v", "0"); err != nil {
		return nil, err
	}
	if err := os.WriteFile(path("kube-proxy.yaml"), []byte(proxyConfig(c, ports)), 0o644); err != nil {
		return nil, err
	}
	if err := c.run(ctx, "kube-proxy", c.bin("kube-proxy"), "--config", path("kube-proxy.yaml"),
		"--hostname-override", NodeName, "--v", "0"); err != nil {
		return nil, err
	}

	// Cluster DNS on the host, behind the kube-dns Service.
	if err := os.WriteFile(path("Corefile"), []byte(corefile(c, ports["dns"])), 0o644); err != nil {
		return nil, err
	}
	if err := c.run(ctx, "coredns", c.bin("coredns"), "-conf", path("Corefile")); err != nil {
		return nil, err
	}
	if err := waitFor(ctx, 2*time.Minute, "kube-system namespace", func() error {
		return c.Kubectl(ctx, nil, "get", "namespace", "kube-system")
	}); err != nil {
		return nil, err
	}
	if err := c.Kubectl(ctx, strings.NewReader(dnsObjects(c.HostIP, ports["dns"])), "apply", "-f", "-"); err != nil {
		return nil, err
	}
	if err := waitFor(ctx, 3*time.Minute, "node Ready", func() error {
		return c.Kubectl(ctx, nil, "wait", "--for=condition=Ready", "node/"+NodeName, "--timeout=5s")
	}); err != nil {
		return nil, err
	}
	return c, nil
}

// Kubectl runs kubectl as admin; its output goes to the logs, and to the
// error when it fails.
func (c *Cluster) Kubectl(ctx context.Context, stdin io.Reader, args ...string) error {
	_, err := c.KubectlOutput(ctx, stdin, args...)
	return err
}

// KubectlOutput runs kubectl as admin and returns its stdout.
func (c *Cluster) KubectlOutput(ctx context.Context, stdin io.Reader, args ...string) ([]byte, error) {
	cmd := exec.CommandContext(ctx, c.bin("kubectl"), append([]string{"--kubeconfig", c.Kubeconfig}, args...)...)
	cmd.Stdin = stdin
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return out, fmt.Errorf("kubectl %s: %w: %s", strings.Join(args, " "), err, stderr.Bytes())
	}
	return out, nil
}

// ContainerPID returns the host PID of a running container's process, for
// kill -9 of what the pod runs (not of the pod).
func (c *Cluster) ContainerPID(ctx context.Context, containerID string) (int, error) {
	id := strings.TrimPrefix(containerID, "containerd://")
	var out bytes.Buffer
	if err := c.ctr(ctx, &out, "tasks", "ls"); err != nil {
		return 0, err
	}
	for _, line := range strings.Split(out.String(), "\n") {
		f := strings.Fields(line)
		if len(f) >= 3 && f[0] == id && f[2] == "RUNNING" {
			return strconv.Atoi(f[1])
		}
	}
	return 0, fmt.Errorf("container %s: no running task", id)
}

// ImportImage imports an OCI archive (BuildWalshipImage) into the
// cluster's containerd, as `ctr -n k8s.io images import` does on a node:
// kubelet then finds it by name without pulling.
func (c *Cluster) ImportImage(ctx context.Context, archive string) error {
	return c.ctr(ctx, nil, "images", "import", archive)
}

func (c *Cluster) bin(name string) string { return filepath.Join(c.cfg.Bin, name) }

// ctr runs containerd's client against this cluster's containerd, in the
// CRI's namespace.
func (c *Cluster) ctr(ctx context.Context, stdout io.Writer, args ...string) error {
	cmd := exec.CommandContext(ctx, "ctr", append([]string{"-a", c.ctdSock, "-n", "k8s.io"}, args...)...)
	var stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = stdout, &stderr
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("ctr %s: %w: %s", strings.Join(args, " "), err, stderr.Bytes())
	}
	return nil
}

// run starts a component with its output in logs/<name>.log.
func (c *Cluster) run(ctx context.Context, name, bin string, args ...string) error {
	log, err := os.OpenFile(filepath.Join(c.cfg.Dir, "logs", name+".log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	// Not CommandContext: Close stops the components in an order of its
	// own, and the context only bounds Start.
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = log, log
	// A group of its own, so that a ^C to the test does not reach it first.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		log.Close()
		return fmt.Errorf("start %s: %w", name, err)
	}
	p := &process{name: name, cmd: cmd, done: make(chan struct{})}
	go func() { _ = cmd.Wait(); log.Close(); close(p.done) }()
	c.procs = append(c.procs, p)
	return nil
}

// Logs returns the tail of a component's log.
func (c *Cluster) Logs(name string, n int) string {
	b, _ := os.ReadFile(filepath.Join(c.cfg.Dir, "logs", name+".log"))
	if len(b) > n {
		b = b[len(b)-n:]
	}
	return string(b)
}

// PIDs returns the components' process ids by name, for stopping them from
// another process (make kube-down).
func (c *Cluster) PIDs() map[string]int {
	m := map[string]int{}
	for _, p := range c.procs {
		m[p.name] = p.cmd.Process.Pid
	}
	return m
}

// Close stops the node first (so that nothing restarts the containers),
// then the containers, then the rest, each by PID; then it unmounts what
// kubelet mounted and removes the iptables rules and the bridge.
func (c *Cluster) Close() {
	stop := func(name string) {
		for _, p := range c.procs {
			if p.name == name {
				stopProcess(p)
			}
		}
	}
	stop("kubelet")
	if c.ctdSock != "" {
		c.removeContainers()
	}
	stop("kube-proxy")
	if _, err := os.Stat(c.bin("kube-proxy")); err == nil && c.ctdSock != "" {
		_ = exec.Command(c.bin("kube-proxy"), "--cleanup").Run()
	}
	for i := len(c.procs) - 1; i >= 0; i-- {
		stopProcess(c.procs[i])
	}
	if c.ctdSock != "" {
		c.killShims()
	}
	unmountUnder(c.cfg.Dir)
	// containerd 1.6 keeps the sandboxes' network namespaces here, not
	// under its state directory; /var/run is a link to /run, and
	// mountinfo names the target.
	unmountUnder("/run/netns/cni-")
	// A CNI plugin containerd started before it stopped (a sandbox's
	// set-up or teardown) can still be changing the tables, and add its
	// chain after they were cleaned (seen: CNI-FORWARD and its jump from
	// FORWARD, left once in a few runs): let those end first.
	_ = waitFor(context.Background(), 10*time.Second, "CNI plugins to end", func() error {
		if pids := cniPlugins(); len(pids) > 0 {
			return fmt.Errorf("still running: %v", pids)
		}
		return nil
	})
	// Again while a rule is left: a command can lose a race with another
	// process changing the tables.
	_ = waitFor(context.Background(), 10*time.Second, "iptables rules removed", func() error {
		if !c.rulesLeft() {
			return nil
		}
		removeCNIRules()
		removeKubeletRules()
		uncontainServices()
		return errors.New("rules were left: look again")
	})
	_ = exec.Command("ip", "link", "del", bridgeName).Run()
}

// Leftovers lists what the cluster left on the host once closed: shims of
// its containerd, mounts under its directory and pod network namespaces,
// iptables chains and rules of kubelet, kube-proxy and the CNI plugins,
// and its bridge. Empty after a clean Close.
func (c *Cluster) Leftovers() []string {
	var left []string
	if c.ctdSock != "" {
		for _, pid := range c.shims() {
			cmd, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
			left = append(left, fmt.Sprintf("shim %d: %s", pid, strings.ReplaceAll(string(cmd), "\x00", " ")))
		}
	}
	if b, err := os.ReadFile("/proc/self/mountinfo"); err == nil {
		for _, line := range strings.Split(string(b), "\n") {
			f := strings.Fields(line)
			if len(f) > 4 && (strings.HasPrefix(f[4], c.cfg.Dir+"/") || strings.Contains(f[4], "/netns/cni-")) {
				left = append(left, "mount "+f[4])
			}
		}
	}
	for _, save := range []string{"iptables-save", "ip6tables-save"} {
		out, err := exec.Command(save).Output()
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(out), "\n") {
			if strings.Contains(line, "KUBE-") || strings.Contains(line, "CNI-") || strings.Contains(line, bridgeName) || strings.Contains(line, containComment) {
				left = append(left, save+": "+line)
			}
		}
	}
	if exec.Command("ip", "link", "show", bridgeName).Run() == nil {
		left = append(left, "link "+bridgeName)
	}
	return left
}

// rulesLeft says whether Leftovers lists an iptables rule or chain.
func (c *Cluster) rulesLeft() bool {
	for _, l := range c.Leftovers() {
		if strings.HasPrefix(l, "iptables-save") || strings.HasPrefix(l, "ip6tables-save") {
			return true
		}
	}
	return false
}

// removeContainers kills every task (running container) of the cluster's
// containerd and deletes them and every container, which also ends their
// shims. It goes by the running tasks first: the containers of pods that
// restarted have no task, and waiting on each of them once used up the
// time before the running ones were reached, leaving their shims and
// processes behind.
func (c *Cluster) removeContainers() {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var out bytes.Buffer
	if err := c.ctr(ctx, &out, "tasks", "ls", "-q"); err == nil {
		for _, id := range strings.Fields(out.String()) {
			_ = c.ctr(ctx, nil, "tasks", "kill", "-a", "-s", "SIGKILL", id)
		}
		for _, id := range strings.Fields(out.String()) {
			_ = c.ctr(ctx, nil, "tasks", "delete", "-f", id)
		}
	}
	out.Reset()
	if err := c.ctr(ctx, &out, "containers", "ls", "-q"); err == nil {
		for _, id := range strings.Fields(out.String()) {
			_ = c.ctr(ctx, nil, "containers", "delete", id)
		}
	}
}

// killShims kills what containerd could not remove: every shim started by
// this cluster's containerd (found by its socket in the shim's command
// line) and the processes it runs (its children), by PID.
func (c *Cluster) killShims() {
	shims := c.shims()
	if len(shims) == 0 {
		return
	}
	children := map[int][]int{}
	stats, _ := filepath.Glob("/proc/[0-9]*/stat")
	for _, p := range stats {
		b, err := os.ReadFile(p)
		if err != nil {
			continue
		}
		// pid (comm) state ppid ...: comm may hold spaces, so after ")".
		s := string(b)
		f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
		pid, _ := strconv.Atoi(filepath.Base(filepath.Dir(p)))
		if len(f) > 1 {
			ppid, _ := strconv.Atoi(f[1])
			children[ppid] = append(children[ppid], pid)
		}
	}
	for _, shim := range shims {
		for _, child := range children[shim] {
			_ = syscall.Kill(child, syscall.SIGKILL)
		}
		_ = syscall.Kill(shim, syscall.SIGKILL)
	}
	_ = waitFor(context.Background(), 10*time.Second, "shims gone", func() error {
		if left := c.shims(); len(left) > 0 {
			return fmt.Errorf("shims %v", left)
		}
		return nil
	})
}

// shims returns the PIDs of the shims of this cluster's containerd.
func (c *Cluster) shims() []int {
	return procsWhere(func(args []string) bool {
		return strings.Contains(args[0], "containerd-shim") && slices.Contains(args, c.ctdSock)
	})
}

// procsWhere are the PIDs of the processes whose command line (program
// first) match says yes to.
func procsWhere(match func(args []string) bool) []int {
	var pids []int
	procs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	for _, p := range procs {
		b, err := os.ReadFile(p)
		if err != nil {
			continue
		}
		if match(strings.Split(strings.TrimRight(string(b), "\x00"), "\x00")) {
			pid, _ := strconv.Atoi(filepath.Base(filepath.Dir(p)))
			pids = append(pids, pid)
		}
	}
	return pids
}

// cniPlugins are the PIDs of CNI plugins (cniBinDir) still running.
func cniPlugins() []int {
	return procsWhere(func(args []string) bool { return strings.HasPrefix(args[0], cniBinDir+"/") })
}

func stopProcess(p *process) {
	select {
	case <-p.done:
		return
	default:
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(15 * time.Second):
		_ = p.cmd.Process.Kill()
		<-p.done
	}
}

// unmountUnder unmounts every mount below dir (or, for a dir ending in
// "-", every mount whose path starts with it), deepest first: kubelet's
// volumes, containerd's sandbox network namespaces and shm.
func unmountUnder(dir string) {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return
	}
	var mounts []string
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) > 4 && (strings.HasPrefix(f[4], dir+"/") || strings.HasSuffix(dir, "-") && strings.HasPrefix(f[4], dir)) {
			mounts = append(mounts, f[4])
		}
	}
	sort.Sort(sort.Reverse(sort.StringSlice(mounts)))
	for _, m := range mounts {
		_ = syscall.Unmount(m, syscall.MNT_DETACH)
	}
}

// Every iptables command here waits for the xtables lock (-w): without
// it a command fails at once while another process (Docker, kube-proxy
// --cleanup) holds the lock, and a rule stays behind (seen once in nine
// runs: CNI-FORWARD and its jump from FORWARD).

// removeCNIRules deletes the NAT rules the bridge plugin added for pods
// whose sandboxes were not torn down through CNI (Close kills them): the
// POSTROUTING jumps to CNI-* chains, by number from the last (a rule's
// spec has a quoted comment that iptables -S does not quote back), then
// the chains.
func removeCNIRules() {
	out, err := exec.Command("iptables", "-w", "-t", "nat", "-L", "POSTROUTING", "-n", "--line-numbers").Output()
	if err != nil {
		return
	}
	var nums []int
	for _, line := range strings.Split(string(out), "\n") {
		f := strings.Fields(line)
		if len(f) > 1 && strings.HasPrefix(f[1], "CNI-") {
			if n, err := strconv.Atoi(f[0]); err == nil {
				nums = append(nums, n)
			}
		}
	}
	sort.Sort(sort.Reverse(sort.IntSlice(nums)))
	for _, n := range nums {
		_ = exec.Command("iptables", "-w", "-t", "nat", "-D", "POSTROUTING", strconv.Itoa(n)).Run()
	}
	out, err = exec.Command("iptables", "-w", "-t", "nat", "-S").Output()
	if err != nil {
		return
	}
	for _, line := range strings.Split(string(out), "\n") {
		if f := strings.Fields(line); len(f) == 2 && f[0] == "-N" && strings.HasPrefix(f[1], "CNI-") {
			_ = exec.Command("iptables", "-w", "-t", "nat", "-F", f[1]).Run()
			_ = exec.Command("iptables", "-w", "-t", "nat", "-X", f[1]).Run()
		}
	}
}

// removeKubeletRules deletes the chains kubelet adds and kube-proxy
// --cleanup leaves: KUBE-FIREWALL (jumped to from INPUT and OUTPUT) and
// the KUBE-KUBELET-CANARY and KUBE-IPTABLES-HINT markers.
func removeKubeletRules() {
	// The CNI firewall plugin's, likewise left by killed sandboxes.
	_ = exec.Command("iptables", "-w", "-D", "FORWARD", "-m", "comment", "--comment", "CNI firewall plugin rules", "-j", "CNI-FORWARD").Run()
	for _, ch := range []string{"CNI-FORWARD", "CNI-ADMIN"} {
		_ = exec.Command("iptables", "-w", "-F", ch).Run()
	}
	for _, ch := range []string{"CNI-FORWARD", "CNI-ADMIN"} {
		_ = exec.Command("iptables", "-w", "-X", ch).Run()
	}
	// kubelet adds its chains for IPv6 too, where the host has it.
	for _, ipt := range []string{"iptables", "ip6tables"} {
		for _, hook := range []string{"INPUT", "OUTPUT"} {
			_ = exec.Command(ipt, "-w", "-D", hook, "-j", "KUBE-FIREWALL").Run()
		}
		for _, table := range []string{"filter", "nat", "mangle"} {
			for _, ch := range []string{"KUBE-FIREWALL", "KUBE-KUBELET-CANARY", "KUBE-IPTABLES-HINT"} {
				_ = exec.Command(ipt, "-w", "-t", table, "-F", ch).Run()
				_ = exec.Command(ipt, "-w", "-t", table, "-X", ch).Run()
			}
		}
	}
}

// hostIP is the address of the interface of the default route: reachable
// from the pods (unlike loopback), where the API server and CoreDNS listen.
func hostIP() (string, error) {
	// No packet is sent: a UDP "connection" only picks the source address.
	conn, err := net.Dial("udp", "192.0.2.255:9")
	if err != nil {
		conn, err = net.Dial("udp", "203.0.113.1:9")
	}
	if err != nil {
		return "", fmt.Errorf("host address: no default route: %w", err)
	}
	defer conn.Close()
	return conn.LocalAddr().(*net.UDPAddr).IP.String(), nil
}

func ready(url, caFile string) error {
	ca, err := os.ReadFile(caFile)
	if err != nil {
		return err
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(ca) {
		return errors.New("apiserver.crt: no certificate")
	}
	c := &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}}
	req, _ := http.NewRequest(http.MethodGet, url+"/readyz", nil)
	req.Header.Set("Authorization", "Bearer "+adminToken)
	resp, err := c.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("readyz: %s", resp.Status)
	}
	return nil
}

// waitFor polls check until it succeeds, ctx ends or timeout passes.
func waitFor(ctx context.Context, timeout time.Duration, what string, check func() error) error {
	deadline := time.Now().Add(timeout)
	for {
		err := check()
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s: not within %s: %w", what, timeout, err)
		}
		t := time.NewTimer(250 * time.Millisecond)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		}
	}
}

// containComment marks the rules containServices adds.
const containComment = "walship-realkube-contain"

// containRules are the filter rules that keep the Service range on this
// host. The filter table sees a packet after kube-proxy's DNAT (nat
// OUTPUT for the host's own connections, nat PREROUTING for pods'), so a
// connection to a Service that has an endpoint passes with the endpoint's
// address; one kube-proxy left untranslated (a Service with no endpoint
// for a moment, between two of its rule updates) would otherwise follow
// the default route off the machine: it is refused here instead.
var containRules = [][]string{
	{"OUTPUT", "-d", ServiceCIDR, "-m", "comment", "--comment", containComment, "-j", "REJECT"},
	{"FORWARD", "-d", ServiceCIDR, "-m", "comment", "--comment", containComment, "-j", "REJECT"},
}

// containServices inserts containRules first in their chains.
func containServices() error {
	for _, r := range containRules {
		args := append([]string{"-w", "-I", r[0], "1"}, r[1:]...)
		if out, err := exec.Command("iptables", args...).CombinedOutput(); err != nil {
			return fmt.Errorf("iptables %s: %v: %s", strings.Join(args, " "), err, out)
		}
	}
	return nil
}

// uncontainServices deletes every copy of containRules.
func uncontainServices() {
	for _, r := range containRules {
		for range 10 {
			if exec.Command("iptables", append([]string{"-w", "-D"}, r...)...).Run() != nil {
				break
			}
		}
	}
}

// ServicesContained reports whether every rule of containRules is in
// place (iptables -C), or which is missing.
func ServicesContained() error {
	for _, r := range containRules {
		if out, err := exec.Command("iptables", append([]string{"-w", "-C"}, r...)...).CombinedOutput(); err != nil {
			return fmt.Errorf("rule %q missing: %v: %s", strings.Join(r, " "), err, out)
		}
	}
	return nil
}
