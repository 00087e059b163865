package check

import (
	"context"
	"fmt"
	"sync"
	"time"

	walshipv1 "github.com/walship/walship/gen/walship/v1"
)

// PinnedWriter puts keys through one node only (no client routing, no
// Service) and keeps the time and LSN of each write it acknowledged: the
// evidence, per node, that two primaries never acknowledged at once.
type PinnedWriter struct {
	mu   sync.Mutex
	acks []PinnedAck
}

// PinnedAck is one write a PinnedWriter's node acknowledged.
type PinnedAck struct {
	At  time.Time
	LSN uint64
	Key string
}

// Run puts prefix0, prefix1, ... through kv until ctx ends, each within a
// second; a refused write (a replica, a deposed primary) is not retried,
// and the next comes 20 ms later.
func (w *PinnedWriter) Run(ctx context.Context, kv walshipv1.KVServiceClient, prefix string) {
	for i := 0; ctx.Err() == nil; i++ {
		key := fmt.Sprintf("%s%d", prefix, i)
		cctx, cancel := context.WithTimeout(ctx, time.Second)
		resp, err := kv.Put(cctx, &walshipv1.PutRequest{Key: key, Value: []byte("v")})
		cancel()
		if err == nil {
			w.mu.Lock()
			w.acks = append(w.acks, PinnedAck{time.Now(), resp.GetLsn(), key})
			w.mu.Unlock()
			continue
		}
		tm := time.NewTimer(20 * time.Millisecond)
		select {
		case <-tm.C:
		case <-ctx.Done():
			tm.Stop()
		}
	}
}

// Acks returns a copy of the acknowledged writes so far, in order.
func (w *PinnedWriter) Acks() []PinnedAck {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]PinnedAck(nil), w.acks...)
}
