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
	"time"

	"github.com/fleetrepair/fleetrepair/controller/config"
)

// loadFlags are the -load.* flags of BenchmarkLoad (`make load`, see
// docs/scale.md), registered on a flag set by newLoadFlags: the test
// binary's command line (load_test.go) and CheckFlags's own set take the
// same flags. Every default is the flag's own; a value the run cannot use
// (0 nodes, 0 replicas, a negative count, ...) is refused before anything
// starts (flagConfig).
type loadFlags struct {
	nodes, zones, clusters, firstNodes, replicas, workers, dbPool        *int
	steady, heartbeat, toleration, pgOutage, heapEvery, lease, agentRamp *time.Duration
	killAt                                                               *time.Duration
	profile, logs, out, binary, pprof                                    *string
}

func newLoadFlags(fs *flag.FlagSet) *loadFlags {
	return &loadFlags{
		nodes:      fs.Int("load.nodes", 1000, "simulated nodes, over every cluster (1 to 1,000,000)"),
		zones:      fs.Int("load.zones", 4, "zones (2 to 26)"),
		clusters:   fs.Int("load.clusters", 1, "simulated clusters, each its own API server (1 to 100, and 250 MiB of available memory each); > 1 runs the fleet scenario (steady heartbeats only)"),
		firstNodes: fs.Int("load.first-cluster-nodes", 0, "Nodes (with NodeClaims) of the first cluster when clusters > 1 (0: min(10000, nodes/2))"),
		profile:    fs.String("load.profile", "", "record the controller with perf in the steady phase into this folder"),
		replicas:   fs.Int("load.replicas", 2, "controller replicas (1 or 2); 2 kills the leader mid-wave"),
		workers:    fs.Int("load.workers", config.DefaultWorkers, "controller --workers (1 or more; default the controller's own)"),
		steady:     fs.Duration("load.steady", 60*time.Second, "steady-heartbeat phase (more than 0)"),
		heartbeat:  fs.Duration("load.heartbeat", 30*time.Second, "agent heartbeat interval (more than 0)"),
		toleration: fs.Duration("load.toleration", 30*time.Second, "controller --toleration (more than 0)"),
		pgOutage:   fs.Duration("load.pg-outage", 60*time.Second, "PostgreSQL stopped this long in the pg-outage phase (0 or negative: no pg-outage phase)"),
		dbPool:     fs.Int("load.db-pool", 32, "pool_max_conns of the controllers' database URL (0: none set, the controller's own default, store.DefaultMaxConns, 32)"),
		logs:       fs.String("load.logs", "", "keep the controllers' logs in this folder (default: a temporary folder, removed)"),
		out:        fs.String("load.out", "", "write the progress lines as they come (log, each phase's figures, the harness's own memory), then the table, to this file (default: load-<nodes>.txt in the system temp folder)"),
		binary:     fs.String("load.binary", "", "the fleetrepair binary to run (default: go build ./cmd/fleetrepair during setup)"),
		pprof:      fs.String("load.pprof", "localhost:0", "serve the harness's net/http/pprof on this address (printed at start; empty: off)"),
		heapEvery:  fs.Duration("load.heap-every", 5*time.Minute, "write a heap profile of the harness this often into the -load.logs folder (default: load-heap-<nodes> in the system temp folder; 0: never)"),
		lease:      fs.Duration("load.lease-duration", 0, "with 2 replicas, the controllers' --leader-elect-lease-duration (whole seconds; renew deadline 2/3 of it, retry period 2/15); 0: the controller's default, 15s"),
		killAt:     fs.Duration("load.kill-at", 1500*time.Millisecond, "with 2 replicas, when the Lease holder is SIGKILLed after the wave's first failing report (0 to the wave's 3s spread; 0: before the old leader can trip the breaker, so the new leader must)"),
		agentRamp:  fs.Duration("load.agent-ramp", 0, "start the agents evenly over this, the phases after it (0: one heartbeat, or 3 ms per agent when longer: 5m at 100,000 nodes)"),
	}
}

// flagValues are the -load.* flags that size a run.
type flagValues struct {
	nodes, zones, clusters, firstNodes, replicas, workers, dbPool        int
	steady, heartbeat, toleration, pgOutage, heapEvery, agentRamp, lease time.Duration
	killAt                                                               time.Duration
	profile, logs, binary                                                string
}

func (f *loadFlags) values() flagValues {
	return flagValues{nodes: *f.nodes, zones: *f.zones, clusters: *f.clusters, firstNodes: *f.firstNodes,
		replicas: *f.replicas, workers: *f.workers, dbPool: *f.dbPool, steady: *f.steady, heartbeat: *f.heartbeat,
		toleration: *f.toleration, pgOutage: *f.pgOutage, heapEvery: *f.heapEvery, agentRamp: *f.agentRamp, lease: *f.lease, killAt: *f.killAt, profile: *f.profile,
		logs: *f.logs, binary: *f.binary}
}

// flagConfig turns the flags into a Config and checks it (Config.validate,
// the API servers' memory included). Config takes a zero field for its
// default; a flag's default is its own, so a zero here is refused where the
// run cannot use it, not replaced: -load.nodes=0 is an error, not 1,000
// nodes. -load.pg-outage 0 or negative is no pg-outage phase,
// -load.heap-every 0 no heap profiles, -load.db-pool 0 the controller's
// pool size, -load.first-cluster-nodes 0 min(10000, nodes/2),
// -load.agent-ramp 0 defaultAgentRamp. It returns one error naming each
// bad value (a *ConfigError when the values are what is wrong).
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
	if f.killAt < 0 {
		bad = append(bad, fmt.Sprintf("kill-at %s: want 0 (with the first failing report) to 3s (the wave's spread)", f.killAt))
	}
	if f.agentRamp < 0 {
		bad = append(bad, fmt.Sprintf("agent-ramp %s: want 0 (scaled with the nodes) or more", f.agentRamp))
	}
	if len(bad) > 0 {
		return Config{}, &ConfigError{Problems: bad}
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
	killAt := f.killAt
	if killAt == 0 {
		killAt = -1 // Config's "with the first report": its zero is WaveSpread/2
	}
	cfg := Config{Nodes: f.nodes, Clusters: f.clusters, FirstClusterNodes: f.firstNodes, ProfileDir: f.profile, Zones: f.zones,
		Replicas: f.replicas, KillLeader: f.replicas == 2 && f.clusters == 1, Workers: f.workers, Steady: f.steady,
		Heartbeat: f.heartbeat, Toleration: f.toleration, PGOutage: pgOutage, DBPoolConns: f.dbPool, LogDir: f.logs,
		Binary: f.binary, Progress: progress, HeapProfileDir: heapDir, HeapProfileEvery: f.heapEvery, AgentRamp: f.agentRamp,
		LeaseDuration: f.lease, KillAt: killAt}
	if err := checkConfig(&cfg); err != nil {
		return Config{}, err
	}
	return cfg, nil
}

// makeVars names the Makefile variable that sets each -load.* flag of
// `make load` (LOAD_ARGS; TestMakeVarsMatchTheMakefile holds the two
// together).
var makeVars = map[string]string{
	"load.nodes": "LOAD_NODES", "load.clusters": "LOAD_CLUSTERS", "load.first-cluster-nodes": "LOAD_FIRST_NODES",
	"load.profile": "LOAD_PROFILE", "load.replicas": "LOAD_REPLICAS", "load.workers": "LOAD_WORKERS",
	"load.zones": "LOAD_ZONES", "load.heartbeat": "LOAD_HEARTBEAT", "load.steady": "LOAD_STEADY",
	"load.pg-outage": "LOAD_PG_OUTAGE", "load.toleration": "LOAD_TOLERATION", "load.db-pool": "LOAD_DB_POOL",
	"load.heap-every": "LOAD_HEAP_EVERY", "load.agent-ramp": "LOAD_AGENT_RAMP", "load.lease-duration": "LOAD_LEASE",
	"load.kill-at": "LOAD_KILL_AT",
}

// CheckFlags checks args, -load.NAME=VALUE flags as `make load` passes them
// to BenchmarkLoad, as BenchmarkLoad does (flagConfig: the same rules, the
// machine's memory included), before anything is built. It returns nil, or
// one line per bad value naming the Makefile variable that set it and what
// it wants: "LOAD_NODES=abc: want a whole number (-load.nodes: simulated
// nodes, ...)", "LOAD_REPLICAS=3: replicas 3: want 1 or 2".
func CheckFlags(args []string) []string {
	fs := flag.NewFlagSet("load", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	f := newLoadFlags(fs)
	raw := map[string]string{} // flag name (nodes, db-pool) -> the value as given
	unparsed := map[string]bool{}
	var bad []string
	for _, a := range args {
		name, value, ok := strings.Cut(strings.TrimPrefix(a, "-"), "=")
		fl := fs.Lookup(name)
		if !ok || !strings.HasPrefix(a, "-") || fl == nil {
			bad = append(bad, fmt.Sprintf("%q: want -load.NAME=VALUE, NAME one of BenchmarkLoad's flags (go test ./test/load -args -help)", a))
			continue
		}
		raw[strings.TrimPrefix(name, "load.")] = value
		if err := fs.Set(name, value); err != nil {
			bad = append(bad, fmt.Sprintf("%s: want %s (-%s: %s)", varIs(name, value), wants(fl.Value), name, fl.Usage))
			unparsed[strings.TrimPrefix(name, "load.")] = true
			_ = fs.Set(name, fl.DefValue) // a failed Set leaves a zero, not the default
		}
	}
	// The values that parsed are checked too (one that did not is back at
	// its default here, and its problem is already said): every bad value
	// in one go.
	_, err := flagConfig(f.values(), nil)
	var ce *ConfigError
	switch {
	case err == nil:
		return bad
	case !errors.As(err, &ce):
		return append(bad, err.Error())
	}
	for _, p := range ce.Problems {
		name, _, _ := strings.Cut(p, " ")
		if unparsed[name] {
			continue
		}
		if v, ok := raw[name]; ok {
			p = varIs("load."+name, v) + ": " + p
		}
		bad = append(bad, p)
	}
	return bad
}

// varIs is "LOAD_NODES=abc" for flag load.nodes given abc, or
// "-load.nodes=abc" for a flag of no Makefile variable.
func varIs(flagName, value string) string {
	if v, ok := makeVars[flagName]; ok {
		return v + "=" + value
	}
	return "-" + flagName + "=" + value
}

// wants says what a flag of v's type takes.
func wants(v flag.Value) string {
	if g, ok := v.(flag.Getter); ok {
		switch g.Get().(type) {
		case int:
			return "a whole number"
		case time.Duration:
			return "a duration such as 90s, 5m or 1h30m"
		}
	}
	return "a value of its kind"
}

// ConfigError is a run's configuration refused (Config.validate,
// flagConfig, checkMemory): each problem starts with the name of the field
// or flag it is about ("replicas 3: want 1 or 2").
type ConfigError struct{ Problems []string }

func (e *ConfigError) Error() string { return "load config: " + strings.Join(e.Problems, "; ") }
