package e2e

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	walshipv1 "github.com/walship/walship/gen/walship/v1"
	"github.com/walship/walship/internal/testkit"
	"github.com/walship/walship/pkg/client"
	"google.golang.org/protobuf/types/known/durationpb"
)

// watchLog is what one watcher received: each transaction as a line
// "lsn: key=value ...", in the order received.
type watchLog struct {
	mu      sync.Mutex
	lines   []string
	last    uint64
	resumes int
	err     error
}

func txnLine(x *walshipv1.WatchTxn) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%d:", x.GetLsn())
	for _, e := range x.GetEvents() {
		if e.GetType() == walshipv1.WatchEventType_WATCH_EVENT_TYPE_DELETE {
			fmt.Fprintf(&b, " -%s", e.GetKey())
		} else {
			fmt.Fprintf(&b, " %s=%s", e.GetKey(), e.GetValue())
		}
	}
	return b.String()
}

// follow receives from w into l until w fails (its context ends).
func (l *watchLog) follow(w *client.Watcher) {
	for {
		m, err := w.Recv()
		if err != nil {
			l.mu.Lock()
			l.err, l.resumes = err, w.Resumes
			l.mu.Unlock()
			return
		}
		for _, x := range m.GetTxns().GetTxns() {
			l.mu.Lock()
			l.lines = append(l.lines, txnLine(x))
			l.last = x.GetLsn()
			l.mu.Unlock()
		}
	}
}

func (l *watchLog) lastLSN() uint64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.last
}

// TestWatchAcrossSwitchoverAndKill9: a watcher on each data node (each
// with the client's node list starting at that node) follows the
// checker's workload through a switchover (n0 → n1) and a kill -9 of the
// new primary with a promotion of n2. Every watcher ends with exactly the
// final primary's log read from LSN 1: every transaction it got is in the
// final history (none was taken back), none is repeated or missing across
// its resumes, all in LSN order with their transactions whole.
func TestWatchAcrossSwitchoverAndKill9(t *testing.T) {
	needLinux(t)
	c, _, ctx, h, finish := failoverUnderLoad(t, "watch/")
	logs, stopWatch, wg := startWatchers(t, ctx, c.addrs())
	defer stopWatch()
	<-time.After(time.Second)
	h.Note("switchover n0 -> n1")
	admin0 := walshipv1.NewAdminServiceClient(conn(t, c.nodes[0].addr))
	if _, err := admin0.Switchover(ctx, &walshipv1.SwitchoverRequest{Target: "n1", Timeout: durationpb.New(10 * time.Second)}); err != nil {
		t.Fatalf("switchover: %v", err)
	}
	<-time.After(1500 * time.Millisecond)
	h.Note("kill -9 n1 (the primary)")
	c.nodes[1].p.kill()
	t.Logf("ctl promote:\n%s", ctl(t, "promote", "--node", c.nodes[2].addr, "--wait", "30s"))
	h.Note("n2 promoted")
	finish()
	c.nodes[1].serving = "replica serving"
	c.nodes[1].start()

	// The end marker, then the final primary's whole log from LSN 1.
	matchFinalLog(t, ctx, c.nodes[2].addr, logs, stopWatch, wg)
	converge(t, ctx, c.nodes[2].addr, c.nodes[0].addr, c.nodes[1].addr)
}

// matchFinalLog writes an end marker on the final primary, follows its
// whole log from LSN 1, waits until every watcher has reached the marker,
// stops them, and fails unless each watcher's transactions are exactly
// the final log's.
func matchFinalLog(t *testing.T, ctx context.Context, primary string, logs []*watchLog, stopWatch func(), wg *sync.WaitGroup) {
	t.Helper()
	final, err := client.New([]string{primary}, client.Options{Retry: 30 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	defer final.Close()
	end, err := final.Put(ctx, "watch/~end", []byte("x"), nil)
	if err != nil {
		t.Fatal(err)
	}
	want := &watchLog{}
	fctx, stopFinal := context.WithCancel(ctx)
	fw := final.Watch(fctx, &walshipv1.WatchRequest{Prefix: "watch/", StartLsn: 1})
	var fwg sync.WaitGroup
	fwg.Go(func() { want.follow(fw) })
	for i, l := range append([]*watchLog{want}, logs...) {
		testkit.UntilWithin(t, time.Minute, fmt.Sprintf("watcher %d to reach the end marker at LSN %d", i, end), func() bool { return l.lastLSN() >= end })
	}
	stopWatch()
	stopFinal()
	wg.Wait()
	fwg.Wait()
	if len(want.lines) < 100 {
		t.Fatalf("the final log holds %d transactions: too few to say anything", len(want.lines))
	}
	for i, l := range logs {
		t.Logf("watcher starting at n%d: %d transactions, %d resumes", i, len(l.lines), l.resumes)
		if got, exp := strings.Join(l.lines, "\n"), strings.Join(want.lines, "\n"); got != exp {
			for j := range min(len(l.lines), len(want.lines)) {
				if l.lines[j] != want.lines[j] {
					t.Fatalf("watcher starting at n%d parts from the final log at transaction %d:\n got  %s\n want %s", i, j, l.lines[j], want.lines[j])
				}
			}
			t.Fatalf("watcher starting at n%d got %d transactions, the final log has %d", i, len(l.lines), len(want.lines))
		}
	}
}

// startWatchers starts one watcher of "watch/" from LSN 1 per node, each
// with a client that tries that node first, and returns their logs, the
// cancel that stops them and the group that ends when they have.
func startWatchers(t *testing.T, ctx context.Context, addrs []string) ([]*watchLog, context.CancelFunc, *sync.WaitGroup) {
	t.Helper()
	wctx, stopWatch := context.WithCancel(ctx)
	logs := make([]*watchLog, len(addrs))
	wg := new(sync.WaitGroup)
	for i := range addrs {
		order := append(append([]string{}, addrs[i:]...), addrs[:i]...)
		cl, err := client.New(order, client.Options{Retry: 30 * time.Second})
		if err != nil {
			stopWatch()
			t.Fatal(err)
		}
		t.Cleanup(func() { cl.Close() })
		logs[i] = &watchLog{}
		w := cl.Watch(wctx, &walshipv1.WatchRequest{Prefix: "watch/", StartLsn: 1, ProgressInterval: durationpb.New(100 * time.Millisecond)})
		wg.Go(func() { logs[i].follow(w) })
	}
	return logs, stopWatch, wg
}
