package runtimelog

import (
	"strings"
	"testing"
	"time"

	"github.com/fleetrepair/fleetrepair/agent/kmsg"
)

// TestLineTimeYear: syslog and glog stamps carry no year; they get the one
// kmsg.CompleteYear gives (they once came out as year 0).
func TestLineTimeYear(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 12, 1, 17, 40, 0, 0, time.UTC)
	for line, want := range map[string]string{
		"Dec  2 11:38:27 node-a1 kubelet[1450]: I1202 11:38:27.934473    1450 kubelet.go:1778] x": "2025-12-02T11:38:27Z",
		"I1130 16:02:43.934473    1450 kubelet.go:1778] x":                                        "2026-11-30T16:02:43.934473Z",
	} {
		if got := lineTime(line, now).Format(time.RFC3339Nano); got != want {
			t.Errorf("lineTime(%q) = %s, want %s", line, got, want)
		}
	}
	// Parse stamps findings against the real clock: never year 0, never
	// later than now + 14 h.
	fs, _, err := Parse(strings.NewReader("Mar 13 16:02:43 node-a1 kubelet[1450]: I0313 16:02:43.934473    1450 kubelet.go:1778] skipping pod synchronization - [PLEG is not healthy: pleg was last seen active 3m5.30015447s ago; threshold is 3m0s]\n"))
	if err != nil || len(fs) != 1 {
		t.Fatalf("Parse: %d findings, %v", len(fs), err)
	}
	if at := fs[0].Time; at.Year() < time.Now().Year()-1 || at.After(time.Now().Add(kmsg.MaxZoneAhead)) {
		t.Errorf("finding time %s: want a year completed against now", at)
	}
}
