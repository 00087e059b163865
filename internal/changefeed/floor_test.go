package changefeed

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	walshipv1 "github.com/walship/walship/gen/walship/v1"
	"github.com/walship/walship/internal/testkit"
	"github.com/walship/walship/pkg/codec"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/mem"
)

// BenchmarkFanoutFloor measures what this machine charges to deliver
// BenchmarkFanout's bytes to 1,000 watchers, with nothing of walship's own:
// the messages a caught-up watcher of "k/" gets (one per round of 64
// transactions, the same encoded bytes, built by Build and assembled as
// Serve does) are written, pre-encoded, to 1,000 receivers on loopback,
// which drain them on the same cores. One op is one transaction; add
// BenchmarkFanout's watchers=0 ns/op (the apply path) to compare with its
// watchers=1000 recv=raw.
//
//   - tcp/conns=1000: 1,000 raw TCP connections, a writer goroutine per
//     connection woken per round (as a watcher is), a reader draining each:
//     one write and one read per watcher per round, the kernel's copies.
//   - tcp/conns=1: the same bytes through one connection, written by one
//     goroutine through a 256 KiB buffer: what the copies alone cost.
//   - grpc/conns=1: 1,000 gRPC server streams over one connection, as
//     BenchmarkFanout's watchers are, each Send of the pre-encoded message
//     (no codec work), received by a recv=raw client (countingCodec).
//   - grpc/conns=1000: the same, one connection per stream.
//   - grpc/conns=1/windows=grpc-default: grpc/conns=1 with the client's
//     flow-control windows gRPC's defaults (as pkg/client's), not fixed
//     64 KiB ones (as BenchmarkFanout's, but for its windows=grpc-default).
func BenchmarkFanoutFloor(b *testing.B) {
	const watchers = 1000
	for _, tc := range []struct {
		name    string
		conns   int
		grpc    bool
		windows bool
	}{{"tcp", 1000, false, false}, {"tcp", 1, false, false}, {"grpc", 1, true, false}, {"grpc", 1000, true, false}, {"grpc", 1, true, true}} {
		name := fmt.Sprintf("%s/conns=%d", tc.name, tc.conns)
		if tc.windows {
			name += "/windows=grpc-default"
		}
		b.Run(name, func(b *testing.B) {
			msgs := newRoundMessages(b)
			if tc.grpc {
				floorGRPC(b, msgs, watchers, tc.conns, tc.windows)
			} else {
				floorTCP(b, msgs, watchers, tc.conns)
			}
			b.ReportMetric(float64(len(msgs.byTxns[round])), "B/msg")
		})
	}
}

// roundMessages are the messages a caught-up watcher of "k/" gets: by
// number of transactions (a round, or the last partial one), the encoded
// WatchResponse.
type roundMessages struct {
	byTxns map[int][]byte
}

func newRoundMessages(tb testing.TB) *roundMessages {
	tb.Helper()
	r := &roundMessages{byTxns: map[int][]byte{}}
	// The same transactions BenchmarkFanout commits: one 64-byte put each,
	// keys k/0..k/999, previous values read from the state.
	var recs []codec.Record
	lsn := uint64(0)
	for i := range round {
		lsn++
		recs = append(recs, codec.Record{LSN: lsn, TxnID: lsn + 1, Op: codec.OpPut, Key: fmt.Appendf(nil, "k/%d", 500+i), Value: []byte("value-of-some-sixty-four-bytes-0123456789-0123456789-0123456789")})
		lsn++
		recs = append(recs, codec.Record{LSN: lsn, TxnID: lsn, Op: codec.OpCommit})
	}
	txns := Build(recs, func(l uint64) int64 { return int64(l) * 1000 })
	for k := 1; k <= round; k++ {
		msgs, err := buildRun(filter{prefix: "k/"}, txns[:k], &bufferPool{}, &message{}, true)
		if err != nil || len(msgs) != 1 {
			tb.Fatalf("build a message of %d transactions: %d messages, %v", k, len(msgs), err)
		}
		r.byTxns[k] = msgs[0].bufs.Materialize()
	}
	return r
}

// rounds calls send(k) for each round of the n transactions (k of them).
func (r *roundMessages) rounds(n int, send func(msg []byte, txns int)) {
	for i := 0; i < n; i += round {
		k := min(round, n-i)
		send(r.byTxns[k], k)
	}
}

// broadcast hands every waiter every round in turn, waking them as the
// bound's advance wakes every watcher. Nobody skips a round: each receiver
// gets one message per round, as many as a caught-up watcher (one that is
// behind gets fewer, bigger ones).
type broadcast struct {
	mu     sync.Mutex
	ch     chan struct{}
	rounds []int // transactions per published round
}

func newBroadcast() *broadcast { return &broadcast{ch: make(chan struct{})} }

func (c *broadcast) publish(txns int) {
	c.mu.Lock()
	c.rounds = append(c.rounds, txns)
	close(c.ch)
	c.ch = make(chan struct{})
	c.mu.Unlock()
}

// next returns the transactions of round i, waiting for it; 0 once ctx is
// done.
func (c *broadcast) next(ctx context.Context, i int) int {
	for {
		c.mu.Lock()
		if i < len(c.rounds) {
			k := c.rounds[i]
			c.mu.Unlock()
			return k
		}
		ch := c.ch
		c.mu.Unlock()
		select {
		case <-ctx.Done():
			return 0
		case <-ch:
		}
	}
}

// A raw frame is gRPC's: a flag byte and a 4-byte length, then the message.
func frame(msg []byte) []byte {
	f := make([]byte, 5+len(msg))
	f[1], f[2], f[3], f[4] = byte(len(msg)>>24), byte(len(msg)>>16), byte(len(msg)>>8), byte(len(msg))
	copy(f[5:], msg)
	return f
}

func floorTCP(b *testing.B, msgs *roundMessages, watchers, conns int) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	defer lis.Close()
	frames := map[int][]byte{}
	for k, m := range msgs.byTxns {
		frames[k] = frame(m)
	}
	var received atomic.Int64 // bytes
	var wg sync.WaitGroup
	servers := make([]net.Conn, conns)
	for i := range conns {
		c, err := net.Dial("tcp", lis.Addr().String())
		if err != nil {
			b.Fatal(err)
		}
		defer c.Close()
		s, err := lis.Accept()
		if err != nil {
			b.Fatal(err)
		}
		defer s.Close()
		servers[i] = s
		wg.Go(func() {
			buf := make([]byte, 256<<10)
			for {
				n, err := c.Read(buf)
				received.Add(int64(n))
				if err != nil {
					return
				}
			}
		})
	}
	want := int64(0)
	msgs.rounds(b.N, func(_ []byte, k int) { want += int64(watchers * len(frames[k])) })
	ctx, cancel := context.WithCancel(context.Background())
	bc := newBroadcast()
	var writers sync.WaitGroup
	if conns == 1 {
		// One writer of every copy, buffered: the copies alone.
		writers.Go(func() {
			w := bufio.NewWriterSize(servers[0], 256<<10)
			for i := 0; ; i++ {
				k := bc.next(ctx, i)
				if k == 0 {
					return
				}
				for range watchers {
					_, _ = w.Write(frames[k])
				}
				if w.Flush() != nil {
					return
				}
			}
		})
	}
	// One writer per watcher, as one goroutine sends to each watcher.
	for w := range watchers {
		if conns == 1 {
			break
		}
		writers.Go(func() {
			s := servers[w]
			for i := 0; ; i++ {
				k := bc.next(ctx, i)
				if k == 0 {
					return
				}
				if _, err := s.Write(frames[k]); err != nil {
					return
				}
			}
		})
	}
	b.ResetTimer()
	cpu := cpuTime(b)
	msgs.rounds(b.N, func(_ []byte, k int) { bc.publish(k) })
	testkit.UntilWithin(b, 10*time.Minute, "every reader to receive every byte", func() bool { return received.Load() >= want })
	b.StopTimer()
	reportCPU(b, cpu)
	cancel()
	writers.Wait()
	for _, s := range servers {
		_ = s.Close()
	}
	wg.Wait()
}

// floorCodec sends pre-encoded bytes as they are and reads a request as
// its bytes.
type floorCodec struct{}

func (floorCodec) Name() string { return "proto" }

func (floorCodec) Marshal(v any) (mem.BufferSlice, error) {
	return mem.BufferSlice{mem.SliceBuffer(v.([]byte))}, nil
}

func (floorCodec) Unmarshal(data mem.BufferSlice, v any) error {
	*v.(*[]byte) = data.Materialize()
	return nil
}

func floorGRPC(b *testing.B, msgs *roundMessages, watchers, conns int, defaultWindows bool) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	bc := newBroadcast()
	g := grpc.NewServer(grpc.InitialWindowSize(64<<10), grpc.InitialConnWindowSize(64<<10), grpc.ForceServerCodecV2(floorCodec{}),
		grpc.UnknownServiceHandler(func(_ any, s grpc.ServerStream) error {
			var req []byte
			if err := s.RecvMsg(&req); err != nil {
				return err
			}
			for i := 0; ; i++ {
				k := bc.next(s.Context(), i)
				if k == 0 {
					return nil
				}
				if err := s.SendMsg(msgs.byTxns[k]); err != nil {
					return err
				}
			}
		}))
	go func() { _ = g.Serve(lis) }()
	defer g.Stop()
	clients := make([]*grpc.ClientConn, conns)
	for i := range clients {
		opts := []grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}
		if !defaultWindows {
			opts = append(opts, grpc.WithInitialWindowSize(64<<10), grpc.WithInitialConnWindowSize(64<<10))
		}
		c, err := grpc.NewClient(lis.Addr().String(), opts...)
		if err != nil {
			b.Fatal(err)
		}
		defer c.Close()
		clients[i] = c
	}
	var received atomic.Int64 // transactions
	var wg sync.WaitGroup
	for w := range watchers {
		s, err := clients[w%conns].NewStream(ctx, &grpc.StreamDesc{ServerStreams: true}, "/walship.floor.v1.Floor/Watch", grpc.ForceCodecV2(countingCodec{}))
		if err != nil {
			b.Fatal(err)
		}
		if err := s.SendMsg(&walshipv1.WatchRequest{}); err != nil {
			b.Fatal(err)
		}
		if err := s.CloseSend(); err != nil {
			b.Fatal(err)
		}
		wg.Go(func() {
			for {
				var c txnCount
				if err := s.RecvMsg(&c); err != nil {
					return
				}
				received.Add(int64(c))
			}
		})
	}
	b.ResetTimer()
	cpu := cpuTime(b)
	sent := int64(0)
	msgs.rounds(b.N, func(_ []byte, k int) {
		bc.publish(k)
		sent += int64(k)
	})
	testkit.UntilWithin(b, 10*time.Minute, "every watcher to receive every transaction", func() bool { return received.Load() >= sent*int64(watchers) })
	b.StopTimer()
	reportCPU(b, cpu)
	cancel()
	wg.Wait()
}
