package diagnose_test

import (
	"testing"
	"time"

	"github.com/fleetrepair/fleetrepair/agent/finding"
	"github.com/fleetrepair/fleetrepair/controller/catalog"
	"github.com/fleetrepair/fleetrepair/controller/diagnose"
)

// TestFaultClasses holds the classes a blind trial got wrong and the
// per-SKU, DCGM and memory-state rules: each case names the class, not one
// input.
func TestFaultClasses(t *testing.T) {
	t.Parallel()
	const g1, g2 = "0000:3b:00.0", "0000:5e:00.0"
	tests := []struct {
		name     string
		boot     string
		sku      string
		findings []finding.Finding
		reason   string
		severity catalog.Severity
		action   catalog.Action
		escal    bool
		conds    int // condition diagnoses when > 0 (an event headline already means none)
	}{
		// Xid 94: contained, the GPU stays usable.
		{name: "xid 94 is a contained memory error, an event", boot: "b1", findings: []finding.Finding{fx("b1", 0, 94, g1, "pid", "7")},
			reason: catalog.ReasonContainedMemoryError, severity: catalog.SeverityEvent, action: catalog.ActionNone},
		{name: "xid 94 from many processes is no repeated application error", boot: "b1", findings: []finding.Finding{
			fx("b1", 0, 94, g1, "pid", "1"), fx("b1", time.Minute, 94, g1, "pid", "2"), fx("b1", 2*time.Minute, 94, g1, "pid", "3")},
			reason: catalog.ReasonContainedMemoryError, severity: catalog.SeverityEvent, action: catalog.ActionNone},
		{name: "xid 94 joins the row remap it queued", boot: "b1", findings: []finding.Finding{fx("b1", 0, 94, g1), fx("b1", time.Second, 63, g1)},
			reason: catalog.ReasonRowRemapPending, severity: catalog.SeverityCondition, action: catalog.ActionResetGPU, conds: 1},
		{name: "xid 94 whose line says RST: Yes needs the reset", boot: "b1", findings: []finding.Finding{fx("b1", 0, 94, g1, "reset_required", "true")},
			reason: catalog.ReasonRowRemapPending, severity: catalog.SeverityCondition, action: catalog.ActionResetGPU},

		// Xid 109 after the application's own fault.
		{name: "xid 109 seconds after an xid 13 is an app-induced hang", boot: "b1",
			findings: []finding.Finding{fx("b1", 0, 13, g1, "pid", "1"), fx("b1", 5*time.Second, 109, g1)},
			reason:   catalog.ReasonGPUHangAfterApplicationError, severity: catalog.SeverityCondition, action: catalog.ActionResetGPU, conds: 1},
		{name: "xid 109 after an xid 13 on another GPU is a hang", boot: "b1",
			findings: []finding.Finding{fx("b1", 0, 13, g2, "pid", "1"), fx("b1", 5*time.Second, 109, g1)},
			reason:   catalog.ReasonGPUHang, severity: catalog.SeverityCondition, action: catalog.ActionResetGPU},
		{name: "xid 109 an hour after an xid 13 is a hang", boot: "b1",
			findings: []finding.Finding{fx("b1", 0, 13, g1, "pid", "1"), fx("b1", time.Hour, 109, g1)},
			reason:   catalog.ReasonGPUHang, severity: catalog.SeverityCondition, action: catalog.ActionResetGPU},
		{name: "app-induced hangs in two boots do not escalate", boot: "b2",
			findings: []finding.Finding{fx("b1", 0, 13, g1, "pid", "1"), fx("b1", 5*time.Second, 109, g1),
				fx("b2", 2*time.Hour, 13, g1, "pid", "9"), fx("b2", 2*time.Hour+5*time.Second, 109, g1)},
			reason: catalog.ReasonGPUHangAfterApplicationError, severity: catalog.SeverityCondition, action: catalog.ActionResetGPU},
		{name: "an app-induced hang in an earlier boot is no history for a hang now", boot: "b2",
			findings: []finding.Finding{fx("b1", 0, 13, g1, "pid", "1"), fx("b1", 5*time.Second, 109, g1), fx("b2", 2*time.Hour, 109, g1)},
			reason:   catalog.ReasonGPUHang, severity: catalog.SeverityCondition, action: catalog.ActionResetGPU},
		{name: "an app-induced hang the driver asks to reset twice escalates", boot: "b1",
			findings: []finding.Finding{fx("b1", 0, 13, g1, "pid", "1"), fx("b1", 5*time.Second, 109, g1),
				fx("b1", 6*time.Second, 154, g1, "recovery_action", "gpu-reset-required"),
				fx("b1", 2*time.Hour, 154, g1, "recovery_action", "gpu-reset-required")},
			reason: catalog.ReasonGPUHangAfterApplicationError, severity: catalog.SeverityCondition, action: catalog.ActionReplace, escal: true},

		// Item 8: secondaries never count, escalation needs the same GPU
		// failing again after a remedy.
		{name: "xid 43 after xid 13 in many processes is no repeated error", boot: "b1", findings: []finding.Finding{
			fx("b1", 0, 43, g1, "pid", "1"), fx("b1", time.Minute, 43, g1, "pid", "2"), fx("b1", 2*time.Minute, 43, g1, "pid", "3")},
			reason: catalog.ReasonXidApplicationError, severity: catalog.SeverityEvent, action: catalog.ActionNone},
		{name: "xid 45 after a non-fatal NVLink5 xid takes its verdict", boot: "b1",
			findings: []finding.Finding{fx("b1", 0, 149, g1, "fatal", "false"), fx("b1", time.Second, 45, g1, "caused_by", "149")},
			reason:   catalog.ReasonXidInformational, severity: catalog.SeverityEvent, action: catalog.ActionNone},
		{name: "xid 45 after a fatal NVLink5 xid is one NVLink incident", boot: "b1",
			findings: []finding.Finding{fx("b1", 0, 145, g1), fx("b1", time.Second, 45, g1, "caused_by", "145")},
			reason:   catalog.ReasonNVLinkError, severity: catalog.SeverityCondition, action: catalog.ActionReboot, conds: 1},
		{name: "an earlier boot's secondary xid 45 is no NVLink history", boot: "b2",
			findings: []finding.Finding{fx("b1", 0, 45, g1, "caused_by", "145"), fx("b2", time.Hour, 74, g1)},
			reason:   catalog.ReasonNVLinkError, severity: catalog.SeverityCondition, action: catalog.ActionReboot},
		{name: "the same NVLink fault after a reboot escalates", boot: "b2",
			findings: []finding.Finding{fx("b1", 0, 74, g1), fx("b2", time.Hour, 74, g1)},
			reason:   catalog.ReasonNVLinkError, severity: catalog.SeverityCondition, action: catalog.ActionReplace, escal: true},
		{name: "memory errors repeating in one boot without a reset do not escalate", boot: "b1",
			findings: []finding.Finding{fx("b1", 0, 48, g1), fx("b1", time.Hour, 48, g1), fx("b1", 2*time.Hour, 48, g1)},
			reason:   catalog.ReasonUncorrectableECC, severity: catalog.SeverityCondition, action: catalog.ActionResetGPU},
		{name: "a memory error on the same GPU after the reboot escalates", boot: "b2",
			findings: []finding.Finding{fx("b1", 0, 48, g1), fx("b2", time.Hour, 48, g1)},
			reason:   catalog.ReasonUncorrectableECC, severity: catalog.SeverityCondition, action: catalog.ActionReplace, escal: true},
		{name: "a memory error on another GPU after the reboot does not", boot: "b2",
			findings: []finding.Finding{fx("b1", 0, 48, g1), fx("b2", time.Hour, 48, g2)},
			reason:   catalog.ReasonUncorrectableECC, severity: catalog.SeverityCondition, action: catalog.ActionResetGPU},

		// Filesystems: an error is not a shutdown.
		{name: "a single XFS CRC error on the root volume is an event", boot: "b1",
			findings: []finding.Finding{fd(finding.DetectorFilesystemError, "b1", 0, "fs", "xfs", "device", "nvme0n1p1", "kind", "error")},
			reason:   catalog.ReasonNodeFilesystemError, severity: catalog.SeverityEvent, action: catalog.ActionNone},
		{name: "an XFS shutdown of the root volume is a failure", boot: "b1",
			findings: []finding.Finding{fd(finding.DetectorFilesystemError, "b1", 0, "fs", "xfs", "device", "nvme0n1p1", "kind", "error"),
				fd(finding.DetectorFilesystemError, "b1", time.Second, "fs", "xfs", "device", "nvme0n1p1", "kind", "shutdown")},
			reason: catalog.ReasonNodeFilesystemFailure, severity: catalog.SeverityCondition, action: catalog.ActionReboot, conds: 1},
		{name: "a read-only remount of /var is a failure", boot: "b1",
			findings: []finding.Finding{fd(finding.DetectorFilesystemError, "b1", 0, "fs", "ext4", "mount", "/var", "kind", "read-only")},
			reason:   catalog.ReasonNodeFilesystemFailure, severity: catalog.SeverityCondition, action: catalog.ActionReboot},
		{name: "a shutdown of a data volume is a storage event", boot: "b1",
			findings: []finding.Finding{fd(finding.DetectorFilesystemError, "b1", 0, "fs", "xfs", "device", "rbd0", "kind", "shutdown")},
			reason:   catalog.ReasonStorageVolumeError, severity: catalog.SeverityEvent, action: catalog.ActionNone},

		// nvidia-smi's own words: no GPU enumerated is the driver's state, a
		// named GPU whose handle fails is that GPU.
		{name: "nvidia-smi 'No devices were found' names no GPU: reboot, never replace", boot: "b1",
			findings: []finding.Finding{fd(finding.DetectorNVMLError, "b1", 0, finding.AttrError, "No devices were found")},
			reason:   catalog.ReasonDriverNotLoaded, severity: catalog.SeverityCondition, action: catalog.ActionReboot},
		{name: "a GPU whose handle answers Unknown Error is lost", boot: "b1",
			findings: []finding.Finding{func() finding.Finding {
				f := fd(finding.DetectorNVMLError, "b1", 0, finding.AttrError, "Unknown Error")
				f.GPUPCI = g1
				return f
			}()},
			reason: catalog.ReasonGPULost, severity: catalog.SeverityCondition, action: catalog.ActionReplace},

		// Per-SKU expectations.
		{name: "7 of 8 GPUs on a p5.48xlarge is a lost GPU", boot: "b1", sku: "p5.48xlarge",
			findings: []finding.Finding{fd(finding.DetectorGPUCount, "b1", 0, "found", "7")},
			reason:   catalog.ReasonGPULost, severity: catalog.SeverityCondition, action: catalog.ActionReplace},
		{name: "8 of 8 GPUs on a p5.48xlarge is no fault whatever the agent expected", boot: "b1", sku: "p5.48xlarge",
			findings: []finding.Finding{fd(finding.DetectorGPUCount, "b1", 0, "found", "8", "expected", "9", "missing", "1")},
			severity: catalog.SeverityNone, action: catalog.ActionNone},
		{name: "an unknown type keeps the agent's count", boot: "b1", sku: "onprem-x",
			findings: []finding.Finding{fd(finding.DetectorGPUCount, "b1", 0, "found", "3", "expected", "4", "missing", "1")},
			reason:   catalog.ReasonGPULost, severity: catalog.SeverityCondition, action: catalog.ActionReplace},
		{name: "links down on a g5.xlarge (no NVLink) are a false positive", boot: "b1", sku: "g5.xlarge",
			findings: []finding.Finding{withGPU(fd(finding.DetectorNVLinkInactive, "b1", 0, "links", "0,1,2", "scope", "all-links"), g1)},
			reason:   catalog.ReasonNVLinkNotApplicable, severity: catalog.SeverityEvent, action: catalog.ActionNone},
		{name: "links down on a p4d.24xlarge are an NVLink fault", boot: "b1", sku: "p4d.24xlarge",
			findings: []finding.Finding{withGPU(fd(finding.DetectorNVLinkInactive, "b1", 0, "links", "0,1,2,3,4,5,6,7,8,9,10,11", "scope", "all-links"), g1)},
			reason:   catalog.ReasonNVLinkError, severity: catalog.SeverityCondition, action: catalog.ActionReboot},
		{name: "a DCGM NVLink health failure on a g6e.xlarge is a false positive", boot: "b1", sku: "g6e.xlarge",
			findings: []finding.Finding{withGPU(fd(finding.DetectorDCGMHealth, "b1", 0, "system", "nvlink", "fatal", "true"), g1)},
			reason:   catalog.ReasonNVLinkNotApplicable, severity: catalog.SeverityEvent, action: catalog.ActionNone},
		{name: "a DCGM NVLink health failure on a p5.48xlarge is a hardware condition", boot: "b1", sku: "p5.48xlarge",
			findings: []finding.Finding{withGPU(fd(finding.DetectorDCGMHealth, "b1", 0, "system", "nvlink", "fatal", "true"), g1)},
			reason:   catalog.ReasonVendorAcceleratedHardwareNotReady, severity: catalog.SeverityCondition, action: catalog.ActionReboot},

		// DCGM policy violations.
		{name: "DCGM policy double-bit ECC", boot: "b1",
			findings: []finding.Finding{fd(finding.DetectorDCGMPolicy, "b1", 0, "condition", "Double-bit ECC error", "gpu_index", "3")},
			reason:   catalog.ReasonUncorrectableECC, severity: catalog.SeverityCondition, action: catalog.ActionResetGPU},
		{name: "DCGM policy retired-page limit", boot: "b1",
			findings: []finding.Finding{fd(finding.DetectorDCGMPolicy, "b1", 0, "condition", "Max Retired Pages Limit", "gpu_index", "0")},
			reason:   catalog.ReasonRetiredPagesLimit, severity: catalog.SeverityCondition, action: catalog.ActionReplace},
		{name: "DCGM policy NVLink error on a type without NVLink", boot: "b1", sku: "g5.xlarge",
			findings: []finding.Finding{fd(finding.DetectorDCGMPolicy, "b1", 0, "condition", "Nvlink Error", "gpu_index", "0")},
			reason:   catalog.ReasonNVLinkNotApplicable, severity: catalog.SeverityEvent, action: catalog.ActionNone},
		{name: "DCGM policy NVLink error on an HGX type", boot: "b1", sku: "p5.48xlarge",
			findings: []finding.Finding{fd(finding.DetectorDCGMPolicy, "b1", 0, "condition", "Nvlink Error", "gpu_index", "0")},
			reason:   catalog.ReasonNVLinkError, severity: catalog.SeverityCondition, action: catalog.ActionReboot},
		{name: "DCGM policy Xid 79", boot: "b1",
			findings: []finding.Finding{func() finding.Finding {
				f := fd(finding.DetectorDCGMPolicy, "b1", 0, "condition", "XID Error", "gpu_index", "1")
				f.Xid = 79
				return f
			}()},
			reason: catalog.ReasonGPULost, severity: catalog.SeverityCondition, action: catalog.ActionReplace},
		{name: "DCGM policy thermal limit is an event", boot: "b1",
			findings: []finding.Finding{fd(finding.DetectorDCGMPolicy, "b1", 0, "condition", "Thermal Limit", "gpu_index", "1")},
			reason:   catalog.ReasonGPUThermalOrPowerViolation, severity: catalog.SeverityEvent, action: catalog.ActionNone},
		{name: "DCGM policy PCIe replays are an early warning", boot: "b1",
			findings: []finding.Finding{fd(finding.DetectorDCGMPolicy, "b1", 0, "condition", "PCI error", "gpu_index", "1")},
			reason:   catalog.ReasonPCIeCorrectableErrors, severity: catalog.SeverityEvent, action: catalog.ActionNone},

		// Retired pages, row remapping, ECC counters.
		{name: "a page retirement pending needs a reset in a drain window", boot: "b1",
			findings: []finding.Finding{withGPU(fd(finding.DetectorRetiredPages, "b1", 0, "pending", "true", "sbe_pages", "2", "dbe_pages", "1"), g1)},
			reason:   catalog.ReasonRowRemapPending, severity: catalog.SeverityCondition, action: catalog.ActionResetGPU},
		{name: "retired pages at the limit replace", boot: "b1",
			findings: []finding.Finding{withGPU(fd(finding.DetectorRetiredPages, "b1", 0, "pending", "true", "sbe_pages", "40", "dbe_pages", "24"), g1)},
			reason:   catalog.ReasonRetiredPagesLimit, severity: catalog.SeverityCondition, action: catalog.ActionReplace},
		{name: "row remap pending vs failure: failure wins", boot: "b1",
			findings: []finding.Finding{withGPU(fd(finding.DetectorRowRemapPending, "b1", 0, "pending", "true"), g1), withGPU(fd(finding.DetectorRowRemapFailure, "b1", time.Second), g1)},
			reason:   catalog.ReasonRowRemapFailure, severity: catalog.SeverityCondition, action: catalog.ActionReplace, conds: 1},
		{name: "an ECC counter rise alone is an event", boot: "b1",
			findings: []finding.Finding{withGPU(fd(finding.DetectorECCErrors, "b1", 0, "uncorrectable", "2"), g1)},
			reason:   catalog.ReasonUncorrectableECCCounted, severity: catalog.SeverityEvent, action: catalog.ActionNone},
		{name: "an ECC counter rise joins the memory incident of its GPU", boot: "b1",
			findings: []finding.Finding{fx("b1", 0, 48, g1), withGPU(fd(finding.DetectorECCErrors, "b1", time.Second, "uncorrectable", "1"), g1)},
			reason:   catalog.ReasonUncorrectableECC, severity: catalog.SeverityCondition, action: catalog.ActionResetGPU, conds: 1},
	}
	eng, err := diagnose.New(diagnose.Options{})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			now := t0.Add(3 * time.Hour)
			ds := eng.Diagnose(diagnose.Input{Node: "n", BootID: tc.boot, Findings: tc.findings, Now: now, InstanceType: tc.sku})
			h := diagnose.Headline(ds)
			if h.Reason != tc.reason || h.Severity != tc.severity || h.Action != tc.action || h.Escalated != tc.escal {
				t.Fatalf("headline = %s/%s/%s escalated=%v, want %s/%s/%s escalated=%v (%s)\nall: %+v",
					h.Reason, h.Severity, h.Action, h.Escalated, tc.reason, tc.severity, tc.action, tc.escal, h.Message, ds)
			}
			if tc.conds > 0 {
				n := 0
				for _, d := range ds {
					if d.Severity == catalog.SeverityCondition {
						n++
					}
				}
				if n != tc.conds {
					t.Errorf("%d condition diagnoses, want %d: %+v", n, tc.conds, ds)
				}
			}
		})
	}
}

// TestInventoryAgainstInstanceType: the heartbeat's GPU inventory is
// compared with what the instance type promises; a missing GPU explained by
// a failed initialisation is that fault's, and an unknown type or an empty
// inventory decides nothing.
func TestInventoryAgainstInstanceType(t *testing.T) {
	t.Parallel()
	eng, err := diagnose.New(diagnose.Options{})
	if err != nil {
		t.Fatal(err)
	}
	now := t0.Add(time.Hour)
	initFailed := withGPU(fd(finding.DetectorRmInitFailed, "b1", 0, "error_code", "0x24:0x72:1568"), "0000:3b:00.0")
	for _, tc := range []struct {
		name, sku string
		inv       int
		fs        []finding.Finding
		want      string
	}{
		{"7 of 8 on a p5.48xlarge", "p5.48xlarge", 7, nil, catalog.ReasonGPULost},
		{"8 of 8 on a p5.48xlarge", "p5.48xlarge", 8, nil, ""},
		{"1 of 1 on a g5.xlarge", "g5.xlarge", 1, nil, ""},
		{"empty inventory", "p5.48xlarge", 0, nil, ""},
		{"unknown type", "onprem-x", 3, nil, ""},
		{"the missing GPU failed to initialise", "p4d.24xlarge", 7, []finding.Finding{initFailed}, catalog.ReasonGPUInitFailed},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ds := eng.Diagnose(diagnose.Input{Node: "n", BootID: "b1", Findings: tc.fs, Now: now, InstanceType: tc.sku, InventoryGPUs: tc.inv})
			if h := diagnose.Headline(ds); h.Reason != tc.want {
				t.Fatalf("headline %q, want %q: %+v", h.Reason, tc.want, ds)
			}
			if tc.want == catalog.ReasonGPULost {
				again := eng.Diagnose(diagnose.Input{Node: "n", BootID: "b1", Now: now.Add(time.Hour), InstanceType: tc.sku, InventoryGPUs: tc.inv})
				if ds[0].FindingIDs[0] != again[0].FindingIDs[0] {
					t.Errorf("inventory finding ID changed between reconciles: %s, %s", ds[0].FindingIDs[0], again[0].FindingIDs[0])
				}
			}
		})
	}
}

// TestDCGMIndexJoinsKernelGPU: DCGM names a GPU by its NVML index; with the
// heartbeat's inventory the policy violation lands on that GPU's PCI
// address and joins the kernel's incident there (one incident, not two).
func TestDCGMIndexJoinsKernelGPU(t *testing.T) {
	t.Parallel()
	eng, err := diagnose.New(diagnose.Options{})
	if err != nil {
		t.Fatal(err)
	}
	const pci = "0000:9c:00.0"
	fs := []finding.Finding{fx("b1", 0, 48, pci), fd(finding.DetectorDCGMPolicy, "b1", time.Second, "condition", "Double-bit ECC error", "gpu_index", "3")}
	inv := []finding.GPU{{Index: 2, PCI: "0000:8a:00.0"}, {Index: 3, PCI: pci}}
	count := func(ds []diagnose.Diagnosis) int {
		n := 0
		for _, d := range ds {
			if d.Severity == catalog.SeverityCondition {
				n++
			}
		}
		return n
	}
	ds := eng.Diagnose(diagnose.Input{Node: "n", BootID: "b1", Findings: fs, Now: t0.Add(time.Hour), Inventory: inv})
	if n := count(ds); n != 1 || len(ds[0].GPUs) != 1 || ds[0].GPUs[0] != pci || len(ds[0].FindingIDs) != 2 {
		t.Fatalf("with the inventory: %d conditions, %+v; want one incident on %s with both findings", n, ds, pci)
	}
	if n := count(eng.Diagnose(diagnose.Input{Node: "n", BootID: "b1", Findings: fs, Now: t0.Add(time.Hour)})); n != 2 {
		t.Errorf("without the inventory the index cannot be placed: %d conditions, want 2", n)
	}
}
