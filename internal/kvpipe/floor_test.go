package kvpipe_test

import (
	"context"
	"fmt"
	"net"
	"sync"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/mem"
)

// rawCodec carries a message's bytes as they are: no protobuf.
type rawCodec struct{}

func (rawCodec) Marshal(v any) (mem.BufferSlice, error) {
	return mem.BufferSlice{mem.SliceBuffer(*v.(*[]byte))}, nil
}

func (rawCodec) Unmarshal(data mem.BufferSlice, v any) error {
	p := v.(*[]byte)
	if n := data.Len(); cap(*p) < n {
		*p = make([]byte, n)
	} else {
		*p = (*p)[:n]
	}
	data.CopyTo(*p)
	return nil
}

func (rawCodec) Name() string { return "raw" }

// echoService answers each message of its one stream with the same bytes.
var echoService = grpc.ServiceDesc{
	ServiceName: "floor.Echo",
	HandlerType: (*any)(nil),
	Streams: []grpc.StreamDesc{{StreamName: "Echo", ServerStreams: true, ClientStreams: true,
		Handler: func(_ any, st grpc.ServerStream) error {
			var b []byte
			for {
				if err := st.RecvMsg(&b); err != nil {
					return nil // the client closed its side (or went away)
				}
				if err := st.SendMsg(&b); err != nil {
					return err
				}
			}
		}}},
}

// BenchmarkStreamFloor is gRPC's own cost per operation on a stream,
// without protobuf, kvpipe or any work: 8 streams on one connection, 16
// operations of 120 bytes (a 100-byte Put) in flight on each, carried
// perMsg to a message and echoed back. cpu-ns/op is the process's CPU
// (client and server) per operation; BenchmarkMux is the same load
// through kvpipe, one operation per message.
func BenchmarkStreamFloor(b *testing.B) {
	const streams, inflight, opBytes = 8, 16, 120
	for _, perMsg := range []int{1, 4, 16} {
		b.Run(fmt.Sprintf("ops_per_message=%d", perMsg), func(b *testing.B) {
			lis, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				b.Fatal(err)
			}
			srv := grpc.NewServer(grpc.ForceServerCodecV2(rawCodec{}))
			srv.RegisterService(&echoService, struct{}{})
			go func() { _ = srv.Serve(lis) }()
			defer srv.Stop()
			conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()),
				grpc.WithDefaultCallOptions(grpc.ForceCodecV2(rawCodec{})))
			if err != nil {
				b.Fatal(err)
			}
			defer conn.Close()
			msgs := max(1, b.N/perMsg/streams)
			before := processCPU(b)
			b.ResetTimer()
			var wg sync.WaitGroup
			for range streams {
				wg.Add(1)
				go func() {
					defer wg.Done()
					echo(b, conn, msgs, inflight/perMsg, make([]byte, opBytes*perMsg))
				}()
			}
			wg.Wait()
			b.ReportMetric(float64(processCPU(b)-before)/float64(msgs*perMsg*streams), "cpu-ns/op")
		})
	}
}

// echo sends msgs copies of m on a new Echo stream, window of them in
// flight at a time, and reads every answer.
func echo(b *testing.B, conn *grpc.ClientConn, msgs, window int, m []byte) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	st, err := conn.NewStream(ctx, &echoService.Streams[0], "/floor.Echo/Echo")
	if err != nil {
		b.Error(err)
		return
	}
	slots := make(chan struct{}, window)
	received := make(chan error, 1)
	go func() {
		var r []byte
		for range msgs {
			if err := st.RecvMsg(&r); err != nil {
				received <- err
				return
			}
			<-slots
		}
		received <- nil
	}()
	for range msgs {
		select {
		case slots <- struct{}{}:
		case err := <-received:
			b.Error(err)
			return
		}
		if err := st.SendMsg(&m); err != nil {
			b.Error(err)
			return
		}
	}
	if err := <-received; err != nil {
		b.Error(err)
	}
	_ = st.CloseSend()
}
