package store

import (
	"context"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// NodeFilter selects nodes for NodePage; zero fields do not filter.
type NodeFilter struct {
	Cluster, NodePool, Zone string
	// Search keeps nodes whose name contains it (case-insensitive).
	Search string
	// Health keeps nodes by the stored part of their health: "failing" (an
	// active condition-severity diagnosis), "silent" (no report since
	// StaleBefore, or never), "attention" (either), "ok" (neither).
	Health string
	// StaleBefore is the silence cutoff of Health: an agent whose last
	// report is older is silent. Required with Health.
	StaleBefore time.Time
	// After continues a listing: only nodes after (cluster, name), the
	// NextCluster/NextName of the previous page.
	AfterCluster, AfterName string
	// Limit is the page size: <= 0 means DefaultListLimit, at most MaxListLimit.
	Limit int
	// IncludeRemoved keeps the nodes whose Kubernetes Node is gone
	// (Node.Removed); by default they are left out.
	IncludeRemoved bool
}

// Node health filters of NodeFilter.Health.
const (
	NodeHealthFailing   = "failing"
	NodeHealthSilent    = "silent"
	NodeHealthAttention = "attention"
	NodeHealthOK        = "ok"
)

// NodeRow is a node with the active condition-severity diagnosis that makes
// it failing (ActiveReason, "" when none) and its open repair (0 when none).
type NodeRow struct {
	Node
	ActiveReason string
	OpenRepairID int64
	OpenRepair   string // state of the open repair, "" when none
}

const sqlNodeActive = `
(SELECT d.reason FROM diagnoses d WHERE d.cluster = n.cluster AND d.node = n.name AND d.active
   AND d.severity = 'condition' ORDER BY d.first_seen LIMIT 1)`

// NodePage returns one page of the nodes matching f, by cluster and name, and
// whether a next page exists (continue with the last row's cluster and name).
// Pagination is by keyset on (cluster, name). An unknown Health is ErrInvalid.
func (s *Store) NodePage(ctx context.Context, f NodeFilter) (rows []NodeRow, more bool, err error) {
	limit := f.Limit
	if limit <= 0 {
		limit = DefaultListLimit
	}
	limit = min(limit, MaxListLimit)
	var (
		where []string
		args  []any
	)
	add := func(cond string, vs ...any) {
		for _, v := range vs {
			args = append(args, v)
			cond = strings.Replace(cond, "?", "$"+strconv.Itoa(len(args)), 1)
		}
		where = append(where, cond)
	}
	if f.Cluster != "" {
		add("n.cluster = ?", f.Cluster)
	}
	if !f.IncludeRemoved {
		add(sqlNodeLive)
	}
	if f.NodePool != "" {
		add("n.nodepool = ?", f.NodePool)
	}
	if f.Zone != "" {
		add("n.zone = ?", f.Zone)
	}
	if f.Search != "" {
		add("strpos(lower(n.name), lower(?)) > 0", f.Search)
	}
	failing := "EXISTS (SELECT 1 FROM diagnoses d WHERE d.cluster = n.cluster AND d.node = n.name AND d.active AND d.severity = 'condition')"
	switch f.Health {
	case "":
	case NodeHealthFailing:
		add(failing)
	case NodeHealthSilent:
		add("(n.last_seen IS NULL OR n.last_seen < ?)", f.StaleBefore)
	case NodeHealthAttention:
		add("(n.last_seen IS NULL OR n.last_seen < ? OR "+failing+")", f.StaleBefore)
	case NodeHealthOK:
		add("(n.last_seen >= ? AND NOT "+failing+")", f.StaleBefore)
	default:
		return nil, false, invalidf("list nodes: health %q is not failing, silent, attention or ok", f.Health)
	}
	if f.AfterCluster != "" || f.AfterName != "" {
		add("(n.cluster, n.name) > (?, ?)", f.AfterCluster, f.AfterName)
	}
	q := "SELECT " + prefixed("n.", nodeCols) + ", COALESCE(" + sqlNodeActive + ", ''), " +
		"COALESCE(r.id, 0), COALESCE(r.state, '') FROM nodes n " +
		"LEFT JOIN repairs r ON r.cluster = n.cluster AND r.node = n.name AND r.closed_at IS NULL"
	if len(where) > 0 {
		q += " WHERE " + strings.Join(where, " AND ")
	}
	args = append(args, limit+1)
	q += " ORDER BY n.cluster, n.name LIMIT $" + strconv.Itoa(len(args))
	pr, _ := s.pool.Query(ctx, q, args...)
	rows, err = pgx.CollectRows(pr, func(row pgx.CollectableRow) (NodeRow, error) {
		var nr NodeRow
		n, err := scanNodeWith(row, &nr.ActiveReason, &nr.OpenRepairID, &nr.OpenRepair)
		nr.Node = n
		return nr, err
	})
	if err != nil {
		return nil, false, errorf(err, "list nodes")
	}
	if len(rows) > limit {
		return rows[:limit], true, nil
	}
	return rows, false, nil
}

func prefixed(p, cols string) string {
	parts := strings.Split(cols, ",")
	for i, c := range parts {
		parts[i] = p + strings.TrimSpace(c)
	}
	return strings.Join(parts, ", ")
}

// NodePoolSummary counts one NodePool's nodes by stored health: Failing have
// an active condition-severity diagnosis, Silent sent no report since the
// cutoff (and are not failing), the rest are OK. NodePool "" holds nodes
// whose NodePool is unknown.
type NodePoolSummary struct {
	Cluster, NodePool    string
	Nodes                int
	Failing, Silent, OK  int
	Deleting, Held, Open int // open repairs: in state deleting, awaiting_approval, any open state
}

const sqlFleetSummary = `
WITH f AS (
  SELECT n.cluster, n.nodepool,
         EXISTS (SELECT 1 FROM diagnoses d WHERE d.cluster = n.cluster AND d.node = n.name AND d.active AND d.severity = 'condition') AS failing,
         (n.last_seen IS NULL OR n.last_seen < $1) AS silent
  FROM nodes n WHERE ` + sqlNodeLive + `
), r AS (
  SELECT cluster, nodepool, count(*) FILTER (WHERE state = 'deleting') AS deleting,
         count(*) FILTER (WHERE state = 'awaiting_approval') AS held, count(*) AS open
  FROM repairs WHERE closed_at IS NULL GROUP BY cluster, nodepool
), g AS (
  SELECT cluster, nodepool, count(*) AS nodes, count(*) FILTER (WHERE failing) AS failing,
         count(*) FILTER (WHERE silent AND NOT failing) AS silent, count(*) FILTER (WHERE NOT silent AND NOT failing) AS ok
  FROM f GROUP BY cluster, nodepool
)
SELECT COALESCE(g.cluster, r.cluster), COALESCE(g.nodepool, r.nodepool), COALESCE(g.nodes, 0), COALESCE(g.failing, 0),
       COALESCE(g.silent, 0), COALESCE(g.ok, 0), COALESCE(r.deleting, 0), COALESCE(r.held, 0), COALESCE(r.open, 0)
FROM g FULL JOIN r ON r.cluster = g.cluster AND r.nodepool = g.nodepool
ORDER BY 1, 2`

// FleetSummary returns every NodePool's node counts by health (agents silent
// since before staleBefore count as silent) and open repairs, by cluster and
// NodePool. Removed nodes (Node.Removed) are not counted.
func (s *Store) FleetSummary(ctx context.Context, staleBefore time.Time) ([]NodePoolSummary, error) {
	rows, _ := s.pool.Query(ctx, sqlFleetSummary, staleBefore)
	out, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (NodePoolSummary, error) {
		var p NodePoolSummary
		err := row.Scan(&p.Cluster, &p.NodePool, &p.Nodes, &p.Failing, &p.Silent, &p.OK, &p.Deleting, &p.Held, &p.Open)
		return p, err
	})
	if err != nil {
		return nil, errorf(err, "summarize fleet")
	}
	return out, nil
}

// BudgetUsage is a cluster's deletion budget for the sliding hour ending at
// the time asked: the limits of its cluster row and how much of them the
// live (not dry-run) repairs have spent, counted from the audit like
// BeginDeletion counts them.
type BudgetUsage struct {
	Cluster                  string
	DeletionsPerHour         int
	DeletionsLastHour        int
	NodePoolDeletionsPerHour int
	MaxInFlightPerNodePool   int
}

// Left is how many more deletions the cluster may start this hour (never negative).
func (b BudgetUsage) Left() int { return max(0, b.DeletionsPerHour-b.DeletionsLastHour) }

// Counted per cluster in one join driven by the partial index on deleting
// audit entries: no correlated subquery, so a planner without statistics
// (fresh tables) cannot turn it into a quadratic join filter.
const sqlBudgetUsage = `
WITH spent AS (
  SELECT r.cluster, count(DISTINCT r.id) AS n
  FROM repair_audit a JOIN repairs r ON r.id = a.repair_id
  WHERE a.to_state = 'deleting' AND a.at > $1 AND NOT r.dry_run
  GROUP BY r.cluster
)
SELECT c.name, c.deletions_per_hour, c.nodepool_deletions_per_hour, c.max_in_flight_per_nodepool, COALESCE(s.n, 0)
FROM clusters c LEFT JOIN spent s ON s.cluster = c.name ORDER BY c.name`

// BudgetUsages returns every cluster's deletion budget for the hour before now.
func (s *Store) BudgetUsages(ctx context.Context, now time.Time) ([]BudgetUsage, error) {
	rows, _ := s.pool.Query(ctx, sqlBudgetUsage, now.Add(-time.Hour))
	out, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (BudgetUsage, error) {
		var b BudgetUsage
		err := row.Scan(&b.Cluster, &b.DeletionsPerHour, &b.NodePoolDeletionsPerHour, &b.MaxInFlightPerNodePool, &b.DeletionsLastHour)
		return b, err
	})
	if err != nil {
		return nil, errorf(err, "read deletion budgets")
	}
	return out, nil
}

// HeldSince returns when each of the repairs last entered awaiting_approval,
// from the audit; repairs that never did are absent.
func (s *Store) HeldSince(ctx context.Context, ids []int64) (map[int64]time.Time, error) {
	rows, _ := s.pool.Query(ctx, `SELECT repair_id, max(at) FROM repair_audit
WHERE repair_id = ANY ($1) AND to_state = 'awaiting_approval' GROUP BY repair_id`, ids)
	out := map[int64]time.Time{}
	var (
		id int64
		at time.Time
	)
	_, err := pgx.ForEachRow(rows, []any{&id, &at}, func() error { out[id] = at.UTC(); return nil })
	if err != nil {
		return nil, errorf(err, "read when repairs were held")
	}
	return out, nil
}

// ReasonStats is one reason's repairs over a range of days: how many opened
// each day, and for those replaced, the time from opening (the first
// condition diagnosis's repair) to the replacement Ready (the last audit
// entry into replaced), p50 and p90 in seconds.
type ReasonStats struct {
	Reason   string
	PerDay   []int // index 0 is the first day of the range
	Replaced int
	P50, P90 float64
}

// RepairStats returns per reason the repairs opened in the days days ending
// with now's day (UTC), by reason.
func (s *Store) RepairStats(ctx context.Context, days int, now time.Time) ([]ReasonStats, error) {
	if days < 1 || days > 366 {
		return nil, invalidf("repair stats: days must be 1..366, got %d", days)
	}
	first := now.UTC().Truncate(24*time.Hour).AddDate(0, 0, -(days - 1))
	byReason := map[string]*ReasonStats{}
	var order []string
	get := func(reason string) *ReasonStats {
		if r, ok := byReason[reason]; ok {
			return r
		}
		r := &ReasonStats{Reason: reason, PerDay: make([]int, days)}
		byReason[reason] = r
		order = append(order, reason)
		return r
	}
	rows, _ := s.pool.Query(ctx, `SELECT reason, floor(extract(epoch FROM created_at - $1) / 86400)::int, count(*)
FROM repairs WHERE created_at >= $1 GROUP BY 1, 2 ORDER BY 1, 2`, first)
	var (
		reason string
		day, n int
	)
	if _, err := pgx.ForEachRow(rows, []any{&reason, &day, &n}, func() error {
		if day >= 0 && day < days {
			get(reason).PerDay[day] = n
		}
		return nil
	}); err != nil {
		return nil, errorf(err, "count repairs per day")
	}
	rows, _ = s.pool.Query(ctx, `
WITH ready AS (
  SELECT r.reason, extract(epoch FROM max(a.at) - r.created_at) AS secs
  FROM repairs r JOIN repair_audit a ON a.repair_id = r.id AND a.to_state = 'replaced'
  WHERE r.created_at >= $1 GROUP BY r.id, r.reason, r.created_at
)
SELECT reason, count(*), percentile_cont(0.5) WITHIN GROUP (ORDER BY secs), percentile_cont(0.9) WITHIN GROUP (ORDER BY secs)
FROM ready GROUP BY reason ORDER BY reason`, first)
	var (
		replaced int
		p50, p90 float64
	)
	if _, err := pgx.ForEachRow(rows, []any{&reason, &replaced, &p50, &p90}, func() error {
		r := get(reason)
		r.Replaced, r.P50, r.P90 = replaced, p50, p90
		return nil
	}); err != nil {
		return nil, errorf(err, "time repairs to replacement")
	}
	slices.Sort(order)
	out := make([]ReasonStats, 0, len(order))
	for _, r := range order {
		out = append(out, *byReason[r])
	}
	return out, nil
}

// TripStats is one breaker scope's trips (decisions into the open phase,
// breaker_decisions.to_phase = 'open') per day of a range: Scope is the
// decision's scope ("cohort", "fleet", "kill-switch", ...) and, for a cohort,
// its key ("cohort zone"), so a chart draws one series per kind of breaker.
type TripStats struct {
	Scope  string
	PerDay []int // index 0 is the first day of the range
}

// BreakerTripStats returns the breaker trips of the days days ending with
// now's day (UTC), one TripStats per scope, by scope.
func (s *Store) BreakerTripStats(ctx context.Context, days int, now time.Time) ([]TripStats, error) {
	if days < 1 || days > 366 {
		return nil, invalidf("breaker trip stats: days must be 1..366, got %d", days)
	}
	first := now.UTC().Truncate(24*time.Hour).AddDate(0, 0, -(days - 1))
	rows, _ := s.pool.Query(ctx, `
SELECT CASE WHEN cohort LIKE '%=%' THEN scope || ' ' || split_part(cohort, '=', 1) ELSE scope END,
       floor(extract(epoch FROM at - $1) / 86400)::int, count(*)
FROM breaker_decisions WHERE at >= $1 AND to_phase = 'open' GROUP BY 1, 2 ORDER BY 1, 2`, first)
	var (
		out   []TripStats
		scope string
		day   int
		n     int
	)
	if _, err := pgx.ForEachRow(rows, []any{&scope, &day, &n}, func() error {
		if len(out) == 0 || out[len(out)-1].Scope != scope {
			out = append(out, TripStats{Scope: scope, PerDay: make([]int, days)})
		}
		if day >= 0 && day < days {
			out[len(out)-1].PerDay[day] = n
		}
		return nil
	}); err != nil {
		return nil, errorf(err, "count breaker trips per day")
	}
	return out, nil
}
