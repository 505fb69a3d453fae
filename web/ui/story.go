package ui

import (
	"slices"
	"strconv"
	"time"

	"github.com/fleetrepair/fleetrepair/agent/finding"
	"github.com/fleetrepair/fleetrepair/controller/catalog"
	"github.com/fleetrepair/fleetrepair/web/api"
)

// step is one line of a timeline: when, how long after the step before,
// what happened, who did it and why.
type step struct {
	At     time.Time
	After  time.Duration
	What   string
	Actor  string
	Reason string
	// State is the ledger state entered ("" for a finding).
	State string
	// Lines are raw kernel lines (findings only).
	Lines []string
}

// repairData is the repair page: GET /api/v1/repairs/{id} arranged as a story.
type repairData struct {
	api.RepairDetail
	Reason   catalog.Reason
	Known    bool
	Timeline []step
	// Total is first finding (or opening) -> closing (or now, while open).
	Total time.Duration
	Open  bool
}

// repairStory orders a repair's findings and audit into one timeline: first
// finding, diagnosis and quarantine (the repair's opening), toleration,
// guard decisions, the NodeClaim deletion and the replacement Ready.
func repairStory(rd api.RepairDetail, cat *catalog.Catalog) repairData {
	out := repairData{RepairDetail: rd, Open: rd.Repair.ClosedAt == nil}
	out.Reason, out.Known = cat.Lookup(rd.Repair.Reason)
	var steps []step
	for _, f := range rd.Findings {
		steps = append(steps, step{At: f.Time, What: findingTitle(f), Actor: "agent on " + rd.Repair.Node, Lines: f.Evidence})
	}
	for _, a := range rd.Audit {
		what := a.To
		if a.From == "" {
			what = "repair opened: " + a.To
		} else {
			what = a.From + " → " + a.To
		}
		steps = append(steps, step{At: a.At, What: what, Actor: a.Actor, Reason: a.Reason, State: a.To})
	}
	slices.SortStableFunc(steps, func(a, b step) int { return a.At.Compare(b.At) })
	for i := range steps {
		if i > 0 && !steps[i].At.IsZero() && !steps[i-1].At.IsZero() {
			steps[i].After = steps[i].At.Sub(steps[i-1].At)
		}
	}
	out.Timeline = steps
	// Findings without a kernel timestamp sort first and do not start the clock.
	for _, st := range steps {
		if st.At.IsZero() {
			continue
		}
		end := rd.Repair.UpdatedAt
		if rd.Repair.ClosedAt != nil {
			end = *rd.Repair.ClosedAt
		}
		out.Total = end.Sub(st.At)
		break
	}
	return out
}

func findingTitle(f finding.Finding) string {
	s := "finding: " + f.Detector
	if f.Xid != 0 {
		s += " Xid " + strconv.Itoa(f.Xid)
	}
	if f.GPUPCI != "" {
		s += " on GPU " + f.GPUPCI
	}
	if f.Count > 1 {
		s += " (×" + strconv.Itoa(f.Count) + ")"
	}
	return s
}

// bootGroup is one boot of a node with what happened during it (lemon history).
type bootGroup struct {
	BootID    string
	Current   bool
	Findings  []finding.Finding
	Diagnoses []api.Diagnosis
}

// nodeData is the node page: GET /api/v1/nodes/{cluster}/{node} by boot.
type nodeData struct {
	api.NodeDetail
	Boots []bootGroup
}

func nodeStory(nd api.NodeDetail) nodeData {
	out := nodeData{NodeDetail: nd}
	idx := map[string]int{}
	group := func(boot string) *bootGroup {
		i, ok := idx[boot]
		if !ok {
			i = len(out.Boots)
			idx[boot] = i
			out.Boots = append(out.Boots, bootGroup{BootID: boot, Current: boot == nd.Node.BootID})
		}
		return &out.Boots[i]
	}
	if nd.Node.BootID != "" {
		group(nd.Node.BootID)
	}
	for _, f := range nd.Findings {
		g := group(f.BootID)
		g.Findings = append(g.Findings, f)
	}
	for _, d := range nd.Diagnoses {
		g := group(d.BootID)
		g.Diagnoses = append(g.Diagnoses, d)
	}
	return out
}
