package detect

import (
	"regexp"
	"strings"

	"github.com/fleetrepair/fleetrepair/agent/finding"
	"github.com/fleetrepair/fleetrepair/agent/kmsg"
)

// A PCIe AER report, as Linux prints it (drivers/pci/pcie/aer.c and err.c),
// is many lines, each prefixed with the driver and address of the device it
// is about:
//
//	pcieport 0000:00:02.0: AER: Uncorrected (Fatal) error received: id=0010    header (root port)
//	pcieport 0000:00:02.0: PCIe Bus Error: severity=Uncorrected (Fatal), type=Transaction Layer, ...  reporting device
//	pcieport 0000:00:02.0:   device [8086:6f04] error status/mask=00000020/00000000
//	pcieport 0000:00:02.0:    [ 5] Surprise Down Error    (First)               error bits
//	pcieport 0000:00:02.0: broadcast error_detected message                     fatal/non-fatal: recovery starts
//	nvidia 0000:02:00.0: device has no AER-aware driver                         drivers below the port
//	pcieport 0000:00:03.0: AER: Root Port link has been reset (0)
//	pcieport 0000:00:03.0: AER: device recovery failed                          outcome: the report is complete
//
// Newer kernels say "Uncorrectable"/"Correctable" and "error message received
// from"; both spellings are read. The "nvidia <address>" line of the same
// broadcast names the GPU behind the port (c01, c18); other functions of the
// card (the audio function 0000:03:00.1) are not GPUs.
type aerReport struct {
	port           string   // device of the header line (the port that received the message)
	reporter       string   // device of the "PCIe Bus Error" line
	reporterDriver string   // its driver ("pcieport", "nvidia", ...)
	severity       string   // detector: aer-correctable, aer-nonfatal or aer-fatal
	errs           []string // error bit names in printed order
	first          int      // index in errs of the "(First)" error, -1 none
	gpu            string   // nvidia device named in the broadcast
	recoveryFailed bool
}

// aerBitRE matches an error bit line: "[ 5] Surprise Down Error    (First)".
var aerBitRE = regexp.MustCompile(`^\[\s*\d+\]\s+(.*?)\s*(\(First\))?$`)

// deviceLine splits "<driver> <dddd:bb:dd.f>: <rest>", the prefix of every
// line the kernel prints through dev_printk. rest keeps its leading spaces.
func deviceLine(msg string) (driver, pci, rest string, ok bool) {
	sp := strings.IndexByte(msg, ' ')
	if sp <= 0 || len(msg) < sp+1+12+1 {
		return "", "", "", false
	}
	addr := msg[sp+1 : sp+13]
	if msg[sp+13] != ':' || addr[4] != ':' || addr[7] != ':' || addr[10] != '.' {
		return "", "", "", false
	}
	pci, err := finding.NormalizePCI(addr)
	if err != nil {
		return "", "", "", false
	}
	return msg[:sp], pci, strings.TrimPrefix(msg[sp+14:], " "), true
}

// aerSeverity reads the severity out of a header or "PCIe Bus Error" line.
func aerSeverity(s string) string {
	switch {
	case strings.Contains(s, "Non-Fatal"):
		return finding.DetectorAERNonFatal
	case strings.Contains(s, "Fatal"):
		return finding.DetectorAERFatal
	case strings.Contains(s, "Corrected") || strings.Contains(s, "Correctable"):
		return finding.DetectorAERCorrectable
	}
	return ""
}

// aerFor returns the held report a line of device dev belongs to: the one
// whose port or reporting device is dev.
func (d *Detector) aerFor(dev string) *group {
	for i := len(d.open) - 1; i >= 0; i-- {
		g := d.open[i]
		if !g.done && g.kind == kindAER && (g.aer.port == dev || g.aer.reporter == dev) {
			return g
		}
	}
	return nil
}

// lastAER returns the most recent held report, or nil.
func (d *Detector) lastAER() *group {
	for i := len(d.open) - 1; i >= 0; i-- {
		if g := d.open[i]; !g.done && g.kind == kindAER {
			return g
		}
	}
	return nil
}

// aerLine feeds one record to the AER assembler.
func (d *Detector) aerLine(rec kmsg.Record, closed, cur *[]finding.Finding) {
	driver, dev, rest, ok := deviceLine(rec.Message)
	if !ok {
		return
	}
	text := strings.TrimSpace(rest)
	window := d.rules.AER.Window.Duration
	newReport := func() *group {
		return d.openGroup(kindAER, dev, finding.Finding{}, rec, window)
	}
	switch {
	case strings.HasPrefix(text, "AER:") && strings.Contains(text, " received"):
		// Header: a new report from this port. One still held for the same
		// port is complete.
		if g := d.aerFor(dev); g != nil {
			*closed = d.close(g, *closed)
		}
		g := newReport()
		g.aer = &aerReport{port: dev, severity: aerSeverity(text), first: -1}

	case strings.HasPrefix(text, "PCIe Bus Error:"):
		g := d.aerFor(dev)
		if g == nil {
			// Details from a device below the port that printed the header.
			if last := d.lastAER(); last != nil && last.aer.reporter == "" && d.joins(last, rec) {
				g = last
			}
		}
		if g == nil {
			g = newReport()
			g.aer = &aerReport{port: dev, first: -1}
		}
		sev := text
		if i := strings.Index(text, "severity="); i >= 0 {
			sev = text[i:]
			if j := strings.Index(sev, ", type="); j >= 0 {
				sev = sev[:j]
			}
		}
		if s := aerSeverity(sev); s != "" {
			g.aer.severity = s
		}
		g.aer.reporter, g.aer.reporterDriver = dev, driver
		d.add(g, rec)

	case strings.HasPrefix(text, "AER: device recovery"):
		g := d.aerFor(dev)
		if g == nil {
			return // the outcome of a report we did not see (c18 starts with one)
		}
		d.add(g, rec)
		g.aer.recoveryFailed = strings.Contains(text, "failed")
		*cur = d.close(g, *cur) // the outcome is the report's last line

	default:
		g := d.aerFor(dev)
		if m := aerBitRE.FindStringSubmatch(text); m != nil && g != nil {
			g.aer.errs = append(g.aer.errs, m[1])
			if m[2] != "" && g.aer.first < 0 {
				g.aer.first = len(g.aer.errs) - 1
			}
		}
		if g == nil && strings.Contains(text, "AER") {
			// A driver below the port answering the broadcast.
			if last := d.lastAER(); last != nil && d.joins(last, rec) {
				g = last
			}
		}
		if g == nil {
			return
		}
		if driver == "nvidia" && dev != g.aer.port && dev != g.aer.reporter && g.aer.gpu == "" {
			g.aer.gpu = dev
		}
		d.add(g, rec)
	}
}

// aerFinding builds the finding of a complete report; ok is false when the
// report never said its severity (only its tail was seen).
func (d *Detector) aerFinding(g *group) (finding.Finding, bool) {
	a := g.aer
	if a == nil || a.severity == "" {
		return finding.Finding{}, false
	}
	f := g.f
	f.Detector = a.severity
	reporter := a.reporter
	if reporter == "" {
		reporter = a.port
	}
	if a.reporterDriver == "nvidia" {
		f.GPUPCI = reporter // the GPU reported the error itself
	} else {
		f.DevicePCI = reporter
		f.GPUPCI = a.gpu
		if f.GPUPCI == "" {
			f.GPUPCI = d.portGPU[reporter]
		}
		if f.GPUPCI == "" && d.opts.GPUBehindPort != nil {
			f.GPUPCI = d.opts.GPUBehindPort(reporter)
		}
		if f.GPUPCI != "" {
			d.portGPU[reporter] = f.GPUPCI
		}
	}
	f.Attrs = map[string]string{}
	if len(a.errs) > 0 {
		ordered := make([]string, 0, len(a.errs))
		if a.first >= 0 {
			ordered = append(ordered, a.errs[a.first])
		}
		for i, e := range a.errs {
			if i != a.first {
				ordered = append(ordered, e)
			}
		}
		f.Attrs[finding.AttrError] = ordered[0]
		f.Attrs[finding.AttrErrors] = strings.Join(ordered, ",")
	}
	if a.recoveryFailed {
		f.Attrs[finding.AttrRecovery] = "failed"
	}
	return f, true
}
