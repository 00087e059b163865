package realkube

import (
	"context"
	"fmt"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/walship/walship/internal/check"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/credentials/insecure"
)

// serviceConn dials a Service of the dev deployment (serviceConnTo).
func serviceConn(t *testing.T, c *Cluster, ctx context.Context, svc string) *grpc.ClientConn {
	t.Helper()
	return serviceConnTo(t, c, ctx, devTarget, svc)
}

// serviceConnTo dials a Service's ClusterIP from the host, where
// kube-proxy's rules route it as they route a pod's connection, with the
// target's credentials. Reconnects are retried quickly: after a failover
// the Service has new endpoints within seconds.
func serviceConnTo(t *testing.T, c *Cluster, ctx context.Context, tg target, svc string) *grpc.ClientConn {
	t.Helper()
	return tracedServiceConn(t, c, ctx, tg, svc, nil)
}

// tracedServiceConn is serviceConnTo whose connects and calls tr records,
// if not nil.
func tracedServiceConn(t *testing.T, c *Cluster, ctx context.Context, tg target, svc string, tr *dialTrace) *grpc.ClientConn {
	t.Helper()
	ip := serviceIP(t, c, ctx, tg.ns, svc)
	creds := insecure.NewCredentials()
	opts := []grpc.DialOption{grpc.WithConnectParams(grpc.ConnectParams{
		Backoff:           backoff.Config{BaseDelay: 50 * time.Millisecond, Multiplier: 1.6, MaxDelay: 250 * time.Millisecond},
		MinConnectTimeout: time.Second,
	})}
	if tg.creds != nil {
		// The server's certificate names the Service, not its address.
		creds = tg.creds
		opts = append(opts, grpc.WithAuthority(svc+"."+tg.ns+".svc"))
	}
	if tr != nil {
		opts = append(opts, grpc.WithContextDialer(tr.dial), grpc.WithChainUnaryInterceptor(tr.intercept))
	}
	conn, err := grpc.NewClient(ip+":7401", append(opts, grpc.WithTransportCredentials(creds))...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

// primaryPod returns the pod labelled primary and its container's id.
func primaryPod(ctx context.Context, c *Cluster) (name, containerID string, err error) {
	out, err := c.KubectlOutput(ctx, nil, "-n", devNamespace, "get", "pods", "-l", "walship.io/role=primary",
		"-o", `jsonpath={range .items[*]}{.metadata.name} {.status.containerStatuses[0].containerID} {.status.conditions[?(@.type=="Ready")].status}{"\n"}{end}`)
	if err != nil {
		return "", "", err
	}
	// A killed primary's pod keeps its label until its restarted
	// container relabels it (in a crash loop, for tens of seconds), but it
	// is not Ready, so the Service does not route to it: only Ready pods
	// count.
	var ready [][]string
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		if f := strings.Fields(line); len(f) == 3 && f[2] == "True" {
			ready = append(ready, f)
		}
	}
	if len(ready) != 1 {
		return "", "", fmt.Errorf("Ready pods labelled primary among %q: %d, want one", out, len(ready))
	}
	return ready[0][0], ready[0][1], nil
}

// TestKillPrimaryContainer kills the primary container's process (kill -9,
// the pod and its network stay) under the checked workload (underLoad):
// another node takes the Lease and writes through walship-rw, nothing
// acknowledged is lost, and the killed container restarts in its pod and
// rejoins as a replica. With WALSHIP_REALKUBE_RUNS it does so that many
// times and logs the median from the kill to the first acknowledged write
// through walship-rw, with each run's timeline.
func TestKillPrimaryContainer(t *testing.T) {
	c := cluster(t)
	deployDev(t, c)
	defer dumpOnFailure(t, c)
	var recovered []time.Duration
	for i := range runs() {
		var pod string
		// Replicas do not contend within the holddown of an epoch change: a
		// kill right after one (a cluster just deployed) is answered by the
		// killed node coming back, not by a failover.
		if err := waitHolddown(context.Background(), c); err != nil {
			t.Fatal(err)
		}
		var killedAt int64
		var tl *timeline
		run := underLoad(t, c, "kill-primary", func(ctx context.Context, h *check.History) error {
			var cid string
			var err error
			if pod, cid, err = primaryPod(ctx, c); err != nil {
				return err
			}
			pid, err := c.ContainerPID(ctx, cid)
			if err != nil {
				return err
			}
			restarts, err := podField(ctx, c, pod, "{.status.containerStatuses[0].restartCount}")
			if err != nil {
				return err
			}
			if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
				return fmt.Errorf("kill -9 %d (%s): %w", pid, pod, err)
			}
			killedAt = h.Now()
			tl = startTimeline(ctx, c, time.Now().Add(-time.Duration(h.Now()-killedAt)))
			h.Note("kill -9 %s (pid %d)", pod, pid)
			// Until kubelet has seen the container die, the pod is still
			// Ready: wait for its restart, so that the next run does not
			// kill a primary while this node is still down (two faults).
			if err := waitFor(ctx, 5*time.Minute, pod+"'s container to restart", func() error {
				if n, err := podField(ctx, c, pod, "{.status.containerStatuses[0].restartCount}"); err != nil || n == restarts {
					return fmt.Errorf("restartCount %s (%v)", n, err)
				}
				return nil
			}); err != nil {
				return err
			}
			err = waitAllReady(ctx, c, 5*time.Minute)
			tl.nodeLogs(ctx, c)
			return err
		})
		rec := run.recoveredFrom(killedAt)
		recovered = append(recovered, rec)
		newPod, _, err := primaryPod(context.Background(), c)
		t.Logf("run %d: killed %s's container; primary now %s (%v); kill → first acknowledged write through walship-rw %v (%v from the disruption's start, finding the pod included)",
			i, pod, newPod, err, rec.Round(time.Millisecond), run.Recovered.Round(time.Millisecond))
		tl.add(tl.t0.Add(rec), "first acknowledged write through walship-rw after the kill")
		tl.merge(run.trace)
		tl.stop(t, fmt.Sprintf("run %d: kill -9 %s", i, pod))
	}
	summarize(t, "kill -9 of the primary → first acknowledged write through walship-rw", recovered)
}

// TestGracefulDeletePrimary deletes the primary's pod (kubectl delete pod,
// SIGTERM and the grace period) under the checked workload: the primary
// switches over to a replica before its container exits, nothing
// acknowledged is lost, and the StatefulSet's new pod rejoins as a replica.
func TestGracefulDeletePrimary(t *testing.T) {
	c := cluster(t)
	deployDev(t, c)
	defer dumpOnFailure(t, c)
	var gaps []time.Duration
	for i := range runs() {
		var pod string
		var tl *timeline
		run := underLoad(t, c, "delete-primary", func(ctx context.Context, h *check.History) error {
			var err error
			if pod, _, err = primaryPod(ctx, c); err != nil {
				return err
			}
			logs, err := followLogs(ctx, c, pod)
			if err != nil {
				return err
			}
			h.Note("kubectl delete pod %s", pod)
			tl = startTimeline(ctx, c, time.Now())
			if err := c.Kubectl(ctx, nil, "-n", devNamespace, "delete", "pod", pod, "--wait=false"); err != nil {
				return err
			}
			out, err := logs.wait(ctx, 2*time.Minute)
			if err != nil {
				return fmt.Errorf("%s's log: %w", pod, err)
			}
			if !strings.Contains(out, "switched over before stopping") {
				return fmt.Errorf("%s did not switch over before it stopped; its log since the delete:\n%s", pod, out)
			}
			for _, line := range strings.Split(out, "\n") {
				if strings.Contains(line, "switched over before stopping") {
					// Its "paused": how long it held writes for the hand-over,
					// the part of the client's gap that is walship's.
					t.Logf("%s: %s", pod, line)
				}
			}
			h.Note("%s switched over and exited", pod)
			err = waitAllReady(ctx, c, 5*time.Minute)
			tl.nodeLogs(ctx, c)
			return err
		})
		gaps = append(gaps, run.LongestGap)
		tl.merge(run.trace)
		tl.stop(t, fmt.Sprintf("run %d: delete %s", i, pod))
		newPod, _, err := primaryPod(context.Background(), c)
		if err != nil || newPod == pod {
			t.Fatalf("primary after %s was deleted: %q (%v), want another pod", pod, newPod, err)
		}
		t.Logf("run %d: deleted %s; primary now %s; longest gap %v", i, pod, newPod, run.LongestGap.Round(time.Millisecond))
	}
	summarize(t, "graceful delete of the primary's pod: the client's longest gap", gaps)
}

// failoverHolddown is WALSHIP_FAILOVER_HOLDDOWN of deploy/k8s/base/node.env.
const failoverHolddown = 5 * time.Second

// waitHolddown waits until the Lease has been held longer than the
// failover holddown (and a second more): every replica may contend again.
func waitHolddown(ctx context.Context, c *Cluster) error {
	return waitFor(ctx, time.Minute, "the failover holddown to pass", func() error {
		out, err := c.KubectlOutput(ctx, nil, "-n", devNamespace, "get", "lease", "walship", "-o", "jsonpath={.spec.acquireTime}")
		if err != nil {
			return err
		}
		at, err := time.Parse(time.RFC3339Nano, strings.TrimSpace(string(out)))
		if err != nil {
			return fmt.Errorf("lease acquireTime %q: %w", out, err)
		}
		if held := time.Since(at); held < failoverHolddown+time.Second {
			return fmt.Errorf("lease held for %v", held)
		}
		return nil
	})
}

// dumpOnFailure logs the cluster's state if t failed (deferred).
func dumpOnFailure(t *testing.T, c *Cluster) {
	if t.Failed() {
		dump(t, c)
	}
}
