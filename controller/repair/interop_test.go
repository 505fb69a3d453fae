package repair

import (
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

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
		if got != tc.want || anyForeignProblem([]corev1.NodeCondition{tc.c}) != tc.want {
			t.Errorf("%s=%s: finding %v, scanned %v, want %v", tc.c.Type, tc.c.Status, got, anyForeignProblem([]corev1.NodeCondition{tc.c}), tc.want)
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
