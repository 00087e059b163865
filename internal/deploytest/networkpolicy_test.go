package deploytest

import (
	"fmt"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
)

// source is where a connection comes from: a pod, by its labels and its
// namespace's.
type source struct {
	what      string
	namespace string
	pod, ns   map[string]string
}

// flow is a connection from a source to a port (by container port name)
// of a StatefulSet's pods.
type flow struct {
	from source
	to   *appsv1.StatefulSet
	port string
}

func (f flow) String() string {
	return fmt.Sprintf("%s → StatefulSet %s port %s", f.from.what, f.to.Name, f.port)
}

// checkNetworkPolicies: when the build has NetworkPolicies, each selects
// pods and names only their ports, both StatefulSets are covered, and the
// policies, evaluated as a network plugin would, let through every
// connection walship needs and none of the ones they exist to stop:
//
//	clients (any namespace) → data nodes gRPC; data nodes → data nodes and
//	log stores gRPC; log stores → log stores gRPC; admin pods → log stores
//	gRPC; Prometheus → every metrics port. Not: a client → a log store, or
//	a client → a metrics port.
func (c *checker) checkNetworkPolicies() {
	if len(c.o.networkPolicies) == 0 {
		return
	}
	for _, name := range sortedKeys(c.o.networkPolicies) {
		np := c.o.networkPolicies[name]
		where := "NetworkPolicy " + name
		targets := c.podsOf(&np.Spec.PodSelector)
		if len(targets) == 0 {
			c.errorf("%s: podSelector selects no walship pods", where)
		}
		if !hasPolicyType(np, networkingv1.PolicyTypeIngress) {
			c.errorf("%s: policyTypes %v lacks Ingress", where, np.Spec.PolicyTypes)
		}
		for _, rule := range np.Spec.Ingress {
			for _, p := range rule.Ports {
				if p.Port == nil || p.Port.StrVal == "" {
					continue
				}
				for _, sts := range targets {
					if _, ok := containerPort(&sts.Spec.Template.Spec.Containers[0], p.Port.StrVal); !ok {
						c.errorf("%s: port %s is not a port of StatefulSet %s's pods: the rule matches nothing there", where, p.Port.StrVal, sts.Name)
					}
				}
			}
		}
	}
	var nodes, logstores *appsv1.StatefulSet
	for _, name := range sortedKeys(c.o.statefulSets) {
		sts := c.o.statefulSets[name]
		switch sts.Spec.Template.Labels[componentLabel] {
		case nodeComponent:
			nodes = sts
		case logstoreComponent:
			logstores = sts
		}
		if !c.policySelects(sts) {
			c.errorf("StatefulSet %s: no NetworkPolicy selects its pods, while others have one", sts.Name)
		}
	}
	if nodes == nil || logstores == nil {
		return
	}
	here := map[string]string{corev1.LabelMetadataName: c.namespace}
	var (
		node     = source{"a data node", c.namespace, nodes.Spec.Template.Labels, here}
		logstore = source{"a log store", c.namespace, logstores.Spec.Template.Labels, here}
		admin    = source{"an admin pod (walship.io/admin=true)", c.namespace, map[string]string{"walship.io/admin": "true"}, here}
		client   = source{"a client in another namespace", "apps", map[string]string{"app": "shop"}, map[string]string{corev1.LabelMetadataName: "apps"}}
		prom     = source{"Prometheus (app.kubernetes.io/name=prometheus) in another namespace", "monitoring",
			map[string]string{"app.kubernetes.io/name": "prometheus"}, map[string]string{corev1.LabelMetadataName: "monitoring"}}
	)
	for _, f := range []flow{
		{client, nodes, "grpc"}, {node, nodes, "grpc"}, {node, logstores, "grpc"}, {logstore, logstores, "grpc"},
		{admin, logstores, "grpc"}, {prom, nodes, "metrics"}, {prom, logstores, "metrics"},
	} {
		if !c.allows(f) {
			c.errorf("NetworkPolicies: %s is refused; walship needs it", f)
		}
	}
	for _, f := range []flow{{client, logstores, "grpc"}, {client, nodes, "metrics"}, {client, logstores, "metrics"}} {
		if c.allows(f) {
			c.errorf("NetworkPolicies: %s is let through", f)
		}
	}
}

func hasPolicyType(np *networkingv1.NetworkPolicy, t networkingv1.PolicyType) bool {
	if len(np.Spec.PolicyTypes) == 0 {
		return t == networkingv1.PolicyTypeIngress // the default
	}
	for _, pt := range np.Spec.PolicyTypes {
		if pt == t {
			return true
		}
	}
	return false
}

// policySelects says whether an ingress policy selects sts's pods.
func (c *checker) policySelects(sts *appsv1.StatefulSet) bool {
	for _, np := range c.o.networkPolicies {
		sel, err := metav1.LabelSelectorAsSelector(&np.Spec.PodSelector)
		if err == nil && hasPolicyType(np, networkingv1.PolicyTypeIngress) && sel.Matches(labels.Set(sts.Spec.Template.Labels)) {
			return true
		}
	}
	return false
}

// allows evaluates the build's NetworkPolicies for f: a pod no ingress
// policy selects takes every connection; one that some select takes those
// that a rule of one of them matches, by port and by source.
func (c *checker) allows(f flow) bool {
	ct := &f.to.Spec.Template.Spec.Containers[0]
	port, ok := containerPort(ct, f.port)
	if !ok {
		return false
	}
	selected := false
	for _, name := range sortedKeys(c.o.networkPolicies) {
		np := c.o.networkPolicies[name]
		sel, err := metav1.LabelSelectorAsSelector(&np.Spec.PodSelector)
		if err != nil || !hasPolicyType(np, networkingv1.PolicyTypeIngress) || !sel.Matches(labels.Set(f.to.Spec.Template.Labels)) {
			continue
		}
		selected = true
		for _, rule := range np.Spec.Ingress {
			if portsMatch(rule.Ports, ct, port) && peersMatch(rule.From, np.Namespace, f.from) {
				return true
			}
		}
	}
	return !selected
}

func portsMatch(ports []networkingv1.NetworkPolicyPort, ct *corev1.Container, port int32) bool {
	if len(ports) == 0 {
		return true
	}
	for _, p := range ports {
		if p.Protocol != nil && *p.Protocol != corev1.ProtocolTCP {
			continue
		}
		switch {
		case p.Port == nil:
			return true
		case p.Port.StrVal != "":
			if n, ok := containerPort(ct, p.Port.StrVal); ok && n == port {
				return true
			}
		case p.EndPort != nil:
			if p.Port.IntVal <= port && port <= *p.EndPort {
				return true
			}
		case p.Port.IntVal == port:
			return true
		}
	}
	return false
}

// peersMatch: a peer with a podSelector alone means pods of the policy's
// namespace; with a namespaceSelector, of the namespaces it selects. An
// ipBlock never matches a pod here (pod addresses are not known).
func peersMatch(peers []networkingv1.NetworkPolicyPeer, policyNS string, from source) bool {
	if len(peers) == 0 {
		return true
	}
	for _, p := range peers {
		if p.IPBlock != nil {
			continue
		}
		nsOK := from.namespace == policyNS
		if p.NamespaceSelector != nil {
			sel, err := metav1.LabelSelectorAsSelector(p.NamespaceSelector)
			nsOK = err == nil && sel.Matches(labels.Set(from.ns))
		}
		podOK := true
		if p.PodSelector != nil {
			sel, err := metav1.LabelSelectorAsSelector(p.PodSelector)
			podOK = err == nil && sel.Matches(labels.Set(from.pod))
		}
		if nsOK && podOK {
			return true
		}
	}
	return false
}
