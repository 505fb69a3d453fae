package store

import (
	"context"
	"time"
)

// sqlCountFindings counts, up to a cap, the findings of the clusters (all
// when the list is empty) that happened in [from, until), by the same time
// FindingsForNode orders and filters by. The LIMIT stops the scan at the cap,
// so a caller bounding its work pays for at most cap+1 rows.
const sqlCountFindings = `
SELECT count(*) FROM (
    SELECT 1 FROM findings
    WHERE (cardinality($1::text[]) = 0 OR cluster = ANY($1::text[]))
      AND COALESCE(observed_at, received_at) >= $2 AND COALESCE(observed_at, received_at) < $3
    LIMIT $4) capped`

// CountFindings returns how many findings of clusters (nil: every cluster)
// happened in [from, until), counting at most upTo+1: a result above upTo
// means "more than upTo". It reads no finding's data, so a caller can check
// the cost of a request (the shadow report) before loading anything.
func (s *Store) CountFindings(ctx context.Context, clusters []string, from, until time.Time, upTo int) (int, error) {
	if upTo < 0 {
		return 0, invalidf("count findings: upTo %d must be >= 0", upTo)
	}
	if clusters == nil {
		clusters = []string{}
	}
	var n int
	if err := s.pool.QueryRow(ctx, sqlCountFindings, clusters, from.UTC(), until.UTC(), upTo+1).Scan(&n); err != nil {
		return 0, errorf(err, "count findings")
	}
	return n, nil
}
