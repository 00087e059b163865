package logstore

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	walshipv1 "github.com/walship/walship/gen/walship/v1"
	"github.com/walship/walship/internal/backoff"
	"github.com/walship/walship/internal/datadir"
	"github.com/walship/walship/internal/failover"
	"github.com/walship/walship/internal/rpcerr"
	"github.com/walship/walship/internal/tlsid"
	"github.com/walship/walship/internal/wal"
	"golang.org/x/sync/semaphore"
	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
)

// A log store refills itself from its peers (Config.Peers) when it is
// empty at start, or when its primary's stream shows a gap: the primary's
// oldest batch starts after the log store's last LSN, so the primary
// cannot fill it. While it refills it reports Status.refilling and refuses
// Append (UNAVAILABLE, the primary retries); Fence is answered as always.
// It copies the batches it lacks from one peer's Read — the same envelope
// bytes — through the writer, which checks each one as it checks a
// primary's (CRC and shape, continuity, epochs along the log) and also
// against the peer's epoch history, and stops if the log store promises an
// epoch newer than the peer's log meanwhile: the peer may then hold a tail
// that epoch's primary cut. What no peer can supply comes from the archive,
// if one is configured (refill_archive.go).

// refillState is the refiller goroutine's (refiller, below), and what the
// rest of the log store reads of it. All of it is atomic or a channel: no
// lock guards it.
//
//   - refilling is set by New (an empty log store with peers) or by the
//     writer (beginRefill, on a gap) and cleared by the refiller when the
//     copy ends; while set, Append is refused and the writer admits only
//     the refill's own batches (admitRefill). why says why.
//   - kick (capacity 1) wakes the refiller after beginRefill.
//   - skippedPeers counts the peers the refiller will not use (this log
//     store itself, found in the list, or a bad address); instance is
//     the token by which it recognises itself (immutable).
//
// The refiller holds no lock while it copies: it queues each batch to the
// writer as a stream would.
type refillState struct {
	refilling    atomic.Bool
	why          atomic.Pointer[string]
	kick         chan struct{}
	skippedPeers atomic.Int32
	instance     string
}

// instanceHeader is the response header of LogStoreService.Status that
// carries the process's instance token, so that a log store listed among
// its own peers (one list for every pod) recognises itself.
const instanceHeader = "walship-logstore-instance"

// Refill timing: how long a peer may take to answer Status, and how long a
// Read stream may send nothing before the refill gives that peer up.
const (
	peerStatusTimeout = 3 * time.Second
	refillSilence     = 10 * time.Second
	// refillTries is how many failed copies in a row end a refill that was
	// asked for by a gap (the primary asks again when it next connects).
	refillTries = 3
)

func newInstance() string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// peer is one configured peer log store (refiller-only, but for self).
type peer struct {
	addr   string
	conn   *grpc.ClientConn
	client walshipv1.LogStoreServiceClient
	self   bool
}

// refillSource is a peer as its Status described it.
type refillSource struct {
	p       *peer
	st      *walshipv1.LogStoreServiceStatusResponse
	history datadir.History
	from    uint64 // the first LSN to copy from it
}

// refill is what the writer checks a refill's batches against.
type refill struct {
	peer string
	// lastEpoch is the peer's newest stored epoch when the refill began: a
	// promise newer than it (a fence meanwhile) stops the refill.
	lastEpoch uint64
	// history is the peer's epoch history then: every copied batch must be
	// of the epoch it says wrote its first LSN.
	history datadir.History
	// vote is the peer's promise: its primary is named when the log
	// store's own promise is raised to the epoch it names.
	vote datadir.Vote
	// clusterID is the peer's cluster: a log store with none yet adopts
	// it with the first batch it copies.
	clusterID string
	// adoptHistory: the log store is empty; with its first batch it takes
	// the source's history up to that batch (the epochs before it too),
	// not only the epochs of what it copies.
	adoptHistory bool
	// fromArchive marks a refill from the archive (counted apart).
	fromArchive bool
}

// beginRefill starts a refill (the writer calls it, walMu held, on a gap
// in its primary's stream) and ends every Append stream. It returns false
// when the log store has neither a peer nor an archive to refill from.
func (s *Server) beginRefill(why string) bool {
	if len(s.cfg.Peers) <= int(s.fill.skippedPeers.Load()) && s.arch == nil {
		return false
	}
	s.fill.why.Store(&why)
	s.fill.refilling.Store(true)
	s.logger.Warn("refilling from peers", "why", why, "durable_lsn", s.durableLSN())
	s.mu.Lock()
	for st := range s.streams {
		st.setErr(s.errRefilling())
	}
	s.mu.Unlock()
	select {
	case s.fill.kick <- struct{}{}:
	default:
	}
	return true
}

// errRefilling refuses an Append while the log store refills.
func (s *Server) errRefilling() error {
	why := ""
	if w := s.fill.why.Load(); w != nil {
		why = ": " + *w
	}
	from := "peers"
	if s.arch != nil {
		from = "peers and the archive"
		if len(s.cfg.Peers) <= int(s.fill.skippedPeers.Load()) {
			from = "the archive"
		}
	}
	return refuse(rpcerr.ErrUnavailable, "refilling from %s%s (durable LSN %d); retry later", from, why, s.durableLSN())
}

// endRefill ends a refill: Append streams are taken again.
func (s *Server) endRefill() {
	s.fill.refilling.Store(false)
	s.fill.why.Store(nil)
}

// refiller runs a refill whenever one is asked for, until ctx ends. It
// owns the connections to the peers.
func (s *Server) refiller(ctx context.Context) {
	peers := make([]*peer, 0, len(s.cfg.Peers))
	for _, addr := range s.cfg.Peers {
		conn, err := s.cfg.Security.Dialer.Dial(addr, s.cfg.Security.Dialer.PeerClass(tlsid.ClassLogStore),
			grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(s.cfg.MaxMessageBytes)))
		if err != nil {
			s.logger.Error("bad peer address; not refilling from it", "peer", addr, "err", err)
			s.fill.skippedPeers.Add(1) // counted out, like this log store itself
			continue
		}
		defer conn.Close()
		peers = append(peers, &peer{addr: addr, conn: conn, client: walshipv1.NewLogStoreServiceClient(conn)})
	}
	var bo backoff.Backoff
	failures := 0
	var lastNote string
	note := func(msg string, args ...any) {
		// Said once while it stays the same: a gap the peers cannot fill
		// either is asked about again at every reconnect of the primary.
		if n := fmt.Sprint(msg, args); n != lastNote {
			lastNote = n
			s.logger.Warn(msg, args...)
		}
	}
	for {
		if !s.fill.refilling.Load() {
			select {
			case <-ctx.Done():
				return
			case <-s.fill.kick:
			}
			continue
		}
		res, err := s.refillOnce(ctx, peers)
		if ctx.Err() != nil {
			return
		}
		switch res {
		case refillDone:
			failures, lastNote = 0, ""
			bo.Reset()
			s.endRefill()
		case refillMore:
			// Copied from the archive: its peers may hold what follows.
			failures, lastNote = 0, ""
			bo.Reset()
		case refillNothing:
			s.logger.Info("nothing to refill: no peer holds anything either (a new cluster)", "why", err)
			s.endRefill()
		case refillNoSource:
			note("no peer can refill this log store; taking the primary's stream again", "durable_lsn", s.durableLSN(), "why", err)
			s.endRefill()
		case refillUnreachable:
			if s.wal.FirstLSN() == 0 {
				// Empty: taking the primary's stream now would start the log
				// at the primary's oldest batch, without the history the
				// peers keep. Wait for one of them.
				note("empty log store: waiting for a peer to answer before taking the primary's stream", "why", err)
				bo.Wait(ctx)
				continue
			}
			note("no peer answered; taking the primary's stream again", "durable_lsn", s.durableLSN(), "why", err)
			s.endRefill()
		default:
			s.logger.Warn("refill failed", "durable_lsn", s.durableLSN(), "err", err)
			if failures++; failures >= refillTries && s.wal.FirstLSN() != 0 {
				failures = 0
				s.endRefill()
				continue
			}
			bo.Wait(ctx)
		}
	}
}

// refillResult is how one refill pass ended.
type refillResult int

const (
	refillDone        refillResult = iota // copied what the chosen peer held
	refillNothing                         // empty, and so are the peers that answered (or there are none)
	refillNoSource                        // peers answered; none holds what is missing
	refillUnreachable                     // no peer answered
	refillFailed                          // the copy failed (retry)
	refillMore                            // copied from the archive; peers may hold what follows
)

// refillOnce asks every peer where it is, picks the one to copy from and
// copies from it; when no peer can serve, it copies what the archive
// holds (refillArchive).
func (s *Server) refillOnce(ctx context.Context, peers []*peer) (refillResult, error) {
	res, err := s.refillFromPeers(ctx, peers)
	switch {
	case res == refillDone || res == refillFailed || s.arch == nil:
		return res, err
	case res == refillNothing:
		// Empty, and so is every peer that answered: a new cluster, whose
		// archive holds nothing of it either (an archive of this prefix
		// with a history is another cluster's, or an old one's).
		return res, err
	}
	n, aerr := s.refillArchive(ctx)
	switch {
	case aerr == nil && n > 0:
		return refillMore, nil
	case aerr != nil && !errors.Is(aerr, errArchiveCannot):
		return refillFailed, fmt.Errorf("copy from the archive %s: %w", s.arch.a, aerr)
	case aerr != nil:
		err = errors.Join(err, aerr)
	}
	return res, err
}

// refillFromPeers is refillOnce's part with the peers.
func (s *Server) refillFromPeers(ctx context.Context, peers []*peer) (refillResult, error) {
	srcs, notes := s.survey(ctx, peers)
	if !slices.ContainsFunc(peers, func(p *peer) bool { return !p.self }) {
		// Only itself is listed (or none): there is no one to wait for.
		if s.wal.FirstLSN() == 0 {
			return refillNothing, errors.New("no peer other than this log store")
		}
		return refillNoSource, errors.New("no peer other than this log store")
	}
	if len(srcs) == 0 {
		return refillUnreachable, errors.New(strings.Join(notes, "; "))
	}
	src, why := s.pickSource(srcs)
	if src == nil {
		if s.wal.FirstLSN() == 0 && !slices.ContainsFunc(srcs, func(r *refillSource) bool { return r.st.GetFirstLsn() != 0 }) {
			return refillNothing, errors.New(why)
		}
		return refillNoSource, errors.New(why)
	}
	if err := s.copyFrom(ctx, src); err != nil {
		return refillFailed, fmt.Errorf("copy from %s: %w", src.p.addr, err)
	}
	return refillDone, nil
}

// survey asks each peer's Status; a peer that turns out to be this log
// store is skipped from then on.
func (s *Server) survey(ctx context.Context, peers []*peer) (srcs []*refillSource, notes []string) {
	for _, p := range peers {
		if p.self {
			continue
		}
		cctx, cancel := context.WithTimeout(ctx, peerStatusTimeout)
		var md metadata.MD
		st, err := p.client.Status(cctx, &walshipv1.LogStoreServiceStatusRequest{}, grpc.Header(&md))
		cancel()
		if err != nil {
			notes = append(notes, fmt.Sprintf("%s: %v", p.addr, err))
			continue
		}
		if v := md.Get(instanceHeader); len(v) > 0 && v[0] == s.fill.instance {
			p.self = true
			s.fill.skippedPeers.Add(1)
			s.logger.Info("this log store is among its own peers; skipping it", "peer", p.addr)
			continue
		}
		// Its vote is adopted with what it copies: kept in the vote file.
		if err := datadir.ValidatePrimary(st.GetPrimaryId(), st.GetPrimaryAddr()); err != nil {
			notes = append(notes, fmt.Sprintf("%s: %v", p.addr, err))
			continue
		}
		src := &refillSource{p: p, st: st}
		if err := datadir.CheckProto(st.GetHistory(), s.knownEpoch(), datadir.MaxEpochGap); err == nil {
			src.history = datadir.HistoryFromProto(st.GetHistory())
		}
		srcs = append(srcs, src)
	}
	return srcs, notes
}

// pickSource chooses the peer to copy from: one whose log is of an epoch
// at least this log store's promise (an older one may end in a tail the
// promised epoch's primary cut), whose history holds this log store's
// whole log, and that holds the LSN after its last. Among those it takes
// the newest epoch, then (for an empty log store) the longest history,
// then the furthest end. It returns nil and why each peer was passed over
// when none fits.
func (s *Server) pickSource(srcs []*refillSource) (*refillSource, string) {
	vote := s.vote.Load().Epoch
	durable := s.durableLSN()
	empty := s.wal.FirstLSN() == 0
	own := *s.history.Load()
	if !empty && len(own) == 0 {
		return nil, "this log store's log has no epoch history (written before histories were kept)"
	}
	var ok []*refillSource
	var why []string
	for _, src := range srcs {
		st := src.st
		from := durable + 1
		if empty {
			from = st.GetFirstLsn()
		}
		var reason string
		mismatch := rpcerr.CheckPeer("log store", s.cluster.ID(), "the peer", st.GetClusterId())
		switch {
		case mismatch != nil:
			s.metrics.clusterMismatch.Inc()
			reason = fmt.Sprintf("%v (check --peers)", mismatch)
		case st.GetRefilling():
			reason = "refilling itself"
		case st.GetFirstLsn() == 0:
			reason = "empty"
		case len(src.history) == 0:
			reason = "no usable epoch history"
		case st.GetLastEpoch() < vote:
			reason = fmt.Sprintf("its log ends in epoch %d, older than this log store's promise (epoch %d): it may end in a tail that epoch cut", st.GetLastEpoch(), vote)
		case st.GetFirstLsn() > from:
			reason = fmt.Sprintf("keeps LSNs from %d only; LSN %d is needed", st.GetFirstLsn(), from)
		case st.GetDurableLsn() < from:
			reason = fmt.Sprintf("holds nothing after LSN %d (durable LSN %d)", durable, st.GetDurableLsn())
		}
		if reason == "" && !empty {
			if keep, all, known := src.history.SharedUpTo(own); !all && (!known || keep < durable) {
				reason = fmt.Sprintf("its history does not hold this log store's entries after LSN %d", keep)
			}
		}
		if reason != "" {
			why = append(why, src.p.addr+": "+reason)
			continue
		}
		src.from = from
		ok = append(ok, src)
	}
	if len(ok) == 0 {
		return nil, strings.Join(why, "; ")
	}
	slices.SortStableFunc(ok, func(a, b *refillSource) int {
		if c := cmpDesc(a.st.GetLastEpoch(), b.st.GetLastEpoch()); c != 0 {
			return c
		}
		if empty {
			if c := cmpDesc(b.st.GetFirstLsn(), a.st.GetFirstLsn()); c != 0 {
				return c
			}
		}
		return cmpDesc(a.st.GetDurableLsn(), b.st.GetDurableLsn())
	})
	return ok[0], ""
}

func cmpDesc(a, b uint64) int {
	switch {
	case a > b:
		return -1
	case a < b:
		return 1
	}
	return 0
}

// copyFrom reads src's batches from src.from to its durable LSN (when it
// answered) and hands them to the writer, which checks and stores them.
func (s *Server) copyFrom(ctx context.Context, src *refillSource) error {
	start := time.Now()
	to := src.st.GetDurableLsn()
	// An empty log store takes the peer's history whole: the peer's own
	// retention may have cut the batches of its oldest epochs, not their
	// lines.
	rf := &refill{peer: src.p.addr, lastEpoch: src.st.GetLastEpoch(), history: src.history, clusterID: src.st.GetClusterId(),
		vote:         datadir.Vote{Epoch: src.st.GetVoteEpoch(), Primary: src.st.GetPrimaryId(), Addr: src.st.GetPrimaryAddr()},
		adoptHistory: s.wal.FirstLSN() == 0}
	s.logger.Info("refilling from a peer", "peer", src.p.addr, "from_lsn", src.from, "to_lsn", to,
		"peer_epoch", src.st.GetLastEpoch(), "durable_lsn", s.durableLSN())
	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stream, err := src.p.client.Read(rctx, &walshipv1.ReadRequest{FromLsn: src.from, ToLsn: to, ClusterId: s.cluster.ID()})
	if err != nil {
		return err
	}
	var silent atomic.Bool
	guard := time.AfterFunc(refillSilence, func() { silent.Store(true); cancel() })
	defer guard.Stop()
	batches, err := s.feed(ctx, rf, func() (*walshipv1.WalBatch, error) {
		guard.Reset(refillSilence)
		resp, err := stream.Recv()
		if err != nil {
			guard.Stop()
			if silent.Load() {
				err = fmt.Errorf("the peer sent nothing for %v: %w", refillSilence, err)
			}
			return nil, err
		}
		if resp.GetBatch() == nil {
			return nil, refuse(rpcerr.ErrInvalid, "read response without a batch")
		}
		return resp.GetBatch(), nil
	})
	switch {
	case err != nil:
		return err
	case s.durableLSN() < to:
		return fmt.Errorf("the peer's Read ended at LSN %d, before its durable LSN %d", s.durableLSN(), to)
	}
	s.logger.Info("refilled from a peer", "peer", src.p.addr, "from_lsn", src.from, "durable_lsn", s.durableLSN(),
		"batches", batches, "took", time.Since(start))
	return nil
}

// feed hands the batches next returns, until io.EOF, to the writer as a
// refill rf's (admitRefill checks and stores them), and waits until the
// writer has handled every one: the refill's end must not let the
// primary's appends in ahead of it. It returns how many it handed over,
// and the writer's refusal if any, else next's error.
func (s *Server) feed(ctx context.Context, rf *refill, next func() (*walshipv1.WalBatch, error)) (int, error) {
	st := &appendStream{budget: semaphore.NewWeighted(2 * int64(s.cfg.MaxMessageBytes)), wake: make(chan struct{}, 1)}
	var readErr error
	batches := 0
	for {
		b, err := next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			readErr = err
			break
		}
		r, err := checkRequest(&walshipv1.AppendRequest{Batch: b}, s.knownEpoch(), datadir.MaxEpochGap)
		if err != nil {
			readErr = err
			break
		}
		r.st, r.refill = st, rf
		if err := st.budget.Acquire(ctx, r.weight); err != nil {
			readErr = err
			break
		}
		if err := s.enqueue(r); err != nil {
			st.budget.Release(r.weight)
			readErr = err
			break
		}
		batches++
		if st.failed() {
			break
		}
	}
	if werr := s.awaitStream(ctx, st); werr != nil {
		return batches, werr
	}
	return batches, readErr
}

// awaitStream waits until the writer has handled every request st queued
// and returns the error that refused one, if any.
func (s *Server) awaitStream(ctx context.Context, st *appendStream) error {
	for {
		st.mu.Lock()
		inflight, err := st.inflight, st.err
		st.mu.Unlock()
		if inflight == 0 {
			return err
		}
		select {
		case <-st.wake:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// admitRefill applies the log's rules to one batch copied from a peer
// (writer only, walMu held), as admit does to a primary's, and checks it
// against the peer's history. A newer epoch is noted in the history, and
// promised if it is newer than the promise (a log store that holds a
// batch of an epoch refuses that epoch's predecessors), before the batch
// is acknowledged.
func (s *Server) admitRefill(r *appendReq, walLast uint64, last *uint64, entries *[]wal.Entry) (refused, fatal error) {
	b, rf := r.env, r.refill
	m := failover.Refill{Batch: failover.Entry{Epoch: b.Epoch, FirstLSN: b.FirstLsn, LastLSN: b.LastLsn}, Last: *last,
		Source: rf.peer, SourceEpoch: rf.lastEpoch, SourceHistory: rf.history, SourceVote: rf.vote, SourceCluster: rf.clusterID,
		AdoptHistory: rf.adoptHistory}
	if *last != 0 && b.FirstLsn <= *last {
		m.Differs = s.differsFromStored(b, r.data, walLast, *entries)
	}
	as := s.acceptor().Refill(m)
	if ref := as.Refused; ref != nil {
		return refillRefusal(ref, rf, b, *last, as.Why), nil
	}
	for _, e := range as.Effects {
		var err error
		switch e := e.(type) {
		case failover.AdoptCluster:
			err = s.adoptCluster(e.ID, e.From)
		case failover.AdoptHistory:
			err = s.adoptHistory(e.History)
		case failover.NoteEpoch:
			err = s.noteEpoch(e.Epoch, e.FirstLSN)
		case failover.SaveVote:
			err = s.saveVote(e.Vote)
		default:
			err = fmt.Errorf("the log store does not carry out %T", e)
		}
		if err != nil {
			return nil, err
		}
	}
	if as.Store {
		*entries = append(*entries, wal.Entry{FirstLSN: b.FirstLsn, LastLSN: b.LastLsn, Data: r.data})
		*last = b.LastLsn
	}
	return nil, nil
}

// refillRefusal is the log store's answer to a refill's batch the
// failover core refused, in its own words and gRPC code.
func refillRefusal(ref *failover.Refusal, rf *refill, b *walshipv1.WalBatch, last uint64, why string) error {
	switch ref.Reason {
	case failover.SourceBehind:
		return refuse(rpcerr.ErrStaleEpoch, "refill from %s stopped: this log store promised epoch %d, newer than the peer's log (epoch %d)", rf.peer, ref.Known, ref.Epoch)
	case failover.SourceHistory:
		return refuse(rpcerr.ErrCorrupt, "refill from %s: batch LSNs %d..%d is of epoch %d, but the peer's history says epoch %d wrote LSN %d", rf.peer, b.FirstLsn, b.LastLsn, b.Epoch, ref.Known, b.FirstLsn)
	case failover.Overlap:
		return refuse(errOutOfRange, "refill from %s: overlap: batch LSNs %d..%d, log store ends at LSN %d and %s", rf.peer, b.FirstLsn, b.LastLsn, last, why)
	case failover.StaleBatch:
		return refuse(rpcerr.ErrStaleEpoch, "refill from %s: stale epoch %d: batch LSNs %d..%d would follow stored batches of epoch %d", rf.peer, b.Epoch, b.FirstLsn, b.LastLsn, ref.Known)
	case failover.Gap:
		return refuse(rpcerr.ErrInvalid, "refill from %s: gap: batch starts at LSN %d, log store ends at LSN %d", rf.peer, b.FirstLsn, last)
	}
	return refuse(rpcerr.ErrInvalid, "refill from %s: batch refused: %v", rf.peer, ref)
}
