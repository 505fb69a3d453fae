package store

import (
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fleetrepair/fleetrepair/agent/finding"
)

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

// SQL of the removed-node sweep, for the plans BenchmarkSweepRemovedNodes
// logs.
var (
	SQLSweepCandidates = sqlSweepCandidates
	SQLSweepMark       = sqlSweepMark
)

// GroupStats returns how many group transactions committed and how many
// reports they held (groupcommit.go).
func GroupStats(s *Store) (groups, reports int64) {
	return s.groups.committed.Load(), s.groups.reports.Load()
}

// WriteReportGroup writes reports of distinct nodes as one group, the way a
// group writer does (reportGroups.write: one transaction, or one per report
// when that fails), and returns each report's result and error. The
// reports' cluster must be known to the Store.
func WriteReportGroup(s *Store, rs []finding.Report, now time.Time) ([]IngestResult, []error) {
	out, errs := make([]IngestResult, len(rs)), make([]error, len(rs))
	group := make([]*nodeReport, len(rs))
	for i, r := range rs {
		nr, err := newNodeReport(r, now)
		if err != nil {
			panic(err)
		}
		nr.done, nr.key = make(chan nodeResult, 1), [2]string{nr.cluster, nr.node}
		group[i] = nr
	}
	s.groups.write(group)
	for i, nr := range group {
		res := <-nr.done
		out[i], errs[i] = IngestResult{Changed: res.changed, Inserted: res.inserted}, translate(res.err)
	}
	return out, errs
}

// SQL of the finding insert and of the plan setting queued before it, for
// TestIngestProbePlan.
var (
	SQLInsertNewFindings = insertNewFindingsSQL
	SQLProbePlan         = sqlProbePlan
)
