//go:build cgo

package nvml

import (
	"fmt"
	"strconv"

	gonvml "github.com/NVIDIA/go-nvml/pkg/nvml"
)

// NewLibrary returns the NVML library through go-nvml. Loading libnvidia-ml
// happens in Init (dlopen), so a node without the driver fails there, with
// ErrLibraryNotFound, and nothing else is ever called.
func NewLibrary() Library { return &library{nvml: gonvml.New()} }

// newLibrary wraps any go-nvml Interface (tests pass go-nvml's mock).
func newLibrary(n gonvml.Interface) Library { return &library{nvml: n} }

type library struct{ nvml gonvml.Interface }

// retErr maps an NVML return code to an error without calling into the
// library (nvmlErrorString is a library call too).
func retErr(op string, r gonvml.Return) error {
	switch r {
	case gonvml.SUCCESS:
		return nil
	case gonvml.ERROR_LIBRARY_NOT_FOUND:
		return fmt.Errorf("%s: %w", op, ErrLibraryNotFound)
	case gonvml.ERROR_DRIVER_NOT_LOADED:
		return fmt.Errorf("%s: %w", op, ErrDriverNotLoaded)
	case gonvml.ERROR_NOT_SUPPORTED, gonvml.ERROR_INVALID_ARGUMENT, gonvml.ERROR_FUNCTION_NOT_FOUND:
		return fmt.Errorf("%s: %w", op, ErrNotSupported)
	case gonvml.ERROR_GPU_IS_LOST:
		return fmt.Errorf("%s: %w", op, ErrGPULost)
	case gonvml.ERROR_RESET_REQUIRED:
		return fmt.Errorf("%s: %w", op, ErrResetRequired)
	case gonvml.ERROR_UNKNOWN:
		return fmt.Errorf("%s: %w", op, ErrUnknown)
	case gonvml.ERROR_LIB_RM_VERSION_MISMATCH:
		return fmt.Errorf("%s: %w", op, ErrVersionMismatch)
	}
	return fmt.Errorf("%s: NVML return code %s", op, strconv.Itoa(int(r)))
}

// Init loads and initialises NVML. When libnvidia-ml.so.1 cannot be
// loaded, the error says where it comes from in a container, so the
// monitor's state tells the operator what to fix.
func (l *library) Init() error {
	r := l.nvml.Init()
	if r == gonvml.ERROR_LIBRARY_NOT_FOUND {
		return fmt.Errorf("nvml init: libnvidia-ml.so.1 could not be loaded (in a pod it comes from the host driver through the NVIDIA container toolkit: runtimeClassName nvidia, NVIDIA_DRIVER_CAPABILITIES=utility): %w", ErrLibraryNotFound)
	}
	return retErr("nvml init", r)
}
func (l *library) Shutdown() error { return retErr("nvml shutdown", l.nvml.Shutdown()) }

func (l *library) DriverVersion() (string, error) {
	v, r := l.nvml.SystemGetDriverVersion()
	return v, retErr("get driver version", r)
}

func (l *library) DeviceCount() (int, error) {
	n, r := l.nvml.DeviceGetCount()
	return n, retErr("get device count", r)
}

func (l *library) Device(i int) (Device, error) {
	d, r := l.nvml.DeviceGetHandleByIndex(i)
	if err := retErr("get device handle "+strconv.Itoa(i), r); err != nil {
		return nil, err
	}
	return device{d}, nil
}

type device struct{ d gonvml.Device }

func (d device) PCIBusID() (string, error) {
	p, r := d.d.GetPciInfo()
	if err := retErr("get pci info", r); err != nil {
		return "", err
	}
	b := make([]byte, 0, len(p.BusId))
	for _, c := range p.BusId {
		if c == 0 {
			break
		}
		b = append(b, byte(c))
	}
	return string(b), nil
}

func (d device) UUID() (string, error) {
	s, r := d.d.GetUUID()
	return s, retErr("get uuid", r)
}

func (d device) Name() (string, error) {
	s, r := d.d.GetName()
	return s, retErr("get name", r)
}

func (d device) Serial() (string, error) {
	s, r := d.d.GetSerial()
	return s, retErr("get serial", r)
}

func (d device) RemappedRows() (RemappedRows, error) {
	c, u, p, f, r := d.d.GetRemappedRows()
	return RemappedRows{Correctable: c, Uncorrectable: u, Pending: p, Failure: f}, retErr("get remapped rows", r)
}

func (d device) RetiredPages() (RetiredPages, error) {
	st, r := d.d.GetRetiredPagesPendingStatus()
	if err := retErr("get retired pages pending status", r); err != nil {
		return RetiredPages{}, err
	}
	out := RetiredPages{Pending: st == gonvml.FEATURE_ENABLED}
	if p, r := d.d.GetRetiredPages(gonvml.PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS); r == gonvml.SUCCESS {
		out.SBE = len(p)
	}
	if p, r := d.d.GetRetiredPages(gonvml.PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR); r == gonvml.SUCCESS {
		out.DBE = len(p)
	}
	return out, nil
}

func (d device) UncorrectableECC() (uint64, error) {
	n, r := d.d.GetTotalEccErrors(gonvml.MEMORY_ERROR_TYPE_UNCORRECTED, gonvml.VOLATILE_ECC)
	return n, retErr("get total ecc errors", r)
}

func (d device) NVLinks() ([]bool, error) {
	var out []bool
	for link := 0; link < gonvml.NVLINK_MAX_LINKS; link++ {
		st, r := d.d.GetNvLinkState(link)
		if r != gonvml.SUCCESS {
			if link == 0 {
				return nil, retErr("get nvlink state", r)
			}
			break // past the GPU's last link
		}
		out = append(out, st == gonvml.FEATURE_ENABLED)
	}
	return out, nil
}
