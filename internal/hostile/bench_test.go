package hostile

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	walshipv1 "github.com/walship/walship/gen/walship/v1"
	"github.com/walship/walship/internal/tlsid"
)

// BenchmarkWellBehavedClient measures the commits/s of a well-behaved
// client (8 committers, a client certificate of its own, 100-byte
// values, the default policy: sync durability) on a cluster of real
// processes under mTLS, alone (attack=none) and under each of the
// suite's attacks, started before the clock and running until the
// commits are done. The target is half of attack=none's rate.
// The attacker is a process of its own, on the same machine (and its two
// cores) as the cluster and the client.
//
//	go test -run XXX -bench WellBehavedClient -benchtime 2000x -count 6 ./internal/hostile/
func BenchmarkWellBehavedClient(b *testing.B) {
	c := startCluster(b)
	e := newEnv(b, c.pki)
	load(waitCtx(b, time.Minute), b, c)
	kv := walshipv1.NewKVServiceClient(grpcConn(b, c.primary.addr, c.pki.files(b, tlsid.ClassClient, "good")))
	run := func(b *testing.B, a *attack) {
		if a != nil {
			at := startAttacker(b, a, c.proc(a.target).addr, e)
			defer at.stop()
			select {
			case <-at.ready:
			case <-at.done:
				b.Fatalf("the attacker of %s exited:\n%s", a.name, at.out.String())
			case <-time.After(30 * time.Second):
				b.Logf("%s: its load was not in place after 30s", a.name)
			}
		}
		var next, failed atomic.Int64
		b.ResetTimer()
		start := time.Now()
		var wg sync.WaitGroup
		value := make([]byte, 100)
		for w := range 8 {
			wg.Go(func() {
				for {
					i := next.Add(1)
					if i > int64(b.N) {
						return
					}
					ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
					_, err := kv.Put(ctx, &walshipv1.PutRequest{Key: fmt.Sprintf("bench/%d/%d", w, i%100), Value: value})
					cancel()
					if err != nil {
						failed.Add(1)
					}
				}
			})
		}
		wg.Wait()
		elapsed := time.Since(start)
		b.StopTimer()
		b.ReportMetric(float64(b.N)/elapsed.Seconds(), "commits/s")
		b.ReportMetric(float64(failed.Load()), "failed")
	}
	b.Run("attack=none", func(b *testing.B) { run(b, nil) })
	for i := range attacks {
		b.Run("attack="+attacks[i].name, func(b *testing.B) { run(b, &attacks[i]) })
	}
}
