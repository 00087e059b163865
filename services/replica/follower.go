package replica

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	walshipv1 "github.com/walship/walship/gen/walship/v1"
	"google.golang.org/grpc"
)

// follower is the state of the replica's following goroutine: where it is
// on the catch-up ladder, its connection to the primary, what it wrote but
// has not applied, and what the primary last said is durable. Everything
// in it is the follower's alone unless its comment says otherwise; the WAL,
// the state, the vote and the history it shares with the rest of Server
// (walMu, snapMu, voteMu).
//
// # Stages
//
// The follower walks the catch-up ladder (follow.go: follow, climb, the
// after* decisions): stream from the primary (stream.go), read a gap from
// a log store (catchup.go), re-seed from a snapshot (catchup.go: install)
// or read the archive (archive.go). Every rung feeds the same rounds
// (apply.go): check each batch (CRC, epoch, continuity, decode), write the
// good prefix with one WAL append (write, appendRound), fsync once for
// every batch written (flushApply, syncWAL), apply what is both flushed
// here and durable on the primary (applyReady), then publish it to reads
// (readable.go) and acknowledge it. What is written but not yet durable on
// the primary waits in unapplied, in memory up to MaxUnappliedBytes and in
// the WAL past it (spilled).
//
// # Goroutines
//
//   - the follower (Server.follow, started by Run and waited for there): the
//     only goroutine that writes the WAL's tail, applies, installs a
//     re-seed and touches the follower-only fields below;
//   - per stream from the primary, one receiver and one sender
//     (primaryStream.receive and .send, through sendLoop), started by
//     startStream and waited for by primaryStream.stop before the stream's
//     rung returns; the sender reads positions (atomics and the WAL's
//     positions) only;
//   - while a failure's backoff is waited out, one goroutine that ends the
//     wait when newPrimary is poked (waitRetry; it exits with the wait);
//   - outside the follower: gRPC handlers (Fence, reads, Status) and the
//     snapshotter (Run: takeSnapshot) share the WAL, the vote and the state
//     with it under the locks below.
//
// # Lock order
//
// A goroutine holding a lock takes only locks to its right:
//
//	snapMu → voteMu → walMu → follower.streamMu
//
// Each arrow, where it is taken:
//   - snapMu → walMu: takeSnapshot truncates the WAL, install resets it
//     (replica.go, catchup.go);
//   - snapMu → voteMu: install raises the promise to the snapshot's epoch
//     (resetHistory → promiseLogEpoch) after releasing walMu;
//   - voteMu → walMu: Fence (epoch.go) and appendRound (apply.go, when the
//     round's epoch is newer than the promise), so that no batch is written
//     between a fence's fsync and its promise;
//   - voteMu (→ walMu) → streamMu: a saved vote naming another primary
//     ends the current stream (saveVoteLocked → followPrimary).
//
// Leaves, under which no other lock is taken: follower.connMu (replClient,
// closeConns), the cluster id's lock (datadir.Cluster, under voteMu and
// walMu), rd.mu (readable.go; it advances the feed's bound, a watermark,
// under it) and lag.mu (lag.go). snapMu is never taken with voteMu or
// walMu held: its only takers are takeSnapshot (the snapshotter, and
// Run's final snapshot once the follower has ended) and the follower's
// install, all holding nothing.
type follower struct {
	// Set from outside the follower (a vote naming a new primary:
	// followPrimary), read by it.
	//
	// streamCancel ends the current stream from the primary (a promise to
	// a newer epoch does); guarded by streamMu. newPrimary wakes a
	// follower waiting out its backoff when the primary to follow changes.
	streamMu     sync.Mutex
	streamCancel context.CancelFunc
	newPrimary   chan struct{}

	// connMu guards the connection to the primary, which changes when the
	// replica follows a new one (replClient); closeConns closes it.
	connMu      sync.Mutex
	dialPrimary []grpc.DialOption
	primaryConn *grpc.ClientConn
	connAddr    string
	repl        walshipv1.ReplicationServiceClient

	// Published by the follower for Status and the metrics.
	// primaryDurableSeen mirrors primaryDurable for readers.
	rung               atomic.Int32 // walshipv1.CatchUpRung
	connected          atomic.Bool
	primaryDurableSeen atomic.Uint64

	// The follower's alone (and New's and Run's, before it starts and
	// after it ends). unapplied holds written batches, in LSN order, not
	// yet applied: not flushed here, or not yet durable on the primary
	// (primaryDurable, the highest durable LSN the primary reported).
	// reseedBack lets the next re-seed move the state backwards: after a
	// divergence, what this replica applied beyond the cut is not the
	// primary's history.
	unapplied      []checked
	unappliedBytes int64     // payload bytes of the batches in unapplied kept in memory
	spillWarned    time.Time // when spilling was last logged (at most once a minute)
	primaryDurable uint64
	reseedBack     bool
	// markerLSN, markerReadable and markerTime: the applied marker last
	// saved (DataDir/applied), and when.
	markerLSN      uint64
	markerReadable bool
	markerTime     time.Time
}
