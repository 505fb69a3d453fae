package store

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"

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
FROM nodes WHERE last_seen IS NOT NULL
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
// [silentSince, reportingSince) (Silent). Nodes never heard from, and nodes
// silent since before silentSince (deleted nodes stay in the table), are in
// neither count. A cluster with no node in either is absent.
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
