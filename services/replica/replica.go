// Package replica is walship's replica: it follows a primary's WAL, writes
// every batch to its own WAL, fsyncs, applies it, acknowledges cumulative
// LSNs per stage (written, flushed, applied), and serves reads at its
// applied LSN.
//
// # Following
//
// One goroutine (the follower) owns the replication position. It walks the
// catch-up ladder: it streams from the primary (rung primary); when the
// primary no longer retains the LSN it needs (OUT_OF_RANGE) it reads the gap
// from the log store, if one is configured (rung logstore), and otherwise, or
// when the log store cannot supply it either, re-seeds its state from a
// snapshot (rung snapshot): the log store's newest base snapshot and its
// batches after it if the log store has one newer than the replica's
// state, else one streamed by the primary; after both it goes back to the
// primary. With an archive configured (Config.Archive), a replica that
// none of them can serve — the primary unreachable, or unable to stream a
// snapshot, and the log stores past its next LSN — reads the archive
// (rung archive, archive.go): its chunks from the replica's next LSN, or
// its newest usable base snapshot and the chunks after it. Failures
// reconnect with exponential backoff (50ms..2s with jitter). Nothing on
// this path ever deletes data the replica cannot get back: a primary that
// says the replica is ahead or in a newer epoch (FAILED_PRECONDITION) is
// logged and retried, never obeyed by wiping.
//
// On a replication stream one goroutine receives and one sends; the
// follower processes what was received in rounds: it drains every batch
// already received, checks each (CRC, epoch, continuity, decode — a batch
// failing any check is refused: counted, never written, never applied, and
// the stream is restarted at the right LSN), writes the good ones with one
// WAL append, acks at once if the primary asked (a commit may wait for
// write-level acks), fsyncs (at once if asked, else within FlushDelay),
// applies, and acks again (at once if asked, else within 10 ms). Batches
// arrive before the primary has fsynced them: every stream message carries
// the primary's durable LSN, and nothing beyond it is applied; the rest
// waits in memory, and across a restart in the WAL past the applied marker
// (DataDir/applied). A primary that restarted without a tail this replica
// holds answers its hello with Diverged, and the tail is cut. Acks are
// cumulative positions read when they are sent, so they coalesce by
// construction; the sender also acks at least every heartbeat interval.
//
// The follower's state is a type of its own (follower.go, whose header
// lists its stages, goroutines and the package's lock order); follow.go
// holds the ladder, stream.go a stream from the primary, apply.go the
// rounds.
//
// # Storage
//
// The data directory has the primary's layout (internal/recovery): WAL
// segments in wal/, state snapshots in snapshots/, plus a file epoch holding
// the highest epoch seen (so that fencing survives a snapshot that truncated
// every batch carrying it), and DataDir/cluster, the id of the cluster the
// replica belongs to (cluster.go: a primary, snapshot or candidate of
// another cluster is refused, and never followed). A snapshot is taken after SnapshotEveryBytes of
// WAL, or after the last snapshot's size in WAL if that is more, and on a
// clean stop; the WAL is then truncated before the older of the two kept
// snapshots, so that recovery can still fall back to it if the newest turns
// out to be corrupt (the WAL holds up to about two snapshot intervals).
// Re-seeding writes the received state as a snapshot first and resets the
// WAL to start right after it second; if a crash falls between the two, New
// finds a WAL that ends before the newest snapshot and finishes the reset
// before recovering.
package replica

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	walshipv1 "github.com/walship/walship/gen/walship/v1"
	"github.com/walship/walship/internal/archive"
	"github.com/walship/walship/internal/changefeed"
	"github.com/walship/walship/internal/datadir"
	"github.com/walship/walship/internal/envelope"
	"github.com/walship/walship/internal/keyspace"
	"github.com/walship/walship/internal/kvread"
	"github.com/walship/walship/internal/recovery"
	"github.com/walship/walship/internal/rpcerr"
	"github.com/walship/walship/internal/serve"
	"github.com/walship/walship/internal/state"
	"github.com/walship/walship/internal/tlsid"
	"github.com/walship/walship/internal/vfs"
	"github.com/walship/walship/internal/wal"
	"github.com/walship/walship/internal/watermark"
	"google.golang.org/grpc"
	"google.golang.org/grpc/keepalive"
)

// maxSendBytes bounds the messages the replica's server sends: a Scan
// response (up to kvread.MaxScanBytes, or one pair with a large value), a
// WAL batch a candidate copies (LogStoreService.Read), plus headroom.
const maxSendBytes = 72 << 20

// maxRequestBytes bounds the messages the replica's server receives: the
// largest write (which it refuses, naming the primary); every other
// request — reads, acks, fences, a candidate's reads — is far smaller.
// (It was maxSendBytes too: a peer could make the replica hold 72 MiB per
// call before any handler ran.)
func (c *Config) maxRequestBytes() int {
	v := c.MaxValueBytes
	if v <= 0 {
		v = 1 << 20
	}
	return v + keyspace.MaxKeyBytes + 1<<20
}

// maxRecvBytes bounds one message from the primary or the log store: a
// WAL batch can be as large as a WAL entry.
const maxRecvBytes = wal.MaxEntrySize + 1<<20

// Server is a replica. New recovers it from its data directory; Run follows
// the primary and serves reads.
type Server struct {
	cfg     Config
	logger  *slog.Logger
	fs      vfs.FS
	now     func() time.Time
	srv     *serve.Server
	metrics *metrics
	reads   *kvread.Reader
	lag     *lagTracker

	// primaryAddr is the primary to follow: set by the vote (followPrimary).
	primaryAddr atomic.Pointer[string]
	// logstores are the log stores dialled, by address: Config.LogStores
	// by New, those of the contract in the log as sets name them
	// (logStoresOf). lsClosed: closeConns closed them, dial no more.
	lsMu         sync.Mutex
	logstores    map[string]*logStore
	lsClosed     bool
	dialLogStore []grpc.DialOption
	// arch is Config.Archive, opened (nil: none); the archive rung reads it.
	arch *archive.Archive

	// walMu serialises the WAL's writer calls: the follower appends, syncs
	// and resets; the snapshotter truncates.
	walMu sync.Mutex
	wal   *wal.Log
	// store is swapped whole when the replica is re-seeded from a snapshot.
	store atomic.Pointer[state.Store]
	// heldRecord is the newest epoch record in a batch written, with that
	// batch's last LSN: the log's newest while not applied (heldrecord.go).
	heldRecord atomic.Pointer[heldEpochRecord]
	visible    watermark.Watermark // the applied LSN
	// rd is what reads and watches are served from: the newest applied
	// view at or below the primary's commit watermark (readable.go);
	// feed, the transactions applied, for watches.
	rd   readable
	feed *changefeed.Feed
	// feedTxns is the apply's list of transactions for feed, reused (the
	// follower's alone).
	feedTxns []*changefeed.Txn
	// epoch is the epoch of the newest entry of the log, history its epoch
	// history, vote the highest epoch promised (epoch.go). voteMu
	// serialises promises.
	epoch   atomic.Uint64
	history atomic.Pointer[datadir.History]
	voteMu  sync.Mutex
	vote    atomic.Pointer[datadir.Vote]
	// logPrimary is the promise of the log's epoch that named its
	// primary, kept when a newer epoch was promised (DataDir/logprimary,
	// failover.State.LogPrimary); written under voteMu.
	logPrimary atomic.Pointer[datadir.Vote]
	// cluster is the cluster the replica belongs to (DataDir/cluster),
	// adopted from the first primary, snapshot or granted fence that
	// states one (cluster.go).
	cluster *datadir.Cluster
	guard   rpcerr.ClusterGuard // refuses peers of another cluster
	// follower is the following goroutine's state and the replication
	// position it owns (follower.go).
	follower follower

	// snapMu serialises snapshot writing and re-seeding (SaveSnapshot must
	// not run concurrently for one directory).
	snapMu          sync.Mutex
	snapshotLSN     atomic.Uint64
	prevSnapshotLSN uint64 // the older kept snapshot; guarded by snapMu
	snaps           *recovery.SnapshotSchedule
}

// New opens the data directory, recovers the state (newest snapshot, then
// the WAL after it) and listens. Health reports NOT_SERVING until Run has
// started.
func New(cfg Config) (*Server, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	s := &Server{cfg: cfg, logger: cfg.Logger, fs: cfg.FS, now: time.Now, snaps: recovery.NewSnapshotSchedule(cfg.SnapshotEveryBytes)}
	s.follower.newPrimary = make(chan struct{}, 1)
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
	if err := s.recover(); err != nil {
		return nil, err
	}
	ok := false
	defer func() {
		if !ok {
			s.closeConns()
			_ = s.wal.Close()
		}
	}()
	// The primary must be a node, a log store a log store (under the
	// default identity scheme): a server holding another class's
	// certificate at the address is neither followed nor read.
	dial := func(class string) []grpc.DialOption {
		return append(cfg.Security.Dialer.Options(cfg.Security.Dialer.PeerClass(class),
			grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(maxRecvBytes)),
			// Find a dead connection (a partition sends no FIN) within ~15s.
			grpc.WithKeepaliveParams(keepalive.ClientParameters{Time: 10 * time.Second, Timeout: 5 * time.Second, PermitWithoutStream: true}),
		), cfg.DialOptions...)
	}
	s.follower.dialPrimary = dial(tlsid.ClassNode)
	var err error
	if _, err = s.replClient(); err != nil {
		return nil, fmt.Errorf("--primary %s: %w", s.primary(), err)
	}
	s.dialLogStore = dial(tlsid.ClassLogStore)
	s.logstores = map[string]*logStore{}
	for _, addr := range cfg.LogStores {
		conn, err := grpc.NewClient(addr, s.dialLogStore...)
		if err != nil {
			return nil, fmt.Errorf("--logstore %s: %w", addr, err)
		}
		s.logstores[addr] = &logStore{addr: addr, conn: conn, client: walshipv1.NewLogStoreServiceClient(conn)}
	}
	if cfg.Archive.Set() {
		// Opening reaches nothing: a wrong address or credentials show
		// when the rung first reads it.
		if s.arch, err = archive.Open(context.Background(), cfg.Archive, s.logger); err != nil {
			return nil, err
		}
	}
	s.lag = newLagTracker(cfg.HeartbeatInterval, s.appliedLSN(), s.now())
	s.reads = &kvread.Reader{View: s.rd.current, Visible: s.rd.lsn, Lag: s.readLag}
	srv, err := serve.New(serve.Options{
		Security:        cfg.Security,
		Listen:          cfg.Listen,
		MetricsListen:   cfg.MetricsListen,
		MaxMessageBytes: cfg.maxRequestBytes(),
		MaxSendBytes:    maxSendBytes,
		Registry:        reg,
		Logger:          s.logger,
		StopTimeout:     cfg.StopTimeout,
		StreamGrace:     cfg.StreamGrace,
		Ready:           s.ready,
		WrongNode:       s.wrongNode,
	}, func(g *grpc.Server) {
		walshipv1.RegisterKVServiceServer(g, &kvServer{s: s})
		walshipv1.RegisterAdminServiceServer(g, &adminServer{s: s})
		walshipv1.RegisterEpochServiceServer(g, &epochServer{s: s})
		walshipv1.RegisterReplicationServiceServer(g, &replServer{s: s})
		walshipv1.RegisterLogStoreServiceServer(g, &logServer{s: s})
		for _, r := range cfg.Register {
			r(g)
		}
	})
	if err != nil {
		return nil, err
	}
	s.srv = srv
	s.metrics = newMetrics(reg, s)
	s.guard = rpcerr.ClusterGuard{Role: "replica " + cfg.ID, ID: func() string { return s.cluster.ID() },
		Refused: s.metrics.clusterMismatch.Inc, Logger: s.logger}
	spilled := 0
	for _, c := range s.follower.unapplied {
		if c.spilled {
			spilled++
		}
	}
	s.observeUnapplied(spilled)
	ok = true
	return s, nil
}

func (s *Server) closeConns() {
	s.follower.connMu.Lock()
	if s.follower.primaryConn != nil {
		_ = s.follower.primaryConn.Close()
		s.follower.primaryConn = nil
	}
	s.follower.connMu.Unlock()
	s.lsMu.Lock()
	for _, ls := range s.logstores {
		_ = ls.conn.Close()
	}
	s.logstores, s.lsClosed = nil, true
	s.lsMu.Unlock()
}

func (s *Server) walDir() string  { return filepath.Join(s.cfg.DataDir, "wal") }
func (s *Server) snapDir() string { return recovery.SnapshotDir(s.cfg.DataDir) }

// recover finishes an interrupted re-seed, then loads the newest snapshot,
// opens the WAL and replays it.
func (s *Server) recover() error {
	if err := s.finishReseed(); err != nil {
		return err
	}
	marker := s.loadAppliedMarker()
	res, err := recovery.Open(recovery.Options{DataDir: s.cfg.DataDir, FS: s.fs, SegmentBytes: s.cfg.SegmentBytes, Logger: s.logger,
		LimitReplay: true, ReplayUpTo: marker.LSN, PendingDataBytes: s.cfg.MaxUnappliedBytes})
	if err != nil {
		return err
	}
	s.wal = res.WAL
	s.snaps.Taken(int64(s.wal.Stats().BytesWritten), res.SnapshotBytes)
	// The log may end in batches the primary had not made durable when they
	// arrived: they wait, unapplied, for the primary to report them durable
	// (or to say they diverged).
	for _, e := range res.Pending {
		if e.Data == nil { // past the memory bound: read back when applied
			s.follower.unapplied = append(s.follower.unapplied, spilledBatch(e.FirstLSN, e.LastLSN))
			continue
		}
		var c checked
		c.env = new(walshipv1.WalBatch)
		if err := envelope.DecodeStored(e.Data, c.env, &c.batch); err != nil {
			_ = res.WAL.Close()
			return fmt.Errorf("wal entry %d..%d after the replay limit: %w", e.FirstLSN, e.LastLSN, err)
		}
		s.keepUnapplied([]checked{c})
	}
	s.rescanHeldRecords() // the spilled ones too
	if n := len(res.Pending); n > 0 {
		s.logger.Info("batches not yet known durable on the primary wait to be applied", "batches", n,
			"from_lsn", res.Pending[0].FirstLSN, "to_lsn", res.Pending[n-1].LastLSN)
	}
	s.follower.primaryDurable = res.Store.AppliedLSN()
	s.follower.markerLSN, s.follower.markerReadable = marker.LSN, marker.Readable
	s.store.Store(res.Store)
	s.visible.Advance(res.Store.AppliedLSN())
	// What was applied before the restart becomes readable once the
	// primary's commit watermark covers it; a read-only replica follows
	// no primary and serves its state as it is (and saves no marker: it
	// learns nothing about the watermark).
	s.feed = changefeed.New(res.Store.AppliedLSN(), s.cfg.WatchMaxBytes, 0)
	s.rd.lsn = &s.feed.Bound
	s.rd.applied(res.Store.Snapshot())
	switch {
	case s.cfg.ReadOnly:
		s.rd.committed(res.Store.AppliedLSN())
	case marker.Readable && res.Store.AppliedLSN() == marker.LSN:
		// A readable marker is the LSN reads were served at when the
		// replica last stopped cleanly: at or below a watermark heard,
		// and the last LSN served. Serving there at once is neither past
		// the contract nor behind what was served. Not so for state past
		// it — a re-seed's snapshot is at the primary's visible LSN — or
		// short of it (what was served is not all here), nor
		// after a crash, nor for a marker of the older form, which holds
		// the applied LSN. The marker is made plain first, durably: a
		// crash after reads moved past it must not find it readable.
		if err := s.writeAppliedMarker(datadir.AppliedMarker{LSN: marker.LSN}, true); err != nil {
			s.logger.Warn("cannot save the applied marker; reads wait for the primary's commit watermark", "err", err)
			break
		}
		s.rd.committed(res.Store.AppliedLSN())
	}
	s.snapshotLSN.Store(res.SnapshotLSN)
	snaps, err := listSnapshots(s.fs, s.snapDir())
	if err != nil {
		_ = res.WAL.Close()
		return err
	}
	s.prevSnapshotLSN = res.SnapshotLSN
	for _, lsn := range snaps {
		if lsn < res.SnapshotLSN {
			s.prevSnapshotLSN = lsn
			break
		}
	}
	if err := s.loadEpochs(res.Epoch); err != nil {
		_ = res.WAL.Close()
		return err
	}
	if s.cluster, err = datadir.OpenCluster(s.fs, s.cfg.DataDir); err != nil {
		_ = res.WAL.Close()
		return err
	}
	return nil
}

// finishReseed handles a crash between the two steps of a re-seed (snapshot
// saved, WAL not yet reset): the WAL then ends before the newest snapshot,
// which recovery would rightly call lost data on a primary. On a replica the
// snapshot is the newer truth and the old WAL is superseded by it, so the
// reset is finished here.
func (s *Server) finishReseed() error {
	snaps, err := listSnapshots(s.fs, s.snapDir())
	if err != nil || len(snaps) == 0 {
		return err
	}
	newest := snaps[0]
	if _, err := s.fs.Stat(s.walDir()); errors.Is(err, os.ErrNotExist) {
		return nil
	}
	log, err := wal.Open(wal.Options{Dir: s.walDir(), FS: s.fs, SegmentSize: s.cfg.SegmentBytes, Logger: s.logger})
	if err != nil {
		return fmt.Errorf("open wal: %w", err)
	}
	if log.Segments() > 0 && log.LastLSN() < newest {
		s.logger.Warn("finishing an interrupted re-seed: the WAL ends before the newest snapshot",
			"wal_last_lsn", log.LastLSN(), "snapshot_lsn", newest)
		if err := log.Reset(newest + 1); err != nil {
			_ = log.Close()
			return fmt.Errorf("reset wal after snapshot at LSN %d: %w", newest, err)
		}
	}
	return log.Close()
}

// listSnapshots returns the LSNs of the snapshots in dir, newest first
// (names as made by state.SnapshotName).
func listSnapshots(fsys vfs.FS, dir string) ([]uint64, error) {
	ents, err := fsys.ReadDir(dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("list snapshots: %w", err)
	}
	var lsns []uint64
	for _, e := range ents {
		digits, ok := strings.CutPrefix(e.Name(), "snapshot-")
		if !ok {
			continue
		}
		if digits, ok = strings.CutSuffix(digits, ".snap"); !ok {
			continue
		}
		if lsn, err := strconv.ParseUint(digits, 10, 64); err == nil && state.SnapshotName(lsn) == e.Name() {
			lsns = append(lsns, lsn)
		}
	}
	slices.Sort(lsns)
	slices.Reverse(lsns)
	return lsns, nil
}

// DataDir/applied (datadir.AppliedMarker) holds an LSN this replica had
// applied, so every batch up to it was durable on the primary: a restart
// replays the log up to it (or up to the newest snapshot, if that is later)
// and keeps the rest unapplied until the primary reports it durable. It is
// the LSN reads were served at (readable.go), saved at most every
// markerInterval without an fsync (a lost or stale marker only makes the
// replica wait for the primary a little longer after a crash).
//
// Only a clean stop saves it in its readable form, durably: then it is
// the last LSN reads were served at, and a restart serves there at once
// (and makes it plain again before serving more). After a crash the
// marker can be behind what was served — a view is published without
// waiting for a marker write, which would cost an fsync per apply round
// (sync apply commits measured at well under half the rate) — so reads
// wait for the primary's watermark, which is at or above anything served.

// markerInterval is how often the plain marker is saved while applying.
const markerInterval = time.Second

// loadAppliedMarker returns the saved applied marker, or the zero marker
// if there is none or it cannot be read (then replay stops at the newest
// snapshot and reads wait for the primary's watermark).
func (s *Server) loadAppliedMarker() datadir.AppliedMarker {
	m, err := datadir.LoadAppliedMarker(s.fs, s.cfg.DataDir)
	if err != nil {
		s.logger.Warn("cannot read the applied marker; replaying up to the newest snapshot only", "err", err)
		return datadir.AppliedMarker{}
	}
	return m
}

// saveAppliedMarker records the LSN reads are served at as the plain
// marker: durably when sync, else by write and rename only, and then at
// most every markerInterval. Errors are logged, not returned: the marker
// is an optimisation of restarts. A read-only replica keeps its marker.
func (s *Server) saveAppliedMarker(sync bool) {
	lsn := min(s.rd.lsn.Load(), s.appliedLSN())
	if s.cfg.ReadOnly || lsn == 0 || (lsn == s.follower.markerLSN && !s.follower.markerReadable) || (!sync && time.Since(s.follower.markerTime) < markerInterval) {
		return // nothing served (yet, or since a re-seed backwards), saved, or saved lately
	}
	if err := s.writeAppliedMarker(datadir.AppliedMarker{LSN: lsn}, sync); err != nil {
		s.logger.Warn("cannot save the applied marker", "err", err)
	}
}

// saveStopMarker records, at a clean stop (nothing is served any more),
// the LSN reads were served at as the readable marker, durably.
func (s *Server) saveStopMarker() {
	lsn := min(s.rd.lsn.Load(), s.appliedLSN())
	if s.cfg.ReadOnly || lsn == 0 {
		return
	}
	if err := s.writeAppliedMarker(datadir.AppliedMarker{LSN: lsn, Readable: true}, true); err != nil {
		s.logger.Warn("cannot save the applied marker", "err", err)
	}
}

// writeAppliedMarker replaces the applied marker with m.
func (s *Server) writeAppliedMarker(m datadir.AppliedMarker, sync bool) error {
	if err := datadir.SaveAppliedMarker(s.fs, s.cfg.DataDir, m, sync); err != nil {
		return err
	}
	s.follower.markerLSN, s.follower.markerReadable, s.follower.markerTime = m.LSN, m.Readable, time.Now()
	return nil
}

func (s *Server) appliedLSN() uint64 { return s.store.Load().AppliedLSN() }

// readLag is how far the readable state trails the primary: in LSNs, from
// the primary's last report; in time, as walship_replica_lag_seconds.
func (s *Server) readLag() (uint64, time.Duration) {
	served := s.rd.lsn.Load()
	lsns := max(s.lag.primaryLSN(), served) - served
	return lsns, time.Duration(s.lag.seconds(s.now()) * float64(time.Second))
}

// Addr is the gRPC address the replica listens on.
func (s *Server) Addr() string { return s.srv.Addr() }

// MetricsAddr is the metrics address, or "" when disabled.
func (s *Server) MetricsAddr() string { return s.srv.MetricsAddr() }

// Run follows the primary and serves reads until ctx is done, then stops
// gracefully: the replication streams are closed, in-flight reads finish,
// a final snapshot is taken and the WAL is synced and closed. It returns a
// fatal error (a failed WAL write or fsync, after which the replica stops
// acknowledging) if one stopped the replica.
func (s *Server) Run(ctx context.Context) error {
	defer s.metrics.unregister()
	followCtx, stopFollow := context.WithCancel(ctx)
	defer stopFollow()
	followDone := make(chan error, 1)
	go func() {
		if s.cfg.ReadOnly {
			<-followCtx.Done() // nothing to follow: reads of what is here
			followDone <- nil
			return
		}
		followDone <- s.follow(followCtx)
	}()
	snapCtx, stopSnap := context.WithCancel(context.Background())
	snapDone := make(chan struct{})
	snapFailed := make(chan error, 1)
	go func() {
		defer close(snapDone)
		s.snaps.Run(snapCtx, s.logger, func() error {
			err := s.takeSnapshot()
			if errors.Is(err, wal.ErrBroken) {
				// The WAL truncation's fsync failed: fatal, as every
				// failed fsync, and at once, not at the next batch.
				s.metrics.fsyncErrors.Inc()
				select {
				case snapFailed <- err:
				default:
				}
			}
			return err
		})
	}()

	serveCtx, stopServe := context.WithCancel(ctx)
	defer stopServe()
	serveDone := make(chan error, 1)
	go func() { serveDone <- s.srv.Serve(serveCtx, stopFollow) }()
	s.srv.SetServing(true)
	s.logger.Info("replica serving", "addr", s.Addr(), "metrics", s.MetricsAddr(), "id", s.cfg.ID, "cluster_id", s.cluster.ID(),
		"primary", s.primary(), "logstores", describeLogStores(s.logStoreSets()), "epoch", s.epoch.Load(), "applied_lsn", s.appliedLSN())

	var serveErr, fatal error
	select {
	case fatal = <-followDone:
		// Only a broken WAL ends the follower early: stop serving.
		stopServe()
		serveErr = <-serveDone
	case fatal = <-snapFailed:
		s.logger.Error("replica failed; stopping", "err", fatal)
		stopFollow()
		<-followDone
		stopServe()
		serveErr = <-serveDone
	case serveErr = <-serveDone:
		stopFollow()
		fatal = <-followDone
	}
	s.srv.SetServing(false)
	s.follower.connected.Store(false)
	stopSnap()
	<-snapDone
	s.closeConns()
	if fatal == nil {
		if err := s.takeSnapshot(); err != nil {
			s.logger.Warn("final snapshot failed", "err", err)
		}
		s.saveStopMarker()
	}
	if err := s.wal.Close(); err != nil && !errors.Is(err, wal.ErrClosed) && fatal == nil {
		fatal = fmt.Errorf("close wal: %w", err)
	}
	return errors.Join(fatal, serveErr)
}

// maybeSnapshot asks for a snapshot when one is due.
func (s *Server) maybeSnapshot() { s.snaps.Written(int64(s.wal.Stats().BytesWritten), false) }

// takeSnapshot writes the applied state to disk and truncates the WAL before
// the older kept snapshot. Applied implies fsynced on a replica, so the
// snapshot never holds anything the WAL could lose.
func (s *Server) takeSnapshot() error {
	s.snapMu.Lock()
	defer s.snapMu.Unlock()
	// The state reads are served at: a restart from it can serve reads
	// before the primary's commit watermark is heard again.
	v := s.rd.current()
	if v == nil {
		return nil
	}
	lsn := v.AppliedLSN()
	if lsn == 0 || lsn <= s.snapshotLSN.Load() {
		return nil
	}
	written := int64(s.wal.Stats().BytesWritten)
	start := time.Now()
	path, err := state.SaveSnapshot(s.fs, s.snapDir(), v)
	if err != nil && path == "" {
		return err
	}
	if err != nil {
		s.logger.Warn("snapshot written, but removing old ones failed", "err", err)
	}
	s.prevSnapshotLSN = s.snapshotLSN.Load()
	s.snapshotLSN.Store(lsn)
	s.snaps.Taken(written, recovery.FileSize(s.fs, path))
	// state keeps two snapshots and falls back to the older one if the newest
	// is corrupt, so the WAL must still reach back to just after the older.
	keepFrom := s.prevSnapshotLSN + 1
	s.walMu.Lock()
	removed, terr := s.wal.TruncateBefore(keepFrom)
	s.walMu.Unlock()
	s.logger.Info("snapshot written", "path", path, "lsn", lsn, "keys", v.Len(), "took", time.Since(start),
		"wal_segments_removed", removed, "wal_first_lsn", s.wal.FirstLSN())
	if terr != nil {
		return fmt.Errorf("truncate wal before LSN %d: %w", keepFrom, terr)
	}
	return nil
}
