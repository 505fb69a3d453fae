// Package procfs watches for processes that cannot die: a process holding an
// NVIDIA device open, in uninterruptible sleep (state D) with a SIGKILL
// pending, for longer than StuckAfter. That is what a GPU container whose
// GPU fell off the bus looks like from the host (case c11): the runtime's
// kill never completes, because the process is stuck inside the driver, and
// the container runtime blocks on it. Only a reboot clears it.
//
// It reads /proc through hostroot.Root (the agent runs with hostPID, or with
// the host's /proc mounted).
package procfs

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/fleetrepair/fleetrepair/agent/finding"
	"github.com/fleetrepair/fleetrepair/agent/source"
	"github.com/fleetrepair/fleetrepair/agent/source/hostroot"
)

// Name is the monitor's name in heartbeats.
const Name = "stuck-gpu-process"

// DefaultStuckAfter is how long a killed GPU process may stay in D state
// before it counts as stuck: the driver normally finishes tearing down a
// context within seconds.
const DefaultStuckAfter = 2 * time.Minute

// Cause is the runtime-wedge cause this monitor reports.
const Cause = "kill of a GPU container does not complete"

// sigkillBit is SIGKILL (9) in the /proc/PID/status signal masks.
const sigkillBit = 1 << (9 - 1)

// Options configure a Monitor.
type Options struct {
	Root       hostroot.Root
	StuckAfter time.Duration // default DefaultStuckAfter
	Now        func() time.Time
}

// Monitor is the stuck-process monitor. Check must not be called concurrently.
type Monitor struct {
	opts     Options
	since    map[int]time.Time // pid -> first seen killed in D state
	reported map[int]bool
}

// New returns a Monitor.
func New(opts Options) *Monitor {
	if opts.StuckAfter <= 0 {
		opts.StuckAfter = DefaultStuckAfter
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	return &Monitor{opts: opts, since: map[int]time.Time{}, reported: map[int]bool{}}
}

// Name implements source.Checker.
func (m *Monitor) Name() string { return Name }

// Proc is what the monitor reads of one process.
type Proc struct {
	PID     int
	Name    string
	State   byte     // 'R', 'S', 'D', ...
	Killed  bool     // SIGKILL pending (SigPnd or ShdPnd)
	Devices []string // NVIDIA device nodes it holds open
}

// Check implements source.Checker: failing while a GPU process has been
// stuck for StuckAfter, with one runtime-wedge finding per stuck process;
// ok otherwise; unknown when /proc cannot be read.
func (m *Monitor) Check(_ context.Context) source.Result {
	now := m.opts.Now()
	procs, err := m.scan()
	if err != nil {
		return source.Result{State: finding.StateUnknown, Reason: err.Error()}
	}
	res := source.Result{State: finding.StateOK}
	alive := map[int]bool{}
	var stuck []string
	for _, p := range procs {
		if p.State != 'D' || !p.Killed || len(p.Devices) == 0 {
			continue
		}
		alive[p.PID] = true
		first, ok := m.since[p.PID]
		if !ok {
			m.since[p.PID] = now
			continue
		}
		if now.Sub(first) < m.opts.StuckAfter {
			continue
		}
		stuck = append(stuck, fmt.Sprintf("%s[%d]", p.Name, p.PID))
		if m.reported[p.PID] {
			continue
		}
		m.reported[p.PID] = true
		res.Findings = append(res.Findings, finding.Finding{Detector: finding.DetectorRuntimeWedge, Time: now,
			Attrs: map[string]string{finding.AttrComponent: "container-runtime", finding.AttrCause: Cause,
				finding.AttrPID: strconv.Itoa(p.PID), finding.AttrProcess: p.Name},
			Evidence: []string{fmt.Sprintf("/proc/%d: %s in uninterruptible sleep with SIGKILL pending for %s, holding %s",
				p.PID, p.Name, now.Sub(first).Round(time.Second), strings.Join(p.Devices, " "))}})
	}
	for pid := range m.since {
		if !alive[pid] {
			delete(m.since, pid)
			delete(m.reported, pid)
		}
	}
	if len(stuck) > 0 {
		sort.Strings(stuck)
		res.State, res.Reason = finding.StateFailing, "killed GPU processes stuck in the driver: "+strings.Join(stuck, ", ")
	}
	return res
}

// scan reads the processes in D state (only those: reading every fd table
// would cost far more than this check is worth).
func (m *Monitor) scan() ([]Proc, error) {
	dir := m.opts.Root.Path("/proc")
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("read proc: %w", err)
	}
	var out []Proc
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join(dir, e.Name(), "status"))
		if err != nil {
			continue // exited
		}
		p := Proc{PID: pid}
		for _, line := range strings.Split(string(b), "\n") {
			k, v, ok := strings.Cut(line, ":")
			if !ok {
				continue
			}
			v = strings.TrimSpace(v)
			switch k {
			case "Name":
				p.Name = v
			case "State":
				if v != "" {
					p.State = v[0]
				}
			case "SigPnd", "ShdPnd":
				if mask, err := strconv.ParseUint(v, 16, 64); err == nil && mask&sigkillBit != 0 {
					p.Killed = true
				}
			}
		}
		if p.State != 'D' || !p.Killed {
			continue
		}
		fds, _ := os.ReadDir(filepath.Join(dir, e.Name(), "fd"))
		seen := map[string]bool{}
		for _, fd := range fds {
			target, err := os.Readlink(filepath.Join(dir, e.Name(), "fd", fd.Name()))
			if err == nil && strings.HasPrefix(target, "/dev/nvidia") && !seen[target] {
				seen[target] = true
				p.Devices = append(p.Devices, target)
			}
		}
		sort.Strings(p.Devices)
		out = append(out, p)
	}
	return out, nil
}
