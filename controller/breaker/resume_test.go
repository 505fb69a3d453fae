package breaker

import (
	"testing"
	"time"
)

// TestResumeOf: the resume that released a node's hold is the newest human
// resume at or after the hold of a cohort the node is in (or the fleet
// ceiling's); a cool-down, an older resume or another cohort's is none.
func TestResumeOf(t *testing.T) {
	t0 := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	node := Node{Name: "c1/n1", Attrs: map[string]string{"zone": "z1", "nodepool": "gpu"}}
	resume := func(cohort, actor string, at time.Duration) Decision {
		return Decision{At: t0.Add(at), Cohort: cohort, Cause: CauseResumed, Actor: actor, Message: "breaker " + cohort + " resumed by " + actor}
	}
	for _, tc := range []struct {
		name string
		ds   []Decision
		want string // actor, "" for none
	}{
		{"resumed after the hold", []Decision{resume("zone=z1", "user:ada", time.Minute)}, "user:ada"},
		{"resumed before the hold", []Decision{resume("zone=z1", "user:ada", -time.Minute)}, ""},
		{"another cohort", []Decision{resume("zone=z2", "user:ada", time.Minute)}, ""},
		{"cooled down", []Decision{{At: t0.Add(time.Minute), Cohort: "zone=z1", Cause: CauseCooledDown, Actor: Actor}}, ""},
		{"the fleet ceiling", []Decision{resume(FleetScope, "user:bo", time.Minute)}, "user:bo"},
		{"the newest of two", []Decision{resume("nodepool=gpu", "user:bo", 3*time.Minute), resume("zone=z1", "user:ada", time.Minute)}, "user:bo"},
		{"malformed cohort", []Decision{resume("zone", "user:ada", time.Minute)}, ""},
	} {
		d, ok := ResumeOf(tc.ds, node, t0)
		if got := map[bool]string{true: d.Actor}[ok]; got != tc.want {
			t.Errorf("%s: %q (ok %v), want %q", tc.name, d.Actor, ok, tc.want)
		}
	}
}
