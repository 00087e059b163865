// Package restore rebuilds a node's data directory as of one point of the
// log from what the log stores hold: the newest base snapshot at or before
// the point, then the batches after it up to the point (point-in-time
// recovery, as pgBackRest, WAL-G and Litestream restore).
//
// It fails closed. A target outside what the log stores keep, a gap, a
// batch whose CRC does not match, a batch of an epoch the log's lineage
// does not give to its LSNs, a snapshot whose digest does not match: each
// is an error naming the LSNs, never a restore to some other point. A time
// target resolves to the last commit at or before it in log order (the
// replay stops before the first batch committed after it, as PostgreSQL's
// recovery_target_time does); a time after the newest archived commit is
// refused, since nothing shows the archive holds every commit up to it.
//
// The restored directory holds the state at the target as a snapshot, the
// epoch history up to it and a NEW cluster id, so that it is never mistaken
// for its source: it starts as a read-only node, or as the primary of a new
// cluster, and every node of the old cluster refuses it. Its WAL holds the
// batch that ends at the target, as read (tail.go): a primary started on
// the directory ships it to its new log stores first, which lets them take
// the restored snapshot as their base at once — so the new cluster is
// restorable from its own log stores and archive from its first minute.
// Given the new cluster's contract (NewCluster), the restore also writes
// that cluster's first epoch after the restored state, so that its primary
// need not wait for the old cluster's members (newcluster.go).
package restore

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	walshipv1 "github.com/walship/walship/gen/walship/v1"
	"github.com/walship/walship/internal/archive"
	"github.com/walship/walship/internal/datadir"
	"github.com/walship/walship/internal/envelope"
	"github.com/walship/walship/internal/failover"
	"github.com/walship/walship/internal/keyspace"
	"github.com/walship/walship/internal/recovery"
	"github.com/walship/walship/internal/rpcerr"
	"github.com/walship/walship/internal/serve"
	"github.com/walship/walship/internal/state"
	"github.com/walship/walship/internal/tlsid"
	"github.com/walship/walship/internal/vfs"
	"github.com/walship/walship/pkg/codec"
	"golang.org/x/sync/errgroup"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Target is the point to restore to: exactly one of LSN, Time and Latest.
type Target struct {
	// LSN restores the state after the batch ending at this LSN (a batch
	// boundary: 0 is the empty state before the first commit).
	LSN uint64
	// Time restores the state after the last commit at or before it.
	Time time.Time
	// Latest restores the newest LSN a majority of the log stores hold.
	Latest bool
	// setLSN tells LSN 0 from "no LSN".
	setLSN bool
}

// AtLSN is the target LSN lsn.
func AtLSN(lsn uint64) Target { return Target{LSN: lsn, setLSN: true} }

// AtTime is the target time t.
func AtTime(t time.Time) Target { return Target{Time: t} }

// AtLatest is the newest LSN a majority of the log stores hold.
func AtLatest() Target { return Target{Latest: true} }

func (t Target) String() string {
	switch {
	case t.Latest:
		return "latest"
	case !t.Time.IsZero():
		return "time " + t.Time.UTC().Format(time.RFC3339Nano)
	default:
		return fmt.Sprintf("LSN %d", t.LSN)
	}
}

func (t Target) validate() error {
	n := 0
	if t.Latest {
		n++
	}
	if !t.Time.IsZero() {
		n++
	}
	if t.setLSN {
		n++
	}
	if n != 1 {
		return errors.New("target: give exactly one of an LSN, a time or latest")
	}
	return nil
}

// Options is what to restore, from where, to where.
type Options struct {
	// LogStores are the log stores' gRPC addresses: one or more, or none
	// with Archive.
	LogStores []string
	// Archive, if set, is where to restore from instead of log stores
	// (archive.go): the history outlives every log store.
	Archive *archive.Archive
	// TmpDir holds a snapshot downloaded from the archive while it is
	// read ("": the data directory's parent).
	TmpDir string
	// DataDir is the directory to build: it must not exist, or be empty.
	DataDir string
	Target  Target
	// DryRun resolves and checks everything (the target, the snapshot, the
	// lineage, every batch's CRC and continuity) without building state or
	// writing anything.
	DryRun bool
	// ClusterID, when set, is the cluster the log stores must belong to.
	// Unset, it is the one the answering log stores state (they must not
	// state different ones). Reads state it either way.
	ClusterID string
	// NewClusterID is the id stamped in the restored directory; empty
	// makes one.
	NewClusterID string
	// NewCluster, if set, is the first epoch of the new cluster the
	// directory starts, which the restore writes after the restored state
	// (newcluster.go): its primary then opens without waiting for the old
	// cluster's members.
	NewCluster *NewCluster
	// NewClusterIfChanged, when NewCluster is not set, is written as
	// NewCluster is if the restored state's epoch record binds a primary
	// started without --peers (failover.BindsPeerless): it holds members
	// a run-time change set (members_changed, or a change in progress),
	// whose log's members win over a primary's --peers, or names members
	// other than NewClusterIfChanged's primary. A primary without --peers
	// refuses such a log, so the directory could start as no cluster's
	// primary but the old members'.
	NewClusterIfChanged *NewCluster
	FS                  vfs.FS
	Logger              *slog.Logger
	// Dialer dials the log stores (zero: plaintext); DialOptions are
	// added to its options.
	Dialer      serve.Dialer
	DialOptions []grpc.DialOption
}

// Source is what one log store holds, as its Status said.
type Source struct {
	Addr      string
	Err       error // no answer
	FirstLSN  uint64
	Durable   uint64
	VoteEpoch uint64
	History   datadir.History
	Snapshots []*walshipv1.SnapshotInfo
	ClusterID string
	// Usable is how far its log follows the lineage (its durable LSN, or
	// the end of the newest epoch it shares with the lineage).
	Usable uint64
}

// Plan is what a restore does: resolved before any state is built.
type Plan struct {
	Target Target
	// LSN and CommitTime are the resolved point: the last LSN restored
	// and the commit time of the batch ending there (zero at LSN 0, or at
	// a snapshot whose time is unknown).
	LSN        uint64
	CommitTime time.Time
	// Snapshot is the base snapshot (nil: replay from LSN 1), taken from
	// SnapshotFrom.
	Snapshot     *walshipv1.SnapshotInfo
	SnapshotFrom string
	// BatchesFrom is the log store the batches are read from.
	BatchesFrom string
	// Batches and Bytes count the batches replayed after the snapshot and
	// their envelope bytes.
	Batches int
	Bytes   uint64
	// Lineage is the epoch history of the restored log, up to LSN.
	Lineage datadir.History
	// Sources are the log stores asked.
	Sources []Source
	// NewestCommit is the commit time of the newest batch read (for a time
	// target, the first one after it if any was read).
	NewestCommit time.Time
}

// Result is a finished restore.
type Result struct {
	Plan
	// Digest and Keys describe the restored state (the digest Status
	// reports at LSN on every node that applied the same log; the
	// clients' keys, as Status counts them).
	Digest string
	Keys   int
	// ClusterID is the new cluster id stamped in the directory.
	ClusterID string
	// NewEpoch is the new cluster's first epoch (Options.NewCluster; 0
	// without), whose epoch record's batch ends at NewEpochLSN: the
	// directory holds the state at LSN with that record put, at
	// NewEpochLSN.
	NewEpoch, NewEpochLSN uint64
	// Replayed is how long reading and applying the batches took.
	Replayed time.Duration
	Took     time.Duration
}

// ReplayMBps is the replay speed: payload megabytes (Bytes) per second
// of replay (0 when nothing was replayed).
func (r *Result) ReplayMBps() float64 {
	if r.Bytes == 0 || r.Replayed <= 0 {
		return 0
	}
	return float64(r.Bytes) / 1e6 / r.Replayed.Seconds()
}

// Run restores (or, with DryRun, plans and checks a restore).
func Run(ctx context.Context, o Options) (*Result, error) {
	start := time.Now()
	if err := o.fill(); err != nil {
		return nil, err
	}
	if o.Archive != nil {
		return runArchive(ctx, o, start)
	}
	conns, err := dial(o)
	if err != nil {
		return nil, err
	}
	defer closeAll(conns)
	r := &restorer{o: o, conns: conns}
	if err := r.survey(ctx); err != nil {
		return nil, err
	}
	if err := r.plan(); err != nil {
		return nil, err
	}
	o.Logger.Info("restore planned", "target", o.Target.String(), "lsn", r.p.LSN, "batches_from", r.p.BatchesFrom,
		"snapshot_from", r.p.SnapshotFrom, "dry_run", o.DryRun)
	return r.finish(ctx, start)
}

func (o *Options) fill() error {
	if err := o.Target.validate(); err != nil {
		return err
	}
	switch {
	case len(o.LogStores) == 0 && o.Archive == nil:
		return errors.New("--logstore or --archive: say where to restore from")
	case len(o.LogStores) > 0 && o.Archive != nil:
		return errors.New("--logstore and --archive: restore from one or the other")
	}
	if o.DataDir == "" && !o.DryRun {
		return errors.New("--data-dir: required (the directory to build)")
	}
	if nc := o.NewClusterIfChanged; nc != nil && o.NewCluster == nil {
		if err := nc.validate(); err != nil {
			return err
		}
	}
	if nc := o.NewCluster; nc != nil {
		if err := nc.validate(); err != nil {
			return err
		}
		for _, l := range nc.Contract.GetLogstores() {
			if slices.Contains(o.LogStores, l) {
				return fmt.Errorf("--new-logstore: %s is one of the log stores restored from: it holds the old cluster's id and refuses the new cluster's primary", l)
			}
		}
	}
	if o.FS == nil {
		o.FS = vfs.OS
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	if !o.DryRun {
		if err := checkEmpty(o.FS, o.DataDir); err != nil {
			return err
		}
	}
	return nil
}

// finish replays the plan, writes the directory (but in a dry run) and
// says so: the same for log stores and the archive.
func (r *restorer) finish(ctx context.Context, start time.Time) (*Result, error) {
	o := r.o
	res, err := r.replay(ctx)
	if err != nil {
		return nil, err
	}
	if !o.DryRun {
		r.findTail(ctx, res.LSN)
		if o.NewCluster == nil && o.NewClusterIfChanged != nil {
			rec, err := keyspace.EpochRecord(r.store.Snapshot())
			if err != nil {
				return nil, fmt.Errorf("read the restored epoch record: %w", err)
			}
			if failover.BindsPeerless(rec.GetContract(), o.NewClusterIfChanged.Primary) {
				r.o.NewCluster, o.NewCluster = o.NewClusterIfChanged, o.NewClusterIfChanged
			}
		}
		if o.NewCluster != nil {
			if err := r.beginCluster(res); err != nil {
				return nil, err
			}
		}
		if err := r.write(res); err != nil {
			return nil, err
		}
	}
	res.Took = time.Since(start)
	o.Logger.Info("restore done", "lsn", res.LSN, "batches", res.Batches, "bytes", res.Bytes, "digest", res.Digest,
		"took", res.Took, "dry_run", o.DryRun)
	return res, nil
}

// checkEmpty refuses to restore over anything.
func checkEmpty(fsys vfs.FS, dir string) error {
	names, err := fsys.ReadDir(dir)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil
		}
		return fmt.Errorf("--data-dir: %w", err)
	}
	if len(names) > 0 {
		return fmt.Errorf("--data-dir: %s is not empty: a restore never writes over a directory", dir)
	}
	return nil
}

func dial(o Options) (map[string]*client, error) {
	conns := map[string]*client{}
	for _, addr := range o.LogStores {
		if _, dup := conns[addr]; dup {
			continue
		}
		cc, err := o.Dialer.Dial(addr, append([]grpc.DialOption{o.Dialer.PeerClass(tlsid.ClassLogStore),
			grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(maxMessageBytes))}, o.DialOptions...)...)
		if err != nil {
			closeAll(conns)
			return nil, fmt.Errorf("--logstore %s: %w", addr, err)
		}
		conns[addr] = &client{walshipv1.NewLogStoreServiceClient(cc), cc}
	}
	return conns, nil
}

// maxMessageBytes bounds one message from a log store: a batch (the
// primary's stream limit) or a snapshot chunk.
const maxMessageBytes = 64 << 20

// client is one log store's connection.
type client struct {
	walshipv1.LogStoreServiceClient
	cc *grpc.ClientConn
}

func closeAll(conns map[string]*client) {
	for _, c := range conns {
		_ = c.cc.Close()
	}
}

// restorer is one restore's state.
type restorer struct {
	o       Options
	conns   map[string]*client
	sources []Source
	lineage datadir.History // the newest vote's log's history
	p       Plan
	store   *state.Store // the state being rebuilt
	// replayer applies the batches to store.
	replayer *state.Replayer
	// arch is the archive restored from (nil: the log stores).
	arch *archiveSource
	// tail is the batch that ends at the restored LSN (nil: none read, or
	// LSN 0): written to the directory's WAL (write, tail.go).
	tail *walshipv1.WalBatch
	// first is the new cluster's epoch record's batch, after the tail in
	// the WAL, and newLineage the lineage with its epoch (nil: no
	// Options.NewCluster).
	first      *walshipv1.WalBatch
	newLineage datadir.History
}

// survey asks every log store what it holds and picks the lineage: the
// history of the log store that promised the newest epoch (it has heard
// from the newest primary, which cut any deposed tail from it).
func (r *restorer) survey(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	r.sources = make([]Source, len(r.o.LogStores))
	var wg sync.WaitGroup
	for i, addr := range r.o.LogStores {
		wg.Go(func() { r.sources[i] = r.status(ctx, addr) })
	}
	wg.Wait()
	best := -1
	var failed []string
	for i, s := range r.sources {
		if s.Err != nil {
			failed = append(failed, fmt.Sprintf("%s: %v", s.Addr, s.Err))
			continue
		}
		if best < 0 || s.VoteEpoch > r.sources[best].VoteEpoch ||
			(s.VoteEpoch == r.sources[best].VoteEpoch && s.Durable > r.sources[best].Durable) {
			best = i
		}
	}
	if best < 0 {
		return fmt.Errorf("no log store answered: %s", strings.Join(failed, "; "))
	}
	if r.o.ClusterID == "" {
		// One restore reads one cluster's log: log stores at LSNs that mean
		// different things must not be mixed. The id is stated on every
		// read, as a node states its own.
		ids := map[string]string{}
		for _, s := range r.sources {
			if s.Err == nil {
				ids[s.Addr] = s.ClusterID
			}
		}
		id, err := datadir.OneClusterID(ids)
		if err != nil {
			return fmt.Errorf("%w; name the cluster to restore with --cluster-id", rpcerr.Mismatch("%v", err))
		}
		r.o.ClusterID = id
	}
	r.lineage = r.sources[best].History
	for i := range r.sources {
		s := &r.sources[i]
		if s.Err != nil {
			continue
		}
		s.Usable = s.Durable
		if shared, all, known := r.lineage.SharedUpTo(s.History); !all {
			if !known {
				shared = 0
			}
			s.Usable = min(s.Durable, shared)
		}
	}
	r.p.Sources = r.sources
	return nil
}

func (r *restorer) status(ctx context.Context, addr string) Source {
	src := Source{Addr: addr}
	st, err := r.conns[addr].Status(ctx, &walshipv1.LogStoreServiceStatusRequest{}, grpc.WaitForReady(true))
	if err != nil {
		src.Err = err
		return src
	}
	if err := rpcerr.CheckPeer("restore", r.o.ClusterID, "the log store", st.GetClusterId()); err != nil {
		src.Err = status.Error(codes.FailedPrecondition, err.Error())
		return src
	}
	src.FirstLSN, src.Durable, src.VoteEpoch = st.GetFirstLsn(), st.GetDurableLsn(), max(st.GetVoteEpoch(), st.GetEpoch())
	src.History = datadir.HistoryFromProto(st.GetHistory())
	if err := src.History.Check(src.VoteEpoch, datadir.MaxEpochGap); err != nil {
		// How far its log follows the lineage is worked out from it.
		src.Err = status.Errorf(codes.DataLoss, "the log store's status: history%v", err)
		return src
	}
	src.Snapshots = st.GetSnapshots()
	src.ClusterID = st.GetClusterId()
	if src.FirstLSN == 0 {
		src.Durable = 0 // holding nothing, it vouches for nothing
	}
	return src
}

// plan resolves the target LSN (for an LSN or latest; a time resolves as
// the batches are read), the base snapshot and the log store to read the
// batches from.
func (r *restorer) plan() error {
	t := r.o.Target
	r.p.Target = t
	var usable []uint64
	newest := uint64(0)
	for _, s := range r.sources {
		if s.Err == nil {
			usable = append(usable, s.Usable)
			newest = max(newest, s.Usable)
		}
	}
	switch {
	case t.Latest:
		// What a majority holds is what a log store quorum acknowledged.
		need := len(r.o.LogStores)/2 + 1
		if len(usable) < need {
			return fmt.Errorf("--latest: %d of %d log stores answered, and the newest LSN a majority holds needs %d: %s",
				len(usable), len(r.o.LogStores), need, r.describeSources())
		}
		sort.Slice(usable, func(i, j int) bool { return usable[i] > usable[j] })
		r.p.LSN = usable[need-1]
	case t.setLSN:
		if t.LSN > newest {
			return status.Errorf(codes.OutOfRange, "--lsn: LSN %d is beyond the newest LSN the log stores hold (%d): %s", t.LSN, newest, r.describeSources())
		}
		r.p.LSN = t.LSN
	}
	snap, from := r.pickSnapshot()
	base := uint64(0)
	if snap != nil {
		base = snap.GetLsn()
		r.p.Snapshot, r.p.SnapshotFrom = snap, from
		r.p.CommitTime = unixTime(snap.GetCommitTimeUnixNano())
	}
	if t.Time.IsZero() && r.p.LSN == base {
		return nil // the snapshot (or the empty state) is the target
	}
	// For a time target, any log store holding the batches after the
	// snapshot: the replay finds where to stop.
	to := r.p.LSN
	if !t.Time.IsZero() {
		to = base + 1
	}
	src := r.pickBatches(base, to, from)
	if src == nil {
		return status.Errorf(codes.OutOfRange, "restore to %s: no log store holds the batches from LSN %d on (a snapshot at or before the target, then every batch up to it, is needed): %s",
			t, base+1, r.describeSources())
	}
	r.p.BatchesFrom = src.Addr
	if !t.Time.IsZero() {
		r.p.LSN = src.Usable // an upper bound; the replay finds the point
	}
	return nil
}

// pickSnapshot returns the newest stored snapshot at or before the target
// that the lineage vouches for (the lineage gives its LSN to the epoch it
// was taken in, so its log up to there is the lineage's), and where it is.
// nil means replaying from LSN 1.
func (r *restorer) pickSnapshot() (*walshipv1.SnapshotInfo, string) {
	t := r.o.Target
	var best *walshipv1.SnapshotInfo
	var from string
	for _, s := range r.sources {
		if s.Err != nil {
			continue
		}
		for _, sn := range s.Snapshots {
			lsn := sn.GetLsn()
			switch {
			case !t.Time.IsZero() && (sn.GetCommitTimeUnixNano() == 0 || unixTime(sn.GetCommitTimeUnixNano()).After(t.Time)):
				continue
			case t.Time.IsZero() && lsn > r.p.LSN:
				continue
			case lsn > 0 && r.lineage.EpochOf(lsn) != sn.GetEpoch():
				continue // of a deposed epoch's log, or of one the lineage does not reach
			}
			if best == nil || lsn > best.GetLsn() {
				best, from = sn, s.Addr
			}
		}
	}
	return best, from
}

// pickBatches returns a log store holding every batch from base+1 through
// to (its log following the lineage that far), preferring the one the
// snapshot comes from, then the one that goes furthest.
func (r *restorer) pickBatches(base, to uint64, prefer string) *Source {
	var best *Source
	for i := range r.sources {
		s := &r.sources[i]
		if s.Err != nil || s.FirstLSN == 0 || s.FirstLSN > base+1 || s.Usable < to {
			continue
		}
		if best == nil || (s.Addr == prefer && best.Addr != prefer) || (best.Addr != prefer && s.Usable > best.Usable) {
			best = s
		}
	}
	return best
}

// describeSources says what each log store holds, for errors.
func (r *restorer) describeSources() string {
	var parts []string
	for _, s := range r.sources {
		if s.Err != nil {
			parts = append(parts, fmt.Sprintf("%s: no answer (%v)", s.Addr, s.Err))
			continue
		}
		var snaps []string
		for _, sn := range s.Snapshots {
			snaps = append(snaps, fmt.Sprintf("%d", sn.GetLsn()))
		}
		desc := fmt.Sprintf("%s holds LSNs %d..%d", s.Addr, s.FirstLSN, s.Usable)
		if s.FirstLSN == 0 {
			desc = s.Addr + " holds no batch"
		}
		if len(snaps) > 0 {
			desc += ", snapshots at " + strings.Join(snaps, ", ")
		} else {
			desc += ", no snapshot"
		}
		parts = append(parts, desc)
	}
	return strings.Join(parts, "; ")
}

func unixTime(ns int64) time.Time {
	if ns == 0 {
		return time.Time{}
	}
	return time.Unix(0, ns)
}

// replay reads the base snapshot and the batches after it up to the target,
// checking each batch's CRC, its LSN continuity and its epoch against the
// lineage, and applies them (all but the applying in a dry run).
func (r *restorer) replay(ctx context.Context) (*Result, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	base := uint64(0)
	if r.p.Snapshot != nil {
		base = r.p.Snapshot.GetLsn()
	}
	// The batches' stream is opened before the snapshot is read: the log
	// store then keeps the WAL after the snapshot while it is read.
	var batches batchStream
	if r.p.BatchesFrom != "" {
		var err error
		if r.arch != nil {
			batches = r.arch.batches(ctx, base)
		} else if batches, err = r.conns[r.p.BatchesFrom].Read(ctx, &walshipv1.ReadRequest{FromLsn: base + 1, ToLsn: r.p.LSN, ClusterId: r.o.ClusterID}); err != nil {
			return nil, fmt.Errorf("read batches from %s at LSN %d: %w", r.p.BatchesFrom, base+1, err)
		}
	}
	r.store = state.New()
	if r.p.Snapshot != nil && !r.o.DryRun {
		var err error
		if r.arch != nil {
			r.store, err = r.arch.snapshot(ctx)
		} else {
			r.store, err = r.fetchSnapshot(ctx)
		}
		if err != nil {
			return nil, err
		}
	}
	began := time.Now()
	if batches != nil {
		// A restore's state is read by no one until it is done: replay
		// keeps the newest write of each key and builds the tree once.
		r.replayer = state.NewReplayer(r.store)
		if err := r.applyBatches(ctx, batches, base); err != nil {
			return nil, err
		}
		r.store = r.replayer.Finish()
	}
	res := &Result{Plan: r.p, Replayed: time.Since(began)}
	res.Plan.Lineage = r.lineage.Cut(res.LSN)
	if !r.o.DryRun {
		v := r.store.Snapshot()
		res.Digest, res.Keys = v.Digest().String(), int(keyspace.UserKeys(v))
	}
	return res, nil
}

// fetchSnapshot reads the base snapshot into a store, checking its pairs'
// order, its count, its digest and its history against the lineage.
func (r *restorer) fetchSnapshot(ctx context.Context) (*state.Store, error) {
	sn, from := r.p.Snapshot, r.p.SnapshotFrom
	st, err := r.conns[from].GetSnapshot(ctx, &walshipv1.GetSnapshotRequest{AtMostLsn: sn.GetLsn(), ClusterId: r.o.ClusterID})
	if err != nil {
		return nil, fmt.Errorf("get snapshot at LSN %d from %s: %w", sn.GetLsn(), from, err)
	}
	m, err := st.Recv()
	if err != nil {
		return nil, fmt.Errorf("get snapshot at LSN %d from %s: %w", sn.GetLsn(), from, err)
	}
	h := m.GetHeader()
	switch {
	case h == nil:
		return nil, status.Errorf(codes.DataLoss, "snapshot from %s: the first message is not a header", from)
	case h.GetLsn() != sn.GetLsn():
		return nil, status.Errorf(codes.DataLoss, "snapshot from %s is at LSN %d, its Status said %d", from, h.GetLsn(), sn.GetLsn())
	}
	hist := datadir.HistoryFromProto(h.GetHistory())
	if err := hist.Check(r.lineage.Current().Epoch, datadir.MaxEpochGap); err != nil {
		return nil, status.Errorf(codes.DataLoss, "snapshot at LSN %d from %s: header.history%v", h.GetLsn(), from, err)
	}
	if len(hist) > 0 {
		if shared, all, _ := r.lineage.SharedUpTo(hist); !all && shared < h.GetLsn() {
			return nil, status.Errorf(codes.FailedPrecondition, "snapshot at LSN %d from %s has history %v, which leaves the lineage %v at LSN %d", h.GetLsn(), from, hist, r.lineage, shared)
		}
	}
	b := state.NewBuilder(h.GetLsn())
	for {
		m, err := st.Recv()
		if err != nil {
			return nil, fmt.Errorf("snapshot at LSN %d from %s ended before its trailer: %w", h.GetLsn(), from, err)
		}
		if tr := m.GetTrailer(); tr != nil {
			store, err := b.Finish(h.GetKeys(), tr.GetStateDigest())
			if err != nil {
				return nil, status.Errorf(codes.DataLoss, "snapshot at LSN %d from %s: %v", h.GetLsn(), from, err)
			}
			return store, nil
		}
		for _, kv := range m.GetChunk().GetKvs() {
			if err := b.Add([]byte(kv.GetKey()), kv.GetValue(), kv.GetVersionLsn()); err != nil {
				return nil, status.Errorf(codes.DataLoss, "snapshot at LSN %d from %s: %v", h.GetLsn(), from, err)
			}
		}
	}
}

// applyBatches reads the batches after base, up to the target, and applies
// them: one goroutine receives, checks and decodes (readBatches), this one
// applies, so the two overlap.
func (r *restorer) applyBatches(ctx context.Context, st batchStream, base uint64) error {
	g, ctx := errgroup.WithContext(ctx)
	batches := make(chan decoded, 8)
	var end readEnd
	g.Go(func() error {
		defer close(batches)
		var err error
		end, err = r.readBatches(ctx, st, base, batches)
		return err
	})
	g.Go(func() error {
		for d := range batches {
			if d.batch != nil {
				if err := r.replayer.Apply(d.batch); err != nil {
					return status.Errorf(codes.DataLoss, "apply LSNs %d..%d: %v", d.first, d.last, err)
				}
			}
			r.p.Batches++
			r.p.Bytes += uint64(d.bytes)
			r.p.CommitTime = d.commit
		}
		return nil
	})
	if err := g.Wait(); err != nil {
		return err
	}
	r.p.LSN, r.p.NewestCommit = end.last, end.newest
	return nil
}

// batchStream is where the batches after the snapshot come from: a log
// store's Read, or the archive's chunks (archive.go).
type batchStream interface {
	Recv() (*walshipv1.ReadResponse, error)
}

// decoded is one checked batch on its way to the replayer.
type decoded struct {
	batch       *codec.Batch // nil in a dry run
	first, last uint64
	bytes       int // payload bytes
	commit      time.Time
}

// readEnd is where the read stopped: the last LSN sent on, and the newest
// commit time seen (for a time target, the first one after it).
type readEnd struct {
	last   uint64
	newest time.Time
}

// readBatches receives the batches after base and sends each on out once
// checked — its CRC, its continuity, its epoch against the lineage, not
// past the target — and decoded (but in a dry run). It stops after the
// target LSN, or before the first batch committed after a target time.
func (r *restorer) readBatches(ctx context.Context, st batchStream, base uint64, out chan<- decoded) (readEnd, error) {
	t := r.o.Target
	from, target := r.p.BatchesFrom, r.p.LSN
	end := readEnd{last: base}
	for {
		m, err := st.Recv()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return end, fmt.Errorf("read batches from %s at LSN %d: %w", from, end.last+1, err)
		}
		env := m.GetBatch()
		if err := envelope.Verify(env); err != nil {
			return end, status.Errorf(codes.DataLoss, "batch from %s at LSN %d: %v", from, end.last+1, err)
		}
		switch {
		case env.GetFirstLsn() != end.last+1:
			return end, status.Errorf(codes.DataLoss, "gap: %s sent LSNs %d..%d after LSN %d", from, env.GetFirstLsn(), env.GetLastLsn(), end.last)
		case r.lineage.EpochOf(env.GetFirstLsn()) != env.GetEpoch() || r.lineage.EpochOf(env.GetLastLsn()) != env.GetEpoch():
			return end, status.Errorf(codes.DataLoss, "lineage: %s holds LSNs %d..%d of epoch %d, but the lineage %v gives them to epoch %d",
				from, env.GetFirstLsn(), env.GetLastLsn(), env.GetEpoch(), r.lineage, r.lineage.EpochOf(env.GetFirstLsn()))
		}
		commit := unixTime(env.GetCommitTimeUnixNano())
		end.newest = commit
		if !t.Time.IsZero() && commit.After(t.Time) {
			return end, nil // the first commit after the target: stop before it
		}
		if t.Time.IsZero() && env.GetLastLsn() > target {
			return end, status.Errorf(codes.InvalidArgument, "--lsn: LSN %d is inside the batch %d..%d, not at a commit: restore to LSN %d or %d",
				target, env.GetFirstLsn(), env.GetLastLsn(), env.GetFirstLsn()-1, env.GetLastLsn())
		}
		d := decoded{first: env.GetFirstLsn(), last: env.GetLastLsn(), bytes: len(env.GetPayload()), commit: commit}
		if !r.o.DryRun {
			d.batch = new(codec.Batch)
			if err := envelope.DecodePayload(env, d.batch); err != nil {
				return end, status.Errorf(codes.DataLoss, "batch from %s at LSNs %d..%d: %v", from, d.first, d.last, err)
			}
		}
		select {
		case out <- d:
		case <-ctx.Done():
			return end, ctx.Err()
		}
		end.last = d.last
		r.tail = env
		if t.Time.IsZero() && end.last == target {
			return end, nil
		}
	}
	if !t.Time.IsZero() {
		return end, status.Errorf(codes.OutOfRange, "--time: %s is after the newest archived commit (%s, LSN %d): nothing shows the archive holds every commit up to it; restore to --latest, to --lsn %d, or to a time at or before %s",
			t.Time.UTC().Format(time.RFC3339Nano), end.newest.UTC().Format(time.RFC3339Nano), end.last, end.last, end.newest.UTC().Format(time.RFC3339Nano))
	}
	return end, status.Errorf(codes.DataLoss, "gap: %s ended its batches at LSN %d, before the target LSN %d", from, end.last, target)
}

// write builds the data directory: a new cluster id first (so nothing in
// it can be taken for the source, whatever happens next), the lineage up
// to the target (and the new cluster's first epoch), the batch that ends
// at the target as the WAL (tail.go) and the new cluster's epoch record's
// batch after it, then the state as a snapshot, which makes it a data
// directory.
func (r *restorer) write(res *Result) error {
	fsys, dir := r.o.FS, r.o.DataDir
	if err := fsys.MkdirAll(dir, vfs.DirPerm); err != nil {
		return fmt.Errorf("create %s: %w", dir, err)
	}
	id := r.o.NewClusterID
	if id == "" {
		id = datadir.NewClusterID()
	}
	if err := datadir.SaveCluster(fsys, dir, id); err != nil {
		return err
	}
	res.ClusterID = id
	h := res.Lineage
	if r.newLineage != nil {
		h = r.newLineage
	}
	if err := datadir.SaveHistory(fsys, dir, h); err != nil {
		return err
	}
	if err := r.writeTail(); err != nil {
		return err
	}
	snapDir := recovery.SnapshotDir(dir)
	if err := fsys.MkdirAll(snapDir, vfs.DirPerm); err != nil {
		return fmt.Errorf("create %s: %w", snapDir, err)
	}
	if _, err := state.SaveSnapshot(fsys, snapDir, r.store.Snapshot()); err != nil {
		return fmt.Errorf("write the restored state: %w", err)
	}
	return nil
}
