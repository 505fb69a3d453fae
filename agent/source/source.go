// Package source holds what the node agent's data sources share: the Result
// a monitor returns (its state, findings and inventory facts), the Checker
// and Pusher interfaces the pipeline drives, and Guard, which time-boxes
// calls into libraries that cannot be interrupted (NVML, DCGM).
//
// Each source lives in a sub-package (sysfs, nvml, dcgm, cri, kubelet,
// procfs). Sources read raw facts and state them; they never decide an
// action. Host paths go through hostroot.Root, so tests run on testdata
// trees.
package source

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/fleetrepair/fleetrepair/agent/finding"
)

// Result is what one check of a monitor (or one push) observed.
type Result struct {
	// State is the monitor's state: finding.StateOK, StateFailing,
	// StateUnknown or StateAbsent. Empty leaves the state as it was (a push
	// of one more finding).
	State string
	// Reason explains a state other than ok, in words an SRE reads
	// ("NVML init: ERROR_LIBRARY_NOT_FOUND"); empty for ok.
	Reason string
	// Findings are new facts, not yet stamped (detect.Stamp). A monitor
	// reports a fact when it appears or changes, not at every check.
	Findings []finding.Finding
	// GPUs is the GPU inventory, when this monitor knows it; nil when not.
	GPUs []finding.GPU
	// DriverVersion is the NVIDIA driver version, when known.
	DriverVersion string
	// ModuleVersion and LibraryVersion are the loaded kernel module's and
	// the user-space NVML library's versions, when known (heartbeat).
	ModuleVersion, LibraryVersion string
}

// Checker is a monitor polled by the scheduler (agent/schedule).
type Checker interface {
	// Name is the monitor's name in heartbeats ("nvml", "sysfs-gpu", ...).
	Name() string
	// Check observes once. It must return within the ctx deadline, and never
	// panic or kill the process because a library is missing.
	Check(ctx context.Context) Result
}

// Pusher is a monitor that is pushed events (a DCGM policy subscription);
// it is started once and not polled.
type Pusher interface {
	Name() string
	// Run delivers results until ctx ends; it reconnects on its own and
	// returns only when ctx is done.
	Run(ctx context.Context, emit func(Result)) error
}

// Errors of Guard.Do.
var (
	// ErrTimeout: the call did not return within its time box. It keeps
	// running in the background (a cgo call cannot be interrupted).
	ErrTimeout = errors.New("call timed out")
	// ErrBusy: an earlier call that timed out has not returned yet; no new
	// call is started, so a hung driver costs one goroutine, not one per poll.
	ErrBusy = errors.New("earlier call still hung")
)

// Guard time-boxes blocking calls into a library. The zero value is ready.
type Guard struct {
	hung atomic.Bool
}

// Hung reports whether a timed-out call is still running.
func (g *Guard) Hung() bool { return g.hung.Load() }

// Do runs fn in its own goroutine and waits at most d (or until ctx ends).
// It returns fn's error, ErrTimeout (wrapped, naming op) or ErrBusy.
func (g *Guard) Do(ctx context.Context, op string, d time.Duration, fn func() error) error {
	if !g.hung.CompareAndSwap(false, true) {
		return fmt.Errorf("%s: %w", op, ErrBusy)
	}
	done := make(chan error, 1)
	go func() {
		err := fn()
		g.hung.Store(false) // before the send: a caller that got the answer may call again at once
		done <- err
	}()
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case err := <-done:
		return err
	case <-t.C:
		return fmt.Errorf("%s: no answer within %s: %w", op, d, ErrTimeout)
	case <-ctx.Done():
		return fmt.Errorf("%s: %w", op, ctx.Err())
	}
}
