package store

import (
	"context"
	"time"

	"github.com/fleetrepair/fleetrepair/agent/finding"
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
	return s.queryFindings(ctx, "findings of "+cluster+"/"+node, sqlFindingsForNodeRange, cluster, node, since, until, limit)
}
