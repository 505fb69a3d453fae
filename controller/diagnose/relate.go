package diagnose

import (
	"strconv"
	"time"

	"github.com/fleetrepair/fleetrepair/agent/finding"
	"github.com/fleetrepair/fleetrepair/controller/catalog"
)

// AppHangWindow is how soon after an application-class Xid on the same GPU
// a hang Xid counts as caused by it: the driver reports the context-switch
// timeout (Xid 109) of a context that faulted seconds before (c03: 5 s).
const AppHangWindow = time.Minute

// secondaryXid reports whether a finding is an Xid that is a consequence of
// another error, never evidence of its own: Xid 45 (the driver closing a
// process's channels after another error or a kill), Xid 43 (a channel
// halted at software's request, after an application's Xid 13 or 31), or
// one the agent marked secondary.
func secondaryXid(f *finding.Finding) bool {
	if f.Detector != finding.DetectorXid && f.Detector != finding.DetectorDCGMPolicy {
		return false
	}
	return f.Xid == 45 || f.Xid == 43 || f.Attr(finding.AttrSecondary) == "true"
}

// hangXid reports whether an Xid is one a wedged context can cause: the
// context-switch timeout (109) and the GPU stopping work on its queue (46).
func hangXid(xid int) bool { return xid == 109 || xid == 46 }

// relate applies the rules that look at a signal's neighbours on the same
// GPU (sigs are in time order):
//
//   - An Xid 45 that names its cause ("caused by previous Xid N") takes the
//     verdict of that Xid when the Xid itself is on record: a 45 after a
//     non-fatal NVLink5 Xid is not an NVLink failure. Without the primary
//     on record (a cut log, c04) the number it names decides (classify).
//   - A hang Xid (109, 46) within AppHangWindow after an application-class
//     Xid on the same GPU is GPUHangAfterApplicationError: a reset is
//     still needed, but it is not hardware evidence.
func (e *Engine) relate(sigs []signal) []signal {
	type key struct {
		gpu string
		xid int
	}
	primary := map[key]signal{}
	lastApp := map[string]time.Time{}
	appSeen := map[string]bool{}
	for i := range sigs {
		s := &sigs[i]
		f := s.f
		if f.Detector != finding.DetectorXid {
			continue
		}
		if f.Xid == 45 {
			if c, err := strconv.Atoi(f.Attr(finding.AttrCausedBy)); err == nil {
				if p, ok := primary[key{s.gpu, c}]; ok {
					s.reason, s.nodeLevel, s.attachable = p.reason, p.nodeLevel, true
					if e.severity(p.reason) != catalog.SeverityCondition {
						s.reason = catalog.ReasonXidApplicationError
					}
				}
			}
			continue
		}
		primary[key{s.gpu, f.Xid}] = *s
		if s.reason == catalog.ReasonXidApplicationError && !secondaryXid(f) && s.gpu != "" {
			lastApp[s.gpu], appSeen[s.gpu] = f.Time, true
			continue
		}
		if s.reason == catalog.ReasonGPUHang && hangXid(f.Xid) && appSeen[s.gpu] {
			t := lastApp[s.gpu]
			if t.IsZero() || f.Time.IsZero() || f.Time.Sub(t) <= AppHangWindow {
				s.reason = catalog.ReasonGPUHangAfterApplicationError
			}
		}
	}
	return sigs
}

// attrTime parses an RFC 3339 attribute; zero when absent or malformed.
func attrTime(f *finding.Finding, key string) time.Time {
	t, err := time.Parse(time.RFC3339, f.Attr(key))
	if err != nil {
		return time.Time{}
	}
	return t
}
