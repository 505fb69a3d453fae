package store_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"k8s.io/client-go/util/workqueue"

	"github.com/fleetrepair/fleetrepair/controller/store"
	"github.com/fleetrepair/fleetrepair/test/pgtest"
)

// BenchmarkFirstReports is a fleet's nodes appearing at once (the
// 100,000-node run 3 of docs/scale.md: the controller stalled), at the
// store: b.N new nodes each send their first report (a heartbeat, no
// findings) from firstReportAgents goroutines at once (web/api's
// DefaultMaxIngestInFlight), in a random order. With reads=groups the
// reconciler runs meanwhile as it did in that run: its work queue (a
// client-go work queue: one entry per node, a node never on two workers)
// holds every node from the start (the informers' Add events) and gets
// the node again after each report that answered Changed (web/api's
// OnIngest); firstReportWorkers workers take nodes from it and read them
// through ReadNodes groups of up to 64 nodes, two groups in flight, as
// controller/repair's evidence.go sends them. reads=none is the ingest
// alone.
//
// Figures: ingest-p50-ms and ingest-p99-ms are the reports' latencies,
// reports/s how many were answered per second until the last was,
// reads/s the nodes read per second until the queue was empty, and
// pg-us/node the CPU of the PostgreSQL backends per node (pgtest.BackendCPU:
// the figure that survives a shared machine).
//
//	go test ./controller/store -run '^$' -bench FirstReports -benchtime 4000x -count 3
func BenchmarkFirstReports(b *testing.B) {
	for _, reads := range []bool{false, true} {
		name := "reads=none"
		if reads {
			name = "reads=groups"
		}
		b.Run(name, func(b *testing.B) { benchFirstReports(b, reads) })
	}
}

const (
	firstReportAgents  = 64
	firstReportWorkers = 16
	firstReportGroup   = 64
)

func benchFirstReports(b *testing.B, reads bool) {
	ctx := context.Background()
	dsn := pgtest.DSN(b)
	s, err := store.Open(ctx, dsn)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(s.Close)
	stats, err := pgx.Connect(ctx, dsn)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = stats.Close(context.Background()) })
	cpu := func() time.Duration {
		d, err := pgtest.BackendCPU(ctx, stats)
		if err != nil {
			b.Fatal(err)
		}
		return d
	}
	n := b.N
	names := make([]string, n)
	for i := range names {
		names[i] = fmt.Sprintf("gpu-%06d", i)
	}
	order := rand.New(rand.NewPCG(1, uint64(n))).Perm(n)
	lat := make([]time.Duration, n)
	// The cluster's first report is written alone with the cluster row
	// (IngestReport): not what is measured.
	if _, err := s.IngestReport(ctx, report("load", "warm-up", "boot-1", 0, t0), t0); err != nil {
		b.Fatal(err)
	}

	q := workqueue.NewTyped[int]()
	var readNodes atomic.Int64
	var readers sync.WaitGroup
	if reads {
		for i := range n {
			q.Add(i) // the informers' Add events
		}
		send := make(chan *benchRead)
		for range 2 { // evidence.go's groupSenders
			go sendReadGroups(b, s, send)
		}
		for range firstReportWorkers {
			readers.Add(1)
			go func() {
				defer readers.Done()
				for {
					i, shutdown := q.Get()
					if shutdown {
						return
					}
					r := &benchRead{meta: store.Node{Cluster: "load", Name: names[i], NodePool: "gpu", Zone: fmt.Sprintf("zone-%d", i%4),
						InstanceType: "p5.48xlarge", NodeClaim: "claim-" + names[i],
						Labels: map[string]string{"topology.kubernetes.io/zone": fmt.Sprintf("zone-%d", i%4)}}, done: make(chan error, 1)}
					send <- r
					if err := <-r.done; err != nil {
						b.Error(err)
					}
					readNodes.Add(1)
					q.Done(i)
				}
			}()
		}
		b.Cleanup(func() { close(send) })
	}

	c0 := cpu()
	b.ResetTimer()
	start := time.Now()
	var next atomic.Int64
	var agents sync.WaitGroup
	for range firstReportAgents {
		agents.Add(1)
		go func() {
			defer agents.Done()
			for {
				k := int(next.Add(1)) - 1
				if k >= n {
					return
				}
				i := order[k]
				now := time.Now().UTC()
				t := time.Now()
				res, err := s.IngestReport(ctx, report("load", names[i], "boot-1", 0, now), now)
				lat[k] = time.Since(t)
				if err != nil || !res.Changed {
					b.Errorf("first report of %s: %+v, %v; want Changed", names[i], res, err)
					return
				}
				if reads {
					q.Add(i) // OnIngest: the node's facts changed
				}
			}
		}()
	}
	agents.Wait()
	ingested := time.Since(start)
	if reads {
		q.ShutDownWithDrain()
		readers.Wait()
	}
	all := time.Since(start)
	b.StopTimer()
	pg := cpu() - c0

	slices.Sort(lat)
	ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1e3 }
	b.ReportMetric(ms(lat[n/2]), "ingest-p50-ms")
	b.ReportMetric(ms(lat[min(n-1, n*99/100)]), "ingest-p99-ms")
	b.ReportMetric(float64(n)/ingested.Seconds(), "reports/s")
	if reads {
		b.ReportMetric(float64(readNodes.Load())/all.Seconds(), "reads/s")
	}
	b.ReportMetric(float64(pg.Microseconds())/float64(n), "pg-us/node")
}

// benchRead is one worker's ReadNode call in BenchmarkFirstReports.
type benchRead struct {
	meta store.Node
	done chan error
}

// sendReadGroups sends the reads waiting on in as ReadNodes groups of up
// to firstReportGroup nodes (evidence.go's group) until in is closed.
func sendReadGroups(b *testing.B, s *store.Store, in <-chan *benchRead) {
	for r := range in {
		group := []*benchRead{r}
	drain:
		for len(group) < firstReportGroup {
			select {
			case r, ok := <-in:
				if !ok {
					break drain
				}
				group = append(group, r)
			default:
				break drain
			}
		}
		metas := make([]store.Node, len(group))
		for i, r := range group {
			metas[i] = r.meta
		}
		_, err := s.ReadNodes(context.Background(), metas, 0, time.Now().UTC())
		for _, r := range group {
			r.done <- err
		}
	}
}
