package nvml

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fleetrepair/fleetrepair/agent/finding"
)

// fakeGPU is one GPU of fakeLib.
type fakeGPU struct {
	bus, uuid, name, serial string
	handleErr               error // Device(i) fails with it
	rows                    RemappedRows
	rowsErr                 error
	pages                   RetiredPages
	ecc                     uint64
	links                   []bool
	linksErr                error
}

// fakeLib is a Library whose behaviour tests set; it fails the test when
// anything but Init is called before Init succeeded.
type fakeLib struct {
	t       *testing.T
	mu      sync.Mutex
	initErr error
	hang    string // op name that blocks until release is closed
	release chan struct{}
	gpus    []*fakeGPU
	inited  bool
	calls   []string
}

func (l *fakeLib) enter(op string) {
	l.mu.Lock()
	l.calls = append(l.calls, op)
	inited, hang := l.inited, l.hang
	l.mu.Unlock()
	if op != "init" && !inited {
		l.t.Errorf("%s called before a successful Init (this kills the process with go-nvml)", op)
	}
	if hang == op {
		<-l.release
	}
}

func (l *fakeLib) Init() error {
	l.enter("init")
	l.mu.Lock()
	defer l.mu.Unlock()
	l.inited = l.initErr == nil
	return l.initErr
}
func (l *fakeLib) Shutdown() error { l.enter("shutdown"); return nil }
func (l *fakeLib) DriverVersion() (string, error) {
	l.enter("driver")
	return "550.90.07", nil
}
func (l *fakeLib) DeviceCount() (int, error) { l.enter("count"); return len(l.gpus), nil }
func (l *fakeLib) Device(i int) (Device, error) {
	l.enter("device")
	if err := l.gpus[i].handleErr; err != nil {
		return nil, err
	}
	return fakeDevice{l, l.gpus[i]}, nil
}

type fakeDevice struct {
	l *fakeLib
	g *fakeGPU
}

func (d fakeDevice) PCIBusID() (string, error) { d.l.enter("pci"); return d.g.bus, nil }
func (d fakeDevice) UUID() (string, error)     { d.l.enter("uuid"); return d.g.uuid, nil }
func (d fakeDevice) Name() (string, error)     { d.l.enter("name"); return d.g.name, nil }
func (d fakeDevice) Serial() (string, error)   { d.l.enter("serial"); return d.g.serial, nil }
func (d fakeDevice) RemappedRows() (RemappedRows, error) {
	d.l.enter("rows")
	return d.g.rows, d.g.rowsErr
}
func (d fakeDevice) RetiredPages() (RetiredPages, error) { d.l.enter("pages"); return d.g.pages, nil }
func (d fakeDevice) UncorrectableECC() (uint64, error)   { d.l.enter("ecc"); return d.g.ecc, nil }
func (d fakeDevice) NVLinks() ([]bool, error) {
	d.l.enter("nvlink")
	return d.g.links, d.g.linksErr
}

func healthy(n int) []*fakeGPU {
	var out []*fakeGPU
	for i := range n {
		out = append(out, &fakeGPU{bus: fmt.Sprintf("00000000:%02X:00.0", 0x3b+i), uuid: fmt.Sprintf("GPU-%d", i),
			name: "NVIDIA H100 80GB HBM3", serial: fmt.Sprintf("S%d", i), links: []bool{true, true}})
	}
	return out
}

func detectors(fs []finding.Finding) string {
	var d []string
	for _, f := range fs {
		d = append(d, f.Detector+":"+f.GPUPCI+":"+f.Attr(finding.AttrError)+f.Attr(finding.AttrLinks))
	}
	return strings.Join(d, " ")
}

func TestCheck(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name       string
		lib        func(*fakeLib)
		expectGPUs bool
		// between changes the fake after the first check.
		between   func(*fakeLib)
		state     []string // state after each of two checks
		findings  []string // detectors of each check's findings
		noCallsTo []string // ops that must never be called
	}{
		{name: "no library, no GPU expected", lib: func(l *fakeLib) { l.initErr = fmt.Errorf("nvml init: %w", ErrLibraryNotFound) },
			state: []string{"absent", "absent"}, findings: []string{"", ""}, noCallsTo: []string{"count", "driver"}},
		{name: "no library on a GPU node", expectGPUs: true, lib: func(l *fakeLib) { l.initErr = fmt.Errorf("nvml init: %w", ErrLibraryNotFound) },
			state:    []string{"unknown", "unknown"},
			findings: []string{"monitoring-plane::nvml init: NVML library not found", ""}, noCallsTo: []string{"count", "driver"}},
		{name: "driver not loaded, then loaded", expectGPUs: true, lib: func(l *fakeLib) {
			l.initErr = fmt.Errorf("nvml init: %w", ErrDriverNotLoaded)
			l.gpus = healthy(1)
		}, between: func(l *fakeLib) { l.initErr = nil },
			state: []string{"unknown", "ok"}, findings: []string{"monitoring-plane::nvml init: NVIDIA driver not loaded", ""}},
		{name: "healthy", lib: func(l *fakeLib) { l.gpus = healthy(2) },
			state: []string{"ok", "ok"}, findings: []string{"", ""}},
		{name: "GPU lost after start", lib: func(l *fakeLib) { l.gpus = healthy(2) },
			between: func(l *fakeLib) { l.gpus[1].handleErr = fmt.Errorf("get device handle 1: %w", ErrGPULost) },
			state:   []string{"ok", "failing"}, findings: []string{"", "nvml-error:0000:3c:00.0:GPU is lost"}},
		{name: "unknown error at start", lib: func(l *fakeLib) {
			l.gpus = healthy(1)
			l.gpus[0].handleErr = fmt.Errorf("x: %w", ErrUnknown)
		}, state: []string{"failing", "failing"}, findings: []string{"nvml-error::Unknown Error", ""}},
		{name: "row remap pending, reported once", lib: func(l *fakeLib) {
			l.gpus = healthy(1)
			l.gpus[0].rows = RemappedRows{Uncorrectable: 4, Pending: true}
		}, state: []string{"failing", "failing"}, findings: []string{"row-remap-pending:0000:3b:00.0:", ""}},
		{name: "remap failure", lib: func(l *fakeLib) {
			l.gpus = healthy(1)
			l.gpus[0].rows = RemappedRows{Uncorrectable: 512, Failure: true}
		}, state: []string{"failing", "failing"}, findings: []string{"row-remap-failure:0000:3b:00.0:", ""}},
		{name: "retired pages pending before Ampere", lib: func(l *fakeLib) {
			l.gpus = healthy(1)
			l.gpus[0].rowsErr = fmt.Errorf("rows: %w", ErrNotSupported)
			l.gpus[0].pages = RetiredPages{DBE: 2, Pending: true}
		}, state: []string{"failing", "failing"}, findings: []string{"retired-pages:0000:3b:00.0:", ""}},
		{name: "nvlink goes down", lib: func(l *fakeLib) { l.gpus = healthy(1) },
			between: func(l *fakeLib) { l.gpus[0].links = []bool{true, false} },
			state:   []string{"ok", "failing"}, findings: []string{"", "nvlink-inactive:0000:3b:00.0:1"}},
		{name: "no nvlink at all", lib: func(l *fakeLib) {
			l.gpus = healthy(1)
			l.gpus[0].linksErr = fmt.Errorf("x: %w", ErrNotSupported)
		}, state: []string{"ok", "ok"}, findings: []string{"", ""}},
		{name: "ecc errors rise", lib: func(l *fakeLib) { l.gpus = healthy(1) },
			between: func(l *fakeLib) { l.gpus[0].ecc = 3 },
			state:   []string{"ok", "ok"}, findings: []string{"", "ecc-errors:0000:3b:00.0:"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			lib := &fakeLib{t: t}
			tt.lib(lib)
			m := New(Options{Library: lib, ExpectGPUs: tt.expectGPUs, Timeout: time.Second})
			for i := range 2 {
				if i == 1 && tt.between != nil {
					tt.between(lib)
				}
				res := m.Check(context.Background())
				if res.State != tt.state[i] {
					t.Errorf("check %d: state %q (%s), want %q", i, res.State, res.Reason, tt.state[i])
				}
				if got := detectors(res.Findings); got != tt.findings[i] {
					t.Errorf("check %d: findings %q, want %q", i, got, tt.findings[i])
				}
				if res.State == "ok" && (res.DriverVersion == "" || len(res.GPUs) != len(lib.gpus)) {
					t.Errorf("check %d: inventory %q %+v", i, res.DriverVersion, res.GPUs)
				}
			}
			for _, c := range lib.calls {
				for _, no := range tt.noCallsTo {
					if c == no {
						t.Errorf("%s was called", c)
					}
				}
			}
		})
	}
}

// TestHungDriver checks that a hung call makes the monitor unknown within
// its time box, is reported once, and that no second call piles up behind it.
func TestHungDriver(t *testing.T) {
	t.Parallel()
	for _, op := range []string{"init", "count", "rows", "nvlink"} {
		t.Run(op, func(t *testing.T) {
			t.Parallel()
			lib := &fakeLib{t: t, gpus: healthy(1), hang: op, release: make(chan struct{})}
			m := New(Options{Library: lib, ExpectGPUs: true, Timeout: 20 * time.Millisecond})
			start := time.Now()
			res := m.Check(context.Background())
			if res.State != finding.StateUnknown || !strings.Contains(res.Reason, "no answer within") {
				t.Fatalf("state %q reason %q, want unknown after a timeout", res.State, res.Reason)
			}
			if d := time.Since(start); d > 2*time.Second {
				t.Errorf("check took %s", d)
			}
			if got := detectors(res.Findings); !strings.HasPrefix(got, "monitoring-plane") {
				t.Errorf("findings %q, want a monitoring-plane finding", got)
			}
			lib.mu.Lock()
			n := len(lib.calls)
			lib.mu.Unlock()
			res = m.Check(context.Background())
			lib.mu.Lock()
			if len(lib.calls) != n {
				t.Errorf("a call was made while the earlier one is hung: %v", lib.calls[n:])
			}
			lib.mu.Unlock()
			if res.State != finding.StateUnknown || len(res.Findings) != 0 {
				t.Errorf("second check: state %q findings %v", res.State, res.Findings)
			}
			close(lib.release)
			lib.mu.Lock()
			lib.hang = ""
			lib.mu.Unlock()
			deadline := time.Now().Add(5 * time.Second)
			for m.guard.Hung() && time.Now().Before(deadline) {
				time.Sleep(time.Millisecond)
			}
			if res := m.Check(context.Background()); res.State != finding.StateOK {
				t.Errorf("after the driver answered: state %q (%s), want ok", res.State, res.Reason)
			}
		})
	}
}

func TestNVMLMessage(t *testing.T) {
	t.Parallel()
	if got := nvmlMessage(fmt.Errorf("get handle: %w", ErrGPULost)); got != "GPU is lost" {
		t.Errorf("got %q", got)
	}
	if got := nvmlMessage(errors.New("other")); got != "other" {
		t.Errorf("got %q", got)
	}
}

// TestVersionMismatch: NVML's version-mismatch error is a fact about the
// driver (failing, driver-version-mismatch), not a monitoring-plane outage;
// with NVML still working (a session opened before the upgrade), the module
// and library versions differing on the host are the same fact; the
// heartbeat carries both versions.
func TestVersionMismatch(t *testing.T) {
	t.Parallel()
	mod, libv := "460.56", "460.73.01"
	versions := func() (string, string) { return mod, libv }
	lib := &fakeLib{t: t, initErr: fmt.Errorf("nvml init: %w", ErrVersionMismatch), gpus: healthy(1)}
	m := New(Options{Library: lib, ExpectGPUs: true, Versions: versions, Now: func() time.Time { return time.Unix(0, 0) }})
	res := m.Check(context.Background())
	if res.State != "failing" || len(res.Findings) != 1 || res.Findings[0].Detector != "driver-version-mismatch" ||
		res.Findings[0].Attrs["source"] != "nvml" || res.Findings[0].Attrs["module_version"] != mod || res.Findings[0].Attrs["nvml_library_version"] != libv {
		t.Fatalf("init mismatch: %+v", res)
	}
	if res.ModuleVersion != mod || res.LibraryVersion != libv {
		t.Errorf("versions %q %q", res.ModuleVersion, res.LibraryVersion)
	}
	if again := m.Check(context.Background()); len(again.Findings) != 0 {
		t.Errorf("the same mismatch reported twice: %+v", again.Findings)
	}

	lib2 := &fakeLib{t: t, gpus: healthy(1)}
	m2 := New(Options{Library: lib2, ExpectGPUs: true, Versions: versions, Now: func() time.Time { return time.Unix(0, 0) }})
	res = m2.Check(context.Background())
	var got []string
	for _, f := range res.Findings {
		got = append(got, f.Detector+"/"+f.Attrs["source"])
	}
	if len(got) != 1 || got[0] != "driver-version-mismatch/agent" {
		t.Fatalf("working NVML, differing versions: %v", got)
	}
	mod = libv // rebooted: the module matches the library
	if res = m2.Check(context.Background()); len(res.Findings) != 0 || res.ModuleVersion != libv {
		t.Errorf("after the reboot: %+v", res)
	}
}
