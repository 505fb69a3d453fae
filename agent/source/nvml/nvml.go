// Package nvml is the agent's NVML monitor: device count and inventory
// (PCI address, UUID, serial, model, driver version), GPUs whose handle
// fails ("GPU is lost", "Unknown Error"), row remapping (pending, failed),
// page retirement, volatile uncorrectable ECC errors and NVLink link state.
// It is the fallback and cross-check of the DCGM monitor.
//
// NVML is reached through Library, a small consumer-side interface. The real
// one (NewLibrary) wraps github.com/NVIDIA/go-nvml and needs cgo; it lives in
// the one file built with the cgo tag, and a stub takes its place without
// cgo. Two rules keep a broken driver from harming the node:
//   - nothing but Init is ever called until Init has succeeded (with go-nvml
//     any other call after a failed Init kills the process);
//   - every call is time-boxed (source.Guard): a hung driver makes the
//     monitor unknown, it never hangs the agent.
//
// An Init failure is a monitoring-plane fact, never a hardware fault: the
// monitor is absent when no NVIDIA GPU is expected, unknown otherwise, with
// a monitoring-plane finding.
package nvml

import (
	"errors"
)

// Library is what the monitor needs of NVML. Implementations return errors
// wrapping the sentinel errors below where they apply.
type Library interface {
	Init() error
	Shutdown() error
	DriverVersion() (string, error)
	DeviceCount() (int, error)
	// Device returns the handle of the GPU with NVML index i.
	Device(i int) (Device, error)
}

// Device is what the monitor needs of one GPU handle.
type Device interface {
	// PCIBusID returns the bus id as NVML prints it ("00000000:3B:00.0").
	PCIBusID() (string, error)
	UUID() (string, error)
	Name() (string, error)
	Serial() (string, error)
	RemappedRows() (RemappedRows, error)
	RetiredPages() (RetiredPages, error)
	// UncorrectableECC is the volatile (since driver load) count of
	// uncorrected ECC errors.
	UncorrectableECC() (uint64, error)
	// NVLinks returns the state of each link (true: active), links 0..n-1;
	// ErrNotSupported when the GPU has no NVLink.
	NVLinks() ([]bool, error)
}

// RemappedRows is nvmlDeviceGetRemappedRows.
type RemappedRows struct {
	Correctable, Uncorrectable int
	Pending, Failure           bool
}

// RetiredPages is page retirement (GPUs before Ampere).
type RetiredPages struct {
	SBE, DBE int
	Pending  bool
}

// Errors a Library returns (wrapped).
var (
	ErrLibraryNotFound = errors.New("NVML library not found")
	ErrDriverNotLoaded = errors.New("NVIDIA driver not loaded")
	ErrNotSupported    = errors.New("not supported")
	ErrGPULost         = errors.New("GPU is lost")
	ErrResetRequired   = errors.New("GPU requires reset")
	ErrUnknown         = errors.New("Unknown Error")
	// ErrVersionMismatch is NVML_ERROR_LIB_RM_VERSION_MISMATCH: the
	// user-space library and the loaded kernel module are of different
	// driver versions (nvidia-smi prints "Driver/library version mismatch").
	ErrVersionMismatch = errors.New("Driver/library version mismatch")
)
