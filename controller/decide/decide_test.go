package decide_test

import (
	"errors"
	"fmt"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/fleetrepair/fleetrepair/controller/breaker"
	"github.com/fleetrepair/fleetrepair/controller/catalog"
	"github.com/fleetrepair/fleetrepair/controller/decide"
	"github.com/fleetrepair/fleetrepair/controller/diagnose"
	"github.com/fleetrepair/fleetrepair/controller/ledger"
)

var t0 = time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)

func TestSignals(t *testing.T) {
	t.Parallel()
	d := func(class string, sev catalog.Severity) diagnose.Diagnosis {
		return diagnose.Diagnosis{Cluster: "c1", Node: "n1", FaultClass: class, Severity: sev, LastSeen: t0.Add(-time.Minute)}
	}
	for _, tt := range []struct {
		name string
		d    diagnose.Diagnosis
		want []breaker.Signal
	}{
		{"condition: new failure and ongoing", d("gpu-lost", catalog.SeverityCondition),
			[]breaker.Signal{{Node: "c1/n1", At: t0.Add(-time.Minute)}, {Node: "c1/n1", At: t0, Ongoing: true}}},
		{"event of a real class: new failure only", d("app-error", catalog.SeverityEvent),
			[]breaker.Signal{{Node: "c1/n1", At: t0.Add(-time.Minute)}}},
		{"fault class none", d("none", catalog.SeverityEvent), nil},
		{"fault class provisioning", d("provisioning", catalog.SeverityNone), nil},
		{"provisioning even as an event", d("provisioning", catalog.SeverityEvent), nil},
		{"severity none", d("gpu-lost", catalog.SeverityNone), nil},
		{"no cluster: the node's own name", diagnose.Diagnosis{Node: "n1", FaultClass: "pcie", Severity: catalog.SeverityEvent, LastSeen: t0},
			[]breaker.Signal{{Node: "n1", At: t0}}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got := decide.Signals([]diagnose.Diagnosis{tt.d}, t0)
			if len(got) != len(tt.want) {
				t.Fatalf("Signals = %+v, want %+v", got, tt.want)
			}
			for i := range got {
				if got[i] != tt.want[i] {
					t.Fatalf("Signals = %+v, want %+v", got, tt.want)
				}
			}
		})
	}
}

func TestToleration(t *testing.T) {
	t.Parallel()
	if got := decide.Toleration(diagnose.Diagnosis{}, 10*time.Minute); got != 10*time.Minute {
		t.Errorf("Toleration = %s, want the policy's 10m", got)
	}
	if got := decide.Toleration(diagnose.Diagnosis{Escalated: true}, 10*time.Minute); got != 0 {
		t.Errorf("escalated Toleration = %s, want 0", got)
	}
}

func TestBudgetAllows(t *testing.T) {
	t.Parallel()
	b := decide.Budget{DeletionsPerHour: 10, MaxInFlightPerNodePool: 1, NodePoolDeletionsPerHour: 5, MinHealthy: 3}
	for _, tt := range []struct {
		name   string
		c      decide.Counts
		budget string // "" allows
		detail string
	}{
		{"room everywhere", decide.Counts{DeletionsLastHour: 9, NodePoolDeletionsLastHour: 4, Healthy: 3}, "", ""},
		{"cluster per hour first", decide.Counts{Cluster: "c1", DeletionsLastHour: 10, InFlight: 1, NodePoolDeletionsLastHour: 5},
			decide.BudgetDeletionsPerHour, "cluster c1: 10 deletions in the last hour, budget 10 per hour"},
		{"in flight before the NodePool's hour", decide.Counts{Cluster: "c1", NodePool: "gpu", InFlight: 1, NodePoolDeletionsLastHour: 5},
			decide.BudgetMaxInFlightPerNodePool, `cluster c1 nodepool "gpu": 1 deletions in flight, budget 1`},
		{"NodePool per hour", decide.Counts{Cluster: "c1", NodePool: "gpu", NodePoolDeletionsLastHour: 5},
			decide.BudgetNodePoolDeletionsPerHour, `cluster c1 nodepool "gpu": 5 deletions in the last hour, budget 5 per hour`},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			ex := b.Allows(tt.c)
			switch {
			case tt.budget == "" && ex != nil:
				t.Fatalf("Allows = %+v, want nil", ex)
			case tt.budget != "" && (ex == nil || ex.Budget != tt.budget || ex.Detail != tt.detail):
				t.Fatalf("Allows = %+v, want %s %q", ex, tt.budget, tt.detail)
			}
		})
	}
	if ex := b.AllowsHealthy(decide.Counts{NodePool: "gpu", Healthy: 2}); ex == nil || ex.Budget != decide.BudgetMinHealthy ||
		ex.Detail != "NodePool gpu has 2 healthy nodes, minimum 3" {
		t.Errorf("AllowsHealthy(2 of 3) = %+v", ex)
	}
	if ex := (decide.Budget{}).AllowsHealthy(decide.Counts{}); ex != nil {
		t.Errorf("AllowsHealthy without a minimum = %+v, want nil", ex)
	}
}

// openZone is a breaker state with zone=z1 open, evaluated at t0.
func openZone(t testing.TB) (breaker.State, breaker.Node, breaker.Node) {
	t.Helper()
	p, err := breaker.NewPolicy(breaker.Config{})
	if err != nil {
		t.Fatal(err)
	}
	var nodes []breaker.Node
	var sigs []breaker.Signal
	for i := range 50 {
		zone := "z2"
		if i < 10 {
			zone = "z1"
		}
		n := breaker.Node{Name: "n" + string(rune('a'+i/26)) + string(rune('a'+i%26)), Attrs: map[string]string{"zone": zone, "cluster": "c1"}}
		nodes = append(nodes, n)
		if i < 6 {
			sigs = append(sigs, breaker.Signal{Node: n.Name, At: t0.Add(-time.Minute)})
		}
	}
	st, _ := p.Evaluate(t0, p.Fleet(nodes), sigs, breaker.State{})
	if !st.Tripped() {
		t.Fatal("zone z1 did not trip")
	}
	return st, nodes[0], nodes[20]
}

func TestDeletion(t *testing.T) {
	t.Parallel()
	st, held, free := openZone(t)
	killed := st
	killed.KillSwitch = breaker.KillSwitch{On: true, Actor: "user:otto", Reason: "incident", Since: t0}
	room := decide.Budget{DeletionsPerHour: 10, MaxInFlightPerNodePool: 1, NodePoolDeletionsPerHour: 5}
	for _, tt := range []struct {
		name string
		g    decide.Guards
		now  time.Time
		want error // nil allows
		text string
	}{
		{"a lone failure passes", decide.Guards{Budget: room, Breakers: true, State: st, Node: free, MaxBreakerAge: time.Minute}, t0, nil, ""},
		{"the breaker before the budget: a held repair goes to on-call with its budget spent", decide.Guards{Budget: room,
			Counts: decide.Counts{Cluster: "c1", DeletionsLastHour: 10}, Breakers: true, State: st, Node: held}, t0, decide.ErrHeldByBreaker, "zone=z1"},
		{"the budget holds a repair the breaker allows", decide.Guards{Budget: room, Counts: decide.Counts{Cluster: "c1", DeletionsLastHour: 10},
			Breakers: true, State: st, Node: free}, t0, decide.ErrBudgetExceeded, "cluster c1: 10 deletions"},
		{"the budget holds an approved repair", decide.Guards{Budget: room, Counts: decide.Counts{Cluster: "c1", DeletionsLastHour: 10},
			Breakers: true, State: st, Node: held, HumanApproved: true}, t0, decide.ErrBudgetExceeded, "cluster c1: 10 deletions"},
		{"the breaker holds its cohort", decide.Guards{Budget: room, Breakers: true, State: st, Node: held, MaxBreakerAge: time.Minute},
			t0, decide.ErrHeldByBreaker, "zone=z1"},
		{"a human approval overrides the breaker", decide.Guards{Budget: room, Breakers: true, State: st, Node: held, HumanApproved: true}, t0, nil, ""},
		{"the kill switch stops approved repairs too", decide.Guards{Budget: room, Breakers: true, State: killed, Node: free, HumanApproved: true},
			t0, decide.ErrKillSwitch, "by user:otto (incident)"},
		{"a stale state is refused, not held", decide.Guards{Budget: room, Breakers: true, State: st, Node: held, MaxBreakerAge: time.Minute},
			t0.Add(2 * time.Minute), decide.ErrBreakerStale, "bound 1m0s"},
		{"never evaluated is stale", decide.Guards{Budget: room, Breakers: true, Node: free, MaxBreakerAge: time.Minute},
			t0, decide.ErrBreakerStale, "not evaluated yet"},
		{"breakers off: no freshness needed", decide.Guards{Budget: room, Node: free, MaxBreakerAge: time.Minute}, t0, nil, ""},
		{"the breaker before the minimum healthy count", decide.Guards{Budget: decide.Budget{DeletionsPerHour: 10, MaxInFlightPerNodePool: 1,
			NodePoolDeletionsPerHour: 5, MinHealthy: 5}, Counts: decide.Counts{NodePool: "gpu", Healthy: 1}, Breakers: true, State: st, Node: held},
			t0, decide.ErrHeldByBreaker, "zone=z1"},
		{"minimum healthy", decide.Guards{Budget: decide.Budget{DeletionsPerHour: 10, MaxInFlightPerNodePool: 1, NodePoolDeletionsPerHour: 5, MinHealthy: 5},
			Counts: decide.Counts{NodePool: "gpu", Healthy: 4}, HumanApproved: true, Node: held, Breakers: true, State: st},
			t0, decide.ErrMinHealthy, "NodePool gpu has 4 healthy nodes, minimum 5"},
		{"do-not-disrupt holds a lone failure", decide.Guards{Budget: room, Node: free,
			Disruption: decide.Disruption{DoNotDisrupt: "Pod ml/train-0"}}, t0, decide.ErrDoNotDisrupt, "Pod ml/train-0: held by karpenter.sh/do-not-disrupt"},
		{"no approval overrides do-not-disrupt", decide.Guards{Budget: room, Breakers: true, State: st, Node: held, HumanApproved: true,
			Disruption: decide.Disruption{DoNotDisrupt: "Node n1"}}, t0, decide.ErrDoNotDisrupt, "Node n1"},
		{"the opt-out before do-not-disrupt", decide.Guards{Budget: room, Node: free,
			Disruption: decide.Disruption{OptOut: "NodePool gpu", DoNotDisrupt: "Node n1"}}, t0, decide.ErrOptedOut, "NodePool gpu: opted out"},
		{"the kill switch before the owners", decide.Guards{Budget: room, State: killed, Node: free,
			Disruption: decide.Disruption{OptOut: "Node n1"}}, t0, decide.ErrKillSwitch, "kill switch"},
		{"the owners before the budget", decide.Guards{Budget: room, Counts: decide.Counts{Cluster: "c1", DeletionsLastHour: 10}, Node: free,
			Disruption: decide.Disruption{OptOut: "Node n1"}}, t0, decide.ErrOptedOut, "Node n1"},
		{"the owners before the breaker: no approval asked for what waits on them", decide.Guards{Budget: room, Breakers: true, State: st, Node: held,
			MaxBreakerAge: time.Minute, Disruption: decide.Disruption{DoNotDisrupt: "NodeClaim nc-1"}}, t0, decide.ErrDoNotDisrupt, "NodeClaim nc-1"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			err := decide.Deletion(tt.g, tt.now)
			if tt.want == nil {
				if err != nil {
					t.Fatalf("Deletion = %v, want nil", err)
				}
				return
			}
			if !errors.Is(err, tt.want) || !strings.Contains(err.Error(), tt.text) {
				t.Fatalf("Deletion = %v, want %v naming %q", err, tt.want, tt.text)
			}
		})
	}
}

func TestStep(t *testing.T) {
	t.Parallel()
	cond := diagnose.Diagnosis{Severity: catalog.SeverityCondition, ConditionType: "FleetRepairGPUHealthy", Message: "GPU lost"}
	esc := cond
	esc.Escalated = true
	tol := decide.Repair{State: ledger.Tolerating, NodeClaim: "nc", NodeClaimUID: "u1", TolerationUntil: t0}
	approved := tol
	approved.State = ledger.Approved
	released := approved
	released.ReleasedBy = decide.Actor
	dry := tol
	dry.DryRun = true
	heldB := decide.Repair{State: ledger.AwaitingApproval, NodeClaim: "nc", HeldBy: decide.HeldByBreaker, Since: t0.Add(-time.Hour)}
	heldA := heldB
	heldA.HeldBy = decide.HeldByAction
	deleting := decide.Repair{State: ledger.Deleting, NodeClaim: "nc", DryRun: true}
	replace := decide.Facts{Action: catalog.ActionReplace, NodeClaimUID: "u1", ApprovalTTL: 24 * time.Hour}
	yes := func() bool { return true }
	for _, tt := range []struct {
		name string
		r    decide.Repair
		head diagnose.Diagnosis
		f    decide.Facts
		now  time.Time
		kind decide.Kind
		to   ledger.State
		why  string
	}{
		{"detected -> quarantined", decide.Repair{State: ledger.Detected}, cond, replace, t0, decide.Transition, ledger.Quarantined, "FleetRepairGPUHealthy=False"},
		{"quarantined -> tolerating", decide.Repair{State: ledger.Quarantined, TolerationUntil: t0}, cond, replace, t0, decide.Transition, ledger.Tolerating, "toleration window until 2026-11-30T12:00:00Z"},
		{"inside the toleration: wait", tol, cond, replace, t0.Add(-time.Second), decide.Wait, "", ""},
		{"toleration over: the guards", tol, cond, replace, t0, decide.Guard, ledger.Deleting, "toleration window over; delete NodeClaim nc (uid u1)"},
		{"NodeClaim UID changed: cancelled", tol, cond, decide.Facts{Action: catalog.ActionReplace, NodeClaimUID: "u2"}, t0, decide.Transition, ledger.Cancelled, `uid u1, now "u2"`},
		{"reset-class: awaits approval", tol, cond, decide.Facts{Action: catalog.ActionResetGPU, NodeClaimUID: "u1"}, t0, decide.Transition, ledger.AwaitingApproval, "reset-gpu is not executable"},
		{"an approval executes any action", approved, cond, decide.Facts{Action: catalog.ActionResetGPU, NodeClaimUID: "u1"}, t0, decide.Guard, ledger.Deleting, "approved (see the approval above)"},
		{"no NodeClaim: failed", decide.Repair{State: ledger.Tolerating}, cond, replace, t0, decide.Transition, ledger.Failed, "no Karpenter NodeClaim"},
		{"dry-run says so", dry, cond, replace, t0, decide.Guard, ledger.Deleting, "dry-run: toleration window over"},
		{"breaker-held, breaker closed: released", heldB, cond, decide.Facts{BreakerAllows: true, Drain: yes, ApprovalTTL: 24 * time.Hour}, t0, decide.Transition, ledger.Approved, "released (paced)"},
		{"breaker-held, resumed by a human: the release names the resume", heldB, cond, decide.Facts{BreakerAllows: true, Drain: yes, ApprovalTTL: 24 * time.Hour,
			Resumed: func() (string, string, bool) {
				return "user:ada", "breaker zone=z1 resumed by user:ada: AZ recovered", true
			}},
			t0, decide.Transition, ledger.Approved, "released (paced) for re-validation after breaker zone=z1 resumed by user:ada: AZ recovered"},
		{"breaker-held, no release left this pass", heldB, cond, decide.Facts{BreakerAllows: true, Drain: func() bool { return false }, ApprovalTTL: 24 * time.Hour}, t0, decide.Wait, "", ""},
		{"breaker-held, breaker open", heldB, cond, decide.Facts{Drain: yes, ApprovalTTL: 24 * time.Hour}, t0, decide.Wait, "", ""},
		{"action-held, escalated to replace: released", heldA, esc, decide.Facts{Action: catalog.ActionReplace, ApprovalTTL: 24 * time.Hour}, t0, decide.Transition, ledger.Approved, "escalated to replace (GPU lost)"},
		{"action-held, not escalated: waits", heldA, cond, decide.Facts{Action: catalog.ActionReplace, ApprovalTTL: 24 * time.Hour}, t0, decide.Wait, "", ""},
		{"approval TTL over: expired", heldA, cond, decide.Facts{Action: catalog.ActionResetGPU, ApprovalTTL: time.Hour}, t0, decide.Transition, ledger.Expired, "no approval within 1h0m0s"},
		{"healthy: resolved", tol, diagnose.Diagnosis{}, replace, t0, decide.Transition, ledger.Resolved, "evidence cleared"},
		{"healthy while deleting: the deletion goes on", decide.Repair{State: ledger.Deleting, NodeClaim: "nc"}, diagnose.Diagnosis{}, replace, t0, decide.DeleteNodeClaim, ledger.Replaced, ""},
		{"dry-run deleting: cancelled, nothing deleted", deleting, cond, replace, t0, decide.Transition, ledger.Cancelled, "would have been deleted now; nothing was deleted"},
		{"node gone: cancelled", tol, cond, decide.Facts{NodeGone: true}, t0, decide.Transition, ledger.Cancelled, "the Node no longer exists"},
		{"terminal: nothing", decide.Repair{State: ledger.Replaced}, cond, replace, t0, decide.Wait, "", ""},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got := decide.Step(tt.r, tt.head, tt.f, tt.now)
			if got.Kind != tt.kind || got.To != tt.to || !strings.Contains(got.Why, tt.why) {
				t.Fatalf("Step = %+v, want kind %d to %q why containing %q", got, tt.kind, tt.to, tt.why)
			}
		})
	}
	if g := decide.Step(approved, cond, replace, t0); !g.HumanApproved {
		t.Error("an approval by on-call is not HumanApproved")
	}
	if g := decide.Step(released, cond, replace, t0); g.HumanApproved {
		t.Error("a release by the controller is HumanApproved: the breakers would not guard it")
	}
	if g := decide.Step(dry, cond, replace, t0); g.Kind != decide.Guard {
		t.Fatalf("dry run: %+v", g)
	} else if n := decide.Deleting(deleting); n.ExecutedAction != "none" {
		t.Errorf("dry-run executed action = %q, want none", n.ExecutedAction)
	}
}

func TestAfterGuard(t *testing.T) {
	t.Parallel()
	g := decide.Next{Kind: decide.Guard, To: ledger.Deleting}
	for _, tt := range []struct {
		name    string
		err     error
		kind    decide.Kind
		to      ledger.State
		retry   string
		decided bool
	}{
		{"passed", nil, decide.Guard, ledger.Deleting, "", true},
		{"held", errors.Join(errors.New("zone=z1 open"), decide.ErrHeldByBreaker), decide.Transition, ledger.AwaitingApproval, "", true},
		{"stale", decide.ErrBreakerStale, decide.Wait, "", "breakers", true},
		{"kill switch", decide.ErrKillSwitch, decide.Wait, "", "", true},
		{"budget", &decide.BudgetError{Exceeded: decide.Exceeded{Budget: decide.BudgetDeletionsPerHour}}, decide.Wait, "", "", true},
		{"min healthy", &decide.BudgetError{Exceeded: decide.Exceeded{Budget: decide.BudgetMinHealthy}}, decide.Wait, "", "", true},
		{"do-not-disrupt", fmt.Errorf("Pod a/b: %w", decide.ErrDoNotDisrupt), decide.Wait, "", "", true},
		{"opt-out", fmt.Errorf("Node n1: %w", decide.ErrOptedOut), decide.Wait, "", "", true},
		{"a database error is no decision", errors.New("connection reset"), decide.Wait, "", "", false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got, ok := decide.AfterGuard(g, tt.err)
			if ok != tt.decided || got.Kind != tt.kind || got.To != tt.to || got.Retry != tt.retry {
				t.Fatalf("AfterGuard(%v) = %+v, %v", tt.err, got, ok)
			}
			if want := decide.HoldOf(tt.err); got.Hold != want || tt.kind == decide.Wait && tt.decided && tt.retry == "" && want == "" {
				t.Fatalf("AfterGuard(%v).Hold = %q, HoldOf %q", tt.err, got.Hold, want)
			}
		})
	}
	for err, want := range map[error]string{
		decide.ErrKillSwitch: decide.HoldKillSwitch, fmt.Errorf("x: %w", decide.ErrDoNotDisrupt): decide.HoldDoNotDisrupt,
		fmt.Errorf("x: %w", decide.ErrOptedOut): decide.HoldOptOut, decide.ErrBreakerStale: "", decide.ErrHeldByBreaker: "",
		&decide.BudgetError{Exceeded: decide.Exceeded{Budget: decide.BudgetMinHealthy}}:             decide.HoldMinHealthy,
		&decide.BudgetError{Exceeded: decide.Exceeded{Budget: decide.BudgetMaxInFlightPerNodePool}}: decide.HoldBudget,
	} {
		if got := decide.HoldOf(err); got != want {
			t.Errorf("HoldOf(%v) = %q, want %q", err, got, want)
		}
	}
	held, _ := decide.AfterGuard(g, errors.Join(errors.New("zone=z1 open"), decide.ErrHeldByBreaker))
	if held.Set["held_by"] != decide.HeldByBreaker || !strings.Contains(held.Why, "held for on-call approval: zone=z1 open") {
		t.Errorf("held = %+v", held)
	}
}

func TestOwners(t *testing.T) {
	t.Parallel()
	started := t0.Add(-20 * time.Minute)
	for _, tt := range []struct {
		value   string
		started time.Time
		want    bool
	}{
		{"true", started, true},
		{"false", started, false},
		{"", started, false},
		{"30m", started, true},     // 20 of 30 minutes
		{"10m", started, false},    // protection over
		{"10m", time.Time{}, true}, // start unknown: fail safe
		{"soon", started, false},   // unparsable: no protection (Karpenter emits an Event)
		{"-5m", started, false},    // not a protection
		{"True", started, false},   // Karpenter compares exactly
		{"1h30m", t0.Add(-time.Hour), true},
	} {
		if got := decide.PodDoNotDisrupt(tt.value, tt.started, t0); got != tt.want {
			t.Errorf("PodDoNotDisrupt(%q, %s) = %t, want %t", tt.value, tt.started, got, tt.want)
		}
	}
	if !decide.ObjectDoNotDisrupt(map[string]string{decide.DoNotDisruptAnnotation: "true"}) || decide.ObjectDoNotDisrupt(map[string]string{decide.DoNotDisruptAnnotation: "1h"}) {
		t.Error("a Node or NodeClaim's do-not-disrupt is exactly \"true\"")
	}
	if !decide.OptedOut(map[string]string{decide.OptOutLabel: "Disabled"}) || decide.OptedOut(map[string]string{decide.OptOutLabel: "enabled"}) || decide.OptedOut(nil) {
		t.Error("OptedOut")
	}
}

func TestSuppressed(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name       string
		last       decide.Repair
		lastReason string
		uid        string
		dryRun     bool
		want       bool
	}{
		{"a dry run that reached its decision", decide.Repair{State: ledger.Cancelled, DryRun: true, NodeClaimUID: "u"}, "GPULost", "u", true, true},
		{"dry run over now: repair for real", decide.Repair{State: ledger.Cancelled, DryRun: true, NodeClaimUID: "u"}, "GPULost", "u", false, false},
		{"rejected for the same reason", decide.Repair{State: ledger.Rejected, NodeClaimUID: "u"}, "GPULost", "u", false, true},
		{"rejected, a new reason", decide.Repair{State: ledger.Rejected, NodeClaimUID: "u"}, "GPUHang", "u", false, false},
		{"a new NodeClaim", decide.Repair{State: ledger.Rejected, NodeClaimUID: "u"}, "GPULost", "v", false, false},
		{"replaced", decide.Repair{State: ledger.Replaced, NodeClaimUID: "u"}, "GPULost", "u", false, false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			if got := decide.Suppressed(tt.last, tt.lastReason, tt.uid, "GPULost", tt.dryRun); got != tt.want {
				t.Fatalf("Suppressed = %v, want %v", got, tt.want)
			}
		})
	}
}

// TestNoIO: the decision package imports no network, file system,
// database or Kubernetes package, so every caller can run it anywhere.
func TestNoIO(t *testing.T) {
	t.Parallel()
	out, err := exec.Command("go", "list", "-f", `{{join .Imports "\n"}}`, ".").CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	imports := strings.Fields(string(out))
	if len(imports) < 3 {
		t.Fatalf("go list listed only %v", imports)
	}
	for _, imp := range imports {
		for _, bad := range []string{"net", "os", "database/", "io/fs", "github.com/jackc/", "k8s.io/", "sigs.k8s.io/",
			"github.com/fleetrepair/fleetrepair/controller/store", "github.com/fleetrepair/fleetrepair/controller/kube",
			"github.com/fleetrepair/fleetrepair/controller/policy"} {
			if imp == bad || strings.HasPrefix(imp, strings.TrimSuffix(bad, "/")+"/") {
				t.Errorf("controller/decide imports %s", imp)
			}
		}
	}
}

// TestRetarget: an open repair takes the headline's reason until its
// deletion starts; never for a non-condition headline or a deleting or
// closed repair.
func TestRetarget(t *testing.T) {
	t.Parallel()
	lost := diagnose.Diagnosis{Severity: catalog.SeverityCondition, Reason: catalog.ReasonGPULost}
	for _, tt := range []struct {
		state  ledger.State
		reason string
		head   diagnose.Diagnosis
		want   bool
	}{
		{ledger.Tolerating, catalog.ReasonPCIeFatalError, lost, true},
		{ledger.Detected, catalog.ReasonPCIeFatalError, lost, true},
		{ledger.Quarantined, catalog.ReasonPCIeFatalError, lost, true},
		{ledger.AwaitingApproval, catalog.ReasonGPUHang, lost, true},
		{ledger.Approved, catalog.ReasonGPUHang, lost, true},
		{ledger.Tolerating, catalog.ReasonGPULost, lost, false},
		{ledger.Deleting, catalog.ReasonPCIeFatalError, lost, false},
		{ledger.Replaced, catalog.ReasonPCIeFatalError, lost, false},
		{ledger.Resolved, catalog.ReasonPCIeFatalError, lost, false},
		{ledger.Tolerating, catalog.ReasonPCIeFatalError, diagnose.Diagnosis{Severity: catalog.SeverityEvent, Reason: catalog.ReasonGPULost}, false},
		{ledger.Tolerating, catalog.ReasonPCIeFatalError, diagnose.Diagnosis{}, false},
	} {
		if got := decide.Retarget(tt.state, tt.reason, tt.head); got != tt.want {
			t.Errorf("Retarget(%s, %s, %s/%s) = %v, want %v", tt.state, tt.reason, tt.head.Severity, tt.head.Reason, got, tt.want)
		}
	}
}

// TestBreakerHolds: the pre-check is true only where Deletion refuses
// whatever the owners' word and the healthy count are.
func TestBreakerHolds(t *testing.T) {
	t.Parallel()
	st, held, free := openZone(t)
	killed := st
	killed.KillSwitch = breaker.KillSwitch{On: true, Actor: "user:otto", Since: t0}
	room := decide.Budget{DeletionsPerHour: 10, MaxInFlightPerNodePool: 1, NodePoolDeletionsPerHour: 5, MinHealthy: 3}
	for _, tt := range []struct {
		name string
		g    decide.Guards
		now  time.Time
		want bool
	}{
		{"held by the zone breaker", decide.Guards{Budget: room, Breakers: true, State: st, Node: held, MaxBreakerAge: time.Minute}, t0, true},
		{"another zone", decide.Guards{Budget: room, Breakers: true, State: st, Node: free, MaxBreakerAge: time.Minute}, t0, false},
		{"human approved", decide.Guards{Budget: room, Breakers: true, State: st, Node: held, HumanApproved: true, MaxBreakerAge: time.Minute}, t0, false},
		{"stale state", decide.Guards{Budget: room, Breakers: true, State: st, Node: held, MaxBreakerAge: time.Minute}, t0.Add(2 * time.Minute), false},
		{"breakers off", decide.Guards{Budget: room, State: st, Node: held, MaxBreakerAge: time.Minute}, t0, false},
		{"kill switch: decided without the pre-check", decide.Guards{Budget: room, Breakers: true, State: killed, Node: held, MaxBreakerAge: time.Minute}, t0, false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			if got := decide.BreakerHolds(tt.g, tt.now); got != tt.want {
				t.Fatalf("BreakerHolds = %t, want %t", got, tt.want)
			}
			if !tt.want {
				return
			}
			// Held: no owners' word and no healthy count let it through.
			for _, owners := range []decide.Disruption{{}, {OptOut: "Node n1"}, {DoNotDisrupt: "Pod ml/a"}} {
				for _, healthy := range []int{0, 100} {
					g := tt.g
					g.Disruption, g.Counts.Healthy = owners, healthy
					if err := decide.Deletion(g, tt.now); err == nil {
						t.Fatalf("Deletion allowed a node BreakerHolds holds (owners %+v, healthy %d)", owners, healthy)
					}
				}
			}
		})
	}
}
