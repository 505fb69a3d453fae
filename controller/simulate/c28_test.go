package simulate

import (
	"testing"
	"time"

	"github.com/fleetrepair/fleetrepair/test/fixtures"
)

// TestCaseC28MustNot gives the fleet-level must_not items of c28 an
// assertion each: the replacements failing the same way trip the pool's
// breaker (cause replacement-failed), no second replacement round follows,
// and the pool is never emptied at once.
func TestCaseC28MustNot(t *testing.T) {
	t.Parallel()
	sc, err := LoadFS(fixtures.Cases, "cases/c28-runtime-down-replacements-fail-too/scenario.yaml")
	if err != nil {
		t.Fatal(err)
	}
	res, err := Run(sc, Options{})
	if err != nil {
		t.Fatal(err)
	}
	fr := res.Policy(PolicyFleetRepair)
	if fr == nil {
		t.Fatal("no fleetrepair result")
	}
	// "ignore the replacement failed the same way as breaker evidence"
	tripped := false
	for _, tr := range fr.Trips {
		if tr.Cause == "replacement-failed" && tr.Cohort == "nodepool=agentpool" {
			tripped = true
		}
	}
	if !tripped {
		t.Errorf("no replacement-failed trip of nodepool=agentpool: %+v", fr.Trips)
	}
	// "start another replacement round once a replacement fails with the
	// same signature": each slot is replaced at most once.
	per := map[string]int{}
	for _, d := range fr.Deletions {
		per[d.Node]++
		if per[d.Node] > 1 {
			t.Errorf("%s replaced twice: %+v", d.Node, fr.Deletions)
		}
	}
	// "delete every node of the pool at once" / "treat the incident as
	// three independently broken machines": never a second round, and the
	// in-place restart came first (no deletion before the restart at 35m).
	if len(fr.Deletions) == 0 {
		t.Error("no replacement round at all: the wedge returning after the restart escalates to replace")
	}
	for _, d := range fr.Deletions {
		at, err := time.ParseDuration(d.At)
		if err != nil || at < 35*time.Minute {
			t.Errorf("deletion at %s before the in-place restart (%v)", d.At, err)
		}
	}
}
