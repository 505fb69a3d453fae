package store

import (
	"context"
	"sort"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/fleetrepair/fleetrepair/agent/finding"
)

// JobIngestResult is what IngestJobFindings stored.
type JobIngestResult struct {
	// Inserted counts the findings stored for the first time (a resent
	// report inserts 0).
	Inserted int
	// Nodes are the nodes that got at least one new finding, sorted: the
	// ones to reconcile.
	Nodes []string
}

// IngestJobFindings stores findings of several nodes of one cluster that
// come from a job's report (finding.JobReport.Findings), not from the
// nodes' agents: the nodes' agent facts (boot ID, last seen, heartbeat)
// are left as they are, and a node no agent has reported yet gets no node
// row. Findings are deduplicated by ID per node as IngestReport's are
// (findingInsert), all in one transaction (one pipelined batch) with each
// node's lock taken in key order. Every
// finding must name its node. Errors wrap ErrInvalid for values no column
// holds, ErrUnavailable when PostgreSQL cannot be reached.
func (s *Store) IngestJobFindings(ctx context.Context, cluster string, fs []finding.Finding, now time.Time) (JobIngestResult, error) {
	if cluster == "" {
		return JobIngestResult{}, invalidf("ingest job findings: cluster is required")
	}
	byNode := map[string]*findingRows{}
	for _, f := range fs {
		if f.Node == "" {
			return JobIngestResult{}, invalidf("ingest job findings: finding %s names no node", f.ID)
		}
		w := byNode[f.Node]
		if w == nil {
			w = newFindingRows(4, now)
			byNode[f.Node] = w
		}
		if err := w.add(f, ""); err != nil {
			return JobIngestResult{}, err
		}
	}
	nodes := make([]string, 0, len(byNode))
	for n := range byNode {
		nodes = append(nodes, n)
	}
	// Lock order: the advisory lock keys, as sqlLockNodes takes them.
	sort.Strings(nodes)
	var (
		res JobIngestResult
		ins findingInsert
	)
	clusters := make([]string, len(nodes))
	for i, n := range nodes {
		clusters[i] = cluster
		ins.add(cluster, n, byNode[n])
	}
	_, known := s.clusters.Load(cluster)
	b := &pgx.Batch{}
	if !known {
		b.Queue(sqlEnsureCluster, cluster, now)
	}
	b.Queue(sqlLockNodes, clusters, nodes)
	ins.queue(b)
	err := ins.run(ctx, s.pool, b, func(br pgx.BatchResults) error {
		for range 1 + btoi(!known) {
			if _, err := br.Exec(); err != nil {
				return err
			}
		}
		return ins.read(br)
	})
	if err != nil {
		return JobIngestResult{}, errorf(err, "ingest job findings of cluster %s", cluster)
	}
	s.clusters.Store(cluster, true)
	for i, n := range nodes {
		if k := ins.inserted(i); k > 0 {
			res.Inserted += k
			res.Nodes = append(res.Nodes, n)
		}
	}
	return res, nil
}
