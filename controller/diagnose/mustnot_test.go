package diagnose_test

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/fleetrepair/fleetrepair/agent/finding"
	"github.com/fleetrepair/fleetrepair/controller/diagnose"
)

// mustNot is one assertion for one "must_not" item of a case's
// expected.yaml. Items about agent-side parsing (line grouping, noise lines)
// are asserted by agent/detect's case test instead.
type mustNot struct {
	item  string
	check func(t *testing.T, c caseRun) error
}

// caseRun diagnoses a case's expected findings, optionally with extra ones.
type caseRun struct {
	eng      *diagnose.Engine
	findings []finding.Finding
}

func (c caseRun) diagnose(extra ...finding.Finding) []diagnose.Diagnosis {
	fs := append(slices.Clone(c.findings), extra...)
	return c.eng.Diagnose(diagnose.Input{Node: "node-a1", Findings: fs, Now: time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)})
}

func (c caseRun) only(detector string, xid int) caseRun {
	var fs []finding.Finding
	for _, f := range c.findings {
		if f.Detector == detector && (xid == 0 || f.Xid == xid) {
			fs = append(fs, f)
		}
	}
	return caseRun{eng: c.eng, findings: fs}
}

func conditions(ds []diagnose.Diagnosis) []diagnose.Diagnosis {
	var out []diagnose.Diagnosis
	for _, d := range ds {
		if d.Severity == "condition" {
			out = append(out, d)
		}
	}
	return out
}

func noCondition(c caseRun) error {
	if cs := conditions(c.diagnose()); len(cs) > 0 {
		return fmt.Errorf("got condition %s", cs[0].Reason)
	}
	return nil
}

func conditionCount(n int) func(*testing.T, caseRun) error {
	return func(_ *testing.T, c caseRun) error {
		if cs := conditions(c.diagnose()); len(cs) != n {
			return fmt.Errorf("%d condition diagnoses, want %d: %+v", len(cs), n, cs)
		}
		return nil
	}
}

func headlineActionNot(actions ...string) func(*testing.T, caseRun) error {
	return func(_ *testing.T, c caseRun) error {
		h := diagnose.Headline(c.diagnose())
		if slices.Contains(actions, string(h.Action)) {
			return fmt.Errorf("headline action %s (%s)", h.Action, h.Reason)
		}
		return nil
	}
}

func headlineAction(a string) func(*testing.T, caseRun) error {
	return func(_ *testing.T, c caseRun) error {
		if h := diagnose.Headline(c.diagnose()); string(h.Action) != a {
			return fmt.Errorf("headline action %s (%s), want %s", h.Action, h.Reason, a)
		}
		return nil
	}
}

func headlineSeverity(s string) func(*testing.T, caseRun) error {
	return func(_ *testing.T, c caseRun) error {
		if h := diagnose.Headline(c.diagnose()); string(h.Severity) != s {
			return fmt.Errorf("headline severity %s (%s), want %s", h.Severity, h.Reason, s)
		}
		return nil
	}
}

func headlineGPUs(gpus ...string) func(*testing.T, caseRun) error {
	return func(_ *testing.T, c caseRun) error {
		if h := diagnose.Headline(c.diagnose()); !slices.Equal(h.GPUs, gpus) {
			return fmt.Errorf("headline GPUs %v, want %v", h.GPUs, gpus)
		}
		return nil
	}
}

var mustNots = map[string][]mustNot{
	"c01": {
		{"open a node condition for the correctable error alone", func(_ *testing.T, c caseRun) error { return noCondition(c.only("aer-correctable", 0)) }},
		{"open two incidents for the fatal AER and the Xid 79", conditionCount(1)},
	},
	"c02": {
		{"wait for an Xid 79 line", headlineSeverity("condition")},
		{"report more than one fallen-off-bus incident", conditionCount(1)},
	},
	"c03": {
		{"replace the node on this first occurrence", headlineActionNot("replace")},
		{"open a node condition for the Xid 13 lines on their own", func(_ *testing.T, c caseRun) error { return noCondition(c.only("xid", 13)) }},
	},
	"c04": {
		{"open eight incidents or four per-GPU incidents", conditionCount(1)},
		{"treat Xid 45 as a root cause", func(_ *testing.T, c caseRun) error {
			if h := diagnose.Headline(c.diagnose()); h.Reason != "NVLinkError" {
				return fmt.Errorf("headline reason %s, want NVLinkError", h.Reason)
			}
			return nil
		}},
		{"replace GPUs or the node on this first occurrence", headlineActionNot("replace")},
	},
	"c05": {
		{"keep restarting validator or driver pods as the remedy", headlineActionNot("restart-device-plugin", "restart-runtime", "none")},
		{"stop at a GPU reset or reboot", headlineAction("replace")},
	},
	"c06": {
		{"replace the node", headlineActionNot("replace")},
		{"ignore it", headlineSeverity("condition")},
	},
	"c08": {
		{"count this DCGM event and a kernel Xid 95 for the same GPU as two incidents", func(_ *testing.T, c caseRun) error {
			k := finding.Finding{ID: "kernel-95", Detector: "xid", Xid: 95, GPUPCI: "0002:00:00.0", Count: 1}
			if cs := conditions(c.diagnose(k)); len(cs) != 1 {
				return fmt.Errorf("%d condition diagnoses with the kernel line added, want 1", len(cs))
			}
			return nil
		}},
		{"replace the node on the first occurrence", headlineActionNot("replace")},
		{"leave the node schedulable until it is drained", headlineSeverity("condition")},
	},
	"c09": {
		{"open an incident for the Xid 45", func(_ *testing.T, c caseRun) error {
			for _, d := range c.diagnose() {
				if d.Reason == "XidApplicationError" {
					return fmt.Errorf("the Xid 45 teardown got its own diagnosis %+v", d)
				}
			}
			return conditionCount(1)(nil, c)
		}},
		{"downgrade to an event", headlineSeverity("condition")},
		{"rely on an in-place warm reboot as the final fix", headlineAction("replace")},
	},
	"c11": {
		{"restart the container runtime or kubelet as the remedy", headlineAction("replace")},
	},
	"c12": {
		{"wait out a long repair toleration", func(_ *testing.T, c caseRun) error {
			if h := diagnose.Headline(c.diagnose()); h.Toleration() > 10*time.Minute {
				return fmt.Errorf("toleration %s, want <= 10m", h.Toleration())
			}
			return nil
		}},
		{"classify the pod admission failures as an application problem", func(_ *testing.T, c caseRun) error {
			for _, d := range c.diagnose() {
				if d.FaultClass == "app-error" {
					return fmt.Errorf("diagnosis %s has fault class app-error", d.Reason)
				}
			}
			return nil
		}},
		{"restart only the device plugin", headlineAction("replace")},
	},
	"c13": {
		{"replace the node before one reboot or GPU reset has been tried", headlineActionNot("replace")},
	},
	"c14": {
		{"fire gpu-count or gpu-lost", func(_ *testing.T, c caseRun) error {
			for _, d := range c.diagnose() {
				if d.FaultClass == "gpu-lost" {
					return fmt.Errorf("diagnosis %s is gpu-lost", d.Reason)
				}
			}
			return nil
		}},
		{"replace the node", headlineActionNot("replace")},
		{"raise the Xid 94 itself above an event", func(_ *testing.T, c caseRun) error {
			ds := c.diagnose(finding.Finding{ID: "x94", Detector: "xid", Xid: 94, GPUPCI: "0000:3b:00.0", Count: 1})
			for _, d := range ds {
				if slices.Contains(d.FindingIDs, "x94") && d.Severity != "event" {
					return fmt.Errorf("Xid 94 is in a %s diagnosis %s", d.Severity, d.Reason)
				}
			}
			return nil
		}},
	},
	"c15": {
		{"attribute the failure to any GPU other than GPU 0", headlineGPUs("index:0")},
	},
	"c16": {
		{"open or keep a node condition because of this metric alone", func(_ *testing.T, c caseRun) error { return noCondition(c) }},
	},
	"c18": {
		{"report 0000:03:00.1 (the audio function) as a second faulty device", headlineGPUs("0000:03:00.0")},
		{"wait for an Xid before acting", headlineSeverity("condition")},
		{"treat it as an application problem", func(_ *testing.T, c caseRun) error {
			if h := diagnose.Headline(c.diagnose()); h.FaultClass != "pcie" {
				return fmt.Errorf("fault class %s", h.FaultClass)
			}
			return nil
		}},
	},
	"c19": {
		{"raise an accelerator condition", func(_ *testing.T, c caseRun) error {
			for _, d := range conditions(c.diagnose()) {
				if d.ConditionType == "FleetRepairAcceleratedHardwareReady" {
					return fmt.Errorf("accelerator condition from %s", d.Reason)
				}
			}
			return nil
		}},
		{"replace the node before the in-place runtime/kubelet restart has been tried", headlineAction("restart-runtime")},
	},
	"c20": {
		{"reboot or replace the node", headlineAction("none")},
		{"report a hardware fault for a connection error", func(_ *testing.T, c caseRun) error { return noCondition(c) }},
		{"treat a False condition whose reason is DCGMError as a hardware verdict", func(_ *testing.T, c caseRun) error {
			return noCondition(c.only("node-condition", 0))
		}},
	},
	"c21": {
		{"read XIDError=False or FrequentDockerRestart=False as unhealthy", func(_ *testing.T, c caseRun) error {
			if ds := c.diagnose(); len(ds) != 0 {
				return fmt.Errorf("diagnoses %+v, want none", ds)
			}
			return nil
		}},
		{"start repair because of Unknown or NetworkUnavailable=True during startup", func(_ *testing.T, c caseRun) error { return noCondition(c) }},
	},
	"c23": {
		{"delete the NodeClaim through the health-repair path", headlineAction("none")},
		{"count it towards unhealthy-node percentages of the pool", headlineSeverity("none")},
	},
	"c24": {
		{"replace the node, on the first occurrence or later (a replacement gets the same package)", func(_ *testing.T, c caseRun) error {
			// Later: the same mismatch in an earlier boot too.
			var hist []finding.Finding
			for _, f := range c.findings {
				f.BootID, f.ID = "boot-0", f.ID+"-old"
				hist = append(hist, f)
			}
			for _, f := range c.findings {
				f.BootID = "boot-1"
				hist = append(hist, f)
			}
			ds := c.eng.Diagnose(diagnose.Input{Node: "node-a1", BootID: "boot-1", Findings: hist, Now: time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)})
			for _, d := range append(ds, c.diagnose()...) {
				if d.Action == "replace" || d.EscalateTo == "replace" {
					return fmt.Errorf("diagnosis %s would replace (action %s, escalate %s)", d.Reason, d.Action, d.EscalateTo)
				}
			}
			return nil
		}},
		{"take the lost-GPU path (fault class gpu-lost) because NVML cannot initialise", noFaultClass("gpu-lost")},
		{"report it only as a monitoring-plane problem; without a NoSchedule taint every new GPU pod lands on the node and fails", func(_ *testing.T, c caseRun) error {
			h := diagnose.Headline(c.diagnose())
			if h.Severity != "condition" || h.FaultClass == "monitoring-plane" || h.ConditionType == "" {
				return fmt.Errorf("headline %s %s %s: no condition (and so no quarantine taint)", h.Severity, h.FaultClass, h.Reason)
			}
			return nil
		}},
		{"kill or drain the GPU jobs that are still running", func(_ *testing.T, c caseRun) error {
			if h := diagnose.Headline(c.diagnose()); h.Urgency != "drain-window" {
				return fmt.Errorf("urgency %q, want drain-window", h.Urgency)
			}
			return nil
		}},
		// "reboot many nodes at once when the same (kernel module, library)
		// version pair shows up across the fleet" is the breaker's: the
		// signals of every node of the pair trip its driver_version cohort
		// (controller/breaker TestMemory and the c10 scenario), and a
		// condition per node is what feeds it.
		{"reboot many nodes at once when the same (kernel module, library) version pair shows up across the fleet", func(_ *testing.T, c caseRun) error {
			for _, d := range c.diagnose() {
				if d.Severity == "condition" && d.FaultClass != "driver-regression" {
					return fmt.Errorf("diagnosis %s is %s: the driver cohort would not explain it", d.Reason, d.FaultClass)
				}
			}
			return conditionCount(1)(nil, c)
		}},
	},
	"c25": {
		{"open more than one incident for the SXid, Xid 137 and Xid 94 lines of that second (not three switch faults plus two GPU faults)", func(_ *testing.T, c caseRun) error {
			if ds := c.diagnose(); len(ds) != 1 {
				return fmt.Errorf("%d diagnoses, want one: %+v", len(ds), ds)
			}
			return nil
		}},
		{`read SXid 12028 "Non-fatal" as harmless (it stalls the GPU's NVLink traffic; NVIDIA lists a system restart as the recovery)`, func(_ *testing.T, c caseRun) error {
			h := diagnose.Headline(c.only("nvswitch-sxid", 0).diagnose())
			if h.Severity != "condition" || h.Action != "reboot" {
				return fmt.Errorf("SXid 12028 alone: %s %s (%s)", h.Severity, h.Action, h.Reason)
			}
			return nil
		}},
		{"start memory-retirement handling or an RMA for the Xid 94 lines (no ECC counter moved; the errors came over NVLink)", noFaultClass("memory-uncorrectable")},
		{`read "RST: No, D-RST: No" as a request to reset the GPU`, headlineActionNot("reset-gpu")},
		{"replace the node on the first occurrence", headlineActionNot("replace")},
		{"drop the SXid lines because no Xid rule matches them", func(_ *testing.T, c caseRun) error {
			for _, d := range c.diagnose() {
				n := 0
				for _, e := range d.Evidence {
					if strings.HasPrefix(e, "nvswitch-sxid") {
						n++
					}
				}
				if n == 3 {
					return nil
				}
			}
			return fmt.Errorf("the three SXid findings are not in one diagnosis")
		}},
	},
	"c26": {
		{"start a graceful reboot without a deadline and a forced reboot or power cycle to fall back on (cloud - stop or terminate the instance); the shutdown waits for the same lock", func(_ *testing.T, c caseRun) error {
			h := diagnose.Headline(c.diagnose())
			if h.Action != "reboot" || h.RebootDeadlineSeconds <= 0 || h.Fallback != "power-cycle" {
				return fmt.Errorf("action %s, deadline %ds, fallback %q", h.Action, h.RebootDeadlineSeconds, h.Fallback)
			}
			return nil
		}},
		{"try a GPU reset while a process is stuck inside the driver", headlineActionNot("reset-gpu")},
		{"put the node back into service before a GPU check after the boot has passed", func(_ *testing.T, c caseRun) error {
			// The condition clears only with the boot: the same finding
			// in an earlier boot no longer holds the node, and a second
			// hang after the reboot escalates.
			f := c.findings[0]
			f.BootID = "boot-0"
			ds := c.eng.Diagnose(diagnose.Input{Node: "node-a1", BootID: "boot-1", Findings: []finding.Finding{f}, Now: time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)})
			if len(conditions(ds)) != 0 {
				return fmt.Errorf("a hang of the previous boot still holds the node: %+v", ds)
			}
			g := f
			g.BootID, g.ID = "boot-1", "again"
			h := diagnose.Headline(c.eng.Diagnose(diagnose.Input{Node: "node-a1", BootID: "boot-1", Findings: []finding.Finding{f, g}, Now: time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)}))
			if h.Action != "replace" || !h.Escalated {
				return fmt.Errorf("the hang returning after the reboot gives %s (escalated %v)", h.Action, h.Escalated)
			}
			return nil
		}},
		{"treat the agent's own NVML call timing out on this node as a monitoring-plane problem only (it is the same hang)", func(_ *testing.T, c caseRun) error {
			nvml := finding.Finding{ID: "nvml-timeout", Detector: "monitoring-plane", Count: 1, Attrs: map[string]string{"component": "nvml", "error": "nvmlInit timed out"}}
			if h := diagnose.Headline(c.diagnose(nvml)); h.Reason != "GPUDriverHang" {
				return fmt.Errorf("headline %s with the NVML timeout added", h.Reason)
			}
			return nil
		}},
		{"blame the GPU for a hung-task record without [nvidia] or [nvidia_uvm] frames (that is a storage or kernel problem)", func(_ *testing.T, c caseRun) error {
			f := c.findings[0]
			f.Attrs = map[string]string{"task": "kworker/u64:2", "module": "xfs", "modules": "xfs", "state": "D", "blocked_for": "120s"}
			for _, d := range c.eng.Diagnose(diagnose.Input{Node: "node-a1", Findings: []finding.Finding{f}, Now: time.Now()}) {
				if d.Severity == "condition" || d.FaultClass == "gpu-hang" {
					return fmt.Errorf("an xfs hung task gives %s %s", d.Severity, d.Reason)
				}
			}
			return nil
		}},
		{"replace the node on the first occurrence", headlineActionNot("replace")},
	},
	"c27": {
		{"count the node as healthy or schedulable capacity (it is already leaving)", func(_ *testing.T, c caseRun) error {
			if h := diagnose.Headline(c.diagnose()); h.Reason != "NodeTerminating" {
				return fmt.Errorf("headline %s, want NodeTerminating (which capacity counts exclude)", h.Reason)
			}
			return nil
		}},
		{"open a repair or send a second delete for it", headlineAction("none")},
		{"count it in a breaker's unhealthy ratio (week-old terminating nodes inflate the ratio and can block real repairs, cf. c22)", func(_ *testing.T, c caseRun) error {
			for _, d := range c.diagnose() {
				if d.FaultClass != "provisioning" || d.Severity != "none" {
					return fmt.Errorf("diagnosis %s (%s, %s) would feed a breaker", d.Reason, d.Severity, d.FaultClass)
				}
			}
			return nil
		}},
		// "remove the karpenter.sh/termination finalizer before confirming
		// that the cloud instance is gone": fleetrepair never removes a
		// finalizer; the action is none and the runbook names the check.
		{"remove the karpenter.sh/termination finalizer before confirming that the cloud instance is gone (looked up by its providerID); otherwise the instance leaks", func(_ *testing.T, c caseRun) error {
			h := diagnose.Headline(c.diagnose())
			r := c.eng.Catalog().MustLookup(h.Reason)
			if h.Action != "none" || !strings.Contains(r.Runbook, "providerID") {
				return fmt.Errorf("action %s, runbook %q", h.Action, r.Runbook)
			}
			return nil
		}},
		{"raise a node-health condition (no agent signal is involved)", func(_ *testing.T, c caseRun) error { return noCondition(c) }},
	},
	"c29": {
		{"raise a node condition or start a repair from one job's lines", func(_ *testing.T, c caseRun) error { return noCondition(c) }},
		{"blame only the reporting node (either end, or the switch path between them, can be at fault)", func(_ *testing.T, c caseRun) error {
			for _, d := range c.diagnose() {
				if d.Severity != "event" {
					return fmt.Errorf("diagnosis %s is %s", d.Reason, d.Severity)
				}
			}
			return nil
		}},
		{"replace nodes when many different node pairs fail at the same moment (a switch or fabric problem, for the breaker)", func(_ *testing.T, c caseRun) error {
			// Even the same node failing with many peers (RDMANetworkDegraded)
			// keeps it out of multi-node jobs, never replaces it.
			var more []finding.Finding
			for i, peer := range []string{"10.0.9.1", "10.0.9.2", "10.0.9.3"} {
				more = append(more, finding.Finding{ID: fmt.Sprintf("peer-%d", i), Detector: "nccl-net-error", Count: 1,
					Attrs: map[string]string{"status": "12", "vendor_err": "129", "peer": peer}})
			}
			h := diagnose.Headline(c.diagnose(more...))
			if h.Reason != "RDMANetworkDegraded" || h.Action == "replace" {
				return fmt.Errorf("many peers: headline %s action %s", h.Reason, h.Action)
			}
			return nil
		}},
		{"read failures at the very start of every run as hardware (that is configuration)", func(_ *testing.T, c caseRun) error {
			for _, d := range c.diagnose() {
				if d.FaultClass != "network" {
					return fmt.Errorf("diagnosis %s has fault class %s", d.Reason, d.FaultClass)
				}
			}
			return nil
		}},
	},
}

func noFaultClass(class string) func(*testing.T, caseRun) error {
	return func(_ *testing.T, c caseRun) error {
		for _, d := range c.diagnose() {
			if d.FaultClass == class {
				return fmt.Errorf("diagnosis %s has fault class %s", d.Reason, class)
			}
		}
		return nil
	}
}

// TestMustNot gives every controller-side must_not item of the corpus an
// assertion of its own (cases/README.md).
func TestMustNot(t *testing.T) {
	t.Parallel()
	eng, err := diagnose.New(diagnose.Options{})
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for _, c := range loadCases(t) {
		checks, ok := mustNots[c.ID]
		if !ok {
			continue
		}
		seen[c.ID] = true
		var fs []finding.Finding
		for i, m := range c.Findings {
			fs = append(fs, toFinding(t, c.ID, i, m))
		}
		run := caseRun{eng: eng, findings: fs}
		for _, m := range checks {
			t.Run(c.ID+"/"+m.item, func(t *testing.T) {
				t.Parallel()
				if err := m.check(t, run); err != nil {
					t.Errorf("must not %s: %v", m.item, err)
				}
			})
		}
	}
	for id := range mustNots {
		if !seen[id] {
			t.Errorf("case %s has must_not checks but no fixture", id)
		}
	}
}
