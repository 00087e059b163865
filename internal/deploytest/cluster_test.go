package deploytest

import (
	"bytes"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"reflect"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/labels"
	"sigs.k8s.io/kustomize/kyaml/kio"
)

// Client Services of the data nodes, and the run-time labels each selects
// (nothing else of them): writes go to the primary by its role label,
// reads to the pods labelled reads=true — the replicas, and a new primary
// for a grace — not by role=replica: a hand-over's relabelling (replica →
// primary) would then change both Services' EndpointSlices, and
// kube-proxy applies the second a minSyncPeriod (1 s) after the first.
var roleServices = map[string]map[string]string{
	"walship-rw": {roleLabel: "primary"},
	"walship-ro": {readsLabel: "true"},
}

// stopTimeout is how long a walship server's graceful stop may take
// (primary.DefaultConfig().StopTimeout, not a flag).
const stopTimeout = 30 * time.Second

// checkCluster checks that the pods make one walship cluster: one
// StatefulSet of log stores and one of data nodes, every node listing
// every log store pod and every data node (itself among them, under its
// pod name) at addresses that reach those very pods, every log store
// listing the other log store pods as its peers, and a bootstrap primary
// among the nodes. With automatic failover (--kube-lease) it checks
// what makes a failover safe and a drain harmless: see checkFailover.
func (c *checker) checkCluster() {
	byComponent := map[string][]*appsv1.StatefulSet{}
	for _, name := range sortedKeys(c.o.statefulSets) {
		sts := c.o.statefulSets[name]
		comp := sts.Spec.Template.Labels[componentLabel]
		byComponent[comp] = append(byComponent[comp], sts)
	}
	for _, comp := range []string{logstoreComponent, nodeComponent} {
		if len(byComponent[comp]) != 1 {
			c.errorf("%d StatefulSets with %s=%s, want 1", len(byComponent[comp]), componentLabel, comp)
			return
		}
	}
	ls, nodes := byComponent[logstoreComponent][0], byComponent[nodeComponent][0]
	var pods []*pod
	var stores []*pod
	for ord := int32(0); ord < ptrOr(ls.Spec.Replicas, 1); ord++ {
		if p, err := c.podConfig(ls, ord); err == nil {
			stores = append(stores, p)
		}
	}
	// Log stores that join (--join) may be more than the lists name: the
	// StatefulSet scaled up adds them at run time.
	joining := len(stores) > 0 && stores[0].flag("join") == "true"
	for ord := int32(0); ord < ptrOr(nodes.Spec.Replicas, 1); ord++ {
		p, err := c.podConfig(nodes, ord)
		if err != nil {
			continue // reported by checkStatefulSet
		}
		pods = append(pods, p)
		c.checkLogstoreList(p, ls, joining)
		c.checkMembers(p, nodes)
	}
	if len(pods) > 0 && pods[0].callsAPI() {
		c.checkFailover(pods, nodes, ls)
	}
	for _, p := range stores {
		c.checkLogstorePeers(p, ls, joining)
		if len(pods) > 0 {
			c.checkLogstoreJoin(p, pods[0], nodes)
		}
	}
}

// checkLogstoreJoin: a log store that joins or leaves by itself (--join,
// --leave-on-scale-down) advertises the address that reaches its own pod,
// spelled exactly as the data nodes' --logstore spells it where that names
// the pod (the contract names log stores by address: another spelling
// would be added a second time), and its --nodes reach data node pods.
func (c *checker) checkLogstoreJoin(p, node *pod, nodes *appsv1.StatefulSet) {
	if p.flag("join") != "true" && p.flag("leave-on-scale-down") != "true" {
		return
	}
	adv := p.flag("advertise")
	if target, err := c.resolvePeer(adv, logstoreComponent); err != nil {
		c.errorf("log store pod %s --advertise %q: %v", p.name, adv, err)
	} else if target != "pod/"+p.name {
		c.errorf("log store pod %s --advertise %s reaches %s, not the pod itself", p.name, adv, target)
	}
	for _, addr := range strings.Split(node.flag("logstore"), ",") {
		if target, err := c.resolvePeer(addr, logstoreComponent); err == nil && target == "pod/"+p.name && addr != adv {
			c.errorf("log store pod %s --advertise %s, but the data nodes' --logstore names it %s: the contract would list it twice", p.name, adv, addr)
		}
	}
	list := p.flag("nodes")
	reached := 0
	for _, addr := range strings.Split(list, ",") {
		if addr == "" {
			continue
		}
		if _, err := c.resolvePeer(addr, nodeComponent); err != nil {
			c.errorf("log store pod %s --nodes %s: %v", p.name, addr, err)
			continue
		}
		reached++
	}
	if reached == 0 {
		c.errorf("log store pod %s --nodes %q reaches no data node of StatefulSet %s: it could not find the primary", p.name, list, nodes.Name)
	}
	// A scaled-down log store asks to be removed, serving, before its
	// graceful stop.
	if p.flag("leave-on-scale-down") == "true" && strings.HasSuffix(p.name, "-0") {
		leave, err := time.ParseDuration(p.flag("leave-timeout"))
		if err != nil {
			c.errorf("log store pod %s --leave-timeout %q: %v", p.name, p.flag("leave-timeout"), err)
		}
		need := leave + stopTimeout
		if g := p.sts.Spec.Template.Spec.TerminationGracePeriodSeconds; g == nil || time.Duration(*g)*time.Second < need {
			c.errorf("StatefulSet %s: terminationGracePeriodSeconds %v: want at least %v (a scale-down's removal, up to --leave-timeout %v, plus the %v graceful stop)", p.sts.Name, ptrOr(g, 30), int64(need/time.Second), leave, stopTimeout)
		}
	}
}

// checkLogstorePeers: a log store lists every other log store pod as its
// peers (itself may be listed too: it knows itself), once each, so that
// one that lost its disk or fell behind refills from them.
func (c *checker) checkLogstorePeers(p *pod, ls *appsv1.StatefulSet, joining bool) {
	list := p.flag("peers")
	seen := map[string]bool{}
	for _, addr := range strings.Split(list, ",") {
		if addr == "" {
			continue
		}
		target, err := c.resolvePeer(addr, logstoreComponent)
		if err != nil {
			c.errorf("log store pod %s --peers %s: %v", p.name, addr, err)
			continue
		}
		if seen[target] {
			c.errorf("log store pod %s --peers lists %s twice", p.name, target)
		}
		seen[target] = true
	}
	for ord := int32(0); ord < ptrOr(ls.Spec.Replicas, 1); ord++ {
		// Joining log stores refill from the first ones (those the
		// data nodes' --logstore names); the others need not list them.
		if other := fmt.Sprintf("%s-%d", ls.Name, ord); other != p.name && !seen["pod/"+other] && (!joining || len(seen) == 0) {
			c.errorf("log store pod %s --peers %q does not list %s: it could not refill from it", p.name, list, other)
		}
	}
}

// checkLogstoreList: a data node ships to every log store pod, once each.
func (c *checker) checkLogstoreList(p *pod, ls *appsv1.StatefulSet, joining bool) {
	list := p.flag("logstore")
	seen := map[string]bool{}
	for _, addr := range strings.Split(list, ",") {
		if addr == "" {
			continue
		}
		target, err := c.resolvePeer(addr, logstoreComponent)
		if err != nil {
			c.errorf("pod %s --logstore %s: %v", p.name, addr, err)
			continue
		}
		if seen[target] {
			c.errorf("pod %s --logstore lists %s twice", p.name, target)
		}
		seen[target] = true
	}
	// With --join on the log stores, the pods the list leaves out ask the
	// primary to add them; it names at most the StatefulSet's pods.
	if n := ptrOr(ls.Spec.Replicas, 1); int32(len(seen)) != n && (!joining || len(seen) == 0 || int32(len(seen)) > n) {
		c.errorf("pod %s --logstore %q names %d log store pods, but StatefulSet %s runs %d", p.name, list, len(seen), ls.Name, n)
	}
}

// checkMembers: --id is the pod name; --peers lists every pod of the
// StatefulSet under its pod name (with --join, some of them: the others
// join at run time), once, at an address that reaches that pod; --initial-primary is one of them; --advertise reaches the pod
// itself.
func (c *checker) checkMembers(p *pod, nodes *appsv1.StatefulSet) {
	if id := p.flag("id"); id != p.name {
		c.errorf("pod %s: --id %q is not the pod name", p.name, id)
	}
	want := map[string]bool{}
	for ord := int32(0); ord < ptrOr(nodes.Spec.Replicas, 1); ord++ {
		want[fmt.Sprintf("%s-%d", nodes.Name, ord)] = true
	}
	peers := p.flag("peers")
	got := map[string]bool{}
	for _, part := range strings.Split(peers, ",") {
		if part == "" {
			continue
		}
		id, addr, _ := strings.Cut(part, "=")
		if got[id] {
			c.errorf("pod %s --peers lists %s twice", p.name, id)
		}
		got[id] = true
		if !want[id] {
			c.errorf("pod %s --peers: %s is not a pod of StatefulSet %s", p.name, id, nodes.Name)
			continue
		}
		target, err := c.resolvePeer(addr, nodeComponent)
		switch {
		case err != nil:
			c.errorf("pod %s --peers %s=%s: %v", p.name, id, addr, err)
		case target != "pod/"+id:
			c.errorf("pod %s --peers %s=%s reaches %s, not pod %s", p.name, id, addr, target, id)
		}
	}
	for _, id := range sortedKeys(want) {
		// With --join a pod --peers leave out (a StatefulSet scaled up)
		// asks the primary to add it; the others must be listed.
		if !got[id] && (p.flag("join") != "true" || len(got) == 0) {
			c.errorf("pod %s --peers %q does not list %s: StatefulSet %s runs %d pods", p.name, peers, id, nodes.Name, len(want))
		}
	}
	if ip := p.flag("initial-primary"); !want[ip] {
		c.errorf("pod %s --initial-primary %q is not a pod of StatefulSet %s: a new cluster would have no primary", p.name, ip, nodes.Name)
	}
	if adv := p.flag("advertise"); adv != "" {
		if target, err := c.resolvePeer(adv, nodeComponent); err != nil {
			c.errorf("pod %s --advertise %s: %v", p.name, adv, err)
		} else if target != "pod/"+p.name {
			c.errorf("pod %s --advertise %s reaches %s, not the pod itself", p.name, adv, target)
		}
	}
}

// checkFailover checks a cluster that fails over by itself:
//
//   - each node knows its Pod (--pod-name, --pod-namespace) — the one it
//     labels, whose name is its --id and its name in the Lease;
//   - the contract makes every acknowledged commit survive the loss of the
//     primary: fsynced locally, on a majority of the log stores
//     (--logstore-ack sync) and on a replica (--replication sync,
//     --sync-replicas ≥ 1 at flush or apply; write is not durable);
//   - a drain the PodDisruptionBudgets allow leaves what commits wait
//     for: k sync replicas besides a primary, a log store majority;
//   - the pods start in parallel (a node is ready only as a primary with
//     a replica or a replica with a primary: OrderedReady would wait for
//     walship-0 forever), and the grace period covers the switchover a
//     primary makes on SIGTERM plus its graceful stop, with no exec preStop
//     hook (the image has no shell);
//   - walship-rw routes on the role label, walship-ro on the reads label.
func (c *checker) checkFailover(pods []*pod, nodes, ls *appsv1.StatefulSet) {
	for _, p := range pods {
		if got := p.flag("pod-name"); got != p.name {
			c.errorf("pod %s: --pod-name %q is not the pod's name (POD_NAME from metadata.name)", p.name, got)
		}
		if got := p.flag("pod-namespace"); got != c.namespace || got == "" {
			c.errorf("pod %s: --pod-namespace %q, want the pod's namespace %q (POD_NAMESPACE from metadata.namespace)", p.name, got, c.namespace)
		}
	}
	p := pods[0]
	where := "StatefulSet " + nodes.Name
	for _, f := range []struct{ flag, want, why string }{
		{"durability", "sync", "an acknowledged commit must be fsynced on the primary"},
		{"replication", "sync", "an acknowledged commit must be on a replica that can take over"},
		{"logstore-ack", "sync", "an acknowledged commit must be on a log store majority, which every promotion reads"},
	} {
		if got := p.flag(f.flag); got != f.want {
			c.errorf("%s: --kube-lease with --%s %s: want %s (%s)", where, f.flag, got, f.want, f.why)
		}
	}
	if lvl := p.flag("sync-level"); lvl != "flush" && lvl != "apply" {
		c.errorf("%s: --sync-level %s: a replica's write is not durable; want flush or apply for a failover that loses nothing", where, lvl)
	}
	k, _ := strconv.Atoi(p.flag("sync-replicas"))
	if k < 1 {
		c.errorf("%s: --sync-replicas %d: a commit on no replica can be lost by a failover", where, k)
	}
	n := ptrOr(nodes.Spec.Replicas, 1)
	if d, ok := c.pdbDisruptions(nodes); ok && int32(k) > n-1-d {
		c.errorf("%s: %d data nodes and a PodDisruptionBudget that lets %d go leave %d replicas, but commits wait for %d (--sync-replicas)", where, n, d, n-1-d, k)
	}
	l := ptrOr(ls.Spec.Replicas, 1)
	if d, ok := c.pdbDisruptions(ls); ok && l-d < l/2+1 {
		c.errorf("StatefulSet %s: a PodDisruptionBudget that lets %d of %d log stores go leaves no majority (%d) for commits and votes", ls.Name, d, l, l/2+1)
	}
	if nodes.Spec.PodManagementPolicy != appsv1.ParallelPodManagement {
		c.errorf("%s: podManagementPolicy %q: want Parallel (a node is ready only with a primary, so OrderedReady can wait for a pod it never starts)", where, nodes.Spec.PodManagementPolicy)
	}
	switchover, err := time.ParseDuration(p.flag("switchover-timeout"))
	if err != nil {
		c.errorf("%s: --switchover-timeout %q: %v", where, p.flag("switchover-timeout"), err)
	}
	// A scaled-down node asks to be removed after its switchover, before
	// its graceful stop (--leave-on-scale-down, up to --leave-timeout).
	var leave time.Duration
	if p.flag("leave-on-scale-down") == "true" {
		if leave, err = time.ParseDuration(p.flag("leave-timeout")); err != nil {
			c.errorf("%s: --leave-timeout %q: %v", where, p.flag("leave-timeout"), err)
		}
	}
	need := max(60*time.Second, switchover+leave+stopTimeout)
	if g := nodes.Spec.Template.Spec.TerminationGracePeriodSeconds; g == nil || time.Duration(*g)*time.Second < need {
		c.errorf("%s: terminationGracePeriodSeconds %v: want at least %v (the SIGTERM switchover, up to --switchover-timeout %v, plus a scale-down's removal, up to --leave-timeout %v, plus the %v graceful stop)", where, ptrOr(g, 30), int64(need/time.Second), switchover, leave, stopTimeout)
	}
	for _, ct := range nodes.Spec.Template.Spec.Containers {
		if ct.Lifecycle != nil && ct.Lifecycle.PreStop != nil && ct.Lifecycle.PreStop.Exec != nil {
			c.errorf("%s container %s: an exec preStop hook needs a shell, which the image (FROM scratch) lacks; walship handles SIGTERM itself", where, ct.Name)
		}
	}
	for _, name := range sortedKeys(roleServices) {
		want := roleServices[name]
		svc := c.o.services[name]
		if svc == nil {
			c.errorf("no Service %s (the pods with %s)", name, labels.Set(want))
			continue
		}
		targets, got := c.podsOfService(svc.Spec.Selector)
		if !maps.Equal(got, want) || len(targets) != 1 || targets[0] != nodes {
			c.errorf("Service %s: selector %v, want the pods of StatefulSet %s with %s and no other run-time label", name, svc.Spec.Selector, nodes.Name, labels.Set(want))
		}
		if !reachesGRPC(svc, p.container) {
			c.errorf("Service %s: does not reach the gRPC port of StatefulSet %s", name, nodes.Name)
		}
	}
}

// reachesGRPC says whether some port of svc reaches the gRPC port of
// container ct.
func reachesGRPC(svc *corev1.Service, ct *corev1.Container) bool {
	grpc, ok := containerPort(ct, "grpc")
	for _, sp := range svc.Spec.Ports {
		if tp, found := resolveTargetPort(ct, sp); ok && found && tp == grpc {
			return true
		}
	}
	return false
}

// pdbDisruptions is how many pods of sts its PodDisruptionBudget lets go.
func (c *checker) pdbDisruptions(sts *appsv1.StatefulSet) (int32, bool) {
	for _, name := range sortedKeys(c.o.pdbs) {
		pdb := c.o.pdbs[name]
		if targets := c.podsOf(pdb.Spec.Selector); len(targets) == 1 && targets[0] == sts {
			d, err := disruptionsAllowed(pdb, ptrOr(sts.Spec.Replicas, 1))
			return d, err == nil
		}
	}
	return 0, false
}

// permission is one thing RBAC allows: a verb on a resource of an API
// group, on objects of one name ("" = any name).
type permission struct{ group, resource, verb, name string }

func (p permission) String() string {
	g := p.group
	if g == "" {
		g = "core"
	}
	s := p.verb + " " + g + "/" + p.resource
	if p.name != "" {
		s += "/" + p.name
	} else {
		s += " (any name)"
	}
	return s
}

// minimalPermissions are the calls a data node of pod p makes with its
// --kube-lease (internal/kube), each with what needs it: nothing more (no
// list, no watch, no other Lease) and nothing less.
func minimalPermissions(p *pod) map[permission]string {
	if p.command == "logstore" {
		// --leave-on-scale-down alone.
		// Any name: kustomize would rewrite resourceNames
		// [walship-logstore] to the log stores' ConfigMap's hashed name
		// (rbac-logstore.yaml).
		return map[permission]string{
			{"apps", "statefulsets", "get", ""}: "a log store told to stop reads its StatefulSet's spec.replicas: scaled down, it leaves the contract's log stores",
		}
	}
	lease := p.flag("kube-lease")
	perms := map[permission]string{
		{"coordination.k8s.io", "leases", "get", lease}:    "the election reads who holds the Lease and until when",
		{"coordination.k8s.io", "leases", "update", lease}: "the election renews, takes over and releases the Lease",
		{"coordination.k8s.io", "leases", "create", ""}:    "the first contender creates the Lease (a create names no object RBAC could match)",
		{"", "pods", "patch", ""}:                          "a node sets the walship.io/role and walship.io/reads labels on its own Pod",
		{"", "events", "create", ""}:                       "a node records Events on its own Pod",
	}
	if p.flag("leave-on-scale-down") == "true" {
		perms[permission{"apps", "statefulsets", "get", p.sts.Name}] = "a node told to stop reads its StatefulSet's spec.replicas: scaled down, it leaves the members"
	}
	return perms
}

// permissionsOf flattens RBAC rules into permissions; nonResourceURLs
// (meaningless in a Role) are reported as permissions of group "URL".
func permissionsOf(rules []rbacv1.PolicyRule) map[permission]bool {
	out := map[permission]bool{}
	for _, r := range rules {
		for _, u := range r.NonResourceURLs {
			for _, v := range r.Verbs {
				out[permission{"URL", u, v, ""}] = true
			}
		}
		names := r.ResourceNames
		if len(names) == 0 {
			names = []string{""}
		}
		for _, g := range r.APIGroups {
			for _, res := range r.Resources {
				for _, v := range r.Verbs {
					for _, n := range names {
						out[permission{g, res, v, n}] = true
					}
				}
			}
		}
	}
	return out
}

// comparePermissions returns what got lacks and what it has beyond want.
func comparePermissions(got map[permission]bool, want map[permission]string) (missing, extra []string) {
	for p, why := range want {
		if !got[p] {
			missing = append(missing, fmt.Sprintf("%s (%s)", p, why))
		}
	}
	for p := range got {
		if _, ok := want[p]; !ok {
			extra = append(extra, p.String())
		}
	}
	sort.Strings(missing)
	sort.Strings(extra)
	return missing, extra
}

// checkRBAC: nothing cluster-wide; every RoleBinding binds a Role of the
// build to ServiceAccounts of the build in the namespace; every Role is
// bound; and the ServiceAccount of the pods that call the API gets
// exactly minimalPermissions for their --kube-lease.
func (c *checker) checkRBAC() {
	for _, n := range sortedKeys(c.o.clusterRoles) {
		c.errorf("ClusterRole %s: walship needs no cluster-wide permissions", n)
	}
	for _, n := range sortedKeys(c.o.clusterBindings) {
		c.errorf("ClusterRoleBinding %s: walship needs no cluster-wide permissions", n)
	}
	bound := map[string]bool{}
	rolesOf := map[string][]string{} // ServiceAccount -> Roles
	for _, n := range sortedKeys(c.o.roleBindings) {
		rb := c.o.roleBindings[n]
		ref := rb.RoleRef
		if ref.APIGroup != rbacv1.GroupName || ref.Kind != "Role" || c.o.roles[ref.Name] == nil {
			c.errorf("RoleBinding %s: roleRef %s %s/%s is not a Role of the build", n, ref.APIGroup, ref.Kind, ref.Name)
			continue
		}
		bound[ref.Name] = true
		if len(rb.Subjects) == 0 {
			c.errorf("RoleBinding %s: no subjects", n)
		}
		for _, s := range rb.Subjects {
			switch {
			case s.Kind != rbacv1.ServiceAccountKind || s.APIGroup != "":
				c.errorf("RoleBinding %s: subject %s %q: want only ServiceAccounts of the build", n, s.Kind, s.Name)
			case c.o.serviceAccounts[s.Name] == nil:
				c.errorf("RoleBinding %s: subject ServiceAccount %q is not in the build", n, s.Name)
			// RBAC takes a ServiceAccount subject without a namespace to be
			// in the RoleBinding's namespace (base/rbac.yaml relies on it).
			case s.Namespace != "" && s.Namespace != c.namespace:
				c.errorf("RoleBinding %s: subject ServiceAccount %s in namespace %q, but the build is in %q", n, s.Name, s.Namespace, c.namespace)
			default:
				rolesOf[s.Name] = append(rolesOf[s.Name], ref.Name)
			}
		}
	}
	for _, n := range sortedKeys(c.o.roles) {
		if !bound[n] {
			c.errorf("Role %s: bound to no one", n)
		}
	}
	for _, name := range sortedKeys(c.o.statefulSets) {
		sts := c.o.statefulSets[name]
		p, err := c.podConfig(sts, 0)
		if err != nil || !p.callsAPI() {
			continue
		}
		sa := sts.Spec.Template.Spec.ServiceAccountName
		got := map[permission]bool{}
		for _, r := range rolesOf[sa] {
			for perm := range permissionsOf(c.o.roles[r].Rules) {
				got[perm] = true
			}
		}
		missing, extra := comparePermissions(got, minimalPermissions(p))
		if len(missing) > 0 {
			c.errorf("StatefulSet %s: ServiceAccount %q (Roles %v) may not: %s", name, sa, rolesOf[sa], strings.Join(missing, "; "))
		}
		if len(extra) > 0 {
			c.errorf("StatefulSet %s: ServiceAccount %q (Roles %v) may do more than walship needs: %s", name, sa, rolesOf[sa], strings.Join(extra, "; "))
		}
	}
}

// RBACFile is the Role and RoleBinding of the data nodes as a plain file:
// `kubectl apply -n NAMESPACE -f` applies it as it is (the Go end-to-end
// tests do), so it sets no namespace anywhere. RBACLogStoreFile is the log
// stores', the same way.
const (
	RBACFile         = "deploy/k8s/base/rbac.yaml"
	RBACLogStoreFile = "deploy/k8s/base/rbac-logstore.yaml"
)

// rbacFiles are the plain RBAC files and the StatefulSet whose pods each
// grants what they need.
var rbacFiles = map[string]string{RBACFile: "walship", RBACLogStoreFile: "walship-logstore"}

// TestRBACFile: base/rbac.yaml on its own holds exactly a Role and a
// RoleBinding without a namespace — also none on the subject, which RBAC
// then takes to be the RoleBinding's — granting exactly what the overlays'
// data nodes need, and the overlays build the same rules from it; and
// base/rbac-logstore.yaml the same for the log stores.
func TestRBACFile(t *testing.T) {
	for file, sts := range rbacFiles {
		t.Run(filepath.Base(file), func(t *testing.T) { testRBACFile(t, file, sts) })
	}
}

func testRBACFile(t *testing.T, file, sts string) {
	data, err := os.ReadFile(filepath.Join(repoRoot(t), file))
	if err != nil {
		t.Fatal(err)
	}
	nodes, err := (&kio.ByteReader{Reader: bytes.NewReader(data), OmitReaderAnnotations: true}).Read()
	if err != nil {
		t.Fatal(err)
	}
	var docs [][]byte
	for _, n := range nodes {
		j, err := n.MarshalJSON()
		if err != nil {
			t.Fatal(err)
		}
		docs = append(docs, j)
	}
	f, err := decodeObjects(docs)
	if err != nil {
		t.Fatalf("%s: %v", file, err)
	}
	if n := len(f.all()); n != 2 || len(f.roles) != 1 || len(f.roleBindings) != 1 {
		t.Fatalf("%s: %d objects (%d Roles, %d RoleBindings), want one Role and one RoleBinding", file, n, len(f.roles), len(f.roleBindings))
	}
	for _, m := range f.all() {
		if m.obj.Namespace != "" {
			t.Errorf("%s: %s %s sets namespace %q: `kubectl apply -n` would refuse another", file, m.kind, m.obj.Name, m.obj.Namespace)
		}
	}
	for _, rb := range f.roleBindings {
		for _, s := range rb.Subjects {
			if s.Namespace != "" {
				t.Errorf("%s: RoleBinding %s subject %s %s has namespace %q; leave it out (RBAC then takes the RoleBinding's)", file, rb.Name, s.Kind, s.Name, s.Namespace)
			}
		}
	}
	for name, dir := range overlayDirs(t) {
		o := buildOverlay(t, dir)
		c := &checker{o: o, namespace: overlayWants[name].namespace}
		p, err := c.podConfig(o.statefulSets[sts], 0)
		if err != nil {
			t.Fatalf("overlay %s: %v", name, err)
		}
		for rn, r := range f.roles {
			missing, extra := comparePermissions(permissionsOf(r.Rules), minimalPermissions(p))
			if len(missing)+len(extra) > 0 {
				t.Errorf("%s: Role %s for overlay %s: lacks %v; has more: %v", file, rn, name, missing, extra)
			}
			if built := o.roles[rn]; built == nil || !reflect.DeepEqual(built.Rules, r.Rules) {
				t.Errorf("overlay %s: Role %s differs from %s", name, rn, file)
			}
		}
		for bn, rb := range f.roleBindings {
			built := o.roleBindings[bn]
			if built == nil || built.RoleRef != rb.RoleRef || len(built.Subjects) != len(rb.Subjects) {
				t.Errorf("overlay %s: RoleBinding %s differs from %s", name, bn, file)
				continue
			}
			for i, s := range built.Subjects {
				if s.Namespace != c.namespace {
					t.Errorf("overlay %s: RoleBinding %s subject %s: namespace %q, want the overlay's %q (kustomize sets it)", name, bn, s.Name, s.Namespace, c.namespace)
				}
				s.Namespace = ""
				if s != rb.Subjects[i] {
					t.Errorf("overlay %s: RoleBinding %s subject %d differs from %s", name, bn, i, file)
				}
			}
		}
	}
}
