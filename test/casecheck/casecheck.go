// Package casecheck compares a detector's findings with the expected
// findings of a case of the corpus, by the corpus rules (cases/README.md):
// detector, gpu_pci, xid and count always, plus every other key the
// expected finding gives; extra findings are failures.
package casecheck

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/fleetrepair/fleetrepair/agent/finding"
)

// CompareFindings reports through t every expected finding (an
// expected.yaml item) without a match in got, one to one, and every finding
// of got that matches none.
func CompareFindings(t testing.TB, want []map[string]any, got []finding.Finding) {
	t.Helper()
	used := make([]bool, len(got))
	for _, w := range want {
		found := false
		var near []string
		for i, g := range got {
			if used[i] {
				continue
			}
			if diff := FindingDiff(w, g); diff == "" {
				used[i], found = true, true
				break
			} else if g.Detector == fmt.Sprint(w["detector"]) {
				near = append(near, diff)
			}
		}
		if !found {
			t.Errorf("expected finding not found: %v\n  closest: %s", w, strings.Join(near, "\n  closest: "))
		}
	}
	for i, g := range got {
		if !used[i] {
			t.Errorf("unexpected finding: detector=%s gpu=%s device=%s xid=%d count=%d attrs=%v evidence=%q",
				g.Detector, g.GPUPCI, g.DevicePCI, g.Xid, g.Count, g.Attrs, g.Evidence)
		}
	}
}

// FindingDiff compares one finding with an expected one; "" when they match.
func FindingDiff(w map[string]any, g finding.Finding) string {
	var diffs []string
	check := func(key, got string) {
		want := ""
		if v, ok := w[key]; ok {
			want = AttrString(v)
		}
		if got != want {
			diffs = append(diffs, fmt.Sprintf("%s=%q want %q", key, got, want))
		}
	}
	check("detector", g.Detector)
	check("gpu_pci", g.GPUPCI)
	xid := ""
	if g.Xid != 0 {
		xid = strconv.Itoa(g.Xid)
	}
	check("xid", xid)
	check("count", strconv.Itoa(g.Count))
	keys := make([]string, 0, len(w))
	for k := range w {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		switch k {
		case "detector", "gpu_pci", "xid", "count":
		case "device_pci":
			check(k, g.DevicePCI)
		default:
			check(k, g.Attrs[k])
		}
	}
	return strings.Join(diffs, ", ")
}

// AttrString renders an expected value the way attributes travel: strings on
// the wire, numbers without decimals, lists comma separated.
func AttrString(v any) string {
	switch v := v.(type) {
	case nil:
		return ""
	case string:
		return v
	case float64:
		return strconv.FormatFloat(v, 'f', -1, 64)
	case bool:
		return strconv.FormatBool(v)
	case []any:
		parts := make([]string, len(v))
		for i, e := range v {
			parts[i] = AttrString(e)
		}
		return strings.Join(parts, ",")
	}
	return fmt.Sprint(v)
}
