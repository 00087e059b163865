package e2e

import (
	"context"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	walshipv1 "github.com/walship/walship/gen/walship/v1"
	"github.com/walship/walship/internal/testkit"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

// kubeStatefulSet is the data nodes' StatefulSet as the API server holds
// it: nothing runs it here (no controller, no kubelet), the tests create
// its Pods and processes, but the nodes read its spec.replicas.
func kubeStatefulSet(replicas int) string {
	return fmt.Sprintf(`apiVersion: apps/v1
kind: StatefulSet
metadata: {name: walship, namespace: %s}
spec:
  serviceName: walship-headless
  replicas: %d
  selector: {matchLabels: {app.kubernetes.io/name: walship}}
  template:
    metadata: {labels: {app.kubernetes.io/name: walship}}
    spec: {containers: [{name: node, image: walship}]}
`, kubeNS, replicas)
}

// members is the contract's member ids as the primary reports them
// (ListMembers at any node: the others name the primary); nil if none
// answers with a contract.
func (c *kubeCluster) members(t *testing.T) []string {
	t.Helper()
	for _, n := range c.nodes {
		if n.p == nil {
			continue
		}
		select {
		case <-n.p.done:
			continue // stopped
		default:
		}
		cc, err := grpc.NewClient(n.addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(t.Context(), 2*time.Second)
		resp, err := walshipv1.NewAdminServiceClient(cc).ListMembers(ctx, &walshipv1.ListMembersRequest{})
		cancel()
		cc.Close()
		if err != nil || resp.GetMembership().GetContract() == nil {
			continue
		}
		var ids []string
		for _, m := range resp.GetMembership().GetContract().GetMembers() {
			ids = append(ids, m.GetId())
		}
		slices.Sort(ids)
		return ids
	}
	return nil
}

// TestKubeScaleStatefulSet: the data-node StatefulSet scaled 3 → 4 → 3
// with the shipped flags (node.env: --join, --leave-on-scale-down) and
// RBAC. walship-3 starts with --peers walship-0..2, which leave it out,
// and becomes a member (ListMembers); a restart of walship-2 (ordinal
// below spec.replicas) changes nothing; scaled back to 3, walship-3's
// SIGTERM removes it.
func TestKubeScaleStatefulSet(t *testing.T) {
	c := startKubeCluster(t, "--join", "--leave-on-scale-down")
	c.apply(t, kubeStatefulSet(3))
	c.waitLabels(t, map[string]string{"walship-0": "primary"})
	want := func(what string, ids ...string) {
		t.Helper()
		var got []string
		testkit.UntilWithin(t, 60*time.Second, what, func() bool {
			got = c.members(t)
			return slices.Equal(got, ids)
		})
	}
	want("the three members", "walship-0", "walship-1", "walship-2")

	// Scale up: the StatefulSet's controller would create walship-3.
	c.kubectlRun(t, "", "scale", "-n", kubeNS, "statefulset", "walship", "--replicas", "4")
	c.apply(t, fmt.Sprintf(`apiVersion: v1
kind: Pod
metadata: {name: walship-3, namespace: %s, labels: {app.kubernetes.io/name: walship}}
spec:
  serviceAccountName: walship
  containers: [{name: node, image: walship}]
`, kubeNS))
	n3 := &procNode{name: "walship-3", serving: "replica serving", addr: testkit.FreeAddr(t), t: t}
	n3.args = slices.Clone(c.nodes[2].args)
	for i := 0; i+1 < len(n3.args); i++ {
		switch n3.args[i] {
		case "--id", "--pod-name":
			n3.args[i+1] = n3.name
		case "--listen":
			n3.args[i+1] = n3.addr
		case "--data-dir":
			n3.args[i+1] = filepath.Join(filepath.Dir(n3.args[i+1]), n3.name)
		}
	}
	n3.args = append(n3.args, "--advertise", n3.addr)
	n3.start()
	c.nodes = append(c.nodes, n3)
	want("walship-3 to be added", "walship-0", "walship-1", "walship-2", "walship-3")

	// A restart (ordinal 2 < 4): it stays a member.
	c.nodes[2].p.stop()
	if logs := c.nodes[2].p.logs(); !strings.Contains(logs, "not a scale-down; staying a member") {
		t.Fatalf("walship-2's stop did not say it stays a member:\n%s", logs)
	}
	c.nodes[2].serving = "replica serving"
	c.nodes[2].start()
	want("walship-2 still a member after its restart", "walship-0", "walship-1", "walship-2", "walship-3")

	// Scale down: the controller would delete walship-3 (SIGTERM).
	c.kubectlRun(t, "", "scale", "-n", kubeNS, "statefulset", "walship", "--replicas", "3")
	n3.p.stop()
	if logs := n3.p.logs(); !strings.Contains(logs, "removed from the cluster's members for the scale-down") {
		t.Fatalf("walship-3 did not remove itself on its scale-down:\n%s", logs)
	}
	want("walship-3 to be removed", "walship-0", "walship-1", "walship-2")
}
