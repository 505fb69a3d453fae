package load

import (
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// Sizes of BenchmarkLoad (`make load`, see docs/scale.md).
var (
	flagNodes      = flag.Int("load.nodes", 1000, "simulated nodes")
	flagZones      = flag.Int("load.zones", 4, "zones")
	flagClusters   = flag.Int("load.clusters", 1, "simulated clusters, each its own API server; > 1 runs the fleet scenario (steady heartbeats only)")
	flagFirstNodes = flag.Int("load.first-cluster-nodes", 0, "Nodes (with NodeClaims) of the first cluster when clusters > 1 (0: min(10000, nodes/2))")
	flagProfile    = flag.String("load.profile", "", "record the controller with perf in the steady phase into this folder")
	flagReplicas   = flag.Int("load.replicas", 2, "controller replicas (1 or 2); 2 kills the leader mid-wave")
	flagWorkers    = flag.Int("load.workers", 4, "controller --workers")
	flagSteady     = flag.Duration("load.steady", 60*time.Second, "steady-heartbeat phase")
	flagHeartbeat  = flag.Duration("load.heartbeat", 30*time.Second, "agent heartbeat interval")
	flagToleration = flag.Duration("load.toleration", 30*time.Second, "controller --toleration")
	flagPGOutage   = flag.Duration("load.pg-outage", 60*time.Second, "PostgreSQL stopped this long (negative: skip)")
	flagDBPool     = flag.Int("load.db-pool", 32, "pool_max_conns of the controllers' database URL (0: pgxpool's default, which deadlocks at 2 CPUs, see docs/scale.md)")
	flagLogs       = flag.String("load.logs", "", "keep the controllers' logs in this folder (default: a temporary folder, removed)")
	flagOut        = flag.String("load.out", "", "write the progress lines as they come (log, each phase's figures, the harness's own memory), then the table, to this file (default: load-<nodes>.txt in the system temp folder)")
	flagBinary     = flag.String("load.binary", "", "the fleetrepair binary to run (default: go build ./cmd/fleetrepair during setup)")
	flagPprof      = flag.String("load.pprof", "localhost:0", "serve the harness's net/http/pprof on this address (printed at start; empty: off)")
	flagHeapEvery  = flag.Duration("load.heap-every", 5*time.Minute, "write a heap profile of the harness this often into the -load.logs folder (default: load-heap-<nodes> in the system temp folder; 0: never)")
)

// BenchmarkLoad runs every scenario once on a fleet sized by the -load.*
// flags and prints the figures; `make load` runs it with -benchtime 1x.
func BenchmarkLoad(b *testing.B) {
	out := *flagOut
	if out == "" {
		out = filepath.Join(os.TempDir(), "load-"+strconv.Itoa(*flagNodes)+".txt")
	}
	// The out file gets the progress lines (log, each phase's figures, the
	// harness's own memory) as they come, then the table.
	f, err := os.Create(out)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { f.Close() }) // after Run's own cleanups, which stop its progress lines
	prog := io.MultiWriter(os.Stderr, f)
	if *flagPprof != "" {
		addr, err := ServePprof(*flagPprof)
		if err != nil {
			b.Fatal(err)
		}
		fmt.Fprintf(prog, "harness pprof: http://%s/debug/pprof/ (go tool pprof http://%s/debug/pprof/heap)\n", addr, addr)
	}
	heapDir := *flagLogs
	if heapDir == "" {
		heapDir = filepath.Join(os.TempDir(), "load-heap-"+strconv.Itoa(*flagNodes))
	}
	if *flagHeapEvery <= 0 {
		heapDir = ""
	}
	cfg := Config{Nodes: *flagNodes, Clusters: *flagClusters, FirstClusterNodes: *flagFirstNodes, ProfileDir: *flagProfile, Zones: *flagZones, Replicas: *flagReplicas, KillLeader: *flagReplicas > 1 && *flagClusters <= 1,
		Workers: *flagWorkers, Steady: *flagSteady, Heartbeat: *flagHeartbeat, Toleration: *flagToleration,
		PGOutage: *flagPGOutage, DBPoolConns: *flagDBPool, LogDir: *flagLogs, Binary: *flagBinary,
		Progress: prog, HeapProfileDir: heapDir, HeapProfileEvery: *flagHeapEvery}
	var res *Result
	for b.Loop() {
		res = Run(b, cfg)
	}
	if err := res.WriteTable(f); err != nil {
		b.Fatal(err)
	}
	if err := res.WriteTable(os.Stdout); err != nil {
		b.Fatal(err)
	}
	b.Logf("figures written to %s", out)
	for _, p := range res.Phases {
		if p.Name == "steady" {
			b.ReportMetric(p.Rate(), "reports/s")
			b.ReportMetric(ms(p.P99), "p99-ms")
			b.ReportMetric(p.ControllerCores, "ctrl-cores")
		}
	}
	if err := res.Err(); err != nil {
		b.Error(err)
	}
}

// TestLoadSmoke is the harness in small, in `make test`: 200 nodes, two
// replicas with the leader SIGKILLed mid-wave, a 5 s database outage. It
// asserts correctness only (the zone breaker trips and holds the zone, the
// lone failure elsewhere reaches deleting with exactly one NodeClaim
// delete, no acknowledged finding is lost), never a timing. It runs the
// controllers with pool_max_conns=32: with pgxpool's default (4 on 2 CPUs)
// the deletion guards of a wave deadlock the pool (docs/scale.md).
func TestLoadSmoke(t *testing.T) {
	if testing.Short() {
		t.Skip("skip: the load smoke starts PostgreSQL, an API server and two controllers")
	}
	res := Run(t, Config{Nodes: 200, Zones: 4, Replicas: 2, KillLeader: true, Heartbeat: 5 * time.Second,
		Flush: time.Second, Steady: 5 * time.Second, WaveMax: 90 * time.Second, Toleration: 10 * time.Second,
		Resync: 2 * time.Second, PGOutage: 5 * time.Second, Background: 20, DBPoolConns: 32, Drain: 60 * time.Second, Logf: t.Logf})
	var b strings.Builder
	_ = res.WriteTable(&b)
	t.Log("\n" + b.String())
	if err := res.Err(); err != nil {
		t.Fatal(err)
	}
	if res.WaveCohort != "zone=zone-a" || res.ZoneDeleted != 0 || res.LoneDeletes < 1 || res.Lost != 0 || res.Acked == 0 {
		t.Fatalf("result: cohort %q, zone deletions %d, lone deletes %.0f, lost %d of %d acknowledged",
			res.WaveCohort, res.ZoneDeleted, res.LoneDeletes, res.Lost, res.Acked)
	}
}
