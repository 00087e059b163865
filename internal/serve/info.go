package serve

import "github.com/prometheus/client_golang/prometheus"

// infoCollector is walship_server_info: always 1, labelled with what an
// alert needs to name the process to an operator beside the metrics
// address Prometheus scrapes (its instance): the gRPC address the
// RUNBOOK's commands take, and the id it goes by.
type infoCollector struct {
	desc *prometheus.Desc
	id   string
	addr func() string
}

// NewInfo returns walship_server_info for a process of id ("" for a log
// store, which has none) serving gRPC at addr() (read at every scrape: a
// listener on port 0 learns its port late). A service registers it with
// its other metrics and unregisters it with them.
func NewInfo(id string, addr func() string) prometheus.Collector {
	return &infoCollector{
		desc: prometheus.NewDesc("walship_server_info",
			"Always 1: the process's id (a data node's; empty for a log store) and the gRPC address it is reached at (its advertised address, else its listener's), for alerts to name beside the metrics address.",
			[]string{"id", "grpc_address"}, nil),
		id:   id,
		addr: addr,
	}
}

func (c *infoCollector) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc }

func (c *infoCollector) Collect(ch chan<- prometheus.Metric) {
	ch <- prometheus.MustNewConstMetric(c.desc, prometheus.GaugeValue, 1, c.id, c.addr())
}
