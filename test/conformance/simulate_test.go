package conformance

import (
	"fmt"
	"sort"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"

	"github.com/fleetrepair/fleetrepair/controller/decide"
	"github.com/fleetrepair/fleetrepair/controller/ledger"
	"github.com/fleetrepair/fleetrepair/controller/simulate"
)

// TestSimulator runs the rules through the simulator's fleetrepair policy.
func TestSimulator(t *testing.T) { conform(t, simulated) }

// simulated writes the case as a scenario file: the catalog's tolerations,
// the controller's resync as the tick.
func simulated(t *testing.T, c Case) map[string]Outcome {
	t.Helper()
	var b strings.Builder
	cfg := c.settings(t)
	// The scenario sets the simulation's resolution only: the policy's
	// settings are the configuration's (simulate.Options.Config).
	fmt.Fprintf(&b, "scenario: conformance\nparameters: {tick: %s, end: %s}\n", resync, c.End)
	b.WriteString("fleet:\n  cluster: c1\n  nodepools:\n")
	for _, p := range c.Pools {
		zones, _ := yaml.Marshal(p.Zones)
		fmt.Fprintf(&b, "    - {name: %q, node_name_prefix: %q, zones: {%s}}\n", p.Name, p.Prefix,
			strings.ReplaceAll(strings.TrimSpace(string(zones)), "\n", ", "))
	}
	b.WriteString("timeline:\n")
	// Node labels: set at 0s, before any finding (a change step; the
	// simulator's nodes carry them as attributes, cohorts when configured).
	for _, n := range c.nodes() {
		for k, v := range n.labels {
			fmt.Fprintf(&b, "  - {at: 0s, kind: change, select: {nodes: [%q]}, set: {%q: %q}}\n", n.name, k, v)
		}
	}
	for n, hold := range c.Owners { // the owners' holds are node attributes in the simulator
		set := fmt.Sprintf("%q: \"true\"", decide.DoNotDisruptAnnotation)
		if hold == decide.HoldOptOut {
			set = fmt.Sprintf("%q: %q", decide.OptOutLabel, decide.OptOutDisabled)
		}
		fmt.Fprintf(&b, "  - {at: 0s, kind: change, select: {nodes: [%q]}, set: {%s}}\n", n, set)
	}
	boots := map[string]int{}
	for _, in := range c.Inject {
		for _, n := range in.Nodes {
			if in.Boot > boots[n] {
				boots[n] = in.Boot
				fmt.Fprintf(&b, "  - {at: %s, kind: recover, select: {nodes: [%q]}, method: reboot}\n", in.At, n)
			}
		}
		fs, err := yaml.Marshal(in.Findings)
		if err != nil {
			t.Fatal(err)
		}
		js, err := yaml.YAMLToJSON(fs)
		if err != nil {
			t.Fatal(err)
		}
		nodes, err := yaml.Marshal(in.Nodes)
		if err != nil {
			t.Fatal(err)
		}
		nodesJS, err := yaml.YAMLToJSON(nodes)
		if err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(&b, "  - {at: %s, kind: inject, select: {nodes: %s}, findings: %s}\n", in.At, nodesJS, js)
	}
	sc, err := simulate.Parse([]byte(b.String()))
	if err != nil {
		t.Fatalf("scenario:\n%s\n%v", b.String(), err)
	}
	res, err := simulate.Run(sc, simulate.Options{Policies: []string{simulate.PolicyFleetRepair}, Config: &cfg})
	if err != nil {
		t.Fatal(err)
	}
	p := res.Policy(simulate.PolicyFleetRepair)
	out := map[string]Outcome{}
	for _, o := range p.Open {
		switch {
		case o.State == string(ledger.AwaitingApproval) && o.HeldBy == "breaker":
			out[o.Node] = HeldByBreaker
		case o.State == string(ledger.AwaitingApproval):
			out[o.Node] = HeldByAction
		case o.WaitingOn != "":
			out[o.Node] = Outcome("waiting:" + o.WaitingOn)
		case o.Waiting:
			out[o.Node] = Delayed
		default:
			out[o.Node] = Tolerating
		}
	}
	for _, d := range p.Deletions {
		out[d.Node] = Deleted
	}
	if testing.Verbose() {
		keys := make([]string, 0, len(out))
		for k := range out {
			keys = append(keys, k+"="+string(out[k]))
		}
		sort.Strings(keys)
		t.Logf("simulator: %v", keys)
	}
	return out
}
