package detect

import (
	"regexp"
	"slices"
	"strings"

	"github.com/fleetrepair/fleetrepair/agent/finding"
	"github.com/fleetrepair/fleetrepair/agent/kmsg"
)

// Kernel reports that carry a stack: the hung-task report (kernel/hung_task.c),
// soft and hard lockups (kernel/watchdog.c) and RCU CPU stall warnings
// (kernel/rcu/tree_stall.h). Each is a header line followed by its details
// (Tainted, the task line, Call Trace and frames, registers), all within a
// few milliseconds (c26). The frames' module names say whose code the task is
// stuck in: "[nvidia]" frames make it the GPU driver's, none make it a
// storage or kernel problem. Frames marked "?" are the unwinder's guesses and
// only count when no reliable frame names a module.
var (
	hungTaskRE  = regexp.MustCompile(`INFO: task (.+):(\d+) blocked for more than (\d+) seconds`)
	softLockRE  = regexp.MustCompile(`BUG: soft lockup - CPU#(\d+) stuck for (\d+)s! \[(.*):(\d+)\]`)
	hardLockRE  = regexp.MustCompile(`Watchdog detected hard LOCKUP on cpu (\d+)`)
	rcuStallRE  = regexp.MustCompile(`INFO: (\w+) (?:self-detected stall on CPU|detected stalls on CPUs/tasks)`)
	stackTaskRE = regexp.MustCompile(`^task:\s*(\S+)\s+state:\s*(\S+).*?\bpid:\s*(\d+)`)
	// rcuCPURE is a CPU line of an RCU stall warning (print_cpu_stall_info
	// in kernel/rcu/tree_stall.h): "rcu: \t37-....: (59997 ticks this GP)",
	// without the "rcu: " prefix on kernels before 5.x. It names the stalled CPU.
	rcuCPURE = regexp.MustCompile(`^(?:rcu:\s+)?(\d+)-[.0-9A-Za-z]{3,}:\s*\(`)
	// frameRE and ripRE read a stack frame in both renderings: today's
	// "? func+0x1e/0x40 [mod]" and older kernels' (3.x/4.x, e.g. RHEL 7)
	// "[<ffffffffa09c376e>] ? func+0x1e/0x40 [mod]" with the address first.
	frameRE = regexp.MustCompile(`^(?:\[<[0-9a-f]+>\]\s+)?(\? )?[\w.$]+\+0x[0-9a-f]+/0x[0-9a-f]+(?: \[(\w+)\])?`)
	ripRE   = regexp.MustCompile(`^RIP: [0-9a-f]{4}:(?:\[<[0-9a-f]+>\]\s+\[<[0-9a-f]+>\]\s+)?[\w.$]+\+0x[0-9a-f]+/0x[0-9a-f]+(?: \[(\w+)\])?`)
	// stackDetailRE are the other lines of such a report.
	stackDetailRE = regexp.MustCompile(`^(?:Tainted:|Not tainted|"echo 0 > /proc/sys/kernel/hung_task_timeout_secs"|Call Trace:|</?(?:TASK|IRQ|NMI|SOFTIRQ)>|Modules linked in:|CPU: \d+ |Hardware name:|Code: |[A-Z0-9]{2,3}: |rcu: |\(detected by|Sending NMI|NMI backtrace|task:|Workqueue:|irq event stamp:|hardirqs |softirqs |Showing all locks|\d+ locks? held by|#\d+: |Kernel panic|---\[ end trace)`)
)

// stackReport is what a held report has gathered so far.
type stackReport struct {
	reliable, guessed []string // modules of frames, innermost first
}

// stackLine handles a record that opens or continues a report with a stack;
// it returns false when the record is neither.
func (d *Detector) stackLine(rec kmsg.Record, closed, cur *[]finding.Finding) bool {
	msg := strings.TrimSpace(rec.Message)
	if f, ok := stackHeader(msg); ok {
		if g := d.find(kindStack, "stack"); g != nil {
			*closed = d.close(g, *closed)
		}
		g := d.openGroup(kindStack, "stack", f, rec, d.rules.Stack.Window.Duration)
		g.stack = &stackReport{}
		return true
	}
	g := d.find(kindStack, "stack")
	if g == nil || !d.joins(g, rec) {
		return false
	}
	switch {
	case frameRE.MatchString(msg):
		m := frameRE.FindStringSubmatch(msg)
		if m[2] != "" {
			if m[1] == "" {
				g.stack.reliable = appendNew(g.stack.reliable, m[2])
			} else {
				g.stack.guessed = appendNew(g.stack.guessed, m[2])
			}
		}
	case ripRE.MatchString(msg):
		if m := ripRE.FindStringSubmatch(msg); m[1] != "" {
			g.stack.reliable = appendNew(g.stack.reliable, m[1])
		}
	case stackTaskRE.MatchString(msg):
		m := stackTaskRE.FindStringSubmatch(msg)
		g.f.Attrs[finding.AttrState] = m[2]
		if g.f.Attrs[finding.AttrPID] == "" {
			g.f.Attrs[finding.AttrPID] = m[3]
		}
	case g.f.Detector == finding.DetectorRCUStall && rcuCPURE.MatchString(msg):
		// The stalled CPUs, comma-separated: the controller ties a stall
		// to a lockup of the same CPU (a stall with no stack of its own
		// inside the driver's hang is the driver's).
		cpu := rcuCPURE.FindStringSubmatch(msg)[1]
		if c := g.f.Attrs[finding.AttrCPU]; c == "" {
			g.f.Attrs[finding.AttrCPU] = cpu
		} else if !slices.Contains(strings.Split(c, ","), cpu) {
			g.f.Attrs[finding.AttrCPU] = c + "," + cpu
		}
	case stackDetailRE.MatchString(msg):
	default:
		return false
	}
	d.add(g, rec)
	return true
}

// stackHeader reads the first line of a report with a stack.
func stackHeader(msg string) (finding.Finding, bool) {
	if !strings.Contains(msg, "INFO: ") && !strings.Contains(msg, "LOCKUP") && !strings.Contains(msg, "lockup") {
		return finding.Finding{}, false
	}
	if m := hungTaskRE.FindStringSubmatch(msg); m != nil {
		return finding.Finding{Detector: finding.DetectorHungTask, Attrs: map[string]string{
			finding.AttrTask: m[1], finding.AttrPID: m[2], finding.AttrBlockedFor: m[3] + "s"}}, true
	}
	if m := softLockRE.FindStringSubmatch(msg); m != nil {
		return finding.Finding{Detector: finding.DetectorSoftLockup, Attrs: map[string]string{
			finding.AttrKind: "soft", finding.AttrCPU: m[1], finding.AttrStuckFor: m[2] + "s", finding.AttrTask: m[3], finding.AttrPID: m[4]}}, true
	}
	if m := hardLockRE.FindStringSubmatch(msg); m != nil {
		return finding.Finding{Detector: finding.DetectorSoftLockup, Attrs: map[string]string{
			finding.AttrKind: "hard", finding.AttrCPU: m[1]}}, true
	}
	if m := rcuStallRE.FindStringSubmatch(msg); m != nil {
		return finding.Finding{Detector: finding.DetectorRCUStall, Attrs: map[string]string{finding.AttrKind: m[1]}}, true
	}
	return finding.Finding{}, false
}

// stackFinding completes a report: the modules on its stack.
func (d *Detector) stackFinding(g *group) finding.Finding {
	f := g.f
	mods := append(slices.Clone(g.stack.reliable), g.stack.guessed...)
	mods = slices.Compact(mods)
	var uniq []string
	for _, m := range mods {
		uniq = appendNew(uniq, m)
	}
	if len(uniq) > 0 {
		f.Attrs[finding.AttrModules] = strings.Join(uniq, ",")
		// The innermost reliable frame with a module names it; the GPU
		// driver's module wins among them (a task inside nvidia's lock
		// shows module-less rwsem frames first, then [nvidia], then maybe
		// the caller's module). Guessed frames count only without any
		// reliable one.
		list := g.stack.reliable
		if len(list) == 0 {
			list = g.stack.guessed
		}
		f.Attrs[finding.AttrModule] = list[0]
		if i := slices.IndexFunc(list, func(m string) bool { return slices.Contains(d.rules.Stack.GPUModules, m) }); i >= 0 {
			f.Attrs[finding.AttrModule] = list[i]
		}
	}
	return f
}

func appendNew(list []string, s string) []string {
	if slices.Contains(list, s) {
		return list
	}
	return append(list, s)
}
