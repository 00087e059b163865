package client_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/walship/walship/app/cluster"
	walshipv1 "github.com/walship/walship/gen/walship/v1"
	"github.com/walship/walship/pkg/client"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// TestWatchResumesAcrossAFailover: a watch through the client, begun on
// the primary, follows a stop of the primary and a promotion by resuming
// elsewhere: it gets every committed write of its prefix once, in LSN
// order, each transaction whole.
func TestWatchResumesAcrossAFailover(t *testing.T) {
	c, err := cluster.Start(t.Context(), cluster.Config{Dir: t.TempDir(), LogStores: 1, Replicas: 2, Failover: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Stop() })
	cl, err := client.New(nodeAddrs(c), client.Options{Retry: 20 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	w := cl.Watch(ctx, &walshipv1.WatchRequest{Prefix: "w/", StartLsn: 1})
	defer w.Close()
	var want []uint64
	put := func(i int) {
		t.Helper()
		r, err := cl.Txn(ctx, &walshipv1.TxnRequest{Success: []*walshipv1.TxnOp{
			{Op: &walshipv1.TxnOp_Put{Put: &walshipv1.PutOp{Key: fmt.Sprintf("w/%d/a", i), Value: []byte("x")}}},
			{Op: &walshipv1.TxnOp_Put{Put: &walshipv1.PutOp{Key: fmt.Sprintf("w/%d/b", i), Value: []byte("y")}}},
			{Op: &walshipv1.TxnOp_Put{Put: &walshipv1.PutOp{Key: "other", Value: []byte("z")}}},
		}})
		if err != nil {
			t.Fatal(err)
		}
		want = append(want, r.Lsn)
	}
	for i := range 20 {
		put(i)
	}
	if err := c.StopNode(c.Primary); err != nil {
		t.Fatal(err)
	}
	if _, err := walshipv1.NewAdminServiceClient(c.Conn(c.Replicas[0])).Promote(ctx, &walshipv1.PromoteRequest{}); err != nil {
		t.Fatal(err)
	}
	for i := 20; i < 40; i++ {
		put(i)
	}
	var got []uint64
	for len(got) < len(want) {
		m, err := w.Recv()
		if err != nil {
			t.Fatalf("after %d transactions: %v", len(got), err)
		}
		for _, x := range m.GetTxns().GetTxns() {
			i := len(got)
			if len(x.Events) != 2 || x.Events[0].Key != fmt.Sprintf("w/%d/a", i) || x.Events[1].Key != fmt.Sprintf("w/%d/b", i) {
				t.Fatalf("transaction %d at LSN %d: %v", i, x.Lsn, x.Events)
			}
			got = append(got, x.Lsn)
		}
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("watched LSNs %v, committed %v", got, want)
	}
	if w.Resumes == 0 {
		t.Fatal("the watch never resumed: it did not follow the failover")
	}
	if w.Next() != want[len(want)-1]+1 {
		t.Fatalf("Next = %d, want %d", w.Next(), want[len(want)-1]+1)
	}
	// A request no node can serve is returned, not retried.
	bad := cl.Watch(ctx, &walshipv1.WatchRequest{Key: "k", Prefix: "k"})
	if _, err := bad.Recv(); status.Code(err) != codes.InvalidArgument {
		t.Fatalf("key and prefix: %v; want INVALID_ARGUMENT", err)
	}
}
