package kubetest

import (
	"os/exec"
	"strings"
	"testing"
)

// TestServerServesLeases: the API server starts, the admin kubeconfig
// works with kubectl, and RBAC refuses a user without a role.
func TestServerServesLeases(t *testing.T) {
	kubectl := Kubectl(t)
	s := StartT(t, "nobody")
	out, err := exec.Command(kubectl, "--kubeconfig", s.Admin, "get", "leases", "-A").CombinedOutput()
	if err != nil {
		t.Fatalf("kubectl get leases: %v\n%s", err, out)
	}
	kc, err := s.Kubeconfig("nobody")
	if err != nil {
		t.Fatal(err)
	}
	out, err = exec.Command(kubectl, "--kubeconfig", kc, "get", "leases", "-n", "default").CombinedOutput()
	if err == nil || !strings.Contains(string(out), "forbidden") {
		t.Fatalf("a user without a role listed leases: %v\n%s", err, out)
	}
}
