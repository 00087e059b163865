package primary

import (
	"context"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	walshipv1 "github.com/walship/walship/gen/walship/v1"
	"github.com/walship/walship/internal/failover"
	"github.com/walship/walship/internal/testkit"
)

// TestAckReleasesOnlyTheCommitsItCovers: sync commits wait in LSN order per
// (stage, k), and an ack releases exactly those its positions cover — not
// later LSNs, not other stages, not commits that need more replicas.
func TestAckReleasesOnlyTheCommitsItCovers(t *testing.T) {
	const (
		flush = walshipv1.SyncLevel_SYNC_LEVEL_FLUSH
		apply = walshipv1.SyncLevel_SYNC_LEVEL_APPLY
	)
	p := newPeers()
	for _, id := range []string{"a", "b"} {
		p.updateReplica(id, func(r *replicaPos) { r.connected = true })
	}
	type wait struct {
		name  string
		lsn   uint64
		k     int
		level walshipv1.SyncLevel
	}
	waits := []wait{
		{"flush-1@30", 30, 1, flush}, {"flush-1@10", 10, 1, flush}, {"flush-1@20", 20, 1, flush},
		{"flush-2@10", 10, 2, flush}, {"apply-1@10", 10, 1, apply},
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	done := map[string]chan error{}
	for _, w := range waits {
		ch := make(chan error, 1)
		done[w.name] = ch
		go func() { ch <- p.waitReplicas(ctx, w.lsn, waitClass{level: w.level, k: w.k}) }()
	}
	queued := func() int {
		p.mu.Lock()
		defer p.mu.Unlock()
		n := 0
		for _, q := range p.replWaiters {
			n += len(*q)
		}
		return n
	}
	testkit.Until(t, "every commit to queue", func() bool { return queued() == len(waits) })
	// released checks which waits have returned (nil) once an update is
	// done: the release happens under the lock, inside the update.
	released := func(step string, want ...string) {
		t.Helper()
		for _, name := range want {
			select {
			case err := <-done[name]:
				if err != nil {
					t.Fatalf("%s: %s: %v", step, name, err)
				}
				delete(done, name)
			case <-time.After(10 * time.Second):
				t.Fatalf("%s: %s was not released", step, name)
			}
		}
		if n := queued(); n != len(done) {
			t.Fatalf("%s: %d commits queued, want %d (%v still waiting)", step, n, len(done), keys(done))
		}
	}
	p.updateReplica("a", func(r *replicaPos) { r.written, r.flushed = 25, 20 })
	released("a flushed 20", "flush-1@10", "flush-1@20")
	p.updateReplica("b", func(r *replicaPos) { r.lastAck = time.Now() })
	released("b's heartbeat")
	p.updateReplica("b", func(r *replicaPos) { r.written, r.flushed = 12, 12 })
	released("b flushed 12", "flush-2@10")
	p.updateReplica("a", func(r *replicaPos) { r.connected = false; r.flushed, r.applied = 40, 40 })
	released("a disconnected")
	p.updateReplica("b", func(r *replicaPos) { r.applied = 11 })
	released("b applied 11", "apply-1@10")

	// The last one times out with what the replicas reached, and leaves
	// no waiter behind.
	cancel()
	err := <-done["flush-1@30"]
	if err == nil || !strings.Contains(err.Error(), "0 of 1 connected replica(s)") {
		t.Fatalf("timed-out wait: %v", err)
	}
	if n := queued(); n != 0 {
		t.Fatalf("%d waiters left behind", n)
	}
}

func keys(m map[string]chan error) []string {
	var ks []string
	for k := range m {
		ks = append(ks, k)
	}
	return ks
}

func TestKthHighest(t *testing.T) {
	for _, c := range []struct {
		pos  []uint64
		k    int
		want uint64
	}{
		{nil, 1, 0}, {[]uint64{5}, 1, 5}, {[]uint64{5}, 2, 0}, {[]uint64{3, 9, 7}, 1, 9},
		{[]uint64{3, 9, 7}, 2, 7}, {[]uint64{3, 9, 7}, 3, 3}, {[]uint64{3, 9, 7}, 0, 0},
	} {
		if got := failover.AckLSN(append([]uint64(nil), c.pos...), c.k); got != c.want {
			t.Errorf("AckLSN(%v, %d) = %d, want %d", c.pos, c.k, got, c.want)
		}
	}
}

// BenchmarkAckRelease: 256 sync commits wait on LSNs 1..256 and acks
// advance one replica's flushed LSN one at a time until all are released
// (ns/op is per ack). An ack should wake the one commit it covers, not every
// commit still waiting.
func BenchmarkAckRelease(b *testing.B) {
	const waiters = 256
	ctx := context.Background()
	p := newPeers()
	p.updateReplica("a", func(r *replicaPos) { r.connected = true })
	var base uint64
	b.ResetTimer()
	for done := 0; done < b.N; done += waiters {
		b.StopTimer()
		var wg sync.WaitGroup
		for i := range uint64(waiters) {
			wg.Go(func() {
				if err := p.waitReplicas(ctx, base+i+1, waitClass{level: walshipv1.SyncLevel_SYNC_LEVEL_FLUSH, k: 1}); err != nil {
					b.Error(err)
				}
			})
		}
		for waitingAt(p, walshipv1.SyncLevel_SYNC_LEVEL_FLUSH) < waiters {
			runtime.Gosched() // until every commit waits
		}
		b.StartTimer()
		for i := range uint64(waiters) {
			lsn := base + i + 1
			p.updateReplica("a", func(r *replicaPos) { r.written, r.flushed = lsn, lsn })
		}
		wg.Wait()
		base += waiters
	}
}

func waitingAt(p *peers, level walshipv1.SyncLevel) int64 { return p.waiting[level].Load() }

// TestWaitsBeginWakesHolds: every kind of wait on peers — a sync commit's
// on replicas, one on the log stores, a switchover's on its target —
// closes the channel a stream holding a batch back (--ship-delay) took
// before it looked, and is counted while it waits, so that a stream
// looking later sends at once.
func TestWaitsBeginWakesHolds(t *testing.T) {
	for name, wait := range map[string]func(context.Context, *peers) error{
		"replicas": func(ctx context.Context, p *peers) error {
			return p.waitReplicas(ctx, 5, waitClass{level: walshipv1.SyncLevel_SYNC_LEVEL_FLUSH, k: 1})
		},
		"log stores": func(ctx context.Context, p *peers) error { return p.waitLogStores(ctx, 5) },
		"switchover": func(ctx context.Context, p *peers) error { return p.waitReplica(ctx, "r", 5) },
	} {
		t.Run(name, func(t *testing.T) {
			p := newPeers()
			p.quorum = 1
			p.logstores["ls"] = &logstorePos{addr: "ls"}
			begun := p.waitsBegin()
			ctx, cancel := context.WithCancel(t.Context())
			done := make(chan error, 1)
			go func() { done <- wait(ctx, p) }()
			select {
			case <-begun:
			case <-time.After(time.Minute):
				t.Fatal("the wait began and the channel stayed open")
			}
			counted := p.anyReplicaWaiting()
			if name == "log stores" {
				counted = p.lsWaiting.Load() > 0
			}
			if !counted {
				t.Error("the wait is under way but not counted")
			}
			cancel()
			if err := <-done; err == nil {
				t.Error("a wait nothing satisfied returned nil")
			}
			if p.anyReplicaWaiting() || p.lsWaiting.Load() != 0 {
				t.Error("a wait that ended is still counted")
			}
		})
	}
}
