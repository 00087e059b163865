package primary

import (
	"context"
	"testing"
	"time"

	walshipv1 "github.com/walship/walship/gen/walship/v1"
	"github.com/walship/walship/internal/kvpipe"
	"github.com/walship/walship/internal/testkit"
	"github.com/walship/walship/internal/vfs"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
)

// TestPipelineOpGivenUp: a pipelined Put stuck behind a held fsync whose
// caller gives up — its deadline passes, or it cancels — fails as the
// unary call would (DEADLINE_EXCEEDED, CANCELED: for a write, an unknown
// outcome), and the server abandons it as it abandons a unary call: with
// one operation per stream, the next operation on the same stream is run
// and answered while the fsync is still held. Before the cancel message
// the server never heard of the cancellation, and the stream's one slot
// stayed taken until the fsync ended.
func TestPipelineOpGivenUp(t *testing.T) {
	for _, tc := range []struct {
		name   string
		giveUp func() (context.Context, context.CancelFunc)
		want   codes.Code
	}{
		{"deadline", func() (context.Context, context.CancelFunc) {
			return context.WithTimeout(context.Background(), 200*time.Millisecond)
		}, codes.DeadlineExceeded},
		{"cancel", func() (context.Context, context.CancelFunc) { return context.WithCancel(context.Background()) }, codes.Canceled},
	} {
		t.Run(tc.name, func(t *testing.T) {
			mem := vfs.NewMem()
			cfg := testConfig(t, "/data")
			cfg.FS = mem
			cfg.MaxPipelineOps = 1
			r := start(t, cfg)
			m := kvpipe.NewMux(r.kv)
			defer m.Close()
			c := ctx(t)
			if _, err := m.Put(c, &walshipv1.PutRequest{Key: "before", Value: []byte("v")}); err != nil {
				t.Fatal(err)
			}
			entered, release := mem.HoldNextSync(".wal")
			defer release()
			opCtx, cancel := tc.giveUp()
			defer cancel()
			done := make(chan error, 1)
			go func() {
				_, err := m.Put(opCtx, &walshipv1.PutRequest{Key: "stuck", Value: []byte("v")})
				done <- err
			}()
			select {
			case <-entered:
			case <-c.Done():
				t.Fatal("the Put's fsync never began")
			}
			if tc.want == codes.Canceled {
				cancel()
			}
			if err := <-done; status.Code(err) != tc.want {
				t.Fatalf("the stuck Put: %v; want %v", err, tc.want)
			}
			// The fsync is still held: only a server that let the Put go
			// reads and answers the next operation of the stream.
			next, cancelNext := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancelNext()
			g, err := m.Get(next, &walshipv1.GetRequest{Key: "before"})
			if err != nil || !g.GetFound() {
				t.Fatalf("a Get on the same stream, the fsync held: %v, %v; want it answered", g, err)
			}
			release()
			// The abandoned write's outcome was unknown; here it committed.
			testkit.Until(t, "the abandoned write to become visible", func() bool {
				g, err := r.kv.Get(c, &walshipv1.GetRequest{Key: "stuck"})
				return err == nil && g.GetFound()
			})
		})
	}
}

// TestPipelineTimeoutWithoutCancel: a client that sends no cancel
// (grpcurl) gets the same from the operation's timeout alone: the Put
// stuck behind the held fsync is answered DEADLINE_EXCEEDED at its
// timeout and its place freed, so the next operation is answered while
// the fsync is still held.
func TestPipelineTimeoutWithoutCancel(t *testing.T) {
	mem := vfs.NewMem()
	cfg := testConfig(t, "/data")
	cfg.FS = mem
	cfg.MaxPipelineOps = 1
	r := start(t, cfg)
	c := ctx(t)
	if _, err := r.kv.Put(c, &walshipv1.PutRequest{Key: "before", Value: []byte("v")}); err != nil {
		t.Fatal(err)
	}
	s, err := r.kv.Pipeline(c)
	if err != nil {
		t.Fatal(err)
	}
	entered, release := mem.HoldNextSync(".wal")
	defer release()
	if err := s.Send(&walshipv1.PipelineRequest{Id: 1, Op: &walshipv1.PipelineRequest_Put{Put: &walshipv1.PutRequest{Key: "stuck", Value: []byte("v")}},
		Timeout: durationpb.New(200 * time.Millisecond)}); err != nil {
		t.Fatal(err)
	}
	<-entered
	if err := s.Send(&walshipv1.PipelineRequest{Id: 2, Op: &walshipv1.PipelineRequest_Get{Get: &walshipv1.GetRequest{Key: "before"}}}); err != nil {
		t.Fatal(err)
	}
	for _, want := range []struct {
		id   uint64
		code codes.Code
	}{{1, codes.DeadlineExceeded}, {2, codes.OK}} {
		a, err := s.Recv()
		if err != nil {
			t.Fatal(err)
		}
		if got := codes.Code(a.GetError().GetCode()); a.GetId() != want.id || got != want.code {
			t.Fatalf("answer %v; want id %d %v (the fsync still held)", a, want.id, want.code)
		}
	}
}
