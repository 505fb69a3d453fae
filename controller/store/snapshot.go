package store

import (
	"context"
	"encoding/json"
	"errors"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/fleetrepair/fleetrepair/agent/finding"
)

// One reconcile of a node reads its database state and writes its verdict
// in two round trips (ReadNode, WriteNodeLedger) instead of about twenty
// sequential statements and transactions: in a 10,000-node zone wave the
// reconciler's evidence step of 1,500 nodes was bound by them (issue 9,
// docs/scale.md "priority work queue"). Each is one pipelined pgx batch,
// which PostgreSQL runs as one implicit transaction (one Sync): all of it
// or nothing. The statements are the ones the single-purpose functions run
// (UpsertNodeMeta, OpenRepairForNode, FindingsForNode, BreakerState,
// UpsertDiagnosis, OpenRepair, AddRepairFindings), so the two paths cannot
// drift apart.

const (
	// The node's newest repair, open or closed: ListRepairs{Cluster, Node,
	// Limit: 1} (repairs_node_id_idx).
	sqlLastRepairForNode = `SELECT ` + repairCols + ` FROM repairs r
WHERE r.cluster = $1 AND r.node = $2 ORDER BY r.id DESC LIMIT 1`

	// DeactivateDiagnoses by key: the node's active diagnoses whose (boot
	// ID, reason) is not among the ones upserted in the same batch, whose
	// IDs the batch cannot know yet.
	sqlDeactivateDiagnosesExcept = `
UPDATE diagnoses SET active = false, updated_at = $5
WHERE cluster = $1 AND node = $2 AND active
  AND (boot_id, reason) NOT IN (SELECT b, r FROM unnest($3::text[], $4::text[]) AS keep(b, r))`

	// OpenRepair's insert, creation audit entry and finding links in one
	// statement ($1-$15 are sqlInsertRepair's; $16 actor, $17 reason, $18
	// the finding IDs). A row only when this insert created the repair;
	// none when the node already has an open one (repairs_one_open_per_node;
	// a concurrent uncommitted opener makes it wait for its outcome). The
	// audit trigger (repair_audit_event) and the links' foreign key see the
	// repair: both run at the end of the statement.
	sqlOpenRepairLinked = `
WITH ins AS (` + sqlInsertRepair + `),
audit AS (
    INSERT INTO repair_audit (repair_id, from_state, to_state, actor, reason, detail, at)
    SELECT id, NULL, $10, $16, $17, '{}', $14 FROM ins),
links AS (
    INSERT INTO repair_findings (repair_id, finding_id)
    SELECT ins.id, t.id FROM ins, unnest($18::text[]) AS t(id) WHERE t.id <> ''
    ON CONFLICT DO NOTHING)
SELECT id FROM ins`
)

// NodeSnapshot is what one reconcile reads of a node (ReadNode).
type NodeSnapshot struct {
	// Node is the stored node after its Kubernetes facts were recorded
	// (UpsertNodeMeta's result: the agent's boot ID, versions, inventory,
	// the owners' word).
	Node Node
	// Open is the node's open repair (OpenRepairForNode); HasOpen is false
	// when it has none.
	Open    Repair
	HasOpen bool
	// Last is the node's newest repair, open or closed (ListRepairs with
	// Cluster, Node, Limit 1); HasLast is false when it never had one.
	Last    Repair
	HasLast bool
	// Findings are the node's newest findings (FindingsForNode with no
	// since and the limit asked), oldest first.
	Findings []finding.Finding
	// Breakers is the saved breaker state document and BreakerVersion its
	// version (BreakerState: nil and 0 when never saved).
	Breakers       json.RawMessage
	BreakerVersion int64
}

// ReadNode records a node's Kubernetes facts (UpsertNodeMeta: meta's
// Cluster, Name, NodePool, Zone, InstanceType, NodeClaim, Labels) and reads
// in the same round trip everything a reconcile of it needs (NodeSnapshot):
// one pipelined batch, one implicit transaction. findingsLimit bounds the
// findings read (<= 0 or above MaxFindingsLimit: MaxFindingsLimit).
// ErrInvalid without a cluster or node name; errors are wrapped "read node
// cluster/node".
func (s *Store) ReadNode(ctx context.Context, meta Node, findingsLimit int, now time.Time) (NodeSnapshot, error) {
	if meta.Cluster == "" || meta.Name == "" {
		return NodeSnapshot{}, invalidf("read node: cluster and name are required")
	}
	if findingsLimit <= 0 || findingsLimit > MaxFindingsLimit {
		findingsLimit = MaxFindingsLimit
	}
	_, knownCluster := s.clusters.Load(meta.Cluster)
	b := &pgx.Batch{}
	if !knownCluster {
		b.Queue(sqlEnsureCluster, meta.Cluster, now)
	}
	b.Queue(sqlUpsertNodeMeta, meta.Cluster, meta.Name, meta.NodePool, meta.Zone, meta.InstanceType, meta.NodeClaim, now, labelsDoc(meta.Labels))
	b.Queue(sqlOpenRepairForNode, meta.Cluster, meta.Name)
	b.Queue(sqlLastRepairForNode, meta.Cluster, meta.Name)
	b.Queue(sqlFindingsForNode, meta.Cluster, meta.Name, time.Time{}, findingsLimit)
	b.Queue(sqlGetBreakerState)
	var out NodeSnapshot
	err := func() error {
		br, err := s.sendBatch(ctx, b, knownCluster)
		if err != nil {
			return err
		}
		defer br.Close()
		rows, _ := br.Query()
		if out.Node, err = pgx.CollectExactlyOneRow(rows, scanNode); err != nil {
			return err
		}
		if out.Open, out.HasOpen, err = optionalRepair(br); err != nil {
			return err
		}
		if out.Last, out.HasLast, err = optionalRepair(br); err != nil {
			return err
		}
		rows, _ = br.Query()
		if out.Findings, err = pgx.CollectRows(rows, scanFinding); err != nil {
			return err
		}
		err = br.QueryRow().Scan(&out.Breakers, &out.BreakerVersion)
		if err != nil && !errors.Is(err, pgx.ErrNoRows) {
			return err
		}
		return br.Close()
	}()
	if err != nil {
		return NodeSnapshot{}, errorf(err, "read node %s/%s", meta.Cluster, meta.Name)
	}
	s.clusters.Store(meta.Cluster, true) // cluster rows are never deleted
	return out, nil
}

// optionalRepair reads the next batch result: at most one repair row.
func optionalRepair(br pgx.BatchResults) (Repair, bool, error) {
	rows, _ := br.Query()
	rs, err := pgx.CollectRows(rows, scanRepair)
	if err != nil || len(rs) == 0 {
		return Repair{}, false, err
	}
	return rs[0], true, nil
}

// NodeLedger is what one reconcile writes for a node (WriteNodeLedger).
type NodeLedger struct {
	Cluster, Node string
	// Diagnoses are upserted (UpsertDiagnosis; each for Cluster and Node);
	// every other active diagnosis of the node is deactivated
	// (DeactivateDiagnoses).
	Diagnoses []DiagnosisRecord
	// LinkTo, when not 0, is the node's open repair: LinkFindings are
	// linked to it (AddRepairFindings).
	LinkTo       int64
	LinkFindings []string
	// Open, when set, is the repair to open for the node (OpenRepair's
	// columns and checks), by Actor for Reason. When the node already has
	// an open repair, that one is returned and nothing is opened.
	Open          *Repair
	Actor, Reason string
}

// NodeLedgerResult is what WriteNodeLedger stored.
type NodeLedgerResult struct {
	// Diagnoses are the stored records, in the order of
	// NodeLedger.Diagnoses; Created tells which were new.
	Diagnoses []DiagnosisRecord
	Created   []bool
	// Repair is the node's open repair when NodeLedger.Open was set:
	// opened by this call (Opened) or the one it already had.
	Repair Repair
	Opened bool
}

// WriteNodeLedger writes a reconcile's verdict on one node in one round
// trip and one transaction (a pipelined batch): the diagnoses upserted, the
// node's other active diagnoses deactivated, and either findings linked to
// the open repair or a repair opened (see NodeLedger). It is
// UpsertDiagnosis, DeactivateDiagnoses, AddRepairFindings and OpenRepair
// together, with their semantics, all or nothing. ErrInvalid for a
// diagnosis or repair those refuse, or one of another node; errors are
// wrapped "write ledger of cluster/node".
func (s *Store) WriteNodeLedger(ctx context.Context, w NodeLedger, now time.Time) (NodeLedgerResult, error) {
	if w.Cluster == "" || w.Node == "" {
		return NodeLedgerResult{}, invalidf("write ledger: cluster and node are required")
	}
	b := &pgx.Batch{}
	_, knownCluster := s.clusters.Load(w.Cluster)
	if !knownCluster {
		b.Queue(sqlEnsureCluster, w.Cluster, now)
	}
	boots, reasons := make([]string, 0, len(w.Diagnoses)), make([]string, 0, len(w.Diagnoses))
	for _, d := range w.Diagnoses {
		if d.Cluster != w.Cluster || d.Node != w.Node {
			return NodeLedgerResult{}, invalidf("write ledger of %s/%s: diagnosis %s is of %s/%s", w.Cluster, w.Node, d.Reason, d.Cluster, d.Node)
		}
		args, err := upsertDiagnosisArgs(d, now)
		if err != nil {
			return NodeLedgerResult{}, err
		}
		b.Queue(sqlUpsertDiagnosis, args...)
		boots, reasons = append(boots, d.BootID), append(reasons, d.Reason)
	}
	b.Queue(sqlDeactivateDiagnosesExcept, w.Cluster, w.Node, boots, reasons, now)
	link := w.LinkTo != 0 && len(w.LinkFindings) > 0
	if link {
		b.Queue(sqlLinkFindings, w.LinkTo, w.LinkFindings)
	}
	var open Repair
	if w.Open != nil {
		open = *w.Open
		if open.Cluster != w.Cluster || open.Node != w.Node {
			return NodeLedgerResult{}, invalidf("write ledger of %s/%s: repair to open is of %s/%s", w.Cluster, w.Node, open.Cluster, open.Node)
		}
		detail, err := checkOpenRepair(&open, w.Actor)
		if err != nil {
			return NodeLedgerResult{}, err
		}
		ids := open.FindingIDs
		if ids == nil {
			ids = []string{}
		}
		b.Queue(sqlOpenRepairLinked, open.Cluster, open.Node, open.NodeClaim, open.NodeClaimUID, open.NodePool,
			open.Reason, open.FaultClass, open.RecommendedAction, open.ExecutedAction, string(open.State), open.DryRun,
			nullTime(open.TolerationStartedAt), nullTime(open.TolerationUntil), now, detail, w.Actor, w.Reason, ids)
		b.Queue(sqlOpenRepairForNode, open.Cluster, open.Node)
	}
	out := NodeLedgerResult{Diagnoses: make([]DiagnosisRecord, len(w.Diagnoses)), Created: make([]bool, len(w.Diagnoses))}
	found := false
	err := func() error {
		br, err := s.sendBatch(ctx, b, knownCluster)
		if err != nil {
			return err
		}
		defer br.Close()
		for i := range w.Diagnoses {
			rows, _ := br.Query()
			var err error
			out.Diagnoses[i], err = pgx.CollectExactlyOneRow(rows, func(row pgx.CollectableRow) (DiagnosisRecord, error) {
				return scanDiagnosisInto(row, &out.Created[i])
			})
			if err != nil {
				return err
			}
		}
		if _, err := br.Exec(); err != nil {
			return err
		}
		if link {
			if _, err := br.Exec(); err != nil {
				return err
			}
		}
		if w.Open != nil {
			rows, _ := br.Query()
			created, err := pgx.CollectRows(rows, pgx.RowTo[int64])
			if err != nil {
				return err
			}
			if out.Repair, found, err = optionalRepair(br); err != nil {
				return err
			}
			out.Opened = found && len(created) == 1 && created[0] == out.Repair.ID
		}
		return br.Close()
	}()
	if err != nil {
		return NodeLedgerResult{}, errorf(err, "write ledger of %s/%s", w.Cluster, w.Node)
	}
	s.clusters.Store(w.Cluster, true)
	if w.Open != nil && !found {
		// The open repair this insert lost to closed before it could be
		// read: OpenRepair tries again (its own transaction; the diagnoses
		// are committed).
		rp, created, err := s.OpenRepair(ctx, open, w.Actor, w.Reason, now)
		if err != nil {
			return NodeLedgerResult{}, errorf(err, "write ledger of %s/%s", w.Cluster, w.Node)
		}
		out.Repair, out.Opened = rp, created
	}
	return out, nil
}

// sendBatch sends b, whose first statement is sqlEnsureCluster unless known
// (the cluster row this Store has seen), and reads that statement's result.
// The caller closes the results.
func (s *Store) sendBatch(ctx context.Context, b *pgx.Batch, known bool) (pgx.BatchResults, error) {
	br := s.pool.SendBatch(ctx, b)
	if !known {
		if _, err := br.Exec(); err != nil {
			br.Close()
			return nil, err
		}
	}
	return br, nil
}
