// Package kubelet probes the kubelet's /healthz endpoint (by default
// http://127.0.0.1:10248/healthz, the kubelet's local health port) with a
// timeout. A kubelet that does not answer, or answers unhealthy, several
// checks in a row, is wedged: a runtime-wedge finding, not a GPU fault. A
// refused connection makes the monitor unknown, not failing.
package kubelet

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"syscall"
	"time"

	"github.com/fleetrepair/fleetrepair/agent/finding"
	"github.com/fleetrepair/fleetrepair/agent/source"
)

// Name is the monitor's name in heartbeats.
const Name = "kubelet"

// DefaultURL is the kubelet's local health endpoint.
const DefaultURL = "http://127.0.0.1:10248/healthz"

// Options configure a Monitor.
type Options struct {
	URL       string        // default DefaultURL
	Timeout   time.Duration // default 5s
	FailAfter int           // failed checks in a row before failing; default 2
	Client    *http.Client  // default a client without keep-alives
	Now       func() time.Time
}

// Monitor probes the kubelet. Check must not be called concurrently.
type Monitor struct {
	opts     Options
	failures int
	reported bool
}

// New returns a Monitor.
func New(opts Options) *Monitor {
	if opts.URL == "" {
		opts.URL = DefaultURL
	}
	if opts.Timeout <= 0 {
		opts.Timeout = 5 * time.Second
	}
	if opts.FailAfter <= 0 {
		opts.FailAfter = 2
	}
	if opts.Client == nil {
		// No idle connections: one probe a minute does not need one held open.
		opts.Client = &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	return &Monitor{opts: opts}
}

// Name implements source.Checker.
func (m *Monitor) Name() string { return Name }

// Check implements source.Checker.
func (m *Monitor) Check(ctx context.Context) source.Result {
	ctx, cancel := context.WithTimeout(ctx, m.opts.Timeout)
	defer cancel()
	cause := ""
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, m.opts.URL, nil)
	if err != nil {
		return source.Result{State: finding.StateUnknown, Reason: fmt.Sprintf("build kubelet probe: %v", err)}
	}
	resp, err := m.opts.Client.Do(req)
	switch {
	case errors.Is(err, syscall.ECONNREFUSED):
		// Nothing listens: a kubelet with another health port, or no kubelet
		// (a test machine). The kubelet's own NotReady path covers a dead
		// kubelet; this monitor cannot tell which it is.
		m.failures = 0
		return source.Result{State: finding.StateUnknown, Reason: "kubelet /healthz: connection refused"}
	case err != nil && ctx.Err() != nil:
		cause = fmt.Sprintf("kubelet /healthz did not answer within %s", m.opts.Timeout)
	case err != nil:
		cause = "kubelet /healthz: " + err.Error()
	default:
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			cause = fmt.Sprintf("kubelet /healthz: %d %s", resp.StatusCode, strings.TrimSpace(string(body)))
		}
	}
	if cause == "" {
		m.failures, m.reported = 0, false
		return source.Result{State: finding.StateOK}
	}
	m.failures++
	if m.failures < m.opts.FailAfter {
		return source.Result{State: finding.StateOK, Reason: cause}
	}
	res := source.Result{State: finding.StateFailing, Reason: cause}
	if !m.reported {
		m.reported = true
		res.Findings = []finding.Finding{{Detector: finding.DetectorRuntimeWedge, Time: m.opts.Now(),
			Attrs:    map[string]string{finding.AttrComponent: "kubelet", finding.AttrCause: cause},
			Evidence: []string{fmt.Sprintf("%s: %s, %d checks in a row", m.opts.URL, cause, m.failures)}}}
	}
	return res
}
