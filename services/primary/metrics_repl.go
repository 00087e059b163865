package primary

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// replCollector exports replica and log store positions, computed at scrape
// time from the acked positions and the batch index, so lag is true at the
// moment it is read: 0 for a caught-up peer however idle the primary is, and
// growing for a peer that stopped acking.
type replCollector struct {
	s *Server

	lagSeconds, lagBytes, lagRecords *prometheus.Desc
	connected, replicaConnected      *prometheus.Desc
	lsAcked, lsLag, lsConnected      *prometheus.Desc
	lsLagSeconds, lsLagBytes         *prometheus.Desc
	waiting                          *prometheus.Desc
	archived, archLagSec, archLagB   *prometheus.Desc
}

func newReplCollector(s *Server) *replCollector {
	return &replCollector{
		s: s,
		lagSeconds: prometheus.NewDesc("walship_replication_lag_seconds",
			"How long ago the oldest commit a replica has not reached at this stage was made (0 when caught up).", []string{"replica", "stage"}, nil),
		lagBytes: prometheus.NewDesc("walship_replication_lag_bytes",
			"WAL bytes a replica has not reached at this stage.", []string{"replica", "stage"}, nil),
		lagRecords: prometheus.NewDesc("walship_replication_lag_records",
			"WAL records (LSNs) a replica has not reached at this stage.", []string{"replica", "stage"}, nil),
		connected: prometheus.NewDesc("walship_replication_connected_replicas",
			"Replicas with a replication stream open.", nil, nil),
		replicaConnected: prometheus.NewDesc("walship_replication_replica_connected",
			"1 if the replica's stream is open, 0 if it was seen since start and is not.", []string{"replica"}, nil),
		lsAcked: prometheus.NewDesc("walship_replication_logstore_acked_lsn",
			"Last LSN the log store acknowledged as durable.", []string{"logstore"}, nil),
		lsLag: prometheus.NewDesc("walship_replication_logstore_lag_records",
			"WAL records the log store has not made durable yet.", []string{"logstore"}, nil),
		lsLagSeconds: prometheus.NewDesc("walship_replication_logstore_lag_seconds",
			"How long ago the oldest commit the log store has not made durable was made (0 when caught up).", []string{"logstore"}, nil),
		lsLagBytes: prometheus.NewDesc("walship_replication_logstore_lag_bytes",
			"WAL bytes the log store has not made durable yet.", []string{"logstore"}, nil),
		lsConnected: prometheus.NewDesc("walship_replication_logstore_connected",
			"1 if the append stream to the log store is open.", []string{"logstore"}, nil),
		archived: prometheus.NewDesc("walship_archive_lsn",
			"End of what the archive holds, as the log stores report it (exported while a log store has an archive).", nil, nil),
		archLagSec: prometheus.NewDesc("walship_archive_lag_seconds",
			"How long ago the oldest durable commit the archive lacks was made (0 when it has everything).", nil, nil),
		archLagB: prometheus.NewDesc("walship_archive_lag_bytes",
			"Durable WAL bytes the archive lacks.", nil, nil),
		waiting: prometheus.NewDesc("walship_sync_commits_waiting",
			"Commits waiting now for replicas at a stage (peers=replicas) or for a log store majority (peers=logstores).", []string{"peers", "stage"}, nil),
	}
}

func (c *replCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.lagSeconds, c.lagBytes, c.lagRecords, c.connected, c.replicaConnected, c.lsAcked, c.lsLag, c.lsLagSeconds, c.lsLagBytes, c.lsConnected, c.waiting,
		c.archived, c.archLagSec, c.archLagB} {
		ch <- d
	}
}

func (c *replCollector) Collect(ch chan<- prometheus.Metric) {
	s := c.s
	replicas, logstores := s.peers.snapshot()
	last, now := s.wal.DurableLSN(), time.Now()
	n := 0
	for _, r := range replicas {
		if r.connected {
			n++
		}
		ch <- prometheus.MustNewConstMetric(c.replicaConnected, prometheus.GaugeValue, b2f(r.connected), r.id)
		for _, level := range syncStages {
			pos, stage := r.at(level), levelName(level)
			bytes, age := s.pipe.index.lag(pos, now)
			ch <- prometheus.MustNewConstMetric(c.lagSeconds, prometheus.GaugeValue, age.Seconds(), r.id, stage)
			ch <- prometheus.MustNewConstMetric(c.lagBytes, prometheus.GaugeValue, float64(bytes), r.id, stage)
			ch <- prometheus.MustNewConstMetric(c.lagRecords, prometheus.GaugeValue, float64(last-min(last, pos)), r.id, stage)
		}
	}
	ch <- prometheus.MustNewConstMetric(c.connected, prometheus.GaugeValue, float64(n))
	for _, level := range syncStages {
		ch <- prometheus.MustNewConstMetric(c.waiting, prometheus.GaugeValue, float64(s.peers.waiting[level].Load()), "replicas", levelName(level))
	}
	ch <- prometheus.MustNewConstMetric(c.waiting, prometheus.GaugeValue, float64(s.peers.lsWaiting.Load()), "logstores", "flush")
	for _, l := range logstores {
		ch <- prometheus.MustNewConstMetric(c.lsAcked, prometheus.GaugeValue, float64(l.durable), l.addr)
		ch <- prometheus.MustNewConstMetric(c.lsLag, prometheus.GaugeValue, float64(last-min(last, l.durable)), l.addr)
		bytes, age := s.pipe.index.lag(l.durable, now)
		ch <- prometheus.MustNewConstMetric(c.lsLagSeconds, prometheus.GaugeValue, age.Seconds(), l.addr)
		ch <- prometheus.MustNewConstMetric(c.lsLagBytes, prometheus.GaugeValue, float64(bytes), l.addr)
		ch <- prometheus.MustNewConstMetric(c.lsConnected, prometheus.GaugeValue, b2f(l.connected), l.addr)
	}
	if url, archived := s.peers.archived(); url != "" {
		bytes, age := s.pipe.index.lag(archived, now)
		ch <- prometheus.MustNewConstMetric(c.archived, prometheus.GaugeValue, float64(archived))
		ch <- prometheus.MustNewConstMetric(c.archLagSec, prometheus.GaugeValue, age.Seconds())
		ch <- prometheus.MustNewConstMetric(c.archLagB, prometheus.GaugeValue, float64(bytes))
	}
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}
