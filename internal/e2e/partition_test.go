package e2e

import (
	"context"
	"fmt"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	walshipv1 "github.com/walship/walship/gen/walship/v1"
	"github.com/walship/walship/internal/testkit"
	"github.com/walship/walship/pkg/client"
)

// TestFailoverPartition: three log stores and three data nodes run as
// containers on a cluster network, and each is also on a second network
// that only the test's clients use. Under checked load, the primary is cut
// off the cluster network (docker network disconnect) while clients still
// reach it; a replica on the majority side is promoted; the network heals.
// The history across it all is linearizable — the cut-off primary
// acknowledged nothing the new one lacks, and served no stale read — the
// old primary rejoins as a replica, keeping what it wrote alone in an
// orphan file, and the three data nodes converge on one state digest.
func TestFailoverPartition(t *testing.T) {
	needLinux(t)
	if testing.Short() {
		t.Skip("skipping the Docker partition test in -short mode")
	}
	testkit.NeedDocker(t)
	r := testkit.NewDockerRun(t)
	image := r.Image()
	clusterNet, clientNet := r.Network("cluster"), r.Network("clients")

	const nodePort, lsPort = 7000, 7100
	var lsAddrs, peers []string
	for i := range 3 {
		lsAddrs = append(lsAddrs, fmt.Sprintf("ls%d:%d", i, lsPort))
		peers = append(peers, fmt.Sprintf("n%d=n%d:%d", i, i, nodePort))
	}
	type ctr struct{ alias, name, addr string }
	var all []*ctr
	run := func(alias string, port int, args ...string) *ctr {
		c := &ctr{alias: alias, name: "walship-test-" + r.ID + "-" + alias}
		all = append(all, c)
		// Created on the clients' network, where the test reaches it, with
		// no alias there: no node resolves another on it. The alias peers
		// use is on the cluster network only.
		r.Must(append(append(append([]string{"create", "--name", c.name, "--network", clientNet}, r.Labels()...), image), args...)...)
		r.Must("network", "connect", "--alias", alias, clusterNet, c.name)
		r.Must("start", c.name)
		c.addr = net.JoinHostPort(r.IP(c.name, clientNet), strconv.Itoa(port))
		return c
	}
	t.Cleanup(func() {
		if t.Failed() {
			for _, c := range all {
				t.Logf("--- docker logs %s ---\n%s", c.alias, testkit.DockerLogs(c.name, 40))
			}
		}
	})
	for i := range 3 {
		run(fmt.Sprintf("ls%d", i), lsPort, "logstore", "--listen", fmt.Sprintf(":%d", lsPort), "--plaintext", "--metrics-listen", "", "--data-dir", "/data")
	}
	// The contract of the failover issue (K=1 at flush plus a log store
	// majority); a 2 s lease, so that the writes sent to n0 just after the
	// cut reach it within its lease however slowly docker disconnects.
	var nodes []*ctr
	for i := range 3 {
		role := "replica"
		if i == 0 {
			role = "primary"
		}
		nodes = append(nodes, run(fmt.Sprintf("n%d", i), nodePort, role, "--id", fmt.Sprintf("n%d", i),
			"--listen", fmt.Sprintf(":%d", nodePort), "--plaintext", "--metrics-listen", "", "--data-dir", "/data",
			"--peers", strings.Join(peers, ","), "--logstore", strings.Join(lsAddrs, ","), "--primary", fmt.Sprintf("n0:%d", nodePort),
			"--durability", "sync", "--replication", "sync", "--sync-replicas", "1", "--sync-level", "flush", "--logstore-ack", "sync",
			"--sync-timeout", "3s", "--heartbeat-interval", "100ms", "--lease-timeout", "2s"))
	}
	n0, n1, n2 := nodes[0], nodes[1], nodes[2]

	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	cl, err := client.New([]string{n0.addr, n1.addr, n2.addr}, client.Options{Retry: 20 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	testkit.Until(t, "the primary to take a write", func() bool {
		_, err := cl.Put(ctx, "partition/ready", []byte("x"), nil)
		return err == nil
	})
	before, err := walshipv1.NewAdminServiceClient(conn(t, n0.addr)).Status(ctx, &walshipv1.StatusRequest{})
	if err != nil {
		t.Fatal(err)
	}

	h, finish := runChecked(t, ctx, cl, "partition/", 6*time.Second)
	<-time.After(1500 * time.Millisecond)
	h.Note("n0 (the primary) cut off the cluster network")
	r.Must("network", "disconnect", clusterNet, n0.name)
	// Writes straight to n0 after the cut, within its lease: it takes them
	// into its log, which nobody else will hear of — the tail it must keep
	// in an orphan file. None may be acknowledged.
	kv0 := walshipv1.NewKVServiceClient(conn(t, n0.addr))
	cutWrites := make(chan error, 5)
	for i := range cap(cutWrites) {
		go func() {
			_, err := kv0.Put(ctx, &walshipv1.PutRequest{Key: fmt.Sprintf("orphan/%d", i), Value: []byte("x")})
			cutWrites <- err
		}()
	}
	taken := 0
	for range cap(cutWrites) {
		err := <-cutWrites
		if err == nil {
			t.Fatal("n0, cut off from every log store and replica, acknowledged a sync write")
		}
		if !client.NotApplied(err) {
			taken++
		}
	}
	if taken == 0 {
		t.Fatal("n0 refused every write after the cut: its lease ran out before they reached it")
	}
	out := ctl(t, "promote", "--node", n1.addr, "--wait", "30s")
	t.Logf("ctl promote:\n%s", out)
	h.Note("n1 promoted")
	// The first write the new primary acknowledges under the contract.
	if _, err := cl.Put(ctx, "partition/first-after", []byte("x"), nil); err != nil {
		t.Fatal(err)
	}
	// A second of load on the new primary while n0, still cut off, still
	// hears from clients.
	<-time.After(time.Second)
	h.Note("the network heals")
	r.Must("network", "connect", "--alias", n0.alias, clusterNet, n0.name)
	finish()

	admin0 := walshipv1.NewAdminServiceClient(conn(t, n0.addr))
	testkit.Until(t, "the old primary to rejoin as a replica", func() bool {
		st, err := admin0.Status(ctx, &walshipv1.StatusRequest{})
		return err == nil && st.Role == walshipv1.Role_ROLE_REPLICA && st.Epoch > before.Epoch
	})
	sts := converge(t, ctx, n1.addr, n0.addr, n2.addr)
	// What n0 wrote after the cut reached nobody: it is cut at the
	// divergence point and kept, not deleted.
	o := sts[n0.addr].Orphans
	if len(o) == 0 || o[0].GetEpoch() != before.Epoch {
		t.Fatalf("n0 keeps orphans %v; want its unshipped tail of epoch %d (%d writes after the cut) in an orphan file", o, before.Epoch, taken)
	}
	kv1 := walshipv1.NewKVServiceClient(conn(t, n1.addr))
	for i := range cap(cutWrites) {
		if g, err := kv1.Get(ctx, &walshipv1.GetRequest{Key: fmt.Sprintf("orphan/%d", i)}); err != nil || g.Found {
			t.Fatalf("orphan/%d on the new primary: %v, %v (n0 took it alone, after the cut)", i, g, err)
		}
	}
	t.Logf("n0 took %d writes after the cut and orphaned LSNs %d..%d", taken, o[0].GetFirstLsn(), o[len(o)-1].GetLastLsn())
}
