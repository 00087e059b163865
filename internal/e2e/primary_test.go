package e2e

import (
	"context"
	"fmt"
	"sort"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	walshipv1 "github.com/walship/walship/gen/walship/v1"
)

type ackedWrite struct {
	key, value string
	lsn        uint64
}

// runWriters writes unique keys from n goroutines until stop is closed,
// recording every acknowledged write. Errors after the kill are expected.
// reached is closed once threshold writes were acknowledged.
func runWriters(ctx context.Context, kv walshipv1.KVServiceClient, n int, pol *walshipv1.CommitPolicy, stop <-chan struct{}, acked *[]ackedWrite,
	threshold int64, reached chan<- struct{}) *sync.WaitGroup {
	var mu sync.Mutex
	var count atomic.Int64
	var wg sync.WaitGroup
	for w := 0; w < n; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				k, v := fmt.Sprintf("w%d/%06d", w, i), fmt.Sprintf("value-%d-%d", w, i)
				putCtx, cancel := context.WithTimeout(ctx, 5*time.Second)
				resp, err := kv.Put(putCtx, &walshipv1.PutRequest{Key: k, Value: []byte(v), Policy: pol})
				cancel()
				if err != nil {
					return // the primary is gone
				}
				mu.Lock()
				*acked = append(*acked, ackedWrite{k, v, resp.Lsn})
				mu.Unlock()
				if count.Add(1) == threshold {
					close(reached)
				}
			}
		}()
	}
	return &wg
}

// TestPrimaryKill9 kills a real primary under concurrent load and restarts
// it: with durability sync every acknowledged write is there; with async
// what survives is a prefix of the log with no holes.
func TestPrimaryKill9(t *testing.T) {
	needLinux(t)
	for _, tc := range []struct {
		name       string
		durability string
		pol        *walshipv1.CommitPolicy
	}{
		{"sync", "sync", nil},
		{"async", "async", nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			args := []string{"primary", "--listen", "127.0.0.1:0", "--metrics-listen", "", "--data-dir", dir,
				"--durability", tc.durability, "--async-flush-interval", "50ms", "--segment-bytes", "1048576"}
			p := startProc(t, "primary serving", args...)
			ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
			defer cancel()
			kv := walshipv1.NewKVServiceClient(p.dial(ctx))

			var acked []ackedWrite
			stop, reached := make(chan struct{}), make(chan struct{})
			wg := runWriters(ctx, kv, 8, tc.pol, stop, &acked, 400, reached)
			// Let enough commits through that the kill lands mid-stream.
			select {
			case <-reached:
			case <-p.done:
				t.Fatalf("primary died under load:\n%s", p.logs())
			case <-ctx.Done():
				t.Fatal("400 commits did not happen before the deadline")
			}
			p.kill()
			close(stop)
			wg.Wait()

			p2 := startProc(t, "primary serving", args...)
			conn := p2.dial(ctx)
			kv2 := walshipv1.NewKVServiceClient(conn)
			st, err := walshipv1.NewAdminServiceClient(conn).Status(ctx, &walshipv1.StatusRequest{})
			if err != nil {
				t.Fatal(err)
			}
			visible := st.VisibleLsn
			sort.Slice(acked, func(i, j int) bool { return acked[i].lsn < acked[j].lsn })
			lost := 0
			for _, w := range acked {
				g, err := kv2.Get(ctx, &walshipv1.GetRequest{Key: w.key})
				if err != nil {
					t.Fatal(err)
				}
				present := g.Found && string(g.Value) == w.value
				switch {
				case tc.durability == "sync" && !present:
					t.Errorf("acknowledged sync write %s (LSN %d) lost after kill -9 (recovered to LSN %d)", w.key, w.lsn, visible)
				case w.lsn <= visible && !present:
					t.Errorf("write %s at LSN %d missing below the recovered LSN %d: a hole", w.key, w.lsn, visible)
				case w.lsn > visible && present:
					t.Errorf("write %s at LSN %d present beyond the recovered LSN %d", w.key, w.lsn, visible)
				case !present:
					lost++
				}
			}
			t.Logf("%d acknowledged writes, recovered to LSN %d, %d async writes lost (a suffix)", len(acked), visible, lost)
			p2.stop()
		})
	}
}
