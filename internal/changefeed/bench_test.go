package changefeed

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	walshipv1 "github.com/walship/walship/gen/walship/v1"
	"github.com/walship/walship/internal/testkit"
	"google.golang.org/protobuf/types/known/durationpb"
)

// round is how many transactions the bound advances by at once: a
// replica applies (and the watermark covers) a round of batches at a time.
const round = 64

// BenchmarkFanout measures a node's apply path (WAL append, Build with
// previous values, state apply, ring append, bound advance every round
// transactions: one op is one transaction of one put) with 0 or 1,000 watchers over real gRPC on
// loopback, watching the prefix written (every watcher gets every
// transaction, the shared message: no copy per watcher) or another one
// (filtered out). With watchers of the prefix written, the op ends only
// once every watcher has received every transaction: ns/op is then the
// apply throughput under full fan-out.
func BenchmarkFanout(b *testing.B) {
	for _, tc := range []struct {
		watchers int
		prefix   string
	}{{0, ""}, {1000, "other/"}, {1000, "k/"}} {
		b.Run(fmt.Sprintf("watchers=%d/prefix=%s", tc.watchers, tc.prefix), func(b *testing.B) {
			n := newNode(b, 0, 0)
			benchFanout(b, n, tc.watchers, tc.prefix)
		})
	}
}

func benchFanout(b *testing.B, n *node, watchers int, prefix string) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var received atomic.Int64
	var wg sync.WaitGroup
	start := n.feed.Bound.Load() + 1
	for range watchers {
		s, err := n.kv.Watch(ctx, &walshipv1.WatchRequest{Prefix: prefix, StartLsn: start, ProgressInterval: durationpb.New(time.Minute)})
		if err != nil {
			b.Fatal(err)
		}
		wg.Go(func() {
			for {
				m, err := s.Recv()
				if err != nil {
					return
				}
				received.Add(int64(len(m.GetTxns().GetTxns())))
			}
		})
	}
	b.ResetTimer()
	for i := range b.N {
		l := n.commit(b, fmt.Sprintf("k/%d", i%1000), "value-of-some-sixty-four-bytes-0123456789-0123456789-0123456789")
		if i%round == round-1 || i == b.N-1 {
			n.feed.Bound.Advance(l)
		}
	}
	if prefix == "k/" {
		testkit.UntilWithin(b, 10*time.Minute, "every watcher to receive every transaction", func() bool { return received.Load() >= int64(b.N*watchers) })
	}
	b.StopTimer()
	cancel()
	wg.Wait()
}
