package detect

import (
	"slices"
	"strconv"
	"strings"

	"github.com/fleetrepair/fleetrepair/agent/finding"
)

// descriptiveAttrs vary from one occurrence of the same fact to the next
// (which process hit the fault, how many lines it took); Aggregate does not
// tell findings apart by them. Every other attribute is part of the fact
// (Xid 154's recovery action, Xid 45's cause, an AER report's error names).
var descriptiveAttrs = map[string]bool{
	finding.AttrPID:     true,
	finding.AttrProcess: true,
	finding.AttrLines:   true,
}

// inheritedAttrs may be missing from one line of a fact that other lines of
// the same detector, GPU and Xid state: a line cut short before Xid 45's
// "caused by previous Xid N" (c04), the first rm_init_adapter attempt before
// the driver printed its error code (c05).
var inheritedAttrs = []string{finding.AttrCausedBy, finding.AttrErrorCode}

// unionAttrs are list attributes of one detector that Aggregate does not
// tell findings apart by but unions (comma separated, first seen first;
// numbers sorted): the NVLinks an Xid 137 storm names line by line are one
// fact about the GPU (c25), the GIDs NCCL names in its completion errors are
// one fact about the peer path (c29).
var unionAttrs = map[string][]string{
	finding.DetectorXid:          {finding.AttrLinks},
	finding.DetectorNCCLNetError: {finding.AttrLocalGIDs, finding.AttrRemoteGIDs},
}

// Aggregate summarises the findings of one whole input (a file, one boot):
// findings that state the same fact about the same device become one finding
// whose Count is the number of events and whose Evidence holds their lines
// (the first MaxEvidence). It is what the scan command prints and what the case corpus's
// expected counts mean (c04: Xid 45 twice per GPU; c05: four init attempts;
// c09: Xid 154 once per incident). The live agent does not aggregate: it sends
// every event at once and the controller counts.
//
// Before grouping, gaps are filled from the rest of the input:
//   - an attribute in inheritedAttrs that a finding lacks is taken from the
//     findings of the same detector, GPU and Xid when they all agree on it;
//   - an AER finding without a GPU takes the GPU that the other AER findings
//     of the same port name (c01: the correctable error comes 104 s before
//     the fatal report whose broadcast names the GPU).
//
// Findings are the same fact when detector, GPU, device, Xid and every
// attribute except pid, process and lines are equal. The aggregate keeps the
// first finding's order, Seq and ID inputs, the earliest known Time, sums
// Count and lines, and keeps pid/process only when all its findings agree.
// The input slice is not modified.
func Aggregate(fs []finding.Finding) []finding.Finding {
	fs = slices.Clone(fs)
	for i := range fs {
		fs[i].Attrs = cloneAttrs(fs[i].Attrs)
		fs[i].Evidence = slices.Clone(fs[i].Evidence)
	}
	inherit(fs)

	var out []finding.Finding
	index := map[string]int{}
	lines := map[int]int{}
	for _, f := range fs {
		k := aggregateKey(f)
		i, ok := index[k]
		if !ok {
			index[k] = len(out)
			lines[len(out)] = linesOf(f)
			out = append(out, f)
			continue
		}
		a := &out[i]
		a.Count += max(f.Count, 1)
		lines[i] += linesOf(f)
		if room := MaxEvidence - len(a.Evidence); room > 0 {
			a.Evidence = append(a.Evidence, f.Evidence[:min(room, len(f.Evidence))]...)
		}
		if !f.Time.IsZero() && (a.Time.IsZero() || f.Time.Before(a.Time)) {
			a.Time = f.Time
		}
		for k := range descriptiveAttrs {
			if a.Attrs[k] != f.Attrs[k] {
				delete(a.Attrs, k)
			}
		}
		for _, k := range unionAttrs[f.Detector] {
			if v := unionList(a.Attrs[k], f.Attrs[k]); v != "" {
				a.Attrs[k] = v
			}
		}
	}
	for i := range out {
		if out[i].Count < 1 {
			out[i].Count = 1
		}
		if n := lines[i]; n > 1 {
			if out[i].Attrs == nil {
				out[i].Attrs = map[string]string{}
			}
			out[i].Attrs[finding.AttrLines] = strconv.Itoa(n)
		}
		if len(out[i].Attrs) == 0 {
			out[i].Attrs = nil
		}
		out[i].ID = finding.NewID(out[i])
	}
	return out
}

// inherit fills attributes and AER GPUs that some findings lack from the
// others (see Aggregate).
func inherit(fs []finding.Finding) {
	for _, attr := range inheritedAttrs {
		values := map[string]map[string]bool{} // detector|gpu|xid -> values seen
		key := func(f finding.Finding) string {
			return f.Detector + "|" + f.GPUPCI + "|" + strconv.Itoa(f.Xid)
		}
		for _, f := range fs {
			if v := f.Attrs[attr]; v != "" {
				if values[key(f)] == nil {
					values[key(f)] = map[string]bool{}
				}
				values[key(f)][v] = true
			}
		}
		for i := range fs {
			if fs[i].Attrs[attr] != "" {
				continue
			}
			if vs := values[key(fs[i])]; len(vs) == 1 {
				for v := range vs {
					if fs[i].Attrs == nil {
						fs[i].Attrs = map[string]string{}
					}
					fs[i].Attrs[attr] = v
				}
			}
		}
	}
	gpus := map[string]map[string]bool{} // port -> GPUs named
	for _, f := range fs {
		if isAER(f.Detector) && f.DevicePCI != "" && f.GPUPCI != "" {
			if gpus[f.DevicePCI] == nil {
				gpus[f.DevicePCI] = map[string]bool{}
			}
			gpus[f.DevicePCI][f.GPUPCI] = true
		}
	}
	for i := range fs {
		if f := fs[i]; isAER(f.Detector) && f.DevicePCI != "" && f.GPUPCI == "" {
			if gs := gpus[f.DevicePCI]; len(gs) == 1 {
				for g := range gs {
					fs[i].GPUPCI = g
				}
			}
		}
	}
}

func isAER(detector string) bool {
	return detector == finding.DetectorAERFatal || detector == finding.DetectorAERNonFatal ||
		detector == finding.DetectorAERCorrectable
}

// aggregateKey identifies a fact: everything but the descriptive attributes.
func aggregateKey(f finding.Finding) string {
	var b strings.Builder
	b.WriteString(f.Detector)
	b.WriteByte(0)
	b.WriteString(f.GPUPCI)
	b.WriteByte(0)
	b.WriteString(f.DevicePCI)
	b.WriteByte(0)
	b.WriteString(strconv.Itoa(f.Xid))
	keys := make([]string, 0, len(f.Attrs))
	for k := range f.Attrs {
		if !descriptiveAttrs[k] && !slices.Contains(unionAttrs[f.Detector], k) {
			keys = append(keys, k)
		}
	}
	slices.Sort(keys)
	for _, k := range keys {
		b.WriteByte(0)
		b.WriteString(k)
		b.WriteByte('=')
		b.WriteString(f.Attrs[k])
	}
	return b.String()
}

// linesOf is the number of records a finding was read from.
func linesOf(f finding.Finding) int {
	if n, err := strconv.Atoi(f.Attrs[finding.AttrLines]); err == nil && n > 0 {
		return n
	}
	return 1
}

func cloneAttrs(m map[string]string) map[string]string {
	if m == nil {
		return nil
	}
	out := make(map[string]string, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}

// unionList merges two comma-separated lists, keeping the first occurrence
// of each item; when every item is a number the result is sorted
// numerically.
func unionList(a, b string) string {
	var items []string
	for _, s := range []string{a, b} {
		for _, it := range strings.Split(s, ",") {
			if it = strings.TrimSpace(it); it != "" && !slices.Contains(items, it) {
				items = append(items, it)
			}
		}
	}
	numeric := true
	for _, it := range items {
		if _, err := strconv.Atoi(it); err != nil {
			numeric = false
			break
		}
	}
	if numeric {
		slices.SortFunc(items, func(x, y string) int {
			nx, _ := strconv.Atoi(x)
			ny, _ := strconv.Atoi(y)
			return nx - ny
		})
	}
	return strings.Join(items, ",")
}
