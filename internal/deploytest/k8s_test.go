package deploytest

import (
	"bytes"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"sort"
	"strings"
	"testing"

	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// overlayWant is what the issue asks of each overlay.
type overlayWant struct {
	namespace   string
	replicas    map[string]int32 // per StatefulSet
	logstoreAck string           // the data nodes' --logstore-ack
	kubeLease   string           // the data nodes' --kube-lease (automatic failover)
	monitoring  bool             // PodMonitor, PrometheusRule and dashboard included
	tls         bool             // mTLS with cert-manager certificates (components/tls)
	// antiAffinity: no two pods of one StatefulSet on a node.
	antiAffinity bool
	// maxMemoryLimit bounds every container's memory limit ("" = no bound).
	maxMemoryLimit string
	// networkPolicy: NetworkPolicies restrict who reaches which port
	// (checkNetworkPolicies says what they must allow and refuse).
	networkPolicy bool
	// priorityClass: every pod has a priorityClassName.
	priorityClass bool
}

var overlayWants = map[string]overlayWant{
	"dev": {
		namespace:      "walship-dev",
		replicas:       map[string]int32{"walship-logstore": 3, "walship": 3},
		logstoreAck:    "sync",
		kubeLease:      "walship",
		maxMemoryLimit: "512Mi",
	},
	"prod": {
		namespace:    "walship",
		replicas:     map[string]int32{"walship-logstore": 3, "walship": 3},
		logstoreAck:  "sync",
		kubeLease:    "walship",
		monitoring:   true,
		tls:          true,
		antiAffinity: true,
		// components/network-policy and components/priority-class.
		networkPolicy: true,
		priorityClass: true,
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
		if pc := sts.Spec.Template.Spec.PriorityClassName; (pc != "") != want.priorityClass {
			t.Errorf("StatefulSet %s: priorityClassName %q; want one: %v", name, pc, want.priorityClass)
		}
	}
	if got := len(o.networkPolicies) > 0; got != want.networkPolicy {
		t.Errorf("%d NetworkPolicies; want them: %v", len(o.networkPolicies), want.networkPolicy)
	}
	c := &checker{o: o, namespace: want.namespace}
	if sts := o.statefulSets["walship"]; sts != nil {
		p, err := c.podConfig(sts, 0)
		if err != nil {
			t.Fatal(err)
		}
		if ack := p.flag("logstore-ack"); ack != want.logstoreAck {
			t.Errorf("data node --logstore-ack %s, want %s", ack, want.logstoreAck)
		}
		if want.logstoreAck == "sync" && want.replicas["walship-logstore"] < 3 {
			t.Errorf("--logstore-ack sync (majority) with %d log stores survives no failure", want.replicas["walship-logstore"])
		}
		if lease := p.flag("kube-lease"); lease != want.kubeLease {
			t.Errorf("data node --kube-lease %q, want %q", lease, want.kubeLease)
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
	nodes := func(o *objects) *appsv1.StatefulSet { return o.statefulSets["walship"] }
	node := func(o *objects) *corev1.Container { return &nodes(o).Spec.Template.Spec.Containers[0] }
	logstore := func(o *objects) *corev1.Container {
		return &o.statefulSets["walship-logstore"].Spec.Template.Spec.Containers[0]
	}
	configMap := func(o *objects, prefix string) *corev1.ConfigMap { return configMapOf(t, o, prefix) }
	nodeEnv := func(o *objects, k, v string) { configMap(o, "walship-node").Data[k] = v }
	lsEnv := func(o *objects, k, v string) { configMap(o, "walship-logstore").Data[k] = v }
	intPtr := func(i int32) *int32 { return &i }
	boolPtr := func(b bool) *bool { return &b }
	rule := func(o *objects, i int) *rbacv1.PolicyRule { return &o.roles["walship"].Rules[i] }
	maxUnavailable := func(n int) *intstr.IntOrString { v := intstr.FromInt32(int32(n)); return &v }
	checkMistakes(t, docs, ns, []mistake{
		// Flags and their sources.
		{"unknown flag in args", func(o *objects) { node(o).Args = append(node(o).Args, "--no-such-flag=1") },
			"flag provided but not defined: -no-such-flag"},
		{"bad flag value", func(o *objects) { node(o).Args = append(node(o).Args, "--durability=sometimes") },
			`"sometimes" is not one of`},
		{"unknown flag from the ConfigMap", func(o *objects) { nodeEnv(o, "WALSHIP_SYNC_REPLICA", "1") },
			"has no flag --sync-replica"},
		{"log store flag given to a node", func(o *objects) { nodeEnv(o, "WALSHIP_RETENTION_AGE", "1h") },
			"has no flag --retention-age"},
		{"undefined $(VAR)", func(o *objects) { node(o).Args = append(node(o).Args, "--id=$(HOSTNAME)") },
			"$(HOSTNAME) is not defined"},
		{"missing ConfigMap", func(o *objects) { node(o).EnvFrom[0].ConfigMapRef.Name = "nope" },
			"envFrom: no ConfigMap nope"},
		{"missing ConfigMap key", func(o *objects) {
			node(o).Env = append(node(o).Env, corev1.EnvVar{Name: "WALSHIP_LOG_LEVEL", ValueFrom: &corev1.EnvVarSource{
				ConfigMapKeyRef: &corev1.ConfigMapKeySelector{LocalObjectReference: corev1.LocalObjectReference{Name: configMap(o, "walship-node").Name}, Key: "level"}}})
		}, `no key "level"`},
		{"listen elsewhere than the container port", func(o *objects) { node(o).Args = append(node(o).Args, "--listen=:8000") },
			"--listen :8000, but container port grpc is 7401"},
		{"metrics on their loopback default", func(o *objects) {
			node(o).Args = slices.DeleteFunc(node(o).Args, func(a string) bool { return strings.HasPrefix(a, "--metrics-listen") })
		}, "--metrics-listen 127.0.0.1:9401 binds loopback only"},
		{"listen on loopback", func(o *objects) { logstore(o).Args = append(logstore(o).Args, "--listen=127.0.0.1:7400") },
			"--listen 127.0.0.1:7400 binds loopback only"},
		{"retention larger than the volume", func(o *objects) { configMap(o, "walship-logstore").Data["WALSHIP_RETENTION_BYTES"] = "1099511627776" },
			"exceeds 80% of the 1Gi volume"},

		// Pods and Services fit.
		{"Service targetPort", func(o *objects) { o.services["walship-rw"].Spec.Ports[0].TargetPort = intstr.FromString("grcp") },
			"targetPort grcp is not a port"},
		{"selector misses the pods", func(o *objects) { nodes(o).Spec.Selector.MatchLabels[componentLabel] = "nodes" },
			"does not match the pod labels"},
		{"Service selects nothing", func(o *objects) { o.services["walship-ro"].Spec.Selector[componentLabel] = "nodes" },
			"Service walship-ro: selects the pods of 0 StatefulSets"},
		{"PVC mount without a claim", func(o *objects) { node(o).VolumeMounts[0].Name = "wal" },
			"volumeMount wal: no such volume"},
		{"writable root filesystem", func(o *objects) { f := false; node(o).SecurityContext.ReadOnlyRootFilesystem = &f },
			"readOnlyRootFilesystem is not true"},
		{"missing label", func(o *objects) { delete(o.services["walship-rw"].Labels, "app.kubernetes.io/part-of") },
			"Service walship-rw: no label app.kubernetes.io/part-of"},

		// Peers.
		{"log store missing from the nodes' list", func(o *objects) {
			o.statefulSets["walship-logstore"].Spec.Replicas = intPtr(4)
			lsEnv(o, "WALSHIP_JOIN", "false")
		}, "names 3 log store pods, but StatefulSet walship-logstore runs 4"},
		{"log store missing from the log stores' peers", func(o *objects) {
			o.statefulSets["walship-logstore"].Spec.Replicas = intPtr(4)
			lsEnv(o, "WALSHIP_JOIN", "false")
		},
			"log store pod walship-logstore-0 --peers \"walship-logstore-0.walship-logstore-headless:7400,walship-logstore-1.walship-logstore-headless:7400,walship-logstore-2.walship-logstore-headless:7400\" does not list walship-logstore-3"},
		{"log store advertising another spelling of its address", func(o *objects) {
			logstore(o).Args = append(logstore(o).Args, "--advertise=$(POD_NAME).walship-logstore-headless.walship-dev.svc:7400")
		}, "but the data nodes' --logstore names it walship-logstore-0.walship-logstore-headless:7400: the contract would list it twice"},
		{"log store advertising another pod", func(o *objects) {
			logstore(o).Args = append(logstore(o).Args, "--advertise=walship-logstore-1.walship-logstore-headless:7400")
		}, "log store pod walship-logstore-0 --advertise walship-logstore-1.walship-logstore-headless:7400 reaches pod/walship-logstore-1, not the pod itself"},
		{"log store asking log stores for the primary", func(o *objects) {
			lsEnv(o, "WALSHIP_NODES", "walship-logstore-1.walship-logstore-headless:7400")
		}, "is a logstore, want a node"},
		{"log store peer at a node", func(o *objects) {
			configMap(o, "walship-logstore").Data["WALSHIP_PEERS"] = "walship-logstore-0.walship-logstore-headless:7400,walship-1.walship-headless:7401"
		}, "is a node, want a logstore"},
		{"node missing from --peers", func(o *objects) { nodes(o).Spec.Replicas = intPtr(4); nodeEnv(o, "WALSHIP_JOIN", "false") },
			"does not list walship-3"},
		{"peer that is no pod", func(o *objects) {
			nodeEnv(o, "WALSHIP_PEERS", "walship-0=walship-0.walship-headless:7401,walship-1=walship-1.walship-headless:7401,walship-2=walship-2.walship-headless:7401,walship-5=walship-5.walship-headless:7401")
		}, "walship-5 is not a pod of StatefulSet walship"},
		{"peer at another pod's address", func(o *objects) {
			nodeEnv(o, "WALSHIP_PEERS", "walship-0=walship-0.walship-headless:7401,walship-1=walship-2.walship-headless:7401,walship-2=walship-2.walship-headless:7401")
		}, "reaches pod/walship-2, not pod walship-1"},
		{"peer at a log store", func(o *objects) {
			nodeEnv(o, "WALSHIP_PEERS", "walship-0=walship-logstore-0.walship-logstore-headless:7400,walship-1=walship-1.walship-headless:7401,walship-2=walship-2.walship-headless:7401")
		}, "is a logstore, want a node"},
		{"bootstrap primary not a member", func(o *objects) { nodeEnv(o, "WALSHIP_INITIAL_PRIMARY", "walship-9") },
			`--initial-primary "walship-9" is not a pod`},
		{"advertising another pod", func(o *objects) { node(o).Args = append(node(o).Args, "--advertise=walship-1.walship-headless:7401") },
			"reaches pod/walship-1, not the pod itself"},
		{"advertising another namespace", func(o *objects) {
			node(o).Args = append(node(o).Args, "--advertise=$(POD_NAME).walship-headless.other.svc:7401")
		}, "names namespace other"},
		{"--id not the pod name", func(o *objects) { node(o).Args = append(node(o).Args, "--id=node") },
			`--id "node" is not the pod name`},

		// Probes.
		{"log store probe on the wrong port", func(o *objects) { logstore(o).ReadinessProbe.GRPC.Port = 7401 },
			"readinessProbe port 7401, but gRPC is served on 7400"},
		{"liveness on /readyz", func(o *objects) { node(o).LivenessProbe.HTTPGet.Path = "/readyz" },
			"livenessProbe is GET /readyz on port 9401; want /healthz"},
		{"startup on /readyz", func(o *objects) { node(o).StartupProbe.HTTPGet.Path = "/readyz" },
			"startupProbe is GET /readyz on port 9401; want /healthz"},
		{"readiness on the gRPC port", func(o *objects) { node(o).ReadinessProbe.HTTPGet.Port = intstr.FromInt32(7401) },
			"want /readyz on the metrics port 9401"},
		{"gRPC readiness on a node", func(o *objects) {
			p := node(o).ReadinessProbe
			p.HTTPGet, p.GRPC = nil, &corev1.GRPCAction{Port: 7401}
		}, "readinessProbe must be an HTTP probe of /readyz for a data node"},
		{"slow readiness", func(o *objects) { node(o).ReadinessProbe.PeriodSeconds = 10 },
			"readinessProbe takes 30s to notice"},

		// Automatic failover.
		{"no token for a node", func(o *objects) { nodes(o).Spec.Template.Spec.AutomountServiceAccountToken = boolPtr(false) },
			"automountServiceAccountToken is not true, but --kube-lease walship needs the API server"},
		{"a token for a log store that calls no API", func(o *objects) { lsEnv(o, "WALSHIP_LEAVE_ON_SCALE_DOWN", "false") },
			"StatefulSet walship-logstore: automountServiceAccountToken is not false"},
		{"no token for a log store that leaves on a scale-down", func(o *objects) {
			o.statefulSets["walship-logstore"].Spec.Template.Spec.AutomountServiceAccountToken = boolPtr(false)
		}, "StatefulSet walship-logstore: automountServiceAccountToken is not true, but --leave-on-scale-down needs the API server"},
		{"a log store with the data nodes' rights", func(o *objects) {
			o.statefulSets["walship-logstore"].Spec.Template.Spec.ServiceAccountName = "walship"
		}, `StatefulSet walship-logstore: ServiceAccount "walship" (Roles [walship]) may do more than walship needs`},
		{"a log store that may not read its StatefulSet", func(o *objects) {
			o.roles["walship-logstore"].Rules[0].ResourceNames = []string{"walship-logstore"}
		}, `StatefulSet walship-logstore: ServiceAccount "walship-logstore" (Roles [walship-logstore]) may not: get apps/statefulsets (any name)`},
		{"a token for every pod", func(o *objects) { o.serviceAccounts["walship"].AutomountServiceAccountToken = boolPtr(true) },
			"ServiceAccount walship mounts its token into every pod"},
		{"wrong --pod-name", func(o *objects) { nodeEnv(o, "WALSHIP_POD_NAME", "walship-0") },
			`pod walship-1: --pod-name "walship-0" is not the pod's name`},
		{"wrong --pod-namespace", func(o *objects) { nodeEnv(o, "WALSHIP_POD_NAMESPACE", "default") },
			`--pod-namespace "default", want the pod's namespace "walship-dev"`},
		{"async replication", func(o *objects) { nodeEnv(o, "WALSHIP_REPLICATION", "async") },
			"--replication async: want sync"},
		{"async log stores", func(o *objects) { nodeEnv(o, "WALSHIP_LOGSTORE_ACK", "async") },
			"--logstore-ack async: want sync"},
		{"async durability", func(o *objects) { nodeEnv(o, "WALSHIP_DURABILITY", "async") },
			"--durability async: want sync"},
		{"sync level write", func(o *objects) { nodeEnv(o, "WALSHIP_SYNC_LEVEL", "write") },
			"--sync-level write: a replica's write is not durable"},
		{"no sync replica", func(o *objects) { nodeEnv(o, "WALSHIP_SYNC_REPLICAS", "0") },
			"--sync-replicas 0: a commit on no replica"},
		{"more sync replicas than a drain leaves", func(o *objects) { nodeEnv(o, "WALSHIP_SYNC_REPLICAS", "2") },
			"leave 1 replicas, but commits wait for 2"},
		{"grace period too short", func(o *objects) { g := int64(30); nodes(o).Spec.Template.Spec.TerminationGracePeriodSeconds = &g },
			"terminationGracePeriodSeconds 30: want at least 65"},
		{"grace period shorter than the switchover", func(o *objects) { nodeEnv(o, "WALSHIP_SWITCHOVER_TIMEOUT", "45s") },
			"terminationGracePeriodSeconds 75: want at least 90"},
		{"grace period shorter than the scale-down's removal", func(o *objects) { nodeEnv(o, "WALSHIP_LEAVE_TIMEOUT", "40s") },
			"terminationGracePeriodSeconds 75: want at least 90 (the SIGTERM switchover, up to --switchover-timeout 20s, plus a scale-down's removal, up to --leave-timeout 40s"},
		{"log store grace period shorter than its removal", func(o *objects) { lsEnv(o, "WALSHIP_LEAVE_TIMEOUT", "40s") },
			"StatefulSet walship-logstore: terminationGracePeriodSeconds 60: want at least 70 (a scale-down's removal, up to --leave-timeout 40s"},
		{"exec preStop hook", func(o *objects) {
			node(o).Lifecycle = &corev1.Lifecycle{PreStop: &corev1.LifecycleHandler{Exec: &corev1.ExecAction{Command: []string{"sh", "-c", "sleep 5"}}}}
		}, "an exec preStop hook needs a shell"},
		{"OrderedReady", func(o *objects) { nodes(o).Spec.PodManagementPolicy = appsv1.OrderedReadyPodManagement },
			`podManagementPolicy "OrderedReady": want Parallel`},

		// Routing by role.
		{"walship-rw routes to replicas", func(o *objects) { o.services["walship-rw"].Spec.Selector[roleLabel] = "replica" },
			"Service walship-rw: selector"},
		{"no walship-ro", func(o *objects) { delete(o.services, "walship-ro") }, "no Service walship-ro"},
		{"a role nobody sets", func(o *objects) { o.services["walship-ro"].Spec.Selector[roleLabel] = "follower" },
			`selects walship.io/role="follower"`},
		{"headless role Service", func(o *objects) { o.services["walship-rw"].Spec.ClusterIP = corev1.ClusterIPNone },
			"routes by role, so it must be a ClusterIP Service of ready pods only"},
		{"role label in the template", func(o *objects) { nodes(o).Spec.Template.Labels[roleLabel] = "replica" },
			"pod template sets walship.io/role"},
		{"role label in the StatefulSet selector", func(o *objects) { nodes(o).Spec.Selector.MatchLabels[roleLabel] = "replica" },
			"selector uses walship.io/role"},
		{"walship-ro by role", func(o *objects) {
			delete(o.services["walship-ro"].Spec.Selector, readsLabel)
			o.services["walship-ro"].Spec.Selector[roleLabel] = "replica"
		}, "Service walship-ro: selector"},
		{"walship-ro by role and reads", func(o *objects) { o.services["walship-ro"].Spec.Selector[roleLabel] = "replica" },
			"Service walship-ro: selector"},
		{"walship-rw by reads too", func(o *objects) { o.services["walship-rw"].Spec.Selector[readsLabel] = "true" },
			"Service walship-rw: selector"},
		{"a reads value nobody sets", func(o *objects) { o.services["walship-ro"].Spec.Selector[readsLabel] = "yes" },
			`selects walship.io/reads="yes"`},
		{"reads label in the template", func(o *objects) { nodes(o).Spec.Template.Labels[readsLabel] = "true" },
			"pod template sets walship.io/reads"},
		{"reads label in the StatefulSet selector", func(o *objects) { nodes(o).Spec.Selector.MatchLabels[readsLabel] = "true" },
			"selector uses walship.io/reads"},
		{"role Service without failover", func(o *objects) { nodeEnv(o, "WALSHIP_KUBE_LEASE", "") },
			"run without --kube-lease and never set it"},

		// Disruption budgets.
		{"node budget too loose", func(o *objects) { o.pdbs["walship"].Spec.MaxUnavailable = maxUnavailable(2) },
			"a PodDisruptionBudget that lets 2 go leave 0 replicas"},
		{"log store budget below a majority", func(o *objects) { o.pdbs["walship-logstore"].Spec.MaxUnavailable = maxUnavailable(2) },
			"leaves no majority (2)"},
		{"budget that blocks drains", func(o *objects) {
			v := intstr.FromInt32(3)
			o.pdbs["walship-logstore"].Spec.MinAvailable, o.pdbs["walship-logstore"].Spec.MaxUnavailable = &v, nil
		},
			"lets 0 of 3 pods go: it blocks every drain"},
		{"two budgets on one StatefulSet", func(o *objects) {
			extra := o.pdbs["walship"].DeepCopy()
			extra.Name = "walship-extra"
			o.pdbs[extra.Name] = extra
		}, "StatefulSet walship: 3 pods under 2 PodDisruptionBudgets"},
		{"budget on the role", func(o *objects) { o.pdbs["walship"].Spec.Selector.MatchLabels[roleLabel] = "primary" },
			"PodDisruptionBudget walship: selects on walship.io/role"},
		{"budget on reads", func(o *objects) { o.pdbs["walship"].Spec.Selector.MatchLabels[readsLabel] = "true" },
			"PodDisruptionBudget walship: selects on walship.io/reads"},

		// RBAC.
		{"list pods", func(o *objects) { rule(o, 2).Verbs = append(rule(o, 2).Verbs, "list") },
			"may do more than walship needs: list core/pods (any name)"},
		{"every verb on leases", func(o *objects) { rule(o, 0).Verbs = []string{"*"} },
			"may do more than walship needs: * coordination.k8s.io/leases/walship"},
		{"every Lease", func(o *objects) { rule(o, 0).ResourceNames = nil },
			"get coordination.k8s.io/leases (any name)"},
		{"no Events", func(o *objects) { o.roles["walship"].Rules = o.roles["walship"].Rules[:3] },
			"may not: create core/events (any name)"},
		{"no StatefulSet get", func(o *objects) { o.roles["walship"].Rules = o.roles["walship"].Rules[:4] },
			"may not: get apps/statefulsets/walship"},
		{"every StatefulSet", func(o *objects) { rule(o, 4).ResourceNames = nil },
			"may do more than walship needs: get apps/statefulsets (any name)"},
		{"StatefulSet get without the scale-down", func(o *objects) { nodeEnv(o, "WALSHIP_LEAVE_ON_SCALE_DOWN", "false") },
			"may do more than walship needs: get apps/statefulsets/walship"},
		{"create by name", func(o *objects) { rule(o, 1).ResourceNames = []string{"walship"} },
			"may not: create coordination.k8s.io/leases (any name)"},
		{"another Lease than the Role's", func(o *objects) { nodeEnv(o, "WALSHIP_KUBE_LEASE", "other") },
			"may not: get coordination.k8s.io/leases/other"},
		{"subject in another namespace", func(o *objects) { o.roleBindings["walship"].Subjects[0].Namespace = "default" },
			`subject ServiceAccount walship in namespace "default"`},
		{"binding to a ClusterRole", func(o *objects) { o.roleBindings["walship"].RoleRef.Kind = "ClusterRole" },
			"is not a Role of the build"},
		{"a ClusterRole", func(o *objects) { o.clusterRoles["walship"] = &rbacv1.ClusterRole{} },
			"ClusterRole walship: walship needs no cluster-wide permissions"},
		{"an unbound Role", func(o *objects) { o.roles["spare"] = &rbacv1.Role{} }, "Role spare: bound to no one"},
	})
	// Not a mistake: with --join (node.env) the StatefulSet scales past
	// --peers, its new pods joining at run time.
	o, err := decodeObjects(docs)
	if err != nil {
		t.Fatal(err)
	}
	nodes(o).Spec.Replicas = intPtr(4)
	if errs := check(o, ns); len(errs) > 0 {
		t.Errorf("the dev overlay scaled to 4 data nodes with --join fails: %v", errs)
	}
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
	dropName := func(o *objects, cert, name string) {
		c := o.certificates[cert]
		c.Spec.DNSNames = slices.DeleteFunc(c.Spec.DNSNames, func(n string) bool { return n == name })
	}
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
		{"another trust domain", func(o *objects) { configMap(o, "walship-node").Data["WALSHIP_TRUST_DOMAIN"] = "example.org" }, "under spiffe://example.org/walship/node/"},
		{"plaintext beside TLS", func(o *objects) { configMap(o, "walship-node").Data["WALSHIP_PLAINTEXT"] = "true" }, "WALSHIP_PLAINTEXT=true beside the TLS flags"},
		{"pod not named", func(o *objects) { o.certificates["walship-logstore"].Spec.DNSNames = []string{"walship-logstore"} }, "does not name walship-logstore-0.walship-logstore-headless"},
		{"advertised name not named", func(o *objects) { dropName(o, "walship-node", "*.walship-headless.walship.svc") },
			"does not name walship-0.walship-headless.walship.svc"},
		{"walship-rw not named", func(o *objects) { dropName(o, "walship-node", "walship-rw") }, "does not name walship-rw,"},
		{"walship-ro in the namespace not named", func(o *objects) { dropName(o, "walship-node", "walship-ro.walship.svc") },
			"does not name walship-ro.walship.svc"},
		{"namespace not filled in", func(o *objects) {
			c := o.certificates["walship-node"]
			for i, n := range c.Spec.DNSNames {
				c.Spec.DNSNames[i] = strings.ReplaceAll(n, ".walship.svc", ".NAMESPACE.svc")
			}
		}, `still says NAMESPACE`},
		{"gRPC probe under TLS", func(o *objects) {
			p := logstore(o).ReadinessProbe
			p.HTTPGet, p.GRPC = nil, &corev1.GRPCAction{Port: 7400}
		}, "readinessProbe must be an HTTP probe of /readyz under TLS"},
		{"issuer missing", func(o *objects) { delete(o.issuers, "walship-ca") }, `issuerRef Issuer "walship-ca" is not an Issuer`},
		{"scrape job from the role", func(o *objects) {
			pm := o.podMonitors["walship"]
			pm.Spec.PodMetricsEndpoints[0].RelabelConfigs[0].SourceLabels = []monitoringv1.LabelName{"__meta_kubernetes_pod_label_walship_io_role"}
		}, "relabels job from the walship.io/role label"},
		{"scraping by role", func(o *objects) { o.podMonitors["walship"].Spec.Selector.MatchLabels[roleLabel] = "primary" },
			"PodMonitor walship: selects on walship.io/role"},
		{"scraping by reads", func(o *objects) { o.podMonitors["walship"].Spec.Selector.MatchLabels[readsLabel] = "true" },
			"PodMonitor walship: selects on walship.io/reads"},
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
	env := map[string]string{"A": "x", "POD": "walship-1"}
	for _, tc := range []struct{ in, want, err string }{
		{in: "--id=$(POD)", want: "--id=walship-1"},
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
