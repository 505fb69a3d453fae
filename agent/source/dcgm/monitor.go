package dcgm

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/fleetrepair/fleetrepair/agent/finding"
	"github.com/fleetrepair/fleetrepair/agent/source"
)

// Names of the monitors in heartbeats.
const (
	Name       = "dcgm-health"
	PolicyName = "dcgm-policy"
)

// DefaultTimeout is the time box of one DCGM call.
const DefaultTimeout = 5 * time.Second

// Options configure the DCGM monitors.
type Options struct {
	// Client is DCGM; default NewClient(Address).
	Client Client
	// Address of nv-hostengine, default "localhost:5555".
	Address string
	// Timeout bounds every call; default DefaultTimeout.
	Timeout time.Duration
	// ExpectGPUs says the node should have NVIDIA GPUs; without it a missing
	// libdcgm means "absent".
	ExpectGPUs bool
	// Retry is the pause before the policy subscription reconnects; default 30s.
	Retry time.Duration
	Now   func() time.Time
}

// conn is the connection state shared by Monitor and Policy: one Connect,
// one Guard.
type conn struct {
	opts      Options
	guard     source.Guard
	mu        sync.Mutex
	connected bool
	lastErr   string
}

// Monitor polls DCGM's health watches. Check must not be called concurrently.
type Monitor struct {
	c        *conn
	reported map[string]bool
}

// Policy is the pushed policy-violation subscription.
type Policy struct{ c *conn }

// New returns the health Monitor and the Policy subscription, sharing one
// connection.
func New(opts Options) (*Monitor, *Policy) {
	if opts.Address == "" {
		opts.Address = "localhost:5555"
	}
	if opts.Client == nil {
		opts.Client = NewClient(opts.Address)
	}
	if opts.Timeout <= 0 {
		opts.Timeout = DefaultTimeout
	}
	if opts.Retry <= 0 {
		opts.Retry = 30 * time.Second
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	c := &conn{opts: opts}
	return &Monitor{c: c, reported: map[string]bool{}}, &Policy{c: c}
}

// connect connects once; it returns a Result to report when not connected.
func (c *conn) connect(ctx context.Context) (source.Result, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.connected {
		return source.Result{}, true
	}
	err := c.guard.Do(ctx, "dcgm connect", c.opts.Timeout, c.opts.Client.Connect)
	if err == nil {
		c.connected, c.lastErr = true, ""
		return source.Result{}, true
	}
	res := source.Result{State: finding.StateUnknown, Reason: err.Error()}
	if errors.Is(err, ErrLibraryNotFound) && !c.opts.ExpectGPUs {
		res.State = finding.StateAbsent
		return res, false
	}
	if msg := err.Error(); msg != c.lastErr && !errors.Is(err, source.ErrBusy) {
		c.lastErr = msg
		res.Findings = []finding.Finding{monitoringPlane(msg, c.opts.Now())}
	}
	return res, false
}

// lost marks the connection lost after a failed call (the host engine went
// away): the next check reconnects, and reports why.
func (c *conn) lost(err error) source.Result {
	c.mu.Lock()
	defer c.mu.Unlock()
	res := source.Result{State: finding.StateUnknown, Reason: err.Error()}
	if !errors.Is(err, source.ErrTimeout) && !errors.Is(err, source.ErrBusy) {
		c.connected = false // reconnect; a hung call keeps the connection marked
	}
	if msg := err.Error(); msg != c.lastErr && !errors.Is(err, source.ErrBusy) {
		c.lastErr = msg
		res.Findings = []finding.Finding{monitoringPlane(msg, c.opts.Now())}
	}
	return res
}

func monitoringPlane(msg string, now time.Time) finding.Finding {
	return finding.Finding{Detector: finding.DetectorMonitoring, Time: now,
		Attrs:    map[string]string{finding.AttrComponent: "dcgm", finding.AttrError: msg},
		Evidence: []string{"dcgm: " + msg}}
}

// Name implements source.Checker.
func (m *Monitor) Name() string { return Name }

// Check implements source.Checker: ok when the health watches report no
// incident, failing with a dcgm-health finding per new incident, unknown
// (with a monitoring-plane finding) when the host engine cannot be reached,
// absent without libdcgm on a node where no GPU is expected.
func (m *Monitor) Check(ctx context.Context) source.Result {
	if res, ok := m.c.connect(ctx); !ok {
		return res
	}
	var incidents []Incident
	err := m.c.guard.Do(ctx, "dcgm health check", m.c.opts.Timeout, func() (e error) { incidents, e = m.c.opts.Client.Health(); return })
	if err != nil {
		return m.c.lost(err)
	}
	m.c.mu.Lock()
	m.c.lastErr = ""
	m.c.mu.Unlock()
	res := source.Result{State: finding.StateOK}
	now := m.c.opts.Now()
	seen := map[string]bool{}
	var reasons []string
	for _, in := range incidents {
		key := fmt.Sprintf("%d/%s/%s", in.GPU, in.System, in.Code)
		seen[key] = true
		reasons = append(reasons, fmt.Sprintf("GPU %d %s %s: %s", in.GPU, in.System, in.Result, in.Code))
		if m.reported[key] {
			continue
		}
		m.reported[key] = true
		res.Findings = append(res.Findings, finding.Finding{Detector: finding.DetectorDCGMHealth, Time: now,
			Attrs: map[string]string{finding.AttrGPUIndex: strconv.Itoa(in.GPU), finding.AttrSystem: in.System,
				finding.AttrErrorCode: in.Code, finding.AttrResult: in.Result, finding.AttrFatal: strconv.FormatBool(in.Result == "fail"),
				finding.AttrMessage: in.Message},
			Evidence: []string{fmt.Sprintf("DCGM health %s on GPU %d (%s): %s %s", in.Result, in.GPU, in.System, in.Code, in.Message)}})
	}
	for k := range m.reported {
		if !seen[k] {
			delete(m.reported, k)
		}
	}
	if len(reasons) > 0 {
		res.State, res.Reason = finding.StateFailing, strings.Join(reasons, "; ")
	}
	return res
}

// Name implements source.Pusher.
func (p *Policy) Name() string { return PolicyName }

// Run implements source.Pusher: it subscribes to the policy violations and
// emits one dcgm-policy finding per violation (with the Xid for the Xid
// condition), ok while subscribed, unknown while the host engine cannot be
// reached; it retries every Options.Retry until ctx ends.
func (p *Policy) Run(ctx context.Context, emit func(source.Result)) error {
	c := p.c
	for {
		res, ok := c.connect(ctx)
		if ok {
			var ch <-chan Violation
			err := c.guard.Do(ctx, "dcgm policy subscribe", c.opts.Timeout, func() (e error) {
				ch, e = c.opts.Client.Violations(ctx)
				return
			})
			if err == nil {
				emit(source.Result{State: finding.StateOK})
				p.drain(ctx, ch, emit)
				if ctx.Err() != nil {
					return nil
				}
				err = fmt.Errorf("dcgm policy subscription: %w", ErrNotConnected)
			}
			res = c.lost(err)
		}
		emit(res)
		t := time.NewTimer(c.opts.Retry)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil
		case <-t.C:
		}
	}
}

// drain emits violations until the channel closes or ctx ends.
func (p *Policy) drain(ctx context.Context, ch <-chan Violation, emit func(source.Result)) {
	for {
		select {
		case <-ctx.Done():
			return
		case v, ok := <-ch:
			if !ok {
				return
			}
			t := v.Time
			if t.IsZero() {
				t = p.c.opts.Now()
			}
			f := finding.Finding{Detector: finding.DetectorDCGMPolicy, Time: t, Xid: v.Xid,
				Attrs:    map[string]string{finding.AttrCondition: v.Condition, finding.AttrGPUIndex: strconv.Itoa(v.GPU)},
				Evidence: []string{fmt.Sprintf("DCGM policy violation on GPU %d: %s %s", v.GPU, v.Condition, v.Detail)}}
			if v.Detail != "" {
				f.Attrs[finding.AttrMessage] = v.Detail
			}
			emit(source.Result{Findings: []finding.Finding{f}})
		}
	}
}
