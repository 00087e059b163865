package deploytest

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/walship/walship/internal/testkit"
	corev1 "k8s.io/api/core/v1"
)

// Timing overrides appended to the dev overlay's arguments (explicit
// flags win over the ConfigMap's environment), so the test sees a cut-off
// replica and a failed sync commit in seconds rather than the defaults.
// Automatic failover is off (--kube-lease=): Docker has no API server.
const (
	testHeartbeat   = "200ms"
	testSyncTimeout = 2 * time.Second
)

// grpcurlPath returns grpcurl: $WALSHIP_GRPCURL, bin/grpcurl (make tools),
// one on PATH, or one built from the version pinned in tools/go.mod.
func grpcurlPath(t *testing.T) string {
	t.Helper()
	root := repoRoot(t)
	candidates := []string{os.Getenv("WALSHIP_GRPCURL"), filepath.Join(root, "bin", "grpcurl")}
	if p, err := exec.LookPath("grpcurl"); err == nil {
		candidates = append(candidates, p)
	}
	for _, p := range candidates {
		if p == "" {
			continue
		}
		if fi, err := os.Stat(p); err == nil && !fi.IsDir() {
			return p
		}
	}
	p := filepath.Join(t.TempDir(), "grpcurl")
	cmd := exec.Command("go", "build", "-modfile", filepath.Join(root, "tools", "go.mod"), "-o", p, "github.com/fullstorydev/grpcurl/cmd/grpcurl")
	cmd.Dir = root
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("build grpcurl: %v\n%s", err, out)
	}
	return p
}

// dockerCluster is the dev overlay run as Docker containers on one network.
type dockerCluster struct {
	t         *testing.T
	r         *testkit.DockerRun
	image     string
	network   string
	namespace string // the overlay's, in the longer aliases
	grpcurl   string
	pods      map[string]*container // by pod name
	primary   *container
	replicas  []*container
}

// container is one pod of the overlay as a Docker container.
type container struct {
	pod      string   // StatefulSet pod name, e.g. walship-1
	name     string   // Docker container name
	aliases  []string // <pod>.<headless service>[.<namespace>.svc]: the names peers use
	grpcPort int32
	addr     string // published gRPC address on the host (loopback)
}

func (d *dockerCluster) mustDocker(args ...string) string {
	d.t.Helper()
	return d.r.Must(args...)
}

// TestDockerCluster builds the scratch image and runs the dev overlay's
// pods as containers (same arguments and environment, resolved from the
// kustomize build, peers reaching each other by their Kubernetes DNS names
// as network aliases), then drives it from the host with grpcurl: writes
// and reads, a killed replica, a replica cut off the network. The data
// nodes run without --kube-lease and --leave-on-scale-down, the log stores
// without --leave-on-scale-down (no API server here): walship-0, the
// --initial-primary, bootstraps the cluster and stays its primary.
func TestDockerCluster(t *testing.T) {
	if testing.Short() {
		t.Skip("skipping the Docker cluster test in -short mode")
	}
	testkit.NeedDocker(t)
	start := time.Now()
	d := &dockerCluster{t: t, r: testkit.NewDockerRun(t), grpcurl: grpcurlPath(t), pods: map[string]*container{}}
	t.Cleanup(func() {
		if t.Failed() {
			for _, name := range sortedKeys(d.pods) {
				c := d.pods[name]
				t.Logf("--- docker logs %s (%s) ---\n%s", c.name, c.pod, testkit.DockerLogs(c.name, 60))
			}
		}
	})

	// The image, FROM scratch around a static binary.
	d.image = d.r.Image()
	if user := d.mustDocker("image", "inspect", "--format", "{{.Config.User}}", d.image); user != "65532:65532" {
		t.Errorf("image user %q, want 65532:65532", user)
	}
	t.Logf("image %s built in %v", d.image, time.Since(start).Round(time.Millisecond))

	d.network = d.r.Network("deploytest")

	// The dev overlay's pods, in the order Kubernetes would make them ready.
	o := buildOverlay(t, overlayDirs(t)["dev"])
	c := &checker{o: o, namespace: overlayWants["dev"].namespace}
	d.namespace = c.namespace
	var initial string
	for _, stsName := range []string{"walship-logstore", "walship"} {
		sts := o.statefulSets[stsName]
		for ord := int32(0); ord < ptrOr(sts.Spec.Replicas, 1); ord++ {
			p, err := c.podConfig(sts, ord)
			if err != nil {
				t.Fatal(err)
			}
			if p.command == "node" {
				initial = p.flag("initial-primary")
			}
			d.startPod(p)
		}
	}
	for _, name := range sortedKeys(d.pods) {
		d.waitServing(d.pods[name], time.Minute)
	}
	t.Logf("cluster of %d containers serving after %v", len(d.pods), time.Since(start).Round(time.Millisecond))
	primary := d.pods[initial]
	var replicas []*container
	for _, name := range sortedKeys(d.pods) {
		if cn := d.pods[name]; strings.HasPrefix(name, "walship-") && !strings.HasPrefix(name, "walship-logstore-") && cn != primary {
			replicas = append(replicas, cn)
		}
	}
	if primary == nil || len(replicas) != 2 {
		t.Fatalf("the dev overlay has no --initial-primary pod %q and two other data nodes: %v", initial, sortedKeys(d.pods))
	}
	d.primary, d.replicas = primary, replicas
	r0, r1 := replicas[0], replicas[1]
	if s, err := d.status(primary); err != nil || s.Role != "ROLE_PRIMARY" {
		t.Fatalf("%s (--initial-primary) is not the primary: %+v, %v", primary.pod, s, err)
	}

	// A write through the primary, read back on each replica with min_lsn.
	lsn := d.put(primary, "greeting", "hello", "")
	for _, r := range []*container{r0, r1} {
		if v := d.get(r, "greeting", lsn); v != "hello" {
			t.Fatalf("Get greeting on %s with min_lsn %d: %q", r.pod, lsn, v)
		}
	}
	d.put(primary, "both", "acked", syncPolicy(2))
	d.waitConverged(30 * time.Second)
	phase := time.Now()

	// A replica killed: writes go on (sync K=1 through the other), and the
	// restarted replica recovers its WAL and catches up.
	d.mustDocker("kill", r1.name)
	for i := range 20 {
		d.put(primary, fmt.Sprintf("while-killed-%d", i), "v", "")
	}
	d.put(primary, "k1-while-killed", "v", syncPolicy(1))
	d.mustDocker("start", r1.name)
	d.publishedAddr(r1)
	d.waitServing(r1, time.Minute)
	last := d.put(primary, "after-restart", "v", "")
	if v := d.get(r1, "after-restart", last); v != "v" {
		t.Errorf("restarted %s: Get after-restart = %q", r1.pod, v)
	}
	d.waitConverged(time.Minute)
	t.Logf("kill/restart of %s: converged after %v", r1.pod, time.Since(phase).Round(time.Millisecond))
	phase = time.Now()

	// A replica cut off the network while it keeps running: async writes
	// go on, sync K=1 of 2 succeeds, sync K=2 fails with UNAVAILABLE after
	// the sync timeout.
	d.mustDocker("network", "disconnect", d.network, r0.name)
	for i := range 20 {
		d.put(primary, fmt.Sprintf("while-cut-%d", i), "v", "")
	}
	d.put(primary, "k1-while-cut", "v", syncPolicy(1))
	t0 := time.Now()
	out, err := d.call(primary, "walship.v1.KVService/Put", putBody("k2-while-cut", "v", syncPolicy(2)))
	took := time.Since(t0)
	if err == nil || !strings.Contains(out, "Unavailable") {
		t.Errorf("sync K=2 Put with a replica cut off: want Unavailable, got err=%v\n%s", err, out)
	}
	if took < testSyncTimeout || took > testSyncTimeout+15*time.Second {
		t.Errorf("sync K=2 Put failed after %v, want about the sync timeout (%v)", took, testSyncTimeout)
	}
	t.Logf("sync K=2 with %s cut off: %q after %v", r0.pod, strings.TrimSpace(out), took.Round(time.Millisecond))
	// How long the primary goes on listing the cut-off replica as
	// connected (a silently dropped connection has no end of stream): for
	// the report and the WalshipReplicaDisconnected alert, not a pass/fail.
	if seen, ok := d.peerDisconnected(primary, r0.pod, 10*time.Second); ok {
		t.Logf("primary reported %s disconnected %v after the cut", r0.pod, seen.Sub(t0.Add(-took)).Round(time.Millisecond))
	} else {
		t.Logf("primary still reported %s connected 10s after the K=2 failure (%v after the cut)", r0.pod, time.Since(t0.Add(-took)).Round(time.Millisecond))
	}

	reconnect := []string{"network", "connect"}
	for _, a := range r0.aliases {
		reconnect = append(reconnect, "--alias", a)
	}
	d.mustDocker(append(reconnect, d.network, r0.name)...)
	d.publishedAddr(r0)
	d.waitServing(r0, time.Minute)
	d.waitConverged(time.Minute)
	// Both replicas stream again: a sync K=2 commit succeeds.
	d.waitFor(30*time.Second, "a sync K=2 commit after reconnecting", func() (bool, string) {
		out, err := d.call(primary, "walship.v1.KVService/Put", putBody("k2-after-reconnect", "v", syncPolicy(2)))
		return err == nil, out
	})
	d.waitConverged(30 * time.Second)
	var ps struct {
		Peers []struct {
			ID        string `json:"id"`
			Connected bool   `json:"connected"`
			Applied   string `json:"appliedLsn"`
		} `json:"peers"`
	}
	d.mustCall(primary, "walship.v1.AdminService/Status", "", &ps)
	t.Logf("primary's peers after reconnecting: %+v", ps.Peers)
	t.Logf("disconnect/reconnect of %s: converged after %v; whole test %v", r0.pod, time.Since(phase).Round(time.Millisecond), time.Since(start).Round(time.Millisecond))
}

// startPod runs pod p as a container with the pod's arguments and resolved
// environment, the restricted security context (read-only root, no
// capabilities, non-root user), its memory limit, and a volume for /data.
func (d *dockerCluster) startPod(p *pod) {
	d.t.Helper()
	c := &container{
		pod:      p.name,
		name:     p.name + "-" + d.r.ID,
		aliases:  []string{p.name + "." + p.sts.Spec.ServiceName, p.name + "." + p.sts.Spec.ServiceName + "." + d.namespace + ".svc"},
		grpcPort: mustPort(p.container, "grpc"),
	}
	labels := d.r.Labels()
	vol := c.name + "-data"
	d.mustDocker(append(append([]string{"volume", "create"}, labels...), vol)...)
	args := []string{"run", "-d", "--name", c.name, "--hostname", p.name, "--network", d.network}
	for _, a := range c.aliases {
		args = append(args, "--network-alias", a)
	}
	args = append(append(args,
		"--read-only", "--cap-drop", "ALL", "--security-opt", "no-new-privileges",
		"--user", "65532:65532",
		"-v", vol+":/data",
		"-p", fmt.Sprintf("127.0.0.1::%d", c.grpcPort),
	), labels...)
	if lim, ok := p.container.Resources.Limits[corev1.ResourceMemory]; ok {
		args = append(args, "--memory", strconv.FormatInt(lim.Value(), 10))
	}
	for _, k := range sortedKeys(p.env) {
		args = append(args, "-e", k+"="+p.env[k])
	}
	args = append(append(args, d.image), p.args...)
	if p.command == "node" {
		// No API server: no Lease, and no StatefulSet to read on a stop.
		args = append(args, "--heartbeat-interval="+testHeartbeat, "--sync-timeout="+testSyncTimeout.String(), "--kube-lease=", "--leave-on-scale-down=false")
	}
	if p.command == "logstore" {
		// No StatefulSet to read on a stop either (--join stays: the
		// bootstrap contract names them, and they ask nothing).
		args = append(args, "--leave-on-scale-down=false")
	}
	d.pods[p.name] = c // before run: cleanup and logs find it even if run fails
	d.mustDocker(args...)
	d.publishedAddr(c)
}

// publishedAddr finds the host address of c's gRPC port (it changes when
// the container restarts).
func (d *dockerCluster) publishedAddr(c *container) {
	d.t.Helper()
	out := d.mustDocker("port", c.name, fmt.Sprintf("%d/tcp", c.grpcPort))
	for _, line := range strings.Split(out, "\n") {
		if strings.HasPrefix(line, "127.0.0.1:") {
			c.addr = strings.TrimSpace(line)
			return
		}
	}
	d.t.Fatalf("docker port %s %d: no loopback binding in %q", c.name, c.grpcPort, out)
}

// call runs grpcurl against c; err is non-nil when grpcurl fails (the
// output then holds the gRPC status).
func (d *dockerCluster) call(c *container, method, body string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	args := []string{"-plaintext", "-max-time", "20"}
	if body != "" {
		args = append(args, "-d", body)
	}
	args = append(args, c.addr, method)
	out, err := exec.CommandContext(ctx, d.grpcurl, args...).CombinedOutput()
	return string(out), err
}

func (d *dockerCluster) mustCall(c *container, method, body string, into any) {
	d.t.Helper()
	out, err := d.call(c, method, body)
	if err != nil {
		d.t.Fatalf("grpcurl %s %s %s: %v\n%s", c.pod, method, body, err, out)
	}
	if into != nil {
		if err := json.Unmarshal([]byte(out), into); err != nil {
			d.t.Fatalf("grpcurl %s %s: output %q: %v", c.pod, method, out, err)
		}
	}
}

func syncPolicy(k int) string {
	return fmt.Sprintf(`{"replication":"REPLICATION_MODE_SYNC","sync_replicas":%d,"sync_level":"SYNC_LEVEL_APPLY"}`, k)
}

func putBody(key, value, policy string) string {
	b := fmt.Sprintf(`{"key":%q,"value":%q`, key, base64.StdEncoding.EncodeToString([]byte(value)))
	if policy != "" {
		b += `,"policy":` + policy
	}
	return b + "}"
}

// put writes key=value through c and returns the commit LSN.
func (d *dockerCluster) put(c *container, key, value, policy string) uint64 {
	d.t.Helper()
	var resp struct {
		Lsn string `json:"lsn"`
	}
	d.mustCall(c, "walship.v1.KVService/Put", putBody(key, value, policy), &resp)
	lsn, err := strconv.ParseUint(resp.Lsn, 10, 64)
	if err != nil || lsn == 0 {
		d.t.Fatalf("Put %s: lsn %q", key, resp.Lsn)
	}
	return lsn
}

// get reads key on c once minLSN is visible there.
func (d *dockerCluster) get(c *container, key string, minLSN uint64) string {
	d.t.Helper()
	var resp struct {
		Found bool   `json:"found"`
		Value string `json:"value"`
	}
	d.mustCall(c, "walship.v1.KVService/Get", fmt.Sprintf(`{"key":%q,"min_lsn":"%d","wait_timeout":"10s"}`, key, minLSN), &resp)
	if !resp.Found {
		return ""
	}
	v, err := base64.StdEncoding.DecodeString(resp.Value)
	if err != nil {
		d.t.Fatalf("Get %s: value %q: %v", key, resp.Value, err)
	}
	return string(v)
}

type status struct {
	Role        string `json:"role"`
	VisibleLsn  string `json:"visibleLsn"`
	StateDigest string `json:"stateDigest"`
}

func (d *dockerCluster) status(c *container) (status, error) {
	var s status
	out, err := d.call(c, "walship.v1.AdminService/Status", "")
	if err != nil {
		return s, fmt.Errorf("%v: %s", err, out)
	}
	return s, json.Unmarshal([]byte(out), &s)
}

// peerDisconnected polls the primary's Status until it lists replica id
// as not connected, for at most timeout; it reports when it saw that.
func (d *dockerCluster) peerDisconnected(c *container, id string, timeout time.Duration) (time.Time, bool) {
	deadline := time.Now().Add(timeout)
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for time.Now().Before(deadline) {
		out, err := d.call(c, "walship.v1.AdminService/Status", "")
		var s struct {
			Peers []struct {
				ID        string `json:"id"`
				Connected bool   `json:"connected"`
			} `json:"peers"`
		}
		if err == nil && json.Unmarshal([]byte(out), &s) == nil {
			for _, p := range s.Peers {
				if p.ID == id && !p.Connected {
					return time.Now(), true
				}
			}
		}
		<-tick.C
	}
	return time.Time{}, false
}

// waitServing waits until c's gRPC health check reports SERVING.
func (d *dockerCluster) waitServing(c *container, timeout time.Duration) {
	d.t.Helper()
	d.waitFor(timeout, c.pod+" SERVING", func() (bool, string) {
		out, err := d.call(c, "grpc.health.v1.Health/Check", "")
		return err == nil && strings.Contains(out, `"SERVING"`), out
	})
}

// waitConverged waits until every replica reports the primary's
// visible_lsn and state_digest.
func (d *dockerCluster) waitConverged(timeout time.Duration) {
	d.t.Helper()
	d.waitFor(timeout, "replicas converged on the primary's state", func() (bool, string) {
		p, err := d.status(d.primary)
		if err != nil {
			return false, "primary: " + err.Error()
		}
		detail := fmt.Sprintf("primary visible_lsn %s digest %s", p.VisibleLsn, p.StateDigest)
		ok := p.StateDigest != ""
		for _, rc := range d.replicas {
			r, err := d.status(rc)
			if err != nil {
				return false, rc.pod + ": " + err.Error()
			}
			detail += fmt.Sprintf("; %s visible_lsn %s digest %s", rc.pod, r.VisibleLsn, r.StateDigest)
			ok = ok && r.VisibleLsn == p.VisibleLsn && r.StateDigest == p.StateDigest
		}
		return ok, detail
	})
}

// waitFor polls cond until it holds or timeout passes, then fails the test
// with cond's last detail. The cluster is other processes: there is nothing
// to be notified by, so it polls, with a deadline.
func (d *dockerCluster) waitFor(timeout time.Duration, what string, cond func() (bool, string)) {
	d.t.Helper()
	deadline := time.Now().Add(timeout)
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		ok, detail := cond()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			d.t.Fatalf("waiting for %s: not after %v: %s", what, timeout, detail)
		}
		<-tick.C
	}
}
