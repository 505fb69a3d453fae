package store

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// Findings are range-partitioned by received_at, one partition per UTC day
// named findings_pYYYYMMDD, plus findings_default for anything outside the
// created days (migrations/00006_findings_partitioned.sql).
const (
	// DefaultPartitionsAhead is how many days of partitions MaintainFindings
	// keeps created beyond today.
	DefaultPartitionsAhead = 7

	partitionPrefix = "findings_p"
	partitionLayout = "20060102"

	sqlEnsurePartitions = `SELECT fleetrepair_findings_partitions($1::date, $2)`

	sqlListPartitions = `
SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
WHERE i.inhparent = 'findings'::regclass AND c.relname ~ '^findings_p[0-9]{8}$'
ORDER BY c.relname`

	sqlDeleteOldDefault = `DELETE FROM findings_default WHERE received_at < $1`

	// Dropping a partition takes an ACCESS EXCLUSIVE lock on findings; wait
	// for it at most this long (ingest queues behind a waiting DROP), and
	// try again at the next maintenance pass.
	sqlDropLockTimeout = `SET LOCAL lock_timeout = '2s'`
)

// FindingsMaintenance says what MaintainFindings keeps.
type FindingsMaintenance struct {
	// Ahead is how many days of partitions to keep created beyond today
	// (<= 0: DefaultPartitionsAhead). Yesterday and today are always made.
	Ahead int
	// Retention drops the findings received more than Retention before now:
	// each day's partition once its whole day is older, and rows of the
	// default partition one by one. 0 keeps every finding. Repairs, their
	// audit, diagnoses and their links to findings are never dropped; a link
	// to a dropped finding is skipped when read (RepairFindings).
	Retention time.Duration
}

// MaintenanceResult lists what MaintainFindings did.
type MaintenanceResult struct {
	Created int      // partitions created
	Dropped []string // partitions dropped, oldest first
	Deleted int64    // rows deleted from the default partition
}

// MaintainFindings creates the finding partitions of yesterday, today and
// m.Ahead days ahead (UTC days of now) that do not exist yet, moving rows that
// landed in the default partition into them, and, with m.Retention > 0,
// drops the partitions of days that ended at or before now - m.Retention.
// The controller calls it at start and then periodically; replicas may call
// it concurrently. A partition that cannot be dropped now (lock timeout) is
// left for the next call and reported as an error (ErrUnavailable).
func (s *Store) MaintainFindings(ctx context.Context, now time.Time, m FindingsMaintenance) (MaintenanceResult, error) {
	var res MaintenanceResult
	if m.Ahead <= 0 {
		m.Ahead = DefaultPartitionsAhead
	}
	if m.Retention < 0 {
		return res, invalidf("maintain findings: retention %v is negative", m.Retention)
	}
	today := now.UTC().Truncate(24 * time.Hour)
	if err := s.pool.QueryRow(ctx, sqlEnsurePartitions, today.AddDate(0, 0, -1), m.Ahead+2).Scan(&res.Created); err != nil {
		return res, errorf(err, "create finding partitions")
	}
	if m.Retention == 0 {
		return res, nil
	}
	cutoff := now.Add(-m.Retention)
	parts, err := s.FindingPartitions(ctx)
	if err != nil {
		return res, err
	}
	for _, p := range parts {
		if p.Until.After(cutoff) {
			break // sorted by day
		}
		err := s.inTx(ctx, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, sqlDropLockTimeout); err != nil {
				return err
			}
			_, err := tx.Exec(ctx, "DROP TABLE "+pgx.Identifier{p.Name}.Sanitize())
			return err
		})
		if err != nil {
			return res, errorf(err, "drop finding partition %s", p.Name)
		}
		res.Dropped = append(res.Dropped, p.Name)
	}
	tag, err := s.pool.Exec(ctx, sqlDeleteOldDefault, cutoff)
	if err != nil {
		return res, errorf(err, "delete old findings of the default partition")
	}
	res.Deleted = tag.RowsAffected()
	return res, nil
}

// FindingPartition is one daily partition of findings: the findings received
// in [From, Until).
type FindingPartition struct {
	Name        string
	From, Until time.Time
}

// FindingPartitions lists the daily partitions of findings, oldest first
// (the default partition is not listed).
func (s *Store) FindingPartitions(ctx context.Context) ([]FindingPartition, error) {
	rows, _ := s.pool.Query(ctx, sqlListPartitions)
	names, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, errorf(err, "list finding partitions")
	}
	out := make([]FindingPartition, 0, len(names))
	for _, n := range names {
		day, err := time.Parse(partitionLayout, strings.TrimPrefix(n, partitionPrefix))
		if err != nil {
			return nil, fmt.Errorf("list finding partitions: partition %q is not named for a day: %w", n, err)
		}
		out = append(out, FindingPartition{Name: n, From: day, Until: day.AddDate(0, 0, 1)})
	}
	slices.SortFunc(out, func(a, b FindingPartition) int { return a.From.Compare(b.From) })
	return out, nil
}
