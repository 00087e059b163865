package replica

import (
	"github.com/prometheus/client_golang/prometheus"
	walshipv1 "github.com/walship/walship/gen/walship/v1"
	"github.com/walship/walship/internal/changefeed"
	"github.com/walship/walship/internal/serve"
)

// Refusal reasons, the label values of walship_replica_refused_batches_total.
const (
	reasonCRC    = "crc"
	reasonEpoch  = "epoch"
	reasonGap    = "gap"
	reasonDecode = "decode"
)

// metrics are the replica's Prometheus metrics, registered on the injected
// registry and unregistered when Run returns.
type metrics struct {
	reg        prometheus.Registerer
	collectors []prometheus.Collector

	appliedRecords prometheus.Counter
	appliedBytes   prometheus.Counter
	rung           *prometheus.GaugeVec
	refused        *prometheus.CounterVec
	diverged       prometheus.Counter
	unapplied      prometheus.Gauge
	spilled        prometheus.Counter
	decodeSeconds  *prometheus.HistogramVec
	fsyncSeconds   prometheus.Histogram
	fsyncErrors    prometheus.Counter
	fences         prometheus.Counter
	orphaned       prometheus.Counter
	// clusterMismatch counts primaries, candidates and requests refused
	// for another cluster.
	clusterMismatch prometheus.Counter
	// pacedSeconds is the time log store reads waited for
	// --learner-bytes-per-second (catchup.go).
	pacedSeconds prometheus.Counter
	// The archive rung's (registered only with an archive).
	archiveBatches, archiveReseeds, archiveErrors prometheus.Counter
	watch                                         *changefeed.Metrics
}

func newMetrics(reg prometheus.Registerer, s *Server) *metrics {
	m := &metrics{reg: reg}
	lag := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "walship_replica_lag_seconds",
		Help: "How far the replica's applied state is behind the primary, in seconds: 0 when caught up and in contact; else the age of the oldest commit not yet applied, growing while the primary is unreachable.",
	}, func() float64 { return s.lag.seconds(s.now()) })
	stage := func(name string, f func() uint64) prometheus.Collector {
		return prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name:        "walship_replica_lsn",
			Help:        "Last LSN the replica has reached at each stage: written to its WAL, flushed (fsynced), applied (readable).",
			ConstLabels: prometheus.Labels{"stage": name},
		}, func() float64 { return float64(f()) })
	}
	m.appliedRecords = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "walship_replica_applied_records_total",
		Help: "WAL records (puts, deletes and commits) the replica applied from the primary or a log store.",
	})
	m.appliedBytes = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "walship_replica_applied_bytes_total",
		Help: "Payload bytes of the WAL batches the replica applied.",
	})
	m.rung = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "walship_replica_catchup_rung",
		Help: "The catch-up rung the replica is on (1) or not (0): primary (streaming), logstore (reading a gap), snapshot (re-seeding), archive (reading the archive).",
	}, []string{"rung"})
	connected := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "walship_replica_connected",
		Help: "1 while a replication stream from the primary is up, else 0.",
	}, func() float64 {
		if s.follower.connected.Load() {
			return 1
		}
		return 0
	})
	m.diverged = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "walship_replica_diverged_total",
		Help: "Times the primary answered Diverged: this replica held entries the primary lost in a crash before they were durable there; they were cut (or, if applied after a restart, the replica re-seeded).",
	})
	m.unapplied = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "walship_replica_unapplied_bytes",
		Help: "Payload bytes of written batches held in memory until the primary reports them durable (at most --max-unapplied-bytes).",
	})
	m.spilled = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "walship_replica_spilled_batches_total",
		Help: "Batches that arrived while --max-unapplied-bytes was full: kept in the WAL only and read back from it to be applied. Rising means the primary's durable LSN is stalling.",
	})
	m.refused = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "walship_replica_refused_batches_total",
		Help: "WAL batches the replica refused (never written nor applied), by reason: crc, epoch (older than the highest seen), gap (not continuing the log), decode.",
	}, []string{"reason"})
	m.decodeSeconds = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "walship_codec_decode_duration_seconds",
		Help:    "Time to decode one WAL batch payload, by codec.",
		Buckets: prometheus.ExponentialBuckets(1e-6, 2, 18),
	}, []string{"codec"})
	m.fsyncSeconds = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name:    "walship_wal_fsync_duration_seconds",
		Help:    "Duration of the WAL's fdatasync calls (a primary's: one per group commit).",
		Buckets: prometheus.ExponentialBuckets(25e-6, 2, 16),
	})
	m.fsyncErrors = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "walship_wal_fsync_errors_total",
		Help: "Failed WAL fsyncs. One is fatal: the process stops committing or acking and exits (it is never retried).",
	})
	m.fences = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "walship_fences_granted_total",
		Help: "Epochs promised to a candidate (EpochService.Fence granted); a primary that grants one steps down.",
	})
	m.orphaned = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "walship_orphaned_records_total",
		Help: "Log records cut because the cluster's history went another way, kept in orphan files.",
	})
	m.clusterMismatch = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "walship_cluster_mismatch_total",
		Help: "Times this node met a peer of another cluster (a cluster id other than its own): requests and streams it refused, or that refused it. Both ids are logged.",
	})
	m.pacedSeconds = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "walship_replica_catchup_paced_seconds_total",
		Help: "Time the replica waited, reading from a log store, for --learner-bytes-per-second: the newest contract it holds does not name it a member (a learner).",
	})
	m.archiveBatches = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "walship_replica_archive_batches_total",
		Help: "WAL batches the replica applied from the archive's chunks (the archive rung: neither the primary nor a log store could serve it).",
	})
	m.archiveReseeds = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "walship_replica_archive_reseeds_total",
		Help: "Times the replica re-seeded its state from a base snapshot in the archive.",
	})
	m.archiveErrors = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "walship_replica_archive_errors_total",
		Help: "Archive rungs that failed (the archive unreachable, an object damaged, nothing in it for this replica); the replica goes back to the primary with backoff.",
	})
	for _, r := range []string{reasonCRC, reasonEpoch, reasonGap, reasonDecode} {
		m.refused.WithLabelValues(r)
	}
	m.collectors = []prometheus.Collector{
		lag,
		stage("write", s.wal.LastLSN),
		stage("flush", s.wal.DurableLSN),
		stage("apply", s.appliedLSN),
		m.appliedRecords, m.appliedBytes, m.pacedSeconds, m.rung, connected, m.refused, m.diverged, m.unapplied, m.spilled, m.decodeSeconds, m.fsyncSeconds, m.fsyncErrors,
		m.fences, m.orphaned, m.clusterMismatch,
		serve.NewInfo(s.cfg.ID, s.srv.Addr),
	}
	m.watch = changefeed.NewMetrics(s.feed)
	m.collectors = append(m.collectors, m.watch.Collectors()...)
	if s.arch != nil {
		m.collectors = append(m.collectors, m.archiveBatches, m.archiveReseeds, m.archiveErrors)
	}
	for _, c := range m.collectors {
		reg.MustRegister(c)
	}
	m.setRung(walshipv1.CatchUpRung_CATCH_UP_RUNG_UNSPECIFIED)
	return m
}

func rungLabel(r walshipv1.CatchUpRung) string {
	switch r {
	case walshipv1.CatchUpRung_CATCH_UP_RUNG_PRIMARY:
		return "primary"
	case walshipv1.CatchUpRung_CATCH_UP_RUNG_LOGSTORE:
		return "logstore"
	case walshipv1.CatchUpRung_CATCH_UP_RUNG_SNAPSHOT:
		return "snapshot"
	case walshipv1.CatchUpRung_CATCH_UP_RUNG_ARCHIVE:
		return "archive"
	}
	return ""
}

// setRung makes r the one rung reported as 1 (none for UNSPECIFIED).
func (m *metrics) setRung(r walshipv1.CatchUpRung) {
	for _, l := range []string{"primary", "logstore", "snapshot", "archive"} {
		v := 0.0
		if l == rungLabel(r) {
			v = 1
		}
		m.rung.WithLabelValues(l).Set(v)
	}
}

func (m *metrics) unregister() {
	for _, c := range m.collectors {
		m.reg.Unregister(c)
	}
}
