package store

import (
	"context"
	"encoding/json"
	"fmt"
	"math"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/fleetrepair/fleetrepair/agent/finding"
)

const (
	// Cluster rows are created on first sight with the default budgets.
	sqlEnsureCluster = `
INSERT INTO clusters (name, created_at) VALUES ($1, $2)
ON CONFLICT (name) DO NOTHING`

	// The agent's columns only. A report older (by SentAt) than the newest
	// one applied, e.g. a retry from the agent's spool, still refreshes
	// last_seen but does not roll boot_id, versions or heartbeat back.
	sqlUpsertNodeFromReport = `
INSERT INTO nodes AS n (cluster, name, boot_id, driver_version, kernel_version, agent_version,
                        heartbeat, last_seen, last_sent_at, created_at, updated_at)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $8, $8)
ON CONFLICT (cluster, name) DO UPDATE SET
    last_seen = GREATEST(n.last_seen, excluded.last_seen),
    updated_at = excluded.updated_at,
    boot_id = CASE WHEN {{newer}} AND excluded.boot_id <> '' THEN excluded.boot_id ELSE n.boot_id END,
    driver_version = CASE WHEN {{newer}} AND excluded.driver_version <> '' THEN excluded.driver_version ELSE n.driver_version END,
    kernel_version = CASE WHEN {{newer}} AND excluded.kernel_version <> '' THEN excluded.kernel_version ELSE n.kernel_version END,
    agent_version = CASE WHEN {{newer}} AND excluded.agent_version <> '' THEN excluded.agent_version ELSE n.agent_version END,
    heartbeat = CASE WHEN {{newer}} AND excluded.heartbeat IS NOT NULL THEN excluded.heartbeat ELSE n.heartbeat END,
    last_sent_at = CASE WHEN {{newer}} THEN COALESCE(excluded.last_sent_at, n.last_sent_at) ELSE n.last_sent_at END`

	// One statement for the whole batch; ON CONFLICT makes resent findings
	// no-ops, and the affected row count is the number of new ones.
	sqlInsertFindings = `
INSERT INTO findings (id, cluster, node, boot_id, detector, gpu_pci, device_pci, xid, count,
                      attrs, evidence, seq, observed_at, received_at)
SELECT u.id, $1, $2, u.boot_id, u.detector, u.gpu_pci, u.device_pci, u.xid, u.count,
       u.attrs, u.evidence, u.seq, u.observed_at, $3
FROM unnest($4::text[], $5::text[], $6::text[], $7::text[], $8::text[], $9::int[], $10::int[],
            $11::jsonb[], $12::jsonb[], $13::bigint[], $14::timestamptz[])
     AS u(id, boot_id, detector, gpu_pci, device_pci, xid, count, attrs, evidence, seq, observed_at)
ON CONFLICT (cluster, id) DO NOTHING`

	findingCols = `id, node, boot_id, detector, gpu_pci, device_pci, xid, count, attrs, evidence, seq, observed_at`

	// Ordered by when the fault happened; findings without that time sort
	// by when they were received.
	// The newest $4 matching findings, returned oldest first.
	sqlFindingsForNode = `
SELECT ` + findingCols + ` FROM (
    SELECT *, COALESCE(observed_at, received_at) AS happened FROM findings
    WHERE cluster = $1 AND node = $2 AND COALESCE(observed_at, received_at) >= $3
    ORDER BY happened DESC, id DESC
    LIMIT $4) newest
ORDER BY happened, id`

	sqlFindingsByIDs = `
SELECT ` + findingCols + ` FROM findings
JOIN unnest($2::text[]) WITH ORDINALITY AS want(id, ord) USING (id)
WHERE cluster = $1
ORDER BY want.ord`
)

// MaxClockSkew is how far ahead of the controller's clock an agent's SentAt
// may be. The API clamps a later SentAt to now (web/api); the store does not
// trust a stored SentAt further ahead of the clock than this either (a row
// written before the clamp existed, or by a controller with a slow clock), so
// no report can freeze a node's facts.
const MaxClockSkew = 5 * time.Minute

// nodeNewer is spliced into sqlUpsertNodeFromReport: whether the incoming
// report is at least as new as the newest applied (by the agent's SentAt; a
// report without SentAt always applies), or the newest applied claims a
// SentAt more than MaxClockSkew ahead of this write's clock (excluded.last_seen
// is now): such a SentAt is a wrong clock, and keeping it would hold the
// node's boot ID, heartbeat and versions, and so its old boot's faults, until
// the clock reaches it.
var nodeNewer = fmt.Sprintf(`(excluded.last_sent_at IS NULL OR n.last_sent_at IS NULL OR excluded.last_sent_at >= n.last_sent_at
    OR n.last_sent_at > excluded.last_seen + interval '%d seconds')`, int(MaxClockSkew/time.Second))

// MaxFindingsLimit caps the limit of FindingsForNode.
const MaxFindingsLimit = 10000

// IngestReport stores one agent Report in a single transaction: it creates
// the cluster row if needed, upserts the node's agent facts (boot ID,
// last_seen = now, heartbeat, driver/kernel/agent version when given) and
// inserts the findings. A finding whose ID is already stored is skipped, so
// a resent report is harmless; inserted counts the new findings. Either all
// of the report is stored or none of it (a finding the schema refuses, e.g.
// count 0, fails the whole report with ErrInvalid).
//
// The caller validates the report first (finding.Report.Validate); the store
// fills a finding's empty Node and BootID from the report. The driver version
// comes from the heartbeat, else from a driver-version finding.
func (s *Store) IngestReport(ctx context.Context, r finding.Report, now time.Time) (inserted int, err error) {
	if r.Cluster == "" || r.Node == "" {
		return 0, invalidf("ingest report: cluster and node are required")
	}
	n := len(r.Findings)
	var (
		ids, bootIDs, detectors, gpuPCIs, devicePCIs = make([]string, n), make([]string, n), make([]string, n), make([]string, n), make([]string, n)
		xids, counts                                 = make([]int32, n), make([]int32, n)
		attrs, evidence                              = make([][]byte, n), make([][]byte, n)
		seqs                                         = make([]int64, n)
		observed                                     = make([]*time.Time, n)
	)
	driver := ""
	for i, f := range r.Findings {
		if f.Node != "" && f.Node != r.Node {
			return 0, invalidf("ingest report: finding %s is for node %q, not the report's node %q", f.ID, f.Node, r.Node)
		}
		if f.Xid > math.MaxInt32 || f.Count > math.MaxInt32 || f.Xid < math.MinInt32 || f.Count < math.MinInt32 {
			return 0, invalidf("ingest report: finding %s: xid or count out of range", f.ID)
		}
		if f.Seq > math.MaxInt64 {
			return 0, invalidf("ingest report: finding %s: seq %d out of range", f.ID, f.Seq)
		}
		ids[i], detectors[i], gpuPCIs[i], devicePCIs[i] = f.ID, f.Detector, f.GPUPCI, f.DevicePCI
		bootIDs[i] = f.BootID
		if bootIDs[i] == "" {
			bootIDs[i] = r.BootID
		}
		xids[i], counts[i], seqs[i] = int32(f.Xid), int32(f.Count), int64(f.Seq)
		observed[i] = nullTime(f.Time)
		if attrs[i], err = marshalOr(f.Attrs, "{}"); err != nil {
			return 0, invalidf("ingest report: encode attrs of finding %s", f.ID)
		}
		if evidence[i], err = marshalOr(f.Evidence, "[]"); err != nil {
			return 0, invalidf("ingest report: encode evidence of finding %s", f.ID)
		}
		if f.Detector == finding.DetectorDriverVersion && f.Attr(finding.AttrValue) != "" {
			driver = f.Attr(finding.AttrValue)
		}
	}
	var hb []byte
	kernel := ""
	if r.Heartbeat != nil {
		if hb, err = json.Marshal(r.Heartbeat); err != nil {
			return 0, invalidf("ingest report: encode heartbeat")
		}
		if r.Heartbeat.DriverVersion != "" {
			driver = r.Heartbeat.DriverVersion
		}
		kernel = r.Heartbeat.KernelVersion
	}

	err = s.inTx(ctx, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, sqlEnsureCluster, r.Cluster, now); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, upsertNodeSQL, r.Cluster, r.Node, r.BootID, driver, kernel,
			r.AgentVersion, hb, now, nullTime(r.SentAt)); err != nil {
			return err
		}
		if n == 0 {
			return nil
		}
		tag, err := tx.Exec(ctx, sqlInsertFindings, r.Cluster, r.Node, now,
			ids, bootIDs, detectors, gpuPCIs, devicePCIs, xids, counts, attrs, evidence, seqs, observed)
		if err != nil {
			return err
		}
		inserted = int(tag.RowsAffected())
		return nil
	})
	if err != nil {
		return 0, errorf(err, "ingest report from %s/%s", r.Cluster, r.Node)
	}
	return inserted, nil
}

var upsertNodeSQL = strings.ReplaceAll(sqlUpsertNodeFromReport, "{{newer}}", nodeNewer)

func marshalOr[T any](v T, empty string) ([]byte, error) {
	b, err := json.Marshal(v)
	if err != nil {
		return nil, err
	}
	if string(b) == "null" {
		return []byte(empty), nil
	}
	return b, nil
}

// FindingsForNode returns the newest limit findings of a node that happened
// at or after since, oldest first, ordered by the time the fault happened (a
// finding without that time by when it was received): a node with a long
// history always sees its latest findings. limit <= 0 means
// MaxFindingsLimit. A finding's Time is zero when the agent could not tell.
func (s *Store) FindingsForNode(ctx context.Context, cluster, node string, since time.Time, limit int) ([]finding.Finding, error) {
	if limit <= 0 || limit > MaxFindingsLimit {
		limit = MaxFindingsLimit
	}
	rows, err := s.pool.Query(ctx, sqlFindingsForNode, cluster, node, since, limit)
	if err != nil {
		return nil, errorf(err, "query findings of %s/%s", cluster, node)
	}
	out, err := pgx.CollectRows(rows, scanFinding)
	if err != nil {
		return nil, errorf(err, "read findings of %s/%s", cluster, node)
	}
	return out, nil
}

// FindingsByIDs returns the stored findings with the given IDs, in the order
// of ids; IDs not stored (never received, or dropped by retention) are left
// out.
func (s *Store) FindingsByIDs(ctx context.Context, cluster string, ids []string) ([]finding.Finding, error) {
	if len(ids) == 0 {
		return nil, nil
	}
	rows, err := s.pool.Query(ctx, sqlFindingsByIDs, cluster, ids)
	if err != nil {
		return nil, errorf(err, "query findings by id")
	}
	out, err := pgx.CollectRows(rows, scanFinding)
	if err != nil {
		return nil, errorf(err, "read findings by id")
	}
	return out, nil
}

func scanFinding(row pgx.CollectableRow) (finding.Finding, error) {
	var (
		f        finding.Finding
		seq      int64
		observed *time.Time
	)
	err := row.Scan(&f.ID, &f.Node, &f.BootID, &f.Detector, &f.GPUPCI, &f.DevicePCI, &f.Xid, &f.Count,
		&f.Attrs, &f.Evidence, &seq, &observed)
	if err != nil {
		return f, err
	}
	f.Seq = uint64(seq)
	f.Time = fromNull(observed)
	if len(f.Attrs) == 0 {
		f.Attrs = nil
	}
	if len(f.Evidence) == 0 {
		f.Evidence = nil
	}
	return f, nil
}
