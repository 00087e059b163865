package deploytest

import (
	"flag"
	"fmt"
	"io"
	"net"
	"regexp"
	"slices"
	"strconv"
	"strings"

	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/walship/walship/app/cli"
)

// Labels every object carries (app.kubernetes.io/*, set by the base's
// kustomization), and the ones that tell pods apart.
var (
	commonLabels = []string{
		"app.kubernetes.io/name",
		"app.kubernetes.io/instance",
		"app.kubernetes.io/part-of",
		"app.kubernetes.io/managed-by",
	}
	componentLabel = "app.kubernetes.io/component"
	// roleLabel and readsLabel are the labels a data node sets on its own
	// Pod at run time (internal/kube): its role, primary or replica, and
	// "true" while it serves walship-ro's reads. Only the client Services
	// may select on them; no template sets them.
	roleLabel  = "walship.io/role"
	readsLabel = "walship.io/reads"
	// runTimeLabels are those two.
	runTimeLabels = []string{roleLabel, readsLabel}
)

// The component of the data nodes' StatefulSet, whose pods run `walship
// node`, and of the log stores'.
const (
	nodeComponent     = "node"
	logstoreComponent = "logstore"
)

// checker runs every fit check over one build and collects the problems.
type checker struct {
	o         *objects
	namespace string // the overlay's namespace; "" when it sets none
	errs      []error
}

func (c *checker) errorf(format string, args ...any) {
	c.errs = append(c.errs, fmt.Errorf(format, args...))
}

// check returns every problem found in o. namespace is where the overlay
// puts its objects.
func check(o *objects, namespace string) []error {
	c := &checker{o: o, namespace: namespace}
	c.checkMetadata()
	for _, name := range sortedKeys(o.statefulSets) {
		c.checkStatefulSet(o.statefulSets[name])
	}
	c.checkServices()
	c.checkPDBs()
	c.checkPodMonitors()
	c.checkNetworkPolicies()
	c.checkCluster()
	c.checkRBAC()
	c.checkIssuers()
	return c.errs
}

// checkMetadata: labels on everything, and every namespaced object in the
// overlay's namespace, which the overlay creates.
func (c *checker) checkMetadata() {
	for _, m := range c.o.all() {
		for _, l := range commonLabels {
			if m.obj.Labels[l] == "" {
				c.errorf("%s %s: no label %s", m.kind, m.obj.Name, l)
			}
		}
		if m.kind == "Namespace" || m.kind == "PriorityClass" { // cluster-scoped
			if m.obj.Namespace != "" {
				c.errorf("%s %s: cluster-scoped, but namespace %q", m.kind, m.obj.Name, m.obj.Namespace)
			}
			continue
		}
		if m.obj.Namespace != c.namespace {
			c.errorf("%s %s: namespace %q, want %q", m.kind, m.obj.Name, m.obj.Namespace, c.namespace)
		}
	}
	if c.namespace != "" && c.o.namespaces[c.namespace] == nil {
		c.errorf("namespace %s: no Namespace object creates it", c.namespace)
	}
}

// podsOf returns the StatefulSets whose pods sel selects.
func (c *checker) podsOf(sel *metav1.LabelSelector) []*appsv1.StatefulSet {
	s, err := metav1.LabelSelectorAsSelector(sel)
	if err != nil || s.Empty() {
		return nil
	}
	var out []*appsv1.StatefulSet
	for _, name := range sortedKeys(c.o.statefulSets) {
		sts := c.o.statefulSets[name]
		if s.Matches(labels.Set(sts.Spec.Template.Labels)) {
			out = append(out, sts)
		}
	}
	return out
}

// podsOfService returns the StatefulSets whose pods a Service selector
// selects, reading the run-time labels apart: they are on no template but
// set at run time, so they narrow the pods to those the nodes label so
// (runTime; nil when the selector has none).
func (c *checker) podsOfService(selector map[string]string) (sts []*appsv1.StatefulSet, runTime map[string]string) {
	rest := map[string]string{}
	for k, v := range selector {
		if slices.Contains(runTimeLabels, k) {
			if runTime == nil {
				runTime = map[string]string{}
			}
			runTime[k] = v
			continue
		}
		rest[k] = v
	}
	return c.podsOf(&metav1.LabelSelector{MatchLabels: rest}), runTime
}

func (c *checker) checkStatefulSet(sts *appsv1.StatefulSet) {
	where := "StatefulSet " + sts.Name
	tmpl := &sts.Spec.Template
	if sts.Spec.Replicas == nil || *sts.Spec.Replicas < 1 {
		c.errorf("%s: replicas not set", where)
	}
	sel, err := metav1.LabelSelectorAsSelector(sts.Spec.Selector)
	if err != nil || sel.Empty() {
		c.errorf("%s: bad or empty selector: %v", where, err)
	} else if !sel.Matches(labels.Set(tmpl.Labels)) {
		c.errorf("%s: selector %s does not match the pod labels %v", where, sel, tmpl.Labels)
	}
	for _, l := range append(slices.Clone(commonLabels), componentLabel) {
		if tmpl.Labels[l] == "" {
			c.errorf("%s: pod template has no label %s", where, l)
		}
	}
	// The nodes patch their run-time labels: in the template one would
	// route a pod by the role it was created with, in the selector orphan
	// the pod the moment it changes.
	for _, l := range runTimeLabels {
		if _, ok := tmpl.Labels[l]; ok {
			c.errorf("%s: pod template sets %s, which each node sets on its own Pod at run time", where, l)
		}
		if selectorHas(sts.Spec.Selector, l) {
			c.errorf("%s: selector uses %s, which changes at run time: pods would leave their StatefulSet", where, l)
		}
	}
	// The headless Service that gives the pods their DNS names.
	if svc := c.o.services[sts.Spec.ServiceName]; svc == nil {
		c.errorf("%s: serviceName %q: no such Service", where, sts.Spec.ServiceName)
	} else {
		if svc.Spec.ClusterIP != corev1.ClusterIPNone {
			c.errorf("%s: serviceName %q is not headless (clusterIP: None)", where, svc.Name)
		}
		if !labels.SelectorFromSet(svc.Spec.Selector).Matches(labels.Set(tmpl.Labels)) || len(svc.Spec.Selector) == 0 {
			c.errorf("%s: headless Service %s does not select its pods", where, svc.Name)
		}
	}
	claims := map[string]bool{}
	for _, vct := range sts.Spec.VolumeClaimTemplates {
		claims[vct.Name] = true
		for _, l := range []string{"app.kubernetes.io/name", "app.kubernetes.io/instance", componentLabel} {
			if vct.Labels[l] == "" {
				c.errorf("%s: volumeClaimTemplate %s has no label %s", where, vct.Name, l)
			}
		}
		if _, ok := vct.Spec.Resources.Requests[corev1.ResourceStorage]; !ok {
			c.errorf("%s: volumeClaimTemplate %s requests no storage", where, vct.Name)
		}
	}
	c.checkPodSpec(where, sts, claims)
}

func (c *checker) checkPodSpec(where string, sts *appsv1.StatefulSet, claims map[string]bool) {
	spec := &sts.Spec.Template.Spec
	if spec.ServiceAccountName != "" && c.o.serviceAccounts[spec.ServiceAccountName] == nil {
		c.errorf("%s: serviceAccountName %q: no such ServiceAccount", where, spec.ServiceAccountName)
	}
	// A missing class is not an error the API server reports at apply: the
	// StatefulSet is accepted and its pods are refused, one by one.
	if pc := spec.PriorityClassName; pc != "" && c.o.priorityClasses[pc] == nil && pc != "system-cluster-critical" && pc != "system-node-critical" {
		c.errorf("%s: priorityClassName %q: no such PriorityClass in the build", where, pc)
	}
	// Service links put <SERVICE>_PORT variables in the environment; for a
	// Service named walship-rw those are WALSHIP_RW_*, the
	// namespace walship reads its flags from.
	if spec.EnableServiceLinks == nil || *spec.EnableServiceLinks {
		c.errorf("%s: enableServiceLinks is not false", where)
	}
	psc := spec.SecurityContext
	if psc == nil || psc.RunAsNonRoot == nil || !*psc.RunAsNonRoot || psc.RunAsUser == nil || *psc.RunAsUser == 0 {
		c.errorf("%s: pod securityContext does not run as a non-root user", where)
	}
	if psc == nil || psc.FSGroup == nil {
		c.errorf("%s: pod securityContext has no fsGroup: the non-root user cannot write the volume", where)
	}
	if psc == nil || psc.SeccompProfile == nil || psc.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault {
		c.errorf("%s: pod securityContext has no RuntimeDefault seccomp profile", where)
	}
	volumes := map[string]*corev1.Volume{}
	for i := range spec.Volumes {
		v := &spec.Volumes[i]
		volumes[v.Name] = v
		switch {
		case v.ConfigMap != nil:
			if c.o.configMaps[v.ConfigMap.Name] == nil && !ptrTrue(v.ConfigMap.Optional) {
				c.errorf("%s: volume %s: no ConfigMap %s", where, v.Name, v.ConfigMap.Name)
			}
		case v.Secret != nil:
			if c.o.secrets[v.Secret.SecretName] == nil && c.certificateFor(v.Secret.SecretName) == nil && !ptrTrue(v.Secret.Optional) {
				c.errorf("%s: volume %s: no Secret %s", where, v.Name, v.Secret.SecretName)
			}
		case v.PersistentVolumeClaim != nil:
			c.errorf("%s: volume %s: a fixed PVC shared by every pod; use volumeClaimTemplates", where, v.Name)
		}
	}
	for i := range spec.Containers {
		ct := &spec.Containers[i]
		cw := fmt.Sprintf("%s container %s", where, ct.Name)
		for _, vm := range ct.VolumeMounts {
			if volumes[vm.Name] == nil && !claims[vm.Name] {
				c.errorf("%s: volumeMount %s: no such volume or volumeClaimTemplate", cw, vm.Name)
			}
		}
		c.checkContainerSecurity(cw, ct)
		c.checkResources(cw, ct)
		if ct.Image == "" || strings.HasSuffix(ct.Image, ":latest") || !strings.Contains(ct.Image, ":") {
			c.errorf("%s: image %q has no pinned tag", cw, ct.Image)
		}
	}
	if len(spec.Containers) != 1 {
		c.errorf("%s: %d containers, want the one walship container", where, len(spec.Containers))
		return
	}
	for ord := int32(0); ord < ptrOr(sts.Spec.Replicas, 1); ord++ {
		p, err := c.podConfig(sts, ord)
		if err != nil {
			c.errs = append(c.errs, err)
			continue
		}
		pw := fmt.Sprintf("%s pod %s", where, p.name)
		if ord == 0 { // the same template for every pod
			c.checkProbes(fmt.Sprintf("%s container %s", where, p.container.Name), p)
			c.checkAPIAccess(where, p)
		}
		c.checkTLS(pw, sts, p)
	}
}

// checkAPIAccess: a pod gets a service account token exactly when walship
// calls the API server (a data node with --kube-lease), and then its
// ServiceAccount exists and is bound to a Role (checkRBAC says which).
func (c *checker) checkAPIAccess(where string, p *pod) {
	spec := &p.sts.Spec.Template.Spec
	automount := spec.AutomountServiceAccountToken
	if !p.callsAPI() {
		if automount == nil || *automount {
			c.errorf("%s: automountServiceAccountToken is not false (`walship %s` without --kube-lease or --leave-on-scale-down calls no API)", where, p.command)
		}
		return
	}
	if automount == nil || !*automount {
		c.errorf("%s: automountServiceAccountToken is not true, but %s needs the API server", where, p.apiFlags())
	}
	if spec.ServiceAccountName == "" || c.o.serviceAccounts[spec.ServiceAccountName] == nil {
		c.errorf("%s: %s needs a ServiceAccount of the build, not %q", where, p.apiFlags(), spec.ServiceAccountName)
	} else if sa := c.o.serviceAccounts[spec.ServiceAccountName]; sa.AutomountServiceAccountToken == nil || *sa.AutomountServiceAccountToken {
		c.errorf("%s: ServiceAccount %s mounts its token into every pod; set automountServiceAccountToken: false on it and true on the pods that call the API", where, sa.Name)
	}
}

func (c *checker) checkContainerSecurity(where string, ct *corev1.Container) {
	sc := ct.SecurityContext
	if sc == nil {
		c.errorf("%s: no securityContext", where)
		return
	}
	if sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation {
		c.errorf("%s: allowPrivilegeEscalation is not false", where)
	}
	if sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem {
		c.errorf("%s: readOnlyRootFilesystem is not true", where)
	}
	if ptrTrue(sc.Privileged) {
		c.errorf("%s: privileged", where)
	}
	if sc.RunAsUser != nil && *sc.RunAsUser == 0 {
		c.errorf("%s: runs as root", where)
	}
	if sc.Capabilities == nil || !slices.Contains(sc.Capabilities.Drop, "ALL") || len(sc.Capabilities.Add) > 0 {
		c.errorf("%s: capabilities must drop ALL and add none", where)
	}
}

func (c *checker) checkResources(where string, ct *corev1.Container) {
	req, lim := ct.Resources.Requests, ct.Resources.Limits
	for _, r := range []corev1.ResourceName{corev1.ResourceCPU, corev1.ResourceMemory} {
		if _, ok := req[r]; !ok {
			c.errorf("%s: no %s request", where, r)
		}
	}
	ml, ok := lim[corev1.ResourceMemory]
	if !ok {
		c.errorf("%s: no memory limit", where)
	} else if mr, ok := req[corev1.ResourceMemory]; ok && ml.Cmp(mr) < 0 {
		c.errorf("%s: memory limit %s below its request %s", where, ml.String(), mr.String())
	}
}

// probeWant is one probe a container must have.
type probeWant struct {
	name string
	p    *corev1.Probe
	path string // "" for a gRPC health probe on the gRPC port
}

// checkProbes: every container has a startup, a readiness and a liveness
// probe, and a startup window long enough for a WAL recovery (health
// NOT_SERVING) not to be mistaken for a hung process.
//
// A data node (`walship node`) is probed over HTTP on its metrics port,
// with or without TLS: readiness is /readyz, its role's readiness (what
// walship-rw and walship-ro route on), probed often enough that a deposed
// primary leaves walship-rw within seconds; startup and liveness are
// /healthz, which never asks the API server, so that a node that is not
// ready — a replica without a primary, a primary without the Lease — is
// never restarted for it. Other servers use native gRPC health probes on
// their gRPC port, or under TLS (kubelet's gRPC probes present no client
// certificate) /readyz and /healthz on the metrics port.
func (c *checker) checkProbes(where string, p *pod) {
	ct := p.container
	tls := p.env["WALSHIP_TLS_CERT"] != ""
	probes := []probeWant{{"startupProbe", ct.StartupProbe, ""}, {"readinessProbe", ct.ReadinessProbe, ""}, {"livenessProbe", ct.LivenessProbe, ""}}
	switch {
	case p.command == "node":
		probes[0].path, probes[1].path, probes[2].path = "/healthz", "/readyz", "/healthz"
	case tls:
		probes[0].path, probes[1].path, probes[2].path = "/readyz", "/readyz", "/healthz"
	}
	grpcPort, _ := containerPort(ct, "grpc")
	metrics, hasMetrics := containerPort(ct, "metrics")
	for _, pr := range probes {
		switch {
		case pr.p == nil:
			c.errorf("%s: no %s", where, pr.name)
		case pr.path == "" && pr.p.GRPC == nil:
			c.errorf("%s: %s is not a gRPC health probe: without TLS, use gRPC health probes", where, pr.name)
		case pr.path == "":
			if pr.p.GRPC.Port != grpcPort {
				c.errorf("%s: %s port %d, but gRPC is served on %d", where, pr.name, pr.p.GRPC.Port, grpcPort)
			}
			if s := pr.p.GRPC.Service; s != nil && *s != "" {
				c.errorf("%s: %s asks for service %q; walship reports its status on the empty name", where, pr.name, *s)
			}
		case pr.p.GRPC != nil || pr.p.HTTPGet == nil:
			why := "under TLS"
			if p.command == "node" {
				why = "for a data node"
			}
			c.errorf("%s: %s must be an HTTP probe of %s %s", where, pr.name, pr.path, why)
		case !hasMetrics:
			c.errorf("%s: %s: no container port named metrics", where, pr.name)
		case pr.p.HTTPGet.Path != pr.path || httpProbePort(ct, pr.p.HTTPGet) != metrics:
			c.errorf("%s: %s is GET %s on port %s; want %s on the metrics port %d", where, pr.name, pr.p.HTTPGet.Path, pr.p.HTTPGet.Port.String(), pr.path, metrics)
		case pr.p.HTTPGet.Scheme != "" && pr.p.HTTPGet.Scheme != corev1.URISchemeHTTP:
			c.errorf("%s: %s uses %s; the metrics port serves plain HTTP", where, pr.name, pr.p.HTTPGet.Scheme)
		}
	}
	if p := ct.StartupProbe; p != nil && probeWindow(p) < 300 {
		c.errorf("%s: startupProbe gives recovery only %ds (want at least 300s)", where, probeWindow(p))
	}
	if p := ct.LivenessProbe; p != nil && probeWindow(p) < 30 {
		c.errorf("%s: livenessProbe restarts after %ds (want at least 30s)", where, probeWindow(p))
	}
	if rp := ct.ReadinessProbe; p.command == "node" && rp != nil && probeWindow(rp) > 10 {
		c.errorf("%s: readinessProbe takes %ds to notice a node that is no longer ready (want at most 10s: walship-rw routes on it)", where, probeWindow(rp))
	}
}

// httpProbePort is the container port an HTTP probe reaches (by number or
// by the port's name).
func httpProbePort(ct *corev1.Container, g *corev1.HTTPGetAction) int32 {
	if g.Port.StrVal != "" {
		p, _ := containerPort(ct, g.Port.StrVal)
		return p
	}
	return g.Port.IntVal
}

// probeWindow is how long a probe keeps failing before it acts, in seconds.
func probeWindow(p *corev1.Probe) int32 {
	period, failures := p.PeriodSeconds, p.FailureThreshold
	if period == 0 {
		period = 10
	}
	if failures == 0 {
		failures = 3
	}
	return period * failures
}

// pod is what one pod of a StatefulSet runs: its walship command and flags.
type pod struct {
	name      string
	sts       *appsv1.StatefulSet
	container *corev1.Container
	command   string
	args      []string // the container's arguments, $(VAR) expanded
	flags     *flag.FlagSet
	env       map[string]string // resolved environment
}

// flag is the value of flag name as the pod's walship parses it ("" if
// the command has no such flag).
func (p *pod) flag(name string) string {
	if f := p.flags.Lookup(name); f != nil {
		return f.Value.String()
	}
	return ""
}

// callsAPI says whether walship in the pod talks to the Kubernetes API:
// a data node with automatic failover (--kube-lease), a log store that
// reads its StatefulSet when told to stop (--leave-on-scale-down).
func (p *pod) callsAPI() bool {
	return p.flag("kube-lease") != "" || (p.command == "logstore" && p.flag("leave-on-scale-down") == "true")
}

// apiFlags names the flags that make the pod call the API, for messages.
func (p *pod) apiFlags() string {
	if p.command == "logstore" {
		return "--leave-on-scale-down"
	}
	return "--kube-lease " + p.flag("kube-lease")
}

// podConfig resolves the environment and arguments of pod ordinal ord of
// sts as the kubelet would, and parses them with walship's own flag set for
// the command: WALSHIP_<FLAG> variables become --<flag> (walship reads them
// as flag defaults), then the arguments, which win. Every variable named
// WALSHIP_* must be a flag of the command, every $(VAR) must resolve, and
// every ConfigMap, Secret or key referenced must exist.
func (c *checker) podConfig(sts *appsv1.StatefulSet, ord int32) (*pod, error) {
	ct := &sts.Spec.Template.Spec.Containers[0]
	p := &pod{name: fmt.Sprintf("%s-%d", sts.Name, ord), sts: sts, container: ct}
	where := fmt.Sprintf("pod %s container %s", p.name, ct.Name)
	env, err := c.resolveEnv(p.name, ct)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", where, err)
	}
	p.env = env
	if len(ct.Command) > 0 {
		return nil, fmt.Errorf("%s: command %q overrides the image's entrypoint (/walship)", where, ct.Command)
	}
	var args []string
	referenced := map[string]bool{}
	for _, a := range ct.Args {
		x, err := expand(a, env, referenced)
		if err != nil {
			return nil, fmt.Errorf("%s: argument %q: %w", where, a, err)
		}
		args = append(args, x)
	}
	if len(args) == 0 {
		return nil, fmt.Errorf("%s: no arguments: the first must be the walship command", where)
	}
	p.command = args[0]
	p.args = args
	if want := sts.Spec.Template.Labels[componentLabel]; p.command != want {
		return nil, fmt.Errorf("%s: runs `walship %s` in a pod labelled %s=%s", where, p.command, componentLabel, want)
	}
	if !slices.Contains(cli.Commands(), p.command) || p.command == "dev" || p.command == "version" {
		return nil, fmt.Errorf("%s: %q is not a walship server command", where, p.command)
	}
	fs, _ := cli.NewFlagSet(p.command, &cli.Env{})
	fs.SetOutput(io.Discard)
	// Flags whose default walship takes from a plain variable take it from
	// the container's environment, not the test's: first, so that
	// WALSHIP_<FLAG> and the arguments win as they do in walship.
	var envArgs []string
	for _, v := range sortedKeys(defaultFromEnv) {
		if fs.Lookup(defaultFromEnv[v]) != nil {
			envArgs = append(envArgs, "--"+defaultFromEnv[v]+"="+env[v])
		}
	}
	for _, name := range sortedKeys(env) {
		flagName, ok := flagForEnv(name)
		if !ok {
			if f, reads := defaultFromEnv[name]; reads && fs.Lookup(f) != nil {
				continue
			}
			if !referenced[name] && !allowedEnv[name] {
				return nil, fmt.Errorf("%s: environment variable %s is neither a walship flag nor used by the arguments", where, name)
			}
			continue
		}
		if fs.Lookup(flagName) == nil {
			return nil, fmt.Errorf("%s: environment %s: `walship %s` has no flag --%s", where, name, p.command, flagName)
		}
		envArgs = append(envArgs, "--"+flagName+"="+env[name])
	}
	if err := fs.Parse(append(envArgs, args[1:]...)); err != nil {
		return nil, fmt.Errorf("%s: walship %s %s: %w", where, p.command, strings.Join(append(envArgs, args[1:]...), " "), err)
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("%s: walship %s: unexpected argument %q", where, p.command, fs.Arg(0))
	}
	p.flags = fs
	return p, c.checkPodFlags(where, p)
}

// allowedEnv are variables that are not walship flags but may be set.
var allowedEnv = map[string]bool{"GOMEMLIMIT": true, "GOMAXPROCS": true, "GODEBUG": true, "GOTRACEBACK": true}

// defaultFromEnv are the plain variables walship reads as the default of
// a flag (from the downward API), for the commands that have that flag.
var defaultFromEnv = map[string]string{"POD_NAME": "pod-name", "POD_NAMESPACE": "pod-namespace"}

// flagForEnv maps WALSHIP_SYNC_TIMEOUT to sync-timeout (cli.EnvName's inverse).
func flagForEnv(name string) (string, bool) {
	rest, ok := strings.CutPrefix(name, "WALSHIP_")
	if !ok || rest == "" {
		return "", false
	}
	f := strings.ToLower(strings.ReplaceAll(rest, "_", "-"))
	if cli.EnvName(f) != name {
		return "", false
	}
	return f, true
}

// resolveEnv returns the container's environment: envFrom first, then env
// (which wins), each value resolved; $(VAR) in env values refers to
// variables defined before it, as in Kubernetes.
func (c *checker) resolveEnv(podName string, ct *corev1.Container) (map[string]string, error) {
	env := map[string]string{}
	for _, ef := range ct.EnvFrom {
		var data map[string]string
		switch {
		case ef.ConfigMapRef != nil:
			cm := c.o.configMaps[ef.ConfigMapRef.Name]
			if cm == nil {
				if ptrTrue(ef.ConfigMapRef.Optional) {
					continue
				}
				return nil, fmt.Errorf("envFrom: no ConfigMap %s", ef.ConfigMapRef.Name)
			}
			data = cm.Data
		case ef.SecretRef != nil:
			s := c.o.secrets[ef.SecretRef.Name]
			if s == nil {
				if ptrTrue(ef.SecretRef.Optional) {
					continue
				}
				return nil, fmt.Errorf("envFrom: no Secret %s", ef.SecretRef.Name)
			}
			data = map[string]string{}
			for k, v := range s.StringData {
				data[k] = v
			}
			for k, v := range s.Data {
				data[k] = string(v)
			}
		default:
			return nil, fmt.Errorf("envFrom entry with neither configMapRef nor secretRef")
		}
		for k, v := range data {
			env[ef.Prefix+k] = v
		}
	}
	for _, e := range ct.Env {
		if e.ValueFrom == nil {
			v, err := expand(e.Value, env, nil)
			if err != nil {
				return nil, fmt.Errorf("env %s: %w", e.Name, err)
			}
			env[e.Name] = v
			continue
		}
		vf := e.ValueFrom
		switch {
		case vf.FieldRef != nil:
			switch vf.FieldRef.FieldPath {
			case "metadata.name":
				env[e.Name] = podName
			case "metadata.namespace":
				env[e.Name] = c.namespace
			default:
				return nil, fmt.Errorf("env %s: fieldRef %s is not resolved by this test", e.Name, vf.FieldRef.FieldPath)
			}
		case vf.ConfigMapKeyRef != nil:
			ref := vf.ConfigMapKeyRef
			cm := c.o.configMaps[ref.Name]
			v, ok := "", false
			if cm != nil {
				v, ok = cm.Data[ref.Key]
			}
			if !ok {
				if ptrTrue(ref.Optional) {
					continue
				}
				return nil, fmt.Errorf("env %s: no key %q in ConfigMap %s", e.Name, ref.Key, ref.Name)
			}
			env[e.Name] = v
		case vf.SecretKeyRef != nil:
			ref := vf.SecretKeyRef
			s := c.o.secrets[ref.Name]
			if s == nil {
				if ptrTrue(ref.Optional) {
					continue
				}
				return nil, fmt.Errorf("env %s: no Secret %s", e.Name, ref.Name)
			}
			if v, ok := s.Data[ref.Key]; ok {
				env[e.Name] = string(v)
			} else if v, ok := s.StringData[ref.Key]; ok {
				env[e.Name] = v
			} else if !ptrTrue(ref.Optional) {
				return nil, fmt.Errorf("env %s: no key %q in Secret %s", e.Name, ref.Key, ref.Name)
			}
		case vf.ResourceFieldRef != nil:
			q, ok := ct.Resources.Limits[corev1.ResourceName(strings.TrimPrefix(vf.ResourceFieldRef.Resource, "limits."))]
			if !ok {
				return nil, fmt.Errorf("env %s: resourceFieldRef %s: the container sets no such limit", e.Name, vf.ResourceFieldRef.Resource)
			}
			env[e.Name] = strconv.FormatInt(q.Value(), 10)
		default:
			return nil, fmt.Errorf("env %s: empty valueFrom", e.Name)
		}
	}
	return env, nil
}

// expand replaces $(VAR) in s with env's value, as the kubelet expands
// arguments; $$ is a literal $. Unlike the kubelet, which leaves an unknown
// $(VAR) as it is, an unknown variable is an error here: a walship flag
// would get the literal text. Every name expanded is added to referenced.
func expand(s string, env map[string]string, referenced map[string]bool) (string, error) {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] != '$' || i+1 == len(s) {
			b.WriteByte(s[i])
			continue
		}
		switch s[i+1] {
		case '$':
			b.WriteByte('$')
			i++
		case '(':
			end := strings.IndexByte(s[i+2:], ')')
			if end < 0 {
				return "", fmt.Errorf("unterminated $( at offset %d", i)
			}
			name := s[i+2 : i+2+end]
			v, ok := env[name]
			if !ok {
				return "", fmt.Errorf("$(%s) is not defined in the container's environment", name)
			}
			if referenced != nil {
				referenced[name] = true
			}
			b.WriteString(v)
			i += 2 + end
		default:
			b.WriteByte('$')
		}
	}
	return b.String(), nil
}

// checkPodFlags checks that the flags fit the pod: walship listens where
// the container ports say, on the pod's address (its listeners default to
// loopback, which neither peers, Prometheus nor the kubelet's probes
// reach), keeps its data on a persistent volume, and bounds its WAL to the
// volume's size.
func (c *checker) checkPodFlags(where string, p *pod) error {
	var errs []string
	for _, l := range []struct{ flag, port string }{{"listen", "grpc"}, {"metrics-listen", "metrics"}} {
		addr := p.flags.Lookup(l.flag).Value.String()
		host, portStr, err := net.SplitHostPort(addr)
		port, perr := strconv.Atoi(portStr)
		want, ok := containerPort(p.container, l.port)
		ip := net.ParseIP(host)
		switch {
		case err != nil || perr != nil:
			errs = append(errs, fmt.Sprintf("--%s %q is not host:port", l.flag, addr))
		case host == "localhost" || (ip != nil && ip.IsLoopback()):
			errs = append(errs, fmt.Sprintf("--%s %s binds loopback only: the pod is reached at its own address (set it, e.g. :%d)", l.flag, addr, port))
		case !ok:
			errs = append(errs, fmt.Sprintf("no container port named %s for --%s %s", l.port, l.flag, addr))
		case int32(port) != want:
			errs = append(errs, fmt.Sprintf("--%s %s, but container port %s is %d", l.flag, addr, l.port, want))
		}
	}
	dataDir := p.flags.Lookup("data-dir").Value.String()
	claim := ""
	for _, vm := range p.container.VolumeMounts {
		if (dataDir == vm.MountPath || strings.HasPrefix(dataDir, strings.TrimSuffix(vm.MountPath, "/")+"/")) && !vm.ReadOnly {
			claim = vm.Name
		}
	}
	var storage *resource.Quantity
	for _, vct := range p.sts.Spec.VolumeClaimTemplates {
		if vct.Name == claim {
			q := vct.Spec.Resources.Requests[corev1.ResourceStorage]
			storage = &q
		}
	}
	if storage == nil {
		errs = append(errs, fmt.Sprintf("--data-dir %q is not on a writable volume from volumeClaimTemplates", dataDir))
	} else {
		// The WAL the command keeps at most, plus one segment being written.
		retention := map[string]string{"logstore": "retention-bytes", "primary": "wal-retention-bytes", "node": "wal-retention-bytes"}[p.command]
		if retention != "" {
			keep, _ := strconv.ParseInt(p.flags.Lookup(retention).Value.String(), 10, 64)
			seg, _ := strconv.ParseInt(p.flags.Lookup("segment-bytes").Value.String(), 10, 64)
			if keep == 0 {
				errs = append(errs, fmt.Sprintf("--%s 0 keeps the WAL forever on a %s volume", retention, storage.String()))
			} else if limit := storage.Value() / 10 * 8; keep+seg > limit {
				errs = append(errs, fmt.Sprintf("--%s %d plus a %d-byte segment exceeds 80%% of the %s volume", retention, keep, seg, storage.String()))
			}
		}
	}
	if len(errs) > 0 {
		return fmt.Errorf("%s: %s", where, strings.Join(errs, "; "))
	}
	return nil
}

// resolvePeer resolves addr as cluster DNS would inside the namespace:
// <pod>.<headless service>[.<namespace>[.svc[.cluster.local]]]:port for one
// StatefulSet pod, or <service>[...]:port for a Service. It returns the
// pod or Service it names, which must be of component comp and serve gRPC
// on that port.
func (c *checker) resolvePeer(addr, comp string) (string, error) {
	host, portStr, err := net.SplitHostPort(addr)
	if err != nil {
		return "", err
	}
	port, err := strconv.Atoi(portStr)
	if err != nil {
		return "", fmt.Errorf("port %q: %v", portStr, err)
	}
	parts := strings.Split(host, ".")
	// Drop a namespace-qualified suffix: it must name this namespace.
	for _, suffix := range [][]string{{"svc", "cluster", "local"}, {"svc"}, nil} {
		n := len(parts) - len(suffix) - 1
		if n >= 1 && slices.Equal(parts[n+1:], suffix) && len(parts) > 2 {
			if parts[n] != c.namespace {
				return "", fmt.Errorf("%s names namespace %s, not %s", host, parts[n], c.namespace)
			}
			parts = parts[:n]
			break
		}
	}
	switch len(parts) {
	case 1: // a Service
		svc := c.o.services[parts[0]]
		if svc == nil {
			return "", fmt.Errorf("no Service %s", parts[0])
		}
		for _, sp := range svc.Spec.Ports {
			if int(sp.Port) != port {
				continue
			}
			targets, _ := c.podsOfService(svc.Spec.Selector)
			for _, sts := range targets {
				if sts.Spec.Template.Labels[componentLabel] != comp {
					return "", fmt.Errorf("Service %s selects %s pods, want %s", svc.Name, sts.Spec.Template.Labels[componentLabel], comp)
				}
				if tp, ok := resolveTargetPort(&sts.Spec.Template.Spec.Containers[0], sp); !ok || tp != mustPort(&sts.Spec.Template.Spec.Containers[0], "grpc") {
					return "", fmt.Errorf("Service %s port %d does not reach the gRPC port of %s", svc.Name, port, sts.Name)
				}
				return "service/" + svc.Name, nil
			}
			return "", fmt.Errorf("Service %s selects no pods", svc.Name)
		}
		return "", fmt.Errorf("Service %s has no port %d", svc.Name, port)
	case 2: // a StatefulSet pod
		podName, svcName := parts[0], parts[1]
		for _, name := range sortedKeys(c.o.statefulSets) {
			sts := c.o.statefulSets[name]
			if sts.Spec.ServiceName != svcName {
				continue
			}
			ord, err := strconv.Atoi(strings.TrimPrefix(podName, sts.Name+"-"))
			if !strings.HasPrefix(podName, sts.Name+"-") || err != nil {
				continue
			}
			if ord < 0 || int32(ord) >= ptrOr(sts.Spec.Replicas, 1) {
				return "", fmt.Errorf("pod %s does not exist: StatefulSet %s runs %d", podName, sts.Name, ptrOr(sts.Spec.Replicas, 1))
			}
			if got := sts.Spec.Template.Labels[componentLabel]; got != comp {
				return "", fmt.Errorf("pod %s is a %s, want a %s", podName, got, comp)
			}
			if gp := mustPort(&sts.Spec.Template.Spec.Containers[0], "grpc"); int32(port) != gp {
				return "", fmt.Errorf("pod %s serves gRPC on %d, not %d", podName, gp, port)
			}
			return "pod/" + podName, nil
		}
		return "", fmt.Errorf("no StatefulSet with serviceName %s runs a pod %s", svcName, podName)
	default:
		return "", fmt.Errorf("host %q is neither <pod>.<headless service> nor <service>", host)
	}
}

// checkServices: each Service selects the pods of one StatefulSet, and
// every port reaches a port the container listens on. A Service that
// selects on a run-time label routes to the pods the nodes label so: the
// role is primary or replica, reads is "true", and the pods set them (a
// data node with --kube-lease labels its own Pod); a headless Service
// publishes pods before they are ready, so that peers resolve them while
// they recover.
func (c *checker) checkServices() {
	for _, name := range sortedKeys(c.o.services) {
		svc := c.o.services[name]
		where := "Service " + name
		if len(svc.Spec.Selector) == 0 {
			c.errorf("%s: no selector", where)
			continue
		}
		targets, runTime := c.podsOfService(svc.Spec.Selector)
		if len(targets) != 1 {
			c.errorf("%s: selects the pods of %d StatefulSets, want 1", where, len(targets))
			continue
		}
		sts := targets[0]
		ct := &sts.Spec.Template.Spec.Containers[0]
		for _, sp := range svc.Spec.Ports {
			if _, ok := resolveTargetPort(ct, sp); !ok {
				c.errorf("%s port %s (%d): targetPort %s is not a port of container %s", where, sp.Name, sp.Port, sp.TargetPort.String(), ct.Name)
			}
		}
		if svc.Spec.ClusterIP == corev1.ClusterIPNone && !svc.Spec.PublishNotReadyAddresses {
			c.errorf("%s: headless without publishNotReadyAddresses: peers cannot resolve a pod until it is ready", where)
		}
		if runTime == nil {
			continue
		}
		if role, ok := runTime[roleLabel]; ok && role != "primary" && role != "replica" {
			c.errorf("%s: selects %s=%q; nodes label themselves primary or replica", where, roleLabel, role)
		}
		if reads, ok := runTime[readsLabel]; ok && reads != "true" {
			c.errorf("%s: selects %s=%q; nodes set it to \"true\" or not at all", where, readsLabel, reads)
		}
		if svc.Spec.ClusterIP == corev1.ClusterIPNone || svc.Spec.PublishNotReadyAddresses {
			c.errorf("%s: routes by role, so it must be a ClusterIP Service of ready pods only", where)
		}
		if p, err := c.podConfig(sts, 0); err == nil && !p.callsAPI() {
			c.errorf("%s: selects %v, but the pods of StatefulSet %s run without --kube-lease and never set it", where, runTime, sts.Name)
		}
	}
}

// checkPDBs: each budget covers the pods of one StatefulSet, selects them
// by labels that do not change at run time, and lets at least one pod go
// (a budget that allows none blocks every node drain); every StatefulSet
// of more than one pod has exactly one (the eviction API refuses a pod
// under two). How many a budget may let go is checked against the
// contract by checkCluster.
func (c *checker) checkPDBs() {
	if len(c.o.pdbs) == 0 {
		c.errorf("no PodDisruptionBudget")
	}
	covered := map[string][]string{}
	for _, name := range sortedKeys(c.o.pdbs) {
		pdb := c.o.pdbs[name]
		if l, ok := selectsRunTime(pdb.Spec.Selector); ok {
			c.errorf("PodDisruptionBudget %s: selects on %s, which changes at run time", name, l)
			continue
		}
		targets := c.podsOf(pdb.Spec.Selector)
		if len(targets) != 1 {
			c.errorf("PodDisruptionBudget %s: selects the pods of %d StatefulSets, want 1", name, len(targets))
			continue
		}
		covered[targets[0].Name] = append(covered[targets[0].Name], name)
		if _, err := disruptionsAllowed(pdb, ptrOr(targets[0].Spec.Replicas, 1)); err != nil {
			c.errorf("PodDisruptionBudget %s: %v", name, err)
		}
	}
	for _, name := range sortedKeys(c.o.statefulSets) {
		if r := ptrOr(c.o.statefulSets[name].Spec.Replicas, 1); r > 1 && len(covered[name]) != 1 {
			c.errorf("StatefulSet %s: %d pods under %d PodDisruptionBudgets %v, want exactly 1", name, r, len(covered[name]), covered[name])
		}
	}
}

// disruptionsAllowed is how many of replicas pods a budget lets go at once
// (when all are healthy); at least one, or it blocks every drain.
func disruptionsAllowed(pdb *policyv1.PodDisruptionBudget, replicas int32) (int32, error) {
	var n int32
	switch {
	case pdb.Spec.MaxUnavailable != nil && pdb.Spec.MinAvailable != nil:
		return 0, fmt.Errorf("both minAvailable and maxUnavailable")
	case pdb.Spec.MaxUnavailable != nil:
		v, err := intstr.GetScaledValueFromIntOrPercent(pdb.Spec.MaxUnavailable, int(replicas), false)
		if err != nil {
			return 0, fmt.Errorf("maxUnavailable: %v", err)
		}
		n = int32(v)
	case pdb.Spec.MinAvailable != nil:
		v, err := intstr.GetScaledValueFromIntOrPercent(pdb.Spec.MinAvailable, int(replicas), true)
		if err != nil {
			return 0, fmt.Errorf("minAvailable: %v", err)
		}
		n = replicas - int32(v)
	default:
		return 0, fmt.Errorf("neither minAvailable nor maxUnavailable")
	}
	if n < 1 {
		return n, fmt.Errorf("lets %d of %d pods go: it blocks every drain", max(n, 0), replicas)
	}
	return n, nil
}

// checkPodMonitors: a PodMonitor selects every walship pod, scrapes a port
// each one has, and labels the targets with a job the alert rules match.
func (c *checker) checkPodMonitors() {
	for _, name := range sortedKeys(c.o.podMonitors) {
		pm := c.o.podMonitors[name]
		where := "PodMonitor " + name
		if l, ok := selectsRunTime(&pm.Spec.Selector); ok {
			c.errorf("%s: selects on %s: a failover would move a pod out of its scrape", where, l)
		}
		targets := c.podsOf(&pm.Spec.Selector)
		if len(targets) != len(c.o.statefulSets) {
			c.errorf("%s: selects %d of the %d StatefulSets' pods", where, len(targets), len(c.o.statefulSets))
		}
		if len(pm.Spec.PodMetricsEndpoints) == 0 {
			c.errorf("%s: no podMetricsEndpoints", where)
		}
		for _, ep := range pm.Spec.PodMetricsEndpoints {
			for _, sts := range targets {
				ct := &sts.Spec.Template.Spec.Containers[0]
				if ep.Port == nil {
					c.errorf("%s: endpoint without a port name", where)
					break
				}
				if _, ok := containerPort(ct, *ep.Port); !ok {
					c.errorf("%s: port %q is not a port of %s", where, *ep.Port, sts.Name)
				}
				for _, rc := range ep.RelabelConfigs {
					for _, sl := range rc.SourceLabels {
						for _, l := range runTimeLabels {
							if string(sl) == "__meta_kubernetes_pod_label_"+sanitize(l) && rc.Action != "drop" && rc.Action != "keep" {
								c.errorf("%s: relabels %s from the %s label: it changes at a failover and would start new series", where, rc.TargetLabel, l)
							}
						}
					}
				}
				job := relabelJob(ep.RelabelConfigs, sts.Spec.Template.Labels, c.namespace+"/"+pm.Name)
				if !jobPattern.MatchString(job) {
					c.errorf("%s: %s targets get job %q, which the rules' up{job=~\"walship.*\"} misses", where, sts.Name, job)
				}
			}
		}
	}
}

// jobPattern is the job matcher of the WalshipTargetDown rule.
var jobPattern = regexp.MustCompile(`^(?:walship.*)$`)

// relabelJob applies the replace relabelings that target job to a pod with
// podLabels, starting from the operator's default job (namespace/name).
func relabelJob(rcs []monitoringv1.RelabelConfig, podLabels map[string]string, job string) string {
	meta := map[string]string{"job": job}
	for k, v := range podLabels {
		meta["__meta_kubernetes_pod_label_"+sanitize(k)] = v
	}
	for _, rc := range rcs {
		if (rc.Action != "" && strings.ToLower(rc.Action) != "replace") || rc.TargetLabel != "job" {
			continue
		}
		var vals []string
		for _, s := range rc.SourceLabels {
			vals = append(vals, meta[string(s)])
		}
		sep := ";"
		if rc.Separator != nil {
			sep = *rc.Separator
		}
		re := "(.*)"
		if rc.Regex != "" {
			re = rc.Regex
		}
		rx, err := regexp.Compile("^(?:" + re + ")$")
		if err != nil {
			return ""
		}
		src := strings.Join(vals, sep)
		m := rx.FindStringSubmatchIndex(src)
		if m == nil {
			continue
		}
		repl := "$1"
		if rc.Replacement != nil {
			repl = *rc.Replacement
		}
		meta["job"] = string(rx.ExpandString(nil, repl, src, m))
	}
	return meta["job"]
}

var unsafeLabelChars = regexp.MustCompile(`[^a-zA-Z0-9_]`)

func sanitize(s string) string { return unsafeLabelChars.ReplaceAllString(s, "_") }

func containerPort(ct *corev1.Container, name string) (int32, bool) {
	for _, p := range ct.Ports {
		if p.Name == name {
			return p.ContainerPort, true
		}
	}
	return 0, false
}

func mustPort(ct *corev1.Container, name string) int32 {
	p, _ := containerPort(ct, name)
	return p
}

// resolveTargetPort returns the container port a Service port reaches.
func resolveTargetPort(ct *corev1.Container, sp corev1.ServicePort) (int32, bool) {
	tp := sp.TargetPort
	switch {
	case tp.StrVal != "":
		return containerPort(ct, tp.StrVal)
	case tp.IntVal != 0:
		for _, p := range ct.Ports {
			if p.ContainerPort == tp.IntVal {
				return p.ContainerPort, true
			}
		}
		return 0, false
	default: // targetPort defaults to port
		for _, p := range ct.Ports {
			if p.ContainerPort == sp.Port {
				return p.ContainerPort, true
			}
		}
		return 0, false
	}
}

func ptrTrue(b *bool) bool { return b != nil && *b }

// selectsRunTime returns a run-time label sel matches on, if any.
func selectsRunTime(sel *metav1.LabelSelector) (string, bool) {
	for _, l := range runTimeLabels {
		if selectorHas(sel, l) {
			return l, true
		}
	}
	return "", false
}

// selectorHas says whether sel matches on label key at all.
func selectorHas(sel *metav1.LabelSelector, key string) bool {
	if sel == nil {
		return false
	}
	if _, ok := sel.MatchLabels[key]; ok {
		return true
	}
	for _, e := range sel.MatchExpressions {
		if e.Key == key {
			return true
		}
	}
	return false
}

func ptrOr[T any](p *T, def T) T {
	if p == nil {
		return def
	}
	return *p
}
