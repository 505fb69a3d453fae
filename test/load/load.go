// Package load is the fleet-scale load harness of issue 9 (`make load`): the
// real controller binary (cmd/fleetrepair, one or two replicas as child
// processes) against a real PostgreSQL (test/pgtemp) and a real
// kube-apiserver with etcd (test/envtest) holding N Nodes and their
// NodeClaims, created through the API (test/karpentersim), and one simulated
// agent per node: a goroutine running the real agent uplink (agent/uplink:
// the wire format, batching, retries with backoff and jitter, Retry-After,
// unacknowledged findings kept queued), authenticated with the static token
// (--agent-auth=static).
//
// Run plays the scenarios in order on one fleet: steady heartbeats; a zone
// wave (a share of one zone reports Xid 79 within a few seconds) with a lone
// failure in another zone, optionally with the leading replica SIGKILLed
// mid-wave; PostgreSQL stopped for a while under load; then a drain and the
// final checks (findings acknowledged vs stored, NodeClaim deletions in the
// wave zone, delete calls for the lone failure). It measures, per phase,
// accepted reports/s, ingest latency, controller CPU and RSS (/proc),
// PostgreSQL CPU (/proc, the postmaster and its children) and API server
// requests/s (apiserver_request_total from its own /metrics, the harness's
// own requests taken out).
//
// Correctness problems are collected in Result.Failures, never asserted on
// timings; TestLoadSmoke asserts there are none at 200 nodes, and
// BenchmarkLoad prints the figures (see docs/scale.md).
package load

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"golang.org/x/sync/errgroup"
	coordv1 "k8s.io/api/coordination/v1"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/controller-runtime/pkg/client"
	karpv1 "sigs.k8s.io/karpenter/pkg/apis/v1"

	"github.com/fleetrepair/fleetrepair/agent/finding"
	"github.com/fleetrepair/fleetrepair/agent/uplink"
	"github.com/fleetrepair/fleetrepair/cmd/runner"
	"github.com/fleetrepair/fleetrepair/controller/config"
	"github.com/fleetrepair/fleetrepair/test/envtest"
	"github.com/fleetrepair/fleetrepair/test/karpentersim"
	"github.com/fleetrepair/fleetrepair/test/pgtemp"
)

// Cluster is the name the controller knows the simulated cluster by.
const Cluster = "load"

// token is the static agent token (--agent-auth=static).
const token = "load-harness-agent-token"

// Config sizes a run. Zero fields take the defaults in parentheses.
type Config struct {
	Nodes int // simulated nodes (1000), over every cluster
	// Clusters is the number of simulated clusters (1), each its own
	// kube-apiserver and etcd (test/envtest), every one served by the
	// controller (--cluster per cluster). With more than one the run is
	// the fleet scenario: steady heartbeats of every node, then the drain
	// and the lost-findings check (the wave, the kill and the PostgreSQL
	// outage need the one cluster's NodeClaims and Lease and are not run).
	// The first cluster, Cluster, holds FirstClusterNodes Nodes with their
	// NodeClaims (test/karpentersim); the others, Cluster-01 and on, share
	// the rest evenly and hold Nodes only (one Create each, status
	// included), so 100,000 Nodes are created in minutes, not the half
	// hour that four requests per node take.
	Clusters int
	// FirstClusterNodes is the first cluster's share when Clusters > 1
	// (min(10000, Nodes/2)).
	FirstClusterNodes int
	// SmallAPIServerGOGC is GOGC of the other clusters' kube-apiservers
	// (25): an idle one holds about 215 MiB of RSS with it and 265 MiB
	// without (envtest.Options.GoGC).
	SmallAPIServerGOGC int
	// SmallAPIServerNice is the niceness of the other clusters'
	// kube-apiservers and etcds (19; envtest.Options.Nice): they stand for
	// clusters on machines of their own, so they get this machine's CPU
	// after the controller, PostgreSQL, the first cluster and the agents.
	// At 10 the 49 of the 100,000-node run still took 53% of the CPU
	// (docs/scale.md, "The 100,000-node runs (session 7)").
	SmallAPIServerNice int
	// ProfileDir, when set, has the harness record the controller with
	// `perf record -g` for ProfileFor in the middle of the steady phase
	// (controller.perf there; read it with `perf report -i`).
	ProfileDir string
	ProfileFor time.Duration // (20s)
	Zones      int           // zones, >= 2 (4); the wave zone holds WaveZoneShare of the nodes, the rest share the others
	// WaveZoneShare is the wave zone's share of the fleet (0.25); WaveShare
	// the share of that zone reporting Xid 79 (0.6): 150 nodes at 1,000.
	WaveZoneShare, WaveShare float64
	WaveSpread               time.Duration // the wave's reports fall within this (3s)
	Heartbeat                time.Duration // agent heartbeat interval (30s)
	Flush                    time.Duration // agent flush interval (5s)
	Steady                   time.Duration // steady-state phase (60s)
	WaveMax                  time.Duration // longest wait for the wave's outcome (3m)
	Toleration               time.Duration // controller --toleration (30s)
	Resync                   time.Duration // controller --resync (10s, its default)
	Workers                  int           // controller --workers (16, its default)
	// AgentRamp is how long the agents take to start, evenly, one after
	// the other (defaultAgentRamp: one Heartbeat, or 3 ms per agent when
	// longer: 5 min at 100,000). The phases start once every agent has
	// started and had a report accepted (or, in the fleet scenario, a
	// deadline of AgentRamp + Heartbeat + Flush + 2 min has passed).
	AgentRamp time.Duration
	// LeaseDuration, when not 0, is the replicas' Lease duration with 2
	// replicas (--leader-elect-lease-duration; renew deadline 2/3 of it,
	// retry period 2/15: leaseTimings); 0 leaves the controller's default
	// (runner.DefaultLeaseDuration, 15 s). The killed leader's cluster waits
	// about this long for the other replica.
	LeaseDuration time.Duration
	// DBPoolConns, when > 0, is pool_max_conns in the controllers'
	// --database-url. 0 sets none: the controller's own pool size,
	// store.DefaultMaxConns (32, controller/store/store.go). (pgxpool's
	// default, max(4, CPUs), deadlocked the controller on 2 cores when
	// --workers deletion guards ran at once: docs/scale.md, "Controller
	// problems the harness found".)
	DBPoolConns int
	Replicas    int // controller replicas, 1 or 2 (2); 2 runs with --leader-elect
	// KillLeader SIGKILLs the replica holding the cluster's Lease in the
	// middle of the wave (needs Replicas 2).
	KillLeader bool
	// KillAt is when, after the wave's first failing report, the leader is
	// killed (WaveSpread/2; at most WaveSpread; negative: with the first
	// report, so the old leader has seen at most one failing report and a
	// trip is the new leader's).
	KillAt   time.Duration
	PGOutage time.Duration // PostgreSQL stopped this long under load (60s); < 0 skips it
	// Background is the fleet-wide rate of non-critical findings (Xid 92,
	// informational: it opens nothing and counts towards no breaker) in
	// findings/s (Nodes/100), so the database outage has findings to lose.
	Background    float64
	CreateWorkers int           // concurrent Node/NodeClaim creators (8)
	Drain         time.Duration // longest wait for agents to deliver everything at the end (3m)
	Binary        string        // the fleetrepair binary; empty: built into a temporary folder
	LogDir        string        // where the controllers' logs go (replica-N.log); empty: a temporary folder
	Logf          func(format string, args ...any)
	// Progress, when set, gets the run's log lines and each phase's row of
	// figures as they happen (Logf of a benchmark is held until it
	// returns), so a run stopped midway keeps its completed phases.
	Progress io.Writer
	// SelfEvery is how often the harness prints its own RSS, heap and
	// goroutines to Progress (30s; < 0: never).
	SelfEvery time.Duration
	// HeapProfileDir, when set, gets a heap profile of the harness process
	// every HeapProfileEvery (5m), from the start of setup.
	HeapProfileDir   string
	HeapProfileEvery time.Duration
}

func (c *Config) defaults() {
	orDefault(&c.Nodes, 1000)
	orDefault(&c.Clusters, 1)
	orDefault(&c.FirstClusterNodes, max(0, min(10000, c.Nodes/2)))
	orDefault(&c.SmallAPIServerGOGC, 25)
	orDefault(&c.SmallAPIServerNice, 19)
	orDefault(&c.ProfileFor, 20*time.Second)
	orDefault(&c.Zones, 4)
	orDefault(&c.Workers, config.DefaultWorkers)
	orDefault(&c.Replicas, 2)
	orDefault(&c.CreateWorkers, 8)
	if c.WaveZoneShare == 0 {
		c.WaveZoneShare = 0.25
	}
	if c.WaveShare == 0 {
		c.WaveShare = 0.6
	}
	orDefault(&c.WaveSpread, 3*time.Second)
	orDefault(&c.KillAt, c.WaveSpread/2)
	orDefault(&c.Heartbeat, 30*time.Second)
	orDefault(&c.AgentRamp, defaultAgentRamp(max(c.Nodes, 0), c.Heartbeat)) // negative Nodes are refused by validate
	orDefault(&c.Flush, 5*time.Second)
	orDefault(&c.Steady, 60*time.Second)
	orDefault(&c.WaveMax, 3*time.Minute)
	orDefault(&c.Toleration, 30*time.Second)
	orDefault(&c.Resync, 10*time.Second)
	orDefault(&c.PGOutage, 60*time.Second)
	orDefault(&c.Drain, 3*time.Minute)
	orDefault(&c.SelfEvery, 30*time.Second)
	orDefault(&c.HeapProfileEvery, 5*time.Minute)
	if c.Background == 0 && c.Nodes > 0 { // negative Nodes are refused by validate
		c.Background = float64(c.Nodes) / 100
	}
	if c.Logf == nil {
		c.Logf = func(string, ...any) {}
	}
}

// Phase is what one phase of a run measured.
type Phase struct {
	Name     string
	Duration time.Duration
	// Reports accepted (2xx), answered 429, 5xx, other 4xx, and POSTs that
	// got no answer (connection refused, timeout) during the phase; NoConn
	// of NetworkErrors spent most of their time without a connection
	// (waiting in the harness's bounded transport, or connecting).
	Accepted, TooMany, ServerErrors, ClientErrors, NetworkErrors, NoConn int64
	P50, P99                                                             time.Duration // latency of the accepted POSTs
	ControllerCores                                                      float64       // CPU of every replica, in cores (CPU s / wall s)
	ControllerRSS                                                        int64         // largest RSS of one replica, sampled every second, bytes
	PostgresCores                                                        float64       // postmaster and children, cores
	HarnessCores                                                         float64       // this process (agents, API polling): it shares the CPUs
	HarnessRSS                                                           int64         // largest RSS of this process, sampled every second, bytes
	APIRequests                                                          float64       // apiserver_request_total delta, the harness's own taken out
	APIByVerb                                                            map[string]float64
	// LoadStart and LoadEnd are the machine's 1-minute load average
	// (/proc/loadavg) when the phase started and ended: everything on the
	// machine, other runs included, competes for the same CPUs.
	LoadStart, LoadEnd float64
}

// Rate is accepted reports per second.
func (p Phase) Rate() float64 { return float64(p.Accepted) / p.Duration.Seconds() }

// APIRate is API server requests per second, the harness's own excluded.
func (p Phase) APIRate() float64 { return p.APIRequests / p.Duration.Seconds() }

// Result is a whole run.
type Result struct {
	Config Config
	Phases []Phase
	Setup  time.Duration // PostgreSQL, API server, Nodes, controllers, first heartbeats

	WaveNodes   int
	WaveCohort  string        // the breaker that tripped ("zone=zone-a"); empty when none did
	TripAfter   time.Duration // from the wave's first failing report (sent) to the trip decision
	TripLast    time.Duration // from the wave's last failing report (acknowledged) to the trip; < 0: before it
	WaveOpened  int           // wave nodes with an open repair when the phase ended
	OpenP50     time.Duration // failing finding given to the agent -> repair created, wave nodes
	OpenP99     time.Duration
	OpenedAt    []Sample      // wave repairs opened, over time since the first failing report
	ZoneDeleted int           // wave-zone NodeClaims with a deletionTimestamp at the end (must be 0)
	LoneAfter   time.Duration // lone failure report -> its repair in deleting; 0: never
	LoneDeletes float64       // NodeClaim DELETE calls the API server counted (must be 1)
	Killed      string        // the replica SIGKILLed mid-wave
	// ClusterNodes is each cluster's Node count (the fleet scenario).
	ClusterNodes map[string]int
	// APIServerRSS is the largest kube-apiserver RSS of a small cluster
	// and the first cluster's, at the end of setup, bytes.
	SmallAPIServerRSS, FirstAPIServerRSS int64

	Enqueued int // findings the agents were given
	Acked    int // findings acknowledged by a 2xx
	Stored   int // acknowledged findings found in the database at the end
	Lost     int // Acked - Stored: must be 0

	Failures []string // correctness violations
	Notes    []string // findings about the controller that are not correctness violations
}

// Sample is one point of a time series.
type Sample struct {
	At time.Duration
	N  int
}

// node is one simulated node and its agent.
type node struct {
	name, zone string
	cluster    string
	up         *uplink.Uplink
	tr         *agentTransport
	seq        atomic.Uint64
	boot       string
}

// replica is one controller process.
type replica struct {
	name string
	url  *url.URL
	cmd  *exec.Cmd
	done chan struct{}
	dead atomic.Bool
	rss  atomic.Int64 // largest RSS since the last phase start
}

// Run builds the fleet, plays the scenarios and returns the figures. Setup
// failures end the test (tb.Fatal); scenario failures are in
// Result.Failures.
func Run(tb testing.TB, cfg Config) *Result {
	tb.Helper()
	// Every field is checked before anything starts: a bad one fails the
	// run in well under a second, with nothing left to stop.
	if err := checkConfig(&cfg); err != nil {
		tb.Fatal(err)
	}
	setControllerRuntimeLogger()
	h := &harness{tb: tb, cfg: cfg, res: &Result{Config: cfg}, st: newAgentStats(), prog: &progress{w: cfg.Progress}}
	h.log = func(format string, args ...any) {
		cfg.Logf(format, args...)
		h.prog.printf(format, args...)
	}
	ctx, cancel := context.WithCancel(context.Background())
	tb.Cleanup(cancel)
	tb.Cleanup(stopOnSignal(&h.stops, h.log, os.Exit))
	go h.watchSelf(ctx)
	begin := time.Now()
	h.setup(ctx)
	h.res.Setup = time.Since(begin)
	h.log("setup done in %s", h.res.Setup.Round(time.Second))

	h.phase(ctx, "steady", func() { h.steady(ctx) })
	if h.fleet() {
		h.phase(ctx, "drain", func() { h.drain(ctx) })
		h.final(ctx)
		return h.res
	}
	h.phase(ctx, "wave", func() { h.runWave(ctx) })
	if cfg.PGOutage > 0 {
		h.phase(ctx, "pg-outage", func() { h.pgOutage(ctx) })
	}
	h.phase(ctx, "drain", func() { h.drain(ctx) })
	h.final(ctx)
	return h.res
}

type harness struct {
	tb  testing.TB
	cfg Config
	res *Result
	log func(string, ...any)
	st  *agentStats
	// prog is Config.Progress; selfRSS the harness's largest RSS since the
	// last phase start (watchSelf).
	prog    *progress
	selfRSS atomic.Int64
	// stops is what setup started, stopped on SIGINT or SIGTERM.
	stops stopList

	pg        *pgtemp.Server
	pgCPU     float64 // CPU seconds of earlier postmasters (before a Halt)
	db        *pgxpool.Pool
	env       *envtest.Env
	kc        client.Client
	cs        kubernetes.Interface
	others    []otherCluster // the fleet scenario's clusters after the first
	ownReqs   atomic.Int64
	replicas  []*replica
	nodes     []*node
	zones     []string
	waveNodes []*node
	lone      *node
	enqueued  atomic.Int64
	started   atomic.Int64 // agents whose uplink runs (startAgents)
	agents    atomic.Int64 // agents built, started or not (startAgents; read by watchSelf)

	mu      sync.Mutex
	deadCPU float64 // CPU seconds of killed replicas, read at the kill
}

func (h *harness) fatal(format string, args ...any) {
	h.tb.Helper()
	h.tb.Fatalf(format, args...)
}

func (h *harness) fail(format string, args ...any) {
	msg := fmt.Sprintf(format, args...)
	h.log("FAIL: %s", msg)
	h.res.Failures = append(h.res.Failures, msg)
}

func (h *harness) setup(ctx context.Context) {
	cfg := h.cfg
	bin := cfg.Binary
	var buildErr error
	var buildWG sync.WaitGroup
	if bin == "" {
		bin = filepath.Join(h.tb.TempDir(), "fleetrepair")
		buildWG.Go(func() { buildErr = buildController(ctx, bin) })
	}
	pg, err := pgtemp.Start(ctx, pgtemp.Options{Settings: map[string]string{"max_connections": "300"}})
	if err != nil {
		h.fatal("start postgres: %v", err)
	}
	h.pg = pg
	h.tb.Cleanup(func() { _ = pg.Stop() })
	h.stops.add(func() { _ = pg.Stop() })
	h.env = envtest.Start(h.tb, envtest.Options{})
	h.stops.add(func() { _ = h.env.Stop() })
	if h.kc, h.cs, err = h.clients(h.env); err != nil {
		h.fatal("%v", err)
	}
	h.createFleet(ctx)
	buildWG.Wait()
	if buildErr != nil {
		h.fatal("%v", buildErr)
	}

	// `fleetrepair migrate up` first (a migration Job's part), then the
	// replicas: --migrate passes the DSN's pool_max_conns on to the server,
	// which refuses it.
	if out, err := exec.CommandContext(ctx, bin, "migrate", "up", "--database-url", pg.DSN("")).CombinedOutput(); err != nil {
		h.fatal("migrate database: %v: %s", err, out)
	}
	for i := range cfg.Replicas {
		h.replicas = append(h.replicas, h.startReplica(ctx, bin, i))
	}
	if h.db, err = pgxpool.New(ctx, pg.DSN("")+"&pool_max_conns=4"); err != nil {
		h.fatal("open database: %v", err)
	}
	h.tb.Cleanup(h.db.Close)
	go h.sampleRSS(ctx)
	h.startAgents(ctx)
	h.recordAPIServerRSS()
}

// buildController builds cmd/fleetrepair into bin.
func buildController(ctx context.Context, bin string) error {
	root, err := envtest.ModuleRoot()
	if err != nil {
		return err
	}
	cmd := exec.CommandContext(ctx, "go", "build", "-o", bin, "./cmd/fleetrepair")
	cmd.Dir = root
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("build cmd/fleetrepair: %w: %s", err, out)
	}
	return nil
}

// createFleet creates the NodePool and every Node with its NodeClaim through
// the API server, CreateWorkers at a time.
func (h *harness) createFleet(ctx context.Context) {
	cfg := h.cfg
	sim := karpentersim.New(h.kc, time.Hour)
	if err := sim.CreateNodePool(ctx, "gpu"); err != nil {
		h.fatal("%v", err)
	}
	for z := range cfg.Zones {
		h.zones = append(h.zones, "zone-"+string(rune('a'+z)))
	}
	first := cfg.Nodes
	if h.fleet() {
		first = cfg.FirstClusterNodes
	}
	h.res.ClusterNodes = map[string]int{Cluster: first}
	inWave := int(float64(first) * cfg.WaveZoneShare)
	for i := range first {
		zone := h.zones[0]
		if i >= inWave {
			zone = h.zones[1+(i-inWave)%(cfg.Zones-1)]
		}
		h.nodes = append(h.nodes, &node{name: fmt.Sprintf("gpu-%s-%05d", zone[len(zone)-1:], i), zone: zone, cluster: Cluster, boot: uuid.NewString()})
	}
	// The first cluster's Nodes and NodeClaims are created while the other
	// clusters' API servers start and get their Nodes (fleet.go): setup
	// waits for the slowest of the two, not their sum.
	start := time.Now()
	var wg sync.WaitGroup
	var failed atomic.Value
	wg.Go(func() {
		work := make(chan *node)
		var creators sync.WaitGroup
		for range cfg.CreateWorkers {
			creators.Go(func() {
				for n := range work {
					if err := sim.CreateNode(ctx, karpentersim.NodeSpec{Name: n.name, NodePool: "gpu", Zone: n.zone,
						InstanceType: "p5.48xlarge", GPUs: 8}); err != nil {
						failed.CompareAndSwap(nil, err)
					}
				}
			})
		}
		defer creators.Wait()
		defer close(work)
		for i, n := range h.nodes[:first] {
			select {
			case work <- n:
			case <-ctx.Done():
				return
			}
			if (i+1)%2000 == 0 {
				h.log("created %d nodes (%.0f/s)", i+1, float64(i+1)/time.Since(start).Seconds())
			}
		}
	})
	var others []*node
	var othersErr error
	if h.fleet() {
		others, othersErr = h.setupOtherClusters(ctx, first) // starts API servers: on the test's goroutine
	}
	wg.Wait()
	if err, _ := failed.Load().(error); err != nil {
		h.fatal("create fleet: %v", err)
	}
	h.log("created %d Nodes and NodeClaims in %s", first, time.Since(start).Round(time.Second))
	if othersErr != nil {
		h.fatal("%v", othersErr)
	}
	h.nodes = append(h.nodes, others...)
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("find a free port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// startReplica starts one controller process and waits for /readyz.
func (h *harness) startReplica(ctx context.Context, bin string, i int) *replica {
	port, err := freePort()
	if err != nil {
		h.fatal("%v", err)
	}
	name := fmt.Sprintf("replica-%d", i)
	dsn := h.pg.DSN("")
	if h.cfg.DBPoolConns > 0 {
		dsn += "&pool_max_conns=" + strconv.Itoa(h.cfg.DBPoolConns)
	}
	pport, err := freePort()
	if err != nil {
		h.fatal("%v", err)
	}
	args := []string{"controller", "--database-url", dsn, "--listen", "127.0.0.1:" + strconv.Itoa(port),
		"--profiling-listen", "127.0.0.1:" + strconv.Itoa(pport),
		"--cluster", Cluster + "=" + h.env.Kubeconfig, "--agent-auth=static", "--agent-token", token,
		"--toleration", h.cfg.Toleration.String(), "--resync", h.cfg.Resync.String(), "--workers", strconv.Itoa(h.cfg.Workers)}
	for _, o := range h.others {
		args = append(args, "--cluster", o.name+"="+o.env.Kubeconfig)
	}
	if h.cfg.Replicas > 1 {
		args = append(args, "--leader-elect", "--leader-elect-namespace", "default", "--leader-elect-identity", name)
		if h.cfg.LeaseDuration != 0 {
			le := leaseTimings(h.cfg.LeaseDuration)
			args = append(args, "--leader-elect-lease-duration", le.LeaseDuration.String(),
				"--leader-elect-renew-deadline", le.RenewDeadline.String(), "--leader-elect-retry-period", le.RetryPeriod.String())
		}
	}
	dir := h.cfg.LogDir
	if dir == "" {
		dir = h.tb.TempDir()
	} else if err := os.MkdirAll(dir, 0o755); err != nil {
		h.fatal("create log folder: %v", err)
	}
	logPath := filepath.Join(dir, name+".log")
	logf, err := os.Create(logPath)
	if err != nil {
		h.fatal("create controller log: %v", err)
	}
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		h.fatal("start controller: %v", err)
	}
	r := &replica{name: name, url: &url.URL{Scheme: "http", Host: "127.0.0.1:" + strconv.Itoa(port)}, cmd: cmd, done: make(chan struct{})}
	// A stalled controller can be profiled while it stalls (docs/scale.md).
	h.prog.printf("%s: pid %d, pprof http://127.0.0.1:%d/debug/pprof/ (go tool pprof http://127.0.0.1:%d/debug/pprof/profile?seconds=30)",
		name, cmd.Process.Pid, pport, pport)
	go func() { _ = cmd.Wait(); logf.Close(); close(r.done) }()
	stop := func() {
		if !r.dead.Load() {
			_ = cmd.Process.Signal(syscall.SIGTERM)
			select {
			case <-r.done:
			case <-time.After(10 * time.Second):
				_ = cmd.Process.Kill()
				<-r.done
			}
		}
	}
	h.stops.add(stop)
	h.tb.Cleanup(func() {
		stop()
		if h.tb.Failed() {
			b, _ := os.ReadFile(logPath)
			if len(b) > 4000 {
				b = b[len(b)-4000:]
			}
			h.tb.Logf("%s log tail:\n%s", name, b)
		}
	})
	deadline := time.Now().Add(2 * time.Minute)
	for {
		resp, err := http.Get(r.url.String() + "/readyz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				break
			}
		}
		select {
		case <-r.done:
			b, _ := os.ReadFile(logPath)
			h.fatal("controller %s exited at start: %s", name, b)
		case <-time.After(200 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			h.fatal("controller %s not ready within 2m", name)
		}
	}
	h.log("controller %s ready at %s (pid %d)", name, r.url, cmd.Process.Pid)
	return r
}

// sampleRSS records each replica's largest RSS, every second.
func (h *harness) sampleRSS(ctx context.Context) {
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		for _, r := range h.replicas {
			if r.dead.Load() {
				continue
			}
			if v, err := rssBytes(r.cmd.Process.Pid); err == nil && v > r.rss.Load() {
				r.rss.Store(v)
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// startAgents builds one uplink per node and starts them one after the
// other, evenly over cfg.AgentRamp (rampDelay), from one goroutine: an
// agent not started yet holds no goroutine or timer. It returns once every
// agent has started and had a report accepted; the phases follow. A fleet
// whose agents are not all accepted by AgentRamp + Heartbeat + Flush + 2
// min is recorded as a failure (fleet scenario) or ends the run.
func (h *harness) startAgents(ctx context.Context) {
	var urls []*url.URL
	for _, r := range h.replicas {
		urls = append(urls, r.url)
	}
	bases := newAgentTransports(len(urls))
	// Agent logs are dropped before they are formatted (a text handler
	// writing to io.Discard formats every line: each agent's first failed
	// attempt, at 100,000 agents).
	discard := slog.New(slog.DiscardHandler)
	// One metric set for every agent: 13 collectors per uplink cost about
	// 9.5 KB of heap each (BenchmarkNew in agent/uplink), 950 MB at 100,000.
	um, err := uplink.NewMetrics(nil)
	if err != nil {
		h.fatal("build agent metrics: %v", err)
	}
	for i, n := range h.nodes {
		n.tr = &agentTransport{base: bases.forAgent(i), urls: urls, st: h.st}
		n.tr.cur.Store(int32(i % len(urls)))
		up, err := uplink.New(uplink.Config{URL: urls[i%len(urls)].String(), Cluster: n.cluster, Node: n.name, BootID: n.boot,
			AgentVersion: "load", Token: token, HTTPClient: &http.Client{Transport: n.tr}, FlushInterval: h.cfg.Flush,
			HeartbeatInterval: h.cfg.Heartbeat, Logger: discard, Metrics: um})
		if err != nil {
			h.fatal("configure agent %s: %v", n.name, err)
		}
		n.up = up
		up.SetHeartbeat(finding.Heartbeat{DriverVersion: "550.54.15", KernelVersion: "6.8.0-1015-aws", GPUCount: 8,
			Monitors: []finding.MonitorState{{Name: "kmsg", State: finding.StateOK, Since: time.Now()}}})
	}
	// The start order is shuffled, so the clusters' agents start mixed, as
	// nodes join a fleet, not cluster after cluster.
	h.agents.Store(int64(len(h.nodes)))
	order := rand.Perm(len(h.nodes))
	start := time.Now()
	h.log("starting %d agents over %s", len(h.nodes), h.cfg.AgentRamp)
	started := make(chan struct{})
	go func() {
		defer close(started)
		for k, i := range order {
			if d := time.Until(start.Add(rampDelay(k, len(order), h.cfg.AgentRamp))); d > 0 {
				select {
				case <-ctx.Done():
					return
				case <-time.After(d):
				}
			}
			up := h.nodes[i].up
			h.started.Add(1)
			// Each agent its own context: every POST's timeout context is a
			// child of it, and children of one shared context serialize on
			// its lock (context.propagateCancel, removeChild): 30,000 of
			// 100,000 agents waited there in the session-7 run. A real
			// agent is a process of its own.
			actx, cancel := context.WithCancel(ctx)
			go func() { defer cancel(); _ = up.Run(actx) }()
		}
	}()
	deadline := start.Add(h.cfg.AgentRamp + h.cfg.Heartbeat + h.cfg.Flush + 2*time.Minute)
	for h.st.firstOK.Load() < int64(len(h.nodes)) {
		if time.Now().After(deadline) {
			<-started
			if h.fleet() { // how far a fleet too large for the controller gets is a figure, not a setup failure
				h.fail("only %d of %d agents had a report accepted by the end of setup (outcomes %+v)", h.st.firstOK.Load(), len(h.nodes), h.st.counts())
				return
			}
			h.fatal("only %d of %d agents had a report accepted (outcomes %+v)", h.st.firstOK.Load(), len(h.nodes), h.st.counts())
		}
		time.Sleep(250 * time.Millisecond)
	}
	<-started
	h.log("all %d agents started and reporting (%s)", len(h.nodes), time.Since(start).Round(time.Second))
}

// agentConnsPerReplica bounds the simulated agents' connections to one
// controller replica, connects in progress included: about the listen
// backlog of a controller (net.core.somaxconn, 4096), and 40 times the
// connections 20,000 healthy agents keep busy (311 in the steady phase,
// docs/scale.md). A POST beyond it waits in the harness for a connection,
// inside its own request timeout and its measured latency, where a real
// agent would wait in the controller's accept queue.
const agentConnsPerReplica = 4096

// agentDialTimeout bounds one connect of the simulated agents.
const agentDialTimeout = 5 * time.Second

// agentTransportShards is how many HTTP transports the simulated agents
// share, agent i the (i mod agentTransportShards)-th, each with its share
// of agentConnsPerReplica. One shared transport serialized 100,000 agents
// on its per-host lock: in the session-7 100,000-node run 11,704 of them
// waited in net/http's queueForDial for Transport.connsPerHostMu and the
// harness stopped answering (docs/scale.md, "The 100,000-node runs
// (session 7)"). Real agents each have a transport of their own.
const agentTransportShards = 64

// agentTransports are the HTTP transports the simulated agents' POSTs go
// through (under agentTransport). Together they hold what 100,000 agents in
// one process can afford (docs/design.md, "The load harness's agents share
// a bounded transport"): net/http lets a connect outlive the request that
// started it (it may serve a later one), so without MaxConnsPerHost and a
// dial timeout every POST that times out against a controller too busy to
// accept leaves a connect behind, each up to the kernel's SYN retries
// (about two minutes), and they pile up with every retry: 10 goroutines and
// 124 KB per agent after 15 s in BenchmarkAgentsStalledController, 12 GiB
// in the 100,000-node run. Idle connections are kept up to the same bound,
// so agents reuse them instead of connecting anew.
type agentTransports []*http.Transport

// newAgentTransports returns agentTransportShards transports for replicas
// controller addresses: at most agentConnsPerReplica connections to one
// replica in all.
func newAgentTransports(replicas int) agentTransports {
	per := agentConnsPerReplica / agentTransportShards
	out := make(agentTransports, agentTransportShards)
	for i := range out {
		d := &net.Dialer{Timeout: agentDialTimeout, KeepAlive: 30 * time.Second}
		out[i] = &http.Transport{
			DialContext:         d.DialContext,
			MaxConnsPerHost:     per,
			MaxIdleConnsPerHost: per,
			MaxIdleConns:        per * max(1, replicas),
			IdleConnTimeout:     90 * time.Second,
		}
	}
	return out
}

// forAgent is the transport of the i-th agent.
func (t agentTransports) forAgent(i int) *http.Transport { return t[i%len(t)] }

// enqueue gives node n a finding.
func (h *harness) enqueue(n *node, f finding.Finding) string {
	f.Node, f.BootID, f.Count, f.Seq = n.name, n.boot, 1, n.seq.Add(1)
	f.Time = time.Now().UTC()
	f.ID = finding.NewID(f)
	h.enqueued.Add(1)
	n.up.Enqueue(f)
	return f.ID
}

func xid79(seq uint64) finding.Finding {
	return finding.Finding{Detector: finding.DetectorXid, Xid: 79, GPUPCI: "0000:02:00.0",
		Evidence: []string{fmt.Sprintf("[%d.000001] NVRM: Xid (PCI:0000:02:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.", seq)}}
}

// sbeRate is Xid 92 (high single-bit ECC error rate): informational, it
// opens nothing and counts towards no breaker, and agents batch it.
func sbeRate(seq uint64) finding.Finding {
	return finding.Finding{Detector: finding.DetectorXid, Xid: 92, GPUPCI: "0000:02:00.0",
		Evidence: []string{fmt.Sprintf("[%d.000002] NVRM: Xid (PCI:0000:02:00): 92, pid='<unknown>', name=<unknown>, High single-bit ECC error rate", seq)}}
}

// background sends non-critical findings from random nodes outside the wave
// at cfg.Background per second for d.
func (h *harness) background(ctx context.Context, d time.Duration) {
	if h.cfg.Background <= 0 {
		sleepCtx(ctx, d)
		return
	}
	every := time.Duration(float64(time.Second) / h.cfg.Background)
	t := time.NewTicker(max(every, time.Millisecond))
	defer t.Stop()
	end := time.After(d)
	perTick := max(1, int(float64(time.Millisecond)/float64(every)))
	for {
		select {
		case <-ctx.Done():
			return
		case <-end:
			return
		case <-t.C:
			for range perTick {
				n := h.nodes[rand.IntN(len(h.nodes))]
				if !h.fleet() && (n == h.lone || n.zone == h.zones[0]) {
					continue // the wave zone and the lone node carry only their failures
				}
				h.enqueue(n, sbeRate(n.seq.Load()+1))
			}
		}
	}
}

func sleepCtx(ctx context.Context, d time.Duration) {
	select {
	case <-ctx.Done():
	case <-time.After(d):
	}
}

// phase measures fn's run as one Phase.
func (h *harness) phase(ctx context.Context, name string, fn func()) {
	h.log("phase %s", name)
	h.st.takeLatencies()
	c0 := h.st.counts()
	api0 := h.apiRequests(ctx)
	own0 := h.ownReqs.Load()
	ctl0 := h.controllerCPU()
	pg0 := h.postgresCPU()
	self0, _ := cpuSeconds(os.Getpid(), false)
	for _, r := range h.replicas {
		r.rss.Store(0)
	}
	h.selfRSS.Store(0)
	load0, _ := loadAverage()
	start := time.Now()
	fn()
	p := Phase{Name: name, Duration: time.Since(start), LoadStart: load0}
	p.LoadEnd, _ = loadAverage()
	secs := p.Duration.Seconds()
	c := h.st.counts().sub(c0)
	p.Accepted, p.TooMany, p.ServerErrors, p.ClientErrors, p.NetworkErrors, p.NoConn = c.ok, c.tooMany, c.server, c.client, c.network, c.noConn
	lat := h.st.takeLatencies()
	p.P50, p.P99 = quantile(lat, 0.5), quantile(lat, 0.99)
	p.ControllerCores = (h.controllerCPU() - ctl0) / secs
	for _, r := range h.replicas {
		p.ControllerRSS = max(p.ControllerRSS, r.rss.Load())
	}
	p.PostgresCores = (h.postgresCPU() - pg0) / secs
	self1, _ := cpuSeconds(os.Getpid(), false)
	p.HarnessCores = (self1 - self0) / secs
	p.HarnessRSS = h.selfRSS.Load()
	api1 := h.apiRequests(ctx)
	own := float64(h.ownReqs.Load() - own0)
	p.APIRequests = api1.total - api0.total - own
	p.APIByVerb = map[string]float64{}
	for k, v := range api1.by {
		if d := v - api0.by[k]; d > 0 {
			p.APIByVerb[k] = d
		}
	}
	h.res.Phases = append(h.res.Phases, p)
	h.cfg.Logf("phase %s: %.0f reports/s p50 %s p99 %s, controller %.2f cores, postgres %.2f cores, api %.1f req/s",
		name, p.Rate(), p.P50, p.P99, p.ControllerCores, p.PostgresCores, p.APIRate())
	h.prog.phaseRow(p)
}

func quantile(sorted []time.Duration, q float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	return sorted[min(len(sorted)-1, int(q*float64(len(sorted))))]
}

// controllerCPU is the CPU seconds of every replica; a killed replica keeps
// what it had when it died (its stat is gone, so it is read at the kill).
func (h *harness) controllerCPU() float64 {
	var t float64
	for _, r := range h.replicas {
		if r.dead.Load() {
			continue
		}
		if v, err := cpuSeconds(r.cmd.Process.Pid, true); err == nil {
			t += v
		}
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	return t + h.deadCPU
}

// postgresCPU is the CPU seconds of every postmaster of the run, halted ones included.
func (h *harness) postgresCPU() float64 {
	pid := h.pg.PID()
	if pid == 0 {
		return h.pgCPU
	}
	v, err := treeCPUSeconds(pid)
	if err != nil {
		return h.pgCPU
	}
	return h.pgCPU + v
}

// apiRequests reads apiserver_request_total from every API server's
// /metrics and adds them up.
func (h *harness) apiRequests(ctx context.Context) apiRequests {
	css := []kubernetes.Interface{h.cs}
	for _, o := range h.others {
		css = append(css, o.cs)
	}
	sum := apiRequests{by: map[string]float64{}, at: time.Now()}
	var mu sync.Mutex
	var g errgroup.Group
	g.SetLimit(apiMetricsReaders)
	for _, cs := range css {
		g.Go(func() error {
			rctx, cancel := context.WithTimeout(ctx, apiMetricsTimeout)
			defer cancel()
			b, err := cs.CoreV1().RESTClient().Get().AbsPath("/metrics").DoRaw(rctx)
			if err != nil {
				h.fail("read API server /metrics: %v", err)
				return nil
			}
			r := parseAPIRequests(b, time.Now())
			mu.Lock()
			defer mu.Unlock()
			sum.total += r.total
			for k, v := range r.by {
				sum.by[k] += v
			}
			return nil
		})
	}
	_ = g.Wait()
	return sum
}

// apiMetricsReaders is how many API servers' /metrics apiRequests reads at
// once, each within apiMetricsTimeout: one after the other, the 50 of the
// fleet scenario (49 of them niced) took minutes at every phase's
// end.
const (
	apiMetricsReaders = 8
	apiMetricsTimeout = time.Minute
)

// runWave: WaveShare of the wave zone reports Xid 79 within WaveSpread, a lone
// node of another zone fails in the middle of it, and (KillLeader) the
// leading replica is SIGKILLed right after. It ends when the zone breaker
// has tripped, every wave repair is open and the lone repair is deleting,
// or after WaveMax.
func (h *harness) runWave(ctx context.Context) {
	cfg := h.cfg
	for _, n := range h.nodes {
		if n.zone == h.zones[0] && len(h.waveNodes) < int(float64(cfg.Nodes)*cfg.WaveZoneShare*cfg.WaveShare) {
			h.waveNodes = append(h.waveNodes, n)
		}
	}
	for _, n := range h.nodes {
		if n.zone == h.zones[1] {
			h.lone = n
			break
		}
	}
	h.res.WaveNodes = len(h.waveNodes)
	t0 := time.Now()
	sentAt := make(map[string]time.Time, len(h.waveNodes))
	var mu sync.Mutex
	var wg sync.WaitGroup
	ids := map[*node]string{}
	for i, n := range h.waveNodes {
		at := time.Duration(rand.Int64N(int64(cfg.WaveSpread)))
		if i == 0 {
			at = 0 // the first failing report opens the clock
		}
		wg.Go(func() {
			sleepCtx(ctx, at)
			id := h.enqueue(n, xid79(n.seq.Load()+1))
			mu.Lock()
			ids[n], sentAt[n.name] = id, time.Now()
			mu.Unlock()
		})
	}
	var loneSent time.Time
	wg.Go(func() {
		sleepCtx(ctx, cfg.WaveSpread/2)
		h.enqueue(h.lone, xid79(h.lone.seq.Load()+1))
		mu.Lock()
		loneSent = time.Now()
		mu.Unlock()
	})
	if cfg.KillLeader {
		wg.Go(func() {
			sleepCtx(ctx, max(cfg.KillAt, 0))
			h.killLeader(ctx)
		})
	}
	bgCtx, stopBG := context.WithCancel(ctx)
	bgDone := make(chan struct{})
	go func() { h.background(bgCtx, cfg.WaveMax); close(bgDone) }()
	defer func() { stopBG(); <-bgDone }()
	wg.Wait()

	waveNames := make([]string, len(h.waveNodes))
	for i, n := range h.waveNodes {
		waveNames[i] = n.name
	}
	var tripAt time.Time
	tick := time.NewTicker(250 * time.Millisecond)
	defer tick.Stop()
	lastSample := -1
	for time.Since(t0) < cfg.WaveMax {
		if tripAt.IsZero() {
			var cohort string
			err := h.db.QueryRow(ctx, `SELECT cohort, at FROM breaker_decisions WHERE to_phase = 'open' AND at >= $1 ORDER BY at LIMIT 1`, t0).Scan(&cohort, &tripAt)
			if err == nil {
				h.res.WaveCohort, h.res.TripAfter = cohort, tripAt.Sub(t0)
				h.log("breaker %s tripped %s after the first failing report", cohort, h.res.TripAfter.Round(time.Millisecond))
			}
		}
		var opened int
		if err := h.db.QueryRow(ctx, `SELECT count(*) FROM repairs WHERE cluster = $1 AND node = ANY($2) AND created_at >= $3`,
			Cluster, waveNames, t0).Scan(&opened); err == nil && opened != lastSample {
			h.res.OpenedAt = append(h.res.OpenedAt, Sample{At: time.Since(t0), N: opened})
			lastSample = opened
		}
		var loneState string
		_ = h.db.QueryRow(ctx, `SELECT state FROM repairs WHERE cluster = $1 AND node = $2 AND created_at >= $3 ORDER BY id DESC LIMIT 1`,
			Cluster, h.lone.name, t0).Scan(&loneState)
		if loneState == "deleting" && h.res.LoneAfter == 0 {
			h.res.LoneAfter = time.Since(loneSent)
			h.log("lone failure %s deleting %s after its report", h.lone.name, h.res.LoneAfter.Round(time.Millisecond))
		}
		if !tripAt.IsZero() && opened == len(h.waveNodes) && h.res.LoneAfter > 0 {
			break
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
	h.res.WaveOpened = lastSample
	// Latency from a wave report's acknowledgement to its repair.
	rows, err := h.db.Query(ctx, `SELECT node, created_at FROM repairs WHERE cluster = $1 AND node = ANY($2) AND created_at >= $3`, Cluster, waveNames, t0)
	if err != nil {
		h.fail("read wave repairs: %v", err)
		return
	}
	defer rows.Close()
	var lastAck time.Time
	for _, n := range h.waveNodes {
		if at, ok := h.st.ackTime(ids[n]); ok && at.After(lastAck) {
			lastAck = at
		}
	}
	var lat []time.Duration
	for rows.Next() {
		var name string
		var created time.Time
		if rows.Scan(&name, &created) != nil {
			continue
		}
		mu.Lock()
		sent, ok := sentAt[name]
		mu.Unlock()
		if ok {
			lat = append(lat, max(0, created.Sub(sent)))
		}
	}
	slices.Sort(lat)
	h.res.OpenP50, h.res.OpenP99 = quantile(lat, 0.5), quantile(lat, 0.99)
	if !tripAt.IsZero() && !lastAck.IsZero() {
		h.res.TripLast = tripAt.Sub(lastAck)
	}
	if tripAt.IsZero() {
		h.fail("no breaker tripped within %s of the wave (%d of %d wave repairs open)", cfg.WaveMax, h.res.WaveOpened, len(h.waveNodes))
	} else if h.res.WaveCohort != "zone="+h.zones[0] {
		h.fail("the breaker that tripped is %q, want zone=%s", h.res.WaveCohort, h.zones[0])
	}
	if h.res.LoneAfter == 0 {
		h.fail("the lone failure %s (zone %s) did not reach deleting within %s", h.lone.name, h.lone.zone, cfg.WaveMax)
	}
}

// killLeader SIGKILLs the replica holding the cluster's Lease.
func (h *harness) killLeader(ctx context.Context) {
	var lease coordv1.Lease
	if err := h.kc.Get(ctx, client.ObjectKey{Namespace: "default", Name: "fleetrepair-controller"}, &lease); err != nil {
		h.fail("read the controller Lease: %v", err)
		return
	}
	holder := ""
	if lease.Spec.HolderIdentity != nil {
		holder = *lease.Spec.HolderIdentity
	}
	for _, r := range h.replicas {
		if r.name != holder {
			continue
		}
		cpu, _ := cpuSeconds(r.cmd.Process.Pid, true)
		h.mu.Lock()
		h.deadCPU += cpu
		h.mu.Unlock()
		r.dead.Store(true)
		if err := r.cmd.Process.Signal(syscall.SIGKILL); err != nil {
			h.fail("kill %s: %v", r.name, err)
		}
		<-r.done
		h.res.Killed = r.name
		h.log("SIGKILLed the leader %s", r.name)
		return
	}
	h.fail("no replica holds the Lease (holder %q)", holder)
}

// pgOutage stops PostgreSQL for PGOutage under load and starts it again.
func (h *harness) pgOutage(ctx context.Context) {
	bgCtx, stopBG := context.WithCancel(ctx)
	bgDone := make(chan struct{})
	go func() { h.background(bgCtx, time.Hour); close(bgDone) }()
	defer func() { stopBG(); <-bgDone }()
	sleepCtx(ctx, min(10*time.Second, h.cfg.PGOutage))
	h.pgCPU = h.postgresCPU()
	if err := h.pg.Halt(); err != nil {
		h.fail("halt postgres: %v", err)
	}
	h.log("postgres stopped for %s", h.cfg.PGOutage)
	sleepCtx(ctx, h.cfg.PGOutage)
	if err := h.pg.Resume(ctx); err != nil {
		h.fatal("resume postgres: %v", err)
	}
	h.log("postgres back")
	sleepCtx(ctx, min(10*time.Second, h.cfg.PGOutage))
}

// drain waits until every finding given to the agents has been
// acknowledged, at most cfg.Drain.
func (h *harness) drain(ctx context.Context) {
	deadline := time.Now().Add(h.cfg.Drain)
	for int64(h.st.ackedCount()) < h.enqueued.Load() && time.Now().Before(deadline) {
		sleepCtx(ctx, 250*time.Millisecond)
	}
	if int64(h.st.ackedCount()) < h.enqueued.Load() {
		h.logDatabaseSessions(ctx) // a stuck controller shows in its sessions
	}
}

// logDatabaseSessions logs the controllers' database sessions that are not
// idle: what they wait on, for how long, and their last query.
func (h *harness) logDatabaseSessions(ctx context.Context) {
	rows, err := h.db.Query(ctx, `SELECT pid, state, coalesce(wait_event_type,'')||':'||coalesce(wait_event,''),
		coalesce((now()-xact_start)::text,''), left(regexp_replace(query, '\s+', ' ', 'g'), 300)
		FROM pg_stat_activity WHERE application_name = 'fleetrepair' AND state <> 'idle'`)
	if err != nil {
		h.log("read pg_stat_activity: %v", err)
		return
	}
	defer rows.Close()
	for rows.Next() {
		var pid int
		var state, wait, age, query string
		if err := rows.Scan(&pid, &state, &wait, &age, &query); err != nil {
			h.log("read pg_stat_activity: %v", err)
			return
		}
		h.log("controller session %d: %s, waiting on %s, transaction age %s, query: %s", pid, state, wait, age, query)
	}
}

// final counts what was lost and checks the NodeClaims.
func (h *harness) final(ctx context.Context) {
	res := h.res
	res.Enqueued = int(h.enqueued.Load())
	ids := h.st.ackedIDs()
	res.Acked = len(ids)
	for i := 0; i < len(ids); i += 5000 {
		var n int
		if err := h.db.QueryRow(ctx, `SELECT count(*) FROM findings WHERE cluster = ANY($1) AND id = ANY($2)`, h.clusterNames(), ids[i:min(i+5000, len(ids))]).Scan(&n); err != nil {
			h.fail("count stored findings: %v", err)
			return
		}
		res.Stored += n
	}
	res.Lost = res.Acked - res.Stored
	if res.Lost != 0 {
		h.fail("%d acknowledged findings are not in the database", res.Lost)
	}
	if res.Acked < res.Enqueued {
		h.fail("%d of %d findings still unacknowledged after the drain", res.Enqueued-res.Acked, res.Enqueued)
	}
	if h.fleet() {
		return // no wave: no NodeClaim to check
	}
	var ncs karpv1.NodeClaimList
	if err := h.kc.List(ctx, &ncs); err != nil {
		h.fail("list NodeClaims: %v", err)
		return
	}
	loneDeleted := false
	for _, nc := range ncs.Items {
		if nc.DeletionTimestamp == nil {
			continue
		}
		if nc.Labels["topology.kubernetes.io/zone"] == h.zones[0] {
			res.ZoneDeleted++
		}
		if nc.Status.NodeName == h.lone.name {
			loneDeleted = true
		}
	}
	if res.ZoneDeleted != 0 {
		h.fail("%d NodeClaims in the wave zone %s were deleted", res.ZoneDeleted, h.zones[0])
	}
	if !loneDeleted {
		h.fail("the lone failure's NodeClaim %s-nc has no deletionTimestamp", h.lone.name)
	}
	var deletes float64
	for _, p := range res.Phases {
		deletes += p.APIByVerb["DELETE nodeclaims"]
	}
	res.LoneDeletes = deletes
	deleted := 0
	for _, nc := range ncs.Items {
		if nc.DeletionTimestamp != nil {
			deleted++
		}
	}
	// Exactly one NodeClaim is deleted: the lone failure's. A repeated
	// DELETE of that same NodeClaim is a no-op for the API server (it is
	// already being deleted, UID precondition); it is reported, not failed.
	if deleted != 1 {
		h.fail("%d NodeClaims deleted in the cluster, want exactly 1 (the lone failure)", deleted)
	}
	if deletes != 1 {
		res.Notes = append(res.Notes, fmt.Sprintf("the API server counted %.0f NodeClaim DELETE calls for the one NodeClaim deleted", deletes))
	}
}

// ErrFailures is returned by Result.Err when a run had correctness failures.
var ErrFailures = errors.New("load run failed")

// Err returns nil, or ErrFailures wrapping every failure.
func (r *Result) Err() error {
	if len(r.Failures) == 0 {
		return nil
	}
	errs := []error{ErrFailures}
	for _, f := range r.Failures {
		errs = append(errs, errors.New(f))
	}
	return errors.Join(errs...)
}

// orDefault sets *v to d when it holds its zero value (the harness
// configurations' defaults).
func orDefault[T comparable](v *T, d T) {
	var zero T
	if *v == zero {
		*v = d
	}
}

// leaseTimings are the replicas' Lease timings for Config.LeaseDuration
// lease: renew deadline 2/3 of it, retry period 2/15 (15 s gives
// client-go's 10 s and 2 s).
func leaseTimings(lease time.Duration) runner.LeaderElection {
	return runner.LeaderElection{LeaseDuration: lease, RenewDeadline: lease * 2 / 3, RetryPeriod: lease * 2 / 15}
}
