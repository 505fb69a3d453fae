package conformance

import (
	"reflect"
	"testing"

	"github.com/fleetrepair/fleetrepair/controller/breaker"
	"github.com/fleetrepair/fleetrepair/controller/config"
	"github.com/fleetrepair/fleetrepair/controller/repair"
	"github.com/fleetrepair/fleetrepair/controller/shadow"
	"github.com/fleetrepair/fleetrepair/controller/simulate"
)

// TestSameConfiguration: the live reconciler (repair.ConfigFrom), the
// shadow report (shadow.FromConfig) and the simulator (Scenario.Settings
// of a scenario that sets no policy parameter) receive the same settings
// from one controller configuration — the defaults, and a file that
// changes every kind of setting — so their defaults cannot drift.
func TestSameConfiguration(t *testing.T) {
	t.Parallel()
	custom, err := config.Parse([]byte(`
breaker: {labels: [topology.kubernetes.io/rack], window: 5m, minFailing: 4, alpha: 0.01}
budgets: {deletionsPerHour: 3, nodePoolDeletionsPerHour: 2, maxInFlightPerNodePool: 2, minHealthy: 4}
repair: {toleration: 2m, resync: 20s, approvalTTL: 2h, drainPerPass: 3, lookback: 48h, maxBreakerAge: 2m}
policy: {nodePools: {small: {minHealthy: 1}}}
`), nil)
	if err != nil {
		t.Fatal(err)
	}
	sc, err := simulate.Parse([]byte("scenario: settings\nparameters: {tick: 1m}\nfleet:\n  nodepools:\n    - {name: gpu, zones: {z1: 4}, node_name_prefix: n}\ntimeline:\n  - {at: 1m, kind: checkpoint, expect: {deletions: 0}}\n"))
	if err != nil {
		t.Fatal(err)
	}
	for name, c := range map[string]config.Config{"defaults": config.Default(), "custom": custom} {
		t.Run(name, func(t *testing.T) {
			rc, err := repair.ConfigFrom(c)
			if err != nil {
				t.Fatal(err)
			}
			shc, err := shadow.FromConfig(c)
			if err != nil {
				t.Fatal(err)
			}
			sim := sc.Settings(c)
			simBP, err := sim.BreakerPolicy()
			if err != nil {
				t.Fatal(err)
			}
			type view struct {
				Resync, ApprovalTTL, Toleration, Lookback string
				DrainPerPass                              int
				Breaker                                   breaker.Config
				MinHealthyGPU, MinHealthySmall            int
			}
			live := view{rc.Resync.String(), rc.ApprovalTTL.String(), rc.Toleration.String(), rc.Lookback.String(), rc.DrainPerPass,
				rc.Breaker.Config(), rc.Policy.MinHealthy("gpu"), rc.Policy.MinHealthy("small")}
			replay := view{shc.Resync.String(), shc.ApprovalTTL.String(), shc.Toleration.String(), shc.Lookback.String(), shc.DrainPerPass,
				shc.Breaker.Config(), shc.Policy.MinHealthy("gpu"), shc.Policy.MinHealthy("small")}
			simulated := view{sim.Repair.Resync.String(), sim.Repair.ApprovalTTL.String(), sim.Repair.Toleration.String(), sim.Repair.Lookback.String(),
				sim.Repair.DrainPerPass, simBP.Config(), sim.MinHealthy("gpu"), sim.MinHealthy("small")}
			if !reflect.DeepEqual(live, replay) || !reflect.DeepEqual(live, simulated) {
				t.Errorf("the callers receive different settings:\nlive      %+v\nshadow    %+v\nsimulator %+v", live, replay, simulated)
			}
			if want := c.Repair.BreakerAge(); rc.MaxBreakerAge != want {
				t.Errorf("live max breaker age %s, want %s", rc.MaxBreakerAge, want)
			}
			if got, want := sim.Budget("gpu"), c.Budget("gpu"); got != want {
				t.Errorf("simulator budget %+v, want the configuration's %+v", got, want)
			}
			if name == "defaults" {
				// The replays' own zero-value defaults are the configuration's.
				d := config.Default().Repair
				if shadow.DefaultResync != d.Resync || shadow.DefaultApprovalTTL != d.ApprovalTTL || shadow.DefaultLookback != d.Lookback ||
					shadow.DefaultDrainPerPass != d.DrainPerPass {
					t.Errorf("shadow's defaults differ from the configuration's %+v", d)
				}
			}
		})
	}
}
