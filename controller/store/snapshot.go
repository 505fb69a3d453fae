package store

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
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
// or nothing. The evidence step sends the nodes of a group in one batch
// (ReadNodes, WriteNodeLedgers; controller/repair evidence.go), and the
// batch holds one set-based statement per kind for all of them (arrays
// as parameters, unnest, LATERAL joins): PostgreSQL's CPU per node was
// the wave's limit, and most of it was the cost of the statements
// themselves, four to six per node (docs/scale.md "The evidence step in
// one statement per kind"). One node is the group of one: the
// single-node calls run the same statements.

const (
	// sqlGroupPlans comes first in every ReadNodes and WriteNodeLedgers
	// batch: until the end of its transaction (set_config local) the
	// statements' plans are generic, made once per connection, and
	// never sequential scans. With arrays as parameters PostgreSQL
	// otherwise plans every execution anew (the custom plan knows the
	// arrays' lengths, so it always looks cheaper than the generic one:
	// 0.1 to 0.2 ms of planning per statement and group, as much as a
	// one-node group's execution), and a generic plan made while a table
	// was small could keep scanning it whole as it grows (sqlStoredProbe
	// in findings.go: the same risk for the finding inserts). Every lookup
	// of these statements and of their triggers has an index.
	sqlGroupPlans = `SELECT set_config('plan_cache_mode', 'force_generic_plan', true), set_config('enable_seqscan', 'off', true)`

	// sqlEnsureClusters creates the clusters named in $1 that have no row.
	sqlEnsureClusters = `
INSERT INTO clusters (name, created_at) SELECT DISTINCT unnest($1::text[]), $2::timestamptz
ON CONFLICT (name) DO NOTHING`

	// The nodes' open repair (OpenRepairForNode) and newest repair, open or
	// closed (ListRepairs{Cluster, Node, Limit: 1}), for the nodes $1/$2:
	// one row when they are the same repair, none when the node never had
	// one. Each node's repairs are looked up on their own
	// (repairs_node_id_idx; OFFSET 0 keeps the LATERAL subquery a per-node
	// lookup instead of a join the planner may run over every open
	// repair).
	sqlRepairsOfNodes = `
SELECT ` + repairCols + ` FROM unnest($1::text[], $2::text[]) AS u(c, n)
CROSS JOIN LATERAL (
    SELECT * FROM repairs
    WHERE cluster = u.c AND node = u.n
      AND (closed_at IS NULL OR id = (SELECT max(id) FROM repairs WHERE cluster = u.c AND node = u.n))
    OFFSET 0) AS r`

	// sqlFindingsOfNodes is FindingsForNode for each node $1/$2 (the
	// newest $4 since $3, oldest first), rows tagged with the node's
	// ordinal (1-based) and ordered by it.
	sqlFindingsOfNodes = `
SELECT ` + findingCols + `, u.ord FROM unnest($1::text[], $2::text[]) WITH ORDINALITY AS u(c, n, ord)
CROSS JOIN LATERAL (` + sqlNewestFindingsWhere + `cluster = u.c AND node = u.n` + sqlNewestFindingsLimit + `) AS newest
ORDER BY u.ord, newest.happened, newest.id`

	// DeactivateDiagnoses by key for the nodes $1/$2: their active
	// diagnoses whose key is not among $3-$6 (cluster, node, boot ID,
	// reason: the ones upserted in the same batch, whose IDs the batch
	// cannot know yet); $7 now. Each node's active diagnoses are looked up
	// on their own (diagnoses_active_idx; OFFSET 0 as in
	// sqlRepairsOfNodes), not joined with every active diagnosis.
	sqlDeactivateDiagnosesExcept = `
UPDATE diagnoses d SET active = false, updated_at = $7
FROM (SELECT x.id FROM unnest($1::text[], $2::text[]) AS u(c, n)
      CROSS JOIN LATERAL (SELECT id, boot_id, reason FROM diagnoses WHERE cluster = u.c AND node = u.n AND active OFFSET 0) AS x
      WHERE NOT EXISTS (SELECT FROM unnest($3::text[], $4::text[], $5::text[], $6::text[]) AS keep(c, n, b, r)
                        WHERE keep.c = u.c AND keep.n = u.n AND keep.b = x.boot_id AND keep.r = x.reason)) AS gone
WHERE d.id = gone.id AND d.active`

	// sqlLinkFindingsTo links each finding $2[i] to repair $1[i] (a link
	// already there stays one; "" is skipped).
	sqlLinkFindingsTo = `
INSERT INTO repair_findings (repair_id, finding_id)
SELECT r, id FROM unnest($1::bigint[], $2::text[]) AS t(r, id) WHERE id <> ''
ON CONFLICT DO NOTHING`

	// OpenRepair's insert, creation audit entry and finding links for
	// repairs of distinct nodes in one statement: $1-$14 the repairs'
	// columns (cluster, node, nodeclaim, nodeclaim_uid, nodepool, reason,
	// fault_class, recommended_action, executed_action, state, dry_run,
	// toleration_started_at, toleration_until, detail), $15 the audit
	// actor and $16 its reason per repair, $17 now, $18/$19 the links (the
	// repair's ordinal in $1, 1-based; the finding ID). A row (id,
	// cluster, node) for each repair this insert created; none for a node
	// that already has an open repair (repairs_one_open_per_node, the only
	// unique key an insert can hit; a concurrent uncommitted opener makes
	// it wait for its outcome). The audit trigger (repair_audit_event) and
	// the links' foreign key see the repairs: both run at the end of the
	// statement.
	sqlOpenRepairsLinked = `
WITH input AS (
    SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[], $6::text[], $7::text[],
                         $8::text[], $9::text[], $10::text[], $11::bool[], $12::timestamptz[], $13::timestamptz[],
                         $14::jsonb[], $15::text[], $16::text[])
        WITH ORDINALITY AS t(cluster, node, nodeclaim, nodeclaim_uid, nodepool, reason, fault_class,
                             recommended_action, executed_action, state, dry_run, toleration_started_at,
                             toleration_until, detail, actor, why, ord)),
ins AS (
    INSERT INTO repairs AS r (cluster, node, nodeclaim, nodeclaim_uid, nodepool, reason, fault_class,
                              recommended_action, executed_action, state, dry_run, toleration_started_at,
                              toleration_until, created_at, updated_at, detail)
    SELECT cluster, node, nodeclaim, nodeclaim_uid, nodepool, reason, fault_class, recommended_action,
           executed_action, state, dry_run, toleration_started_at, toleration_until, $17::timestamptz, $17::timestamptz, detail
    FROM input ORDER BY ord
    ON CONFLICT DO NOTHING
    RETURNING r.id, r.cluster, r.node, r.state),
opened AS (
    SELECT ins.id, ins.state, input.actor, input.why, input.ord
    FROM ins JOIN input ON input.cluster = ins.cluster AND input.node = ins.node),
audit AS (
    INSERT INTO repair_audit (repair_id, from_state, to_state, actor, reason, detail, at)
    SELECT id, NULL, state, actor, why, '{}', $17::timestamptz FROM opened),
links AS (
    INSERT INTO repair_findings (repair_id, finding_id)
    SELECT opened.id, l.id FROM opened JOIN unnest($18::bigint[], $19::text[]) AS l(ord, id) ON l.ord = opened.ord
    WHERE l.id <> ''
    ON CONFLICT DO NOTHING)
SELECT id, cluster, node FROM ins`

	// The open repairs of the nodes $1/$2 (per node, as sqlRepairsOfNodes),
	// read after sqlOpenRepairsLinked: a new statement sees a winning
	// concurrent opener, committed by then.
	sqlOpenRepairsOfNodes = `
SELECT ` + repairCols + ` FROM unnest($1::text[], $2::text[]) AS u(c, n)
CROSS JOIN LATERAL (SELECT * FROM repairs WHERE cluster = u.c AND node = u.n AND closed_at IS NULL OFFSET 0) AS r`
)

// NodeSnapshot is what one reconcile reads of a node (ReadNode).
type NodeSnapshot struct {
	// Node is the stored node after its Kubernetes facts were recorded
	// (sqlReadNodesMeta's result: the agent's boot ID, versions, inventory,
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
// and the ingest path do not overwrite each other. A node whose row holds
// these facts already and is not removed is only read: no write, no lock,
// updated_at kept (sqlReadNodesMeta). It reads
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
// all. Each kind of read is one statement for all the nodes (the nodes'
// upsert, their open and newest repairs, their findings). Only the nodes
// whose Kubernetes facts changed are written; when more than one is, the
// statement first takes their advisory locks in key order, as the ingest
// groups do (sqlReadNodesMeta; sqlLockNodes, groupcommit.go), so its node
// upserts cannot deadlock with a group writing the same nodes' heartbeats.
// ErrInvalid for a meta without a cluster or node name, or a node named
// twice; errors are wrapped "read node cluster/node" (one node) or "read N
// nodes".
func (s *Store) ReadNodes(ctx context.Context, metas []Node, findingsLimit int, now time.Time) ([]NodeSnapshot, error) {
	if len(metas) == 0 {
		return nil, nil
	}
	if findingsLimit <= 0 || findingsLimit > MaxFindingsLimit {
		findingsLimit = MaxFindingsLimit
	}
	n := len(metas)
	clusters, names := make([]string, n), make([]string, n)
	pools, zones, types, claims := make([]string, n), make([]string, n), make([]string, n), make([]string, n)
	labels := make([][]byte, n)
	at := make(map[[2]string]int, n) // node -> its index in metas
	for i, m := range metas {
		if m.Cluster == "" || m.Name == "" {
			return nil, invalidf("read node: cluster and name are required")
		}
		k := [2]string{m.Cluster, m.Name}
		if _, twice := at[k]; twice {
			return nil, invalidf("read %d nodes: %s/%s named twice", n, m.Cluster, m.Name)
		}
		at[k] = i
		clusters[i], names[i], pools[i], zones[i], types[i], claims[i] = m.Cluster, m.Name, m.NodePool, m.Zone, m.InstanceType, m.NodeClaim
		labels[i] = labelsDoc(m.Labels)
	}
	b := &pgx.Batch{}
	b.Queue(sqlGroupPlans)
	unknown := s.queueUnknownClusters(b, clusters, now)
	b.Queue(sqlReadNodesMeta, clusters, names, pools, zones, types, claims, now, labels)
	b.Queue(sqlRepairsOfNodes, clusters, names)
	b.Queue(sqlFindingsOfNodes, clusters, names, time.Time{}, findingsLimit)
	b.Queue(sqlGetBreakerState)
	out := make([]NodeSnapshot, n)
	err := func() error {
		br := s.pool.SendBatch(ctx, b)
		defer br.Close()
		if _, err := br.Exec(); err != nil {
			return err
		}
		if len(unknown) > 0 {
			if _, err := br.Exec(); err != nil {
				return err
			}
		}
		if err := readSnapshots(br, out, at); err != nil {
			return err
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
		if n == 1 {
			return nil, errorf(err, "read node %s/%s", metas[0].Cluster, metas[0].Name)
		}
		return nil, errorf(err, "read %d nodes", n)
	}
	for _, c := range unknown {
		s.clusters.Store(c, true) // cluster rows are never deleted
	}
	return out, nil
}

// queueUnknownClusters queues sqlEnsureClusters for the distinct clusters
// among clusters that this Store has not seen, when there are any, and
// returns them (one Exec result, first in the batch, when not empty).
func (s *Store) queueUnknownClusters(b *pgx.Batch, clusters []string, now time.Time) []string {
	var unknown []string
	for _, c := range clusters {
		if _, known := s.clusters.Load(c); known || c == "" || slices.Contains(unknown, c) {
			continue
		}
		unknown = append(unknown, c)
	}
	if len(unknown) > 0 {
		b.Queue(sqlEnsureClusters, unknown, now)
	}
	return unknown
}

// readSnapshots reads the nodes' results of a ReadNodes batch into out
// (everything but the breaker state); at gives each node's index.
func readSnapshots(br pgx.BatchResults, out []NodeSnapshot, at map[[2]string]int) error {
	rows, _ := br.Query()
	nodes, err := pgx.CollectRows(rows, scanNode)
	if err != nil {
		return err
	}
	for _, nd := range nodes {
		i, ok := at[[2]string{nd.Cluster, nd.Name}]
		if !ok {
			return fmt.Errorf("node upsert returned %s/%s, not asked for", nd.Cluster, nd.Name)
		}
		out[i].Node = nd
	}
	if len(nodes) != len(out) {
		return fmt.Errorf("node upsert returned %d rows for %d nodes", len(nodes), len(out))
	}
	rows, _ = br.Query()
	repairs, err := pgx.CollectRows(rows, scanRepair)
	if err != nil {
		return err
	}
	for _, r := range repairs {
		i, ok := at[[2]string{r.Cluster, r.Node}]
		if !ok {
			return fmt.Errorf("repairs read returned one of %s/%s, not asked for", r.Cluster, r.Node)
		}
		snap := &out[i]
		if r.ClosedAt.IsZero() {
			snap.Open, snap.HasOpen = r, true
		}
		if !snap.HasLast || r.ID > snap.Last.ID {
			snap.Last, snap.HasLast = r, true
		}
	}
	for i := range out {
		out[i].Findings = []finding.Finding{}
	}
	type tagged struct {
		f   finding.Finding
		ord int64 // the node's, 1-based
	}
	rows, _ = br.Query()
	fs, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (tagged, error) {
		var t tagged
		var err error
		t.f, err = scanFindingWith(row, &t.ord)
		return t, err
	})
	if err != nil {
		return err
	}
	for _, t := range fs {
		if t.ord < 1 || t.ord > int64(len(out)) {
			return fmt.Errorf("findings read returned node ordinal %d of %d", t.ord, len(out))
		}
		out[t.ord-1].Findings = append(out[t.ord-1].Findings, t.f)
	}
	return nil
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
// input and its rows.
type ledgerPlan struct {
	w     NodeLedger
	diags []diagnosisRow
	link  bool
	open  Repair // when w.Open != nil: the checked copy
	// openDetail is open's encoded Detail.
	openDetail []byte
}

// planLedger checks w (WriteNodeLedger's ErrInvalid cases) and prepares
// its rows.
func planLedger(w NodeLedger, now time.Time) (*ledgerPlan, error) {
	if w.Cluster == "" || w.Node == "" {
		return nil, invalidf("write ledger: cluster and node are required")
	}
	p := &ledgerPlan{w: w, diags: make([]diagnosisRow, 0, len(w.Diagnoses))}
	for _, d := range w.Diagnoses {
		if d.Cluster != w.Cluster || d.Node != w.Node {
			return nil, invalidf("write ledger of %s/%s: diagnosis %s is of %s/%s", w.Cluster, w.Node, d.Reason, d.Cluster, d.Node)
		}
		row, err := newDiagnosisRow(d, now)
		if err != nil {
			return nil, err
		}
		p.diags = append(p.diags, row)
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
		p.open, p.openDetail = open, detail
	}
	return p, nil
}

// ledgerBatch is the statements of one WriteNodeLedgers batch, one per
// kind for all its nodes (plans, distinct nodes): the diagnosis upserts
// (one statement per rank: the k-th diagnoses of every node, so that each
// node's diagnoses are written in order, one statement each, as the
// live-feed trigger needs; sqlUpsertDiagnoses), the deactivation of the
// nodes' other diagnoses, the finding links to open repairs, the repairs
// opened and the open repairs read back.
type ledgerBatch struct {
	plans []*ledgerPlan
	// ranks[k] are the indexes in plans of the nodes with a k-th diagnosis.
	ranks [][]int
	// opens are the indexes in plans of the nodes with a repair to open.
	opens []int
	links bool
}

// queue adds the batch's statements to b.
func (lb *ledgerBatch) queue(b *pgx.Batch, now time.Time) {
	n := len(lb.plans)
	clusters, nodes := make([]string, n), make([]string, n)
	var keepC, keepN, keepB, keepR []string
	var linkRepairs []int64
	var linkIDs []string
	for i, p := range lb.plans {
		clusters[i], nodes[i] = p.w.Cluster, p.w.Node
		for k, d := range p.diags {
			if k == len(lb.ranks) {
				lb.ranks = append(lb.ranks, nil)
			}
			lb.ranks[k] = append(lb.ranks[k], i)
			keepC, keepN, keepB, keepR = append(keepC, d.d.Cluster), append(keepN, d.d.Node), append(keepB, d.d.BootID), append(keepR, d.d.Reason)
		}
		if p.link {
			for _, id := range p.w.LinkFindings {
				linkRepairs, linkIDs = append(linkRepairs, p.w.LinkTo), append(linkIDs, id)
			}
		}
		if p.w.Open != nil {
			lb.opens = append(lb.opens, i)
		}
	}
	for k, rank := range lb.ranks {
		var c diagnosisColumns
		for _, i := range rank {
			c.add(lb.plans[i].diags[k])
		}
		b.Queue(sqlUpsertDiagnoses, c.args(now)...)
	}
	if keepC == nil {
		keepC, keepN, keepB, keepR = []string{}, []string{}, []string{}, []string{}
	}
	b.Queue(sqlDeactivateDiagnosesExcept, clusters, nodes, keepC, keepN, keepB, keepR, now)
	lb.links = len(linkIDs) > 0
	if lb.links {
		b.Queue(sqlLinkFindingsTo, linkRepairs, linkIDs)
	}
	if len(lb.opens) == 0 {
		return
	}
	m := len(lb.opens)
	oc, on, claim, uid, pool := make([]string, m), make([]string, m), make([]string, m), make([]string, m), make([]string, m)
	reason, class, rec, exec, state := make([]string, m), make([]string, m), make([]string, m), make([]string, m), make([]string, m)
	dry, tolStart, tolUntil := make([]bool, m), make([]*time.Time, m), make([]*time.Time, m)
	detail, actor, why := make([][]byte, m), make([]string, m), make([]string, m)
	var idOrd []int64
	var ids []string
	for j, i := range lb.opens {
		p := lb.plans[i]
		r := p.open
		oc[j], on[j], claim[j], uid[j], pool[j] = r.Cluster, r.Node, r.NodeClaim, r.NodeClaimUID, r.NodePool
		reason[j], class[j], rec[j], exec[j], state[j] = r.Reason, r.FaultClass, r.RecommendedAction, r.ExecutedAction, string(r.State)
		dry[j], tolStart[j], tolUntil[j] = r.DryRun, nullTime(r.TolerationStartedAt), nullTime(r.TolerationUntil)
		detail[j], actor[j], why[j] = p.openDetail, p.w.Actor, p.w.Reason
		for _, id := range r.FindingIDs {
			idOrd, ids = append(idOrd, int64(j+1)), append(ids, id)
		}
	}
	if ids == nil {
		idOrd, ids = []int64{}, []string{}
	}
	b.Queue(sqlOpenRepairsLinked, oc, on, claim, uid, pool, reason, class, rec, exec, state, dry, tolStart, tolUntil,
		detail, actor, why, now, idOrd, ids)
	b.Queue(sqlOpenRepairsOfNodes, oc, on)
}

// read reads the batch's results from br into out (one per plan); found[i]:
// plans[i]'s open repair was read (always true without w.Open).
func (lb *ledgerBatch) read(br pgx.BatchResults, out []NodeLedgerResult, found []bool) error {
	at := make(map[[2]string]int, len(lb.plans))
	for i, p := range lb.plans {
		n := len(p.diags)
		out[i] = NodeLedgerResult{Diagnoses: make([]DiagnosisRecord, n), Created: make([]bool, n)}
		found[i] = p.w.Open == nil
		at[[2]string{p.w.Cluster, p.w.Node}] = i
	}
	for k, rank := range lb.ranks {
		type upserted struct {
			d       DiagnosisRecord
			created bool
		}
		rows, _ := br.Query()
		ds, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (upserted, error) {
			var u upserted
			var err error
			u.d, err = scanDiagnosisInto(row, &u.created)
			return u, err
		})
		if err != nil {
			return err
		}
		if len(ds) != len(rank) {
			return fmt.Errorf("diagnosis upsert returned %d rows for %d", len(ds), len(rank))
		}
		for _, u := range ds {
			i, ok := at[[2]string{u.d.Cluster, u.d.Node}]
			if !ok {
				return fmt.Errorf("diagnosis upsert returned one of %s/%s, not asked for", u.d.Cluster, u.d.Node)
			}
			out[i].Diagnoses[k], out[i].Created[k] = u.d, u.created
		}
	}
	if _, err := br.Exec(); err != nil {
		return err
	}
	if lb.links {
		if _, err := br.Exec(); err != nil {
			return err
		}
	}
	if len(lb.opens) == 0 {
		return nil
	}
	rows, _ := br.Query()
	created := make(map[[2]string]int64, len(lb.opens)) // node -> the repair this batch opened
	var (
		id            int64
		cluster, node string
	)
	_, err := pgx.ForEachRow(rows, []any{&id, &cluster, &node}, func() error {
		created[[2]string{cluster, node}] = id
		return nil
	})
	if err != nil {
		return err
	}
	rows, _ = br.Query()
	open, err := pgx.CollectRows(rows, scanRepair)
	if err != nil {
		return err
	}
	for _, r := range open {
		i, ok := at[[2]string{r.Cluster, r.Node}]
		if !ok {
			return fmt.Errorf("open repairs read returned one of %s/%s, not asked for", r.Cluster, r.Node)
		}
		out[i].Repair, found[i] = r, true
		out[i].Opened = created[[2]string{r.Cluster, r.Node}] == r.ID
	}
	return nil
}

// writeLedgers writes plans (distinct nodes) in one pipelined batch, one
// implicit transaction (ledgerBatch), and returns their results in order;
// an error means nothing of the batch was kept. A node whose repair to
// open lost to an open one that closed before it could be read gets
// OpenRepair's own transaction after the batch committed (its diagnoses
// are kept); after holds the error of that second step per node (nil: none
// or it worked).
func (s *Store) writeLedgers(ctx context.Context, plans []*ledgerPlan, now time.Time) (out []NodeLedgerResult, after []error, err error) {
	b := &pgx.Batch{}
	clusters := make([]string, len(plans))
	for i, p := range plans {
		clusters[i] = p.w.Cluster
	}
	b.Queue(sqlGroupPlans)
	unknown := s.queueUnknownClusters(b, clusters, now)
	lb := &ledgerBatch{plans: plans}
	lb.queue(b, now)
	out, after = make([]NodeLedgerResult, len(plans)), make([]error, len(plans))
	found := make([]bool, len(plans))
	err = func() error {
		br := s.pool.SendBatch(ctx, b)
		defer br.Close()
		if _, err := br.Exec(); err != nil {
			return err
		}
		if len(unknown) > 0 {
			if _, err := br.Exec(); err != nil {
				return err
			}
		}
		if err := lb.read(br, out, found); err != nil {
			return err
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
