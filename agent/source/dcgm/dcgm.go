// Package dcgm is the agent's DCGM monitor: health watches polled through
// the scheduler (Monitor, a source.Checker) and the policy-violation
// subscription pushed by the host engine (Policy, a source.Pusher: double-bit
// ECC, PCIe, retired pages, thermal, power, NVLink and Xid).
//
// DCGM is reached through Client, a small consumer-side interface; the real
// one (NewClient) wraps github.com/NVIDIA/go-dcgm (pinned to v1.4611.0, the
// only kind of version its proxy serves) in the one file built with cgo, and
// a stub replaces it without cgo. The rules of the nvml package apply: no
// call but Connect until Connect succeeded (any go-dcgm call after a failed
// Init kills the process), every call time-boxed, and a missing library or
// an unreachable host engine is a monitoring-plane fact (state absent or
// unknown), never a hardware fault. The monitor reconnects on its own and
// goes back to ok once the host engine answers (case c20).
package dcgm

import (
	"context"
	"errors"
	"time"
)

// Client is what the monitors need of DCGM.
type Client interface {
	// Connect loads libdcgm and connects to the host engine. It may be
	// called again after it failed.
	Connect() error
	// DeviceCount is the number of GPUs DCGM sees.
	DeviceCount() (int, error)
	// Health returns the incidents of the health watches since the last call.
	Health() ([]Incident, error)
	// Violations subscribes to the policy conditions until ctx ends.
	Violations(ctx context.Context) (<-chan Violation, error)
}

// Incident is one health-watch incident.
type Incident struct {
	GPU     int    // DCGM GPU id
	System  string // "mem", "pcie", "nvlink", ... (HealthSystem)
	Result  string // "warn" or "fail"
	Code    string // DCGM_FR_* name, or the numeric code
	Message string
}

// Violation is one policy violation.
type Violation struct {
	GPU       int
	Condition string // DCGM's condition name: "Double-bit ECC error", "XID Error", ...
	Time      time.Time
	Xid       int    // for "XID Error"
	Detail    string // condition data, formatted
}

// Errors a Client returns (wrapped).
var (
	ErrLibraryNotFound = errors.New("libdcgm not found")
	ErrNotConnected    = errors.New("host engine not connected")
)
