package api_test

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/fleetrepair/fleetrepair/agent/finding"
	"github.com/fleetrepair/fleetrepair/controller/breaker"
	"github.com/fleetrepair/fleetrepair/controller/catalog"
	"github.com/fleetrepair/fleetrepair/controller/ledger"
	"github.com/fleetrepair/fleetrepair/controller/store"
	"github.com/fleetrepair/fleetrepair/test/pgtest"
	"github.com/fleetrepair/fleetrepair/web/api"
)

// TestStateGauges checks the gauges the alert rules of deploy/chart read:
// open repairs by state and held_by, open breakers, the kill switch and
// agents reporting or silent, all from the store at scrape time.
func TestStateGauges(t *testing.T) {
	ctx := context.Background()
	st := pgtest.Store(t)
	now := time.Date(2026, 12, 1, 9, 0, 0, 0, time.UTC)
	reg := prometheus.NewRegistry()
	if _, err := api.Handler(api.Config{Store: st, Catalog: catalog.Default(), Clusters: []string{"c1", "c2"},
		Registerer: reg, Gatherer: reg, Now: func() time.Time { return now },
		Log: slog.New(slog.NewTextHandler(io.Discard, nil))}); err != nil {
		t.Fatal(err)
	}
	names := []string{"fleetrepair_repairs", "fleetrepair_breaker_open", "fleetrepair_kill_switch",
		"fleetrepair_agents_reporting", "fleetrepair_agents_silent", "fleetrepair_metrics_store_up"}

	// An empty store: the kill switch is off, the store is up, nothing else.
	if err := testutil.GatherAndCompare(reg, strings.NewReader(`
# HELP fleetrepair_kill_switch 1 while the kill switch stops every repair.
# TYPE fleetrepair_kill_switch gauge
fleetrepair_kill_switch 0
# HELP fleetrepair_metrics_store_up 1 when this scrape could read the repair, breaker and agent state from PostgreSQL.
# TYPE fleetrepair_metrics_store_up gauge
fleetrepair_metrics_store_up 1
`), names...); err != nil {
		t.Fatal(err)
	}

	// Agents: n1 reported 30s ago, n2 10 minutes ago, n3 two hours ago
	// (a deleted node: in neither count); c2's only agent is silent.
	for _, a := range []struct {
		cluster, node string
		ago           time.Duration
	}{{"c1", "n1", 30 * time.Second}, {"c1", "n2", 10 * time.Minute}, {"c1", "n3", 2 * time.Hour}, {"c2", "m1", 5 * time.Minute}} {
		r := finding.Report{SchemaVersion: finding.SchemaVersion, Cluster: a.cluster, Node: a.node, BootID: "b1", SentAt: now.Add(-a.ago)}
		if _, err := st.IngestReport(ctx, r, now.Add(-a.ago)); err != nil {
			t.Fatal(err)
		}
	}
	// Repairs: two held by a breaker, one waiting for an approval of its
	// action, one tolerating, one closed (not counted).
	open := func(node string, state ledger.State, heldBy string) store.Repair {
		t.Helper()
		r := store.Repair{Cluster: "c1", Node: node, Reason: "GPUFallenOffBus", State: state}
		if heldBy != "" {
			r.Detail = map[string]any{"held_by": heldBy}
		}
		got, _, err := st.OpenRepair(ctx, r, "controller", "test", now)
		if err != nil {
			t.Fatal(err)
		}
		return got
	}
	open("h1", ledger.AwaitingApproval, "breaker")
	open("h2", ledger.AwaitingApproval, "breaker")
	open("h3", ledger.AwaitingApproval, "action")
	open("t1", ledger.Tolerating, "")
	closed := open("x1", ledger.Tolerating, "")
	if _, err := st.Transition(ctx, store.TransitionRequest{ID: closed.ID, From: ledger.Tolerating, To: ledger.Resolved, Actor: "controller", Reason: "test"}, now); err != nil {
		t.Fatal(err)
	}
	doc, _ := json.Marshal(breaker.State{Cohorts: map[string]breaker.Breaker{"zone=us-east-1a": {Cohort: "zone=us-east-1a"}},
		Ceiling: &breaker.Breaker{Cohort: breaker.FleetScope}, KillSwitch: breaker.KillSwitch{On: true, Actor: "alice", Reason: "test"}})
	if err := st.SaveBreakerState(ctx, doc, 0, nil, now); err != nil {
		t.Fatal(err)
	}
	if err := testutil.GatherAndCompare(reg, strings.NewReader(`
# HELP fleetrepair_agents_reporting Agents whose last report is within the stale bound (the API's StaleAfter), by cluster.
# TYPE fleetrepair_agents_reporting gauge
fleetrepair_agents_reporting{cluster="c1"} 1
fleetrepair_agents_reporting{cluster="c2"} 0
# HELP fleetrepair_agents_silent Agents silent for longer than the stale bound but heard from within the last hour, by cluster.
# TYPE fleetrepair_agents_silent gauge
fleetrepair_agents_silent{cluster="c1"} 1
fleetrepair_agents_silent{cluster="c2"} 1
# HELP fleetrepair_breaker_open 1 for each open breaker, by cohort (key=value, or fleet for the fleet ceiling).
# TYPE fleetrepair_breaker_open gauge
fleetrepair_breaker_open{cohort="fleet"} 1
fleetrepair_breaker_open{cohort="zone=us-east-1a"} 1
# HELP fleetrepair_kill_switch 1 while the kill switch stops every repair.
# TYPE fleetrepair_kill_switch gauge
fleetrepair_kill_switch 1
# HELP fleetrepair_metrics_store_up 1 when this scrape could read the repair, breaker and agent state from PostgreSQL.
# TYPE fleetrepair_metrics_store_up gauge
fleetrepair_metrics_store_up 1
# HELP fleetrepair_repairs Open repairs by cluster, state and what holds them (held_by: breaker, action, or empty).
# TYPE fleetrepair_repairs gauge
fleetrepair_repairs{cluster="c1",held_by="",state="tolerating"} 1
fleetrepair_repairs{cluster="c1",held_by="action",state="awaiting_approval"} 1
fleetrepair_repairs{cluster="c1",held_by="breaker",state="awaiting_approval"} 2
`), names...); err != nil {
		t.Fatal(err)
	}

	// Budgets left: every cluster's deletions per hour, and a NodePool's
	// budgets once one of its nodes is stored (the schema's defaults: 10 per
	// hour per cluster, 1 in flight and 5 per hour per NodePool).
	if _, err := st.ReadNode(ctx, store.Node{Cluster: "c2", Name: "m1", NodePool: "gpu"}, 1, now); err != nil {
		t.Fatal(err)
	}
	if err := testutil.GatherAndCompare(reg, strings.NewReader(`
# HELP fleetrepair_deletion_budget_remaining NodeClaim deletions a budget still allows now: budget deletions_per_hour (per cluster, nodepool empty), nodepool_deletions_per_hour and max_in_flight_per_nodepool (per NodePool); real repairs only, as the deletion guard counts them.
# TYPE fleetrepair_deletion_budget_remaining gauge
fleetrepair_deletion_budget_remaining{budget="deletions_per_hour",cluster="c1",nodepool=""} 10
fleetrepair_deletion_budget_remaining{budget="deletions_per_hour",cluster="c2",nodepool=""} 10
fleetrepair_deletion_budget_remaining{budget="max_in_flight_per_nodepool",cluster="c2",nodepool="gpu"} 1
fleetrepair_deletion_budget_remaining{budget="nodepool_deletions_per_hour",cluster="c2",nodepool="gpu"} 5
`), "fleetrepair_deletion_budget_remaining"); err != nil {
		t.Fatal(err)
	}

	// A store that cannot be read: the state gauges are absent (an alert on
	// them neither fires nor resolves) and fleetrepair_metrics_store_up is 0.
	st.Close()
	if err := testutil.GatherAndCompare(reg, strings.NewReader(`
# HELP fleetrepair_metrics_store_up 1 when this scrape could read the repair, breaker and agent state from PostgreSQL.
# TYPE fleetrepair_metrics_store_up gauge
fleetrepair_metrics_store_up 0
`), names...); err != nil {
		t.Fatal(err)
	}
}
