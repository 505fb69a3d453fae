package repair

import (
	"sort"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"

	"github.com/fleetrepair/fleetrepair/agent/finding"
	"github.com/fleetrepair/fleetrepair/controller/diagnose"
	"github.com/fleetrepair/fleetrepair/controller/kube"
	"github.com/fleetrepair/fleetrepair/controller/lifecycle"
	"github.com/fleetrepair/fleetrepair/controller/store"
)

// Interop: conditions that other node agents already set (the EKS node
// monitoring agent's AcceleratedHardwareReady, KernelReady,
// ContainerRuntimeReady; node-problem-detector's XIDError,
// FrequentDockerRestart, ...) become node-condition findings, so a fleet can
// adopt fleetrepair without removing those agents. They are read from the
// Node at every reconcile and passed to the diagnosis with the stored
// findings; they are not stored as findings of their own (the Node object is
// their record), so they clear when the other agent clears them.
//
// How a condition is read (mapped, unmapped, stale, in its start-up grace)
// is diagnose.ReadCondition, the one rule: the diagnosis and the
// fleetrepair_node_conditions metric below both call it.

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
		f.ID = finding.NewID(f) // before the heartbeat: a refresh is the same condition, not a new one
		if !c.LastHeartbeatTime.IsZero() {
			f.Attrs[finding.AttrHeartbeat] = c.LastHeartbeatTime.Time.UTC().Format(time.RFC3339)
		}
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

// conditionReading is the diagnosis's view of one condition of a node.
func conditionReading(c corev1.NodeCondition, info kube.NodeInfo) diagnose.ConditionReading {
	return diagnose.ConditionReading{Type: string(c.Type), Status: string(c.Status), Reason: c.Reason,
		Heartbeat: c.LastHeartbeatTime.Time, NodeCreated: info.Created}
}

// anyForeignProblem is the node filter of the periodic scan: nodes with a
// foreign condition whose verdict is a fault, or that is in its start-up
// grace (it is read again when the grace ends). Unmapped and stale
// conditions are counted by the metric, not re-read every pass.
func anyForeignProblem(eng *diagnose.Engine, info kube.NodeInfo, now time.Time) bool {
	for _, c := range info.Conditions {
		if !foreignCondition(c) {
			continue
		}
		switch eng.ReadCondition(conditionReading(c, info), now).Verdict {
		case diagnose.VerdictBad, diagnose.VerdictStartup:
			return true
		}
	}
	return false
}

// maxConditionTypes bounds the type label of fleetrepair_node_conditions:
// types are chosen by other agents, so past this many distinct types per
// pass the rest are counted as type "other".
const maxConditionTypes = 64

// conditionKey is one series of fleetrepair_node_conditions.
type conditionKey struct{ cluster, typ, verdict string }

// countConditions counts the foreign conditions of a fleet by cluster,
// type and verdict (diagnose.ReadCondition). Types beyond
// maxConditionTypes (by name order) are counted as "other".
func countConditions(eng *diagnose.Engine, fleet map[string][]kube.NodeInfo, now time.Time) map[conditionKey]int {
	types := map[string]bool{}
	for _, nodes := range fleet {
		for _, n := range nodes {
			for _, c := range n.Conditions {
				if foreignCondition(c) {
					types[string(c.Type)] = true
				}
			}
		}
	}
	keep := make([]string, 0, len(types))
	for t := range types {
		keep = append(keep, t)
	}
	sort.Strings(keep)
	allowed := map[string]bool{}
	for i, t := range keep {
		allowed[t] = i < maxConditionTypes
	}
	out := map[conditionKey]int{}
	for cluster, nodes := range fleet {
		for _, n := range nodes {
			for _, c := range n.Conditions {
				if !foreignCondition(c) {
					continue
				}
				typ := string(c.Type)
				if !allowed[typ] {
					typ = "other"
				}
				out[conditionKey{cluster, typ, eng.ReadCondition(conditionReading(c, n), now).Verdict}]++
			}
		}
	}
	return out
}

// newConditionsGauge is fleetrepair_node_conditions.
func newConditionsGauge() *prometheus.GaugeVec {
	return prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "fleetrepair_node_conditions",
		Help: "NodeConditions set by other agents (and the kubelet's Ready while not True), by cluster, type and verdict " +
			"(bad, healthy, unknown, startup, stale, unmapped), at the last periodic pass."}, []string{"cluster", "type", "verdict"})
}

// setConditions replaces the gauge's series with counts.
func setConditions(g *prometheus.GaugeVec, counts map[conditionKey]int) {
	g.Reset()
	for k, n := range counts {
		g.WithLabelValues(k.cluster, k.typ, k.verdict).Set(float64(n))
	}
}

// inventoryGPUs is the GPU count of the node's newest heartbeat; 0 when
// there is none (the diagnosis then has no inventory to compare with the
// instance type's).
func inventoryGPUs(n store.Node) int {
	if n.Heartbeat == nil {
		return 0
	}
	return max(n.Heartbeat.GPUCount, len(n.Heartbeat.GPUs))
}

// inventory is the GPU list of the node's newest heartbeat; nil when none.
func inventory(n store.Node) []finding.GPU {
	if n.Heartbeat == nil {
		return nil
	}
	return n.Heartbeat.GPUs
}
