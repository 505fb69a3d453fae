package diagnose

import (
	"time"

	"github.com/fleetrepair/fleetrepair/controller/catalog"
)

// This file reads NodeConditions that other node agents set (the EKS node
// monitoring agent, node-problem-detector and its vendor plugins, the GPU
// Operator's and NVSentinel's health checks) and the kubelet's Ready. Every
// condition type is either in conditionTypes (mapped: a polarity and the
// reason a bad status means) or counted as unmapped (NodeConditionUnmapped):
// none is dropped without a trace. The controller's interop (controller/
// repair/interop.go) and its metric call ReadCondition, the one rule.

// Condition verdicts, the "verdict" label of the fleetrepair_node_conditions
// metric.
const (
	VerdictHealthy  = "healthy"  // a known type in its good status
	VerdictUnknown  = "unknown"  // a known type with status Unknown or empty: no verdict
	VerdictBad      = "bad"      // a known type in its bad status: Reason is its mapped reason
	VerdictStartup  = "startup"  // bad, but set within the start-up grace of the node
	VerdictStale    = "stale"    // bad, but no agent refreshed its lastHeartbeatTime within the freshness window
	VerdictUnmapped = "unmapped" // a type this table does not know
	VerdictKubelet  = "kubelet"  // the kubelet's pressure and network conditions: the scheduler's, not a repair signal
)

// Defaults for the condition timing (Options.ConditionStartupGrace,
// Options.ConditionStaleAfter).
const (
	// DefaultConditionStartupGrace: node-problem-detector's and the EKS
	// agent's first checks settle within a few minutes of the node
	// joining (c21: Unknown and NetworkUnavailable=True seconds after boot).
	DefaultConditionStartupGrace = 10 * time.Minute
	// DefaultConditionStaleAfter: node-problem-detector refreshes a
	// condition's lastHeartbeatTime every 5 minutes while it runs; 20
	// minutes is four missed heartbeats.
	DefaultConditionStaleAfter = 20 * time.Minute
)

// conditionRule is how one condition type is read.
type conditionRule struct {
	// readiness: healthy when True, bad when False (Ready,
	// AcceleratedHardwareReady); otherwise problem-style, bad when True
	// (XIDError, KernelDeadlock).
	readiness bool
	// reason is the catalog reason of the bad status; "" for the kubelet's
	// own conditions (VerdictKubelet) and for types whose polarity is known
	// but whose bad status is not mapped (unmapped set).
	reason string
	// unmapped: the polarity is known, a bad status is counted as
	// NodeConditionUnmapped (a good one is healthy).
	unmapped bool
}

// conditionTypes maps the condition types fleetrepair knows. Sources: the
// EKS node monitoring agent (AcceleratedHardwareReady, ContainerRuntimeReady,
// KernelReady), node-problem-detector's default monitors (KernelDeadlock,
// ReadonlyFilesystem, FrequentKubeletRestart, FrequentDockerRestart,
// FrequentContainerdRestart, CorruptDockerOverlay2) and the GPU plugins AKS
// ships with it (XIDError, UnhealthyNvidiaDevicePlugin: case c21), and the
// kubelet. Types not listed are counted as unmapped rather than guessed.
var conditionTypes = map[string]conditionRule{
	"AcceleratedHardwareReady":    {readiness: true, reason: catalog.ReasonVendorAcceleratedHardwareNotReady},
	"XIDError":                    {reason: catalog.ReasonVendorAcceleratedHardwareNotReady},
	"GPUProblem":                  {reason: catalog.ReasonVendorAcceleratedHardwareNotReady},
	"GpuProblem":                  {reason: catalog.ReasonVendorAcceleratedHardwareNotReady},
	"UnhealthyNvidiaDevicePlugin": {reason: catalog.ReasonDevicePluginError},
	"ContainerRuntimeReady":       {readiness: true, reason: catalog.ReasonContainerRuntimeNotReady},
	"ContainerRuntimeProblem":     {reason: catalog.ReasonContainerRuntimeNotReady},
	"FrequentContainerdRestart":   {reason: catalog.ReasonContainerRuntimeNotReady},
	"FrequentDockerRestart":       {reason: catalog.ReasonContainerRuntimeNotReady},
	"FrequentKubeletRestart":      {reason: catalog.ReasonContainerRuntimeNotReady},
	"CorruptDockerOverlay2":       {reason: catalog.ReasonContainerRuntimeNotReady},
	// The EKS agent's KernelReady=False, node-problem-detector's
	// KernelDeadlock=True (a task hung in D state).
	"KernelReady":    {readiness: true, reason: catalog.ReasonKernelLockup},
	"KernelDeadlock": {reason: catalog.ReasonKernelLockup},
	// node-problem-detector: the root (node) filesystem remounted read-only
	// or corrupt.
	"ReadonlyFilesystem":   {reason: catalog.ReasonNodeFilesystemFailure},
	"FilesystemCorruption": {reason: catalog.ReasonNodeFilesystemFailure},
	// The kubelet's.
	"Ready":              {readiness: true, reason: catalog.ReasonNodeNotReady},
	"MemoryPressure":     {},
	"DiskPressure":       {},
	"PIDPressure":        {},
	"NetworkUnavailable": {},
	// The EKS agent's, polarity only: their reasons range from a missing
	// route or an IPAM daemon to a slow disk, none a repair of ours yet.
	"NetworkingReady": {readiness: true, unmapped: true},
	"StorageReady":    {readiness: true, unmapped: true},
}

// monitoringReasons are vendor condition reasons that describe the monitor,
// not the hardware: a monitor that cannot reach DCGM says nothing about the
// GPUs (case c20).
var monitoringReasons = map[string]bool{"DCGMError": true, "DCGMConnectionError": true, "NVMLError": true}

// ConditionReading is one NodeCondition as ReadCondition needs it.
type ConditionReading struct {
	Type, Status, Reason string
	// Heartbeat is the condition's lastHeartbeatTime; zero when the agent
	// does not set one (freshness then cannot be judged and is assumed).
	Heartbeat time.Time
	// NodeCreated is the Node's creation time; zero when unknown (no
	// start-up grace).
	NodeCreated time.Time
}

// ConditionVerdict is how a condition is read: Verdict (one of the Verdict
// constants) and Reason, the catalog reason to diagnose ("" for healthy,
// unknown and kubelet verdicts; NodeConditionStartup, NodeConditionStale,
// NodeConditionUnmapped for those verdicts).
type ConditionVerdict struct {
	Verdict string
	Reason  string
}

// ReadCondition reads one condition at now: its polarity from the type
// table, then the vendor's reason (a monitor that lost DCGM, DCGM's IMEX
// health code on a node without IMEX), then freshness and the start-up
// grace. The kubelet's Ready is exempt from both: the node lifecycle
// controller sets Ready=Unknown exactly when the kubelet stops
// heartbeating, and NodeNotReady carries its own toleration.
func (e *Engine) ReadCondition(c ConditionReading, now time.Time) ConditionVerdict {
	rule, known := conditionTypes[c.Type]
	if !known {
		return ConditionVerdict{Verdict: VerdictUnmapped, Reason: catalog.ReasonNodeConditionUnmapped}
	}
	if rule.reason == "" && !rule.unmapped {
		return ConditionVerdict{Verdict: VerdictKubelet}
	}
	if c.Type == "Ready" {
		if c.Status == "False" || c.Status == "Unknown" {
			return ConditionVerdict{Verdict: VerdictBad, Reason: catalog.ReasonNodeNotReady}
		}
		return ConditionVerdict{Verdict: VerdictHealthy}
	}
	switch {
	case c.Status != "True" && c.Status != "False":
		return ConditionVerdict{Verdict: VerdictUnknown}
	case rule.readiness == (c.Status == "True"):
		return ConditionVerdict{Verdict: VerdictHealthy}
	}
	if rule.unmapped {
		return ConditionVerdict{Verdict: VerdictUnmapped, Reason: catalog.ReasonNodeConditionUnmapped}
	}
	reason := rule.reason
	switch {
	case monitoringReasons[c.Reason]:
		reason = catalog.ReasonMonitoringPlaneUnavailable
	case c.Reason == "DCGMHealthCode122":
		reason = catalog.ReasonDCGMHealthCheckNotApplicable
	}
	switch {
	case !c.Heartbeat.IsZero() && now.Sub(c.Heartbeat) > e.conditionStaleAfter:
		return ConditionVerdict{Verdict: VerdictStale, Reason: catalog.ReasonNodeConditionStale}
	case !c.NodeCreated.IsZero() && now.Sub(c.NodeCreated) < e.conditionStartupGrace:
		return ConditionVerdict{Verdict: VerdictStartup, Reason: catalog.ReasonNodeConditionStartup}
	}
	return ConditionVerdict{Verdict: VerdictBad, Reason: reason}
}

// ConditionBad reports whether a condition's status is its type's bad one
// by polarity alone (readiness types bad when False, others when True),
// with no freshness, grace or mapping: how an agent that acts on any bad
// condition (Karpenter's NodeRepair) sees it. The simulator's baselines use
// it.
func ConditionBad(typ, status string) bool {
	if conditionTypes[typ].readiness {
		return status == "False"
	}
	return status == "True"
}
