package simulate

import (
	"encoding/json"
	"io/fs"
	"path"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"sigs.k8s.io/yaml"

	"github.com/fleetrepair/fleetrepair/test/fixtures"
)

// knownFailures are case checkpoints that fail because of the diagnosis
// rules (controller/diagnose), not the simulator: key "<scenario> <at>
// <expect key>". The test fails when one of them starts passing, so the
// list stays true.
var knownFailures = map[string]string{}

// TestCaseScenarios replays every scenario.yaml of the case corpus: every
// checkpoint must hold, the breaker must trip (or not) with the expected
// cohort, and fleetrepair must delete no more than breaker.max_deletions
// (cases/README.md, "Fleet").
func TestCaseScenarios(t *testing.T) {
	t.Parallel()
	paths, err := fs.Glob(fixtures.Cases, "cases/*/scenario.yaml")
	if err != nil || len(paths) < 5 {
		t.Fatalf("want the case scenarios, got %v (%v)", paths, err)
	}
	for _, p := range paths {
		id := path.Base(path.Dir(p))
		t.Run(id, func(t *testing.T) {
			t.Parallel()
			sc, err := LoadFS(fixtures.Cases, p)
			if err != nil {
				t.Fatal(err)
			}
			res, err := Run(sc, Options{})
			if err != nil {
				t.Fatal(err)
			}
			if len(res.Checkpoints) == 0 {
				t.Error("no checkpoint evaluated")
			}
			for _, c := range append(append([]Check(nil), res.Checkpoints...), res.Expectations...) {
				key := strings.TrimSpace(res.Scenario + " " + c.At + " " + c.Key)
				if why, known := knownFailures[key]; known {
					if c.Status != StatusFail {
						t.Errorf("%s now %s: remove it from knownFailures (%s)", key, c.Status, why)
					}
					continue
				}
				if c.Status != StatusPass {
					t.Errorf("%s: %s (want %v, got %v) %s", key, c.Status, c.Want, c.Got, c.Detail)
				}
			}
			if kind := caseKind(t, p); kind == "fleet-scenario" {
				if sc.Expect == nil || len(res.Expectations) == 0 {
					t.Errorf("fleet scenario %s has no breaker expectation", id)
				}
			}
		})
	}
}

func caseKind(t *testing.T, scenarioPath string) string {
	t.Helper()
	b, err := fs.ReadFile(fixtures.Cases, path.Join(path.Dir(scenarioPath), "expected.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var e struct {
		Kind string `json:"kind"`
	}
	if err := yaml.Unmarshal(b, &e); err != nil {
		t.Fatal(err)
	}
	return e.Kind
}

// TestFleetScenariosHaveScenarioFiles makes sure no fleet-scenario case is
// skipped for want of a scenario.yaml.
func TestFleetScenariosHaveScenarioFiles(t *testing.T) {
	t.Parallel()
	exp, err := fs.Glob(fixtures.Cases, "cases/*/expected.yaml")
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range exp {
		if caseKind(t, e) != "fleet-scenario" {
			continue
		}
		if _, err := fs.Stat(fixtures.Cases, path.Join(path.Dir(e), "scenario.yaml")); err != nil {
			t.Errorf("%s is a fleet scenario without scenario.yaml", path.Dir(e))
		}
	}
}

// TestSyntheticScenarios replays the fleet-scale scenarios of testdata/:
// their own checkpoints and breaker outcome must hold, fleetrepair must
// delete no healthy-cause node and leave no broken node unrepaired, and the
// baselines must show the failure each scenario is built to show.
func TestSyntheticScenarios(t *testing.T) {
	t.Parallel()
	type want struct {
		// baselines that delete healthy-cause nodes in this scenario
		healthyDeleters []string
		// baselines that leave a broken node unrepaired
		unrepairers []string
		// fleetrepair's lone failures: at least this many repaired, each
		// within maxTTR
		minRepaired int
		maxTTR      time.Duration
	}
	tests := map[string]want{
		"zone-outage.yaml":             {healthyDeleters: []string{PolicyKarpenter, PolicyNVSentinel}, unrepairers: []string{PolicyKarpenter}, minRepaired: 2, maxTTR: 12 * time.Minute},
		"driver-rollout.yaml":          {healthyDeleters: []string{PolicyKarpenter, PolicyNVSentinel}, minRepaired: 1, maxTTR: 12 * time.Minute},
		"monitoring-rollout.yaml":      {healthyDeleters: []string{PolicyKarpenter, PolicyNVSentinel}, unrepairers: []string{PolicyKarpenter}, minRepaired: 1, maxTTR: 12 * time.Minute},
		"rack-fate-sharing.yaml":       {healthyDeleters: []string{PolicyKarpenter, PolicyNVSentinel}, minRepaired: 1, maxTTR: 12 * time.Minute},
		"small-pool-lone-failure.yaml": {unrepairers: []string{PolicyKarpenter}, minRepaired: 1, maxTTR: 12 * time.Minute},
		"background-noise.yaml":        {minRepaired: 5, maxTTR: 12 * time.Minute},
	}
	files, err := filepath.Glob("testdata/*.yaml")
	if err != nil || len(files) != len(tests) {
		t.Fatalf("testdata holds %v, want the %d scenarios of this test", files, len(tests))
	}
	for name, w := range tests {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			sc, err := LoadFile(filepath.Join("testdata", name))
			if err != nil {
				t.Fatal(err)
			}
			res, err := Run(sc, Options{})
			if err != nil {
				t.Fatal(err)
			}
			for _, c := range append(append([]Check(nil), res.Checkpoints...), res.Expectations...) {
				if c.Status != StatusPass {
					t.Errorf("%s %s: %s (want %v, got %v) %s", c.At, c.Key, c.Status, c.Want, c.Got, c.Detail)
				}
			}
			fr := res.Policy(PolicyFleetRepair).Summary
			if fr.HealthyCauseDeleted != 0 || fr.BrokenUnrepaired != 0 {
				t.Errorf("fleetrepair deleted %d healthy-cause nodes and left %d broken ones: %+v", fr.HealthyCauseDeleted, fr.BrokenUnrepaired, fr)
			}
			if fr.LoneRepaired < w.minRepaired || time.Duration(fr.LoneTTRMaxSeconds)*time.Second > w.maxTTR {
				t.Errorf("fleetrepair repaired %d lone failures, slowest after %gs; want >= %d within %s", fr.LoneRepaired, fr.LoneTTRMaxSeconds, w.minRepaired, w.maxTTR)
			}
			for _, p := range []string{PolicyKarpenter, PolicyNVSentinel} {
				s := res.Policy(p).Summary
				if deletes := contains(w.healthyDeleters, p); deletes != (s.HealthyCauseDeleted > 0) {
					t.Errorf("%s deleted %d healthy-cause nodes, want some: %v", p, s.HealthyCauseDeleted, deletes)
				}
				if leaves := contains(w.unrepairers, p); leaves != (s.BrokenUnrepaired > 0) {
					t.Errorf("%s left %d broken nodes unrepaired, want some: %v", p, s.BrokenUnrepaired, leaves)
				}
			}
		})
	}
}

func contains(l []string, s string) bool {
	for _, x := range l {
		if x == s {
			return true
		}
	}
	return false
}

// TestRunIsDeterministic replays a scenario with random selections and
// background failures twice: the results must be identical.
func TestRunIsDeterministic(t *testing.T) {
	t.Parallel()
	sc, err := LoadFile("testdata/rack-fate-sharing.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var out [2][]byte
	for i := range out {
		res, err := Run(sc, Options{})
		if err != nil {
			t.Fatal(err)
		}
		if out[i], err = json.Marshal(res); err != nil {
			t.Fatal(err)
		}
	}
	if string(out[0]) != string(out[1]) {
		t.Error("two runs of the same scenario differ")
	}
}
