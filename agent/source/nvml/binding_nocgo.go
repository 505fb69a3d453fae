//go:build !cgo

package nvml

import "fmt"

// NewLibrary returns a stub: this binary was built without cgo, so go-nvml
// cannot be used. Init fails with ErrLibraryNotFound and the monitor reports
// itself absent or unknown, as on a node without the driver.
func NewLibrary() Library { return stub{} }

type stub struct{}

func (stub) Init() error {
	return fmt.Errorf("nvml init: agent built without cgo: %w", ErrLibraryNotFound)
}
func (stub) Shutdown() error                { return nil }
func (stub) DriverVersion() (string, error) { return "", ErrLibraryNotFound }
func (stub) DeviceCount() (int, error)      { return 0, ErrLibraryNotFound }
func (stub) Device(int) (Device, error)     { return nil, ErrLibraryNotFound }
