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
// controller/repair's evidence.go sends them. reads=known is the same
// after the Add events' reconciles (the nodes' Kubernetes facts stored,
// no agent's yet): only the reports' triggers are queued. reads=none is
// the ingest alone.
//
// Figures: ingest-p50-ms and ingest-p99-ms are the reports' latencies,
// reports/s how many were answered per second until the last was,
// reads/s the nodes read per second until the queue was empty, and
// pg-us/node the CPU of the PostgreSQL backends per node (pgtest.BackendCPU:
// the figure that survives a shared machine), node-lock-waiters how many
// backends were waiting for a node's lock (the ingest groups' and the
// reads' advisory locks, rows and keys), on average over samples taken
// every millisecond: a figure of the contention itself, whatever the
// machine's load; other-lock-waiters the same for any other lock.
//
//	go test ./controller/store -run '^$' -bench FirstReports -benchtime 4000x -count 3
func BenchmarkFirstReports(b *testing.B) {
	for _, reads := range []firstReads{readsNone, readsGroups, readsKnown} {
		b.Run("reads="+string(reads), func(b *testing.B) { benchFirstReports(b, reads) })
	}
}

// firstReads is what the reconciler does in BenchmarkFirstReports.
type firstReads string

const (
	readsNone   firstReads = "none"   // nothing: the ingest alone
	readsGroups firstReads = "groups" // every node queued from the start, and again after its report
	// readsKnown: the nodes' Kubernetes facts were recorded before (the
	// informers' Add reconciles done before the agents started); each
	// report's trigger is a reconcile of a node whose facts are unchanged.
	readsKnown firstReads = "known"
)

const (
	firstReportAgents  = 64
	firstReportWorkers = 16
	firstReportGroup   = 64
)

func benchFirstReports(b *testing.B, mode firstReads) {
	reads := mode != readsNone
	ctx := context.Background()
	s, dsn, cpu := openMeasured(b)
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

	meta := func(i int) store.Node {
		zone := fmt.Sprintf("zone-%d", i%4)
		return store.Node{Cluster: "load", Name: names[i], NodePool: "gpu", Zone: zone, InstanceType: "p5.48xlarge",
			NodeClaim: "claim-" + names[i], Labels: map[string]string{"topology.kubernetes.io/zone": zone}}
	}
	if mode == readsKnown {
		for i := 0; i < n; i += firstReportGroup {
			metas := make([]store.Node, 0, firstReportGroup)
			for j := i; j < min(n, i+firstReportGroup); j++ {
				metas = append(metas, meta(j))
			}
			if _, err := s.ReadNodes(ctx, metas, 0, t0); err != nil {
				b.Fatal(err)
			}
		}
	}

	q := workqueue.NewTyped[int]()
	var readNodes atomic.Int64
	var readers sync.WaitGroup
	if reads {
		if mode == readsGroups {
			for i := range n {
				q.Add(i) // the informers' Add events
			}
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
					r := &benchRead{meta: meta(i), done: make(chan error, 1)}
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

	waits := sampleLockWaits(b, dsn)
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
	nodeWaits, otherWaits := waits()

	slices.Sort(lat)
	ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1e3 }
	b.ReportMetric(ms(lat[n/2]), "ingest-p50-ms")
	b.ReportMetric(ms(lat[min(n-1, n*99/100)]), "ingest-p99-ms")
	b.ReportMetric(float64(n)/ingested.Seconds(), "reports/s")
	if reads {
		b.ReportMetric(float64(readNodes.Load())/all.Seconds(), "reads/s")
	}
	b.ReportMetric(float64(pg.Microseconds())/float64(n), "pg-us/node")
	b.ReportMetric(nodeWaits, "node-lock-waiters")
	b.ReportMetric(otherWaits, "other-lock-waiters")
}

// sampleLockWaits counts, every millisecond until the returned function is
// called, the backends of dsn's database waiting for a node's lock (an
// advisory lock, a row or a key another transaction writes) and for any
// other lock (a relation's extension, ...); the function returns the two
// means per sample.
func sampleLockWaits(b *testing.B, dsn string) func() (node, other float64) {
	ctx, cancel := context.WithCancel(context.Background())
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		b.Fatal(err)
	}
	var samples, waiting, other int
	done := make(chan struct{})
	go func() {
		defer close(done)
		defer func() { _ = conn.Close(context.Background()) }()
		for ctx.Err() == nil {
			var n, o int
			if err := conn.QueryRow(ctx, `SELECT count(*) FILTER (WHERE wait_event IN ('advisory', 'transactionid', 'tuple', 'speculative token')),
				count(*) FILTER (WHERE wait_event NOT IN ('advisory', 'transactionid', 'tuple', 'speculative token'))
				FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'`).Scan(&n, &o); err != nil {
				return
			}
			samples, waiting, other = samples+1, waiting+n, other+o
			time.Sleep(time.Millisecond)
		}
	}()
	return func() (float64, float64) {
		cancel()
		<-done
		s := float64(max(samples, 1))
		return float64(waiting) / s, float64(other) / s
	}
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

// BenchmarkReadNodesUnchanged is the reconciles' read of nodes whose
// Kubernetes facts are stored already (every reconcile but a node's first,
// or one after a change): b.N groups of 16 nodes (the work queue's 16
// workers), each node with a heartbeat and no findings, read one group
// after the other from one caller. pg-us/node is the CPU of the PostgreSQL
// backends per node read, read-us/node the calls' wall time.
//
//	go test ./controller/store -run '^$' -bench ReadNodesUnchanged -benchtime 500x -count 3
func BenchmarkReadNodesUnchanged(b *testing.B) {
	ctx := context.Background()
	s, _, cpu := openMeasured(b)
	const nodes, group = 1600, firstReportWorkers
	metas := make([]store.Node, nodes)
	for i := range metas {
		name, zone := fmt.Sprintf("gpu-%05d", i), fmt.Sprintf("zone-%d", i%4)
		metas[i] = store.Node{Cluster: "load", Name: name, NodePool: "gpu", Zone: zone, InstanceType: "p5.48xlarge",
			NodeClaim: "claim-" + name, Labels: map[string]string{"topology.kubernetes.io/zone": zone}}
		if _, err := s.IngestReport(ctx, report("load", name, "boot-1", 0, t0), t0); err != nil {
			b.Fatal(err)
		}
	}
	for i := 0; i < nodes; i += group {
		if _, err := s.ReadNodes(ctx, metas[i:i+group], 0, t0); err != nil {
			b.Fatal(err)
		}
	}
	c0 := cpu()
	b.ResetTimer()
	for g := range b.N {
		i := g * group % nodes
		if _, err := s.ReadNodes(ctx, metas[i:i+group], 0, t0.Add(time.Duration(g)*time.Second)); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	pg := cpu() - c0
	read := float64(b.N * group)
	b.ReportMetric(float64(pg.Microseconds())/read, "pg-us/node")
	b.ReportMetric(float64(b.Elapsed().Microseconds())/read, "read-us/node")
}

// openMeasured returns a Store on a fresh database of its own, the
// database's DSN, and a function returning the CPU time so far of the
// PostgreSQL backends serving it (pgtest.BackendCPU, from a connection of
// its own): benchmarks report the difference of two calls.
func openMeasured(b *testing.B) (*store.Store, string, func() time.Duration) {
	b.Helper()
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
	return s, dsn, func() time.Duration {
		d, err := pgtest.BackendCPU(ctx, stats)
		if err != nil {
			b.Fatal(err)
		}
		return d
	}
}
