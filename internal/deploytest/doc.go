// Package deploytest checks walship's deployment artifacts: the Kubernetes
// manifests in deploy/k8s (built with the kustomize library, decoded
// strictly into the Kubernetes API types and checked for fit: selectors,
// ports, flags, peers, the failover contract, disruption budgets, RBAC,
// certificates), the same manifests against a real API server
// (internal/kubetest: a server-side dry run of every overlay with the
// CRDs it uses, and base/rbac.yaml before the real authorizer), and the
// container image, which a Docker test builds FROM scratch and runs as a
// small cluster with the dev overlay's arguments.
//
// It also owns the two generated monitoring manifests under
// deploy/k8s/components/monitoring: the PrometheusRule built from
// deploy/prometheus/walship-rules.yaml and the Grafana dashboard ConfigMap
// built from deploy/grafana/walship.json. Regenerate them with
//
//	make manifests
//
// from the repository root; the tests fail when they are stale.
package deploytest
