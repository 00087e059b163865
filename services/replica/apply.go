package replica

import (
	"context"
	"errors"
	"fmt"
	"time"

	walshipv1 "github.com/walship/walship/gen/walship/v1"
	"github.com/walship/walship/internal/changefeed"
	"github.com/walship/walship/internal/datadir"
	"github.com/walship/walship/internal/envelope"
	"github.com/walship/walship/internal/failover"
	"github.com/walship/walship/internal/wal"
	"github.com/walship/walship/pkg/codec"
)

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

// write runs the first half of a round: it checks the batches in order,
// writes the good prefix with one append, adds it to s.follower.unapplied (to be
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
	if len(s.follower.unapplied) == 0 {
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
	limit := min(s.wal.DurableLSN(), s.follower.primaryDurable)
	st := s.store.Load()
	var rd *wal.Reader // reads spilled batches back, if any
	defer func() {
		if rd != nil {
			rd.Close()
		}
	}()
	n := 0
	commit := s.rd.commitLSN()
	for ; n < len(s.follower.unapplied) && s.follower.unapplied[n].env.GetLastLsn() <= limit; n++ {
		c := &s.follower.unapplied[n]
		if c.spilled {
			if err := s.unspill(&rd, c); err != nil {
				s.dropUnapplied(n)
				return n, err
			}
		}
		commitTime := c.env.GetCommitTimeUnixNano()
		changes, err := st.ApplyChanges(&c.batch, nil)
		if err != nil {
			// Written and synced but not appliable: the WAL and the state
			// disagree, and recovery would fail the same way. Stop rather
			// than serve a state that skips a batch.
			err = fmt.Errorf("%w: apply LSNs %d..%d: %w", errFatal, c.env.GetFirstLsn(), c.env.GetLastLsn(), err)
			s.dropUnapplied(n) // c points into s.follower.unapplied: formatted first
			return n, err
		}
		s.feedTxns = changefeed.FromChanges(s.feedTxns[:0], c.batch.Records, changes, func(uint64) int64 { return commitTime })
		s.feed.Append(s.feedTxns)
		clear(s.feedTxns)
		s.metrics.appliedRecords.Add(float64(len(c.batch.Records)))
		s.metrics.appliedBytes.Add(float64(len(c.env.GetPayload())))
		if last := c.env.GetLastLsn(); last == commit && n+1 < len(s.follower.unapplied) && s.follower.unapplied[n+1].env.GetLastLsn() <= limit {
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

// keepUnapplied adds written batches to s.follower.unapplied. Decoded batches are
// kept in memory up to MaxUnappliedBytes of payload; past that only their
// LSNs are, and applyReady reads them back from the WAL. The bound matters
// when the primary's durable LSN stalls (a slow or stuck fsync, a long
// --async-flush-interval) while its batches keep arriving.
func (s *Server) keepUnapplied(cs []checked) {
	s.noteHeldRecords(cs)
	spilled := 0
	for i := range cs {
		c := &cs[i]
		c.data = nil // written to the WAL: not needed again
		size := int64(len(c.env.GetPayload()))
		if s.follower.unappliedBytes+size <= s.cfg.MaxUnappliedBytes {
			c.held = size
			s.follower.unappliedBytes += size
			continue
		}
		if now := s.now(); now.Sub(s.follower.spillWarned) >= time.Minute {
			s.follower.spillWarned = now
			s.logger.Warn("batches waiting for the primary's durable LSN exceed --max-unapplied-bytes; the rest are kept on disk only and read back to be applied",
				"max_unapplied_bytes", s.cfg.MaxUnappliedBytes, "primary_durable_lsn", s.follower.primaryDurable, "from_lsn", c.env.GetFirstLsn())
		}
		*c = spilledBatch(c.env.GetFirstLsn(), c.env.GetLastLsn())
		spilled++
	}
	s.follower.unapplied = append(s.follower.unapplied, cs...)
	s.observeUnapplied(spilled)
}

// spilledBatch is a batch of s.follower.unapplied kept in the WAL only.
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

// dropUnapplied removes the first n batches of s.follower.unapplied.
func (s *Server) dropUnapplied(n int) {
	s.forgetUnapplied(s.follower.unapplied[:n])
	rest := copy(s.follower.unapplied, s.follower.unapplied[n:])
	clear(s.follower.unapplied[rest:])
	s.follower.unapplied = s.follower.unapplied[:rest]
}

// forgetUnapplied releases the memory accounting of batches leaving
// s.follower.unapplied.
func (s *Server) forgetUnapplied(cs []checked) {
	for i := range cs {
		s.follower.unappliedBytes -= cs[i].held
	}
	s.observeUnapplied(0)
}

// observeUnapplied updates the metrics after batches were spilled or
// s.follower.unapplied changed.
func (s *Server) observeUnapplied(spilled int) {
	if s.metrics == nil {
		return // recovering: New reports them once the metrics exist
	}
	s.metrics.spilled.Add(float64(spilled))
	s.metrics.unapplied.Set(float64(s.follower.unappliedBytes))
}

// process runs one whole round (write, fsync, apply), for the log store
// rung: a log store holds only what the primary made durable.
func (s *Server) process(round []*walshipv1.WalBatch, written func()) (int, error) {
	before := s.wal.LastLSN()
	refused := s.write(round, 0, written)
	if len(s.follower.unapplied) == 0 {
		return 0, refused
	}
	// Only what this round wrote is the log store's word; what the primary
	// sent before it (still unapplied) is durable only as far as that goes.
	if last := s.wal.LastLSN(); last > before {
		s.follower.primaryDurable = max(s.follower.primaryDurable, last)
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
