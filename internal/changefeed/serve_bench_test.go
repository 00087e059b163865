package changefeed

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	walshipv1 "github.com/walship/walship/gen/walship/v1"
	"github.com/walship/walship/internal/state"
	"github.com/walship/walship/internal/testkit"
	"github.com/walship/walship/internal/vfs"
	"github.com/walship/walship/internal/wal"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/types/known/durationpb"
)

// countingStream is a Watch stream with no transport: SendMsg takes the
// message's encoding, as internal/serve's codec does, drops it, and counts
// the message's transactions (as the server knows them: no parsing).
type countingStream struct {
	ctx  context.Context
	txns *atomic.Int64
}

func (s countingStream) Context() context.Context { return s.ctx }

func (s countingStream) SendMsg(m any) error {
	p, ok := m.(interface{ EncodedBuffers() mem.BufferSlice })
	if !ok {
		return nil // progress
	}
	p.EncodedBuffers().Free()
	s.txns.Add(int64(m.(*runMsg).txns))
	return nil
}

// BenchmarkFanoutServe is BenchmarkFanout's watchers=1000 recv=raw case
// without gRPC: 1,000 watchers of "k/" served by Serve into streams that
// only take each message's encoding and count its transactions. What is
// left is walship's own per-watcher work (waking, reading the ring,
// choosing and assembling messages) and the apply path: the part of the
// fan-out above the transport's floor (BenchmarkFanoutFloor).
func BenchmarkFanoutServe(b *testing.B) {
	for _, watchers := range []int{0, 1000} {
		b.Run(fmt.Sprintf("watchers=%d", watchers), func(b *testing.B) { benchFanoutServe(b, watchers) })
	}
}

func benchFanoutServe(b *testing.B, watchers int) {
	log, err := wal.Open(wal.Options{Dir: "wal", FS: vfs.NewMem(), SegmentSize: 4096})
	if err != nil {
		b.Fatal(err)
	}
	defer log.Close()
	n := &node{st: state.New(), log: log, feed: New(0, 0, 0)}
	src := Source{Feed: n.feed, WAL: log}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var received atomic.Int64
	var wg sync.WaitGroup
	start := n.feed.Bound.Load() + 1
	for range watchers {
		wg.Go(func() {
			_ = Serve(src, &walshipv1.WatchRequest{Prefix: "k/", StartLsn: start, ProgressInterval: durationpb.New(time.Minute)}, countingStream{ctx, &received})
		})
	}
	b.ResetTimer()
	cpu := cpuTime(b)
	for i := range b.N {
		l := n.commit(b, fmt.Sprintf("k/%d", i%1000), "value-of-some-sixty-four-bytes-0123456789-0123456789-0123456789")
		if i%round == round-1 || i == b.N-1 {
			n.feed.Bound.Advance(l)
		}
	}
	testkit.UntilWithin(b, 10*time.Minute, "every watcher to receive every transaction", func() bool { return received.Load() >= int64(b.N*watchers) })
	b.StopTimer()
	reportCPU(b, cpu)
	cancel()
	wg.Wait()
}
