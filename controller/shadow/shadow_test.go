package shadow_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/fleetrepair/fleetrepair/agent/finding"
	"github.com/fleetrepair/fleetrepair/controller/breaker"
	"github.com/fleetrepair/fleetrepair/controller/catalog"
	"github.com/fleetrepair/fleetrepair/controller/diagnose"
	"github.com/fleetrepair/fleetrepair/controller/policy"
	"github.com/fleetrepair/fleetrepair/controller/shadow"
	"github.com/fleetrepair/fleetrepair/controller/store"
	"github.com/fleetrepair/fleetrepair/test/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// t0 is the fake clock's start: nodes join an hour before it, reports are
// received when they are observed, and every report range starts at t0.
var t0 = time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)

type fleet struct {
	t   *testing.T
	st  *store.Store
	seq uint64
}

func newFleet(t *testing.T) *fleet {
	t.Helper()
	st := pgtest.Store(t)
	return &fleet{t: t, st: st}
}

// node stores a node the way the controller learns it: Kubernetes metadata
// (the informers) and a heartbeat-only agent report. claim "" leaves it
// without a Karpenter NodeClaim.
func (f *fleet) node(name, pool, zone, claim string) {
	f.t.Helper()
	ctx, at := context.Background(), t0.Add(-time.Hour)
	if _, err := f.st.ReadNode(ctx, store.Node{Cluster: "c1", Name: name, NodePool: pool, Zone: zone,
		InstanceType: "p5.48xlarge", NodeClaim: claim}, 1, at); err != nil {
		f.t.Fatal(err)
	}
	f.report(name, at, nil)
}

// report ingests one agent report from node, received at `at`.
func (f *fleet) report(node string, at time.Time, fs []finding.Finding) {
	f.t.Helper()
	r := finding.Report{SchemaVersion: finding.SchemaVersion, Cluster: "c1", Node: node, BootID: "boot-" + node,
		AgentVersion: "v0.1.0", SentAt: at, Findings: fs,
		Heartbeat: &finding.Heartbeat{DriverVersion: "570.133.20", KernelVersion: "6.8.0", GPUCount: 8}}
	if _, err := f.st.IngestReport(context.Background(), r, at); err != nil {
		f.t.Fatal(err)
	}
}

// xid reports one Xid on GPU 0000:3b:00.0 of node observed at `at` (zero:
// the agent could not tell), received at recv.
func (f *fleet) xid(node string, xid int, at, recv time.Time) {
	f.t.Helper()
	f.xidBoot(node, "boot-"+node, xid, at, recv)
}

// xidBoot is xid in the given boot.
func (f *fleet) xidBoot(node, boot string, xid int, at, recv time.Time) {
	f.t.Helper()
	f.seq++
	x := finding.Finding{Detector: finding.DetectorXid, Node: node, BootID: boot, Time: at,
		GPUPCI: "0000:3b:00.0", Xid: xid, Count: 1, Seq: f.seq,
		Attrs:    map[string]string{finding.AttrPID: fmt.Sprint(1000 + f.seq)},
		Evidence: []string{fmt.Sprintf("NVRM: Xid (PCI:0000:3b:00): %d, pid=%d", xid, 1000+f.seq)}}
	x.ID = finding.NewID(x)
	f.report(node, recv, []finding.Finding{x})
}

func config(t *testing.T, st *store.Store) shadow.Config {
	t.Helper()
	eng, err := diagnose.New(diagnose.Options{})
	if err != nil {
		t.Fatal(err)
	}
	bp, err := breaker.NewPolicy(breaker.Config{})
	if err != nil {
		t.Fatal(err)
	}
	return shadow.Config{Store: st, Engine: eng, Breaker: bp}
}

func run(t *testing.T, cfg shadow.Config, until time.Time) *shadow.Report {
	t.Helper()
	rep, err := shadow.Run(context.Background(), cfg, t0, until)
	if err != nil {
		t.Fatal(err)
	}
	return rep
}

func names(ds []shadow.Deletion) []string {
	var out []string
	for _, d := range ds {
		out = append(out, d.Cluster+"/"+d.Node)
	}
	return out
}

// TestLoneFaults: a lost GPU is replaced after its toleration, an
// application error opens nothing, a reset-class fault waits for on-call
// (its action is not executable), a node without a NodeClaim fails, and
// none of it trips a breaker.
func TestLoneFaults(t *testing.T) {
	t.Parallel()
	f := newFleet(t)
	for _, n := range []string{"lost", "app", "reset"} {
		f.node(n, "train", "z1", "nc-"+n)
	}
	f.node("unclaimed", "train", "z2", "")
	for i := range 20 {
		f.node(fmt.Sprintf("quiet-%02d", i), "train", []string{"z1", "z2"}[i%2], fmt.Sprintf("nc-q%d", i))
	}
	f.xid("lost", 79, t0.Add(10*time.Minute), t0.Add(10*time.Minute))
	f.xid("app", 13, t0.Add(time.Hour), t0.Add(time.Hour))
	f.xid("app", 13, time.Time{}, t0.Add(90*time.Minute)) // no observation time: placed after the one before
	f.xid("reset", 109, t0.Add(2*time.Hour), t0.Add(2*time.Hour))
	f.xid("unclaimed", 79, t0.Add(3*time.Hour), t0.Add(3*time.Hour))
	f.xid("lost", 79, t0.Add(5*time.Hour), t0.Add(5*time.Hour)) // after until: not replayed

	cfg := config(t, f.st)
	rep := run(t, cfg, t0.Add(4*time.Hour))

	if rep.Nodes != 24 || rep.Findings != 5 || rep.UntimedFindings != 1 {
		t.Errorf("nodes %d, findings %d, untimed %d; want 24, 5, 1", rep.Nodes, rep.Findings, rep.UntimedFindings)
	}
	if len(rep.Deletions) != 1 {
		t.Fatalf("deletions %v; want c1/lost only", names(rep.Deletions))
	}
	d := rep.Deletions[0]
	if d.Cluster != "c1" || d.Node != "lost" || d.Reason != catalog.ReasonGPULost || !d.At.Equal(t0.Add(20*time.Minute)) ||
		!d.TolerationStartedAt.Equal(t0.Add(10*time.Minute)) {
		t.Errorf("deletion %+v; want c1/lost GPULost at t0+20m (10m toleration from t0+10m)", d)
	}
	if len(rep.ApprovalsNeeded) != 1 {
		t.Fatalf("approvals %+v; want the reset-class fault only", rep.ApprovalsNeeded)
	}
	a := rep.ApprovalsNeeded[0]
	if a.Node != "reset" || a.Reason != catalog.ReasonGPUHang || a.Why != shadow.WhyActionNotExecutable ||
		a.Action != string(catalog.ActionResetGPU) || !a.At.Equal(t0.Add(2*time.Hour+10*time.Minute)) || a.Outcome != shadow.OutcomePending {
		t.Errorf("approval %+v; want reset GPUHang action-not-executable reset-gpu at t0+2h10m, pending", a)
	}
	if len(rep.Failed) != 1 || rep.Failed[0].Node != "unclaimed" {
		t.Errorf("failed %+v; want the node without a NodeClaim", rep.Failed)
	}
	if len(rep.Trips) != 0 {
		t.Errorf("trips %+v; want none for lone faults", rep.Trips)
	}
	want := map[string]shadow.ReasonCounts{
		catalog.ReasonGPULost: {Repairs: 2, Deletions: 1, Failed: 1},
		catalog.ReasonGPUHang: {Repairs: 1, ApprovalsNeeded: 1, NotExecutable: 1},
	}
	if len(rep.ByReason) != len(want) {
		t.Errorf("byReason has %d reasons, want %d: %+v", len(rep.ByReason), len(want), rep.ByReason)
	}
	for reason, w := range want {
		if got := rep.ByReason[reason]; got == nil || *got != w {
			t.Errorf("byReason[%s] = %+v, want %+v", reason, got, w)
		}
	}
	if !strings.Contains(strings.Join(rep.Notes, "\n"), "no observation time") {
		t.Errorf("notes %q lack the untimed-findings limitation", rep.Notes)
	}

	// The current policy decides: with GPUHang set to replace, the same
	// history deletes the reset-class node instead of asking on-call.
	cfg.Policy = &policy.Policy{Reasons: map[string]policy.Override{catalog.ReasonGPUHang: {Action: catalog.ActionReplace}}}
	rep = run(t, cfg, t0.Add(4*time.Hour))
	if got := names(rep.Deletions); len(got) != 2 || got[1] != "c1/reset" || len(rep.ApprovalsNeeded) != 0 {
		t.Errorf("with GPUHang -> replace: deletions %v, approvals %+v; want c1/lost and c1/reset, none", got, rep.ApprovalsNeeded)
	}

	// A range holding more findings than one report replays is refused.
	cfg.MaxFindings = 3
	if _, err := shadow.Run(context.Background(), cfg, t0, t0.Add(4*time.Hour)); !errors.Is(err, store.ErrInvalid) ||
		!strings.Contains(err.Error(), "narrow the range") {
		t.Errorf("over MaxFindings: %v; want ErrInvalid asking to narrow the range", err)
	}
}

// TestZoneWave: 6 of the 10 nodes of zone z1 lose a GPU within a minute
// while 40 nodes elsewhere stay quiet: the zone's breaker trips and the six
// repairs wait for on-call instead of replacing nodes of a broken zone.
func TestZoneWave(t *testing.T) {
	t.Parallel()
	f := newFleet(t)
	for i := range 10 {
		f.node(fmt.Sprintf("z1-%02d", i), "train", "z1", fmt.Sprintf("nc-z1-%d", i))
	}
	for i := range 40 {
		f.node(fmt.Sprintf("quiet-%02d", i), "train", []string{"z2", "z3"}[i%2], fmt.Sprintf("nc-q%d", i))
	}
	for i := range 6 {
		at := t0.Add(30*time.Minute + time.Duration(i)*10*time.Second)
		f.xid(fmt.Sprintf("z1-%02d", i), 79, at, at)
	}

	rep := run(t, config(t, f.st), t0.Add(2*time.Hour))

	if len(rep.Deletions) != 0 {
		t.Errorf("deletions %v; want none while zone z1's breaker is open", names(rep.Deletions))
	}
	if len(rep.Trips) != 1 {
		t.Fatalf("trips %+v; want zone=z1 only", rep.Trips)
	}
	tr := rep.Trips[0]
	if tr.Cohort != "zone=z1" || tr.At.Before(t0.Add(30*time.Minute)) || tr.At.After(t0.Add(32*time.Minute)) ||
		tr.Evidence.CohortNodes != 10 || tr.Evidence.CohortFailing < 3 || tr.Evidence.RestFailing != 0 || tr.ClosedAt != nil {
		t.Errorf("trip %+v; want zone=z1 opened within the wave, 10 nodes, >= 3 failing, rest 0, still open", tr)
	}
	if len(rep.ApprovalsNeeded) != 6 {
		t.Fatalf("approvals %+v; want the six repairs held", rep.ApprovalsNeeded)
	}
	for _, a := range rep.ApprovalsNeeded {
		if a.Why != shadow.WhyBreaker || a.Action != string(catalog.ActionReplace) || a.Reason != catalog.ReasonGPULost ||
			!strings.Contains(a.Detail, "breaker zone=z1 open") || a.Outcome != shadow.OutcomePending {
			t.Errorf("approval %+v; want GPULost replace held by breaker zone=z1, pending", a)
		}
	}
	if got := rep.ByReason[catalog.ReasonGPULost]; got == nil || *got != (shadow.ReasonCounts{Repairs: 6, ApprovalsNeeded: 6, HeldByBreaker: 6}) {
		t.Errorf("byReason[GPULost] = %+v; want 6 repairs, 6 held by the breaker", got)
	}
	if rep.Policy.Breakers == nil || rep.Policy.Budgets["c1"].DeletionsPerHour != 10 {
		t.Errorf("policy %+v; want the breaker config and c1's budgets", rep.Policy)
	}
}

// TestBudgets: two lone GPU losses in one NodePool two minutes apart; with
// one deletion in flight per NodePool the second waits for the first; with
// one deletion per NodePool and hour it waits past the range; with a
// minimum of 12 healthy nodes in the 12-node pool neither goes.
func TestBudgets(t *testing.T) {
	t.Parallel()
	f := newFleet(t)
	for i := range 12 {
		f.node(fmt.Sprintf("n%02d", i), "train", []string{"z1", "z2", "z3"}[i%3], fmt.Sprintf("nc-%d", i))
	}
	f.xid("n00", 79, t0.Add(10*time.Minute), t0.Add(10*time.Minute))
	f.xid("n01", 79, t0.Add(12*time.Minute), t0.Add(12*time.Minute))

	rep := run(t, config(t, f.st), t0.Add(time.Hour))

	if got := names(rep.Deletions); len(got) != 2 || !rep.Deletions[1].At.Equal(t0.Add(25*time.Minute)) {
		t.Fatalf("deletions %+v; want n00 at t0+20m, n01 at t0+25m (after the first left flight)", rep.Deletions)
	}
	if len(rep.BudgetDelays) != 1 || rep.BudgetDelays[0].Node != "n01" || rep.BudgetDelays[0].Budget != store.BudgetMaxInFlightPerNodePool {
		t.Errorf("budget delays %+v; want n01 by max_in_flight_per_nodepool", rep.BudgetDelays)
	}

	cfg := config(t, f.st)
	cfg.NodePoolDeletionsPerHour = 1
	rep = run(t, cfg, t0.Add(time.Hour))
	if got := names(rep.Deletions); len(got) != 1 || rep.Policy.Budgets["c1"].NodePoolDeletionsPerHour != 1 {
		t.Errorf("one per NodePool and hour: deletions %v, budgets %+v; want c1/n00 only", got, rep.Policy.Budgets)
	}

	cfg = config(t, f.st)
	cfg.Policy = &policy.Policy{NodePools: map[string]policy.NodePool{"train": {MinHealthy: ptr(12)}}}
	rep = run(t, cfg, t0.Add(time.Hour))
	if len(rep.Deletions) != 0 || len(rep.BudgetDelays) != 2 || rep.BudgetDelays[0].Budget != shadow.BudgetMinHealthy ||
		!strings.Contains(rep.BudgetDelays[0].Detail, "10 healthy nodes, minimum 12") {
		t.Errorf("minHealthy 12 of 12: deletions %v, delays %+v; want none deleted, both held by the minimum", names(rep.Deletions), rep.BudgetDelays)
	}
}

// TestReboot: a reset-class fault waits for on-call; when the node reports
// from a new boot (someone reset it by hand) the fault is history and the
// repair resolves. A fault of the current boot counts past the lookback.
func TestReboot(t *testing.T) {
	t.Parallel()
	f := newFleet(t)
	for i := range 6 {
		f.node(fmt.Sprintf("n%d", i), "train", "z1", fmt.Sprintf("nc-%d", i))
	}
	f.xidBoot("n0", "boot-a", 109, t0.Add(10*time.Minute), t0.Add(10*time.Minute))
	f.xidBoot("n0", "boot-b", 13, t0.Add(2*time.Hour), t0.Add(2*time.Hour))
	f.xidBoot("n1", "boot-a", 109, t0.Add(10*time.Minute), t0.Add(10*time.Minute))

	cfg := config(t, f.st)
	cfg.Lookback = time.Hour
	rep := run(t, cfg, t0.Add(30*time.Hour))

	var n0, n1 []shadow.Approval
	for _, a := range rep.ApprovalsNeeded {
		switch a.Node {
		case "n0":
			n0 = append(n0, a)
		case "n1":
			n1 = append(n1, a)
		}
	}
	if len(n0) != 1 || n0[0].Outcome != shadow.OutcomeResolved || !n0[0].Ended.Equal(t0.Add(2*time.Hour)) {
		t.Errorf("n0 approvals %+v; want one, resolved when boot-b reported at t0+2h", n0)
	}
	// n1 stays in boot-a: its fault outlives the 1h lookback, the approval
	// expires after 24h and is asked again.
	if len(n1) != 2 || n1[0].Outcome != shadow.OutcomeExpired || n1[1].Outcome != shadow.OutcomePending {
		t.Errorf("n1 approvals %+v; want expired after 24h, then asked again", n1)
	}
	if c := rep.ByReason[catalog.ReasonGPUHang]; c == nil || c.Resolved != 1 || c.Expired != 1 || c.Repairs != 3 {
		t.Errorf("byReason[GPUHang] = %+v; want 3 repairs, 1 resolved, 1 expired", c)
	}
}

func TestRange(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name         string
		since, until time.Time
		want         string
	}{
		{"no since", time.Time{}, t0, "since is required"},
		{"empty", t0, t0, "must be before until"},
		{"reversed", t0, t0.Add(-time.Hour), "must be before until"},
		{"too long", t0, t0.Add(32 * 24 * time.Hour), "longer than the maximum"},
	} {
		err := shadow.CheckRange(tt.since, tt.until, 0)
		if !errors.Is(err, store.ErrInvalid) || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%s: %v; want ErrInvalid saying %q", tt.name, err, tt.want)
		}
	}
	if err := shadow.CheckRange(t0, t0.Add(168*time.Hour), 0); err != nil {
		t.Errorf("a week: %v", err)
	}
}

// TestNewestFindingsOverTheLimit: a node with more findings than the
// controller reads per reconcile is diagnosed on its newest ones, as
// store.FindingsForNode returns them: a GPU lost after 10,000 harmless
// findings is seen (and replaced), not cut off.
func TestNewestFindingsOverTheLimit(t *testing.T) {
	t.Parallel()
	f := newFleet(t)
	f.node("chatty", "train", "z1", "nc-chatty")
	for i := range 20 {
		f.node(fmt.Sprintf("quiet-%02d", i), "train", "z1", fmt.Sprintf("nc-q%d", i))
	}
	const filler = 10_000
	start := t0.Add(-time.Hour)
	for b := 0; b < filler; b += 500 {
		var fs []finding.Finding
		for i := b; i < b+500; i++ {
			f.seq++
			at := start.Add(time.Duration(i) * 300 * time.Millisecond)
			x := finding.Finding{Detector: finding.DetectorDriverVersion, Node: "chatty", BootID: "boot-chatty", Time: at, Count: 1, Seq: f.seq,
				Attrs: map[string]string{finding.AttrValue: "570.133.20"}, Evidence: []string{fmt.Sprintf("NVRM: loading 570.133.20 (%d)", i)}}
			x.ID = finding.NewID(x)
			fs = append(fs, x)
		}
		f.report("chatty", fs[len(fs)-1].Time, fs)
	}
	f.xid("chatty", 79, t0.Add(time.Minute), t0.Add(time.Minute))

	rep := run(t, config(t, f.st), t0.Add(2*time.Hour))
	if names := names(rep.Deletions); len(names) != 1 || names[0] != "c1/chatty" {
		t.Fatalf("deletions %v; want c1/chatty, whose newest finding is a lost GPU (notes %v, %+v)", names, rep.Notes, rep.ByReason)
	}
}

func ptr[T any](v T) *T { return &v }

// TestDeliveryAtReceipt: the findings of one agent report are delivered
// together, when the controller received them, as the live controller
// reconciles the node once per report. A GPU hang (Xid 109, reset: waits
// for on-call) observed at t0+9s and a lost GPU (Xid 79, replace) at
// t0+11s, both received at t0+12s, open one repair for GPULost. Delivered
// at their observed times, the first landed on the t0+10s pass alone: the
// replay opened GPUHang and deleted the NodeClaim under that reason.
func TestDeliveryAtReceipt(t *testing.T) {
	t.Parallel()
	f := newFleet(t)
	for i := range 6 {
		f.node(fmt.Sprintf("n%d", i), "train", "z1", fmt.Sprintf("nc-%d", i))
	}
	var fs []finding.Finding
	for _, x := range []struct {
		xid int
		at  time.Duration
	}{{109, 9 * time.Second}, {79, 11 * time.Second}} {
		f.seq++
		g := finding.Finding{Detector: finding.DetectorXid, Node: "n0", BootID: "boot-n0", Time: t0.Add(x.at),
			GPUPCI: "0000:3b:00.0", Xid: x.xid, Count: 1, Seq: f.seq,
			Evidence: []string{fmt.Sprintf("NVRM: Xid (PCI:0000:3b:00): %d, pid=1", x.xid)}}
		g.ID = finding.NewID(g)
		fs = append(fs, g)
	}
	f.report("n0", t0.Add(12*time.Second), fs)

	rep := run(t, config(t, f.st), t0.Add(time.Hour))
	if len(rep.Deletions) != 1 || rep.Deletions[0].Node != "n0" || rep.Deletions[0].Reason != catalog.ReasonGPULost ||
		!rep.Deletions[0].TolerationStartedAt.Equal(t0.Add(20*time.Second)) {
		t.Fatalf("deletions %+v; want n0 GPULost, its toleration from the t0+20s pass (the first after receipt)", rep.Deletions)
	}
	if len(rep.ApprovalsNeeded) != 0 {
		t.Errorf("approvals %+v; want none (the report's headline is GPULost)", rep.ApprovalsNeeded)
	}
	if c := rep.ByReason[catalog.ReasonGPUHang]; c != nil && c.Repairs != 0 {
		t.Errorf("byReason[GPUHang] = %+v; want no GPUHang repair", c)
	}
}
