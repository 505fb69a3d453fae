// Package cri probes the container runtime through the CRI (Version and
// Status over its unix socket, e.g. containerd's), each call with a timeout:
// a runtime that does not answer, or says it is not ready, is wedged. This
// is a fact about the runtime, not about the GPUs.
package cri

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"strings"
	"time"

	"github.com/fleetrepair/fleetrepair/agent/finding"
	"github.com/fleetrepair/fleetrepair/agent/source"
)

// Name is the monitor's name in heartbeats.
const Name = "container-runtime"

// DefaultSocket is containerd's CRI socket.
const DefaultSocket = "/run/containerd/containerd.sock"

// DefaultTimeout bounds each CRI call.
const DefaultTimeout = 5 * time.Second

// DefaultFailAfter is how many failed checks in a row make the runtime
// failing: one slow answer during a runtime restart is not a wedge.
const DefaultFailAfter = 2

// Condition is one CRI runtime condition (RuntimeReady, NetworkReady).
type Condition struct {
	Type    string
	Status  bool
	Reason  string
	Message string
}

// Runtime is what the monitor needs of the CRI runtime service.
type Runtime interface {
	// Version returns the runtime's name and version.
	Version(ctx context.Context) (name, version string, err error)
	// Status returns the runtime's conditions.
	Status(ctx context.Context) ([]Condition, error)
}

// Options configure a Monitor.
type Options struct {
	// Runtime is the CRI client; default Dial(Socket).
	Runtime   Runtime
	Socket    string        // host path, default DefaultSocket (through hostroot by the caller)
	Timeout   time.Duration // default DefaultTimeout
	FailAfter int           // default DefaultFailAfter
	Now       func() time.Time
}

// Monitor probes the runtime. Check must not be called concurrently.
type Monitor struct {
	opts     Options
	failures int
	reported string
	// Version is the last "name version" the runtime reported.
	Version string
}

// New returns a Monitor.
func New(opts Options) *Monitor {
	if opts.Socket == "" {
		opts.Socket = DefaultSocket
	}
	if opts.Runtime == nil {
		opts.Runtime = Dial(opts.Socket)
	}
	if opts.Timeout <= 0 {
		opts.Timeout = DefaultTimeout
	}
	if opts.FailAfter <= 0 {
		opts.FailAfter = DefaultFailAfter
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	return &Monitor{opts: opts}
}

// Name implements source.Checker.
func (m *Monitor) Name() string { return Name }

// Check implements source.Checker: ok when Status answers in time with
// RuntimeReady; after FailAfter failures in a row, failing with one
// runtime-wedge finding (cause: no answer, not ready, refused); unknown when
// the socket does not exist or may not be opened (a deployment problem).
func (m *Monitor) Check(ctx context.Context) source.Result {
	cctx, cancel := context.WithTimeout(ctx, m.opts.Timeout)
	defer cancel()
	name, version, err := m.opts.Runtime.Version(cctx)
	var conds []Condition
	if err == nil {
		m.Version = strings.TrimSpace(name + " " + version)
		conds, err = m.opts.Runtime.Status(cctx)
	}
	cause := ""
	switch {
	case errors.Is(err, fs.ErrNotExist) || errors.Is(err, fs.ErrPermission):
		m.failures = 0
		return source.Result{State: finding.StateUnknown, Reason: err.Error()}
	case errors.Is(err, context.DeadlineExceeded) || errors.Is(cctx.Err(), context.DeadlineExceeded):
		cause = fmt.Sprintf("CRI call did not answer within %s", m.opts.Timeout)
	case err != nil:
		cause = "CRI call failed: " + err.Error()
	default:
		for _, c := range conds {
			if c.Type == "RuntimeReady" && !c.Status {
				cause = strings.TrimSpace("runtime not ready: " + c.Reason + " " + c.Message)
			}
		}
	}
	if cause == "" {
		m.failures, m.reported = 0, ""
		return source.Result{State: finding.StateOK}
	}
	m.failures++
	if m.failures < m.opts.FailAfter {
		return source.Result{State: finding.StateOK, Reason: cause}
	}
	res := source.Result{State: finding.StateFailing, Reason: cause}
	if m.reported == "" {
		m.reported = cause
		res.Findings = []finding.Finding{{Detector: finding.DetectorRuntimeWedge, Time: m.opts.Now(),
			Attrs:    map[string]string{finding.AttrComponent: "container-runtime", finding.AttrCause: cause},
			Evidence: []string{fmt.Sprintf("CRI %s (%s): %s, %d checks in a row", m.opts.Socket, m.Version, cause, m.failures)}}}
	}
	return res
}

var _ source.Checker = (*Monitor)(nil)
