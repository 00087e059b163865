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
	"google.golang.org/grpc"
	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
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
//
// The watchers are clients in the same process, on the same cores:
// recv=decode unmarshals every message as an application would (its cost
// is the consumer's, here on the node's cores); recv=raw only counts the
// transactions in the received bytes, leaving the node's own work (and
// the transport's, both ends of loopback) — the nearer measure of what
// the watchers cost the node.
func BenchmarkFanout(b *testing.B) {
	for _, tc := range []struct {
		watchers int
		prefix   string
		raw      bool
	}{{0, "", false}, {1000, "other/", false}, {1000, "k/", false}, {1000, "k/", true}} {
		recv := "decode"
		if tc.raw {
			recv = "raw"
		}
		b.Run(fmt.Sprintf("watchers=%d/prefix=%s/recv=%s", tc.watchers, tc.prefix, recv), func(b *testing.B) {
			n := newNodeWith(b, 0, 0, grpc.ForceServerCodecV2(sharedCodec{}))
			benchFanout(b, n, tc.watchers, tc.prefix, tc.raw)
		})
	}
}

func benchFanout(b *testing.B, n *node, watchers int, prefix string, raw bool) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var received atomic.Int64
	var wg sync.WaitGroup
	start := n.feed.Bound.Load() + 1
	var opts []grpc.CallOption
	if raw {
		opts = append(opts, grpc.ForceCodecV2(countingCodec{}))
	}
	for range watchers {
		s, err := n.kv.Watch(ctx, &walshipv1.WatchRequest{Prefix: prefix, StartLsn: start, ProgressInterval: durationpb.New(time.Minute)}, opts...)
		if err != nil {
			b.Fatal(err)
		}
		wg.Go(func() {
			for {
				if raw {
					var c txnCount
					if err := s.RecvMsg(&c); err != nil {
						return
					}
					received.Add(int64(c))
					continue
				}
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

// txnCount is a WatchResponse received by countingCodec: how many
// transactions it carries.
type txnCount int

// countingCodec is a client codec that encodes requests as protobuf and
// counts a WatchResponse's transactions without decoding them.
type countingCodec struct{}

func (countingCodec) Name() string { return "proto" }

func (countingCodec) Marshal(v any) (mem.BufferSlice, error) {
	return encoding.GetCodecV2("proto").Marshal(v)
}

func (countingCodec) Unmarshal(data mem.BufferSlice, v any) error {
	c, ok := v.(*txnCount)
	if !ok {
		return encoding.GetCodecV2("proto").Unmarshal(data, v)
	}
	buf := data.MaterializeToBuffer(mem.DefaultBufferPool())
	defer buf.Free()
	b := buf.ReadOnlyData()
	*c = 0
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return protowire.ParseError(n)
		}
		b = b[n:]
		if num != 1 || typ != protowire.BytesType { // progress
			n = protowire.ConsumeFieldValue(num, typ, b)
			if n < 0 {
				return protowire.ParseError(n)
			}
			b = b[n:]
			continue
		}
		txns, n := protowire.ConsumeBytes(b)
		if n < 0 {
			return protowire.ParseError(n)
		}
		b = b[n:]
		for len(txns) > 0 {
			num, typ, n := protowire.ConsumeTag(txns)
			if n < 0 {
				return protowire.ParseError(n)
			}
			txns = txns[n:]
			n = protowire.ConsumeFieldValue(num, typ, txns)
			if n < 0 {
				return protowire.ParseError(n)
			}
			txns = txns[n:]
			if num == 1 {
				*c++
			}
		}
	}
	return nil
}
