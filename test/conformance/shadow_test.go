package conformance

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/fleetrepair/fleetrepair/agent/finding"
	"github.com/fleetrepair/fleetrepair/controller/config"
	"github.com/fleetrepair/fleetrepair/controller/decide"
	"github.com/fleetrepair/fleetrepair/controller/diagnose"
	"github.com/fleetrepair/fleetrepair/controller/shadow"
	"github.com/fleetrepair/fleetrepair/controller/simulate"
	"github.com/fleetrepair/fleetrepair/controller/store"
	"github.com/fleetrepair/fleetrepair/test/pgtest"
)

// TestShadow runs the rules through the shadow replay of the stored findings.
func TestShadow(t *testing.T) { conform(t, replayed) }

// storedFleet stores the case's nodes and findings as the controller
// would have: node metadata with a NodeClaim, a heartbeat, and each
// injection as one agent report received when it was observed.
func storedFleet(t *testing.T, c Case, cfg config.Config) *store.Store {
	t.Helper()
	ctx := context.Background()
	st := pgtest.Store(t)
	joined := t0.Add(-time.Hour)
	for _, n := range c.nodes() {
		if _, err := st.ReadNode(ctx, store.Node{Cluster: "c1", Name: n.name, NodePool: n.pool, Zone: n.zone,
			InstanceType: "p5.48xlarge", NodeClaim: n.name + "-nc", Labels: n.labels}, 1, joined); err != nil {
			t.Fatal(err)
		}
		report(t, st, n.name, joined, nil)
	}
	// The owners' holds as the live deletion guard records them.
	for n, hold := range c.Owners {
		optOut, dnd := "", ""
		if hold == decide.HoldOptOut {
			optOut = "Node " + n
		} else {
			dnd = "Pod ml/train-" + n
		}
		if err := st.SetNodeOwners(ctx, "c1", n, optOut, dnd, joined); err != nil {
			t.Fatal(err)
		}
	}
	// The budgets of the configuration, as cmd/runner sets them at start.
	b := cfg.Budgets
	if _, err := st.SetClusterBudget(ctx, "c1", b.DeletionsPerHour, b.MaxInFlightPerNodePool, joined); err != nil {
		t.Fatal(err)
	}
	if err := st.SetNodePoolBudget(ctx, "c1", b.NodePoolDeletionsPerHour, joined); err != nil {
		t.Fatal(err)
	}
	return st
}

// findings turns an injection into the findings one node reports at `at`.
func findings(in Inject, node string, at time.Time, seq *uint64) []finding.Finding {
	boot := bootID(node, in.Boot)
	var out []finding.Finding
	for _, spec := range in.Findings {
		*seq++
		f := simulate.FindingFromSpec(spec)
		f.Node, f.BootID, f.Time, f.Seq = node, boot, at, *seq
		f.Evidence = []string{fmt.Sprintf("%v", spec)}
		f.ID = finding.NewID(f)
		out = append(out, f)
	}
	return out
}

// report ingests one agent report from node, received at `at`.
func report(t *testing.T, st *store.Store, node string, at time.Time, fs []finding.Finding) {
	t.Helper()
	boot := bootID(node, 0)
	if len(fs) > 0 {
		boot = fs[0].BootID
	}
	r := finding.Report{SchemaVersion: finding.SchemaVersion, Cluster: "c1", Node: node, BootID: boot,
		AgentVersion: "v0.1.0", SentAt: at, Findings: fs,
		Heartbeat: &finding.Heartbeat{DriverVersion: "570.133.20", KernelVersion: "6.8.0", GPUCount: 8}}
	if _, err := st.IngestReport(context.Background(), r, at); err != nil {
		t.Fatal(err)
	}
}

func replayed(t *testing.T, c Case) map[string]Outcome {
	t.Helper()
	cfg := c.settings(t)
	st := storedFleet(t, c, cfg)
	var seq uint64
	for _, in := range c.Inject {
		for _, n := range in.Nodes {
			at := t0.Add(in.At)
			report(t, st, n, at, findings(in, n, at, &seq))
		}
	}
	eng, err := diagnose.New(diagnose.Options{})
	if err != nil {
		t.Fatal(err)
	}
	sc, err := shadow.FromConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	sc.Store, sc.Engine = st, eng
	rep, err := shadow.Run(context.Background(), sc, t0, t0.Add(c.End))
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]Outcome{}
	for _, o := range rep.Open {
		switch {
		case o.HeldBy == shadow.WhyBreaker:
			out[o.Node] = HeldByBreaker
		case o.HeldBy == shadow.WhyActionNotExecutable:
			out[o.Node] = HeldByAction
		case o.WaitingOn != "":
			out[o.Node] = Outcome("waiting:" + o.WaitingOn)
		case !t0.Add(c.End).Before(o.TolerationUntil):
			out[o.Node] = Delayed
		default:
			out[o.Node] = Tolerating
		}
	}
	for _, d := range rep.Deletions {
		out[d.Node] = Deleted
	}
	return out
}
