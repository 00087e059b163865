package changefeed

import "github.com/prometheus/client_golang/prometheus"

// Reasons a watch is ended by the node, the label values of
// walship_watch_cutoffs_total (a bounded set).
const (
	// CutStalled: a Send stayed blocked past the stall bound (the client
	// does not read).
	CutStalled = "stalled"
	// CutOutOfRange: the position is not held here (older than the WAL,
	// or, with prev_values, than the ring; or still in the future).
	CutOutOfRange = "out_of_range"
	// CutUnavailable: the node cannot serve it now (nothing readable yet,
	// its WAL could not be read).
	CutUnavailable = "unavailable"
	// CutDataLoss: a damaged WAL entry.
	CutDataLoss = "data_loss"
)

var cutReasons = []string{CutStalled, CutOutOfRange, CutUnavailable, CutDataLoss}

// Metrics are a node's watch metrics. The node registers Collectors on its
// injected registry (and unregisters them) and passes the Metrics in every
// Source; a nil *Metrics records nothing.
type Metrics struct {
	open    prometheus.Gauge
	cutoffs *prometheus.CounterVec
	sent    prometheus.Counter
	oldest  prometheus.Collector
}

// NewMetrics returns the watch metrics of a node serving from feed.
func NewMetrics(feed *Feed) *Metrics {
	m := &Metrics{
		open: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "walship_watch_watchers",
			Help: "Watch streams open on this node (from a valid request until the stream ends).",
		}),
		cutoffs: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "walship_watch_cutoffs_total",
			Help: "Watch streams this node ended, by reason: stalled (the client did not read for --watch-stall), out_of_range (a position not held here, or in the future), unavailable (nothing readable yet, the WAL unreadable), data_loss (a damaged WAL entry).",
		}, []string{"reason"}),
		sent: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "walship_watch_sent_transactions_total",
			Help: "Transactions sent to watchers, every watcher counted (one sent to 3 watchers counts 3).",
		}),
		oldest: prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "walship_watch_ring_oldest_lsn",
			Help: "Oldest commit LSN the ring of recent transactions holds (with previous values): a watch with prev_values starts at or after it; one without reads older positions from the WAL.",
		}, func() float64 { return float64(feed.From()) }),
	}
	for _, r := range cutReasons {
		m.cutoffs.WithLabelValues(r) // exported at 0 before the first
	}
	return m
}

// Collectors returns the collectors the node registers.
func (m *Metrics) Collectors() []prometheus.Collector {
	return []prometheus.Collector{m.open, m.cutoffs, m.sent, m.oldest}
}

func (m *Metrics) opened(delta float64) {
	if m != nil {
		m.open.Add(delta)
	}
}

// cut counts a watch ended for reason, and returns err.
func (m *Metrics) cut(reason string, err error) error {
	if m != nil {
		m.cutoffs.WithLabelValues(reason).Inc()
	}
	return err
}

func (m *Metrics) sentTxns(n int) {
	if m != nil {
		m.sent.Add(float64(n))
	}
}
