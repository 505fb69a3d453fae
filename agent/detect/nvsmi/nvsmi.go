// Package nvsmi turns saved nvidia-smi output into findings: the error lines
// nvidia-smi prints when NVML cannot reach a GPU ("Unable to determine the
// device handle for GPU 0000:09:00.0: Unknown Error"), the "Remapped Rows"
// and "Retired Pages" sections of "nvidia-smi -q", and the link table of
// "nvidia-smi nvlink -s" (and its all-links-inactive error line).
//
// It reads tool output someone saved (a bug report, a support bundle, a
// node's cron job). The live agent asks NVML directly (agent/source/nvml) and
// never runs nvidia-smi, which can hang on a broken GPU. Findings carry no
// node or ID; detect.Stamp completes them.
package nvsmi

import (
	"bufio"
	"fmt"
	"io"
	"regexp"
	"sort"
	"strconv"
	"strings"

	"github.com/fleetrepair/fleetrepair/agent/finding"
)

// Stats count what Parse saw.
type Stats struct {
	Lines    int // physical lines read
	GPUs     int // GPU blocks ("GPU 00000000:3B:00.0" in -q, "GPU 3:" in nvlink -s)
	Sections int // "Remapped Rows" and "Retired Pages" sections read
}

var (
	// handleErr is nvidia-smi's message when nvmlDeviceGetHandleByPciBusId
	// (or ..ByIndex) fails: the text after the address is NVML's error string,
	// sometimes followed by advice ("GPU is lost.  Reboot the system...").
	// nvidia-smi prints the bus ID both after "GPU " and glued to it
	// ("for GPU0000:AA:00.0: Unknown Error", the rendering of most public
	// reports), so the space is optional.
	handleErr = regexp.MustCompile(`(?i)Unable to determine the device handle for (?:GPU\s*)?([0-9a-f]{4,8}:[0-9a-f]{2}:[0-9a-f]{2}(?:\.[0-7])?)\s*:\s*(.*)$`)
	// allLinksInactive is "nvidia-smi nvlink" when NVML reports every link down.
	allLinksInactive = regexp.MustCompile(`(?i)Unable to retrieve Nvlink information as all links are inactive`)
	// gpuQ is the GPU block header of "nvidia-smi -q".
	gpuQ = regexp.MustCompile(`^GPU ([0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-7])\s*$`)
	// gpuLink is the GPU header of "nvidia-smi nvlink -s": "GPU 3: Tesla V100-SXM2-32GB (UUID: GPU-...)".
	gpuLink = regexp.MustCompile(`^GPU (\d+): (.*?)\s*(?:\(UUID: ([^)]*)\))?\s*$`)
	// linkLine is one link of "nvidia-smi nvlink -s": a speed or "<inactive>".
	linkLine = regexp.MustCompile(`^\s*Link (\d+): (<inactive>|([0-9.]+) GB/s)`)
	// keyValue is a "Key : Value" line of "nvidia-smi -q".
	keyValue = regexp.MustCompile(`^(\s*)([^:]+?)\s*:\s*(.*?)\s*$`)
	// driverGone covers nvidia-smi's messages when it cannot talk to the driver at all.
	// versionMismatch is NVML's NVML_ERROR_LIB_RM_VERSION_MISMATCH as
	// nvidia-smi (and every NVML client) prints it: the user-space library
	// and the loaded kernel module are of different driver versions (c24).
	versionMismatch = regexp.MustCompile(`(?i)Driver/library version mismatch`)
	// nvmlLibVersion is the line nvidia-smi adds after the mismatch on newer
	// drivers: "NVML library version: 570.195".
	nvmlLibVersion = regexp.MustCompile(`(?i)^\s*NVML library version:\s*(\d+\.\d+(?:\.\d+)?)`)
	driverGone     = regexp.MustCompile(`(?i)NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver|No devices were found|Failed to initialize NVML: (.*)$`)
)

// section is an open "Remapped Rows" / "Retired Pages" block of -q output.
type section struct {
	name   string
	indent int
	kv     map[string]string
	lines  []string
}

// Parse reads nvidia-smi output (any of the renderings in the package doc,
// several concatenated) and returns its findings in input order.
func Parse(r io.Reader) ([]finding.Finding, Stats, error) {
	var (
		st   Stats
		out  []finding.Finding
		gpu  string   // PCI address of the enclosing -q GPU block
		sec  *section // open -q section
		link *linkGPU // open nvlink -s GPU
	)
	closeSection := func() {
		if sec != nil {
			out = append(out, sectionFindings(sec, gpu)...)
			sec = nil
		}
	}
	closeLink := func() {
		if link != nil {
			if f, ok := link.finding(); ok {
				out = append(out, f)
			}
			link = nil
		}
	}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64*1024), 1<<20)
	for sc.Scan() {
		line := strings.TrimRight(sc.Text(), "\r")
		st.Lines++
		if m := handleErr.FindStringSubmatch(line); m != nil {
			pci, _ := finding.NormalizePCI(m[1])
			out = append(out, finding.Finding{Detector: finding.DetectorNVMLError, GPUPCI: pci,
				Attrs: map[string]string{finding.AttrError: nvmlError(m[2])}, Evidence: []string{line}})
			continue
		}
		if allLinksInactive.MatchString(line) {
			out = append(out, finding.Finding{Detector: finding.DetectorNVLinkInactive,
				Attrs: map[string]string{finding.AttrScope: "all-links"}, Evidence: []string{line}})
			continue
		}
		if versionMismatch.MatchString(line) {
			closeSection()
			out = append(out, finding.Finding{Detector: finding.DetectorDriverVersionMismatch,
				Attrs:    map[string]string{finding.AttrError: "Driver/library version mismatch", finding.AttrSource: "nvidia-smi"},
				Evidence: []string{line}})
			continue
		}
		if m := nvmlLibVersion.FindStringSubmatch(line); m != nil {
			if n := len(out); n > 0 && out[n-1].Detector == finding.DetectorDriverVersionMismatch {
				out[n-1].Attrs[finding.AttrNVMLLibraryVersion] = m[1]
				out[n-1].Evidence = append(out[n-1].Evidence, line)
			}
			continue
		}
		if m := driverGone.FindStringSubmatch(line); m != nil {
			e := strings.TrimSpace(m[0])
			if m[1] != "" {
				e = nvmlError(m[1])
			}
			out = append(out, finding.Finding{Detector: finding.DetectorNVMLError,
				Attrs: map[string]string{finding.AttrError: e}, Evidence: []string{line}})
			continue
		}
		if m := gpuQ.FindStringSubmatch(line); m != nil {
			closeSection()
			closeLink()
			gpu, _ = finding.NormalizePCI(m[1])
			st.GPUs++
			continue
		}
		if m := gpuLink.FindStringSubmatch(line); m != nil {
			closeSection()
			closeLink()
			link = &linkGPU{index: m[1], model: m[2], uuid: m[3], header: line}
			st.GPUs++
			continue
		}
		if link != nil {
			if m := linkLine.FindStringSubmatch(line); m != nil {
				link.lines = append(link.lines, line)
				if m[2] == "<inactive>" {
					link.inactive = append(link.inactive, m[1])
				} else {
					link.speeds = append(link.speeds, m[3])
				}
				continue
			}
		}
		m := keyValue.FindStringSubmatch(line)
		trim := strings.TrimSpace(line)
		indent := len(line) - len(strings.TrimLeft(line, " \t"))
		if sec != nil && trim != "" && indent <= sec.indent {
			closeSection()
		}
		if m == nil {
			switch trim {
			case "Remapped Rows", "Retired Pages", "Fabric":
				closeSection()
				sec = &section{name: trim, indent: indent, kv: map[string]string{}, lines: []string{line}}
				st.Sections++
			}
			continue
		}
		if sec != nil {
			sec.kv[strings.ToLower(m[2])] = m[3]
			sec.lines = append(sec.lines, line)
		}
	}
	closeSection()
	closeLink()
	if err := sc.Err(); err != nil {
		return out, st, fmt.Errorf("read nvidia-smi output: %w", err)
	}
	return out, st, nil
}

// nvmlError condenses NVML's error text: the error string, without the
// advice nvidia-smi appends after the first sentence.
func nvmlError(s string) string {
	s = strings.TrimSpace(s)
	if i := strings.Index(s, ". "); i >= 0 {
		s = s[:i]
	}
	return strings.TrimSpace(strings.TrimSuffix(s, "."))
}

// sectionFindings turns a -q section into findings: a pending or failed row
// remap, or pending page retirement. A section that reports nothing pending
// is healthy and yields nothing.
func sectionFindings(s *section, gpu string) []finding.Finding {
	yes := func(k string) bool { return strings.EqualFold(s.kv[k], "yes") }
	num := func(k string) string {
		v := s.kv[k]
		if _, err := strconv.Atoi(v); err == nil {
			return v
		}
		return ""
	}
	var out []finding.Finding
	switch s.name {
	case "Remapped Rows":
		attrs := map[string]string{}
		if v := num("uncorrectable error"); v != "" {
			attrs[finding.AttrUncorrectableRows] = v
		}
		if v := num("correctable error"); v != "" {
			attrs[finding.AttrCorrectableRows] = v
		}
		if yes("remapping failure occurred") {
			out = append(out, finding.Finding{Detector: finding.DetectorRowRemapFailure, GPUPCI: gpu,
				Attrs: clone(attrs), Evidence: s.lines})
		}
		if yes("pending") {
			attrs[finding.AttrPending] = "true"
			out = append(out, finding.Finding{Detector: finding.DetectorRowRemapPending, GPUPCI: gpu,
				Attrs: attrs, Evidence: s.lines})
		}
	case "Fabric":
		// "nvidia-smi -q" Fabric block (NVSwitch / NVLink-C2C systems):
		// State is Not Supported, Not Started, In Progress or Completed;
		// Status is Success or the error Fabric Manager reported. Anything
		// but a completed, successful registration means the GPU is not on
		// the NVLink fabric yet (or failed to join).
		state, status := s.kv["state"], s.kv["status"]
		if state == "" || strings.EqualFold(state, "Not Supported") || strings.EqualFold(state, "N/A") {
			break
		}
		if strings.EqualFold(state, "Completed") && (status == "" || strings.EqualFold(status, "Success") || strings.EqualFold(status, "N/A")) {
			break
		}
		attrs := map[string]string{finding.AttrState: strings.ToLower(state)}
		if status != "" {
			attrs[finding.AttrStatus] = status
		}
		out = append(out, finding.Finding{Detector: finding.DetectorFabricState, GPUPCI: gpu, Attrs: attrs, Evidence: s.lines})
	case "Retired Pages":
		if yes("pending page blacklist") || yes("pending page retirement") || yes("pending") {
			attrs := map[string]string{finding.AttrPending: "true"}
			for k, a := range map[string]string{
				"single bit ecc": finding.AttrSBEPages, "double bit ecc": finding.AttrDBEPages,
			} {
				if v := num(k); v != "" {
					attrs[a] = v
				}
			}
			out = append(out, finding.Finding{Detector: finding.DetectorRetiredPages, GPUPCI: gpu,
				Attrs: attrs, Evidence: s.lines})
		}
	}
	return out
}

func clone(m map[string]string) map[string]string {
	c := make(map[string]string, len(m))
	for k, v := range m {
		c[k] = v
	}
	return c
}

// linkGPU is one GPU block of "nvidia-smi nvlink -s".
type linkGPU struct {
	index, model, uuid, header string
	lines                      []string
	inactive                   []string
	speeds                     []string
}

// finding returns the GPU's nvlink-inactive finding: one event per inactive
// link (Count), the link numbers, and the speed its active links run at
// (the lowest one when they differ, which is the one that limits traffic).
func (g *linkGPU) finding() (finding.Finding, bool) {
	if len(g.inactive) == 0 {
		return finding.Finding{}, false
	}
	attrs := map[string]string{
		finding.AttrGPUIndex: g.index,
		finding.AttrLinks:    strings.Join(g.inactive, ","),
	}
	if g.model != "" {
		attrs[finding.AttrModel] = g.model
	}
	if strings.HasPrefix(g.uuid, "GPU-") {
		attrs[finding.AttrGPUUUID] = g.uuid
	}
	if len(g.speeds) > 0 {
		sort.Slice(g.speeds, func(i, j int) bool {
			a, _ := strconv.ParseFloat(g.speeds[i], 64)
			b, _ := strconv.ParseFloat(g.speeds[j], 64)
			return a < b
		})
		attrs[finding.AttrLinkSpeed] = g.speeds[0]
	}
	return finding.Finding{Detector: finding.DetectorNVLinkInactive, Count: len(g.inactive), Attrs: attrs,
		Evidence: append([]string{g.header}, g.lines...)}, true
}
