package store_test

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fleetrepair/fleetrepair/agent/finding"
	"github.com/fleetrepair/fleetrepair/controller/ledger"
	"github.com/fleetrepair/fleetrepair/controller/store"
)

// TestWriteNodeLedgersAsAlone: a group written by WriteNodeLedgers (one
// statement per kind for all its nodes) stores exactly what writing each
// node alone (WriteNodeLedger) stores, on two databases set up the same
// way: the results, the nodes' diagnoses, repairs, audit entries, finding
// links and live-feed events (all but the IDs the sequences hand out in
// another order). The group mixes the cases the set-based statements must
// keep apart: a node with two new condition diagnoses (one "failing" node
// event, as when they are written one statement each), a node with the
// same diagnosis twice (merged), a node with an open repair (returned,
// nothing opened), a node linking findings to its open repair (a duplicate
// and "" among them), a node whose diagnosis comes back after it was
// deactivated (its Event to be recorded anew), one whose other diagnosis
// is deactivated, and a plain new node; nodes of two clusters, one name in
// both.
func TestWriteNodeLedgersAsAlone(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	diag := func(cluster, node, reason, severity string, seen time.Time, ids ...string) store.DiagnosisRecord {
		return store.DiagnosisRecord{Cluster: cluster, Node: node, BootID: "boot-a", Reason: reason, Severity: severity,
			FaultClass: "accelerated-hardware", Action: "replace", FirstSeen: seen, LastSeen: seen, FindingIDs: ids,
			Detail: map[string]any{"message": reason}}
	}
	toOpen := func(cluster, node string, ids ...string) *store.Repair {
		r := newRepair(node, "gpu")
		r.Cluster, r.FindingIDs = cluster, ids
		return &r
	}
	now := t0.Add(time.Hour)
	// setup writes the same history into s, node by node.
	setup := func(s *store.Store) map[string]int64 {
		t.Helper()
		open := map[string]int64{}
		for _, n := range []string{"n-open", "n-link"} {
			res, err := s.WriteNodeLedger(ctx, store.NodeLedger{Cluster: "c1", Node: n,
				Diagnoses: []store.DiagnosisRecord{diag("c1", n, "GPUFallenOffBus", "condition", t0, "f0")},
				Open:      toOpen("c1", n, "f0"), Actor: "controller", Reason: "setup"}, t0)
			if err != nil || !res.Opened {
				t.Fatalf("setup %s: opened %v, %v", n, res.Opened, err)
			}
			open[n] = res.Repair.ID
		}
		// n-back: a condition diagnosis whose Event was recorded, then
		// deactivated (its evidence cleared).
		res, err := s.WriteNodeLedger(ctx, store.NodeLedger{Cluster: "c1", Node: "n-back",
			Diagnoses: []store.DiagnosisRecord{diag("c1", "n-back", "XidNVLinkError", "condition", t0, "f0")}}, t0)
		if err != nil {
			t.Fatal(err)
		}
		if err := s.MarkEventRecorded(ctx, res.Diagnoses[0].ID, t0); err != nil {
			t.Fatal(err)
		}
		if _, err := s.WriteNodeLedger(ctx, store.NodeLedger{Cluster: "c1", Node: "n-back"}, t0.Add(time.Minute)); err != nil {
			t.Fatal(err)
		}
		// n-drop: an event diagnosis that the group's write drops.
		if _, err := s.WriteNodeLedger(ctx, store.NodeLedger{Cluster: "c2", Node: "n-drop",
			Diagnoses: []store.DiagnosisRecord{diag("c2", "n-drop", "PCIeAERFatal", "event", t0, "f0")}}, t0); err != nil {
			t.Fatal(err)
		}
		return open
	}
	group := func(open map[string]int64) []store.NodeLedger {
		return []store.NodeLedger{
			{Cluster: "c1", Node: "n-two", Diagnoses: []store.DiagnosisRecord{
				diag("c1", "n-two", "GPUFallenOffBus", "condition", now, "f1"), diag("c1", "n-two", "XidNVLinkError", "condition", now, "f2", "f1")},
				Open: toOpen("c1", "n-two", "f1", "f2"), Actor: "controller", Reason: "two"},
			{Cluster: "c1", Node: "n-same", Diagnoses: []store.DiagnosisRecord{
				diag("c1", "n-same", "GPUFallenOffBus", "condition", now, "f1", "f2"),
				diag("c1", "n-same", "GPUFallenOffBus", "condition", now.Add(time.Second), "f3", "f2")}},
			{Cluster: "c1", Node: "n-open", Diagnoses: []store.DiagnosisRecord{diag("c1", "n-open", "GPUFallenOffBus", "condition", now, "f5")},
				Open: toOpen("c1", "n-open", "f5"), Actor: "controller", Reason: "again"},
			{Cluster: "c1", Node: "n-link", Diagnoses: []store.DiagnosisRecord{diag("c1", "n-link", "GPUFallenOffBus", "condition", now, "f6")},
				LinkTo: open["n-link"], LinkFindings: []string{"f6", "", "f6", "f0"}},
			{Cluster: "c1", Node: "n-back", Diagnoses: []store.DiagnosisRecord{diag("c1", "n-back", "XidNVLinkError", "condition", now, "f7")}},
			{Cluster: "c2", Node: "n-drop", Diagnoses: []store.DiagnosisRecord{diag("c2", "n-drop", "GPUFallenOffBus", "condition", now, "f8")},
				Open: toOpen("c2", "n-drop", "f8", "f8"), Actor: "controller", Reason: "drop"},
			{Cluster: "c2", Node: "n-two", Diagnoses: []store.DiagnosisRecord{diag("c2", "n-two", "GPUFallenOffBus", "condition", now, "f9")},
				Open: toOpen("c2", "n-two", "f9"), Actor: "controller", Reason: "plain"},
		}
	}

	grouped, alone := open(t), open(t)
	openG, openA := setup(grouped), setup(alone)
	if !reflect.DeepEqual(openG, openA) {
		t.Fatalf("the two databases' setups differ: %v, %v", openG, openA)
	}
	_, afterG, err := grouped.EventBounds(ctx)
	if err != nil {
		t.Fatal(err)
	}
	_, afterA, err := alone.EventBounds(ctx)
	if err != nil {
		t.Fatal(err)
	}
	ws := group(openG)
	resG, errs := grouped.WriteNodeLedgers(ctx, ws, now)
	resA := make([]store.NodeLedgerResult, len(ws))
	for i, w := range ws {
		if errs[i] != nil {
			t.Fatalf("group: %s/%s: %v", w.Cluster, w.Node, errs[i])
		}
		if resA[i], err = alone.WriteNodeLedger(ctx, w, now); err != nil {
			t.Fatalf("alone: %s/%s: %v", w.Cluster, w.Node, err)
		}
	}

	for i, w := range ws {
		g, a := normalResult(resG[i]), normalResult(resA[i])
		if !reflect.DeepEqual(g, a) {
			t.Errorf("%s/%s: group wrote %+v, alone %+v", w.Cluster, w.Node, g, a)
		}
		gd, err := grouped.DiagnosesForNode(ctx, w.Cluster, w.Node, 0)
		if err != nil {
			t.Fatal(err)
		}
		ad, err := alone.DiagnosesForNode(ctx, w.Cluster, w.Node, 0)
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(normalDiagnoses(gd), normalDiagnoses(ad)) {
			t.Errorf("%s/%s: diagnoses after the group %+v, alone %+v", w.Cluster, w.Node, gd, ad)
		}
		if g, a := nodeRepairs(t, grouped, w.Cluster, w.Node), nodeRepairs(t, alone, w.Cluster, w.Node); !reflect.DeepEqual(g, a) {
			t.Errorf("%s/%s: repairs after the group %+v, alone %+v", w.Cluster, w.Node, g, a)
		}
	}
	if g, a := nodeEvents(t, grouped, afterG), nodeEvents(t, alone, afterA); !reflect.DeepEqual(g, a) {
		t.Errorf("live-feed events of the group %v, alone %v", g, a)
	}

	// The cases themselves, on the grouped database.
	two := resG[0]
	if !two.Opened || !two.Created[0] || !two.Created[1] || !reflect.DeepEqual(two.Repair.FindingIDs, []string{"f1", "f2"}) {
		t.Errorf("n-two: %+v", two)
	}
	if failing := nodeEvents(t, grouped, afterG)["c1/n-two"]; countEvents(failing, "node", `"health":"failing"`) != 1 {
		t.Errorf("n-two: node events %v, want one failing", failing)
	}
	same := resG[1]
	if !same.Created[0] || same.Created[1] || same.Diagnoses[1].ID != same.Diagnoses[0].ID ||
		!reflect.DeepEqual(same.Diagnoses[1].FindingIDs, []string{"f1", "f2", "f3"}) || !same.Diagnoses[1].LastSeen.Equal(now.Add(time.Second)) {
		t.Errorf("n-same: %+v", same)
	}
	if again := resG[2]; again.Opened || again.Repair.ID != openG["n-open"] {
		t.Errorf("n-open: opened %v repair %d, want the open %d", again.Opened, again.Repair.ID, openG["n-open"])
	}
	if got, _ := grouped.GetRepair(ctx, openG["n-link"]); !reflect.DeepEqual(got.FindingIDs, []string{"f0", "f6"}) {
		t.Errorf("n-link: linked findings %v, want f0 f6", got.FindingIDs)
	}
	if back := resG[4]; back.Created[0] || !back.Diagnoses[0].Active || !back.Diagnoses[0].EventRecordedAt.IsZero() ||
		!reflect.DeepEqual(back.Diagnoses[0].FindingIDs, []string{"f0", "f7"}) {
		t.Errorf("n-back: %+v", back)
	}
	if active, err := grouped.ActiveDiagnoses(ctx, "c2", "n-drop"); err != nil || len(active) != 1 || active[0].Reason != "GPUFallenOffBus" {
		t.Errorf("n-drop: active %+v (%v), want GPUFallenOffBus only", active, err)
	}
	if d := resG[5]; !d.Opened || !reflect.DeepEqual(d.Repair.FindingIDs, []string{"f8"}) {
		t.Errorf("n-drop: %+v", d)
	}
	if p := resG[6]; !p.Opened || p.Repair.Cluster != "c2" || p.Repair.Node != "n-two" || p.Diagnoses[0].Cluster != "c2" {
		t.Errorf("c2/n-two: %+v", p)
	}
}

// TestWriteNodeLedgersConcurrentGroups: groups of the same nodes, in
// different orders, written at once (their repair inserts conflict with
// each other's; a deadlock between two of them fails a group, which is
// then written node by node): every write succeeds, each node has exactly
// one repair with one audit entry, exactly one writer opened it, and
// every writer got that repair.
func TestWriteNodeLedgersConcurrentGroups(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := openWide(t, 16)
	const writers, nodes = 6, 12
	names := make([]string, nodes)
	for i := range names {
		names[i] = fmt.Sprintf("n%02d", i)
	}
	var (
		wg     sync.WaitGroup
		mu     sync.Mutex
		opened = map[string]int{}
		ids    = map[string]map[int64]bool{}
	)
	for w := range writers {
		order := rand.New(rand.NewPCG(uint64(w), 7)).Perm(nodes)
		wg.Go(func() {
			ws := make([]store.NodeLedger, nodes)
			for j, i := range order {
				n := names[i]
				r := newRepair(n, "gpu")
				r.FindingIDs = []string{"f-" + n}
				ws[j] = store.NodeLedger{Cluster: "c1", Node: n, Open: &r, Actor: "controller", Reason: fmt.Sprintf("writer %d", w),
					Diagnoses: []store.DiagnosisRecord{{Cluster: "c1", Node: n, BootID: "boot-a", Reason: "GPUFallenOffBus",
						Severity: "condition", FindingIDs: []string{fmt.Sprintf("f-%s-%d", n, w)}}}}
			}
			res, errs := s.WriteNodeLedgers(ctx, ws, t0.Add(time.Duration(w)*time.Millisecond))
			mu.Lock()
			defer mu.Unlock()
			for j, l := range ws {
				if errs[j] != nil {
					t.Errorf("%s: %v", l.Node, errs[j])
					continue
				}
				if ids[l.Node] == nil {
					ids[l.Node] = map[int64]bool{}
				}
				ids[l.Node][res[j].Repair.ID] = true
				if res[j].Opened {
					opened[l.Node]++
				}
			}
		})
	}
	wg.Wait()
	for _, n := range names {
		rs, _, err := s.ListRepairs(ctx, store.RepairFilter{Cluster: "c1", Node: n})
		if err != nil || len(rs) != 1 {
			t.Fatalf("%s: repairs %+v (%v), want one", n, rs, err)
		}
		if opened[n] != 1 || len(ids[n]) != 1 || !ids[n][rs[0].ID] {
			t.Errorf("%s: opened by %d writers, writers got repairs %v; want 1 and only %d", n, opened[n], ids[n], rs[0].ID)
		}
		if audit, err := s.RepairAudit(ctx, rs[0].ID); err != nil || len(audit) != 1 || audit[0].To != ledger.Detected {
			t.Errorf("%s: audit %+v (%v), want one detected entry", n, audit, err)
		}
		d, err := s.ActiveDiagnoses(ctx, "c1", n)
		if err != nil || len(d) != 1 || len(d[0].FindingIDs) != writers {
			t.Errorf("%s: diagnoses %+v (%v), want one with every writer's finding", n, d, err)
		}
	}
}

// TestReadNodesPerNode: in a group read each node gets its own newest
// findings (the limit is per node), its own repairs (a closed newest one
// is the last and none open, an open one both), also for one node name in
// two clusters; and a group of one reads what a larger group reads of it.
func TestReadNodesPerNode(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := open(t)
	for _, c := range []string{"c1", "c2"} {
		for _, n := range []string{"n1", "n2"} {
			var fs []finding.Finding
			for i, xid := range []int{79, 48, 94} {
				f := finding.Finding{Detector: finding.DetectorXid, Xid: xid, Node: n, BootID: "boot-" + c, Count: 1,
					Time: t0.Add(time.Duration(i) * time.Second), GPUPCI: "0000:02:00.0"}
				f.ID = finding.NewID(f)
				fs = append(fs, f)
			}
			if _, err := s.IngestReport(ctx, finding.Report{SchemaVersion: finding.SchemaVersion, Cluster: c, Node: n,
				BootID: "boot-" + c, Findings: fs}, t0); err != nil {
				t.Fatal(err)
			}
		}
	}
	closed := newRepair("n1", "gpu")
	closed.Cluster = "c2"
	first := mustOpen(t, s, closed, t0)
	step(t, s, first.ID, ledger.Detected, ledger.Resolved, t0.Add(time.Minute))
	openC1 := mustOpen(t, s, newRepair("n1", "gpu"), t0)
	metas := []store.Node{{Cluster: "c2", Name: "n1"}, {Cluster: "c1", Name: "n2"}, {Cluster: "c1", Name: "n1"}, {Cluster: "c2", Name: "n2"}}
	got, err := s.ReadNodes(ctx, metas, 2, t0.Add(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	for i, m := range metas {
		snap := got[i]
		if snap.Node.Cluster != m.Cluster || snap.Node.Name != m.Name || snap.Node.BootID != "boot-"+m.Cluster {
			t.Errorf("%s/%s: node %+v", m.Cluster, m.Name, snap.Node)
		}
		if len(snap.Findings) != 2 || snap.Findings[0].Xid != 48 || snap.Findings[1].Xid != 94 ||
			snap.Findings[0].Node != m.Name || snap.Findings[0].BootID != "boot-"+m.Cluster {
			t.Errorf("%s/%s: findings %+v, want its own newest two", m.Cluster, m.Name, snap.Findings)
		}
		one, err := s.ReadNodes(ctx, []store.Node{m}, 2, t0.Add(time.Hour))
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(one[0], snap) {
			t.Errorf("%s/%s: read alone %+v, in the group %+v", m.Cluster, m.Name, one[0], snap)
		}
	}
	if c2 := got[0]; c2.HasOpen || !c2.HasLast || c2.Last.ID != first.ID || c2.Last.State != ledger.Resolved {
		t.Errorf("c2/n1: open %v, last %v %+v; want only the closed one as last", c2.HasOpen, c2.HasLast, c2.Last)
	}
	if c1 := got[2]; !c1.HasOpen || !c1.HasLast || c1.Open.ID != openC1.ID || !reflect.DeepEqual(c1.Open, c1.Last) {
		t.Errorf("c1/n1: open %v %+v, last %v %+v; want its open repair as both", c1.HasOpen, c1.Open, c1.HasLast, c1.Last)
	}
	if got[1].HasOpen || got[1].HasLast || got[3].HasOpen || got[3].HasLast {
		t.Errorf("nodes without repairs read some: %+v, %+v", got[1], got[3])
	}
}

// normalResult is r without the IDs the sequences handed out.
func normalResult(r store.NodeLedgerResult) store.NodeLedgerResult {
	r.Diagnoses = normalDiagnoses(r.Diagnoses)
	r.Repair.ID = 0
	return r
}

func normalDiagnoses(ds []store.DiagnosisRecord) []store.DiagnosisRecord {
	out := make([]store.DiagnosisRecord, len(ds))
	for i, d := range ds {
		d.ID = 0
		out[i] = d
	}
	return out
}

// nodeRepairs returns the node's repairs, each with its audit entries and
// links, without their IDs.
func nodeRepairs(t *testing.T, s *store.Store, cluster, node string) []string {
	t.Helper()
	ctx := context.Background()
	rs, _, err := s.ListRepairs(ctx, store.RepairFilter{Cluster: cluster, Node: node})
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, r := range rs {
		audit, err := s.RepairAudit(ctx, r.ID)
		if err != nil {
			t.Fatal(err)
		}
		for i := range audit {
			audit[i].ID, audit[i].RepairID = 0, 0
		}
		r.ID = 0
		out = append(out, fmt.Sprintf("%+v %+v", r, audit))
	}
	return out
}

// nodeEvents returns the live-feed events after id, per cluster/node, in
// order, each as its type and data without the IDs.
func nodeEvents(t *testing.T, s *store.Store, after int64) map[string][]string {
	t.Helper()
	batch, err := s.EventsAfter(context.Background(), after, store.MaxEventsLimit)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string][]string{}
	for _, e := range batch.Events {
		var data map[string]any
		if err := json.Unmarshal(e.Data, &data); err != nil {
			t.Fatal(err)
		}
		for _, k := range []string{"id", "repairId", "auditId"} {
			delete(data, k)
		}
		doc, _ := json.Marshal(data) // sorted keys
		k := e.Cluster + "/" + e.Node
		out[k] = append(out[k], e.Type+" "+string(doc))
	}
	return out
}

// countEvents counts the events of nodeEvents of type typ whose data
// holds has.
func countEvents(evs []string, typ, has string) int {
	n := 0
	for _, e := range evs {
		if strings.HasPrefix(e, typ+" ") && strings.Contains(e, has) {
			n++
		}
	}
	return n
}
