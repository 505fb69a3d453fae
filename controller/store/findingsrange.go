package store

import (
	"context"
	"time"

	"github.com/fleetrepair/fleetrepair/agent/finding"
	"github.com/jackc/pgx/v5"
)

// sqlFindingsForNodeRange pages forward through a node's findings: the
// oldest first in [since, until), ordered as sqlFindingsForNode.
const sqlFindingsForNodeRange = `
SELECT ` + findingCols + ` FROM findings
WHERE cluster = $1 AND node = $2 AND COALESCE(observed_at, received_at) >= $3 AND COALESCE(observed_at, received_at) < $4
ORDER BY COALESCE(observed_at, received_at), id
LIMIT $5`

// FindingsForNodeRange returns the oldest limit findings of a node that
// happened in [since, until), oldest first, ordered as FindingsForNode
// (by the time the fault happened, an untimed finding by when it was
// received). It is for reading a range forward page by page (the shadow
// report), where FindingsForNode gives the newest. limit <= 0 means
// MaxFindingsLimit.
func (s *Store) FindingsForNodeRange(ctx context.Context, cluster, node string, since, until time.Time, limit int) ([]finding.Finding, error) {
	if limit <= 0 || limit > MaxFindingsLimit {
		limit = MaxFindingsLimit
	}
	rows, err := s.pool.Query(ctx, sqlFindingsForNodeRange, cluster, node, since, until, limit)
	if err != nil {
		return nil, errorf(err, "query findings of %s/%s", cluster, node)
	}
	out, err := pgx.CollectRows(rows, scanFinding)
	if err != nil {
		return nil, errorf(err, "read findings of %s/%s", cluster, node)
	}
	return out, nil
}
