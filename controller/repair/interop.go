package repair

import (
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/fleetrepair/fleetrepair/agent/finding"
	"github.com/fleetrepair/fleetrepair/controller/kube"
	"github.com/fleetrepair/fleetrepair/controller/lifecycle"
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
// is worth a finding: not ours, not the kubelet's pressure conditions (the
// scheduler and eviction handle those), and the kubelet's Ready only while
// it is False or Unknown (catalog NodeNotReady: a lone NotReady node is
// repaired after its toleration, a zone of them trips the zone breaker).
func foreignCondition(c corev1.NodeCondition) bool {
	switch c.Type {
	case corev1.NodeReady:
		return c.Status != corev1.ConditionTrue
	case corev1.NodeMemoryPressure, corev1.NodeDiskPressure, corev1.NodePIDPressure, corev1.NodeNetworkUnavailable:
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

// lifecycleFindings are the node's lifecycle facts read from its Node and
// NodeClaim: a deletionTimestamp on either (node-terminating, at the earlier
// one, with the NodeClaim's finalizers; NodeTerminating opens no repair).
// Like the foreign conditions they are not stored; the objects are their
// record.
func lifecycleFindings(node, bootID string, info kube.NodeInfo) []finding.Finding {
	at := info.Deleting
	if d := info.Claim.Deleting; !d.IsZero() && (at.IsZero() || d.Before(at)) {
		at = d
	}
	if at.IsZero() {
		return nil
	}
	f := lifecycle.TerminatingFinding(node, at, info.Claim.Finalizers)
	f.BootID = bootID
	f.ID = finding.NewID(f)
	return []finding.Finding{f}
}

// anyForeignProblem is the node filter of the periodic scan: nodes with a
// foreign condition in a state that may carry a verdict.
func anyForeignProblem(conds []corev1.NodeCondition) bool {
	for _, c := range conds {
		if foreignCondition(c) && (c.Status != corev1.ConditionUnknown || c.Type == corev1.NodeReady) {
			return true
		}
	}
	return false
}
