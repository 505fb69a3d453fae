package nvml

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/fleetrepair/fleetrepair/agent/finding"
	"github.com/fleetrepair/fleetrepair/agent/source"
)

// Name is the monitor's name in heartbeats.
const Name = "nvml"

// DefaultTimeout is the time box of one NVML call.
const DefaultTimeout = 5 * time.Second

// Options configure a Monitor.
type Options struct {
	// Library is NVML; default NewLibrary().
	Library Library
	// Timeout bounds every call; default DefaultTimeout.
	Timeout time.Duration
	// ExpectGPUs says the node should have NVIDIA GPUs (a GPU node, or
	// sysfs saw some). Without it a missing NVML library means "absent".
	ExpectGPUs bool
	// Now is the clock for finding times; default time.Now.
	Now func() time.Time
	// Versions returns the loaded kernel module's and the user-space
	// library's driver versions without NVML (hostroot.Root.DriverVersions);
	// nil: not known. They go into the heartbeat, and a difference is a
	// driver-version-mismatch finding even while this agent's own NVML
	// session, opened before the upgrade, still works.
	Versions func() (module, library string)
}

// Monitor is the NVML monitor. Check must not be called concurrently.
type Monitor struct {
	opts  Options
	guard source.Guard

	initialized bool
	lastInitErr string // reported once per distinct error
	lastHung    string

	inventory map[int]finding.GPU // by NVML index, kept from the last good reading
	reported  map[string]string   // fact key -> last reported value: report on change only
	ecc       map[string]uint64
}

// New returns a Monitor.
func New(opts Options) *Monitor {
	if opts.Library == nil {
		opts.Library = NewLibrary()
	}
	if opts.Timeout <= 0 {
		opts.Timeout = DefaultTimeout
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	return &Monitor{opts: opts, inventory: map[int]finding.GPU{}, reported: map[string]string{}, ecc: map[string]uint64{}}
}

// Name implements source.Checker.
func (m *Monitor) Name() string { return Name }

// call time-boxes one library call.
func (m *Monitor) call(ctx context.Context, op string, fn func() error) error {
	return m.guard.Do(ctx, op, m.opts.Timeout, fn)
}

// Check implements source.Checker.
//
// States: absent (no library and no GPU expected), unknown (Init failed,
// or a call hung or timed out: a monitoring-plane finding says which), failing
// (a GPU lost or unreachable, a pending or failed row remap, pending page
// retirement, inactive NVLinks), ok. Facts are reported when they appear or
// change.
func (m *Monitor) Check(ctx context.Context) source.Result {
	now := m.opts.Now()
	lib := m.opts.Library
	var mod, libv string
	if m.opts.Versions != nil {
		mod, libv = m.opts.Versions()
	}
	if !m.initialized {
		err := m.call(ctx, "nvml init", lib.Init)
		if err != nil {
			res := m.initFailed(err, now, mod, libv)
			res.ModuleVersion, res.LibraryVersion = mod, libv
			return res
		}
		m.initialized, m.lastInitErr = true, ""
	}
	res := source.Result{State: finding.StateOK, ModuleVersion: mod, LibraryVersion: libv}
	m.reportIf(&res, "version-pair", mod != "" && libv != "" && mod != libv, mod+"/"+libv, mismatchFinding(now, "agent", mod, libv))
	var problems []string
	var n int
	var driver string
	err := m.call(ctx, "get driver version", func() (e error) { driver, e = lib.DriverVersion(); return })
	if err == nil {
		res.DriverVersion = driver
		err = m.call(ctx, "get device count", func() (e error) { n, e = lib.DeviceCount(); return })
	}
	if err != nil {
		return m.hung(res, err, now)
	}
	m.lastHung = ""
	for i := range n {
		var d Device
		err := m.call(ctx, "get device handle", func() (e error) { d, e = lib.Device(i); return })
		if errors.Is(err, source.ErrTimeout) || errors.Is(err, source.ErrBusy) {
			return m.hung(res, err, now)
		}
		inv, known := m.inventory[i]
		if err != nil {
			// The handle fails: the GPU is lost or unreachable. Its PCI
			// address comes from the inventory of an earlier reading.
			msg := nvmlMessage(err)
			problems = append(problems, fmt.Sprintf("GPU %d: %s", i, msg))
			f := finding.Finding{Detector: finding.DetectorNVMLError, Time: now,
				Attrs:    map[string]string{finding.AttrError: msg, finding.AttrGPUIndex: strconv.Itoa(i)},
				Evidence: []string{fmt.Sprintf("NVML: Unable to determine the device handle for GPU index %d: %s", i, msg)}}
			if known {
				f.GPUPCI = inv.PCI
				f.Attrs[finding.AttrGPUUUID] = inv.UUID
				f.Evidence[0] = fmt.Sprintf("NVML: Unable to determine the device handle for GPU %s (index %d): %s", inv.PCI, i, msg)
			}
			m.report(&res, "handle/"+strconv.Itoa(i), msg, f)
			if known {
				res.GPUs = append(res.GPUs, inv)
			}
			continue
		}
		m.report(&res, "handle/"+strconv.Itoa(i), "", finding.Finding{})
		gpu, probs, hungErr := m.checkDevice(ctx, &res, i, d, inv, known, now)
		if hungErr != nil {
			return m.hung(res, hungErr, now)
		}
		problems = append(problems, probs...)
		m.inventory[i] = gpu
		res.GPUs = append(res.GPUs, gpu)
	}
	slices.SortFunc(res.GPUs, func(a, b finding.GPU) int { return strings.Compare(a.PCI, b.PCI) })
	if len(problems) > 0 {
		res.State, res.Reason = finding.StateFailing, strings.Join(problems, "; ")
	}
	return res
}

// checkDevice reads one GPU. It returns the inventory entry, the problems
// found, and a non-nil error only when a call hung.
func (m *Monitor) checkDevice(ctx context.Context, res *source.Result, i int, d Device, inv finding.GPU, known bool, now time.Time) (finding.GPU, []string, error) {
	var problems []string
	str := func(op string, fn func() (string, error)) (string, error) {
		var s string
		err := m.call(ctx, op, func() (e error) { s, e = fn(); return })
		return s, err
	}
	hung := func(err error) bool { return errors.Is(err, source.ErrTimeout) || errors.Is(err, source.ErrBusy) }
	if !known || inv.PCI == "" {
		inv = finding.GPU{Index: i}
		bus, err := str("get pci info", d.PCIBusID)
		if hung(err) {
			return inv, nil, err
		}
		inv.PCI, _ = finding.NormalizePCI(bus)
		for _, x := range []struct {
			op  string
			fn  func() (string, error)
			dst *string
		}{{"get uuid", d.UUID, &inv.UUID}, {"get name", d.Name, &inv.Model}, {"get serial", d.Serial, &inv.Serial}} {
			v, err := str(x.op, x.fn)
			if hung(err) {
				return inv, nil, err
			}
			*x.dst = v
		}
	}
	base := func(det string, ev string) finding.Finding {
		f := finding.Finding{Detector: det, Time: now, GPUPCI: inv.PCI,
			Attrs: map[string]string{finding.AttrGPUIndex: strconv.Itoa(i)}, Evidence: []string{ev}}
		if inv.UUID != "" {
			f.Attrs[finding.AttrGPUUUID] = inv.UUID
		}
		return f
	}
	key := func(k string) string { return k + "/" + inv.PCI + "/" + strconv.Itoa(i) }

	var rr RemappedRows
	err := m.call(ctx, "get remapped rows", func() (e error) { rr, e = d.RemappedRows(); return })
	switch {
	case hung(err):
		return inv, nil, err
	case err == nil:
		ev := fmt.Sprintf("NVML remapped rows of %s: correctable %d, uncorrectable %d, pending %t, failure %t",
			inv.PCI, rr.Correctable, rr.Uncorrectable, rr.Pending, rr.Failure)
		attrs := func(f finding.Finding) finding.Finding {
			f.Attrs[finding.AttrCorrectableRows] = strconv.Itoa(rr.Correctable)
			f.Attrs[finding.AttrUncorrectableRows] = strconv.Itoa(rr.Uncorrectable)
			return f
		}
		f := attrs(base(finding.DetectorRowRemapPending, ev))
		f.Attrs[finding.AttrPending] = "true"
		m.reportIf(res, key("remap-pending"), rr.Pending, fmt.Sprint(rr.Uncorrectable), f)
		m.reportIf(res, key("remap-failure"), rr.Failure, fmt.Sprint(rr.Uncorrectable), attrs(base(finding.DetectorRowRemapFailure, ev)))
		if rr.Pending {
			problems = append(problems, inv.PCI+": row remap pending")
		}
		if rr.Failure {
			problems = append(problems, inv.PCI+": row remap failed")
		}
	case errors.Is(err, ErrNotSupported):
		// Before Ampere: page retirement instead.
		var rp RetiredPages
		err := m.call(ctx, "get retired pages", func() (e error) { rp, e = d.RetiredPages(); return })
		if hung(err) {
			return inv, nil, err
		}
		if err == nil {
			f := base(finding.DetectorRetiredPages, fmt.Sprintf("NVML retired pages of %s: sbe %d, dbe %d, pending %t", inv.PCI, rp.SBE, rp.DBE, rp.Pending))
			f.Attrs[finding.AttrPending] = "true"
			f.Attrs[finding.AttrSBEPages], f.Attrs[finding.AttrDBEPages] = strconv.Itoa(rp.SBE), strconv.Itoa(rp.DBE)
			m.reportIf(res, key("retired-pending"), rp.Pending, fmt.Sprint(rp.SBE+rp.DBE), f)
			if rp.Pending {
				problems = append(problems, inv.PCI+": page retirement pending")
			}
		}
	}

	var ecc uint64
	err = m.call(ctx, "get total ecc errors", func() (e error) { ecc, e = d.UncorrectableECC(); return })
	if hung(err) {
		return inv, nil, err
	}
	if err == nil {
		k := key("ecc")
		if old, seen := m.ecc[k]; (seen && ecc > old) || (!seen && ecc > 0) {
			f := base(finding.DetectorECCErrors, fmt.Sprintf("NVML volatile uncorrected ECC errors of %s: %d", inv.PCI, ecc))
			f.Attrs[finding.AttrUncorrectable] = strconv.FormatUint(ecc, 10)
			f.Count = int(min(ecc-m.ecc[k], 1<<30))
			res.Findings = append(res.Findings, f)
		}
		m.ecc[k] = ecc
	}

	var links []bool
	err = m.call(ctx, "get nvlink state", func() (e error) { links, e = d.NVLinks(); return })
	if hung(err) {
		return inv, nil, err
	}
	if err == nil {
		var inactive []string
		for l, up := range links {
			if !up {
				inactive = append(inactive, strconv.Itoa(l))
			}
		}
		f := base(finding.DetectorNVLinkInactive, fmt.Sprintf("NVML NVLink state of %s: %d links, inactive: %s", inv.PCI, len(links), strings.Join(inactive, ",")))
		f.Count = max(len(inactive), 1)
		f.Attrs[finding.AttrLinks] = strings.Join(inactive, ",")
		if len(inactive) == len(links) {
			f.Attrs[finding.AttrScope] = "all-links"
		}
		m.reportIf(res, key("nvlink"), len(inactive) > 0, strings.Join(inactive, ","), f)
		if len(inactive) > 0 {
			problems = append(problems, inv.PCI+": NVLinks inactive: "+strings.Join(inactive, ","))
		}
	}
	return inv, problems, nil
}

// report records fact k with value v and adds f when v differs from what was
// reported last; v "" clears the fact (f unused).
func (m *Monitor) report(res *source.Result, k, v string, f finding.Finding) {
	old := m.reported[k]
	if v == "" {
		delete(m.reported, k)
		return
	}
	m.reported[k] = v
	if old != v {
		res.Findings = append(res.Findings, f)
	}
}

func (m *Monitor) reportIf(res *source.Result, k string, on bool, v string, f finding.Finding) {
	if !on {
		v = ""
	} else if v == "" {
		v = "true"
	}
	m.report(res, k, v, f)
}

// initFailed is the result of a failed Init: never a hardware fault. A
// version mismatch is a fact about the node's driver, not about the
// monitor: the state is failing and the finding a driver-version-mismatch.
func (m *Monitor) initFailed(err error, now time.Time, mod, libv string) source.Result {
	res := source.Result{State: finding.StateUnknown, Reason: err.Error()}
	if errors.Is(err, ErrVersionMismatch) {
		res.State = finding.StateFailing
		if msg := err.Error(); msg != m.lastInitErr {
			m.lastInitErr = msg
			res.Findings = append(res.Findings, mismatchFinding(now, "nvml", mod, libv))
		}
		return res
	}
	if errors.Is(err, ErrLibraryNotFound) && !m.opts.ExpectGPUs {
		res.State = finding.StateAbsent
		return res
	}
	if errors.Is(err, source.ErrBusy) {
		return res // the hung Init was reported when it timed out
	}
	if msg := err.Error(); msg != m.lastInitErr {
		m.lastInitErr = msg
		res.Findings = append(res.Findings, monitoringPlane(msg, now))
	}
	return res
}

// hung is the result of a call that timed out or is still hung.
func (m *Monitor) hung(res source.Result, err error, now time.Time) source.Result {
	res.State, res.Reason, res.Findings = finding.StateUnknown, err.Error(), nil
	if errors.Is(err, source.ErrBusy) {
		return res // already reported when it timed out
	}
	if msg := err.Error(); msg != m.lastHung {
		m.lastHung = msg
		res.Findings = append(res.Findings, monitoringPlane(msg, now))
	}
	return res
}

// mismatchFinding is a driver-version-mismatch seen by the agent: NVML's
// init error (source nvml) or the module and library versions on the host
// differing (source agent).
func mismatchFinding(now time.Time, src, mod, libv string) finding.Finding {
	attrs := map[string]string{finding.AttrError: ErrVersionMismatch.Error(), finding.AttrSource: src}
	ev := "nvml: " + ErrVersionMismatch.Error()
	if mod != "" {
		attrs[finding.AttrModuleVersion] = mod
		ev += ", kernel module " + mod
	}
	if libv != "" {
		attrs[finding.AttrNVMLLibraryVersion] = libv
		ev += ", library " + libv
	}
	return finding.Finding{Detector: finding.DetectorDriverVersionMismatch, Time: now, Attrs: attrs, Evidence: []string{ev}}
}

func monitoringPlane(msg string, now time.Time) finding.Finding {
	return finding.Finding{Detector: finding.DetectorMonitoring, Time: now,
		Attrs:    map[string]string{finding.AttrComponent: "nvml", finding.AttrError: msg},
		Evidence: []string{"nvml: " + msg}}
}

// nvmlMessage is NVML's error text for a failed handle, as nvidia-smi
// prints it ("GPU is lost", "Unknown Error").
func nvmlMessage(err error) string {
	for _, e := range []error{ErrGPULost, ErrUnknown, ErrResetRequired, ErrDriverNotLoaded} {
		if errors.Is(err, e) {
			return e.Error()
		}
	}
	return err.Error()
}
