package logstore

import (
	"fmt"
	"testing"
	"time"

	walshipv1 "github.com/walship/walship/gen/walship/v1"
)

// BenchmarkAppend measures the log store's commit path through real gRPC
// on loopback and real fsyncs: the receiving goroutine's checks, the
// writer's rounds (admit, one Append and one fsync per round) and the
// acks.
//
//   - Pipelined: a primary streaming batches without waiting, as under
//     load; rounds group what arrived meanwhile (FlushDelay as shipped).
//   - Commit: each batch followed by a heartbeat asking for a reply and a
//     wait for its durable ack, as a sync commit waits (one round, one
//     fsync per batch).
func BenchmarkAppend(b *testing.B) {
	for _, valueBytes := range []int{100, 4096} {
		b.Run(fmt.Sprintf("Pipelined/value=%d", valueBytes), func(b *testing.B) {
			benchAppend(b, valueBytes, false)
		})
		b.Run(fmt.Sprintf("Commit/value=%d", valueBytes), func(b *testing.B) {
			benchAppend(b, valueBytes, true)
		})
	}
}

func benchAppend(b *testing.B, valueBytes int, wait bool) {
	cfg := testConfig(b, b.TempDir())
	cfg.FlushDelay = DefaultConfig().FlushDelay
	r := start(b, cfg)
	bs := chain(b, 1, 1, b.N, valueBytes)
	a := r.append(b)
	a.heartbeat(1)
	a.waitDurable(0)
	b.SetBytes(int64(len(bs[0].Payload)))
	b.ReportAllocs()
	b.ResetTimer()
	for _, bt := range bs {
		req := &walshipv1.AppendRequest{Batch: bt}
		if wait {
			req.Heartbeat = &walshipv1.Heartbeat{Epoch: 1, TimeUnixNano: time.Now().UnixNano(), ReplyRequested: true}
		}
		a.sendOrEnded(req, "batch")
		if wait {
			a.waitDurable(bt.LastLsn)
		}
	}
	if !wait {
		a.waitDurable(bs[len(bs)-1].LastLsn)
	}
	b.StopTimer()
	a.cancel()
}
