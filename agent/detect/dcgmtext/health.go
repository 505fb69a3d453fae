package dcgmtext

import (
	"io"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/fleetrepair/fleetrepair/agent/detect/jsonlog"
	"github.com/fleetrepair/fleetrepair/agent/finding"
)

var xidInMessage = regexp.MustCompile(`(?i)\bXID[ :]+(\d+)\b`)

// ParseHealthEvents reads a JSON log and returns a dcgm-health finding for
// every GPU health event in it: an object with an errorCode list and
// entitiesImpacted (the health-event shape of GPU health monitors built on
// DCGM, e.g. NVSentinel's gpu-health-monitor), found at any depth, including
// events serialised into string values such as node annotations. Lines cut
// off after the event's entities still yield the event (jsonlog.Parse).
//
// Attributes: error_code (the first DCGM_FR_* code), fatal, message,
// gpu_index, gpu_uuid; GPUPCI from the PCI entity; Xid from the message
// ("XID 95"). Time is the log line's "time" or "ts" (RFC 3339) when present.
func ParseHealthEvents(r io.Reader) ([]finding.Finding, error) {
	recs, err := jsonlog.Records(r)
	if err != nil {
		return nil, err
	}
	var out []finding.Finding
	for _, rec := range recs {
		v, _ := jsonlog.Parse(rec)
		top, _ := v.(map[string]any)
		at := lineTime(top)
		jsonlog.Walk(v, func(m map[string]any) {
			if f, ok := healthEvent(m); ok {
				f.Time = at
				f.Evidence = []string{rec}
				out = append(out, f)
			}
		})
	}
	return out, nil
}

func lineTime(m map[string]any) time.Time {
	for _, k := range []string{"time", "ts", "timestamp"} {
		if s, ok := jsonlog.String(m, k); ok {
			if t, err := time.Parse(time.RFC3339Nano, s); err == nil {
				return t.UTC()
			}
		}
	}
	return time.Time{}
}

// healthEvent maps one health-event object.
func healthEvent(m map[string]any) (finding.Finding, bool) {
	codes, ok := m["errorCode"].([]any)
	if !ok {
		return finding.Finding{}, false
	}
	ents, _ := m["entitiesImpacted"].([]any)
	f := finding.Finding{Detector: finding.DetectorDCGMHealth, Attrs: map[string]string{}}
	for _, c := range codes {
		if s, ok := c.(string); ok && s != "" {
			f.Attrs[finding.AttrErrorCode] = s
			break
		}
	}
	if b, ok := m["isFatal"].(bool); ok {
		f.Attrs[finding.AttrFatal] = strconv.FormatBool(b)
	}
	if s, ok := jsonlog.String(m, "checkName"); ok {
		f.Attrs[finding.AttrSystem] = s
	}
	if msg, ok := jsonlog.String(m, "message"); ok {
		f.Attrs[finding.AttrMessage] = msg
		if x := xidInMessage.FindStringSubmatch(msg); x != nil {
			if n, err := finding.ParseNumber("xid", x[1], 1, finding.MaxXid); err == nil {
				f.Xid = n // an out-of-range number stays in attr message only
			}
		}
	}
	for _, e := range ents {
		em, _ := e.(map[string]any)
		typ, _ := jsonlog.String(em, "entityType")
		val, _ := jsonlog.String(em, "entityValue")
		switch strings.ToUpper(typ) {
		case "GPU":
			f.Attrs[finding.AttrGPUIndex] = val
		case "PCI":
			f.GPUPCI, _ = finding.NormalizePCI(val)
		case "GPU_UUID":
			f.Attrs[finding.AttrGPUUUID] = val
		}
	}
	return f, f.Attrs[finding.AttrErrorCode] != "" || f.Xid != 0
}
