package api

import (
	"fmt"
	"time"

	"github.com/fleetrepair/fleetrepair/agent/finding"
)

// Bounds of an agent report's free-text fields and counts beyond what
// finding.Report.Validate checks, enforced by POST /api/v1/reports
// (checkReportBounds): every value is stored and rendered, so one report
// cannot store a 100 KB version string or a negative GPU count. The agent
// never comes near them (agent/detect MaxEvidence is 64 lines).
const (
	MaxBootIDLength    = 128  // a boot ID is a 36-character UUID
	MaxVersionLength   = 256  // agent, driver, kernel, module, library versions, the node image
	MaxMonitors        = 64   // monitors of one heartbeat
	MaxMonitorName     = 64   // a monitor's name
	MaxReasonLength    = 1024 // a monitor's reason
	MaxGPUs            = 64   // GPUs of one heartbeat's inventory, and heartbeat.gpuCount
	MaxGPUFieldLength  = 128  // a GPU's UUID, serial, model, PCI ID
	MaxEvidenceLines   = 64   // evidence lines of one finding
	MaxEvidenceBytes   = 8192 // one evidence line (a kernel record is at most 1 KiB)
	MaxAttrs           = 64   // attributes of one finding
	MaxAttrKeyLength   = 64
	MaxAttrValueLength = 4096
)

// MinFindingTime is the oldest finding time the controller keeps as the
// agent sent it: an earlier one comes from a clock that was never set (an
// RTC reset to 1970) and is set to the receipt time, as a time more than
// MaxClockSkew ahead is (clampTimes; agent_time keeps the agent's).
var MinFindingTime = time.Date(2000, 1, 1, 0, 0, 0, 0, time.UTC)

// checkReportBounds returns one problem per field of rep out of the bounds
// above ("heartbeat.driverVersion: longer than 256 characters"), nil when
// none is.
func checkReportBounds(rep *finding.Report) []string {
	var p []string
	long := func(field, v string, limit int) {
		if len(v) > limit {
			p = append(p, fmt.Sprintf("%s: longer than %d characters (%d)", field, limit, len(v)))
		}
	}
	long("bootID", rep.BootID, MaxBootIDLength)
	long("agentVersion", rep.AgentVersion, MaxVersionLength)
	for i, f := range rep.Findings {
		at := fmt.Sprintf("findings[%d]", i)
		long(at+".bootID", f.BootID, MaxBootIDLength)
		if len(f.Evidence) > MaxEvidenceLines {
			p = append(p, fmt.Sprintf("%s.evidence: %d lines, more than %d", at, len(f.Evidence), MaxEvidenceLines))
		}
		for j, e := range f.Evidence {
			long(fmt.Sprintf("%s.evidence[%d]", at, j), e, MaxEvidenceBytes)
		}
		if len(f.Attrs) > MaxAttrs {
			p = append(p, fmt.Sprintf("%s.attrs: %d attributes, more than %d", at, len(f.Attrs), MaxAttrs))
		}
		for k, v := range f.Attrs {
			long(at+".attrs key", k, MaxAttrKeyLength)
			long(fmt.Sprintf("%s.attrs[%q]", at, truncate(k, MaxAttrKeyLength)), v, MaxAttrValueLength)
		}
	}
	hb := rep.Heartbeat
	if hb == nil {
		return p
	}
	for _, v := range []struct {
		field, v string
	}{{"driverVersion", hb.DriverVersion}, {"kernelVersion", hb.KernelVersion}, {"moduleVersion", hb.ModuleVersion},
		{"libraryVersion", hb.LibraryVersion}, {"image", hb.Image}} {
		long("heartbeat."+v.field, v.v, MaxVersionLength)
	}
	if hb.GPUCount < 0 || hb.GPUCount > MaxGPUs {
		p = append(p, fmt.Sprintf("heartbeat.gpuCount: %d is not 0..%d", hb.GPUCount, MaxGPUs))
	}
	if len(hb.Monitors) > MaxMonitors {
		p = append(p, fmt.Sprintf("heartbeat.monitors: %d monitors, more than %d", len(hb.Monitors), MaxMonitors))
	}
	for i, m := range hb.Monitors {
		at := fmt.Sprintf("heartbeat.monitors[%d]", i)
		long(at+".name", m.Name, MaxMonitorName)
		long(at+".reason", m.Reason, MaxReasonLength)
	}
	if len(hb.GPUs) > MaxGPUs {
		p = append(p, fmt.Sprintf("heartbeat.gpus: %d GPUs, more than %d", len(hb.GPUs), MaxGPUs))
	}
	for i, g := range hb.GPUs {
		at := fmt.Sprintf("heartbeat.gpus[%d]", i)
		if g.Index < -1 || g.Index >= MaxGPUs {
			p = append(p, fmt.Sprintf("%s.index: %d is not -1 (unknown) or 0..%d", at, g.Index, MaxGPUs-1))
		}
		long(at+".pci", g.PCI, MaxGPUFieldLength)
		long(at+".uuid", g.UUID, MaxGPUFieldLength)
		long(at+".serial", g.Serial, MaxGPUFieldLength)
		long(at+".model", g.Model, MaxGPUFieldLength)
		long(at+".pciID", g.PCIID, MaxGPUFieldLength)
	}
	return p
}

func truncate(s string, n int) string {
	if len(s) > n {
		return s[:n]
	}
	return s
}
