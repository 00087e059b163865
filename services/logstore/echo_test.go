package logstore

import (
	"strings"
	"testing"
	"time"

	walshipv1 "github.com/walship/walship/gen/walship/v1"
	"github.com/walship/walship/internal/testkit"
	"github.com/walship/walship/internal/vfs"
)

// startStalled starts a log store on cfg whose first WAL fsync waits
// until release.
func startStalled(t *testing.T, cfg Config) (r *running, entered <-chan struct{}, release func()) {
	t.Helper()
	fs := vfs.NewMem()
	entered, release = fs.HoldNextSync(".wal")
	cfg.FS = fs
	r = start(t, cfg)
	// Registered after start's, so run before it: a test that fails while
	// the fsync is held must not leave Run waiting on it.
	t.Cleanup(release)
	return r, entered, release
}

func waitClosed(t *testing.T, ch <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(20 * time.Second):
		t.Fatalf("%s never happened", what)
	}
}

// TestHeartbeatEchoedDuringAStalledRound: while the writer's round is
// stuck in an fsync, the primary's next heartbeat is echoed at once — its
// lease does not hang on the log store's disk — with the durable LSN as it
// is (the batch is not durable yet); the batch's own ack follows the
// fsync.
func TestHeartbeatEchoedDuringAStalledRound(t *testing.T) {
	r, entered, release := startStalled(t, testConfig(t, "/data"))
	a := r.append(t)
	a.heartbeat(1)
	if ack := a.ack(); ack.Epoch != 1 {
		t.Fatalf("first heartbeat's ack = %v", ack)
	}
	b := chain(t, 1, 1, 1, 10)[0]
	a.send(b)
	waitClosed(t, entered, "the batch's fsync")
	sent := time.Now().UnixNano()
	a.sendOrEnded(&walshipv1.AppendRequest{Heartbeat: &walshipv1.Heartbeat{Epoch: 1, TimeUnixNano: sent, ReplyRequested: true}}, "heartbeat")
	ack := a.echoOf(sent) // before release: at once
	if ack.HeartbeatTimeUnixNano != sent || ack.DurableLsn >= b.LastLsn || ack.Epoch != 1 {
		t.Fatalf("ack during the stalled fsync = %v, want the heartbeat of %d echoed, durable below %d", ack, sent, b.LastLsn)
	}
	release()
	a.waitDurable(b.LastLsn)
}

// TestFenceCoversEarlyEchoes: a heartbeat echoed at once while a fence
// waits in the writer's queue renewed the old primary's lease after the
// last request the writer admitted; the fence's since_primary_contact must
// count from that echo, or the candidate would open while the old primary
// still holds its lease (Failover invariant 7).
func TestFenceCoversEarlyEchoes(t *testing.T) {
	r, entered, release := startStalled(t, testConfig(t, "/data"))
	a := r.append(t)
	a.heartbeat(1)
	a.ack()
	a.send(chain(t, 1, 1, 1, 10)[0])
	waitClosed(t, entered, "the batch's fsync")
	type fenced struct {
		resp *walshipv1.FenceResponse
		err  error
	}
	done := make(chan fenced, 1)
	go func() {
		resp, err := walshipv1.NewEpochServiceClient(r.conn).Fence(t.Context(), &walshipv1.FenceRequest{Epoch: 2, CandidateId: "c2", CandidateAddr: "c2:1"})
		done <- fenced{resp, err}
	}()
	// The fence is queued behind the stalled round before the heartbeat.
	testkit.UntilWithin(t, 20*time.Second, "the fence to be queued", func() bool {
		r.s.mu.Lock()
		defer r.s.mu.Unlock()
		for _, q := range r.s.w.queue {
			if q.fence != nil {
				return true
			}
		}
		return false
	})
	// Time passing is the condition here: a gap between the writer's
	// last admission and the heartbeat, so that a contact counted from the
	// former is seen to be too old.
	queued := time.Now()
	testkit.UntilWithin(t, 20*time.Second, "300 ms to pass", func() bool { return time.Since(queued) > 300*time.Millisecond })
	sent := time.Now()
	a.sendOrEnded(&walshipv1.AppendRequest{Heartbeat: &walshipv1.Heartbeat{Epoch: 1, TimeUnixNano: sent.UnixNano(), ReplyRequested: true}}, "heartbeat")
	if ack := a.echoOf(sent.UnixNano()); ack.HeartbeatTimeUnixNano != sent.UnixNano() {
		t.Fatalf("ack = %v, want the heartbeat echoed at once", ack)
	}
	release()
	var f fenced
	select {
	case f = <-done:
	case <-time.After(20 * time.Second):
		t.Fatal("the fence was never answered")
	}
	answered := time.Now()
	if f.err != nil || !f.resp.Granted {
		t.Fatalf("fence = %v, %v", f.resp, f.err)
	}
	// The contact the fence reports is no earlier than the echoed
	// heartbeat was sent (it was answered later).
	if contact := answered.Add(-f.resp.GetSincePrimaryContact().AsDuration()); contact.Before(sent) {
		t.Fatalf("the fence reports the primary's last contact %v before the heartbeat it echoed at once was sent", sent.Sub(contact))
	}
	// The old primary's stream is ended: its heartbeat, still queued, is
	// refused by the promise.
	if err := a.failure(); !strings.Contains(err.Error(), "epoch") {
		t.Fatalf("old primary's stream ended with %v", err)
	}
}
