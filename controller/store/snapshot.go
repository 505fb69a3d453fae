package store

import (
	"context"
	"encoding/json"
	"errors"
	"slices"
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
// (OpenRepairForNode, FindingsForNode, BreakerState, OpenRepair), so the
// two paths cannot drift apart; the node upsert, the diagnosis upsert and
// the finding links have no single-purpose twin.

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
	// (sqlUpsertNodeMeta's result: the agent's boot ID, versions, inventory,
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

// ReadNode records a node's Kubernetes facts (meta's Cluster, Name,
// NodePool, Zone, InstanceType, NodeClaim, Labels; empty means unknown and
// is stored as such), creating the cluster and node rows when needed and
// clearing the node's removal (MarkNodeRemoved); it never touches the
// agent's fields (boot ID, versions, heartbeat, last seen), so the reconciler
// and the ingest path do not overwrite each other. It reads
// in the same round trip everything a reconcile of it needs (NodeSnapshot):
// one pipelined batch, one implicit transaction. findingsLimit bounds the
// findings read (<= 0 or above MaxFindingsLimit: MaxFindingsLimit).
// ErrInvalid without a cluster or node name; errors are wrapped "read node
// cluster/node".
func (s *Store) ReadNode(ctx context.Context, meta Node, findingsLimit int, now time.Time) (NodeSnapshot, error) {
	out, err := s.ReadNodes(ctx, []Node{meta}, findingsLimit, now)
	if err != nil {
		return NodeSnapshot{}, err
	}
	return out[0], nil
}

// ReadNodes is ReadNode for several nodes (of any clusters) in one round
// trip: one pipelined batch, one implicit transaction, all of it or nothing;
// the i-th snapshot is metas[i]'s, the saved breaker state is read once for
// all. With more than one node the batch first takes the nodes' advisory
// locks in key order, as the ingest groups do (sqlLockNodes,
// groupcommit.go), so its node upserts cannot deadlock with a group writing
// the same nodes' heartbeats. ErrInvalid for a meta without a cluster or
// node name, or a node named twice; errors are wrapped "read node
// cluster/node" (one node) or "read N nodes".
func (s *Store) ReadNodes(ctx context.Context, metas []Node, findingsLimit int, now time.Time) ([]NodeSnapshot, error) {
	if len(metas) == 0 {
		return nil, nil
	}
	if findingsLimit <= 0 || findingsLimit > MaxFindingsLimit {
		findingsLimit = MaxFindingsLimit
	}
	b := &pgx.Batch{}
	unknown := s.queueUnknownClusters(b, len(metas), func(i int) string { return metas[i].Cluster }, now)
	if len(metas) > 1 {
		clusters, nodes := make([]string, len(metas)), make([]string, len(metas))
		seen := make(map[[2]string]bool, len(metas))
		for i, m := range metas {
			k := [2]string{m.Cluster, m.Name}
			if seen[k] {
				return nil, invalidf("read %d nodes: %s/%s named twice", len(metas), m.Cluster, m.Name)
			}
			seen[k] = true
			clusters[i], nodes[i] = m.Cluster, m.Name
		}
		b.Queue(sqlLockNodes, clusters, nodes)
	}
	for _, meta := range metas {
		if meta.Cluster == "" || meta.Name == "" {
			return nil, invalidf("read node: cluster and name are required")
		}
		b.Queue(sqlUpsertNodeMeta, meta.Cluster, meta.Name, meta.NodePool, meta.Zone, meta.InstanceType, meta.NodeClaim, now, labelsDoc(meta.Labels))
		b.Queue(sqlOpenRepairForNode, meta.Cluster, meta.Name)
		b.Queue(sqlLastRepairForNode, meta.Cluster, meta.Name)
		b.Queue(sqlFindingsForNode, meta.Cluster, meta.Name, time.Time{}, findingsLimit)
	}
	b.Queue(sqlGetBreakerState)
	out := make([]NodeSnapshot, len(metas))
	err := func() error {
		br := s.pool.SendBatch(ctx, b)
		defer br.Close()
		for range unknown {
			if _, err := br.Exec(); err != nil {
				return err
			}
		}
		if len(metas) > 1 {
			if _, err := br.Exec(); err != nil {
				return err
			}
		}
		for i := range out {
			if err := readSnapshot(br, &out[i]); err != nil {
				return err
			}
		}
		var doc json.RawMessage
		var version int64
		err := br.QueryRow().Scan(&doc, &version)
		if err != nil && !errors.Is(err, pgx.ErrNoRows) {
			return err
		}
		for i := range out {
			out[i].Breakers, out[i].BreakerVersion = doc, version
		}
		return br.Close()
	}()
	if err != nil {
		if len(metas) == 1 {
			return nil, errorf(err, "read node %s/%s", metas[0].Cluster, metas[0].Name)
		}
		return nil, errorf(err, "read %d nodes", len(metas))
	}
	for _, c := range unknown {
		s.clusters.Store(c, true) // cluster rows are never deleted
	}
	return out, nil
}

// queueUnknownClusters queues sqlEnsureCluster for each distinct cluster
// among the n named by cluster(i) that this Store has not seen, and returns
// them in the order queued (one Exec result each, first in the batch).
func (s *Store) queueUnknownClusters(b *pgx.Batch, n int, cluster func(int) string, now time.Time) []string {
	var unknown []string
	for i := range n {
		c := cluster(i)
		if _, known := s.clusters.Load(c); known || c == "" || slices.Contains(unknown, c) {
			continue
		}
		b.Queue(sqlEnsureCluster, c, now)
		unknown = append(unknown, c)
	}
	return unknown
}

// readSnapshot reads one node's results of a ReadNodes batch into out
// (everything but the breaker state).
func readSnapshot(br pgx.BatchResults, out *NodeSnapshot) error {
	rows, _ := br.Query()
	var err error
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
	out.Findings, err = pgx.CollectRows(rows, scanFinding)
	return err
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
	// Diagnoses are upserted (each for Cluster and Node), keyed by
	// (Cluster, Node, BootID, Reason). A new key is inserted (Created) with
	// FirstSeen/LastSeen defaulting to now. An existing one is updated:
	// catalog fields and Detail replaced, FirstSeen/LastSeen widened,
	// FindingIDs merged (union, in order of first appearance, newest
	// MaxDiagnosisFindings kept), made active again and, if it was
	// inactive, EventRecordedAt cleared so its Event is recorded anew.
	// Every other active diagnosis of the node is deactivated (as
	// DeactivateDiagnoses does).
	Diagnoses []DiagnosisRecord
	// LinkTo, when not 0, is the node's open repair: LinkFindings are
	// linked to it (a finding already linked stays one link; "" is
	// skipped). No repair LinkTo fails the whole write.
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
// the open repair or a repair opened (see NodeLedger), all or nothing;
// the repair is opened with OpenRepair's semantics. ErrInvalid for a
// diagnosis or repair those refuse, or one of another node; errors are
// wrapped "write ledger of cluster/node".
func (s *Store) WriteNodeLedger(ctx context.Context, w NodeLedger, now time.Time) (NodeLedgerResult, error) {
	p, err := planLedger(w, now)
	if err != nil {
		return NodeLedgerResult{}, err
	}
	res, after, err := s.writeLedgers(ctx, []*ledgerPlan{p}, now)
	if err == nil {
		err = after[0]
	}
	if err != nil {
		return NodeLedgerResult{}, errorf(err, "write ledger of %s/%s", w.Cluster, w.Node)
	}
	return res[0], nil
}

// WriteNodeLedgers is WriteNodeLedger for several nodes (distinct ones, of
// any clusters) in one round trip and one transaction: the evidence step of
// a zone wave writes its nodes' verdicts in groups (controller/repair
// evidence.go). Each node keeps WriteNodeLedger's semantics and its own
// outcome: the i-th result and error are ws[i]'s. A node that fails
// validation gets its ErrInvalid and is left out; when the group's
// transaction fails (one node's statement refused, a serialization failure)
// nothing of it is kept and every node is written again alone, so one
// node's error is its own and never loses or blocks the others' writes;
// when PostgreSQL cannot be reached (ErrUnavailable) or ctx ends, every
// node of the group gets that error and nothing is written. A node named
// twice is ErrInvalid for its second entry.
func (s *Store) WriteNodeLedgers(ctx context.Context, ws []NodeLedger, now time.Time) ([]NodeLedgerResult, []error) {
	out, errs := make([]NodeLedgerResult, len(ws)), make([]error, len(ws))
	plans := make([]*ledgerPlan, 0, len(ws))
	idx := make([]int, 0, len(ws))
	seen := make(map[[2]string]bool, len(ws))
	for i, w := range ws {
		if k := [2]string{w.Cluster, w.Node}; seen[k] {
			errs[i] = invalidf("write ledger of %s/%s: node named twice in one group", w.Cluster, w.Node)
			continue
		} else {
			seen[k] = true
		}
		p, err := planLedger(w, now)
		if err != nil {
			errs[i] = err
			continue
		}
		plans, idx = append(plans, p), append(idx, i)
	}
	if len(plans) == 0 {
		return out, errs
	}
	res, after, err := s.writeLedgers(ctx, plans, now)
	if err == nil {
		for j, i := range idx {
			out[i] = res[j]
			if after[j] != nil {
				errs[i] = errorf(after[j], "write ledger of %s/%s", plans[j].w.Cluster, plans[j].w.Node)
			}
		}
		return out, errs
	}
	if len(plans) == 1 || ctx.Err() != nil || errors.Is(translate(err), ErrUnavailable) {
		for j, i := range idx {
			errs[i] = errorf(err, "write ledger of %s/%s", plans[j].w.Cluster, plans[j].w.Node)
		}
		return out, errs
	}
	for j, i := range idx { // each alone: its own transaction, its own error
		res, after, err := s.writeLedgers(ctx, plans[j:j+1], now)
		if err == nil {
			err = after[0]
		}
		if err != nil {
			errs[i] = errorf(err, "write ledger of %s/%s", plans[j].w.Cluster, plans[j].w.Node)
			continue
		}
		out[i] = res[0]
	}
	return out, errs
}

// ledgerPlan is one node's part of a WriteNodeLedgers batch: its checked
// input and the arguments of its statements.
type ledgerPlan struct {
	w        NodeLedger
	diagArgs [][]any
	boots    []string
	reasons  []string
	link     bool
	open     Repair // when w.Open != nil: the checked copy
	openArgs []any
}

// planLedger checks w (WriteNodeLedger's ErrInvalid cases) and prepares
// its statements' arguments.
func planLedger(w NodeLedger, now time.Time) (*ledgerPlan, error) {
	if w.Cluster == "" || w.Node == "" {
		return nil, invalidf("write ledger: cluster and node are required")
	}
	p := &ledgerPlan{w: w, boots: make([]string, 0, len(w.Diagnoses)), reasons: make([]string, 0, len(w.Diagnoses))}
	for _, d := range w.Diagnoses {
		if d.Cluster != w.Cluster || d.Node != w.Node {
			return nil, invalidf("write ledger of %s/%s: diagnosis %s is of %s/%s", w.Cluster, w.Node, d.Reason, d.Cluster, d.Node)
		}
		args, err := upsertDiagnosisArgs(d, now)
		if err != nil {
			return nil, err
		}
		p.diagArgs = append(p.diagArgs, args)
		p.boots, p.reasons = append(p.boots, d.BootID), append(p.reasons, d.Reason)
	}
	p.link = w.LinkTo != 0 && len(w.LinkFindings) > 0
	if w.Open != nil {
		open := *w.Open
		if open.Cluster != w.Cluster || open.Node != w.Node {
			return nil, invalidf("write ledger of %s/%s: repair to open is of %s/%s", w.Cluster, w.Node, open.Cluster, open.Node)
		}
		detail, err := checkOpenRepair(&open, w.Actor)
		if err != nil {
			return nil, err
		}
		ids := open.FindingIDs
		if ids == nil {
			ids = []string{}
		}
		p.open = open
		p.openArgs = []any{open.Cluster, open.Node, open.NodeClaim, open.NodeClaimUID, open.NodePool,
			open.Reason, open.FaultClass, open.RecommendedAction, open.ExecutedAction, string(open.State), open.DryRun,
			nullTime(open.TolerationStartedAt), nullTime(open.TolerationUntil), now, detail, w.Actor, w.Reason, ids}
	}
	return p, nil
}

// queue adds p's statements to b.
func (p *ledgerPlan) queue(b *pgx.Batch, now time.Time) {
	for _, args := range p.diagArgs {
		b.Queue(sqlUpsertDiagnosis, args...)
	}
	b.Queue(sqlDeactivateDiagnosesExcept, p.w.Cluster, p.w.Node, p.boots, p.reasons, now)
	if p.link {
		b.Queue(sqlLinkFindings, p.w.LinkTo, p.w.LinkFindings)
	}
	if p.w.Open != nil {
		b.Queue(sqlOpenRepairLinked, p.openArgs...)
		b.Queue(sqlOpenRepairForNode, p.open.Cluster, p.open.Node)
	}
}

// read reads p's results from br; found: the open repair was read (always
// true without w.Open).
func (p *ledgerPlan) read(br pgx.BatchResults) (out NodeLedgerResult, found bool, err error) {
	n := len(p.w.Diagnoses)
	out = NodeLedgerResult{Diagnoses: make([]DiagnosisRecord, n), Created: make([]bool, n)}
	for i := range n {
		rows, _ := br.Query()
		out.Diagnoses[i], err = pgx.CollectExactlyOneRow(rows, func(row pgx.CollectableRow) (DiagnosisRecord, error) {
			return scanDiagnosisInto(row, &out.Created[i])
		})
		if err != nil {
			return out, false, err
		}
	}
	if _, err := br.Exec(); err != nil {
		return out, false, err
	}
	if p.link {
		if _, err := br.Exec(); err != nil {
			return out, false, err
		}
	}
	if p.w.Open == nil {
		return out, true, nil
	}
	rows, _ := br.Query()
	created, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil {
		return out, false, err
	}
	if out.Repair, found, err = optionalRepair(br); err != nil {
		return out, false, err
	}
	out.Opened = found && len(created) == 1 && created[0] == out.Repair.ID
	return out, found, nil
}

// writeLedgers writes plans (distinct nodes) in one pipelined batch, one
// implicit transaction, and returns their results in order; an error means
// nothing of the batch was kept. A node whose repair to open lost to an
// open one that closed before it could be read gets OpenRepair's own
// transaction after the batch committed (its diagnoses are kept); after
// holds the error of that second step per node (nil: none or it worked).
func (s *Store) writeLedgers(ctx context.Context, plans []*ledgerPlan, now time.Time) (out []NodeLedgerResult, after []error, err error) {
	b := &pgx.Batch{}
	unknown := s.queueUnknownClusters(b, len(plans), func(i int) string { return plans[i].w.Cluster }, now)
	for _, p := range plans {
		p.queue(b, now)
	}
	out, after = make([]NodeLedgerResult, len(plans)), make([]error, len(plans))
	found := make([]bool, len(plans))
	err = func() error {
		br := s.pool.SendBatch(ctx, b)
		defer br.Close()
		for range unknown {
			if _, err := br.Exec(); err != nil {
				return err
			}
		}
		for i, p := range plans {
			var err error
			if out[i], found[i], err = p.read(br); err != nil {
				return err
			}
		}
		return br.Close()
	}()
	if err != nil {
		return nil, nil, err
	}
	for _, c := range unknown {
		s.clusters.Store(c, true)
	}
	for i, p := range plans {
		if p.w.Open != nil && !found[i] {
			// The open repair this insert lost to closed before it could be
			// read: OpenRepair tries again (its own transaction; the
			// diagnoses are committed).
			rp, created, err := s.OpenRepair(ctx, p.open, p.w.Actor, p.w.Reason, now)
			if err != nil {
				after[i] = err
				continue
			}
			out[i].Repair, out[i].Opened = rp, created
		}
	}
	return out, after, nil
}
