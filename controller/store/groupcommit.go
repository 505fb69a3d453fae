package store

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
)

// Group commit. Reports (heartbeats, about 3,300/s for 100,000 nodes, and
// reports with findings alike) are written in groups: each of a few writer
// goroutines takes the reports waiting when it is free, up to
// maxReportGroup reports of distinct nodes and maxGroupFindings findings,
// and writes them in one transaction (writeGroup): one lock statement for
// every node of the group, one multi-row upsert of the nodes and one insert
// of the group's new findings with its duplicate check, pipelined in one
// round trip (a large group: the check in the batch, then one COPY). Each
// report is answered only after that transaction committed, with its own
// Changed and Inserted, the same as written alone. Under load the groups grow on their own (more
// reports arrive while a group is written); alone, a report waits for
// nobody. A group that fails is written again one report per transaction,
// so one report's error is its own (an invalid finding fails only its
// report); when PostgreSQL cannot be reached every report of the group gets
// ErrUnavailable (web/api answers 503 with Retry-After) and nothing of it is
// acknowledged.
const (
	maxReportGroup = 256
	// maxGroupFindings bounds the findings of one group (one statement's
	// arrays); a report is never split: one larger than this is a group
	// of its own.
	maxGroupFindings = 10000
	// reportGroupTimeout bounds the write of one group; the callers' own
	// deadlines still apply to their wait.
	reportGroupTimeout = 10 * time.Second

	// The node locks of the group, taken first in its transaction
	// (released at commit) and in key order, so that two groups never wait
	// on each other in a cycle. They serialize the reports of one node
	// across groups and replicas, so each statement after them sees
	// everything an earlier report of the node committed: the change check
	// of the node upsert compares with the latest facts, and the duplicate
	// check of findingInsert (findings.go) sees every finding stored before
	// and nothing can be inserted for the node between that check and the
	// insert. Reports of different nodes do not wait on each other (a 64-bit
	// hash; a collision only serializes two nodes). A row lock would not
	// do: a node's first reports have no row to lock.
	sqlLockNodes = sqlLockKeys + `unnest($1::text[], $2::text[]) AS t(c, n)` + sqlLockKeysEnd

	// sqlLockKeys, a row source of (c, n) pairs, then sqlLockKeysEnd: the
	// advisory locks of those nodes in key order, one row (their count).
	// The one spelling of a node's lock key (sqlLockNodes, and
	// sqlReadNodesMeta in nodes.go for the nodes a reconcile writes).
	sqlLockKeys = `
SELECT count(pg_advisory_xact_lock(k)) FROM (
    SELECT hashtextextended(c || '/' || n, 0) AS k FROM `
	sqlLockKeysEnd = ` ORDER BY k) keys`

	// The node upsert of a group (the conflict clause, sqlNodeConflict in
	// findings.go, says what a report may change). It returns, per node,
	// whether the agent's facts changed (or the row is new): the CTE reads
	// the old values, after sqlLockNodes.
	sqlUpsertNodesFromHeartbeats = `
WITH input AS (
    SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[], $6::text[], $7::jsonb[],
                         $8::timestamptz[], $9::timestamptz[])
    AS t(cluster, name, boot_id, driver_version, kernel_version, agent_version, heartbeat, now, sent_at)),
old AS (
    SELECT n.cluster, n.name, n.boot_id, n.driver_version, n.kernel_version, n.agent_version, n.heartbeat
    FROM nodes n JOIN input i ON n.cluster = i.cluster AND n.name = i.name)
INSERT INTO nodes AS n (cluster, name, boot_id, driver_version, kernel_version, agent_version,
                        heartbeat, last_seen, last_sent_at, created_at, updated_at)
SELECT cluster, name, boot_id, driver_version, kernel_version, agent_version, heartbeat, now, sent_at, now, now
FROM input
{{conflict}}
RETURNING n.cluster, n.name, {{changed}}`
)

var upsertNodesSQL = nodeUpsert(sqlUpsertNodesFromHeartbeats)

// nodeReport is one report as the group writes take it: the node part and
// its findings (none for a heartbeat).
type nodeReport struct {
	cluster, node               string
	boot, driver, kernel, agent string
	heartbeat                   []byte // nil: no heartbeat in the report
	sentAt                      *time.Time
	now                         time.Time
	findings                    *findingRows    // nil or empty for a heartbeat
	done                        chan nodeResult // buffered (1)
	key                         [2]string
}

func (r *nodeReport) findingCount() int {
	if r.findings == nil {
		return 0
	}
	return len(r.findings.ids)
}

type nodeResult struct {
	changed  bool
	inserted int
	err      error
}

// errStoreClosed answers reports submitted after Close.
var errStoreClosed = &dbError{kind: ErrUnavailable, err: errors.New("store closed")}

type reportGroups struct {
	s *Store
	// committed and reports count the group transactions committed and
	// the reports they held.
	committed, reports atomic.Int64
	in                 chan *nodeReport
	quit               chan struct{}
	stopOnce           sync.Once
}

func startReportGroups(s *Store, writers int) *reportGroups {
	g := &reportGroups{s: s, in: make(chan *nodeReport, 4*maxReportGroup), quit: make(chan struct{})}
	for range max(writers, 1) {
		go g.work()
	}
	return g
}

func (g *reportGroups) stop() { g.stopOnce.Do(func() { close(g.quit) }) }

// submit queues r and waits for its result, ctx's end or Close. A result is
// only ever sent after the group's transaction ended: success means r is
// committed.
func (g *reportGroups) submit(ctx context.Context, r *nodeReport) (nodeResult, error) {
	r.done = make(chan nodeResult, 1)
	r.key = [2]string{r.cluster, r.node}
	select {
	case g.in <- r:
	case <-ctx.Done():
		return nodeResult{}, ctx.Err()
	case <-g.quit:
		return nodeResult{}, errStoreClosed
	}
	select {
	case res := <-r.done:
		return res, res.err
	case <-ctx.Done():
		// The write may still commit: a resent report then answers
		// inserted 0, and every finding is stored once.
		return nodeResult{}, ctx.Err()
	case <-g.quit:
		return nodeResult{}, errStoreClosed
	}
}

func (g *reportGroups) work() {
	var carry []*nodeReport // reports of nodes already in the previous group, or over its findings bound
	for {
		group := carry
		carry = nil
		if len(group) == 0 {
			select {
			case r := <-g.in:
				group = append(group, r)
			case <-g.quit:
				return
			}
		}
	drain:
		for len(group) < maxReportGroup {
			select {
			case r := <-g.in:
				group = append(group, r)
			default:
				break drain
			}
		}
		// One report per node per group (a multi-row upsert cannot touch a
		// row twice, and the node's later report must see its earlier
		// findings); the node's later report goes in the next group, as
		// does what exceeds maxGroupFindings.
		seen := make(map[[2]string]bool, len(group))
		distinct := group[:0:0]
		findings := 0
		for _, r := range group {
			n := r.findingCount()
			if seen[r.key] || (len(distinct) > 0 && findings+n > maxGroupFindings) {
				carry = append(carry, r)
				continue
			}
			seen[r.key] = true
			findings += n
			distinct = append(distinct, r)
		}
		g.write(distinct)
	}
}

// write stores a group, falling back to one transaction per report when
// the group fails (so one report's error is its own).
func (g *reportGroups) write(group []*nodeReport) {
	ctx, cancel := context.WithTimeout(context.Background(), reportGroupTimeout)
	defer cancel()
	res, err := g.s.writeGroup(ctx, group, false)
	if err == nil {
		g.committed.Add(1)
		g.reports.Add(int64(len(group)))
		for i, r := range group {
			r.done <- res[i]
		}
		return
	}
	if len(group) == 1 || errors.Is(translate(err), ErrUnavailable) {
		for _, r := range group {
			r.done <- nodeResult{err: err}
		}
		return
	}
	for _, r := range group {
		one, err := g.s.writeGroup(ctx, []*nodeReport{r}, false)
		if err != nil {
			r.done <- nodeResult{err: err}
			continue
		}
		g.committed.Add(1)
		g.reports.Add(1)
		r.done <- one[0]
	}
}

// writeGroup writes reports of distinct nodes in one transaction and
// returns, per report, whether the node's facts changed and how many of its
// findings were new; with ensureCluster it first creates the cluster row of
// group[0] (the first report of a cluster this Store has not seen, written
// alone). One pipelined batch takes the node locks, upserts the nodes and,
// when the group has findings, inserts those not stored yet
// (findingInsert, findings.go): one round trip in an implicit transaction,
// or, for a group of copyMinFindings findings or more, BEGIN, the batch
// (with a lookup of the stored findings), one COPY, COMMIT. Nothing is
// answered before the commit.
func (s *Store) writeGroup(ctx context.Context, group []*nodeReport, ensureCluster bool) ([]nodeResult, error) {
	n := len(group)
	var (
		clusters, nodes, boots, drivers = make([]string, n), make([]string, n), make([]string, n), make([]string, n)
		kernels, agents                 = make([]string, n), make([]string, n)
		hbs                             = make([][]byte, n)
		nows, sent                      = make([]time.Time, n), make([]*time.Time, n)
		index                           = make(map[[2]string]int, n)
		ins                             findingInsert
		set                             = make([]int, n) // the report's set in ins, -1: none
	)
	for i, r := range group {
		clusters[i], nodes[i], boots[i], drivers[i], kernels[i], agents[i] = r.cluster, r.node, r.boot, r.driver, r.kernel, r.agent
		hbs[i], nows[i], sent[i] = r.heartbeat, r.now, r.sentAt
		index[[2]string{r.cluster, r.node}] = i
		set[i] = -1
		if r.findingCount() > 0 {
			set[i] = ins.add(r.cluster, r.node, r.findings)
		}
	}
	b := &pgx.Batch{}
	if ensureCluster {
		b.Queue(sqlEnsureCluster, group[0].cluster, group[0].now)
	}
	b.Queue(sqlLockNodes, clusters, nodes)
	b.Queue(upsertNodesSQL, clusters, nodes, boots, drivers, kernels, agents, hbs, nows, sent)
	if ins.total > 0 {
		ins.queue(b)
	}
	out := make([]nodeResult, n)
	err := ins.run(ctx, s.pool, b, func(br pgx.BatchResults) error {
		for range 1 + btoi(ensureCluster) {
			if _, err := br.Exec(); err != nil {
				return err
			}
		}
		var (
			c, name string
			changed bool
			got     int
		)
		rows, err := br.Query()
		if err != nil {
			return err
		}
		_, err = pgx.ForEachRow(rows, []any{&c, &name, &changed}, func() error {
			i, ok := index[[2]string{c, name}]
			if !ok {
				return errors.New("upsert nodes: a row for a node not in the group")
			}
			out[i].changed = changed
			got++
			return nil
		})
		if err != nil {
			return err
		}
		if got != n {
			return errors.New("upsert nodes: fewer rows than reports")
		}
		if ins.total > 0 {
			return ins.read(br)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	for i := range group {
		if set[i] >= 0 {
			out[i].inserted = ins.inserted(set[i])
		}
	}
	return out, nil
}

func btoi(b bool) int {
	if b {
		return 1
	}
	return 0
}
