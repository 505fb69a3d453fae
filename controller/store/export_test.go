package store

import "github.com/jackc/pgx/v5/pgxpool"

// Pool exposes the connection pool to the tests, for checks on the schema
// itself (catalog queries, forbidden updates).
func (s *Store) Pool() *pgxpool.Pool { return s.pool }

// SQL of the history queries, for the EXPLAIN plans BenchmarkHistory logs.
const (
	SQLFindingsForNode = sqlFindingsForNode
	SQLRepairFindings  = sqlRepairFindings
	RepairCols         = repairCols
	SQLRepairAudit     = sqlRepairAudit
)

// GroupStats returns how many group transactions committed and how many
// reports they held (groupcommit.go).
func GroupStats(s *Store) (groups, reports int64) {
	return s.groups.committed.Load(), s.groups.reports.Load()
}
