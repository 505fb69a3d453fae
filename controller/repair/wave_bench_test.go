package repair

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/fleetrepair/fleetrepair/agent/finding"
	"github.com/fleetrepair/fleetrepair/controller/breaker"
	"github.com/fleetrepair/fleetrepair/controller/diagnose"
	"github.com/fleetrepair/fleetrepair/controller/kube"
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
// BenchmarkWaveFollowUp's.
//
//	go test ./controller/repair -run '^$' -bench WaveLedgerStep -benchtime 400x
func BenchmarkWaveLedgerStep(b *testing.B) {
	for _, workers := range []int{4, 16} {
		b.Run(fmt.Sprintf("workers=%d", workers), func(b *testing.B) {
			w := newWaveBench(b, b.N)
			b.ResetTimer()
			w.run(b, workers, true)
			b.StopTimer()
			w.checkOpen(b)
		})
	}
}

// BenchmarkWaveFollowUp is the reconcile after the ledger step
// (BenchmarkWaveLedgerStep, untimed here) of each of b.N wave nodes: the
// quarantine written, the repair advanced, the Events recorded.
func BenchmarkWaveFollowUp(b *testing.B) {
	w := newWaveBench(b, b.N)
	w.run(b, 16, true)
	b.ResetTimer()
	w.run(b, 16, false)
}

type waveBench struct {
	rec   *Reconciler
	nodes []string
}

func newWaveBench(b *testing.B, n int) *waveBench {
	b.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	b.Cleanup(cancel)
	env := envtest.Start(b, envtest.Options{})
	st := pgtest.Store(b)
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
	go func() { _ = k.Run(ctx, nil) }()
	pol, err := breaker.NewPolicy(breaker.Config{})
	if err != nil {
		b.Fatal(err)
	}
	eng, _ := diagnose.New(diagnose.Options{})
	rec, err := New(Config{Store: st, Engine: eng, Clusters: map[string]*kube.Cluster{"load": k}, Breaker: pol,
		Toleration: time.Hour, Resync: time.Hour, Workers: 4, Log: slog.New(slog.DiscardHandler)})
	if err != nil {
		b.Fatal(err)
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
	return &waveBench{rec: rec, nodes: names}
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
