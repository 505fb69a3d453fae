package simulate

import (
	"encoding/json"
	"io/fs"
	"os"
	"testing"

	"github.com/fleetrepair/fleetrepair/test/fixtures"
)

func TestDump(t *testing.T) {
	paths, _ := fs.Glob(fixtures.Cases, "cases/*/scenario.yaml")
	for _, p := range paths {
		sc, err := LoadFS(fixtures.Cases, p)
		if err != nil {
			t.Fatal(err)
		}
		res, err := Run(sc, Options{})
		if err != nil {
			t.Fatal(err)
		}
		for i := range res.Policies {
			for j := range res.Policies[i].Trips {
				res.Policies[i].Trips[j].Evidence = nil
			}
		}
		enc := json.NewEncoder(os.Stdout)
		enc.SetIndent("", " ")
		res.Policies = res.Policies[:1]
		for _, c := range append(res.Checkpoints, res.Expectations...) {
			if c.Status != "pass" {
				enc.Encode(c)
			}
		}
		enc.Encode(map[string]any{"s": res.Scenario, "pass": res.Pass, "fr": res.Policies[0].Summary, "trips": res.Policies[0].Trips, "halted": res.Halted})
	}
}
