package store_test

import (
	"context"
	"errors"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fleetrepair/fleetrepair/agent/finding"
	"github.com/fleetrepair/fleetrepair/controller/ledger"
	"github.com/fleetrepair/fleetrepair/controller/store"
)

// TestReadNode: ReadNode records the node's Kubernetes facts and returns,
// in one batch, exactly what the single-purpose reads return: the stored
// node (GetNode), its open repair (OpenRepairForNode), its newest repair
// (ListRepairs, limit 1), its newest findings (FindingsForNode) and the
// breaker state (BreakerState).
func TestReadNode(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := open(t)
	meta := store.Node{Cluster: "c-new", Name: "n1", NodePool: "gpu", Zone: "z1", InstanceType: "p5.48xlarge",
		NodeClaim: "claim-n1", Labels: map[string]string{"rack": "r7"}}

	// A cluster and node never seen: both rows created, nothing else.
	snap, err := s.ReadNode(ctx, meta, 0, t0)
	if err != nil {
		t.Fatal(err)
	}
	if snap.Node.Cluster != "c-new" || snap.Node.Name != "n1" || snap.Node.NodePool != "gpu" || snap.Node.Zone != "z1" ||
		snap.Node.NodeClaim != "claim-n1" || snap.Node.Labels["rack"] != "r7" || snap.Node.BootID != "" {
		t.Fatalf("new node read as %+v", snap.Node)
	}
	if snap.HasOpen || snap.HasLast || len(snap.Findings) != 0 || snap.Breakers != nil || snap.BreakerVersion != 0 {
		t.Fatalf("a new node's snapshot has %+v", snap)
	}

	// The agent reports three findings; one repair closed, a second open;
	// the breakers saved once.
	meta.Cluster = "c1"
	var fs []finding.Finding
	for i, xid := range []int{79, 48, 94} {
		f := finding.Finding{Detector: finding.DetectorXid, Xid: xid, Node: "n1", BootID: "boot-a", Count: 1,
			Time: t0.Add(time.Duration(i) * time.Second), GPUPCI: "0000:02:00.0"}
		f.ID = finding.NewID(f)
		fs = append(fs, f)
	}
	if _, err := s.IngestReport(ctx, finding.Report{SchemaVersion: finding.SchemaVersion, Cluster: "c1", Node: "n1",
		BootID: "boot-a", Findings: fs, Heartbeat: &finding.Heartbeat{DriverVersion: "550.54.15"}}, t0); err != nil {
		t.Fatal(err)
	}
	first := mustOpen(t, s, newRepair("n1", "gpu"), t0)
	step(t, s, first.ID, ledger.Detected, ledger.Resolved, t0.Add(time.Minute))
	second := mustOpen(t, s, newRepair("n1", "gpu"), t0.Add(2*time.Minute))
	if err := s.SaveBreakerState(ctx, []byte(`{"killSwitch":{"on":false}}`), 0, nil, t0); err != nil {
		t.Fatal(err)
	}

	now := t0.Add(3 * time.Minute)
	snap, err = s.ReadNode(ctx, meta, 0, now)
	if err != nil {
		t.Fatal(err)
	}
	node, err := s.GetNode(ctx, "c1", "n1")
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(snap.Node, node) || node.BootID != "boot-a" || node.DriverVersion != "550.54.15" ||
		node.NodeClaim != "claim-n1" || !node.UpdatedAt.Equal(now) {
		t.Errorf("node: snapshot %+v, stored %+v", snap.Node, node)
	}
	open, err := s.OpenRepairForNode(ctx, "c1", "n1")
	if err != nil {
		t.Fatal(err)
	}
	if !snap.HasOpen || !reflect.DeepEqual(snap.Open, open) || open.ID != second.ID {
		t.Errorf("open repair: snapshot %v %+v, stored %+v", snap.HasOpen, snap.Open, open)
	}
	last, _, err := s.ListRepairs(ctx, store.RepairFilter{Cluster: "c1", Node: "n1", Limit: 1})
	if err != nil {
		t.Fatal(err)
	}
	if !snap.HasLast || !reflect.DeepEqual(snap.Last, last[0]) || last[0].ID != second.ID {
		t.Errorf("last repair: snapshot %v %+v, listed %+v", snap.HasLast, snap.Last, last[0])
	}
	want, err := s.FindingsForNode(ctx, "c1", "n1", time.Time{}, 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(want) != 3 || !reflect.DeepEqual(snap.Findings, want) {
		t.Errorf("findings: snapshot %+v, stored %+v", snap.Findings, want)
	}
	doc, v, err := s.BreakerState(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if v != 1 || snap.BreakerVersion != v || string(snap.Breakers) != string(doc) {
		t.Errorf("breakers: snapshot %s v%d, stored %s v%d", snap.Breakers, snap.BreakerVersion, doc, v)
	}

	// The limit keeps the newest findings; a closed newest repair is
	// the last one, and no open one is reported.
	step(t, s, second.ID, ledger.Detected, ledger.Resolved, now)
	snap, err = s.ReadNode(ctx, meta, 2, now)
	if err != nil {
		t.Fatal(err)
	}
	if len(snap.Findings) != 2 || snap.Findings[0].ID != fs[1].ID || snap.Findings[1].ID != fs[2].ID {
		t.Errorf("limit 2 read %+v", snap.Findings)
	}
	if snap.HasOpen || !snap.HasLast || snap.Last.ID != second.ID || snap.Last.State != ledger.Resolved {
		t.Errorf("after close: open %v, last %v %+v", snap.HasOpen, snap.HasLast, snap.Last)
	}

	if _, err := s.ReadNode(ctx, store.Node{Cluster: "c1"}, 0, now); !errors.Is(err, store.ErrInvalid) {
		t.Errorf("no node name: %v, want ErrInvalid", err)
	}
}

// TestWriteNodeLedger: diagnoses upserted, the others deactivated, a
// repair opened with its audit entry, finding links and live-feed event, or
// the open one returned; findings linked to an open repair; all or
// nothing; concurrent writers for one node open exactly one repair.
func TestWriteNodeLedger(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := open(t)
	diag := func(reason, severity string, ids ...string) store.DiagnosisRecord {
		return store.DiagnosisRecord{Cluster: "c1", Node: "n1", BootID: "boot-a", Reason: reason, Severity: severity,
			FaultClass: "accelerated-hardware", Action: "replace", FirstSeen: t0, LastSeen: t0, FindingIDs: ids,
			Detail: map[string]any{"message": reason}}
	}
	toOpen := newRepair("n1", "gpu")
	toOpen.FindingIDs = []string{"f2", "f1"}
	toOpen.TolerationStartedAt, toOpen.TolerationUntil = t0, t0.Add(time.Hour)
	_, before, err := s.EventBounds(ctx)
	if err != nil {
		t.Fatal(err)
	}

	res, err := s.WriteNodeLedger(ctx, store.NodeLedger{Cluster: "c1", Node: "n1",
		Diagnoses: []store.DiagnosisRecord{diag("GPUFallenOffBus", "condition", "f1", "f2"), diag("PCIeAERFatal", "event", "f3")},
		Open:      &toOpen, Actor: "controller", Reason: "GPU fell off the bus"}, t0)
	if err != nil {
		t.Fatal(err)
	}
	if !res.Opened || res.Repair.ID == 0 || res.Repair.State != ledger.Detected || !reflect.DeepEqual(res.Repair.FindingIDs, []string{"f1", "f2"}) ||
		!res.Repair.TolerationUntil.Equal(t0.Add(time.Hour)) {
		t.Fatalf("first write opened %v: %+v", res.Opened, res.Repair)
	}
	if len(res.Diagnoses) != 2 || !res.Created[0] || !res.Created[1] || !res.Diagnoses[0].Active ||
		!reflect.DeepEqual(res.Diagnoses[0].FindingIDs, []string{"f1", "f2"}) || res.Diagnoses[1].Reason != "PCIeAERFatal" {
		t.Fatalf("first write stored %+v (created %v)", res.Diagnoses, res.Created)
	}
	stored, err := s.OpenRepairForNode(ctx, "c1", "n1")
	if err != nil || !reflect.DeepEqual(stored, res.Repair) {
		t.Fatalf("open repair stored %+v (%v), returned %+v", stored, err, res.Repair)
	}
	audit, err := s.RepairAudit(ctx, res.Repair.ID)
	if err != nil || len(audit) != 1 || audit[0].From != "" || audit[0].To != ledger.Detected || audit[0].Actor != "controller" ||
		audit[0].Reason != "GPU fell off the bus" || !audit[0].At.Equal(t0) {
		t.Fatalf("audit %+v (%v)", audit, err)
	}
	evs, err := s.EventsAfter(ctx, before, 100)
	if err != nil {
		t.Fatal(err)
	}
	repairEvents := 0
	for _, e := range evs.Events {
		if e.Type == "repair" && e.Cluster == "c1" && e.Node == "n1" {
			repairEvents++
		}
	}
	if repairEvents != 1 {
		t.Errorf("%d live-feed events for the opened repair, want 1: %+v", repairEvents, evs.Events)
	}

	// Again with one diagnosis: the other is deactivated, the same row
	// updated, nothing new opened.
	again := diag("GPUFallenOffBus", "condition", "f4")
	res2, err := s.WriteNodeLedger(ctx, store.NodeLedger{Cluster: "c1", Node: "n1", Diagnoses: []store.DiagnosisRecord{again},
		Open: &toOpen, Actor: "controller", Reason: "again"}, t0.Add(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	if res2.Opened || res2.Repair.ID != res.Repair.ID || res2.Created[0] || res2.Diagnoses[0].ID != res.Diagnoses[0].ID ||
		!reflect.DeepEqual(res2.Diagnoses[0].FindingIDs, []string{"f1", "f2", "f4"}) {
		t.Fatalf("second write: opened %v repair %d, diagnosis %+v (created %v)", res2.Opened, res2.Repair.ID, res2.Diagnoses[0], res2.Created)
	}
	active, err := s.ActiveDiagnoses(ctx, "c1", "n1")
	if err != nil || len(active) != 1 || active[0].Reason != "GPUFallenOffBus" {
		t.Fatalf("active after the second write: %+v (%v)", active, err)
	}
	if audit, _ := s.RepairAudit(ctx, res.Repair.ID); len(audit) != 1 {
		t.Errorf("the repair found open got %d audit entries, want 1", len(audit))
	}

	// Findings linked to the open repair.
	if _, err := s.WriteNodeLedger(ctx, store.NodeLedger{Cluster: "c1", Node: "n1", Diagnoses: []store.DiagnosisRecord{again},
		LinkTo: res.Repair.ID, LinkFindings: []string{"f4", "f1", ""}}, t0.Add(2*time.Minute)); err != nil {
		t.Fatal(err)
	}
	if got, _ := s.GetRepair(ctx, res.Repair.ID); !reflect.DeepEqual(got.FindingIDs, []string{"f1", "f2", "f4"}) {
		t.Errorf("linked findings %v, want f1 f2 f4", got.FindingIDs)
	}

	// All or nothing: a link to a repair that does not exist fails the
	// batch, and its new diagnosis is not stored.
	if _, err := s.WriteNodeLedger(ctx, store.NodeLedger{Cluster: "c1", Node: "n1",
		Diagnoses: []store.DiagnosisRecord{again, diag("XidNVLinkError", "event")}, LinkTo: 1 << 40, LinkFindings: []string{"f9"}},
		t0.Add(3*time.Minute)); err == nil {
		t.Fatal("a link to a missing repair was written")
	}
	if active, _ := s.ActiveDiagnoses(ctx, "c1", "n1"); len(active) != 1 {
		t.Errorf("a failed write left %d active diagnoses, want 1: %+v", len(active), active)
	}

	// Refused input, nothing written.
	other := diag("GPUFallenOffBus", "condition")
	other.Node = "n2"
	for name, w := range map[string]store.NodeLedger{
		"no node":            {Cluster: "c1"},
		"another node's":     {Cluster: "c1", Node: "n1", Diagnoses: []store.DiagnosisRecord{other}},
		"repair of another":  {Cluster: "c1", Node: "n1", Open: &store.Repair{Cluster: "c1", Node: "n2", Reason: "X"}, Actor: "controller"},
		"repair, no actor":   {Cluster: "c1", Node: "n1", Open: &store.Repair{Cluster: "c1", Node: "n1", Reason: "X"}},
		"diagnosis, no code": {Cluster: "c1", Node: "n1", Diagnoses: []store.DiagnosisRecord{{Cluster: "c1", Node: "n1"}}},
	} {
		if _, err := s.WriteNodeLedger(ctx, w, t0); !errors.Is(err, store.ErrInvalid) {
			t.Errorf("%s: %v, want ErrInvalid", name, err)
		}
	}

	// Concurrent first writes for one node: one opens, every writer gets
	// that repair.
	s = openWide(t, 16)
	const writers = 12
	var (
		wg     sync.WaitGroup
		mu     sync.Mutex
		opened int
		ids    = map[int64]bool{}
	)
	for i := range writers {
		wg.Go(func() {
			r := newRepair("n3", "gpu")
			d := diag("GPUFallenOffBus", "condition")
			d.Node = "n3"
			res, err := s.WriteNodeLedger(ctx, store.NodeLedger{Cluster: "c1", Node: "n3", Diagnoses: []store.DiagnosisRecord{d},
				Open: &r, Actor: "controller", Reason: "writer"}, t0.Add(time.Duration(i)*time.Millisecond))
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				t.Errorf("writer %d: %v", i, err)
				return
			}
			ids[res.Repair.ID] = true
			if res.Opened {
				opened++
			}
		})
	}
	wg.Wait()
	if opened != 1 || len(ids) != 1 {
		t.Fatalf("%d writers opened a repair, %d distinct repairs returned; want 1 and 1", opened, len(ids))
	}
}

// TestListNodeVersions: the versions of every node of every cluster, as
// ListNodes returns them, and nothing else.
func TestListNodeVersions(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := open(t)
	for i, n := range []struct{ cluster, node, driver, kernel string }{
		{"c2", "a", "550.54.15", "6.8.0"}, {"c1", "b", "535.183.01", ""}, {"c1", "a", "", ""},
	} {
		var hb *finding.Heartbeat
		if n.driver != "" || n.kernel != "" {
			hb = &finding.Heartbeat{DriverVersion: n.driver, KernelVersion: n.kernel, GPUCount: 8}
		}
		if _, err := s.IngestReport(ctx, finding.Report{SchemaVersion: finding.SchemaVersion, Cluster: n.cluster, Node: n.node,
			BootID: "boot-a", Heartbeat: hb}, t0.Add(time.Duration(i)*time.Second)); err != nil {
			t.Fatal(err)
		}
	}
	all, err := s.ListNodes(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	got, err := s.ListNodeVersions(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var want []store.Node
	for _, n := range all {
		want = append(want, store.Node{Cluster: n.Cluster, Name: n.Name, DriverVersion: n.DriverVersion, KernelVersion: n.KernelVersion})
	}
	if len(want) != 3 || !reflect.DeepEqual(got, want) || got[2].DriverVersion != "550.54.15" || got[2].KernelVersion != "6.8.0" {
		t.Fatalf("ListNodeVersions = %+v, want %+v", got, want)
	}
}

// TestReadNodes: several nodes in one batch read exactly what ReadNode
// reads of each, in order; a node named twice is refused.
func TestReadNodes(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := open(t)
	if _, err := s.IngestReport(ctx, finding.Report{SchemaVersion: finding.SchemaVersion, Cluster: "c1", Node: "n2",
		BootID: "boot-b", Heartbeat: &finding.Heartbeat{DriverVersion: "550.54.15"}}, t0); err != nil {
		t.Fatal(err)
	}
	open := mustOpen(t, s, newRepair("n2", "gpu"), t0)
	if err := s.SaveBreakerState(ctx, []byte(`{"killSwitch":{"on":false}}`), 0, nil, t0); err != nil {
		t.Fatal(err)
	}
	metas := []store.Node{{Cluster: "c1", Name: "n1", NodePool: "gpu", Zone: "z1"}, {Cluster: "c1", Name: "n2", NodePool: "gpu", Zone: "z2"},
		{Cluster: "c-other", Name: "n1", NodePool: "cpu", Zone: "z9"}}
	got, err := s.ReadNodes(ctx, metas, 0, t0)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 3 {
		t.Fatalf("%d snapshots for 3 nodes", len(got))
	}
	for i, m := range metas {
		alone, err := s.ReadNode(ctx, m, 0, t0)
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(got[i], alone) {
			t.Errorf("node %s/%s in a group read %+v, alone %+v", m.Cluster, m.Name, got[i], alone)
		}
	}
	if got[1].Node.BootID != "boot-b" || !got[1].HasOpen || got[1].Open.ID != open.ID || got[0].HasOpen || got[2].Node.NodePool != "cpu" ||
		got[0].BreakerVersion == 0 || got[2].BreakerVersion != got[0].BreakerVersion {
		t.Errorf("group read %+v", got)
	}
	if _, err := s.ReadNodes(ctx, []store.Node{metas[0], metas[0]}, 0, t0); !errors.Is(err, store.ErrInvalid) {
		t.Errorf("a node named twice: %v, want ErrInvalid", err)
	}
	if _, err := s.ReadNodes(ctx, []store.Node{metas[0], {Cluster: "c1"}}, 0, t0); !errors.Is(err, store.ErrInvalid) {
		t.Errorf("a node without a name: %v, want ErrInvalid", err)
	}
}

// TestWriteNodeLedgers: a group of nodes written in one transaction, each
// with WriteNodeLedger's outcome; one node whose write fails (a link to a
// repair that does not exist) or whose input is refused costs only that
// node: the others' repairs open, exactly once (a second write of the
// group opens nothing new), with one audit entry each, and the failed
// node keeps nothing of its write.
func TestWriteNodeLedgers(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := open(t)
	ledgerOf := func(node string) store.NodeLedger {
		rp := newRepair(node, "gpu")
		rp.FindingIDs = []string{"f-" + node}
		return store.NodeLedger{Cluster: "c1", Node: node, Open: &rp, Actor: "controller", Reason: "GPU fell off the bus",
			Diagnoses: []store.DiagnosisRecord{{Cluster: "c1", Node: node, BootID: "boot-a", Reason: "GPUFallenOffBus", Severity: "condition",
				FaultClass: "accelerated-hardware", Action: "replace", FirstSeen: t0, LastSeen: t0, FindingIDs: []string{"f-" + node}}}}
	}
	bad := ledgerOf("n-bad")
	bad.Open, bad.LinkTo, bad.LinkFindings = nil, 1<<40, []string{"f9"} // fails in PostgreSQL (foreign key)
	refused := ledgerOf("n-refused")
	refused.Diagnoses[0].Node = "n-elsewhere" // ErrInvalid before anything is sent
	group := []store.NodeLedger{ledgerOf("n1"), bad, ledgerOf("n2"), refused, ledgerOf("n3")}

	for round, wantOpened := range []bool{true, false} {
		res, errs := s.WriteNodeLedgers(ctx, group, t0.Add(time.Duration(round)*time.Minute))
		if len(res) != len(group) || len(errs) != len(group) {
			t.Fatalf("round %d: %d results, %d errors for %d nodes", round, len(res), len(errs), len(group))
		}
		if errs[1] == nil || !strings.Contains(errs[1].Error(), "repair_findings_repair_id_fkey") {
			t.Errorf("round %d: the node linking to a missing repair: %v, want its foreign key error", round, errs[1])
		}
		if !errors.Is(errs[3], store.ErrInvalid) {
			t.Errorf("round %d: the refused node: %v, want ErrInvalid", round, errs[3])
		}
		for _, i := range []int{0, 2, 4} {
			node := group[i].Node
			if errs[i] != nil {
				t.Fatalf("round %d: %s: %v", round, node, errs[i])
			}
			if res[i].Opened != wantOpened || res[i].Repair.ID == 0 || res[i].Repair.Node != node || len(res[i].Diagnoses) != 1 ||
				res[i].Diagnoses[0].Node != node || res[i].Created[0] != wantOpened {
				t.Errorf("round %d: %s: opened %v (want %v), %+v", round, node, res[i].Opened, wantOpened, res[i])
			}
			rs, _, err := s.ListRepairs(ctx, store.RepairFilter{Cluster: "c1", Node: node})
			if err != nil || len(rs) != 1 || rs[0].ID != res[i].Repair.ID {
				t.Fatalf("round %d: %s has repairs %+v (%v), want exactly %d", round, node, rs, err, res[i].Repair.ID)
			}
			if audit, err := s.RepairAudit(ctx, rs[0].ID); err != nil || len(audit) != 1 || audit[0].To != ledger.Detected {
				t.Errorf("round %d: %s audit %+v (%v), want one detected entry", round, node, audit, err)
			}
		}
	}
	for _, node := range []string{"n-bad", "n-refused", "n-elsewhere"} {
		if active, err := s.ActiveDiagnoses(ctx, "c1", node); err != nil || len(active) != 0 {
			t.Errorf("%s: a failed or refused write left diagnoses %+v (%v)", node, active, err)
		}
	}
	if _, errs := s.WriteNodeLedgers(ctx, []store.NodeLedger{ledgerOf("n4"), ledgerOf("n4")}, t0); errs[0] != nil || !errors.Is(errs[1], store.ErrInvalid) {
		t.Errorf("a node named twice: %v, want nil and ErrInvalid", errs)
	}
}
