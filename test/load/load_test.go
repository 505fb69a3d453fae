package load

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/fleetrepair/fleetrepair/controller/config"
)

// Sizes of BenchmarkLoad (`make load`, see docs/scale.md). Every default is
// the flag's own; a value the run cannot use (0 nodes, 0 replicas, a
// negative count, ...) is refused before anything starts (flagConfig).
var (
	flagNodes      = flag.Int("load.nodes", 1000, "simulated nodes, over every cluster (1 to 1,000,000)")
	flagZones      = flag.Int("load.zones", 4, "zones (2 to 26)")
	flagClusters   = flag.Int("load.clusters", 1, "simulated clusters, each its own API server (1 to 100, and 250 MiB of available memory each); > 1 runs the fleet scenario (steady heartbeats only)")
	flagFirstNodes = flag.Int("load.first-cluster-nodes", 0, "Nodes (with NodeClaims) of the first cluster when clusters > 1 (0: min(10000, nodes/2))")
	flagProfile    = flag.String("load.profile", "", "record the controller with perf in the steady phase into this folder")
	flagReplicas   = flag.Int("load.replicas", 2, "controller replicas (1 or 2); 2 kills the leader mid-wave")
	flagWorkers    = flag.Int("load.workers", config.DefaultWorkers, "controller --workers (1 or more; default the controller's own)")
	flagSteady     = flag.Duration("load.steady", 60*time.Second, "steady-heartbeat phase (more than 0)")
	flagHeartbeat  = flag.Duration("load.heartbeat", 30*time.Second, "agent heartbeat interval (more than 0)")
	flagToleration = flag.Duration("load.toleration", 30*time.Second, "controller --toleration (more than 0)")
	flagPGOutage   = flag.Duration("load.pg-outage", 60*time.Second, "PostgreSQL stopped this long in the pg-outage phase (0 or negative: no pg-outage phase)")
	flagDBPool     = flag.Int("load.db-pool", 32, "pool_max_conns of the controllers' database URL (0: none set, the controller's own default, store.DefaultMaxConns, 32)")
	flagLogs       = flag.String("load.logs", "", "keep the controllers' logs in this folder (default: a temporary folder, removed)")
	flagOut        = flag.String("load.out", "", "write the progress lines as they come (log, each phase's figures, the harness's own memory), then the table, to this file (default: load-<nodes>.txt in the system temp folder)")
	flagBinary     = flag.String("load.binary", "", "the fleetrepair binary to run (default: go build ./cmd/fleetrepair during setup)")
	flagPprof      = flag.String("load.pprof", "localhost:0", "serve the harness's net/http/pprof on this address (printed at start; empty: off)")
	flagHeapEvery  = flag.Duration("load.heap-every", 5*time.Minute, "write a heap profile of the harness this often into the -load.logs folder (default: load-heap-<nodes> in the system temp folder; 0: never)")
	flagLease      = flag.Duration("load.lease-duration", 0, "with 2 replicas, the controllers' --leader-elect-lease-duration (whole seconds; renew deadline 2/3 of it, retry period 2/15); 0: the controller's default, 15s")
	flagAgentRamp  = flag.Duration("load.agent-ramp", 0, "start the agents evenly over this, the phases after it (0: one heartbeat, or 3 ms per agent when longer: 5m at 100,000 nodes)")
)

// flagValues are the -load.* flags that size a run.
type flagValues struct {
	nodes, zones, clusters, firstNodes, replicas, workers, dbPool        int
	steady, heartbeat, toleration, pgOutage, heapEvery, agentRamp, lease time.Duration
	profile, logs, binary                                                string
}

func currentFlags() flagValues {
	return flagValues{nodes: *flagNodes, zones: *flagZones, clusters: *flagClusters, firstNodes: *flagFirstNodes,
		replicas: *flagReplicas, workers: *flagWorkers, dbPool: *flagDBPool, steady: *flagSteady, heartbeat: *flagHeartbeat,
		toleration: *flagToleration, pgOutage: *flagPGOutage, heapEvery: *flagHeapEvery, agentRamp: *flagAgentRamp, lease: *flagLease, profile: *flagProfile,
		logs: *flagLogs, binary: *flagBinary}
}

// flagConfig turns the flags into a Config and checks it (Config.validate,
// the API servers' memory included). Config takes a zero field for its
// default; a flag's default is its own, so a zero here is refused where the
// run cannot use it, not replaced: -load.nodes=0 is an error, not 1,000
// nodes. -load.pg-outage 0 or negative is no pg-outage phase,
// -load.heap-every 0 no heap profiles, -load.db-pool 0 the controller's
// pool size, -load.first-cluster-nodes 0 min(10000, nodes/2),
// -load.agent-ramp 0 defaultAgentRamp. It returns one error naming each
// bad value.
func flagConfig(f flagValues, progress io.Writer) (Config, error) {
	var bad []string
	for _, v := range []struct {
		name string
		zero bool
	}{{"nodes 0: want 1 or more", f.nodes == 0}, {"zones 0: want 2 or more", f.zones == 0},
		{"clusters 0: want 1 or more", f.clusters == 0}, {"replicas 0: want 1 or 2", f.replicas == 0},
		{"workers 0: want 1 or more", f.workers == 0}, {"steady 0s: want more than 0", f.steady == 0},
		{"heartbeat 0s: want more than 0", f.heartbeat == 0}, {"toleration 0s: want more than 0", f.toleration == 0}} {
		if v.zero {
			bad = append(bad, v.name)
		}
	}
	if f.firstNodes != 0 && f.clusters == 1 {
		bad = append(bad, fmt.Sprintf("first-cluster-nodes %d with clusters 1: only the fleet scenario (clusters > 1) has a first cluster", f.firstNodes))
	}
	if f.heapEvery < 0 {
		bad = append(bad, fmt.Sprintf("heap-every %s: want 0 (never) or more", f.heapEvery))
	}
	if f.agentRamp < 0 {
		bad = append(bad, fmt.Sprintf("agent-ramp %s: want 0 (scaled with the nodes) or more", f.agentRamp))
	}
	if len(bad) > 0 {
		return Config{}, errors.New("load config: " + strings.Join(bad, "; "))
	}
	heapDir := f.logs
	if heapDir == "" {
		heapDir = filepath.Join(os.TempDir(), "load-heap-"+strconv.Itoa(f.nodes))
	}
	if f.heapEvery == 0 {
		heapDir = ""
	}
	pgOutage := f.pgOutage
	if pgOutage <= 0 {
		pgOutage = -1 // Config's "skip": its zero is the 60 s default
	}
	cfg := Config{Nodes: f.nodes, Clusters: f.clusters, FirstClusterNodes: f.firstNodes, ProfileDir: f.profile, Zones: f.zones,
		Replicas: f.replicas, KillLeader: f.replicas == 2 && f.clusters == 1, Workers: f.workers, Steady: f.steady,
		Heartbeat: f.heartbeat, Toleration: f.toleration, PGOutage: pgOutage, DBPoolConns: f.dbPool, LogDir: f.logs,
		Binary: f.binary, Progress: progress, HeapProfileDir: heapDir, HeapProfileEvery: f.heapEvery, AgentRamp: f.agentRamp,
		LeaseDuration: f.lease}
	if err := checkConfig(&cfg); err != nil {
		return Config{}, err
	}
	return cfg, nil
}

// BenchmarkLoad runs every scenario once on a fleet sized by the -load.*
// flags and prints the figures; `make load` runs it with -benchtime 1x.
func BenchmarkLoad(b *testing.B) {
	// The flags first: a bad one fails here, before any file, port or process.
	flags := currentFlags()
	if _, err := flagConfig(flags, nil); err != nil {
		b.Fatal(err)
	}
	out := *flagOut
	if out == "" {
		out = filepath.Join(os.TempDir(), "load-"+strconv.Itoa(flags.nodes)+".txt")
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
	cfg, err := flagConfig(flags, prog)
	if err != nil {
		b.Fatal(err)
	}
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
