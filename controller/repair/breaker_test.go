package repair_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"
	karpv1 "sigs.k8s.io/karpenter/pkg/apis/v1"

	"github.com/fleetrepair/fleetrepair/agent/finding"
	"github.com/fleetrepair/fleetrepair/controller/breaker"
	"github.com/fleetrepair/fleetrepair/controller/diagnose"
	"github.com/fleetrepair/fleetrepair/controller/kube"
	"github.com/fleetrepair/fleetrepair/controller/ledger"
	"github.com/fleetrepair/fleetrepair/controller/repair"
	"github.com/fleetrepair/fleetrepair/controller/store"
	"github.com/fleetrepair/fleetrepair/test/expect"
	"github.com/fleetrepair/fleetrepair/test/karpentersim"
	"github.com/fleetrepair/fleetrepair/test/pgtest"
)

// TestZoneBreakerHoldsCohortOnly: six of ten nodes in zone z1 lose a GPU at
// once (an AZ problem), one of forty in z2 too. The zone breaker trips: the
// z1 repairs wait for approval with the cohort and numbers, the lone z2
// failure is replaced. After a human resumes the breaker, the held repairs
// are released one per pass, each through the budgets.
func TestZoneBreakerHoldsCohortOnly(t *testing.T) {
	ctx := context.Background()
	e, z1, z2 := zoneFleet(t, repair.Config{})
	st, rec, clk := e.st, e.rec, e.clock
	failing := append(append([]string(nil), z1[:6]...), z2[0])
	for _, n := range failing {
		e.ingest(t, n, xid79())
		e.reconcile(t, n)
	}
	clk.Add(time.Minute)
	if err := rec.EvaluateBreakers(ctx); err != nil {
		t.Fatal(err)
	}
	doc, _, _ := st.BreakerState(ctx)
	var bs breaker.State
	_ = json.Unmarshal(doc, &bs)
	if _, open := bs.Cohorts["zone=z1"]; !open || len(bs.Cohorts) != 1 {
		t.Fatalf("open breakers = %v, want exactly zone=z1", bs.OpenCohorts())
	}
	clk.Add(10 * time.Minute)
	if err := rec.EvaluateBreakers(ctx); err != nil {
		t.Fatal(err)
	}
	for _, n := range failing {
		e.reconcile(t, n)
	}
	for _, n := range z1[:6] {
		r := e.open(t, n)
		if r.State != ledger.AwaitingApproval || r.Detail["held_by"] != "breaker" {
			t.Fatalf("%s: %s held_by=%v, want awaiting_approval held by the breaker", n, r.State, r.Detail["held_by"])
		}
		audit, _ := st.RepairAudit(ctx, r.ID)
		if last := audit[len(audit)-1]; !strings.Contains(last.Reason, "zone=z1") {
			t.Fatalf("%s: hold reason %q does not name the cohort", n, last.Reason)
		}
		if e.nodeClaimDeleting(t, n+"-nc") {
			t.Fatalf("%s: NodeClaim deleted behind an open breaker", n)
		}
	}
	if r := e.open(t, z2[0]); r.State != ledger.Deleting || !e.nodeClaimDeleting(t, z2[0]+"-nc") {
		t.Fatalf("lone z2 failure: %s, want deleting", r.State)
	}
	ds, _ := st.BreakerDecisions(ctx, 10)
	if len(ds) == 0 || ds[0].Cohort != "zone=z1" || !strings.Contains(string(ds[0].Evidence), "pValue") {
		t.Fatalf("breaker decisions = %+v, want the trip with its evidence", ds)
	}

	// On-call resumes the breaker: held repairs drain one per pass.
	doc, v, _ := st.BreakerState(ctx)
	_ = json.Unmarshal(doc, &bs)
	bs, d, err := breaker.Resume(bs, "zone=z1", "user:oncall", "AZ recovered, replace the broken ones", clk.Now())
	if err != nil {
		t.Fatal(err)
	}
	newDoc, _ := json.Marshal(bs)
	ev, _ := json.Marshal(d.Evidence)
	if err := st.SaveBreakerState(ctx, newDoc, v, []store.BreakerDecision{{At: d.At, Scope: string(d.Scope), Cohort: d.Cohort,
		From: string(d.From), To: string(d.To), Cause: string(d.Cause), Actor: d.Actor, Message: d.Message, Evidence: ev}}, clk.Now()); err != nil {
		t.Fatal(err)
	}
	released := func() int {
		n := 0
		for _, name := range z1[:6] {
			if r, err := st.OpenRepairForNode(ctx, "c1", name); err != nil || r.State != ledger.AwaitingApproval {
				n++
			}
		}
		return n
	}
	for pass := 1; pass <= 3; pass++ {
		if err := rec.EvaluateBreakers(ctx); err != nil { // a periodic pass starts with the evaluation
			t.Fatal(err)
		}
		for _, n := range z1[:6] {
			e.reconcile(t, n)
		}
		if got := released(); got != pass {
			t.Fatalf("after pass %d: %d repairs released, want %d (paced, one per pass)", pass, got, pass)
		}
	}
	// Each released repair's audit names the human resume that released it.
	named := 0
	for _, name := range z1[:6] {
		rs, _, err := st.ListRepairs(ctx, store.RepairFilter{Cluster: "c1", Node: name, Limit: 1})
		if err != nil || len(rs) != 1 {
			t.Fatalf("%s: repairs %v %v", name, rs, err)
		}
		audit, err := st.RepairAudit(ctx, rs[0].ID)
		if err != nil {
			t.Fatal(err)
		}
		for _, a := range audit {
			if a.From == ledger.AwaitingApproval && a.To == ledger.Approved {
				named++
				if !strings.Contains(a.Reason, "breaker zone=z1 resumed by user:oncall: AZ recovered, replace the broken ones") ||
					a.Detail["resumed_by"] != "user:oncall" || rs[0].Detail["resumed_by"] != "user:oncall" {
					t.Errorf("%s: release audit %q %v (repair detail %v), want it to name the resume by user:oncall", name, a.Reason, a.Detail, rs[0].Detail)
				}
			}
		}
	}
	if named != 3 {
		t.Fatalf("%d releases audited, want 3", named)
	}
}

// TestKillSwitchStopsApprovedRepairs: with the kill switch on, nothing is
// deleted, not even a repair a human approved; it goes on once it is off.
func TestKillSwitchStopsApprovedRepairs(t *testing.T) {
	e := newEnv(t, false)
	ctx := context.Background()
	e.ingest(t, "node-hang", finding.Finding{Detector: finding.DetectorXid, Xid: 109, GPUPCI: "0000:cb:00.0", Evidence: []string{"xid 109"}})
	e.reconcile(t, "node-hang")
	// Kill switch on.
	st, d := breaker.SetKillSwitch(breaker.State{}, true, "user:ada", "incident freeze", e.clock.Now())
	doc, _ := json.Marshal(st)
	_ = d
	if err := e.st.SaveBreakerState(ctx, doc, 0, nil, e.clock.Now()); err != nil {
		t.Fatal(err)
	}
	e.clock.Add(11 * time.Minute)
	e.reconcile(t, "node-hang")
	expect.ExpectNodeClaimNotDeleting(t, e.k.Client(), "node-hang-nc", "while the kill switch is on")
	r := expect.ExpectRepairState(t, e.st, "c1", "node-hang", ledger.AwaitingApproval) // a GPU reset is not executable
	if _, err := e.st.Transition(ctx, store.TransitionRequest{ID: r.ID, From: ledger.AwaitingApproval, To: ledger.Approved,
		Actor: "user:otto", Reason: "replace it"}, e.clock.Now()); err != nil {
		t.Fatal(err)
	}
	e.reconcile(t, "node-hang")
	expect.ExpectNodeClaimNotDeleting(t, e.k.Client(), "node-hang-nc", "(approved) while the kill switch is on")
	_, v, _ := e.st.BreakerState(ctx)
	st, _ = breaker.SetKillSwitch(st, false, "user:ada", "freeze over", e.clock.Now())
	doc, _ = json.Marshal(st)
	if err := e.st.SaveBreakerState(ctx, doc, v, nil, e.clock.Now()); err != nil {
		t.Fatal(err)
	}
	e.reconcile(t, "node-hang")
	if !e.nodeClaimDeleting(t, "node-hang-nc") {
		t.Fatalf("not deleted after the kill switch went off (state %s)", e.open(t, "node-hang").State)
	}
}

// zoneFleet is cluster c1 with one NodePool: ten nodes in zone z1 (a00..a09)
// and forty in z2 (b10..b49), the cohort breakers on with their defaults,
// budgets wide enough that only breakers hold repairs. cfg adds to the
// reconciler's configuration (Store, Engine, Clusters, Breaker and Now are
// set here).
func zoneFleet(t *testing.T, cfg repair.Config) (e *env, z1, z2 []string) {
	return zoneFleetIntercepted(t, cfg, nil)
}

// zoneFleetIntercepted is zoneFleet whose cluster's client calls go
// through funcs (fakeFleetIntercepted).
func zoneFleetIntercepted(t *testing.T, cfg repair.Config, funcs *interceptor.Funcs) (e *env, z1, z2 []string) {
	t.Helper()
	ctx := context.Background()
	st := pgtest.Store(t)
	var nodes []karpentersim.NodeSpec
	for i := 0; i < 50; i++ {
		zone, name := "z2", fmt.Sprintf("b%02d", i)
		if i < 10 {
			zone, name = "z1", fmt.Sprintf("a%02d", i)
			z1 = append(z1, name)
		} else {
			z2 = append(z2, name)
		}
		nodes = append(nodes, karpentersim.NodeSpec{Name: name, NodePool: "gpu", Zone: zone, InstanceType: "p5.48xlarge", GPUs: 8})
	}
	k, sim := fakeFleetIntercepted(t, nodes, funcs)
	pol, err := breaker.NewPolicy(breaker.Config{})
	if err != nil {
		t.Fatal(err)
	}
	eng, _ := diagnose.New(diagnose.Options{})
	clk := newClock()
	cfg.Store, cfg.Engine, cfg.Clusters, cfg.Breaker, cfg.Now = st, eng, map[string]*kube.Cluster{"c1": k}, pol, clk.Now
	rec, err := repair.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := st.SetClusterBudget(ctx, "c1", 100, 10, clk.Now()); err != nil {
		t.Fatal(err)
	}
	return &env{st: st, k: k, sim: sim, rec: rec, clock: clk}, z1, z2
}

// waitFor polls ok every 10 ms until it holds, failing the test with what
// and the output of explain (optional) after deadline. The deadline is a
// liveness bound (the system must get there at all), never a speed
// assertion.
func waitFor(t *testing.T, deadline time.Time, what string, ok func() bool, explain func() string) {
	t.Helper()
	for !ok() {
		if time.Now().After(deadline) {
			msg := ""
			if explain != nil {
				msg = "; " + explain()
			}
			t.Fatalf("gave up waiting for %s%s", what, msg)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestLoneFailureNotBehindHeldWave: zone z1's breaker is open (six of its
// ten nodes lost a GPU); the other four report the same, then a lone z2
// node does, all queued as new evidence before a single worker starts.
// Every repair opens first (the ledger step); then the lone node's
// quarantine is written before any of the four held z1 nodes' (their
// follow-ups wait at PriorityHeld): the quarantine and toleration clock of a
// failure the breaker does not hold never wait behind a held wave. In FIFO
// order the four would be quarantined first.
func TestLoneFailureNotBehindHeldWave(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	e, z1, z2 := zoneFleet(t, repair.Config{Toleration: time.Hour, Resync: time.Hour, Workers: 1})
	st, rec, clk := e.st, e.rec, e.clock
	for _, n := range z1[:6] {
		e.ingest(t, n, xid79())
		e.reconcile(t, n)
	}
	clk.Add(time.Minute)
	if err := rec.EvaluateBreakers(ctx); err != nil {
		t.Fatal(err)
	}
	wave, lone := z1[6:], z2[0]
	for _, n := range append(append([]string(nil), wave...), lone) {
		e.ingest(t, n, xid79())
		rec.TriggerFindings("c1", n) // the lone node last
	}
	defer runReconciler(ctx, rec)()

	quarantined := func(node string) int64 { // the audit entry's ID: the order of writes
		rp, err := st.OpenRepairForNode(ctx, "c1", node)
		if err != nil {
			return 0
		}
		audit, _ := st.RepairAudit(ctx, rp.ID)
		for _, a := range audit {
			if a.To == ledger.Quarantined {
				return a.ID
			}
		}
		return 0
	}
	deadline := time.Now().Add(60 * time.Second) // liveness bound, not a speed assertion
	waitFor(t, deadline, "every node quarantined", func() bool {
		for _, n := range append(append([]string(nil), wave...), lone) {
			if quarantined(n) == 0 {
				return false
			}
		}
		return true
	}, nil)
	l := quarantined(lone)
	for _, n := range wave {
		if q := quarantined(n); q < l {
			t.Errorf("held wave node %s quarantined (audit %d) before the lone failure %s (audit %d)", n, q, lone, l)
		}
	}
}

// TestHeldRepairsReadNoOwners: in a zone wave every wave repair reaches the
// deletion guard while the zone breaker holds it. Those guards decide on
// the owners' word as recorded and read nothing from the API server (no
// Pod list, no NodePool read: kube.Disruption), and go to on-call exactly
// as before; the lone failure elsewhere reads its owners and is deleted.
// When the breaker state in the guard transaction no longer holds a node
// that this replica's last evaluation held (a human resumed the breaker
// since), every fact is read and the guards run again: the pre-check only
// ever skips reads for a refusal.
func TestHeldRepairsReadNoOwners(t *testing.T) {
	ctx := context.Background()
	var ownerReads atomic.Int32
	funcs := &interceptor.Funcs{
		List: func(ctx context.Context, c client.WithWatch, list client.ObjectList, opts ...client.ListOption) error {
			if _, ok := list.(*corev1.PodList); ok {
				ownerReads.Add(1)
			}
			return c.List(ctx, list, opts...)
		},
		Get: func(ctx context.Context, c client.WithWatch, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
			if _, ok := obj.(*karpv1.NodePool); ok {
				ownerReads.Add(1)
			}
			return c.Get(ctx, key, obj, opts...)
		},
	}
	e, z1, z2 := zoneFleetIntercepted(t, repair.Config{}, funcs)
	st, rec, clk := e.st, e.rec, e.clock
	for _, n := range append(append([]string(nil), z1[:7]...), z2[0]) {
		e.ingest(t, n, xid79())
		e.reconcile(t, n)
	}
	clk.Add(time.Minute)
	if err := rec.EvaluateBreakers(ctx); err != nil { // zone=z1 trips
		t.Fatal(err)
	}
	clk.Add(10 * time.Minute) // the tolerations are over
	if err := rec.EvaluateBreakers(ctx); err != nil {
		t.Fatal(err)
	}
	before := ownerReads.Load()
	for _, n := range z1[:6] {
		e.reconcile(t, n)
		if r := e.open(t, n); r.State != ledger.AwaitingApproval || r.Detail["held_by"] != "breaker" {
			t.Fatalf("%s: %s held_by=%v, want awaiting_approval held by the breaker", n, r.State, r.Detail["held_by"])
		}
	}
	if got := ownerReads.Load() - before; got != 0 {
		t.Fatalf("%d owner reads (Pod lists, NodePool reads) for 6 repairs the breaker holds, want 0", got)
	}
	e.reconcile(t, z2[0])
	if r := e.open(t, z2[0]); r.State != ledger.Deleting || !e.nodeClaimDeleting(t, z2[0]+"-nc") {
		t.Fatalf("lone z2 failure: %s, want deleting", r.State)
	}
	if got := ownerReads.Load() - before; got == 0 {
		t.Fatal("the lone failure was deleted without reading its owners' word")
	}

	// On-call resumes zone=z1 in the store; this replica's last evaluation
	// still holds z1[6], whose guard therefore starts without reads, finds
	// the resumed state in its transaction and reads everything again.
	doc, v, _ := st.BreakerState(ctx)
	var bs breaker.State
	_ = json.Unmarshal(doc, &bs)
	bs, d, err := breaker.Resume(bs, "zone=z1", "user:oncall", "AZ recovered", clk.Now())
	if err != nil {
		t.Fatal(err)
	}
	newDoc, _ := json.Marshal(bs)
	if err := st.SaveBreakerState(ctx, newDoc, v, []store.BreakerDecision{{At: d.At, Scope: string(d.Scope), Cohort: d.Cohort,
		From: string(d.From), To: string(d.To), Cause: string(d.Cause), Actor: d.Actor, Message: d.Message}}, clk.Now()); err != nil {
		t.Fatal(err)
	}
	before = ownerReads.Load()
	e.reconcile(t, z1[6])
	if got := ownerReads.Load() - before; got == 0 {
		t.Fatal("the guard decided on the resumed breaker without reading the owners' word")
	}
	if r := e.open(t, z1[6]); r.State != ledger.Deleting || !e.nodeClaimDeleting(t, z1[6]+"-nc") {
		t.Fatalf("%s after the resume: %s held_by=%v, want deleting (the full guard allows it)", z1[6], r.State, r.Detail["held_by"])
	}
}

// runReconciler runs rec until the returned stop is called: stop cancels
// Run's context and waits for Run to return (defer runReconciler(ctx, rec)()).
func runReconciler(ctx context.Context, rec *repair.Reconciler) (stop func()) {
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- rec.Run(ctx) }()
	return func() { cancel(); <-done }
}
