package deploytest

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/walship/walship/internal/kubetest"
	"sigs.k8s.io/kustomize/kyaml/kio"
	"sigs.k8s.io/yaml"
)

// crdSource is a Go module that ships CustomResourceDefinitions as plain
// YAML, pinned by version and by the hash of its zip (as go.sum would pin
// it), and the directory in it that holds them. The API server test
// installs the CRDs the overlays use from these, so that the server checks
// the custom resources against their real schemas.
type crdSource struct {
	module, version, sum, dir string
}

// crdSources: cert-manager's CRDs (Certificate, Issuer: components/tls)
// and the Prometheus Operator's (PodMonitor, PrometheusRule:
// components/monitoring). The Prometheus Operator's version is that of
// its API module in go.mod, whose Go types the offline checks decode
// with (TestCRDSourcesMatchGoMod); cert-manager's API is not a dependency.
var crdSources = []crdSource{
	{"github.com/cert-manager/cert-manager", "v1.21.2", "h1:UWgoYM+KLNtRlqmoWOKjKBOBUPVHeepQ6/ac3ERJW68=", "deploy/crds"},
	{"github.com/prometheus-operator/prometheus-operator", "v0.85.0", "h1:M5xLCLEoaW2IJfnuCwFzzpL+jSVQu3KGT84Pye+fW8s=", "example/prometheus-operator-crd"},
}

// TestCRDSourcesMatchGoMod: the pinned Prometheus Operator CRDs are of the
// release whose API types go.mod pins.
func TestCRDSourcesMatchGoMod(t *testing.T) {
	// From go.mod itself: a test binary's build info lists no dependencies.
	mod, err := os.ReadFile("go.mod")
	if err != nil {
		t.Fatal(err)
	}
	const api = "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring"
	var pinned string
	for _, line := range strings.Split(string(mod), "\n") {
		if f := strings.Fields(line); len(f) >= 2 && f[0] == api {
			pinned = f[1]
		}
	}
	if pinned == "" {
		t.Fatalf("go.mod does not require %s", api)
	}
	for _, src := range crdSources {
		if src.module == "github.com/prometheus-operator/prometheus-operator" && src.version != pinned {
			t.Errorf("CRDs of %s %s, but go.mod pins %s %s: move them together", src.module, src.version, api, pinned)
		}
	}
}

// crd is one CustomResourceDefinition from a pinned source.
type crd struct {
	name, group, kind string
	doc               []byte // JSON
	from              string // module@version/path
}

// pinnedCRDs downloads each source with `go mod download` (from the module
// cache when it is there, else the module proxy), checks its hash, and
// returns its CRDs by group and kind.
func pinnedCRDs(t *testing.T) map[[2]string]*crd {
	t.Helper()
	out := map[[2]string]*crd{}
	for _, src := range crdSources {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		cmd := exec.CommandContext(ctx, "go", "mod", "download", "-json", src.module+"@"+src.version)
		// Outside any module, so that nothing of go.mod or go.sum is read
		// or written. The hash is checked below against the pin, so the
		// checksum database is not needed for these two modules.
		cmd.Dir = t.TempDir()
		cmd.Env = append(os.Environ(), "GOWORK=off", "GONOSUMDB="+src.module)
		var stdout, stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		err := cmd.Run()
		cancel()
		var info struct{ Dir, Sum, Error string }
		if jerr := json.Unmarshal(stdout.Bytes(), &info); jerr != nil || info.Error != "" || err != nil {
			t.Fatalf("go mod download %s@%s (the pinned CRDs; needs the module proxy or the module cache): %v %s\n%s%s",
				src.module, src.version, err, info.Error, stdout.String(), stderr.String())
		}
		if info.Sum != src.sum {
			t.Fatalf("%s@%s: hash %s, but the test pins %s", src.module, src.version, info.Sum, src.sum)
		}
		files, err := filepath.Glob(filepath.Join(info.Dir, filepath.FromSlash(src.dir), "*.yaml"))
		if err != nil || len(files) == 0 {
			t.Fatalf("%s@%s: no CRD files in %s: %v", src.module, src.version, src.dir, err)
		}
		for _, f := range files {
			data, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			nodes, err := (&kio.ByteReader{Reader: bytes.NewReader(data), OmitReaderAnnotations: true}).Read()
			if err != nil {
				t.Fatalf("%s: %v", f, err)
			}
			for _, n := range nodes {
				if n.GetKind() != "CustomResourceDefinition" {
					continue
				}
				j, err := n.MarshalJSON()
				if err != nil {
					t.Fatalf("%s: %v", f, err)
				}
				var d struct {
					Spec struct {
						Group string
						Names struct{ Kind string }
					}
				}
				if err := json.Unmarshal(j, &d); err != nil {
					t.Fatalf("%s: %v", f, err)
				}
				rel, _ := filepath.Rel(info.Dir, f)
				out[[2]string{d.Spec.Group, d.Spec.Names.Kind}] = &crd{name: n.GetName(), group: d.Spec.Group, kind: d.Spec.Names.Kind, doc: j,
					from: src.module + "@" + src.version + "/" + filepath.ToSlash(rel)}
			}
		}
	}
	return out
}

// kubectlRunner runs kubectl against a test API server.
type kubectlRunner struct {
	t          *testing.T
	bin, admin string
}

// run runs kubectl as the admin with stdin, and returns its combined
// output.
func (k *kubectlRunner) run(stdin []byte, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, k.bin, append([]string{"--kubeconfig", k.admin}, args...)...)
	if stdin != nil {
		cmd.Stdin = bytes.NewReader(stdin)
	}
	out, err := cmd.CombinedOutput()
	return string(out), err
}

func (k *kubectlRunner) must(stdin []byte, args ...string) string {
	k.t.Helper()
	out, err := k.run(stdin, args...)
	if err != nil {
		k.t.Fatalf("kubectl %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return out
}

// TestAPIServer runs the manifests past a real Kubernetes API server
// (internal/kubetest: etcd and kube-apiserver, no kubelet, no
// controllers): it installs the CRDs the overlays use from their pinned
// sources, then for every overlay creates its namespace and runs
// `kubectl apply --dry-run=server --validate=strict -k` — the documented
// command, with kubectl's own kustomize, whose build must be the one the
// offline checks examined — and it applies base/rbac.yaml on its own with
// `kubectl apply -n` and asks the real authorizer what the data nodes'
// ServiceAccount may do. It skips without the binaries.
func TestAPIServer(t *testing.T) {
	bin := kubetest.Kubectl(t)
	_, _ = kubetest.Binaries(t) // skip before downloading anything
	crds := pinnedCRDs(t)
	s := kubetest.StartT(t)
	k := &kubectlRunner{t: t, bin: bin, admin: s.Admin}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("API server log (tail):\n%s", s.Logs())
		}
	})

	// The CRDs every overlay needs, each once.
	dirs := overlayDirs(t)
	builds := map[string][][]byte{}
	need := map[string]*crd{}
	for _, name := range sortedKeys(dirs) {
		builds[name] = kustomizeBuild(t, dirs[name])
		for _, doc := range builds[name] {
			var tm struct{ APIVersion, Kind string }
			if err := json.Unmarshal(doc, &tm); err != nil {
				t.Fatal(err)
			}
			group, _, found := strings.Cut(tm.APIVersion, "/")
			if !found {
				continue // the core group
			}
			if c := crds[[2]string{group, tm.Kind}]; c != nil {
				need[c.name] = c
			} else if crdGroups(crds)[group] {
				t.Fatalf("overlay %s: %s %s: no CRD for it in the pinned sources", name, tm.APIVersion, tm.Kind)
			}
		}
	}
	if len(need) > 0 {
		var manifest [][]byte
		var names []string
		for _, n := range sortedKeys(need) {
			manifest = append(manifest, need[n].doc)
			names = append(names, "crd/"+n)
			t.Logf("CRD %s from %s", n, need[n].from)
		}
		// Server-side: the large CRDs exceed the annotation that a
		// client-side apply would keep.
		k.must(bytes.Join(manifest, []byte("\n---\n")), "apply", "--server-side", "-f", "-")
		k.must(nil, append([]string{"wait", "--for=condition=Established", "--timeout=60s"}, names...)...)
	}

	for _, name := range sortedKeys(dirs) {
		t.Run("dry-run/"+name, func(t *testing.T) {
			k := &kubectlRunner{t: t, bin: bin, admin: s.Admin}
			ns := overlayWants[name].namespace
			if ns == "" {
				t.Fatalf("overlay %s sets no namespace", name)
			}
			// The overlay's Namespace object is applied in the dry run
			// too, which creates nothing: its objects need it to exist.
			k.must(nil, "create", "namespace", ns)
			out := k.must(nil, "apply", "--dry-run=server", "--validate=strict", "-k", dirs[name])
			if got, want := strings.Count(out, "(server dry run)"), len(builds[name]); got != want {
				t.Errorf("kubectl apply -k %s: %d objects went to the server, the build has %d:\n%s", name, got, want, out)
			}
			t.Logf("overlay %s: %d objects accepted by the API server (dry run)", name, len(builds[name]))
			// What kubectl builds is what the checks checked.
			kbuild := k.must(nil, "kustomize", dirs[name])
			compareBuilds(t, name, builds[name], []byte(kbuild))
		})
	}

	// prod with the optional components (storage-class, zone-strict),
	// as a user's overlay adds them.
	t.Run("dry-run/prod-options", func(t *testing.T) {
		k := &kubectlRunner{t: t, bin: bin, admin: s.Admin}
		dir := optionsOverlay(t, "standard")
		build := kustomizeBuild(t, dir)
		if out, err := k.run(nil, "create", "namespace", overlayWants["prod"].namespace); err != nil && !strings.Contains(out, "AlreadyExists") {
			t.Fatalf("kubectl create namespace: %v\n%s", err, out)
		}
		out := k.must(nil, "apply", "--dry-run=server", "--validate=strict", "-k", dir)
		if got, want := strings.Count(out, "(server dry run)"), len(build); got != want {
			t.Errorf("kubectl apply -k prod-options: %d objects went to the server, the build has %d:\n%s", got, want, out)
		}
		compareBuilds(t, "prod-options", build, []byte(k.must(nil, "kustomize", dir)))
	})

	// The server would refuse a mistake: the dry runs above check
	// something. Each case breaks one object of the prod build.
	t.Run("rejects", func(t *testing.T) {
		k := &kubectlRunner{t: t, bin: bin, admin: s.Admin}
		if out, err := k.run(nil, "create", "namespace", overlayWants["prod"].namespace); err != nil && !strings.Contains(out, "AlreadyExists") {
			t.Fatalf("kubectl create namespace: %v\n%s", err, out)
		}
		objs := map[string]map[string]any{}
		for _, doc := range builds["prod"] {
			var v map[string]any
			if err := json.Unmarshal(doc, &v); err != nil {
				t.Fatal(err)
			}
			objs[fmt.Sprint(v["kind"], "/", v["metadata"].(map[string]any)["name"])] = v
		}
		for _, tc := range []struct {
			name, obj string
			break_    func(v map[string]any)
			want      string
		}{
			{"unknown field in a PodMonitor", "PodMonitor/walship", func(v map[string]any) {
				v["spec"].(map[string]any)["podMetricsEndpoints"].([]any)[0].(map[string]any)["prot"] = "metrics"
			}, "unknown field"},
			{"bad value in a Certificate", "Certificate/walship-node", func(v map[string]any) {
				v["spec"].(map[string]any)["privateKey"].(map[string]any)["algorithm"] = "DSA"
			}, "Unsupported value"},
			{"bad probe in a StatefulSet", "StatefulSet/walship", func(v map[string]any) {
				ct := v["spec"].(map[string]any)["template"].(map[string]any)["spec"].(map[string]any)["containers"].([]any)[0].(map[string]any)
				ct["readinessProbe"].(map[string]any)["grpc"] = map[string]any{"port": 7401}
			}, "may not specify more than 1 handler type"},
		} {
			v := objs[tc.obj]
			if v == nil {
				t.Fatalf("no %s in the prod build", tc.obj)
			}
			j, _ := json.Marshal(v)
			var broken map[string]any
			_ = json.Unmarshal(j, &broken)
			tc.break_(broken)
			j, _ = json.Marshal(broken)
			out, err := k.run(j, "apply", "--dry-run=server", "--validate=strict", "-f", "-")
			if err == nil || !strings.Contains(out, tc.want) {
				t.Errorf("%s: the API server accepted it or said something else (want %q): %v\n%s", tc.name, tc.want, err, out)
			}
		}
	})

	t.Run("rbac", func(t *testing.T) {
		k := &kubectlRunner{t: t, bin: bin, admin: s.Admin}
		const ns = "walship-rbac"
		k.must(nil, "create", "namespace", ns)
		k.must(nil, "-n", ns, "create", "serviceaccount", "walship")
		k.must(nil, "-n", ns, "apply", "-f", filepath.Join(repoRoot(t), RBACFile))
		as := "system:serviceaccount:" + ns + ":walship"
		for _, tc := range []struct {
			args []string // verb, resource[, --subresource=...]
			ns   string   // "" = ns
			want bool
		}{
			// What internal/kube does.
			{[]string{"get", "leases.coordination.k8s.io/walship"}, "", true},
			{[]string{"update", "leases.coordination.k8s.io/walship"}, "", true},
			{[]string{"create", "leases.coordination.k8s.io"}, "", true},
			{[]string{"patch", "pods/walship-1"}, "", true},
			{[]string{"create", "events"}, "", true},
			{[]string{"get", "statefulsets.apps/walship"}, "", true},
			// Nothing more.
			{[]string{"get", "leases.coordination.k8s.io/other"}, "", false},
			{[]string{"update", "leases.coordination.k8s.io/other"}, "", false},
			{[]string{"patch", "leases.coordination.k8s.io/walship"}, "", false},
			{[]string{"delete", "leases.coordination.k8s.io/walship"}, "", false},
			{[]string{"list", "leases.coordination.k8s.io"}, "", false},
			{[]string{"watch", "leases.coordination.k8s.io"}, "", false},
			{[]string{"get", "pods/walship-0"}, "", false},
			{[]string{"list", "pods"}, "", false},
			{[]string{"watch", "pods"}, "", false},
			{[]string{"create", "pods"}, "", false},
			{[]string{"update", "pods/walship-0"}, "", false},
			{[]string{"delete", "pods/walship-0"}, "", false},
			{[]string{"patch", "pods/walship-0", "--subresource=status"}, "", false},
			{[]string{"create", "pods/walship-0", "--subresource=exec"}, "", false},
			{[]string{"create", "pods/walship-0", "--subresource=eviction"}, "", false},
			{[]string{"get", "secrets"}, "", false},
			{[]string{"get", "statefulsets.apps/other"}, "", false},
			{[]string{"list", "statefulsets.apps"}, "", false},
			{[]string{"update", "statefulsets.apps/walship"}, "", false},
			{[]string{"patch", "statefulsets.apps/walship", "--subresource=scale"}, "", false},
			{[]string{"list", "events"}, "", false},
			{[]string{"create", "events.events.k8s.io"}, "", false},
			{[]string{"get", "leases.coordination.k8s.io/walship"}, "default", false},
			{[]string{"patch", "pods/walship-0"}, "default", false},
		} {
			in := tc.ns
			if in == "" {
				in = ns
			}
			out, err := k.run(nil, append([]string{"auth", "can-i", "-n", in, "--as", as}, tc.args...)...)
			answer := strings.TrimSpace(strings.SplitN(out, "\n", 2)[0])
			if (answer != "yes" && answer != "no") || (err == nil) != (answer == "yes") {
				t.Fatalf("kubectl auth can-i %v -n %s: %v\n%s", tc.args, in, err, out)
			}
			if got := answer == "yes"; got != tc.want {
				t.Errorf("ServiceAccount %s may %s in %s: %v, want %v", as, strings.Join(tc.args, " "), in, got, tc.want)
			}
		}
		// And real calls as the ServiceAccount: the Lease's life, the
		// role label on a Pod, an Event; a list is refused.
		k.must([]byte(`{"apiVersion":"v1","kind":"Pod","metadata":{"name":"walship-0"},"spec":{"containers":[{"name":"node","image":"walship"}]}}`), "-n", ns, "create", "-f", "-")
		lease := `{"apiVersion":"coordination.k8s.io/v1","kind":"Lease","metadata":{"name":"walship"},"spec":{"holderIdentity":"%s","leaseDurationSeconds":2}}`
		k.must([]byte(fmt.Sprintf(lease, "walship-0")), "-n", ns, "--as", as, "create", "-f", "-")
		k.must(nil, "-n", ns, "--as", as, "get", "lease", "walship")
		k.must([]byte(fmt.Sprintf(lease, "walship-1")), "-n", ns, "--as", as, "replace", "-f", "-")
		// The role label is a merge patch without a read, which kubectl
		// cannot send (it reads first); internal/e2e's Kubernetes tests
		// run the nodes under this very file and check their labels.
		k.must([]byte(`{"apiVersion":"v1","kind":"Event","metadata":{"generateName":"walship-0."},"involvedObject":{"kind":"Pod","name":"walship-0","namespace":"`+ns+`"},"reason":"Test","message":"test","type":"Normal"}`),
			"-n", ns, "--as", as, "create", "-f", "-")
		if out, err := k.run(nil, "-n", ns, "--as", as, "get", "pods"); err == nil || !strings.Contains(out, "forbidden") {
			t.Errorf("ServiceAccount %s listed pods: %v\n%s", as, err, out)
		}
	})

	// The log stores' own file: get a StatefulSet (--leave-on-scale-down
	// reads spec.replicas), nothing of the data nodes' rights.
	t.Run("rbac-logstore", func(t *testing.T) {
		k := &kubectlRunner{t: t, bin: bin, admin: s.Admin}
		const ns = "walship-rbac-logstore"
		k.must(nil, "create", "namespace", ns)
		k.must(nil, "-n", ns, "create", "serviceaccount", "walship-logstore")
		k.must(nil, "-n", ns, "apply", "-f", filepath.Join(repoRoot(t), RBACLogStoreFile))
		as := "system:serviceaccount:" + ns + ":walship-logstore"
		for _, tc := range []struct {
			args []string
			ns   string
			want bool
		}{
			{[]string{"get", "statefulsets.apps/walship-logstore"}, "", true},
			{[]string{"list", "statefulsets.apps"}, "", false},
			{[]string{"watch", "statefulsets.apps"}, "", false},
			{[]string{"update", "statefulsets.apps/walship-logstore"}, "", false},
			{[]string{"patch", "statefulsets.apps/walship-logstore", "--subresource=scale"}, "", false},
			{[]string{"get", "leases.coordination.k8s.io/walship"}, "", false},
			{[]string{"create", "leases.coordination.k8s.io"}, "", false},
			{[]string{"patch", "pods/walship-logstore-0"}, "", false},
			{[]string{"create", "events"}, "", false},
			{[]string{"get", "secrets"}, "", false},
			{[]string{"get", "statefulsets.apps/walship-logstore"}, "default", false},
		} {
			in := tc.ns
			if in == "" {
				in = ns
			}
			out, err := k.run(nil, append([]string{"auth", "can-i", "-n", in, "--as", as}, tc.args...)...)
			answer := strings.TrimSpace(strings.SplitN(out, "\n", 2)[0])
			if (answer != "yes" && answer != "no") || (err == nil) != (answer == "yes") {
				t.Fatalf("kubectl auth can-i %v -n %s: %v\n%s", tc.args, in, err, out)
			}
			if got := answer == "yes"; got != tc.want {
				t.Errorf("ServiceAccount %s may %s in %s: %v, want %v", as, strings.Join(tc.args, " "), in, got, tc.want)
			}
		}
	})
}

// crdGroups is the set of API groups the pinned CRDs define.
func crdGroups(crds map[[2]string]*crd) map[string]bool {
	g := map[string]bool{}
	for k := range crds {
		g[k[0]] = true
	}
	return g
}

// compareBuilds fails when kubectl's kustomize builds other objects than
// the kustomize library the checks use.
func compareBuilds(t *testing.T, overlay string, lib [][]byte, kubectlYAML []byte) {
	t.Helper()
	index := func(docs [][]byte) map[string]any {
		m := map[string]any{}
		for _, d := range docs {
			var v map[string]any
			if err := json.Unmarshal(d, &v); err != nil {
				t.Fatal(err)
			}
			md, _ := v["metadata"].(map[string]any)
			m[fmt.Sprintf("%v %v %v/%v", v["apiVersion"], v["kind"], md["namespace"], md["name"])] = v
		}
		return m
	}
	nodes, err := (&kio.ByteReader{Reader: bytes.NewReader(kubectlYAML), OmitReaderAnnotations: true}).Read()
	if err != nil {
		t.Fatalf("kubectl kustomize %s: %v", overlay, err)
	}
	var kdocs [][]byte
	for _, n := range nodes {
		y, err := n.String()
		if err != nil {
			t.Fatal(err)
		}
		j, err := yaml.YAMLToJSON([]byte(y))
		if err != nil {
			t.Fatal(err)
		}
		kdocs = append(kdocs, j)
	}
	a, b := index(lib), index(kdocs)
	var diffs []string
	for id, v := range a {
		if w, ok := b[id]; !ok {
			diffs = append(diffs, "only in the library's build: "+id)
		} else {
			for _, d := range jsonDiff("", v, w) {
				diffs = append(diffs, id+": "+d)
			}
		}
	}
	for id := range b {
		if _, ok := a[id]; !ok {
			diffs = append(diffs, "only in kubectl's build: "+id)
		}
	}
	sort.Strings(diffs)
	for _, d := range diffs {
		t.Errorf("overlay %s: kubectl kustomize and the kustomize library differ: %s", overlay, d)
	}
}

// jsonDiff lists where two decoded JSON values differ, by path.
func jsonDiff(path string, a, b any) []string {
	switch av := a.(type) {
	case map[string]any:
		bv, ok := b.(map[string]any)
		if !ok {
			break
		}
		var out []string
		keys := map[string]bool{}
		for k := range av {
			keys[k] = true
		}
		for k := range bv {
			keys[k] = true
		}
		for _, k := range sortedKeys(keys) {
			out = append(out, jsonDiff(path+"."+k, av[k], bv[k])...)
		}
		return out
	case []any:
		bv, ok := b.([]any)
		if !ok || len(av) != len(bv) {
			break
		}
		var out []string
		for i := range av {
			out = append(out, jsonDiff(fmt.Sprintf("%s[%d]", path, i), av[i], bv[i])...)
		}
		return out
	default:
		if reflect.DeepEqual(a, b) {
			return nil
		}
	}
	if reflect.DeepEqual(a, b) {
		return nil
	}
	ja, _ := json.Marshal(a)
	jb, _ := json.Marshal(b)
	return []string{fmt.Sprintf("%s: library %s, kubectl %s", path, ja, jb)}
}
