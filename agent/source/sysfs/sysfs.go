// Package sysfs reads the GPUs the kernel sees on the PCI bus, straight from
// /sys, without any NVIDIA library: NVIDIA functions (vendor 0x10de) of the
// display class (VGA 0x0300 or 3D controller 0x0302), compared with the
// number the node should have, and the PCIe AER counters of each GPU and the
// ports above it.
//
// It is the cross-check that still works when the driver or NVML is broken:
// a GPU that fell off the bus disappears here too.
package sysfs

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/fleetrepair/fleetrepair/agent/finding"
	"github.com/fleetrepair/fleetrepair/agent/source"
	"github.com/fleetrepair/fleetrepair/agent/source/hostroot"
)

// Name is the monitor's name in heartbeats.
const Name = "sysfs-gpu"

// InstanceGPUs is the number of GPUs of common cloud GPU instance types,
// used when no expected count is configured. The instance type comes from
// Options.InstanceType or, on AWS and Azure, DMI's product name.
var InstanceGPUs = map[string]int{
	"p3.2xlarge": 1, "p3.8xlarge": 4, "p3.16xlarge": 8, "p3dn.24xlarge": 8,
	"p4d.24xlarge": 8, "p4de.24xlarge": 8, "p5.48xlarge": 8, "p5e.48xlarge": 8, "p5en.48xlarge": 8,
	"g5.xlarge": 1, "g5.2xlarge": 1, "g5.4xlarge": 1, "g5.8xlarge": 1, "g5.16xlarge": 1,
	"g5.12xlarge": 4, "g5.24xlarge": 4, "g5.48xlarge": 8,
	"g6.xlarge": 1, "g6.12xlarge": 4, "g6.48xlarge": 8, "g6e.48xlarge": 8,
	"Standard_ND96asr_v4": 8, "Standard_ND96amsr_A100_v4": 8, "Standard_ND96isr_H100_v5": 8,
	"a2-highgpu-8g": 8, "a2-ultragpu-8g": 8, "a3-highgpu-8g": 8, "a3-megagpu-8g": 8,
}

// Options configure a Source.
type Options struct {
	Root hostroot.Root
	// Expected is the number of GPUs the node must have; 0 looks it up in
	// InstanceGPUs; when that fails too, the count is not checked.
	Expected int
	// InstanceType overrides the DMI product name for the InstanceGPUs lookup.
	InstanceType string
	// Now is the clock for correctable-error windows; default time.Now.
	Now func() time.Time
}

// Source is the sysfs monitor. Check must not be called concurrently.
type Source struct {
	opts     Options
	expected int
	lastGPUs int // GPUs found at the last check, -1 before the first
	aer      map[string]map[string]uint64
	lastAt   time.Time
}

// New returns a Source.
func New(opts Options) *Source {
	if opts.Now == nil {
		opts.Now = time.Now
	}
	s := &Source{opts: opts, expected: opts.Expected, lastGPUs: -1, aer: map[string]map[string]uint64{}}
	if s.expected == 0 {
		it := opts.InstanceType
		if it == "" {
			it, _ = opts.Root.ReadString("/sys/devices/virtual/dmi/id/product_name")
		}
		s.expected = InstanceGPUs[it]
	}
	return s
}

// Name implements source.Checker.
func (s *Source) Name() string { return Name }

// Expected returns the GPU count the node should have; 0 when unknown.
func (s *Source) Expected() int { return s.expected }

// Device is one PCI function of the GPU list.
type Device struct {
	PCI      string // "0000:3b:00.0"
	PCIID    string // "10de:2330"
	Class    string // "0x030200"
	SysPath  string // resolved /sys/devices/... path (agent-side)
	Upstream []string
}

// GPUs lists the NVIDIA display-class PCI functions, sorted by address.
func (s *Source) GPUs() ([]Device, error) {
	dir := s.opts.Root.Path("/sys/bus/pci/devices")
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("list pci devices: %w", err)
	}
	var out []Device
	for _, e := range ents {
		p := filepath.Join(dir, e.Name())
		vendor, _ := readTrim(filepath.Join(p, "vendor"))
		class, _ := readTrim(filepath.Join(p, "class"))
		if !strings.EqualFold(vendor, "0x10de") || !isDisplay(class) {
			continue
		}
		dev, _ := readTrim(filepath.Join(p, "device"))
		pci, err := finding.NormalizePCI(e.Name())
		if err != nil {
			continue
		}
		d := Device{PCI: pci, PCIID: "10de:" + strings.TrimPrefix(strings.ToLower(dev), "0x"), Class: class, SysPath: p}
		if real, err := filepath.EvalSymlinks(p); err == nil {
			d.SysPath = real
			// Ports above the GPU: the PCI-address-named parents in the path.
			for parent := filepath.Dir(real); ; parent = filepath.Dir(parent) {
				b := filepath.Base(parent)
				if a, err := finding.NormalizePCI(b); err == nil && strings.Count(b, ":") == 2 {
					d.Upstream = append(d.Upstream, a)
					continue
				}
				break
			}
		}
		out = append(out, d)
	}
	slices.SortFunc(out, func(a, b Device) int { return strings.Compare(a.PCI, b.PCI) })
	return out, nil
}

// isDisplay reports whether a PCI class ("0x030200") is VGA (0x0300xx) or
// 3D controller (0x0302xx).
func isDisplay(class string) bool {
	c := strings.TrimPrefix(strings.ToLower(class), "0x")
	return strings.HasPrefix(c, "0300") || strings.HasPrefix(c, "0302")
}

func readTrim(p string) (string, error) {
	b, err := os.ReadFile(p)
	return strings.TrimSpace(string(b)), err
}

// GPUBehindPort returns the GPU below a PCIe port (or the GPU itself), ""
// when none is known; for detect.Options.GPUBehindPort.
func (s *Source) GPUBehindPort(port string) string {
	gpus, err := s.GPUs()
	if err != nil {
		return ""
	}
	for _, g := range gpus {
		if g.PCI == port || slices.Contains(g.Upstream, port) {
			return g.PCI
		}
	}
	return ""
}

// Check implements source.Checker. The state is failing while fewer GPUs
// than expected are on the bus, ok otherwise (also when no count is
// expected), absent when the node has no NVIDIA GPU and none is expected,
// unknown when /sys cannot be read. A gpu-count finding is reported when the
// number of missing GPUs changes; AER findings when counters rise: fatal and
// non-fatal at any rise (and at the first check, for errors earlier in this
// boot), correctable as the rise since the last check.
func (s *Source) Check(_ context.Context) source.Result {
	now := s.opts.Now()
	gpus, err := s.GPUs()
	if err != nil {
		return source.Result{State: finding.StateUnknown, Reason: err.Error()}
	}
	res := source.Result{State: finding.StateOK}
	for _, g := range gpus {
		res.GPUs = append(res.GPUs, finding.GPU{Index: -1, PCI: g.PCI, PCIID: g.PCIID})
	}
	switch {
	case len(gpus) == 0 && s.expected == 0:
		res.State, res.Reason = finding.StateAbsent, "no NVIDIA GPU on the PCI bus and none expected"
	case s.expected > 0 && len(gpus) < s.expected:
		res.State = finding.StateFailing
		res.Reason = fmt.Sprintf("%d of %d expected GPUs on the PCI bus", len(gpus), s.expected)
	}
	if s.expected > 0 && len(gpus) != s.lastGPUs && (len(gpus) < s.expected || s.lastGPUs >= 0 && s.lastGPUs < s.expected) {
		missing := max(s.expected-len(gpus), 0)
		var found []string
		for _, g := range gpus {
			found = append(found, g.PCI)
		}
		res.Findings = append(res.Findings, finding.Finding{Detector: finding.DetectorGPUCount, Time: now,
			Attrs: map[string]string{finding.AttrMissing: strconv.Itoa(missing), finding.AttrExpected: strconv.Itoa(s.expected),
				finding.AttrFound: strconv.Itoa(len(gpus))},
			Evidence: []string{fmt.Sprintf("sysfs: %d NVIDIA display-class PCI functions (%s), %d expected", len(gpus), strings.Join(found, " "), s.expected)}})
	}
	s.lastGPUs = len(gpus)
	res.Findings = append(res.Findings, s.checkAER(gpus, now)...)
	s.lastAt = now
	return res
}

// aerFiles maps the sysfs AER counter files to detectors.
var aerFiles = []struct{ file, detector string }{
	{"aer_dev_fatal", finding.DetectorAERFatal},
	{"aer_dev_nonfatal", finding.DetectorAERNonFatal},
	{"aer_dev_correctable", finding.DetectorAERCorrectable},
}

func (s *Source) checkAER(gpus []Device, now time.Time) []finding.Finding {
	var out []finding.Finding
	for _, g := range gpus {
		devs := append([]string{g.SysPath}, upstreamPaths(g)...)
		addrs := append([]string{g.PCI}, g.Upstream...)
		for i, p := range devs {
			for _, af := range aerFiles {
				counters, err := readCounters(filepath.Join(p, af.file))
				if err != nil {
					continue // no AER capability, or not readable
				}
				key := addrs[i] + "/" + af.file
				old, seen := s.aer[key]
				s.aer[key] = counters
				delta := counters["TOTAL_ERR_FATAL"] + counters["TOTAL_ERR_NONFATAL"] + counters["TOTAL_ERR_COR"]
				if seen {
					delta -= old["TOTAL_ERR_FATAL"] + old["TOTAL_ERR_NONFATAL"] + old["TOTAL_ERR_COR"]
				} else if af.detector == finding.DetectorAERCorrectable {
					continue // correctable: a rate, from the second check on
				}
				if delta == 0 || delta > 1<<62 { // no rise, or the counter went back (driver reload)
					continue
				}
				var names []string
				for k, v := range counters {
					if v > old[k] && !strings.HasPrefix(k, "TOTAL_") {
						names = append(names, k)
					}
				}
				slices.Sort(names)
				f := finding.Finding{Detector: af.detector, Time: now, GPUPCI: g.PCI, Count: int(min(delta, 1<<30)),
					Attrs:    map[string]string{finding.AttrCounter: af.file, finding.AttrErrors: strings.Join(names, ",")},
					Evidence: []string{fmt.Sprintf("sysfs %s of %s: %s", af.file, addrs[i], formatCounters(counters))}}
				if addrs[i] != g.PCI {
					f.DevicePCI = addrs[i]
				}
				if seen && !s.lastAt.IsZero() {
					f.Attrs["window_s"] = strconv.Itoa(int(now.Sub(s.lastAt).Seconds()))
				}
				out = append(out, f)
			}
		}
	}
	return out
}

func upstreamPaths(g Device) []string {
	var out []string
	p := g.SysPath
	for range g.Upstream {
		p = filepath.Dir(p)
		out = append(out, p)
	}
	return out
}

// readCounters reads an AER counter file: "NAME value" lines.
func readCounters(p string) (map[string]uint64, error) {
	b, err := os.ReadFile(p)
	if err != nil {
		return nil, err
	}
	m := map[string]uint64{}
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) != 2 {
			continue
		}
		v, err := strconv.ParseUint(f[1], 10, 64)
		if err != nil {
			// A counter that does not parse (or overflows u64) makes the
			// whole file unread: keeping the other counters would make the
			// missing one look like a counter that went back to 0.
			return nil, fmt.Errorf("read AER counters %s: %s: %w", p, f[0], err)
		}
		m[f[0]] = v
	}
	return m, nil
}

func formatCounters(m map[string]uint64) string {
	keys := make([]string, 0, len(m))
	for k, v := range m {
		if v > 0 {
			keys = append(keys, k)
		}
	}
	slices.Sort(keys)
	for i, k := range keys {
		keys[i] = k + "=" + strconv.FormatUint(m[k], 10)
	}
	return strings.Join(keys, " ")
}
