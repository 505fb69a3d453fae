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
var xidRE = regexp.MustCompile(`NVRM: Xid \((?:PCI:)?([0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}(?:\.[0-7])?)\): (\d{1,5})(?:,\s*([^\n]*))?`)

var (
	// causedByRE: newer drivers name the error an Xid 45 teardown follows (c04).
	causedByRE = regexp.MustCompile(`caused by previous Xid (\d{1,5})`)
	// recoveryRE: Xid 154 "GPU recovery action changed from 0x0 (None) to 0x1 (GPU Reset Required)" (c09).
	recoveryRE = regexp.MustCompile(`recovery action changed from \S+ \([^)]*\) to \S+ \(([^)]*)\)`)
	// mmuFaultRE: Xid 31 "MMU Fault: ENGINE GRAPHICS GPC2 ... Fault is of type FAULT_PDE ACCESS_TYPE_VIRT_READ" (c10).
	mmuEngineRE = regexp.MustCompile(`MMU Fault: ENGINE (\S+)`)
	mmuTypeRE   = regexp.MustCompile(`Fault is of type (\S+(?: \S+)?)`)
)

// parseXid reads an Xid line; ok is false when msg holds none.
func parseXid(msg string) (xidLine, bool) {
	m := xidRE.FindStringSubmatch(msg)
	if m == nil {
		return xidLine{}, false
	}
	n, err := strconv.Atoi(m[2])
	if err != nil || n <= 0 || n > finding.MaxXid { // the wire contract's range

		return xidLine{}, false
	}
	x := xidLine{xid: n}
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
	return x, true
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
	key := x.pci + "|" + strconv.Itoa(x.xid) + "|" + x.pid
	if g := d.find(kindXid, key); g != nil {
		if d.joins(g, rec) {
			d.add(g, rec)
			return
		}
		*closed = d.close(g, *closed)
	}
	d.openGroup(kindXid, key, f, rec, d.rules.Xid.GroupWindow.Duration)
}
