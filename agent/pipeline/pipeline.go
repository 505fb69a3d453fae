// Package pipeline composes the node agent: a kernel-log source (the live
// /dev/kmsg reader, or a file replayed for demos and tests) feeds the
// detector, whose findings go to the uplink; polled monitors (sysfs, NVML,
// DCGM health, container runtime, kubelet) run from one scheduler
// (agent/schedule) and pushed ones (DCGM policy violations) run on their
// own; the heartbeat carries the facts the controller needs beyond findings
// (driver version, GPU inventory, every monitor's state, lost kernel records).
//
// `fleetrepair-agent run` and the demo's in-process agents both run it, so
// the demo exercises the same code as a node.
package pipeline

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"sort"
	"sync"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/fleetrepair/fleetrepair/agent/detect"
	"github.com/fleetrepair/fleetrepair/agent/finding"
	"github.com/fleetrepair/fleetrepair/agent/kmsg"
	"github.com/fleetrepair/fleetrepair/agent/schedule"
	"github.com/fleetrepair/fleetrepair/agent/source"
	"github.com/fleetrepair/fleetrepair/agent/uplink"
)

// Monitor is a polled monitor and its period.
type Monitor struct {
	Checker source.Checker
	Every   time.Duration
}

// KernelLogMonitor is the kernel log's name in heartbeats.
const KernelLogMonitor = "kernel-log"

// Source produces kernel records until ctx ends or the input is exhausted.
// It returns nil at the end of a finite input.
type Source interface {
	Run(ctx context.Context, out chan<- kmsg.Record) error
}

// LostCounter is implemented by sources that can tell how many kernel
// records they missed (the live /dev/kmsg reader).
type LostCounter interface {
	Lost() uint64
}

// Replay is a Source that reads a kernel-log file (any format kmsg.ParseText
// knows) once, optionally pacing records by Interval.
type Replay struct {
	Path     string
	Format   kmsg.Format
	Interval time.Duration // pause between records; 0 sends as fast as read
	// Open replaces os.Open (tests, embedded fixtures).
	Open func(path string) (io.ReadCloser, error)
	// Clock, when set, stamps each record that carries no wall-clock time
	// of its own (a /dev/kmsg or dmesg file: a time since boot only) with
	// the time it is replayed, as the live kmsg Reader places a record just
	// written at boot time + its time since boot. A replay that stands for
	// faults happening now (the demo) so gives findings real times: the
	// node timeline, the toleration clock and the shadow report read them.
	// Nil: such records stay untimed.
	Clock func() time.Time
}

// Run implements Source.
func (r Replay) Run(ctx context.Context, out chan<- kmsg.Record) error {
	open := r.Open
	if open == nil {
		open = func(p string) (io.ReadCloser, error) { return os.Open(p) }
	}
	f, err := open(r.Path)
	if err != nil {
		return fmt.Errorf("open replay file: %w", err)
	}
	defer f.Close()
	format := r.Format
	if format == "" {
		format = kmsg.FormatAuto
	}
	p := kmsg.NewTextParser(f, format, kmsg.TextOptions{})
	for {
		rec, ok := p.Next()
		if !ok {
			break
		}
		if rec.Time.IsZero() && r.Clock != nil {
			rec.Time = r.Clock().UTC()
		}
		select {
		case out <- rec:
		case <-ctx.Done():
			return nil
		}
		if r.Interval > 0 {
			select {
			case <-time.After(r.Interval):
			case <-ctx.Done():
				return nil
			}
		}
	}
	if err := p.Err(); err != nil {
		return fmt.Errorf("replay %s: %w", r.Path, err)
	}
	return nil
}

// Config configures an agent pipeline.
type Config struct {
	Source   Source
	Detector detect.Options
	Uplink   *uplink.Uplink
	// ExpireEvery is how often held detector groups are checked (default 1s).
	ExpireEvery time.Duration
	Log         *slog.Logger
	// OnFinding, when set, sees every finding before it is queued (demo output).
	OnFinding func(finding.Finding)
	// Monitors are polled by one scheduler; Pushers run until ctx ends.
	Monitors []Monitor
	Pushers  []source.Pusher
	// Schedule configures the scheduler (Node defaults to Detector.Node).
	Schedule schedule.Options
}

// Run reads the source, detects, and sends until ctx ends. A finite source
// (Replay) ending does not stop the agent: it keeps heartbeating, as a node
// whose kernel log went quiet does. It returns the first error of the source
// or the uplink.
func Run(ctx context.Context, cfg Config) error {
	if cfg.Source == nil || cfg.Uplink == nil {
		return errors.New("run agent pipeline: Source and Uplink are required")
	}
	if cfg.ExpireEvery <= 0 {
		cfg.ExpireEvery = time.Second
	}
	if cfg.Log == nil {
		cfg.Log = slog.Default()
	}
	det := detect.New(cfg.Detector)
	recs := make(chan kmsg.Record, 256)
	g, ctx := errgroup.WithContext(ctx)
	g.Go(func() error { return cfg.Uplink.Run(ctx) })
	g.Go(func() error {
		defer close(recs)
		return cfg.Source.Run(ctx, recs)
	})

	st := newState(cfg.Uplink)
	send := func(fs []finding.Finding) {
		for _, f := range fs {
			if f.Detector == finding.DetectorDriverVersion {
				st.driverFromKernel(f.Attr(finding.AttrValue))
			}
			if cfg.OnFinding != nil {
				cfg.OnFinding(f)
			}
			cfg.Uplink.Enqueue(f)
		}
	}
	// apply takes one monitor result: state, inventory, findings.
	apply := func(name string, r source.Result) {
		st.apply(name, r)
		fs := make([]finding.Finding, 0, len(r.Findings))
		for _, f := range r.Findings {
			fs = append(fs, detect.Stamp(f, cfg.Detector.Node, cfg.Detector.BootID))
		}
		send(fs)
	}
	st.apply(KernelLogMonitor, source.Result{State: finding.StateOK})
	for _, m := range cfg.Monitors {
		st.apply(m.Checker.Name(), source.Result{State: finding.StateUnknown, Reason: "not checked yet"})
	}
	if len(cfg.Monitors) > 0 {
		sopts := cfg.Schedule
		if sopts.Node == "" {
			sopts.Node = cfg.Detector.Node
		}
		jobs := make([]schedule.Job, 0, len(cfg.Monitors))
		for _, m := range cfg.Monitors {
			c := m.Checker
			jobs = append(jobs, schedule.Job{Name: c.Name(), Every: m.Every, Run: func(ctx context.Context) { apply(c.Name(), c.Check(ctx)) }})
		}
		sched, err := schedule.New(sopts, jobs...)
		if err != nil {
			return fmt.Errorf("run agent pipeline: %w", err)
		}
		g.Go(func() error { return sched.Run(ctx) })
	}
	for _, p := range cfg.Pushers {
		st.apply(p.Name(), source.Result{State: finding.StateUnknown, Reason: "not connected yet"})
		g.Go(func() error { return p.Run(ctx, func(r source.Result) { apply(p.Name(), r) }) })
	}
	g.Go(func() error {
		t := time.NewTicker(cfg.ExpireEvery)
		defer t.Stop()
		open := true
		for {
			select {
			case <-ctx.Done():
				send(det.Flush())
				return nil
			case rec, ok := <-recs:
				if !ok {
					if open {
						send(det.Flush())
						open = false
						recs = nil // a nil channel blocks: keep heartbeating
					}
					continue
				}
				send(det.Feed(rec))
			case <-t.C:
				send(det.Expire(time.Now()))
				if lc, ok := cfg.Source.(LostCounter); ok {
					st.lost(lc.Lost())
				}
			}
		}
	})
	return g.Wait()
}

// state is the heartbeat the pipeline maintains: every monitor's state
// (Since changes only when the state does), the GPU inventory (NVML's when
// it has one, else sysfs's), the driver version (NVML's, else the kernel
// banner's) and the lost kernel records. Every change is handed to the
// uplink at once.
type state struct {
	mu        sync.Mutex
	up        *uplink.Uplink
	monitors  map[string]finding.MonitorState
	gpus      map[string][]finding.GPU
	driver    string // from a monitor (NVML)
	kernelDrv string // from the kernel log banner
	module    string // loaded kernel module version (a monitor's Result)
	library   string // user-space NVML library version (a monitor's Result)
	lostRecs  uint64
}

func newState(up *uplink.Uplink) *state {
	return &state{up: up, monitors: map[string]finding.MonitorState{}, gpus: map[string][]finding.GPU{}}
}

func (s *state) apply(name string, r source.Result) {
	s.mu.Lock()
	defer s.mu.Unlock()
	changed := false
	if r.State != "" {
		old, ok := s.monitors[name]
		if !ok || old.State != r.State || old.Reason != r.Reason {
			since := old.Since
			if !ok || old.State != r.State {
				since = time.Now().UTC()
			}
			s.monitors[name] = finding.MonitorState{Name: name, State: r.State, Since: since, Reason: r.Reason}
			changed = true
		}
	}
	if r.GPUs != nil {
		s.gpus[name] = r.GPUs
		changed = true
	}
	if r.DriverVersion != "" && r.DriverVersion != s.driver {
		s.driver, changed = r.DriverVersion, true
	}
	if r.ModuleVersion != "" && r.ModuleVersion != s.module {
		s.module, changed = r.ModuleVersion, true
	}
	if r.LibraryVersion != "" && r.LibraryVersion != s.library {
		s.library, changed = r.LibraryVersion, true
	}
	if changed {
		s.publish()
	}
}

func (s *state) driverFromKernel(v string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if v != "" && v != s.kernelDrv {
		s.kernelDrv = v
		s.publish()
	}
}

func (s *state) lost(n uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if n != s.lostRecs {
		s.lostRecs = n
		s.publish()
	}
}

// publish hands the heartbeat to the uplink; s.mu is held.
func (s *state) publish() {
	hb := finding.Heartbeat{DriverVersion: s.driver, LostRecords: s.lostRecs, ModuleVersion: s.module, LibraryVersion: s.library}
	if hb.DriverVersion == "" {
		hb.DriverVersion = s.kernelDrv
	}
	if hb.DriverVersion == "" {
		// NVML cannot start (a version mismatch) and the banner is gone
		// from the ring buffer: the loaded module's version still names
		// the driver cohort.
		hb.DriverVersion = s.module
	}
	for _, m := range s.monitors {
		hb.Monitors = append(hb.Monitors, m)
	}
	sort.Slice(hb.Monitors, func(i, j int) bool { return hb.Monitors[i].Name < hb.Monitors[j].Name })
	for _, src := range []string{"nvml", "sysfs-gpu"} {
		if g := s.gpus[src]; len(g) > 0 {
			hb.GPUs = g
			break
		}
	}
	hb.GPUCount = len(hb.GPUs)
	s.up.SetHeartbeat(hb)
}
