package dcgm

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fleetrepair/fleetrepair/agent/finding"
	"github.com/fleetrepair/fleetrepair/agent/source"
)

// fakeClient simulates DCGM; it fails the test on any call before a
// successful Connect.
type fakeClient struct {
	t          *testing.T
	mu         sync.Mutex
	connectErr error
	connected  bool
	incidents  []Incident
	healthErr  error
	hangHealth chan struct{}
	violations chan Violation
}

func (c *fakeClient) Connect() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.connected = c.connectErr == nil
	return c.connectErr
}

func (c *fakeClient) must(op string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.connected {
		c.t.Errorf("%s called before a successful Connect (kills the process with go-dcgm)", op)
	}
}

func (c *fakeClient) DeviceCount() (int, error) { c.must("DeviceCount"); return 8, nil }
func (c *fakeClient) Health() ([]Incident, error) {
	c.must("Health")
	if c.hangHealth != nil {
		<-c.hangHealth
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.incidents, c.healthErr
}
func (c *fakeClient) Violations(ctx context.Context) (<-chan Violation, error) {
	c.must("Violations")
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.violations, nil
}

// c20 is the host engine error of case c20.
var c20 = errors.New("Error connecting to nv-hostengine: Host engine connection invalid/disconnected")

func TestMonitorCheck(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name       string
		setup      func(*fakeClient)
		expectGPUs bool
		between    func(*fakeClient)
		states     [2]string
		findings   [2]string
	}{
		{name: "no libdcgm, no GPU", setup: func(c *fakeClient) { c.connectErr = fmt.Errorf("dcgm init: %w", ErrLibraryNotFound) },
			states: [2]string{"absent", "absent"}},
		{name: "no libdcgm on a GPU node", expectGPUs: true, setup: func(c *fakeClient) { c.connectErr = fmt.Errorf("dcgm init: %w", ErrLibraryNotFound) },
			states: [2]string{"unknown", "unknown"}, findings: [2]string{"monitoring-plane/dcgm"}},
		{name: "c20 host engine unreachable, then back", expectGPUs: true,
			setup:   func(c *fakeClient) { c.connectErr = fmt.Errorf("dcgm init: %w", c20) },
			between: func(c *fakeClient) { c.connectErr = nil },
			states:  [2]string{"unknown", "ok"}, findings: [2]string{"monitoring-plane/dcgm"}},
		{name: "healthy", setup: func(*fakeClient) {}, states: [2]string{"ok", "ok"}},
		{name: "incident reported once", setup: func(c *fakeClient) {
			c.incidents = []Incident{{GPU: 1, System: "mem", Result: "fail", Code: "DCGM_FR_UNCONTAINED_ERROR", Message: "XID 95"}}
		}, states: [2]string{"failing", "failing"}, findings: [2]string{"dcgm-health/mem"}},
		{name: "host engine goes away", setup: func(*fakeClient) {},
			between: func(c *fakeClient) { c.healthErr = c20 },
			states:  [2]string{"ok", "unknown"}, findings: [2]string{"", "monitoring-plane/dcgm"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			c := &fakeClient{t: t}
			tt.setup(c)
			m, _ := New(Options{Client: c, ExpectGPUs: tt.expectGPUs, Timeout: time.Second})
			for i := range 2 {
				if i == 1 && tt.between != nil {
					tt.between(c)
				}
				res := m.Check(context.Background())
				var got []string
				for _, f := range res.Findings {
					k := f.Attr(finding.AttrComponent) + f.Attr(finding.AttrSystem)
					got = append(got, f.Detector+"/"+k)
					if f.Detector == finding.DetectorMonitoring && tt.name[:3] == "c20" && !strings.Contains(f.Attr(finding.AttrError), "Host engine connection invalid/disconnected") {
						t.Errorf("monitoring-plane error %q lacks the host engine's message", f.Attr(finding.AttrError))
					}
				}
				if res.State != tt.states[i] || strings.Join(got, " ") != tt.findings[i] {
					t.Errorf("check %d: state %q (%s) findings %q; want %q, %q", i, res.State, res.Reason, got, tt.states[i], tt.findings[i])
				}
			}
		})
	}
}

func TestMonitorHungHealth(t *testing.T) {
	t.Parallel()
	c := &fakeClient{t: t, hangHealth: make(chan struct{})}
	m, _ := New(Options{Client: c, Timeout: 20 * time.Millisecond})
	res := m.Check(context.Background())
	if res.State != finding.StateUnknown || len(res.Findings) != 1 || res.Findings[0].Detector != finding.DetectorMonitoring {
		t.Fatalf("hung health check: %q %+v", res.State, res.Findings)
	}
	res = m.Check(context.Background())
	if res.State != finding.StateUnknown || len(res.Findings) != 0 {
		t.Errorf("still hung: %q %+v", res.State, res.Findings)
	}
	close(c.hangHealth)
}

// TestPolicy covers each policy condition the subscription asks for, and the
// subscription ending (host engine restart): unknown, then resubscribed.
func TestPolicy(t *testing.T) {
	t.Parallel()
	conditions := []Violation{
		{GPU: 0, Condition: "Double-bit ECC error", Detail: "{Location:device NumErrors:1}"},
		{GPU: 1, Condition: "PCI error", Detail: "{ReplayCounter:100}"},
		{GPU: 2, Condition: "Max Retired Pages Limit", Detail: "{SbePages:0 DbePages:60}"},
		{GPU: 3, Condition: "Thermal Limit", Detail: "{ThermalViolation:95}"},
		{GPU: 4, Condition: "Power Limit", Detail: "{PowerViolation:700}"},
		{GPU: 5, Condition: "Nvlink Error", Detail: "{FieldId:1 Counter:3}"},
		{GPU: 6, Condition: "XID Error", Xid: 79},
	}
	c := &fakeClient{t: t, violations: make(chan Violation, len(conditions))}
	_, p := New(Options{Client: c, Retry: time.Millisecond, Timeout: time.Second})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	results := make(chan source.Result, 64)
	done := make(chan error, 1)
	go func() { done <- p.Run(ctx, func(r source.Result) { results <- r }) }()
	if r := <-results; r.State != finding.StateOK {
		t.Fatalf("first result %+v, want ok", r)
	}
	for _, v := range conditions {
		c.violations <- v
	}
	for _, want := range conditions {
		r := <-results
		if len(r.Findings) != 1 {
			t.Fatalf("result %+v", r)
		}
		f := r.Findings[0]
		if f.Detector != finding.DetectorDCGMPolicy || f.Attr(finding.AttrCondition) != want.Condition || f.Xid != want.Xid ||
			f.Attr(finding.AttrGPUIndex) != fmt.Sprint(want.GPU) || f.Time.IsZero() {
			t.Errorf("finding %+v for %+v", f, want)
		}
	}
	// The host engine restarts: the channel closes.
	c.mu.Lock()
	close(c.violations)
	c.violations = make(chan Violation)
	c.mu.Unlock()
	if r := <-results; r.State != finding.StateUnknown || len(r.Findings) != 1 {
		t.Errorf("after the subscription ended: %+v", r)
	}
	if r := <-results; r.State != finding.StateOK {
		t.Errorf("after resubscribing: %+v", r)
	}
	cancel()
	if err := <-done; err != nil {
		t.Errorf("Run: %v", err)
	}
}
