package changefeed

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	walshipv1 "github.com/walship/walship/gen/walship/v1"
	"github.com/walship/walship/internal/testkit"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
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
		windows  bool
	}{{0, "", false, false}, {1000, "other/", false, false}, {1000, "k/", false, false}, {1000, "k/", true, false}, {1000, "k/", true, true}} {
		recv := "decode"
		if tc.raw {
			recv = "raw"
		}
		name := fmt.Sprintf("watchers=%d/prefix=%s/recv=%s", tc.watchers, tc.prefix, recv)
		if tc.windows {
			name += "/windows=grpc-default"
		}
		b.Run(name, func(b *testing.B) {
			n := newNodeWith(b, 0, 0, grpc.ForceServerCodecV2(sharedCodec{}))
			kv := n.kv
			if tc.windows {
				kv = defaultWindowsClient(b, n.addr)
			}
			benchFanout(b, n, kv, tc.watchers, tc.prefix, tc.raw)
		})
	}
}

// defaultWindowsClient returns a client of addr with gRPC's default
// flow-control windows, as pkg/client dials: 64 KiB to start, grown by
// BDP estimation (newNode's client has fixed 64 KiB windows, for the
// stall tests; 1,000 streams on one connection then share 64 KiB in
// flight, and the server waits for a window update every few messages).
func defaultWindowsClient(b *testing.B, addr string) walshipv1.KVServiceClient {
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = conn.Close() })
	return walshipv1.NewKVServiceClient(conn)
}

func benchFanout(b *testing.B, n *node, kv walshipv1.KVServiceClient, watchers int, prefix string, raw bool) {
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
		s, err := kv.Watch(ctx, &walshipv1.WatchRequest{Prefix: prefix, StartLsn: start, ProgressInterval: durationpb.New(time.Minute)}, opts...)
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
	cpu := cpuTime(b)
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
	reportCPU(b, cpu)
	cancel()
	wg.Wait()
}

// cpuTime returns the CPU time (user and system) the process has used.
// On a machine shared with other work, wall time per op counts the time
// others took the cores; CPU time per op (reportCPU) is what this process
// spent, its own and its in-process watchers'.
func cpuTime(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// reportCPU reports the process's CPU time per op since start.
func reportCPU(b *testing.B, start time.Duration) {
	b.ReportMetric(float64(cpuTime(b)-start)/float64(b.N), "cpu-ns/op")
}

// firstLSN returns the lsn (field 1) of an encoded WatchTxn element
// (tag and length first), 0 if it has none.
func firstLSN(elem []byte) uint64 {
	txn, n := protowire.ConsumeBytes(elem)
	if n < 0 {
		return 0
	}
	for len(txn) > 0 {
		num, typ, n := protowire.ConsumeTag(txn)
		if n < 0 {
			return 0
		}
		txn = txn[n:]
		if num == 1 && typ == protowire.VarintType {
			v, _ := protowire.ConsumeVarint(txn)
			return v
		}
		n = protowire.ConsumeFieldValue(num, typ, txn)
		if n < 0 {
			return 0
		}
		txn = txn[n:]
	}
	return 0
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
	lsns, _ := v.(*txnLSNs)
	c, ok := v.(*txnCount)
	if !ok {
		if lsns == nil {
			return encoding.GetCodecV2("proto").Unmarshal(data, v)
		}
		c = new(txnCount)
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
			if num == 1 {
				*c++
				if lsns != nil {
					*lsns = append(*lsns, firstLSN(txns[:n]))
				}
			}
			txns = txns[n:]
		}
	}
	return nil
}

// BenchmarkFanoutLatency measures, at about 1,000 transactions/s (one
// put per 1 ms tick, the bound advanced past each as the commit watermark
// would be), the time from the bound covering a transaction to the last
// of 1, 100 or 1,000 watchers of its prefix receiving it (recv=raw
// watchers, which note when each transaction arrived). It reports the
// median and p99 (ms) over transactions of that slowest watcher's delay;
// ns/op is the committing loop's pace: above 1 ms, the node did not keep
// up 1,000 transactions/s (its cores went to the fan-out).
func BenchmarkFanoutLatency(b *testing.B) {
	for _, watchers := range []int{1, 100, 1000} {
		b.Run(fmt.Sprintf("watchers=%d", watchers), func(b *testing.B) { benchFanoutLatency(b, watchers) })
	}
}

func benchFanoutLatency(b *testing.B, watchers int) {
	n := newNodeWith(b, 0, 0, grpc.ForceServerCodecV2(sharedCodec{}))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	start := n.feed.Bound.Load() + 1
	// Every transaction is one put and its commit: two LSNs.
	index := func(lsn uint64) int { return int(lsn-start) / 2 }
	arrived := make([][]int64, watchers) // per watcher, per transaction: unix ns
	var done atomic.Int64
	var wg sync.WaitGroup
	for w := range watchers {
		arrived[w] = make([]int64, b.N)
		s, err := n.kv.Watch(ctx, &walshipv1.WatchRequest{Prefix: "k/", StartLsn: start, ProgressInterval: durationpb.New(time.Minute)}, grpc.ForceCodecV2(countingCodec{}))
		if err != nil {
			b.Fatal(err)
		}
		wg.Go(func() {
			got := 0
			for got < b.N {
				var l txnLSNs
				if err := s.RecvMsg(&l); err != nil {
					return
				}
				now := time.Now().UnixNano()
				for _, lsn := range l {
					if i := index(lsn); i >= 0 && i < b.N {
						arrived[w][i] = now
						got++
					}
				}
			}
			done.Add(1)
		})
	}
	covered := make([]int64, b.N)
	tick := time.NewTicker(time.Millisecond)
	defer tick.Stop()
	b.ResetTimer()
	for i := range b.N {
		<-tick.C
		l := n.commit(b, fmt.Sprintf("k/%d", i%1000), "value-of-some-sixty-four-bytes-0123456789-0123456789-0123456789")
		covered[i] = time.Now().UnixNano()
		n.feed.Bound.Advance(l)
	}
	testkit.UntilWithin(b, 10*time.Minute, "every watcher to receive every transaction", func() bool { return done.Load() == int64(watchers) })
	b.StopTimer()
	cancel()
	wg.Wait()
	lat := make([]time.Duration, b.N)
	for i := range b.N {
		for w := range watchers {
			lat[i] = max(lat[i], time.Duration(arrived[w][i]-covered[i]))
		}
	}
	slices.Sort(lat)
	b.ReportMetric(float64(lat[len(lat)/2].Microseconds())/1000, "p50_ms")
	b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds())/1000, "p99_ms")
}

// txnLSNs is a WatchResponse received by countingCodec for
// BenchmarkFanoutLatency: the LSNs of the transactions it carries.
type txnLSNs []uint64
