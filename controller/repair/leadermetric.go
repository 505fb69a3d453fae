package repair

import "github.com/prometheus/client_golang/prometheus"

// leaderCollector exports fleetrepair_cluster_leader{cluster}: 1 when this
// replica leads the cluster (holds its Lease, or leader election is off),
// else 0, for every cluster the reconciler serves, read from Clusters at
// each scrape (clusters added or dropped at run time appear and vanish with
// it). Summed over replicas it is the cluster's leader count: 0 for long is
// the FleetRepairNoLeader alert (deploy/chart/templates/_alerts.tpl), a
// cluster nobody repairs.
type leaderCollector struct {
	r    *Reconciler
	desc *prometheus.Desc
}

func newLeaderCollector(r *Reconciler) *leaderCollector {
	return &leaderCollector{r: r, desc: prometheus.NewDesc("fleetrepair_cluster_leader",
		"1 when this replica leads the cluster (holds its Lease, or leader election is off), else 0.", []string{"cluster"}, nil)}
}

func (c *leaderCollector) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc }

func (c *leaderCollector) Collect(ch chan<- prometheus.Metric) {
	for _, st := range c.r.Clusters() {
		v := 1.0
		if st.Leading != nil && !*st.Leading {
			v = 0
		}
		ch <- prometheus.MustNewConstMetric(c.desc, prometheus.GaugeValue, v, st.Name)
	}
}
