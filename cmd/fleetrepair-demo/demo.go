package main

import (
	"context"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"net"
	"os"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/spf13/cobra"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	karpv1 "sigs.k8s.io/karpenter/pkg/apis/v1"

	"github.com/fleetrepair/fleetrepair/agent/detect"
	"github.com/fleetrepair/fleetrepair/agent/finding"
	"github.com/fleetrepair/fleetrepair/agent/kmsg"
	"github.com/fleetrepair/fleetrepair/agent/pipeline"
	"github.com/fleetrepair/fleetrepair/agent/source"
	"github.com/fleetrepair/fleetrepair/agent/uplink"
	"github.com/fleetrepair/fleetrepair/cmd/runner"
	"github.com/fleetrepair/fleetrepair/controller/auth"
	"github.com/fleetrepair/fleetrepair/controller/config"
	"github.com/fleetrepair/fleetrepair/controller/kube"
	"github.com/fleetrepair/fleetrepair/controller/ledger"
	"github.com/fleetrepair/fleetrepair/controller/shadow"
	"github.com/fleetrepair/fleetrepair/controller/store"
	"github.com/fleetrepair/fleetrepair/test/fixtures"
	"github.com/fleetrepair/fleetrepair/test/karpentersim"
	"github.com/fleetrepair/fleetrepair/test/pgtemp"
	"github.com/fleetrepair/fleetrepair/web/apiclient"
)

// demoOptions are the flags of `fleetrepair-demo`.
type demoOptions struct {
	listen       string
	databaseURL  string
	toleration   time.Duration
	replaceDelay time.Duration
	exitAfter    bool
	timeout      time.Duration
	verbose      bool
}

func newDemoCmd() *cobra.Command {
	var o demoOptions
	cmd := &cobra.Command{
		Use:   "demo",
		Short: "Run the self-contained demo: throwaway PostgreSQL, simulated fleet, real agents replaying real kernel logs",
		Long: `Run the whole system on one machine, with no cluster and no database server
needed. It starts a throwaway PostgreSQL from the local PostgreSQL
binaries (or uses DATABASE_URL), a simulated cluster (client fakes holding
Nodes, a NodePool and NodeClaims, plus a simulated Karpenter that replaces a
deleted NodeClaim), the controller and its API, and one real agent pipeline
per node replaying kernel logs from the case corpus:

  gpu-a100-1  a GPU falls off the bus (c01: AER + Xid 79)   -> quarantined, replaced
  gpu-a100-2  application-class Xid 31 only (c10)            -> Events only
  gpu-a100-3, gpu-a100-4  quiet                              -> untouched
  gpu-h100-1..7 in us-east-1c  zone outage at t+30s (c02)    -> the zone breaker trips,
              their repairs wait for on-call approval; 17 other gpu-h100 nodes quiet

It prints what happens as it happens, the dashboard's URL (DEMO MODE local
login: a name and a role, no password), the API's URL and the DEMO MODE operator
token ("demo-admin") for on-call actions from the CLI, e.g.

  fleetrepair breakers list --server URL
  fleetrepair breakers resume zone=us-east-1c --reason "AZ healthy" --token demo-admin --server URL

With --exit-after-scenarios the demo plays on-call itself (it resumes the breaker
once all seven repairs are held), checks every outcome and exits non-zero if one
is wrong. Budgets in the demo: 20 deletions/h per cluster, 10/h per NodePool.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if o.toleration <= 0 || o.replaceDelay < 0 || o.timeout <= 0 {
				return fmt.Errorf("--toleration and --timeout must be > 0 and --replace-delay >= 0 (got %s, %s, %s)", o.toleration, o.timeout, o.replaceDelay)
			}
			return runDemo(cmd.Context(), o, cmd.OutOrStdout())
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.listen, "listen", "127.0.0.1:8080", "API listen address (127.0.0.1:0 picks a free port)")
	f.StringVar(&o.databaseURL, "database-url", os.Getenv("DATABASE_URL"), "use this PostgreSQL instead of a throwaway one (env DATABASE_URL)")
	f.DurationVar(&o.toleration, "toleration", 15*time.Second, "toleration window (shortened from the 10m default for the demo)")
	f.DurationVar(&o.replaceDelay, "replace-delay", 3*time.Second, "how long the simulated Karpenter takes to replace a node")
	f.BoolVar(&o.exitAfter, "exit-after-scenarios", false, "check every scenario outcome, print a summary and exit (non-zero if any is wrong)")
	f.DurationVar(&o.timeout, "timeout", 3*time.Minute, "with --exit-after-scenarios: give up after this long")
	f.BoolVar(&o.verbose, "verbose", false, "also print the controller's structured logs")
	return cmd
}

type demoNode struct {
	name, pool, zone, fixture, story string
	// delay is when the agent starts replaying, after the demo started.
	delay time.Duration
}

// zoneOutage is the zone of the second scenario: a degraded AZ takes the GPUs
// of most of its nodes off the bus at once. Replacing them would land the
// replacements in the same zone: the zone breaker must pause them.
const zoneOutage = "us-east-1c"

var demoNodes = func() []demoNode {
	ns := []demoNode{
		{name: "gpu-a100-1", pool: "gpu-a100", zone: "us-east-1a", fixture: "c01-xid79-aer-surprise-down/input.devkmsg.txt", story: "a GPU falls off the bus"},
		{name: "gpu-a100-2", pool: "gpu-a100", zone: "us-east-1a", fixture: "c10-xid31-driver-rollout/input.kmsg.txt", story: "application-class Xid 31 only"},
		{name: "gpu-a100-3", pool: "gpu-a100", zone: "us-east-1b", story: "quiet"},
		{name: "gpu-a100-4", pool: "gpu-a100", zone: "us-east-1b", story: "quiet"},
	}
	// Scenario 2: NodePool gpu-h100, 8 nodes in us-east-1c (7 lose a GPU at
	// t+30s) and 16 quiet nodes in us-east-1d.
	for i := 1; i <= 24; i++ {
		n := demoNode{name: fmt.Sprintf("gpu-h100-%d", i), pool: "gpu-h100", zone: "us-east-1d", story: "quiet"}
		if i <= 8 {
			n.zone = zoneOutage
		}
		if i <= 7 {
			n.fixture, n.story, n.delay = "c02-fallen-off-bus-no-xid/input.devkmsg.txt", "zone outage", 30*time.Second
		}
		ns = append(ns, n)
	}
	return ns
}()

const demoCluster = "demo"

// demoOperatorToken is the demo's local login for on-call actions (DEMO
// MODE ONLY): `fleetrepair approve ID --reason ... --token demo-admin`.
const demoOperatorToken = "demo-admin"

func demoOperators() *auth.Operators {
	ops, err := auth.NewOperators([]auth.Operator{{Name: "demo-admin", Role: auth.RoleAdmin, TokenSHA256: auth.TokenHash(demoOperatorToken)}})
	if err != nil {
		panic(err) // a constant list
	}
	return ops
}

// demoToken is the static agent token of the demo (DEMO MODE: static tokens
// cannot bind an agent to its node; production uses TokenReview).
const demoToken = "demo-agent-token"

func runDemo(ctx context.Context, o demoOptions, out io.Writer) error {
	p := func(format string, a ...any) {
		fmt.Fprintf(out, "%s  "+format+"\n", append([]any{time.Now().Format("15:04:05")}, a...)...)
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()

	if _, err := net.ResolveTCPAddr("tcp", o.listen); err != nil {
		return fmt.Errorf("--listen %q: %w", o.listen, err)
	}
	dsn := o.databaseURL
	if dsn == "" {
		p("starting a throwaway PostgreSQL (set DATABASE_URL to use your own)")
		srv, err := pgtemp.Start(ctx, pgtemp.Options{})
		if err != nil {
			return fmt.Errorf("start throwaway postgres: %w", err)
		}
		defer srv.Stop()
		dsn = srv.DSN("postgres")
		p("PostgreSQL ready on port %d (data in %s, removed on exit)", srv.Port(), srv.Dir())
	}

	c := fake.NewClientBuilder().WithScheme(kube.Scheme).WithStatusSubresource(&corev1.Node{}, &karpv1.NodeClaim{}).Build()
	sim := karpentersim.New(c, o.replaceDelay)
	replaced := make(chan karpentersim.Replacement, 16)
	sim.OnReplace = func(r karpentersim.Replacement) {
		p("karpenter: NodeClaim %s finalized, node %s removed; replacement %s is Ready", r.OldNodeClaim, r.OldNode, r.NewNode)
		replaced <- r
	}
	for _, pool := range []string{"gpu-a100", "gpu-h100"} {
		if err := sim.CreateNodePool(ctx, pool); err != nil {
			return err
		}
	}
	for _, n := range demoNodes {
		itype := map[string]string{"gpu-a100": "p4d.24xlarge", "gpu-h100": "p5.48xlarge"}[n.pool]
		if err := sim.CreateNode(ctx, karpentersim.NodeSpec{Name: n.name, NodePool: n.pool, Zone: n.zone, InstanceType: itype, GPUs: 8}); err != nil {
			return err
		}
	}
	p("simulated cluster %q: NodePool gpu-a100 (4 nodes, p4d.24xlarge) and gpu-h100 (24 nodes, p5.48xlarge), 8 GPUs each", demoCluster)

	logw := io.Discard
	if o.verbose {
		logw = out
	}
	log := slog.New(slog.NewTextHandler(logw, nil))
	ctrl, err := runner.Start(ctx, runner.Options{DatabaseURL: dsn, Migrate: true, Listen: o.listen,
		Clusters: map[string]*kube.Cluster{demoCluster: kube.New(demoCluster, c)}, Config: demoConfig(o.toleration),
		Authenticator: auth.StaticToken{Token: demoToken}, Operators: demoOperators(), DevLogin: true, Log: log})
	if err != nil {
		return err
	}
	p("controller API on %s  (toleration %s, dry-run off, DEMO MODE: static agent token)", ctrl.URL, o.toleration)
	p("dashboard: %s/fleet  (DEMO MODE local login: any name, pick viewer, approver or admin; no password)", ctrl.URL)

	var wg sync.WaitGroup
	errs := make(chan error, 16)
	goRun := func(name string, f func() error) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := f(); err != nil && ctx.Err() == nil {
				errs <- fmt.Errorf("%s: %w", name, err)
			}
		}()
	}
	goRun("controller", func() error { return ctrl.Run(ctx) })
	goRun("karpenter", func() error { return sim.Run(ctx, 500*time.Millisecond) })
	// Each agent runs until its node is replaced; the replacement node gets a
	// fresh (quiet) agent, as the DaemonSet would schedule one.
	var amu sync.Mutex
	stopAgent := map[string]context.CancelFunc{}
	startAgent := func(n demoNode) {
		actx, stop := context.WithCancel(ctx)
		amu.Lock()
		stopAgent[n.name] = stop
		amu.Unlock()
		goRun("agent "+n.name, func() error { return runDemoAgent(actx, ctrl.URL, n, log, p) })
	}
	started := time.Now().UTC().Truncate(time.Second)
	for _, n := range demoNodes {
		startAgent(n)
	}
	goRun("agent manager", func() error {
		for {
			select {
			case <-ctx.Done():
				return nil
			case r := <-replaced:
				amu.Lock()
				if stop := stopAgent[r.OldNode]; stop != nil {
					stop()
				}
				amu.Unlock()
				startAgent(demoNode{name: r.NewNode, story: "replacement"})
			}
		}
	})
	goRun("watch", func() error { return watchRepairs(ctx, ctrl.Store, p) })
	goRun("watch breakers", func() error { return watchBreakers(ctx, ctrl.Store, p) })

	p("agents started; %s", storyLine())
	p("try:  curl -s -H 'Authorization: Bearer %s' %s/api/v1/repairs | jq   or   FLEETREPAIR_TOKEN=%s ./bin/fleetrepair repairs list --server %s",
		demoOperatorToken, ctrl.URL, demoOperatorToken, ctrl.URL)
	p("live: curl -N -H 'Authorization: Bearer %s' %s/api/v1/events", demoOperatorToken, ctrl.URL)
	p("on-call (DEMO MODE local login):  ./bin/fleetrepair approve ID --reason '...' --token %s --server %s", demoOperatorToken, ctrl.URL)

	var result error
	if o.exitAfter {
		result = checkScenarios(ctx, ctrl, sim, started, o.timeout, p)
		cancel()
	} else {
		select {
		case <-ctx.Done():
		case err := <-errs:
			result = err
			cancel()
		}
	}
	wg.Wait()
	if result == nil {
		select {
		case err := <-errs:
			result = err
		default:
		}
	}
	return result
}

func storyLine() string {
	parts := make([]string, 0, 5)
	for _, n := range demoNodes[:4] {
		parts = append(parts, n.name+": "+n.story)
	}
	parts = append(parts, "gpu-h100-1..7 in "+zoneOutage+": zone outage at t+30s (the zone breaker pauses their repairs until on-call resumes it)")
	return strings.Join(parts, "; ")
}

// delayed is a Source that starts src after d (the agent heartbeats meanwhile).
type delayed struct {
	d   time.Duration
	src pipeline.Source
}

func (s delayed) Run(ctx context.Context, out chan<- kmsg.Record) error {
	select {
	case <-time.After(s.d):
	case <-ctx.Done():
		return nil
	}
	return s.src.Run(ctx, out)
}

// driverVersion is the demo's stand-in for what a real agent reads before any
// fault (NVML, /proc/driver/nvidia/version): the node's driver version, in
// its first heartbeat. Without it only the nodes whose replayed kernel log
// prints the driver's load banner would name a driver cohort, and that
// cohort would hold exactly the failing nodes. Versions per NodePool are the
// ones the replayed logs print (c02: 570.158.01, c10: 595.71.05).
type driverVersion string

func (driverVersion) Name() string { return "nvidia-driver" }

func (d driverVersion) Run(ctx context.Context, emit func(source.Result)) error {
	v := "595.71.05"
	if strings.HasPrefix(string(d), "gpu-h100-") {
		v = "570.158.01"
	}
	emit(source.Result{State: finding.StateOK, DriverVersion: v})
	<-ctx.Done()
	return nil
}

// quiet is a Source with no kernel messages: the agent only heartbeats.
type quiet struct{}

func (quiet) Run(ctx context.Context, _ chan<- kmsg.Record) error { <-ctx.Done(); return nil }

func runDemoAgent(ctx context.Context, url string, n demoNode, log *slog.Logger, p func(string, ...any)) error {
	boot := "demo-boot-" + n.name
	up, err := uplink.New(uplink.Config{URL: url, Cluster: demoCluster, Node: n.name, BootID: boot, AgentVersion: "demo", Token: demoToken,
		FlushInterval: time.Second, HeartbeatInterval: 5 * time.Second, Logger: log})
	if err != nil {
		return err
	}
	var src pipeline.Source = quiet{}
	if n.fixture != "" {
		src = delayed{d: n.delay, src: pipeline.Replay{Path: n.fixture, Interval: 300 * time.Millisecond, Clock: time.Now,
			Open: func(path string) (io.ReadCloser, error) {
				sub, err := fs.Sub(fixtures.Cases, "cases")
				if err != nil {
					return nil, err
				}
				return sub.Open(path)
			}}}
	}
	return pipeline.Run(ctx, pipeline.Config{Source: src, Uplink: up, Log: log, Pushers: []source.Pusher{driverVersion(n.name)},
		Detector: detect.Options{Node: n.name, BootID: boot},
		OnFinding: func(f finding.Finding) {
			what := f.Detector
			if f.Xid != 0 {
				what = fmt.Sprintf("xid %d", f.Xid)
			}
			if f.GPUPCI != "" {
				what += " on " + f.GPUPCI
			}
			p("agent %s: finding %s", n.name, what)
		}})
}

// watchRepairs prints every repair transition once, as it lands in the ledger.
func watchRepairs(ctx context.Context, st *store.Store, p func(string, ...any)) error {
	seen := map[int64]int{}
	t := time.NewTicker(300 * time.Millisecond)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		rs, _, err := st.ListRepairs(ctx, store.RepairFilter{Limit: store.MaxListLimit})
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
		sort.Slice(rs, func(i, j int) bool { return rs[i].ID < rs[j].ID })
		for _, r := range rs {
			audit, err := st.RepairAudit(ctx, r.ID)
			if err != nil {
				if ctx.Err() != nil {
					return nil
				}
				return err
			}
			for _, a := range audit[seen[r.ID]:] {
				from := string(a.From)
				if from == "" {
					from = "new"
				}
				p("repair %d %s: %s -> %s  (%s: %s)", r.ID, r.Node, from, a.To, a.Actor, a.Reason)
			}
			seen[r.ID] = len(audit)
		}
	}
}

// watchBreakers prints every breaker decision once, as it is saved.
func watchBreakers(ctx context.Context, st *store.Store, p func(string, ...any)) error {
	var last int64
	t := time.NewTicker(300 * time.Millisecond)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		ds, err := st.BreakerDecisions(ctx, 50)
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
		for i := len(ds) - 1; i >= 0; i-- {
			if d := ds[i]; d.ID > last {
				last = d.ID
				p("BREAKER %s %s: %s -> %s (%s, %s) %s", d.Scope, d.Cohort, d.From, d.To, d.Cause, d.Actor, d.Message)
			}
		}
	}
}

// zoneHeld reports how many zone-outage repairs wait for approval, held by
// the breaker.
func zoneHeld(ctx context.Context, st *store.Store) int {
	held := 0
	for i := 1; i <= 7; i++ {
		r, err := st.OpenRepairForNode(ctx, demoCluster, fmt.Sprintf("gpu-h100-%d", i))
		if err == nil && r.State == ledger.AwaitingApproval && r.Detail["held_by"] == "breaker" {
			held++
		}
	}
	return held
}

// checkScenarios drives the on-call part of the demo (it resumes the zone
// breaker once every zone repair is held), waits until every outcome holds
// or the timeout passes, prints a summary, and returns an error listing
// what is wrong.
func checkScenarios(ctx context.Context, ctrl *runner.Controller, sim *karpentersim.Sim, started time.Time, timeout time.Duration, p func(string, ...any)) error {
	st := ctrl.Store
	deadline := time.Now().Add(timeout)
	var problems []string
	var resumedAt time.Time
	for {
		if resumedAt.IsZero() && zoneHeld(ctx, st) == 7 {
			if early := replacedIn(sim, "gpu-h100-", time.Time{}); early > 0 {
				p("FAIL: %d zone-outage nodes replaced before the on-call decided", early)
			}
			p("on-call: all 7 zone repairs are held by the breaker; resuming it (the AZ is healthy again)")
			c, err := apiclient.New(ctrl.URL, apiclient.Options{Token: demoOperatorToken})
			if err != nil {
				return fmt.Errorf("demo on-call: %w", err)
			}
			if _, err := c.Resume(ctx, "zone="+zoneOutage, "demo: AZ recovered, replace the broken nodes"); err != nil {
				return fmt.Errorf("demo on-call: resume breaker: %w", err)
			}
			resumedAt = time.Now()
		}
		problems = demoProblems(ctx, st, sim, resumedAt)
		if len(problems) == 0 || time.Now().After(deadline) || ctx.Err() != nil {
			break
		}
		select {
		case <-ctx.Done():
		case <-time.After(500 * time.Millisecond):
		}
	}
	// Hold a little longer: nothing else may happen after success.
	if len(problems) == 0 {
		time.Sleep(2 * time.Second)
		problems = demoProblems(ctx, st, sim, resumedAt)
	}
	if len(problems) == 0 {
		problems = shadowProblems(ctx, ctrl, started)
	}
	p("---- scenario summary ----")
	checks := []string{
		"gpu-a100-1 (GPU lost): one repair, quarantined, NodeClaim deleted once after the toleration, node replaced",
		"replacement node: its agent reports, the removed node keeps no active diagnosis",
		"gpu-a100-2 (app-class Xids): Events only, no repair, no NodeClaim deletion",
		"gpu-a100-3, gpu-a100-4 (quiet): untouched",
		"zone outage (7 of 8 nodes in " + zoneOutage + "): the zone breaker tripped with its evidence, no replacement before on-call resumed it, then all 7 replaced (paced), no other node touched",
		"shadow report over the demo: its findings carry their times, it trips the same cohort breakers as the live controller did and deletes the same NodeClaims under the same reasons (those on-call released it holds)",
	}
	if len(problems) == 0 {
		for _, c := range checks {
			p("PASS  %s", c)
		}
		return nil
	}
	for _, pr := range problems {
		p("FAIL  %s", pr)
	}
	return fmt.Errorf("demo: %d scenario outcome(s) wrong", len(problems))
}

// replacedIn counts replacements of nodes with the prefix before t (zero t:
// all of them).
func replacedIn(sim *karpentersim.Sim, prefix string, before time.Time) int {
	n := 0
	for _, r := range sim.Replacements() {
		if strings.HasPrefix(r.OldNode, prefix) && (before.IsZero() || r.At.Before(before)) {
			n++
		}
	}
	return n
}

func demoProblems(ctx context.Context, st *store.Store, sim *karpentersim.Sim, resumedAt time.Time) []string {
	var out []string
	reps := sim.Replacements()
	lost := 0
	zone := map[string]bool{}
	for i := 1; i <= 7; i++ {
		zone[fmt.Sprintf("gpu-h100-%d", i)] = true
	}
	for _, r := range reps {
		switch {
		case r.OldNode == "gpu-a100-1":
			lost++
		case zone[r.OldNode]:
			if resumedAt.IsZero() || r.At.Before(resumedAt) {
				out = append(out, "zone-outage node "+r.OldNode+" was replaced before on-call resumed the breaker")
			}
		default:
			out = append(out, "node "+r.OldNode+" was replaced but should not have been")
		}
	}
	if resumedAt.IsZero() {
		out = append(out, fmt.Sprintf("zone breaker: %d of 7 zone repairs held so far", zoneHeld(ctx, st)))
	} else if n := replacedIn(sim, "gpu-h100-", time.Time{}); n != 7 {
		out = append(out, fmt.Sprintf("zone outage: %d of 7 nodes replaced after the resume so far", n))
	}
	if ds, err := st.BreakerDecisions(ctx, 100); err == nil {
		tripped := false
		for _, d := range ds {
			if d.Cohort == "zone="+zoneOutage && d.Cause == "tripped" {
				tripped = true
			}
		}
		if !tripped {
			out = append(out, "the zone breaker did not trip")
		}
	}
	if lost != 1 {
		out = append(out, fmt.Sprintf("gpu-a100-1 replaced %d times, want exactly 1", lost))
	}
	rs, _, err := st.ListRepairs(ctx, store.RepairFilter{Cluster: demoCluster, Node: "gpu-a100-1"})
	switch {
	case err != nil:
		out = append(out, "list repairs: "+err.Error())
	case len(rs) != 1:
		out = append(out, fmt.Sprintf("gpu-a100-1 has %d repairs, want 1", len(rs)))
	case rs[0].State != ledger.Replaced || rs[0].Reason != "GPULost":
		out = append(out, fmt.Sprintf("gpu-a100-1 repair is %s/%s, want replaced/GPULost", rs[0].State, rs[0].Reason))
	}
	for _, r := range reps {
		if r.OldNode != "gpu-a100-1" {
			continue
		}
		if n, err := st.GetNode(ctx, demoCluster, r.NewNode); err != nil || n.LastSeen.IsZero() {
			out = append(out, "replacement node "+r.NewNode+" has not reported from its agent yet")
		}
		if ds, err := st.ActiveDiagnoses(ctx, demoCluster, r.OldNode); err == nil && len(ds) > 0 {
			out = append(out, fmt.Sprintf("removed node %s still has %d active diagnoses", r.OldNode, len(ds)))
		}
	}
	for _, n := range []string{"gpu-a100-2", "gpu-a100-3", "gpu-a100-4"} {
		rs, _, err := st.ListRepairs(ctx, store.RepairFilter{Cluster: demoCluster, Node: n})
		if err == nil && len(rs) > 0 {
			out = append(out, fmt.Sprintf("%s has %d repair(s), want none", n, len(rs)))
		}
	}
	ds, err := st.DiagnosesForNode(ctx, demoCluster, "gpu-a100-2", 10)
	if err != nil {
		out = append(out, "diagnoses: "+err.Error())
	} else {
		events := 0
		for _, d := range ds {
			if d.Severity != "event" {
				out = append(out, "gpu-a100-2 has a "+d.Severity+" diagnosis "+d.Reason)
			}
			if !d.EventRecordedAt.IsZero() {
				events++
			}
		}
		if events == 0 {
			out = append(out, "gpu-a100-2 has no Event recorded yet")
		}
	}
	return out
}

// shadowProblems compares the shadow report over the demo's run (GET
// /api/v1/shadow from the agents' start to now) with the live breakers:
// both replay the same stored findings through the same decision code, so
// they must trip the same cohorts. They can only agree when the replayed
// findings carry the times they happened at (pipeline.Replay's Clock): an
// untimed finding is placed at an estimate of its receipt, and the zone's
// seven failures then fall into other breaker windows.
func shadowProblems(ctx context.Context, ctrl *runner.Controller, started time.Time) []string {
	c, err := apiclient.New(ctrl.URL, apiclient.Options{Token: demoOperatorToken})
	if err != nil {
		return []string{"shadow report: " + err.Error()}
	}
	rep, err := c.Shadow(ctx, started, time.Time{})
	if err != nil {
		return []string{"shadow report: " + err.Error()}
	}
	ds, err := ctrl.Store.BreakerDecisions(ctx, 100)
	if err != nil {
		return []string{"breaker decisions: " + err.Error()}
	}
	out := compareTrips(rep.Findings, rep.UntimedFindings, func(yield func(string) bool) {
		for _, t := range rep.Trips {
			if !yield(t.Cohort) {
				return
			}
		}
	}, ds)
	live, _, err := ctrl.Store.ListRepairs(ctx, store.RepairFilter{Since: started, Limit: store.MaxListLimit})
	if err != nil {
		return append(out, "repairs: "+err.Error())
	}
	return append(out, compareDeletions(rep, live)...)
}

// compareDeletions lists what differs between the NodeClaim deletions of
// the shadow report and the live controller's (repairs that reached
// deleting): every deletion the shadow report makes, the live controller
// made on the same node under the same reason; and every live deletion is
// either one of the shadow report's or one it holds for on-call (the
// replay never approves or resumes, docs/shadow.md).
func compareDeletions(rep shadow.Report, live []store.Repair) []string {
	deleted := map[string]string{} // cluster/node -> reason
	for _, rp := range live {
		if rp.State == ledger.Deleting || rp.State == ledger.Replaced {
			deleted[rp.Cluster+"/"+rp.Node] = rp.Reason
		}
	}
	held := map[string]bool{}
	for _, a := range rep.ApprovalsNeeded {
		held[a.Cluster+"/"+a.Node] = true
	}
	var out []string
	shadowed := map[string]bool{}
	for _, d := range rep.Deletions {
		k := d.Cluster + "/" + d.Node
		shadowed[k] = true
		switch reason, ok := deleted[k]; {
		case !ok:
			out = append(out, fmt.Sprintf("the shadow report deleted %s (%s), the live controller did not", k, d.Reason))
		case reason != d.Reason:
			out = append(out, fmt.Sprintf("the shadow report deleted %s under %s, the live controller under %s", k, d.Reason, reason))
		}
	}
	for k, reason := range deleted {
		if !shadowed[k] && !held[k] {
			out = append(out, fmt.Sprintf("the live controller deleted %s (%s), the shadow report neither deleted it nor held it for on-call", k, reason))
		}
	}
	sort.Strings(out)
	return out
}

// compareTrips lists what differs between the cohorts the shadow report
// tripped and those the live breakers tripped (decisions with cause
// "tripped"), and untimed replayed findings.
func compareTrips(findings, untimed int, shadow func(func(string) bool), live []store.BreakerDecision) []string {
	var out []string
	if findings == 0 {
		out = append(out, "shadow report: no findings replayed")
	}
	if untimed > 0 {
		out = append(out, fmt.Sprintf("shadow report: %d of %d replayed findings carry no time", untimed, findings))
	}
	want, got := map[string]bool{}, map[string]bool{}
	for _, d := range live {
		if d.Cause == "tripped" {
			want[d.Cohort] = true
		}
	}
	for c := range shadow {
		got[c] = true
	}
	for c := range want {
		if !got[c] {
			out = append(out, "the live breaker tripped "+c+", the shadow report did not")
		}
	}
	for c := range got {
		if !want[c] {
			out = append(out, "the shadow report tripped "+c+", the live breaker did not")
		}
	}
	sort.Strings(out)
	return out
}

// demoConfig is the demo's controller configuration: the defaults with
// the demo's toleration, a one-second pass and budgets that let the
// scenarios' repairs through at demo speed.
func demoConfig(toleration time.Duration) *config.Config {
	c := config.Default()
	c.Repair.Toleration, c.Repair.Resync = toleration, time.Second
	c.Budgets.DeletionsPerHour, c.Budgets.NodePoolDeletionsPerHour, c.Budgets.MaxInFlightPerNodePool = 20, 10, 1
	return &c
}
