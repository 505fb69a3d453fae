package load

// The fault-injection suite of issue 11 (`make faults`, TestFaultsSmoke in
// `make test`, docs/faults.md): the real controller (cmd/fleetrepair as a
// child process; test/load/faultctl, the same composition with the
// reconciler's crash points wired to a real SIGKILL, for the step kills),
// a real PostgreSQL (test/pgtemp) and a real kube-apiserver (test/envtest)
// whose TokenReview authenticates every agent: each simulated agent runs
// the real uplink (agent/uplink) with a spool, a projected ServiceAccount
// token minted by the API server for a Pod bound to its node, and its own
// loopback source address (as nodes have their own IPs).
//
// RunFaults plays, in order: PostgreSQL stopped under load with agents
// killed (SIGKILL semantics: what is on disk survives) and restarted
// mid-outage; a slow-body flood (many connections trickling a report body);
// a bad-token flood from one source; then the controller killed at each
// step of a repair (repair.CrashPoints) and restarted. It checks, and
// reports as figures: findings acknowledged vs stored (equal), repairs left
// in an intermediate state (none), good agents' acceptance during each
// flood (100%), slow-body connections still held once the server's read
// timeout is over (none), exactly one NodeClaim DELETE per repair.

import (
	"bufio"
	"context"
	"encoding/json"
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
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	authnv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/fleetrepair/fleetrepair/agent/finding"
	"github.com/fleetrepair/fleetrepair/agent/uplink"
	"github.com/fleetrepair/fleetrepair/controller/kube"
	"github.com/fleetrepair/fleetrepair/controller/ledger"
	"github.com/fleetrepair/fleetrepair/controller/repair"
	"github.com/fleetrepair/fleetrepair/test/envtest"
	"github.com/fleetrepair/fleetrepair/test/karpentersim"
	"github.com/fleetrepair/fleetrepair/test/pgtemp"
)

// FaultConfig sizes a fault run. Zero fields take the defaults in
// parentheses (the full run's, `make faults`).
type FaultConfig struct {
	// Nodes is the fleet: one node per crash point (each in its own zone, so
	// no breaker trips on the sequence of repairs) plus the rest (100).
	Nodes      int
	Heartbeat  time.Duration // agent heartbeat interval (5s)
	Background float64       // informational findings per second, fleet-wide (Nodes/5)
	PGOutage   time.Duration // PostgreSQL stopped this long (60s)
	KillAgents int           // agents killed mid-outage and restarted (10)
	SlowConns  int           // connections of the slow-body flood (3000)
	// ReadTimeout is the controller's --read-timeout (45s, its default):
	// how long one request, body included, may take.
	ReadTimeout time.Duration
	BadTokenRPS int           // garbage-token reports per second (200)
	FloodFor    time.Duration // each flood lasts this long (ReadTimeout + 15s for the slow bodies; 60s for bad tokens)
	Toleration  time.Duration // controller --toleration (3s)
	Drain       time.Duration // longest wait for everything to be acknowledged (3m)
	StepWait    time.Duration // longest wait for a repair to reach a point, or to finish after a restart (2m)
	LogDir      string        // where the controllers' logs go; empty: a temporary folder
	Logf        func(format string, args ...any)
}

func (c *FaultConfig) defaults() {
	orDefault(&c.Nodes, 100)
	c.Nodes = max(c.Nodes, len(repair.CrashPoints)+2)
	orDefault(&c.Heartbeat, 5*time.Second)
	orDefault(&c.PGOutage, 60*time.Second)
	orDefault(&c.KillAgents, 10)
	c.KillAgents = min(c.KillAgents, c.Nodes-len(repair.CrashPoints))
	orDefault(&c.SlowConns, 3000)
	orDefault(&c.ReadTimeout, 45*time.Second)
	orDefault(&c.BadTokenRPS, 200)
	orDefault(&c.Toleration, 3*time.Second)
	orDefault(&c.Drain, 3*time.Minute)
	orDefault(&c.StepWait, 2*time.Minute)
	if c.Background == 0 {
		c.Background = float64(c.Nodes) / 5
	}
	if c.Logf == nil {
		c.Logf = func(string, ...any) {}
	}
}

// Acceptance is what good agents' POSTs got during a flood.
type Acceptance struct {
	Accepted, Refused int64 // 2xx; anything else (429, 5xx, 4xx, no answer)
}

// Percent is the accepted share, 100 when there was nothing to accept.
func (a Acceptance) Percent() float64 {
	if a.Accepted+a.Refused == 0 {
		return 100
	}
	return 100 * float64(a.Accepted) / float64(a.Accepted+a.Refused)
}

// StepResult is one controller kill at a repair step.
type StepResult struct {
	Point       string
	Node        string
	Killed      bool         // the controller died by SIGKILL at the point
	StateAtKill ledger.State // the repair's state right after the kill
	Final       ledger.State // after the restart
	Deletes     float64      // NodeClaim DELETE calls the API server counted for this repair
	Took        time.Duration
}

// FaultResult is a whole fault run.
type FaultResult struct {
	Config FaultConfig

	Enqueued, Acked, Stored int
	Lost                    int // Acked - Stored: must be 0
	// LostAtKill are findings given to a killed agent after its last spool
	// snapshot and never acknowledged: the spool is not write-through
	// (agent/uplink/doc.go), so a SIGKILL loses them by design.
	LostAtKill int

	PGOutage      time.Duration
	OutageAnswers counts // good agents' POST outcomes while PostgreSQL was down
	// OutageDrain is how long after PostgreSQL came back every finding
	// given to a live agent was acknowledged; DrainAnswers the POST
	// outcomes meanwhile.
	OutageDrain     time.Duration
	DrainAnswers    counts
	AgentsKilled    int
	Spooled         int // findings in the killed agents' spool files at the kill
	Replayed        int // of those, acknowledged after the restart (must equal Spooled)
	SlowConns       int
	SlowHeldPeak    int           // slow-body connections open at once, at most
	SlowHeldAfter   int           // still open ReadTimeout + 5s after they started (must be 0)
	SlowLongest     time.Duration // the longest the server kept one
	SlowAcceptance  Acceptance
	BadTokens       int64 // garbage-token reports sent
	BadTokenAnswers map[int]int64
	BadAcceptance   Acceptance
	NewAgentAfter   time.Duration // a new agent (token never reviewed) started mid-flood: to its first accepted report; 0: never
	Steps           []StepResult
	Stuck           []string // repairs left in an intermediate state (must be none)

	// ClientErrors are the first 4xx answers (not 429) the good agents got.
	ClientErrors []string

	Failures []string
}

// Err returns nil, or ErrFailures wrapping every failure.
func (r *FaultResult) Err() error {
	if len(r.Failures) == 0 {
		return nil
	}
	errs := []error{ErrFailures}
	for _, f := range r.Failures {
		errs = append(errs, errors.New(f))
	}
	return errors.Join(errs...)
}

// fnode is one simulated node of the fault run and its agent.
type fnode struct {
	name, zone, boot, token string
	src                     net.IP // the agent's source address
	spool                   string
	up                      *uplink.Uplink
	tr                      *agentTransport
	stop                    context.CancelFunc
	done                    chan struct{}
	seq                     atomic.Uint64
}

type faultHarness struct {
	tb  testing.TB
	cfg FaultConfig
	res *FaultResult
	log func(string, ...any)
	st  *agentStats

	pg       *pgtemp.Server
	db       *pgxpool.Pool
	env      *envtest.Env
	kc       client.Client
	cs       kubernetes.Interface
	sim      *karpentersim.Sim
	bin, ctl string // cmd/fleetrepair, test/load/faultctl
	port     int
	url      *url.URL
	proc     *ctlProc
	nodes    []*fnode
	steps    []*fnode // one per crash point
	others   []*fnode

	mu       sync.Mutex
	enqueued map[string]*fnode    // finding ID -> node, every finding given to an agent
	killedAt map[string]bool      // IDs a killed agent held only in memory at its kill
	late     map[string]time.Time // IDs still unacknowledged when a drain gave up, and when
}

// RunFaults builds the fleet, plays the faults and returns the figures.
// Setup failures end the test; fault outcomes are in FaultResult.Failures.
func RunFaults(tb testing.TB, cfg FaultConfig) *FaultResult {
	tb.Helper()
	setControllerRuntimeLogger()
	cfg.defaults()
	h := &faultHarness{tb: tb, cfg: cfg, res: &FaultResult{Config: cfg, BadTokenAnswers: map[int]int64{}}, st: newAgentStats(),
		log: cfg.Logf, enqueued: map[string]*fnode{}, killedAt: map[string]bool{}, late: map[string]time.Time{}}
	ctx, cancel := context.WithCancel(context.Background())
	tb.Cleanup(cancel)
	h.setup(ctx)
	bgCtx, stopBG := context.WithCancel(ctx)
	bgDone := make(chan struct{})
	go func() { h.background(bgCtx); close(bgDone) }()
	sleepCtx(ctx, 2*cfg.Heartbeat)
	h.pgOutage(ctx)
	h.slowBodies(ctx)
	h.badTokens(ctx)
	stopBG()
	<-bgDone
	h.stepKills(ctx)
	h.drain(ctx)
	h.final(ctx)
	return h.res
}

func (h *faultHarness) fail(format string, args ...any) {
	msg := fmt.Sprintf(format, args...)
	h.log("FAIL: %s", msg)
	h.res.Failures = append(h.res.Failures, msg)
}

func (h *faultHarness) fatal(format string, args ...any) {
	h.tb.Helper()
	h.tb.Fatalf(format, args...)
}

func (h *faultHarness) setup(ctx context.Context) {
	dir := h.tb.TempDir()
	h.bin, h.ctl = filepath.Join(dir, "fleetrepair"), filepath.Join(dir, "faultctl")
	var buildErr [2]error
	var wg sync.WaitGroup
	wg.Go(func() { buildErr[0] = buildCommand(ctx, h.bin, "./cmd/fleetrepair") })
	wg.Go(func() { buildErr[1] = buildCommand(ctx, h.ctl, "./test/load/faultctl") })
	pg, err := pgtemp.Start(ctx, pgtemp.Options{Settings: map[string]string{"max_connections": "200"}})
	if err != nil {
		h.fatal("start postgres: %v", err)
	}
	h.pg = pg
	h.tb.Cleanup(func() { _ = pg.Stop() })
	h.env = envtest.Start(h.tb, envtest.Options{})
	kcfg := rest.CopyConfig(h.env.Config)
	kcfg.QPS, kcfg.Burst = 500, 1000
	if h.kc, err = client.New(kcfg, client.Options{Scheme: kube.Scheme}); err != nil {
		h.fatal("build client: %v", err)
	}
	if h.cs, err = kubernetes.NewForConfig(kcfg); err != nil {
		h.fatal("build clientset: %v", err)
	}
	// Karpenter's part: a deleted NodeClaim is finalized (and replaced) 3 s
	// after its deletion, so the controller is seen waiting for it.
	h.sim = karpentersim.New(h.kc, 3*time.Second)
	if err := h.sim.CreateNodePool(ctx, "gpu"); err != nil {
		h.fatal("%v", err)
	}
	go func() { _ = h.sim.Run(ctx, 500*time.Millisecond) }()
	h.createFleet(ctx)
	wg.Wait()
	for _, err := range buildErr {
		if err != nil {
			h.fatal("%v", err)
		}
	}
	if out, err := exec.CommandContext(ctx, h.bin, "migrate", "up", "--database-url", pg.DSN("")).CombinedOutput(); err != nil {
		h.fatal("migrate database: %v: %s", err, out)
	}
	if h.db, err = pgxpool.New(ctx, pg.DSN("")+"&pool_max_conns=4"); err != nil {
		h.fatal("open database: %v", err)
	}
	h.tb.Cleanup(h.db.Close)
	if h.port, err = freePort(); err != nil {
		h.fatal("%v", err)
	}
	h.url = &url.URL{Scheme: "http", Host: "127.0.0.1:" + strconv.Itoa(h.port)}
	h.proc = h.startController(ctx, "fleetrepair-0", "")
	for _, n := range h.nodes {
		h.startAgent(ctx, n, n.spool)
	}
	deadline := time.Now().Add(2 * time.Minute)
	for h.st.firstOK.Load() < int64(len(h.nodes)) {
		if time.Now().After(deadline) {
			h.fatal("only %d of %d agents had a report accepted (outcomes %+v)", h.st.firstOK.Load(), len(h.nodes), h.st.counts())
		}
		sleepCtx(ctx, 200*time.Millisecond)
	}
	h.log("setup done: %d nodes, every agent reporting through TokenReview", len(h.nodes))
}

// buildCommand builds the module's package pkg into bin.
func buildCommand(ctx context.Context, bin, pkg string) error {
	root, err := envtest.ModuleRoot()
	if err != nil {
		return err
	}
	cmd := exec.CommandContext(ctx, "go", "build", "-o", bin, pkg)
	cmd.Dir = root
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("build %s: %w: %s", pkg, err, out)
	}
	return nil
}

// createFleet creates one node per crash point, each in its own zone, and
// the others in two zones; each gets an agent Pod bound to it and a
// projected token for that Pod.
func (h *faultHarness) createFleet(ctx context.Context) {
	const ns, sa = "fleetrepair", "fleetrepair-agent"
	if _, err := h.cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		h.fatal("create namespace: %v", err)
	}
	if _, err := h.cs.CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: sa}}, metav1.CreateOptions{}); err != nil {
		h.fatal("create service account: %v", err)
	}
	spools := h.tb.TempDir()
	for i := range h.cfg.Nodes {
		n := &fnode{boot: uuid.NewString()}
		if i < len(repair.CrashPoints) {
			n.name, n.zone = fmt.Sprintf("gpu-step-%d", i), fmt.Sprintf("zone-step-%d", i)
			h.steps = append(h.steps, n)
		} else {
			n.zone = "zone-" + string(rune('a'+i%2))
			n.name = fmt.Sprintf("gpu-%s-%04d", n.zone[len(n.zone)-1:], i)
			h.others = append(h.others, n)
		}
		// 127.1.0.0/16: one loopback source per agent (Linux routes all of 127/8 to lo).
		n.src = net.IPv4(127, 1, byte(i/250), byte(1+i%250))
		n.spool = filepath.Join(spools, n.name)
		if err := karpentersim.New(h.kc, 0).CreateNode(ctx, karpentersim.NodeSpec{Name: n.name, NodePool: "gpu", Zone: n.zone,
			InstanceType: "p5.48xlarge", GPUs: 8}); err != nil {
			h.fatal("create node: %v", err)
		}
		pod, err := h.cs.CoreV1().Pods(ns).Create(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "agent-" + n.name},
			Spec: corev1.PodSpec{NodeName: n.name, ServiceAccountName: sa,
				Containers: []corev1.Container{{Name: "agent", Image: "fleetrepair-agent"}}}}, metav1.CreateOptions{})
		if err != nil {
			h.fatal("create agent pod: %v", err)
		}
		exp := int64(3600)
		tr, err := h.cs.CoreV1().ServiceAccounts(ns).CreateToken(ctx, sa, &authnv1.TokenRequest{Spec: authnv1.TokenRequestSpec{
			Audiences: []string{"fleetrepair"}, ExpirationSeconds: &exp,
			BoundObjectRef: &authnv1.BoundObjectReference{Kind: "Pod", APIVersion: "v1", Name: pod.Name, UID: pod.UID}}}, metav1.CreateOptions{})
		if err != nil {
			h.fatal("request token: %v", err)
		}
		n.token = tr.Status.Token
		h.nodes = append(h.nodes, n)
	}
}

// ctlProc is one controller process.
type ctlProc struct {
	name string
	cmd  *exec.Cmd
	done chan struct{}
	log  string
}

// killedBySIGKILL reports whether the process ended by SIGKILL.
func (p *ctlProc) killedBySIGKILL() bool {
	ws, ok := p.cmd.ProcessState.Sys().(syscall.WaitStatus)
	return ok && ws.Signaled() && ws.Signal() == syscall.SIGKILL
}

// startController starts the controller on the harness's port: the
// production binary, or faultctl killing itself at crashAt. It waits for
// /readyz.
func (h *faultHarness) startController(ctx context.Context, name, crashAt string) *ctlProc {
	listen := "127.0.0.1:" + strconv.Itoa(h.port)
	dsn := h.pg.DSN("") + "&pool_max_conns=16"
	var cmd *exec.Cmd
	if crashAt == "" {
		cmd = exec.Command(h.bin, "controller", "--database-url", dsn, "--listen", listen,
			"--cluster", Cluster+"="+h.env.Kubeconfig, "--agent-auth=tokenreview",
			"--toleration", h.cfg.Toleration.String(), "--resync", "1s", "--read-timeout", h.cfg.ReadTimeout.String(),
			"--deletions-per-hour", "1000", "--nodepool-deletions-per-hour", "1000", "--max-in-flight-per-nodepool", "100")
	} else {
		cmd = exec.Command(h.ctl, "--database-url", dsn, "--listen", listen, "--cluster", Cluster, "--cluster-kubeconfig", h.env.Kubeconfig,
			"--toleration", h.cfg.Toleration.String(), "--resync", "1s", "--crash-at", crashAt)
	}
	dir := h.cfg.LogDir
	if dir == "" {
		dir = h.tb.TempDir()
	} else if err := os.MkdirAll(dir, 0o755); err != nil {
		h.fatal("create log folder: %v", err)
	}
	p := &ctlProc{name: name, cmd: cmd, done: make(chan struct{}), log: filepath.Join(dir, name+".log")}
	logf, err := os.Create(p.log)
	if err != nil {
		h.fatal("create controller log: %v", err)
	}
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		h.fatal("start controller: %v", err)
	}
	go func() { _ = cmd.Wait(); logf.Close(); close(p.done) }()
	h.tb.Cleanup(func() {
		select {
		case <-p.done:
		default:
			_ = cmd.Process.Signal(syscall.SIGTERM)
			select {
			case <-p.done:
			case <-time.After(10 * time.Second):
				_ = cmd.Process.Kill()
				<-p.done
			}
		}
		if h.tb.Failed() {
			b, _ := os.ReadFile(p.log)
			if len(b) > 3000 {
				b = b[len(b)-3000:]
			}
			h.tb.Logf("%s log tail:\n%s", name, b)
		}
	})
	deadline := time.Now().Add(time.Minute)
	for {
		resp, err := http.Get(h.url.String() + "/readyz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return p
			}
		}
		select {
		case <-p.done:
			b, _ := os.ReadFile(p.log)
			h.fatal("controller %s exited at start: %s", name, b)
		case <-ctx.Done():
			h.fatal("controller %s: %v", name, ctx.Err())
		case <-time.After(100 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			h.fatal("controller %s not ready within 1m", name)
		}
	}
}

// stopController stops the running controller with SIGTERM.
func (h *faultHarness) stopController() {
	p := h.proc
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(15 * time.Second):
		_ = p.cmd.Process.Kill()
		<-p.done
	}
}

// startAgent starts n's uplink with its spool in dir, dialling from n's
// own source address.
func (h *faultHarness) startAgent(ctx context.Context, n *fnode, dir string) {
	d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: n.src}, Timeout: 5 * time.Second}
	base := &http.Transport{DialContext: d.DialContext, MaxIdleConnsPerHost: 2, IdleConnTimeout: 30 * time.Second}
	n.tr = &agentTransport{base: base, urls: []*url.URL{h.url}, st: h.st}
	up, err := uplink.New(uplink.Config{URL: h.url.String(), Cluster: Cluster, Node: n.name, BootID: n.boot, AgentVersion: "faults",
		Token: n.token, HTTPClient: &http.Client{Transport: n.tr}, FlushInterval: time.Second, HeartbeatInterval: h.cfg.Heartbeat,
		RetryMaxInterval: 5 * time.Second, SpoolDir: dir, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		h.fatal("configure agent %s: %v", n.name, err)
	}
	up.SetHeartbeat(finding.Heartbeat{DriverVersion: "550.54.15", KernelVersion: "6.8.0-1015-aws", GPUCount: 8,
		Monitors: []finding.MonitorState{{Name: "kmsg", State: finding.StateOK, Since: time.Now()}}})
	actx, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	n.up, n.stop, n.done = up, stop, done
	go func() { _ = up.Run(actx); close(done) }()
}

// enqueue gives node n a finding and remembers it.
func (h *faultHarness) enqueue(n *fnode, f finding.Finding) string {
	f.Node, f.BootID, f.Count, f.Seq = n.name, n.boot, 1, n.seq.Add(1)
	f.Time = time.Now().UTC()
	f.ID = finding.NewID(f)
	h.mu.Lock() // under the lock: a kill (killAgent) swaps n.up meanwhile
	defer h.mu.Unlock()
	h.enqueued[f.ID] = n
	n.up.Enqueue(f) // never blocks
	return f.ID
}

// background sends informational findings from the nodes that are not
// crash-point nodes until ctx ends.
func (h *faultHarness) background(ctx context.Context) {
	t := time.NewTicker(time.Duration(float64(time.Second) / h.cfg.Background))
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			n := h.others[rand.IntN(len(h.others))]
			h.enqueue(n, sbeRate(n.seq.Load()+1))
		}
	}
}

// acceptanceSince is the good agents' POST outcomes since c0.
func (h *faultHarness) acceptanceSince(c0 counts) Acceptance {
	c := h.st.counts().sub(c0)
	return Acceptance{Accepted: c.ok, Refused: c.tooMany + c.server + c.client + c.network}
}

// pgOutage stops PostgreSQL for PGOutage under load; in the middle of it
// KillAgents agents are killed and restarted from what their spool holds.
func (h *faultHarness) pgOutage(ctx context.Context) {
	h.log("fault: PostgreSQL stopped for %s, %d agents killed mid-outage", h.cfg.PGOutage, h.cfg.KillAgents)
	c0 := h.st.counts()
	if err := h.pg.Halt(); err != nil {
		h.fail("halt postgres: %v", err)
		return
	}
	start := time.Now()
	sleepCtx(ctx, h.cfg.PGOutage/2)
	for _, n := range h.others[:h.cfg.KillAgents] {
		h.killAgent(ctx, n)
	}
	sleepCtx(ctx, h.cfg.PGOutage-time.Since(start))
	if err := h.pg.Resume(ctx); err != nil {
		h.fatal("resume postgres: %v", err)
	}
	h.res.PGOutage = time.Since(start)
	h.res.OutageAnswers = h.st.counts().sub(c0)
	h.log("PostgreSQL back after %s; agents' answers meanwhile %+v", h.res.PGOutage.Round(time.Millisecond), h.res.OutageAnswers)
	h.res.AgentsKilled = h.cfg.KillAgents
	c1 := h.st.counts()
	h.res.OutageDrain = h.waitAcked(ctx, "after the PostgreSQL outage")
	h.res.DrainAnswers = h.st.counts().sub(c1)
}

// killAgent kills n's agent as SIGKILL would: its process stops sending at
// once, and only its spool file survives. The harness copies that file (the
// state on disk at the kill) to a new folder and starts a new agent from
// it; the old uplink, stopped, writes nothing the new one reads.
func (h *faultHarness) killAgent(ctx context.Context, n *fnode) {
	n.tr.dead.Store(true)
	h.mu.Lock() // no finding reaches the old uplink after the copy
	dir := n.spool + "-restarted"
	if err := os.MkdirAll(dir, 0o755); err != nil {
		h.mu.Unlock()
		h.fatal("create spool folder: %v", err)
	}
	ids := map[string]bool{}
	if b, err := os.ReadFile(filepath.Join(n.spool, "findings.jsonl")); err == nil {
		if err := os.WriteFile(filepath.Join(dir, "findings.jsonl"), b, 0o600); err != nil {
			h.mu.Unlock()
			h.fatal("copy spool: %v", err)
		}
		sc := bufio.NewScanner(strings.NewReader(string(b)))
		sc.Buffer(make([]byte, 1<<20), 64<<20)
		for sc.Scan() {
			var f finding.Finding
			if json.Unmarshal(sc.Bytes(), &f) == nil && f.ID != "" {
				ids[f.ID] = true
			}
		}
	}
	for id, on := range h.enqueued {
		if on == n && !ids[id] {
			if _, acked := h.st.ackTime(id); !acked {
				h.killedAt[id] = true
			}
		}
	}
	old := n.stop
	oldDone := n.done
	n.spool = dir
	h.startAgent(ctx, n, dir)
	h.mu.Unlock()
	old()
	<-oldDone
	h.mu.Lock()
	h.res.Spooled += len(ids)
	h.mu.Unlock()
	go func() { // replayed: every spooled finding is acknowledged after the restart
		deadline := time.Now().Add(h.cfg.Drain)
		for time.Now().Before(deadline) && ctx.Err() == nil {
			left := 0
			for id := range ids {
				if _, ok := h.st.ackTime(id); !ok {
					left++
				}
			}
			if left == 0 {
				break
			}
			sleepCtx(ctx, 250*time.Millisecond)
		}
		n := 0
		for id := range ids {
			if _, ok := h.st.ackTime(id); ok {
				n++
			}
		}
		h.mu.Lock()
		h.res.Replayed += n
		h.mu.Unlock()
	}()
}

// waitAcked waits until every finding given to a live agent before it was
// called is acknowledged, at most Drain. Findings given meanwhile are not
// waited for: under the background load there is always one in flight, so
// "nothing unacknowledged" would hold only by chance.
func (h *faultHarness) waitAcked(ctx context.Context, when string) time.Duration {
	start := time.Now()
	deadline := start.Add(h.cfg.Drain)
	c0 := h.st.counts()
	h.mu.Lock()
	want := make(map[string]*fnode, len(h.enqueued))
	for id, n := range h.enqueued {
		if !h.killedAt[id] {
			want[id] = n
		}
	}
	h.mu.Unlock()
	for {
		left := map[string]int{}
		for id, n := range want {
			if _, ok := h.st.ackTime(id); ok {
				delete(want, id)
			} else {
				left[n.name]++
			}
		}
		if len(want) == 0 {
			h.log("everything acknowledged %s within %s; answers meanwhile %+v", when, time.Since(start).Round(time.Millisecond), h.st.counts().sub(c0))
			return time.Since(start)
		}
		if time.Now().After(deadline) {
			h.fail("%d findings unacknowledged %s+%s (by node: %v), answers meanwhile %+v", len(want), when, h.cfg.Drain, left, h.st.counts().sub(c0))
			h.mu.Lock()
			for id := range want {
				h.late[id] = time.Now()
			}
			h.mu.Unlock()
			return time.Since(start)
		}
		sleepCtx(ctx, 250*time.Millisecond)
	}
}

// slowBodies opens SlowConns connections from one source (127.0.0.3) that
// each send a report's headers and then one body byte per second, while
// the good agents keep reporting. It counts how many connections the
// server still holds over time: none may outlive the read timeout.
func (h *faultHarness) slowBodies(ctx context.Context) {
	cfg := h.cfg
	dur := cfg.FloodFor
	if dur == 0 {
		dur = cfg.ReadTimeout + 15*time.Second
	}
	h.log("fault: %d slow-body connections for %s (controller --read-timeout %s)", cfg.SlowConns, dur, cfg.ReadTimeout)
	fctx, stop := context.WithTimeout(ctx, dur)
	defer stop()
	c0 := h.st.counts()
	var open, peak atomic.Int64
	var longest atomic.Int64
	start := time.Now()
	var wg sync.WaitGroup
	d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, 3)}, Timeout: 5 * time.Second}
	for i := range cfg.SlowConns {
		wg.Go(func() {
			conn, err := d.DialContext(fctx, "tcp", h.url.Host)
			if err != nil {
				return
			}
			defer conn.Close()
			began := time.Now()
			for p, m := open.Add(1), peak.Load(); p > m && !peak.CompareAndSwap(m, p); m = peak.Load() {
			}
			closed := make(chan struct{})
			go func() { // the server closes (or answers) when it gives up on the body
				_, _ = io.Copy(io.Discard, conn)
				close(closed)
			}()
			_, err = fmt.Fprintf(conn, "POST /api/v1/reports HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\nAuthorization: Bearer slow-%d\r\nContent-Length: 1048576\r\n\r\n{", h.url.Host, i)
			t := time.NewTicker(time.Second)
			defer t.Stop()
			ended := false // the flood ended with the connection still held
		loop:
			for err == nil { // a failed write: the server closed it
				select {
				case <-fctx.Done():
					ended = true
					break loop
				case <-closed:
					break loop
				case <-t.C:
					_, err = conn.Write([]byte(" "))
				}
			}
			if !ended {
				held := int64(time.Since(began))
				for l := longest.Load(); held > l && !longest.CompareAndSwap(l, held); l = longest.Load() {
				}
			}
			open.Add(-1)
		})
	}
	// Held once the read timeout is over for every connection (they all
	// start within the first seconds).
	sleepCtx(ctx, min(cfg.ReadTimeout+5*time.Second, dur-time.Second))
	h.res.SlowHeldAfter = int(open.Load())
	wg.Wait()
	h.res.SlowConns, h.res.SlowHeldPeak, h.res.SlowLongest = cfg.SlowConns, int(peak.Load()), time.Duration(longest.Load())
	h.res.SlowAcceptance = h.acceptanceSince(c0)
	h.log("slow bodies: peak %d held, %d still held after %s, longest %s; good agents %.1f%% accepted (%+v)",
		h.res.SlowHeldPeak, h.res.SlowHeldAfter, time.Since(start).Round(time.Second), h.res.SlowLongest.Round(time.Millisecond),
		h.res.SlowAcceptance.Percent(), h.res.SlowAcceptance)
	if h.res.SlowHeldAfter != 0 {
		h.fail("%d slow-body connections still held after the read timeout (%s) + 5s", h.res.SlowHeldAfter, cfg.ReadTimeout)
	}
	if h.res.SlowAcceptance.Refused != 0 {
		h.fail("good agents' acceptance during the slow-body flood: %.1f%% (%+v), want 100%%", h.res.SlowAcceptance.Percent(), h.res.SlowAcceptance)
	}
}

// badTokens floods the ingest with garbage tokens from one source
// (127.0.0.2) at BadTokenRPS for FloodFor, while the good agents keep
// reporting; midway a new agent, whose token was never reviewed, starts on
// its own source and must get its first report accepted.
func (h *faultHarness) badTokens(ctx context.Context) {
	cfg := h.cfg
	dur := cfg.FloodFor
	if dur == 0 {
		dur = time.Minute
	}
	h.log("fault: %d garbage-token reports/s for %s", cfg.BadTokenRPS, dur)
	fctx, stop := context.WithTimeout(ctx, dur)
	defer stop()
	c0 := h.st.counts()
	d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, 2)}, Timeout: 5 * time.Second}
	cl := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{DialContext: d.DialContext, MaxIdleConnsPerHost: 64}}
	body, _ := json.Marshal(finding.Report{SchemaVersion: finding.SchemaVersion, Cluster: Cluster, Node: h.others[0].name,
		BootID: "b", SentAt: time.Now().UTC(), Findings: []finding.Finding{}})
	var mu sync.Mutex
	var wg sync.WaitGroup
	t := time.NewTicker(time.Second / time.Duration(max(cfg.BadTokenRPS, 1)))
	newAgent := time.After(dur / 2)
	var sent atomic.Int64
loop:
	for {
		select {
		case <-fctx.Done():
			break loop
		case <-newAgent:
			wg.Go(func() { h.newAgentMidFlood(fctx) })
		case <-t.C:
			i := sent.Add(1)
			wg.Go(func() {
				req, _ := http.NewRequestWithContext(fctx, http.MethodPost, h.url.String()+"/api/v1/reports", strings.NewReader(string(body)))
				req.Header.Set("Content-Type", "application/json")
				req.Header.Set("Authorization", "Bearer garbage-"+strconv.FormatInt(i, 10))
				resp, err := cl.Do(req)
				code := 0
				if err == nil {
					_, _ = io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
					code = resp.StatusCode
				}
				mu.Lock()
				h.res.BadTokenAnswers[code]++
				mu.Unlock()
			})
		}
	}
	t.Stop()
	wg.Wait()
	h.res.BadTokens = sent.Load()
	h.res.BadAcceptance = h.acceptanceSince(c0)
	h.log("bad tokens: %d sent, answers %v; good agents %.1f%% accepted (%+v); new agent accepted after %s",
		h.res.BadTokens, h.res.BadTokenAnswers, h.res.BadAcceptance.Percent(), h.res.BadAcceptance, h.res.NewAgentAfter)
	if h.res.BadAcceptance.Refused != 0 {
		h.fail("good agents' acceptance during the bad-token flood: %.1f%% (%+v), want 100%%", h.res.BadAcceptance.Percent(), h.res.BadAcceptance)
	}
	if h.res.BadTokenAnswers[http.StatusOK] != 0 {
		h.fail("%d garbage-token reports were accepted", h.res.BadTokenAnswers[http.StatusOK])
	}
	if h.res.NewAgentAfter == 0 {
		h.fail("an agent started during the bad-token flood had no report accepted before the flood ended")
	}
}

// newAgentMidFlood reports as a new agent of the last node (a new Pod bound
// to it, from its own source 127.0.0.4): its token was never reviewed, so
// its first report costs a TokenReview in the middle of the flood.
func (h *faultHarness) newAgentMidFlood(ctx context.Context) {
	n := h.others[len(h.others)-1]
	const ns, sa = "fleetrepair", "fleetrepair-agent"
	pod, err := h.cs.CoreV1().Pods(ns).Create(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "agent2-" + n.name},
		Spec: corev1.PodSpec{NodeName: n.name, ServiceAccountName: sa, Containers: []corev1.Container{{Name: "agent", Image: "fleetrepair-agent"}}}},
		metav1.CreateOptions{})
	if err != nil {
		h.fail("create the new agent's pod: %v", err)
		return
	}
	exp := int64(3600)
	tr, err := h.cs.CoreV1().ServiceAccounts(ns).CreateToken(ctx, sa, &authnv1.TokenRequest{Spec: authnv1.TokenRequestSpec{
		Audiences: []string{"fleetrepair"}, ExpirationSeconds: &exp,
		BoundObjectRef: &authnv1.BoundObjectReference{Kind: "Pod", APIVersion: "v1", Name: pod.Name, UID: pod.UID}}}, metav1.CreateOptions{})
	if err != nil {
		h.fail("request the new agent's token: %v", err)
		return
	}
	rep, _ := json.Marshal(finding.Report{SchemaVersion: finding.SchemaVersion, Cluster: Cluster, Node: n.name, BootID: n.boot,
		SentAt: time.Now().UTC(), Findings: []finding.Finding{}})
	d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, 4)}}
	cl := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{DialContext: d.DialContext}}
	start := time.Now()
	for ctx.Err() == nil {
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, h.url.String()+"/api/v1/reports", strings.NewReader(string(rep)))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Authorization", "Bearer "+tr.Status.Token)
		resp, err := cl.Do(req)
		if err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				h.res.NewAgentAfter = max(time.Since(start), time.Microsecond)
				return
			}
		}
		sleepCtx(ctx, 200*time.Millisecond)
	}
}

// stepKills kills the controller at each crash point of a repair, one
// crash-point node after the other: faultctl replaces the controller, the
// node reports Xid 79, faultctl SIGKILLs itself at the point, and the
// production controller is started again; the repair must end replaced
// with exactly one NodeClaim DELETE.
func (h *faultHarness) stepKills(ctx context.Context) {
	for i, point := range repair.CrashPoints {
		n := h.steps[i]
		h.log("fault: controller killed at %s (node %s)", point, n.name)
		sr := StepResult{Point: point, Node: n.name}
		start := time.Now()
		d0 := h.nodeClaimDeletes(ctx)
		h.stopController()
		h.proc = h.startController(ctx, fmt.Sprintf("faultctl-%d-%s", i, point), point)
		h.enqueue(n, xid79(n.seq.Load()+1))
		select {
		case <-h.proc.done:
			sr.Killed = h.proc.killedBySIGKILL()
		case <-time.After(h.cfg.StepWait):
			h.fail("%s: the repair of %s did not reach the point within %s", point, n.name, h.cfg.StepWait)
			h.stopController()
		}
		sr.StateAtKill = h.repairState(ctx, n.name)
		h.proc = h.startController(ctx, fmt.Sprintf("fleetrepair-%d", i+1), "")
		deadline := time.Now().Add(h.cfg.StepWait)
		for {
			sr.Final = h.repairState(ctx, n.name)
			if ledger.Terminal(sr.Final) || time.Now().After(deadline) {
				break
			}
			sleepCtx(ctx, 250*time.Millisecond)
		}
		sleepCtx(ctx, 2*time.Second) // a second delete would come on the next passes
		sr.Deletes = h.nodeClaimDeletes(ctx) - d0
		sr.Took = time.Since(start)
		h.res.Steps = append(h.res.Steps, sr)
		h.log("  killed=%v state at kill %s, final %s, NodeClaim DELETE calls %.0f, %s", sr.Killed, sr.StateAtKill, sr.Final, sr.Deletes, sr.Took.Round(time.Millisecond))
		switch {
		case !sr.Killed:
			h.fail("%s: the controller was not killed at the point (exit %v)", point, h.proc.cmd.ProcessState)
		case sr.Final != ledger.Replaced:
			h.fail("%s: the repair of %s ended %q after the restart, want replaced", point, n.name, sr.Final)
		case sr.Deletes != 1:
			h.fail("%s: %.0f NodeClaim DELETE calls for %s, want exactly 1", point, sr.Deletes, n.name)
		}
	}
}

// repairState is the state of node's latest repair ("" when none).
func (h *faultHarness) repairState(ctx context.Context, node string) ledger.State {
	var s string
	_ = h.db.QueryRow(ctx, `SELECT state FROM repairs WHERE cluster = $1 AND node = $2 ORDER BY id DESC LIMIT 1`, Cluster, node).Scan(&s)
	return ledger.State(s)
}

// nodeClaimDeletes is the API server's count of NodeClaim DELETE calls.
func (h *faultHarness) nodeClaimDeletes(ctx context.Context) float64 {
	b, err := h.cs.CoreV1().RESTClient().Get().AbsPath("/metrics").DoRaw(ctx)
	if err != nil {
		h.fail("read API server /metrics: %v", err)
		return 0
	}
	return parseAPIRequests(b, time.Now()).by["DELETE nodeclaims"]
}

// drain waits until everything given to a live agent is acknowledged.
func (h *faultHarness) drain(ctx context.Context) {
	_ = h.waitAcked(ctx, "at the end")
}

// final counts acknowledged vs stored findings and the repairs left open.
func (h *faultHarness) final(ctx context.Context) {
	res := h.res
	ids := h.st.ackedIDs()
	h.mu.Lock()
	res.Enqueued, res.LostAtKill = len(h.enqueued), len(h.killedAt)
	h.mu.Unlock()
	res.Acked = len(ids)
	for i := 0; i < len(ids); i += 5000 {
		var n int
		if err := h.db.QueryRow(ctx, `SELECT count(*) FROM findings WHERE cluster = $1 AND id = ANY($2)`, Cluster, ids[i:min(i+5000, len(ids))]).Scan(&n); err != nil {
			h.fail("count stored findings: %v", err)
			return
		}
		res.Stored += n
	}
	res.Lost = res.Acked - res.Stored
	if res.Lost != 0 {
		h.fail("%d of %d acknowledged findings are not in the database", res.Lost, res.Acked)
	}
	h.st.mu.Lock()
	res.ClientErrors = append([]string(nil), h.st.clientErrors...)
	h.st.mu.Unlock()
	h.mu.Lock()
	for id, at := range h.late {
		if acked, ok := h.st.ackTime(id); ok {
			h.log("late finding %s of %s: acknowledged %s after the drain gave up", id, h.enqueued[id].name, acked.Sub(at).Round(time.Millisecond))
		} else {
			h.log("late finding %s of %s: never acknowledged", id, h.enqueued[id].name)
		}
	}
	h.mu.Unlock()
	h.mu.Lock()
	spooled, replayed := res.Spooled, res.Replayed
	h.mu.Unlock()
	if replayed != spooled {
		h.fail("%d of the %d findings in killed agents' spools were acknowledged after their restart", replayed, spooled)
	}
	rows, err := h.db.Query(ctx, `SELECT node, state FROM repairs WHERE cluster = $1 AND state <> ALL($2)`, Cluster, terminalStates())
	if err != nil {
		h.fail("read open repairs: %v", err)
		return
	}
	defer rows.Close()
	for rows.Next() {
		var node, state string
		if err := rows.Scan(&node, &state); err != nil {
			h.fail("read open repairs: %v", err)
			return
		}
		res.Stuck = append(res.Stuck, node+" "+state)
	}
	if len(res.Stuck) != 0 {
		h.fail("repairs left in an intermediate state: %v", res.Stuck)
	}
}

func terminalStates() []string {
	var out []string
	for _, s := range ledger.AllStates {
		if ledger.Terminal(s) {
			out = append(out, string(s))
		}
	}
	return out
}

// WriteTable writes the run's figures.
func (r *FaultResult) WriteTable(w io.Writer) error {
	c := r.Config
	var b strings.Builder
	fmt.Fprintf(&b, "fleetrepair faults: %d nodes, 1 controller (--agent-auth=tokenreview, --read-timeout %s, --toleration %s), heartbeat %s, background %.0f findings/s\n\n",
		c.Nodes, c.ReadTimeout, c.Toleration, c.Heartbeat, c.Background)
	fmt.Fprintf(&b, "findings: %d given to agents, %d acknowledged, %d of them stored, %d lost (must be 0); %d lost in killed agents' memory (not spooled yet, never acknowledged)\n",
		r.Enqueued, r.Acked, r.Stored, r.Lost, r.LostAtKill)
	fmt.Fprintf(&b, "PostgreSQL stopped %s: good agents' POSTs meanwhile %d accepted, %d 503, %d 429, %d other 4xx, %d no answer\n",
		r.PGOutage.Round(time.Second), r.OutageAnswers.ok, r.OutageAnswers.server, r.OutageAnswers.tooMany, r.OutageAnswers.client, r.OutageAnswers.network)
	fmt.Fprintf(&b, "after PostgreSQL came back: everything acknowledged within %s; POSTs meanwhile %d accepted, %d 503, %d 429, %d other 4xx, %d no answer\n",
		r.OutageDrain.Round(100*time.Millisecond), r.DrainAnswers.ok, r.DrainAnswers.server, r.DrainAnswers.tooMany, r.DrainAnswers.client, r.DrainAnswers.network)
	fmt.Fprintf(&b, "agents killed mid-outage: %d; findings in their spools %d, replayed and acknowledged after restart %d\n", r.AgentsKilled, r.Spooled, r.Replayed)
	fmt.Fprintf(&b, "slow-body flood: %d connections, peak held %d, held after read timeout + 5s: %d (must be 0), longest held %s; good agents accepted %.1f%% (%d of %d)\n",
		r.SlowConns, r.SlowHeldPeak, r.SlowHeldAfter, r.SlowLongest.Round(100*time.Millisecond), r.SlowAcceptance.Percent(), r.SlowAcceptance.Accepted, r.SlowAcceptance.Accepted+r.SlowAcceptance.Refused)
	fmt.Fprintf(&b, "bad-token flood: %d garbage-token reports (answers %v); good agents accepted %.1f%% (%d of %d); a new agent mid-flood accepted after %s\n",
		r.BadTokens, r.BadTokenAnswers, r.BadAcceptance.Percent(), r.BadAcceptance.Accepted, r.BadAcceptance.Accepted+r.BadAcceptance.Refused, r.NewAgentAfter.Round(time.Millisecond))
	fmt.Fprintf(&b, "\ncontroller killed at each step of a repair (faultctl SIGKILLs itself, cmd/fleetrepair restarted):\n")
	for _, s := range r.Steps {
		fmt.Fprintf(&b, "  %-22s killed=%-5v state at kill %-12s final %-9s NodeClaim DELETE calls %.0f  (%s)\n", s.Point, s.Killed, s.StateAtKill, s.Final, s.Deletes, s.Took.Round(100*time.Millisecond))
	}
	fmt.Fprintf(&b, "repairs stuck in an intermediate state: %d %v\n", len(r.Stuck), r.Stuck)
	if len(r.ClientErrors) > 0 {
		fmt.Fprintf(&b, "\n4xx answers to good agents (first %d):\n", len(r.ClientErrors))
		for _, e := range r.ClientErrors {
			fmt.Fprintf(&b, "  %s\n", e)
		}
	}
	if len(r.Failures) > 0 {
		fmt.Fprintf(&b, "\nFAILURES:\n")
		for _, f := range r.Failures {
			fmt.Fprintf(&b, "  %s\n", f)
		}
	}
	_, err := io.WriteString(w, b.String())
	return err
}
