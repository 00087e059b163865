package primary

import (
	"context"
	"strings"
	"testing"
	"time"

	walshipv1 "github.com/walship/walship/gen/walship/v1"
	"github.com/walship/walship/internal/kvpipe"
	"github.com/walship/walship/internal/testkit"
	"github.com/walship/walship/internal/vfs"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
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
	_, s := startPipeline(t, cfg)
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

// pipeOp makes a Pipeline operation of id from a Put, Delete or Txn.
func pipeOp(id uint64, req proto.Message) *walshipv1.PipelineRequest {
	r := &walshipv1.PipelineRequest{Id: id}
	switch x := req.(type) {
	case *walshipv1.PutRequest:
		r.Op = &walshipv1.PipelineRequest_Put{Put: x}
	case *walshipv1.DeleteRequest:
		r.Op = &walshipv1.PipelineRequest_Delete{Delete: x}
	case *walshipv1.TxnRequest:
		r.Op = &walshipv1.PipelineRequest_Txn{Txn: x}
	}
	return r
}

// TestPipelineGroupInMessageOrder: the writes one Pipeline message
// carries are run as one group, sequenced in the message's order: a Txn
// sees the Put before it in the message, a Delete after both finds the
// key, a Txn that only reads sees what the group wrote before it; a
// write that fails validation gets the unary call's error and the others
// commit; every write has its own LSN, in the message's order; the
// store then holds what that order gives.
func TestPipelineGroupInMessageOrder(t *testing.T) {
	r := start(t, testConfig(t, t.TempDir()))
	c := ctx(t)
	s, err := r.kv.Pipeline(c)
	if err != nil {
		t.Fatal(err)
	}
	async := &walshipv1.CommitPolicy{Durability: walshipv1.Durability_DURABILITY_ASYNC}
	get := func(k string) *walshipv1.TxnOp {
		return &walshipv1.TxnOp{Op: &walshipv1.TxnOp_Get{Get: &walshipv1.GetOp{Key: k}}}
	}
	msg := pipeOp(1, &walshipv1.PutRequest{Key: "k1", Value: []byte("v1"), Policy: async})
	msg.More = []*walshipv1.PipelineRequest{
		pipeOp(2, &walshipv1.TxnRequest{
			Compares: []*walshipv1.Compare{{Key: "k1", Result: walshipv1.CompareResult_COMPARE_RESULT_EQUAL,
				Target: walshipv1.CompareTarget_COMPARE_TARGET_VALUE, Operand: &walshipv1.Compare_Value{Value: []byte("v1")}}},
			Success: []*walshipv1.TxnOp{{Op: &walshipv1.TxnOp_Put{Put: &walshipv1.PutOp{Key: "k2", Value: []byte("v2")}}}, get("k1")},
		}),
		pipeOp(3, &walshipv1.DeleteRequest{Key: "k1"}),
		pipeOp(4, &walshipv1.PutRequest{Key: "", Value: []byte("x")}),
		pipeOp(5, &walshipv1.TxnRequest{Success: []*walshipv1.TxnOp{get("k1"), get("k2")}}),
		pipeOp(6, &walshipv1.PutRequest{Key: "k3", Value: []byte("v3"), Policy: &walshipv1.CommitPolicy{Durability: 99}}),
	}
	if err := s.Send(msg); err != nil {
		t.Fatal(err)
	}
	if err := s.CloseSend(); err != nil {
		t.Fatal(err)
	}
	got := map[uint64]*walshipv1.PipelineResponse{}
	for {
		a, err := s.Recv()
		if err != nil {
			break
		}
		got[a.GetId()] = a
	}
	if len(got) != 6 {
		t.Fatalf("answers %v; want 6", got)
	}
	p1, tx, del := got[1].GetPut(), got[2].GetTxn(), got[3].GetDelete()
	if p1.GetLsn() == 0 || !tx.GetSucceeded() || !del.GetExisted() || !(p1.GetLsn() < tx.GetLsn() && tx.GetLsn() < del.GetLsn()) {
		t.Fatalf("answers %v, %v, %v; want the Put, the Txn that saw it and the Delete that found k1, at increasing LSNs", got[1], got[2], got[3])
	}
	if g := tx.GetResults()[1].GetGet(); !g.GetFound() || string(g.GetValue()) != "v1" || g.GetVersionLsn() != p1.GetLsn() {
		t.Fatalf("the Txn's get of k1: %v; want v1 at LSN %d", g, p1.GetLsn())
	}
	for id, field := range map[uint64]string{4: "key", 6: "policy.durability"} {
		e := got[id].GetError()
		if codes.Code(e.GetCode()) != codes.InvalidArgument || !strings.Contains(e.GetMessage(), field) {
			t.Errorf("operation %d: %v; want INVALID_ARGUMENT naming %s", id, got[id], field)
		}
	}
	reads := got[5].GetTxn().GetResults()
	if len(reads) != 2 || reads[0].GetGet().GetFound() || string(reads[1].GetGet().GetValue()) != "v2" {
		t.Fatalf("the reading Txn after the group's writes: %v; want k1 gone, k2 = v2", got[5])
	}
	for k, want := range map[string]string{"k1": "", "k2": "v2", "k3": ""} {
		g, err := r.kv.Get(c, &walshipv1.GetRequest{Key: k})
		if err != nil || g.GetFound() != (want != "") || string(g.GetValue()) != want {
			t.Errorf("Get %s: %v, %v; want %q", k, g, err, want)
		}
	}
}

// startPipeline starts a primary with cfg, commits one Put ("before")
// and opens a Pipeline stream to it.
func startPipeline(t *testing.T, cfg Config) (*running, walshipv1.KVService_PipelineClient) {
	t.Helper()
	r := start(t, cfg)
	c := ctx(t)
	if _, err := r.kv.Put(c, &walshipv1.PutRequest{Key: "before", Value: []byte("v")}); err != nil {
		t.Fatal(err)
	}
	s, err := r.kv.Pipeline(c)
	if err != nil {
		t.Fatal(err)
	}
	return r, s
}

// heldPipeline starts a primary on a MemFS, commits one Put, opens a
// Pipeline stream and holds the WAL's next fsync: entered is closed once
// it begins, release lets it go.
func heldPipeline(t *testing.T) (s walshipv1.KVService_PipelineClient, entered <-chan struct{}, release func()) {
	t.Helper()
	mem := vfs.NewMem()
	cfg := testConfig(t, "/data")
	cfg.FS = mem
	_, s = startPipeline(t, cfg)
	entered, release = mem.HoldNextSync(".wal")
	t.Cleanup(release)
	return s, entered, release
}

// TestPipelineGroupAnswersEachWhenDone: a group's async Put is answered
// while the fsync of the sync Put after it in the same message is still
// held; the sync Put is answered once it is released. A group waits for
// each write's own wait only, not for the slowest of its writes.
func TestPipelineGroupAnswersEachWhenDone(t *testing.T) {
	s, entered, release := heldPipeline(t)
	defer release()
	msg := pipeOp(1, &walshipv1.PutRequest{Key: "async", Value: []byte("a"), Policy: &walshipv1.CommitPolicy{Durability: walshipv1.Durability_DURABILITY_ASYNC}})
	msg.More = []*walshipv1.PipelineRequest{
		pipeOp(2, &walshipv1.PutRequest{Key: "sync", Value: []byte("s"), Policy: &walshipv1.CommitPolicy{Durability: walshipv1.Durability_DURABILITY_SYNC}}),
	}
	if err := s.Send(msg); err != nil {
		t.Fatal(err)
	}
	<-entered
	a, err := s.Recv()
	if err != nil || a.GetId() != 1 || a.GetPut().GetLsn() == 0 {
		t.Fatalf("first answer, the sync Put's fsync held: %v, %v; want the async Put's", a, err)
	}
	release()
	a, err = s.Recv()
	if err != nil || a.GetId() != 2 || a.GetPut().GetLsn() <= 0 {
		t.Fatalf("second answer: %v, %v; want the sync Put's", a, err)
	}
}

// TestPipelineGroupAnswersFailuresAtOnce: a write of a group that fails
// before it is sequenced (here an empty key) is answered at once, with
// the unary call's error, while an earlier write of the same message
// still waits for its fsync; that one is answered once it is released.
func TestPipelineGroupAnswersFailuresAtOnce(t *testing.T) {
	s, entered, release := heldPipeline(t)
	defer release()
	msg := pipeOp(1, &walshipv1.PutRequest{Key: "sync", Value: []byte("s"), Policy: &walshipv1.CommitPolicy{Durability: walshipv1.Durability_DURABILITY_SYNC}})
	msg.More = []*walshipv1.PipelineRequest{pipeOp(2, &walshipv1.PutRequest{Key: "", Value: []byte("x")})}
	if err := s.Send(msg); err != nil {
		t.Fatal(err)
	}
	<-entered
	a, err := s.Recv()
	if err != nil || a.GetId() != 2 || codes.Code(a.GetError().GetCode()) != codes.InvalidArgument {
		t.Fatalf("first answer, the sync Put's fsync held: %v, %v; want the empty key's INVALID_ARGUMENT", a, err)
	}
	release()
	a, err = s.Recv()
	if err != nil || a.GetId() != 1 || a.GetPut().GetLsn() == 0 {
		t.Fatalf("second answer: %v, %v; want the sync Put's", a, err)
	}
}
