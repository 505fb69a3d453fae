//go:build !cgo

package dcgm

import (
	"context"
	"fmt"
)

// NewClient returns a stub: built without cgo, go-dcgm cannot be used.
// Connect fails with ErrLibraryNotFound, as on a node without DCGM.
func NewClient(string) Client { return stub{} }

type stub struct{}

func (stub) Connect() error {
	return fmt.Errorf("dcgm init: agent built without cgo: %w", ErrLibraryNotFound)
}
func (stub) DeviceCount() (int, error)   { return 0, ErrNotConnected }
func (stub) Health() ([]Incident, error) { return nil, ErrNotConnected }
func (stub) Violations(context.Context) (<-chan Violation, error) {
	return nil, ErrNotConnected
}
