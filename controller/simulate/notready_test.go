package simulate

import "testing"

// TestZoneNotReady: the kubelet's Ready=Unknown on most of one zone trips
// the zone breaker and no NodeClaim is deleted; one NotReady node elsewhere
// is replaced after its toleration.
func TestZoneNotReady(t *testing.T) {
	t.Parallel()
	sc, err := Parse([]byte(`
scenario: zone-not-ready
parameters: {tick: 1m, end: 3h, replace_duration: 10m}
fleet:
  nodepools:
    - {name: gpu, instance_type: p5, gpus_per_node: 8, driver_version: "580.1", zones: {zone-a: 20, zone-b: 20, zone-c: 20}, node_name_prefix: "g"}
notready: &nr
  - {detector: node-condition, type: Ready, status: Unknown, reason: NodeStatusUnknown, message: Kubelet stopped posting node status.}
timeline:
  - {at: 5m, kind: inject, select: {zone: zone-a, count: 16}, findings: *nr}
  - {at: 5m-2h, repeat_every: 5m, kind: inject, select: {zone: zone-a, count: 16}, findings: *nr}
  - {at: 10m, kind: inject, select: {nodes: [g25]}, findings: *nr}
  - {at: 10m-2h, repeat_every: 5m, kind: inject, select: {nodes: [g25]}, findings: *nr}
  - {at: 20m, kind: checkpoint, expect: {breaker: {tripped: true}}}
`))
	if err != nil {
		t.Fatal(err)
	}
	res, err := Run(sc, Options{})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range res.Checkpoints {
		if c.Status != StatusPass {
			t.Errorf("%s %s: %s (want %v, got %v) %s", c.At, c.Key, c.Status, c.Want, c.Got, c.Detail)
		}
	}
	fr := res.Policy(PolicyFleetRepair)
	zone := false
	for _, tr := range fr.Trips {
		if tr.Cohort == "zone=zone-a" {
			zone = true
		}
	}
	if !zone {
		t.Errorf("zone=zone-a did not trip: %+v", fr.Trips)
	}
	var lone bool
	for _, d := range fr.Deletions {
		if d.Node == "g25" {
			lone = true
			continue
		}
		t.Errorf("a node of the NotReady zone was deleted: %+v", d)
	}
	if !lone {
		t.Errorf("the lone NotReady node g25 was not replaced: %+v", fr.Deletions)
	}
}
