package repair_test

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/awslabs/operatorpkg/status"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	karpv1 "sigs.k8s.io/karpenter/pkg/apis/v1"

	"github.com/fleetrepair/fleetrepair/controller/breaker"
	"github.com/fleetrepair/fleetrepair/controller/diagnose"
	"github.com/fleetrepair/fleetrepair/controller/kube"
	"github.com/fleetrepair/fleetrepair/controller/lifecycle"
	"github.com/fleetrepair/fleetrepair/controller/repair"
	"github.com/fleetrepair/fleetrepair/controller/store"
	"github.com/fleetrepair/fleetrepair/test/envtest"
	"github.com/fleetrepair/fleetrepair/test/karpentersim"
	"github.com/fleetrepair/fleetrepair/test/pgtest"
)

// TestLifecycleIsNotHealthOnRealAPIServer: on a real kube-apiserver with
// the Karpenter CRDs, NodeClaims in Karpenter's lifecycle states, seen two
// hours after they were made (the reconciler's clock runs ahead):
//   - stuck terminating (deleted, held by karpenter.sh/termination) with a
//     lost GPU: no repair, no delete request, the finalizer kept;
//   - launched but never registered (no Node), and registered but not
//     initialized: classified, counted on the gauge and listed stuck;
//   - breaker denominators: the zone's cohort holds its active nodes and a
//     failing uninitialized replacement, not the terminating node nor an
//     idle uninitialized one (the trip's evidence says 4 of 5);
//   - a health fault on an uninitialized node is still repaired: lifecycle
//     only never starts a repair by itself.
func TestLifecycleIsNotHealthOnRealAPIServer(t *testing.T) {
	api := envtest.Start(t, envtest.Options{})
	ctx := context.Background()
	st := pgtest.Store(t)
	var reqs requestCounter
	c, err := client.New(reqs.wrap(api.Config), client.Options{Scheme: kube.Scheme})
	if err != nil {
		t.Fatal(err)
	}
	sim := karpentersim.New(api.Client, 0)
	if err := sim.CreateNodePool(ctx, "gpu"); err != nil {
		t.Fatal(err)
	}
	z1 := []string{"gpu-00", "gpu-01", "gpu-02", "gpu-03", "gpu-stuck", "gpu-uninit-idle", "gpu-uninit-bad"}
	var all []string
	for i, name := range append(slices.Clone(z1), func() (z2 []string) {
		for j := 0; j < 20; j++ {
			z2 = append(z2, fmt.Sprintf("gpu-z2-%02d", j))
		}
		return z2
	}()...) {
		zone := "z2"
		if i < len(z1) {
			zone = "z1"
		}
		all = append(all, name)
		if err := sim.CreateNode(ctx, karpentersim.NodeSpec{Name: name, NodePool: "gpu", Zone: zone, InstanceType: "p5.48xlarge", GPUs: 8}); err != nil {
			t.Fatal(err)
		}
	}
	// gpu-stuck: deleted, held by Karpenter's termination finalizer.
	var nc karpv1.NodeClaim
	if err := api.Client.Get(ctx, client.ObjectKey{Name: "gpu-stuck-nc"}, &nc); err != nil {
		t.Fatal(err)
	}
	if err := api.Client.Delete(ctx, &nc); err != nil {
		t.Fatal(err)
	}
	// Two registered but not initialized.
	for _, name := range []string{"gpu-uninit-idle-nc", "gpu-uninit-bad-nc"} {
		var nc karpv1.NodeClaim
		if err := api.Client.Get(ctx, client.ObjectKey{Name: name}, &nc); err != nil {
			t.Fatal(err)
		}
		for i := range nc.Status.Conditions {
			if nc.Status.Conditions[i].Type == karpv1.ConditionTypeInitialized {
				nc.Status.Conditions[i].Status, nc.Status.Conditions[i].Reason = metav1.ConditionFalse, "StartupTaintsExist"
			}
		}
		if err := api.Client.Status().Update(ctx, &nc); err != nil {
			t.Fatal(err)
		}
	}
	// A NodeClaim launched that never registered a Node.
	ghost := &karpv1.NodeClaim{ObjectMeta: metav1.ObjectMeta{Name: "ghost-nc", Labels: map[string]string{karpv1.NodePoolLabelKey: "gpu"}}}
	ghost.Spec.NodeClassRef = &karpv1.NodeClassReference{Group: "karpenter.k8s.aws", Kind: "EC2NodeClass", Name: "default"}
	ghost.Spec.Requirements = []karpv1.NodeSelectorRequirementWithMinValues{{Key: "node.kubernetes.io/instance-type", Operator: "In", Values: []string{"p5.48xlarge"}}}
	if err := api.Client.Create(ctx, ghost); err != nil {
		t.Fatal(err)
	}
	ghost.Status.Conditions = []status.Condition{
		{Type: karpv1.ConditionTypeLaunched, Status: metav1.ConditionTrue, Reason: "Launched", LastTransitionTime: metav1.Now()},
		{Type: karpv1.ConditionTypeRegistered, Status: metav1.ConditionUnknown, Reason: "AwaitingReconciliation", LastTransitionTime: metav1.Now()},
	}
	if err := api.Client.Status().Update(ctx, ghost); err != nil {
		t.Fatal(err)
	}

	clk := &clock{t: time.Now().Add(2 * time.Hour)}
	pol, err := breaker.NewPolicy(breaker.Config{})
	if err != nil {
		t.Fatal(err)
	}
	eng, _ := diagnose.New(diagnose.Options{})
	reg := prometheus.NewRegistry()
	rec, err := repair.New(repair.Config{Store: st, Engine: eng, Clusters: map[string]*kube.Cluster{"c1": kube.New("c1", c)},
		Breaker: pol, Toleration: time.Hour, Now: clk.Now, Registerer: reg})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := st.SetClusterBudget(ctx, "c1", 100, 10, clk.Now()); err != nil {
		t.Fatal(err)
	}
	e := &env{st: st, rec: rec, clock: clk}
	for _, n := range []string{"gpu-00", "gpu-01", "gpu-02", "gpu-stuck", "gpu-uninit-bad"} {
		e.ingest(t, n, xid79())
	}
	for _, n := range all {
		if err := rec.ReconcileNode(ctx, "c1", n); err != nil {
			t.Fatalf("reconcile %s: %v", n, err)
		}
	}
	if err := rec.EvaluateBreakers(ctx); err != nil {
		t.Fatal(err)
	}
	for _, n := range all {
		if err := rec.ReconcileNode(ctx, "c1", n); err != nil {
			t.Fatalf("reconcile %s: %v", n, err)
		}
	}

	// The terminating node: diagnosed, never repaired, nothing deleted again.
	if _, err := st.OpenRepairForNode(ctx, "c1", "gpu-stuck"); err == nil {
		t.Error("a repair opened on a NodeClaim already terminating")
	}
	if ds, err := st.ActiveDiagnoses(ctx, "c1", "gpu-stuck"); err != nil || len(ds) == 0 {
		t.Errorf("gpu-stuck's diagnoses: %v %v (the fault stays visible)", ds, err)
	}
	if n := reqs.get("delete nodeclaims"); n != 0 {
		t.Errorf("%d NodeClaim delete requests, want none", n)
	}
	if err := api.Client.Get(ctx, client.ObjectKey{Name: "gpu-stuck-nc"}, &nc); err != nil || !slices.Contains(nc.Finalizers, karpv1.TerminationFinalizer) {
		t.Errorf("gpu-stuck-nc: finalizers %v (err %v), want karpenter.sh/termination kept", nc.Finalizers, err)
	}
	// A health fault on an uninitialized node is a health repair.
	if _, err := st.OpenRepairForNode(ctx, "c1", "gpu-uninit-bad"); err != nil {
		t.Errorf("gpu-uninit-bad: no repair for its lost GPU: %v", err)
	}

	// Classification, gauge, listing.
	claims, at, ok := rec.NodeClaims("c1")
	if !ok || !at.Equal(clk.Now()) {
		t.Fatalf("NodeClaims: ok %v at %s", ok, at)
	}
	states := map[string]lifecycle.State{}
	for _, cl := range claims {
		states[cl.Name] = cl.State
	}
	for name, want := range map[string]lifecycle.State{"gpu-stuck-nc": lifecycle.StateStuckTerminating, "ghost-nc": lifecycle.StateNotRegistered,
		"gpu-uninit-idle-nc": lifecycle.StateNotInitialized, "gpu-00-nc": lifecycle.StateActive} {
		if states[name] != want {
			t.Errorf("%s: state %q, want %q", name, states[name], want)
		}
	}
	if len(claims) != len(all)+1 || !claims[0].Stuck || claims[len(claims)-1].Stuck {
		t.Errorf("%d claims, stuck first: %+v", len(claims), claims)
	}
	for state, want := range map[lifecycle.State]float64{lifecycle.StateStuckTerminating: 1, lifecycle.StateNotRegistered: 1,
		lifecycle.StateNotInitialized: 2, lifecycle.StateActive: float64(len(all) - 3), lifecycle.StateNoNode: 0} {
		g, err := testutil.GatherAndCount(reg, "fleetrepair_nodeclaims")
		if err != nil || g != len(lifecycle.States()) {
			t.Fatalf("gauge series %d (%v), want one per state", g, err)
		}
		mfs, _ := reg.Gather()
		var got float64 = -1
		for _, mf := range mfs {
			if mf.GetName() != "fleetrepair_nodeclaims" {
				continue
			}
			for _, m := range mf.GetMetric() {
				labels := map[string]string{}
				for _, l := range m.GetLabel() {
					labels[l.GetName()] = l.GetValue()
				}
				if labels["cluster"] == "c1" && labels["state"] == string(state) {
					got = m.GetGauge().GetValue()
				}
			}
		}
		if got != want {
			t.Errorf("fleetrepair_nodeclaims{state=%q} = %v, want %v", state, got, want)
		}
	}

	// The zone's breaker: 4 failing of 5 members.
	doc, _, err := st.BreakerState(ctx)
	if err != nil || doc == nil {
		t.Fatalf("breaker state: %v", err)
	}
	var bs breaker.State
	if err := json.Unmarshal(doc, &bs); err != nil {
		t.Fatal(err)
	}
	b, open := bs.Cohorts["zone=z1"]
	if !open || b.Evidence.CohortNodes != 5 || b.Evidence.CohortFailing != 4 {
		t.Errorf("zone=z1 open %v, evidence %d of %d failing; want 4 of 5 (no terminating node, no idle uninitialized one): %+v",
			open, b.Evidence.CohortFailing, b.Evidence.CohortNodes, bs.Cohorts)
	}
}

// TestReplacementThatNeverLaunchesTripsItsPool: on a real API server, a
// GPU-lost node is replaced; the replacement NodeClaim never registers a
// Node. Past the registration grace it counts against its NodePool like a
// replacement failing the same way: the pool's breaker trips (cause
// replacement-failed) naming the NodeClaim, and no further deletion goes
// through in the pool.
func TestReplacementThatNeverLaunchesTripsItsPool(t *testing.T) {
	api := envtest.Start(t, envtest.Options{})
	ctx := context.Background()
	st := pgtest.Store(t)
	sim := karpentersim.New(api.Client, 0)
	if err := sim.CreateNodePool(ctx, "gpu"); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 6; i++ {
		if err := sim.CreateNode(ctx, karpentersim.NodeSpec{Name: fmt.Sprintf("gpu-%02d", i), NodePool: "gpu", Zone: fmt.Sprintf("z%d", i%2),
			InstanceType: "p5.48xlarge", GPUs: 8}); err != nil {
			t.Fatal(err)
		}
	}
	clk := &clock{t: time.Now().Add(-time.Minute)}
	pol, err := breaker.NewPolicy(breaker.Config{})
	if err != nil {
		t.Fatal(err)
	}
	eng, _ := diagnose.New(diagnose.Options{})
	rec, err := repair.New(repair.Config{Store: st, Engine: eng, Clusters: map[string]*kube.Cluster{"c1": kube.New("c1", api.Client)},
		Breaker: pol, Toleration: time.Second, Now: clk.Now})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := st.SetClusterBudget(ctx, "c1", 100, 10, clk.Now()); err != nil {
		t.Fatal(err)
	}
	e := &env{st: st, rec: rec, clock: clk}
	e.ingest(t, "gpu-00", xid79())
	e.reconcile(t, "gpu-00")
	clk.Add(5 * time.Second)
	if err := rec.EvaluateBreakers(ctx); err != nil {
		t.Fatal(err)
	}
	e.reconcile(t, "gpu-00")
	if r := e.open(t, "gpu-00"); r.State != "deleting" {
		t.Fatalf("gpu-00 repair %s, want deleting", r.State)
	}
	if err := sim.Step(ctx, time.Now()); err != nil {
		t.Fatal(err)
	}
	e.reconcile(t, "gpu-00")
	reps := sim.Replacements()
	if len(reps) != 1 {
		t.Fatalf("replacements %+v", reps)
	}
	// The replacement never comes up: no Node, Registered Unknown.
	var node corev1.Node
	if err := api.Client.Get(ctx, client.ObjectKey{Name: reps[0].NewNode}, &node); err != nil {
		t.Fatal(err)
	}
	if err := api.Client.Delete(ctx, &node); err != nil {
		t.Fatal(err)
	}
	var nc karpv1.NodeClaim
	if err := api.Client.Get(ctx, client.ObjectKey{Name: reps[0].NewNode + "-nc"}, &nc); err != nil {
		t.Fatal(err)
	}
	nc.Status.NodeName = ""
	for i := range nc.Status.Conditions {
		if c := &nc.Status.Conditions[i]; c.Type != karpv1.ConditionTypeLaunched {
			c.Status, c.Reason = metav1.ConditionUnknown, "AwaitingReconciliation"
		}
	}
	if err := api.Client.Status().Update(ctx, &nc); err != nil {
		t.Fatal(err)
	}
	// Within the registration grace: launching, nothing trips.
	clk.Add(5 * time.Minute)
	if err := rec.EvaluateBreakers(ctx); err != nil {
		t.Fatal(err)
	}
	if bs := breakerState(t, st); len(bs.Cohorts) != 0 {
		t.Fatalf("breakers open while the replacement is still launching: %+v", bs.Cohorts)
	}
	clk.Add(30 * time.Minute)
	if err := rec.EvaluateBreakers(ctx); err != nil {
		t.Fatal(err)
	}
	bs := breakerState(t, st)
	b, open := bs.Cohorts["nodepool=gpu"]
	if !open || !slices.Contains(b.Evidence.Failing, "c1/nodeclaim/"+nc.Name) {
		t.Fatalf("nodepool=gpu open %v, evidence %+v (all: %+v)", open, b.Evidence, bs.Cohorts)
	}
	ds, err := st.BreakerDecisions(ctx, 10)
	if err != nil || len(ds) == 0 || ds[0].Cause != string(breaker.CauseReplacementFailed) || !strings.Contains(ds[0].Message, "never launched") {
		t.Fatalf("decisions %v %+v", err, ds)
	}
	// Another lost GPU in the pool waits for on-call instead of a deletion.
	e.ingest(t, "gpu-03", xid79())
	e.reconcile(t, "gpu-03")
	clk.Add(5 * time.Second)
	if err := rec.EvaluateBreakers(ctx); err != nil {
		t.Fatal(err)
	}
	e.reconcile(t, "gpu-03")
	if r := e.open(t, "gpu-03"); r.State != "awaiting_approval" || r.Detail["held_by"] != "breaker" {
		t.Fatalf("gpu-03 repair %s held by %v, want awaiting_approval by the breaker", r.State, r.Detail["held_by"])
	}
}

func breakerState(t *testing.T, st *store.Store) breaker.State {
	t.Helper()
	doc, _, err := st.BreakerState(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	var bs breaker.State
	if doc != nil {
		if err := json.Unmarshal(doc, &bs); err != nil {
			t.Fatal(err)
		}
	}
	return bs
}
