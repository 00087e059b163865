package kube

import (
	"context"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/walship/walship/internal/kubetest"
)

// TestLeaseHeldAndTakenOver, against a real API server: the first
// campaigner holds the Lease and Held says so; a second does not; the
// second's TakeOver makes it the holder at once, and the first's release
// when it stops leaves the Lease to the second; labels and
// Exists work with nothing but admin rights here.
func TestLeaseHeldAndTakenOver(t *testing.T) {
	kubectl := kubetest.Kubectl(t)
	api := kubetest.StartT(t)
	if out, err := exec.Command(kubectl, "--kubeconfig", api.Admin, "create", "namespace", "w").CombinedOutput(); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	for _, p := range []string{"a", "b"} {
		cmd := exec.Command(kubectl, "--kubeconfig", api.Admin, "-n", "w", "apply", "-f", "-")
		cmd.Stdin = strings.NewReader("apiVersion: v1\nkind: Pod\nmetadata: {name: " + p + "}\nspec: {containers: [{name: c, image: x}]}\n")
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("%v\n%s", err, out)
		}
	}
	newClient := func(pod string) *Client {
		c, err := New(Config{Kubeconfig: api.Admin, Namespace: "w", Pod: pod, Lease: "walship",
			LeaseDuration: DefaultLeaseDuration, RenewDeadline: DefaultRenewDeadline, RetryPeriod: DefaultRetryPeriod})
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	a, b := newClient("a"), newClient("b")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if ok, err := a.Exists(ctx); err != nil || ok {
		t.Fatalf("Exists before any campaign: %v, %v", ok, err)
	}
	leading, aDone := make(chan struct{}), make(chan struct{})
	actx, acancel := context.WithCancel(ctx)
	defer acancel()
	go func() {
		defer close(aDone)
		_ = a.Campaign(actx, true, func(context.Context) { close(leading) })
	}()
	<-leading
	if !a.Held() {
		t.Fatal("a leads but Held is false")
	}
	// Its next renewal closes Renewed's channel (what a commit waiting out
	// a late renewal waits on).
	select {
	case <-a.Renewed():
	case <-time.After(time.Minute):
		t.Fatal("a renews the Lease, but Renewed's channel did not close in a minute")
	}
	if ok, err := b.Exists(ctx); err != nil || !ok {
		t.Fatalf("Exists after a campaign: %v, %v", ok, err)
	}
	bctx, bcancel := context.WithCancel(ctx)
	defer bcancel()
	go func() { _ = b.Campaign(bctx, false, func(context.Context) {}) }()
	if b.Held() {
		t.Fatal("b holds a Lease a renews")
	}
	if err := b.TakeOver(ctx); err != nil {
		t.Fatal(err)
	}
	if !b.Held() {
		t.Fatal("b took the Lease over but Held is false")
	}
	// a stops: its release must not free the Lease b holds now.
	acancel()
	<-aDone
	if a.Held() {
		t.Fatal("a still holds the Lease after its campaign ended")
	}
	out, err := exec.Command(kubectl, "--kubeconfig", api.Admin, "-n", "w", "get", "lease", "walship", "-o", "jsonpath={.spec.holderIdentity}").CombinedOutput()
	if err != nil || string(out) != "b" {
		t.Fatalf("after a's release the Lease's holder is %q (%v), want b", out, err)
	}
	on, off := true, false
	if err := a.Label(ctx, "replica", &on); err != nil {
		t.Fatal(err)
	}
	if err := b.Label(ctx, "replica", &on); err != nil {
		t.Fatal(err)
	}
	// A promotion: the role changes, the reads label stays (nil leaves it).
	if err := b.Label(ctx, "primary", nil); err != nil {
		t.Fatal(err)
	}
	labels := func() string {
		t.Helper()
		out, err := exec.Command(kubectl, "--kubeconfig", api.Admin, "-n", "w", "get", "pods", "a", "b",
			"-o", `jsonpath={range .items[*]}{.metadata.name}:{.metadata.labels.walship\.io/role}:{.metadata.labels.walship\.io/reads} {end}`).CombinedOutput()
		if err != nil {
			t.Fatalf("labels: %v\n%s", err, out)
		}
		return strings.TrimSpace(string(out))
	}
	if got, want := labels(), "a:replica:true b:primary:true"; got != want {
		t.Fatalf("labels %q, want %q", got, want)
	}
	if err := b.Label(ctx, "primary", &off); err != nil {
		t.Fatal(err)
	}
	if got, want := labels(), "a:replica:true b:primary:"; got != want {
		t.Fatalf("labels %q, want %q", got, want)
	}
}

// TestConfigNamesTheFlag: every mistake names its flag.
func TestConfigNamesTheFlag(t *testing.T) {
	err := Config{LeaseDuration: time.Second, RenewDeadline: 2 * time.Second, RetryPeriod: 0}.Validate()
	for _, f := range []string{"--kube-lease", "--pod-namespace", "--pod-name", "--kube-retry-period", "--kube-lease-duration"} {
		if err == nil || !strings.Contains(err.Error(), f) {
			t.Errorf("error %v does not name %s", err, f)
		}
	}
}
