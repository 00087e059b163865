package primary

import (
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	walshipv1 "github.com/walship/walship/gen/walship/v1"
	"github.com/walship/walship/internal/changefeed"
	"github.com/walship/walship/internal/rpcerr"
	"github.com/walship/walship/internal/serve"
)

// metrics are the primary's Prometheus metrics, registered on the injected
// registry and unregistered when Run returns.
type metrics struct {
	reg        prometheus.Registerer
	collectors []prometheus.Collector

	commits       *prometheus.CounterVec
	commitSeconds *prometheus.HistogramVec
	// okCommits caches, by policy (durabilityIndex, replicationIndex),
	// the series of a commit that succeeded: a commit then skips the
	// vectors' hashing and lookup of its labels. Filled on first use, so
	// that only the series of policies used are exported, as before.
	okCommits     [2][3]atomic.Pointer[commitSeries]
	walBatches    prometheus.Counter
	walRecords    prometheus.Counter
	fsyncSeconds  prometheus.Histogram
	encodeSeconds prometheus.Observer

	fsyncErrors       prometheus.Counter
	sentBytes         *prometheus.CounterVec
	shipDelays        *prometheus.CounterVec
	pacedBytes        *prometheus.CounterVec
	pacedSeconds      *prometheus.CounterVec
	replicaOutOfRange prometheus.Counter
	replicaDiverged   prometheus.Counter
	snapshotsStreamed prometheus.Counter
	fences            prometheus.Counter
	clusterMismatch   prometheus.Counter

	snapshotUploads       *prometheus.CounterVec
	snapshotUploadSeconds prometheus.Histogram

	refusedWrites *prometheus.CounterVec
	gateWaits     *prometheus.CounterVec

	changeInProgress prometheus.Gauge
	changes          *prometheus.CounterVec

	watch *changefeed.Metrics
}

func newMetrics(reg prometheus.Registerer, s *Server) *metrics {
	m := &metrics{reg: reg}
	m.fences = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "walship_fences_granted_total",
		Help: "Epochs promised to a candidate (EpochService.Fence granted); a primary that grants one steps down.",
	})
	m.commits = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "walship_commits_total",
		Help: "Write transactions by commit policy and result (ok, or the gRPC code of the failure).",
	}, []string{"durability", "replication", "result"})
	m.commitSeconds = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "walship_commit_duration_seconds",
		Help:    "Time from a write's arrival to its acknowledgement, by commit policy.",
		Buckets: prometheus.ExponentialBuckets(50e-6, 2, 18),
	}, []string{"durability", "replication"})
	m.walBatches = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "walship_wal_batches_total",
		Help: "WAL batches written by the primary.",
	})
	m.walRecords = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "walship_wal_records_total",
		Help: "WAL records written by the primary (puts, deletes and commits).",
	})
	m.fsyncSeconds = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name:    "walship_wal_fsync_duration_seconds",
		Help:    "Duration of the WAL's fdatasync calls (a primary's: one per group commit).",
		Buckets: prometheus.ExponentialBuckets(25e-6, 2, 16),
	})
	encode := prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "walship_codec_encode_duration_seconds",
		Help:    "Time to encode one WAL batch payload, by codec.",
		Buckets: prometheus.ExponentialBuckets(1e-6, 2, 18),
	}, []string{"codec"})
	m.encodeSeconds = encode.WithLabelValues(s.cfg.Codec.Name())
	written := prometheus.NewCounterFunc(prometheus.CounterOpts{
		Name: "walship_wal_written_bytes_total",
		Help: "Bytes written to the primary's WAL segment files.",
	}, func() float64 { return float64(s.wal.Stats().BytesWritten) })
	last := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "walship_wal_last_lsn",
		Help: "Last LSN written to the primary's WAL.",
	}, func() float64 { return float64(s.wal.LastLSN()) })
	durable := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "walship_wal_durable_lsn",
		Help: "Last LSN fsynced in the primary's WAL.",
	}, func() float64 { return float64(s.wal.DurableLSN()) })
	visible := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "walship_visible_lsn",
		Help: "LSN up to which the primary's reads see commits.",
	}, func() float64 { return float64(s.pipe.visible.Load()) })
	walBytes := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "walship_wal_size_bytes",
		Help: "Size of the primary's WAL segment files on disk.",
	}, func() float64 { return float64(s.wal.Size()) })
	m.fsyncErrors = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "walship_wal_fsync_errors_total",
		Help: "Failed WAL fsyncs. One is fatal: the process stops committing or acking and exits (it is never retried).",
	})
	m.sentBytes = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "walship_replication_sent_bytes_total",
		Help: "WAL bytes sent to each replica.",
	}, []string{"replica"})
	m.shipDelays = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "walship_ship_delays_total",
		Help: "Times a stream began holding back a batch nothing waited on, for at most --ship-delay, to send it with the batches after it; to is replica or logstore.",
	}, []string{"to"})
	m.pacedBytes = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "walship_replication_paced_bytes_total",
		Help: "WAL bytes sent to a replica whose acks count for nothing (a learner) after waiting for --learner-bytes-per-second.",
	}, []string{"replica"})
	m.pacedSeconds = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "walship_replication_paced_seconds_total",
		Help: "Time a replica stream waited for --learner-bytes-per-second before sending a batch: its replica's acks count for nothing (a learner).",
	}, []string{"replica"})
	m.replicaOutOfRange = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "walship_replication_out_of_range_total",
		Help: "Replica streams refused because the replica needed WAL the primary no longer retains.",
	})
	m.replicaDiverged = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "walship_replication_diverged_total",
		Help: "Replica streams answered with Diverged: the replica held entries, sent before they were durable here, that a crash of this primary lost.",
	})
	m.snapshotsStreamed = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "walship_replication_snapshots_sent_total",
		Help: "State snapshots streamed to replicas.",
	})
	m.clusterMismatch = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "walship_cluster_mismatch_total",
		Help: "Times this node met a peer of another cluster (a cluster id other than its own): requests and streams it refused, or that refused it. Both ids are logged.",
	})
	m.snapshotUploads = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "walship_primary_snapshot_uploads_total",
		Help: "Uploads of state snapshots to the log stores by result: ok, existed (the log store held it), skipped (a newer snapshot replaced its file), error.",
	}, []string{"result"})
	for _, r := range []string{"ok", "existed", "skipped", "error"} {
		m.snapshotUploads.WithLabelValues(r) // exported at 0 before the first upload
	}
	m.snapshotUploadSeconds = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name:    "walship_primary_snapshot_upload_duration_seconds",
		Help:    "Time one snapshot upload to a log store took (asking the log store, streaming, its fsync).",
		Buckets: prometheus.ExponentialBuckets(0.01, 2, 16),
	})
	m.refusedWrites = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "walship_primary_refused_writes_total",
		Help: "Writes (Put, Delete, Txn with writes) the primary refused UNAVAILABLE before doing anything, by reason: opening (its epoch record does not meet the contract yet), no_lease (no log store majority heard within --lease-timeout), handover (a switchover), election (it does not hold the --kube-lease election), failed (a fatal error, or deposed).",
	}, []string{"reason"})
	for _, r := range refusedReasons {
		m.refusedWrites.WithLabelValues(r)
	}
	m.gateWaits = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "walship_primary_election_waits_total",
		Help: "Commits acknowledged under the contract while the primary did not hold the election (a Lease renewal late), whose answer waited for it, by outcome: held (it held it again within the grace, and the commit was answered) or lost (answered UNAVAILABLE with an unknown outcome).",
	}, []string{"outcome"})
	for _, o := range []string{"held", "lost"} {
		m.gateWaits.WithLabelValues(o)
	}
	takingWrites := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "walship_primary_taking_writes",
		Help: "1 while the primary takes writes (and reads), 0 while it refuses them: opening its epoch, without a log store majority (its lease), handing over, without the election, failed.",
	}, func() float64 { return b2f(s.TakingWrites()) })
	m.changeInProgress = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "walship_membership_change_in_progress",
		Help: "1 while the primary runs a membership change (ChangeMembers, or finishing a joint record its log ended in), else 0.",
	})
	m.changes = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "walship_membership_changes_total",
		Help: "Membership changes the primary ran, by outcome: done, abandoned (the learner did not catch up in time), rolled_back (a joint record a new primary rolled back), failed (the primary stopped or a record failed).",
	}, []string{"outcome"})
	for _, o := range changeOutcomes {
		m.changes.WithLabelValues(o)
	}
	contractK := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "walship_primary_contract_sync_replicas",
		Help: "The contract's k: replicas that must acknowledge a commit under the default policy (0 without sync replication). walship_replication_connected_replicas below it means sync commits stall.",
	}, func() float64 { return float64(s.contract().GetSyncReplicas()) })
	retention := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "walship_wal_retention_limit_bytes",
		Help: "The primary's WAL retention limit (--wal-retention-bytes).",
	}, func() float64 { return float64(s.cfg.WALRetentionBytes) })
	m.collectors = []prometheus.Collector{m.commits, m.commitSeconds, m.walBatches, m.walRecords, m.fsyncSeconds, m.fsyncErrors,
		encode, written, last, durable, visible, walBytes, m.sentBytes, m.shipDelays, m.pacedBytes, m.pacedSeconds, m.replicaOutOfRange, m.replicaDiverged, m.snapshotsStreamed, retention,
		m.fences, m.clusterMismatch, m.snapshotUploads, m.snapshotUploadSeconds, newReplCollector(s), m.refusedWrites, m.gateWaits, takingWrites, contractK,
		m.changeInProgress, m.changes,
		serve.NewInfo(s.cfg.ID, func() string {
			if a := s.Advertise(); a != "" {
				return a
			}
			if s.srv == nil {
				return s.cfg.Listen
			}
			return s.srv.Addr()
		})}
	m.collectors = append(m.collectors, s.admit.collectors()...)
	m.watch = changefeed.NewMetrics(s.pipe.feed)
	m.collectors = append(m.collectors, m.watch.Collectors()...)
	for _, c := range m.collectors {
		reg.MustRegister(c)
	}
	return m
}

// commitSeries are the series of one policy's successful commits.
type commitSeries struct {
	commits prometheus.Counter
	seconds prometheus.Observer
}

func (m *metrics) observeCommit(p Policy, err error, d time.Duration) {
	if err == nil {
		c := &m.okCommits[durabilityIndex(p.Durability)][replicationIndex(p.Replication)]
		s := c.Load()
		if s == nil {
			// Two first commits may both get here: they find the
			// same series.
			dur, rep := durabilityLabel(p.Durability), replicationLabel(p.Replication)
			s = &commitSeries{commits: m.commits.WithLabelValues(dur, rep, "ok"), seconds: m.commitSeconds.WithLabelValues(dur, rep)}
			c.Store(s)
		}
		s.commits.Inc()
		s.seconds.Observe(d.Seconds())
		return
	}
	dur, rep := durabilityLabel(p.Durability), replicationLabel(p.Replication)
	m.commits.WithLabelValues(dur, rep, rpcerr.Code(err).String()).Inc()
	m.commitSeconds.WithLabelValues(dur, rep).Observe(d.Seconds())
}

func (m *metrics) unregister() {
	for _, c := range m.collectors {
		m.reg.Unregister(c)
	}
}

// durabilityIndex and replicationIndex number the values of
// durabilityLabel and replicationLabel, for okCommits.
func durabilityIndex(d walshipv1.Durability) int {
	if d == walshipv1.Durability_DURABILITY_ASYNC {
		return 1
	}
	return 0
}

func replicationIndex(r walshipv1.ReplicationMode) int {
	switch r {
	case walshipv1.ReplicationMode_REPLICATION_MODE_DISABLED:
		return 0
	case walshipv1.ReplicationMode_REPLICATION_MODE_SYNC:
		return 1
	default:
		return 2
	}
}

func durabilityLabel(d walshipv1.Durability) string {
	if d == walshipv1.Durability_DURABILITY_ASYNC {
		return "async"
	}
	return "sync"
}

func replicationLabel(r walshipv1.ReplicationMode) string {
	switch r {
	case walshipv1.ReplicationMode_REPLICATION_MODE_DISABLED:
		return "disabled"
	case walshipv1.ReplicationMode_REPLICATION_MODE_SYNC:
		return "sync"
	default:
		return "async"
	}
}
