package replica

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"time"

	walshipv1 "github.com/walship/walship/gen/walship/v1"
	"github.com/walship/walship/internal/datadir"
	"github.com/walship/walship/internal/failover"
	"github.com/walship/walship/internal/rpcerr"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
)

// maxRound bounds the batches one processing round takes, so a burst still
// gets acked (and applied) in steps.
const maxRound = 256

// recvBuffer is how many messages the receiver may read ahead of the
// follower; beyond it, gRPC flow control pushes back on the primary.
const recvBuffer = 256

// streamFromPrimary runs one replication stream until it fails, a batch is
// refused, or ctx ends. progress reports whether anything was applied.
func (s *Server) streamFromPrimary(ctx context.Context) (progress bool, err error) {
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	// A promise to a newer epoch ends this stream (its primary is deposed).
	s.setStreamCancel(cancel)
	defer s.setStreamCancel(nil)
	repl, err := s.replClient()
	if err != nil {
		return false, err
	}
	stream, err := repl.Stream(sctx)
	if err != nil {
		return false, err
	}
	ps := s.startStream(sctx, cancel, stream)
	defer func() {
		ps.stop()
		s.follower.connected.Store(false)
	}()
	defer ps.flushTimer.Stop()
	// Whatever was written when the stream ends is flushed, and applied as
	// far as the primary said it is durable; the rest waits in s.follower.unapplied.
	defer func() {
		if len(s.follower.unapplied) > 0 {
			if ferr := ps.flush(); ferr != nil && err == nil {
				err = ferr
			}
		}
		progress = ps.progress
	}()
	err = ps.run(sctx)
	return ps.progress, err
}

// setStreamCancel records how to end the current stream from the primary
// (nil: there is none).
func (s *Server) setStreamCancel(cancel context.CancelFunc) {
	s.follower.streamMu.Lock()
	s.follower.streamCancel = cancel
	s.follower.streamMu.Unlock()
}

// primaryStream is one replication stream from the primary: its one
// receiver and one sender, and the follower's state of the rounds it
// processes from what the receiver hands over.
type primaryStream struct {
	s      *Server
	cancel context.CancelFunc // ends the stream and both goroutines

	wg      sync.WaitGroup
	recv    chan *walshipv1.StreamResponse // closed when the receiver ends
	recvErr error                          // set before recv is closed
	sendErr chan error
	// kick asks the sender for an ack within ackCoalesce; urgent at once.
	kick, urgent chan struct{}

	// primaryEpoch is the primary's epoch, from its heartbeats (the first
	// message of every stream is one).
	primaryEpoch uint64
	round        streamRound
	// flushTimer, while armed, fires when written batches have waited
	// FlushDelay for their fsync.
	flushTimer *time.Timer
	armed      bool
	progress   bool // anything applied
}

// streamRound is what one processing round took from the stream.
type streamRound struct {
	batches []*walshipv1.WalBatch
	// replyNow: the primary asked for a reply (a heartbeat's
	// reply_requested); ackWritten, ackFlushed: a batch's sync commits
	// wait at that stage (its reply_at).
	replyNow, ackWritten, ackFlushed bool
}

// startStream starts the stream's receiver and its sender, which sends the
// hello first: on a stream one goroutine receives and one sends. stop ends
// them.
func (s *Server) startStream(ctx context.Context, cancel context.CancelFunc, stream walshipv1.ReplicationService_StreamClient) *primaryStream {
	ps := &primaryStream{s: s, cancel: cancel,
		recv: make(chan *walshipv1.StreamResponse, recvBuffer), sendErr: make(chan error, 1),
		kick: make(chan struct{}, 1), urgent: make(chan struct{}, 1)}
	hello := &walshipv1.StreamRequest{Msg: &walshipv1.StreamRequest_Hello{Hello: &walshipv1.ReplicaHello{
		ReplicaId: s.cfg.ID, Epoch: s.epoch.Load(), NextLsn: s.wal.LastLSN() + 1, FencedEpoch: s.Vote().Epoch,
		History: logHistory(*s.history.Load(), s.wal.LastLSN()).Proto(), ClusterId: s.cluster.ID(),
	}}}
	ps.flushTimer = time.NewTimer(time.Hour)
	ps.flushTimer.Stop()
	ps.wg.Add(2)
	go ps.receive(ctx, stream)
	go ps.send(ctx, stream, hello)
	return ps
}

// receive is the stream's one receiver: it hands every message over to
// the follower until the stream or ctx ends.
func (ps *primaryStream) receive(ctx context.Context, stream walshipv1.ReplicationService_StreamClient) {
	defer ps.wg.Done()
	defer close(ps.recv)
	for {
		m, err := stream.Recv()
		if err != nil {
			ps.recvErr = err
			return
		}
		select {
		case ps.recv <- m:
		case <-ctx.Done():
			ps.recvErr = ctx.Err()
			return
		}
	}
}

// send is the stream's one sender (sendLoop); a failure to send ends the
// stream.
func (ps *primaryStream) send(ctx context.Context, stream walshipv1.ReplicationService_StreamClient, hello *walshipv1.StreamRequest) {
	defer ps.wg.Done()
	if err := ps.s.sendLoop(ctx, stream, hello, ps.kick, ps.urgent); err != nil {
		ps.sendErr <- err
		ps.cancel()
	}
}

// stop ends the stream and waits for its goroutines.
func (ps *primaryStream) stop() {
	ps.cancel()
	ps.wg.Wait()
}

// run processes what the primary sends, a round at a time, until the
// stream ends, a batch is refused, the primary goes silent or ctx ends.
func (ps *primaryStream) run(ctx context.Context) error {
	s := ps.s
	// The primary heartbeats every interval while idle; a stream silent for
	// much longer is a dead connection (a partition drops no FIN), so end it
	// and reconnect rather than wait for TCP to notice.
	silence := s.silence()
	watchdog := time.NewTimer(silence)
	defer watchdog.Stop()
	for {
		var m *walshipv1.StreamResponse
		var ok bool
		select {
		case m, ok = <-ps.recv:
			watchdog.Reset(silence)
		case <-ctx.Done():
		case <-watchdog.C:
			return fmt.Errorf("nothing from the primary for %v; reconnecting", silence)
		case <-ps.flushTimer.C:
			if err := ps.flush(); err != nil {
				return err
			}
			continue
		}
		if m == nil {
			return ps.ended(ok)
		}
		s.follower.connected.Store(true)
		if err := ps.take(m); err != nil {
			return err
		}
		if err := ps.process(); err != nil {
			return err
		}
	}
}

// ended stops the stream's goroutines and says why the stream ended.
func (ps *primaryStream) ended(ok bool) error {
	ps.stop()
	select {
	case e := <-ps.sendErr:
		// io.EOF from Send means the primary ended the stream: its status
		// (OUT_OF_RANGE, say, which picks the next rung) is what the
		// receive side got.
		if !errors.Is(e, io.EOF) || ps.recvErr == nil || errors.Is(ps.recvErr, io.EOF) {
			return fmt.Errorf("send: %w", e)
		}
	default:
	}
	if !ok && ps.recvErr != nil && !errors.Is(ps.recvErr, io.EOF) {
		return ps.recvErr
	}
	return errors.New("the primary closed the stream")
}

// take makes m and everything already received after it one round (of at
// most maxRound batches): it notes the primary's durable LSN, the acks the
// primary asks for and its heartbeats. The primary asks for an ack at once
// at the stages sync commits wait at (reply_at on a batch), or for any
// reply (a heartbeat's reply_requested); an ack at the other stages would
// wake no one.
func (ps *primaryStream) take(m *walshipv1.StreamResponse) error {
	s := ps.s
	r := &ps.round
	r.batches = r.batches[:0]
	r.replyNow, r.ackWritten, r.ackFlushed = false, false, false
	for m != nil {
		if d := m.GetDiverged(); d != nil {
			// Checked first: a durable LSN of the primary's log says
			// nothing about this replica's entries until the primary has
			// accepted them as its own history.
			return &divergedError{keep: d.GetTruncateAfterLsn(), epoch: d.GetEpoch()}
		}
		s.follower.primaryDurable = max(s.follower.primaryDurable, m.GetDurableLsn())
		s.follower.primaryDurableSeen.Store(s.follower.primaryDurable)
		s.rd.committed(m.GetCommitLsn())
		switch x := m.GetMsg().(type) {
		case *walshipv1.StreamResponse_Batch:
			r.batches = append(r.batches, x.Batch)
			for _, l := range m.GetReplyAt() {
				switch l {
				case walshipv1.SyncLevel_SYNC_LEVEL_WRITE:
					r.ackWritten = true
				case walshipv1.SyncLevel_SYNC_LEVEL_FLUSH, walshipv1.SyncLevel_SYNC_LEVEL_APPLY:
					r.ackFlushed = true
				}
			}
		case *walshipv1.StreamResponse_Heartbeat:
			hb := x.Heartbeat
			s.lag.heartbeat(hb.GetLastLsn(), s.now())
			if err := s.acceptPrimary(hb); err != nil {
				return err
			}
			ps.primaryEpoch = max(ps.primaryEpoch, hb.GetEpoch())
			r.replyNow = r.replyNow || hb.GetReplyRequested()
		}
		if len(r.batches) >= maxRound {
			break
		}
		select {
		case m = <-ps.recv:
		default:
			m = nil
		}
	}
	return nil
}

// process writes the round's batches, flushes and applies as the round
// asks, and pokes the sender for the acks due. It returns the refusal of
// one of the round's batches (those before it are written and processed).
func (ps *primaryStream) process() error {
	s := ps.s
	r := &ps.round
	var refused error
	if len(r.batches) > 0 {
		// The write is acked at once only when a sync commit waits at
		// stage write; otherwise the ack after the flush covers it, and
		// an async stream costs no message per round.
		var written func()
		if r.ackWritten {
			written = func() { poke(ps.urgent) }
		}
		refused = s.write(r.batches, ps.primaryEpoch, written)
	}
	// Flush and apply now if a sync commit waits on this replica's
	// flush (or apply), the primary asked for a reply, the round was
	// refused (apply the good prefix before reconnecting), or enough
	// piled up; otherwise within FlushDelay, so one fsync covers many
	// rounds while nobody waits — the disk is shared with the primary.
	// Batches already flushed that the primary has since made durable
	// are applied at once: that needs no fsync.
	unflushed := s.wal.DurableLSN() < s.wal.LastLSN()
	replyNow := r.replyNow || r.ackFlushed
	switch {
	case replyNow || refused != nil || (unflushed && len(s.follower.unapplied) >= maxRound) || s.cfg.FlushDelay <= 0:
		if err := ps.flush(); err != nil {
			return err
		}
	case unflushed && !ps.armed:
		ps.flushTimer.Reset(s.cfg.FlushDelay)
		ps.armed = true
	}
	n, err := s.applyReady()
	ps.progress = ps.progress || n > 0
	if err != nil {
		return err
	}
	if replyNow {
		poke(ps.urgent)
	} else if n > 0 {
		// Applied on the primary's word that they are durable: report
		// it within ackCoalesce, not at the next flush.
		poke(ps.kick)
	}
	return refused
}

// flush fsyncs and applies what is written (flushApply) and asks for an ack.
func (ps *primaryStream) flush() error {
	ps.armed = false
	applied, err := ps.s.flushApply()
	ps.progress = ps.progress || applied > 0
	poke(ps.kick)
	return err
}

func poke(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}

// ackCoalesce bounds how long an ack waits for more progress to report
// when nobody asked for it: at low rates every batch would otherwise cost
// the primary an ack to receive per replica.
const ackCoalesce = 10 * time.Millisecond

// sendLoop is the stream's only sender: the hello, then an ack of the
// current positions when urgent is poked, within ackCoalesce when kick is,
// and at least every heartbeat interval.
func (s *Server) sendLoop(ctx context.Context, stream walshipv1.ReplicationService_StreamClient, hello *walshipv1.StreamRequest, kick, urgent <-chan struct{}) error {
	if err := stream.Send(hello); err != nil {
		return err
	}
	t := time.NewTimer(s.cfg.HeartbeatInterval)
	defer t.Stop()
	hold := time.NewTimer(time.Hour)
	hold.Stop()
	defer hold.Stop()
	var last time.Time
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-urgent:
		case <-kick:
			if wait := ackCoalesce - time.Since(last); wait > 0 {
				hold.Reset(wait)
				select {
				case <-ctx.Done():
					return nil
				case <-urgent:
					hold.Stop()
				case <-hold.C:
				}
			}
		case <-t.C:
		}
		// Positions are read now, not when kicked: kicks that pile up while
		// a Send blocks collapse into one ack of the latest positions.
		ack := s.positions()
		ack.TimeUnixNano = s.now().UnixNano()
		if err := stream.Send(&walshipv1.StreamRequest{Msg: &walshipv1.StreamRequest_Ack{Ack: ack}}); err != nil {
			return err
		}
		last = time.Now()
		if !t.Stop() {
			select {
			case <-t.C:
			default:
			}
		}
		t.Reset(s.cfg.HeartbeatInterval)
	}
}

// positions reads the cumulative positions, latest stage first, so that
// applied <= flushed <= written holds in every ack.
func (s *Server) positions() *walshipv1.ReplicaAck {
	visible := s.rd.lsn.Load()
	applied := s.appliedLSN()
	flushed := s.wal.DurableLSN()
	written := s.wal.LastLSN()
	if s.wal.Err() != nil {
		// A write or fsync failed: what is past the durable LSN may not
		// be in the WAL at all, so it is not reported as written (the
		// replica is on its way down; this is its last word).
		written = max(flushed, applied)
	}
	return &walshipv1.ReplicaAck{WrittenLsn: written, FlushedLsn: max(flushed, applied), AppliedLsn: applied, VisibleLsn: proto.Uint64(min(visible, applied))}
}

// acceptPrimary checks a heartbeat against the replica's cluster and
// promise: a primary of another cluster is refused (the stream ends, and
// the replica neither promises it anything nor follows it); an older
// epoch is a deposed primary's (refused too); the primary's cluster id is
// adopted, durably, if the replica had none; a newer epoch is promised,
// durably, to the primary that sent it. The primary of an epoch promised
// for the log's entries alone, which named no one, is recorded as the
// promise's primary.
func (s *Server) acceptPrimary(hb *walshipv1.Heartbeat) error {
	s.voteMu.Lock()
	defer s.voteMu.Unlock()
	if err := rpcerr.CheckClusterID("heartbeat.cluster_id", hb.GetClusterId()); err != nil {
		return &refusal{reason: reasonDecode, err: err}
	}
	// Kept in the vote file once learnt: checked as a candidate's are.
	if err := datadir.ValidatePrimary(hb.GetPrimaryId(), hb.GetPrimaryAddr()); err != nil {
		return &refusal{reason: reasonDecode, err: status.Error(codes.InvalidArgument, "heartbeat."+err.Error())}
	}
	st := s.acceptor().Heartbeat(failover.Heartbeat{Epoch: hb.GetEpoch(), Primary: hb.GetPrimaryId(), Addr: hb.GetPrimaryAddr(),
		Cluster: hb.GetClusterId(), Bound: datadir.MaxEpochJump})
	if r := st.Refused; r != nil {
		switch r.Reason {
		case failover.OtherCluster:
			return s.clusterRefused(hb.GetClusterId(), primaryPeer(hb))
		case failover.EpochAhead:
			return &refusal{reason: reasonEpoch, err: fmt.Errorf("heartbeat.epoch: %w", r.Err), ahead: true}
		}
		return &refusal{reason: reasonEpoch, err: fmt.Errorf("heartbeat from epoch %d: this replica has promised epoch %d (%s)", r.Epoch, r.Vote.Epoch, r.Vote.String())}
	}
	return s.persist(st.Effects)
}
