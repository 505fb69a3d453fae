// Package finding is the wire contract between the node agent and the
// controller: what an agent observed (a Finding), what state its monitors are
// in (a MonitorState) and the envelope both travel in (a Report).
//
// Findings state facts, never actions: "Xid 79 on 0000:3b:00.0 at 12:00:01",
// not "replace this node". Only the controller maps facts to a diagnosis
// (docs/design.md, decision 1). This package uses the standard library only, so the
// agent binary stays small.
package finding

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// SchemaVersion is the version of the Report envelope and of the finding
// vocabulary (detector names and attribute keys) this package speaks. The
// controller rejects a Report whose SchemaVersion it does not know with a 400
// naming the versions it accepts.
const SchemaVersion = "fleetrepair.dev/v1"

// Detector names. A detector is the agent-side rule that produced a Finding;
// the list mirrors the "Detectors used so far" table of the case corpus.
const (
	DetectorXid             = "xid"               // an "NVRM: Xid" line, any driver format
	DetectorFallenOffBus    = "fallen-off-bus"    // the driver's off-the-bus message without an Xid number
	DetectorGPUCount        = "gpu-count"         // fewer GPUs than expected (attr "missing")
	DetectorRmInitFailed    = "rminit-failed"     // the driver failed to initialise a GPU
	DetectorGSPError        = "gsp-error"         // GSP / PMU firmware messages without an Xid number
	DetectorAERFatal        = "aer-fatal"         // PCIe AER uncorrected (fatal) error
	DetectorAERNonFatal     = "aer-nonfatal"      // PCIe AER uncorrected (non-fatal) error
	DetectorAERCorrectable  = "aer-correctable"   // PCIe AER corrected error
	DetectorDriverVersion   = "driver-version"    // driver version from the load banner (attr "value")
	DetectorNVLinkInactive  = "nvlink-inactive"   // NVLinks reported inactive
	DetectorMonitoring      = "monitoring-plane"  // the agent cannot reach its own data sources
	DetectorUnparsed        = "unparsed"          // a kernel record the parser could not read (kept, counted)
	DetectorNodeCondition   = "node-condition"    // a NodeCondition set by another agent (attrs type, status, reason)
	DetectorRowRemapPending = "row-remap-pending" // NVML / nvidia-smi: remapped rows waiting for a GPU reset
	DetectorRowRemapFailure = "row-remap-failure" // NVML / nvidia-smi: row remapping failed
	DetectorNVMLError       = "nvml-error"        // NVML cannot reach a GPU ("GPU is lost", "Unknown Error")
	DetectorRuntimeWedge    = "runtime-wedge"     // container runtime or kubelet stuck (PLEG, unkillable container)
	DetectorDevicePlugin    = "device-plugin"     // device plugin errors, or GPUs withheld from allocatable
	DetectorDCGMHealth      = "dcgm-health"       // a DCGM health-watch event
	DetectorDCGMDiag        = "dcgm-diag"         // a dcgmi diag result
	DetectorDCGMMetric      = "dcgm-metric"       // a dcgm-exporter sample
	DetectorNodeClaimStatus = "nodeclaim-status"  // a Karpenter NodeClaim's status conditions
	DetectorKarpenterEvent  = "karpenter-event"   // a Karpenter Event (NodeRepairBlocked, ...)
	DetectorDCGMPolicy      = "dcgm-policy"       // a DCGM policy violation pushed by the host engine (attr condition; xid for the Xid policy)
	DetectorRetiredPages    = "retired-pages"     // NVML: pages retired, or a retirement pending (GPUs without row remapping)
	DetectorECCErrors       = "ecc-errors"        // NVML: volatile uncorrectable ECC errors counted since the last driver load

	// Software, OS, fabric and NIC detectors (catalog 1.1.0). A controller
	// that predates one of them records its findings and ignores them.
	DetectorDriverVersionMismatch = "driver-version-mismatch" // kernel module and user-space driver differ (NVML "Driver/library version mismatch", NVRM "API mismatch")
	DetectorGSPFirmwareMissing    = "gsp-firmware-missing"    // the driver cannot load its GSP firmware file (attr firmware)
	DetectorNVSwitchSXid          = "nvswitch-sxid"           // an SXid line of the nvidia-nvswitch driver; DevicePCI is the switch (attrs sxid, severity, link, error)
	DetectorFabricState           = "fabric-state"            // Fabric Manager / NVML fabric state of a GPU (attrs state, status)
	DetectorHungTask              = "hung-task"               // the kernel's hung-task report (attrs task, pid, state, blocked_for, module)
	DetectorSoftLockup            = "soft-lockup"             // watchdog soft or hard lockup of a CPU (attrs cpu, stuck_for, task)
	DetectorRCUStall              = "rcu-stall"               // an RCU CPU stall warning
	DetectorFilesystemError       = "filesystem-error"        // filesystem shutdown, error or read-only remount (attrs fs, device, mount, kind)
	DetectorOOMKill               = "oom-kill"                // the kernel OOM killer killed a process (attrs process, pid, constraint)
	DetectorNICFirmware           = "nic-firmware"            // mlx5 / EFA NIC firmware or health failure; DevicePCI is the NIC
	DetectorNICLink               = "nic-link"                // a NIC port's link went down (attrs interface, state)
	DetectorNCCLNetError          = "nccl-net-error"          // an NCCL NET/IB completion error in a job log (attrs status, vendor_err, peer, host, hca, local_gids, remote_gids)
	DetectorNodeTerminating       = "node-terminating"        // a Node that carries a deletionTimestamp (controller side)
)

// Well-known attribute keys of Finding.Attrs. Values are strings on the wire.
const (
	AttrCausedBy       = "caused_by"       // Xid 45: the Xid number named in "caused by previous Xid N"
	AttrRecoveryAction = "recovery_action" // Xid 154: none|gpu-reset-required|node-reboot-required|drain-p2p|drain-and-reset
	AttrPID            = "pid"             // process id from an Xid line, when known
	AttrProcess        = "process"         // process name from an Xid line, when known
	AttrSecondary      = "secondary"       // "true" when the Xid is a consequence of another (Xid 45)
	AttrError          = "error"           // AER: the first error name (e.g. "Surprise Down Error")
	AttrErrors         = "errors"          // AER: all error names, comma separated
	AttrRecovery       = "recovery"        // AER: "failed" when the kernel reports recovery failed
	AttrMissing        = "missing"         // gpu-count: number of GPUs missing
	AttrValue          = "value"           // driver-version: the version string
	AttrPCIID          = "pci_id"          // vendor:device id, e.g. "10de:26b5"
	AttrMessage        = "message"         // gsp-error: the condensed message
	AttrGPUIndex       = "gpu_index"       // gsp-error: the driver-internal GPU index
	AttrErrorCode      = "error_code"      // rminit-failed: e.g. "0x24:0x72:1568"
	AttrScope          = "scope"           // nvlink-inactive: "all-links" or a link list
	AttrLines          = "lines"           // number of physical lines grouped into this finding
	AttrEngine         = "engine"          // Xid MMU fault: the faulting engine (e.g. "GRAPHICS")
	AttrFault          = "fault"           // Xid MMU fault: the fault type (e.g. "FAULT_PDE ACCESS_TYPE_VIRT_READ")

	AttrComponent         = "component"              // monitoring-plane, runtime-wedge: the part affected (dcgm, nvml, containerd, kubelet, kubelet-pleg)
	AttrCause             = "cause"                  // runtime-wedge: what was observed to hang
	AttrGPUUUID           = "gpu_uuid"               // the GPU's UUID (GPU-...), when the source names it
	AttrModel             = "model"                  // the GPU's product name, as the source prints it
	AttrFatal             = "fatal"                  // "true" when the source marks the event fatal
	AttrUncorrectableRows = "uncorrectable_rows"     // row remapping: rows remapped for uncorrectable errors
	AttrCorrectableRows   = "correctable_rows"       // row remapping: rows remapped for correctable errors
	AttrPending           = "pending"                // row remapping, page retirement: "true" while a GPU reset is needed
	AttrSBEPages          = "sbe_pages"              // retired-pages: pages retired for single-bit errors
	AttrDBEPages          = "dbe_pages"              // retired-pages: pages retired for double-bit errors
	AttrUncorrectable     = "uncorrectable"          // ecc-errors: volatile uncorrectable ECC error count
	AttrLinks             = "links"                  // nvlink-inactive: inactive link numbers, comma separated
	AttrLinkSpeed         = "active_link_speed_gbps" // nvlink-inactive: speed of the GPU's active links in GB/s, as printed
	AttrTest              = "test"                   // dcgm-diag: the test name ("Diagnostic", "PCIe", ...)
	AttrResult            = "result"                 // dcgm-diag: pass|fail|warn|skip
	AttrFaultyMemory      = "faulty_memory_elements" // dcgm-diag: faulty memory elements the memory test found
	AttrMetric            = "metric"                 // dcgm-metric: the metric name
	AttrWindowMS          = "window_ms"              // dcgm-metric: the exporter's counting window in milliseconds
	AttrCondition         = "condition"              // dcgm-policy: DCGM's policy condition name ("XID Error", ...)
	AttrSystem            = "system"                 // dcgm-health: the DCGM health watch system (mem, pcie, nvlink, ...)
	AttrNVMLIndex         = "nvml_index"             // device-plugin: the NVML device index named in the error
	AttrWithheldGPUs      = "withheld_gpus"          // device-plugin: GPUs in capacity but not allocatable
	AttrResource          = "resource"               // device-plugin withheld: the extended resource (nvidia.com/gpu)
	AttrCapacity          = "capacity"               // device-plugin withheld: the Node's capacity of it
	AttrAllocatable       = "allocatable"            // device-plugin withheld: the Node's allocatable count of it
	AttrLastSeenActiveMax = "last_seen_active_max"   // runtime-wedge kubelet-pleg: longest "last seen active" duration
	AttrThreshold         = "threshold"              // runtime-wedge kubelet-pleg: the kubelet's threshold
	AttrExpected          = "expected"               // gpu-count: GPUs expected on the node
	AttrFound             = "found"                  // gpu-count: GPUs found
	AttrCounter           = "counter"                // aer-*: the sysfs AER counter name, for counter-based findings

	AttrNVMLLibraryVersion = "nvml_library_version" // driver-version-mismatch: the user-space NVML library version, when printed
	AttrModuleVersion      = "module_version"       // driver-version-mismatch: the loaded kernel module's version, when known
	AttrClientVersion      = "client_version"       // driver-version-mismatch: the user-space client's version (NVRM API mismatch)
	AttrSource             = "source"               // driver-version-mismatch: the tool that hit it (nvidia-smi, nvidia-container-cli, nvml, kernel)
	AttrFirmware           = "firmware"             // gsp-firmware-missing: the firmware file the driver asked for
	AttrSXid               = "sxid"                 // nvswitch-sxid: the SXid number
	AttrSeverity           = "severity"             // nvswitch-sxid: fatal|non-fatal, from the event's summary line
	AttrLink               = "link"                 // nvswitch-sxid: the switch port (link) number
	AttrContained          = "contained"            // Xid 94/95 (new format): the unit the error was contained to (SM, ...)
	AttrResetRequired      = "reset_required"       // Xid 94/95 (new format): "RST: Yes|No" as true|false
	AttrTask               = "task"                 // hung-task, soft-lockup: the task's command name
	AttrState              = "state"                // hung-task: the task's scheduler state (D); fabric-state: the fabric state
	AttrBlockedFor         = "blocked_for"          // hung-task: the kernel's threshold the task exceeded ("120s")
	AttrModule             = "module"               // hung-task: kernel module of the innermost reliable stack frame with one
	AttrModules            = "modules"              // hung-task: every kernel module on the stack, comma separated, innermost first
	AttrCPU                = "cpu"                  // soft-lockup: the CPU number; rcu-stall: the stalled CPUs, comma-separated
	AttrStuckFor           = "stuck_for"            // soft-lockup: how long the CPU was stuck ("22s")
	AttrFS                 = "fs"                   // filesystem-error: xfs, ext4, btrfs
	AttrDevice             = "device"               // filesystem-error: the block device (nvme0n1p1, dm-0)
	AttrMount              = "mount"                // filesystem-error: the mount point, when the agent knows it
	AttrVolumeRole         = "volume_role"          // filesystem-error: root|ephemeral|data, when the agent knows it
	AttrKind               = "kind"                 // filesystem-error: shutdown|error|read-only; nic-firmware: the failure kind
	AttrConstraint         = "constraint"           // oom-kill: CONSTRAINT_NONE (global) or CONSTRAINT_MEMCG (a cgroup limit)
	AttrInterface          = "interface"            // nic-link: the network interface name
	AttrStatus             = "status"               // nccl-net-error: the ibverbs completion status number
	AttrVendorErr          = "vendor_err"           // nccl-net-error: the HCA vendor error number
	AttrPeer               = "peer"                 // nccl-net-error: the peer's address (no port)
	AttrHost               = "host"                 // nccl-net-error: the reporting host as NCCL prints it
	AttrHCA                = "hca"                  // nccl-net-error: the local HCA (mlx5_26), newer NCCL only
	AttrLocalGIDs          = "local_gids"           // nccl-net-error: local GIDs, comma separated, first seen first
	AttrRemoteGIDs         = "remote_gids"          // nccl-net-error: remote GIDs, comma separated, first seen first
	AttrDeletionTimestamp  = "deletion_timestamp"   // node-terminating, nodeclaim-status: RFC 3339
	AttrFinalizers         = "finalizers"           // nodeclaim-status: finalizers, comma separated
	AttrHeartbeat          = "last_heartbeat"       // node-condition: the condition's lastHeartbeatTime, RFC 3339 (absent: the agent sets none)
)

// Finding is one fact observed on one node. Its ID is an idempotency key: the
// agent may send the same Finding more than once (at-least-once delivery) and
// the controller stores it once.
type Finding struct {
	// ID is stable for the same observation: see NewID.
	ID string `json:"id"`
	// Detector names the agent-side rule that produced the Finding (Detector* constants).
	Detector string `json:"detector"`
	// Node is the Kubernetes Node name the agent runs on.
	Node string `json:"node,omitempty"`
	// BootID is the kernel boot ID (/proc/sys/kernel/random/boot_id) the
	// observation belongs to; evidence from an earlier boot does not keep a
	// rebooted node unhealthy.
	BootID string `json:"bootID,omitempty"`
	// Time is when the fault happened, from the kernel record's timestamp when
	// it has one, else when the agent read it. Zero when unknown (dmesg -H deltas).
	Time time.Time `json:"time,omitzero"`
	// GPUPCI is the PCI address of the affected GPU, normalised to
	// "0000:bb:dd.f" lower case; empty when the fact is not about one GPU.
	GPUPCI string `json:"gpuPCI,omitempty"`
	// DevicePCI is the PCI address of the reporting device when it is not the
	// GPU itself (an AER root port above the GPU).
	DevicePCI string `json:"devicePCI,omitempty"`
	// Xid is the NVIDIA Xid number (detector "xid"); 0 otherwise.
	Xid int `json:"xid,omitempty"`
	// Count is the number of logical events grouped into this Finding (>= 1).
	Count int `json:"count"`
	// Attrs holds detector-specific facts (Attr* keys).
	Attrs map[string]string `json:"attrs,omitempty"`
	// Evidence holds the raw kernel lines (or tool output) the Finding was read
	// from, unchanged.
	Evidence []string `json:"evidence,omitempty"`
	// Seq is the /dev/kmsg sequence number of the first record, 0 when unknown.
	Seq uint64 `json:"seq,omitempty"`
}

// NewID returns the idempotency key of a Finding: a hex SHA-256 over the node,
// boot ID, detector, kernel sequence number (or time) and the first raw line.
// The same record read twice, or resent after an agent restart, gets the same
// ID; two different records never share one.
func NewID(f Finding) string {
	h := sha256.New()
	first := ""
	if len(f.Evidence) > 0 {
		first = f.Evidence[0]
	}
	for _, s := range []string{f.Node, f.BootID, f.Detector, f.GPUPCI, strconv.Itoa(f.Xid),
		strconv.FormatUint(f.Seq, 10), f.Time.UTC().Format(time.RFC3339Nano), first} {
		h.Write([]byte(s))
		h.Write([]byte{0})
	}
	return hex.EncodeToString(h.Sum(nil))[:32]
}

// Attr returns the attribute k, or "" when it is absent.
func (f Finding) Attr(k string) string { return f.Attrs[k] }

// Monitor states (docs/design.md, decision 2). Never repair on Unknown.
const (
	StateOK      = "ok"      // the monitor observed the hardware and it is healthy
	StateFailing = "failing" // the monitor observed a fault
	StateUnknown = "unknown" // the monitor could not tell (source unreachable, probe timed out)
	StateAbsent  = "absent"  // not applicable (no GPU, monitor disabled)
)

// MonitorState is the state of one agent monitor in a heartbeat.
type MonitorState struct {
	Name   string    `json:"name"`
	State  string    `json:"state"`
	Since  time.Time `json:"since"`
	Reason string    `json:"reason,omitempty"`
}

// Heartbeat carries what the controller needs beyond findings: monitor
// states and inventory facts used for cohorts and lemon tracking.
type Heartbeat struct {
	Monitors      []MonitorState `json:"monitors,omitempty"`
	DriverVersion string         `json:"driverVersion,omitempty"`
	KernelVersion string         `json:"kernelVersion,omitempty"`
	// ModuleVersion is the loaded NVIDIA kernel module's version
	// (/proc/driver/nvidia/version, "NVRM version: ... Kernel Module  X").
	// Empty when unknown. Added in catalog 1.1.0; older controllers ignore it.
	ModuleVersion string `json:"moduleVersion,omitempty"`
	// LibraryVersion is the user-space driver library's version
	// (nvmlSystemGetDriverVersion, or the libnvidia-ml.so.X file name).
	// It differs from ModuleVersion after a user-space upgrade under a loaded
	// module: a driver-version-mismatch. Empty when unknown.
	LibraryVersion string `json:"libraryVersion,omitempty"`
	// Image is the node image (AMI id, OS image name) when the agent knows
	// it, for cohorts by image.
	Image    string `json:"image,omitempty"`
	GPUCount int    `json:"gpuCount,omitempty"`
	// Lost is the number of kernel records the agent knows it missed
	// (/dev/kmsg EPIPE gaps) since it started.
	LostRecords uint64 `json:"lostRecords,omitempty"`
	// GPUs is the GPU inventory as NVML (or sysfs, without NVML) reports it,
	// ordered by PCI address: the controller needs models and serials for
	// cohorts and lemon tracking. The boot ID travels in Report.BootID.
	GPUs []GPU `json:"gpus,omitempty"`
}

// GPU is one GPU of a node's inventory. Fields the source cannot tell are
// empty (sysfs knows the PCI address and device id only).
type GPU struct {
	// Index is NVML's device index; -1 when unknown.
	Index  int    `json:"index"`
	PCI    string `json:"pci"` // normalised "0000:bb:dd.f"
	UUID   string `json:"uuid,omitempty"`
	Serial string `json:"serial,omitempty"`
	Model  string `json:"model,omitempty"` // product name, e.g. "NVIDIA H100 80GB HBM3"
	PCIID  string `json:"pciID,omitempty"` // vendor:device, e.g. "10de:2330"
}

// Report is the envelope an agent POSTs to the controller
// (POST /api/v1/reports, Content-Type application/json).
type Report struct {
	// SchemaVersion must be SchemaVersion.
	SchemaVersion string `json:"schemaVersion"`
	// Cluster is the name the controller knows the agent's cluster by.
	Cluster string `json:"cluster"`
	// Node is the reporting node; every Finding must be for this node.
	Node         string     `json:"node"`
	BootID       string     `json:"bootID"`
	AgentVersion string     `json:"agentVersion,omitempty"`
	SentAt       time.Time  `json:"sentAt"`
	Findings     []Finding  `json:"findings"`
	Heartbeat    *Heartbeat `json:"heartbeat,omitempty"`
}

// MaxFindingsPerReport bounds one Report, so one request cannot exhaust the
// controller's memory.
const MaxFindingsPerReport = 1000

// Bounds of a Report's fields, checked by Validate.
const (
	MaxNameLength     = 253 // cluster and node names (a DNS subdomain)
	MaxDetectorLength = 64  // detector names
	// MaxXid is the largest Xid number on the wire: the driver prints the
	// number in decimal and the agent's parser (agent/detect/xid.go) reads at
	// most five digits, so both sides share 1..99999. NVIDIA's catalog
	// stays far below; the headroom keeps an unknown new Xid a finding the
	// controller stores (and diagnoses as unknown), never a refused report.
	MaxXid   = 99999
	MaxCount = 1<<31 - 1 // counts fit PostgreSQL's integer
	// MaxSXid is the largest NVSwitch SXid number a parser accepts: the
	// catalogue's numbers have five digits (11001..24007); six leave room
	// for new ones.
	MaxSXid = 999999
	// MaxLink is the largest NVLink / NVSwitch port number a parser
	// accepts: a switch has at most 64 ports today; 255 leaves headroom.
	MaxLink = 255
)

// ErrOutOfRange is returned (wrapped) by ParseNumber for a number outside
// its field's range or too long to represent.
var ErrOutOfRange = errors.New("number out of range")

// ParseNumber reads the decimal number s (digits only, no sign) of the
// field named field (used in the error: "xid", "sxid", "link") and checks
// it lies in lo..hi. Parsers call it for every number they keep, so that an
// oversized number is rejected with a reason instead of being truncated to
// the digits a pattern happened to capture. Errors: a malformed number, or
// one outside lo..hi (ErrOutOfRange, wrapped), e.g.
// `parse xid "99999999999999999999": not in 1..99999: number out of range`.
func ParseNumber(field, s string, lo, hi int) (int, error) {
	if s == "" {
		return 0, fmt.Errorf("parse %s: empty number", field)
	}
	for _, c := range s {
		if c < '0' || c > '9' {
			return 0, fmt.Errorf("parse %s %q: not a decimal number", field, s)
		}
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil || n < int64(lo) || n > int64(hi) {
		return 0, fmt.Errorf("parse %s %q: not in %d..%d: %w", field, s, lo, hi, ErrOutOfRange)
	}
	return int(n), nil
}

// Sanitize makes every string of the report storable and safe to print
// without losing information: NUL bytes, which PostgreSQL text and jsonb
// cannot hold, and the other control bytes (C0 but tab and newline, and
// DEL: a carriage return or an ESC sequence rewrites an operator's terminal
// line) become the kernel's own escape `\xNN` (/dev/kmsg escapes them so; a
// line read from a text file, a driver or model string read from a broken
// GPU may carry them raw). It covers every string field, heartbeat
// included (TestSanitizeCoversEveryString walks the types). Call it before
// Validate.
func (r *Report) Sanitize() {
	r.SchemaVersion, r.Cluster, r.Node = escapeControl(r.SchemaVersion), escapeControl(r.Cluster), escapeControl(r.Node)
	r.BootID, r.AgentVersion = escapeControl(r.BootID), escapeControl(r.AgentVersion)
	for i := range r.Findings {
		f := &r.Findings[i]
		f.ID, f.Node, f.BootID, f.Detector = escapeControl(f.ID), escapeControl(f.Node), escapeControl(f.BootID), escapeControl(f.Detector)
		f.GPUPCI, f.DevicePCI = escapeControl(f.GPUPCI), escapeControl(f.DevicePCI)
		for j, e := range f.Evidence {
			f.Evidence[j] = escapeControl(e)
		}
		f.Attrs = escapeMap(f.Attrs)
	}
	if hb := r.Heartbeat; hb != nil {
		hb.DriverVersion, hb.KernelVersion = escapeControl(hb.DriverVersion), escapeControl(hb.KernelVersion)
		hb.ModuleVersion, hb.LibraryVersion, hb.Image = escapeControl(hb.ModuleVersion), escapeControl(hb.LibraryVersion), escapeControl(hb.Image)
		for i := range hb.Monitors {
			m := &hb.Monitors[i]
			m.Name, m.State, m.Reason = escapeControl(m.Name), escapeControl(m.State), escapeControl(m.Reason)
		}
		for i := range hb.GPUs {
			g := &hb.GPUs[i]
			g.PCI, g.UUID, g.Serial, g.Model, g.PCIID = escapeControl(g.PCI), escapeControl(g.UUID), escapeControl(g.Serial), escapeControl(g.Model), escapeControl(g.PCIID)
		}
	}
}

func escapeMap(m map[string]string) map[string]string {
	dirty := false
	for k, v := range m {
		if hasControl(k) || hasControl(v) {
			dirty = true
			break
		}
	}
	if !dirty {
		return m
	}
	out := make(map[string]string, len(m))
	for k, v := range m {
		out[escapeControl(k)] = escapeControl(v)
	}
	return out
}

// isControl reports whether Sanitize escapes byte c: C0 controls but tab
// and newline, and DEL.
func isControl(c byte) bool { return (c < 0x20 && c != '\t' && c != '\n') || c == 0x7f }

func hasControl(s string) bool {
	for i := 0; i < len(s); i++ {
		if isControl(s[i]) {
			return true
		}
	}
	return false
}

// escapeControl replaces each control byte (isControl) with the four
// characters \xNN, as the kernel escapes them in /dev/kmsg; a string
// without one is returned as is.
func escapeControl(s string) string {
	if !hasControl(s) {
		return s
	}
	const hex = "0123456789abcdef"
	var b strings.Builder
	b.Grow(len(s) + 8)
	for i := 0; i < len(s); i++ {
		c := s[i]
		if isControl(c) {
			b.WriteString(`\x`)
			b.WriteByte(hex[c>>4])
			b.WriteByte(hex[c&0xf])
			continue
		}
		b.WriteByte(c)
	}
	return b.String()
}

// ValidationError lists every problem found in a Report, one message per field
// (for example "findings[3].detector: required").
type ValidationError struct {
	Problems []string
}

func (e *ValidationError) Error() string {
	return "invalid report: " + strings.Join(e.Problems, "; ")
}

// Validate checks a Report before anything of it is stored. It returns a
// *ValidationError listing every problem, or nil.
func (r *Report) Validate() error {
	var p []string
	if r.SchemaVersion != SchemaVersion {
		p = append(p, fmt.Sprintf("schemaVersion: %q is not supported (supported: %q)", r.SchemaVersion, SchemaVersion))
	}
	if err := CheckName(r.Cluster); err != nil {
		p = append(p, "cluster: "+err.Error())
	}
	if err := CheckName(r.Node); err != nil {
		p = append(p, "node: "+err.Error())
	}
	if r.BootID == "" {
		p = append(p, "bootID: required (the agent reads /proc/sys/kernel/random/boot_id)")
	}
	seen := make(map[string]int, len(r.Findings))
	if len(r.Findings) > MaxFindingsPerReport {
		p = append(p, fmt.Sprintf("findings: %d findings exceed the limit of %d per report", len(r.Findings), MaxFindingsPerReport))
	}
	for i, f := range r.Findings {
		at := fmt.Sprintf("findings[%d]", i)
		if f.ID == "" {
			p = append(p, at+".id: required")
		} else if len(f.ID) > 128 {
			p = append(p, at+".id: longer than 128 characters")
		} else if j, dup := seen[f.ID]; dup {
			p = append(p, fmt.Sprintf("%s.id: %q repeats findings[%d].id (IDs are idempotency keys)", at, f.ID, j))
		} else {
			seen[f.ID] = i
		}
		if f.Detector == "" {
			p = append(p, at+".detector: required")
		} else if len(f.Detector) > MaxDetectorLength {
			p = append(p, fmt.Sprintf("%s.detector: longer than %d characters", at, MaxDetectorLength))
		}
		for _, pci := range []struct{ name, v string }{{"gpuPCI", f.GPUPCI}, {"devicePCI", f.DevicePCI}} {
			if pci.v == "" {
				continue
			}
			if n, err := NormalizePCI(pci.v); err != nil || n != pci.v {
				p = append(p, fmt.Sprintf("%s.%s: %q is not a PCI address in the form 0000:3b:00.0", at, pci.name, pci.v))
			}
		}
		if f.Count > MaxCount {
			p = append(p, fmt.Sprintf("%s.count: larger than %d", at, MaxCount))
		}
		if f.Xid > MaxXid {
			p = append(p, fmt.Sprintf("%s.xid: %d is not an Xid number", at, f.Xid))
		}
		if f.Node != "" && f.Node != r.Node {
			p = append(p, fmt.Sprintf("%s.node: %q differs from the report's node %q (an agent reports only for its own node)", at, f.Node, r.Node))
		}
		if f.Count < 1 {
			p = append(p, at+".count: must be >= 1")
		}
		if f.Xid < 0 {
			p = append(p, at+".xid: must be >= 0")
		}
		if f.Detector == DetectorXid && f.Xid == 0 {
			p = append(p, at+".xid: required for detector \"xid\"")
		}
	}
	if r.Heartbeat != nil {
		for i, m := range r.Heartbeat.Monitors {
			switch m.State {
			case StateOK, StateFailing, StateUnknown, StateAbsent:
			default:
				p = append(p, fmt.Sprintf("heartbeat.monitors[%d].state: %q is not one of ok, failing, unknown, absent", i, m.State))
			}
		}
	}
	if len(p) > 0 {
		return &ValidationError{Problems: p}
	}
	return nil
}

// CheckName checks a cluster or node name as Kubernetes checks a Node's name:
// a DNS subdomain (RFC 1123) of at most MaxNameLength characters, lower-case
// alphanumeric labels of at most 63 characters, '-' inside a label, labels
// joined by single dots. So a name carrying control bytes, bidirectional
// overrides, "..", "/" or markup is refused before anything is stored. The
// error says which rule failed; it quotes the name escaped (%q).
func CheckName(name string) error {
	switch {
	case name == "":
		return errors.New("required")
	case len(name) > MaxNameLength:
		return fmt.Errorf("longer than %d characters", MaxNameLength)
	}
	for _, label := range strings.Split(name, ".") {
		if label == "" {
			return fmt.Errorf("%q is not a Kubernetes node name: empty label (leading, trailing or double dot)", name)
		}
		if len(label) > 63 {
			return fmt.Errorf("%q is not a Kubernetes node name: label %q is longer than 63 characters", name, label)
		}
		for i := 0; i < len(label); i++ {
			c := label[i]
			alnum := c >= 'a' && c <= 'z' || c >= '0' && c <= '9'
			if !alnum && (c != '-' || i == 0 || i == len(label)-1) {
				return fmt.Errorf("%q is not a Kubernetes node name (RFC 1123 subdomain: lower-case letters, digits, '-' inside labels, '.' between them)", name)
			}
		}
	}
	return nil
}

// ErrNotPCI is returned by NormalizePCI for a string that is not a PCI address.
var ErrNotPCI = errors.New("not a PCI address")

// NormalizePCI turns the PCI address spellings found in NVIDIA driver and
// kernel messages into the canonical "dddd:bb:dd.f" lower-case form:
// "0000:3b:00" -> "0000:3b:00.0", "PCI:0000:3B:00" -> "0000:3b:00.0",
// "3b:00.0" -> "0000:3b:00.0", "00000000:3b:00.0" (nvidia-smi) -> "0000:3b:00.0".
func NormalizePCI(s string) (string, error) {
	s = strings.ToLower(strings.TrimSpace(s))
	s = strings.TrimPrefix(s, "pci:")
	fn := "0"
	if i := strings.LastIndexByte(s, '.'); i >= 0 {
		fn = s[i+1:]
		s = s[:i]
	}
	parts := strings.Split(s, ":")
	switch len(parts) {
	case 2:
		parts = append([]string{"0000"}, parts...)
	case 3:
	default:
		return "", fmt.Errorf("normalize %q: %w", s, ErrNotPCI)
	}
	dom := parts[0]
	if len(dom) == 8 && strings.HasPrefix(dom, "0000") { // nvidia-smi prints an 8-digit domain
		dom = dom[4:]
	}
	if len(dom) != 4 || len(parts[1]) != 2 || len(parts[2]) != 2 || len(fn) != 1 ||
		!isHex(dom+parts[1]+parts[2]) || fn[0] < '0' || fn[0] > '7' {
		return "", fmt.Errorf("normalize %q: %w", s, ErrNotPCI)
	}
	return dom + ":" + parts[1] + ":" + parts[2] + "." + fn, nil
}

func isHex(s string) bool {
	for _, c := range s {
		if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f') {
			return false
		}
	}
	return true
}
