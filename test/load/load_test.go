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

	"github.com/fleetrepair/fleetrepair/web/profiling"
)

// benchFlags are BenchmarkLoad's -load.* flags (flags.go).
var benchFlags = newLoadFlags(flag.CommandLine)

func currentFlags() flagValues { return benchFlags.values() }

// BenchmarkLoad runs every scenario once on a fleet sized by the -load.*
// flags and prints the figures; `make load` runs it with -benchtime 1x.
func BenchmarkLoad(b *testing.B) {
	// The flags first: a bad one fails here, before any file, port or process.
	flags := currentFlags()
	if _, err := flagConfig(flags, nil); err != nil {
		b.Fatal(err)
	}
	out := *benchFlags.out
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
	if *benchFlags.pprof != "" {
		// The harness's own pprof, for as long as the benchmark runs.
		addr, err := profiling.Serve(b.Context(), *benchFlags.pprof, nil)
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
