package deploytest

import (
	"bytes"
	"os"
	"path/filepath"
	"reflect"
	"sort"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// overlayWant is what the issue asks of each overlay.
type overlayWant struct {
	namespace   string
	replicas    map[string]int32 // per StatefulSet
	logstoreAck string           // the primary's --logstore-ack
	monitoring  bool             // PodMonitor, PrometheusRule and dashboard included
	tls         bool             // mTLS with cert-manager certificates (components/tls)
	// antiAffinity: no two pods of one StatefulSet on a node.
	antiAffinity bool
	// maxMemoryLimit bounds every container's memory limit ("" = no bound).
	maxMemoryLimit string
}

var overlayWants = map[string]overlayWant{
	"dev": {
		namespace:      "walship-dev",
		replicas:       map[string]int32{"walship-logstore": 1, "walship-primary": 1, "walship-replica": 2},
		logstoreAck:    "async",
		maxMemoryLimit: "512Mi",
	},
	"prod": {
		namespace:    "walship",
		replicas:     map[string]int32{"walship-logstore": 3, "walship-primary": 1, "walship-replica": 3},
		logstoreAck:  "sync",
		monitoring:   true,
		tls:          true,
		antiAffinity: true,
	},
}

// overlayDirs lists deploy/k8s/overlays/*, so a new overlay is built and
// checked (and must be given expectations) without editing the test.
func overlayDirs(t *testing.T) map[string]string {
	t.Helper()
	root := repoRoot(t)
	entries, err := os.ReadDir(filepath.Join(root, "deploy", "k8s", "overlays"))
	if err != nil {
		t.Fatal(err)
	}
	dirs := map[string]string{}
	for _, e := range entries {
		if e.IsDir() {
			dirs[e.Name()] = filepath.Join(root, "deploy", "k8s", "overlays", e.Name())
		}
	}
	if len(dirs) == 0 {
		t.Fatal("no overlays under deploy/k8s/overlays")
	}
	return dirs
}

func buildOverlay(t *testing.T, dir string) *objects {
	t.Helper()
	o, err := decodeObjects(kustomizeBuild(t, dir))
	if err != nil {
		t.Fatalf("kustomize build %s: %v", dir, err)
	}
	return o
}

// TestOverlays builds every overlay with the kustomize library, decodes
// every object strictly into its API type, and checks that the pieces fit
// and that each overlay is what it promises.
func TestOverlays(t *testing.T) {
	for name, dir := range overlayDirs(t) {
		t.Run(name, func(t *testing.T) {
			want, ok := overlayWants[name]
			if !ok {
				t.Fatalf("overlay %s has no expectations in overlayWants", name)
			}
			o := buildOverlay(t, dir)
			for _, err := range check(o, want.namespace) {
				t.Error(err)
			}
			checkOverlayWant(t, o, want)
		})
	}
}

func checkOverlayWant(t *testing.T, o *objects, want overlayWant) {
	t.Helper()
	if got := len(o.certificates) > 0; got != want.tls {
		t.Errorf("%d Certificates; want TLS: %v", len(o.certificates), want.tls)
	}
	var got []string
	for _, name := range sortedKeys(o.statefulSets) {
		got = append(got, name)
	}
	var wantNames []string
	for name := range want.replicas {
		wantNames = append(wantNames, name)
	}
	sort.Strings(wantNames)
	if !reflect.DeepEqual(got, wantNames) {
		t.Errorf("StatefulSets %v, want %v", got, wantNames)
	}
	for name, n := range want.replicas {
		sts := o.statefulSets[name]
		if sts == nil {
			continue
		}
		if r := ptrOr(sts.Spec.Replicas, 1); r != n {
			t.Errorf("StatefulSet %s: %d replicas, want %d", name, r, n)
		}
		if want.maxMemoryLimit != "" {
			max := resource.MustParse(want.maxMemoryLimit)
			for _, ct := range sts.Spec.Template.Spec.Containers {
				if l := ct.Resources.Limits[corev1.ResourceMemory]; l.Cmp(max) > 0 {
					t.Errorf("StatefulSet %s: memory limit %s above %s", name, l.String(), want.maxMemoryLimit)
				}
			}
		}
		if want.antiAffinity {
			checkAntiAffinity(t, sts)
		}
	}
	c := &checker{o: o, namespace: want.namespace}
	if sts := o.statefulSets["walship-primary"]; sts != nil {
		p, err := c.podConfig(sts, 0)
		if err != nil {
			t.Fatal(err)
		}
		if ack := p.flags.Lookup("logstore-ack").Value.String(); ack != want.logstoreAck {
			t.Errorf("primary --logstore-ack %s, want %s", ack, want.logstoreAck)
		}
		if want.logstoreAck == "sync" && want.replicas["walship-logstore"] < 3 {
			t.Errorf("--logstore-ack sync (majority) with %d log stores survives no failure", want.replicas["walship-logstore"])
		}
	}
	hasMonitoring := len(o.podMonitors)+len(o.serviceMonitors) > 0
	if hasMonitoring != want.monitoring || (len(o.rules) > 0) != want.monitoring || (o.configMaps["walship-grafana-dashboard"] != nil) != want.monitoring {
		t.Errorf("monitoring objects: %d PodMonitors, %d ServiceMonitors, %d PrometheusRules, dashboard %v; want them: %v",
			len(o.podMonitors), len(o.serviceMonitors), len(o.rules), o.configMaps["walship-grafana-dashboard"] != nil, want.monitoring)
	}
	if want.monitoring {
		checkMonitoringSources(t, o)
	}
}

// checkAntiAffinity: a required anti-affinity term on the node keeps two
// pods of the StatefulSet apart; its selector must match those very pods,
// or it keeps nothing apart.
func checkAntiAffinity(t *testing.T, sts *appsv1.StatefulSet) {
	t.Helper()
	aff := sts.Spec.Template.Spec.Affinity
	if aff == nil || aff.PodAntiAffinity == nil {
		t.Errorf("StatefulSet %s: no podAntiAffinity", sts.Name)
		return
	}
	for _, term := range aff.PodAntiAffinity.RequiredDuringSchedulingIgnoredDuringExecution {
		sel, err := metav1.LabelSelectorAsSelector(term.LabelSelector)
		if err == nil && !sel.Empty() && term.TopologyKey == corev1.LabelHostname && sel.Matches(labels.Set(sts.Spec.Template.Labels)) {
			return
		}
	}
	t.Errorf("StatefulSet %s: no required anti-affinity on %s whose selector matches its own pods", sts.Name, corev1.LabelHostname)
}

// checkMonitoringSources: the PrometheusRule holds exactly the rules of
// deploy/prometheus/walship-rules.yaml and the dashboard ConfigMap exactly
// deploy/grafana/walship.json, whatever the generated files say.
func checkMonitoringSources(t *testing.T, o *objects) {
	t.Helper()
	root := repoRoot(t)
	rulesFile, err := os.ReadFile(filepath.Join(root, RulesFile))
	if err != nil {
		t.Fatal(err)
	}
	want, err := DecodeRules(rulesFile)
	if err != nil {
		t.Fatal(err)
	}
	if len(o.rules) != 1 {
		t.Fatalf("%d PrometheusRules, want 1", len(o.rules))
	}
	for name, pr := range o.rules {
		if !reflect.DeepEqual(pr.Spec, want) {
			t.Errorf("PrometheusRule %s differs from %s: run make manifests", name, RulesFile)
		}
		var n int
		for _, g := range pr.Spec.Groups {
			n += len(g.Rules)
		}
		t.Logf("PrometheusRule %s: %d groups, %d rules, as in %s", name, len(pr.Spec.Groups), n, RulesFile)
	}
	dash, err := os.ReadFile(filepath.Join(root, DashboardFile))
	if err != nil {
		t.Fatal(err)
	}
	cm := o.configMaps["walship-grafana-dashboard"]
	if cm == nil {
		t.Fatal("no walship-grafana-dashboard ConfigMap")
	}
	if cm.Labels["grafana_dashboard"] != "1" {
		t.Errorf("ConfigMap %s: no label grafana_dashboard=1, so Grafana's sidecar ignores it", cm.Name)
	}
	if cm.Data[DashboardKey] != string(dash) {
		t.Errorf("ConfigMap %s key %s differs from %s: run make manifests", cm.Name, DashboardKey, DashboardFile)
	}
}

// TestGeneratedManifestsUpToDate fails when a generated monitoring manifest
// differs from what its source produces now.
func TestGeneratedManifestsUpToDate(t *testing.T) {
	root := repoRoot(t)
	files, err := Generate(root)
	if err != nil {
		t.Fatal(err)
	}
	for path, want := range files {
		got, err := os.ReadFile(filepath.Join(root, path))
		if err != nil {
			t.Errorf("%v (run make manifests)", err)
			continue
		}
		if !bytes.Equal(got, want) {
			t.Errorf("%s is stale: run make manifests", path)
		}
	}
}

// TestStrictDecodeRejects shows the decoder rejects what the API server's
// strict field validation rejects.
func TestStrictDecodeRejects(t *testing.T) {
	const good = `{"apiVersion":"v1","kind":"Service","metadata":{"name":"s"},"spec":{"ports":[{"port":1}]}}`
	if _, err := decodeObjects([][]byte{[]byte(good)}); err != nil {
		t.Fatalf("a valid Service: %v", err)
	}
	for _, tc := range []struct{ name, doc, want string }{
		{"misspelled field", `{"apiVersion":"v1","kind":"Service","metadata":{"name":"s"},"spec":{"prots":[{"port":1}]}}`, `unknown field "spec.prots"`},
		{"wrong case", `{"apiVersion":"v1","kind":"Service","metadata":{"name":"s"},"spec":{"Ports":[{"port":1}]}}`, `unknown field "spec.Ports"`},
		{"duplicate field", `{"apiVersion":"v1","kind":"Service","metadata":{"name":"s"},"spec":{"ports":[],"ports":[]}}`, `duplicate field "spec.ports"`},
		{"wrong type", `{"apiVersion":"v1","kind":"Service","metadata":{"name":"s"},"spec":{"ports":[{"port":"x"}]}}`, `cannot unmarshal`},
		{"unknown kind", `{"apiVersion":"apps/v1","kind":"Deployment","metadata":{"name":"d"}}`, `kind not known to the test`},
		{"misspelled CRD field", `{"apiVersion":"monitoring.coreos.com/v1","kind":"PodMonitor","metadata":{"name":"p"},"spec":{"selector":{},"podMetricsEndpoints":[{"prot":"metrics"}]}}`, `unknown field`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := decodeObjects([][]byte{[]byte(tc.doc)})
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("got %v, want an error containing %q", err, tc.want)
			}
		})
	}
}

// TestChecksCatchMistakes breaks the dev overlay one way at a time and
// expects the checks to name the mistake: they would otherwise pass by
// checking nothing.
func TestChecksCatchMistakes(t *testing.T) {
	dir := overlayDirs(t)["dev"]
	docs := kustomizeBuild(t, dir)
	ns := overlayWants["dev"].namespace
	if o, err := decodeObjects(docs); err != nil {
		t.Fatal(err)
	} else if errs := check(o, ns); len(errs) > 0 {
		t.Fatalf("the dev overlay itself fails: %v", errs)
	}
	primary := func(o *objects) *corev1.Container {
		return &o.statefulSets["walship-primary"].Spec.Template.Spec.Containers[0]
	}
	replica := func(o *objects) *corev1.Container {
		return &o.statefulSets["walship-replica"].Spec.Template.Spec.Containers[0]
	}
	configMap := func(o *objects, prefix string) *corev1.ConfigMap { return configMapOf(t, o, prefix) }
	checkMistakes(t, docs, ns, []mistake{
		{"unknown flag in args", func(o *objects) { primary(o).Args = append(primary(o).Args, "--no-such-flag=1") },
			"flag provided but not defined: -no-such-flag"},
		{"bad flag value", func(o *objects) { primary(o).Args = append(primary(o).Args, "--durability=sometimes") },
			`"sometimes" is not one of`},
		{"unknown flag from the ConfigMap", func(o *objects) { configMap(o, "walship-primary").Data["WALSHIP_SYNC_REPLICA"] = "1" },
			"has no flag --sync-replica"},
		{"log store flag given to the primary", func(o *objects) { configMap(o, "walship-primary").Data["WALSHIP_RETENTION_AGE"] = "1h" },
			"has no flag --retention-age"},
		{"undefined $(VAR)", func(o *objects) { replica(o).Args = append(replica(o).Args, "--id=$(POD_NAME)") },
			"$(POD_NAME) is not defined"},
		{"missing ConfigMap", func(o *objects) { replica(o).EnvFrom[0].ConfigMapRef.Name = "nope" },
			"envFrom: no ConfigMap nope"},
		{"missing ConfigMap key", func(o *objects) {
			replica(o).Env = append(replica(o).Env, corev1.EnvVar{Name: "WALSHIP_LOG_LEVEL", ValueFrom: &corev1.EnvVarSource{
				ConfigMapKeyRef: &corev1.ConfigMapKeySelector{LocalObjectReference: corev1.LocalObjectReference{Name: configMap(o, "walship-replica").Name}, Key: "level"}}})
		}, `no key "level"`},
		{"probe on the wrong port", func(o *objects) { primary(o).ReadinessProbe.GRPC.Port = 7400 },
			"readinessProbe port 7400, but gRPC is served on 7401"},
		{"listen elsewhere than the container port", func(o *objects) { primary(o).Args = append(primary(o).Args, "--listen=:8000") },
			"--listen :8000, but container port grpc is 7401"},
		{"Service targetPort", func(o *objects) { o.services["walship-primary"].Spec.Ports[0].TargetPort = intstr.FromString("grcp") },
			"targetPort grcp is not a port"},
		{"selector misses the pods", func(o *objects) {
			o.statefulSets["walship-replica"].Spec.Selector.MatchLabels[componentLabel] = "replicas"
		}, "does not match the pod labels"},
		{"Service selects nothing", func(o *objects) { o.services["walship-replicas"].Spec.Selector[componentLabel] = "replicas" },
			"Service walship-replicas: selects the pods of 0 StatefulSets"},
		{"PVC mount without a claim", func(o *objects) { primary(o).VolumeMounts[0].Name = "wal" },
			"volumeMount wal: no such volume"},
		{"log store missing from the primary's list", func(o *objects) {
			r := int32(2)
			o.statefulSets["walship-logstore"].Spec.Replicas = &r
		}, "names 1 log store pods, but StatefulSet walship-logstore runs 2"},
		{"primary points at a pod that does not exist", func(o *objects) {
			configMap(o, "walship-replica").Data["WALSHIP_PRIMARY"] = "walship-primary-1.walship-primary-headless:7401"
		}, "pod walship-primary-1 does not exist"},
		{"replica follows a log store", func(o *objects) {
			configMap(o, "walship-replica").Data["WALSHIP_PRIMARY"] = "walship-logstore-0.walship-logstore-headless:7400"
		}, "is a logstore, want a primary"},
		{"writable root filesystem", func(o *objects) { f := false; primary(o).SecurityContext.ReadOnlyRootFilesystem = &f },
			"readOnlyRootFilesystem is not true"},
		{"retention larger than the volume", func(o *objects) { configMap(o, "walship-logstore").Data["WALSHIP_RETENTION_BYTES"] = "1099511627776" },
			"exceeds 80% of the 1Gi volume"},
		{"missing label", func(o *objects) { delete(o.services["walship-primary"].Labels, "app.kubernetes.io/part-of") },
			"Service walship-primary: no label app.kubernetes.io/part-of"},
	})
}

// TestTLSChecksCatchMistakes: the prod overlay (mTLS with cert-manager)
// passes; each mistake below in its TLS wiring is caught.
func TestTLSChecksCatchMistakes(t *testing.T) {
	docs := kustomizeBuild(t, overlayDirs(t)["prod"])
	ns := overlayWants["prod"].namespace
	o, err := decodeObjects(docs)
	if err != nil {
		t.Fatal(err)
	}
	if len(o.certificates) == 0 {
		t.Fatal("the prod overlay has no Certificates")
	}
	if errs := check(o, ns); len(errs) > 0 {
		t.Fatalf("the prod overlay itself fails: %v", errs)
	}
	logstore := func(o *objects) *corev1.Container {
		return &o.statefulSets["walship-logstore"].Spec.Template.Spec.Containers[0]
	}
	configMap := func(o *objects, prefix string) *corev1.ConfigMap { return configMapOf(t, o, prefix) }
	checkMistakes(t, docs, ns, []mistake{
		{"subPath mount", func(o *objects) {
			for i, vm := range logstore(o).VolumeMounts {
				if vm.Name == "tls" {
					logstore(o).VolumeMounts[i].SubPath = "tls.crt"
				}
			}
		}, "mounted with subPath"},
		{"no client auth", func(o *objects) { o.certificates["walship-node"].Spec.Usages = []string{"server auth"} }, `lacks the usage "client auth"`},
		{"log stores with the node identity", func(o *objects) {
			for i := range o.statefulSets["walship-logstore"].Spec.Template.Spec.Volumes {
				if v := &o.statefulSets["walship-logstore"].Spec.Template.Spec.Volumes[i]; v.Secret != nil {
					v.Secret.SecretName = "walship-node-tls"
				}
			}
		}, "want one SPIFFE ID under spiffe://walship.local/walship/logstore/"},
		{"another trust domain", func(o *objects) { configMap(o, "walship-primary").Data["WALSHIP_TRUST_DOMAIN"] = "example.org" }, "under spiffe://example.org/walship/node/"},
		{"plaintext beside TLS", func(o *objects) { configMap(o, "walship-replica").Data["WALSHIP_PLAINTEXT"] = "true" }, "WALSHIP_PLAINTEXT=true beside the TLS flags"},
		{"pod not named", func(o *objects) { o.certificates["walship-logstore"].Spec.DNSNames = []string{"walship-logstore"} }, "does not name walship-logstore-0.walship-logstore-headless"},
		{"gRPC probe under TLS", func(o *objects) {
			p := logstore(o).ReadinessProbe
			p.HTTPGet, p.GRPC = nil, &corev1.GRPCAction{Port: 7400}
		}, "readinessProbe must be an HTTP probe of /readyz under TLS"},
		{"issuer missing", func(o *objects) { delete(o.issuers, "walship-ca") }, `issuerRef Issuer "walship-ca" is not an Issuer`},
	})
}

// mistake is one way to break a built overlay, and the error it must draw.
type mistake struct {
	name   string
	break_ func(o *objects)
	want   string
}

// checkMistakes breaks a fresh decode of docs in each way and wants the
// checks to report it.
func checkMistakes(t *testing.T, docs [][]byte, ns string, ms []mistake) {
	t.Helper()
	for _, tc := range ms {
		t.Run(tc.name, func(t *testing.T) {
			o, err := decodeObjects(docs)
			if err != nil {
				t.Fatal(err)
			}
			tc.break_(o)
			errs := check(o, ns)
			for _, err := range errs {
				if strings.Contains(err.Error(), tc.want) {
					return
				}
			}
			t.Errorf("no error containing %q; got %v", tc.want, errs)
		})
	}
}

// configMapOf is the ConfigMap whose (hashed) name starts with prefix.
func configMapOf(t *testing.T, o *objects, prefix string) *corev1.ConfigMap {
	t.Helper()
	for name, cm := range o.configMaps {
		if strings.HasPrefix(name, prefix) {
			return cm
		}
	}
	t.Fatalf("no ConfigMap %s*", prefix)
	return nil
}

func TestExpand(t *testing.T) {
	env := map[string]string{"A": "x", "POD": "walship-replica-0"}
	for _, tc := range []struct{ in, want, err string }{
		{in: "--id=$(POD)", want: "--id=walship-replica-0"},
		{in: "$(A)$(A)", want: "xx"},
		{in: "$$(A)", want: "$(A)"},
		{in: "cost $5", want: "cost $5"},
		{in: "trailing $", want: "trailing $"},
		{in: "$(B)", err: "$(B) is not defined"},
		{in: "$(A", err: "unterminated"},
	} {
		got, err := expand(tc.in, env, nil)
		switch {
		case tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)):
			t.Errorf("expand(%q): error %v, want %q", tc.in, err, tc.err)
		case tc.err == "" && (err != nil || got != tc.want):
			t.Errorf("expand(%q) = %q, %v; want %q", tc.in, got, err, tc.want)
		}
	}
}
