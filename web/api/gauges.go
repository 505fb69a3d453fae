package api

import (
	"context"
	"encoding/json"
	"fmt"
	"runtime/debug"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/fleetrepair/fleetrepair/controller/breaker"
)

// AgentSilentWindow bounds the silent agents of fleetrepair_agents_silent:
// a node that last reported more than StaleAfter ago but within this window.
// Nodes whose Kubernetes Node the controller saw deleted are not counted
// (store.Node.Removed); a deletion it missed stops counting after this
// window.
const AgentSilentWindow = time.Hour

// gauges is the collector of the state gauges on-call alerts on, read from
// the store at every scrape, so every replica answers the same whether or
// not it leads (docs/runbooks/ explains each alert built on them):
//
//	fleetrepair_repairs{cluster,state,held_by}    open repairs (held_by: breaker, action or "")
//	fleetrepair_breaker_open{cohort}             1 per open breaker ("fleet" for the ceiling)
//	fleetrepair_kill_switch                      1 while the kill switch is on
//	fleetrepair_agents_reporting{cluster}        agents that reported within StaleAfter
//	fleetrepair_agents_silent{cluster}           agents silent for StaleAfter .. AgentSilentWindow
//	fleetrepair_deletion_budget_remaining{cluster,nodepool,budget}
//	                                             deletions a budget still allows now (nodepool "" for the cluster's)
//	fleetrepair_metrics_store_up                 0 when the store could not be read for this scrape
//	fleetrepair_build_info{version,goversion}    1
//
// A failed store read leaves the state gauges out of the scrape (absent, not
// zero: a zero would resolve alerts) and sets fleetrepair_metrics_store_up 0.
type gauges struct {
	s *server

	repairs, breakerOpen, killSwitch, reporting, silent, storeUp, buildInfo, budgetLeft *prometheus.Desc
	version, goVersion                                                                  string
}

func newGauges(s *server) *gauges {
	g := &gauges{s: s,
		repairs: prometheus.NewDesc("fleetrepair_repairs", "Open repairs by cluster, state and what holds them (held_by: breaker, action, or empty).",
			[]string{"cluster", "state", "held_by"}, nil),
		breakerOpen: prometheus.NewDesc("fleetrepair_breaker_open", "1 for each open breaker, by cohort (key=value, or fleet for the fleet ceiling).",
			[]string{"cohort"}, nil),
		killSwitch: prometheus.NewDesc("fleetrepair_kill_switch", "1 while the kill switch stops every repair.", nil, nil),
		reporting: prometheus.NewDesc("fleetrepair_agents_reporting", "Agents whose last report is within the stale bound (the API's StaleAfter), by cluster.",
			[]string{"cluster"}, nil),
		silent: prometheus.NewDesc("fleetrepair_agents_silent", "Agents silent for longer than the stale bound but heard from within the last hour, by cluster.",
			[]string{"cluster"}, nil),
		budgetLeft: prometheus.NewDesc("fleetrepair_deletion_budget_remaining",
			"NodeClaim deletions a budget still allows now: budget deletions_per_hour (per cluster, nodepool empty), "+
				"nodepool_deletions_per_hour and max_in_flight_per_nodepool (per NodePool); real repairs only, as the deletion guard counts them.",
			[]string{"cluster", "nodepool", "budget"}, nil),
		storeUp: prometheus.NewDesc("fleetrepair_metrics_store_up", "1 when this scrape could read the repair, breaker and agent state from PostgreSQL.", nil, nil),
		buildInfo: prometheus.NewDesc("fleetrepair_build_info", "The controller's build: module version and Go version.",
			[]string{"version", "goversion"}, nil),
		version: "devel", goVersion: "unknown",
	}
	if bi, ok := debug.ReadBuildInfo(); ok {
		g.goVersion = bi.GoVersion
		if bi.Main.Version != "" {
			g.version = bi.Main.Version
		}
	}
	return g
}

func (g *gauges) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{g.repairs, g.breakerOpen, g.killSwitch, g.reporting, g.silent, g.storeUp, g.buildInfo, g.budgetLeft} {
		ch <- d
	}
}

func (g *gauges) Collect(ch chan<- prometheus.Metric) {
	ch <- prometheus.MustNewConstMetric(g.buildInfo, prometheus.GaugeValue, 1, g.version, g.goVersion)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	ms, err := g.collect(ctx)
	if err != nil {
		g.s.cfg.Log.Warn("metrics: read state gauges", "err", err)
		ch <- prometheus.MustNewConstMetric(g.storeUp, prometheus.GaugeValue, 0)
		return
	}
	for _, m := range ms {
		ch <- m
	}
	ch <- prometheus.MustNewConstMetric(g.storeUp, prometheus.GaugeValue, 1)
}

// collect reads every state gauge, or none.
func (g *gauges) collect(ctx context.Context) ([]prometheus.Metric, error) {
	st := g.s.cfg.Store
	var ms []prometheus.Metric
	rcs, err := st.OpenRepairCounts(ctx)
	if err != nil {
		return nil, err
	}
	for _, c := range rcs {
		ms = append(ms, prometheus.MustNewConstMetric(g.repairs, prometheus.GaugeValue, float64(c.Count), c.Cluster, string(c.State), c.HeldBy))
	}
	doc, _, err := st.BreakerState(ctx)
	if err != nil {
		return nil, err
	}
	var bs breaker.State
	if doc != nil {
		if err := json.Unmarshal(doc, &bs); err != nil {
			return nil, fmt.Errorf("decode breaker state: %w", err)
		}
	}
	for cohort := range bs.Cohorts {
		ms = append(ms, prometheus.MustNewConstMetric(g.breakerOpen, prometheus.GaugeValue, 1, cohort))
	}
	if bs.Ceiling != nil {
		ms = append(ms, prometheus.MustNewConstMetric(g.breakerOpen, prometheus.GaugeValue, 1, breaker.FleetScope))
	}
	ms = append(ms, prometheus.MustNewConstMetric(g.killSwitch, prometheus.GaugeValue, boolGauge(bs.KillSwitch.On)))
	now := g.s.cfg.Now()
	acs, err := st.AgentCounts(ctx, now.Add(-g.s.staleAfter()), now.Add(-AgentSilentWindow))
	if err != nil {
		return nil, err
	}
	for _, c := range acs {
		ms = append(ms,
			prometheus.MustNewConstMetric(g.reporting, prometheus.GaugeValue, float64(c.Reporting), c.Cluster),
			prometheus.MustNewConstMetric(g.silent, prometheus.GaugeValue, float64(c.Silent), c.Cluster))
	}
	budgets, err := st.DeletionBudgets(ctx, now)
	if err != nil {
		return nil, err
	}
	for _, b := range budgets {
		ms = append(ms, prometheus.MustNewConstMetric(g.budgetLeft, prometheus.GaugeValue, float64(b.Remaining), b.Cluster, b.NodePool, b.Budget))
	}
	return ms, nil
}

func boolGauge(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

// staleAfter is Config.StaleAfter or its default, 90s (as health.go reads it).
func (s *server) staleAfter() time.Duration {
	if s.cfg.StaleAfter > 0 {
		return s.cfg.StaleAfter
	}
	return 90 * time.Second
}
