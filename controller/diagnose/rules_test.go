package diagnose_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/fleetrepair/fleetrepair/agent/finding"
	"github.com/fleetrepair/fleetrepair/controller/catalog"
	"github.com/fleetrepair/fleetrepair/controller/diagnose"
)

var t0 = time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)

func fx(boot string, at time.Duration, xid int, gpu string, attrs ...string) finding.Finding {
	f := finding.Finding{Detector: finding.DetectorXid, Xid: xid, GPUPCI: gpu, BootID: boot, Time: t0.Add(at), Count: 1,
		Attrs: map[string]string{}, Evidence: []string{fmt.Sprintf("xid %d %s %s", xid, gpu, at)}}
	for i := 0; i+1 < len(attrs); i += 2 {
		f.Attrs[attrs[i]] = attrs[i+1]
	}
	f.ID = finding.NewID(f)
	return f
}

func TestRules(t *testing.T) {
	t.Parallel()
	const g1, g2 = "0000:3b:00.0", "0000:5e:00.0"
	tests := []struct {
		name     string
		boot     string
		findings []finding.Finding
		now      time.Duration
		reason   string
		severity catalog.Severity
		action   catalog.Action
		escal    bool
	}{
		{name: "no findings is healthy", severity: catalog.SeverityNone, action: catalog.ActionNone},
		{name: "xid 79 replaces", boot: "b1", findings: []finding.Finding{fx("b1", 0, 79, g1)},
			reason: catalog.ReasonGPULost, severity: catalog.SeverityCondition, action: catalog.ActionReplace},
		{name: "xid 79 of an earlier boot does not keep the node unhealthy", boot: "b2", findings: []finding.Finding{fx("b1", 0, 79, g1)},
			severity: catalog.SeverityNone, action: catalog.ActionNone},
		{name: "first xid 109 is a reset", boot: "b1", findings: []finding.Finding{fx("b1", 0, 109, g1)},
			reason: catalog.ReasonGPUHang, severity: catalog.SeverityCondition, action: catalog.ActionResetGPU},
		{name: "xid 109 again on the same GPU after a reboot escalates (lemon)", boot: "b2",
			findings: []finding.Finding{fx("b1", 0, 109, g1), fx("b2", time.Hour, 109, g1)},
			reason:   catalog.ReasonGPUHang, severity: catalog.SeverityCondition, action: catalog.ActionReplace, escal: true},
		{name: "xid 109 after a reboot on another GPU does not escalate", boot: "b2",
			findings: []finding.Finding{fx("b1", 0, 109, g1), fx("b2", time.Hour, 109, g2)},
			reason:   catalog.ReasonGPUHang, severity: catalog.SeverityCondition, action: catalog.ActionResetGPU},
		{name: "app xid 13 is an event", boot: "b1", findings: []finding.Finding{fx("b1", 0, 13, g1, "pid", "1")},
			reason: catalog.ReasonXidApplicationError, severity: catalog.SeverityEvent, action: catalog.ActionNone},
		{name: "app xid 13 from three processes on one GPU within the window escalates", boot: "b1", now: 30 * time.Minute,
			findings: []finding.Finding{fx("b1", 0, 13, g1, "pid", "1"), fx("b1", time.Minute, 13, g1, "pid", "2"), fx("b1", 2*time.Minute, 13, g1, "pid", "3")},
			reason:   catalog.ReasonRepeatedApplicationXid, severity: catalog.SeverityCondition, action: catalog.ActionResetGPU},
		{name: "app xid 13 from three processes on three GPUs stays an event", boot: "b1",
			findings: []finding.Finding{fx("b1", 0, 13, g1, "pid", "1"), fx("b1", time.Minute, 13, g2, "pid", "2"), fx("b1", 2*time.Minute, 13, "0000:86:00.0", "pid", "3")},
			reason:   catalog.ReasonXidApplicationError, severity: catalog.SeverityEvent, action: catalog.ActionNone},
		{name: "app xid 13 repeats outside the window stay an event", boot: "b1", now: 5 * time.Hour,
			findings: []finding.Finding{fx("b1", 0, 13, g1, "pid", "1"), fx("b1", time.Minute, 13, g1, "pid", "2"), fx("b1", 2*time.Minute, 13, g1, "pid", "3")},
			reason:   catalog.ReasonXidApplicationError, severity: catalog.SeverityEvent, action: catalog.ActionNone},
		{name: "unknown pids do not count as distinct processes", boot: "b1",
			findings: []finding.Finding{fx("b1", 0, 13, g1, "pid", "<unknown>"), fx("b1", time.Minute, 13, g1, "pid", "<unknown>"), fx("b1", 2*time.Minute, 13, g1, "pid", "<unknown>")},
			reason:   catalog.ReasonXidApplicationError, severity: catalog.SeverityEvent, action: catalog.ActionNone},
		{name: "xid 45 caused by an NVLink xid is an NVLink fault", boot: "b1", findings: []finding.Finding{fx("b1", 0, 45, g1, "caused_by", "145")},
			reason: catalog.ReasonNVLinkError, severity: catalog.SeverityCondition, action: catalog.ActionReboot},
		{name: "secondary xid 45 of many processes never repeats into a condition", boot: "b1", findings: []finding.Finding{
			fx("b1", 0, 45, g1, "pid", "1", "secondary", "true"), fx("b1", time.Second, 45, g1, "pid", "2", "secondary", "true"),
			fx("b1", 2*time.Second, 45, g1, "pid", "3", "secondary", "true"), fx("b1", 3*time.Second, 45, g1, "pid", "4", "secondary", "true")},
			reason: catalog.ReasonXidApplicationError, severity: catalog.SeverityEvent, action: catalog.ActionNone},
		{name: "xid 45 caused by xid 13 stays an event", boot: "b1", findings: []finding.Finding{fx("b1", 0, 45, g1, "caused_by", "13")},
			reason: catalog.ReasonXidApplicationError, severity: catalog.SeverityEvent, action: catalog.ActionNone},
		{name: "xid 154 node reboot required raises a reset-class fault to reboot", boot: "b1",
			findings: []finding.Finding{fx("b1", 0, 62, g1), fx("b1", 0, 154, g1, "recovery_action", "node-reboot-required")},
			reason:   catalog.ReasonGPUFirmwareError, severity: catalog.SeverityCondition, action: catalog.ActionReboot},
		{name: "xid 154 none is informational", boot: "b1", findings: []finding.Finding{fx("b1", 0, 154, g1, "recovery_action", "none")},
			reason: catalog.ReasonXidInformational, severity: catalog.SeverityEvent, action: catalog.ActionNone},
		{name: "xid 154 alone asks for what it says", boot: "b1", findings: []finding.Finding{fx("b1", 0, 154, g1, "recovery_action", "gpu-reset-required")},
			reason: catalog.ReasonGPURecoveryActionRequired, severity: catalog.SeverityCondition, action: catalog.ActionResetGPU},
		{name: "two reset-required crashes on one GPU escalate", boot: "b1",
			findings: []finding.Finding{fx("b1", 0, 120, g1), fx("b1", 0, 154, g1, "recovery_action", "gpu-reset-required"),
				fx("b1", 48*time.Hour, 120, g1), fx("b1", 48*time.Hour, 154, g1, "recovery_action", "gpu-reset-required")},
			reason: catalog.ReasonGPUFirmwareError, severity: catalog.SeverityCondition, action: catalog.ActionReplace, escal: true},
		{name: "unknown xid is recorded, never repaired on", boot: "b1", findings: []finding.Finding{fx("b1", 0, 999, g1)},
			reason: catalog.ReasonXidUnclassified, severity: catalog.SeverityEvent, action: catalog.ActionNone},
		{name: "non-fatal NVLink5 error is informational", boot: "b1", findings: []finding.Finding{fx("b1", 0, 145, g1, "fatal", "false")},
			reason: catalog.ReasonXidInformational, severity: catalog.SeverityEvent, action: catalog.ActionNone},
	}
	eng, err := diagnose.New(diagnose.Options{})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			now := t0.Add(tc.now)
			if tc.now == 0 {
				// Inside the repeat window of the first finding, and not
				// before the last one, unless the case sets Now.
				now = t0.Add(time.Hour)
				for _, f := range tc.findings {
					if f.Time.After(now) {
						now = f.Time
					}
				}
			}
			h := diagnose.Headline(eng.Diagnose(diagnose.Input{Node: "n", BootID: tc.boot, Findings: tc.findings, Now: now}))
			if h.Reason != tc.reason || h.Severity != tc.severity || h.Action != tc.action || h.Escalated != tc.escal {
				t.Fatalf("headline = %s/%s/%s escalated=%v, want %s/%s/%s escalated=%v (%s)",
					h.Reason, h.Severity, h.Action, h.Escalated, tc.reason, tc.severity, tc.action, tc.escal, h.Message)
			}
		})
	}
}

func TestNewRejectsBadOptions(t *testing.T) {
	t.Parallel()
	if _, err := diagnose.New(diagnose.Options{RepeatProcesses: 1}); err == nil {
		t.Error("RepeatProcesses 1 accepted")
	}
	if _, err := diagnose.New(diagnose.Options{RepeatWindow: -time.Second}); err == nil {
		t.Error("negative RepeatWindow accepted")
	}
}

// BenchmarkDiagnose measures diagnoses per second on one core for a
// realistic mix: a node with 60 findings (mostly application Xids and
// corrected AER, one GPU-lost incident, history from an earlier boot).
func BenchmarkDiagnose(b *testing.B) {
	eng, _ := diagnose.New(diagnose.Options{})
	var fs []finding.Finding
	for i := 0; i < 40; i++ {
		fs = append(fs, fx("b2", time.Duration(i)*time.Minute, 13, fmt.Sprintf("0000:%02x:00.0", 0x10+i%8), "pid", fmt.Sprint(i%2)))
	}
	for i := 0; i < 10; i++ {
		fs = append(fs, fx("b1", time.Duration(i)*time.Minute, 109, "0000:3b:00.0"))
	}
	for i := 0; i < 8; i++ {
		f := finding.Finding{Detector: finding.DetectorAERCorrectable, DevicePCI: "0000:00:02.0", GPUPCI: "0000:02:00.0", BootID: "b2", Time: t0, Count: 1}
		f.ID = finding.NewID(f)
		fs = append(fs, f)
	}
	fs = append(fs, fx("b2", time.Hour, 79, "0000:02:00.0"), fx("b2", time.Hour, 109, "0000:3b:00.0"))
	in := diagnose.Input{Node: "n", BootID: "b2", Findings: fs, Now: t0.Add(2 * time.Hour)}
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if len(eng.Diagnose(in)) == 0 {
			b.Fatal("no diagnosis")
		}
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "diagnoses/s")
}
