package client_test

import (
	"context"
	"fmt"
	"log"
	"os"
	"time"

	"github.com/walship/walship/app/cluster"
	walshipv1 "github.com/walship/walship/gen/walship/v1"
	"github.com/walship/walship/pkg/client"
)

// Connect to a cluster, write, read the write on the primary and on a
// replica, and go on writing after the primary is lost and a replica
// promoted. The cluster here runs in this process (what `walship dev`
// starts); a program outside this repository gives New the addresses of
// its cluster's data nodes instead.
func Example() {
	dir, err := os.MkdirTemp("", "walship-example")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c, err := cluster.Start(ctx, cluster.Config{Dir: dir, LogStores: 1, Replicas: 2, Failover: true})
	if err != nil {
		log.Fatal(err)
	}
	defer c.Stop()
	addrs := []string{c.Primary.Addr, c.Replicas[0].Addr, c.Replicas[1].Addr}

	// Connect: any of the nodes will do; the client finds the primary.
	// Over mutual TLS add TLS: &client.TLSFiles{Cert: ..., Key: ..., CA: ...}.
	cl, err := client.New(addrs, client.Options{Retry: 20 * time.Second})
	if err != nil {
		log.Fatal(err)
	}
	defer cl.Close()

	// Write, and read the write: linearizably on the primary, and on a
	// replica once it has applied the write's LSN.
	lsn, err := cl.Put(ctx, "greeting", []byte("hello"), nil)
	if err != nil {
		log.Fatal(err)
	}
	g, err := cl.Get(ctx, "greeting")
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("primary: %s\n", g.Value)
	r, err := cl.GetReplica(ctx, "greeting", lsn)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("replica at LSN >= %d: %s\n", lsn, r.Value)

	// Survive a failover: the primary goes, an operator (or Kubernetes)
	// promotes a replica, and the client finds it by itself.
	if err := c.StopNode(c.Primary); err != nil {
		log.Fatal(err)
	}
	if _, err := walshipv1.NewAdminServiceClient(c.Conn(c.Replicas[0])).Promote(ctx, &walshipv1.PromoteRequest{}); err != nil {
		log.Fatal(err)
	}
	if _, err := cl.Put(ctx, "greeting", []byte("hello again"), nil); err != nil {
		// An *UnknownOutcomeError here would mean: the write may or may
		// not be committed; read it back to know.
		log.Fatal(err)
	}
	s, err := cl.Scan(ctx, &walshipv1.ScanRequest{})
	if err != nil {
		log.Fatal(err)
	}
	for _, kv := range s.Kvs {
		fmt.Printf("after the failover: %s = %s\n", kv.Key, kv.Value)
	}
	// Output:
	// primary: hello
	// replica at LSN >= 4: hello
	// after the failover: greeting = hello again
}
