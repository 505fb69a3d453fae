package store

import (
	"context"

	"github.com/jackc/pgx/v5"
)

// sqlListNodeVersions is sqlListNodes reduced to what a breaker
// evaluation reads of the agents' rows.
const sqlListNodeVersions = `SELECT cluster, name, driver_version, kernel_version FROM nodes ORDER BY cluster, name`

// ListNodeVersions returns every stored node of every cluster, by cluster
// and name, with only Cluster, Name, DriverVersion and KernelVersion set:
// the agent's facts the cohort breakers group by (controller/repair
// breakerNode). It is ListNodes(ctx, "") without the heartbeat document and
// the other columns, which a breaker evaluation of every node, run every
// second in a zone wave, would otherwise read and decode for nothing.
func (s *Store) ListNodeVersions(ctx context.Context) ([]Node, error) {
	rows, _ := s.pool.Query(ctx, sqlListNodeVersions)
	ns, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (Node, error) {
		var n Node
		err := row.Scan(&n.Cluster, &n.Name, &n.DriverVersion, &n.KernelVersion)
		return n, err
	})
	if err != nil {
		return nil, errorf(err, "list node versions")
	}
	return ns, nil
}
