package logstore

import (
	"github.com/prometheus/client_golang/prometheus"
	"github.com/walship/walship/internal/serve"
)

// metrics are the log store's Prometheus metrics, registered on the injected
// registry in New and unregistered when Run returns.
type metrics struct {
	reg        prometheus.Registerer
	collectors []prometheus.Collector

	appendedBytes prometheus.Counter
	readBytes     prometheus.Counter
	fsyncSeconds  prometheus.Histogram
	fsyncErrors   prometheus.Counter
	appendStreams prometheus.Gauge
	readStreams   prometheus.Gauge
	fences        prometheus.Counter
	orphaned      prometheus.Counter
	// clusterMismatch counts peers refused for another cluster.
	clusterMismatch prometheus.Counter
	refillBatches   prometheus.Counter
	refillBytes     prometheus.Counter

	snapshotPuts      *prometheus.CounterVec
	snapshotsServed   prometheus.Counter
	snapshotSentBytes prometheus.Counter
}

func newMetrics(reg prometheus.Registerer, s *Server) (*metrics, error) {
	m := &metrics{reg: reg}
	m.appendedBytes = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "walship_logstore_appended_bytes_total",
		Help: "Envelope bytes appended to the log store's WAL (retransmissions not counted).",
	})
	m.readBytes = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "walship_logstore_read_bytes_total",
		Help: "Envelope bytes sent to Read streams.",
	})
	m.fsyncSeconds = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name:    "walship_logstore_fsync_duration_seconds",
		Help:    "Duration of the log store's group fsyncs: one per round of appends, whatever the number of batches and streams in it.",
		Buckets: prometheus.ExponentialBuckets(25e-6, 2, 16),
	})
	m.fsyncErrors = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "walship_wal_fsync_errors_total",
		Help: "Failed fsyncs of the log store's WAL or epoch file; each one is fatal to the log store.",
	})
	m.appendStreams = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "walship_logstore_append_streams",
		Help: "Connected Append streams (primaries shipping their WAL).",
	})
	m.readStreams = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "walship_logstore_read_streams",
		Help: "Open Read streams.",
	})
	m.fences = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "walship_fences_granted_total",
		Help: "Epochs promised to a candidate (EpochService.Fence granted).",
	})
	m.orphaned = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "walship_orphaned_records_total",
		Help: "Log records cut because the cluster's history went another way, kept in orphan files.",
	})
	m.clusterMismatch = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "walship_cluster_mismatch_total",
		Help: "Times this node met a peer of another cluster (a cluster id other than its own): requests and streams it refused, or that refused it. Both ids are logged.",
	})
	m.refillBatches = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "walship_logstore_refill_batches_total",
		Help: "Batches copied by refills from peer log stores or the archive (stored; retransmissions not counted).",
	})
	m.refillBytes = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "walship_logstore_refill_bytes_total",
		Help: "Envelope bytes copied by refills from peer log stores or the archive (also in walship_logstore_appended_bytes_total).",
	})
	refilling := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "walship_logstore_refilling",
		Help: "1 while the log store copies what it lacks from its peers and refuses Append streams.",
	}, func() float64 {
		if s.fill.refilling.Load() {
			return 1
		}
		return 0
	})
	durable := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "walship_logstore_durable_lsn",
		Help: "Last LSN fsynced by the log store.",
	}, func() float64 { return float64(s.wal.DurableLSN()) })
	first := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "walship_logstore_first_lsn",
		Help: "Oldest LSN the log store still keeps (0 when empty).",
	}, func() float64 { return float64(s.wal.FirstLSN()) })
	stored := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "walship_logstore_stored_bytes",
		Help: "Size of the log store's WAL segment files.",
	}, func() float64 { return float64(s.wal.Size()) })
	epoch := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "walship_logstore_epoch",
		Help: "Highest epoch the log store has promised (a fence, or a newer primary seen), persisted.",
	}, func() float64 { return float64(s.epoch.Load()) })
	m.snapshotPuts = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "walship_logstore_snapshot_puts_total",
		Help: "Base snapshots uploaded (PutSnapshot) by result: stored, existed (already stored), refused (a bad argument, or an LSN that is not a durable batch end here, or a stale epoch), corrupt (the digest differs), error.",
	}, []string{"result"})
	for _, r := range []string{"stored", "existed", "refused", "corrupt", "error"} {
		m.snapshotPuts.WithLabelValues(r) // exported at 0 before the first upload
	}
	m.snapshotsServed = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "walship_logstore_snapshots_served_total",
		Help: "Base snapshots streamed whole by GetSnapshot (to a restore or a re-seeding replica).",
	})
	m.snapshotSentBytes = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "walship_logstore_snapshot_sent_bytes_total",
		Help: "Key and value bytes sent by GetSnapshot streams.",
	})
	snapshots := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "walship_logstore_snapshots",
		Help: "Base snapshots the log store holds.",
	}, func() float64 { return float64(s.snaps.len()) })
	snapshotBytes := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "walship_logstore_snapshot_bytes",
		Help: "Size of the log store's base snapshot files.",
	}, func() float64 { return float64(s.snaps.bytes()) })
	held := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "walship_logstore_retention_held_bytes",
		Help: "WAL bytes retention would remove but keeps: the log after the newest base snapshot stays restorable, and, with an archive, nothing leaves before it is archived. Grows while no new snapshot arrives or archiving is behind.",
	}, func() float64 { return float64(s.ret.heldBytes.Load()) })
	m.collectors = []prometheus.Collector{m.appendedBytes, m.readBytes, m.fsyncSeconds, m.fsyncErrors,
		m.appendStreams, m.readStreams, m.fences, m.orphaned, m.clusterMismatch, m.refillBatches, m.refillBytes, refilling, durable, first, stored, epoch,
		m.snapshotPuts, m.snapshotsServed, m.snapshotSentBytes, snapshots, snapshotBytes, held,
		serve.NewInfo("", func() string {
			if s.srv == nil {
				return s.cfg.Listen
			}
			return s.srv.Addr()
		})}
	for i, c := range m.collectors {
		if err := reg.Register(c); err != nil {
			for _, r := range m.collectors[:i] {
				reg.Unregister(r)
			}
			return nil, err
		}
	}
	return m, nil
}

func (m *metrics) unregister() {
	for _, c := range m.collectors {
		m.reg.Unregister(c)
	}
}

// register adds c to the registry, to be unregistered with the rest.
func (m *metrics) register(c prometheus.Collector) error {
	if err := m.reg.Register(c); err != nil {
		return err
	}
	m.collectors = append(m.collectors, c)
	return nil
}
