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
	// try again at the next maintenance pass. A compaction's swap takes the
	// same lock.
	sqlDropLockTimeout = `SET LOCAL lock_timeout = '2s'`

	sqlForgetCompaction = `DELETE FROM finding_partition_compactions WHERE partition = $1`

	sqlCompactedPartitions = `SELECT partition FROM finding_partition_compactions`

	sqlCompactPartition = `SELECT fleetrepair_findings_compact($1)`

	// DefaultCompactAfter is how long after its day ended a partition is
	// rewritten in node-timeline order (FindingsMaintenance.CompactAfter).
	// Far above MaxClockSkew, so no replica still writes that day.
	DefaultCompactAfter = 2 * time.Hour
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
	// Compact is how many closed partitions one call rewrites in
	// node-timeline order (CompactFindings), newest first: 0 means 1,
	// negative none. A rewrite copies the day's rows once (seconds per
	// million rows); readers and ingest go on meanwhile.
	Compact int
	// CompactAfter is how long after its day ended a partition may be
	// rewritten (0: DefaultCompactAfter; at least MaxClockSkew).
	CompactAfter time.Duration
}

// MaintenanceResult lists what MaintainFindings did.
type MaintenanceResult struct {
	Created int      // partitions created
	Dropped []string // partitions dropped, oldest first
	Deleted int64    // rows deleted from the default partition
	// Compacted lists the partitions rewritten in node-timeline order,
	// newest first.
	Compacted []string
}

// MaintainFindings creates the finding partitions of yesterday, today and
// m.Ahead days ahead (UTC days of now) that do not exist yet, moving rows that
// landed in the default partition into them, and, with m.Retention > 0,
// drops the partitions of days that ended at or before now - m.Retention,
// then rewrites up to m.Compact closed partitions in node-timeline order
// (CompactFindings). The controller calls it at start and then
// periodically; replicas may call it concurrently. A partition that cannot
// be dropped or swapped now (lock timeout) is left for the next call and
// reported as an error (ErrUnavailable).
func (s *Store) MaintainFindings(ctx context.Context, now time.Time, m FindingsMaintenance) (MaintenanceResult, error) {
	var res MaintenanceResult
	if m.Ahead <= 0 {
		m.Ahead = DefaultPartitionsAhead
	}
	if m.Retention < 0 {
		return res, invalidf("maintain findings: retention %v is negative", m.Retention)
	}
	if m.CompactAfter == 0 {
		m.CompactAfter = DefaultCompactAfter
	}
	if m.CompactAfter < MaxClockSkew {
		return res, invalidf("maintain findings: compact after %v is below the clock skew allowed (%v)", m.CompactAfter, MaxClockSkew)
	}
	today := now.UTC().Truncate(24 * time.Hour)
	if err := s.pool.QueryRow(ctx, sqlEnsurePartitions, today.AddDate(0, 0, -1), m.Ahead+2).Scan(&res.Created); err != nil {
		return res, errorf(err, "create finding partitions")
	}
	if m.Retention > 0 {
		if err := s.dropFindings(ctx, now.Add(-m.Retention), &res); err != nil {
			return res, err
		}
	}
	if m.Compact == 0 {
		m.Compact = 1
	}
	if m.Compact > 0 {
		var keepAfter time.Time
		if m.Retention > 0 {
			keepAfter = now.Add(-m.Retention)
		}
		done, err := s.CompactFindings(ctx, now.Add(-m.CompactAfter), keepAfter, m.Compact)
		res.Compacted = done
		if err != nil {
			return res, err
		}
	}
	return res, nil
}

// dropFindings drops the partitions whose day ended at or before cutoff and
// deletes the default partition's rows received before it (MaintainFindings).
func (s *Store) dropFindings(ctx context.Context, cutoff time.Time, res *MaintenanceResult) error {
	parts, err := s.FindingPartitions(ctx)
	if err != nil {
		return err
	}
	for _, p := range parts {
		if p.Until.After(cutoff) {
			break // sorted by day
		}
		err := s.inTx(ctx, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, sqlDropLockTimeout); err != nil {
				return err
			}
			if _, err := tx.Exec(ctx, "DROP TABLE "+pgx.Identifier{p.Name}.Sanitize()); err != nil {
				return err
			}
			_, err := tx.Exec(ctx, sqlForgetCompaction, p.Name)
			return err
		})
		if err != nil {
			return errorf(err, "drop finding partition %s", p.Name)
		}
		res.Dropped = append(res.Dropped, p.Name)
	}
	tag, err := s.pool.Exec(ctx, sqlDeleteOldDefault, cutoff)
	if err != nil {
		return errorf(err, "delete old findings of the default partition")
	}
	res.Deleted = tag.RowsAffected()
	return nil
}

// CompactFindings rewrites up to max daily partitions of findings in
// node-timeline order (migrations/00010_findings_compaction.sql): those
// whose day ended at or before closedBy, not rewritten before, and (with a
// non-zero keepAfter) not about to be dropped by retention (day ended after
// keepAfter); newest first. It returns the partitions rewritten; while
// another replica is rewriting one it returns at once. Each
// rewrite is one transaction: its swap waits at most 2 s for the lock on
// findings (lock timeout: ErrUnavailable; the partition is left as it was
// and the next call tries again). Rows and names are kept exactly; only the
// heap order changes, which takes the node timeline from about one buffer
// per finding to a few pages per partition (docs/scale.md).
func (s *Store) CompactFindings(ctx context.Context, closedBy, keepAfter time.Time, max int) ([]string, error) {
	parts, err := s.FindingPartitions(ctx)
	if err != nil {
		return nil, err
	}
	rows, _ := s.pool.Query(ctx, sqlCompactedPartitions)
	compacted, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, errorf(err, "list compacted finding partitions")
	}
	var done []string
	for i := len(parts) - 1; i >= 0 && len(done) < max; i-- {
		p := parts[i]
		if p.Until.After(closedBy) || (!keepAfter.IsZero() && !p.Until.After(keepAfter)) || slices.Contains(compacted, p.Name) {
			continue
		}
		var n int64
		err := s.inTx(ctx, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, sqlDropLockTimeout); err != nil {
				return err
			}
			return tx.QueryRow(ctx, sqlCompactPartition, p.Name).Scan(&n)
		})
		if err != nil {
			return done, errorf(err, "compact finding partition %s", p.Name)
		}
		if n == -2 {
			break // another replica is compacting: its turn
		}
		if n >= 0 {
			done = append(done, p.Name)
		}
	}
	return done, nil
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
