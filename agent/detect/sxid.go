package detect

import (
	"regexp"
	"strconv"
	"strings"

	"github.com/fleetrepair/fleetrepair/agent/finding"
	"github.com/fleetrepair/fleetrepair/agent/kmsg"
)

// NVSwitch SXid lines (the nvidia-nvswitch driver, NVIDIA's "NVSwitch SXid
// errors" catalogue in the Fabric Manager user guide). One SXid event is
// printed as up to three lines, interleaved across switches and with NVRM
// lines (c25):
//
//	nvidia-nvswitch2: SXid (PCI:0000:07:00.0): 12028, Non-fatal, Link 62 egress non-posted PRIV error (First)
//	nvidia-nvswitch2: SXid (PCI:0000:07:00.0): 12028, Severity 0 Engine instance 62 Sub-engine instance 00
//	nvidia-nvswitch2: SXid (PCI:0000:07:00.0): 12028, Data {0x000001c0, ...}
//
// Only the summary line carries the severity (Fatal / Non-fatal), the link
// and the error's name. A summary line opens an event; engine and Data lines
// of the same switch and SXid join it (the Data line ends it); one without an
// open event is an event of its own, whose summary was printed before the
// input starts.
var (
	sxidRE = regexp.MustCompile(`SXid \((?:PCI:)?([0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}(?:\.[0-7])?)\): (\d+)(?:,\s*(.*))?`)
	// sxidSummaryRE reads "Non-fatal, Link 62 egress non-posted PRIV error (First)";
	// older drivers print "Fatal error," and some events name no link.
	sxidSummaryRE = regexp.MustCompile(`(?i)^(non-fatal|fatal)(?: error)?\b,?\s*(?:link (\d+)\b,?\s*)?(.*?)\s*(?:\((?:first|subsequent)[^)]*\))?\s*$`)
)

// sxidLine is what one SXid line says.
type sxidLine struct {
	device, sxid string
	summary      bool // the line with severity, link and error name
	data         bool // the "Data {...}" line, the last of an event
	attrs        map[string]string
}

// parseSXid reads an SXid line; ok is false when msg holds none. err is set
// (and ok false) when the SXid or link number is out of range: the line is
// rejected, never read with a number cut short.
func parseSXid(msg string) (sxidLine, bool, error) {
	m := sxidRE.FindStringSubmatch(msg)
	if m == nil {
		return sxidLine{}, false, nil
	}
	dev, err := finding.NormalizePCI(m[1])
	if err != nil {
		return sxidLine{}, false, nil
	}
	n, err := finding.ParseNumber("sxid", m[2], 1, finding.MaxSXid)
	if err != nil {
		return sxidLine{}, false, err
	}
	id := strconv.Itoa(n)
	s := sxidLine{device: dev, sxid: id, attrs: map[string]string{finding.AttrSXid: id}}
	rest := strings.TrimSpace(m[3])
	switch {
	case strings.HasPrefix(rest, "Data"):
		s.data = true
	case sxidSummaryRE.MatchString(rest):
		sm := sxidSummaryRE.FindStringSubmatch(rest)
		s.summary = true
		s.attrs[finding.AttrSeverity] = strings.ToLower(sm[1])
		if sm[2] != "" {
			l, err := finding.ParseNumber("link", sm[2], 0, finding.MaxLink)
			if err != nil {
				return sxidLine{}, false, err
			}
			s.attrs[finding.AttrLink] = strconv.Itoa(l)
		}
		if e := strings.TrimSpace(sm[3]); e != "" {
			s.attrs[finding.AttrError] = e
		}
	}
	return s, true, nil
}

// sxid turns an SXid line into (part of) an nvswitch-sxid event.
func (d *Detector) sxid(rec kmsg.Record, s sxidLine, closed, cur *[]finding.Finding) {
	key := "sxid|" + s.device + "|" + s.sxid
	g := d.find(kindSXid, key)
	if g != nil && (s.summary || !d.joins(g, rec)) {
		*closed = d.close(g, *closed)
		g = nil
	}
	if g == nil {
		f := finding.Finding{Detector: finding.DetectorNVSwitchSXid, DevicePCI: s.device, Attrs: s.attrs}
		if s.data {
			f.Evidence, f.Seq, f.Time = []string{rec.Raw}, rec.Seq, rec.Time
			*cur = append(*cur, d.finish(f, 1))
			return
		}
		d.openGroup(kindSXid, key, f, rec, d.rules.SXid.Window.Duration)
		return
	}
	d.add(g, rec)
	if s.data {
		*cur = d.close(g, *cur)
	}
}
