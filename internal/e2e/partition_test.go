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

// dockerNode is a walship container of a dockerCluster.
type dockerNode struct {
	alias string // its name on the cluster network
	name  string // the container's
	addr  string // where the test reaches it, on the clients' network
}

// dockerCluster is three log stores and three data nodes (n0 the primary)
// as containers on a cluster network, and each is also on a second network
// that only the test's clients use, so that a node can be cut off the
// cluster (docker network disconnect) while clients still reach it.
type dockerCluster struct {
	r                     *testkit.DockerRun
	clusterNet, clientNet string
	nodes                 []*dockerNode
}

// startDockerCluster starts the cluster under the contract of the
// failover issue (K=1 at flush plus a log store majority) with a 2 s
// lease, so that the writes sent to n0 just after a cut reach it within
// its lease however slowly docker disconnects; extra is added to every
// data node's flags.
func startDockerCluster(t *testing.T, extra ...string) *dockerCluster {
	t.Helper()
	needLinux(t)
	if testing.Short() {
		t.Skip("skipping the Docker partition test in -short mode")
	}
	testkit.NeedDocker(t)
	r := testkit.NewDockerRun(t)
	image := r.Image()
	c := &dockerCluster{r: r, clusterNet: r.Network("cluster"), clientNet: r.Network("clients")}

	const nodePort, lsPort = 7000, 7100
	var lsAddrs, peers []string
	for i := range 3 {
		lsAddrs = append(lsAddrs, fmt.Sprintf("ls%d:%d", i, lsPort))
		peers = append(peers, fmt.Sprintf("n%d=n%d:%d", i, i, nodePort))
	}
	var all []*dockerNode
	run := func(alias string, port int, args ...string) *dockerNode {
		n := &dockerNode{alias: alias, name: "walship-test-" + r.ID + "-" + alias}
		all = append(all, n)
		// Created on the clients' network, where the test reaches it, with
		// no alias there: no node resolves another on it. The alias peers
		// use is on the cluster network only.
		r.Must(append(append(append([]string{"create", "--name", n.name, "--network", c.clientNet}, r.Labels()...), image), args...)...)
		r.Must("network", "connect", "--alias", alias, c.clusterNet, n.name)
		r.Must("start", n.name)
		n.addr = net.JoinHostPort(r.IP(n.name, c.clientNet), strconv.Itoa(port))
		return n
	}
	t.Cleanup(func() {
		if t.Failed() {
			for _, n := range all {
				t.Logf("--- docker logs %s ---\n%s", n.alias, testkit.DockerLogs(n.name, 40))
			}
		}
	})
	for i := range 3 {
		run(fmt.Sprintf("ls%d", i), lsPort, "logstore", "--listen", fmt.Sprintf(":%d", lsPort), "--plaintext", "--metrics-listen", "", "--data-dir", "/data")
	}
	for i := range 3 {
		role := "replica"
		if i == 0 {
			role = "primary"
		}
		c.nodes = append(c.nodes, run(fmt.Sprintf("n%d", i), nodePort, append([]string{role, "--id", fmt.Sprintf("n%d", i),
			"--listen", fmt.Sprintf(":%d", nodePort), "--plaintext", "--metrics-listen", "", "--data-dir", "/data",
			"--peers", strings.Join(peers, ","), "--logstore", strings.Join(lsAddrs, ","), "--primary", fmt.Sprintf("n0:%d", nodePort),
			"--durability", "sync", "--replication", "sync", "--sync-replicas", "1", "--sync-level", "flush", "--logstore-ack", "sync",
			"--sync-timeout", "3s", "--heartbeat-interval", "100ms", "--lease-timeout", "2s"}, extra...)...))
	}
	return c
}

// addrs are the data nodes' addresses on the clients' network.
func (c *dockerCluster) addrs() []string {
	var out []string
	for _, n := range c.nodes {
		out = append(out, n.addr)
	}
	return out
}

// cut takes n off the cluster network; heal puts it back.
func (c *dockerCluster) cut(n *dockerNode) { c.r.Must("network", "disconnect", c.clusterNet, n.name) }

func (c *dockerCluster) heal(n *dockerNode) {
	c.r.Must("network", "connect", "--alias", n.alias, c.clusterNet, n.name)
}

// writesToCutPrimary sends count sync writes under prefix straight to n,
// cut off from every log store and replica, and returns how many it took
// into its log (refusals that are not "not applied"); it fails the test
// if n acknowledged any.
func writesToCutPrimary(t *testing.T, ctx context.Context, n *dockerNode, prefix string, count int) int {
	t.Helper()
	kv := walshipv1.NewKVServiceClient(conn(t, n.addr))
	errs := make(chan error, count)
	for i := range count {
		go func() {
			_, err := kv.Put(ctx, &walshipv1.PutRequest{Key: fmt.Sprintf("%s%d", prefix, i), Value: []byte("x")})
			errs <- err
		}()
	}
	taken := 0
	for range count {
		err := <-errs
		if err == nil {
			t.Fatalf("%s, cut off from every log store and replica, acknowledged a sync write", n.alias)
		}
		if !client.NotApplied(err) {
			taken++
		}
	}
	return taken
}

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
	c := startDockerCluster(t)
	n0, n1, n2 := c.nodes[0], c.nodes[1], c.nodes[2]

	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	cl, err := client.New(c.addrs(), client.Options{Retry: 20 * time.Second})
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
	c.cut(n0)
	// Writes straight to n0 after the cut, within its lease: it takes them
	// into its log, which nobody else will hear of — the tail it must keep
	// in an orphan file. None may be acknowledged.
	const cutWrites = 5
	taken := writesToCutPrimary(t, ctx, n0, "orphan/", cutWrites)
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
	c.heal(n0)
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
	for i := range cutWrites {
		if g, err := kv1.Get(ctx, &walshipv1.GetRequest{Key: fmt.Sprintf("orphan/%d", i)}); err != nil || g.Found {
			t.Fatalf("orphan/%d on the new primary: %v, %v (n0 took it alone, after the cut)", i, g, err)
		}
	}
	t.Logf("n0 took %d writes after the cut and orphaned LSNs %d..%d", taken, o[0].GetFirstLsn(), o[len(o)-1].GetLastLsn())
}

// TestAutoFailoverPartition is TestFailoverPartition with automatic
// failover (issue #37) and no command: under checked load, the primary
// is cut off the cluster network while clients still reach it; a replica
// on the majority side promotes itself (the log stores stop hearing the
// primary renew the election) to exactly one new epoch; the cut-off
// primary acknowledges nothing after the cut (writes sent straight to it,
// the linearizability check and the read back of every acknowledged write
// show it); the network heals, the old primary rejoins as a replica, no
// further epoch opens, and the three data nodes converge on one digest.
func TestAutoFailoverPartition(t *testing.T) {
	c := startDockerCluster(t, "--auto-failover")
	n0 := c.nodes[0]

	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	cl, err := client.New(c.addrs(), client.Options{Retry: 30 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	testkit.Until(t, "the primary to take a write", func() bool {
		_, err := cl.Put(ctx, "autopart/ready", []byte("x"), nil)
		return err == nil
	})
	before := nodeStatusOf(t, ctx, n0.addr)
	if before.GetRole() != walshipv1.Role_ROLE_PRIMARY || before.GetElection().GetHolderId() != "n0" {
		t.Fatalf("n0 before the cut: %v, election %v; want the primary holding the election", before.GetRole(), before.GetElection())
	}

	h, finish := runChecked(t, ctx, cl, "autopart/", 8*time.Second)
	<-time.After(1500 * time.Millisecond)
	h.Note("n0 (the primary of epoch %d) cut off the cluster network", before.GetEpoch())
	c.cut(n0)
	// Writes straight to n0 after the cut: it may take some into its log
	// until it stops renewing the election, but acknowledges none.
	const cutWrites = 5
	taken := writesToCutPrimary(t, ctx, n0, "orphan/", cutWrites)

	var next *dockerNode
	var last map[string]*walshipv1.StatusResponse
	t.Cleanup(func() {
		if t.Failed() {
			for addr, st := range last {
				t.Logf("%s: %v in epoch %d, election %v", addr, st.GetRole(), st.GetEpoch(), st.GetElection())
			}
		}
	})
	testkit.UntilWithin(t, 60*time.Second, "a replica on the majority side to promote itself", func() bool {
		last = map[string]*walshipv1.StatusResponse{}
		for _, n := range c.nodes[1:] {
			cctx, ccancel := context.WithTimeout(ctx, time.Second)
			st, err := walshipv1.NewAdminServiceClient(conn(t, n.addr)).Status(cctx, &walshipv1.StatusRequest{})
			ccancel()
			if err != nil {
				continue
			}
			last[n.addr] = st
			if st.GetRole() == walshipv1.Role_ROLE_PRIMARY && st.GetTakingWrites() {
				next = n
			}
		}
		return next != nil
	})
	st := nodeStatusOf(t, ctx, next.addr)
	if st.GetEpoch() != before.GetEpoch()+1 {
		t.Fatalf("%s promoted itself to epoch %d; want exactly one new epoch, %d", next.alias, st.GetEpoch(), before.GetEpoch()+1)
	}
	h.Note("%s promoted itself to epoch %d", next.alias, st.GetEpoch())
	firstAck(t, ctx, cl, "autopart/first-after")
	// A second of load on the new primary while n0, still cut off, still
	// hears from clients.
	<-time.After(time.Second)
	h.Note("the network heals")
	c.heal(n0)
	finish()

	testkit.UntilWithin(t, 60*time.Second, "the old primary to rejoin as a replica", func() bool {
		st, err := walshipv1.NewAdminServiceClient(conn(t, n0.addr)).Status(ctx, &walshipv1.StatusRequest{})
		return err == nil && st.GetRole() == walshipv1.Role_ROLE_REPLICA && st.GetEpoch() > before.GetEpoch()
	})
	var rest []string
	for _, n := range c.nodes {
		if n != next {
			rest = append(rest, n.addr)
		}
	}
	sts := converge(t, ctx, next.addr, rest...)
	// converge checked every replica is in the primary's epoch: still the
	// one the failover opened, so the healed n0 opened none.
	if p := nodeStatusOf(t, ctx, next.addr); p.GetEpoch() != before.GetEpoch()+1 || p.GetRole() != walshipv1.Role_ROLE_PRIMARY {
		t.Fatalf("after the heal %s is %v in epoch %d; want the primary of epoch %d (one epoch for one failure)", next.alias, p.GetRole(), p.GetEpoch(), before.GetEpoch()+1)
	}
	kv := walshipv1.NewKVServiceClient(conn(t, next.addr))
	for i := range cutWrites {
		if g, err := kv.Get(ctx, &walshipv1.GetRequest{Key: fmt.Sprintf("orphan/%d", i)}); err != nil || g.GetFound() {
			t.Fatalf("orphan/%d on the new primary: %v, %v (n0 took it alone, after the cut)", i, g, err)
		}
	}
	if o := sts[n0.addr].GetOrphans(); taken > 0 && (len(o) == 0 || o[0].GetEpoch() != before.GetEpoch()) {
		t.Fatalf("n0 keeps orphans %v; want its unshipped tail of epoch %d (%d writes after the cut) in an orphan file", o, before.GetEpoch(), taken)
	}
	t.Logf("n0 took %d of %d writes sent straight to it after the cut, acknowledged none; %s opened epoch %d", taken, cutWrites, next.alias, before.GetEpoch()+1)
}
