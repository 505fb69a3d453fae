package store_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fleetrepair/fleetrepair/agent/finding"
)

// BenchmarkIngestReport measures IngestReport with batches of 100 new
// findings from one node (each iteration a new batch: nothing deduplicated).
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
		r.Findings = make([]finding.Finding, batch)
		for j, f := range base.Findings {
			f.Seq = uint64(i*batch + j)
			f.ID = fmt.Sprintf("bench-%d-%d", i, j)
			r.Findings[j] = f
		}
		n, err := s.IngestReport(ctx, r, t0.Add(time.Duration(i)*time.Second))
		if err != nil || n.Inserted != batch {
			b.Fatalf("ingest: %+v, %v", n, err)
		}
		i++
	}
	b.ReportMetric(float64(batch*b.N)/b.Elapsed().Seconds(), "findings/s")
}

// BenchmarkIngestReportParallel is BenchmarkIngestReport with many agents
// reporting at once (one node per goroutine), as the ingest endpoint sees it.
func BenchmarkIngestReportParallel(b *testing.B) {
	ctx := context.Background()
	s := open(b)
	const batch = 100
	var node atomic.Int64
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		name := fmt.Sprintf("n%d", node.Add(1))
		base := report("c1", name, "boot-a", batch, t0)
		i := 0
		for pb.Next() {
			r := base
			r.Findings = make([]finding.Finding, batch)
			for j, f := range base.Findings {
				f.ID = fmt.Sprintf("%s-%d-%d", name, i, j)
				r.Findings[j] = f
			}
			if _, err := s.IngestReport(ctx, r, t0.Add(time.Duration(i)*time.Second)); err != nil {
				b.Error(err)
				return
			}
			i++
		}
	})
	b.ReportMetric(float64(batch*b.N)/b.Elapsed().Seconds(), "findings/s")
}
