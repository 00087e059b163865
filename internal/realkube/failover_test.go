package realkube

import (
	"context"
	"fmt"
	"strings"
	"syscall"
	"testing"
	"time"

	walshipv1 "github.com/walship/walship/gen/walship/v1"
	"github.com/walship/walship/internal/check"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/credentials/insecure"
)

// serviceConn dials a Service's ClusterIP from the host, where kube-proxy's
// rules route it as they route a pod's connection. Reconnects are retried
// quickly: after a failover the Service has new endpoints within seconds.
func serviceConn(t *testing.T, c *Cluster, ctx context.Context, svc string) *grpc.ClientConn {
	t.Helper()
	ip, err := c.KubectlOutput(ctx, nil, "-n", devNamespace, "get", "service", svc, "-o", "jsonpath={.spec.clusterIP}")
	if err != nil {
		t.Fatal(err)
	}
	conn, err := grpc.NewClient(string(ip)+":7401",
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithConnectParams(grpc.ConnectParams{
			Backoff:           backoff.Config{BaseDelay: 50 * time.Millisecond, Multiplier: 1.6, MaxDelay: 250 * time.Millisecond},
			MinConnectTimeout: time.Second,
		}))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

// primaryPod returns the pod labelled primary and its container's id.
func primaryPod(ctx context.Context, c *Cluster) (name, containerID string, err error) {
	out, err := c.KubectlOutput(ctx, nil, "-n", devNamespace, "get", "pods", "-l", "walship.io/role=primary",
		"-o", `jsonpath={range .items[*]}{.metadata.name} {.status.containerStatuses[0].containerID}{"\n"}{end}`)
	if err != nil {
		return "", "", err
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	if len(lines) != 1 || len(strings.Fields(lines[0])) != 2 {
		return "", "", fmt.Errorf("pods labelled primary: %q, want one", out)
	}
	f := strings.Fields(lines[0])
	return f[0], f[1], nil
}

// TestKillPrimaryContainer kills the primary container's process (kill -9,
// the pod and its network stay) under a workload through walship-rw, reads
// through walship-ro, and checks that another node takes the Lease and
// writes through the Service, that the history is linearizable and that
// every acknowledged write is there afterwards.
func TestKillPrimaryContainer(t *testing.T) {
	c := cluster(t)
	deployDev(t, c)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	defer func() {
		if t.Failed() {
			dump(t, c)
		}
	}()
	rw := serviceConn(t, c, ctx, "walship-rw")
	ro := serviceConn(t, c, ctx, "walship-ro")
	st, err := walshipv1.NewAdminServiceClient(rw).Status(ctx, &walshipv1.StatusRequest{}, grpc.WaitForReady(true))
	if err != nil {
		t.Fatalf("status through walship-rw: %v", err)
	}
	w := check.Workload{
		Primary: walshipv1.NewKVServiceClient(rw), Replica: walshipv1.NewKVServiceClient(ro),
		Prefix: fmt.Sprintf("realkube-kill-%d/", time.Now().UnixNano()), Concurrency: 4, Rate: 100,
		Defaults: st.DefaultPolicy, Crashes: true,
	}
	h := check.NewHistory()
	done := make(chan error, 1)
	go func() {
		_, _, err := w.Run(ctx, 40*time.Second, h)
		done <- err
	}()
	// Let the workload run on the first primary: wait for writes in h.
	if err := waitFor(ctx, time.Minute, "first writes", func() error {
		if len(h.Ops()) < 50 {
			return fmt.Errorf("%d operations", len(h.Ops()))
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	pod, cid, err := primaryPod(ctx, c)
	if err != nil {
		t.Fatal(err)
	}
	pid, err := c.ContainerPID(ctx, cid)
	if err != nil {
		t.Fatal(err)
	}
	killedAt := time.Now()
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatalf("kill -9 %d (%s): %v", pid, pod, err)
	}
	h.Note("kill -9 %s (pid %d)", pod, pid)
	kv := walshipv1.NewKVServiceClient(rw)
	probe := w.Prefix + "after-kill"
	if err := waitFor(ctx, 2*time.Minute, "a write through walship-rw after the kill", func() error {
		pctx, pcancel := context.WithTimeout(ctx, 2*time.Second)
		defer pcancel()
		_, err := kv.Put(pctx, &walshipv1.PutRequest{Key: probe, Value: []byte("x")})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	took := time.Since(killedAt)
	newPod, _, _ := primaryPod(ctx, c)
	t.Logf("kill -9 of %s's container → first acknowledged write through walship-rw: %v (new primary %s)", pod, took.Round(time.Millisecond), newPod)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if err := w.ReadBack(ctx, h); err != nil {
		t.Fatal(err)
	}
	res := check.Check(h, 5*time.Minute)
	t.Logf("%s", res)
	if !res.OK() {
		t.Fatalf("not linearizable: %v", res.Violations())
	}
	// The killed container restarts in its pod and rejoins as a replica.
	if err := waitAllReady(ctx, c, 5*time.Minute); err != nil {
		t.Fatal(err)
	}
}
