package store

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
)

// Reports without findings (heartbeats, about 3,300/s for 100,000 nodes) are
// written in groups: each of a few writer goroutines takes the reports
// waiting when it is free, up to maxHeartbeatGroup of distinct nodes, and
// writes them with one lock statement and one multi-row upsert in one round
// trip and one transaction. Under load the groups grow on their own (more
// reports arrive while a group is written); alone, a report waits for
// nobody. A group that fails is written again one report per transaction,
// so one report's error is its own.
const (
	maxHeartbeatGroup = 256
	// heartbeatGroupTimeout bounds the write of one group; the callers'
	// own deadlines still apply to their wait.
	heartbeatGroupTimeout = 10 * time.Second

	// The node locks of the group, taken in key order so that two groups
	// never wait on each other in a cycle (a single report takes one).
	sqlLockNodes = `
SELECT count(pg_advisory_xact_lock(k)) FROM (
    SELECT hashtextextended(c || '/' || n, 0) AS k FROM unnest($1::text[], $2::text[]) AS t(c, n) ORDER BY k) keys`

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

// nodeReport is the node part of one report, as the upserts take it.
type nodeReport struct {
	cluster, node               string
	boot, driver, kernel, agent string
	heartbeat                   []byte // nil: no heartbeat in the report
	sentAt                      *time.Time
	now                         time.Time
	done                        chan nodeResult // buffered (1)
	key                         [2]string
}

type nodeResult struct {
	changed bool
	err     error
}

// errStoreClosed answers reports submitted after Close.
var errStoreClosed = &dbError{kind: ErrUnavailable, err: errors.New("store closed")}

type heartbeatGroups struct {
	s        *Store
	in       chan *nodeReport
	quit     chan struct{}
	stopOnce sync.Once
}

func startHeartbeatGroups(s *Store, writers int) *heartbeatGroups {
	g := &heartbeatGroups{s: s, in: make(chan *nodeReport, 4*maxHeartbeatGroup), quit: make(chan struct{})}
	for range max(writers, 1) {
		go g.work()
	}
	return g
}

func (g *heartbeatGroups) stop() { g.stopOnce.Do(func() { close(g.quit) }) }

// submit queues r and waits for its result, ctx's end or Close.
func (g *heartbeatGroups) submit(ctx context.Context, r *nodeReport) (bool, error) {
	r.done = make(chan nodeResult, 1)
	r.key = [2]string{r.cluster, r.node}
	select {
	case g.in <- r:
	case <-ctx.Done():
		return false, ctx.Err()
	case <-g.quit:
		return false, errStoreClosed
	}
	select {
	case res := <-r.done:
		return res.changed, res.err
	case <-ctx.Done():
		return false, ctx.Err() // the write may still happen: a heartbeat, harmless
	case <-g.quit:
		return false, errStoreClosed
	}
}

func (g *heartbeatGroups) work() {
	var carry []*nodeReport // reports of nodes already in the previous group
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
		for len(group) < maxHeartbeatGroup {
			select {
			case r := <-g.in:
				group = append(group, r)
			default:
				break drain
			}
		}
		// One report per node per group (a multi-row upsert cannot touch a
		// row twice); the node's later report goes in the next group.
		seen := make(map[[2]string]bool, len(group))
		distinct := group[:0:0]
		for _, r := range group {
			if seen[r.key] {
				carry = append(carry, r)
				continue
			}
			seen[r.key] = true
			distinct = append(distinct, r)
		}
		g.write(distinct)
	}
}

// write stores a group, falling back to one transaction per report when
// the group fails (so one report's error is its own).
func (g *heartbeatGroups) write(group []*nodeReport) {
	ctx, cancel := context.WithTimeout(context.Background(), heartbeatGroupTimeout)
	defer cancel()
	changed, err := g.s.upsertNodes(ctx, group)
	if err == nil {
		for i, r := range group {
			r.done <- nodeResult{changed: changed[i]}
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
		c, err := g.s.upsertNodes(ctx, []*nodeReport{r})
		if err != nil {
			r.done <- nodeResult{err: err}
			continue
		}
		r.done <- nodeResult{changed: c[0]}
	}
}

// upsertNodes writes the node facts of reports of distinct nodes in one
// transaction and returns, per report, whether the node's facts changed.
func (s *Store) upsertNodes(ctx context.Context, group []*nodeReport) ([]bool, error) {
	n := len(group)
	var (
		clusters, nodes, boots, drivers = make([]string, n), make([]string, n), make([]string, n), make([]string, n)
		kernels, agents                 = make([]string, n), make([]string, n)
		hbs                             = make([][]byte, n)
		nows, sent                      = make([]time.Time, n), make([]*time.Time, n)
		index                           = make(map[[2]string]int, n)
	)
	for i, r := range group {
		clusters[i], nodes[i], boots[i], drivers[i], kernels[i], agents[i] = r.cluster, r.node, r.boot, r.driver, r.kernel, r.agent
		hbs[i], nows[i], sent[i] = r.heartbeat, r.now, r.sentAt
		index[[2]string{r.cluster, r.node}] = i
	}
	b := &pgx.Batch{}
	b.Queue(sqlLockNodes, clusters, nodes)
	b.Queue(upsertNodesSQL, clusters, nodes, boots, drivers, kernels, agents, hbs, nows, sent)
	br := s.pool.SendBatch(ctx, b)
	defer br.Close()
	if _, err := br.Exec(); err != nil {
		return nil, err
	}
	rows, err := br.Query()
	if err != nil {
		return nil, err
	}
	out := make([]bool, n)
	var (
		c, name string
		changed bool
		got     int
	)
	_, err = pgx.ForEachRow(rows, []any{&c, &name, &changed}, func() error {
		i, ok := index[[2]string{c, name}]
		if !ok {
			return errors.New("upsert nodes: a row for a node not in the group")
		}
		out[i] = changed
		got++
		return nil
	})
	if err != nil {
		return nil, err
	}
	if got != n {
		return nil, errors.New("upsert nodes: fewer rows than reports")
	}
	return out, br.Close()
}
