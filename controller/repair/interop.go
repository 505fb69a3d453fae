package repair

import (
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/fleetrepair/fleetrepair/agent/finding"
)

// Interop: conditions that other node agents already set (the EKS node
// monitoring agent's AcceleratedHardwareReady, KernelReady,
// ContainerRuntimeReady; node-problem-detector's XIDError,
// FrequentDockerRestart, ...) become node-condition findings, so a fleet can
// adopt fleetrepair without removing those agents. They are read from the
// Node at every reconcile and passed to the diagnosis with the stored
// findings; they are not stored as findings of their own (the Node object is
// their record), so they clear when the other agent clears them.

// foreignCondition reports whether a condition was set by another agent and
// is worth a finding: not the kubelet's own (Ready, *Pressure,
// NetworkUnavailable: Karpenter and the scheduler handle those), not ours.
func foreignCondition(c corev1.NodeCondition) bool {
	switch c.Type {
	case corev1.NodeReady, corev1.NodeMemoryPressure, corev1.NodeDiskPressure, corev1.NodePIDPressure, corev1.NodeNetworkUnavailable:
		return false
	}
	return !strings.HasPrefix(string(c.Type), "FleetRepair")
}

// conditionFindings turns the node's foreign conditions into findings.
func conditionFindings(node, bootID string, conds []corev1.NodeCondition) []finding.Finding {
	var out []finding.Finding
	for _, c := range conds {
		if !foreignCondition(c) {
			continue
		}
		f := finding.Finding{Detector: finding.DetectorNodeCondition, Node: node, BootID: bootID, Count: 1,
			Time:     c.LastTransitionTime.Time.UTC().Truncate(time.Second),
			Attrs:    map[string]string{"type": string(c.Type), "status": string(c.Status), "reason": c.Reason, "message": c.Message},
			Evidence: []string{string(c.Type) + "=" + string(c.Status) + " reason=" + c.Reason + ": " + c.Message}}
		f.ID = finding.NewID(f)
		out = append(out, f)
	}
	return out
}

// anyForeignProblem is the node filter of the periodic scan: nodes with a
// foreign condition in a state that may carry a verdict.
func anyForeignProblem(conds []corev1.NodeCondition) bool {
	for _, c := range conds {
		if foreignCondition(c) && c.Status != corev1.ConditionUnknown {
			return true
		}
	}
	return false
}
