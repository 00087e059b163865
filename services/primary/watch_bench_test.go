package primary

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	walshipv1 "github.com/walship/walship/gen/walship/v1"
)

// BenchmarkCommitToEvent measures the time from a commit's acknowledgement
// (its Put returning) to its event reaching a watcher of the primary, at
// about 1,000 commits/s (one committer, paced by a 1 ms ticker; sync
// durability on the real disk). It reports the median and p99 (ms).
func BenchmarkCommitToEvent(b *testing.B) {
	s := startBench(b, walshipv1.Durability_DURABILITY_SYNC)
	conn := dialBench(b, s.Addr())
	defer conn.Close()
	kv := walshipv1.NewKVServiceClient(conn)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	w, err := kv.Watch(ctx, &walshipv1.WatchRequest{Prefix: "lat/"})
	if err != nil {
		b.Fatal(err)
	}
	if _, err := w.Recv(); err != nil { // the first progress: the watch is on
		b.Fatal(err)
	}
	var mu sync.Mutex
	got := map[uint64]time.Time{}
	recvDone := make(chan struct{})
	go func() {
		defer close(recvDone)
		for {
			m, err := w.Recv()
			if err != nil {
				return
			}
			now := time.Now()
			mu.Lock()
			for _, x := range m.GetTxns().GetTxns() {
				got[x.GetLsn()] = now
			}
			mu.Unlock()
		}
	}()
	acked := make(map[uint64]time.Time, b.N)
	tick := time.NewTicker(time.Millisecond)
	defer tick.Stop()
	b.ResetTimer()
	for i := range b.N {
		<-tick.C
		r, err := kv.Put(ctx, &walshipv1.PutRequest{Key: fmt.Sprintf("lat/%d", i%100), Value: []byte("v")})
		if err != nil {
			b.Fatal(err)
		}
		acked[r.Lsn] = time.Now()
	}
	b.StopTimer()
	deadline := time.Now().Add(10 * time.Second)
	for {
		mu.Lock()
		n := len(got)
		mu.Unlock()
		if n >= b.N || time.Now().After(deadline) {
			break
		}
		<-tick.C
	}
	cancel()
	<-recvDone
	var lat []time.Duration
	for lsn, at := range acked {
		if t, ok := got[lsn]; ok {
			lat = append(lat, max(t.Sub(at), 0))
		}
	}
	if len(lat) < b.N {
		b.Fatalf("%d of %d events delivered", len(lat), b.N)
	}
	slices.Sort(lat)
	b.ReportMetric(float64(lat[len(lat)/2].Microseconds())/1000, "p50_ms")
	b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds())/1000, "p99_ms")
}
