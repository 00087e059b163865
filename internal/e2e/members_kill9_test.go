package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	walshipv1 "github.com/walship/walship/gen/walship/v1"
	"github.com/walship/walship/internal/failover"
	"github.com/walship/walship/internal/testkit"
)

// Issue 38's "kill -9 the primary in the middle of each change", the
// stages TestMembershipChangeKill9 and TestLogStoreRemovalKill9 leave out:
// a data node's and a log store's add at its learner and at its joint
// stage, a log store's replacement at its joint stage. Each stage is
// reached without a race by what the change waits for:
//
//   - the learner record waits for sync_replicas of the members: with the
//     primary's replicas paused (SIGSTOP) it stays unacknowledged, the
//     change held at its learner stage;
//   - the learner stage then waits for the learner to catch up: with the
//     learner killed (its stream down) it stays there once the replicas
//     are resumed and have acknowledged the learner record;
//   - the joint record waits for sync_replicas of C_old too: with the
//     replicas paused again and the learner restarted, the learner
//     catches up and the joint record is written, on every log store, but
//     no replica of C_old acknowledges it (an added data node's ack
//     counts for C_new only): the change is held at its joint stage.

// changeAt is a membership change run by `walship ctl members` against a
// primary, held at one of its stages.
type changeAt struct {
	t        *testing.T
	ctx      context.Context
	primary  *procNode
	replicas []*procNode // the primary's replicas, paused while they must not acknowledge
	learner  *procNode   // the data node or log store the change adds
	id       string      // the learner's id in the membership: a node id, a log store's address
	before   int         // the primary's change records logged before this change
	admin    walshipv1.AdminServiceClient
	wait     func() string
}

// startChangeAtLearner pauses the replicas, starts `walship ctl members
// args...` at the primary, and returns once the primary has the learner
// record in force (the learner was probed before it): the record cannot
// be acknowledged while the replicas are paused.
func startChangeAtLearner(t *testing.T, ctx context.Context, primary *procNode, replicas []*procNode, learner *procNode, id string, args ...string) *changeAt {
	t.Helper()
	c := &changeAt{t: t, ctx: ctx, primary: primary, replicas: replicas, learner: learner, id: id, before: len(changeRecords(primary.p, "")),
		admin: walshipv1.NewAdminServiceClient(conn(t, primary.addr))}
	for _, r := range replicas {
		r.p.pause()
	}
	cmd := exec.Command(walshipBin(t), append(append([]string{"ctl", "members"}, args...), "--nodes", primary.addr, "--timeout", "2m")...)
	var out strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = cmd.Wait()
	}()
	t.Cleanup(func() { _ = cmd.Process.Kill(); <-done })
	c.wait = func() string { <-done; return out.String() }
	testkit.UntilWithin(t, 30*time.Second, fmt.Sprintf("%s to be a learner at %s", id, primary.name), func() bool {
		select {
		case <-done:
			t.Fatalf("walship ctl members %s ended before its learner stage:\n%s", strings.Join(args, " "), out.String())
		default:
		}
		m := c.member()
		return m != nil && m.GetVoice() == walshipv1.MemberVoice_MEMBER_VOICE_LEARNER
	})
	return c
}

// membership is the primary's ListMembers answer (nil if it gives none).
func (c *changeAt) membership() *walshipv1.MembershipStatus {
	cctx, cancel := context.WithTimeout(c.ctx, 2*time.Second)
	defer cancel()
	resp, err := c.admin.ListMembers(cctx, &walshipv1.ListMembersRequest{})
	if err != nil {
		return nil
	}
	return resp.GetMembership()
}

// member is the learner's row in the primary's membership (nil if none).
func (c *changeAt) member() *walshipv1.MemberStatus {
	for _, m := range c.membership().GetMembers() {
		if m.GetId() == c.id {
			return m
		}
	}
	return nil
}

// record waits until the primary has logged writing the record of stage
// of this change, and returns its LSN.
func (c *changeAt) record(stage string) uint64 {
	c.t.Helper()
	var lsn uint64
	testkit.UntilWithin(c.t, 30*time.Second, fmt.Sprintf("%s to write the %s record", c.primary.name, stage), func() bool {
		recs := changeRecords(c.primary.p, "")
		for _, r := range recs[min(c.before, len(recs)):] {
			if r.stage == stage {
				lsn = r.lsn
				return true
			}
		}
		return false
	})
	return lsn
}

// toJoint takes the change from its learner stage to its joint stage: the
// learner is killed (its stream down, it cannot catch up), the replicas
// resume and acknowledge the learner record, are paused again, and the
// learner restarts, catches up and gets the joint record written; it
// returns the joint record's LSN once every log store the primary ships to
// has it durable, the replicas still paused.
func (c *changeAt) toJoint() uint64 {
	c.t.Helper()
	c.learner.p.kill()
	testkit.UntilWithin(c.t, 30*time.Second, c.id+"'s stream from "+c.primary.name+" to be down", func() bool {
		m := c.member()
		return m != nil && !m.GetConnected()
	})
	for _, r := range c.replicas {
		r.p.signal(syscall.SIGCONT)
	}
	learnerLSN := c.record("learner")
	// Acknowledged as the primary sees it: sync_replicas (1) of the
	// members and a majority of the log stores.
	testkit.UntilWithin(c.t, 30*time.Second, fmt.Sprintf("%s to hear the learner record at LSN %d acknowledged", c.primary.name, learnerLSN), func() bool {
		var replicas, stores, voters int
		for _, m := range c.membership().GetMembers() {
			switch {
			case m.GetVoice() != walshipv1.MemberVoice_MEMBER_VOICE_VOTER:
			case m.GetRole() == walshipv1.Role_ROLE_LOGSTORE:
				voters++
				if m.GetReachedLsn() >= learnerLSN {
					stores++
				}
			case m.GetRole() == walshipv1.Role_ROLE_REPLICA && m.GetReachedLsn() >= learnerLSN:
				replicas++
			}
		}
		return replicas >= 1 && stores >= failover.Majority(voters)
	})
	if st := c.membership().GetStage(); st != walshipv1.MembershipStage_MEMBERSHIP_STAGE_LEARNER {
		c.t.Fatalf("%s with %s down: stage %v, want still the learner stage", c.primary.name, c.id, st)
	}
	for _, r := range c.replicas {
		r.p.pause()
	}
	c.learner.start()
	joint := c.record("joint")
	testkit.UntilWithin(c.t, 30*time.Second, fmt.Sprintf("every log store %s ships to to hold the joint record at LSN %d", c.primary.name, joint), func() bool {
		ms := c.membership()
		for _, m := range ms.GetMembers() {
			if m.GetRole() == walshipv1.Role_ROLE_LOGSTORE && m.GetConnected() && m.GetReachedLsn() < joint {
				return false
			}
		}
		return ms != nil
	})
	if st := c.membership().GetStage(); st != walshipv1.MembershipStage_MEMBERSHIP_STAGE_JOINT {
		c.t.Fatalf("%s with C_old's replicas paused: stage %v, want the joint stage", c.primary.name, st)
	}
	return joint
}

// killPrimary kills the primary (kill -9), resumes the replicas, promotes
// next with `walship ctl promote`, and returns the change command's
// output.
func (c *changeAt) killPrimary(next *procNode) string {
	c.t.Helper()
	c.primary.p.kill()
	out := c.wait()
	c.t.Logf("ctl members, whose primary was killed:\n%s", out)
	for _, r := range c.replicas {
		r.p.signal(syscall.SIGCONT)
	}
	c.t.Logf("ctl promote %s:\n%s", next.name, ctl(c.t, "promote", "--node", next.addr, "--wait", "30s"))
	return out
}

// changeRecord is a membership change record a primary logged writing.
type changeRecord struct {
	stage string
	lsn   uint64
}

// changeRecords are the membership change records p has logged writing,
// oldest first (of stage only, unless "").
func changeRecords(p *proc, stage string) []changeRecord {
	var out []changeRecord
	for _, line := range strings.Split(p.logs(), "\n") {
		var rec struct {
			Msg   string `json:"msg"`
			Stage string `json:"stage"`
			LSN   uint64 `json:"lsn"`
		}
		if json.Unmarshal([]byte(line), &rec) == nil && rec.Msg == "membership change record written" && (stage == "" || rec.Stage == stage) {
			out = append(out, changeRecord{rec.Stage, rec.LSN})
		}
	}
	return out
}

// stagesOf are the stages of recs.
func stagesOf(recs []changeRecord) []string {
	var out []string
	for _, r := range recs {
		out = append(out, r.stage)
	}
	return out
}

// settledMembers waits until the primary at addr has no change in
// progress and returns its `walship ctl members list`.
func settledMembers(t *testing.T, addr string) string {
	t.Helper()
	var out string
	testkit.UntilWithin(t, time.Minute, "the primary at "+addr+" to have no change in progress", func() bool {
		o, err := exec.Command(walshipBin(t), "ctl", "members", "list", "--nodes", addr).CombinedOutput()
		out = string(o)
		return err == nil && strings.Contains(out, "no change in progress")
	})
	return out
}

// newReplica lays out a data node id that is no member (its --peers name
// it, as a node started to be added does), started.
func newReplica(t *testing.T, template *procNode, id string) *procNode {
	n := &procNode{name: id, serving: "replica serving", addr: testkit.FreeAddr(t), t: t}
	n.args = slices.Clone(template.args)
	setFlag(n.args, "--id", id)
	setFlag(n.args, "--listen", n.addr)
	setFlag(n.args, "--data-dir", filepath.Join(t.TempDir(), id))
	setFlag(n.args, "--peers", flagValue(template.args, "--peers")+","+id+"="+n.addr)
	n.start()
	return n
}

// newLogStore starts an empty log store name whose --peers are the
// cluster's log stores and itself, so that it refills their log.
func newLogStore(t *testing.T, c *failoverCluster, name string) *procNode {
	addr := testkit.FreeAddr(t)
	n := &procNode{name: name, serving: "log store serving", addr: addr, t: t, args: []string{"logstore",
		"--listen", addr, "--metrics-listen", "", "--data-dir", filepath.Join(t.TempDir(), name), "--peers", c.logstoreAddrs() + "," + addr}}
	n.start()
	return n
}

// TestMemberAddKill9: under load checked for linearizability, on the
// failover cluster (members n0, n1, n2; any 1 at flush and a log store
// majority), with n3 running as a replica that is no member:
//
//  1. `walship ctl members add n3` at n0 is held at its learner stage (n1
//     and n2 paused); a second change meanwhile (`ctl members remove n2`)
//     is refused saying one is in progress; n0 is killed (kill -9), n1 and
//     n2 resume, and n1 is promoted: the change is abandoned (a learner
//     stage a failover interrupts is), the members are n0, n1, n2 and no
//     change is in progress;
//  2. adding n3 again, at n1, gets through its learner stage and is held at
//     its joint record (n0 and n2 paused); n1 is killed and n2 promoted:
//     the change is finished or rolled back — the members exactly
//     n0, n1, n2, n3 or n0, n1, n2 — and, rolled back, adding n3 once more
//     works;
//  3. n0, killed, is removed while down; with n1 paused, a sync write is
//     acknowledged by n3 alone: it counts for sync_replicas.
//
// Every acknowledged write is read back, the history is linearizable,
// and n1 and n3 converge on n2.
func TestMemberAddKill9(t *testing.T) {
	needLinux(t)
	c := startFailoverCluster(t)
	n0, n1, n2 := c.nodes[0], c.nodes[1], c.nodes[2]
	n3 := newReplica(t, n1, "n3")
	_, ctx, h, finish := loadOn(t, c, "member-add-kill9/", 4*time.Minute, 12*time.Second)
	<-time.After(time.Second)

	h.Note("pause n1 and n2; add n3")
	add := startChangeAtLearner(t, ctx, n0, []*procNode{n1, n2}, n3, "n3", "add", "--member", "n3="+n3.addr)
	out, err := exec.Command(walshipBin(t), "ctl", "members", "remove", "--member", "n2", "--nodes", n0.addr).CombinedOutput()
	t.Logf("ctl members remove n2 while n3 is a learner: %v\n%s", err, out)
	if err == nil || !strings.Contains(string(out), "a membership change is in progress") || !strings.Contains(string(out), "one change at a time") {
		t.Fatalf("a second change while one is in progress: %v\n%s\nwant it refused, saying one is in progress", err, out)
	}
	h.Note("kill -9 n0 (the primary) in the learner stage")
	add.killPrimary(n1)
	h.Note("n1 promoted")
	if list := settledMembers(t, n1.addr); !strings.Contains(list, "members n0, n1, n2;") || strings.Contains(list, "learners") {
		t.Fatalf("after a failover in the learner stage, want the change abandoned (members n0, n1, n2, no learner):\n%s", list)
	}
	n0.serving = "replica serving"
	n0.start()

	h.Note("pause n0 and n2; add n3 again")
	add = startChangeAtLearner(t, ctx, n1, []*procNode{n0, n2}, n3, "n3", "add", "--member", "n3="+n3.addr)
	add.toJoint()
	h.Note("kill -9 n1 (the primary) in the joint stage")
	add.killPrimary(n2)
	h.Note("n2 promoted")
	list := settledMembers(t, n2.addr)
	t.Logf("ctl members list after the failover:\n%s", list)
	switch {
	case strings.Contains(list, "members n0, n1, n2, n3;"):
		t.Log("the new primary finished the change")
	case strings.Contains(list, "members n0, n1, n2;"):
		t.Log("the new primary rolled the change back: adding n3 once more")
		t.Logf("ctl members add n3:\n%s", ctl(t, "members", "add", "--member", "n3="+n3.addr, "--nodes", n2.addr))
		if list := settledMembers(t, n2.addr); !strings.Contains(list, "members n0, n1, n2, n3;") {
			t.Fatalf("after adding n3 once more:\n%s", list)
		}
	default:
		t.Fatalf("after a failover in the joint stage, neither C_new nor C_old:\n%s", list)
	}
	n1.serving = "replica serving"
	n1.start()

	h.Note("kill -9 n0 (a replica); remove it")
	n0.p.kill()
	t.Logf("ctl members remove n0, down:\n%s", ctl(t, "members", "remove", "--member", "n0", "--nodes", n2.addr))
	if list := settledMembers(t, n2.addr); !strings.Contains(list, "members n1, n2, n3;") {
		t.Fatalf("after removing n0:\n%s", list)
	}
	// n3 counts for sync_replicas: with n1 paused, it alone acknowledges.
	h.Note("pause n1; a sync write n3 alone acknowledges")
	n1.p.pause()
	if _, err := walshipv1.NewKVServiceClient(conn(t, n2.addr)).Put(ctx, &walshipv1.PutRequest{Key: "counts/n3", Value: []byte("x")}); err != nil {
		t.Fatalf("a sync write (any 1 at flush) with n1 paused, n3 a member: %v", err)
	}
	n1.p.signal(syscall.SIGCONT)
	finish()
	converge(t, ctx, n2.addr, n1.addr, n3.addr)
}

// TestLogStoreAddKill9: under load checked for linearizability, on the
// failover cluster (log stores ls0, ls1, ls2), with `walship ctl members`,
// each primary killed (kill -9) in the middle of a change and the next
// node promoted:
//
//  1. `add --logstore ls3` (empty, refilling from the others) at n0 is
//     held at its learner stage (n1 and n2 paused); n0 is killed and n1
//     promoted: the change is abandoned (the log stores ls0, ls1, ls2, no
//     learner, no change record);
//  2. adding ls3 again, at n1, is held at its joint record (C_old's
//     replicas, n0 and n2, paused); n1 is killed and n2 promoted. Its log
//     ends in the joint record and ls3 is up: it finishes the change (a
//     final record; the log stores exactly ls0, ls1, ls2, ls3);
//  3. ls2 is killed, and `replace --logstore ls2=ls5` (ls5 empty, at a new
//     address) at n2 is held at its joint record (n0 and n1 paused); ls5
//     is killed, then n2, and n0 promoted. ls5 does not connect within the
//     grace (10 s): n0 rolls the change back through a joint record to
//     exactly C_old (ls2 still named, dead); ls5 restarted, replacing ls2
//     with it again works.
//
// Every acknowledged write is read back, the history is linearizable, and
// n1 and n2 converge on n0.
func TestLogStoreAddKill9(t *testing.T) {
	needLinux(t)
	c := startFailoverCluster(t)
	n0, n1, n2 := c.nodes[0], c.nodes[1], c.nodes[2]
	ls0, ls1, ls2 := c.logstores[0].addr, c.logstores[1].addr, c.logstores[2].addr
	ls3, ls5 := newLogStore(t, c, "ls3"), newLogStore(t, c, "ls5")
	_, ctx, h, finish := loadOn(t, c, "logstore-add-kill9/", 4*time.Minute, 25*time.Second)
	<-time.After(time.Second)
	stores := func(addrs ...string) string { return fmt.Sprintf("; log stores %s;", strings.Join(addrs, ", ")) }
	// restart brings a killed primary back; it rejoins as a replica.
	restart := func(n *procNode) {
		n.serving = "replica serving"
		n.start()
	}

	h.Note("pause n1 and n2; add ls3")
	add := startChangeAtLearner(t, ctx, n0, []*procNode{n1, n2}, ls3, ls3.addr, "add", "--logstore", ls3.addr)
	h.Note("kill -9 n0 (the primary) in the learner stage")
	add.killPrimary(n1)
	h.Note("n1 promoted")
	list := settledMembers(t, n1.addr)
	t.Logf("ctl members list after the failover:\n%s", list)
	if !strings.Contains(list, stores(ls0, ls1, ls2)) || strings.Contains(list, "learners") || len(changeRecords(n1.p, "")) > 0 {
		t.Fatalf("after a failover in the learner stage of adding ls3, want it abandoned (records %v):\n%s", changeRecords(n1.p, ""), list)
	}
	restart(n0)

	h.Note("pause n0 and n2; add ls3 again")
	add = startChangeAtLearner(t, ctx, n1, []*procNode{n0, n2}, ls3, ls3.addr, "add", "--logstore", ls3.addr)
	add.toJoint()
	h.Note("kill -9 n1 (the primary) in the joint stage")
	add.killPrimary(n2)
	h.Note("n2 promoted")
	list = settledMembers(t, n2.addr)
	t.Logf("ctl members list after the failover:\n%s", list)
	if !strings.Contains(list, stores(ls0, ls1, ls2, ls3.addr)) || !slices.Equal(stagesOf(changeRecords(n2.p, "")), []string{"final"}) {
		t.Fatalf("after a failover in the joint stage of adding ls3, which is up, want it finished (records %v):\n%s", changeRecords(n2.p, ""), list)
	}
	restart(n1)

	h.Note("kill -9 ls2; pause n0 and n1; replace ls2 with ls5")
	c.logstores[2].p.kill()
	replace := startChangeAtLearner(t, ctx, n2, []*procNode{n0, n1}, ls5, ls5.addr, "replace", "--logstore", ls2+"="+ls5.addr)
	replace.toJoint()
	h.Note("kill -9 ls5, then n2 (the primary) in the joint stage")
	ls5.p.kill()
	replace.killPrimary(n0)
	h.Note("n0 promoted")
	list = settledMembers(t, n0.addr)
	t.Logf("ctl members list after the failover:\n%s", list)
	if !strings.Contains(list, stores(ls0, ls1, ls2, ls3.addr)) || !slices.Equal(stagesOf(changeRecords(n0.p, "")), []string{"rollback_joint", "rolled_back"}) {
		t.Fatalf("after a failover in the joint stage of replacing ls2 with ls5, which is down, want it rolled back through a joint record (records %v):\n%s",
			changeRecords(n0.p, ""), list)
	}
	h.Note("restart ls5; replace ls2 with it again")
	ls5.start()
	t.Logf("ctl members replace --logstore ls2=ls5:\n%s", ctl(t, "members", "replace", "--logstore", ls2+"="+ls5.addr, "--nodes", n0.addr))
	if list := settledMembers(t, n0.addr); !strings.Contains(list, stores(ls0, ls1, ls5.addr, ls3.addr)) {
		t.Fatalf("after replacing ls2 with ls5 again:\n%s", list)
	}
	restart(n2)
	finish()
	converge(t, ctx, n0.addr, n1.addr, n2.addr)
}
