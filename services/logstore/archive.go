package logstore

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	walshipv1 "github.com/walship/walship/gen/walship/v1"
	"github.com/walship/walship/internal/archive"
	"github.com/walship/walship/internal/backoff"
	"github.com/walship/walship/internal/datadir"
	"github.com/walship/walship/internal/envelope"
	"github.com/walship/walship/internal/wal"
)

// The archiver uploads this log store's log and base snapshots to the
// archive (internal/archive) when the primary asks it to: one log store
// at a time uploads, the one whose Append stream's heartbeats carry
// `archiver` (docs/ARCHITECTURE.md, *Archive*). It uploads only up to the
// LSN a majority of the log stores holds (`logstore_quorum_lsn`), which
// no failover cuts, so the archive never holds a tail a later epoch
// drops. Where it starts is read from the archive itself — the end of
// the chunks of this log's lineage — so when the primary moves the job to
// another log store, or a new primary takes over, the next one continues
// without a gap; an upload interrupted by a crash is no object at all,
// and one repeated is harmless (chunks of a range are the same batches).
//
// Every log store with an archive configured keeps, against retention,
// everything after the archived LSN it knows of (from its own uploads or
// the primary's heartbeats), so nothing leaves the log stores before it
// is in the archive.
type archiver struct {
	s   *Server
	a   *archive.Archive
	cfg ArchiveOptions

	kick chan struct{}
	// by is the Append stream whose heartbeats asked this log store to
	// upload (nil: not asked); guarded by mu. safe is the primary's
	// logstore_quorum_lsn, from the same heartbeats.
	mu   sync.Mutex
	by   *appendStream
	safe atomic.Uint64
	// uploaded is the end of what this log store found or put in the
	// archive, in its own log's lineage.
	uploaded atomic.Uint64
	// lastErr is the last step's failure ("" after a success); active
	// says the loop is uploading now.
	lastErr atomic.Pointer[string]
	active  atomic.Bool
	// bytesUp counts uploaded WAL chunk bytes (plaintext) for metrics.
	m *archiveMetrics
}

// ArchiveOptions configures the archive of a log store.
type ArchiveOptions struct {
	archive.Config
	// ChunkBytes is the WAL chunk size the uploader aims for: a chunk
	// closes when it reaches it, at the end of what may be uploaded, or
	// at an epoch change. 0: DefaultArchiveChunkBytes.
	ChunkBytes int
	// Interval is how often the uploader looks for new batches when no
	// heartbeat wakes it (it also uploads on every heartbeat that brings
	// a higher quorum LSN, at most once per Interval). 0: 1s.
	Interval time.Duration
	// Parallel is how many chunk uploads run at once. 0: 4.
	Parallel int
	// Window is the recovery window the archive keeps: every point of the
	// last Window stays restorable (0 keeps everything).
	Window time.Duration
	// KeepSnapshots is how many base snapshots the archive keeps at least
	// (with everything after the oldest of them).
	KeepSnapshots int
	// RetentionEvery is how often the uploader applies Window and
	// KeepSnapshots. 0: 10 minutes.
	RetentionEvery time.Duration
}

// Archive defaults.
const (
	DefaultArchiveChunkBytes = 16 << 20
	maxArchiveBackoff        = time.Minute
)

func (o ArchiveOptions) withDefaults() ArchiveOptions {
	if o.ChunkBytes <= 0 {
		o.ChunkBytes = DefaultArchiveChunkBytes
	}
	if o.Interval <= 0 {
		o.Interval = time.Second
	}
	if o.Parallel <= 0 {
		o.Parallel = 4
	}
	if o.RetentionEvery <= 0 {
		o.RetentionEvery = 10 * time.Minute
	}
	return o
}

func (o ArchiveOptions) validate() error {
	var errs []error
	if err := o.Config.Validate(); err != nil {
		errs = append(errs, err)
	}
	if o.ChunkBytes < 0 || o.ChunkBytes > 1<<30 {
		errs = append(errs, fmt.Errorf("--archive-chunk-bytes: %d is not in [0, 1GiB]", o.ChunkBytes))
	}
	if o.Interval < 0 || o.Interval > time.Hour {
		errs = append(errs, fmt.Errorf("--archive-interval: %v is not in [0, 1h]", o.Interval))
	}
	if o.Parallel < 0 || o.Parallel > 64 {
		errs = append(errs, fmt.Errorf("--archive-parallel: %d is not in [0, 64]", o.Parallel))
	}
	if o.Window < 0 {
		errs = append(errs, fmt.Errorf("--archive-retention: %v is negative (0 keeps everything)", o.Window))
	}
	if o.KeepSnapshots < 0 {
		errs = append(errs, fmt.Errorf("--archive-keep-snapshots: %d is negative", o.KeepSnapshots))
	}
	return errors.Join(errs...)
}

// noteHeartbeat is called by the writer for every heartbeat it accepted
// on stream st.
func (s *Server) noteHeartbeat(st *appendStream, hb *walshipv1.Heartbeat) {
	if v := hb.GetArchivedLsn(); v > s.archivedHeard.Load() {
		s.archivedHeard.Store(v) // writer-only
	}
	ar := s.arch
	if ar == nil {
		return
	}
	ar.mu.Lock()
	kick := false
	switch {
	case hb.GetArchiver():
		kick = ar.by != st || hb.GetLogstoreQuorumLsn() > ar.safe.Load()
		ar.by = st
		ar.safe.Store(hb.GetLogstoreQuorumLsn())
	case ar.by == st:
		ar.by = nil
	}
	ar.mu.Unlock()
	if kick {
		ar.wake()
	}
}

// streamEnded: a stream that asked for uploads no longer does.
func (ar *archiver) streamEnded(st *appendStream) {
	ar.mu.Lock()
	if ar.by == st {
		ar.by = nil
	}
	ar.mu.Unlock()
}

func (ar *archiver) asked() bool {
	ar.mu.Lock()
	defer ar.mu.Unlock()
	return ar.by != nil
}

func (ar *archiver) wake() {
	select {
	case ar.kick <- struct{}{}:
	default:
	}
}

// archivedLSN is the end of what this log store knows the archive holds.
func (s *Server) archivedLSN() uint64 {
	v := s.archivedHeard.Load()
	if s.arch != nil {
		v = max(v, s.arch.uploaded.Load())
	}
	return v
}

// forgetArchivedAbove lowers what the log store knows the archive holds to
// lsn: its log was cut there (a forced promotion's new epoch may write
// other batches at those LSNs, not archived yet). Writer-only.
func (s *Server) forgetArchivedAbove(lsn uint64) {
	if s.archivedHeard.Load() > lsn {
		s.archivedHeard.Store(lsn)
	}
	if s.arch != nil {
		for {
			u := s.arch.uploaded.Load()
			if u <= lsn || s.arch.uploaded.CompareAndSwap(u, lsn) {
				break
			}
		}
		s.arch.wake()
	}
}

// session is what the uploader knows of the archive while it is asked to
// upload; it is read from the archive when the job starts.
type session struct {
	tail      uint64          // end of the archived chunks of this log's lineage
	epochs    map[uint64]bool // epochs with a history object
	snapshots map[uint64]bool // LSNs with a snapshot object
	retained  time.Time       // last bucket retention pass
	gapWarned bool
}

// run is the uploader's loop: it owns the archive's writes from this log
// store and ends with ctx.
func (ar *archiver) run(ctx context.Context) {
	t := time.NewTicker(ar.cfg.Interval)
	defer t.Stop()
	var sess *session
	delay := time.Duration(0) // the backoff after a failed step
	for {
		select {
		case <-ctx.Done():
			return
		case <-ar.kick:
		case <-t.C:
		}
		if !ar.asked() {
			if sess != nil {
				ar.s.logger.Info("archive: no longer the uploader", "archived_lsn", ar.uploaded.Load())
			}
			sess = nil
			ar.active.Store(false)
			continue
		}
		ar.active.Store(true)
		began := time.Now()
		err := ar.step(ctx, &sess)
		if ctx.Err() != nil {
			return
		}
		if err == nil {
			ar.lastErr.Store(nil)
			delay = 0
			// At most one step per Interval, however often heartbeats
			// bring a higher quorum LSN: each step is at least one object
			// (a PUT, billed), and a step uploads all there is.
			if !backoff.Sleep(ctx, ar.cfg.Interval-time.Since(began)) {
				return
			}
			continue
		}
		msg := err.Error()
		if prev := ar.lastErr.Load(); prev == nil || *prev != msg {
			ar.s.logger.Error("archive: upload failed; retrying with backoff", "archive", ar.a.String(), "err", err)
		}
		ar.lastErr.Store(&msg)
		ar.m.errors.Inc()
		sess = nil // read the archive again: it may have changed meanwhile
		delay = min(max(2*delay, time.Second), maxArchiveBackoff)
		if !backoff.Sleep(ctx, delay) {
			return
		}
	}
}

// step uploads what may be uploaded now: WAL chunks up to the quorum LSN,
// base snapshots within it, and applies the archive's retention when due.
func (ar *archiver) step(ctx context.Context, sessp **session) error {
	s := ar.s
	cluster := s.cluster.ID()
	if cluster == "" {
		return errors.New("this log store belongs to no cluster yet (no primary has reached it): nothing to archive")
	}
	if *sessp == nil {
		sess, err := ar.begin(ctx, cluster)
		if err != nil {
			return err
		}
		*sessp = sess
	}
	sess := *sessp
	limit := min(ar.safe.Load(), s.durableLSN())
	if err := ar.uploadChunks(ctx, cluster, sess, limit); err != nil {
		return err
	}
	if err := ar.uploadSnapshots(ctx, cluster, sess, limit); err != nil {
		return err
	}
	if (ar.cfg.Window > 0 || ar.cfg.KeepSnapshots > 0) && time.Since(sess.retained) >= ar.cfg.RetentionEvery {
		if err := ar.retain(ctx, cluster); err != nil {
			return err
		}
		sess.retained = time.Now()
	}
	return nil
}

// begin reads what the archive holds: it claims it for this cluster (or
// refuses another cluster's) and finds where this log's lineage ends in it.
func (ar *archiver) begin(ctx context.Context, cluster string) (*session, error) {
	if err := ar.a.Claim(ctx, cluster); err != nil {
		var me *archive.ClusterMismatchError
		if errors.As(err, &me) {
			ar.s.metrics.clusterMismatch.Inc()
		}
		return nil, err
	}
	cat, err := ar.a.Catalog(ctx, cluster)
	if err != nil {
		return nil, err
	}
	// The archive's chunks are judged by this log's history: it is the
	// lineage (the primary cut anything else from it).
	cat.Lineage = *ar.s.history.Load()
	sess := &session{tail: cat.Tail(), epochs: map[uint64]bool{}, snapshots: map[uint64]bool{}}
	for _, e := range cat.Epochs {
		sess.epochs[e] = true
	}
	for _, sn := range cat.Snapshots {
		sess.snapshots[sn.LSN] = true
	}
	ar.uploaded.Store(sess.tail)
	ar.s.logger.Info("archive: uploading", "archive", ar.a.String(), "archived_lsn", sess.tail,
		"chunks", len(cat.Chunks), "snapshots", len(cat.Snapshots), "encrypted", ar.a.Encrypted())
	return sess, nil
}

// chunkUpload is one chunk on its way to the archive.
type chunkUpload struct {
	c    archive.Chunk
	done chan error
}

// uploadChunks uploads the batches after the archive's tail up to limit,
// cut into chunks, up to Parallel at once; the archived LSN advances as
// the oldest of them completes.
func (ar *archiver) uploadChunks(ctx context.Context, cluster string, sess *session, limit uint64) error {
	s := ar.s
	if sess.tail >= limit {
		return nil
	}
	from := sess.tail + 1
	if first := s.wal.FirstLSN(); first == 0 {
		return nil
	} else if from < first {
		// What follows the archive is gone from this log (archiving began
		// on a cluster whose log stores had cut it, or the log store was
		// refilled after it): the archive has a gap there; restores reach
		// past it from a snapshot after it.
		if !sess.gapWarned {
			s.logger.Warn("archive: this log store no longer holds what follows the archive; archiving from its first LSN, leaving a gap",
				"archived_lsn", sess.tail, "first_lsn", first)
			sess.gapWarned = true
		}
		from = first
	}
	rd, err := s.wal.NewReader(from, true)
	if err != nil {
		return fmt.Errorf("read the log at LSN %d: %w", from, err)
	}
	defer rd.Close()
	uctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var pending []*chunkUpload
	var b archive.ChunkBuilder
	// settle waits for the oldest upload, and moves the tail past it.
	settle := func() error {
		u := pending[0]
		pending = pending[1:]
		if err := <-u.done; err != nil {
			return err
		}
		sess.tail = u.c.LastLSN
		ar.uploaded.Store(u.c.LastLSN)
		return nil
	}
	ship := func() error {
		data, c := b.Finish()
		if !sess.epochs[c.Epoch] {
			// The history comes first: a restore that finds a chunk of an
			// epoch finds that epoch's history too.
			if err := ar.a.PutHistory(uctx, cluster, c.Epoch, historyUpTo(*s.history.Load(), c.Epoch)); err != nil {
				return err
			}
			sess.epochs[c.Epoch] = true
		}
		for len(pending) >= ar.cfg.Parallel {
			if err := settle(); err != nil {
				return err
			}
		}
		u := &chunkUpload{c: c, done: make(chan error, 1)}
		body := data // the builder starts a new buffer
		go func() {
			start := time.Now()
			err := ar.a.PutChunk(uctx, cluster, body, c)
			if err == nil {
				ar.m.uploadSeconds.Observe(time.Since(start).Seconds())
				ar.m.chunkBytes.Add(float64(len(body)))
				ar.m.chunks.Inc()
			}
			u.done <- err
		}()
		pending = append(pending, u)
		return nil
	}
	fail := func(err error) error {
		cancel()
		for _, u := range pending {
			<-u.done
		}
		return err
	}
	expect := from
	for expect <= limit {
		e, err := rd.Next(ctx)
		if err != nil {
			if errors.Is(err, wal.ErrTruncated) {
				return fail(fmt.Errorf("the log was cut while it was archived: %w", err))
			}
			return fail(fmt.Errorf("read the log at LSN %d: %w", expect, err))
		}
		if e.FirstLSN != expect {
			return fail(fmt.Errorf("the log's entry at LSN %d starts at %d: the archive's end is not a batch boundary of this log", expect, e.FirstLSN))
		}
		var env walshipv1.WalBatch
		if err := envelope.Unmarshal(e.Data, &env); err != nil {
			return fail(fmt.Errorf("stored batch %d..%d: %w", e.FirstLSN, e.LastLSN, err))
		}
		if b.Len() > 0 && (env.GetEpoch() != b.Chunk().Epoch || b.Len()+len(e.Data) > ar.cfg.ChunkBytes) {
			if err := ship(); err != nil {
				return fail(err)
			}
		}
		if err := b.Add(e.Data, &env); err != nil {
			return fail(err)
		}
		expect = e.LastLSN + 1
	}
	if b.Len() > 0 {
		if err := ship(); err != nil {
			return fail(err)
		}
	}
	for len(pending) > 0 {
		if err := settle(); err != nil {
			return fail(err)
		}
	}
	return nil
}

// historyUpTo is h without the epochs after e.
func historyUpTo(h datadir.History, e uint64) datadir.History {
	var out datadir.History
	for _, st := range h {
		if st.Epoch <= e {
			out = append(out, st)
		}
	}
	return out
}

// uploadSnapshots uploads the stored base snapshots at or before limit
// that the archive lacks, oldest first.
func (ar *archiver) uploadSnapshots(ctx context.Context, cluster string, sess *session, limit uint64) error {
	s := ar.s
	for _, b := range s.snaps.snapshot() {
		if b.lsn > limit || sess.snapshots[b.lsn] {
			continue
		}
		if err := ar.uploadSnapshot(ctx, cluster, b); err != nil {
			return err
		}
		sess.snapshots[b.lsn] = true
	}
	return nil
}

func (ar *archiver) uploadSnapshot(ctx context.Context, cluster string, b *baseSnap) error {
	s := ar.s
	// Pinned, so that retention does not remove it while it is read.
	pb, p, err := s.pinSnapshot(b.lsn)
	if err != nil {
		return nil // gone meanwhile
	}
	defer s.pins.release(p)
	if pb.lsn != b.lsn {
		return nil
	}
	f, err := s.fs.OpenFile(filepath.Join(s.snapDir(), b.name), os.O_RDONLY, 0)
	if err != nil {
		return fmt.Errorf("open snapshot %s: %w", b.name, err)
	}
	defer f.Close() // read-only
	ref := archive.SnapshotRef{LSN: b.lsn, Epoch: b.hdr.GetEpoch(), Commit: b.hdr.GetCommitTimeUnixNano()}
	start := time.Now()
	if err := ar.a.PutSnapshot(ctx, cluster, ref, f, b.bytes, s.cfg.DataDir); err != nil {
		return err
	}
	ar.m.snapshots.Inc()
	s.logger.Info("archive: uploaded a base snapshot", "lsn", b.lsn, "bytes", b.bytes, "took", time.Since(start))
	return nil
}

// retain deletes from the archive what its recovery window and snapshot
// count no longer need.
func (ar *archiver) retain(ctx context.Context, cluster string) error {
	cat, err := ar.a.Catalog(ctx, cluster)
	if err != nil {
		return err
	}
	plan := cat.Expired(time.Now(), ar.cfg.Window, ar.cfg.KeepSnapshots)
	if len(plan.Delete) == 0 {
		return nil
	}
	if err := ar.a.Bucket().Delete(ctx, plan.Delete...); err != nil {
		return err
	}
	ar.m.deleted.Add(float64(len(plan.Delete)))
	ar.s.logger.Info("archive: retention deleted objects", "objects", len(plan.Delete), "restorable_from_lsn", plan.KeepFrom,
		"window", ar.cfg.Window, "keep_snapshots", ar.cfg.KeepSnapshots)
	return nil
}

// status is the archive's part of Status.
func (ar *archiver) status() *walshipv1.ArchiveStatus {
	st := &walshipv1.ArchiveStatus{Url: ar.a.String(), ArchivedLsn: ar.s.archivedLSN(), Uploader: ar.asked()}
	if e := ar.lastErr.Load(); e != nil {
		st.Error = *e
	}
	return st
}

// archiveMetrics are the uploader's.
type archiveMetrics struct {
	chunks, snapshots, errors, deleted prometheus.Counter
	chunkBytes                         prometheus.Counter
	uploadSeconds                      prometheus.Histogram
	// refillBatches counts batches refills copied from the archive.
	refillBatches prometheus.Counter
}

// openArchive opens the configured archive and registers its metrics on
// the log store's registry (unregistered with the others).
func (s *Server) openArchive(reg prometheus.Registerer) error {
	a, err := archive.Open(context.Background(), s.cfg.Archive.Config, s.logger)
	if err != nil {
		return err
	}
	ar := &archiver{s: s, a: a, cfg: s.cfg.Archive.withDefaults(), kick: make(chan struct{}, 1)}
	m := &archiveMetrics{
		chunks: prometheus.NewCounter(prometheus.CounterOpts{Name: "walship_archive_chunks_uploaded_total",
			Help: "WAL chunks this log store uploaded to the archive."}),
		chunkBytes: prometheus.NewCounter(prometheus.CounterOpts{Name: "walship_archive_uploaded_bytes_total",
			Help: "Bytes of WAL chunks (before encryption) this log store uploaded to the archive."}),
		snapshots: prometheus.NewCounter(prometheus.CounterOpts{Name: "walship_archive_snapshots_uploaded_total",
			Help: "Base snapshots this log store uploaded to the archive."}),
		errors: prometheus.NewCounter(prometheus.CounterOpts{Name: "walship_archive_upload_errors_total",
			Help: "Failed archive steps (an upload, a listing, a claim); each is retried with backoff up to a minute."}),
		deleted: prometheus.NewCounter(prometheus.CounterOpts{Name: "walship_archive_deleted_objects_total",
			Help: "Objects the archive's retention deleted (--archive-retention, --archive-keep-snapshots)."}),
		uploadSeconds: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "walship_archive_chunk_upload_duration_seconds",
			Help: "Duration of one WAL chunk's upload.", Buckets: prometheus.ExponentialBuckets(0.005, 2, 14)}),
		refillBatches: prometheus.NewCounter(prometheus.CounterOpts{Name: "walship_logstore_refill_archive_batches_total",
			Help: "Batches refills copied from the archive, because no peer held them (stored; also in walship_logstore_refill_batches_total)."}),
	}
	archived := prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "walship_logstore_archived_lsn",
		Help: "End of what the archive holds of this log's lineage, as this log store knows it (its uploads, or the primary's word)."},
		func() float64 { return float64(s.archivedLSN()) })
	uploader := prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "walship_archive_uploader",
		Help: "1 while the primary has this log store upload to the archive."},
		func() float64 { return b2f(ar.asked()) })
	for _, c := range []prometheus.Collector{m.chunks, m.chunkBytes, m.snapshots, m.errors, m.deleted, m.uploadSeconds, m.refillBatches, archived, uploader} {
		if err := s.metrics.register(c); err != nil {
			return err
		}
	}
	ar.m = m
	s.arch = ar
	return nil
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}
