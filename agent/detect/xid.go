package detect

import (
	"regexp"
	"strconv"
	"strings"

	"github.com/fleetrepair/fleetrepair/agent/finding"
	"github.com/fleetrepair/fleetrepair/agent/kmsg"
)

// xidLine is what one "NVRM: Xid" line says.
type xidLine struct {
	pci     string // normalised GPU address, "" when the line's address is unreadable
	xid     int
	pid     string // "" when absent or '<unknown>'
	process string // "" when absent or <unknown>
	text    string // the driver's description after the pid/name fields
}

// xidRE matches the Xid line of every driver generation:
//
//	NVRM: Xid (0000:01:00): 79, GPU has fallen off the bus.              (old, no "PCI:")
//	NVRM: Xid (PCI:0000:02:00): 79, GPU has fallen off the bus.          (no pid/name)
//	NVRM: Xid (PCI:0000:cb:00): 13, pid='<unknown>', name=<unknown>, ... (quoted and bare unknowns)
//	NVRM: Xid (PCI:0000:cb:00): 109, pid=1797828, name=pt_main_thread, ...
//
// The Xid catalog (https://docs.nvidia.com/deploy/xid-errors/) documents the
// numbers; the driver formats come from the case corpus.
var xidRE = regexp.MustCompile(`NVRM: Xid \((?:PCI:)?([0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}(?:\.[0-7])?)\): (\d+)(?:,\s*([^\n]*))?`)

var (
	// causedByRE: newer drivers name the error an Xid 45 teardown follows (c04).
	causedByRE = regexp.MustCompile(`caused by previous Xid (\d+)`)
	// recoveryRE: Xid 154 "GPU recovery action changed from 0x0 (None) to 0x1 (GPU Reset Required)" (c09).
	recoveryRE = regexp.MustCompile(`recovery action changed from \S+ \([^)]*\) to \S+ \(([^)]*)\)`)
	// mmuFaultRE: Xid 31 "MMU Fault: ENGINE GRAPHICS GPC2 ... Fault is of type FAULT_PDE ACCESS_TYPE_VIRT_READ" (c10).
	mmuEngineRE = regexp.MustCompile(`MMU Fault: ENGINE (\S+)`)
	mmuTypeRE   = regexp.MustCompile(`Fault is of type (\S+(?: \S+)?)`)
	// containedRE, resetRE: the newer Xid 94/95 form
	// "94, Contained: SM (0x1). RST: No, D-RST: No" (c25). RST says whether
	// the driver requires a GPU reset; "No" is not a reset request.
	containedRE = regexp.MustCompile(`\b(Contained|Uncontained): (\w+)`)
	resetRE     = regexp.MustCompile(`(?:^|[^-\w])RST: (Yes|No)\b`)
	// linkRE: the NVLink a link-level Xid names ("TLC RX interrupt hit on
	// link 4", "NVLink: fatal error detected on link 14").
	linkRE = regexp.MustCompile(`(?i)\blink (\d+)\b`)
	// nvlinkSevRE reads the severity an NVLink5 Xid (144-150) prints after
	// its unit: "145, RLW_RXPIPE Nonfatal XC0 i0 Link 13 (...)".
	nvlinkSevRE = regexp.MustCompile(`(?i)\b(non-?fatal|fatal)\b`)
)

// linkXid reports whether an Xid is about one NVLink (74 NVLink error, 137
// NVLink TLC/PRIV error, 144-150 NVLink5 unit errors), so that its line's
// link number is a fact (attr links, unioned by Aggregate).
func linkXid(xid int) bool { return xid == 74 || xid == 137 || xid >= 144 && xid <= 150 }

// parseXid reads an Xid line; ok is false when msg holds none. err is set
// (and ok false) for an Xid line whose numbers are out of range (the Xid,
// the Xid 45 cause, an NVLink number): such a line is rejected whole, never
// read with its number cut to the digits that fit.
func parseXid(msg string) (x xidLine, ok bool, err error) {
	m := xidRE.FindStringSubmatch(msg)
	if m == nil {
		return xidLine{}, false, nil
	}
	n, err := finding.ParseNumber("xid", m[2], 1, finding.MaxXid) // the wire contract's range
	if err != nil {
		return xidLine{}, false, err
	}
	if c := causedByRE.FindStringSubmatch(m[3]); c != nil {
		if _, err := finding.ParseNumber("caused-by xid", c[1], 1, finding.MaxXid); err != nil {
			return xidLine{}, false, err
		}
	}
	if l := linkRE.FindStringSubmatch(m[3]); l != nil && linkXid(n) {
		if _, err := finding.ParseNumber("link", l[1], 0, finding.MaxLink); err != nil {
			return xidLine{}, false, err
		}
	}
	x = xidLine{xid: n}
	if pci, err := finding.NormalizePCI(m[1]); err == nil {
		x.pci = pci
	}
	rest := m[3]
	if v, ok := strings.CutPrefix(rest, "pid="); ok {
		v, rest, _ = strings.Cut(v, ",")
		rest = strings.TrimLeft(rest, " ")
		if v = strings.Trim(v, "' "); v != "<unknown>" && v != "" {
			x.pid = v
		}
	}
	if v, ok := strings.CutPrefix(rest, "name="); ok {
		v, rest, _ = strings.Cut(v, ", ")
		if v = strings.TrimSpace(v); v != "<unknown>" && v != "'<unknown>'" && v != "" {
			x.process = v
		}
	}
	x.text = rest
	return x, true, nil
}

// xidAttrs returns the facts of an Xid line beyond GPU and number.
func (d *Detector) xidAttrs(x xidLine) map[string]string {
	a := map[string]string{}
	if x.pid != "" {
		a[finding.AttrPID] = x.pid
	}
	if x.process != "" {
		a[finding.AttrProcess] = x.process
	}
	if m := causedByRE.FindStringSubmatch(x.text); m != nil {
		if n, err := strconv.Atoi(m[1]); err == nil {
			a[finding.AttrCausedBy] = strconv.Itoa(n)
		}
	}
	if d.rules.secondary[x.xid] {
		a[finding.AttrSecondary] = "true"
	}
	if m := recoveryRE.FindStringSubmatch(x.text); m != nil {
		a[finding.AttrRecoveryAction] = slug(m[1])
	}
	if m := mmuEngineRE.FindStringSubmatch(x.text); m != nil {
		a[finding.AttrEngine] = m[1]
	}
	if m := mmuTypeRE.FindStringSubmatch(x.text); m != nil {
		a[finding.AttrFault] = strings.TrimRight(m[1], ".")
	}
	if m := containedRE.FindStringSubmatch(x.text); m != nil {
		a[finding.AttrContained] = m[2]
		if m[1] == "Uncontained" {
			a[finding.AttrContained] = "false"
		}
	}
	if m := resetRE.FindStringSubmatch(x.text); m != nil {
		a[finding.AttrResetRequired] = strconv.FormatBool(m[1] == "Yes")
	}
	if x.xid >= 144 && x.xid <= 150 {
		if m := nvlinkSevRE.FindStringSubmatch(x.text); m != nil {
			a[finding.AttrFatal] = strconv.FormatBool(strings.EqualFold(m[1], "fatal"))
		}
	}
	if linkXid(x.xid) {
		if m := linkRE.FindStringSubmatch(x.text); m != nil {
			if n, err := strconv.Atoi(m[1]); err == nil {
				a[finding.AttrLinks] = strconv.Itoa(n)
			}
		}
	}
	return a
}

// slug turns the driver's recovery action text into the attribute value:
// "GPU Reset Required" -> "gpu-reset-required", "Drain P2P" -> "drain-p2p".
func slug(s string) string {
	var b strings.Builder
	dash := false
	for _, c := range strings.ToLower(strings.TrimSpace(s)) {
		if c >= 'a' && c <= 'z' || c >= '0' && c <= '9' {
			if dash && b.Len() > 0 {
				b.WriteByte('-')
			}
			b.WriteRune(c)
			dash = false
		} else {
			dash = true
		}
	}
	return b.String()
}

// xid turns an Xid line into a finding: at once, or, for the Xids the driver
// prints as several lines per event (rules xid.group), by holding it until
// the event's lines are all in.
func (d *Detector) xid(rec kmsg.Record, x xidLine, closed, cur *[]finding.Finding) {
	f := finding.Finding{Detector: finding.DetectorXid, GPUPCI: x.pci, Xid: x.xid, Attrs: d.xidAttrs(x)}
	if !d.rules.group[x.xid] {
		f.Evidence, f.Seq, f.Time = []string{rec.Raw}, rec.Seq, rec.Time
		*cur = append(*cur, d.finish(f, 1))
		return
	}
	key := x.pci + "|" + strconv.Itoa(x.xid)
	if g := d.findXid(key, x.pid); g != nil {
		if d.joins(g, rec) {
			d.add(g, rec)
			// A line may add facts the first one lacked: Xid 94's
			// "Contained: SM" line and its "pid=..., name=..." line are
			// one event (c25).
			for k, v := range f.Attrs {
				if _, ok := g.f.Attrs[k]; !ok {
					if g.f.Attrs == nil {
						g.f.Attrs = map[string]string{}
					}
					g.f.Attrs[k] = v
				}
			}
			return
		}
		*closed = d.close(g, *closed)
	}
	d.openGroup(kindXid, key, f, rec, d.rules.Xid.GroupWindow.Duration)
}

// findXid returns the held multi-line Xid event of a GPU and Xid (key) that
// a line of process pid may continue: one of the same pid, or one where
// either side names no process (the driver prints the pid on one line of
// the event only). Nil when none.
func (d *Detector) findXid(key, pid string) *group {
	for i := len(d.open) - 1; i >= 0; i-- {
		g := d.open[i]
		if g.done || g.kind != kindXid || g.key != key {
			continue
		}
		if gp := g.f.Attrs[finding.AttrPID]; gp == "" || pid == "" || gp == pid {
			return g
		}
	}
	return nil
}
