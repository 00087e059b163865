package deploytest

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"testing"

	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	schedulingv1 "k8s.io/api/scheduling/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/kyaml/filesys"
)

// repoRoot is the repository root: tests run in the package directory.
func repoRoot(t testing.TB) string {
	t.Helper()
	root, err := filepath.Abs(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(root, "go.mod")); err != nil {
		t.Fatalf("repository root not found from %s: %v", root, err)
	}
	return root
}

// kustomizeBuild builds the kustomization in dir with the kustomize
// library, with the defaults of `kubectl kustomize` (files only from inside
// the kustomization root), and returns each object as JSON.
func kustomizeBuild(t testing.TB, dir string) [][]byte {
	t.Helper()
	k := krusty.MakeKustomizer(krusty.MakeDefaultOptions())
	m, err := k.Run(filesys.MakeFsOnDisk(), dir)
	if err != nil {
		t.Fatalf("kustomize build %s: %v", dir, err)
	}
	var docs [][]byte
	for _, r := range m.Resources() {
		j, err := r.MarshalJSON()
		if err != nil {
			t.Fatalf("kustomize build %s: %s: %v", dir, r.CurId(), err)
		}
		docs = append(docs, j)
	}
	return docs
}

// objects is one build's objects, each decoded into its API type.
type objects struct {
	namespaces      map[string]*corev1.Namespace
	serviceAccounts map[string]*corev1.ServiceAccount
	configMaps      map[string]*corev1.ConfigMap
	secrets         map[string]*corev1.Secret
	services        map[string]*corev1.Service
	statefulSets    map[string]*appsv1.StatefulSet
	pdbs            map[string]*policyv1.PodDisruptionBudget
	roles           map[string]*rbacv1.Role
	roleBindings    map[string]*rbacv1.RoleBinding
	clusterRoles    map[string]*rbacv1.ClusterRole
	clusterBindings map[string]*rbacv1.ClusterRoleBinding
	podMonitors     map[string]*monitoringv1.PodMonitor
	serviceMonitors map[string]*monitoringv1.ServiceMonitor
	rules           map[string]*monitoringv1.PrometheusRule
	certificates    map[string]*cmCertificate
	issuers         map[string]*cmIssuer
	networkPolicies map[string]*networkingv1.NetworkPolicy
	priorityClasses map[string]*schedulingv1.PriorityClass
}

// kindKey names an API type as apiVersion/kind.
type kindKey struct{ apiVersion, kind string }

// decodeObjects decodes every document strictly into its typed API struct:
// an unknown kind, an unknown or misspelled field, a field in the wrong case
// or a duplicate field is an error, as `kubectl apply` with server-side
// field validation would report it.
func decodeObjects(docs [][]byte) (*objects, error) {
	o := &objects{
		namespaces:      map[string]*corev1.Namespace{},
		serviceAccounts: map[string]*corev1.ServiceAccount{},
		configMaps:      map[string]*corev1.ConfigMap{},
		secrets:         map[string]*corev1.Secret{},
		services:        map[string]*corev1.Service{},
		statefulSets:    map[string]*appsv1.StatefulSet{},
		pdbs:            map[string]*policyv1.PodDisruptionBudget{},
		roles:           map[string]*rbacv1.Role{},
		roleBindings:    map[string]*rbacv1.RoleBinding{},
		clusterRoles:    map[string]*rbacv1.ClusterRole{},
		clusterBindings: map[string]*rbacv1.ClusterRoleBinding{},
		podMonitors:     map[string]*monitoringv1.PodMonitor{},
		serviceMonitors: map[string]*monitoringv1.ServiceMonitor{},
		rules:           map[string]*monitoringv1.PrometheusRule{},
		certificates:    map[string]*cmCertificate{},
		issuers:         map[string]*cmIssuer{},
		networkPolicies: map[string]*networkingv1.NetworkPolicy{},
		priorityClasses: map[string]*schedulingv1.PriorityClass{},
	}
	for _, doc := range docs {
		var tm metav1.TypeMeta
		if err := json.Unmarshal(doc, &tm); err != nil {
			return nil, err
		}
		var meta struct {
			Metadata struct{ Name string } `json:"metadata"`
		}
		_ = json.Unmarshal(doc, &meta)
		name := meta.Metadata.Name
		var err error
		switch (kindKey{tm.APIVersion, tm.Kind}) {
		case kindKey{"v1", "Namespace"}:
			err = decodeInto(doc, name, o.namespaces)
		case kindKey{"v1", "ServiceAccount"}:
			err = decodeInto(doc, name, o.serviceAccounts)
		case kindKey{"v1", "ConfigMap"}:
			err = decodeInto(doc, name, o.configMaps)
		case kindKey{"v1", "Secret"}:
			err = decodeInto(doc, name, o.secrets)
		case kindKey{"v1", "Service"}:
			err = decodeInto(doc, name, o.services)
		case kindKey{"apps/v1", "StatefulSet"}:
			err = decodeInto(doc, name, o.statefulSets)
		case kindKey{"policy/v1", "PodDisruptionBudget"}:
			err = decodeInto(doc, name, o.pdbs)
		case kindKey{"rbac.authorization.k8s.io/v1", "Role"}:
			err = decodeInto(doc, name, o.roles)
		case kindKey{"rbac.authorization.k8s.io/v1", "RoleBinding"}:
			err = decodeInto(doc, name, o.roleBindings)
		case kindKey{"rbac.authorization.k8s.io/v1", "ClusterRole"}:
			err = decodeInto(doc, name, o.clusterRoles)
		case kindKey{"rbac.authorization.k8s.io/v1", "ClusterRoleBinding"}:
			err = decodeInto(doc, name, o.clusterBindings)
		case kindKey{"monitoring.coreos.com/v1", "PodMonitor"}:
			err = decodeInto(doc, name, o.podMonitors)
		case kindKey{"monitoring.coreos.com/v1", "ServiceMonitor"}:
			err = decodeInto(doc, name, o.serviceMonitors)
		case kindKey{"monitoring.coreos.com/v1", "PrometheusRule"}:
			err = decodeInto(doc, name, o.rules)
		case kindKey{"cert-manager.io/v1", "Certificate"}:
			err = decodeInto(doc, name, o.certificates)
		case kindKey{"cert-manager.io/v1", "Issuer"}:
			err = decodeInto(doc, name, o.issuers)
		case kindKey{"networking.k8s.io/v1", "NetworkPolicy"}:
			err = decodeInto(doc, name, o.networkPolicies)
		case kindKey{"scheduling.k8s.io/v1", "PriorityClass"}:
			err = decodeInto(doc, name, o.priorityClasses)
		default:
			// A kind the test does not decode is not checked at all: add it
			// here (with its checks) rather than let it through.
			err = fmt.Errorf("%s %s: kind not known to the test", tm.APIVersion, tm.Kind)
		}
		if err != nil {
			return nil, err
		}
	}
	return o, nil
}

func decodeInto[T any](doc []byte, name string, into map[string]*T) error {
	v := new(T)
	if err := StrictJSON(doc, v); err != nil {
		return fmt.Errorf("%T %q: %w", v, name, err)
	}
	if _, dup := into[name]; dup {
		return fmt.Errorf("%T %q: defined twice", v, name)
	}
	into[name] = v
	return nil
}

// meta is the metadata of any object, for checks common to every kind.
type meta struct {
	kind string
	obj  *metav1.ObjectMeta
}

// all returns every object's kind and metadata, in a stable order.
func (o *objects) all() []meta {
	var ms []meta
	add := func(kind string, m *metav1.ObjectMeta) { ms = append(ms, meta{kind, m}) }
	for _, v := range o.namespaces {
		add("Namespace", &v.ObjectMeta)
	}
	for _, v := range o.serviceAccounts {
		add("ServiceAccount", &v.ObjectMeta)
	}
	for _, v := range o.configMaps {
		add("ConfigMap", &v.ObjectMeta)
	}
	for _, v := range o.secrets {
		add("Secret", &v.ObjectMeta)
	}
	for _, v := range o.services {
		add("Service", &v.ObjectMeta)
	}
	for _, v := range o.statefulSets {
		add("StatefulSet", &v.ObjectMeta)
	}
	for _, v := range o.pdbs {
		add("PodDisruptionBudget", &v.ObjectMeta)
	}
	for _, v := range o.roles {
		add("Role", &v.ObjectMeta)
	}
	for _, v := range o.roleBindings {
		add("RoleBinding", &v.ObjectMeta)
	}
	for _, v := range o.clusterRoles {
		add("ClusterRole", &v.ObjectMeta)
	}
	for _, v := range o.clusterBindings {
		add("ClusterRoleBinding", &v.ObjectMeta)
	}
	for _, v := range o.certificates {
		add("Certificate", &v.ObjectMeta)
	}
	for _, v := range o.issuers {
		add("Issuer", &v.ObjectMeta)
	}
	for _, v := range o.podMonitors {
		add("PodMonitor", &v.ObjectMeta)
	}
	for _, v := range o.serviceMonitors {
		add("ServiceMonitor", &v.ObjectMeta)
	}
	for _, v := range o.rules {
		add("PrometheusRule", &v.ObjectMeta)
	}
	for _, v := range o.networkPolicies {
		add("NetworkPolicy", &v.ObjectMeta)
	}
	for _, v := range o.priorityClasses {
		add("PriorityClass", &v.ObjectMeta)
	}
	sort.Slice(ms, func(i, j int) bool {
		if ms[i].kind != ms[j].kind {
			return ms[i].kind < ms[j].kind
		}
		return ms[i].obj.Name < ms[j].obj.Name
	})
	return ms
}

// sortedKeys returns m's keys in order, so that checks report in a stable order.
func sortedKeys[V any](m map[string]V) []string {
	ks := make([]string, 0, len(m))
	for k := range m {
		ks = append(ks, k)
	}
	sort.Strings(ks)
	return ks
}
