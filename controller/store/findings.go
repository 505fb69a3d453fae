package store

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/fleetrepair/fleetrepair/agent/finding"
)

const (
	// Cluster rows are created on first sight with the default budgets.
	sqlEnsureCluster = `
INSERT INTO clusters (name, created_at) VALUES ($1, $2)
ON CONFLICT (name) DO NOTHING`

	// sqlNodeConflict is the ON CONFLICT clause of the node upsert from
	// reports (sqlUpsertNodesFromHeartbeats, groupcommit.go): what a report
	// may change. The agent's columns only. A report older (by SentAt) than
	// the newest one applied, e.g. a retry from the agent's spool, still
	// refreshes last_seen but does not roll boot_id, versions or heartbeat
	// back. A column whose value does not change keeps its stored datum (no
	// new TOAST value for an unchanged heartbeat); nodes has no index on the
	// updated columns, so a heartbeat that changes nothing is a HOT update
	// of one row.
	sqlNodeConflict = `ON CONFLICT (cluster, name) DO UPDATE SET
    last_seen = GREATEST(n.last_seen, excluded.last_seen),
    updated_at = excluded.updated_at,
    boot_id = CASE WHEN {{newer}} AND excluded.boot_id <> '' THEN excluded.boot_id ELSE n.boot_id END,
    driver_version = CASE WHEN {{newer}} AND excluded.driver_version <> '' THEN excluded.driver_version ELSE n.driver_version END,
    kernel_version = CASE WHEN {{newer}} AND excluded.kernel_version <> '' THEN excluded.kernel_version ELSE n.kernel_version END,
    agent_version = CASE WHEN {{newer}} AND excluded.agent_version <> '' THEN excluded.agent_version ELSE n.agent_version END,
    heartbeat = CASE WHEN {{newer}} AND excluded.heartbeat IS NOT NULL AND excluded.heartbeat IS DISTINCT FROM n.heartbeat
                     THEN excluded.heartbeat ELSE n.heartbeat END,
    last_sent_at = CASE WHEN {{newer}} THEN COALESCE(excluded.last_sent_at, n.last_sent_at) ELSE n.last_sent_at END`

	// sqlNodeChanged: whether the upserted row n differs in the agent's facts
	// from its version before the statement (CTE old), or is new.
	sqlNodeChanged = `NOT EXISTS (
    SELECT 1 FROM old o
    WHERE o.cluster = n.cluster AND o.name = n.name
      AND (o.boot_id, o.driver_version, o.kernel_version, o.agent_version, o.heartbeat)
          IS NOT DISTINCT FROM (n.boot_id, n.driver_version, n.kernel_version, n.agent_version, n.heartbeat))`

	// sqlStoredProbe is the duplicate check of every finding insert, for
	// one row u (id, cluster, node, since, received_at): whether the node
	// has the finding stored already. Findings are unique per (cluster,
	// node, id); the first copy of a resent finding was received from since
	// (dedupSince, per row) to the row's received_at + {{skew}}
	// (DedupClockSkew: another replica's clock may be ahead, but the
	// partitions created days ahead are empty), which bounds the partitions
	// probed.
	//
	// It is correlated (a scalar subquery or LATERAL ... LIMIT 1, which
	// PostgreSQL never pulls up into a join): per row, one primary key
	// probe ((cluster, node, id) equal, received_at range) in each
	// partition left after run-time pruning on the row's bounds. A hash or
	// merge anti-join over the partitions, which the planner chose for
	// earlier forms of this check (docs/scale.md, "Group commit"), cannot
	// happen.
	//
	// The probe must be a primary key probe whatever the statistics say,
	// including a partition ANALYZEd while it was empty (reltuples 0: a
	// sequential scan costs nothing, and a generic plan made then keeps
	// scanning the whole partition per finding as the day fills, until the
	// next ANALYZE invalidates it). Two things pin it: sqlProbePlan, run
	// before every statement holding the probe, in its transaction, so that
	// every plan of these statements, custom or generic, is made with
	// sequential scans disabled; and the ORDER BY received_at, which the
	// primary key (cluster, node, id, received_at; migration 00011)
	// delivers with all of the probe's conditions as index conditions,
	// while the timeline index (cluster, node, happened, id) would need a
	// sort: without it the two indexes cost the same on empty statistics
	// and the planner may take the timeline one, which reads every finding
	// of the node in the partition for each probe.
	// TestIngestProbePlan checks both.
	sqlStoredProbe = `
               SELECT 1 FROM findings f
               WHERE f.cluster = u.cluster AND f.node = u.node AND f.id = u.id
                 AND f.received_at >= u.since AND f.received_at <= u.received_at + {{skew}}::interval
               ORDER BY f.received_at
               LIMIT 1`

	// sqlProbePlan disables sequential scans until the end of the
	// transaction (set_config local: the pipelined batch's implicit
	// transaction, or the COPY path's explicit one) for the finding insert
	// statement queued after it (sqlStoredProbe says why). It changes
	// nothing else the transaction runs: it is the last statement but one.
	sqlProbePlan = `SELECT set_config('enable_seqscan', 'off', true)`

	// sqlInsertNewFindings inserts the findings of a group (rows of several
	// nodes, each node once) that sqlStoredProbe does not find, and returns
	// per node how many it inserted. The probe reads the statement's
	// snapshot: it does not see the rows this statement inserts, which
	// cannot collide (one report per node, one row per ID).
	sqlInsertNewFindings = `
WITH ins AS (
    INSERT INTO findings (id, cluster, node, boot_id, detector, gpu_pci, device_pci, xid, count,
                          attrs, evidence, seq, observed_at, received_at)
    SELECT u.id, u.cluster, u.node, u.boot_id, u.detector, u.gpu_pci, u.device_pci, u.xid, u.count,
           u.attrs, u.evidence, u.seq, u.observed_at, u.received_at
    FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[], $6::text[], $7::text[],
                $8::int[], $9::int[], $10::jsonb[], $11::jsonb[], $12::bigint[], $13::timestamptz[],
                $14::timestamptz[], $15::timestamptz[])
         AS u(id, cluster, node, boot_id, detector, gpu_pci, device_pci, xid, count, attrs, evidence, seq,
              observed_at, received_at, since)
    WHERE (SELECT count(*) FROM ({{probe16}}) stored) = 0
    RETURNING cluster, node)
SELECT cluster, node, count(*) FROM ins GROUP BY cluster, node`

	// sqlStoredFindings returns the ordinals (1-based) of the rows that
	// sqlStoredProbe finds, for the COPY path of findingInsert.
	sqlStoredFindings = `
SELECT u.ord FROM unnest($1::text[], $2::text[], $3::text[], $4::timestamptz[], $5::timestamptz[])
     WITH ORDINALITY AS u(id, cluster, node, since, received_at, ord)
CROSS JOIN LATERAL ({{probe6}}) stored`

	findingCols = `id, node, boot_id, detector, gpu_pci, device_pci, xid, count, attrs, evidence, seq, observed_at`

	// A node's newest findings: the newest $4 that happened at or after $3,
	// ordered by when the fault happened; findings without that time sort
	// by when they were received (findings_node_happened_idx). The node's
	// condition goes between the two parts (sqlFindingsForNode, and
	// sqlFindingsOfNodes in snapshot.go); the rows have a happened column.
	sqlNewestFindingsWhere = `
    SELECT *, COALESCE(observed_at, received_at) AS happened FROM findings
    WHERE `
	sqlNewestFindingsLimit = ` AND COALESCE(observed_at, received_at) >= $3
    ORDER BY COALESCE(observed_at, received_at) DESC, id DESC
    LIMIT $4`

	// The newest $4 matching findings, returned oldest first.
	sqlFindingsForNode = `
SELECT ` + findingCols + ` FROM (` + sqlNewestFindingsWhere + `cluster = $1 AND node = $2` + sqlNewestFindingsLimit + `) newest
ORDER BY happened, id`

	sqlFindingsByIDs = `
SELECT DISTINCT ON (want.ord) ` + findingCols + ` FROM findings
JOIN unnest($3::text[]) WITH ORDINALITY AS want(id, ord) USING (id)
WHERE cluster = $1 AND node = $2
ORDER BY want.ord, received_at`
)

// The finding insert statements with their duplicate check spliced in.
var (
	insertNewFindingsSQL = strings.ReplaceAll(sqlInsertNewFindings, "{{probe16}}", strings.ReplaceAll(sqlStoredProbe, "{{skew}}", "$16"))
	storedFindingsSQL    = strings.ReplaceAll(sqlStoredFindings, "{{probe6}}", strings.ReplaceAll(sqlStoredProbe, "{{skew}}", "$6"))
)

// MaxClockSkew is how far ahead of the controller's clock an agent's SentAt
// may be. The API clamps a later SentAt to now (web/api); the store does not
// trust a stored SentAt further ahead of the clock than this either (a row
// written before the clamp existed, or by a controller with a slow clock), so
// no report can freeze a node's facts.
const MaxClockSkew = 5 * time.Minute

// nodeNewer is spliced into sqlNodeConflict: whether the incoming
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

// Bounds of the duplicate check of IngestReport. The first copy of a resent
// finding was received after the agent observed it, give or take the
// agent's clock error, so only partitions from (observed time -
// DedupClockSkew) on are probed. A finding without an observed time is
// checked against the findings received in the last DedupUntimedWindow.
// A resend outside these bounds (an agent clock more than DedupClockSkew
// ahead, or an untimed finding resent after a week) is stored a second time:
// a duplicate, never a loss.
const (
	DedupClockSkew     = 24 * time.Hour
	DedupUntimedWindow = 7 * 24 * time.Hour
)

// IngestResult is what IngestReport did.
type IngestResult struct {
	// Inserted is the number of the report's findings stored for the first
	// time (resent ones excluded): the `inserted` of the ingest answer.
	Inserted int
	// Changed is whether the node's agent facts changed: the node row is new,
	// or the boot ID, a version or the heartbeat's content (monitor states,
	// GPU inventory, ...) differs from what was stored. A heartbeat that
	// changes nothing only refreshes last_seen, and the reconciler need not
	// look at the node again.
	Changed bool
}

// IngestReport stores one agent Report atomically in one transaction: it
// creates the cluster row the first time this Store sees the cluster, takes
// the node's lock, upserts the node's agent facts (boot ID, last_seen = now,
// heartbeat, driver/kernel/agent version when given) and inserts the
// findings: one round trip, a pipelined batch in an implicit transaction
// (writeGroup, groupcommit.go). Findings are unique per (cluster,
// node, id): one already stored for this node (a resent report) is skipped,
// so a resent report is harmless, while another node's finding with the
// same ID is stored. Either all of the report is stored or none of it (a
// finding the schema refuses, e.g. count 0, fails the whole report with
// ErrInvalid); a database that cannot be reached is ErrUnavailable.
//
// A report is written together with the reports of other nodes waiting at
// the same moment, in one transaction (group commit, groupcommit.go), with
// the same effect and answer as alone; it returns only after that
// transaction committed. The first report of a cluster this Store has not
// seen yet is written alone (it creates the cluster row).
//
// The caller validates the report first (finding.Report.Validate); the store
// fills a finding's empty Node and BootID from the report, and keeps the
// first of findings repeating an ID within the report. The driver version
// comes from the heartbeat, else from a driver-version finding.
func (s *Store) IngestReport(ctx context.Context, r finding.Report, now time.Time) (IngestResult, error) {
	nr, err := newNodeReport(r, now)
	if err != nil {
		return IngestResult{}, err
	}
	_, knownCluster := s.clusters.Load(r.Cluster)
	if knownCluster && s.groups != nil {
		res, err := s.groups.submit(ctx, nr)
		if err != nil {
			return IngestResult{}, errorf(err, "ingest report from %s/%s", r.Cluster, r.Node)
		}
		return IngestResult{Changed: res.changed, Inserted: res.inserted}, nil
	}
	// The first report of a cluster this Store has not seen: alone, with
	// the cluster row, in the same transaction.
	res, err := s.writeGroup(ctx, []*nodeReport{nr}, !knownCluster)
	if err != nil {
		return IngestResult{}, errorf(err, "ingest report from %s/%s", r.Cluster, r.Node)
	}
	s.clusters.Store(r.Cluster, true) // cluster rows are never deleted
	return IngestResult{Changed: res[0].changed, Inserted: res[0].inserted}, nil
}

// newNodeReport converts r into the rows IngestReport writes; an error wraps
// ErrInvalid (no cluster or node, a finding of another node, a value no
// column holds).
func newNodeReport(r finding.Report, now time.Time) (*nodeReport, error) {
	if r.Cluster == "" || r.Node == "" {
		return nil, invalidf("ingest report: cluster and node are required")
	}
	rows := newFindingRows(len(r.Findings), now)
	driver := ""
	for _, f := range r.Findings {
		if f.Node != "" && f.Node != r.Node {
			return nil, invalidf("ingest report: finding %s is for node %q, not the report's node %q", f.ID, f.Node, r.Node)
		}
		if f.Detector == finding.DetectorDriverVersion && f.Attr(finding.AttrValue) != "" {
			driver = f.Attr(finding.AttrValue)
		}
		if err := rows.add(f, r.BootID); err != nil {
			return nil, err
		}
	}
	var (
		hb  []byte
		err error
	)
	kernel := ""
	if r.Heartbeat != nil {
		if hb, err = json.Marshal(r.Heartbeat); err != nil {
			return nil, invalidf("ingest report: encode heartbeat")
		}
		if r.Heartbeat.DriverVersion != "" {
			driver = r.Heartbeat.DriverVersion
		}
		kernel = r.Heartbeat.KernelVersion
	}
	return &nodeReport{cluster: r.Cluster, node: r.Node, boot: r.BootID, driver: driver,
		kernel: kernel, agent: r.AgentVersion, heartbeat: hb, sentAt: nullTime(r.SentAt), now: now, findings: rows}, nil
}

// findingRows are the findings of one report (or of one node of a job
// report) to insert, column by column.
type findingRows struct {
	now                                          time.Time // received_at
	ids, bootIDs, detectors, gpuPCIs, devicePCIs []string
	xids, counts                                 []int32
	attrs, evidence                              [][]byte
	seqs                                         []int64
	observed                                     []*time.Time
	sinces                                       []time.Time // per finding: dedupSince
	seen                                         map[string]bool
}

func newFindingRows(n int, now time.Time) *findingRows {
	return &findingRows{now: now, seen: make(map[string]bool, n),
		ids: make([]string, 0, n), bootIDs: make([]string, 0, n), detectors: make([]string, 0, n), gpuPCIs: make([]string, 0, n),
		devicePCIs: make([]string, 0, n), xids: make([]int32, 0, n), counts: make([]int32, 0, n), attrs: make([][]byte, 0, n),
		evidence: make([][]byte, 0, n), seqs: make([]int64, 0, n), observed: make([]*time.Time, 0, n), sinces: make([]time.Time, 0, n)}
}

// add appends f (its boot ID, else boot), once per ID; an error wraps
// ErrInvalid for a value no column can hold.
func (w *findingRows) add(f finding.Finding, boot string) error {
	if f.Xid > math.MaxInt32 || f.Count > math.MaxInt32 || f.Xid < math.MinInt32 || f.Count < math.MinInt32 {
		return invalidf("ingest report: finding %s: xid or count out of range", f.ID)
	}
	if f.Seq > math.MaxInt64 {
		return invalidf("ingest report: finding %s: seq %d out of range", f.ID, f.Seq)
	}
	if w.seen[f.ID] {
		return nil
	}
	w.seen[f.ID] = true
	a, err := marshalOr(f.Attrs, "{}")
	if err != nil {
		return invalidf("ingest report: encode attrs of finding %s", f.ID)
	}
	e, err := marshalOr(f.Evidence, "[]")
	if err != nil {
		return invalidf("ingest report: encode evidence of finding %s", f.ID)
	}
	if f.BootID != "" {
		boot = f.BootID
	}
	w.ids, w.detectors, w.gpuPCIs, w.devicePCIs = append(w.ids, f.ID), append(w.detectors, f.Detector), append(w.gpuPCIs, f.GPUPCI), append(w.devicePCIs, f.DevicePCI)
	w.bootIDs, w.xids, w.counts, w.seqs = append(w.bootIDs, boot), append(w.xids, int32(f.Xid)), append(w.counts, int32(f.Count)), append(w.seqs, int64(f.Seq))
	w.observed, w.attrs, w.evidence = append(w.observed, nullTime(f.Time)), append(w.attrs, a), append(w.evidence, e)
	w.sinces = append(w.sinces, dedupSince(f.Time, w.now))
	return nil
}

// findingInsert inserts the findings of several nodes (each node once) in
// the transaction that holds their node locks (sqlLockNodes,
// groupcommit.go), queued after the lock statement in the same pipelined
// batch: no other report of these nodes, from this replica or another, is
// written between the duplicate check (sqlStoredProbe) and the insert, and
// the check sees every finding committed before. This is the one duplicate
// check of every write path (IngestReport, grouped or alone, and
// IngestJobFindings). Two ways, by size: up to copyMinFindings findings,
// one statement checks and inserts (sqlInsertNewFindings), in the batch's
// round trip; from copyMinFindings on, the batch looks the stored ones up
// (sqlStoredFindings) and one binary COPY writes the others, in the same
// explicit transaction (fewer CPU per finding in PostgreSQL, two more
// round trips; docs/scale.md).
type findingInsert struct {
	sets   []findingSet
	total  int
	counts []int  // per set: inserted (read)
	stored []bool // COPY path: per finding of all sets, in order, found by the lookup
}

// copyMinFindings is the size from which findingInsert takes the COPY path.
var copyMinFindings = 256

type findingSet struct {
	cluster, node string
	rows          *findingRows
	first         int // index of its first finding in stored
}

// useCopy tells whether the findings go in a COPY after a lookup (in an
// explicit transaction) rather than in one statement.
func (w *findingInsert) useCopy() bool { return w.total >= copyMinFindings }

// add adds the rows of cluster/node; it returns the set's index.
func (w *findingInsert) add(cluster, node string, rows *findingRows) int {
	w.sets = append(w.sets, findingSet{cluster: cluster, node: node, rows: rows, first: w.total})
	w.total += len(rows.ids)
	return len(w.sets) - 1
}

// queue queues sqlProbePlan and then sqlInsertNewFindings, or on the COPY
// path sqlStoredFindings, for every finding added; read reads their
// results.
func (w *findingInsert) queue(b *pgx.Batch) {
	n := w.total
	if w.useCopy() {
		clusters, nodes, ids := make([]string, 0, n), make([]string, 0, n), make([]string, 0, n)
		sinces, received := make([]time.Time, 0, n), make([]time.Time, 0, n)
		for _, set := range w.sets {
			for range set.rows.ids {
				clusters, nodes, received = append(clusters, set.cluster), append(nodes, set.node), append(received, set.rows.now)
			}
			ids, sinces = append(ids, set.rows.ids...), append(sinces, set.rows.sinces...)
		}
		b.Queue(sqlProbePlan)
		b.Queue(storedFindingsSQL, ids, clusters, nodes, sinces, received, DedupClockSkew)
		return
	}
	ids, clusters, nodes, boots := make([]string, 0, n), make([]string, 0, n), make([]string, 0, n), make([]string, 0, n)
	detectors, gpus, devices := make([]string, 0, n), make([]string, 0, n), make([]string, 0, n)
	xids, counts := make([]int32, 0, n), make([]int32, 0, n)
	attrs, evidence, seqs := make([][]byte, 0, n), make([][]byte, 0, n), make([]int64, 0, n)
	observed, received, sinces := make([]*time.Time, 0, n), make([]time.Time, 0, n), make([]time.Time, 0, n)
	for _, set := range w.sets {
		r := set.rows
		for range r.ids {
			clusters, nodes, received = append(clusters, set.cluster), append(nodes, set.node), append(received, r.now)
		}
		ids, boots, detectors, gpus, devices = append(ids, r.ids...), append(boots, r.bootIDs...), append(detectors, r.detectors...), append(gpus, r.gpuPCIs...), append(devices, r.devicePCIs...)
		xids, counts, attrs, evidence = append(xids, r.xids...), append(counts, r.counts...), append(attrs, r.attrs...), append(evidence, r.evidence...)
		seqs, observed, sinces = append(seqs, r.seqs...), append(observed, r.observed...), append(sinces, r.sinces...)
	}
	b.Queue(sqlProbePlan)
	b.Queue(insertNewFindingsSQL, ids, clusters, nodes, boots, detectors, gpus, devices, xids, counts, attrs, evidence,
		seqs, observed, received, sinces, DedupClockSkew)
}

func (w *findingInsert) read(br pgx.BatchResults) error {
	if _, err := br.Exec(); err != nil { // sqlProbePlan
		return err
	}
	if w.useCopy() {
		return w.readStored(br)
	}
	w.counts = make([]int, len(w.sets))
	index := make(map[[2]string]int, len(w.sets))
	for i, set := range w.sets {
		index[[2]string{set.cluster, set.node}] = i
	}
	rows, err := br.Query()
	if err != nil {
		return err
	}
	var (
		c, node string
		n       int
	)
	_, err = pgx.ForEachRow(rows, []any{&c, &node, &n}, func() error {
		i, ok := index[[2]string{c, node}]
		if !ok {
			return errors.New("insert findings: a count for a node not in the group")
		}
		w.counts[i] = n
		return nil
	})
	return err
}

// readStored reads the result of sqlStoredFindings and counts, per set,
// the findings that copy will insert.
func (w *findingInsert) readStored(br pgx.BatchResults) error {
	w.stored = make([]bool, w.total)
	rows, err := br.Query()
	if err != nil {
		return err
	}
	var ord int64
	_, err = pgx.ForEachRow(rows, []any{&ord}, func() error {
		if ord < 1 || ord > int64(w.total) {
			return errors.New("look up stored findings: an ordinal out of range")
		}
		w.stored[ord-1] = true
		return nil
	})
	if err != nil {
		return err
	}
	w.counts = make([]int, len(w.sets))
	for i, set := range w.sets {
		for _, st := range w.stored[set.first : set.first+len(set.rows.ids)] {
			if !st {
				w.counts[i]++
			}
		}
	}
	return nil
}

// findingCopyColumns are the columns copy writes, in the order of its row
// values.
var findingCopyColumns = []string{"id", "cluster", "node", "boot_id", "detector", "gpu_pci", "device_pci",
	"xid", "count", "attrs", "evidence", "seq", "observed_at", "received_at"}

// copy writes, on the COPY path, the findings the lookup did not find, in
// one COPY into findings (PostgreSQL routes each row to its day's
// partition), in tx: the transaction of the lookup's batch.
func (w *findingInsert) copy(ctx context.Context, tx pgx.Tx) error {
	n := 0
	for _, c := range w.counts {
		n += c
	}
	if n == 0 {
		return nil
	}
	set, i, k := 0, 0, 0 // the next finding: w.sets[set].rows row i, flat index k
	row := make([]any, len(findingCopyColumns))
	src := pgx.CopyFromFunc(func() ([]any, error) {
		for ; set < len(w.sets); set, i = set+1, 0 {
			s := w.sets[set]
			r := s.rows
			for ; i < len(r.ids); i, k = i+1, k+1 {
				if w.stored[k] {
					continue
				}
				row[0], row[1], row[2], row[3], row[4], row[5], row[6] = r.ids[i], s.cluster, s.node, r.bootIDs[i], r.detectors[i], r.gpuPCIs[i], r.devicePCIs[i]
				row[7], row[8], row[9], row[10], row[11], row[12], row[13] = r.xids[i], r.counts[i], r.attrs[i], r.evidence[i], r.seqs[i], r.observed[i], r.now
				i, k = i+1, k+1
				return row, nil
			}
		}
		return nil, nil
	})
	got, err := tx.CopyFrom(ctx, pgx.Identifier{"findings"}, findingCopyColumns, src)
	if err != nil {
		return err
	}
	if got != int64(n) {
		return fmt.Errorf("copy findings: %d rows copied, want %d", got, n)
	}
	return nil
}

// run sends b, whose last statement queue queued (if any findings were
// added), and calls read with its results, which must read them all (the
// statements before, then w.read): in one implicit transaction, or on the
// COPY path in an explicit one (BEGIN, the batch, the COPY, COMMIT).
func (w *findingInsert) run(ctx context.Context, pool *pgxpool.Pool, b *pgx.Batch, read func(pgx.BatchResults) error) error {
	send := func(q interface {
		SendBatch(context.Context, *pgx.Batch) pgx.BatchResults
	}) error {
		br := q.SendBatch(ctx, b)
		defer br.Close()
		if err := read(br); err != nil {
			return err
		}
		return br.Close()
	}
	if w.total == 0 || !w.useCopy() {
		return send(pool)
	}
	return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if err := send(tx); err != nil {
			return err
		}
		return w.copy(ctx, tx)
	})
}

// inserted is how many findings of set i were new (after read).
func (w *findingInsert) inserted(i int) int { return w.counts[i] }

// dedupSince is the earliest received_at the first copy of a finding
// observed at observed (zero: unknown), arriving at now, can have.
func dedupSince(observed, now time.Time) time.Time {
	if observed.IsZero() {
		return now.Add(-DedupUntimedWindow)
	}
	return earliest(observed, now).Add(-DedupClockSkew)
}

func earliest(a, b time.Time) time.Time {
	if a.Before(b) {
		return a
	}
	return b
}

// nodeUpsert completes a node upsert statement with the shared conflict
// clause and change test.
func nodeUpsert(q string) string {
	return strings.NewReplacer("{{conflict}}", strings.ReplaceAll(sqlNodeConflict, "{{newer}}", nodeNewer),
		"{{changed}}", sqlNodeChanged).Replace(q)
}

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
	return s.queryFindings(ctx, "findings of "+cluster+"/"+node, sqlFindingsForNode, cluster, node, since, limit)
}

// queryFindings runs a query returning findingCols rows and scans them;
// what names the rows in errors.
func (s *Store) queryFindings(ctx context.Context, what, sql string, args ...any) ([]finding.Finding, error) {
	rows, err := s.pool.Query(ctx, sql, args...)
	if err != nil {
		return nil, errorf(err, "query %s", what)
	}
	out, err := pgx.CollectRows(rows, scanFinding)
	if err != nil {
		return nil, errorf(err, "read %s", what)
	}
	return out, nil
}

// FindingsByIDs returns the stored findings of one node with the given IDs
// (finding IDs are unique per node), in the order of ids; IDs not stored
// (never received, or dropped by retention) are left out. Should a node's
// finding be stored twice (a resend outside the bounds of IngestReport's
// duplicate check), the first received is returned.
func (s *Store) FindingsByIDs(ctx context.Context, cluster, node string, ids []string) ([]finding.Finding, error) {
	if len(ids) == 0 {
		return nil, nil
	}
	return s.queryFindings(ctx, "findings by id", sqlFindingsByIDs, cluster, node, ids)
}

func scanFinding(row pgx.CollectableRow) (finding.Finding, error) { return scanFindingWith(row) }

// scanFindingWith scans findingCols followed by the extra columns into
// extra.
func scanFindingWith(row pgx.CollectableRow, extra ...any) (finding.Finding, error) {
	var (
		f        finding.Finding
		seq      int64
		observed *time.Time
	)
	err := row.Scan(append([]any{&f.ID, &f.Node, &f.BootID, &f.Detector, &f.GPUPCI, &f.DevicePCI, &f.Xid, &f.Count,
		&f.Attrs, &f.Evidence, &seq, &observed}, extra...)...)
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
