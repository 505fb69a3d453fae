package simulate

import (
	"context"
	"strings"
	"testing"
)

const limitBase = `scenario: limits
fleet:
  nodepools:
    - {name: p, instance_type: t, gpus_per_node: 8, driver_version: d, zones: {z: ZONE}, node_name_prefix: n}
parameters: {tick: TICK}
timeline:
  - {at: AT, repeat_every: REPEAT, kind: inject, select: {nodes: [n1]}, findings: [{detector: xid, xid: 79, gpu_pci: "0000:01:00.0"}]}
`

func limitDoc(zone, tick, at, repeat string) string {
	return strings.NewReplacer("ZONE", zone, "TICK", tick, "AT", at, "REPEAT", repeat).Replace(limitBase)
}

// TestLimitsRefuseRunawayScenarios: scenarios that would exhaust memory or
// never end are refused with the limit named, before anything runs.
func TestLimitsRefuseRunawayScenarios(t *testing.T) {
	t.Parallel()
	for name, tc := range map[string]struct{ doc, want string }{
		"huge fleet":  {limitDoc("100000000", "30s", "0m-10m", "1m"), "more than the simulator's limit"},
		"tiny tick":   {limitDoc("3", "1ns", "0m-10m", "1m"), "parameters.tick"},
		"tiny repeat": {limitDoc("3", "30s", "0m-8d", "1ns"), "repeat_every"},
		"endless":     {limitDoc("3", "30s", "0m-1000d", "1h"), "beyond the limit"},
	} {
		if _, err := Parse([]byte(tc.doc)); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: err = %v, want it to mention %q", name, err, tc.want)
		}
	}
	sc, err := Parse([]byte(limitDoc("3", "30s", "0m-10m", "1m")))
	if err != nil {
		t.Fatalf("a sane scenario was refused: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := Run(sc, Options{Context: ctx}); err == nil {
		t.Fatal("a cancelled run returned no error")
	}
}
