// Package primary is walship's primary: it sequences and commits KV
// transactions into a durable segmented WAL with group commit, serves reads at
// its visible LSN, and ships the WAL to replicas and log stores.
//
// Reading order: pipeline.go (the write path: a transaction's stages, the
// goroutines, who writes the WAL, the lock order), then sequence.go,
// commit.go (the writers and group commit) and visible.go; replication.go
// and logship.go are the streams to replicas and log stores, epoch.go the
// epoch, the lease and switchover.
package primary

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	walshipv1 "github.com/walship/walship/gen/walship/v1"
	"github.com/walship/walship/internal/changefeed"
	"github.com/walship/walship/internal/datadir"
	"github.com/walship/walship/internal/failover"
	"github.com/walship/walship/internal/kvread"
	"github.com/walship/walship/internal/recovery"
	"github.com/walship/walship/internal/rpcerr"
	"github.com/walship/walship/internal/serve"
	"github.com/walship/walship/internal/state"
	"github.com/walship/walship/internal/vfs"
	"github.com/walship/walship/internal/wal"
	"github.com/walship/walship/internal/watermark"
	"google.golang.org/grpc"
)

// Server is a primary. New recovers it from its data directory; Run serves it.
type Server struct {
	cfg     Config
	logger  *slog.Logger
	fs      vfs.FS
	srv     *serve.Server
	wal     *wal.Log
	store   *state.Store
	pipe    *pipeline // the write path
	reads   *kvread.Reader
	metrics *metrics
	admit   *admission // write admission: in-flight bytes, quotas
	peers   *peers
	epoch   uint64          // this run's epoch: epochs.Current()
	epochs  datadir.History // fixed after recover
	vote    atomic.Pointer[datadir.Vote]
	// cluster is the cluster this primary belongs to (DataDir/cluster):
	// settled before anything of its epoch is written or sent (cluster.go).
	cluster *datadir.Cluster
	// epochReady is set once the epoch is won and saved: replication
	// streams are served from then on. opened is set once the epoch record
	// meets the contract: reads and writes are served from then on.
	epochReady atomic.Bool
	opened     atomic.Bool
	openedCh   chan struct{} // closed once opened is set (markOpened)
	// commit is the commit watermark (commitmark.go), computed under
	// commitContract, this run's contract.
	commit         watermark.Watermark
	commitContract *walshipv1.Contract
	peerContract   bool // the contract waits for replicas or log stores
	lease          *lease
	leaseEchoes    atomic.Uint64 // echoes on the lease streams (keepLease)
	guard          rpcerr.ClusterGuard
	deposeOnce     sync.Once

	policy atomic.Pointer[Policy] // default commit policy
	// inForce is the newest contract record this run wrote (nil before
	// its epoch record): acks follow it (useContract).
	inForce atomic.Pointer[contractInForce]
	// changes is the membership change in progress (change.go).
	changes changes
	// lsChanged is closed when the log stores of the contract in force
	// change (logstores.go); guarded by lsMu.
	lsMu      sync.Mutex
	lsChanged chan struct{}

	snapMu      sync.Mutex
	snapshotLSN atomic.Uint64
	snaps       *recovery.SnapshotSchedule
	uploads     snapUploads // snapshots for the log stores (snapupload.go)

}

// New opens the data directory, recovers the state (newest snapshot, then
// the WAL after it) and listens. Health reports NOT_SERVING until Run has
// started.
func New(cfg Config) (*Server, error) {
	if cfg.ID == "" {
		cfg.ID = "primary"
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.ReplicaTimeout == 0 {
		cfg.ReplicaTimeout = 10 * cfg.HeartbeatInterval
	}
	if cfg.LeaseTimeout == 0 {
		cfg.LeaseTimeout = DefaultLeaseTimeout
	}
	if cfg.ChangeResumeGrace == 0 {
		cfg.ChangeResumeGrace = defaultResumeGrace
	}
	if cfg.ChangeRetryBackoff <= 0 {
		cfg.ChangeRetryBackoff = defaultRetryBackoff
	}
	if cfg.LogStoreSnapshotTimeout == 0 {
		cfg.LogStoreSnapshotTimeout = DefaultLogStoreSnapshotTimeout
	}
	s := &Server{
		cfg:    cfg,
		logger: cfg.Logger,
		fs:     cfg.FS,
		snaps:  recovery.NewSnapshotSchedule(cfg.SnapshotEveryBytes),
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
	s.openedCh = make(chan struct{})
	s.peers = newPeers()
	s.changes.ch = make(chan *changeRun)
	nv := datadir.Vote{}
	s.vote.Store(&nv)
	if err := s.recover(); err != nil {
		return nil, err
	}
	// The log stores are the contract's: the flags', unless a membership
	// change has set them in the log (startContract).
	start := s.startContract()
	for _, a := range logStoreSet(start) {
		s.peers.logstores[a] = &logstorePos{addr: a}
	}
	s.peers.quorum = failover.Majority(len(start.GetLogstores()))
	s.lease = newLease(cfg.LeaseTimeout, logStoreHalves(start))
	s.commitContract = start
	s.peerContract = s.commitContract.GetSyncReplicas() > 0 || s.commitContract.GetLogstoreSync()
	s.peers.setRule(ruleOf(s.commitContract, cfg.ID))
	if start.GetMembersChanged() && !slices.Equal(logStoreSet(start), cfg.LogStores) {
		s.logger.Warn("the log stores are those a membership change left in the log, not --logstore's: change them with walship ctl members",
			"logstores", orNone(logStoreSet(start)), "flag", orNone(cfg.LogStores))
	}
	s.admit = newAdmission(cfg.MaxInflightCommitBytes, cfg.WriteQuotaBytesPerSecond)
	s.metrics = newMetrics(reg, s)
	s.pipe.metrics = s.metrics
	s.guard = rpcerr.ClusterGuard{Role: "primary", ID: func() string { return s.cluster.ID() },
		Refused: s.metrics.clusterMismatch.Inc, Logger: s.logger}
	s.pipe.written = s.maybeSnapshot
	s.reads = &kvread.Reader{View: func() *state.View { return s.store.Snapshot() }, Visible: &s.pipe.visible}
	srv, err := serve.New(serve.Options{
		Security:        cfg.Security,
		Listen:          cfg.Listen,
		MetricsListen:   cfg.MetricsListen,
		MaxMessageBytes: cfg.maxMessageBytes(),
		MaxSendBytes:    streamMessageBytes,
		Registry:        reg,
		Logger:          s.logger,
		StopTimeout:     cfg.StopTimeout,
		StreamGrace:     cfg.StreamGrace,
		Ready:           func() error { return s.serving() },
		WrongNode:       s.wrongNode,
	}, func(g *grpc.Server) {
		walshipv1.RegisterKVServiceServer(g, &kvServer{s: s})
		walshipv1.RegisterAdminServiceServer(g, &adminServer{s: s})
		walshipv1.RegisterReplicationServiceServer(g, &replServer{s: s})
		walshipv1.RegisterEpochServiceServer(g, &epochServer{s: s})
		walshipv1.RegisterLogStoreServiceServer(g, &logServer{s: s})
		for _, r := range cfg.Register {
			r(g)
		}
	})
	if err != nil {
		_ = s.wal.Close()
		return nil, err
	}
	s.srv = srv
	s.pipe.stopped = func() { s.srv.SetServing(false) }
	return s, nil
}

// recover loads the newest snapshot, opens the WAL and replays it from the
// snapshot's LSN. Every batch in the WAL is committed from here on, whether
// or not its writer heard back before the crash.
func (s *Server) recover() error {
	res, err := recovery.Open(recovery.Options{DataDir: s.cfg.DataDir, FS: s.fs, SegmentBytes: s.cfg.SegmentBytes, Logger: s.logger})
	if err != nil {
		return err
	}
	s.store, s.wal = res.Store, res.WAL
	s.snapshotLSN.Store(res.SnapshotLSN)
	s.snaps.Taken(int64(s.wal.Stats().BytesWritten), res.SnapshotBytes)
	s.pipe = newPipeline(s.cfg, s.wal, s.store, s.peers, s.logger)
	s.pipe.feed = changefeed.New(s.store.AppliedLSN(), s.cfg.WatchMaxBytes, 0)
	if err := s.proposeEpoch(res.Epoch, s.store.AppliedLSN()+1); err != nil {
		_ = s.wal.Close()
		return err
	}
	s.pipe.epoch = s.epoch
	if s.cluster, err = datadir.OpenCluster(s.fs, s.cfg.DataDir); err != nil {
		_ = s.wal.Close()
		return err
	}
	if v, err := datadir.LoadVote(s.fs, s.cfg.DataDir); err == nil {
		s.vote.Store(&v)
	}
	return nil
}

// Addr is the gRPC address the primary listens on.
func (s *Server) Addr() string { return s.srv.Addr() }

// MetricsAddr is the metrics address, or "" when disabled.
func (s *Server) MetricsAddr() string { return s.srv.MetricsAddr() }

// Run serves until ctx is done, then stops gracefully: new writes are
// refused, in-flight commits finish, the WAL is synced, a snapshot is taken
// and the WAL closed. It first wins its epoch (elect; a *DeposedError if a
// newer one exists, an rpcerr.ErrOtherCluster if the log stores belong to
// another cluster) and settles its cluster id, and opens for reads and writes once its epoch record
// meets the contract. It returns a fatal error (a WAL write or fsync
// failure, a deposition) if one stopped the primary.
func (s *Server) Run(ctx context.Context) error {
	serveCtx, stopServe := context.WithCancel(ctx)
	defer stopServe()
	serveDone := make(chan error, 1)
	go func() {
		serveDone <- s.srv.Serve(serveCtx, s.pipe.stop)
	}()
	if err := s.elect(ctx); err == nil {
		err = s.saveEpoch()
	} else if !errors.Is(err, context.Canceled) || ctx.Err() == nil {
		// Deposed while down, or the epoch could not be saved: nothing
		// was served but Status and health.
		stopServe()
		<-serveDone
		_ = s.wal.Close()
		s.metrics.unregister()
		s.pipe.killAlive()
		return err
	}
	s.epochReady.Store(true)

	commitCtx, stopCommitter := context.WithCancel(context.Background())
	defer stopCommitter()
	committerDone := make(chan error, 1)
	go func() { committerDone <- s.pipe.committer(commitCtx) }()
	stopSnap := background(context.Background(), func(ctx context.Context) {
		s.snaps.Run(ctx, s.logger, func() error {
			if err := s.takeSnapshot(); err != nil {
				return err
			}
			s.enforceRetention()
			return nil
		})
	})
	stopShipping := background(context.Background(), s.shipToLogStores)
	stopCommit := background(serveCtx, s.trackCommit)
	defer stopCommit()
	// Snapshot uploads end as soon as the stop begins: they are best effort.
	stopUploads := background(serveCtx, s.uploadToLogStores)
	defer stopUploads()
	stopChanges := background(serveCtx, s.runChanges)
	defer stopChanges()
	stopOpen := background(serveCtx, func(ctx context.Context) {
		if err := s.openEpoch(ctx); err != nil && ctx.Err() == nil && s.pipe.alive.Err() == nil {
			s.logger.Error("cannot open the epoch", "epoch", s.epoch, "err", err)
		}
	})
	s.logger.Info("primary serving", "addr", s.Addr(), "metrics", s.MetricsAddr(), "cluster_id", s.cluster.ID(), "epoch", s.epoch, "id", s.cfg.ID,
		"visible_lsn", s.pipe.visible.Load(), "durability", s.cfg.Policy.Durability.String())

	var serveErr, fatal error
	select {
	case fatal = <-committerDone:
		// The WAL failed, or the primary was deposed: every waiter already
		// has the error. Stop serving.
		stopServe()
		serveErr = <-serveDone
	case serveErr = <-serveDone:
		// Every call has finished; let the committer sync what is left.
		stopCommitter()
		fatal = <-committerDone
	}
	stopOpen()
	stopChanges()
	stopUploads()
	s.srv.SetServing(false)
	stopSnap()
	// The committer synced everything; give log stores a moment to take the
	// tail before the WAL closes (their acks are not waited for: async
	// archiving, and sync commits already waited).
	stopShipping()
	// No snapshot after a deposition: its state may hold a tail the new
	// primary does not have, which the rejoining replica cuts from its WAL.
	if fatal == nil {
		if err := s.takeSnapshot(); err != nil {
			s.logger.Warn("final snapshot failed", "err", err)
		}
	}
	if err := s.wal.Close(); err != nil && !errors.Is(err, wal.ErrClosed) && fatal == nil {
		fatal = fmt.Errorf("close wal: %w", err)
	}
	s.pipe.killAlive()
	s.metrics.unregister()
	return errors.Join(fatal, serveErr)
}

// background runs fn in a goroutine of its own with a context derived from
// parent; the stop it returns cancels that context and waits for fn to
// return (calling it again does nothing more).
func background(parent context.Context, fn func(ctx context.Context)) (stop func()) {
	ctx, cancel := context.WithCancel(parent)
	done := make(chan struct{})
	go func() { defer close(done); fn(ctx) }()
	return func() { cancel(); <-done }
}

// shipToLogStores keeps every log store of the contract in force fed
// (shipLogStore) until ctx ends, following the contract as a membership
// change moves it; one that leaves is forgotten.
func (s *Server) shipToLogStores(ctx context.Context) {
	s.followLogStores(ctx, s.shipLogStore, func(addr string) {
		s.peers.dropLogStore(addr)
		s.lease.forget(addr)
		s.logger.Info("not shipping to the log store any more: it left the contract", "logstore", addr)
	})
}

// uploadToLogStores uploads the primary's snapshots to every log store
// (uploadSnapshots), and the one it recovered from, until ctx ends.
func (s *Server) uploadToLogStores(ctx context.Context) {
	if len(s.logStores()) == 0 {
		return
	}
	if s.cfg.LogStoreSnapshotEvery < 0 {
		s.logger.Warn("--logstore-snapshot-every is negative: no snapshot is uploaded to the log stores, so the cluster is not restorable from its log stores or their archive (nor can they re-seed a replica) once their log no longer starts at LSN 1",
			"wal_first_lsn", s.wal.FirstReadableLSN(), "snapshot_lsn", s.snapshotLSN.Load())
		return
	}
	var wg sync.WaitGroup
	wg.Go(func() {
		s.followLogStores(ctx, func(ctx context.Context, addr string) {
			kick := s.uploads.watch()
			defer s.uploads.unwatch(kick)
			s.uploadSnapshots(ctx, addr, kick)
		}, nil)
	})
	wg.Go(s.offerRecovered)
	wg.Wait()
}

// enforceRetention removes WAL segments once the WAL passes 80% of
// WALRetentionBytes, up to the newest snapshot (recovery needs the WAL after
// it), so the WAL stays under the limit with room to spare and an alert at
// 90% means retention is stuck. A replica or log store that still needed the
// removed segments catches up from a log store or a snapshot; retention
// never fills the disk waiting for one.
//
// The cut keeps the batch that ends at the snapshot's LSN, not only the
// ones after it (wal.TruncateBefore keeps every entry that holds its LSN or
// a later one): a log store takes a base snapshot only at a batch end it
// holds, so a restart from this snapshot with new, empty log stores can
// upload it at once (offerRecovered) only if the WAL still has that batch.
// It costs at most one segment more.
func (s *Server) enforceRetention() {
	if !s.overRetention() {
		return
	}
	select {
	case s.pipe.cuts <- s.snapshotLSN.Load():
	default: // one is pending already
	}
}

func (s *Server) overRetention() bool { return s.wal.Size() > s.cfg.WALRetentionBytes/10*8 }

// maybeSnapshot asks for a snapshot when one is due, or when the WAL is
// over its retention budget and a snapshot would let retention cut it.
func (s *Server) maybeSnapshot() {
	s.snaps.Written(int64(s.wal.Stats().BytesWritten), s.overRetention() && s.pipe.visible.Load() > s.snapshotLSN.Load())
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
	if err := s.pipe.syncThrough(ctx, v.AppliedLSN()); err != nil {
		return err
	}
	start := time.Now()
	path, err := state.SaveSnapshot(s.fs, recovery.SnapshotDir(s.cfg.DataDir), v)
	if err != nil {
		return err
	}
	s.snapshotLSN.Store(v.AppliedLSN())
	size := recovery.FileSize(s.fs, path)
	s.snaps.Taken(written, size)
	s.logger.Info("snapshot written", "path", path, "lsn", v.AppliedLSN(), "keys", v.Len(), "bytes", size, "took", time.Since(start),
		"next_after_wal_bytes", s.snaps.Interval())
	s.offerSnapshot(path, v.AppliedLSN(), uint64(v.Len()), v.Digest().String())
	return nil
}
