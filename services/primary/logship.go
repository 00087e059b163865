package primary

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"time"

	walshipv1 "github.com/walship/walship/gen/walship/v1"
	"github.com/walship/walship/internal/backoff"
	"github.com/walship/walship/internal/datadir"
	"github.com/walship/walship/internal/rpcerr"
	"github.com/walship/walship/internal/serve"
	"github.com/walship/walship/internal/tlsid"
	"github.com/walship/walship/internal/wal"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/status"
)

// dialer is how the primary dials its log stores and, in a switchover,
// its target (Config.Security.Dialer).
func (s *Server) dialer() serve.Dialer { return s.cfg.Security.Dialer }

// shipLogStore keeps one log store fed: it dials, asks where the log store
// is, streams durable WAL batches from there, and records the log store's
// cumulative durable acks. It reconnects with backoff until ctx ends.
func (s *Server) shipLogStore(ctx context.Context, addr string) {
	log := s.logger.With("logstore", addr)
	conn, err := s.dialer().Dial(addr, s.dialer().PeerClass(tlsid.ClassLogStore),
		// Find a dead connection (a partition sends no FIN) within ~15s.
		grpc.WithKeepaliveParams(keepalive.ClientParameters{Time: 10 * time.Second, Timeout: 5 * time.Second, PermitWithoutStream: true}),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(streamMessageBytes), grpc.MaxCallSendMsgSize(streamMessageBytes)))
	if err != nil {
		log.Error("bad log store address", "err", err)
		return
	}
	defer conn.Close()
	client, fencer := walshipv1.NewLogStoreServiceClient(conn), walshipv1.NewEpochServiceClient(conn)
	up := newGate()
	leaseDone := make(chan struct{})
	go func() {
		defer close(leaseDone)
		s.keepLease(ctx, client, addr, up)
	}()
	defer func() { <-leaseDone }() // before conn.Close
	var bo backoff.Backoff
	behind := false // the log store's gap was reported and lasts
	for ctx.Err() == nil {
		began := time.Now()
		err := s.shipOnce(ctx, client, fencer, addr, up)
		up.set(false)
		if time.Since(began) > 10*time.Second {
			bo.Reset() // it was healthy for a while: retry quickly
		}
		s.peers.updateLogStore(addr, func(l *logstorePos) { l.connected = false })
		if ctx.Err() != nil {
			return
		}
		var gap *logStoreGapError
		switch {
		case rpcerr.IsOtherCluster(err):
			behind = false
			s.metrics.clusterMismatch.Inc()
			log.Error("the log store belongs to another cluster: not shipping to it (check --logstore); retrying", "cluster_id", s.cluster.ID(), "err", err)
		case !errors.As(err, &gap):
			behind = false
			log.Warn("log store stream ended; reconnecting", "err", err)
		case !behind:
			// Said once: it lasts until the log store has refilled from
			// its peers, which may take a while, or an operator acts.
			behind = true
			if gap.refilling {
				log.Info("the log store is copying what it lacks from its peers; shipping to it when it is done", "err", err)
				break
			}
			log.Warn("the log store cannot take this primary's stream yet; retrying", "err", err,
				"hint", "it refills from its peers if it has any (walship logstore --peers); without peers, empty its data directory and it starts again from this primary's oldest batch",
				"store_durable_lsn", gap.durable, "wal_first_lsn", gap.first)
		default:
			log.Debug("the log store still cannot take this primary's stream", "err", err)
		}
		if !bo.Wait(ctx) {
			return
		}
	}
}

// shipOnce runs one Append stream to a log store: it asks where the log
// store is (cutting a tail of an epoch this primary's history does not
// have; fencing it in steps first if its promise is too far behind for
// its heartbeat, catchUpEpoch), then ships durable batches from there
// with lease heartbeats, until the stream or ctx ends.
func (s *Server) shipOnce(ctx context.Context, client walshipv1.LogStoreServiceClient, fencer walshipv1.EpochServiceClient, addr string, up *gate) error {
	st, err := client.Status(ctx, &walshipv1.LogStoreServiceStatusRequest{}, grpc.WaitForReady(true))
	if err != nil {
		return fmt.Errorf("status: %w", err)
	}
	// A log store of another cluster has nothing to say about this
	// primary's epoch: checked first.
	if err := s.otherClusterLogStore(addr, st); err != nil {
		return err
	}
	if err := datadir.CheckEpoch(st.Epoch, s.epoch, datadir.MaxEpochGap); err != nil {
		// Not believed: no honest log store gets that far ahead of its
		// primary, and this node would promise it as it steps down.
		return fmt.Errorf("status: epoch: %w", err)
	}
	if st.Epoch > s.epoch {
		err := &DeposedError{Vote: datadir.Vote{Epoch: st.Epoch, Primary: st.PrimaryId, Addr: st.PrimaryAddr},
			Why: fmt.Sprintf("log store %s has promised epoch %d", addr, st.Epoch)}
		s.depose(err)
		return err
	}
	if st.Refilling {
		return &logStoreGapError{durable: st.DurableLsn, first: s.wal.FirstLSN(), refilling: true}
	}
	if err := s.catchUpEpoch(ctx, fencer, addr, st.Epoch); err != nil {
		return err
	}
	// Compared with this primary's to decide what the log store keeps
	// (after the checks above, which do not read it: a newer promise
	// deposes this primary whatever history comes with it).
	if err := datadir.CheckProto(st.GetHistory(), max(s.epoch, st.Epoch), datadir.MaxEpochGap); err != nil {
		return fmt.Errorf("status: history%w", err)
	}
	from, durable, cut := s.logStoreStart(addr, st)
	rd, err := s.wal.NewReader(from, true)
	gap := false
	if errors.Is(err, wal.ErrCompacted) {
		// The log store ends before this primary's oldest batch. Ship from
		// that batch all the same: the log store sees the gap and, if it
		// has peers, refills from them (and refuses the stream meanwhile);
		// without peers it refuses the gap.
		gap = true
		from = s.wal.FirstReadableLSN()
		rd, err = s.wal.NewReader(from, true)
	}
	if err != nil {
		return fmt.Errorf("read wal from %d: %w", from, err)
	}
	defer rd.Close()
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stream, err := client.Append(sctx)
	if err != nil {
		return fmt.Errorf("append: %w", err)
	}
	s.peers.updateLogStore(addr, func(l *logstorePos) {
		l.connected, l.durable = true, max(l.durable, durable)
		l.archive, l.archived = st.GetArchive().GetUrl(), max(l.archived, st.GetArchive().GetArchivedLsn())
	})
	s.logger.Info("shipping to log store", "logstore", addr, "from_lsn", from)
	beats := &leaseBeats{s: s, addr: addr, sent: map[int64]time.Time{}}
	recvDone := make(chan error, 1)
	go func() { recvDone <- s.receiveLogStoreAcks(stream, addr, beats) }()
	// The first message declares this primary's epoch (the log store
	// refuses a stream of an older one than it promised), then the cut.
	first := beats.next(true)
	if cut {
		first.Truncate, first.TruncateAfterLsn = true, durable
	}
	if err := stream.Send(first); err != nil {
		cancel()
		<-recvDone
		return err
	}
	up.set(true)
	sendErr := s.shipEntries(sctx, stream, rd, from, beats)
	cancel()
	rerr := <-recvDone
	if status.Code(rerr) == codes.FailedPrecondition && !rpcerr.IsOtherCluster(rerr) {
		// Refused for its epoch: a newer one was promised (or the log store
		// says so now).
		if st, err := client.Status(ctx, &walshipv1.LogStoreServiceStatusRequest{}); err == nil && st.Epoch > s.epoch && datadir.CheckEpoch(st.Epoch, s.epoch, datadir.MaxEpochGap) == nil && s.otherClusterLogStore(addr, st) == nil {
			s.depose(&DeposedError{Vote: datadir.Vote{Epoch: st.Epoch, Primary: st.PrimaryId, Addr: st.PrimaryAddr},
				Why: fmt.Sprintf("log store %s refused this primary's epoch: %v", addr, rerr)})
		}
	}
	err = sendErr
	if errors.Is(sendErr, io.EOF) || errors.Is(sendErr, context.Canceled) {
		// The receive side holds the log store's reason.
		err = rerr
	}
	if gap && ctx.Err() == nil {
		return &logStoreGapError{durable: durable, first: from, err: err}
	}
	return err
}

// catchUpEpoch brings a log store that has promised only epoch promised,
// more than datadir.MaxEpochJump behind this primary's, within the jump
// of it, so that it takes this primary's heartbeat: it fences it, as this
// primary, at each of datadir.EpochSteps. Such a log store was away while
// a promotion bridged a gap the same way (one accepted message can put
// some nodes that far ahead of the others), or has emptied its directory
// in a cluster of more than 2^20 epochs.
func (s *Server) catchUpEpoch(ctx context.Context, fencer walshipv1.EpochServiceClient, addr string, promised uint64) error {
	steps := datadir.EpochSteps(promised, s.epoch)
	if len(steps) == 0 {
		return nil
	}
	s.logger.Info("fencing a log store that is far behind this primary's epoch in steps", "logstore", addr, "promised", promised, "epoch", s.epoch, "steps", len(steps))
	for _, e := range steps {
		fctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		_, err := fencer.Fence(fctx, &walshipv1.FenceRequest{Epoch: e, CandidateId: s.cfg.ID, CandidateAddr: s.Advertise(), ClusterId: s.cluster.ID()})
		cancel()
		if err != nil {
			return fmt.Errorf("fence epoch %d on the way to %d: %w", e, s.epoch, err)
		}
	}
	return nil
}

// otherClusterLogStore is an error naming both ids when the log store at
// addr, in state st, belongs to another cluster than this primary's.
func (s *Server) otherClusterLogStore(addr string, st *walshipv1.LogStoreServiceStatusResponse) error {
	return rpcerr.CheckPeer("primary", s.cluster.ID(), "log store "+addr, st.GetClusterId())
}

// logStoreGapError ends a stream to a log store whose log ends before
// the primary's oldest batch, or that is refilling from its peers.
type logStoreGapError struct {
	durable, first uint64
	refilling      bool
	err            error
}

func (e *logStoreGapError) Error() string {
	if e.refilling {
		return fmt.Sprintf("the log store is refilling from its peers (durable LSN %d)", e.durable)
	}
	return fmt.Sprintf("the log store ends at LSN %d and this primary's WAL starts at LSN %d: %v", e.durable, e.first, e.err)
}

func (e *logStoreGapError) Unwrap() error { return e.err }

// logStoreStart decides where shipping to a log store in state st begins:
// the first LSN to send, the durable LSN the log store vouches for, and
// whether it must first cut a stored tail of an epoch this primary's
// history does not have (a deposed primary's, never committed; the log
// store keeps it as an orphan).
func (s *Server) logStoreStart(addr string, st *walshipv1.LogStoreServiceStatusResponse) (from, durable uint64, cut bool) {
	if st.FirstLsn == 0 {
		// An empty log store starts at the oldest batch we still have,
		// or, holding none yet (a primary started on a restored
		// directory: its state is a snapshot, its WAL starts after it),
		// at the next one; the base snapshot reaches the log store by
		// upload. It may report a durable LSN even so (a WAL anchored by
		// a segment header written before a crash); holding nothing, it
		// vouches for nothing.
		return max(s.wal.FirstReadableLSN(), 1), 0, false
	}
	from, durable = st.DurableLsn+1, st.DurableLsn
	keep, all, known := s.epochs.KeepUpTo(st.LastEpoch)
	if len(st.History) > 0 {
		keep, all, known = s.epochs.SharedUpTo(datadir.HistoryFromProto(st.History))
	}
	if all {
		return from, durable, false
	}
	if !known {
		keep = 0
	}
	if keep < st.DurableLsn {
		s.logger.Warn("the log store holds entries of an epoch this primary's history does not have; asking it to cut them",
			"logstore", addr, "store_epoch", st.LastEpoch, "store_last_lsn", st.DurableLsn, "truncate_after_lsn", keep)
		return keep + 1, keep, true
	}
	return from, durable, false
}

// keepLease renews the lease (Failover invariant 7) through an Append
// stream of its own to the log store, which carries heartbeats only: their
// echoes never wait behind batches, neither in this primary's sends (the
// log stream's flow control) nor in the log store's queue, which answers
// such a heartbeat at once (services/logstore, echo.go). Otherwise a bulk
// load on a log store's slow disk — a round of up to its stream budget of
// batches and an fsync before the echo — would cost a healthy primary its
// lease. The log stream's heartbeats renew it too. It runs while the log
// stream is up (past its checks: the epoch, the cluster, a refill — a
// refusal is the log stream's to act on), reopening with backoff, until
// ctx ends.
func (s *Server) keepLease(ctx context.Context, client walshipv1.LogStoreServiceClient, addr string, logUp *gate) {
	var bo backoff.Backoff
	for ctx.Err() == nil {
		if !logUp.wait(ctx) {
			return
		}
		began := time.Now()
		err := s.leaseOnce(ctx, client, addr)
		if time.Since(began) > 10*time.Second {
			bo.Reset()
		}
		if ctx.Err() != nil {
			return
		}
		s.logger.Debug("lease stream to the log store ended; reopening", "logstore", addr, "err", err)
		if !bo.Wait(ctx) {
			return
		}
	}
}

// leaseOnce runs one lease stream: a heartbeat asking for its echo every
// quarter of the lease, until the stream or ctx ends.
func (s *Server) leaseOnce(ctx context.Context, client walshipv1.LogStoreServiceClient, addr string) error {
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stream, err := client.Append(sctx, grpc.WaitForReady(true))
	if err != nil {
		return fmt.Errorf("append: %w", err)
	}
	beats := &leaseBeats{s: s, addr: addr, sent: map[int64]time.Time{}, leaseOnly: true}
	recvDone := make(chan error, 1)
	go func() {
		for {
			ack, err := stream.Recv()
			if err != nil {
				recvDone <- err
				return
			}
			if t, ok := beats.sentAt(ack.GetHeartbeatTimeUnixNano()); ok {
				s.lease.renew(addr, t)
				s.leaseEchoes.Add(1)
			}
		}
	}()
	tick := time.NewTicker(s.cfg.LeaseTimeout / 4)
	defer tick.Stop()
	for {
		if err := stream.Send(beats.next(true)); err != nil {
			cancel()
			return errors.Join(err, <-recvDone)
		}
		select {
		case <-tick.C:
		case err := <-recvDone:
			return err
		}
	}
}

// gate is a condition goroutines wait for.
type gate struct {
	mu   sync.Mutex
	open bool
	ch   chan struct{} // closed when the gate opens
}

func newGate() *gate { return &gate{ch: make(chan struct{})} }

func (g *gate) set(open bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	switch {
	case open && !g.open:
		close(g.ch)
	case !open && g.open:
		g.ch = make(chan struct{})
	}
	g.open = open
}

// wait returns true once the gate is open, false if ctx ends first.
func (g *gate) wait(ctx context.Context) bool {
	g.mu.Lock()
	ch := g.ch
	g.mu.Unlock()
	select {
	case <-ch:
		return true
	case <-ctx.Done():
		return false
	}
}

// leaseBeats makes the heartbeats of one log store stream. They renew the
// lease: the log store echoes each one's time in its ack, which is mapped
// back to the (monotonic) time it was sent.
type leaseBeats struct {
	s    *Server
	addr string // the log store's
	// leaseOnly: the lease stream's (keepLease), which never names the
	// log store the archiver (the log stream does).
	leaseOnly bool
	mu        sync.Mutex
	sent      map[int64]time.Time // by the wall-clock nanoseconds it carries
}

// next returns a heartbeat sent now.
func (b *leaseBeats) next(reply bool) *walshipv1.AppendRequest {
	s := b.s
	now := time.Now()
	b.mu.Lock()
	b.sent[now.UnixNano()] = now
	for k, t := range b.sent {
		if now.Sub(t) > 4*s.cfg.LeaseTimeout {
			delete(b.sent, k)
		}
	}
	b.mu.Unlock()
	_, archived := s.peers.archived()
	return &walshipv1.AppendRequest{Heartbeat: &walshipv1.Heartbeat{Epoch: s.epoch, LastLsn: s.wal.DurableLSN(), TimeUnixNano: now.UnixNano(),
		ReplyRequested: reply, PrimaryId: s.cfg.ID, PrimaryAddr: s.Advertise(), ClusterId: s.cluster.ID(),
		LogstoreQuorumLsn: s.peers.logStoreQuorum(), Archiver: !b.leaseOnly && s.peers.archiver(s.logStores()) == b.addr, ArchivedLsn: archived}}
}

// sentAt is when the heartbeat a log store echoed was sent.
func (b *leaseBeats) sentAt(echo int64) (time.Time, bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	t, ok := b.sent[echo]
	return t, ok
}

// receiveLogStoreAcks records a log store's cumulative durable acks, and
// renews the lease with the heartbeats they echo, until the stream ends.
func (s *Server) receiveLogStoreAcks(stream walshipv1.LogStoreService_AppendClient, addr string, beats *leaseBeats) error {
	for {
		ack, err := stream.Recv()
		if err != nil {
			return err
		}
		if e := ack.GetHeartbeatTimeUnixNano(); e != 0 {
			if t, ok := beats.sentAt(e); ok {
				s.lease.renew(addr, t)
			}
		}
		s.peers.updateLogStore(addr, func(l *logstorePos) {
			l.durable = max(l.durable, ack.DurableLsn)
			l.archived = max(l.archived, ack.ArchivedLsn)
			l.lastAck = time.Now()
		})
	}
}

// shipEntries sends durable WAL entries from LSN from on, and a heartbeat
// every quarter of the lease at least, batches or not. A batch that holds
// (or comes before) a commit waiting for the log stores is followed by a
// heartbeat asking for the log store's round now, not after its delay.
func (s *Server) shipEntries(ctx context.Context, stream walshipv1.LogStoreService_AppendClient, rd *wal.Reader, from uint64, beats *leaseBeats) error {
	renewEvery := s.cfg.LeaseTimeout / 4
	lastBeat := time.Now()
	want := from // first LSN of the entry to send next
	hold := newShipHold(s.cfg.ShipDelay, s.metrics.shipDelays.WithLabelValues("logstore"))
	defer hold.stop()
	for {
		if time.Since(lastBeat) >= renewEvery {
			if err := stream.Send(beats.next(true)); err != nil {
				return err
			}
			lastBeat = time.Now()
		}
		var e wal.Entry
		var err error
		if s.wal.DurableLSN() >= want {
			e, err = rd.Next(ctx) // available: no timer needed
		} else {
			hold.caughtUp()
			nctx, ncancel := context.WithTimeout(ctx, min(s.cfg.HeartbeatInterval, renewEvery))
			e, err = rd.Next(nctx)
			ncancel()
		}
		if err == nil {
			want = e.LastLSN + 1
		}
		switch {
		case errors.Is(err, context.DeadlineExceeded) && ctx.Err() == nil:
			err = stream.Send(beats.next(true))
			lastBeat = time.Now()
		case err != nil:
			return err
		default:
			if err = s.holdForLogStore(ctx, e.FirstLSN, hold); err != nil {
				return err
			}
			err = stream.Send(withRawBatch(&walshipv1.AppendRequest{}, e.Data))
			if err == nil && (s.pipe.want.logStoreNow(e.LastLSN) || s.peers.lsWaiting.Load() > 0) {
				err = stream.Send(beats.next(true))
				lastBeat = time.Now()
			}
		}
		if err != nil {
			return err
		}
	}
}

// holdForLogStore holds a durable batch that starts at first back (hold),
// if no commit waits on the log stores for it or any after it; the
// batches made durable meanwhile then go right after it: one socket write
// and one round on the log store for several. A write noting a commit that
// waits on the log stores, or any wait on peers that begins, ends the hold.
func (s *Server) holdForLogStore(ctx context.Context, first uint64, hold *shipHold) error {
	for hold.delay > 0 {
		// Before the look: a write or a wait begun after it wakes the hold.
		changed, begun := s.wal.Changed(), s.peers.waitsBegin()
		if s.pipe.want.logStore.Load() >= first || s.peers.lsWaiting.Load() > 0 {
			return nil
		}
		if waited, err := hold.wait(ctx, changed, begun, nil); err != nil || !waited {
			return err
		}
	}
	return nil
}

// streamMessageBytes bounds a replication or log store stream message. It
// carries one WAL entry: a batch of at most MaxBatchBytes, or one larger
// transaction, which the request limit bounds; Config.Validate keeps both
// to half of it (maxBatchLimit, maxValueLimit). A log store's default
// message limit (logstore.DefaultMaxMessageBytes) is the same.
const streamMessageBytes = 64 << 20
