package e2e

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	walshipv1 "github.com/walship/walship/gen/walship/v1"
	"github.com/walship/walship/internal/testkit"
	"github.com/walship/walship/pkg/client"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
)

func (l *watchLog) count() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.lines)
}

// TestWatchAcrossRestarts is TestWatchAcrossSwitchoverAndKill9 with
// restarts (issue 39): a watcher on each data node follows the checker's
// workload while a replica is killed (kill -9) and restarted, another is
// restarted cleanly (SIGTERM), the primary switches over, the new primary
// is killed and another promoted, and every killed node comes back as a
// replica. A restarted replica serves watches again only from what it
// knows acknowledged (its readable marker after a clean stop, else the
// primary's watermark). Every watcher ends with exactly the final
// primary's log read from LSN 1: nothing it got was taken back, nothing
// repeated or missing across its resumes, in LSN order, whole
// transactions.
func TestWatchAcrossRestarts(t *testing.T) {
	needLinux(t)
	c := startFailoverCluster(t)
	cl, err := client.New(c.addrs(), client.Options{Retry: 30 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cl.Close() })
	ctx, cancel := context.WithTimeout(t.Context(), 4*time.Minute)
	defer cancel()
	h, finish := runChecked(t, ctx, cl, "watch/", 15*time.Second)

	logs, stopWatch, wg := startWatchers(t, ctx, c.addrs())
	defer stopWatch()
	// Each step waits for the watchers to move on by some transactions:
	// a step then happens under load, whatever the machine's pace.
	most := func() int {
		n := 0
		for _, l := range logs {
			n = max(n, l.count())
		}
		return n
	}
	step := func(what string) {
		t.Helper()
		from := most()
		testkit.UntilWithin(t, time.Minute, "the watchers to get 20 more transactions before: "+what, func() bool { return most() >= from+20 })
		h.Note("%s", what)
		t.Log(what)
	}

	step("kill -9 n2 (a replica), restart it")
	c.nodes[2].p.kill()
	c.nodes[2].start()
	step("SIGTERM n1 (a replica), restart it")
	c.nodes[1].p.stop()
	c.nodes[1].start()
	step("switchover n0 -> n1")
	admin0 := walshipv1.NewAdminServiceClient(conn(t, c.nodes[0].addr))
	if _, err := admin0.Switchover(ctx, &walshipv1.SwitchoverRequest{Target: "n1", Timeout: durationpb.New(10 * time.Second)}); err != nil {
		t.Fatalf("switchover: %v", err)
	}
	step("kill -9 n0 (a replica since the switchover), restart it")
	c.nodes[0].p.kill()
	c.nodes[0].args = append(c.nodes[0].args, "--switchover-on-stop=false")
	c.nodes[0].serving = "replica serving"
	c.nodes[0].start()
	step("kill -9 n1 (the primary), promote n2")
	c.nodes[1].p.kill()
	t.Logf("ctl promote:\n%s", ctl(t, "promote", "--node", c.nodes[2].addr, "--wait", "30s"))
	h.Note("n2 promoted; n1 restarts as a replica")
	c.nodes[1].serving = "replica serving"
	c.nodes[1].start()
	finish()

	// The end marker, then the final primary's whole log from LSN 1.
	matchFinalLog(t, ctx, c.nodes[2].addr, logs, stopWatch, wg)
	converge(t, ctx, c.nodes[2].addr, c.nodes[0].addr, c.nodes[1].addr)
}

// TestWatchThatNeverReads: a watcher that opens a stream and never reads
// while 96 MiB of values are committed under its prefix is cut off with
// RESOURCE_EXHAUSTED once its send has been blocked --watch-stall, and
// the server's heap stays within a bound far below what was written: a
// watcher holds a position, never a buffer.
func TestWatchThatNeverReads(t *testing.T) {
	needLinux(t)
	metrics := testkit.FreeAddr(t)
	p := startProc(t, "primary serving", "primary", "--listen", "127.0.0.1:0", "--metrics-listen", metrics, "--data-dir", t.TempDir(),
		"--watch-stall", "5s", "--watch-ring-bytes", "1048576")
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
	defer cancel()
	kv := walshipv1.NewKVServiceClient(p.dial(ctx))
	heap := func() float64 { return scrape(t, metrics, "go_memstats_heap_inuse_bytes") }
	testkit.UntilWithin(t, 30*time.Second, "the metrics endpoint", func() bool { return heap() > 0 })

	// The watcher's own connection, its windows as small as gRPC allows:
	// the server's sends block after about 64 KiB.
	wc, err := grpc.NewClient(p.addr, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithInitialWindowSize(64<<10), grpc.WithInitialConnWindowSize(64<<10))
	if err != nil {
		t.Fatal(err)
	}
	defer wc.Close()
	stream, err := walshipv1.NewKVServiceClient(wc).Watch(ctx, &walshipv1.WatchRequest{Prefix: "big/"})
	if err != nil {
		t.Fatal(err)
	}
	testkit.UntilWithin(t, 30*time.Second, "the watcher to be open", func() bool { return scrape(t, metrics, "walship_watch_watchers") == 1 })

	// Rewrite 8 keys, so that the state itself stays small.
	const puts = 1536 // 96 MiB
	base := heap()
	var peak float64
	var done, doneAtCut int // puts
	var wg sync.WaitGroup
	var mu sync.Mutex
	var putErr error
	for w := range 4 {
		wg.Go(func() {
			value := make([]byte, 64<<10)
			for i := w; i < puts; i += 4 {
				value[0] = byte(i)
				if _, err := kv.Put(ctx, &walshipv1.PutRequest{Key: fmt.Sprintf("big/%d", i%8), Value: value}); err != nil {
					mu.Lock()
					putErr = err
					mu.Unlock()
					return
				}
				mu.Lock()
				done++
				mu.Unlock()
				if i%64 == w {
					v := heap()
					cut := scrape(t, metrics, `walship_watch_cutoffs_total{reason="stalled"}`) == 1
					mu.Lock()
					peak = max(peak, v)
					if cut && doneAtCut == 0 {
						doneAtCut = done
					}
					mu.Unlock()
				}
			}
		})
	}
	wg.Wait()
	if putErr != nil {
		t.Fatal(putErr)
	}
	testkit.UntilWithin(t, 30*time.Second, "the watcher to be cut off", func() bool {
		return scrape(t, metrics, `walship_watch_cutoffs_total{reason="stalled"}`) == 1
	})
	peak = max(peak, heap())
	const bound = 48 << 20
	t.Logf("heap in use: %.1f MiB before, peak %.1f MiB while 96 MiB were written (the watcher was cut after about %d MiB; 0: after the last)",
		base/(1<<20), peak/(1<<20), doneAtCut/16)
	if peak-base > bound {
		t.Errorf("the heap grew by %.1f MiB while a watcher did not read: more than %d MiB", (peak-base)/(1<<20), bound>>20)
	}
	// What the client had buffered, then the cut-off.
	for {
		_, err := stream.Recv()
		if err == nil {
			continue
		}
		if status.Code(err) != codes.ResourceExhausted {
			t.Fatalf("the watcher's stream ended with %v, want RESOURCE_EXHAUSTED", err)
		}
		t.Logf("cut off: %v", err)
		break
	}
}
