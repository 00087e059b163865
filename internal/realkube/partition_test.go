package realkube

import (
	"context"
	"fmt"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	walshipv1 "github.com/walship/walship/gen/walship/v1"
	"github.com/walship/walship/internal/check"
)

// leaseDuration is WALSHIP_KUBE_LEASE_DURATION of deploy/k8s/base/node.env:
// a primary cut off from the API server must stop acknowledging within it,
// since after it another node may take the Lease.
const leaseDuration = 2 * time.Second

// TestAPIServerCutForThePrimary cuts the primary's pod off from the API
// server (iptables DROP in the pod's network namespace: plain bridge CNI
// enforces no NetworkPolicy) with a writer pinned to each data node's pod.
// The primary stops acknowledging before its Lease can have expired;
// another node takes the Lease and writes; no write the old primary
// acknowledged comes after the new one's first, and all of them are in
// the new epoch's log before it starts. Healed, the old primary's pod
// rejoins as a replica and a new connection to walship-rw writes.
//
// Not under underLoad: a connection through walship-rw made while the
// cut-off primary still carries the primary label (it cannot relabel
// itself) stays on that pod once it is a replica, refused
// (FAILED_PRECONDITION) for good — nothing closes it under plaintext.
// That is a finding to fix in walship (issue #36's report), not here.
func TestAPIServerCutForThePrimary(t *testing.T) {
	c := cluster(t)
	deployDev(t, c)
	defer dumpOnFailure(t, c)
	var (
		oldPod, holder string
		cut            time.Time
		// cutIn is when the rules were surely in: iptables waits for its
		// lock, which kube-proxy's syncs hold, so at load the cut takes
		// effect somewhere between cut and cutIn.
		cutIn      time.Time
		old, first []check.PinnedAck
	)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	if err := func() error {
		var err error
		if oldPod, _, err = primaryPod(ctx, c); err != nil {
			return err
		}
		pods, err := podsWith(ctx, c, nodeSelector)
		if err != nil {
			return err
		}
		wctx, stopWriters := context.WithCancel(ctx)
		defer stopWriters()
		var wg sync.WaitGroup
		writers := map[string]*check.PinnedWriter{}
		for _, p := range pods {
			w := &check.PinnedWriter{}
			writers[p] = w
			kv := walshipv1.NewKVServiceClient(podConn(t, c, ctx, p, "7401"))
			wg.Add(1)
			go func() { defer wg.Done(); w.Run(wctx, kv, "pinned-"+p+"/") }()
		}
		if err := waitFor(ctx, time.Minute, "pinned writes on "+oldPod, func() error {
			if n := len(writers[oldPod].Acks()); n < 20 {
				return fmt.Errorf("%d acknowledged", n)
			}
			return nil
		}); err != nil {
			return err
		}
		rules := [][]string{
			{"-d", "10.96.0.1", "-j", "DROP"},
			{"-d", c.HostIP, "-p", "tcp", "--dport", c.apiPort, "-j", "DROP"},
		}
		cut = time.Now()
		if err := podIptables(ctx, c, oldPod, "-I", rules); err != nil {
			return err
		}
		cutIn = time.Now()
		if err := waitFor(ctx, time.Minute, "another node holding the Lease", func() error {
			out, err := c.KubectlOutput(ctx, nil, "-n", devNamespace, "get", "lease", "walship", "-o", "jsonpath={.spec.holderIdentity}")
			if holder = strings.TrimSpace(string(out)); err != nil || holder == oldPod || holder == "" {
				return fmt.Errorf("held by %q (%v)", holder, err)
			}
			return nil
		}); err != nil {
			return err
		}
		if writers[holder] == nil {
			return fmt.Errorf("the Lease is held by %q, not a data node's pod", holder)
		}
		if err := waitFor(ctx, time.Minute, "a write acknowledged by "+holder, func() error {
			for _, a := range writers[holder].Acks() {
				if a.At.After(cut) {
					return nil
				}
			}
			return fmt.Errorf("none since the cut")
		}); err != nil {
			return err
		}
		stopWriters()
		wg.Wait()
		old = writers[oldPod].Acks()
		for _, a := range writers[holder].Acks() {
			if a.At.After(cut) {
				first = append(first, a)
			}
		}
		if err := podIptables(ctx, c, oldPod, "-D", rules); err != nil {
			return err
		}
		return waitAllReady(ctx, c, 5*time.Minute)
	}(); err != nil {
		t.Fatal(err)
	}
	last := old[len(old)-1]
	t.Logf("cut at +0 (the rules in by %v); %s's (the old primary) last ack at %v; %s's first at %v",
		cutIn.Sub(cut).Round(time.Millisecond), oldPod, last.At.Sub(cut).Round(time.Millisecond), holder, first[0].At.Sub(cut).Round(time.Millisecond))
	if !last.At.Before(first[0].At) {
		t.Fatalf("two primaries acknowledged at once: %s's last ack (%v after the cut) is after %s's first (%v)",
			oldPod, last.At.Sub(cut), holder, first[0].At.Sub(cut))
	}
	if d := last.At.Sub(cutIn); d >= leaseDuration {
		t.Fatalf("%s acknowledged %v after it was surely cut off from the API server, past the Lease's duration (%v)", oldPod, d, leaseDuration)
	}
	newConn := podConn(t, c, ctx, holder, "7401")
	st, err := walshipv1.NewAdminServiceClient(newConn).Status(ctx, &walshipv1.StatusRequest{})
	if err != nil {
		t.Fatal(err)
	}
	var start uint64
	for _, e := range st.GetHistory() {
		if e.GetEpoch() == st.GetEpoch() {
			start = e.GetFirstLsn()
		}
	}
	kv := walshipv1.NewKVServiceClient(newConn)
	for _, a := range old {
		if a.LSN >= start {
			t.Fatalf("%s acknowledged LSN %d, at or past the new epoch's first LSN %d", oldPod, a.LSN, start)
		}
		r, err := kv.Get(ctx, &walshipv1.GetRequest{Key: a.Key})
		if err != nil || !r.GetFound() {
			t.Fatalf("%s (acknowledged by %s at LSN %d) is not on %s: %v", a.Key, oldPod, a.LSN, holder, err)
		}
	}
	if role, _ := podField(ctx, c, oldPod, "{.metadata.labels.walship\\.io/role}"); role != "replica" {
		t.Fatalf("%s healed is labelled %q, want replica", oldPod, role)
	}
	// A connection of its own for each try: one made before kube-proxy
	// applied the relabelling lands on the old primary and stays there
	// (plaintext connections are never closed), refused for good.
	if err := waitFor(ctx, time.Minute, "a write through a new connection to walship-rw", func() error {
		conn := serviceConn(t, c, ctx, "walship-rw")
		defer conn.Close()
		pctx, pcancel := context.WithTimeout(ctx, 2*time.Second)
		defer pcancel()
		_, err := walshipv1.NewKVServiceClient(conn).Put(pctx, &walshipv1.PutRequest{Key: "apiserver-cut/after", Value: []byte("x")})
		return err
	}); err != nil {
		t.Fatal(err)
	}
}

// podIptables adds (-I) or deletes (-D) rules of the OUTPUT chain in the
// network namespace of a pod's container.
func podIptables(ctx context.Context, c *Cluster, pod, op string, rules [][]string) error {
	cid, err := podField(ctx, c, pod, "{.status.containerStatuses[0].containerID}")
	if err != nil {
		return err
	}
	pid, err := c.ContainerPID(ctx, cid)
	if err != nil {
		return err
	}
	for _, r := range rules {
		args := append([]string{"-t", fmt.Sprint(pid), "-n", "iptables", op, "OUTPUT"}, r...)
		if out, err := exec.CommandContext(ctx, "nsenter", args...).CombinedOutput(); err != nil {
			return fmt.Errorf("nsenter %s: %w: %s", strings.Join(args, " "), err, out)
		}
	}
	return nil
}
