package cli

import (
	"strings"
	"testing"
	"time"

	"github.com/walship/walship/app/cluster"
	walshipv1 "github.com/walship/walship/gen/walship/v1"
	"github.com/walship/walship/internal/serve"
	"github.com/walship/walship/internal/testkit"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// TestWrongKindOfNode: a command pointed at the wrong kind of node says
// what that node is and where to go instead, as `check linear` does,
// rather than a bare "unknown service" or "method … not implemented":
// a switchover at a replica or a log store, a verify or a restore at a
// data node, KV calls at a log store.
func TestWrongKindOfNode(t *testing.T) {
	c, err := cluster.Start(t.Context(), cluster.Config{Dir: t.TempDir(), LogStores: 1, Replicas: 1, Failover: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := c.Stop(); err != nil {
			t.Error(err)
		}
	})
	p, r, ls := c.Primary.Addr, c.Replicas[0].Addr, c.LogStores[0].Addr
	// The replica knows the primary once it has applied its epoch record.
	testkit.UntilWithin(t, 30*time.Second, "the replica to know the primary", func() bool {
		st, err := nodeStatus(t.Context(), serve.Dialer{}, r)
		return err == nil && st.GetPrimaryId() == "primary" && st.GetPrimary() == p
	})
	atPrimary := "primary at " + p
	for _, tc := range []struct {
		args []string
		want []string
	}{
		{[]string{"ctl", "switchover", "--primary", r, "--target", "primary"}, []string{"replica replica-0 is not the primary", atPrimary}},
		{[]string{"ctl", "switchover", "--primary", ls, "--target", "replica-0"}, []string{ls + " is a log store", atPrimary}},
		{[]string{"ctl", "verify", "--logstore", p}, []string{p + " is a data node, the primary primary", "its log stores are " + ls}},
		{[]string{"ctl", "verify", "--logstore", r}, []string{r + " is a data node, the replica replica-0", atPrimary, "the log stores are " + ls}},
		{[]string{"restore", "--logstore", p, "--latest", "--dry-run"}, []string{p + " is a data node, the primary primary", "its log stores are " + ls}},
		{[]string{"check", "linear", "--primary", ls, "--duration", "1s"}, []string{ls + " is a log store, not the primary", atPrimary}},
		{[]string{"check", "linear", "--primary", r, "--duration", "1s"}, []string{r + " is a replica, not the primary", atPrimary}},
	} {
		code, out, errOut := run(t, tc.args...)
		for _, w := range tc.want {
			if code != 1 || !strings.Contains(out+errOut, w) {
				t.Errorf("%v: exit %d, want exit 1 saying %q\nstdout:\n%s\nstderr:\n%s", tc.args, code, w, out, errOut)
			}
		}
		if strings.Contains(out+errOut, "unknown service") || strings.Contains(out+errOut, "not implemented") {
			t.Errorf("%v: a bare gRPC answer:\n%s%s", tc.args, out, errOut)
		}
	}
	// KVService at a log store: UNIMPLEMENTED, saying it is a log store
	// and where the primary is.
	kv := walshipv1.NewKVServiceClient(c.Conn(c.LogStores[0]))
	_, err = kv.Put(t.Context(), &walshipv1.PutRequest{Key: "k", Value: []byte("v")})
	if st := status.Convert(err); st.Code() != codes.Unimplemented || !strings.Contains(st.Message(), "/walship.v1.KVService/Put is not served here: "+ls+" is a log store") ||
		!strings.Contains(st.Message(), atPrimary) {
		t.Errorf("Put at a log store: %v", err)
	}
}

// TestSwitchoverTargetNamesMembers: a switchover to a node that is not a
// member, or without --target, lists the members it could hand over to.
func TestSwitchoverTargetNamesMembers(t *testing.T) {
	c, err := cluster.Start(t.Context(), cluster.Config{Dir: t.TempDir(), LogStores: 1, Replicas: 2, Failover: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := c.Stop(); err != nil {
			t.Error(err)
		}
	})
	code, out, errOut := run(t, "ctl", "switchover", "--primary", c.Primary.Addr, "--target", "nope")
	if code != 1 || !strings.Contains(errOut, `is not another member of the cluster (--peers): want one of replica-0, replica-1`) {
		t.Errorf("--target nope: exit %d\nstdout:\n%s\nstderr:\n%s", code, out, errOut)
	}
	code, out, errOut = run(t, "ctl", "switchover", "--primary", c.Primary.Addr)
	if code != 2 || !strings.Contains(errOut, "--target: required: the node id of the member to hand over to, one of replica-0, replica-1") {
		t.Errorf("no --target: exit %d\nstdout:\n%s\nstderr:\n%s", code, out, errOut)
	}
}
