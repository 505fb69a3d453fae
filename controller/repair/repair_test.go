package repair_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"
	karpv1 "sigs.k8s.io/karpenter/pkg/apis/v1"

	"github.com/fleetrepair/fleetrepair/agent/finding"
	"github.com/fleetrepair/fleetrepair/controller/catalog"
	"github.com/fleetrepair/fleetrepair/controller/diagnose"
	"github.com/fleetrepair/fleetrepair/controller/kube"
	"github.com/fleetrepair/fleetrepair/controller/ledger"
	"github.com/fleetrepair/fleetrepair/controller/policy"
	"github.com/fleetrepair/fleetrepair/controller/repair"
	"github.com/fleetrepair/fleetrepair/controller/store"
	"github.com/fleetrepair/fleetrepair/test/expect"
	"github.com/fleetrepair/fleetrepair/test/karpentersim"
	"github.com/fleetrepair/fleetrepair/test/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// clock is a fake clock the tests step by hand.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) Now() time.Time                  { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *clock) Add(d time.Duration)             { c.mu.Lock(); c.t = c.t.Add(d); c.mu.Unlock() }
func newClock() *clock                           { return &clock{t: time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)} }
func (c *clock) since(d time.Duration) time.Time { return c.Now().Add(-d) }

// strictClock is now made strictly increasing: a reading not after the
// last one is the last plus a microsecond (PostgreSQL keeps microseconds),
// so every reconcile stamps distinct, ordered times.
func strictClock(now func() time.Time) func() time.Time {
	var (
		mu   sync.Mutex
		last time.Time
	)
	return func() time.Time {
		mu.Lock()
		defer mu.Unlock()
		t := now()
		if !t.After(last) {
			t = last.Add(time.Microsecond)
		}
		last = t
		return t
	}
}

type env struct {
	st    *store.Store
	k     *kube.Cluster
	sim   *karpentersim.Sim
	rec   *repair.Reconciler
	clock *clock
}

func newEnv(t *testing.T, dryRun bool) *env { return newEnvPolicy(t, dryRun, nil) }

func newEnvPolicy(t *testing.T, dryRun bool, pol *policy.Policy) *env {
	t.Helper()
	st := pgtest.Store(t)
	var nodes []karpentersim.NodeSpec
	for _, n := range []string{"node-lost", "node-app", "node-hang"} {
		nodes = append(nodes, karpentersim.NodeSpec{Name: n, NodePool: "gpu", Zone: "z1", InstanceType: "p4d.24xlarge", GPUs: 8})
	}
	k, sim := fakeFleet(t, nodes)
	eng, err := diagnose.New(diagnose.Options{})
	if err != nil {
		t.Fatal(err)
	}
	clk := newClock()
	rec, err := repair.New(repair.Config{Store: st, Engine: eng, Clusters: map[string]*kube.Cluster{"c1": k}, DryRun: dryRun, Policy: pol, Now: clk.Now})
	if err != nil {
		t.Fatal(err)
	}
	return &env{st: st, k: k, sim: sim, rec: rec, clock: clk}
}

// fakeFleet is cluster c1 on the client fakes: NodePool gpu with nodes,
// each with its NodeClaim (the simulated Karpenter made them).
func fakeFleet(t *testing.T, nodes []karpentersim.NodeSpec) (*kube.Cluster, *karpentersim.Sim) {
	return fakeFleetIntercepted(t, nodes, nil)
}

// fakeFleetIntercepted is fakeFleet whose cluster's client calls go
// through funcs (nil: straight to the fake).
func fakeFleetIntercepted(t *testing.T, nodes []karpentersim.NodeSpec, funcs *interceptor.Funcs) (*kube.Cluster, *karpentersim.Sim) {
	t.Helper()
	ctx := context.Background()
	var c client.WithWatch = fake.NewClientBuilder().WithScheme(kube.Scheme).WithStatusSubresource(&corev1.Node{}, &karpv1.NodeClaim{}).Build()
	sim := karpentersim.New(c, 0)
	if err := sim.CreateNodePool(ctx, "gpu"); err != nil {
		t.Fatal(err)
	}
	for _, n := range nodes {
		if err := sim.CreateNode(ctx, n); err != nil {
			t.Fatal(err)
		}
	}
	if funcs != nil {
		c = interceptor.NewClient(c, *funcs) // the reconciler's calls, not the fleet's creation
	}
	return kube.New("c1", c), sim
}

func (e *env) ingest(t *testing.T, node string, fs ...finding.Finding) {
	t.Helper()
	for i := range fs {
		fs[i].Node, fs[i].BootID = node, "boot-1"
		if fs[i].Count == 0 {
			fs[i].Count = 1
		}
		fs[i].Time = e.clock.Now()
		fs[i].ID = finding.NewID(fs[i])
	}
	if _, err := e.st.IngestReport(context.Background(), finding.Report{SchemaVersion: finding.SchemaVersion,
		Cluster: "c1", Node: node, BootID: "boot-1", Findings: fs}, e.clock.Now()); err != nil {
		t.Fatal(err)
	}
}

func (e *env) reconcile(t *testing.T, node string) {
	t.Helper()
	if err := e.rec.ReconcileNode(context.Background(), "c1", node); err != nil {
		t.Fatalf("reconcile %s: %v", node, err)
	}
}

func (e *env) open(t *testing.T, node string) store.Repair {
	t.Helper()
	r, err := e.st.OpenRepairForNode(context.Background(), "c1", node)
	if err != nil {
		t.Fatalf("open repair for %s: %v", node, err)
	}
	return r
}

func (e *env) nodeClaimDeleting(t *testing.T, name string) bool {
	t.Helper()
	return expect.NodeClaimDeleting(t, e.k.Client(), name)
}

func xid79() finding.Finding {
	return finding.Finding{Detector: finding.DetectorXid, Xid: 79, GPUPCI: "0000:02:00.0",
		Evidence: []string{"NVRM: Xid (PCI:0000:02:00): 79, GPU has fallen off the bus."}}
}

// TestGPULostIsReplacedAfterToleration walks the whole repair path: Xid 79
// -> condition, taint, repair in tolerating; nothing deleted before the
// window ends; after it exactly one NodeClaim deletion; replaced.
func TestGPULostIsReplacedAfterToleration(t *testing.T) {
	e := newEnv(t, false)
	ctx := context.Background()
	e.ingest(t, "node-lost", xid79())
	e.reconcile(t, "node-lost")

	r := e.open(t, "node-lost")
	if r.State != ledger.Tolerating || r.Reason != "GPULost" || r.RecommendedAction != "replace" || r.NodeClaim != "node-lost-nc" {
		t.Fatalf("repair after first pass = %+v", r)
	}
	if !r.TolerationUntil.Equal(e.clock.Now().Add(10 * time.Minute)) {
		t.Fatalf("toleration until %s, want now+10m (accelerated hardware default)", r.TolerationUntil)
	}
	cond, ok, _ := e.k.Condition(ctx, "node-lost", "FleetRepairAcceleratedHardwareReady")
	if !ok || cond.Status != corev1.ConditionFalse || cond.Reason != "GPULost" {
		t.Fatalf("condition = %+v (present %v)", cond, ok)
	}
	if q, _ := e.k.Quarantined(ctx, "node-lost"); !q {
		t.Fatal("node not tainted")
	}

	e.clock.Add(9 * time.Minute)
	e.reconcile(t, "node-lost")
	expect.ExpectNodeClaimNotDeleting(t, e.k.Client(), "node-lost-nc", "before the toleration window ended")

	e.clock.Add(2 * time.Minute)
	e.reconcile(t, "node-lost")
	expect.ExpectNodeClaimDeleting(t, e.k.Client(), "node-lost-nc")
	expect.ExpectRepairState(t, e.st, "c1", "node-lost", ledger.Deleting) // while Karpenter finalizes
	// Karpenter finalizes; the next pass sees the NodeClaim gone.
	if err := e.sim.Step(ctx, e.clock.Now()); err != nil {
		t.Fatal(err)
	}
	e.reconcile(t, "node-lost")
	e.reconcile(t, "node-lost") // idempotent
	rs, _, err := e.st.ListRepairs(ctx, store.RepairFilter{Node: "node-lost"})
	if err != nil || len(rs) != 1 {
		t.Fatalf("repairs for node-lost = %d (%v), want exactly 1", len(rs), err)
	}
	if rs[0].State != ledger.Replaced || rs[0].ExecutedAction != "replace" {
		t.Fatalf("final repair = %+v", rs[0])
	}
	if reps := e.sim.Replacements(); len(reps) != 1 {
		t.Fatalf("replacements = %d, want exactly 1", len(reps))
	}
	expect.ExpectAuditPath(t, e.st, rs[0].ID, ledger.Detected, ledger.Quarantined, ledger.Tolerating, ledger.Deleting, ledger.Replaced)
	// The replaced node is out of the fleet (counts, silent agents), its row kept.
	if n, err := e.st.GetNode(ctx, "c1", "node-lost"); err != nil || !n.Removed() {
		t.Fatalf("replaced node-lost: removed %v at %v (%v), want removed", n.Removed(), n.RemovedAt, err)
	}
	// Verification finds the Node Karpenter launched instead, Ready and healthy.
	e.clock.Add(3 * time.Minute)
	if err := e.rec.VerifyReplacements(ctx); err != nil {
		t.Fatal(err)
	}
	got, _ := e.st.GetRepair(ctx, rs[0].ID)
	if got.Detail["replacement_node"] != e.sim.Replacements()[0].NewNode || got.Detail["replacement_verified"] != true {
		t.Fatalf("verification detail = %v, want the replacement node verified", got.Detail)
	}
	if secs, _ := got.Detail["time_to_replace_seconds"].(float64); secs < 180 {
		t.Fatalf("time to replace = %v s, want >= 180 (3 minutes on the fake clock)", got.Detail["time_to_replace_seconds"])
	}
}

// TestAppErrorsOnlyGetEvents: application-class Xids never open a repair,
// never set a condition or taint, and each gets one Event.
func TestAppErrorsOnlyGetEvents(t *testing.T) {
	e := newEnv(t, false)
	ctx := context.Background()
	e.ingest(t, "node-app",
		finding.Finding{Detector: finding.DetectorXid, Xid: 13, GPUPCI: "0000:cb:00.0", Evidence: []string{"xid 13"}},
		finding.Finding{Detector: finding.DetectorXid, Xid: 31, GPUPCI: "0000:cb:00.0", Evidence: []string{"xid 31"}})
	for i := 0; i < 3; i++ {
		e.reconcile(t, "node-app")
		e.clock.Add(time.Hour)
	}
	if _, err := e.st.OpenRepairForNode(ctx, "c1", "node-app"); err == nil {
		t.Fatal("an app-error node got a repair")
	}
	if q, _ := e.k.Quarantined(ctx, "node-app"); q {
		t.Fatal("an app-error node was tainted")
	}
	if _, ok, _ := e.k.Condition(ctx, "node-app", "FleetRepairAcceleratedHardwareReady"); ok {
		t.Fatal("an app-error node got a condition")
	}
	if e.nodeClaimDeleting(t, "node-app-nc") {
		t.Fatal("an app-error node's NodeClaim was deleted")
	}
	var evs corev1.EventList
	_ = e.k.Client().List(ctx, &evs)
	n := 0
	for _, ev := range evs.Items {
		if ev.InvolvedObject.Name == "node-app" {
			n++
			if ev.Reason != "XidApplicationError" {
				t.Errorf("event reason = %s", ev.Reason)
			}
		}
	}
	// One diagnosis per reason and boot (both Xids are XidApplicationError),
	// so one Event, recorded once across three passes.
	if n != 1 {
		t.Fatalf("events on node-app = %d, want 1", n)
	}
}

// TestResetClassWaitsForApproval: a first GPU hang (Xid 109) recommends a
// GPU reset, which Karpenter v1.14 cannot execute: the repair waits for
// on-call approval instead of replacing the node.
func TestResetClassWaitsForApproval(t *testing.T) {
	e := newEnv(t, false)
	e.ingest(t, "node-hang", finding.Finding{Detector: finding.DetectorXid, Xid: 109, GPUPCI: "0000:cb:00.0", Evidence: []string{"xid 109"}})
	e.reconcile(t, "node-hang")
	e.clock.Add(11 * time.Minute)
	e.reconcile(t, "node-hang")
	if r := e.open(t, "node-hang"); r.State != ledger.AwaitingApproval || r.RecommendedAction != "reset-gpu" {
		t.Fatalf("repair = %s/%s, want awaiting_approval/reset-gpu", r.State, r.RecommendedAction)
	}
	if e.nodeClaimDeleting(t, "node-hang-nc") {
		t.Fatal("node replaced on a first reset-class fault")
	}
}

// TestDryRunDeletesNothing: the whole path is recorded, no NodeClaim is
// deleted, and the decision is not repeated every window.
func TestDryRunDeletesNothing(t *testing.T) {
	e := newEnv(t, true)
	ctx := context.Background()
	e.ingest(t, "node-lost", xid79())
	for i := 0; i < 4; i++ {
		e.reconcile(t, "node-lost")
		e.clock.Add(11 * time.Minute)
	}
	if e.nodeClaimDeleting(t, "node-lost-nc") {
		t.Fatal("dry run deleted a NodeClaim")
	}
	rs, _, _ := e.st.ListRepairs(ctx, store.RepairFilter{Node: "node-lost"})
	if len(rs) != 1 || !rs[0].DryRun || rs[0].State != ledger.Cancelled {
		t.Fatalf("dry-run repairs = %+v, want one cancelled dry-run repair", rs)
	}
	audit, _ := e.st.RepairAudit(ctx, rs[0].ID)
	if len(audit) < 2 || audit[len(audit)-2].To != ledger.Deleting {
		t.Fatalf("dry-run audit does not record the would-delete decision: %+v", audit)
	}
}

// TestNewBootClearsCondition: nothing latches. A node rebooted into a new
// boot with no fault has its condition set back to True, its taint removed
// and its repair resolved.
func TestNewBootClearsCondition(t *testing.T) {
	e := newEnv(t, false)
	ctx := context.Background()
	e.ingest(t, "node-hang", finding.Finding{Detector: finding.DetectorXid, Xid: 109, GPUPCI: "0000:cb:00.0", Evidence: []string{"xid 109"}})
	e.reconcile(t, "node-hang")
	// The node reboots: its agent reports a heartbeat from a new boot.
	if _, err := e.st.IngestReport(ctx, finding.Report{SchemaVersion: finding.SchemaVersion, Cluster: "c1", Node: "node-hang",
		BootID: "boot-2", Heartbeat: &finding.Heartbeat{}}, e.clock.Now()); err != nil {
		t.Fatal(err)
	}
	e.reconcile(t, "node-hang")
	if _, err := e.st.OpenRepairForNode(ctx, "c1", "node-hang"); err == nil {
		t.Fatal("repair still open after a clean reboot")
	}
	if q, _ := e.k.Quarantined(ctx, "node-hang"); q {
		t.Fatal("taint kept after a clean reboot")
	}
	cond, _, _ := e.k.Condition(ctx, "node-hang", "FleetRepairAcceleratedHardwareReady")
	if cond.Status != corev1.ConditionTrue {
		t.Fatalf("condition = %s, want True after recovery", cond.Status)
	}
}

// TestPolicyOverrides: a policy that executes replace for a first GPU hang
// after 1m deletes the NodeClaim then; a disabled reason opens no repair.
func TestPolicyOverrides(t *testing.T) {
	pol, err := policy.Parse([]byte("reasons:\n  GPUHang: {toleration: 1m, action: replace}\n  GPULost: {disabled: true}\n"), catalog.Default())
	if err != nil {
		t.Fatal(err)
	}
	e := newEnvPolicy(t, false, pol)
	ctx := context.Background()
	e.ingest(t, "node-hang", finding.Finding{Detector: finding.DetectorXid, Xid: 109, GPUPCI: "0000:cb:00.0", Evidence: []string{"xid 109"}})
	e.ingest(t, "node-lost", xid79())
	e.reconcile(t, "node-hang")
	e.reconcile(t, "node-lost")
	if r := e.open(t, "node-hang"); !r.TolerationUntil.Equal(e.clock.Now().Add(time.Minute)) {
		t.Fatalf("toleration until %s, want now+1m from the policy", r.TolerationUntil)
	}
	e.clock.Add(61 * time.Second)
	e.reconcile(t, "node-hang")
	if !e.nodeClaimDeleting(t, "node-hang-nc") {
		t.Fatal("policy action replace did not delete the NodeClaim")
	}
	if _, err := e.st.OpenRepairForNode(ctx, "c1", "node-lost"); err == nil {
		t.Fatal("a repair opened for a reason the policy disables")
	}
	if q, _ := e.k.Quarantined(ctx, "node-lost"); q {
		t.Fatal("node tainted for a reason the policy disables")
	}
}

func (e *env) setForeignCondition(t *testing.T, node, typ, status, reason string) {
	t.Helper()
	ctx := context.Background()
	var n corev1.Node
	if err := e.k.Client().Get(ctx, client.ObjectKey{Name: node}, &n); err != nil {
		t.Fatal(err)
	}
	n.Status.Conditions = append(n.Status.Conditions, corev1.NodeCondition{Type: corev1.NodeConditionType(typ),
		Status: corev1.ConditionStatus(status), Reason: reason, Message: "set by another agent"})
	if err := e.k.Client().Status().Update(ctx, &n); err != nil {
		t.Fatal(err)
	}
}

// TestInteropConditions: conditions set by other agents become findings. A
// hardware verdict opens a repair (on a node with no fleetrepair agent); a
// DCGM connection error (c20), a healthy problem-style condition (c21) or
// a type no rule maps opens nothing.
func TestInteropConditions(t *testing.T) {
	e := newEnv(t, false)
	ctx := context.Background()
	e.setForeignCondition(t, "node-lost", "AcceleratedHardwareReady", "False", "NvidiaXID79Error")
	e.setForeignCondition(t, "node-app", "AcceleratedHardwareReady", "False", "DCGMError")
	e.setForeignCondition(t, "node-hang", "XIDError", "False", "NoXIDError")
	e.setForeignCondition(t, "node-hang", "GPUMemoryTemperatureHigh", "True", "VendorCheck")
	for _, n := range []string{"node-lost", "node-app", "node-hang"} {
		e.reconcile(t, n)
	}
	// A type no rule maps is recorded against the node (the API's node
	// diagnoses), not dropped, and repairs nothing.
	ds, err := e.st.DiagnosesForNode(ctx, "c1", "node-hang", 50)
	if err != nil {
		t.Fatal(err)
	}
	unmapped := false
	for _, d := range ds {
		unmapped = unmapped || d.Reason == catalog.ReasonNodeConditionUnmapped && d.Active && d.Severity == "none"
	}
	if !unmapped {
		t.Errorf("no active NodeConditionUnmapped diagnosis for the unmapped type: %+v", ds)
	}
	r := e.open(t, "node-lost")
	if r.Reason != catalog.ReasonVendorAcceleratedHardwareNotReady {
		t.Fatalf("repair reason = %s", r.Reason)
	}
	for _, n := range []string{"node-app", "node-hang"} {
		if _, err := e.st.OpenRepairForNode(ctx, "c1", n); err == nil {
			t.Fatalf("%s got a repair from a condition that carries no hardware verdict", n)
		}
	}
}

// TestMinHealthyHoldsDeletion: with minHealthy 3 in a pool of three nodes,
// one of them quarantined, nothing is deleted; with minHealthy 2 it is.
func TestMinHealthyHoldsDeletion(t *testing.T) {
	for _, tc := range []struct {
		min     int
		deleted bool
	}{{3, false}, {2, true}} {
		pol, err := policy.Parse([]byte(fmt.Sprintf("nodePools:\n  gpu: {minHealthy: %d}\n", tc.min)), catalog.Default())
		if err != nil {
			t.Fatal(err)
		}
		e := newEnvPolicy(t, false, pol)
		e.ingest(t, "node-lost", xid79())
		e.reconcile(t, "node-lost")
		e.clock.Add(11 * time.Minute)
		e.reconcile(t, "node-lost")
		if got := e.nodeClaimDeleting(t, "node-lost-nc"); got != tc.deleted {
			t.Fatalf("minHealthy %d: deleted = %v, want %v", tc.min, got, tc.deleted)
		}
	}
}

// TestHeldRepairExpires: a repair awaiting approval that nobody decides
// expires after ApprovalTTL (24 h by default), although every pass
// reconciles its node again in between.
func TestHeldRepairExpires(t *testing.T) {
	e := newEnv(t, false)
	e.ingest(t, "node-hang", finding.Finding{Detector: finding.DetectorXid, Xid: 109, GPUPCI: "0000:cb:00.0", Evidence: []string{"xid 109"}})
	e.reconcile(t, "node-hang")
	e.clock.Add(11 * time.Minute)
	e.reconcile(t, "node-hang")
	held := e.open(t, "node-hang")
	if held.State != ledger.AwaitingApproval {
		t.Fatalf("repair = %s, want awaiting_approval", held.State)
	}
	for i := 0; i < 25; i++ {
		e.clock.Add(time.Hour)
		e.reconcile(t, "node-hang")
	}
	r, err := e.st.GetRepair(context.Background(), held.ID)
	if err != nil {
		t.Fatal(err)
	}
	if r.State != ledger.Expired {
		t.Fatalf("after 25 h unanswered the repair is %s (updated %s), want expired", r.State, r.UpdatedAt)
	}
}
