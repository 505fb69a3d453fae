// Package diagnose turns a node's findings into diagnoses: reason codes from
// the catalog with their severity, fault class and recommended action.
//
// It is pure: no I/O, no clock of its own (the caller passes Now), so every
// rule is table-tested in microseconds. The rules follow cases/README.md and
// cases/xid-actions.md (our summary of NVIDIA's Xid catalog):
//
//   - One incident, one diagnosis: an Xid 79, the Xid-less "fallen off the
//     bus" message, a fatal AER under that GPU and a GPU-count drop on one
//     node are one GPULost diagnosis carrying all the evidence.
//   - Condition-class signals on the same GPU are one incident, named after
//     the most disruptive (then highest-priority) reason among them. NVLink
//     faults are one node-level incident.
//   - Application-class Xids (13, 31, 43, 45, ...) are events. Xid 45 is
//     attributed to the Xid it names ("caused by previous Xid N") or, without
//     that suffix, to a condition incident on the same GPU.
//   - Xid 154 states the recovery action the driver requires; it joins the
//     incident on its GPU and can raise its action (a reboot outranks a reset).
//   - Escalation (action -> escalateTo) when the fault returns after the first
//     remedy: a second Xid 154 "changed from None" on the same GPU (the GPU was
//     reset in between), repeated GPU init attempts, or the same fault class
//     on the same GPU in an earlier boot (lemon detection, keyed by PCI
//     address; GPU serials join this once agents report them).
//   - Evidence from an earlier boot never makes the current boot unhealthy.
package diagnose

import (
	"fmt"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/fleetrepair/fleetrepair/agent/finding"
	"github.com/fleetrepair/fleetrepair/controller/catalog"
)

// Options configures an Engine.
type Options struct {
	// Catalog is the reason catalog; nil means catalog.Default().
	Catalog *catalog.Catalog
	// RepeatProcesses is how many distinct processes must hit the same
	// application-class Xid on one GPU within RepeatWindow before it becomes
	// a condition (RepeatedApplicationXid). Default 3.
	RepeatProcesses int
	// RepeatWindow is the sliding window for RepeatProcesses. Default 1h.
	RepeatWindow time.Duration
	// ConditionStartupGrace is how long after a Node's creation another
	// agent's problem condition is not acted on (NodeConditionStartup).
	// Default DefaultConditionStartupGrace.
	ConditionStartupGrace time.Duration
	// ConditionStaleAfter is how old another agent's lastHeartbeatTime may
	// be before its condition is stale, not a fault (NodeConditionStale).
	// Default DefaultConditionStaleAfter.
	ConditionStaleAfter time.Duration
	// InstanceTypes overrides and extends DefaultInstanceTypes (the policy
	// file's instanceTypes), by instance type.
	InstanceTypes map[string]InstanceType
}

// Engine applies the diagnosis rules. It is safe for concurrent use.
type Engine struct {
	cat                   *catalog.Catalog
	repeatProcesses       int
	repeatWindow          time.Duration
	conditionStartupGrace time.Duration
	conditionStaleAfter   time.Duration
	instanceTypes         map[string]InstanceType
}

// New returns an Engine. It returns an error for invalid options.
func New(o Options) (*Engine, error) {
	if o.Catalog == nil {
		o.Catalog = catalog.Default()
	}
	if o.RepeatProcesses == 0 {
		o.RepeatProcesses = 3
	}
	if o.RepeatWindow == 0 {
		o.RepeatWindow = time.Hour
	}
	if o.RepeatProcesses < 2 {
		return nil, fmt.Errorf("new diagnose engine: RepeatProcesses must be >= 2, got %d", o.RepeatProcesses)
	}
	if o.RepeatWindow < 0 {
		return nil, fmt.Errorf("new diagnose engine: RepeatWindow must be positive, got %s", o.RepeatWindow)
	}
	if o.ConditionStartupGrace == 0 {
		o.ConditionStartupGrace = DefaultConditionStartupGrace
	}
	if o.ConditionStaleAfter == 0 {
		o.ConditionStaleAfter = DefaultConditionStaleAfter
	}
	if o.ConditionStartupGrace < 0 || o.ConditionStaleAfter < 0 {
		return nil, fmt.Errorf("new diagnose engine: condition grace %s and freshness window %s must be positive", o.ConditionStartupGrace, o.ConditionStaleAfter)
	}
	types, err := mergeInstanceTypes(o.InstanceTypes)
	if err != nil {
		return nil, fmt.Errorf("new diagnose engine: %w", err)
	}
	return &Engine{cat: o.Catalog, repeatProcesses: o.RepeatProcesses, repeatWindow: o.RepeatWindow,
		conditionStartupGrace: o.ConditionStartupGrace, conditionStaleAfter: o.ConditionStaleAfter, instanceTypes: types}, nil
}

// Catalog returns the engine's reason catalog.
func (e *Engine) Catalog() *catalog.Catalog { return e.cat }

// Input is everything the rules look at for one node.
type Input struct {
	Cluster string
	Node    string
	// BootID is the node's current boot. Findings of other boots are history:
	// they only escalate. Empty means every finding is of the current boot
	// (a dmesg file scanned offline).
	BootID string
	// Findings of the node, any order, current boot and history.
	Findings []finding.Finding
	// Now is the evaluation time (the injected clock).
	Now time.Time
	// InstanceType is the node's instance type (node.kubernetes.io/
	// instance-type); it selects the expected GPU count and NVLink wiring
	// (InstanceTypes). Empty: unknown, the agent's own expectations stand.
	InstanceType string
	// NodeCreated is the Node's creation time, for the start-up grace of
	// other agents' conditions; zero: unknown, no grace.
	NodeCreated time.Time
	// SuspectSoftware are the node's driver, kernel and image cohorts
	// ("driver_version=610.57.04") whose breaker is open or remembered
	// (breaker.State.SoftwareSuspects): the fleet has found that software
	// failing. The node's application-class Xids are then attributed to it
	// (XidOnSuspectSoftware), never to the workload or the GPU (c10).
	SuspectSoftware []string
	// InventoryGPUs is how many GPUs the agent's heartbeat lists (NVML,
	// else sysfs); 0: unknown. With InstanceType known, fewer than it
	// promises is a lost GPU (inventoryFinding).
	InventoryGPUs int
	// Inventory is the heartbeat's GPU list (NVML index and PCI address):
	// findings that name a GPU by its NVML index only (DCGM's) are placed
	// on its PCI address, so they join the kernel's findings of that GPU.
	Inventory []finding.GPU
}

// Diagnosis is one incident on one node.
type Diagnosis struct {
	Cluster       string           `json:"cluster,omitempty"`
	Node          string           `json:"node"`
	BootID        string           `json:"bootID,omitempty"`
	Reason        string           `json:"reason"`
	ConditionType string           `json:"conditionType,omitempty"`
	Severity      catalog.Severity `json:"severity"`
	FaultClass    string           `json:"faultClass"`
	// Action is the recommended action, after escalation.
	Action     catalog.Action `json:"action"`
	EscalateTo catalog.Action `json:"escalateTo,omitempty"`
	// Escalated is true when Action was raised because the fault returned.
	Escalated bool   `json:"escalated,omitempty"`
	Urgency   string `json:"urgency,omitempty"`
	// RebootDeadlineSeconds bounds a reboot action (catalog rebootDeadline):
	// a graceful reboot not completed by then gives way to Fallback
	// ("power-cycle"). 0 and "" when the reason sets none.
	RebootDeadlineSeconds int64  `json:"rebootDeadlineSeconds,omitempty"`
	Fallback              string `json:"fallback,omitempty"`
	// GPUs are the PCI addresses involved, sorted; empty for node-level faults.
	GPUs []string `json:"gpus,omitempty"`
	// TolerationSeconds is how long the condition must persist before the
	// repair is executed (catalog default; policy may override).
	TolerationSeconds int64     `json:"tolerationSeconds,omitempty"`
	FirstSeen         time.Time `json:"firstSeen"`
	LastSeen          time.Time `json:"lastSeen"`
	// Count is the number of logical events behind the diagnosis.
	Count      int      `json:"count"`
	FindingIDs []string `json:"findingIDs"`
	// Evidence summarises each finding ("xid 79 on 0000:02:00.0").
	Evidence       []string `json:"evidence"`
	Message        string   `json:"message"`
	CatalogVersion string   `json:"catalogVersion"`
}

// Toleration returns TolerationSeconds as a duration.
func (d Diagnosis) Toleration() time.Duration {
	return time.Duration(d.TolerationSeconds) * time.Second
}

// signal is one finding classified into a reason.
type signal struct {
	reason     string
	gpu        string
	nodeLevel  bool           // belongs to a node-level incident (NVLink, GPU count)
	attachable bool           // joins a condition incident on its GPU when one exists
	recovery   catalog.Action // Xid 154: the action the driver requires
	f          *finding.Finding
}

// incident is a group of signals that make one Diagnosis.
type incident struct {
	key     string
	reason  catalog.Reason
	signals []signal
	gpus    map[string]bool
}

// Diagnose applies the rules to one node's findings. The result is ordered:
// condition diagnoses first (most disruptive action first, then catalog
// priority), then events. An empty result means nothing to report.
func (e *Engine) Diagnose(in Input) []Diagnosis {
	current, history := splitBoots(in)
	ctx := classifyContext{driverChanged: driverChanged(current, history) || manyGPUsFailInit(current),
		nodeCreated: in.NodeCreated, now: in.Now, pciByIndex: pciByIndex(in.Inventory), driverHangs: driverHangs(current)}
	if t, ok := e.instanceTypes[in.InstanceType]; ok {
		ctx.sku = &t
	}
	if f, ok := inventoryFinding(in, ctx.sku, current); ok {
		current = append(current, f)
	}
	sigs := e.relate(e.classifyAll(current, ctx))
	if len(in.SuspectSoftware) > 0 {
		for i := range sigs {
			if sigs[i].reason == catalog.ReasonXidApplicationError {
				sigs[i].reason = catalog.ReasonXidOnSuspectSoftware
			}
		}
	}
	incidents := e.group(sigs, in.Now)

	hist := e.historyClasses(history, ctx.sku)
	out := make([]Diagnosis, 0, len(incidents))
	for _, inc := range incidents {
		out = append(out, e.toDiagnosis(in, inc, hist))
	}
	sort.SliceStable(out, func(i, j int) bool { return less(e.cat, out[i], out[j]) })
	return out
}

// Headline returns the diagnosis that decides the node's state: the first of
// a Diagnose result, or a severity-none diagnosis when there is none.
func Headline(ds []Diagnosis) Diagnosis {
	if len(ds) == 0 {
		return Diagnosis{Severity: catalog.SeverityNone, FaultClass: "none", Action: catalog.ActionNone}
	}
	return ds[0]
}

func less(c *catalog.Catalog, a, b Diagnosis) bool {
	if a.Severity.Rank() != b.Severity.Rank() {
		return a.Severity.Rank() > b.Severity.Rank()
	}
	if a.Action.Rank() != b.Action.Rank() {
		return a.Action.Rank() > b.Action.Rank()
	}
	pa, pb := c.MustLookup(a.Reason).Priority, c.MustLookup(b.Reason).Priority
	if pa != pb {
		return pa < pb
	}
	return a.FirstSeen.Before(b.FirstSeen)
}

func splitBoots(in Input) (current, history []finding.Finding) {
	for _, f := range in.Findings {
		if in.BootID == "" || f.BootID == "" || f.BootID == in.BootID {
			current = append(current, f)
		} else {
			history = append(history, f)
		}
	}
	byTime := func(fs []finding.Finding) {
		sort.SliceStable(fs, func(i, j int) bool { return fs[i].Time.Before(fs[j].Time) })
	}
	byTime(current)
	byTime(history)
	return current, history
}

// classifyContext is what classify needs to know about the rest of the
// node's findings.
type classifyContext struct {
	// driverChanged: this boot runs another driver version than an earlier
	// one, or several GPUs fail to initialise at once (GPU init failures
	// then point at the driver, not a GPU).
	driverChanged bool
	// sku is the node's instance type expectations; nil when unknown.
	sku *InstanceType
	// nodeCreated and now time other agents' conditions (ReadCondition).
	nodeCreated, now time.Time
	// pciByIndex maps NVML device indexes to PCI addresses (Inventory).
	pciByIndex map[string]string
	// driverHangs are the reports of this boot whose stacks are in the GPU
	// driver: a lockup or stall of their CPU or task is the same hang.
	driverHangs []driverHang
}

// pciByIndex maps the inventory's NVML indexes to PCI addresses.
func pciByIndex(inv []finding.GPU) map[string]string {
	if len(inv) == 0 {
		return nil
	}
	out := make(map[string]string, len(inv))
	for _, g := range inv {
		if g.Index >= 0 && g.PCI != "" {
			out[strconv.Itoa(g.Index)] = g.PCI
		}
	}
	return out
}

// indexedGPU is the GPU of a finding that names it by NVML index only: its
// PCI address from the inventory, else "index:N" (one GPU, unplaced).
func indexedGPU(f *finding.Finding, ctx classifyContext) string {
	i := f.Attr(finding.AttrGPUIndex)
	if i == "" {
		return ""
	}
	if pci := ctx.pciByIndex[i]; pci != "" {
		return pci
	}
	return "index:" + i
}

// classify maps one finding to zero or one signal.
func (e *Engine) classify(f *finding.Finding, ctx classifyContext) (signal, bool) {
	s := signal{gpu: f.GPUPCI, f: f}
	switch f.Detector {
	case finding.DetectorDriverVersionMismatch:
		s.reason, s.nodeLevel = mismatchReason(f), true
	case finding.DetectorGSPFirmwareMissing:
		s.reason, s.nodeLevel = catalog.ReasonDriverImageDefect, true
	case finding.DetectorNVSwitchSXid:
		s.reason, s.nodeLevel = sxidReason(f), true
	case finding.DetectorFabricState:
		if s.reason = fabricStateReason(f); s.reason == "" {
			return s, false
		}
		s.nodeLevel = true
	case finding.DetectorHungTask, finding.DetectorSoftLockup, finding.DetectorRCUStall:
		s.reason, s.nodeLevel = stackReason(f, ctx.driverHangs), true
	case finding.DetectorFilesystemError:
		s.reason, s.nodeLevel = catalog.ReasonStorageVolumeError, true
		if VolumeRole(f) == "node" {
			s.reason = nodeFilesystemReason(f)
		}
	case finding.DetectorOOMKill:
		if s.reason = oomReason(f); s.reason == "" {
			return s, false
		}
		s.nodeLevel = true
	case finding.DetectorNICFirmware:
		s.reason, s.nodeLevel = catalog.ReasonNICFirmwareFault, true
	case finding.DetectorNICLink:
		s.reason = catalog.ReasonNICLinkFlap
	case finding.DetectorNCCLNetError:
		s.reason = catalog.ReasonNCCLNetworkError
	case finding.DetectorNodeTerminating:
		s.reason, s.nodeLevel = catalog.ReasonNodeTerminating, true
	case finding.DetectorXid:
		switch f.Xid {
		case 45:
			if c, err := strconv.Atoi(f.Attr(finding.AttrCausedBy)); err == nil && c != 45 {
				if r := xidReason(c); e.cat.MustLookup(r).Severity == catalog.SeverityCondition {
					s.reason = r
					s.nodeLevel = r == catalog.ReasonNVLinkError
					return s, true
				}
			}
			s.reason, s.attachable = catalog.ReasonXidApplicationError, true
		case 94:
			// Contained: only the context died, the GPU stays usable (c14);
			// it joins a memory incident on its GPU (c07). "RST: Yes" (newer
			// drivers) says the GPU needs a reset before the remap of the
			// failed row takes effect.
			s.reason, s.attachable = catalog.ReasonContainedMemoryError, true
			if f.Attr(finding.AttrResetRequired) == "true" {
				s.reason, s.attachable = catalog.ReasonRowRemapPending, false
			}
		case 154:
			a, ok := recoveryAction(f.Attr(finding.AttrRecoveryAction))
			if !ok {
				s.reason = catalog.ReasonXidInformational
				return s, true
			}
			s.reason, s.attachable, s.recovery = catalog.ReasonGPURecoveryActionRequired, true, a
		default:
			s.reason = xidReason(f.Xid)
			if f.Xid >= 144 && f.Xid <= 150 && f.Attr("fatal") == "false" {
				s.reason = catalog.ReasonXidInformational
			}
			s.nodeLevel = s.reason == catalog.ReasonNVLinkError
		}
	case finding.DetectorFallenOffBus:
		s.reason = catalog.ReasonGPULost
	case finding.DetectorGPUCount:
		if s.reason = gpuCountReason(f, ctx.sku); s.reason == "" {
			return s, false
		}
	case finding.DetectorAERFatal:
		s.reason = catalog.ReasonPCIeFatalError
	case finding.DetectorAERCorrectable, finding.DetectorAERNonFatal:
		s.reason = catalog.ReasonPCIeCorrectableErrors
	case finding.DetectorRmInitFailed:
		s.reason = catalog.ReasonGPUInitFailed
		if ctx.driverChanged {
			s.reason, s.nodeLevel = catalog.ReasonDriverInitFailedAfterChange, true
		}
	case finding.DetectorGSPError:
		s.reason = catalog.ReasonGPUFirmwareError
		s.attachable = s.gpu == ""
		if ctx.driverChanged {
			s.reason, s.nodeLevel, s.attachable = catalog.ReasonDriverInitFailedAfterChange, true, false
		}
	case finding.DetectorNVLinkInactive:
		s.reason, s.nodeLevel = catalog.ReasonNVLinkError, true
		if nvlinkGated(ctx.sku) {
			s.reason, s.nodeLevel = catalog.ReasonNVLinkNotApplicable, false
		}
	case finding.DetectorMonitoring:
		s.reason = catalog.ReasonMonitoringPlaneUnavailable
	case finding.DetectorRowRemapPending:
		s.reason = catalog.ReasonRowRemapPending
		if f.Attr("failure") == "true" || f.Attr("remap_failed") == "true" {
			s.reason = catalog.ReasonRowRemapFailure
		}
	case finding.DetectorRowRemapFailure:
		s.reason = catalog.ReasonRowRemapFailure
	case finding.DetectorRetiredPages:
		if s.reason = retiredPagesReason(f); s.reason == "" {
			return s, false
		}
	case finding.DetectorECCErrors:
		// The counter says errors happened, not what the driver did about
		// them: it joins a memory incident on its GPU, else an event.
		s.reason, s.attachable = catalog.ReasonUncorrectableECCCounted, true
	case finding.DetectorDCGMPolicy:
		if s.reason = dcgmPolicyReason(f, ctx.sku); s.reason == "" {
			return s, false
		}
		s.nodeLevel = s.reason == catalog.ReasonNVLinkError
		s.attachable = s.reason == catalog.ReasonContainedMemoryError || s.reason == catalog.ReasonXidApplicationError
		if s.gpu == "" {
			s.gpu = indexedGPU(f, ctx) // DCGM names GPUs by index
		}
	case finding.DetectorNVMLError:
		s.reason = catalog.ReasonGPULost // "GPU is lost", "Unknown Error": the handle is gone (c11, c12)
		if s.gpu == "" && driverNotLoaded(f.Attr(finding.AttrError)) {
			// No module answers at all: the driver, not one GPU.
			s.reason, s.nodeLevel = catalog.ReasonDriverNotLoaded, true
		}
	case finding.DetectorRuntimeWedge:
		s.reason, s.nodeLevel = catalog.ReasonContainerRuntimeNotReady, true
	case finding.DetectorDevicePlugin:
		s.reason, s.nodeLevel = catalog.ReasonDevicePluginError, true
		if n, err := strconv.Atoi(f.Attr("withheld_gpus")); err == nil && n > 0 {
			s.reason = catalog.ReasonDevicePluginWithheldGPU
		}
	case finding.DetectorDCGMHealth:
		if s.gpu == "" {
			s.gpu = indexedGPU(f, ctx)
		}
		s.reason = catalog.ReasonDCGMHealthWarning
		switch {
		case f.Xid != 0:
			s.reason = xidReason(f.Xid)
		case strings.Contains(strings.ToLower(f.Attr(finding.AttrSystem)), "nvlink") && nvlinkGated(ctx.sku):
			s.reason = catalog.ReasonNVLinkNotApplicable
		case f.Attr("fatal") == "true":
			s.reason = catalog.ReasonVendorAcceleratedHardwareNotReady
		}
	case finding.DetectorDCGMDiag:
		if f.Attr("result") != "fail" {
			return s, false
		}
		s.reason = catalog.ReasonDCGMDiagnosticFailed
		if f.Attr("faulty_memory_elements") != "" || strings.Contains(strings.ToLower(f.Attr("test")), "memory") {
			s.reason = catalog.ReasonGPUMemoryDiagnosticFailed
		}
		if s.gpu == "" {
			s.gpu = indexedGPU(f, ctx)
		}
	case finding.DetectorDCGMMetric:
		if f.Attr("stale") == "true" {
			return s, false // an unchanged last-value gauge is no new fact (c16)
		}
		s.reason = catalog.ReasonDCGMExporterXidHint
	case finding.DetectorNodeClaimStatus:
		if f.Attr(finding.AttrDeletionTimestamp) != "" {
			s.reason, s.nodeLevel = catalog.ReasonNodeTerminating, true
			return s, true
		}
		if f.Attr("registered") == "True" {
			if i := f.Attr("initialized"); i != "" && i != "True" {
				s.reason, s.nodeLevel = catalog.ReasonNodeClaimNotInitialized, true
				return s, true
			}
			return s, false
		}
		s.reason, s.nodeLevel = catalog.ReasonNodeClaimNotRegistered, true
	case finding.DetectorNodeCondition:
		v := e.ReadCondition(ConditionReading{Type: f.Attr("type"), Status: f.Attr("status"), Reason: f.Attr("reason"),
			Heartbeat: attrTime(f, finding.AttrHeartbeat), NodeCreated: ctx.nodeCreated}, ctx.now)
		if s.reason = v.Reason; s.reason == "" {
			return s, false
		}
		s.nodeLevel = true
		// The kubelet's NotReady joins a more specific incident of the node
		// (a runtime wedge says why it is NotReady, c28).
		s.attachable = s.reason == catalog.ReasonNodeNotReady
	default:
		// driver-version, unparsed and detectors newer than these rules carry
		// no health verdict of their own.
		return s, false
	}
	return s, true
}

func (e *Engine) classifyAll(fs []finding.Finding, ctx classifyContext) []signal {
	out := make([]signal, 0, len(fs))
	for i := range fs {
		if s, ok := e.classify(&fs[i], ctx); ok {
			out = append(out, s)
		}
	}
	return out
}

func (e *Engine) severity(reason string) catalog.Severity { return e.cat.MustLookup(reason).Severity }

// group builds incidents from signals. See the package doc for the rules.
func (e *Engine) group(sigs []signal, now time.Time) []*incident {
	byKey := map[string]*incident{}
	var order []*incident
	get := func(key string) *incident {
		if inc, ok := byKey[key]; ok {
			return inc
		}
		inc := &incident{key: key, gpus: map[string]bool{}}
		byKey[key] = inc
		order = append(order, inc)
		return inc
	}
	add := func(inc *incident, s signal) {
		inc.signals = append(inc.signals, s)
		if s.gpu != "" {
			inc.gpus[s.gpu] = true
		}
	}

	// GPUs lost from the bus: everything PCIe-fatal under them joins the loss.
	lost := map[string]bool{}
	anyLost := false
	for _, s := range sigs {
		if s.reason == catalog.ReasonGPULost {
			anyLost = true
			if s.gpu != "" {
				lost[s.gpu] = true
			}
		}
	}
	condKey := func(s signal) string {
		switch {
		case s.reason == catalog.ReasonGPULost, anyLost && s.reason == catalog.ReasonPCIeFatalError && (s.gpu == "" || lost[s.gpu]):
			return "node/gpu-lost"
		case s.nodeLevel:
			return "node/" + s.reason
		case s.gpu == "":
			return "node/" + s.reason
		}
		return "gpu/" + s.gpu
	}

	// Pass 0: the NVLink fabric. SXids of the node's NVSwitches and the GPU
	// Xids of the same second that the fabric explains (NVLink, Xid 94 and
	// 137 over NVLink) are one incident, not one per switch and GPU (c25).
	var sxidTimes []time.Time
	for _, s := range sigs {
		if s.f.Detector == finding.DetectorNVSwitchSXid {
			sxidTimes = append(sxidTimes, s.f.Time)
		}
	}
	nearSXid := func(t time.Time) bool {
		for _, st := range sxidTimes {
			if st.IsZero() && t.IsZero() || !st.IsZero() && !t.IsZero() && t.Sub(st).Abs() <= FabricWindow {
				return true
			}
		}
		return false
	}
	rest := sigs[:0:0]
	for _, s := range sigs {
		if s.f.Detector == finding.DetectorNVSwitchSXid || len(sxidTimes) > 0 && s.f.Detector == finding.DetectorXid && fabricXid(s.reason) && nearSXid(s.f.Time) {
			s.attachable = false
			add(get("node/fabric"), s)
			continue
		}
		rest = append(rest, s)
	}
	sigs = rest

	// Pass 1: condition signals that are not attachable form incidents.
	var attach, events []signal
	for _, s := range sigs {
		switch {
		case s.attachable:
			attach = append(attach, s)
		case e.severity(s.reason) == catalog.SeverityCondition:
			add(get(condKey(s)), s)
		default:
			events = append(events, s)
		}
	}
	// Repeated application-class Xids on one GPU across processes.
	repeated := e.repeatedAppXids(append(append([]signal(nil), events...), attach...), now)

	// Pass 2: attachables join a condition incident on their GPU (or the only
	// firmware incident, for GSP messages that name no PCI address).
	findHost := func(s signal) *incident {
		if s.gpu != "" {
			if inc, ok := byKey["gpu/"+s.gpu]; ok {
				return inc
			}
			for _, inc := range order {
				if inc.gpus[s.gpu] {
					return inc
				}
			}
			return nil
		}
		var host *incident
		for _, inc := range order {
			for _, m := range inc.signals {
				if e.cat.MustLookup(m.reason).FaultClass == e.cat.MustLookup(s.reason).FaultClass {
					if host != nil && host != inc {
						return nil // ambiguous
					}
					host = inc
				}
			}
		}
		return host
	}
	for _, s := range attach {
		if host := findHost(s); host != nil {
			add(host, s)
			continue
		}
		if e.severity(s.reason) == catalog.SeverityCondition {
			add(get(condKey(s)), s) // e.g. Xid 154 with no other fault on record
			continue
		}
		events = append(events, s)
	}
	for gpu, ss := range repeated {
		inc := byKey["gpu/"+gpu]
		if inc == nil {
			inc = get("gpu/" + gpu + "/repeated")
		}
		for _, s := range ss {
			s.reason = catalog.ReasonRepeatedApplicationXid
			add(inc, s)
		}
	}
	// NCCL completion errors with several peers: the node's NIC path.
	if rep := repeatedPeers(events, e.repeatProcesses, e.repeatWindow, now); len(rep) > 0 {
		inc := get("node/" + catalog.ReasonRDMANetworkDegraded)
		kept := events[:0:0]
		for _, s := range events {
			if s.reason == catalog.ReasonNCCLNetworkError {
				s.reason = catalog.ReasonRDMANetworkDegraded
				add(inc, s)
				continue
			}
			kept = append(kept, s)
		}
		events = kept
	}
	// Events: one diagnosis per reason, GPU and Xid.
	for _, s := range events {
		add(get(fmt.Sprintf("event/%s/%s/%d", s.reason, s.gpu, s.f.Xid)), s)
	}
	for _, inc := range order {
		inc.reason = e.headReason(inc)
	}
	return order
}

// repeatedAppXids returns, per GPU, the application-class Xid signals that
// repeated across at least RepeatProcesses distinct processes within
// RepeatWindow. Unknown pids ("<unknown>") do not count as distinct.
func (e *Engine) repeatedAppXids(sigs []signal, now time.Time) map[string][]signal {
	type key struct {
		gpu string
		xid int
	}
	groups := map[key][]signal{}
	for _, s := range sigs {
		// A secondary Xid (45: the driver tearing down the channels of a
		// process after another error) is a consequence, never evidence
		// that the GPU keeps failing.
		if s.reason == catalog.ReasonXidApplicationError && s.gpu != "" && !secondaryXid(s.f) {
			groups[key{s.gpu, s.f.Xid}] = append(groups[key{s.gpu, s.f.Xid}], s)
		}
	}
	out := map[string][]signal{}
	for k, ss := range groups {
		pids := map[string]bool{}
		var in []signal
		for _, s := range ss {
			t := s.f.Time
			if t.IsZero() {
				t = now
			}
			if now.Sub(t) > e.repeatWindow {
				continue
			}
			in = append(in, s)
			if p := s.f.Attr(finding.AttrPID); p != "" && p != "<unknown>" {
				pids[p] = true
			}
		}
		if len(pids) >= e.repeatProcesses {
			out[k.gpu] = append(out[k.gpu], in...)
		}
	}
	return out
}

// headReason picks the reason naming the incident: the most disruptive
// action, then the lowest catalog priority, among its non-attachable members.
func (e *Engine) headReason(inc *incident) catalog.Reason {
	var best catalog.Reason
	for _, s := range inc.signals {
		if s.attachable && len(inc.signals) > 1 && e.hasNonAttachable(inc) {
			continue
		}
		r := e.cat.MustLookup(s.reason)
		if best.Code == "" || r.Severity.Rank() > best.Severity.Rank() ||
			r.Severity == best.Severity && (r.Action.Rank() > best.Action.Rank() ||
				r.Action == best.Action && r.Priority < best.Priority) {
			best = r
		}
	}
	return best
}

func (e *Engine) hasNonAttachable(inc *incident) bool {
	for _, s := range inc.signals {
		if !s.attachable {
			return true
		}
	}
	return false
}

// historyClasses returns the fault classes of condition signals seen in
// earlier boots, keyed by GPU ("" for node-level signals).
func (e *Engine) historyClasses(history []finding.Finding, sku *InstanceType) map[string]map[string]bool {
	out := map[string]map[string]bool{}
	for _, s := range e.relate(e.classifyAll(history, classifyContext{sku: sku, driverHangs: driverHangs(history)})) {
		r := e.cat.MustLookup(s.reason)
		// A secondary Xid (45, 43: the driver tearing a channel down after
		// another error) and a hang the application's own fault caused are
		// consequences, not evidence that the GPU fails again (item 8).
		if r.Severity != catalog.SeverityCondition || secondaryXid(s.f) || s.reason == catalog.ReasonGPUHangAfterApplicationError {
			continue
		}
		g := s.gpu
		if s.nodeLevel {
			g = ""
		}
		if out[g] == nil {
			out[g] = map[string]bool{}
		}
		out[g][r.FaultClass] = true
	}
	return out
}

func (e *Engine) toDiagnosis(in Input, inc *incident, hist map[string]map[string]bool) Diagnosis {
	r := inc.reason
	d := Diagnosis{
		Cluster: in.Cluster, Node: in.Node, BootID: in.BootID,
		Reason: r.Code, Severity: r.Severity, FaultClass: r.FaultClass,
		Action: r.Action, EscalateTo: r.EscalateTo, Urgency: r.Urgency,
		CatalogVersion: e.cat.Version,
	}
	if r.Severity == catalog.SeverityCondition {
		d.ConditionType = r.ConditionType
		d.TolerationSeconds = int64(r.TolerationDuration() / time.Second)
	}
	if r.Fallback != "" && r.Action == catalog.ActionReboot {
		d.RebootDeadlineSeconds, d.Fallback = int64(r.RebootDeadlineDuration()/time.Second), r.Fallback
	}
	recoveries, initAttempts := 0, 0
	for _, s := range inc.signals {
		f := s.f
		d.FindingIDs = append(d.FindingIDs, f.ID)
		d.Evidence = append(d.Evidence, describe(*f))
		d.Count += max(f.Count, 1)
		if !f.Time.IsZero() {
			if d.FirstSeen.IsZero() || f.Time.Before(d.FirstSeen) {
				d.FirstSeen = f.Time
			}
			if f.Time.After(d.LastSeen) {
				d.LastSeen = f.Time
			}
		}
		if s.recovery != "" && s.recovery != catalog.ActionNone {
			// Only "GPU Reset Required" / "Node Reboot Required" leave the
			// GPU unusable until the action is done: a second such
			// transition means the GPU was reset and failed again (c09).
			// "Drain and Reset" / "Drain P2P" leave it usable, so a repeat
			// proves no reset (c07: evidence grows, same incident).
			if ra := f.Attr(finding.AttrRecoveryAction); ra == "gpu-reset-required" || ra == "node-reboot-required" {
				recoveries += max(f.Count, 1)
			}
			if s.recovery.Rank() > d.Action.Rank() {
				d.Action = s.recovery
			}
		}
		if s.reason == catalog.ReasonGPUInitFailed {
			initAttempts += max(f.Count, 1)
		}
	}
	for g := range inc.gpus {
		d.GPUs = append(d.GPUs, g)
	}
	sort.Strings(d.GPUs)
	if d.FirstSeen.IsZero() {
		d.FirstSeen, d.LastSeen = in.Now, in.Now
	}

	why := ""
	if r.Severity == catalog.SeverityCondition && r.EscalateTo != "" && r.EscalateTo.Rank() > d.Action.Rank() {
		switch {
		case recoveries >= 2:
			why = fmt.Sprintf("the driver required a GPU reset or reboot %d times: the fault returned after the GPU was reset", recoveries)
		case r.Code == catalog.ReasonGPUInitFailed && initAttempts >= 2:
			why = fmt.Sprintf("GPU initialisation failed %d times", initAttempts)
		case r.Code == catalog.ReasonGPUHangAfterApplicationError:
			// The application wedged the GPU; an earlier boot's hang is no
			// proof that this GPU fails (only the driver's second reset
			// request above is).
		default:
			keys := d.GPUs
			if nodeLevelKey(inc.key) {
				keys = append([]string{""}, keys...)
			}
			for _, g := range keys {
				if hist[g][r.FaultClass] {
					why = fmt.Sprintf("the same %s fault was seen on %s in an earlier boot", r.FaultClass, orNode(g))
					break
				}
			}
		}
		if why != "" {
			d.Action, d.Escalated = r.EscalateTo, true
		}
	}
	if r.Code == catalog.ReasonNVLinkError && partialNVLink(inc) {
		// Some links of one GPU down: single-GPU work still runs, so the
		// reboot waits for the next drain window (c13); all links down or
		// channels torn down by an NVLink error stay immediate (c04).
		d.Urgency = "drain-window"
	}
	d.Message = fmt.Sprintf("%s: %s", r.Code, r.Description)
	if r.Code == catalog.ReasonXidOnSuspectSoftware {
		d.Message += " Suspect: " + strings.Join(in.SuspectSoftware, ", ") + "."
	}
	if why != "" {
		d.Message += " Escalated to " + string(d.Action) + ": " + why + "."
	}
	return d
}

// partialNVLink reports whether an NVLink incident rests only on links
// reported inactive on some, not all, links.
func partialNVLink(inc *incident) bool {
	for _, sg := range inc.signals {
		if sg.f.Detector != finding.DetectorNVLinkInactive || sg.f.Attr(finding.AttrScope) == "all-links" {
			return false
		}
	}
	return len(inc.signals) > 0
}

// nodeLevelKey reports whether an incident key is node-level.
func nodeLevelKey(key string) bool { return len(key) > 5 && key[:5] == "node/" }

func orNode(g string) string {
	if g == "" {
		return "this node"
	}
	return "GPU " + g
}

// describe summarises a finding for Diagnosis.Evidence.
func describe(f finding.Finding) string {
	s := f.Detector
	if f.Xid != 0 {
		s += " " + strconv.Itoa(f.Xid)
	}
	if f.GPUPCI != "" {
		s += " on " + f.GPUPCI
	}
	if f.DevicePCI != "" {
		s += " via " + f.DevicePCI
	}
	if f.Detector == finding.DetectorNodeCondition {
		s += " " + f.Attr("type") + "=" + f.Attr("status")
		if r := f.Attr("reason"); r != "" {
			s += " (" + r + ")"
		}
	}
	if f.Count > 1 {
		s += " x" + strconv.Itoa(f.Count)
	}
	return s
}
