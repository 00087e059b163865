package primary

import (
	"context"
	"runtime"
	"sync"
	"testing"

	walshipv1 "github.com/walship/walship/gen/walship/v1"
)

// BenchmarkAckReleaseMembers is BenchmarkAckRelease with members p, a, b,
// c (a primary with --peers): a and b ack, c is down.
func BenchmarkAckReleaseMembers(b *testing.B) {
	p := newPeers()
	p.rule = ruleOf(&walshipv1.Contract{SyncReplicas: 2, Members: members("p", "a", "b", "c")}, "p")
	benchAckReleaseMembers(b, p)
}

func benchAckReleaseMembers(b *testing.B, p *peers) {
	const waiters = 256
	ctx := context.Background()
	p.updateReplica("a", func(r *replicaPos) { r.connected = true })
	p.updateReplica("b", func(r *replicaPos) { r.connected = true })
	var base uint64
	b.ResetTimer()
	for done := 0; done < b.N; done += waiters {
		b.StopTimer()
		var wg sync.WaitGroup
		for i := range uint64(waiters) {
			wg.Go(func() {
				if err := p.waitReplicas(ctx, base+i+1, waitClass{level: walshipv1.SyncLevel_SYNC_LEVEL_FLUSH, k: 2}); err != nil {
					b.Error(err)
				}
			})
		}
		for p.waiting[walshipv1.SyncLevel_SYNC_LEVEL_FLUSH].Load() < waiters {
			runtime.Gosched()
		}
		b.StartTimer()
		for i := range uint64(waiters) {
			lsn := base + i + 1
			p.updateReplica("a", func(r *replicaPos) { r.written, r.flushed = lsn, lsn })
			p.updateReplica("b", func(r *replicaPos) { r.written, r.flushed = lsn, lsn })
		}
		wg.Wait()
		base += waiters
	}
}
