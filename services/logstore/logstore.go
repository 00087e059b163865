package logstore

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
	"github.com/walship/walship/internal/datadir"
	"github.com/walship/walship/internal/rpcerr"
	"github.com/walship/walship/internal/serve"
	"github.com/walship/walship/internal/vfs"
	"github.com/walship/walship/internal/wal"
	"google.golang.org/grpc"
)

// Server is a log store. New recovers it from its data directory; Run
// serves it.
type Server struct {
	cfg     Config
	logger  *slog.Logger
	fs      vfs.FS
	now     func() time.Time
	srv     *serve.Server
	wal     *wal.Log
	metrics *metrics

	// epoch is the highest epoch promised (DataDir/vote): by a fence, or
	// to a primary whose heartbeat or batch was of a newer epoch. Senders
	// of an older epoch are refused. Only the writer goroutine raises it,
	// after persisting it; everyone may read it. vote is the whole promise.
	epoch atomic.Uint64
	vote  atomic.Pointer[datadir.Vote]
	// logPrimary is the promise of the log's epoch that named its primary,
	// kept when a newer epoch was promised (DataDir/logprimary,
	// failover.State.LogPrimary); nil before recovery. Writer-only writes.
	logPrimary atomic.Pointer[datadir.Vote]
	// logEpoch is the epoch of the newest stored batch and history the
	// epoch history of the stored log (DataDir/epochs). Writer-only writes.
	logEpoch atomic.Uint64
	history  atomic.Pointer[datadir.History]
	// cluster is the cluster the log store belongs to (DataDir/cluster):
	// adopted from the first fence or primary's heartbeat that states one,
	// by the writer; peers of another cluster are refused.
	cluster *datadir.Cluster
	guard   rpcerr.ClusterGuard // refuses peers of another cluster
	// orphans counts entries cut into orphan files (for Status and metrics).
	orphanedRecords atomic.Uint64

	// walMu serialises the WAL's single-writer operations: the writer's
	// Append+Sync rounds and fences, and retention's TruncateBefore.
	walMu sync.Mutex

	// mu guards the registered streams, the lifecycle flags below and the
	// writer's queue (w.queue, w.urgent, w.closed): a request is admitted
	// (not stopping, not failed) and queued in one critical section.
	mu       sync.Mutex
	streams  map[*appendStream]struct{}
	stopping bool  // graceful stop began: no new streams or requests
	fatal    error // the WAL failed; set once

	// active tracks RPC handlers and their receive goroutines, so Run
	// closes the WAL only after every one has returned. Add is only called
	// under mu while !stopping, and Run waits after setting stopping.
	active sync.WaitGroup

	// stopReads is cancelled when the graceful stop begins, ending Read
	// streams (followers would otherwise never end).
	stopReads       context.Context
	cancelStopReads context.CancelFunc

	w    writerState    // the writer goroutine (append.go)
	echo echoState      // heartbeats answered at once (echo.go)
	ret  retentionState // the retention goroutine (retention.go)
	fill refillState    // the refiller goroutine (refill.go)

	// snaps are the stored base snapshots (DataDir/snapshots); putSem lets
	// one upload through at a time; pins are the positions of readers
	// that retention must not cut (lock order: see the package's).
	snaps  snapshotList
	putSem chan struct{}
	pins   pins
	// arch uploads to the archive (nil without one); archivedHeard is the
	// archived LSN the primary's heartbeats last said (writer-only
	// writes): with arch's own uploads, what retention keeps after.
	arch          *archiver
	archivedHeard atomic.Uint64

	// elect is the election register automatic failover runs on (elect.go).
	elect electReg

	// snapshotWait bounds PutSnapshot's wait for its LSN to be durable
	// here (snapshotDurableWait; tests shorten it).
	snapshotWait time.Duration
}

// New opens the data directory, recovers the WAL and the highest epoch seen,
// and listens. Health reports NOT_SERVING until Run has started.
func New(cfg Config) (*Server, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	s := &Server{
		cfg:     cfg,
		logger:  cfg.Logger,
		fs:      cfg.FS,
		now:     cfg.Now,
		streams: make(map[*appendStream]struct{}),
		w:       writerState{kick: make(chan struct{}, 1)},
		echo:    echoState{base: time.Now()},
		ret:     retentionState{kick: make(chan struct{}, 1), commitAt: make(map[uint64]time.Time)},
		fill:    refillState{kick: make(chan struct{}, 1), instance: newInstance()},
		putSem:  make(chan struct{}, 1),

		snapshotWait: snapshotDurableWait,
	}
	if s.logger == nil {
		s.logger = slog.New(slog.DiscardHandler)
	}
	if s.fs == nil {
		s.fs = vfs.OS
	}
	if s.now == nil {
		s.now = time.Now
	}
	s.stopReads, s.cancelStopReads = context.WithCancel(context.Background())
	reg := cfg.Registry
	if reg == nil {
		reg = serve.NewRegistry()
	}
	if err := s.recover(); err != nil {
		return nil, err
	}
	if err := s.loadElection(); err != nil {
		_ = s.wal.Close()
		return nil, err
	}
	m, err := newMetrics(reg, s)
	if err != nil {
		_ = s.wal.Close()
		return nil, fmt.Errorf("register metrics: %w", err)
	}
	s.metrics = m
	s.guard = rpcerr.ClusterGuard{Role: "log store", ID: func() string { return s.cluster.ID() },
		Refused: m.clusterMismatch.Inc, Logger: s.logger}
	if cfg.Archive.Set() {
		if err := s.openArchive(reg); err != nil {
			m.unregister()
			_ = s.wal.Close()
			return nil, err
		}
	}
	if len(cfg.Peers) > 0 && s.wal.FirstLSN() == 0 {
		// Empty, with peers: copy what they keep first, rather than start
		// at the primary's oldest batch without the history before it.
		why := "this log store is empty"
		s.fill.why.Store(&why)
		s.fill.refilling.Store(true)
	}
	srv, err := serve.New(serve.Options{
		Security:        cfg.Security,
		Listen:          cfg.Listen,
		MetricsListen:   cfg.MetricsListen,
		MaxMessageBytes: cfg.MaxMessageBytes,
		// Only data nodes send WAL batches (Append) and snapshots
		// (PutSnapshot); every other peer's requests are a few bytes.
		EdgeMaxMessageBytes: edgeMessageBytes,
		Registry:            reg,
		Logger:              s.logger,
		StopTimeout:         cfg.StopTimeout,
		WrongNode:           s.wrongNode,
	}, func(g *grpc.Server) {
		walshipv1.RegisterLogStoreServiceServer(g, &logStoreServer{s: s})
		walshipv1.RegisterEpochServiceServer(g, &epochServer{s: s})
		walshipv1.RegisterAdminServiceServer(g, &adminServer{s: s})
	})
	if err != nil {
		m.unregister()
		_ = s.wal.Close()
		return nil, err
	}
	s.srv = srv
	return s, nil
}

// recover reads the vote and the epoch history and opens the WAL.
func (s *Server) recover() error {
	if err := s.fs.MkdirAll(s.cfg.DataDir, vfs.DirPerm); err != nil {
		return fmt.Errorf("create %s: %w", s.cfg.DataDir, err)
	}
	v, err := datadir.LoadVote(s.fs, s.cfg.DataDir)
	if err != nil {
		return err
	}
	lp, err := datadir.LoadLogPrimary(s.fs, s.cfg.DataDir)
	if err != nil {
		return err
	}
	s.logPrimary.Store(&lp)
	h, err := datadir.LoadHistory(s.fs, s.cfg.DataDir)
	if err != nil {
		return err
	}
	if s.cluster, err = datadir.OpenCluster(s.fs, s.cfg.DataDir); err != nil {
		return err
	}
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
	// A crash may cut entries the history was written for: the history
	// describes what the log holds.
	h = h.Cut(log.LastLSN())
	logEpoch := h.Current().Epoch
	if len(h) == 0 && log.FirstLSN() != 0 {
		// A log written before histories were kept: its epoch file was
		// the epoch of its newest batch.
		logEpoch = v.Epoch
	}
	s.epoch.Store(v.Epoch)
	s.vote.Store(&v)
	s.logEpoch.Store(logEpoch)
	s.history.Store(&h)
	if ri := log.Recovery(); ri.TornSegment != "" {
		s.logger.Warn("cut a torn WAL tail", "segment", ri.TornSegment, "offset", ri.TornOffset, "bytes", ri.TornBytes, "reason", ri.TornReason)
	}
	s.ret.firstKept.Advance(log.FirstLSN())
	if err := s.recoverSnapshots(); err != nil {
		_ = log.Close()
		return err
	}
	s.logger.Info("recovered", "cluster_id", s.cluster.ID(), "first_lsn", log.FirstLSN(), "durable_lsn", log.DurableLSN(), "vote", v.String(),
		"log_epoch", logEpoch, "segments", log.Segments(), "wal_bytes", log.Size(), "snapshots", s.snaps.len())
	return nil
}

// saveVote persists v as the log store's promise, then publishes it,
// keeping first the promise it replaces if that named the primary of the
// log's epoch (failover.State.KeepsLogPrimary). Writer-only. An error is
// fatal.
func (s *Server) saveVote(v datadir.Vote) error {
	if kept, ok := s.acceptor().KeepsLogPrimary(v); ok {
		if err := datadir.SaveLogPrimary(s.fs, s.cfg.DataDir, kept); err != nil {
			s.metrics.fsyncErrors.Inc()
			return err
		}
		s.logPrimary.Store(&kept)
	}
	if err := datadir.SaveVote(s.fs, s.cfg.DataDir, v); err != nil {
		s.metrics.fsyncErrors.Inc()
		return err
	}
	prev := s.vote.Load()
	s.vote.Store(&v)
	s.epoch.Store(v.Epoch)
	s.logger.Info("promised a newer epoch", "vote", v.String(), "previous", prev.String())
	return nil
}

// knownEpoch is the newest epoch the log store knows, promised or stored:
// datadir.CheckEpoch bounds what a peer may state from it.
func (s *Server) knownEpoch() uint64 { return max(s.epoch.Load(), s.logEpoch.Load()) }

// adoptCluster makes id the log store's cluster id if it has none, saved
// before anything that came with it is acted on. Writer-only. An error
// is fatal.
func (s *Server) adoptCluster(id, from string) error {
	if id == "" {
		return nil
	}
	adopted, err := s.cluster.Adopt(id)
	if err != nil {
		s.metrics.fsyncErrors.Inc()
		return err
	}
	if adopted {
		s.logger.Info("joined a cluster", "cluster_id", id, "from", from)
	}
	return nil
}

// Addr is the gRPC address the log store listens on.
func (s *Server) Addr() string { return s.srv.Addr() }

// MetricsAddr is the metrics address, or "" when disabled.
func (s *Server) MetricsAddr() string { return s.srv.MetricsAddr() }

// Run serves until ctx is done, then stops gracefully: health turns
// NOT_SERVING, new streams are refused, Read streams end, Append streams
// get their in-flight batches fsynced and acknowledged before they end with
// UNAVAILABLE, and the WAL is closed. A failed WAL write or fsync is fatal:
// every stream fails, the log store stops and Run returns the error.
func (s *Server) Run(ctx context.Context) error {
	stopWriter := make(chan struct{})
	writerDone := make(chan error, 1)
	go func() { writerDone <- s.writer(stopWriter) }()

	retCtx, stopRetention := context.WithCancel(context.Background())
	defer stopRetention()
	retDone := make(chan struct{})
	retFailed := make(chan error, 1)
	// The refiller ends when the graceful stop begins (or a failure stops
	// the log store: beginStop runs then too).
	refillCtx, stopRefill := context.WithCancel(s.stopReads)
	defer stopRefill()
	refillDone := make(chan struct{})
	go func() {
		defer close(refillDone)
		s.refiller(refillCtx)
	}()
	go func() {
		defer close(retDone)
		if err := s.retention(retCtx); err != nil {
			retFailed <- err
		}
	}()
	// The archive's uploader stops when the graceful stop begins.
	archDone := make(chan struct{})
	go func() {
		defer close(archDone)
		if s.arch != nil {
			s.arch.run(refillCtx)
		}
	}()

	// Serving stops when ctx ends, after a scaled-down log store has
	// asked to be removed (Config.Leaving), or at once on a failure.
	serveCtx, stopServe := context.WithCancel(context.Background())
	defer stopServe()
	serveDone := make(chan error, 1)
	go func() { serveDone <- s.srv.Serve(serveCtx, s.beginStop) }()
	s.srv.SetServing(true)
	s.logger.Info("log store serving", "addr", s.Addr(), "metrics", s.MetricsAddr(), "cluster_id", s.cluster.ID(), "epoch", s.epoch.Load(),
		"first_lsn", s.wal.FirstLSN(), "durable_lsn", s.wal.DurableLSN(), "peers", len(s.cfg.Peers), "refilling", s.fill.refilling.Load(),
		"retention_bytes", s.cfg.RetentionBytes, "retention_age", s.cfg.RetentionAge)
	joinCtx, stopJoin := context.WithCancel(serveCtx)
	defer stopJoin()
	joinDone := make(chan struct{})
	go func() {
		defer close(joinDone)
		if s.cfg.Join {
			s.join(joinCtx)
		}
	}()
	leaveDone := make(chan struct{})
	go func() {
		defer close(leaveDone)
		select {
		case <-ctx.Done():
			stopJoin()
			<-joinDone
			s.leaveIfScaledDown()
			stopServe()
		case <-serveCtx.Done(): // a failure stopped it
		}
	}()

	var serveErr, fatal error
	select {
	case fatal = <-writerDone:
		s.logger.Error("log store failed; stopping", "err", fatal)
		stopServe()
		serveErr = <-serveDone
	case fatal = <-retFailed:
		// Retention broke the log: fail every stream now, rather than at
		// the next batch (an idle primary's heartbeats would otherwise be
		// acked on a log whose state on disk is unknown).
		s.logger.Error("log store failed; stopping", "err", fatal)
		s.failAll(fatal, nil)
		stopServe()
		serveErr = <-serveDone
		close(stopWriter)
		<-writerDone
	case serveErr = <-serveDone:
		// Every call has returned, so nothing new is queued: let the
		// writer finish what is (nothing, normally) and exit.
		close(stopWriter)
		fatal = <-writerDone
	}
	stopServe()
	<-leaveDone
	stopJoin()
	<-joinDone
	s.srv.SetServing(false)
	s.beginStop() // in case Serve failed before its own stop ran
	stopRetention()
	<-retDone
	stopRefill()
	<-refillDone
	<-archDone
	s.active.Wait()
	if err := s.wal.Close(); err != nil && !errors.Is(err, wal.ErrClosed) && fatal == nil {
		fatal = fmt.Errorf("close wal: %w", err)
	}
	s.cancelStopReads()
	s.metrics.unregister()
	return errors.Join(fatal, serveErr)
}

// beginStop refuses new streams and requests, ends Read streams and tells
// Append streams to finish once their in-flight batches are acknowledged.
// It runs after health turns NOT_SERVING and before the gRPC server stops.
func (s *Server) beginStop() {
	s.mu.Lock()
	s.stopping = true
	for st := range s.streams {
		st.stop()
	}
	s.mu.Unlock()
	s.cancelStopReads()
}
