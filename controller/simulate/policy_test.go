package simulate

import (
	"slices"
	"strings"
	"testing"
)

const twoPools = `
scenario: policies
parameters: {repair_toleration: 10m, tick: 1m}
fleet:
  nodepools:
    - {name: a, zones: {zone-a: 40}, node_name_prefix: a, driver_version: "1"}
    - {name: b, zones: {zone-a: 10}, node_name_prefix: b, driver_version: "1"}
`

const gpuLost = `[{detector: xid, xid: 79, gpu_pci: "0000:4e:00.0"}]`

// TestPolicies checks each policy's rule on small timelines: which nodes
// it deletes, which it holds and why.
func TestPolicies(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name     string
		yaml     string
		policy   string
		deleted  []string // nodes deleted, in order
		held     []string // nodes held at least once
		heldBy   string   // substring of every hold's reason
		trips    int
		approval []string // fleetrepair: awaiting approval
	}{
		{
			name: "karpenter repairs a pool at 2.5% and blocks one above 20%", policy: PolicyKarpenter,
			yaml: twoPools + `timeline:
  - {at: 0m, kind: inject, select: {nodes: [a1]}, findings: ` + gpuLost + `}
  - {at: 0m, kind: inject, select: {nodes: [b1, b2, b3]}, findings: ` + gpuLost + `}
  - {at: 30m, kind: checkpoint, expect: {deletions: 1}}`,
			deleted: []string{"a1"}, held: []string{"b1", "b2", "b3"}, heldBy: "NodeRepairBlocked: 3 of 10",
		},
		{
			name: "nvsentinel repairs below 50% in 5 minutes", policy: PolicyNVSentinel,
			yaml: twoPools + `timeline:
  - {at: 0m, kind: inject, select: {nodes: [a1, b1, b2, b3]}, findings: ` + gpuLost + `}
  - {at: 30m, kind: checkpoint, expect: {deletions: 4}}`,
			deleted: []string{"a1", "b1", "b2", "b3"},
		},
		{
			name: "nvsentinel trips above 50% in 5 minutes and stays tripped", policy: PolicyNVSentinel,
			yaml: twoPools + `timeline:
  - {at: 0m, kind: inject, select: {pool_any: x, count: 0}, findings: ` + gpuLost + `}
  - {at: 1m, kind: inject, select: {count: 26}, findings: ` + gpuLost + `}
  - {at: 2h, kind: checkpoint, expect: {deletions: 0}}`,
			trips: 1, heldBy: "circuit breaker tripped",
		},
		{
			name: "fleetrepair: 3 of 10 in one pool vs 1 of 40 is not concentrated enough", policy: PolicyFleetRepair,
			yaml: twoPools + `timeline:
  - {at: 0m, kind: inject, select: {nodes: [a1, b1, b2, b3]}, findings: ` + gpuLost + `}
  - {at: 30m, kind: checkpoint, expect: {deletions: 4, breaker: {tripped: false}}}`,
			deleted: []string{"a1", "b1", "b2", "b3"},
		},
		{
			name: "fleetrepair: a pool failing whole while the other is clean trips it", policy: PolicyFleetRepair,
			yaml: twoPools + `timeline:
  - {at: 0m, kind: inject, select: {nodepool: b, count: 6}, findings: ` + gpuLost + `}
  - {at: 1m, kind: inject, select: {nodes: [a1]}, findings: ` + gpuLost + `}
  - {at: 30m, kind: checkpoint, expect: {deletions: 1, deleted: [a1], breaker: {tripped: true, cohort: nodepool=b}}}`,
			deleted: []string{"a1"}, heldBy: "breaker nodepool=b open", trips: 1,
		},
		{
			name: "fleetrepair: reset-class faults wait for approval", policy: PolicyFleetRepair,
			yaml: twoPools + `timeline:
  - {at: 0m, kind: inject, select: {nodes: [a1]}, findings: [{detector: xid, xid: 48, gpu_pci: "0000:4e:00.0"}]}
  - {at: 30m, kind: checkpoint, expect: {deletions: 0, a1: {action: reset-gpu, severity: condition}}}`,
			approval: []string{"a1"},
		},
		{
			name: "fleetrepair: the deletion budget paces repairs", policy: PolicyFleetRepair,
			yaml: strings.Replace(twoPools, "tick: 1m", "tick: 1m, deletions_per_hour: 2, max_in_flight_per_nodepool: 5", 1) + `timeline:
  - {at: 0m, kind: inject, select: {nodes: [a1, b1, a2]}, findings: ` + gpuLost + `}
  - {at: 30m, kind: checkpoint, expect: {deletions: 2}}
  - {at: 71m, kind: checkpoint, expect: {deletions: 3}}`,
			deleted: []string{"a1", "a2", "b1"}, held: []string{"b1"}, heldBy: "2 deletions in the last hour, budget 2 per hour",
		},
		{
			name: "fleetrepair: on-call resume releases held repairs", policy: PolicyFleetRepair,
			// Budgets that let the six through at once: this case is the
			// resume, the budgets have theirs.
			yaml: strings.Replace(twoPools, "tick: 1m", "tick: 1m, max_in_flight_per_nodepool: 6, nodepool_deletions_per_hour: 6", 1) + `timeline:
  - {at: 0m, kind: inject, select: {nodepool: b, count: 6}, findings: ` + gpuLost + `}
  - {at: 19m, kind: checkpoint, expect: {deletions: 0, breaker: {tripped: true}}}
  - {at: 20m, kind: resume, cohort: nodepool=b, actor: oncall@example.invalid}
  - {at: 21m, kind: checkpoint, expect: {deletions: 6, breaker: {tripped: false}}}`,
			trips: 1, heldBy: "breaker nodepool=b open",
		},
		{
			name: "fleetrepair: one deletion in flight per NodePool, five per hour", policy: PolicyFleetRepair,
			yaml: twoPools + `timeline:
  - {at: 0m, kind: inject, select: {nodes: [a1, a2]}, findings: ` + gpuLost + `}
  - {at: 14m, kind: checkpoint, expect: {deletions: 1}}
  - {at: 20m, kind: checkpoint, expect: {deletions: 2}}`,
			deleted: []string{"a1", "a2"}, held: []string{"a2"}, heldBy: "1 deletions in flight, budget 1",
		},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			sc, err := Parse([]byte(tt.yaml))
			if err != nil {
				t.Fatal(err)
			}
			res, err := Run(sc, Options{Policies: []string{tt.policy}})
			if err != nil {
				t.Fatal(err)
			}
			for _, c := range res.Checkpoints {
				if c.Status != StatusPass {
					t.Errorf("%s %s: want %v, got %v %s", c.At, c.Key, c.Want, c.Got, c.Detail)
				}
			}
			p := res.Policies[0]
			var deleted, held, approval []string
			for _, d := range p.Deletions {
				deleted = append(deleted, d.Node)
			}
			for _, h := range p.Paused {
				held = append(held, h.Node)
				if tt.heldBy != "" && !strings.Contains(h.By, tt.heldBy) {
					t.Errorf("%s held by %q, want %q", h.Node, h.By, tt.heldBy)
				}
			}
			for _, a := range p.AwaitingApproval {
				approval = append(approval, a.Node)
			}
			slices.Sort(deleted)
			if tt.deleted != nil && !slices.Equal(deleted, tt.deleted) {
				t.Errorf("deleted %v, want %v", deleted, tt.deleted)
			}
			if tt.held != nil && !slices.Equal(held, tt.held) {
				t.Errorf("held %v, want %v", held, tt.held)
			}
			if !slices.Equal(approval, tt.approval) {
				t.Errorf("awaiting approval %v, want %v", approval, tt.approval)
			}
			if p.Summary.Trips != tt.trips {
				t.Errorf("trips %d, want %d: %+v", p.Summary.Trips, tt.trips, p.Trips)
			}
		})
	}
}

func TestUnknownNode(t *testing.T) {
	t.Parallel()
	sc, err := Parse([]byte(twoPools + "timeline: [{at: 0m, kind: inject, select: {nodes: [zz9]}, findings: " + gpuLost + "}]"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := Run(sc, Options{}); err == nil || !strings.Contains(err.Error(), "zz9") {
		t.Errorf("Run = %v, want an error naming the unknown node", err)
	}
	if _, err := Run(sc, Options{Policies: []string{"yolo"}}); err == nil {
		t.Error("Run accepted an unknown policy")
	}
}
