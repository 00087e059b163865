package primary

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	walshipv1 "github.com/walship/walship/gen/walship/v1"
	"github.com/walship/walship/internal/datadir"
	"github.com/walship/walship/internal/rpcerr"
	"github.com/walship/walship/internal/snapchunk"
	"github.com/walship/walship/internal/state"
	"github.com/walship/walship/internal/wal"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
)

// replServer is the primary's ReplicationService.
type replServer struct {
	walshipv1.UnimplementedReplicationServiceServer
	s *Server
}

// withRawBatch sets stored envelope bytes as field 1 (the batch) of m —
// a StreamResponse or an AppendRequest — without unmarshalling and
// re-marshalling them: the bytes the WAL holds are the bytes every replica
// and log store receives. Protobuf marshals unknown fields byte for byte, and
// the receiver parses them as the batch field.
func withRawBatch[M proto.Message](m M, data []byte) M {
	b := protowire.AppendTag(make([]byte, 0, len(data)+protowire.SizeVarint(uint64(len(data)))+1), 1, protowire.BytesType)
	m.ProtoReflect().SetUnknown(protowire.AppendBytes(b, data))
	return m
}

// Stream serves one replica: batches from its next LSN on, heartbeats when
// idle; its cumulative acks update the positions sync commits wait for.
func (r *replServer) Stream(stream walshipv1.ReplicationService_StreamServer) (retErr error) {
	s := r.s
	first, err := stream.Recv()
	if errors.Is(err, io.EOF) {
		// Returned as it is, the client would see UNKNOWN "EOF".
		return status.Error(codes.InvalidArgument, "hello: the stream ended before its first message, which must be a hello")
	}
	if err != nil {
		return err
	}
	hello := first.GetHello()
	if err := s.checkHello(hello); err != nil {
		return err
	}
	id, next := hello.GetReplicaId(), hello.GetNextLsn()
	if keep, diverged := s.replicaDiverged(hello); diverged {
		// Sent before they were durable here, then lost by a crash of this
		// primary: the replica never applied them, so it can cut them.
		s.metrics.replicaDiverged.Inc()
		s.logger.Warn("replica holds entries this primary lost in a crash; telling it to cut them",
			"replica", id, "replica_epoch", hello.GetEpoch(), "next_lsn", next, "truncate_after_lsn", keep, "epoch", s.epoch)
		// No durable_lsn: it is about this primary's log, which the
		// replica's entries past keep are not part of.
		return stream.Send(&walshipv1.StreamResponse{
			Msg: &walshipv1.StreamResponse_Diverged{Diverged: &walshipv1.Diverged{TruncateAfterLsn: keep, Epoch: s.epoch}},
		})
	}
	rd, err := s.replicaReader(id, next)
	if err != nil {
		return err
	}
	defer rd.Close()

	s.logger.Info("replica connected", "replica", id, "next_lsn", next)
	session := s.peers.connectReplica(id, next)
	defer func() {
		s.peers.disconnectReplica(id, session)
		s.logger.Info("replica disconnected", "replica", id, "reason", retErr)
	}()
	return r.serveStream(stream, id, next, rd)
}

// checkHello validates a stream's hello, and refuses it while this primary
// has no epoch yet or when the replica knows of a newer one.
func (s *Server) checkHello(hello *walshipv1.ReplicaHello) error {
	switch {
	case hello == nil:
		return status.Error(codes.InvalidArgument, "hello: the first message of a stream must be a hello")
	case datadir.ValidateNodeID(hello.GetReplicaId()) != nil:
		return status.Errorf(codes.InvalidArgument, "hello.replica_id: %v", datadir.ValidateNodeID(hello.GetReplicaId()))
	case hello.GetNextLsn() == 0:
		return status.Error(codes.InvalidArgument, "hello.next_lsn: must be at least 1")
	case datadir.CheckEpoch(hello.GetEpoch(), s.epoch, datadir.MaxEpochJump) != nil:
		return status.Errorf(codes.InvalidArgument, "hello.epoch: %v", datadir.CheckEpoch(hello.GetEpoch(), s.epoch, datadir.MaxEpochJump))
	case datadir.CheckEpoch(hello.GetFencedEpoch(), s.epoch, datadir.MaxEpochJump) != nil:
		return status.Errorf(codes.InvalidArgument, "hello.fenced_epoch: %v", datadir.CheckEpoch(hello.GetFencedEpoch(), s.epoch, datadir.MaxEpochJump))
	case datadir.CheckProto(hello.GetHistory(), s.epoch, datadir.MaxEpochJump) != nil:
		return status.Errorf(codes.InvalidArgument, "hello.history%v", datadir.CheckProto(hello.GetHistory(), s.epoch, datadir.MaxEpochJump))
	case rpcerr.CheckClusterID("hello.cluster_id", hello.GetClusterId()) != nil:
		return rpcerr.CheckClusterID("hello.cluster_id", hello.GetClusterId())
	case !s.epochReady.Load():
		return status.Errorf(codes.Unavailable, "primary is still winning epoch %d from the log stores", s.epoch)
	case hello.GetEpoch() > s.epoch:
		return status.Errorf(codes.FailedPrecondition, "hello.epoch: replica has seen epoch %d, newer than this primary's %d: this primary is deposed", hello.GetEpoch(), s.epoch)
	case hello.GetFencedEpoch() > s.epoch:
		// A candidate fenced the replica. The primary does not step down
		// on a replica's word alone (any client can send a hello): the log
		// stores the candidate fenced refuse it, and its lease runs out.
		return status.Errorf(codes.FailedPrecondition, "hello.fenced_epoch: replica has promised epoch %d, newer than this primary's %d: this primary is deposed", hello.GetFencedEpoch(), s.epoch)
	}
	// The epoch is won, so the cluster id is settled.
	return s.guard.Check(hello.GetClusterId(), "the replica "+hello.GetReplicaId())
}

// replicaDiverged reports whether the replica's log holds entries past
// keep that this primary's history does not have (diverged), so that it
// must cut them before it can follow.
func (s *Server) replicaDiverged(hello *walshipv1.ReplicaHello) (keep uint64, diverged bool) {
	keep, all, known := s.epochs.KeepUpTo(hello.GetEpoch())
	if h := hello.GetHistory(); len(h) > 0 {
		keep, all, known = s.epochs.SharedUpTo(datadir.HistoryFromProto(h))
	}
	if !known {
		// The replica's log is of an epoch older than this primary's
		// history reaches back to: nothing of it can be vouched for.
		keep = 0
	}
	return keep, !all && hello.GetNextLsn() > keep+1
}

// replicaReader opens the WAL at a replica's next LSN, or says why the
// replica cannot stream from there: it is ahead (its log diverged), or
// the primary no longer retains that LSN (OUT_OF_RANGE: the replica goes
// down the catch-up ladder).
func (s *Server) replicaReader(id string, next uint64) (*wal.Reader, error) {
	if last := s.wal.LastLSN(); next > last+1 {
		return nil, status.Errorf(codes.FailedPrecondition, "hello.next_lsn: replica %s is ahead of the primary (next LSN %d, primary's last LSN %d): its log diverged", id, next, last)
	}
	rd, err := s.wal.NewReader(next, false)
	if errors.Is(err, wal.ErrCompacted) || (err == nil && next <= s.walResetFloor()) {
		if rd != nil {
			rd.Close()
		}
		s.metrics.replicaOutOfRange.Inc()
		return nil, status.Errorf(codes.OutOfRange, "hello.next_lsn: LSN %d is no longer retained by the primary (first retained LSN %d); catch up from a log store or a snapshot", next, s.wal.FirstLSN())
	}
	if err != nil {
		return nil, status.Errorf(codes.Internal, "read wal from LSN %d: %v", next, err)
	}
	return rd, nil
}

// serveStream runs a replica's stream until it ends: one goroutine
// receives and one sends; this one supervises. A replica that stops
// reading (stopped, or partitioned: no FIN arrives) blocks the sender in
// flow control, so its silence is watched from here, and returning from
// the handler is what unblocks that sender.
func (r *replServer) serveStream(stream walshipv1.ReplicationService_StreamServer, id string, next uint64, rd *wal.Reader) error {
	s := r.s
	ctx, cancel := context.WithCancel(stream.Context())
	defer cancel()
	recvErr := make(chan error, 1)
	go func() { recvErr <- r.receiveAcks(ctx, id, stream) }()
	sendErr := make(chan error, 1)
	go func() { sendErr <- r.send(ctx, id, next, rd, stream) }()
	watch := time.NewTicker(min(s.cfg.HeartbeatInterval, s.cfg.ReplicaTimeout/4))
	defer watch.Stop()
	for {
		select {
		case err := <-sendErr:
			if errors.Is(err, context.Canceled) {
				select {
				case rerr := <-recvErr: // the receiver's failure cancelled it
					err = rerr
				default:
				}
			}
			if errors.Is(err, io.EOF) {
				return nil // the replica closed the stream
			}
			return err
		case err := <-recvErr:
			if errors.Is(err, io.EOF) {
				return nil
			}
			return err
		case <-watch.C:
			if quiet := time.Since(s.replicaLastAck(id)); quiet > s.cfg.ReplicaTimeout {
				s.logger.Warn("cutting off a silent replica", "replica", id, "silent_for", quiet.Round(time.Millisecond), "replica_timeout", s.cfg.ReplicaTimeout)
				return status.Errorf(codes.Unavailable, "replica %s sent nothing for %v (--replica-timeout %v)", id, quiet.Round(time.Millisecond), s.cfg.ReplicaTimeout)
			}
		}
	}
}

// receiveAcks applies the replica's cumulative acks until the stream ends.
func (r *replServer) receiveAcks(ctx context.Context, id string, stream walshipv1.ReplicationService_StreamServer) error {
	for {
		m, err := stream.Recv()
		if err != nil {
			return err
		}
		switch x := m.GetMsg().(type) {
		case *walshipv1.StreamRequest_Ack:
			a := x.Ack
			if a.WrittenLsn < a.FlushedLsn || a.FlushedLsn < a.AppliedLsn || a.AppliedLsn < a.GetVisibleLsn() {
				return status.Errorf(codes.InvalidArgument, "ack: written %d >= flushed %d >= applied %d >= visible %d does not hold", a.WrittenLsn, a.FlushedLsn, a.AppliedLsn, a.GetVisibleLsn())
			}
			if last := r.s.wal.LastLSN(); a.WrittenLsn > last {
				return status.Errorf(codes.InvalidArgument, "ack.written_lsn: %d is beyond the primary's last LSN %d", a.WrittenLsn, last)
			}
			r.s.peers.updateReplica(id, func(p *replicaPos) {
				// Cumulative: a reordered or repeated ack never moves a position back.
				p.written, p.flushed, p.applied = max(p.written, a.WrittenLsn), max(p.flushed, a.FlushedLsn), max(p.applied, a.AppliedLsn)
				if a.VisibleLsn != nil {
					p.visible, p.reportsVisible = max(p.visible, a.GetVisibleLsn()), true
				}
				p.lastAck = time.Now()
			})
		case *walshipv1.StreamRequest_Heartbeat:
			r.s.peers.updateReplica(id, func(p *replicaPos) { p.lastAck = time.Now() })
		case *walshipv1.StreamRequest_Hello:
			return status.Error(codes.InvalidArgument, "hello: sent twice on one stream")
		default:
			return status.Error(codes.InvalidArgument, "msg: empty stream message")
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
	}
}

// send streams WAL batches from next on as soon as they are written, each
// message carrying the primary's durable LSN, beyond which the replica
// applies nothing: the replica's write and fsync overlap the primary's own
// fsync (a sync-replication commit waits for both), and the send itself
// runs while the primary's CPU would otherwise wait for its disk. When the
// WAL is synced and no batch follows to carry the new durable LSN, a
// heartbeat does: at once if a commit waits for replicas to apply, else
// after durableUpdateDelay (a batch usually comes first).
// An idle stream gets a heartbeat every heartbeat interval. A replica that
// falls more than MaxReplicaLagBytes behind is cut off with OUT_OF_RANGE: it
// catches up from a log store instead of pinning the primary's WAL.
func (r *replServer) send(ctx context.Context, id string, next uint64, rd *wal.Reader, stream walshipv1.ReplicationService_StreamServer) error {
	s := r.s
	x := &replicaSender{r: r, id: id, stream: stream, rd: rd, next: next, want: next,
		idle: time.NewTimer(s.cfg.HeartbeatInterval), due: time.NewTimer(time.Hour),
		sent: s.metrics.sentBytes.WithLabelValues(id)}
	// Every replica's pacing series exists from its first stream, at 0
	// unless it is paced (pace.go), as its sent bytes do.
	s.metrics.pacedBytes.WithLabelValues(id)
	s.metrics.pacedSeconds.WithLabelValues(id)
	x.due.Stop()
	defer x.idle.Stop()
	defer x.due.Stop()
	// An immediate heartbeat tells the replica it is connected and where
	// the primary is, before any batch.
	if err := x.sendHeartbeat(s.wal.DurableLSN(), s.commit.Load(), true); err != nil {
		return err
	}
	x.hold = newShipHold(s.cfg.ShipDelay, s.metrics.shipDelays.WithLabelValues("replica"))
	defer x.hold.stop()
	defer x.paceState.stop()
	for {
		changed := s.wal.Changed()
		ask, askChanged := s.pipe.want.flushAsk.Changed()
		commit, commitChanged := s.commit.Changed()
		var err error
		var waited bool
		switch {
		case s.wal.LastLSN() < x.want:
			x.hold.caughtUp()
			err = x.caughtUp(ctx, ask, commit, changed, askChanged, commitChanged)
		default:
			if waited, err = x.linger(ctx, ask, changed, askChanged); err == nil && !waited {
				err = x.sendEntry(ctx, ask)
			}
		}
		if err != nil {
			return err
		}
	}
}

// replicaSender is the sending side of one replica's stream (send): where
// it is in the WAL and what it has told its replica.
type replicaSender struct {
	r      *replServer
	id     string
	stream walshipv1.ReplicationService_StreamServer
	rd     *wal.Reader
	next   uint64 // the hello's: the first entry must start there
	want   uint64 // first LSN of the entry to send next
	// sentDurable is the newest durable LSN the replica has heard of;
	// asked, the flush ask (wants.flushAsk) forwarded to it; sentCommit,
	// the newest commit watermark.
	sentDurable, asked, sentCommit uint64
	idle                           *time.Timer // a heartbeat after an interval of silence
	// A durable LSN not yet sent is sent by dueAt at the latest (due).
	dueAt   time.Time
	due     *time.Timer
	sent    prometheus.Counter
	entries int // sent, for the lag check
	replyAt [len(syncStages)]walshipv1.SyncLevel
	hold    *shipHold // the ship delay (linger)
	// paceState paces a replica whose acks count for nothing (pace.go).
	paceState streamPace
}

// linger holds the next batch back, if nothing waits on the replica, until
// ShipDelay after the stream first found it unsent; the batches written
// meanwhile then go with it, back to back (one socket write, one round on
// the replica). Nothing waits when no commit is noted for it or a batch
// after it, no flush ask is to be forwarded, no commit waiting to apply
// needs a newer durable LSN, and no wait on replicas is under way; one
// that begins (a write, an ask, a wait) ends the hold at once. It reports
// whether it waited (the caller looks again).
func (x *replicaSender) linger(ctx context.Context, ask uint64, changed, askChanged <-chan struct{}) (bool, error) {
	s := x.r.s
	if x.hold.delay <= 0 {
		return false, nil
	}
	begun := s.peers.waitsBegin() // before the look: a wait counted after it wakes the hold
	if ask > x.asked || s.pipe.want.replicasWaitFrom(x.want) || s.peers.anyReplicaWaiting() ||
		(s.wal.DurableLSN() > x.sentDurable && s.pipe.want.applyUrgent(x.sentDurable)) {
		return false, nil
	}
	return x.hold.wait(ctx, changed, askChanged, begun)
}

// caughtUp runs while the replica has every written entry: it forwards a
// group's flush ask, tells the replica of a newer durable LSN (at once if
// a commit waits for replicas to apply, else by durableUpdateDelay) or a
// newer commit watermark (at once), and otherwise waits for
// a write, an ask, that delay or the idle heartbeat.
func (x *replicaSender) caughtUp(ctx context.Context, ask, commit uint64, changed, askChanged, commitChanged <-chan struct{}) error {
	s := x.r.s
	durable := s.wal.DurableLSN()
	if ask > x.asked && ask < x.want {
		// A group's fsync started after its batches went out: ask for
		// the replica's flush (and ack) now.
		if err := x.sendHeartbeat(durable, commit, true); err != nil {
			return err
		}
		x.asked = ask
		return nil
	}
	if durable > x.sentDurable || commit > x.sentCommit {
		// Urgent while an apply-stage commit waits, or is about to: its
		// batch became durable before it began to wait.
		urgent := s.peers.waiting[walshipv1.SyncLevel_SYNC_LEVEL_APPLY].Load() > 0 || s.pipe.want.applyUrgent(x.sentDurable)
		// A new commit watermark goes at once when peers' acks move it
		// (coalesced, at most one per replica per 10 ms): it is what makes
		// the replica's reads and watches catch up. One that only follows
		// the durable LSN (a contract of the primary's fsync alone) goes
		// with it.
		now := commit > x.sentCommit && s.peerContract
		if x.dueAt.IsZero() && !urgent && !now {
			x.dueAt = time.Now().Add(durableUpdateDelay)
			x.due.Reset(durableUpdateDelay)
		}
		if urgent || now || !time.Now().Before(x.dueAt) {
			if err := x.sendHeartbeat(durable, commit, urgent); err != nil {
				return err
			}
			x.dueAt = time.Time{}
			return nil
		}
	}
	var commitMoved <-chan struct{}
	if commit <= x.sentCommit {
		commitMoved = commitChanged
	}
	select {
	case <-changed:
	case <-askChanged:
	case <-commitMoved:
	case <-x.due.C:
	case <-x.idle.C:
		if err := x.sendHeartbeat(durable, commit, true); err != nil {
			return err
		}
	case <-ctx.Done():
		return ctx.Err()
	}
	return nil
}

// sendHeartbeat sends a heartbeat carrying durable and commit.
func (x *replicaSender) sendHeartbeat(durable, commit uint64, reply bool) error {
	m := x.r.heartbeat(durable, reply)
	m.CommitLsn = commit
	if err := x.stream.Send(m); err != nil {
		return err
	}
	x.sentDurable, x.sentCommit = max(x.sentDurable, durable), max(x.sentCommit, commit)
	x.idle.Reset(x.r.s.cfg.HeartbeatInterval)
	return nil
}

// sendEntry sends the next WAL entry, with the primary's durable LSN and
// the stages at which the replica should ack it at once (wants.replyAt).
func (x *replicaSender) sendEntry(ctx context.Context, ask uint64) error {
	s := x.r.s
	e, err := x.rd.Next(ctx)
	switch {
	case errors.Is(err, wal.ErrCompacted):
		return status.Errorf(codes.OutOfRange, "replica %s: the WAL it needs was removed by retention; catch up from a log store or a snapshot", x.id)
	case err != nil:
		return err
	}
	if x.want == x.next && e.FirstLSN != x.next {
		return status.Errorf(codes.FailedPrecondition, "hello.next_lsn: %d is not a batch boundary (the batch holding it starts at %d): the replica's log diverged", x.next, e.FirstLSN)
	}
	if err := x.pace(ctx, len(e.Data)); err != nil {
		return err
	}
	x.want = e.LastLSN + 1
	durable := s.wal.DurableLSN()
	// The batch asks for the group's flush if its commits' group fsync has
	// started, or to forward an ask for batches already sent (the replica
	// flushes all it wrote, this batch too).
	flush := e.LastLSN <= ask || (ask > x.asked && ask < e.FirstLSN)
	if flush {
		x.asked = max(x.asked, e.LastLSN)
	}
	writeWaiting := s.peers.waiting[walshipv1.SyncLevel_SYNC_LEVEL_WRITE].Load() > 0
	reply := s.pipe.want.replyAt(e.LastLSN, flush, writeWaiting, x.replyAt[:0])
	commit := s.commit.Load()
	m := withRawBatch(&walshipv1.StreamResponse{DurableLsn: durable, ReplyAt: reply, CommitLsn: commit}, e.Data)
	if err := x.stream.Send(m); err != nil {
		return err
	}
	x.sentDurable, x.sentCommit = max(x.sentDurable, durable), max(x.sentCommit, commit)
	if x.sentDurable >= x.want-1 {
		x.dueAt = time.Time{} // nothing left to report
	}
	x.idle.Reset(s.cfg.HeartbeatInterval)
	s.peers.addSent(x.id, uint64(len(e.Data)))
	x.sent.Add(float64(len(e.Data)))
	// The lag check costs a lock and a search: every 32 batches is enough
	// to cut off a replica that fell megabytes behind.
	x.entries++
	if x.entries%32 == 0 && s.cfg.MaxReplicaLagBytes > 0 {
		if lagBytes, _ := s.pipe.index.lag(s.replicaFlushed(x.id), time.Now()); lagBytes > uint64(s.cfg.MaxReplicaLagBytes) {
			return status.Errorf(codes.OutOfRange, "replica %s is %d bytes behind, more than --max-replica-lag-bytes %d; catch up from a log store", x.id, lagBytes, s.cfg.MaxReplicaLagBytes)
		}
	}
	return nil
}

// durableUpdateDelay bounds how long a replica may wait to hear that the
// primary's WAL became durable when no commit waits on it applying: about a
// replica's flush delay, since it applies at its flushes anyway. Under load
// the next batch carries it first; at low rates this spares a message per
// batch per replica.
const durableUpdateDelay = 5 * time.Millisecond

// heartbeat reports the primary's last written and durable LSNs.
func (r *replServer) heartbeat(durable uint64, reply bool) *walshipv1.StreamResponse {
	return &walshipv1.StreamResponse{DurableLsn: durable, Msg: &walshipv1.StreamResponse_Heartbeat{Heartbeat: &walshipv1.Heartbeat{
		Epoch: r.s.epoch, LastLsn: r.s.wal.LastLSN(), TimeUnixNano: time.Now().UnixNano(), ReplyRequested: reply,
		PrimaryId: r.s.cfg.ID, PrimaryAddr: r.s.Advertise(), ClusterId: r.s.cluster.ID()}}}
}

func (s *Server) replicaLastAck(id string) time.Time {
	s.peers.mu.Lock()
	defer s.peers.mu.Unlock()
	if r, ok := s.peers.replicas[id]; ok {
		return r.lastAck
	}
	return time.Time{}
}

func (s *Server) replicaFlushed(id string) uint64 {
	s.peers.mu.Lock()
	defer s.peers.mu.Unlock()
	if r, ok := s.peers.replicas[id]; ok {
		return r.flushed
	}
	return 0
}

// walResetFloor is the LSN up to which the primary has state but no WAL
// (a WAL restarted after a snapshot): a replica needing those LSNs must take
// a snapshot.
func (s *Server) walResetFloor() uint64 {
	if s.wal.FirstLSN() == 0 {
		return s.wal.LastLSN()
	}
	return s.wal.FirstLSN() - 1
}

// snapshotChunkBytes bounds one SnapshotChunk message.
const snapshotChunkBytes = 1 << 20

// Snapshot streams the visible state at one LSN.
func (r *replServer) Snapshot(req *walshipv1.SnapshotRequest, stream walshipv1.ReplicationService_SnapshotServer) error {
	if id := req.GetReplicaId(); id != "" && datadir.ValidateNodeID(id) != nil {
		return status.Errorf(codes.InvalidArgument, "replica_id: %v", datadir.ValidateNodeID(id))
	}
	if err := rpcerr.CheckClusterID("cluster_id", req.GetClusterId()); err != nil {
		return err
	}
	s := r.s
	if err := s.servingSnapshots(); err != nil {
		return err
	}
	// Before the state is read: a replica of another cluster would refuse
	// the header anyway. One with no id yet adopts it from the header.
	if err := s.guard.Check(req.GetClusterId(), "the replica "+req.GetReplicaId()); err != nil {
		return err
	}
	v := s.store.Snapshot()
	// A replica applies only what the primary has made durable (streamed
	// batches wait for the durable LSN); a re-seeding snapshot keeps that
	// promise too, so a primary crash cannot leave the replica serving
	// commits the primary lost.
	if err := s.pipe.syncThrough(stream.Context(), v.AppliedLSN()); err != nil {
		return rpcerr.Status(fmt.Errorf("%w: snapshot at LSN %d: %v", rpcerr.ErrUnavailable, v.AppliedLSN(), err))
	}
	s.logger.Info("streaming snapshot", "replica", req.GetReplicaId(), "lsn", v.AppliedLSN(), "keys", v.Len())
	if err := stream.Send(&walshipv1.SnapshotResponse{Part: &walshipv1.SnapshotResponse_Header{Header: &walshipv1.SnapshotHeader{
		Epoch: s.epoch, Lsn: v.AppliedLSN(), Keys: uint64(v.Len()), ClusterId: s.cluster.ID(), CommitLsn: s.commit.Load()}}}); err != nil {
		return err
	}
	if err := sendSnapshotChunks(v, stream); err != nil {
		return err
	}
	s.metrics.snapshotsStreamed.Inc()
	return stream.Send(&walshipv1.SnapshotResponse{Part: &walshipv1.SnapshotResponse_Trailer{Trailer: &walshipv1.SnapshotTrailer{StateDigest: v.Digest().String()}}})
}

func sendSnapshotChunks(v *state.View, stream walshipv1.ReplicationService_SnapshotServer) error {
	chunks := snapchunk.New(snapshotChunkBytes)
	var err error
	flush := func() {
		if ch := chunks.Take(); ch != nil && err == nil {
			err = stream.Send(&walshipv1.SnapshotResponse{Part: &walshipv1.SnapshotResponse_Chunk{Chunk: ch}})
		}
	}
	v.Scan(nil, nil, 0, func(k, val []byte, ver uint64) bool {
		if chunks.Add(k, val, ver) {
			flush()
		}
		return err == nil && stream.Context().Err() == nil
	})
	flush()
	if err == nil {
		err = stream.Context().Err()
	}
	if err != nil {
		return fmt.Errorf("stream snapshot: %w", err)
	}
	return nil
}
