package realkube

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	walshipv1 "github.com/walship/walship/gen/walship/v1"
	"github.com/walship/walship/internal/check"
)

const nodeSelector = "app.kubernetes.io/component=node"

// TestRolloutRestart restarts the data nodes' StatefulSet (kubectl rollout
// restart) under the checked workload: every pod is replaced, one at a time
// (never two data nodes unavailable at once), and nothing acknowledged is
// lost.
func TestRolloutRestart(t *testing.T) {
	c := cluster(t)
	deployDev(t, c)
	defer dumpOnFailure(t, c)
	var before, after map[string]string
	var down, notReady int
	underLoad(t, c, "rollout-restart", func(ctx context.Context, h *check.History) error {
		var err error
		if before, err = podUIDs(ctx, c, nodeSelector); err != nil {
			return err
		}
		watch := watchUnavailable(ctx, c, nodeSelector, len(before))
		if err := c.Kubectl(ctx, nil, "-n", devNamespace, "rollout", "restart", "statefulset/walship"); err != nil {
			return err
		}
		if err := c.Kubectl(ctx, nil, "-n", devNamespace, "rollout", "status", "statefulset/walship", "--timeout=10m"); err != nil {
			return err
		}
		err = waitAllReady(ctx, c, 5*time.Minute)
		down, notReady = watch.stop()
		if err != nil {
			return err
		}
		after, err = podUIDs(ctx, c, nodeSelector)
		return err
	})
	for pod, uid := range before {
		if after[pod] == uid {
			t.Errorf("%s was not replaced by the rollout", pod)
		}
	}
	if down > 1 {
		t.Errorf("%d data nodes were down at once during the rollout, want at most 1", down)
	}
	t.Logf("rollout restart: at most %d data node(s) down and %d not Ready at once", down, notReady)
}

// TestReplicaPodRecreated deletes a replica's pod under the checked
// workload: the StatefulSet's new pod mounts the same volume, starts from
// the same log (its WAL still begins where it began) and catches up to the
// primary's state digest.
func TestReplicaPodRecreated(t *testing.T) {
	c := cluster(t)
	deployDev(t, c)
	defer dumpOnFailure(t, c)
	var pod string
	var was *walshipv1.StatusResponse
	underLoad(t, c, "recreate-replica", func(ctx context.Context, h *check.History) error {
		replicas, err := podsWith(ctx, c, "walship.io/role=replica")
		if err != nil || len(replicas) == 0 {
			return fmt.Errorf("replicas: %v, %v", replicas, err)
		}
		pod = replicas[0]
		uid, _ := podField(ctx, c, pod, "{.metadata.uid}")
		pv, err := claimedVolume(ctx, c, "data-"+pod)
		if err != nil {
			return err
		}
		if was, err = walshipv1.NewAdminServiceClient(podConn(t, c, ctx, pod, "7401")).Status(ctx, &walshipv1.StatusRequest{}); err != nil {
			return err
		}
		h.Note("kubectl delete pod %s", pod)
		if err := c.Kubectl(ctx, nil, "-n", devNamespace, "delete", "pod", pod); err != nil {
			return err
		}
		if err := waitAllReady(ctx, c, 5*time.Minute); err != nil {
			return err
		}
		if now, _ := podField(ctx, c, pod, "{.metadata.uid}"); now == uid {
			return fmt.Errorf("%s was not recreated (uid %s)", pod, uid)
		}
		if now, err := claimedVolume(ctx, c, "data-"+pod); err != nil || now != pv {
			return fmt.Errorf("%s's volume: %q (%v), was %q", pod, now, err, pv)
		}
		return nil
	})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	replica := walshipv1.NewAdminServiceClient(podConn(t, c, ctx, pod, "7401"))
	primary := walshipv1.NewAdminServiceClient(serviceConn(t, c, ctx, "walship-rw"))
	var r, p *walshipv1.StatusResponse
	if err := waitFor(ctx, time.Minute, pod+" at the primary's state", func() error {
		var err error
		if p, err = primary.Status(ctx, &walshipv1.StatusRequest{}); err != nil {
			return err
		}
		if r, err = replica.Status(ctx, &walshipv1.StatusRequest{}); err != nil {
			return err
		}
		if r.GetVisibleLsn() != p.GetVisibleLsn() || r.GetStateDigest() != p.GetStateDigest() {
			return fmt.Errorf("%s at LSN %d digest %s; primary %s at %d digest %s", pod, r.GetVisibleLsn(), r.GetStateDigest(), p.GetId(), p.GetVisibleLsn(), p.GetStateDigest())
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if r.GetClusterId() != was.GetClusterId() || r.GetWalFirstLsn() != was.GetWalFirstLsn() || r.GetLastLsn() < was.GetLastLsn() {
		t.Fatalf("%s after it was recreated: cluster %s, WAL from LSN %d to %d; before: cluster %s, WAL from %d to %d (want the same volume's log, grown)",
			pod, r.GetClusterId(), r.GetWalFirstLsn(), r.GetLastLsn(), was.GetClusterId(), was.GetWalFirstLsn(), was.GetLastLsn())
	}
	t.Logf("%s recreated on its volume: WAL from LSN %d (as before), at LSN %d with the primary's digest %s", pod, r.GetWalFirstLsn(), r.GetVisibleLsn(), r.GetStateDigest())
}

// claimedVolume returns the PersistentVolume a claim is bound to.
func claimedVolume(ctx context.Context, c *Cluster, claim string) (string, error) {
	out, err := c.KubectlOutput(ctx, nil, "-n", devNamespace, "get", "pvc", claim, "-o", "jsonpath={.spec.volumeName}")
	return strings.TrimSpace(string(out)), err
}

// podUIDs returns the uid of each pod with a label selector, by name.
func podUIDs(ctx context.Context, c *Cluster, selector string) (map[string]string, error) {
	out, err := c.KubectlOutput(ctx, nil, "-n", devNamespace, "get", "pods", "-l", selector, "-o", `jsonpath={range .items[*]}{.metadata.name} {.metadata.uid}{"\n"}{end}`)
	if err != nil {
		return nil, err
	}
	m := map[string]string{}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		if f := strings.Fields(line); len(f) == 2 {
			m[f[0]] = f[1]
		}
	}
	return m, nil
}

// unavailableWatch polls a StatefulSet's pods: how many are down at once
// (missing, terminating, or their container not started: the members being
// replaced) and how many not Ready at once (down, or up but not in their
// Service yet, such as a replica reconnecting after a switchover).
type unavailableWatch struct {
	stopWatch      context.CancelFunc
	wg             sync.WaitGroup
	down, notReady int
}

func watchUnavailable(ctx context.Context, c *Cluster, selector string, want int) *unavailableWatch {
	ctx, cancel := context.WithCancel(ctx)
	w := &unavailableWatch{stopWatch: cancel}
	w.wg.Add(1)
	go func() {
		defer w.wg.Done()
		for ctx.Err() == nil {
			out, err := c.KubectlOutput(ctx, nil, "-n", devNamespace, "get", "pods", "-l", selector, "-o",
				`jsonpath={range .items[*]}{.metadata.name}|{.metadata.deletionTimestamp}|{.status.containerStatuses[0].started}|{.status.conditions[?(@.type=="Ready")].status}{"\n"}{end}`)
			if err == nil {
				up, ready := 0, 0
				for _, line := range strings.Split(string(out), "\n") {
					f := strings.Split(line, "|")
					if len(f) != 4 || f[1] != "" || f[2] != "true" {
						continue
					}
					up++
					if f[3] == "True" {
						ready++
					}
				}
				w.down, w.notReady = max(w.down, want-up), max(w.notReady, want-ready)
			}
			t := time.NewTimer(200 * time.Millisecond)
			select {
			case <-t.C:
			case <-ctx.Done():
				t.Stop()
			}
		}
	}()
	return w
}

// stop ends the watch and returns the most pods down and not Ready at once.
func (w *unavailableWatch) stop() (down, notReady int) {
	w.stopWatch()
	w.wg.Wait()
	return w.down, w.notReady
}
