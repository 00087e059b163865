package node

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/walship/walship/internal/logelect"
)

// metrics are the node's own: its role, promotions and step-downs. The
// roles' services register theirs on the same registry.
type metrics struct {
	reg        prometheus.Registerer
	collectors []prometheus.Collector

	role       *prometheus.GaugeVec
	promotions *prometheus.CounterVec
	stepDowns  prometheus.Counter
	phases     *prometheus.HistogramVec
}

// The phases of a promotion, the phase label of
// walship_promotion_phase_duration_seconds (docs of promote.go's steps).
const (
	phaseSurvey    = "survey"     // 1: ask every log store and member where its log ends
	phaseFence     = "fence"      // 2-3: the new epoch promised by a quorum
	phaseLeaseWait = "lease_wait" // 5: the old primary's lease runs out
	phaseCatchUp   = "catch_up"   // 4: the tail this node lacks copied from the donor
	phaseEpochOpen = "epoch_open" // 6: from the primary's start until it takes writes
)

// resultNotMember is the result of a promotion refused before fencing
// because this node may not lead under its log's contract
// (walship_promotions_total).
const resultNotMember = "not_member"

var phases = []string{phaseSurvey, phaseFence, phaseLeaseWait, phaseCatchUp, phaseEpochOpen}

func newMetrics(reg prometheus.Registerer, n *Node) *metrics {
	m := &metrics{reg: reg}
	m.role = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "walship_node_role",
		Help: "1 for the data node's current role (primary or replica), 0 for the other.",
	}, []string{"role"})
	m.promotions = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "walship_promotions_total",
		Help: "Promotions this node attempted, by result: opened, refused (no quorum; nothing changed), failed (after fencing), not_member (this node may not lead under the newest contract in its log — a learner, a member joining or leaving, one removed — refused before fencing; one that gives up for that reason once fenced and caught up is failed, its timeline saying why).",
	}, []string{"result"})
	m.stepDowns = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "walship_step_downs_total",
		Help: "Times this node stepped down from primary because a newer epoch exists, and rejoined as a replica.",
	})
	for _, r := range []string{"opened", "refused", "failed", resultNotMember} {
		m.promotions.WithLabelValues(r)
	}
	m.phases = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "walship_promotion_phase_duration_seconds",
		Help:    "Duration of each phase of a promotion this node carried out (a failover or the target's side of a switchover): survey, fence, lease_wait (the old primary's lease), catch_up (copying the donor's tail), epoch_open (until it takes writes).",
		Buckets: prometheus.ExponentialBuckets(0.001, 2, 18), // 1 ms to 131 s
	}, []string{"phase"})
	for _, p := range phases {
		m.phases.WithLabelValues(p)
	}
	epoch := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "walship_epoch",
		Help: "The epoch a data node is in: the primary's own, or the newest a replica has promised.",
	}, func() float64 { return float64(n.epoch()) })
	held := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "walship_election_held",
		Help: "1 while this data node holds the automatic failover's election (the Kubernetes Lease, --kube-lease); a primary takes writes only then. 0 otherwise, and without automatic failover.",
	}, func() float64 {
		if n.cfg.Election != nil && n.cfg.Election.Held() {
			return 1
		}
		return 0
	})
	m.collectors = []prometheus.Collector{m.role, m.promotions, m.stepDowns, m.phases, epoch, held}
	if ev, ok := n.cfg.Election.(ElectionViewer); ok {
		view := func(f func(v logelect.View) bool) func() float64 {
			return func() float64 {
				if f(ev.LastView()) {
					return 1
				}
				return 0
			}
		}
		m.collectors = append(m.collectors,
			prometheus.NewGaugeFunc(prometheus.GaugeOpts{
				Name: "walship_election_primary_alive",
				Help: "1 while, as this data node last saw, so many log stores hear the election's holder renew it that no other node can win it (--auto-failover).",
			}, view(func(v logelect.View) bool { return v.Alive })),
			prometheus.NewGaugeFunc(prometheus.GaugeOpts{
				Name: "walship_election_paused",
				Help: "1 while automatic failover is paused (walship ctl failover pause), as this data node last saw the log stores (--auto-failover).",
			}, view(func(v logelect.View) bool { return v.Paused })),
			prometheus.NewGaugeFunc(prometheus.GaugeOpts{
				Name: "walship_election_term",
				Help: "The newest election term this data node saw at the log stores: it grows by one or more at every election won (--auto-failover).",
			}, func() float64 { return float64(ev.LastView().Term) }),
			prometheus.NewGaugeFunc(prometheus.GaugeOpts{
				Name: "walship_election_contending",
				Help: "1 while this replica may contend for the election (it is eligible: the holder is dead at the log stores, failover is not paused, the dry run finds a quorum...); Status says why not (--auto-failover).",
			}, func() float64 {
				n.mu.Lock()
				defer n.mu.Unlock()
				if n.role == RoleReplica && n.notEligible == "" && n.seenEpoch != 0 {
					return 1
				}
				return 0
			}),
		)
	}
	if reg != nil {
		for _, c := range m.collectors {
			reg.MustRegister(c)
		}
	}
	return m
}

func (m *metrics) setRole(r Role) {
	for _, x := range []Role{RolePrimary, RoleReplica} {
		v := 0.0
		if x == r {
			v = 1
		}
		m.role.WithLabelValues(x.String()).Set(v)
	}
}

// phase observes that a promotion's phase took since start.
func (m *metrics) phase(name string, start time.Time) {
	m.phases.WithLabelValues(name).Observe(time.Since(start).Seconds())
}

func (m *metrics) unregister() {
	if m.reg == nil {
		return
	}
	for _, c := range m.collectors {
		m.reg.Unregister(c)
	}
}
