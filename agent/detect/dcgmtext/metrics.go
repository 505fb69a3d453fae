package dcgmtext

import (
	"bufio"
	"fmt"
	"io"
	"math"
	"strconv"
	"strings"

	"github.com/fleetrepair/fleetrepair/agent/finding"
)

// Sample is one sample line of the Prometheus text format.
type Sample struct {
	Name   string
	Labels map[string]string
	// Value is the sample value; HasValue is false when the line was
	// published without one (a label set only).
	Value    float64
	HasValue bool
	Line     string
}

// ParseSamples reads the Prometheus text exposition format. Comment lines
// (# HELP, # TYPE) are skipped: dcgm-exporter's HELP/TYPE names do not always
// match the sample names. Lines that are not samples are ignored.
func ParseSamples(r io.Reader) ([]Sample, error) {
	var out []Sample
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64*1024), 1<<20)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || line[0] == '#' {
			continue
		}
		if s, ok := parseSample(line); ok {
			out = append(out, s)
		}
	}
	if err := sc.Err(); err != nil {
		return out, fmt.Errorf("read metrics: %w", err)
	}
	return out, nil
}

func parseSample(line string) (Sample, bool) {
	s := Sample{Labels: map[string]string{}, Line: line}
	i := strings.IndexAny(line, "{ \t")
	if i < 0 {
		return s, false
	}
	s.Name = line[:i]
	if s.Name == "" {
		return s, false
	}
	rest := line[i:]
	if rest[0] == '{' {
		j := 1
		for j < len(rest) {
			for j < len(rest) && (rest[j] == ' ' || rest[j] == ',') {
				j++
			}
			if j < len(rest) && rest[j] == '}' {
				j++
				break
			}
			eq := strings.IndexByte(rest[j:], '=')
			if eq < 0 || j+eq+1 >= len(rest) || rest[j+eq+1] != '"' {
				return s, false
			}
			key := strings.TrimSpace(rest[j : j+eq])
			j += eq + 2
			var v strings.Builder
			for j < len(rest) && rest[j] != '"' {
				if rest[j] == '\\' && j+1 < len(rest) {
					j++
					if rest[j] == 'n' {
						v.WriteByte('\n')
						j++
						continue
					}
				}
				v.WriteByte(rest[j])
				j++
			}
			if j >= len(rest) {
				return s, false
			}
			j++ // closing quote
			s.Labels[key] = v.String()
		}
		rest = rest[j:]
	}
	if f := strings.Fields(rest); len(f) > 0 {
		v, err := strconv.ParseFloat(f[0], 64)
		if err != nil {
			return s, false
		}
		s.Value, s.HasValue = v, true
	}
	return s, true
}

// Xid metrics of dcgm-exporter.
const (
	// MetricXid is DCGM_FI_DEV_XID_ERRORS: the value of the last Xid the GPU
	// raised. It is a sticky last-value gauge: it keeps its value after the
	// GPU recovers, and misses Xids that arrive between scrapes.
	MetricXid = "DCGM_FI_DEV_XID_ERRORS"
	// MetricXidActive is the exporter's windowed count of one Xid (label xid)
	// within window_size_in_ms.
	MetricXidActive = "DCGM_FI_DEV_XID_ERRORS_ACTIVE"
)

// ParseMetrics reads dcgm-exporter samples and returns a dcgm-metric finding
// for every Xid sample that names an Xid: DCGM_FI_DEV_XID_ERRORS with a
// non-zero value (or, published without a value, an err_code label), and
// DCGM_FI_DEV_XID_ERRORS_ACTIVE with a non-zero count. These are hints, not
// health verdicts: the kernel log is the source of Xids. Other metrics are
// ignored. Use a Dedup to report an unchanged gauge once, not per scrape.
func ParseMetrics(r io.Reader) ([]finding.Finding, error) {
	samples, err := ParseSamples(r)
	if err != nil {
		return nil, err
	}
	var out []finding.Finding
	for _, s := range samples {
		if f, ok := MetricFinding(s); ok {
			out = append(out, f)
		}
	}
	return out, nil
}

// MetricFinding maps one sample to a dcgm-metric finding (see ParseMetrics).
func MetricFinding(s Sample) (finding.Finding, bool) {
	f := finding.Finding{Detector: finding.DetectorDCGMMetric, Attrs: map[string]string{finding.AttrMetric: s.Name},
		Evidence: []string{s.Line}}
	switch s.Name {
	case MetricXid:
		switch {
		case s.HasValue && s.Value > 0:
			// A float sample: only a whole number in the Xid range is an
			// Xid (int() of 1e20 would be garbage, never a fact).
			if s.Value != math.Trunc(s.Value) || s.Value > finding.MaxXid {
				return f, false
			}
			f.Xid = int(s.Value)
		case !s.HasValue:
			n, err := finding.ParseNumber("xid", s.Labels["err_code"], 1, finding.MaxXid)
			if err != nil {
				return f, false
			}
			f.Xid = n
		default:
			return f, false
		}
	case MetricXidActive:
		n, err := finding.ParseNumber("xid", s.Labels["xid"], 1, finding.MaxXid)
		if err != nil || (s.HasValue && (s.Value <= 0 || s.Value > finding.MaxCount || s.Value != math.Trunc(s.Value))) {
			return f, false
		}
		f.Xid = n
		if s.HasValue {
			f.Count = int(s.Value)
		}
		if w := s.Labels["window_size_in_ms"]; w != "" {
			f.Attrs[finding.AttrWindowMS] = w
		}
	default:
		return f, false
	}
	if g := s.Labels["gpu"]; g != "" {
		f.Attrs[finding.AttrGPUIndex] = g
	}
	if u := s.Labels["UUID"]; u != "" {
		f.Attrs[finding.AttrGPUUUID] = u
	}
	if m := s.Labels["modelName"]; m != "" {
		f.Attrs[finding.AttrModel] = m
	}
	if p := s.Labels["pci_bus_id"]; p != "" {
		f.GPUPCI, _ = finding.NormalizePCI(p)
	}
	return f, true
}

// Dedup remembers the last value reported per series, so that a sticky
// gauge scraped again and again is reported once, and again only when its
// value changes. The zero value is ready; not safe for concurrent use.
type Dedup struct {
	last map[string]int
}

// Changed reports whether f (from MetricFinding) differs from the last
// finding of the same metric and GPU, and remembers it.
func (d *Dedup) Changed(f finding.Finding) bool {
	if d.last == nil {
		d.last = map[string]int{}
	}
	key := f.Attrs[finding.AttrMetric] + "\x00" + f.Attrs[finding.AttrGPUIndex] + "\x00" + f.Attrs[finding.AttrGPUUUID] + "\x00" + f.GPUPCI
	v := f.Xid
	if f.Attrs[finding.AttrMetric] == MetricXidActive {
		key += "\x00" + strconv.Itoa(f.Xid)
		v = f.Count
	}
	old, seen := d.last[key]
	d.last[key] = v
	return !seen || old != v
}
