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

	"github.com/prometheus/client_golang/prometheus"
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

// Opener is implemented by sources that open their input before Run (the
// live kernel log, kmsg.Device): the pipeline calls Open, reports the
// kernel-log monitor ok once it succeeded, then calls Run.
type Opener interface {
	Open() error
}

// Kernel-log source retry bounds (Config.SourceRetry): a source that cannot
// be opened, or whose Run fails, is tried again after SourceRetry, doubling
// up to MaxSourceRetry.
const (
	DefaultSourceRetry = time.Second
	MaxSourceRetry     = time.Minute
)

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
	// SourceRetry is the first wait before the kernel-log source is tried
	// again after it failed to open or read (default DefaultSourceRetry,
	// doubling to MaxSourceRetry).
	SourceRetry time.Duration
	// Registerer, when set, gets the pipeline's metrics:
	// fleetrepair_agent_monitor_state{monitor,state} (1 for each monitor's
	// current state, 0 for the others) and
	// fleetrepair_agent_source_failures_total{source} (kernel-log source
	// failures: open or read).
	Registerer prometheus.Registerer
}

// Run reads the source, detects, and sends until ctx ends. A finite source
// (Replay) ending does not stop the agent: it keeps heartbeating, as a node
// whose kernel log went quiet does. A source that fails to open or read
// does not stop it either: the kernel-log monitor turns unknown with the
// error as its reason (heartbeat, metric), the failure is logged and
// counted, and the source is opened and run again with backoff
// (SourceRetry) while the other monitors go on. It returns the first error
// of the uplink or the scheduler.
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
	if cfg.SourceRetry <= 0 {
		cfg.SourceRetry = DefaultSourceRetry
	}
	met, err := newMetrics(cfg.Registerer)
	if err != nil {
		return fmt.Errorf("run agent pipeline: %w", err)
	}
	det := detect.New(cfg.Detector)
	recs := make(chan kmsg.Record, 256)
	st := newState(cfg.Uplink, met)
	g, ctx := errgroup.WithContext(ctx)
	g.Go(func() error { return cfg.Uplink.Run(ctx) })
	g.Go(func() error {
		defer close(recs)
		runSource(ctx, cfg, st, met, recs)
		return nil
	})

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

// runSource runs the kernel-log source until it ends (a finite input: the
// kernel-log monitor stays ok) or ctx ends. Each failure to open or read
// makes the monitor unknown, is logged and counted, and is followed by a
// wait (cfg.SourceRetry, doubling to MaxSourceRetry; back to SourceRetry
// after a run that lasted MaxSourceRetry) and another try.
func runSource(ctx context.Context, cfg Config, st *state, met *metrics, out chan<- kmsg.Record) {
	op, opens := cfg.Source.(Opener)
	if opens {
		st.apply(KernelLogMonitor, source.Result{State: finding.StateUnknown, Reason: "not opened yet"})
	}
	wait := cfg.SourceRetry
	for {
		var err error
		if opens {
			err = op.Open()
		}
		if err == nil {
			st.apply(KernelLogMonitor, source.Result{State: finding.StateOK})
			began := time.Now()
			if err = cfg.Source.Run(ctx, out); err == nil {
				return // a finite input ended, or ctx did
			}
			if time.Since(began) >= MaxSourceRetry {
				wait = cfg.SourceRetry
			}
		}
		if ctx.Err() != nil {
			return
		}
		st.apply(KernelLogMonitor, source.Result{State: finding.StateUnknown, Reason: err.Error()})
		met.sourceFailures.WithLabelValues(KernelLogMonitor).Inc()
		cfg.Log.Warn("kernel log source failed; the other monitors go on, retrying", "err", err, "retry_in", wait)
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
		wait = min(2*wait, MaxSourceRetry)
	}
}

// metrics are the pipeline's Prometheus metrics (Config.Registerer).
type metrics struct {
	monitorState   *prometheus.GaugeVec
	sourceFailures *prometheus.CounterVec
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		monitorState: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: "fleetrepair_agent", Name: "monitor_state",
			Help: "1 for each monitor's current state (ok, failing, unknown, absent), 0 for its other states; the heartbeat carries the reason.",
		}, []string{"monitor", "state"}),
		sourceFailures: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "fleetrepair_agent", Name: "source_failures_total",
			Help: "Failures of the kernel-log source to open or read; each is retried with backoff.",
		}, []string{"source"}),
	}
	if reg != nil {
		for _, c := range []prometheus.Collector{m.monitorState, m.sourceFailures} {
			if err := reg.Register(c); err != nil {
				return nil, fmt.Errorf("register pipeline metrics: %w", err)
			}
		}
	}
	return m, nil
}

// monitorStates are the values of the state label.
var monitorStates = []string{finding.StateOK, finding.StateFailing, finding.StateUnknown, finding.StateAbsent}

// state is the heartbeat the pipeline maintains: every monitor's state
// (Since changes only when the state does), the GPU inventory (NVML's when
// it has one, else sysfs's), the driver version (NVML's, else the kernel
// banner's) and the lost kernel records. Every change is handed to the
// uplink at once.
type state struct {
	mu        sync.Mutex
	up        *uplink.Uplink
	met       *metrics
	monitors  map[string]finding.MonitorState
	gpus      map[string][]finding.GPU
	driver    string // from a monitor (NVML)
	kernelDrv string // from the kernel log banner
	module    string // loaded kernel module version (a monitor's Result)
	library   string // user-space NVML library version (a monitor's Result)
	lostRecs  uint64
}

func newState(up *uplink.Uplink, met *metrics) *state {
	return &state{up: up, met: met, monitors: map[string]finding.MonitorState{}, gpus: map[string][]finding.GPU{}}
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
			for _, v := range monitorStates {
				g := 0.0
				if v == r.State {
					g = 1
				}
				s.met.monitorState.WithLabelValues(name, v).Set(g)
			}
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
