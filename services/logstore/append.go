package logstore

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"sync"
	"sync/atomic"
	"time"

	walshipv1 "github.com/walship/walship/gen/walship/v1"
	"github.com/walship/walship/internal/datadir"
	"github.com/walship/walship/internal/envelope"
	"github.com/walship/walship/internal/failover"
	"github.com/walship/walship/internal/rpcerr"
	"github.com/walship/walship/internal/wal"
	"github.com/walship/walship/internal/watermark"
	"github.com/walship/walship/pkg/codec"
	"golang.org/x/sync/semaphore"
)

// appendReq is one AppendRequest on its way to the writer goroutine.
type appendReq struct {
	st     *appendStream
	env    *walshipv1.WalBatch // nil for a heartbeat alone
	data   []byte              // envelope.Marshal(env): the bytes stored
	hb     *walshipv1.Heartbeat
	weight int64 // bytes held against the stream's queue budget
	// cut, with truncate, asks to cut the log after cutAfter.
	cut      bool
	cutAfter uint64
	// fence is a Fence request (st is nil): answered on fenced, by the
	// writer, in queue order.
	fence  *walshipv1.FenceRequest
	fenced chan fenceResult
	// refill marks a batch copied from a peer (st is the refill's own
	// stream, registered nowhere): admitted by admitRefill.
	refill *refill
}

// appendStream is the state one Append stream shares between its receiving
// goroutine, its sending goroutine (the handler) and the writer.
type appendStream struct {
	// budget bounds the bytes a stream has queued for the writer, so a fast
	// primary is slowed down by the fsyncs instead of filling memory.
	budget *semaphore.Weighted
	wake   chan struct{} // capacity 1: "state changed", coalesced

	mu       sync.Mutex
	ack      *walshipv1.AppendResponse // newest ack not yet sent (acks are cumulative)
	inflight int                       // requests queued or in the writer's current round
	recvDone bool                      // the client half-closed the stream
	stopping bool                      // graceful stop: end once inflight is 0
	err      error                     // terminal error, sent after the last ack
	// epoch is the sender's epoch, as its heartbeats declare it (the
	// first message's must). Writer-only.
	epoch uint64
	// admitted is the epoch the writer last took a heartbeat of this
	// stream at (0: none yet): a heartbeat of that epoch may be echoed at
	// once (echo.go).
	admitted atomic.Uint64
	// refused is set when the writer refused one of the stream's requests:
	// it then drops the requests the stream queued after that one. (An
	// error found by the receiving goroutine stops it from queuing more, so
	// what it queued before still counts.)
	refused bool
}

func (st *appendStream) signal() {
	select {
	case st.wake <- struct{}{}:
	default:
	}
}

func (st *appendStream) stop() {
	st.mu.Lock()
	st.stopping = true
	st.mu.Unlock()
	st.signal()
}

func (st *appendStream) setErr(err error) {
	st.mu.Lock()
	if st.err == nil {
		st.err = err
	}
	st.mu.Unlock()
	st.signal()
}

func (st *appendStream) failed() bool {
	st.mu.Lock()
	defer st.mu.Unlock()
	return st.err != nil
}

func (st *appendStream) wasRefused() bool {
	st.mu.Lock()
	defer st.mu.Unlock()
	return st.refused
}

func (st *appendStream) endRecv() {
	st.mu.Lock()
	st.recvDone = true
	st.mu.Unlock()
	st.signal()
}

// finish records the outcome of n requests of one writer round: the ack to
// send (nil for none), the error that ends the stream (nil for none).
func (st *appendStream) finish(ack *walshipv1.AppendResponse, err error, n int, weight int64) {
	st.mu.Lock()
	if ack != nil {
		if st.ack != nil { // a heartbeat echoed at once, not sent yet
			ack.HeartbeatTimeUnixNano = max(ack.HeartbeatTimeUnixNano, st.ack.HeartbeatTimeUnixNano)
		}
		st.ack = ack
	}
	if err != nil {
		st.refused = true
		if st.err == nil {
			st.err = err
		}
	}
	st.inflight -= n
	st.mu.Unlock()
	st.budget.Release(weight)
	st.signal()
}

// echo sends the echo of a heartbeat sent at t, answered at once
// (echo.go): with the ack not sent yet, if there is one; else alone, with
// durable_lsn and archived_lsn 0 — it says nothing of the log, which may
// be about to change (a cut queued before it).
func (st *appendStream) echo(epoch uint64, t int64) {
	st.mu.Lock()
	if st.ack == nil {
		st.ack = &walshipv1.AppendResponse{Epoch: epoch, HeartbeatTimeUnixNano: t}
	} else { // sendAcks takes it under mu: not shared yet
		st.ack.HeartbeatTimeUnixNano = max(st.ack.HeartbeatTimeUnixNano, t)
	}
	st.mu.Unlock()
	st.signal()
}

// Append receives batches and heartbeats from a primary and acknowledges
// durable progress. One goroutine receives (receive) and this one sends.
func (h *logStoreServer) Append(stream walshipv1.LogStoreService_AppendServer) error {
	s := h.s
	st, err := s.openStream()
	if err != nil {
		return toStatus(err)
	}
	defer s.closeStream(st)
	go func() {
		defer s.active.Done()
		s.receive(stream, st)
	}()
	return toStatus(s.sendAcks(stream, st))
}

// openStream registers a new Append stream; it counts the handler and its
// receiving goroutine in s.active.
func (s *Server) openStream() (*appendStream, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case s.fatal != nil:
		return nil, refuse(rpcerr.ErrUnavailable, "log store failed: %v", s.fatal)
	case s.stopping:
		return nil, errStopping
	case s.fill.refilling.Load():
		return nil, s.errRefilling()
	}
	st := &appendStream{
		budget: semaphore.NewWeighted(2 * int64(s.cfg.MaxMessageBytes)),
		wake:   make(chan struct{}, 1),
	}
	s.streams[st] = struct{}{}
	s.active.Add(2)
	s.metrics.appendStreams.Inc()
	return st, nil
}

func (s *Server) closeStream(st *appendStream) {
	s.mu.Lock()
	delete(s.streams, st)
	s.mu.Unlock()
	if s.arch != nil {
		s.arch.streamEnded(st)
	}
	s.metrics.appendStreams.Dec()
	s.active.Done()
}

// receive reads requests, checks what can be checked without the log's
// state (in parallel with other streams: CRC, envelope shape) and queues
// them for the writer. It returns when the stream ends or fails.
func (s *Server) receive(stream walshipv1.LogStoreService_AppendServer, st *appendStream) {
	ctx := stream.Context()
	for first := true; ; first = false {
		req, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			st.endRecv()
			return
		}
		if err != nil {
			st.setErr(err)
			return
		}
		if st.failed() {
			return
		}
		r, err := checkRequest(req, s.knownEpoch(), datadir.MaxEpochJump)
		if err == nil && first {
			err = checkDeclared(req)
		}
		if err != nil {
			st.setErr(err)
			return
		}
		r.st = st
		if err := st.budget.Acquire(ctx, r.weight); err != nil {
			return // the stream is over
		}
		if err := s.enqueue(r); err != nil {
			st.budget.Release(r.weight)
			st.setErr(err)
			return
		}
		if r.hb.GetReplyRequested() && r.env == nil && !r.cut {
			// A heartbeat alone (one that comes with a batch or a cut is
			// answered with its effect).
			s.echoNow(st, r.hb)
		}
	}
}

func (s *Server) enqueue(r *appendReq) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case s.fatal != nil:
		return refuse(rpcerr.ErrUnavailable, "log store failed: %v", s.fatal)
	case s.stopping, s.w.closed:
		return errStopping
	}
	r.st.mu.Lock()
	stopping := r.st.stopping
	if !stopping {
		r.st.inflight++
	}
	r.st.mu.Unlock()
	if stopping {
		return errStopping
	}
	s.w.queue = append(s.w.queue, r)
	if r.hb.GetReplyRequested() {
		s.w.urgent = true
	}
	s.w.nQueued++
	s.w.queued.Advance(s.w.nQueued)
	select {
	case s.w.kick <- struct{}{}:
	default:
	}
	return nil
}

// sendAcks sends the stream's acks as the writer produces them, coalesced
// (only the newest is sent if several are waiting), and ends the stream once
// nothing is in flight and it failed, was half-closed or the log store is
// stopping.
func (s *Server) sendAcks(stream walshipv1.LogStoreService_AppendServer, st *appendStream) error {
	ctx := stream.Context()
	for {
		select {
		case <-st.wake:
		case <-ctx.Done():
			return ctx.Err()
		}
		st.mu.Lock()
		ack, err := st.ack, st.err
		st.ack = nil
		done := false
		if st.inflight == 0 {
			switch {
			case err != nil, st.recvDone:
				done = true
			case st.stopping:
				done, err = true, errStopping
			}
		}
		st.mu.Unlock()
		if ack != nil {
			if err := stream.Send(ack); err != nil {
				return err
			}
		}
		if done {
			return err
		}
	}
}

// checkRequest validates a request on its own, before it reaches the
// writer: an envelope with a bad shape, or an epoch more than bound above
// known (the log store's newest epoch: it only grows, so what passes here
// passes at the writer too; bound is datadir.MaxEpochJump for a
// primary's stream, MaxEpochGap for a refill's peer), is a bad argument,
// a payload whose CRC does not match is data loss.
func checkRequest(req *walshipv1.AppendRequest, known, bound uint64) (*appendReq, error) {
	hb := req.GetHeartbeat()
	if req.GetBatch() == nil && hb == nil && !req.GetTruncate() {
		return nil, refuse(rpcerr.ErrInvalid, "append request: batch, heartbeat or truncate required")
	}
	if req.GetTruncate() && req.GetBatch() != nil {
		return nil, refuse(rpcerr.ErrInvalid, "append request: truncate and a batch in one request")
	}
	if err := rpcerr.CheckClusterID("heartbeat.cluster_id", hb.GetClusterId()); err != nil {
		return nil, err
	}
	// Kept in the vote file once learnt: checked as a candidate's are.
	if err := datadir.ValidatePrimary(hb.GetPrimaryId(), hb.GetPrimaryAddr()); err != nil {
		return nil, refuse(rpcerr.ErrInvalid, "heartbeat.%v", err)
	}
	if err := datadir.CheckEpoch(hb.GetEpoch(), known, bound); err != nil {
		return nil, refuse(rpcerr.ErrInvalid, "heartbeat.epoch: %v", err)
	}
	r := &appendReq{hb: hb, weight: 1, cut: req.GetTruncate(), cutAfter: req.GetTruncateAfterLsn()}
	if env := req.GetBatch(); env != nil {
		if err := checkBatch(env, known, bound); err != nil {
			return nil, err
		}
		data, err := envelope.Marshal(env)
		if err != nil {
			return nil, fmt.Errorf("marshal batch %d..%d: %w", env.FirstLsn, env.LastLsn, err)
		}
		r.env, r.data, r.weight = env, data, int64(len(data))+1
	}
	return r, nil
}

// checkDeclared refuses the first request of a stream unless its heartbeat
// declares the sender's epoch. Every rule of admit is about that epoch: a
// stream that never stated one would pass the fence as "no epoch", and
// its truncate would cut any log.
func checkDeclared(req *walshipv1.AppendRequest) error {
	if req.GetHeartbeat().GetEpoch() == 0 {
		return refuse(rpcerr.ErrInvalid, "heartbeat.epoch: the first message of an Append stream must carry a heartbeat declaring the sender's epoch")
	}
	return nil
}

func checkBatch(b *walshipv1.WalBatch, known, bound uint64) error {
	switch {
	case b.Epoch == 0:
		return refuse(rpcerr.ErrInvalid, "batch.epoch: must be at least 1")
	case datadir.CheckEpoch(b.Epoch, known, bound) != nil:
		return refuse(rpcerr.ErrInvalid, "batch.epoch: %v", datadir.CheckEpoch(b.Epoch, known, bound))
	case b.FirstLsn == 0:
		return refuse(rpcerr.ErrInvalid, "batch.first_lsn: must be at least 1 (LSNs start at 1)")
	case b.LastLsn < b.FirstLsn:
		return refuse(rpcerr.ErrInvalid, "batch.last_lsn: %d is before first_lsn %d", b.LastLsn, b.FirstLsn)
	case b.LastLsn == math.MaxUint64:
		return refuse(rpcerr.ErrInvalid, "batch.last_lsn: %d is out of range", b.LastLsn)
	case b.PrevLsn != b.FirstLsn-1:
		return refuse(rpcerr.ErrInvalid, "batch.prev_lsn: %d, want first_lsn-1 = %d", b.PrevLsn, b.FirstLsn-1)
	case b.Codec <= 0 || b.Codec > math.MaxUint8:
		return refuse(rpcerr.ErrInvalid, "batch.codec: %v is not a known codec (LSNs %d..%d)", b.Codec, b.FirstLsn, b.LastLsn)
	case len(b.Payload) == 0:
		return refuse(rpcerr.ErrInvalid, "batch.payload: empty (LSNs %d..%d)", b.FirstLsn, b.LastLsn)
	}
	if _, err := codec.ByID(codec.ID(b.Codec)); err != nil {
		return refuse(rpcerr.ErrInvalid, "batch.codec: %v is not a known codec (LSNs %d..%d)", b.Codec, b.FirstLsn, b.LastLsn)
	}
	if err := envelope.Verify(b); err != nil {
		return refuse(rpcerr.ErrCorrupt, "batch LSNs %d..%d (epoch %d): %v", b.FirstLsn, b.LastLsn, b.Epoch, err)
	}
	// The CRC matched, so the payload arrived as sent; one that does not
	// hold exactly the envelope's LSNs, ending with a commit, was built
	// wrong by the sender.
	var cb codec.Batch
	if err := envelope.DecodePayload(b, &cb); err != nil {
		return refuse(rpcerr.ErrInvalid, "batch.payload: does not match its envelope (LSNs %d..%d): %v", b.FirstLsn, b.LastLsn, err)
	}
	return nil
}

// writerState is the writer goroutine's (writer, below): the queue every
// Append stream, fence and refill feeds, and what only the writer changes.
//
//   - queue, urgent and closed are guarded by Server.mu (the receiving
//     goroutines and Fence append, the writer takes the whole queue each
//     round); kick (capacity 1) wakes the writer after a push.
//   - nQueued is guarded by Server.mu too; queued publishes it.
//   - nWrites and lastContact are the writer's alone (walMu held);
//     writes publishes nWrites for Read streams of an empty log store.
//
// The writer holds walMu for a whole round or fence; under it, it takes
// Server.mu (failAll, beginRefill, a fence ending stale streams), then a
// stream's mu (finish, setErr). The package's lock order is in doc.go.
type writerState struct {
	queue  []*appendReq
	urgent bool // the queue holds a heartbeat or fence asking for a reply
	closed bool // the writer has exited or is about to: nothing more is queued
	kick   chan struct{}

	nQueued uint64              // requests ever queued
	queued  watermark.Watermark // nQueued, for waiters (tests)

	// nWrites counts the rounds that appended; writes publishes it for
	// followers of an empty log store.
	nWrites uint64
	writes  watermark.Watermark
	// lastContact is when the writer last admitted a request of a
	// primary that was not refused (a fence reports it).
	lastContact time.Time
}

// writer is the goroutine that owns the WAL's append side. Each round takes
// every queued request from every stream, writes the accepted batches with
// one Append call, fsyncs once and then acknowledges each stream once. It
// returns nil after stop is closed and the queue is drained, or the error
// that broke the log.
//
// While nobody waits (no queued heartbeat asks for a reply: the primary
// sends one after a batch a commit waits on), rounds start at most every
// FlushDelay, so one fsync covers what arrived meanwhile: the disk is
// usually shared with the primary, and per-batch fsyncs here would slow its
// own.
func (s *Server) writer(stop <-chan struct{}) error {
	var lastRound time.Time
	for {
		if err := s.awaitRound(lastRound, stop); err != nil {
			return err
		}
		s.mu.Lock()
		reqs := s.w.queue
		s.w.queue = nil
		s.w.urgent = false
		closed := s.w.closed
		s.mu.Unlock()
		if len(reqs) > 0 {
			if err := s.rounds(reqs); err != nil {
				return err
			}
			lastRound = time.Now()
			continue
		}
		if closed {
			return nil
		}
		select {
		case <-s.w.kick:
		case <-stop:
			s.mu.Lock()
			s.w.closed = true
			s.mu.Unlock()
		}
	}
}

// rounds handles the queued requests: a fence or a cut is handled on its
// own, after a round of everything queued before it, so that it sees (and
// answers with) every batch that came first.
func (s *Server) rounds(reqs []*appendReq) error {
	start := 0
	for i, r := range reqs {
		if r.fence == nil && !r.cut {
			continue
		}
		if i > start {
			if err := s.round(reqs[start:i]); err != nil {
				s.failAll(err, reqs[start:])
				return err
			}
		}
		var err error
		if r.fence != nil {
			err = s.handleFence(r)
		} else {
			err = s.round([]*appendReq{r})
		}
		if err != nil {
			s.failAll(err, reqs[i:])
			return err
		}
		start = i + 1
	}
	if start < len(reqs) {
		if err := s.round(reqs[start:]); err != nil {
			s.failAll(err, reqs[start:])
			return err
		}
	}
	return nil
}

// awaitRound waits until FlushDelay has passed since lastRound, unless the
// queue turns urgent or the log store stops.
func (s *Server) awaitRound(lastRound time.Time, stop <-chan struct{}) error {
	d := s.cfg.FlushDelay - time.Since(lastRound)
	if d <= 0 {
		return nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	for {
		s.mu.Lock()
		done := s.w.urgent || s.w.closed || s.stopping
		s.mu.Unlock()
		if done {
			return nil
		}
		select {
		case <-t.C:
			return nil
		case <-s.w.kick:
		case <-stop:
			return nil
		}
	}
}

// outcome is what one writer round decided for one stream.
type outcome struct {
	ack    bool
	err    error
	n      int
	weight int64
	echo   int64 // newest admitted heartbeat's time_unix_nano
}

// round handles one group of requests in arrival order. A returned error is
// fatal (the WAL or the epoch file could not be written or synced); refused
// requests fail only their own stream.
func (s *Server) round(reqs []*appendReq) error {
	s.walMu.Lock()
	defer s.walMu.Unlock()
	outs := make(map[*appendStream]*outcome)
	walLast := s.wal.LastLSN()
	last := walLast
	// A log store holding no batch accepts any first LSN, even if its WAL
	// was anchored elsewhere (a segment header written before a crash).
	empty := s.wal.FirstLSN() == 0
	if empty {
		last = 0
	}
	var entries []wal.Entry
	var newBytes, refillBatches, refillBytes, archiveBatches int
	for _, r := range reqs {
		o := outs[r.st]
		if o == nil {
			o = &outcome{}
			outs[r.st] = o
		}
		o.n++
		o.weight += r.weight
		if o.err != nil || r.st.wasRefused() {
			continue // drop what the stream sent after a refused request
		}
		n := len(entries)
		refused, fatal := s.admit(r, walLast, &last, &entries)
		if fatal != nil {
			return fatal
		}
		if refused != nil {
			o.err = refused
			continue
		}
		if r.hb != nil {
			r.st.admitted.Store(r.st.epoch)
			o.echo = max(o.echo, r.hb.GetTimeUnixNano())
			s.noteHeartbeat(r.st, r.hb)
		}
		if len(entries) > n {
			newBytes += len(r.data)
			if r.refill != nil {
				refillBatches++
				refillBytes += len(r.data)
				if r.refill.fromArchive {
					archiveBatches++
				}
			}
		}
		o.ack = true
	}
	if len(entries) > 0 {
		if first := entries[0].FirstLSN; empty && s.wal.Segments() > 0 && first != walLast+1 {
			if err := s.wal.Reset(first); err != nil {
				return fmt.Errorf("start the empty wal at LSN %d: %w", first, err)
			}
		}
		if err := s.wal.Append(entries...); err != nil {
			return fmt.Errorf("append LSNs %d..%d to the wal: %w", entries[0].FirstLSN, last, err)
		}
		start := time.Now()
		if err := s.wal.Sync(); err != nil {
			s.metrics.fsyncErrors.Inc()
			return fmt.Errorf("fsync wal: %w", err)
		}
		s.metrics.fsyncSeconds.Observe(time.Since(start).Seconds())
		s.metrics.appendedBytes.Add(float64(newBytes))
		s.metrics.refillBatches.Add(float64(refillBatches))
		s.metrics.refillBytes.Add(float64(refillBytes))
		if archiveBatches > 0 {
			s.arch.m.refillBatches.Add(float64(archiveBatches))
		}
		s.w.nWrites++
		s.w.writes.Advance(s.w.nWrites)
		select {
		case s.ret.kick <- struct{}{}:
		default:
		}
	}
	durable, epoch := s.durableLSN(), s.epoch.Load()
	for st, o := range outs {
		var ack *walshipv1.AppendResponse
		if o.ack {
			ack = &walshipv1.AppendResponse{DurableLsn: durable, Epoch: epoch, HeartbeatTimeUnixNano: o.echo, ArchivedLsn: s.archivedLSN()}
		}
		st.finish(ack, o.err, o.n, o.weight)
	}
	return nil
}

// admit applies the epoch and continuity rules — the failover core's
// Append (internal/failover) — to one request, and carries out what it
// decides. It appends an accepted batch to entries (and moves last); a
// retransmission of exactly what is stored is accepted without being
// stored again.
//
// Two epochs are checked. The sender's — what its heartbeats declare, the
// first one before anything else (checkDeclared) — must be at least the
// epoch promised (a fence, or a newer primary seen): a deposed primary is
// refused, batches, heartbeats and cuts alike, so an idle one learns it
// too (I1). A batch's own epoch is that of the primary that wrote it: a
// new primary catching the log store up ships the batches of earlier
// epochs byte for byte. Along the log it never goes down: a batch of an
// epoch older than the newest stored is refused unless it is an exact
// retransmission (I3). A newer epoch is saved in the history, and a newer
// sender epoch promised, before the batch that brings it is acknowledged
// — never from a refused request.
func (s *Server) admit(r *appendReq, walLast uint64, last *uint64, entries *[]wal.Entry) (refused, fatal error) {
	if r.refill != nil {
		return s.admitRefill(r, walLast, last, entries)
	}
	if s.fill.refilling.Load() {
		// Queued before the refill began: the refill is the only writer
		// until it ends.
		return s.errRefilling(), nil
	}
	st, hb, b := r.st, r.hb, r.env
	m := failover.Append{Sender: st.epoch, Truncate: r.cut, TruncateAfter: r.cutAfter, Last: *last}
	if hb != nil {
		m.HB = &failover.Heartbeat{Epoch: hb.GetEpoch(), Primary: hb.GetPrimaryId(), Addr: hb.GetPrimaryAddr(), Cluster: hb.GetClusterId()}
	}
	if r.cut {
		m.Last = s.durableLSN()
	}
	if b != nil {
		m.Batch = &failover.Entry{Epoch: b.Epoch, FirstLSN: b.FirstLsn, LastLSN: b.LastLsn}
		if *last != 0 && b.FirstLsn <= *last {
			// "" for a retransmission of what is stored: acked (if the
			// stream passes the core's rules), not stored again.
			m.Differs = s.differsFromStored(b, r.data, walLast, *entries)
		}
	}
	as := s.acceptor().Append(m)
	st.epoch = as.Sender
	if ref := as.Refused; ref != nil {
		return s.appendRefusal(ref, hb, b, r.cutAfter, *last, as.Why), nil
	}
	for _, e := range as.Effects {
		switch e := e.(type) {
		case failover.AdoptCluster:
			if err := s.adoptCluster(e.ID, e.From); err != nil {
				return nil, err
			}
		case failover.CutAfter:
			if refused, fatal := s.cut(e.LSN); refused != nil || fatal != nil {
				return refused, fatal
			}
		case failover.NoteEpoch:
			if err := s.noteEpoch(e.Epoch, e.FirstLSN); err != nil {
				return nil, err
			}
		case failover.SaveVote:
			if err := s.saveVote(e.Vote); err != nil {
				return nil, err
			}
		default:
			return nil, fmt.Errorf("the log store does not carry out %T", e)
		}
	}
	if r.cut {
		return nil, nil
	}
	if as.Store {
		*entries = append(*entries, wal.Entry{FirstLSN: b.FirstLsn, LastLSN: b.LastLsn, Data: r.data})
		*last = b.LastLsn
	}
	s.w.lastContact = time.Now()
	return nil, nil
}

// appendRefusal is the log store's answer to an Append request the
// failover core refused: each reason in its own words and gRPC code.
func (s *Server) appendRefusal(ref *failover.Refusal, hb *walshipv1.Heartbeat, b *walshipv1.WalBatch, cutAfter, last uint64, why string) error {
	switch ref.Reason {
	case failover.OtherCluster:
		return s.clusterRefused(hb.GetClusterId(), primaryPeer(hb))
	case failover.Undeclared:
		// receive refuses such a stream at its first message; nothing
		// undeclared may pass the fence as "no epoch".
		return refuse(rpcerr.ErrInvalid, "heartbeat.epoch: the stream has not declared the sender's epoch")
	case failover.StaleEpoch:
		return refuse(rpcerr.ErrStaleEpoch, "stale epoch %d, log store is at epoch %d%s", ref.Epoch, ref.Vote.Epoch, primaryName(ref.Vote))
	case failover.SenderBehindBatch:
		return refuse(rpcerr.ErrInvalid, "heartbeat.epoch: %d is older than its batch's epoch %d", ref.Epoch, ref.Known)
	case failover.BatchAheadOfSender:
		return refuse(rpcerr.ErrInvalid, "batch.epoch: %d is newer than the stream's epoch %d", ref.Epoch, ref.Known)
	case failover.CutOwnEpoch:
		return refuse(rpcerr.ErrInvalid, "truncate_after_lsn: %d would cut stored entries of epoch %d, not older than the stream's epoch %d", cutAfter, ref.Known, ref.Epoch)
	case failover.StaleBatch:
		return refuse(rpcerr.ErrStaleEpoch, "stale epoch %d: batch LSNs %d..%d would follow stored batches of epoch %d", b.Epoch, b.FirstLsn, b.LastLsn, ref.Known)
	case failover.Overlap:
		return refuse(errOutOfRange, "overlap: batch LSNs %d..%d, log store ends at LSN %d and %s", b.FirstLsn, b.LastLsn, last, why)
	case failover.Gap:
		// The primary no longer has what follows this log: its peers
		// may, if it has any.
		if s.beginRefill(fmt.Sprintf("the primary's oldest batch starts at LSN %d, after this log store's last LSN %d", b.FirstLsn, last)) {
			return s.errRefilling()
		}
		return refuse(rpcerr.ErrInvalid, "gap: batch starts at LSN %d, log store ends at LSN %d", b.FirstLsn, last)
	}
	return refuse(rpcerr.ErrInvalid, "append request refused: %v", ref)
}

// primaryPeer names the primary that sent hb, for a refusal.
func primaryPeer(hb *walshipv1.Heartbeat) string {
	if id := hb.GetPrimaryId(); id != "" {
		return "the primary " + id
	}
	return "the primary"
}

// primaryName names the primary of v for an error message ("" if unknown).
func primaryName(v datadir.Vote) string {
	switch {
	case v.Addr != "":
		return fmt.Sprintf(" (primary %s at %s)", v.Primary, v.Addr)
	case v.Primary != "":
		return fmt.Sprintf(" (primary %s)", v.Primary)
	}
	return ""
}

// noteEpoch records in the history, durably, that the log continues in
// epoch e from first, if e is newer than the newest stored. An error is
// fatal.
func (s *Server) noteEpoch(e, first uint64) error {
	h, changed := s.history.Load().Note(e, first)
	if !changed {
		return nil
	}
	if err := datadir.SaveHistory(s.fs, s.cfg.DataDir, h); err != nil {
		s.metrics.fsyncErrors.Inc()
		return err
	}
	s.history.Store(&h)
	s.logEpoch.Store(e)
	return nil
}

// adoptHistory makes h, durably, the history of the log store's empty log
// (writer only): a refill that starts it past LSN 1 keeps the epochs of
// its source's log before it, as the source does after its retention cut
// them. An error is fatal.
func (s *Server) adoptHistory(h datadir.History) error {
	if len(h) == 0 {
		return nil
	}
	if err := datadir.SaveHistory(s.fs, s.cfg.DataDir, h); err != nil {
		s.metrics.fsyncErrors.Inc()
		return err
	}
	s.history.Store(&h)
	s.logEpoch.Store(h.Current().Epoch)
	return nil
}

// differsFromStored returns "" if b is a retransmission of a stored batch
// (same LSN range, same bytes), else why it is not. pending are the entries
// accepted in this round and not yet written.
func (s *Server) differsFromStored(b *walshipv1.WalBatch, data []byte, walLast uint64, pending []wal.Entry) string {
	compare := func(e wal.Entry) string {
		switch {
		case e.FirstLSN != b.FirstLsn || e.LastLSN != b.LastLsn:
			return fmt.Sprintf("stores LSN %d in batch %d..%d", b.FirstLsn, e.FirstLSN, e.LastLSN)
		case !bytes.Equal(e.Data, data):
			return "holds different data for them"
		}
		return ""
	}
	if b.FirstLsn > walLast {
		for _, e := range pending {
			if e.LastLSN >= b.FirstLsn {
				return compare(e)
			}
		}
		return "holds different data for them" // not reached: b overlaps a pending entry
	}
	r, err := s.wal.NewReader(b.FirstLsn, false)
	if errors.Is(err, wal.ErrCompacted) {
		return fmt.Sprintf("no longer keeps LSN %d (first LSN is %d)", b.FirstLsn, s.wal.FirstLSN())
	}
	if err != nil {
		return fmt.Sprintf("cannot read the stored batch: %v", err)
	}
	defer r.Close()
	// The entry is written, so Next does not wait; the timeout is a guard.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	e, err := r.Next(ctx)
	if err != nil {
		return fmt.Sprintf("cannot read the stored batch: %v", err)
	}
	return compare(e)
}

// failAll fails every stream after a fatal error: the requests of the
// failed round, everything queued, and every open stream.
func (s *Server) failAll(err error, round []*appendReq) {
	failure := refuse(rpcerr.ErrUnavailable, "log store failed: %v", err)
	for _, r := range round {
		r.st.finish(nil, failure, 1, r.weight)
	}
	s.mu.Lock()
	s.fatal = err
	s.w.closed = true
	queued := s.w.queue
	s.w.queue = nil
	for st := range s.streams {
		st.setErr(failure)
	}
	s.mu.Unlock()
	for _, r := range queued {
		r.st.finish(nil, failure, 1, r.weight)
	}
}
