package realkube

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"
)

// CertManagerBinary is cert-manager's controller (tools/certmanager,
// `make certmanager`), looked for in Config.Bin.
const CertManagerBinary = "cert-manager-controller"

// CertManagerNamespace is the controller's own namespace, where the
// Secrets of ClusterIssuers would live (--cluster-resource-namespace).
const CertManagerNamespace = "cert-manager"

// CRDSource is a Go module that ships CustomResourceDefinitions as plain
// YAML, pinned by version and by the hash of its zip (as go.sum pins it),
// and the directory in it that holds them: the same pins as
// internal/deploytest's API server test.
type CRDSource struct {
	Module, Version, Sum, Dir string
}

// ProdCRDs are the CRDs the prod overlay's objects need: cert-manager's
// (Certificate, Issuer: components/tls) and the Prometheus Operator's
// (PodMonitor, PrometheusRule: components/monitoring).
var ProdCRDs = []CRDSource{
	{"github.com/cert-manager/cert-manager", "v1.21.2", "h1:UWgoYM+KLNtRlqmoWOKjKBOBUPVHeepQ6/ac3ERJW68=", "deploy/crds"},
	{"github.com/prometheus-operator/prometheus-operator", "v0.85.0", "h1:M5xLCLEoaW2IJfnuCwFzzpL+jSVQu3KGT84Pye+fW8s=", "example/prometheus-operator-crd"},
}

// InstallCRDs downloads each source with `go mod download` (from the
// module cache when it is there, else the module proxy), checks its hash,
// applies its CRDs (server-side: some are larger than the last-applied
// annotation allows) and waits for them to be Established.
func (c *Cluster) InstallCRDs(ctx context.Context, sources []CRDSource) error {
	for _, src := range sources {
		cmd := exec.CommandContext(ctx, "go", "mod", "download", "-json", src.Module+"@"+src.Version)
		// Outside any module: nothing of go.mod or go.sum is read or
		// written; the hash is checked below against the pin.
		cmd.Dir = c.cfg.Dir
		cmd.Env = append(os.Environ(), "GOWORK=off", "GONOSUMDB="+src.Module, "GOFLAGS=")
		var stdout, stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		err := cmd.Run()
		var info struct{ Dir, Sum, Error string }
		if jerr := json.Unmarshal(stdout.Bytes(), &info); jerr != nil || info.Error != "" || err != nil {
			return fmt.Errorf("go mod download %s@%s: %v %s %s", src.Module, src.Version, err, info.Error, stderr.Bytes())
		}
		if info.Sum != src.Sum {
			return fmt.Errorf("%s@%s: hash %s, but the pin is %s", src.Module, src.Version, info.Sum, src.Sum)
		}
		files, err := filepath.Glob(filepath.Join(info.Dir, filepath.FromSlash(src.Dir), "*.yaml"))
		if err != nil || len(files) == 0 {
			return fmt.Errorf("%s@%s: no CRD files in %s: %v", src.Module, src.Version, src.Dir, err)
		}
		args := []string{"apply", "--server-side", "--field-manager=realkube"}
		for _, f := range files {
			args = append(args, "-f", f)
		}
		out, err := c.KubectlOutput(ctx, nil, append(args, "-o", "name")...)
		if err != nil {
			return err
		}
		var crds []string
		for _, n := range strings.Fields(string(out)) {
			if strings.HasPrefix(n, "customresourcedefinition") {
				crds = append(crds, n)
			}
		}
		if err := c.Kubectl(ctx, nil, append([]string{"wait", "--for=condition=Established", "--timeout=2m"}, crds...)...); err != nil {
			return err
		}
	}
	return nil
}

// StartCertManager runs cert-manager's controller on the host, as CoreDNS
// runs (out of cluster, with the admin kubeconfig, no leader election),
// in its namespace; Close stops it by PID with the rest. Its CRDs must be
// installed (InstallCRDs). No webhook and no cainjector: the API server
// checks the objects against the CRDs' schemas, and the Issuers used here
// (self-signed, CA) need no CA bundle injected anywhere.
func (c *Cluster) StartCertManager(ctx context.Context) error {
	bin := c.bin(CertManagerBinary)
	if _, err := os.Stat(bin); err != nil {
		return fmt.Errorf("%w (make certmanager)", err)
	}
	ns := fmt.Sprintf("apiVersion: v1\nkind: Namespace\nmetadata: {name: %s}\n", CertManagerNamespace)
	if err := c.Kubectl(ctx, strings.NewReader(ns), "apply", "-f", "-"); err != nil {
		return err
	}
	return c.run(ctx, "cert-manager", bin, "--kubeconfig", c.Kubeconfig,
		"--cluster-resource-namespace", CertManagerNamespace)
}

// WaitCertificatesReady waits until every Certificate of namespace ns has
// the condition Ready, and returns their names.
func (c *Cluster) WaitCertificatesReady(ctx context.Context, ns string, timeout time.Duration) ([]string, error) {
	var names []string
	err := waitFor(ctx, timeout, "Certificates Ready in "+ns, func() error {
		out, err := c.KubectlOutput(ctx, nil, "-n", ns, "get", "certificates",
			"-o", `jsonpath={range .items[*]}{.metadata.name}={.status.conditions[?(@.type=="Ready")].status}{"\n"}{end}`)
		if err != nil {
			return err
		}
		names = names[:0]
		var notReady []string
		for _, l := range strings.Fields(string(out)) {
			name, st, _ := strings.Cut(l, "=")
			names = append(names, name)
			if st != "True" {
				notReady = append(notReady, l)
			}
		}
		if len(names) == 0 {
			return fmt.Errorf("no Certificate")
		}
		if len(notReady) > 0 {
			return fmt.Errorf("not Ready: %v", notReady)
		}
		return nil
	})
	return names, err
}
