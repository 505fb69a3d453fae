package breaker

import (
	"testing"
	"time"
)

// TestLaunchFailure: a NodeClaim that never registered is a failed
// replacement only in a pool that replaced a node before it was created,
// within one replacement cycle.
func TestLaunchFailure(t *testing.T) {
	t.Parallel()
	t0 := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	replaced := []Replaced{{Pool: "c1/gpu", FaultClass: "accelerated-hardware", At: t0}}
	tests := []struct {
		name    string
		pool    string
		created time.Time
		want    bool
	}{
		{"created after the replacement", "c1/gpu", t0.Add(time.Minute), true},
		{"created at the deletion", "c1/gpu", t0, true},
		{"created before the replacement", "c1/gpu", t0.Add(-time.Minute), false},
		{"past one replacement cycle", "c1/gpu", t0.Add(DefaultReplacementCycle + time.Minute), false},
		{"another pool", "c1/cpu", t0.Add(time.Minute), false},
		{"another cluster's pool", "c2/gpu", t0.Add(time.Minute), false},
		{"no pool", "", t0.Add(time.Minute), false},
		{"no creation time", "c1/gpu", time.Time{}, false},
	}
	for _, tt := range tests {
		if got := LaunchFailure(tt.pool, tt.created, replaced); got != tt.want {
			t.Errorf("%s: %v, want %v", tt.name, got, tt.want)
		}
	}
	if LaunchFailure("c1/gpu", t0.Add(time.Minute), nil) {
		t.Error("no replacement: a launch failure")
	}
}
