package client_test

import (
	"context"
	"errors"
	"path/filepath"
	"testing"
	"time"

	"github.com/walship/walship/app/cluster"
	walshipv1 "github.com/walship/walship/gen/walship/v1"
	"github.com/walship/walship/internal/testkit"
	"github.com/walship/walship/internal/tlsid"
	"github.com/walship/walship/pkg/client"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// TestClientFollowsAFailover: a client given every node's address writes
// to the primary, reads its write on a replica with min_lsn, and after the
// primary stops and a replica is promoted finds the new primary by itself.
func TestClientFollowsAFailover(t *testing.T) {
	c, err := cluster.Start(t.Context(), cluster.Config{Dir: t.TempDir(), LogStores: 1, Replicas: 2, Failover: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Stop() })
	addrs := nodeAddrs(c)
	// The log store is not a data node: the client skips what is not one.
	cl, err := client.New(addrs, client.Options{Retry: 20 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	lsn, err := cl.Put(ctx, "k", []byte("v1"), nil)
	if err != nil {
		t.Fatal(err)
	}
	if g, err := cl.GetAt(ctx, c.Replicas[1].Addr, "k", lsn); err != nil || string(g.Value) != "v1" {
		t.Fatalf("read your write on a replica: %v, %v", g, err)
	}
	if err := c.StopNode(c.Primary); err != nil {
		t.Fatal(err)
	}
	admin := walshipv1.NewAdminServiceClient(c.Conn(c.Replicas[0]))
	if _, err := admin.Promote(ctx, &walshipv1.PromoteRequest{}); err != nil {
		t.Fatal(err)
	}
	lsn2, err := cl.Put(ctx, "k", []byte("v2"), nil)
	if err != nil {
		t.Fatalf("Put after the failover: %v", err)
	}
	if p, _ := cl.Primary(ctx); p != c.Replicas[0].Addr || lsn2 <= lsn {
		t.Fatalf("primary %s, lsn %d; want %s above %d", p, lsn2, c.Replicas[0].Addr, lsn)
	}
	if g, err := cl.Get(ctx, "k"); err != nil || string(g.Value) != "v2" {
		t.Fatalf("Get on the new primary: %v, %v", g, err)
	}
}

func TestNotApplied(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want bool
	}{
		{status.Error(codes.FailedPrecondition, "read-only replica"), true},
		{status.Error(codes.Unavailable, `connection error: desc = "transport: Error while dialing: dial tcp: connection refused"`), true},
		{status.Error(codes.Unavailable, "name resolver error: produced zero addresses"), true},
		{status.Error(codes.Unavailable, "error reading from server: EOF"), false},
		{status.Error(codes.DeadlineExceeded, "context deadline exceeded"), false},
		{errors.New("plain"), false},
	} {
		if got := client.NotApplied(tc.err); got != tc.want {
			t.Errorf("NotApplied(%v) = %v, want %v", tc.err, got, tc.want)
		}
	}
	var u *client.UnknownOutcomeError
	if !errors.As(&client.UnknownOutcomeError{Err: errors.New("x")}, &u) {
		t.Fatal("UnknownOutcomeError is not one")
	}
}

// TestReadsAreNeverAnsweredByAReplica: mid-promotion, a replica that has
// promised a candidate names it as the primary of a newer epoch before the
// candidate opens; the client, which follows that name, must not take the
// candidate's answer (a replica's applied state, which can trail an
// acknowledged write) for a linearizable read. It keeps retrying and
// fails instead.
func TestReadsAreNeverAnsweredByAReplica(t *testing.T) {
	c, err := cluster.Start(t.Context(), cluster.Config{Dir: t.TempDir(), LogStores: 1, Replicas: 2, Failover: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Stop() })
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cand, voter := c.Replicas[0], c.Replicas[1]
	// The voter promises epoch 2 to the candidate; nobody else hears of it.
	// The candidate states the cluster's id, as every candidate does.
	// The voter adopts the id from its primary's first heartbeat: wait
	// for it, or the fence below states none.
	var st *walshipv1.StatusResponse
	testkit.Until(t, "the voter to know the cluster's id", func() bool {
		var err error
		st, err = c.Status(ctx, voter)
		return err == nil && st.GetClusterId() != ""
	})
	fr, err := walshipv1.NewEpochServiceClient(c.Conn(voter)).Fence(ctx, &walshipv1.FenceRequest{Epoch: 2, CandidateId: cand.Name, CandidateAddr: cand.Addr, ClusterId: st.GetClusterId()})
	if err != nil || !fr.GetGranted() {
		t.Fatalf("Fence: %v, %v", fr, err)
	}
	// The old primary stops, so that only the voter's word is left.
	if err := c.StopNode(c.Primary); err != nil {
		t.Fatal(err)
	}
	cl, err := client.New([]string{cand.Addr, voter.Addr}, client.Options{Retry: 500 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	if p, err := cl.Primary(ctx); err != nil || p != cand.Addr {
		t.Fatalf("Primary = %q, %v; want the candidate %s (the voter names it)", p, err, cand.Addr)
	}
	g, err := cl.Get(ctx, "k")
	if status.Code(err) != codes.FailedPrecondition {
		t.Fatalf("Get through a replica named as the primary = %v, %v; want FAILED_PRECONDITION", g, err)
	}
	s, err := cl.KV().Scan(ctx, &walshipv1.ScanRequest{})
	if status.Code(err) != codes.FailedPrecondition {
		t.Fatalf("Scan through a replica named as the primary = %v, %v; want FAILED_PRECONDITION", s, err)
	}
}

// TestFailoverOverMTLS: the failover path — fences, the candidate's
// survey and catch-up, the switchover's Promote, every replication and
// log-store stream — works over mutual TLS under the default policy:
// a switchover, then a promotion after the primary stops, with the
// client following both.
func TestFailoverOverMTLS(t *testing.T) {
	dir := t.TempDir()
	sec, err := cluster.DevTLS(dir, "127.0.0.1")
	if err != nil {
		t.Fatal(err)
	}
	// The operator's calls with the admin certificate DevTLS wrote.
	admin, err := tlsid.Load(tlsid.Files{Cert: filepath.Join(dir, "admin.crt"), Key: filepath.Join(dir, "admin.key"), CA: filepath.Join(dir, "ca.crt")}, nil)
	if err != nil {
		t.Fatal(err)
	}
	adminConn := func(n *cluster.Node) *grpc.ClientConn {
		cc, err := grpc.NewClient(n.Addr, grpc.WithTransportCredentials(admin.Credentials()))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cc.Close() })
		return cc
	}
	c, err := cluster.Start(t.Context(), cluster.Config{Dir: t.TempDir(), LogStores: 1, Replicas: 2, Failover: true, Security: sec})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Stop() })
	addrs := nodeAddrs(c)
	cl, err := client.New(addrs, client.Options{Retry: 20 * time.Second, DialOptions: sec.Dialer.Options()})
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := cl.Put(ctx, "k", []byte("v1"), nil); err != nil {
		t.Fatal(err)
	}
	sw, err := walshipv1.NewAdminServiceClient(adminConn(c.Primary)).Switchover(ctx, &walshipv1.SwitchoverRequest{Target: c.Replicas[0].Name})
	if err != nil {
		t.Fatalf("switchover over mTLS: %v", err)
	}
	if _, err := cl.Put(ctx, "k", []byte("v2"), nil); err != nil {
		t.Fatalf("Put after the switchover: %v", err)
	}
	// replica-0 is the primary; stop it and promote replica-1.
	if err := c.StopNode(c.Replicas[0]); err != nil {
		t.Fatal(err)
	}
	pr, err := walshipv1.NewAdminServiceClient(adminConn(c.Replicas[1])).Promote(ctx, &walshipv1.PromoteRequest{})
	if err != nil {
		t.Fatalf("promote over mTLS: %v", err)
	}
	if pr.GetEpoch() <= sw.GetEpoch() {
		t.Fatalf("promoted to epoch %d after the switchover's %d", pr.GetEpoch(), sw.GetEpoch())
	}
	if _, err := cl.Put(ctx, "k", []byte("v3"), nil); err != nil {
		t.Fatalf("Put after the promotion: %v", err)
	}
	if g, err := cl.Get(ctx, "k"); err != nil || string(g.Value) != "v3" {
		t.Fatalf("Get on the new primary: %v, %v", g, err)
	}
}

// nodeAddrs is every node's address, log store included (the client skips
// what is not a data node).
func nodeAddrs(c *cluster.Cluster) []string {
	var addrs []string
	for _, n := range c.Nodes() {
		addrs = append(addrs, n.Addr)
	}
	return addrs
}
