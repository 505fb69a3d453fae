package diagnose_test

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/fleetrepair/fleetrepair/agent/detect/textformat"
	"github.com/fleetrepair/fleetrepair/controller/catalog"
	"github.com/fleetrepair/fleetrepair/controller/diagnose"
)

// TestBlindTrial runs the blind trial's inputs (test/fixtures/trial,
// README.md there) as a user does: the agent's offline scan with format
// auto, then the controller's rules. Each row asserts the headline's reason,
// severity and action and how many condition diagnoses the input gives (one
// faulty component, one incident).
func TestBlindTrial(t *testing.T) {
	t.Parallel()
	eng, err := diagnose.New(diagnose.Options{})
	if err != nil {
		t.Fatal(err)
	}
	// now is two minutes after the heartbeats of t11's saved "describe
	// node": the conditions are fresh then (ReadCondition).
	now := time.Date(2026, 12, 1, 13, 0, 0, 0, time.UTC)
	tests := []struct {
		file, sku string
		format    textformat.Format
		reason    string
		severity  catalog.Severity
		action    catalog.Action
		conds     int
		gpus      int
	}{
		{file: "t01-xid48-63.kmsg", format: textformat.KernelLog, reason: catalog.ReasonUncorrectableECC,
			severity: catalog.SeverityCondition, action: catalog.ActionResetGPU, conds: 1, gpus: 1},
		{file: "t02-xid64.dmesgT", format: textformat.KernelLog, reason: catalog.ReasonRowRemapFailure,
			severity: catalog.SeverityCondition, action: catalog.ActionReplace, conds: 1, gpus: 1},
		{file: "t03-gsp-119-154.journal", format: textformat.KernelLog, reason: catalog.ReasonGPUFirmwareError,
			severity: catalog.SeverityCondition, action: catalog.ActionReboot, conds: 1, gpus: 1},
		{file: "t04-sxid-nonfatal.dmesg", sku: "p4d.24xlarge", format: textformat.KernelLog, reason: catalog.ReasonNVSwitchFatalError,
			severity: catalog.SeverityCondition, action: catalog.ActionReboot, conds: 1},
		{file: "t05-sxid-fatal-xid74.dmesg", sku: "p4d.24xlarge", format: textformat.KernelLog, reason: catalog.ReasonNVSwitchFatalError,
			severity: catalog.SeverityCondition, action: catalog.ActionReboot, conds: 1, gpus: 3},
		// Class: a repeated lockup without its stack, or an RCU stall of
		// the stuck CPU, is the driver hang it repeats, not a second
		// "outside the GPU driver" incident.
		{file: "t06-softlockup-rcu.dmesg", format: textformat.KernelLog, reason: catalog.ReasonGPUDriverHang,
			severity: catalog.SeverityCondition, action: catalog.ActionReboot, conds: 1},
		{file: "t07-ext4-data.syslog", format: textformat.KernelLog, reason: catalog.ReasonStorageVolumeError,
			severity: catalog.SeverityEvent, action: catalog.ActionNone},
		{file: "t08-mlx5-health.journal", format: textformat.KernelLog, reason: catalog.ReasonNICFirmwareFault,
			severity: catalog.SeverityCondition, action: catalog.ActionReboot, conds: 1},
		// Class: nvidia-smi glues the bus ID to "GPU" in its device-handle
		// errors; the lost GPU was read as no finding at all.
		{file: "t09-nvsmi-unknown.txt", format: textformat.NvidiaSMI, reason: catalog.ReasonGPULost,
			severity: catalog.SeverityCondition, action: catalog.ActionReplace, conds: 1, gpus: 1},
		// Class: "describe node" condition rows other than Ready were not
		// read (the file fell back to a kernel log and gave an event from
		// the message column); now each row is a node-condition finding
		// read by ReadCondition.
		{file: "t11-describe-node.txt", format: textformat.KubectlDescribe, reason: catalog.ReasonKernelLockup,
			severity: catalog.SeverityCondition, action: catalog.ActionReboot, conds: 1},
		{file: "t10-nccl-status12.log", format: textformat.JobLog, reason: catalog.ReasonNCCLNetworkError,
			severity: catalog.SeverityEvent, action: catalog.ActionNone},
	}
	for _, tt := range tests {
		t.Run(tt.file, func(t *testing.T) {
			t.Parallel()
			f, err := os.Open(filepath.Join("../../test/fixtures/trial", tt.file))
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			res, err := textformat.Scan(context.Background(), f, textformat.Auto, textformat.Options{Node: "trial-node"})
			if err != nil {
				t.Fatal(err)
			}
			if fam := sameFormatFamily(res.Format); fam != sameFormatFamily(tt.format) {
				t.Errorf("format = %s, want %s", res.Format, tt.format)
			}
			ds := eng.Diagnose(diagnose.Input{Node: "trial-node", Findings: res.Findings, Now: now, InstanceType: tt.sku})
			if len(ds) == 0 {
				t.Fatalf("no diagnosis from %d findings", len(res.Findings))
			}
			h := diagnose.Headline(ds)
			if h.Reason != tt.reason || h.Severity != tt.severity || h.Action != tt.action {
				t.Fatalf("headline = %s %s %s, want %s %s %s\nall: %+v", h.Reason, h.Severity, h.Action, tt.reason, tt.severity, tt.action, ds)
			}
			conds := 0
			for _, d := range ds {
				if d.Severity == catalog.SeverityCondition {
					conds++
				}
			}
			if conds != tt.conds {
				t.Errorf("condition diagnoses = %d, want %d: %+v", conds, tt.conds, ds)
			}
			if len(h.GPUs) != tt.gpus {
				t.Errorf("headline GPUs = %v, want %d", h.GPUs, tt.gpus)
			}
		})
	}
}

// sameFormatFamily folds the kernel renderings into one: Auto reports the
// kernel family, the rows name it.
func sameFormatFamily(f textformat.Format) string {
	if _, ok := f.Kernel(); ok {
		return "kernel"
	}
	return string(f)
}
