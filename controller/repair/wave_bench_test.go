package repair

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/fleetrepair/fleetrepair/agent/finding"
	"github.com/fleetrepair/fleetrepair/controller/breaker"
	"github.com/fleetrepair/fleetrepair/controller/diagnose"
	"github.com/fleetrepair/fleetrepair/controller/kube"
	"github.com/fleetrepair/fleetrepair/controller/store"
	"github.com/fleetrepair/fleetrepair/test/envtest"
	"github.com/fleetrepair/fleetrepair/test/karpentersim"
	"github.com/fleetrepair/fleetrepair/test/pgtest"
)

// BenchmarkWaveLedgerStep is the evidence phase of a zone wave
// (docs/scale.md, issue 9): b.N nodes on a real kube-apiserver (informer
// cache, as in production) each have a GPU-lost finding stored, and the
// reconcile's ledger step (reconcile with ledgerOnly: diagnoses recorded,
// repair opened, breaker consulted) runs for every one of them on the
// given number of workers against the real PostgreSQL of test/pgtest. The
// figure is nodes/s; the follow-up (Kubernetes writes) is
// BenchmarkWaveFollowUp's. group is Config.EvidenceGroup: 1 sends every
// node's read and write alone, DefaultEvidenceGroup lets the workers in
// the step at the same time share their round trips (evidence.go);
// nodes/read and nodes/write are the nodes per round trip of each kind (1
// when alone); pg-ms/node is the CPU time of the PostgreSQL backends
// serving the benchmark's database and ctrl-ms/node the benchmark
// process's (the reconciler, its cache and pgx), per node: on a shared
// machine they compare runs better than nodes/s.
//
//	go test ./controller/repair -run '^$' -bench WaveLedgerStep -benchtime 400x
func BenchmarkWaveLedgerStep(b *testing.B) {
	for _, workers := range []int{4, 16} {
		for _, group := range []int{1, DefaultEvidenceGroup} {
			b.Run(fmt.Sprintf("workers=%d/group=%d", workers, group), func(b *testing.B) {
				w := newWaveBench(b, b.N, group)
				c0 := w.cpu(b)
				b.ResetTimer()
				w.run(b, workers, true)
				b.StopTimer()
				w.cpu(b).since(c0).report(b, len(w.nodes))
				if g, ok := w.rec.evidence.(*evidenceGroups); ok {
					b.ReportMetric(float64(g.reads.calls.Load())/float64(g.reads.sent.Load()), "nodes/read")
					b.ReportMetric(float64(g.writes.calls.Load())/float64(g.writes.sent.Load()), "nodes/write")
				}
				w.checkOpen(b)
			})
		}
	}
}

// BenchmarkWaveFollowUp is the reconcile after the ledger step
// (BenchmarkWaveLedgerStep, untimed here) of each of b.N wave nodes: the
// quarantine written, the repair advanced, the Events recorded.
func BenchmarkWaveFollowUp(b *testing.B) {
	w := newWaveBench(b, b.N, DefaultEvidenceGroup)
	w.run(b, 16, true)
	c0 := w.cpu(b)
	b.ResetTimer()
	w.run(b, 16, false)
	b.StopTimer()
	w.cpu(b).since(c0).report(b, len(w.nodes))
}

type waveBench struct {
	rec   *Reconciler
	nodes []string
	// stats is a connection of its own to the benchmark's database, which
	// lists the backends serving it (cpu).
	stats *pgx.Conn
}

// cpuTimes are CPU times so far of the processes a wave step costs.
type cpuTimes struct {
	// pg: the PostgreSQL backends serving the benchmark's database; self:
	// this process (the reconciler, its cache, pgx); kube: the
	// kube-apiserver and etcd this process started (envtest).
	pg, self, kube time.Duration
}

func (c cpuTimes) since(o cpuTimes) cpuTimes {
	return cpuTimes{pg: c.pg - o.pg, self: c.self - o.self, kube: c.kube - o.kube}
}

// report reports c per node: pg-ms/node, ctrl-ms/node, kube-ms/node.
func (c cpuTimes) report(b *testing.B, nodes int) {
	per := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1e3 / float64(nodes) }
	b.ReportMetric(per(c.pg), "pg-ms/node")
	b.ReportMetric(per(c.self), "ctrl-ms/node")
	b.ReportMetric(per(c.kube), "kube-ms/node")
}

// cpu returns the CPU time so far of the PostgreSQL backends connected to
// the benchmark's database (but stats's own), from /proc/PID/schedstat
// (nanoseconds; a backend that ended meanwhile is not counted, pgxpool
// keeps its connections), of this process (getrusage) and of its child
// kube-apiserver and etcd processes.
func (w *waveBench) cpu(b *testing.B) cpuTimes {
	b.Helper()
	var c cpuTimes
	pg, err := pgtest.BackendCPU(context.Background(), w.stats)
	if err != nil {
		b.Fatal(err)
	}
	c.pg = pg
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	c.self = time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	ents, err := os.ReadDir("/proc")
	if err != nil {
		b.Fatal(err)
	}
	self := os.Getpid()
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		s := string(raw)
		i := strings.LastIndexByte(s, ')')
		if err != nil || i < 0 {
			continue
		}
		comm := s[strings.IndexByte(s, '(')+1 : i]
		f := strings.Fields(s[i+1:]) // state, ppid, ...
		if len(f) < 13 || f[1] != strconv.Itoa(self) || comm != "kube-apiserver" && comm != "etcd" {
			continue
		}
		// utime and stime of every thread, in clock ticks (100 Hz: the
		// schedstat of a multi-threaded process is its first thread's)
		ut, _ := strconv.ParseInt(f[11], 10, 64)
		st, _ := strconv.ParseInt(f[12], 10, 64)
		c.kube += time.Duration(ut+st) * 10 * time.Millisecond
	}
	return c
}

func newWaveBench(b *testing.B, n, group int) *waveBench {
	return newWaveBenchRun(b, n, group, false)
}

// newWaveBenchRun is newWaveBench; with run the reconciler runs (Run: its
// work queue, workers, breaker evaluations and the informers' watches)
// instead of the cache alone.
func newWaveBenchRun(b *testing.B, n, group int, run bool) *waveBench {
	b.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	b.Cleanup(cancel)
	env := envtest.Start(b, envtest.Options{})
	dsn := pgtest.DSN(b)
	st, err := store.Open(ctx, dsn)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(st.Close)
	stats, err := pgx.Connect(ctx, dsn)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = stats.Close(context.Background()) })
	sim := karpentersim.New(env.Client, 0)
	if err := sim.CreateNodePool(ctx, "gpu"); err != nil {
		b.Fatal(err)
	}
	names := make([]string, n)
	for i := range names {
		names[i] = fmt.Sprintf("gpu-%05d", i)
	}
	// The fleet: the wave's nodes in zone-a, as many again elsewhere.
	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		errs []error
	)
	work := make(chan karpentersim.NodeSpec)
	for range 8 {
		wg.Go(func() {
			for spec := range work {
				if err := sim.CreateNode(ctx, spec); err != nil {
					mu.Lock()
					errs = append(errs, err)
					mu.Unlock()
				}
			}
		})
	}
	for i := range 2 * n {
		zone, name := "zone-a", fmt.Sprintf("gpu-%05d", i)
		if i >= n {
			zone = fmt.Sprintf("zone-%c", 'b'+i%3)
		}
		work <- karpentersim.NodeSpec{Name: name, NodePool: "gpu", Zone: zone, InstanceType: "p5.48xlarge", GPUs: 8}
	}
	close(work)
	wg.Wait()
	if len(errs) > 0 {
		b.Fatal(errs[0])
	}
	k, err := kube.NewCached("load", env.Config, kube.CachedOptions{})
	if err != nil {
		b.Fatal(err)
	}
	pol, err := breaker.NewPolicy(breaker.Config{})
	if err != nil {
		b.Fatal(err)
	}
	eng, _ := diagnose.New(diagnose.Options{})
	rec, err := New(Config{Store: st, Engine: eng, Clusters: map[string]*kube.Cluster{"load": k}, Breaker: pol,
		Toleration: time.Hour, Resync: time.Hour, Workers: 16, EvidenceGroup: group, Log: slog.New(slog.DiscardHandler)})
	if err != nil {
		b.Fatal(err)
	}
	if run {
		go func() { _ = rec.Run(ctx) }()
	} else {
		go func() { _ = k.Run(ctx, nil) }()
	}
	deadline := time.Now().Add(2 * time.Minute)
	for k.Probe(ctx) != nil {
		if time.Now().After(deadline) {
			b.Fatal("cache of the benchmark cluster never synced")
		}
		time.Sleep(20 * time.Millisecond)
	}
	if _, err := st.SetClusterBudget(ctx, "load", 100, 10, time.Now()); err != nil {
		b.Fatal(err)
	}
	// Every node heartbeated once (its agent row and boot ID), the breakers
	// evaluated on a healthy fleet, then the wave's findings stored.
	for i := range 2 * n {
		name := fmt.Sprintf("gpu-%05d", i)
		if _, err := st.IngestReport(ctx, finding.Report{SchemaVersion: finding.SchemaVersion, Cluster: "load", Node: name,
			BootID: "boot-1", Heartbeat: &finding.Heartbeat{DriverVersion: "550.54.15", GPUCount: 8}}, time.Now()); err != nil {
			b.Fatal(err)
		}
	}
	if err := rec.EvaluateBreakers(ctx); err != nil {
		b.Fatal(err)
	}
	for _, name := range names {
		f := finding.Finding{Detector: finding.DetectorXid, Xid: 79, GPUPCI: "0000:02:00.0", Node: name, BootID: "boot-1", Count: 1,
			Time: time.Now(), Evidence: []string{"NVRM: Xid (PCI:0000:02:00): 79, GPU has fallen off the bus."}}
		f.ID = finding.NewID(f)
		if _, err := st.IngestReport(ctx, finding.Report{SchemaVersion: finding.SchemaVersion, Cluster: "load", Node: name,
			BootID: "boot-1", Findings: []finding.Finding{f}}, time.Now()); err != nil {
			b.Fatal(err)
		}
	}
	return &waveBench{rec: rec, nodes: names, stats: stats}
}

// run reconciles every wave node once on workers goroutines and reports
// nodes/s; a failed reconcile fails the benchmark.
func (w *waveBench) run(b *testing.B, workers int, ledgerOnly bool) {
	b.Helper()
	ctx := context.Background()
	start := time.Now()
	todo := make(chan string)
	errs := make(chan error, len(w.nodes))
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for n := range todo {
				if _, err := w.rec.reconcile(ctx, "load", n, ledgerOnly); err != nil {
					errs <- err
				}
			}
		})
	}
	for _, n := range w.nodes {
		todo <- n
	}
	close(todo)
	wg.Wait()
	close(errs)
	for err := range errs {
		b.Fatal(err)
	}
	b.ReportMetric(float64(len(w.nodes))/time.Since(start).Seconds(), "nodes/s")
}

// checkOpen fails the benchmark unless every wave node has an open repair.
func (w *waveBench) checkOpen(b *testing.B) {
	b.Helper()
	open, err := w.rec.cfg.Store.RepairsInState(context.Background())
	if err != nil {
		b.Fatal(err)
	}
	if len(open) != len(w.nodes) {
		b.Fatalf("%d repairs open after the ledger step of %d wave nodes", len(open), len(w.nodes))
	}
}

// BenchmarkWaveOpen is the zone wave through the running reconciler
// (Run: work queue, 16 workers, breaker evaluations, follow-ups, the
// informers' watches): b.N wave nodes' findings are stored, then their
// TriggerFindings arrive at 500 per second (the load harness's 10,000-node
// wave: 1,500 reports in 3 s), and the benchmark ends when every wave
// repair is open. trigger->open p50/p99 is each node's time from its
// trigger to its repair row (created_at); follow-ups/node counts the
// quarantine transitions recorded by then (the Kubernetes writes and
// ledger steps done while repairs were still opening); the CPU figures
// are per wave node over the same window.
//
//	go test ./controller/repair -run '^$' -bench WaveOpen -benchtime 600x
func BenchmarkWaveOpen(b *testing.B) {
	const rate = 500 // triggers per second
	w := newWaveBenchRun(b, b.N, DefaultEvidenceGroup, true)
	ctx := context.Background()
	c0 := w.cpu(b)
	b.ResetTimer()
	start := time.Now()
	sent := make(map[string]time.Time, len(w.nodes))
	var mu sync.Mutex
	go func() {
		for i, n := range w.nodes {
			time.Sleep(time.Until(start.Add(time.Duration(i) * time.Second / rate)))
			mu.Lock()
			sent[n] = time.Now()
			mu.Unlock()
			w.rec.TriggerFindings("load", n)
		}
	}()
	deadline := start.Add(5 * time.Minute)
	for {
		var open int
		if err := w.stats.QueryRow(ctx, `SELECT count(*) FROM repairs WHERE cluster = 'load'`).Scan(&open); err != nil {
			b.Fatal(err)
		}
		if open >= len(w.nodes) {
			break
		}
		if time.Now().After(deadline) {
			b.Fatalf("%d of %d wave repairs open after 5 minutes", open, len(w.nodes))
		}
		time.Sleep(10 * time.Millisecond)
	}
	elapsed := time.Since(start)
	b.StopTimer()
	w.cpu(b).since(c0).report(b, len(w.nodes))
	var followUps int
	if err := w.stats.QueryRow(ctx, `SELECT count(*) FROM repair_audit WHERE to_state = 'quarantined'`).Scan(&followUps); err != nil {
		b.Logf("count quarantine transitions: %v", err)
	}
	rows, err := w.stats.Query(ctx, `SELECT node, created_at FROM repairs WHERE cluster = 'load'`)
	if err != nil {
		b.Fatal(err)
	}
	var lat []time.Duration
	mu.Lock()
	for rows.Next() {
		var node string
		var at time.Time
		if err := rows.Scan(&node, &at); err != nil {
			b.Fatal(err)
		}
		lat = append(lat, at.Sub(sent[node]))
	}
	mu.Unlock()
	if err := rows.Err(); err != nil {
		b.Fatal(err)
	}
	slices.Sort(lat)
	q := func(f float64) float64 { return lat[min(len(lat)-1, int(f*float64(len(lat))))].Seconds() * 1e3 }
	b.ReportMetric(q(0.5), "p50-ms")
	b.ReportMetric(q(0.99), "p99-ms")
	b.ReportMetric(float64(len(w.nodes))/elapsed.Seconds(), "opened/s")
	b.ReportMetric(float64(followUps)/float64(len(w.nodes)), "follow-ups/node")
}
