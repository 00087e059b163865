package replica

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"time"

	walshipv1 "github.com/walship/walship/gen/walship/v1"
	"github.com/walship/walship/internal/backoff"
	"github.com/walship/walship/internal/changefeed"
	"github.com/walship/walship/internal/datadir"
	"github.com/walship/walship/internal/envelope"
	"github.com/walship/walship/internal/failover"
	"github.com/walship/walship/internal/rpcerr"
	"github.com/walship/walship/internal/wal"
	"github.com/walship/walship/pkg/codec"
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

// errFatal marks an error that ends the follower (and Run): the WAL failed.
var errFatal = errors.New("replica: fatal")

// refusal is a batch that failed a check: never written, never applied.
type refusal struct {
	reason string
	err    error
	// ahead: the primary stated an epoch more than datadir.MaxEpochJump
	// above the promise. It is not taken from the primary; the log stores
	// may vouch for it (askLogStore).
	ahead bool
}

func (r *refusal) Error() string { return fmt.Sprintf("refused batch (%s): %v", r.reason, r.err) }
func (r *refusal) Unwrap() error { return r.err }

func (s *Server) setRung(r walshipv1.CatchUpRung) {
	if walshipv1.CatchUpRung(s.rung.Swap(int32(r))) != r {
		s.logger.Info("catch-up rung", "rung", rungLabel(r), "next_lsn", s.wal.LastLSN()+1)
	}
	s.metrics.setRung(r)
}

// follow walks the catch-up ladder until ctx is done (nil) or the WAL fails
// (the error).
func (s *Server) follow(ctx context.Context) error {
	l := &ladder{rung: walshipv1.CatchUpRung_CATCH_UP_RUNG_PRIMARY, lastPrimary: s.primary()}
	for ctx.Err() == nil {
		s.setRung(l.rung)
		progress, err := s.climb(ctx, l.rung)
		if errors.Is(err, errFatal) {
			s.logger.Error("replica stopped: its WAL failed", "err", err)
			return err
		}
		if ctx.Err() != nil {
			return nil
		}
		next, err := s.afterRung(ctx, l, progress, err)
		if err != nil {
			s.logger.Error("replica stopped: its WAL failed", "err", err)
			return err
		}
		switch next {
		case retrySoon:
			t := time.NewTimer(notYetPrimaryRetry)
			select {
			case <-t.C:
			case <-ctx.Done():
				t.Stop()
				return nil
			}
		case retryAfterBackoff:
			if p := s.primary(); p != l.lastPrimary {
				// A new primary to follow (a fence, a refusal naming it):
				// it may be restarting its server as it changes role; try
				// again soon rather than at the failures' backoff.
				l.lastPrimary = p
				l.bo.Reset()
			}
			if !s.waitRetry(ctx, &l.bo) {
				return nil
			}
		}
	}
	return nil
}

// ladder is where the follower is on the catch-up ladder and how its
// failures stand.
type ladder struct {
	rung        walshipv1.CatchUpRung
	bo          backoff.Backoff
	failures    int    // streams ended by a failure since one made progress
	lastPrimary string // the primary followed when the last failure was waited out
	// primaryDown: the archive rung was taken because the primary kept
	// failing; after it the replica goes back to the primary, not to the
	// log stores (whose tail may not have reached a majority yet, and a
	// failover may be under way). archiveAsked is when that last happened:
	// while the primary stays down the archive is listed again only every
	// archiveWhilePrimaryDown.
	primaryDown  bool
	archiveAsked time.Time
}

// archiveWhilePrimaryDown is how often a replica whose primary does not
// answer looks in the archive for what it lacks (a listing of the whole
// archive each time).
const archiveWhilePrimaryDown = 30 * time.Second

// retry is how soon the follower climbs its next rung.
type retry int

const (
	retryNow          retry = iota // at once: a rung change or a cut is no failure
	retrySoon                      // after notYetPrimaryRetry: a candidate not open yet
	retryAfterBackoff              // after the failures' backoff
)

// climb runs one rung: a stream from the primary, a read from the log
// store, a re-seed or a read of the archive. progress reports whether
// anything was applied.
func (s *Server) climb(ctx context.Context, rung walshipv1.CatchUpRung) (progress bool, err error) {
	switch rung {
	case walshipv1.CatchUpRung_CATCH_UP_RUNG_PRIMARY:
		return s.streamFromPrimary(ctx)
	case walshipv1.CatchUpRung_CATCH_UP_RUNG_LOGSTORE:
		return s.readLogStore(ctx)
	case walshipv1.CatchUpRung_CATCH_UP_RUNG_ARCHIVE:
		return s.readArchive(ctx)
	default:
		return s.reseed(ctx)
	}
}

// afterRung picks the rung to climb next from how the last one ended, and
// how soon. Its error is fatal: the WAL failed cutting a diverged tail.
func (s *Server) afterRung(ctx context.Context, l *ladder, progress bool, err error) (retry, error) {
	var div *divergedError
	switch {
	case errors.As(err, &div):
		return retryNow, s.afterDiverged(l, div)
	case l.rung == walshipv1.CatchUpRung_CATCH_UP_RUNG_LOGSTORE:
		return s.afterLogStore(l, progress, err), nil
	case l.rung == walshipv1.CatchUpRung_CATCH_UP_RUNG_SNAPSHOT:
		return s.afterReseed(l, err), nil
	case l.rung == walshipv1.CatchUpRung_CATCH_UP_RUNG_ARCHIVE:
		return s.afterArchive(l, progress, err), nil
	default:
		return s.afterStream(ctx, l, progress, err), nil
	}
}

// afterDiverged cuts the entries the primary does not have and reconnects,
// or, if it cannot cut them, goes to the snapshot rung. Either way it is
// not a failure: no backoff.
func (s *Server) afterDiverged(l *ladder, div *divergedError) error {
	cut, err := s.cutDiverged(div.keep)
	if err != nil {
		return err
	}
	s.metrics.diverged.Inc()
	if cut {
		s.logger.Warn("cut entries the primary lost in a crash; reconnecting", "truncate_after_lsn", div.keep, "epoch", div.epoch)
		return nil
	}
	s.logger.Warn("cannot cut this replica's log where the primary diverged (it applied past the cut, or the cut is inside a batch); re-seeding from a snapshot",
		"truncate_after_lsn", div.keep, "applied_lsn", s.appliedLSN(), "epoch", div.epoch)
	l.rung = walshipv1.CatchUpRung_CATCH_UP_RUNG_SNAPSHOT
	return nil
}

// afterLogStore goes back to the primary if the log store supplied
// something, and on to a snapshot if not.
func (s *Server) afterLogStore(l *ladder, progress bool, err error) retry {
	if progress {
		l.rung = walshipv1.CatchUpRung_CATCH_UP_RUNG_PRIMARY
		l.bo.Reset()
		return retryNow
	}
	s.logger.Warn("the log store cannot supply the LSN this replica needs; re-seeding from a snapshot",
		"next_lsn", s.wal.LastLSN()+1, "err", err)
	l.rung = walshipv1.CatchUpRung_CATCH_UP_RUNG_SNAPSHOT
	return retryNow
}

// afterReseed goes back to the primary after a re-seed, or after a failed
// one that may fall back to streaming.
func (s *Server) afterReseed(l *ladder, err error) retry {
	if err == nil {
		l.rung = walshipv1.CatchUpRung_CATCH_UP_RUNG_PRIMARY
		l.bo.Reset()
		return retryNow
	}
	if !s.reseedBack {
		if s.arch != nil {
			// Neither the log stores nor the primary could re-seed this
			// replica: the archive may.
			s.logger.Warn("re-seeding from the primary's snapshot failed; trying the archive", "err", err)
			l.rung = walshipv1.CatchUpRung_CATCH_UP_RUNG_ARCHIVE
			return retryNow
		}
		// A forward re-seed can fall back to streaming; one that must undo
		// a diverged tail has to finish first (the primary would stream
		// onto that tail).
		l.rung = walshipv1.CatchUpRung_CATCH_UP_RUNG_PRIMARY
	}
	s.logger.Error("re-seeding from the primary's snapshot failed", "err", err, "retry_rung", rungLabel(l.rung))
	return retryAfterBackoff
}

// afterArchive goes on after the archive rung: if it brought the replica
// forward, to the log stores for what follows the archive (or straight to
// the primary when it was the primary's failures that led here, or there
// is no log store); if not, back to the primary, after the failures'
// backoff.
func (s *Server) afterArchive(l *ladder, progress bool, err error) retry {
	down := l.primaryDown
	l.primaryDown = false
	l.rung = walshipv1.CatchUpRung_CATCH_UP_RUNG_PRIMARY
	if progress {
		if len(s.logstores) > 0 && !down {
			l.rung = walshipv1.CatchUpRung_CATCH_UP_RUNG_LOGSTORE
		}
		if err != nil {
			s.logger.Warn("the archive rung stopped early", "applied_lsn", s.appliedLSN(), "err", err)
		}
		l.bo.Reset()
		return retryNow
	}
	if errors.Is(err, errNothingArchived) {
		s.logger.Info("nothing in the archive for this replica; back to the primary", "next_lsn", s.wal.LastLSN()+1, "why", err)
	} else {
		s.logger.Warn("the archive cannot serve this replica; back to the primary", "next_lsn", s.wal.LastLSN()+1, "err", err)
	}
	return retryAfterBackoff
}

// afterStream handles the end of a stream from the primary: down a rung if
// the primary no longer retains what the replica needs, to another primary
// if the node named one, and otherwise a failure to retry.
func (s *Server) afterStream(ctx context.Context, l *ladder, progress bool, err error) retry {
	code := status.Code(err)
	var ref *refusal
	switch {
	case rpcerr.IsOtherCluster(err):
		// Pointed at a primary of another cluster (or it at us): never
		// follow it. Only an operator can tell which side is wrong.
		if refuser, _, ok := rpcerr.ClusterIDs(err); ok && refuser != s.cluster.ID() {
			s.metrics.clusterMismatch.Inc() // the primary's refusal (this replica's own is counted where made)
		}
		s.logger.Error("the primary belongs to another cluster: not following it (check --primary and the data directory); retrying",
			"primary", s.primary(), "cluster_id", s.cluster.ID(), "err", err)
	case code == codes.OutOfRange:
		next := walshipv1.CatchUpRung_CATCH_UP_RUNG_SNAPSHOT
		if len(s.logstores) > 0 {
			next = walshipv1.CatchUpRung_CATCH_UP_RUNG_LOGSTORE
		}
		s.logger.Warn("the primary no longer retains the LSN this replica needs", "next_lsn", s.wal.LastLSN()+1,
			"then", rungLabel(next), "err", err)
		l.rung = next
		return retryNow // a rung change is not a failure: no backoff
	case errors.As(err, &ref):
		s.logger.Error("refused a batch from the primary; reconnecting", "reason", ref.reason, "err", ref.err,
			"next_lsn", s.wal.LastLSN()+1)
		if ref.ahead {
			// A promotion while this replica was away may have fenced the
			// others in steps past the jump: the log stores know.
			s.askLogStore(ctx)
		}
	case s.namedByOtherCluster(err):
		// A node of another cluster named its primary: not ours to follow.
	case s.learnPrimary(err):
		// Asked a node that is not the primary: it named the one it
		// knows, which this replica follows from now on.
		return retryNow
	case s.isNotPrimary(err):
		// The node this replica promised is not the primary yet: a
		// candidate still catching up or waiting out the old primary's
		// lease. Ask again shortly; it opens within a lease.
		return retrySoon
	case s.namedAhead(err):
		// A promotion while this replica was away may have fenced the
		// others in steps past the jump: the log stores know.
		s.logger.Warn("a node that is not the primary names a primary too far ahead to take its word for; asking the log stores", "node", s.primary(), "err", err)
		s.askLogStore(ctx)
	case code == codes.FailedPrecondition:
		// Diverged, ahead of the primary, or in a newer epoch: this needs
		// an operator's judgement, never an automatic wipe.
		s.logger.Error("the primary refuses this replica (diverged, ahead, or a stale primary); retrying",
			"next_lsn", s.wal.LastLSN()+1, "epoch", s.epoch.Load(), "err", err)
	case code == codes.InvalidArgument:
		s.logger.Error("the primary rejected the replication hello", "id", s.cfg.ID, "err", err)
	default:
		if progress {
			l.bo.Reset()
			l.failures = 0
		}
		s.logger.Warn("replication stream ended; reconnecting", "next_lsn", s.wal.LastLSN()+1, "err", err)
		if l.failures++; l.failures%5 == 0 {
			// The primary has been away a while: a failover may have
			// happened while this replica could not be fenced. The log
			// store knows the newest epoch's primary.
			before := s.primary()
			s.askLogStore(ctx)
			if s.arch != nil && s.primary() == before && time.Since(l.archiveAsked) >= archiveWhilePrimaryDown {
				// Meanwhile the archive may hold what this replica lacks
				// (it is new, or it was away): only LSNs a log-store
				// majority held, which no failover takes back.
				s.logger.Info("the primary is still unreachable; reading the archive meanwhile", "primary", before, "next_lsn", s.wal.LastLSN()+1)
				l.rung, l.primaryDown, l.archiveAsked = walshipv1.CatchUpRung_CATCH_UP_RUNG_ARCHIVE, true, time.Now()
				return retryNow
			}
		}
	}
	return retryAfterBackoff
}

// waitRetry waits out bo, or less if the primary to follow changes; it
// reports false when ctx ended.
func (s *Server) waitRetry(ctx context.Context, bo *backoff.Backoff) bool {
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		select {
		case <-s.newPrimary:
			cancel()
		case <-wctx.Done():
		}
	}()
	bo.Wait(wctx)
	return ctx.Err() == nil
}

// notYetPrimaryRetry is how soon a replica asks again a candidate that
// is not the primary yet.
const notYetPrimaryRetry = 20 * time.Millisecond

// silence is how long a stream from the primary or a log store may bring
// nothing before the replica gives up on it: ten heartbeats, at least 5 s.
func (s *Server) silence() time.Duration { return max(10*s.cfg.HeartbeatInterval, 5*time.Second) }

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
		s.connected.Store(false)
	}()
	defer ps.flushTimer.Stop()
	// Whatever was written when the stream ends is flushed, and applied as
	// far as the primary said it is durable; the rest waits in s.unapplied.
	defer func() {
		if len(s.unapplied) > 0 {
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
	s.streamMu.Lock()
	s.streamCancel = cancel
	s.streamMu.Unlock()
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
		s.connected.Store(true)
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
		s.primaryDurable = max(s.primaryDurable, m.GetDurableLsn())
		s.primaryDurableSeen.Store(s.primaryDurable)
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
	case replyNow || refused != nil || (unflushed && len(s.unapplied) >= maxRound) || s.cfg.FlushDelay <= 0:
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

// checked is a batch that passed every check, decoded, waiting to be applied.
type checked struct {
	env   *walshipv1.WalBatch
	batch codec.Batch
	data  []byte
	// spilled: only env's LSNs are kept (the batch is read back from the
	// WAL to be applied); held counts the bytes kept in memory otherwise.
	spilled bool
	held    int64
}

// check verifies one batch against the position it must continue (next)
// with the donor-batch check every copy of a batch runs
// (failover.CheckDonorBatch, as a candidate's catch-up does): CRC and
// envelope sanity, epoch (at most bound above the promise: the primary's
// batches by datadir.MaxEpochJump, a log store's it asked for by
// MaxEpochGap; not older than the log's), continuity, then decoding into
// whole transactions.
func (s *Server) check(env *walshipv1.WalBatch, next, epoch, bound uint64, c *checked) error {
	if err := failover.CheckDonorHead(env, next, epoch, s.vote.Load().Epoch, bound); err != nil {
		return donorRefusal(err)
	}
	start := time.Now()
	err := failover.CheckDonorWhole(env, &c.batch)
	if cd, cerr := codec.ByID(codec.ID(env.GetCodec())); cerr == nil {
		s.metrics.decodeSeconds.WithLabelValues(cd.Name()).Observe(time.Since(start).Seconds())
	}
	if err != nil {
		return donorRefusal(err)
	}
	data, err := envelope.Marshal(env)
	if err != nil {
		return &refusal{reason: reasonDecode, err: err}
	}
	c.env, c.data = env, data
	return nil
}

// donorRefusal is the replica's refusal for a failed donor-batch check.
func donorRefusal(err error) error {
	var de *failover.DonorError
	if !errors.As(err, &de) {
		return &refusal{reason: reasonDecode, err: err}
	}
	switch de.Reason {
	case failover.DonorCRC:
		return &refusal{reason: reasonCRC, err: de.Err}
	case failover.DonorEpochAhead:
		return &refusal{reason: reasonEpoch, err: de.Err, ahead: true}
	case failover.DonorEpochStale:
		return &refusal{reason: reasonEpoch, err: de.Err}
	case failover.DonorGap:
		return &refusal{reason: reasonGap, err: de.Err}
	}
	return &refusal{reason: reasonDecode, err: de.Err}
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
	if err := checkClusterID("heartbeat.cluster_id", hb.GetClusterId()); err != nil {
		return &refusal{reason: reasonDecode, err: err}
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

// write runs the first half of a round: it checks the batches in order,
// writes the good prefix with one append, adds it to s.unapplied (to be
// flushed and applied) and calls written (to ack the write at once). It
// returns the first refusal (or a fatal WAL error). streamEpoch is the
// sending primary's epoch (0 from a log store): batches from a primary
// older than the replica's promise are refused, checked under walMu so
// that none is written after a fence. Batches of an epoch newer than the
// promise raise it first (failover.State.Entries; I2).
func (s *Server) write(round []*walshipv1.WalBatch, streamEpoch uint64, written func()) error {
	good := make([]checked, len(round))
	next, epoch := s.wal.LastLSN()+1, s.epoch.Load()
	bound := uint64(datadir.MaxEpochJump)
	if streamEpoch == 0 {
		bound = datadir.MaxEpochGap // from a log store
	}
	var refused error
	n := 0
	for i, env := range round {
		if err := s.check(env, next, epoch, bound, &good[i]); err != nil {
			var ref *refusal
			if errors.As(err, &ref) {
				s.metrics.refused.WithLabelValues(ref.reason).Inc()
			}
			refused = err
			break
		}
		s.lag.batch(env.GetLastLsn(), time.Unix(0, env.GetCommitTimeUnixNano()), s.now())
		next, epoch = env.GetLastLsn()+1, max(epoch, env.GetEpoch())
		n++
	}
	if n == 0 {
		return refused
	}
	good = good[:n]
	if err := s.appendRound(good, streamEpoch, epoch); err != nil {
		return err
	}
	s.keepUnapplied(good)
	if written != nil {
		written()
	}
	return refused
}

// appendRound writes a round's checked batches with one append (its first
// half's write). newest is the newest epoch they leave the log in. The
// batches of a primary older than the promise are refused; the rest are
// written only once the promise and the history they need are durable.
func (s *Server) appendRound(good []checked, streamEpoch, newest uint64) error {
	if newest > s.vote.Load().Epoch {
		// voteMu before walMu, as Fence takes them.
		s.voteMu.Lock()
		defer s.voteMu.Unlock()
	}
	s.walMu.Lock()
	defer s.walMu.Unlock()
	heads := make([]failover.Entry, len(good))
	for i := range good {
		heads[i] = failover.Entry{Epoch: good[i].env.GetEpoch(), FirstLSN: good[i].env.GetFirstLsn(), LastLSN: good[i].env.GetLastLsn()}
	}
	// The history decides which epochs are new to the log (a directory
	// from before histories may know a newer epoch than its history).
	as := s.acceptor()
	as.LogEpoch = s.history.Load().Current().Epoch
	st := as.Entries(streamEpoch, heads)
	if r := st.Refused; r != nil {
		s.metrics.refused.WithLabelValues(reasonEpoch).Add(float64(len(good)))
		return &refusal{reason: reasonEpoch, err: fmt.Errorf("batches from a primary of epoch %d: this replica has promised epoch %d (%s)", streamEpoch, r.Vote.Epoch, r.Vote.String())}
	}
	// The promise and the history are durable before anything of a new
	// epoch is written (voteMu held if the promise grows: taken above).
	if err := s.persist(st.Effects); err != nil {
		return err
	}
	entries := make([]wal.Entry, len(good))
	for i := range good {
		entries[i] = wal.Entry{FirstLSN: good[i].env.GetFirstLsn(), LastLSN: good[i].env.GetLastLsn(), Data: good[i].data}
	}
	if err := s.wal.Append(entries...); err != nil {
		return fmt.Errorf("%w: wal append: %w", errFatal, err)
	}
	return nil
}

// flushApply runs the second half of one or more rounds: one fsync for
// every written batch, then applyReady.
func (s *Server) flushApply() (int, error) {
	if len(s.unapplied) == 0 {
		return 0, nil
	}
	if s.wal.DurableLSN() < s.wal.LastLSN() {
		if err := s.syncWAL(); err != nil {
			return 0, err
		}
	}
	return s.applyReady()
}

// applyReady applies, in order, the written batches that are both flushed
// here and durable on the primary: the primary sends batches before its own
// fsync, and a replica must never serve a write that a crash of the primary
// could take back. It returns how many it applied.
func (s *Server) applyReady() (int, error) {
	limit := min(s.wal.DurableLSN(), s.primaryDurable)
	st := s.store.Load()
	var rd *wal.Reader // reads spilled batches back, if any
	defer func() {
		if rd != nil {
			rd.Close()
		}
	}()
	n := 0
	commit := s.rd.commitLSN()
	for ; n < len(s.unapplied) && s.unapplied[n].env.GetLastLsn() <= limit; n++ {
		c := &s.unapplied[n]
		if c.spilled {
			if err := s.unspill(&rd, c); err != nil {
				s.dropUnapplied(n)
				return n, err
			}
		}
		commitTime := c.env.GetCommitTimeUnixNano()
		txns := changefeed.Build(c.batch.Records, func(uint64) int64 { return commitTime }, st)
		if err := st.Apply(&c.batch); err != nil {
			// Written and synced but not appliable: the WAL and the state
			// disagree, and recovery would fail the same way. Stop rather
			// than serve a state that skips a batch.
			err = fmt.Errorf("%w: apply LSNs %d..%d: %w", errFatal, c.env.GetFirstLsn(), c.env.GetLastLsn(), err)
			s.dropUnapplied(n) // c points into s.unapplied: formatted first
			return n, err
		}
		s.feed.Append(txns)
		s.metrics.appliedRecords.Add(float64(len(c.batch.Records)))
		s.metrics.appliedBytes.Add(float64(len(c.env.GetPayload())))
		if last := c.env.GetLastLsn(); last == commit && n+1 < len(s.unapplied) && s.unapplied[n+1].env.GetLastLsn() <= limit {
			// The watermark ends here and the round goes on: keep a view
			// of this point, readable at once.
			s.rd.applied(st.Snapshot())
		}
	}
	if n == 0 {
		return 0, nil
	}
	s.rd.applied(st.Snapshot())
	s.dropUnapplied(n)
	applied := st.AppliedLSN()
	s.visible.Advance(applied)
	s.lag.advance(applied)
	s.maybeSnapshot()
	s.saveAppliedMarker(false)
	return n, nil
}

// keepUnapplied adds written batches to s.unapplied. Decoded batches are
// kept in memory up to MaxUnappliedBytes of payload; past that only their
// LSNs are, and applyReady reads them back from the WAL. The bound matters
// when the primary's durable LSN stalls (a slow or stuck fsync, a long
// --async-flush-interval) while its batches keep arriving.
func (s *Server) keepUnapplied(cs []checked) {
	spilled := 0
	for i := range cs {
		c := &cs[i]
		c.data = nil // written to the WAL: not needed again
		size := int64(len(c.env.GetPayload()))
		if s.unappliedBytes+size <= s.cfg.MaxUnappliedBytes {
			c.held = size
			s.unappliedBytes += size
			continue
		}
		if now := s.now(); now.Sub(s.spillWarned) >= time.Minute {
			s.spillWarned = now
			s.logger.Warn("batches waiting for the primary's durable LSN exceed --max-unapplied-bytes; the rest are kept on disk only and read back to be applied",
				"max_unapplied_bytes", s.cfg.MaxUnappliedBytes, "primary_durable_lsn", s.primaryDurable, "from_lsn", c.env.GetFirstLsn())
		}
		*c = spilledBatch(c.env.GetFirstLsn(), c.env.GetLastLsn())
		spilled++
	}
	s.unapplied = append(s.unapplied, cs...)
	s.observeUnapplied(spilled)
}

// spilledBatch is a batch of s.unapplied kept in the WAL only.
func spilledBatch(first, last uint64) checked {
	return checked{env: &walshipv1.WalBatch{FirstLsn: first, LastLsn: last}, spilled: true}
}

// unspill reads spilled batch c back from the WAL with *rd (opened at c's
// first LSN if nil) and decodes it into c.
func (s *Server) unspill(rd **wal.Reader, c *checked) error {
	first := c.env.GetFirstLsn()
	if *rd == nil {
		r, err := s.wal.NewReader(first, false)
		if err != nil {
			return fmt.Errorf("%w: read back LSNs %d..%d from the wal: %w", errFatal, first, c.env.GetLastLsn(), err)
		}
		*rd = r
	}
	// The entry was written and synced before it could be applied: Next
	// does not wait for it; the timeout only turns a bug into an error.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var e wal.Entry
	var err error
	for {
		// Batches kept in memory may sit between spilled ones: skip them.
		if e, err = (*rd).Next(ctx); err != nil || e.LastLSN >= first {
			break
		}
	}
	if err == nil && (e.FirstLSN != first || e.LastLSN != c.env.GetLastLsn()) {
		err = fmt.Errorf("wal entry is LSNs %d..%d", e.FirstLSN, e.LastLSN)
	}
	var env walshipv1.WalBatch
	if err == nil {
		err = envelope.DecodeStored(e.Data, &env, &c.batch)
	}
	if err != nil {
		return fmt.Errorf("%w: read back LSNs %d..%d from the wal: %w", errFatal, first, c.env.GetLastLsn(), err)
	}
	c.env, c.spilled = &env, false
	return nil
}

// dropUnapplied removes the first n batches of s.unapplied.
func (s *Server) dropUnapplied(n int) {
	s.forgetUnapplied(s.unapplied[:n])
	rest := copy(s.unapplied, s.unapplied[n:])
	clear(s.unapplied[rest:])
	s.unapplied = s.unapplied[:rest]
}

// forgetUnapplied releases the memory accounting of batches leaving
// s.unapplied.
func (s *Server) forgetUnapplied(cs []checked) {
	for i := range cs {
		s.unappliedBytes -= cs[i].held
	}
	s.observeUnapplied(0)
}

// observeUnapplied updates the metrics after batches were spilled or
// s.unapplied changed.
func (s *Server) observeUnapplied(spilled int) {
	if s.metrics == nil {
		return // recovering: New reports them once the metrics exist
	}
	s.metrics.spilled.Add(float64(spilled))
	s.metrics.unapplied.Set(float64(s.unappliedBytes))
}

// process runs one whole round (write, fsync, apply), for the log store
// rung: a log store holds only what the primary made durable.
func (s *Server) process(round []*walshipv1.WalBatch, written func()) (int, error) {
	before := s.wal.LastLSN()
	refused := s.write(round, 0, written)
	if len(s.unapplied) == 0 {
		return 0, refused
	}
	// Only what this round wrote is the log store's word; what the primary
	// sent before it (still unapplied) is durable only as far as that goes.
	if last := s.wal.LastLSN(); last > before {
		s.primaryDurable = max(s.primaryDurable, last)
	}
	n, err := s.flushApply()
	if err != nil {
		return n, err
	}
	return n, refused
}

// syncWAL fsyncs the WAL. Any WAL error is fatal: after a failed write or
// fsync the log is broken for good (see package wal), and the replica must
// stop acking.
func (s *Server) syncWAL() error {
	s.walMu.Lock()
	defer s.walMu.Unlock()
	start := time.Now()
	err := s.wal.Sync()
	s.metrics.fsyncSeconds.Observe(time.Since(start).Seconds())
	if err != nil {
		s.metrics.fsyncErrors.Inc()
		return fmt.Errorf("%w: wal fsync: %w", errFatal, err)
	}
	return nil
}
