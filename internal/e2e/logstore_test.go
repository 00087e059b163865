package e2e

import (
	"context"
	"fmt"
	"strings"
	"syscall"
	"testing"
	"time"

	walshipv1 "github.com/walship/walship/gen/walship/v1"
	"github.com/walship/walship/internal/testkit"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// TestLogStoresCutOff: three log store processes under the failover
// contract (every commit on a log store majority and one replica; 3 s sync
// timeout, 500 ms lease). One is cut off — paused with SIGSTOP: alive, its
// connections open, but it answers nothing — and commits go on. A second
// is cut off too: the commit in flight fails UNAVAILABLE, and so does
// every write after it, at once, since the primary has lost its lease; no
// write is acknowledged. When one resumes, commits go on again, and when
// the other resumes it catches up.
func TestLogStoresCutOff(t *testing.T) {
	needLinux(t)
	c := startFailoverCluster(t)
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	kv := walshipv1.NewKVServiceClient(conn(t, c.nodes[0].addr))
	put := func(key string) (*walshipv1.PutResponse, time.Duration, error) {
		start := time.Now()
		p, err := kv.Put(ctx, &walshipv1.PutRequest{Key: key, Value: []byte("v")})
		return p, time.Since(start), err
	}
	testkit.UntilWithin(t, 30*time.Second, "the primary to take a write", func() bool {
		_, err := kv.Put(ctx, &walshipv1.PutRequest{Key: "first", Value: []byte("x")}, grpc.WaitForReady(true))
		return err == nil
	})

	c.logstores[0].p.pause()
	var last uint64
	for i := range 10 {
		p, took, err := put(fmt.Sprintf("one-cut-off/%d", i))
		if err != nil {
			t.Fatalf("commit %d with one log store of three cut off: %v", i, err)
		}
		if took > 2*time.Second {
			t.Errorf("commit %d with one log store cut off took %v", i, took)
		}
		last = p.Lsn
	}

	c.logstores[1].p.pause()
	// The commit in flight waits for a majority until its sync timeout —
	// unless it arrives after the lease ran out, when it is refused at
	// once; either way UNAVAILABLE.
	_, took, err := put("two-cut-off")
	if status.Code(err) != codes.Unavailable || !strings.Contains(err.Error(), "log store majority") {
		t.Fatalf("commit with two log stores of three cut off (after %v): %v; want UNAVAILABLE for want of a log store majority", took, err)
	}
	if took > 5*time.Second {
		t.Errorf("the commit failed after %v, past its 3s sync timeout", took)
	}
	// Now the lease has run out: refused at once, as not served.
	_, took, err = put("no-lease")
	if status.Code(err) != codes.Unavailable || !strings.Contains(err.Error(), "has not heard from a log store majority") {
		t.Fatalf("write without a lease: %v; want UNAVAILABLE naming the lease", err)
	}
	if took > time.Second {
		t.Errorf("a write without a lease was refused after %v, not at once", took)
	}

	c.logstores[1].p.signal(syscall.SIGCONT)
	testkit.UntilWithin(t, 30*time.Second, "commits with one log store resumed", func() bool {
		p, _, err := put("resumed")
		if err == nil {
			last = p.Lsn
		}
		return err == nil
	})
	c.logstores[0].p.signal(syscall.SIGCONT)
	ls0 := walshipv1.NewLogStoreServiceClient(conn(t, c.logstores[0].addr))
	testkit.UntilWithin(t, 30*time.Second, "the log store cut off first to catch up", func() bool {
		st, err := ls0.Status(ctx, &walshipv1.LogStoreServiceStatusRequest{})
		return err == nil && st.DurableLsn >= last
	})
}
