package store_test

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/fleetrepair/fleetrepair/agent/finding"
	"github.com/fleetrepair/fleetrepair/controller/store"
)

// benchNodes is how many nodes the ingest benchmarks spread their reports
// over: a fleet, not one node holding every finding.
const benchNodes = 1000

// benchAgents x GOMAXPROCS goroutines report at once in the parallel
// benchmarks: the ingest route serves thousands of agents, many in flight.
const benchAgents = 32

// BenchmarkIngestReport measures IngestReport with batches of 100 new
// findings, each from the next of benchNodes nodes (each iteration a new
// batch: nothing deduplicated).
func BenchmarkIngestReport(b *testing.B) {
	ctx := context.Background()
	s := open(b)
	const batch = 100
	base := report("c1", "n1", "boot-a", batch, t0)
	b.ReportAllocs()
	b.ResetTimer()
	i := 0
	for b.Loop() {
		r := base
		r.Node = fmt.Sprintf("n%d", i%benchNodes)
		r.Findings = make([]finding.Finding, batch)
		for j, f := range base.Findings {
			f.Seq = uint64(i*batch + j)
			f.Node = r.Node
			f.ID = fmt.Sprintf("bench-%d-%d", i, j)
			r.Findings[j] = f
		}
		n, err := s.IngestReport(ctx, r, t0.Add(time.Duration(i)*time.Millisecond))
		if err != nil || n.Inserted != batch {
			b.Fatalf("ingest: %+v, %v", n, err)
		}
		i++
	}
	b.ReportMetric(float64(batch*b.N)/b.Elapsed().Seconds(), "findings/s")
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "reports/s")
}

// BenchmarkIngestReportParallel is BenchmarkIngestReport with many agents
// reporting at once, as the ingest endpoint sees it: each goroutine reports
// for its own nodes in turn.
func BenchmarkIngestReportParallel(b *testing.B) {
	ctx := context.Background()
	s := open(b)
	const batch = 100
	var worker atomic.Int64
	b.SetParallelism(benchAgents)
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		w := worker.Add(1)
		base := report("c1", "n1", "boot-a", batch, t0)
		i := 0
		for pb.Next() {
			r := base
			r.Node = fmt.Sprintf("w%d-n%d", w, i%benchNodes)
			r.Findings = make([]finding.Finding, batch)
			for j, f := range base.Findings {
				f.Node = r.Node
				f.ID = fmt.Sprintf("%d-%d-%d", w, i, j)
				r.Findings[j] = f
			}
			if _, err := s.IngestReport(ctx, r, t0.Add(time.Duration(i)*time.Millisecond)); err != nil {
				b.Error(err)
				return
			}
			i++
		}
	})
	b.ReportMetric(float64(batch*b.N)/b.Elapsed().Seconds(), "findings/s")
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "reports/s")
}

// BenchmarkIngestSmallReportParallel is the shape of a fleet's findings
// traffic (a zone wave, background noise): many agents at once, each
// report carrying one new finding for its own node.
func BenchmarkIngestSmallReportParallel(b *testing.B) {
	ctx := context.Background()
	s := open(b)
	var worker atomic.Int64
	b.SetParallelism(benchAgents)
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		w := worker.Add(1)
		base := report("c1", "n1", "boot-a", 1, t0)
		i := 0
		for pb.Next() {
			r := base
			r.Node = fmt.Sprintf("w%d-n%d", w, i%benchNodes)
			f := base.Findings[0]
			f.Node, f.ID = r.Node, fmt.Sprintf("%d-%d", w, i)
			r.Findings = []finding.Finding{f}
			res, err := s.IngestReport(ctx, r, t0.Add(time.Duration(i)*time.Millisecond))
			if err != nil || res.Inserted != 1 {
				b.Errorf("ingest: %+v, %v; want 1 inserted", res, err)
				return
			}
			i++
		}
	})
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "findings/s")
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "reports/s")
}

// BenchmarkIngestHeartbeat measures the steady state of a fleet: reports
// without findings whose heartbeat changes nothing (the same boot ID,
// versions and monitor states as the node's previous report), from 10,000
// nodes in turn, many at once. Each must answer Changed = false.
// IngestReport writes such reports in groups (groupcommit.go).
func BenchmarkIngestHeartbeat(b *testing.B) {
	ctx := context.Background()
	s := open(b)
	const nodes = 10000
	for i := range nodes {
		r := report("c1", fmt.Sprintf("n%d", i), "boot-a", 0, t0)
		if _, err := s.IngestReport(ctx, r, t0); err != nil {
			b.Fatal(err)
		}
	}
	var next atomic.Int64
	b.SetParallelism(benchAgents)
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			i := next.Add(1)
			r := report("c1", fmt.Sprintf("n%d", i%nodes), "boot-a", 0, t0)
			r.SentAt = t0.Add(time.Duration(i) * time.Millisecond)
			res, err := s.IngestReport(ctx, r, r.SentAt)
			if err != nil || res.Changed || res.Inserted != 0 {
				b.Errorf("heartbeat: %+v, %v; want nothing changed", res, err)
				return
			}
		}
	})
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "reports/s")
}

// BenchmarkSweepRemovedNodes: the removed-node sweep of one 10,000-node
// cluster in its steady state (every stored node listed, nothing to mark),
// which every periodic pass runs per cluster. The seeding is not timed.
func BenchmarkSweepRemovedNodes(b *testing.B) {
	ctx := context.Background()
	s := open(b)
	const nodes = 10000
	names := make([]string, nodes)
	metas := make([]store.Node, 0, 500)
	for i := range nodes {
		names[i] = fmt.Sprintf("gpu-%05d", i)
		metas = append(metas, store.Node{Cluster: "c1", Name: names[i], NodePool: "gpu", Zone: fmt.Sprintf("z%d", i%4)})
		if len(metas) == cap(metas) {
			if _, err := s.ReadNodes(ctx, metas, 1, t0); err != nil {
				b.Fatal(err)
			}
			metas = metas[:0]
		}
	}
	listed := t0.Add(time.Hour)
	logSweepPlan(b, s, names, listed)
	b.ResetTimer()
	for b.Loop() {
		swept, err := s.SweepRemovedNodes(ctx, store.NodeSweep{Cluster: "c1", Present: names, ListedAt: listed}, listed)
		if err != nil || len(swept) != 0 {
			b.Fatalf("swept %d, %v; want nothing", len(swept), err)
		}
	}
}

// logSweepPlan logs the EXPLAIN (ANALYZE, BUFFERS) plans of the sweep's
// statements on the benchmark's rows: the read of the candidates, and the
// update of a tenth of the nodes as gone, in a transaction rolled back.
func logSweepPlan(b *testing.B, s *store.Store, names []string, listed time.Time) {
	b.Helper()
	ctx := context.Background()
	tx, err := s.Pool().Begin(ctx)
	if err != nil {
		b.Fatal(err)
	}
	defer func() { _ = tx.Rollback(ctx) }()
	for _, q := range []struct {
		sql  string
		args []any
	}{
		{store.SQLSweepCandidates, []any{"c1", listed, listed}},
		{store.SQLSweepMark, []any{"c1", names[:len(names)/10], listed, listed, listed}},
	} {
		rows, _ := tx.Query(ctx, "EXPLAIN (ANALYZE, BUFFERS) "+q.sql, q.args...)
		plan, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			b.Fatal(err)
		}
		b.Logf("sweep plan:\n%s", strings.Join(plan, "\n"))
	}
}
