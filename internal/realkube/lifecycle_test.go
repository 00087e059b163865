package realkube

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	walshipv1 "github.com/walship/walship/gen/walship/v1"
	"github.com/walship/walship/internal/check"
	"google.golang.org/protobuf/proto"
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
	var gaps []time.Duration
	for i := range runs() {
		var before, after map[string]string
		var down, notReady int
		var tl *timeline
		run := underLoad(t, c, "rollout-restart", func(ctx context.Context, h *check.History) error {
			var err error
			if before, err = podUIDs(ctx, c, nodeSelector); err != nil {
				return err
			}
			watch := watchUnavailable(ctx, c, nodeSelector, len(before))
			tl = startTimeline(ctx, c, time.Now())
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
			tl.nodeLogs(ctx, c)
			after, err = podUIDs(ctx, c, nodeSelector)
			return err
		})
		gaps = append(gaps, run.LongestGap)
		tl.merge(run.trace)
		tl.stop(t, fmt.Sprintf("run %d: rollout restart", i))
		for pod, uid := range before {
			if after[pod] == uid {
				t.Errorf("run %d: %s was not replaced by the rollout", i, pod)
			}
		}
		if down > 1 {
			t.Errorf("run %d: %d data nodes were down at once during the rollout, want at most 1", i, down)
		}
		t.Logf("run %d: rollout restart: at most %d data node(s) down and %d not Ready at once; longest gap %v",
			i, down, notReady, run.LongestGap.Round(time.Millisecond))
	}
	summarize(t, "rollout restart of the data nodes: the client's longest gap", gaps)
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

// TestLogStoreEmptyVolume replaces a log store's pod and its claim under
// the checked workload, as when its disk is lost: the new pod gets a new,
// empty volume and refills from its peers until it holds the same log as
// they do.
func TestLogStoreEmptyVolume(t *testing.T) {
	c := cluster(t)
	deployDev(t, c)
	defer dumpOnFailure(t, c)
	const pod, claim = "walship-logstore-1", "data-walship-logstore-1"
	var oldPV, newPV string
	underLoad(t, c, "empty-logstore", func(ctx context.Context, h *check.History) error {
		var err error
		if oldPV, err = claimedVolume(ctx, c, claim); err != nil {
			return err
		}
		oldClaim, err := c.KubectlOutput(ctx, nil, "-n", devNamespace, "get", "pvc", claim, "-o", "jsonpath={.metadata.uid}")
		if err != nil {
			return err
		}
		// The new disk, for the StatefulSet's new claim to bind.
		if _, err := c.CreateLocalPV(ctx, fmt.Sprintf("realkube-pv-empty-%d", time.Now().UnixNano()), "1Gi"); err != nil {
			return err
		}
		h.Note("kubectl delete pvc,pod %s", pod)
		if err := c.Kubectl(ctx, nil, "-n", devNamespace, "delete", "pvc", claim, "--wait=false"); err != nil {
			return err
		}
		if err := c.Kubectl(ctx, nil, "-n", devNamespace, "delete", "pod", pod); err != nil {
			return err
		}
		// The StatefulSet may recreate the pod before the old claim is
		// gone: that pod stays Pending on a claim being deleted, and keeps
		// it from being deleted. Deleting the pod again ends it (RUNBOOK).
		var lastDelete time.Time
		if err := waitFor(ctx, 3*time.Minute, "a new claim "+claim, func() error {
			uid, err := c.KubectlOutput(ctx, nil, "-n", devNamespace, "get", "pvc", claim, "-o", "jsonpath={.metadata.uid} {.metadata.deletionTimestamp}")
			if err == nil && len(strings.Fields(string(uid))) == 1 && string(uid) != string(oldClaim) {
				return nil
			}
			if phase, _ := podField(ctx, c, pod, "{.status.phase}"); phase == "Pending" && time.Since(lastDelete) > 10*time.Second {
				lastDelete = time.Now()
				h.Note("kubectl delete pod %s (Pending on the old claim)", pod)
				_ = c.Kubectl(ctx, nil, "-n", devNamespace, "delete", "pod", pod, "--wait=false")
			}
			return fmt.Errorf("claim %q, %v", uid, err)
		}); err != nil {
			return err
		}
		if err := waitAllReady(ctx, c, 5*time.Minute); err != nil {
			return err
		}
		if newPV, err = claimedVolume(ctx, c, claim); err != nil || newPV == oldPV {
			return fmt.Errorf("%s's volume after the replacement: %q (%v), was %q", pod, newPV, err, oldPV)
		}
		return nil
	})
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	refilled := walshipv1.NewLogStoreServiceClient(podConn(t, c, ctx, pod, "7400"))
	peer := walshipv1.NewLogStoreServiceClient(podConn(t, c, ctx, "walship-logstore-0", "7400"))
	var got, want *walshipv1.VerifyResponse
	if err := waitFor(ctx, 2*time.Minute, pod+" holding its peer's log", func() error {
		st, err := refilled.Status(ctx, &walshipv1.LogStoreServiceStatusRequest{})
		if err != nil {
			return err
		}
		if st.GetRefilling() {
			return fmt.Errorf("%s still refilling", pod)
		}
		if got, err = refilled.Verify(ctx, &walshipv1.VerifyRequest{}); err != nil {
			return err
		}
		if want, err = peer.Verify(ctx, &walshipv1.VerifyRequest{}); err != nil {
			return err
		}
		if got.GetFirstLsn() != want.GetFirstLsn() || got.GetLastLsn() != want.GetLastLsn() {
			return fmt.Errorf("%s holds LSNs %d-%d, walship-logstore-0 %d-%d", pod, got.GetFirstLsn(), got.GetLastLsn(), want.GetFirstLsn(), want.GetLastLsn())
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if len(got.GetProblems()) > 0 || !historiesEqual(got.GetHistory(), want.GetHistory()) {
		t.Fatalf("%s after its refill: problems %v, epoch history %v; walship-logstore-0's %v", pod, got.GetProblems(), got.GetHistory(), want.GetHistory())
	}
	t.Logf("%s on a new empty volume (%s, was %s) refilled: LSNs %d-%d in %d batches, as walship-logstore-0", pod, newPV, oldPV, got.GetFirstLsn(), got.GetLastLsn(), got.GetBatches())
}

func historiesEqual(a, b []*walshipv1.EpochStart) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if !proto.Equal(a[i], b[i]) {
			return false
		}
	}
	return true
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

// membership is the primary's membership (ListMembers through walship-rw,
// within 5 s).
func membership(ctx context.Context, admin walshipv1.AdminServiceClient) (*walshipv1.MembershipStatus, error) {
	cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	resp, err := admin.ListMembers(cctx, &walshipv1.ListMembersRequest{})
	return resp.GetMembership(), err
}

// logStoresOf is the primary's contract's log stores (ListMembers through
// walship-rw) once no change is in progress; an error otherwise.
func logStoresOf(ctx context.Context, admin walshipv1.AdminServiceClient) ([]string, error) {
	m, err := membership(ctx, admin)
	if err != nil {
		return nil, err
	}
	if m.GetChange() != "" || m.GetJoint() || len(m.GetContract().GetLogstoreLearners()) > 0 {
		return nil, fmt.Errorf("a change in progress: %s (log stores %v)", m.GetChange(), m.GetContract().GetLogstores())
	}
	return slices.Sorted(slices.Values(m.GetContract().GetLogstores())), nil
}

// scaling is a StatefulSet scaled up and back under the checked workload.
type scaling struct {
	name, set  string                                                                // the workload's name; the StatefulSet
	what       string                                                                // what the primary's contract names ("log stores")
	from, to   int                                                                   // replicas before (and after), and at the top
	pvPrefix   string                                                                // the local volumes the extra pods claim
	pod        func(i int) string                                                    // the pod of ordinal i
	named      func(i int) string                                                    // how the contract names ordinal i
	contracted func(context.Context, walshipv1.AdminServiceClient) ([]string, error) // what the contract names, sorted
}

// scaleUnderLoad scales sc.set from sc.from to sc.to and back with
// kubectl scale alone, under the checked workload through walship-rw,
// waiting each time for the primary's contract to name exactly the pods
// the StatefulSet keeps, then for the scaled-away pods to stop and every
// pod to be Ready; it deletes the scaled-away pods' claims (as the
// RUNBOOK says) and returns how long the contract took each way.
func scaleUnderLoad(t *testing.T, sc scaling) (grew, shrank time.Duration) {
	c := cluster(t)
	deployDev(t, c)
	defer dumpOnFailure(t, c)
	want := func(n int) []string {
		var out []string
		for i := range n {
			out = append(out, sc.named(i))
		}
		return slices.Sorted(slices.Values(out))
	}
	var extraPods, extraClaims []string
	for i := sc.from; i < sc.to; i++ {
		extraPods = append(extraPods, "pod/"+sc.pod(i))
		extraClaims = append(extraClaims, "data-"+sc.pod(i))
	}
	underLoad(t, c, sc.name, func(ctx context.Context, h *check.History) error {
		admin := walshipv1.NewAdminServiceClient(serviceConn(t, c, ctx, "walship-rw"))
		if got, err := sc.contracted(ctx, admin); err != nil || !slices.Equal(got, want(sc.from)) {
			return fmt.Errorf("%s before: %v (%v), want %v", sc.what, got, err, want(sc.from))
		}
		for i := sc.from; i < sc.to; i++ {
			if _, err := c.CreateLocalPV(ctx, fmt.Sprintf("%s%d-%d", sc.pvPrefix, i, time.Now().UnixNano()), "1Gi"); err != nil {
				return err
			}
		}
		scale := func(n int) (time.Duration, error) {
			start := time.Now()
			h.Note("kubectl scale statefulset %s --replicas=%d", sc.set, n)
			if err := c.Kubectl(ctx, nil, "-n", devNamespace, "scale", "statefulset", sc.set, fmt.Sprintf("--replicas=%d", n)); err != nil {
				return 0, err
			}
			var took time.Duration
			if err := waitFor(ctx, 5*time.Minute, fmt.Sprintf("the primary's contract to name %d %s", n, sc.what), func() error {
				got, err := sc.contracted(ctx, admin)
				if err != nil {
					return err
				}
				if !slices.Equal(got, want(n)) {
					return fmt.Errorf("%s %v, want %v", sc.what, got, want(n))
				}
				took = time.Since(start)
				return nil
			}); err != nil {
				return 0, err
			}
			h.Note("%d %s in the contract after %v", n, sc.what, took.Round(time.Millisecond))
			if n < sc.to {
				// The scaled-away pods stop (kubectl wait for Ready would
				// wait on them too while they terminate).
				args := append([]string{"-n", devNamespace, "wait", "--for=delete"}, extraPods...)
				if err := c.Kubectl(ctx, nil, append(args, "--timeout=3m")...); err != nil {
					return 0, err
				}
			}
			return took, waitAllReady(ctx, c, 5*time.Minute)
		}
		var err error
		if grew, err = scale(sc.to); err != nil {
			return err
		}
		if shrank, err = scale(sc.from); err != nil {
			return err
		}
		// The scaled-away pods are gone; their claims stay (a StatefulSet
		// keeps them): remove them, so that a later scale-up starts empty.
		return c.Kubectl(ctx, nil, append(append([]string{"-n", devNamespace, "delete", "pvc"}, extraClaims...), "--wait=false")...)
	})
	return grew, shrank
}

// TestScaleLogStores scales the log stores' StatefulSet 3 → 5 → 3 under
// the checked workload, with nothing but kubectl scale: the new pods ask
// the primary to add them (--join), the pods scaled away ask it to remove
// them on their SIGTERM (--leave-on-scale-down), and the primary's
// contract follows: five log stores, then walship-logstore-0..2 again.
func TestScaleLogStores(t *testing.T) {
	pod := func(i int) string { return fmt.Sprintf("walship-logstore-%d", i) }
	grew, shrank := scaleUnderLoad(t, scaling{name: "scale-logstores", set: "walship-logstore", what: "log stores",
		from: 3, to: 5, pvPrefix: "realkube-pv-ls", pod: pod,
		named:      func(i int) string { return pod(i) + ".walship-logstore-headless:7400" },
		contracted: logStoresOf})
	t.Logf("log stores 3 → 5 in the contract after %v, 5 → 3 after %v (from kubectl scale)", grew.Round(time.Millisecond), shrank.Round(time.Millisecond))
}

// membersOf is the primary's contract's members, sorted, once no change
// is in progress.
func membersOf(ctx context.Context, admin walshipv1.AdminServiceClient) ([]string, error) {
	m, err := membership(ctx, admin)
	if err != nil {
		return nil, err
	}
	if m.GetChange() != "" || m.GetJoint() || len(m.GetContract().GetLearners()) > 0 {
		return nil, fmt.Errorf("a change in progress: %s", m.GetChange())
	}
	var ids []string
	for _, mb := range m.GetContract().GetMembers() {
		ids = append(ids, mb.GetId())
	}
	return slices.Sorted(slices.Values(ids)), nil
}

// TestScaleDataNodes scales the data nodes' StatefulSet 3 → 4 → 3 under
// the checked workload, with nothing but kubectl scale: walship-3 asks the
// primary to add it (--join: a learner, then a member), and on its
// SIGTERM of the scale-down asks it to remove it (--leave-on-scale-down);
// the primary's contract follows: walship-0..3, then walship-0..2 again.
func TestScaleDataNodes(t *testing.T) {
	pod := func(i int) string { return fmt.Sprintf("walship-%d", i) }
	grew, shrank := scaleUnderLoad(t, scaling{name: "scale-nodes", set: "walship", what: "members",
		from: 3, to: 4, pvPrefix: "realkube-pv-n", pod: pod, named: pod, contracted: membersOf})
	t.Logf("data nodes 3 → 4 in the contract after %v, 4 → 3 after %v (from kubectl scale)", grew.Round(time.Millisecond), shrank.Round(time.Millisecond))
}
