// Package detect turns kernel log records (agent/kmsg) into findings
// (agent/finding): facts such as "Xid 79 on 0000:3b:00.0", never actions.
//
// These detectors run on every record:
//
//   - the Xid parser (code, xid.go) for "NVRM: Xid (PCI:0000:3b:00): 79, ..."
//     lines in every driver format, with the Xid 45 cause, the Xid 154
//     recovery action, Xid 94/95 containment, NVLink link numbers and the
//     multi-line events of Xid 13, 94 and 95;
//   - the NVSwitch SXid assembler (code, sxid.go): summary, engine and Data
//     lines of one SXid event, per switch;
//   - the stack-report assembler (code, stack.go): hung tasks, soft and hard
//     lockups and RCU stalls with the kernel modules on their stack;
//   - the PCIe AER assembler (code, aer.go), which builds one finding from
//     the many lines of one AER report and links the reporting port to the
//     GPU behind it;
//   - pattern rules (data, rules.yaml, embedded and replaceable) for the
//     simple detectors: fallen-off-bus, gpu-count, driver-version,
//     rminit-failed, gsp-error, driver-version-mismatch,
//     gsp-firmware-missing, filesystem-error, oom-kill, nic-firmware and
//     nic-link.
//
// A Detector is streaming: Feed returns the findings a record completes.
// Lines that are one event (three Xid 13 lines, an AER report) are held until
// the event is complete: until a later record shows it is over, at most
// Options.Hold in live mode (Expire), or the end of input (Flush). Single-line
// critical facts (Xid 79, fallen off the bus) are returned by the Feed call of
// their own record. The live agent sends every finding as it comes; counting
// over a whole file (the same Xid on the same GPU twice) is Aggregate's job,
// used by the scan command and the case tests.
package detect

import (
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fleetrepair/fleetrepair/agent/finding"
	"github.com/fleetrepair/fleetrepair/agent/kmsg"
)

// DefaultHold is the default Options.Hold.
const DefaultHold = 2 * time.Second

// MaxEvidence bounds Finding.Evidence (raw lines) of one finding, so that a
// storm of lines cannot make one finding unbounded; Count and attr lines
// still count everything.
const MaxEvidence = 64

// maxGroupRecords bounds one held event: a storm of Xid 13 lines closer than
// the group window becomes a series of events of this many lines each.
const maxGroupRecords = MaxEvidence

// Options configure a Detector. The zero value uses the embedded rules.
type Options struct {
	// Node and BootID are copied into every Finding.
	Node   string
	BootID string
	// Rules replaces the embedded rules (DefaultRules) when set.
	Rules *Rules
	// Hold is the longest time (wall clock, Now) a held event waits for more
	// lines before Expire returns it. Default DefaultHold.
	Hold time.Duration
	// Now is the clock Hold is measured with; default time.Now.
	Now func() time.Time
	// GPUBehindPort, when set, names the GPU below a PCIe port (for example
	// from sysfs), for AER reports that do not name it themselves. It returns
	// "" when it does not know. Ports learned from earlier AER reports are
	// used first.
	GPUBehindPort func(port string) string
}

// Stats are a Detector's counters.
type Stats struct {
	Records  uint64            // records fed
	Unparsed uint64            // records fed with kmsg.Record.Unparsed set (still examined)
	Findings map[string]uint64 // findings returned, by detector
	Held     int               // events held open right now
	// Rejected counts the records that had the form of a driver line (an
	// Xid, an SXid) but a number out of its range (finding.ParseNumber):
	// they give no finding and no rule sees them. LastRejected is the
	// reason for the latest, with its line ("" when none).
	Rejected     uint64
	LastRejected string
}

// Detector turns records into findings. Feed, Expire and Flush must be
// called from one goroutine; Stats may be called from any.
type Detector struct {
	opts  Options
	rules *Rules
	now   func() time.Time
	hold  time.Duration

	n       uint64   // index of the current record (1-based)
	gateHit []int8   // per Rules.gates, for the current record: 0 not searched, 1 found, -1 absent
	open    []*group // held events, oldest first
	portGPU map[string]string

	records, unparsed, rejected atomic.Uint64
	held                        atomic.Int64
	mu                          sync.Mutex
	found                       map[string]uint64
	lastRejected                string
}

// New returns a Detector.
func New(opts Options) *Detector {
	d := &Detector{
		opts:    opts,
		rules:   opts.Rules,
		now:     opts.Now,
		hold:    opts.Hold,
		portGPU: map[string]string{},
		found:   map[string]uint64{},
	}
	if d.rules == nil {
		d.rules = DefaultRules()
	}
	d.gateHit = make([]int8, len(d.rules.gates))
	if d.now == nil {
		d.now = time.Now
	}
	if d.hold <= 0 {
		d.hold = DefaultHold
	}
	return d
}

// Stats returns the counters so far.
func (d *Detector) Stats() Stats {
	d.mu.Lock()
	found := make(map[string]uint64, len(d.found))
	for k, v := range d.found {
		found[k] = v
	}
	last := d.lastRejected
	d.mu.Unlock()
	return Stats{Records: d.records.Load(), Unparsed: d.unparsed.Load(), Findings: found, Held: int(d.held.Load()),
		Rejected: d.rejected.Load(), LastRejected: last}
}

// reject counts a record rejected for err (an out-of-range number).
func (d *Detector) reject(rec kmsg.Record, err error) {
	line := rec.Raw
	if len(line) > 200 {
		line = line[:200] + "..."
	}
	d.rejected.Add(1)
	d.mu.Lock()
	d.lastRejected = fmt.Sprintf("%v, in line %q", err, line)
	d.mu.Unlock()
}

type groupKind uint8

const (
	kindXid    groupKind = iota // lines of one multi-line Xid event
	kindAER                     // lines of one PCIe AER report
	kindAttach                  // details waiting for the event line of an attach rule
	kindSXid                    // lines of one NVSwitch SXid event
	kindStack                   // lines of one kernel report with a stack (hung task, soft lockup, RCU stall)
)

// group is an event being assembled from several records.
type group struct {
	kind    groupKind
	key     string
	f       finding.Finding // first record's facts; Evidence grows
	window  time.Duration   // largest kernel-time gap between two records
	opened  time.Time       // wall clock (Options.Now) when it opened
	last    uint64          // index of its last record
	lastUs  int64           // kernel time of its last record, -1 unknown
	lastT   time.Time       // wall time of its last record, zero unknown
	records int
	aer     *aerReport
	stack   *stackReport
	done    bool
}

// Feed examines one record and returns the findings that are complete now:
// events this record shows to be over, then the record's own.
func (d *Detector) Feed(rec kmsg.Record) []finding.Finding {
	d.n++
	d.records.Add(1)
	if rec.Unparsed {
		d.unparsed.Add(1)
	}
	var closed, cur []finding.Finding
	d.examine(rec, &closed, &cur)
	for _, g := range d.open {
		if !g.done && g.last != d.n && d.over(g, rec) {
			closed = d.close(g, closed)
		}
	}
	d.compact()
	return append(closed, cur...)
}

// Expire returns the held events that opened Hold or longer before now. The
// live agent calls it periodically (e.g. every Hold/2) so that a held event
// never waits for a next record that may not come.
func (d *Detector) Expire(now time.Time) []finding.Finding {
	var out []finding.Finding
	for _, g := range d.open {
		if !g.done && now.Sub(g.opened) >= d.hold {
			out = d.close(g, out)
		}
	}
	d.compact()
	return out
}

// Flush returns every held event: the input has ended.
func (d *Detector) Flush() []finding.Finding {
	var out []finding.Finding
	for _, g := range d.open {
		if !g.done {
			out = d.close(g, out)
		}
	}
	d.compact()
	return out
}

// ScanRecords feeds all records and flushes: the findings of a whole input,
// one per event (see Aggregate for counts over the input).
func (d *Detector) ScanRecords(recs []kmsg.Record) []finding.Finding {
	var out []finding.Finding
	for _, r := range recs {
		out = append(out, d.Feed(r)...)
	}
	return append(out, d.Flush()...)
}

// examine runs the detectors on one record. Findings of events closed on the
// way go to closed, findings complete with this record to cur.
func (d *Detector) examine(rec kmsg.Record, closed, cur *[]finding.Finding) {
	msg := rec.Message
	if strings.Contains(msg, "NVRM: Xid (") {
		x, ok, err := parseXid(msg)
		if err != nil {
			d.reject(rec, err)
			return
		}
		if ok {
			d.xid(rec, x, closed, cur)
			return // an Xid line is an Xid finding and nothing else
		}
	}
	if strings.Contains(msg, "SXid (") {
		s, ok, err := parseSXid(msg)
		if err != nil {
			d.reject(rec, err)
			return
		}
		if ok {
			d.sxid(rec, s, closed, cur)
			return
		}
	}
	if d.stackLine(rec, closed, cur) {
		return
	}
	if d.held.Load() > 0 || strings.Contains(msg, "AER") || strings.Contains(msg, "PCIe Bus Error") {
		d.aerLine(rec, closed, cur)
	}
	clear(d.gateHit)
	for _, rule := range d.rules.Rules {
		if rule.gate >= 0 {
			hit := &d.gateHit[rule.gate]
			if *hit == 0 {
				*hit = -1
				if strings.Contains(msg, d.rules.gates[rule.gate]) {
					*hit = 1
				}
			}
			if *hit < 0 {
				continue
			}
		}
		if m, ok := rule.match(msg); ok {
			d.ruleMatched(rule, m, rec, closed, cur)
		}
	}
}

// ruleMatched handles a pattern rule's match: an attach rule holds its facts
// for the event line that follows; any other rule is an event at once.
func (d *Detector) ruleMatched(rule *Rule, m ruleMatch, rec kmsg.Record, closed, cur *[]finding.Finding) {
	f := finding.Finding{Detector: rule.Detector, GPUPCI: m.gpu, DevicePCI: m.device, Attrs: m.attrs}
	key := rule.Detector + "|" + m.gpu + "|" + m.device
	pending := d.find(kindAttach, key)
	if rule.Attach {
		if pending != nil {
			*closed = d.close(pending, *closed)
		}
		d.openGroup(kindAttach, key, f, rec, rule.Window.Duration)
		return
	}
	if pending != nil && d.joins(pending, rec) {
		pending.done = true
		d.held.Add(-1)
		for k, v := range pending.f.Attrs {
			if _, ok := f.Attrs[k]; !ok {
				f.Attrs[k] = v
			}
		}
		f.Evidence = append(pending.f.Evidence, rec.Raw)
		f.Seq, f.Time = pending.f.Seq, pending.f.Time
		*cur = append(*cur, d.finish(f, pending.records+1))
		return
	}
	f.Evidence, f.Seq, f.Time = []string{rec.Raw}, rec.Seq, rec.Time
	*cur = append(*cur, d.finish(f, 1))
}

// openGroup starts holding an event whose first record is rec.
func (d *Detector) openGroup(kind groupKind, key string, f finding.Finding, rec kmsg.Record, window time.Duration) *group {
	f.Evidence, f.Seq, f.Time = []string{rec.Raw}, rec.Seq, rec.Time
	g := &group{kind: kind, key: key, f: f, window: window, opened: d.now(), records: 1,
		last: d.n, lastUs: rec.Usec, lastT: rec.Time}
	d.open = append(d.open, g)
	d.held.Add(1)
	return g
}

// add appends rec to a held event.
func (d *Detector) add(g *group, rec kmsg.Record) {
	if g.last == d.n {
		return // already took this record
	}
	if len(g.f.Evidence) < MaxEvidence {
		g.f.Evidence = append(g.f.Evidence, rec.Raw)
	}
	g.records++
	g.last, g.lastUs, g.lastT = d.n, rec.Usec, rec.Time
}

// find returns the held event of a kind and key, or nil.
func (d *Detector) find(kind groupKind, key string) *group {
	for i := len(d.open) - 1; i >= 0; i-- {
		if g := d.open[i]; !g.done && g.kind == kind && g.key == key {
			return g
		}
	}
	return nil
}

// joins reports whether rec may continue g: within g.window of its last
// record in kernel time, or, when the two have no comparable time, directly
// after it.
func (d *Detector) joins(g *group, rec kmsg.Record) bool {
	if g.records >= maxGroupRecords && g.kind == kindXid {
		return false
	}
	if gap, ok := timeGap(g, rec); ok {
		return gap <= g.window
	}
	return g.last == d.n-1
}

// over reports whether rec, which g did not take, shows g to be complete:
// more than g.window later in kernel time, or, without comparable times, any
// record that is not part of it.
func (d *Detector) over(g *group, rec kmsg.Record) bool {
	if gap, ok := timeGap(g, rec); ok {
		return gap > g.window
	}
	return true
}

// timeGap is the absolute kernel-time distance between g's last record and
// rec: monotonic microseconds when both have them, else wall time.
func timeGap(g *group, rec kmsg.Record) (time.Duration, bool) {
	switch {
	case g.lastUs >= 0 && rec.Usec >= 0:
		us := rec.Usec - g.lastUs
		if us < 0 {
			us = -us
		}
		return time.Duration(us) * time.Microsecond, true
	case !g.lastT.IsZero() && !rec.Time.IsZero():
		gap := rec.Time.Sub(g.lastT)
		if gap < 0 {
			gap = -gap
		}
		return gap, true
	}
	return 0, false
}

// close ends a held event and appends its finding, if it makes one.
func (d *Detector) close(g *group, out []finding.Finding) []finding.Finding {
	if g.done {
		return out
	}
	g.done = true
	d.held.Add(-1)
	switch g.kind {
	case kindAER:
		if f, ok := d.aerFinding(g); ok {
			out = append(out, d.finish(f, g.records))
		}
	case kindStack:
		out = append(out, d.finish(d.stackFinding(g), g.records))
	default:
		out = append(out, d.finish(g.f, g.records))
	}
	return out
}

// compact drops closed events from the held list.
func (d *Detector) compact() {
	j := 0
	for _, g := range d.open {
		if !g.done {
			d.open[j] = g
			j++
		}
	}
	clear(d.open[j:])
	d.open = d.open[:j]
}

// finish completes a finding: node, boot ID, count, lines and ID.
func (d *Detector) finish(f finding.Finding, records int) finding.Finding {
	f.Node, f.BootID = d.opts.Node, d.opts.BootID
	if f.Count < 1 {
		f.Count = 1
	}
	if records > 1 {
		if f.Attrs == nil {
			f.Attrs = map[string]string{}
		}
		f.Attrs[finding.AttrLines] = strconv.Itoa(records)
	}
	if len(f.Attrs) == 0 {
		f.Attrs = nil
	}
	f.ID = finding.NewID(f)
	d.mu.Lock()
	d.found[f.Detector]++
	d.mu.Unlock()
	return f
}
