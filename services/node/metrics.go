package node

import (
	"github.com/prometheus/client_golang/prometheus"
)

// metrics are the node's own: its role, promotions and step-downs. The
// roles' services register theirs on the same registry.
type metrics struct {
	reg        prometheus.Registerer
	collectors []prometheus.Collector

	role       *prometheus.GaugeVec
	promotions *prometheus.CounterVec
	stepDowns  prometheus.Counter
}

func newMetrics(reg prometheus.Registerer, n *Node) *metrics {
	m := &metrics{reg: reg}
	m.role = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "walship_node_role",
		Help: "1 for the data node's current role (primary or replica), 0 for the other.",
	}, []string{"role"})
	m.promotions = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "walship_promotions_total",
		Help: "Promotions this node attempted, by result: opened, refused (no quorum; nothing changed), failed (after fencing).",
	}, []string{"result"})
	m.stepDowns = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "walship_step_downs_total",
		Help: "Times this node stepped down from primary because a newer epoch exists, and rejoined as a replica.",
	})
	for _, r := range []string{"opened", "refused", "failed"} {
		m.promotions.WithLabelValues(r)
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
	m.collectors = []prometheus.Collector{m.role, m.promotions, m.stepDowns, epoch, held}
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

func (m *metrics) unregister() {
	if m.reg == nil {
		return
	}
	for _, c := range m.collectors {
		m.reg.Unregister(c)
	}
}
