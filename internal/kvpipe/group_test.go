package kvpipe_test

import (
	"context"
	"slices"
	"sync"
	"testing"
	"time"

	walshipv1 "github.com/walship/walship/gen/walship/v1"
	"github.com/walship/walship/internal/kvpipe"
	"github.com/walship/walship/internal/testkit"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
)

// grouper is fake as a kvpipe.Grouper: RunWrites runs every write at
// once (each on fake's own handler, as a primary sequences them all
// before it waits) and gives their answers in order, each once it and
// those before it are done; groups records the ids of each group.
type grouper struct {
	*fake
	mu     sync.Mutex
	groups [][]uint64
}

func (g *grouper) RunWrites(ws []kvpipe.Write, done func(int, proto.Message, error)) {
	ids := make([]uint64, len(ws))
	type answer struct {
		resp proto.Message
		err  error
	}
	answers := make([]chan answer, len(ws))
	for i, w := range ws {
		ids[i] = w.Req.GetId()
		answers[i] = make(chan answer, 1)
		go func() {
			var a answer
			switch x := w.Req.GetOp().(type) {
			case *walshipv1.PipelineRequest_Put:
				a.resp, a.err = g.Put(w.Ctx, x.Put)
			case *walshipv1.PipelineRequest_Delete:
				a.resp, a.err = g.Delete(w.Ctx, x.Delete)
			case *walshipv1.PipelineRequest_Txn:
				a.resp, a.err = g.Txn(w.Ctx, x.Txn)
			}
			answers[i] <- a
		}()
	}
	g.mu.Lock()
	g.groups = append(g.groups, ids)
	g.mu.Unlock()
	for i := range ws {
		a := <-answers[i]
		done(i, a.resp, a.err)
	}
}

func (g *grouper) Pipeline(stream walshipv1.KVService_PipelineServer) error {
	return kvpipe.Serve(stream, g, kvpipe.Limits{MaxOps: g.maxOps})
}

func (g *grouper) seen() [][]uint64 {
	g.mu.Lock()
	defer g.mu.Unlock()
	return slices.Clone(g.groups)
}

// openStream serves g and opens a Pipeline stream to it.
func openStream(t *testing.T, g *grouper) walshipv1.KVService_PipelineClient {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	s, err := serveWith(t, g).Pipeline(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// answers reads s's answers until it ends, by id; an id answered twice
// fails t.
func answers(t *testing.T, s walshipv1.KVService_PipelineClient) map[uint64]*walshipv1.PipelineResponse {
	t.Helper()
	got := map[uint64]*walshipv1.PipelineResponse{}
	for {
		r, err := s.Recv()
		if err != nil {
			return got
		}
		for _, a := range flatten(r) {
			if got[a.GetId()] != nil {
				t.Errorf("operation %d answered twice: %v, %v", a.GetId(), got[a.GetId()], a)
			}
			got[a.GetId()] = a
		}
	}
}

// TestServeGroupsAMessagesWrites: for a Grouper, the Puts, Deletes and
// Txns of one message go to one RunWrites, in the message's order; a
// Get, and an operation whose timeout is not valid, are answered as
// they would be alone; each operation is answered once, by its id, with
// its handler's answer. A message of one write runs as a unary call.
func TestServeGroupsAMessagesWrites(t *testing.T) {
	g := &grouper{fake: &fake{}}
	s := openStream(t, g)
	msg := putReq(1, "a")
	msg.More = []*walshipv1.PipelineRequest{
		{Id: 2, Op: &walshipv1.PipelineRequest_Get{Get: &walshipv1.GetRequest{Key: "a"}}},
		putReq(3, "b"),
		{Id: 4, Op: &walshipv1.PipelineRequest_Put{Put: &walshipv1.PutRequest{Key: "c"}}, Timeout: durationpb.New(-time.Second)},
		{Id: 5, Op: &walshipv1.PipelineRequest_Delete{Delete: &walshipv1.DeleteRequest{Key: "a"}}},
		{Id: 6, Op: &walshipv1.PipelineRequest_Put{Put: &walshipv1.PutRequest{Key: "d"}}, Timeout: durationpb.New(time.Hour)},
	}
	if err := s.Send(msg); err != nil {
		t.Fatal(err)
	}
	if err := s.Send(putReq(7, "alone")); err != nil {
		t.Fatal(err)
	}
	if err := s.CloseSend(); err != nil {
		t.Fatal(err)
	}
	got := answers(t, s)
	want := map[uint64]codes.Code{1: codes.OK, 2: codes.Unimplemented, 3: codes.OK, 4: codes.InvalidArgument, 5: codes.Unavailable, 6: codes.OK, 7: codes.OK}
	for id, code := range want {
		a := got[id]
		if a == nil {
			t.Errorf("operation %d not answered", id)
			continue
		}
		if c := codes.Code(a.GetError().GetCode()); c != code {
			t.Errorf("operation %d: %v; want %v", id, a, code)
		}
		if code == codes.OK && a.GetPut().GetLsn() == 0 {
			t.Errorf("operation %d: %v; want a Put's answer", id, a)
		}
	}
	if len(got) != len(want) {
		t.Errorf("%d answers; want %d", len(got), len(want))
	}
	if groups := g.seen(); !slices.EqualFunc(groups, [][]uint64{{1, 3, 5, 6}}, slices.Equal) {
		t.Errorf("groups %v; want the message's writes, in order, in one: [[1 3 5 6]]", groups)
	}
}

// TestServeGroupGivenUp: a write of a group whose timeout passes, or
// that the client cancels, is answered then (DEADLINE_EXCEEDED,
// CANCELED) while its group runs on; the others of the group are
// answered once their handler is done.
func TestServeGroupGivenUp(t *testing.T) {
	g := &grouper{fake: &fake{release: make(chan struct{})}}
	s := openStream(t, g)
	msg := &walshipv1.PipelineRequest{Id: 1, Op: &walshipv1.PipelineRequest_Put{Put: &walshipv1.PutRequest{Key: "slow/1"}}, Timeout: durationpb.New(50 * time.Millisecond)}
	msg.More = []*walshipv1.PipelineRequest{putReq(2, "slow/2"), putReq(3, "slow/3")}
	if err := s.Send(msg); err != nil {
		t.Fatal(err)
	}
	testkit.Until(t, "the group's three writes running", func() bool { return g.running.Load() == 3 })
	if err := s.Send(&walshipv1.PipelineRequest{Id: 2, Op: &walshipv1.PipelineRequest_Cancel{Cancel: &walshipv1.PipelineCancel{}}}); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		a, err := s.Recv()
		if err != nil {
			t.Fatal(err)
		}
		switch c := codes.Code(a.GetError().GetCode()); {
		case a.GetId() == 1 && c == codes.DeadlineExceeded, a.GetId() == 2 && c == codes.Canceled:
		default:
			t.Fatalf("answer %v while the group runs; want 1 DEADLINE_EXCEEDED and 2 CANCELED", a)
		}
	}
	// Once the two given up have returned (their contexts ended), the
	// one release goes to slow/3: sent before, either might take it.
	testkit.Until(t, "the two given up to return", func() bool { return g.running.Load() == 1 })
	g.release <- struct{}{}
	if err := s.CloseSend(); err != nil {
		t.Fatal(err)
	}
	got := answers(t, s)
	if a := got[3]; len(got) != 1 || a.GetPut().GetLsn() == 0 {
		t.Fatalf("answers %v after the two given up; want operation 3's Put", got)
	}
}

// TestServeGroupsWithinMaxOps: a message of more writes than maxOps is
// run in groups of at most maxOps, each write once, never more at once;
// every one is answered.
func TestServeGroupsWithinMaxOps(t *testing.T) {
	g := &grouper{fake: &fake{maxOps: 2, release: make(chan struct{})}}
	s := openStream(t, g)
	msg := putReq(1, "slow/1")
	for id := uint64(2); id <= 5; id++ {
		msg.More = append(msg.More, putReq(id, "slow/x"))
	}
	if err := s.Send(msg); err != nil {
		t.Fatal(err)
	}
	if err := s.CloseSend(); err != nil {
		t.Fatal(err)
	}
	testkit.Until(t, "two writes held", func() bool { return g.running.Load() == 2 })
	go func() {
		for range 5 {
			g.release <- struct{}{}
		}
	}()
	got := answers(t, s)
	for id := uint64(1); id <= 5; id++ {
		if got[id].GetPut().GetLsn() == 0 {
			t.Errorf("operation %d: %v; want a Put's answer", id, got[id])
		}
	}
	if m := g.maxSeen.Load(); m != 2 {
		t.Errorf("%d writes ran at once; want at most (and here exactly) 2", m)
	}
	var ran []uint64
	for _, grp := range g.seen() {
		if len(grp) > 2 {
			t.Errorf("a group of %v; want at most 2", grp)
		}
		ran = append(ran, grp...)
	}
	if len(ran) < 2 || !slices.IsSorted(ran) {
		t.Errorf("grouped %v; want the first two at least, each once, in order", ran)
	}
}
