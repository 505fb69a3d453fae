package store

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/fleetrepair/fleetrepair/agent/finding"
)

// sqlFindingsForNodeRange pages forward through a node's findings: the
// oldest first in [since, until), ordered as sqlFindingsForNode.
const sqlFindingsForNodeRange = `
SELECT ` + findingCols + `, received_at FROM findings
WHERE cluster = $1 AND node = $2 AND COALESCE(observed_at, received_at) >= $3 AND COALESCE(observed_at, received_at) < $4
ORDER BY COALESCE(observed_at, received_at), id
LIMIT $5`

// ReceivedFinding is a stored finding with the time the controller
// received it (the report's ingest time, UTC): when the live controller
// first saw it and reconciled its node.
type ReceivedFinding struct {
	finding.Finding
	Received time.Time
}

// FindingsForNodeRange returns the oldest limit findings of a node that
// happened in [since, until), oldest first, ordered as FindingsForNode
// (by the time the fault happened, an untimed finding by when it was
// received), each with its receipt time. It is for reading a range forward
// page by page (the shadow report, which delivers each finding when the
// controller received it), where FindingsForNode gives the newest.
// limit <= 0 means MaxFindingsLimit. Errors are wrapped "read findings of
// cluster/node".
func (s *Store) FindingsForNodeRange(ctx context.Context, cluster, node string, since, until time.Time, limit int) ([]ReceivedFinding, error) {
	if limit <= 0 || limit > MaxFindingsLimit {
		limit = MaxFindingsLimit
	}
	rows, _ := s.pool.Query(ctx, sqlFindingsForNodeRange, cluster, node, since, until, limit)
	out, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (ReceivedFinding, error) {
		var rf ReceivedFinding
		var err error
		rf.Finding, err = scanFindingWith(row, &rf.Received)
		rf.Received = rf.Received.UTC()
		return rf, err
	})
	if err != nil {
		return nil, errorf(err, "read findings of %s/%s", cluster, node)
	}
	return out, nil
}
