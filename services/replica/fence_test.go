package replica

import (
	"io"
	"testing"

	walshipv1 "github.com/walship/walship/gen/walship/v1"
	"github.com/walship/walship/internal/datadir"
	"github.com/walship/walship/internal/vfs"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
)

// TestFenceFollowsTheCandidate: a fence of a newer epoch is promised
// durably and answered with the end of the replica's log; the stream from
// the old primary ends and the replica follows the candidate, whose
// hello-time epoch and catch-up batches of the old epoch it accepts; the
// same epoch for another candidate is refused naming the holder; the
// replica serves its log for a candidate's catch-up; a node that is not
// the primary and names one sends the replica there.
func TestFenceFollowsTheCandidate(t *testing.T) {
	dir := t.TempDir()
	old, candidate := newFakePrimary(t), newFakePrimary(t)
	r := start(t, testConfig(t, dir, old.addr))
	m := newModel(t)
	s := old.next(t)
	s.heartbeat(t, 1, 0, false)
	b1, b2 := m.txn(put("a", "1")), m.txn(put("b", "2"))
	s.send(t, b1, b2)
	r.waitApplied(t, b2.LastLsn)

	fence := walshipv1.NewEpochServiceClient(r.conn)
	resp, err := fence.Fence(tctx(t), &walshipv1.FenceRequest{Epoch: 2, CandidateId: "c1", CandidateAddr: candidate.addr})
	if err != nil {
		t.Fatal(err)
	}
	if !resp.Granted || resp.Epoch != 2 || resp.LastEpoch != 1 || resp.LastLsn != b2.LastLsn || resp.AppliedLsn != b2.LastLsn ||
		len(resp.History) != 1 || resp.History[0].Epoch != 1 || resp.Id != "r1" {
		t.Fatalf("fence = %v", resp)
	}
	if v, err := datadir.LoadVote(vfs.OS, dir); err != nil || v != (datadir.Vote{Epoch: 2, Primary: "c1", Addr: candidate.addr}) {
		t.Fatalf("vote after the fence: %v, %v", v, err)
	}
	// The same candidate again (a retry) gets the same answer; another is refused.
	if resp, err := fence.Fence(tctx(t), &walshipv1.FenceRequest{Epoch: 2, CandidateId: "c1", CandidateAddr: candidate.addr}); err != nil || !resp.Granted {
		t.Fatalf("retried fence = %v, %v", resp, err)
	}
	if resp, err := fence.Fence(tctx(t), &walshipv1.FenceRequest{Epoch: 2, CandidateId: "c2", CandidateAddr: "x:1"}); err != nil || resp.Granted || resp.PrimaryId != "c1" {
		t.Fatalf("fence of another candidate at epoch 2 = %v, %v", resp, err)
	}
	_, err = fence.Fence(tctx(t), &walshipv1.FenceRequest{Epoch: 3, CandidateId: "c1"})
	wantCode(t, "Fence", err, codes.InvalidArgument, "candidate_addr")

	// The candidate, now primary of epoch 2, ships the rest of epoch 1
	// (it had it, the replica did not) and its own.
	c := candidate.next(t)
	if c.hello.GetFencedEpoch() != 2 || c.hello.GetEpoch() != 1 || c.hello.GetNextLsn() != b2.LastLsn+1 {
		t.Fatalf("hello to the candidate: %v", c.hello)
	}
	c.heartbeat(t, 2, b2.LastLsn, false)
	b3 := m.txn(put("c", "3")) // epoch 1
	m.epoch = 2
	b4 := m.txn(put("d", "4"))
	c.send(t, b3, b4)
	r.waitApplied(t, b4.LastLsn)
	st := r.status(t)
	if st.VoteEpoch != 2 || st.Primary != candidate.addr || st.PrimaryId != "c1" || len(st.History) != 2 || st.History[1].FirstLsn != b4.FirstLsn {
		t.Fatalf("status: %v", st)
	}
	if st.StateDigest != m.digest() {
		t.Fatalf("digest %s, want %s", st.StateDigest, m.digest())
	}

	// The replica serves its log (for a candidate that lacks it).
	rd, err := walshipv1.NewLogStoreServiceClient(r.conn).Read(tctx(t), &walshipv1.ReadRequest{FromLsn: b2.FirstLsn, ToLsn: b3.LastLsn})
	if err != nil {
		t.Fatal(err)
	}
	var got []uint64
	for {
		m, err := rd.Recv()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, m.Batch.FirstLsn)
	}
	if len(got) != 2 || got[0] != b2.FirstLsn || got[1] != b3.FirstLsn {
		t.Fatalf("read the replica's log from %d to %d: batches at %v", b2.FirstLsn, b3.LastLsn, got)
	}
	// As a replication source it refuses, naming the primary.
	st2, err := walshipv1.NewReplicationServiceClient(r.conn).Stream(tctx(t))
	if err != nil {
		t.Fatal(err)
	}
	_, err = st2.Recv()
	if v, ok := primaryFrom(err); !ok || v.Addr != candidate.addr || v.Epoch != 2 {
		t.Fatalf("replication from the replica: %v (names %v)", err, v)
	}
}

// TestNotPrimaryNamesThePrimary: a replica pointed at a node that is not
// the primary follows the primary that node names.
func TestNotPrimaryNamesThePrimary(t *testing.T) {
	real := newFakePrimary(t)
	addr := listen(t, func(g *grpc.Server) {
		walshipv1.RegisterReplicationServiceServer(g, &notPrimary{vote: datadir.Vote{Epoch: 5, Primary: "p9", Addr: real.addr}})
	})
	dir := t.TempDir()
	start(t, testConfig(t, dir, addr))
	s := real.next(t)
	if s.hello.GetFencedEpoch() != 5 {
		t.Fatalf("hello to the named primary: %v", s.hello)
	}
	if v, err := datadir.LoadVote(vfs.OS, dir); err != nil || v.Epoch != 5 || v.Addr != real.addr {
		t.Fatalf("vote: %v, %v", v, err)
	}
}

type notPrimary struct {
	walshipv1.UnimplementedReplicationServiceServer
	vote datadir.Vote
}

func (n *notPrimary) Stream(grpc.BidiStreamingServer[walshipv1.StreamRequest, walshipv1.StreamResponse]) error {
	return NotPrimary("a replica", n.vote)
}
