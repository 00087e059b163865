package primary

import (
	"context"
	"testing"

	walshipv1 "github.com/walship/walship/gen/walship/v1"
	"github.com/walship/walship/internal/testkit"
)

func members(ids ...string) []*walshipv1.Member {
	out := make([]*walshipv1.Member, 0, len(ids))
	for _, id := range ids {
		out = append(out, &walshipv1.Member{Id: id, Addr: id + ":1"})
	}
	return out
}

// TestJointAckRule: under a joint contract a commit needs k of each half's
// members (the primary excluded) and a log store majority of each half;
// learners count for nothing, and the rule follows the newest contract
// put in force — a commit waiting under C_old is released only once the
// joint rule holds when the joint record comes in the meantime.
func TestJointAckRule(t *testing.T) {
	flush := waitClass{level: walshipv1.SyncLevel_SYNC_LEVEL_FLUSH, k: 1}
	old := &walshipv1.Contract{SyncReplicas: 1, Members: members("p", "a", "b"), Logstores: []string{"l1", "l2", "l3"}, Learners: members("c")}
	jointC := &walshipv1.Contract{SyncReplicas: 1, Members: members("p", "a", "b"), Logstores: []string{"l1", "l2", "l3"},
		Next: &walshipv1.Configuration{SyncReplicas: 1, Members: members("p", "b", "c"), Logstores: []string{"l3", "l4", "l5"}}}
	p := newPeers()
	p.quorum = 2
	for _, l := range []string{"l1", "l2", "l3", "l4", "l5"} {
		p.logstores[l] = &logstorePos{addr: l}
	}
	p.setRule(ruleOf(old, "p"))
	ack := func(id string, lsn uint64) {
		p.updateReplica(id, func(r *replicaPos) { r.connected, r.written, r.flushed = true, lsn, lsn })
	}
	durable := func(addr string, lsn uint64) { p.updateLogStore(addr, func(l *logstorePos) { l.durable = lsn }) }
	quorum := func() (uint64, uint64) {
		p.mu.Lock()
		defer p.mu.Unlock()
		return p.replicaQuorumLocked(flush), p.logStoreQuorumLocked()
	}

	ack("c", 10) // a learner
	if r, _ := quorum(); r != 0 {
		t.Fatalf("a learner's ack counted: replica quorum %d", r)
	}
	ack("a", 10)
	durable("l1", 10)
	durable("l2", 10)
	if r, l := quorum(); r != 10 || l != 10 {
		t.Fatalf("C_old: quorums %d, %d; want 10, 10", r, l)
	}

	// A commit at 20 waits under C_old; the joint record comes before a
	// itself acks it: a alone no longer releases it.
	done := make(chan error, 1)
	go func() { done <- p.waitReplicas(context.Background(), 20, flush) }()
	testkit.Until(t, "the commit to wait", func() bool { return p.waiting[walshipv1.SyncLevel_SYNC_LEVEL_FLUSH].Load() == 1 })
	p.setRule(ruleOf(jointC, "p"))
	if r, l := quorum(); r != 10 || l != 0 {
		t.Fatalf("joint, C_new's half unacked: quorums %d, %d; want 10 (c, a), 0 (no majority of l3..l5)", r, l)
	}
	ack("a", 20)
	select {
	case err := <-done:
		t.Fatalf("the commit returned (%v) with an ack of the old half alone", err)
	default:
	}
	ack("c", 20) // the new half
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	durable("l4", 10)
	if _, l := quorum(); l != 0 {
		t.Fatalf("joint: l3..l5 have one at 10; log store quorum %d, want 0", l)
	}
	durable("l3", 10)
	if _, l := quorum(); l != 10 {
		t.Fatalf("joint: majorities of both sets at 10; log store quorum %d", l)
	}
	// b is in both halves: it alone acknowledges under the joint rule.
	ack("b", 30)
	if r, _ := quorum(); r != 30 {
		t.Fatalf("b, a member of both halves, at 30: replica quorum %d", r)
	}
}
