package store_test

import (
	"context"
	"errors"
	"reflect"
	"strconv"
	"testing"
	"time"

	"github.com/fleetrepair/fleetrepair/controller/store"
)

// writeDiagnosis writes d as a reconcile of its node that diagnosed only d
// does (WriteNodeLedger: d upserted, the node's other active diagnoses
// deactivated) and returns the stored record and whether it was new.
func writeDiagnosis(ctx context.Context, s *store.Store, d store.DiagnosisRecord, now time.Time) (store.DiagnosisRecord, bool, error) {
	res, err := s.WriteNodeLedger(ctx, store.NodeLedger{Cluster: d.Cluster, Node: d.Node, Diagnoses: []store.DiagnosisRecord{d}}, now)
	if err != nil {
		return store.DiagnosisRecord{}, false, err
	}
	return res.Diagnoses[0], res.Created[0], nil
}

// TestDiagnosisLifecycle: a diagnosis is stored, merged by its key,
// deactivated and re-activated as the reconciler writes it
// (WriteNodeLedger).
func TestDiagnosisLifecycle(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := open(t)
	d := store.DiagnosisRecord{
		Cluster: "c1", Node: "n1", BootID: "boot-a", Reason: "GPUFallenOffBus", Severity: "condition",
		FaultClass: "accelerated-hardware", Action: "replace", ConditionType: "AcceleratedHardwareReady",
		CatalogVersion: "1", FirstSeen: t0, LastSeen: t0.Add(time.Second), FindingIDs: []string{"f1", "f2", "f1"},
		Detail: map[string]any{"message": "GPU 0000:3b:00.0 fell off the bus"},
	}
	got, created, err := writeDiagnosis(ctx, s, d, t0.Add(time.Minute))
	if err != nil || !created {
		t.Fatalf("first upsert: created %v, %v", created, err)
	}
	if !got.Active || !reflect.DeepEqual(got.FindingIDs, []string{"f1", "f2"}) || !got.FirstSeen.Equal(t0) ||
		got.Detail["message"] == nil || !got.EventRecordedAt.IsZero() {
		t.Fatalf("first upsert stored %+v", got)
	}
	if err := s.MarkEventRecorded(ctx, got.ID, t0.Add(time.Minute)); err != nil {
		t.Fatal(err)
	}

	// Same key again: merged, widened, still one row.
	d.FirstSeen, d.LastSeen, d.FindingIDs = t0.Add(-time.Minute), t0.Add(time.Hour), []string{"f2", "f3"}
	d.Action = "reboot"
	again, created, err := writeDiagnosis(ctx, s, d, t0.Add(time.Hour))
	if err != nil || created || again.ID != got.ID {
		t.Fatalf("second upsert: id %d (first %d), created %v, %v", again.ID, got.ID, created, err)
	}
	if !reflect.DeepEqual(again.FindingIDs, []string{"f1", "f2", "f3"}) || !again.FirstSeen.Equal(t0.Add(-time.Minute)) ||
		!again.LastSeen.Equal(t0.Add(time.Hour)) || again.Action != "reboot" || !again.EventRecordedAt.Equal(t0.Add(time.Minute)) {
		t.Fatalf("second upsert stored %+v", again)
	}

	// A second diagnosis on the node, written with the first as a
	// reconcile writes its whole verdict.
	res, err := s.WriteNodeLedger(ctx, store.NodeLedger{Cluster: "c1", Node: "n1", Diagnoses: []store.DiagnosisRecord{d,
		{Cluster: "c1", Node: "n1", BootID: "boot-a", Reason: "PCIeAERFatal", Severity: "event"}}}, t0.Add(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	other := res.Diagnoses[1]
	if !other.FirstSeen.Equal(t0.Add(time.Hour)) || other.FindingIDs != nil {
		t.Errorf("defaults: %+v", other)
	}
	active, _ := s.ActiveDiagnoses(ctx, "c1", "n1")
	if len(active) != 2 {
		t.Fatalf("%d active diagnoses, want 2", len(active))
	}

	// The latest evaluation keeps only the first.
	n, err := s.DeactivateDiagnoses(ctx, "c1", "n1", []int64{got.ID}, t0.Add(2*time.Hour))
	if err != nil || n != 1 {
		t.Fatalf("deactivate: %d, %v; want 1", n, err)
	}
	active, _ = s.ActiveDiagnoses(ctx, "c1", "")
	if len(active) != 1 || active[0].ID != got.ID {
		t.Fatalf("active after deactivate: %+v", active)
	}
	if n, _ := s.DeactivateDiagnoses(ctx, "c1", "n1", nil, t0.Add(3*time.Hour)); n != 1 {
		t.Fatalf("deactivate all: %d, want 1", n)
	}

	// Coming back re-activates it and asks for a new Event.
	back, created, err := writeDiagnosis(ctx, s, d, t0.Add(4*time.Hour))
	if err != nil || created || !back.Active || !back.EventRecordedAt.IsZero() {
		t.Fatalf("re-activated: %+v created %v, %v", back, created, err)
	}

	hist, err := s.DiagnosesForNode(ctx, "c1", "n1", 10)
	if err != nil || len(hist) != 2 || hist[0].ID != other.ID {
		// other.LastSeen (t0+1h) equals back.LastSeen; ties go to the higher id.
		t.Fatalf("DiagnosesForNode: %+v, %v", hist, err)
	}
	if err := s.MarkEventRecorded(ctx, 999999, t0); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("MarkEventRecorded(missing) = %v, want ErrNotFound", err)
	}
	if _, _, err := writeDiagnosis(ctx, s, store.DiagnosisRecord{Cluster: "c1", Node: "n1"}, t0); !errors.Is(err, store.ErrInvalid) {
		t.Errorf("a diagnosis without a reason = %v, want ErrInvalid", err)
	}
	if _, err := s.WriteNodeLedger(ctx, store.NodeLedger{Cluster: "c1", Node: "n1", Diagnoses: []store.DiagnosisRecord{{Cluster: "c1", Node: "n2",
		Reason: "XidEvent", Severity: "event"}}}, t0); !errors.Is(err, store.ErrInvalid) {
		t.Errorf("a diagnosis of another node = %v, want ErrInvalid", err)
	}
}

func TestDiagnosisFindingIDsBounded(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := open(t)
	d := store.DiagnosisRecord{Cluster: "c1", Node: "n1", Reason: "PCIeAERCorrectable", Severity: "event"}
	var last store.DiagnosisRecord
	for batch := range 3 {
		d.FindingIDs = nil
		for i := range 600 {
			d.FindingIDs = append(d.FindingIDs, string(rune('a'+batch))+"-"+strconv.Itoa(i))
		}
		var err error
		if last, _, err = writeDiagnosis(ctx, s, d, t0); err != nil {
			t.Fatal(err)
		}
	}
	if len(last.FindingIDs) != store.MaxDiagnosisFindings {
		t.Fatalf("%d finding IDs kept, want %d", len(last.FindingIDs), store.MaxDiagnosisFindings)
	}
	// The newest are kept, oldest first.
	if last.FindingIDs[len(last.FindingIDs)-1] != "c-599" || last.FindingIDs[0] != "b-200" {
		t.Fatalf("kept %s .. %s, want b-200 .. c-599", last.FindingIDs[0], last.FindingIDs[len(last.FindingIDs)-1])
	}
}
