package store

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/fleetrepair/fleetrepair/controller/decide"
	"github.com/fleetrepair/fleetrepair/controller/ledger"
)

// RepairCount is the number of open repairs of one cluster in one state,
// split by why they are held (the detail's "held_by": "breaker" or "action";
// "" when nothing holds them).
type RepairCount struct {
	Cluster string
	State   ledger.State
	HeldBy  string
	Count   int
}

// AgentCount is the agents of one cluster by how recently they reported:
// Reporting reported at or after the reporting bound, Silent reported
// between the silent bound and the reporting bound, and has not since.
type AgentCount struct {
	Cluster   string
	Reporting int
	Silent    int
}

const (
	sqlOpenRepairCounts = `
SELECT cluster, state, COALESCE(detail->>'held_by', ''), count(*)
FROM repairs WHERE closed_at IS NULL
GROUP BY 1, 2, 3 ORDER BY 1, 2, 3`

	sqlAgentCounts = `
SELECT cluster,
       count(*) FILTER (WHERE last_seen >= $1),
       count(*) FILTER (WHERE last_seen < $1 AND last_seen >= $2)
FROM nodes n WHERE last_seen IS NOT NULL AND ` + sqlNodeLive + `
GROUP BY cluster ORDER BY cluster`
)

// OpenRepairCounts returns the open repairs counted by cluster, state and
// held_by, sorted; no row for a combination without repairs. It reads one
// aggregate (the open-repairs index), for /metrics at every scrape.
func (s *Store) OpenRepairCounts(ctx context.Context) ([]RepairCount, error) {
	rows, _ := s.pool.Query(ctx, sqlOpenRepairCounts)
	out, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (RepairCount, error) {
		var c RepairCount
		err := row.Scan(&c.Cluster, &c.State, &c.HeldBy, &c.Count)
		return c, err
	})
	if err != nil {
		return nil, errorf(err, "count open repairs")
	}
	return out, nil
}

// AgentCounts counts, per cluster, the nodes whose agent last reported at or
// after reportingSince (Reporting) and those whose last report lies in
// [silentSince, reportingSince) (Silent). Nodes never heard from, nodes
// whose Kubernetes Node is gone (Node.Removed), and nodes silent since
// before silentSince (a removal the controller missed), are in neither
// count. A cluster with no node in either is absent.
func (s *Store) AgentCounts(ctx context.Context, reportingSince, silentSince time.Time) ([]AgentCount, error) {
	rows, _ := s.pool.Query(ctx, sqlAgentCounts, reportingSince, silentSince)
	out, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (AgentCount, error) {
		var c AgentCount
		err := row.Scan(&c.Cluster, &c.Reporting, &c.Silent)
		return c, err
	})
	if err != nil {
		return nil, errorf(err, "count agents")
	}
	var kept []AgentCount
	for _, c := range out {
		if c.Reporting+c.Silent > 0 {
			kept = append(kept, c)
		}
	}
	return kept, nil
}

// BudgetRemaining is what is left of one deletion budget now, for the
// fleetrepair_deletion_budget_remaining gauge: Budget is one of the
// decide.Budget* names (deletions_per_hour per cluster, NodePool "";
// nodepool_deletions_per_hour and max_in_flight_per_nodepool per NodePool),
// Limit the configured budget, Used what BeginDeletion would count against
// it now (real repairs only: dry-run repairs have budgets of their own).
// Remaining is max(0, Limit-Used).
type BudgetRemaining struct {
	Cluster, NodePool, Budget string
	Limit, Used, Remaining    int
}

const sqlDeletionBudgets = `
WITH hour AS (
    SELECT r.cluster, r.nodepool,
           count(DISTINCT a.repair_id) AS any_entry,
           count(DISTINCT a.repair_id) FILTER (WHERE a.from_state IS DISTINCT FROM 'deleting') AS entered
    FROM repair_audit a JOIN repairs r ON r.id = a.repair_id
    WHERE a.to_state = 'deleting' AND a.at > $1 AND NOT r.dry_run
    GROUP BY 1, 2),
flight AS (
    SELECT cluster, nodepool, count(*) AS n FROM repairs WHERE state = 'deleting' AND NOT dry_run GROUP BY 1, 2),
pools AS (
    SELECT DISTINCT n.cluster, n.nodepool FROM nodes n WHERE n.nodepool <> '' AND ` + sqlNodeLive + `
    UNION SELECT cluster, nodepool FROM hour
    UNION SELECT cluster, nodepool FROM flight)
SELECT c.name, c.deletions_per_hour, c.max_in_flight_per_nodepool, c.nodepool_deletions_per_hour,
       COALESCE((SELECT sum(h.any_entry) FROM hour h WHERE h.cluster = c.name), 0)::int,
       COALESCE(p.nodepool, ''), p.nodepool IS NOT NULL,
       COALESCE(h.entered, 0)::int, COALESCE(f.n, 0)::int
FROM clusters c
LEFT JOIN pools p ON p.cluster = c.name
LEFT JOIN hour h ON h.cluster = c.name AND h.nodepool = p.nodepool
LEFT JOIN flight f ON f.cluster = c.name AND f.nodepool = p.nodepool
ORDER BY c.name, p.nodepool`

// DeletionBudgets returns what is left of every deletion budget at now:
// per cluster its deletions per hour, and per NodePool (those with a node
// not removed (Node.Removed), a deletion in the sliding hour or one in
// flight; a NodePool whose nodes are all removed and that used none of its
// budget in the hour is left out) its deletions per hour and deletions in
// flight,
// counted as BeginDeletion counts them (sorted by cluster, NodePool,
// budget). It reads one query, for /metrics at every scrape.
func (s *Store) DeletionBudgets(ctx context.Context, now time.Time) ([]BudgetRemaining, error) {
	rows, err := s.pool.Query(ctx, sqlDeletionBudgets, now.Add(-time.Hour))
	if err != nil {
		return nil, errorf(err, "read deletion budgets")
	}
	defer rows.Close()
	var out []BudgetRemaining
	seen := map[string]bool{}
	add := func(cluster, pool, budget string, limit, used int) {
		out = append(out, BudgetRemaining{Cluster: cluster, NodePool: pool, Budget: budget, Limit: limit, Used: used, Remaining: max(0, limit-used)})
	}
	for rows.Next() {
		var (
			cluster, pool                     string
			perHour, inFlightMax, poolPerHour int
			clusterUsed, poolUsed, inFlight   int
			hasPool                           bool
		)
		if err := rows.Scan(&cluster, &perHour, &inFlightMax, &poolPerHour, &clusterUsed, &pool, &hasPool, &poolUsed, &inFlight); err != nil {
			return nil, errorf(err, "read deletion budgets")
		}
		if !seen[cluster] {
			seen[cluster] = true
			add(cluster, "", decide.BudgetDeletionsPerHour, perHour, clusterUsed)
		}
		if hasPool {
			add(cluster, pool, decide.BudgetMaxInFlightPerNodePool, inFlightMax, inFlight)
			add(cluster, pool, decide.BudgetNodePoolDeletionsPerHour, poolPerHour, poolUsed)
		}
	}
	if err := rows.Err(); err != nil {
		return nil, errorf(err, "read deletion budgets")
	}
	return out, nil
}
