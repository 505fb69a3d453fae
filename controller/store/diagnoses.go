package store

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5"
)

// DiagnosisRecord is a stored diagnosis: the controller's reading of a
// node's findings for one boot and one reason code (controller/diagnose
// produces them; this is their persistent form).
type DiagnosisRecord struct {
	ID      int64
	Cluster string
	Node    string
	BootID  string
	// Reason is the reason code from the catalog (a stable CamelCase string).
	Reason         string
	Severity       string // "condition" or "event"
	FaultClass     string
	Action         string // the recommended action
	ConditionType  string
	CatalogVersion string
	// FirstSeen and LastSeen bound the evidence: the earliest and latest
	// finding behind the diagnosis, widened by every upsert.
	FirstSeen time.Time
	LastSeen  time.Time
	// FindingIDs are the findings behind the diagnosis, oldest first; at
	// most MaxDiagnosisFindings (the newest are kept).
	FindingIDs []string
	// Active is false once the evidence cleared (DeactivateDiagnoses).
	Active bool
	// EventRecordedAt is when the Kubernetes Event for this diagnosis was
	// recorded; zero: not yet (or not since it became active again).
	EventRecordedAt time.Time
	// Detail holds whatever else the diagnosis says (message, GPUs,
	// escalation), for the API and the dashboard.
	Detail    map[string]any
	CreatedAt time.Time
	UpdatedAt time.Time
}

// MaxDiagnosisFindings bounds DiagnosisRecord.FindingIDs, so a fault that
// keeps recurring (correctable AER every second) does not grow a row forever.
const MaxDiagnosisFindings = 1000

const (
	diagnosisCols = `id, cluster, node, boot_id, reason, severity, fault_class, action, condition_type,
catalog_version, first_seen, last_seen, finding_ids, active, event_recorded_at, detail, created_at, updated_at`

	// sqlUpsertDiagnoses upserts diagnoses of distinct nodes, one row per
	// node (WriteNodeLedgers: a node's k-th diagnosis goes in the k-th
	// statement, so that the live-feed trigger, which reads the node's
	// other diagnoses and, being an AFTER trigger, sees every row of its
	// statement, sees exactly what it sees when the diagnoses are written
	// one statement each). $1-$11 are the columns' arrays, $12 each row's
	// finding IDs (a JSON array of strings, in the caller's order; kept
	// once each, in order of first appearance), $13 each row's detail, $14
	// now, $15 MaxDiagnosisFindings. All right-hand sides of the update see
	// the row as it was before it: a diagnosis that comes back after being
	// deactivated gets its Event recorded again (event_recorded_at reset).
	// xmax = 0 only on the row an INSERT created, which tells created from
	// updated.
	sqlUpsertDiagnoses = `
INSERT INTO diagnoses AS d (cluster, node, boot_id, reason, severity, fault_class, action, condition_type,
                            catalog_version, first_seen, last_seen, finding_ids, active, detail, created_at, updated_at)
SELECT u.cluster, u.node, u.boot_id, u.reason, u.severity, u.fault_class, u.action, u.condition_type,
       u.catalog_version, u.first_seen, u.last_seen,
       ARRAY(SELECT t.id FROM jsonb_array_elements_text(u.ids) WITH ORDINALITY AS t(id, ord) GROUP BY t.id ORDER BY min(t.ord)),
       true, u.detail, $14::timestamptz, $14::timestamptz
FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[], $6::text[], $7::text[], $8::text[],
            $9::text[], $10::timestamptz[], $11::timestamptz[], $12::jsonb[], $13::jsonb[])
     AS u(cluster, node, boot_id, reason, severity, fault_class, action, condition_type, catalog_version,
          first_seen, last_seen, ids, detail)
ON CONFLICT (cluster, node, boot_id, reason) DO UPDATE SET
    severity = excluded.severity,
    fault_class = excluded.fault_class,
    action = excluded.action,
    condition_type = excluded.condition_type,
    catalog_version = excluded.catalog_version,
    detail = excluded.detail,
    first_seen = LEAST(d.first_seen, excluded.first_seen),
    last_seen = GREATEST(d.last_seen, excluded.last_seen),
    finding_ids = ARRAY(
        SELECT id FROM (
            SELECT id, min(ord) AS ord
            FROM unnest(d.finding_ids || excluded.finding_ids) WITH ORDINALITY AS t(id, ord)
            GROUP BY id ORDER BY min(ord) DESC LIMIT $15) AS keep
        ORDER BY ord),
    event_recorded_at = CASE WHEN d.active THEN d.event_recorded_at END,
    active = true,
    updated_at = excluded.updated_at
RETURNING ` + diagnosisCols + `, (xmax = 0) AS created`

	sqlDeactivateDiagnoses = `
UPDATE diagnoses SET active = false, updated_at = $4
WHERE cluster = $1 AND node = $2 AND active AND NOT (id = ANY ($3::bigint[]))`

	// $2 = '' means every node of the cluster.
	sqlActiveDiagnoses = `
SELECT ` + diagnosisCols + ` FROM diagnoses
WHERE active AND cluster = $1 AND ($2 = '' OR node = $2)
ORDER BY node, first_seen, id`

	sqlDiagnosesForNode = `
SELECT ` + diagnosisCols + ` FROM diagnoses
WHERE cluster = $1 AND node = $2
ORDER BY last_seen DESC, id DESC
LIMIT $3`

	sqlMarkEventRecorded = `UPDATE diagnoses SET event_recorded_at = $2, updated_at = $2 WHERE id = $1`
)

// diagnosisRow is one diagnosis checked and encoded for
// sqlUpsertDiagnoses: FirstSeen and LastSeen defaulted, FindingIDs and
// Detail as JSON.
type diagnosisRow struct {
	d           DiagnosisRecord
	ids, detail []byte
}

// newDiagnosisRow checks d and prepares its row (WriteNodeLedger);
// ErrInvalid for a diagnosis without cluster, node or reason.
func newDiagnosisRow(d DiagnosisRecord, now time.Time) (diagnosisRow, error) {
	if d.Cluster == "" || d.Node == "" || d.Reason == "" {
		return diagnosisRow{}, invalidf("upsert diagnosis: cluster, node and reason are required")
	}
	if d.FirstSeen.IsZero() {
		d.FirstSeen = now
	}
	if d.LastSeen.IsZero() {
		d.LastSeen = now
	}
	if d.LastSeen.Before(d.FirstSeen) {
		d.LastSeen = d.FirstSeen
	}
	detail, err := marshalOr(d.Detail, "{}")
	if err != nil {
		return diagnosisRow{}, invalidf("upsert diagnosis: encode detail")
	}
	ids, err := marshalOr(d.FindingIDs, "[]")
	if err != nil {
		return diagnosisRow{}, invalidf("upsert diagnosis: encode finding IDs")
	}
	return diagnosisRow{d: d, ids: ids, detail: detail}, nil
}

// diagnosisColumns are the arrays of one sqlUpsertDiagnoses statement.
type diagnosisColumns struct {
	cluster, node, boot, reason, severity, faultClass, action, condition, catalog []string
	first, last                                                                   []time.Time
	ids, detail                                                                   [][]byte
}

// add appends r as the next row.
func (c *diagnosisColumns) add(r diagnosisRow) {
	d := r.d
	c.cluster, c.node, c.boot, c.reason = append(c.cluster, d.Cluster), append(c.node, d.Node), append(c.boot, d.BootID), append(c.reason, d.Reason)
	c.severity, c.faultClass, c.action = append(c.severity, d.Severity), append(c.faultClass, d.FaultClass), append(c.action, d.Action)
	c.condition, c.catalog = append(c.condition, d.ConditionType), append(c.catalog, d.CatalogVersion)
	c.first, c.last = append(c.first, d.FirstSeen), append(c.last, d.LastSeen)
	c.ids, c.detail = append(c.ids, r.ids), append(c.detail, r.detail)
}

// args returns sqlUpsertDiagnoses's arguments for the rows added.
func (c *diagnosisColumns) args(now time.Time) []any {
	return []any{c.cluster, c.node, c.boot, c.reason, c.severity, c.faultClass, c.action, c.condition, c.catalog,
		c.first, c.last, c.ids, c.detail, now, MaxDiagnosisFindings}
}

// DeactivateDiagnoses marks the node's active diagnoses inactive, except
// those whose ID is in keepIDs (the ones the latest evaluation still
// produced), and returns how many it deactivated.
func (s *Store) DeactivateDiagnoses(ctx context.Context, cluster, node string, keepIDs []int64, now time.Time) (int, error) {
	if keepIDs == nil {
		keepIDs = []int64{}
	}
	tag, err := s.pool.Exec(ctx, sqlDeactivateDiagnoses, cluster, node, keepIDs, now)
	if err != nil {
		return 0, errorf(err, "deactivate diagnoses of %s/%s", cluster, node)
	}
	return int(tag.RowsAffected()), nil
}

// ActiveDiagnoses returns the active diagnoses of a node, oldest first; node
// "" returns those of every node of the cluster, by node.
func (s *Store) ActiveDiagnoses(ctx context.Context, cluster, node string) ([]DiagnosisRecord, error) {
	rows, _ := s.pool.Query(ctx, sqlActiveDiagnoses, cluster, node)
	out, err := pgx.CollectRows(rows, scanDiagnosis)
	if err != nil {
		return nil, errorf(err, "list active diagnoses of %s/%s", cluster, node)
	}
	return out, nil
}

// DiagnosesForNode returns up to limit diagnoses of a node, active or not,
// most recently seen first. limit <= 0 means 100.
func (s *Store) DiagnosesForNode(ctx context.Context, cluster, node string, limit int) ([]DiagnosisRecord, error) {
	if limit <= 0 {
		limit = 100
	}
	rows, _ := s.pool.Query(ctx, sqlDiagnosesForNode, cluster, node, limit)
	out, err := pgx.CollectRows(rows, scanDiagnosis)
	if err != nil {
		return nil, errorf(err, "list diagnoses of %s/%s", cluster, node)
	}
	return out, nil
}

// MarkEventRecorded records that the Kubernetes Event for diagnosis id was
// recorded at now; ErrNotFound when there is no such diagnosis.
func (s *Store) MarkEventRecorded(ctx context.Context, id int64, now time.Time) error {
	tag, err := s.pool.Exec(ctx, sqlMarkEventRecorded, id, now)
	if err != nil {
		return errorf(err, "mark event recorded for diagnosis %d", id)
	}
	if tag.RowsAffected() == 0 {
		return errorf(pgx.ErrNoRows, "mark event recorded for diagnosis %d", id)
	}
	return nil
}

func scanDiagnosis(row pgx.CollectableRow) (DiagnosisRecord, error) {
	return scanDiagnosisInto(row, nil)
}

// scanDiagnosisInto scans diagnosisCols, plus the created flag when created
// is not nil.
func scanDiagnosisInto(row pgx.CollectableRow, created *bool) (DiagnosisRecord, error) {
	var (
		d     DiagnosisRecord
		event *time.Time
	)
	dest := []any{&d.ID, &d.Cluster, &d.Node, &d.BootID, &d.Reason, &d.Severity, &d.FaultClass, &d.Action,
		&d.ConditionType, &d.CatalogVersion, &d.FirstSeen, &d.LastSeen, &d.FindingIDs, &d.Active, &event,
		&d.Detail, &d.CreatedAt, &d.UpdatedAt}
	if created != nil {
		dest = append(dest, created)
	}
	if err := row.Scan(dest...); err != nil {
		return d, err
	}
	d.EventRecordedAt = fromNull(event)
	d.FirstSeen, d.LastSeen = d.FirstSeen.UTC(), d.LastSeen.UTC()
	d.CreatedAt, d.UpdatedAt = d.CreatedAt.UTC(), d.UpdatedAt.UTC()
	if len(d.Detail) == 0 {
		d.Detail = nil
	}
	if len(d.FindingIDs) == 0 {
		d.FindingIDs = nil
	}
	return d, nil
}
