//go:build cgo

package nvml

import (
	"context"
	"errors"
	"strings"
	"testing"

	gonvml "github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"

	"github.com/fleetrepair/fleetrepair/agent/finding"
)

// TestBinding drives the go-nvml adapter with go-nvml's own mock: return
// codes map to this package's errors without calling nvmlErrorString, and
// device data is translated.
func TestBinding(t *testing.T) {
	t.Parallel()
	var busID [32]int8
	for i, c := range "00000000:3B:00.0" {
		busID[i] = int8(c)
	}
	lost := &mock.Device{}
	good := &mock.Device{
		GetPciInfoFunc: func() (gonvml.PciInfo, gonvml.Return) { return gonvml.PciInfo{BusId: busID}, gonvml.SUCCESS },
		GetRemappedRowsFunc: func() (int, int, bool, bool, gonvml.Return) {
			return 0, 4, true, false, gonvml.SUCCESS
		},
		GetNvLinkStateFunc: func(link int) (gonvml.EnableState, gonvml.Return) {
			switch link {
			case 0:
				return gonvml.FEATURE_ENABLED, gonvml.SUCCESS
			case 1:
				return gonvml.FEATURE_DISABLED, gonvml.SUCCESS
			}
			return 0, gonvml.ERROR_INVALID_ARGUMENT
		},
	}
	m := &mock.Interface{
		InitFunc:           func() gonvml.Return { return gonvml.SUCCESS },
		DeviceGetCountFunc: func() (int, gonvml.Return) { return 2, gonvml.SUCCESS },
		DeviceGetHandleByIndexFunc: func(i int) (gonvml.Device, gonvml.Return) {
			if i == 1 {
				return lost, gonvml.ERROR_GPU_IS_LOST
			}
			return good, gonvml.SUCCESS
		},
	}
	lib := newLibrary(m)
	if err := lib.Init(); err != nil {
		t.Fatal(err)
	}
	if _, err := lib.Device(1); !errors.Is(err, ErrGPULost) {
		t.Errorf("Device(1) error %v, want ErrGPULost", err)
	}
	d, err := lib.Device(0)
	if err != nil {
		t.Fatal(err)
	}
	if bus, err := d.PCIBusID(); err != nil || bus != "00000000:3B:00.0" {
		t.Errorf("PCIBusID = %q, %v", bus, err)
	}
	if rr, err := d.RemappedRows(); err != nil || !rr.Pending || rr.Uncorrectable != 4 {
		t.Errorf("RemappedRows = %+v, %v", rr, err)
	}
	if links, err := d.NVLinks(); err != nil || len(links) != 2 || !links[0] || links[1] {
		t.Errorf("NVLinks = %v, %v", links, err)
	}
	for r, want := range map[gonvml.Return]error{
		gonvml.ERROR_LIBRARY_NOT_FOUND: ErrLibraryNotFound, gonvml.ERROR_DRIVER_NOT_LOADED: ErrDriverNotLoaded,
		gonvml.ERROR_UNKNOWN: ErrUnknown, gonvml.ERROR_NOT_SUPPORTED: ErrNotSupported,
	} {
		if err := retErr("op", r); !errors.Is(err, want) {
			t.Errorf("retErr(%d) = %v, want %v", r, err, want)
		}
	}
}

// TestInitLibraryNotFound: when go-nvml cannot load libnvidia-ml, the
// monitor's state says so and where the library comes from in a pod.
func TestInitLibraryNotFound(t *testing.T) {
	t.Parallel()
	lib := newLibrary(&mock.Interface{InitFunc: func() gonvml.Return { return gonvml.ERROR_LIBRARY_NOT_FOUND }})
	err := lib.Init()
	if !errors.Is(err, ErrLibraryNotFound) {
		t.Fatalf("Init() = %v, want ErrLibraryNotFound", err)
	}
	for _, want := range []string{"libnvidia-ml.so.1", "runtimeClassName nvidia", "NVIDIA_DRIVER_CAPABILITIES=utility"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("Init() = %q, want it to name %q", err, want)
		}
	}
	res := New(Options{Library: lib, ExpectGPUs: true}).Check(context.Background())
	if res.State != finding.StateUnknown || !strings.Contains(res.Reason, "runtimeClassName nvidia") {
		t.Errorf("Check on a GPU node without the library = %s %q, want unknown saying why", res.State, res.Reason)
	}
}
