// Package primary is walship's primary: it sequences and commits KV
// transactions into a durable segmented WAL with group commit, serves reads at
// its visible LSN, and ships the WAL to replicas and log stores.
//
// A write goes through one sequencer (LSNs assigned, compares evaluated
// against every earlier write), one committer goroutine that owns the WAL
// (group commit: one write and at most one fsync for every queued
// transaction), then waits for its policy (local fsync, replicas, log
// stores). Readers see the state only up to the visible LSN: the end of the
// longest prefix of transactions whose commits have been acknowledged (or
// failed) to their writers, so a read never returns a write before its writer
// was told it committed.
package primary

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	walshipv1 "github.com/walship/walship/gen/walship/v1"
	"github.com/walship/walship/internal/kvapi"
	"github.com/walship/walship/internal/serve"
	"github.com/walship/walship/internal/state"
	"github.com/walship/walship/internal/vfs"
	"github.com/walship/walship/internal/wal"
	"github.com/walship/walship/internal/watermark"
	"github.com/walship/walship/pkg/codec"
	"google.golang.org/grpc"
	"google.golang.org/protobuf/proto"
)

// Server is a primary. New recovers it from its data directory; Run serves it.
type Server struct {
	cfg     Config
	logger  *slog.Logger
	fs      vfs.FS
	srv     *serve.Server
	wal     *wal.Log
	store   *state.Store
	overlay *state.Overlay
	visible watermark.Watermark
	reads   *kvapi.Reader
	metrics *metrics
	peers   *peers
	epoch   uint64

	policy atomic.Pointer[Policy] // default commit policy

	// seqMu guards sequencing: nextLSN, the queue to the committer and the
	// overlay's staged writes are all changed together under it.
	seqMu    sync.Mutex
	nextLSN  uint64
	nextTxn  uint64
	queue    []*txn
	stopping bool
	broken   error
	kick     chan struct{}

	// visMu guards the resolution order and applying to the store.
	visMu      sync.Mutex
	unresolved []*txn
	applyBatch codec.Batch

	// Committer-only buffers.
	batch   codec.Batch
	payload []byte
	entries []wal.Entry

	snapMu      sync.Mutex
	snapshotLSN atomic.Uint64
	walAtSnap   atomic.Int64 // WAL bytes written when the last snapshot was taken
	snapKick    chan struct{}

	serving atomic.Bool
}

// New opens the data directory, recovers the state (newest snapshot, then
// the WAL after it) and listens. Health reports NOT_SERVING until Run has
// started.
func New(cfg Config) (*Server, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	s := &Server{
		cfg:      cfg,
		logger:   cfg.Logger,
		fs:       cfg.FS,
		kick:     make(chan struct{}, 1),
		snapKick: make(chan struct{}, 1),
	}
	if s.logger == nil {
		s.logger = slog.New(slog.DiscardHandler)
	}
	if s.fs == nil {
		s.fs = vfs.OS
	}
	reg := cfg.Registry
	if reg == nil {
		reg = serve.NewRegistry()
	}
	p := cfg.Policy
	s.policy.Store(&p)
	s.peers = newPeers()
	if err := s.recover(); err != nil {
		return nil, err
	}
	s.metrics = newMetrics(reg, s)
	s.reads = &kvapi.Reader{Store: s.store, Visible: &s.visible}
	srv, err := serve.New(serve.Options{
		Listen:          cfg.Listen,
		MetricsListen:   cfg.MetricsListen,
		MaxMessageBytes: cfg.maxMessageBytes(),
		Registry:        reg,
		Logger:          s.logger,
		StopTimeout:     cfg.StopTimeout,
	}, func(g *grpc.Server) {
		walshipv1.RegisterKVServiceServer(g, &kvServer{s: s})
		walshipv1.RegisterAdminServiceServer(g, &adminServer{s: s})
	})
	if err != nil {
		_ = s.wal.Close()
		return nil, err
	}
	s.srv = srv
	return s, nil
}

// recover loads the newest snapshot, opens the WAL and replays it from the
// snapshot's LSN. Every batch in the WAL is committed from here on, whether
// or not its writer heard back before the crash.
func (s *Server) recover() error {
	snapDir := filepath.Join(s.cfg.DataDir, "snapshots")
	if err := s.fs.MkdirAll(snapDir, 0o755); err != nil {
		return fmt.Errorf("create %s: %w", snapDir, err)
	}
	store, snapPath, err := state.LoadLatestSnapshot(s.fs, snapDir)
	if err != nil {
		return fmt.Errorf("load snapshot: %w", err)
	}
	s.store = store
	s.snapshotLSN.Store(store.AppliedLSN())
	log, err := wal.Open(wal.Options{
		Dir:         filepath.Join(s.cfg.DataDir, "wal"),
		FS:          s.fs,
		SegmentSize: s.cfg.SegmentBytes,
		Logger:      s.logger,
	})
	if err != nil {
		return fmt.Errorf("open wal: %w", err)
	}
	s.wal = log
	if ri := log.Recovery(); ri.TornSegment != "" {
		s.logger.Warn("cut a torn WAL tail", "segment", ri.TornSegment, "offset", ri.TornOffset, "bytes", ri.TornBytes, "reason", ri.TornReason)
	}
	applied := store.AppliedLSN()
	switch {
	case log.LastLSN() == 0 && applied > 0:
		// Only a snapshot: start the log right after it.
		if err := log.Reset(applied + 1); err != nil {
			return fmt.Errorf("start wal after snapshot %d: %w", applied, err)
		}
	case log.LastLSN() > 0 && log.LastLSN() < applied:
		return fmt.Errorf("wal ends at LSN %d, before snapshot %s at LSN %d: the WAL lost synced data", log.LastLSN(), snapPath, applied)
	case log.LastLSN() > 0 && log.FirstLSN() > applied+1:
		return fmt.Errorf("wal starts at LSN %d but snapshot %q ends at LSN %d: LSNs %d..%d are missing",
			log.FirstLSN(), snapPath, applied, applied+1, log.FirstLSN()-1)
	}
	replayed, epoch, err := s.replay(applied)
	if err != nil {
		return err
	}
	s.epoch = max(epoch, 1)
	s.overlay = state.NewOverlay(store)
	s.nextLSN = store.AppliedLSN() + 1
	s.nextTxn = store.AppliedLSN() + 1 // txn ids only need to be unique and increasing
	s.visible.Advance(store.AppliedLSN())
	s.walAtSnap.Store(0)
	s.logger.Info("recovered", "snapshot", snapPath, "snapshot_lsn", applied, "replayed_batches", replayed,
		"visible_lsn", store.AppliedLSN(), "epoch", s.epoch, "wal_bytes", log.Size())
	return nil
}

// replay applies every WAL batch after LSN from, returning the number of
// batches and the highest epoch seen.
func (s *Server) replay(from uint64) (n int, epoch uint64, err error) {
	if s.wal.LastLSN() <= from {
		return 0, 0, nil
	}
	r, err := s.wal.NewReader(from+1, false)
	if err != nil {
		return 0, 0, fmt.Errorf("replay wal from LSN %d: %w", from+1, err)
	}
	defer r.Close()
	var env walshipv1.WalBatch
	var b codec.Batch
	for s.store.AppliedLSN() < s.wal.LastLSN() {
		e, err := r.Next(context.Background())
		if err != nil {
			return n, epoch, fmt.Errorf("replay wal at LSN %d: %w", s.store.AppliedLSN()+1, err)
		}
		if e.LastLSN <= s.store.AppliedLSN() {
			continue
		}
		if err := DecodeEnvelope(e.Data, &env, &b); err != nil {
			return n, epoch, fmt.Errorf("replay wal entry %d..%d: %w", e.FirstLSN, e.LastLSN, err)
		}
		if err := s.store.Apply(&b); err != nil {
			return n, epoch, fmt.Errorf("replay wal entry %d..%d: %w", e.FirstLSN, e.LastLSN, err)
		}
		epoch = max(epoch, env.Epoch)
		n++
	}
	return n, epoch, nil
}

// DecodeEnvelope unmarshals a stored envelope, checks its CRC and LSN range,
// and decodes its payload into b (whose records then alias env.Payload).
func DecodeEnvelope(data []byte, env *walshipv1.WalBatch, b *codec.Batch) error {
	if err := proto.Unmarshal(data, env); err != nil {
		return fmt.Errorf("%w: unmarshal envelope: %v", codec.ErrCorrupt, err)
	}
	if got := codec.Checksum(env.Payload); got != env.Crc32C {
		return fmt.Errorf("%w: payload crc32c %08x, envelope says %08x", codec.ErrCorrupt, got, env.Crc32C)
	}
	c, err := codec.ByID(codec.ID(env.Codec))
	if err != nil {
		return fmt.Errorf("%w: %v", codec.ErrCorrupt, err)
	}
	if err := c.DecodeBatch(env.Payload, b); err != nil {
		return err
	}
	if b.FirstLSN() != env.FirstLsn || b.LastLSN() != env.LastLsn {
		return fmt.Errorf("%w: payload holds LSNs %d..%d, envelope says %d..%d", codec.ErrCorrupt, b.FirstLSN(), b.LastLSN(), env.FirstLsn, env.LastLsn)
	}
	return nil
}

// Addr is the gRPC address the primary listens on.
func (s *Server) Addr() string { return s.srv.Addr().String() }

// MetricsAddr is the metrics address, or "" when disabled.
func (s *Server) MetricsAddr() string {
	if a := s.srv.MetricsAddr(); a != nil {
		return a.String()
	}
	return ""
}

func (s *Server) setServing(ok bool) {
	s.serving.Store(ok)
	s.srv.SetServing(ok)
}

// Run serves until ctx is done, then stops gracefully: new writes are
// refused, in-flight commits finish, the WAL is synced, a snapshot is taken
// and the WAL closed. It returns a fatal error (a WAL write or fsync
// failure) if one stopped the primary.
func (s *Server) Run(ctx context.Context) error {
	commitCtx, stopCommitter := context.WithCancel(context.Background())
	defer stopCommitter()
	committerDone := make(chan error, 1)
	go func() { committerDone <- s.committer(commitCtx) }()
	snapCtx, stopSnap := context.WithCancel(context.Background())
	snapDone := make(chan struct{})
	go func() { defer close(snapDone); s.snapshotter(snapCtx) }()

	serveCtx, stopServe := context.WithCancel(ctx)
	defer stopServe()
	serveDone := make(chan error, 1)
	go func() {
		serveDone <- s.srv.Serve(serveCtx, func() {
			s.seqMu.Lock()
			s.stopping = true
			s.seqMu.Unlock()
		})
	}()
	s.setServing(true)
	s.logger.Info("primary serving", "addr", s.Addr(), "metrics", s.MetricsAddr(), "epoch", s.epoch,
		"visible_lsn", s.visible.Load(), "durability", s.cfg.Policy.Durability.String())

	var serveErr, fatal error
	select {
	case fatal = <-committerDone:
		// The WAL failed: every waiter already has the error. Stop serving.
		stopServe()
		serveErr = <-serveDone
	case serveErr = <-serveDone:
		// Every call has finished; let the committer sync what is left.
		stopCommitter()
		fatal = <-committerDone
	}
	s.setServing(false)
	stopSnap()
	<-snapDone
	if fatal == nil {
		if err := s.takeSnapshot(); err != nil {
			s.logger.Warn("final snapshot failed", "err", err)
		}
	}
	if err := s.wal.Close(); err != nil && !errors.Is(err, wal.ErrClosed) && fatal == nil {
		fatal = fmt.Errorf("close wal: %w", err)
	}
	s.metrics.unregister()
	return errors.Join(fatal, serveErr)
}

// snapshotter takes a snapshot whenever SnapshotEveryBytes of WAL were
// written since the last one.
func (s *Server) snapshotter(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-s.snapKick:
		}
		if err := s.takeSnapshot(); err != nil {
			s.logger.Warn("snapshot failed", "err", err)
		}
	}
}

func (s *Server) maybeSnapshot() {
	if int64(s.wal.Stats().BytesWritten)-s.walAtSnap.Load() >= s.cfg.SnapshotEveryBytes {
		select {
		case s.snapKick <- struct{}{}:
		default:
		}
	}
}

// takeSnapshot writes the visible state to disk. The WAL is synced up to
// the snapshot's LSN first so that a snapshot never holds a commit the WAL
// could lose; WAL segments below the snapshot stay until retention drops
// them (replicas may still need them).
func (s *Server) takeSnapshot() error {
	s.snapMu.Lock()
	defer s.snapMu.Unlock()
	v := s.store.Snapshot()
	if v.AppliedLSN() == 0 || v.AppliedLSN() == s.snapshotLSN.Load() {
		return nil
	}
	written := int64(s.wal.Stats().BytesWritten)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s.kickCommitter()
	if err := s.wal.Wait(ctx, v.AppliedLSN(), true); err != nil {
		return fmt.Errorf("wait for wal sync to LSN %d: %w", v.AppliedLSN(), err)
	}
	start := time.Now()
	path, err := state.SaveSnapshot(s.fs, filepath.Join(s.cfg.DataDir, "snapshots"), v)
	if err != nil {
		return err
	}
	s.snapshotLSN.Store(v.AppliedLSN())
	s.walAtSnap.Store(written)
	s.logger.Info("snapshot written", "path", path, "lsn", v.AppliedLSN(), "keys", v.Len(), "took", time.Since(start))
	return nil
}

func (s *Server) kickCommitter() {
	select {
	case s.kick <- struct{}{}:
	default:
	}
}
