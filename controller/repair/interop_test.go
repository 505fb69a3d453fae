package repair

import (
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/fleetrepair/fleetrepair/controller/kube"
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
