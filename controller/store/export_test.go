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
