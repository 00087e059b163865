package deploytest

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// optionsOverlay writes an overlay on top of overlays/prod that adds the
// optional components, with components/storage-class copied next to it
// and its STORAGE_CLASS set to class, as a user would, and returns its
// directory.
func optionsOverlay(t testing.TB, class string) string {
	t.Helper()
	root := repoRoot(t)
	dir := t.TempDir()
	// kustomize takes relative paths only.
	rel := func(p string) string {
		r, err := filepath.Rel(dir, filepath.Join(root, p))
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	src := filepath.Join(root, "deploy/k8s/components/storage-class")
	if err := os.MkdirAll(filepath.Join(dir, "storage-class"), 0o755); err != nil {
		t.Fatal(err)
	}
	comp, err := os.ReadFile(filepath.Join(src, "kustomization.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	files := map[string]string{
		"storage-class/kustomization.yaml": string(comp),
		"storage-class/storage-class.env":  "STORAGE_CLASS=" + class + "\n",
		"kustomization.yaml": `apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
resources:
  - ` + rel("deploy/k8s/overlays/prod") + `
components:
  - storage-class
  - ` + rel("deploy/k8s/components/zone-strict") + `
`,
	}
	for name, data := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// TestOptionalComponents: prod with components/storage-class (its value
// set by the overlay) and components/zone-strict passes every check; every
// volume gets the class, the parameter's ConfigMap is not applied, and the
// zone spread becomes a rule over at least three zones while the hostname
// spread stays as it was.
func TestOptionalComponents(t *testing.T) {
	const class = "fast-ssd"
	docs := kustomizeBuild(t, optionsOverlay(t, class))
	o, err := decodeObjects(docs)
	if err != nil {
		t.Fatal(err)
	}
	ns := overlayWants["prod"].namespace
	for _, err := range check(o, ns) {
		t.Error(err)
	}
	for name := range o.configMaps {
		if strings.HasPrefix(name, "walship-storage-class") {
			t.Errorf("ConfigMap %s is in the build: the parameter is local-config, never applied", name)
		}
	}
	if len(o.statefulSets) != 2 {
		t.Fatalf("%d StatefulSets, want 2", len(o.statefulSets))
	}
	for _, name := range sortedKeys(o.statefulSets) {
		sts := o.statefulSets[name]
		for _, vct := range sts.Spec.VolumeClaimTemplates {
			if got := vct.Spec.StorageClassName; got == nil || *got != class {
				t.Errorf("StatefulSet %s volumeClaimTemplate %s: storageClassName %v, want %s", name, vct.Name, got, class)
			}
		}
		got := map[string]corev1.TopologySpreadConstraint{}
		for _, c := range sts.Spec.Template.Spec.TopologySpreadConstraints {
			got[c.TopologyKey] = c
		}
		if len(got) != 2 || len(sts.Spec.Template.Spec.TopologySpreadConstraints) != 2 {
			t.Errorf("StatefulSet %s: topologySpreadConstraints %v, want one per hostname and one per zone", name, got)
		}
		zone := got[corev1.LabelTopologyZone]
		if zone.WhenUnsatisfiable != corev1.DoNotSchedule || zone.MaxSkew != 1 || ptrOr(zone.MinDomains, 0) != 3 || zone.LabelSelector == nil ||
			zone.NodeTaintsPolicy == nil || *zone.NodeTaintsPolicy != corev1.NodeInclusionPolicyHonor {
			t.Errorf("StatefulSet %s: zone constraint %+v; want DoNotSchedule, maxSkew 1, minDomains 3, the base's selector and taints policy", name, zone)
		}
		if host := got[corev1.LabelHostname]; host.WhenUnsatisfiable != corev1.DoNotSchedule || host.LabelSelector == nil {
			t.Errorf("StatefulSet %s: hostname constraint %+v changed", name, host)
		}
	}
	// Without the component, the base's volumes take the default class
	// and its zone spread is a preference.
	prod := buildOverlay(t, overlayDirs(t)["prod"])
	for _, name := range sortedKeys(prod.statefulSets) {
		sts := prod.statefulSets[name]
		if c := sts.Spec.VolumeClaimTemplates[0].Spec.StorageClassName; c != nil {
			t.Errorf("prod StatefulSet %s: storageClassName %q without components/storage-class", name, *c)
		}
		for _, c := range sts.Spec.Template.Spec.TopologySpreadConstraints {
			if c.TopologyKey == corev1.LabelTopologyZone && c.WhenUnsatisfiable != corev1.ScheduleAnyway {
				t.Errorf("prod StatefulSet %s: zone spread %s without components/zone-strict", name, c.WhenUnsatisfiable)
			}
		}
	}
}

// TestNetworkPolicyChecksCatchMistakes: the NetworkPolicy checks see a
// policy that cuts a connection walship needs, or lets through one it
// exists to stop.
func TestNetworkPolicyChecksCatchMistakes(t *testing.T) {
	docs := kustomizeBuild(t, overlayDirs(t)["prod"])
	ns := overlayWants["prod"].namespace
	if o, err := decodeObjects(docs); err != nil {
		t.Fatal(err)
	} else if errs := check(o, ns); len(errs) > 0 {
		t.Fatalf("the prod overlay itself fails: %v", errs)
	}
	ls := func(o *objects) *networkingv1.NetworkPolicy { return o.networkPolicies["walship-logstore"] }
	node := func(o *objects) *networkingv1.NetworkPolicy { return o.networkPolicies["walship-node"] }
	checkMistakes(t, docs, ns, []mistake{
		{"log stores cannot refill from each other", func(o *objects) {
			ls(o).Spec.Ingress[0].From = ls(o).Spec.Ingress[0].From[:1]
		}, "a log store → StatefulSet walship-logstore port grpc is refused"},
		{"log stores open to every client", func(o *objects) {
			ls(o).Spec.Ingress[0].From = nil
		}, "a client in another namespace → StatefulSet walship-logstore port grpc is let through"},
		{"metrics open to every client", func(o *objects) {
			node(o).Spec.Ingress[2].From = nil
		}, "a client in another namespace → StatefulSet walship port metrics is let through"},
		{"Prometheus only from the namespace itself", func(o *objects) {
			node(o).Spec.Ingress[2].From[0].NamespaceSelector = nil
		}, "Prometheus (app.kubernetes.io/name=prometheus) in another namespace → StatefulSet walship port metrics is refused"},
		{"clients cut off", func(o *objects) {
			node(o).Spec.Ingress = node(o).Spec.Ingress[:1]
		}, "a client in another namespace → StatefulSet walship port grpc is refused"},
		{"a misspelt port", func(o *objects) {
			p := intstr.FromString("gprc")
			ls(o).Spec.Ingress[0].Ports[0].Port = &p
		}, "port gprc is not a port of StatefulSet walship-logstore's pods"},
		{"a policy that selects nothing", func(o *objects) {
			ls(o).Spec.PodSelector.MatchLabels[componentLabel] = "log-store"
		}, "NetworkPolicy walship-logstore: podSelector selects no walship pods"},
		{"a missing PriorityClass", func(o *objects) {
			delete(o.priorityClasses, "walship")
		}, `priorityClassName "walship": no such PriorityClass`},
	})
}
