package e2e

import (
	"context"
	"fmt"
	"net"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	walshipv1 "github.com/walship/walship/gen/walship/v1"
	"github.com/walship/walship/internal/testkit"
	"github.com/walship/walship/internal/tlsid"
)

// TestJoinUnderMTLS: mutual TLS everywhere under the default policy, with
// the flags the Kubernetes manifests give: three log stores that all run
// with --join (a fresh cluster: they are in the bootstrap contract and
// ask for nothing), data nodes n0 and n1, then n2 started with --join
// (a data node asks the primary to add it) and ls3 with --join (a log
// store asks to be added). Both end in the primary's contract, and
// writes are acknowledged after.
func TestJoinUnderMTLS(t *testing.T) {
	needLinux(t)
	dir, certs := t.TempDir(), t.TempDir()
	ca, err := tlsid.NewCA("e2e CA", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	issue := func(name, class string) tlsid.Files {
		f, err := ca.WriteFiles(certs, name, tlsid.Leaf{URI: tlsid.URI("e2e", class, name), IPs: []net.IP{net.ParseIP("127.0.0.1")}})
		if err != nil {
			t.Fatal(err)
		}
		return f
	}
	tlsFlags := func(f tlsid.Files) []string {
		return []string{"--tls-cert", f.Cert, "--tls-key", f.Key, "--tls-ca", f.CA, "--trust-domain", "e2e"}
	}
	// One certificate per role, shared by its pods, as components/tls.
	lsFiles, nodeFiles := issue("logstores", tlsid.ClassLogStore), issue("nodes", tlsid.ClassNode)
	var lsAddrs, nodeAddrs []string
	for range 4 {
		lsAddrs = append(lsAddrs, testkit.FreeAddr(t))
	}
	for range 3 {
		nodeAddrs = append(nodeAddrs, testkit.FreeAddr(t))
	}
	initial := lsAddrs[:3]
	logStore := func(i int) *procNode {
		addr := lsAddrs[i]
		return &procNode{name: fmt.Sprintf("ls%d", i), serving: "log store serving", addr: addr, t: t, args: append([]string{"logstore",
			"--listen", addr, "--metrics-listen", "", "--data-dir", filepath.Join(dir, fmt.Sprintf("ls%d", i)),
			"--peers", strings.Join(initial, ","), "--join", "--advertise", addr, "--nodes", strings.Join(nodeAddrs, ",")}, tlsFlags(lsFiles)...)}
	}
	peers := fmt.Sprintf("n0=%s,n1=%s", nodeAddrs[0], nodeAddrs[1])
	dataNode := func(i int, extra ...string) *procNode {
		id, addr := fmt.Sprintf("n%d", i), nodeAddrs[i]
		cmd, serving := "replica", "replica serving"
		if i == 0 {
			cmd, serving = "primary", "primary serving"
		}
		args := []string{cmd, "--id", id, "--listen", addr, "--metrics-listen", "", "--data-dir", filepath.Join(dir, id),
			"--peers", peers, "--logstore", strings.Join(initial, ","), "--primary", nodeAddrs[0],
			"--durability", "sync", "--replication", "sync", "--sync-replicas", "1", "--sync-level", "flush", "--logstore-ack", "sync",
			"--sync-timeout", "3s", "--heartbeat-interval", "100ms", "--lease-timeout", "500ms"}
		return &procNode{name: id, serving: serving, addr: addr, t: t, args: append(append(args, extra...), tlsFlags(nodeFiles)...)}
	}
	var stores []*procNode
	for i := range 3 {
		stores = append(stores, logStore(i))
		stores[i].start()
	}
	for i := range 2 {
		dataNode(i).start()
	}

	src, err := tlsid.Load(issue("ops", tlsid.ClassAdmin), nil)
	if err != nil {
		t.Fatal(err)
	}
	admin := walshipv1.NewAdminServiceClient(tlsConn(t, nodeAddrs[0], src))
	kv := walshipv1.NewKVServiceClient(tlsConn(t, nodeAddrs[0], src))
	put := func(k string) {
		t.Helper()
		testkit.UntilWithin(t, 30*time.Second, "Put "+k, func() bool {
			ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
			defer cancel()
			_, err := kv.Put(ctx, &walshipv1.PutRequest{Key: k, Value: []byte("x")})
			return err == nil
		})
	}
	// waitFor waits until the primary's contract, no change in progress,
	// has the members and log stores wanted.
	waitFor := func(what string, members, logstores []string) *walshipv1.MembershipStatus {
		t.Helper()
		var last *walshipv1.MembershipStatus
		testkit.UntilWithin(t, 90*time.Second, what, func() bool {
			ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
			defer cancel()
			resp, err := admin.ListMembers(ctx, &walshipv1.ListMembersRequest{})
			if err != nil {
				return false
			}
			m := resp.GetMembership()
			last = m
			var ids []string
			for _, mm := range m.GetContract().GetMembers() {
				ids = append(ids, mm.GetId())
			}
			slices.Sort(ids)
			ls := slices.Sorted(slices.Values(m.GetContract().GetLogstores()))
			return m.GetChange() == "" && !m.GetJoint() && slices.Equal(ids, members) && slices.Equal(ls, slices.Sorted(slices.Values(logstores)))
		})
		return last
	}
	put("a")
	m := waitFor("the bootstrap contract", []string{"n0", "n1"}, initial)
	for _, ls := range stores {
		testkit.UntilWithin(t, 30*time.Second, ls.name+" to find itself named", func() bool {
			return strings.Contains(ls.p.logs(), "a log store of the cluster's contract: not asking to join")
		})
	}
	if m.GetContract().GetMembersChanged() {
		t.Fatalf("the fresh cluster's log stores changed its membership: %v", m.GetContract())
	}

	n2 := dataNode(2, "--join", "--advertise", nodeAddrs[2])
	n2.start()
	ls3 := logStore(3)
	t.Cleanup(func() {
		if t.Failed() {
			for _, p := range []*procNode{n2, ls3} {
				if p.p != nil {
					t.Logf("%s's log:\n%s", p.name, p.p.logs())
				}
			}
		}
	})
	waitFor("n2 (--join) to be added", []string{"n0", "n1", "n2"}, initial)
	put("b")
	ls3.start()
	waitFor("ls3 (--join) to be added", []string{"n0", "n1", "n2"}, lsAddrs)
	put("c")
	for _, p := range []*procNode{n2, ls3} {
		if logs := p.p.logs(); strings.Contains(logs, "PermissionDenied") {
			t.Errorf("%s was refused on its way in:\n%s", p.name, logs)
		}
	}
}
