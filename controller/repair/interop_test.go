package repair

import (
	"fmt"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/fleetrepair/fleetrepair/agent/finding"
	"github.com/fleetrepair/fleetrepair/controller/catalog"
	"github.com/fleetrepair/fleetrepair/controller/diagnose"
	"github.com/fleetrepair/fleetrepair/controller/kube"
	"github.com/fleetrepair/fleetrepair/controller/lifecycle"
)

// TestKubeletReady: the kubelet's Ready is a signal while False or Unknown
// (NodeNotReady), nothing while True; pressure conditions stay the
// scheduler's.
func TestKubeletReady(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		c    corev1.NodeCondition
		want bool
	}{
		{corev1.NodeCondition{Type: corev1.NodeReady, Status: corev1.ConditionTrue}, false},
		{corev1.NodeCondition{Type: corev1.NodeReady, Status: corev1.ConditionFalse, Reason: "KubeletNotReady"}, true},
		{corev1.NodeCondition{Type: corev1.NodeReady, Status: corev1.ConditionUnknown, Reason: "NodeStatusUnknown"}, true},
		{corev1.NodeCondition{Type: corev1.NodeMemoryPressure, Status: corev1.ConditionTrue}, false},
		{corev1.NodeCondition{Type: "FleetRepairAcceleratedHardwareReady", Status: corev1.ConditionFalse}, false},
	} {
		got := len(conditionFindings("n1", "b1", []corev1.NodeCondition{tc.c})) == 1
		scanned := anyForeignProblem(testEngine(t), kube.NodeInfo{Conditions: []corev1.NodeCondition{tc.c}}, time.Now())
		if got != tc.want || scanned != tc.want {
			t.Errorf("%s=%s: finding %v, scanned %v, want %v", tc.c.Type, tc.c.Status, got, scanned, tc.want)
		}
	}
}

func TestLifecycleFindings(t *testing.T) {
	t.Parallel()
	if fs := lifecycleFindings("n1", "b1", kube.NodeInfo{Name: "n1"}); len(fs) != 0 {
		t.Fatalf("live node: %+v", fs)
	}
	at := time.Date(2025, 4, 21, 19, 27, 22, 0, time.UTC)
	fs := lifecycleFindings("n1", "b1", kube.NodeInfo{Name: "n1", Deleting: at})
	if len(fs) != 1 || fs[0].Detector != "node-terminating" || fs[0].ID == "" || fs[0].BootID != "b1" || fs[0].Attrs["deletion_timestamp"] != "2025-04-21T19:27:22Z" {
		t.Fatalf("deleting node: %+v", fs)
	}
}

// TestHealthyNodesIsCapacity: healthy capacity counts only Ready,
// unquarantined nodes of the NodePool that Karpenter's lifecycle counts as
// capacity (a node leaving or not initialized is none).
func TestHealthyNodesIsCapacity(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	up := lifecycle.Condition{Status: "True"}
	claim := lifecycle.Facts{Name: "nc", NodeName: "n", Registered: up, Initialized: up}
	uninit := claim
	uninit.Initialized = lifecycle.Condition{Status: "False", Since: now.Add(-time.Hour)}
	uninit.Registered.Since = now.Add(-time.Hour)
	deleting := claim
	deleting.Deleting = now.Add(-time.Minute)
	nodes := []kube.NodeInfo{
		{Name: "a", NodePool: "p", Ready: true, Claim: claim},
		{Name: "b", NodePool: "p", Ready: true},                                  // no NodeClaim: a plain Node
		{Name: "c", NodePool: "p", Ready: true, Claim: deleting},                 // leaving
		{Name: "d", NodePool: "p", Ready: true, Deleting: now.Add(-time.Minute)}, // its Node leaving
		{Name: "e", NodePool: "p", Ready: true, Claim: uninit},                   // not initialized
		{Name: "f", NodePool: "p", Ready: false, Claim: claim},
		{Name: "g", NodePool: "p", Ready: true, Claim: claim, Taints: []string{kube.QuarantineTaintKey}},
		{Name: "h", NodePool: "other", Ready: true, Claim: claim},
	}
	if got := healthyNodes(nodes, "p", now, lifecycle.Graces{}); got != 2 {
		t.Errorf("healthy %d, want 2 (a and b)", got)
	}
}

func testEngine(t *testing.T) *diagnose.Engine {
	t.Helper()
	eng, err := diagnose.New(diagnose.Options{})
	if err != nil {
		t.Fatal(err)
	}
	return eng
}

// TestForeignConditions: every condition of another agent is mapped or
// counted as unmapped (a diagnosis and a metric series, never dropped); a
// condition no agent refreshes is stale and one set while the node joins
// waits out the start-up grace - neither is a fault, and the periodic scan
// re-reads only what may become one.
func TestForeignConditions(t *testing.T) {
	t.Parallel()
	eng := testEngine(t)
	now := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	old := now.Add(-2 * time.Hour)
	cond := func(typ, status string, heartbeat time.Time) corev1.NodeCondition {
		return corev1.NodeCondition{Type: corev1.NodeConditionType(typ), Status: corev1.ConditionStatus(status), Reason: "R",
			LastHeartbeatTime: metav1.NewTime(heartbeat), LastTransitionTime: metav1.NewTime(old)}
	}
	for _, tc := range []struct {
		name      string
		c         corev1.NodeCondition
		created   time.Time
		reason    string // headline reason, "" none
		severity  catalog.Severity
		scanned   bool
		verdict   string
		heartbeat bool
	}{
		{"mapped and fresh", cond("KernelDeadlock", "True", now.Add(-time.Minute)), old, catalog.ReasonKernelLockup, catalog.SeverityCondition, true, diagnose.VerdictBad, true},
		{"mapped, agent gone", cond("KernelDeadlock", "True", now.Add(-time.Hour)), old, catalog.ReasonNodeConditionStale, catalog.SeverityNone, false, diagnose.VerdictStale, true},
		{"mapped, node joining", cond("XIDError", "True", now.Add(-time.Minute)), now.Add(-3 * time.Minute), catalog.ReasonNodeConditionStartup, catalog.SeverityNone, true, diagnose.VerdictStartup, true},
		{"healthy polarity", cond("XIDError", "False", now.Add(-time.Minute)), old, "", "", false, diagnose.VerdictHealthy, true},
		{"unknown type", cond("GPUMemoryTemperatureHigh", "True", now.Add(-time.Minute)), old, catalog.ReasonNodeConditionUnmapped, catalog.SeverityNone, false, diagnose.VerdictUnmapped, true},
		{"known polarity, unmapped", cond("NetworkingReady", "False", now.Add(-time.Minute)), old, catalog.ReasonNodeConditionUnmapped, catalog.SeverityNone, false, diagnose.VerdictUnmapped, true},
		{"no heartbeat protocol", cond("AcceleratedHardwareReady", "False", time.Time{}), old, catalog.ReasonVendorAcceleratedHardwareNotReady, catalog.SeverityCondition, true, diagnose.VerdictBad, false},
		// The kubelet's Ready is exempt from freshness: Unknown with an old
		// heartbeat is exactly a dead kubelet.
		{"kubelet silent", cond("Ready", "Unknown", now.Add(-time.Hour)), old, catalog.ReasonNodeNotReady, catalog.SeverityCondition, true, diagnose.VerdictBad, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			info := kube.NodeInfo{Name: "n1", Created: tc.created, Conditions: []corev1.NodeCondition{tc.c}}
			fs := conditionFindings("n1", "b1", info.Conditions)
			if len(fs) != 1 {
				t.Fatalf("findings %+v", fs)
			}
			if _, ok := fs[0].Attrs[finding.AttrHeartbeat]; ok != tc.heartbeat {
				t.Errorf("heartbeat attr present %v, want %v", ok, tc.heartbeat)
			}
			ds := eng.Diagnose(diagnose.Input{Node: "n1", BootID: "b1", Findings: fs, Now: now, NodeCreated: tc.created})
			h := diagnose.Headline(ds)
			if tc.reason == "" && len(ds) != 0 || tc.reason != "" && (h.Reason != tc.reason || h.Severity != tc.severity) {
				t.Errorf("diagnoses %+v, want %s %s", ds, tc.reason, tc.severity)
			}
			if got := anyForeignProblem(eng, info, now); got != tc.scanned {
				t.Errorf("scanned %v, want %v", got, tc.scanned)
			}
			counts := countConditions(eng, map[string][]kube.NodeInfo{"c1": {info}}, now)
			if n := counts[conditionKey{"c1", string(tc.c.Type), tc.verdict}]; n != 1 {
				t.Errorf("metric counts %v, want 1 for verdict %s", counts, tc.verdict)
			}
		})
	}
}

// TestConditionsGauge: the gauge shows the last pass only, and other
// agents' types beyond the bound are counted as "other", not dropped.
func TestConditionsGauge(t *testing.T) {
	t.Parallel()
	eng := testEngine(t)
	now := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	var conds []corev1.NodeCondition
	for i := range maxConditionTypes + 3 {
		conds = append(conds, corev1.NodeCondition{Type: corev1.NodeConditionType(fmt.Sprintf("Vendor%03d", i)), Status: corev1.ConditionTrue})
	}
	g := newConditionsGauge()
	setConditions(g, countConditions(eng, map[string][]kube.NodeInfo{"c1": {{Name: "n1", Conditions: conds}}}, now))
	if got := testutil.ToFloat64(g.WithLabelValues("c1", "other", diagnose.VerdictUnmapped)); got != 3 {
		t.Errorf("other = %v, want 3", got)
	}
	if got := testutil.CollectAndCount(g); got != maxConditionTypes+1 {
		t.Errorf("%d series, want %d", got, maxConditionTypes+1)
	}
	setConditions(g, countConditions(eng, map[string][]kube.NodeInfo{"c1": {{Name: "n1"}}}, now))
	if got := testutil.CollectAndCount(g); got != 0 {
		t.Errorf("%d series after the conditions cleared, want 0", got)
	}
}
