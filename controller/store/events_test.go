package store_test

import (
	"context"
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/fleetrepair/fleetrepair/controller/ledger"
	"github.com/fleetrepair/fleetrepair/controller/store"
)

// eventsAfter reads every event after id.
func eventsAfter(t *testing.T, s *store.Store, id int64) []store.Event {
	t.Helper()
	b, err := s.EventsAfter(context.Background(), id, store.MaxEventsLimit)
	if err != nil {
		t.Fatal(err)
	}
	if b.XMin == 0 || b.XMax < b.XMin {
		t.Fatalf("snapshot horizon xmin %d xmax %d", b.XMin, b.XMax)
	}
	return b.Events
}

func eventData(t *testing.T, e store.Event) map[string]any {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal(e.Data, &m); err != nil {
		t.Fatalf("event %d data %s: %v", e.ID, e.Data, err)
	}
	return m
}

// The triggers write one event per repair transition, per diagnosis that
// appears, deactivates or changes severity (not per re-diagnosis), per node
// health flip, and per breaker decision, with increasing ids and the source
// rows' times.
func TestEventsWrittenByTriggers(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := open(t)
	if evs := eventsAfter(t, s, 0); len(evs) != 0 {
		t.Fatalf("fresh database has events %v", evs)
	}

	r := mustOpen(t, s, newRepair("n1", "gpu"), t0)
	step(t, s, r.ID, ledger.Detected, ledger.Quarantined, t0.Add(time.Second))

	d := store.DiagnosisRecord{Cluster: "c1", Node: "n1", Reason: "GPUFallenOffBus", Severity: "condition", Action: "replace", FindingIDs: []string{"f1"}}
	got, _, err := writeDiagnosis(ctx, s, d, t0.Add(2*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	d.FindingIDs = []string{"f2"} // re-diagnosis: no news
	if _, _, err := writeDiagnosis(ctx, s, d, t0.Add(3*time.Second)); err != nil {
		t.Fatal(err)
	}
	ev := store.DiagnosisRecord{Cluster: "c1", Node: "n1", Reason: "XidEvent", Severity: "event", FindingIDs: []string{"f3"}}
	if _, err := s.WriteNodeLedger(ctx, store.NodeLedger{Cluster: "c1", Node: "n1", Diagnoses: []store.DiagnosisRecord{d, ev}}, t0.Add(4*time.Second)); err != nil {
		t.Fatal(err)
	}
	if _, err := s.DeactivateDiagnoses(ctx, "c1", "n1", nil, t0.Add(5*time.Second)); err != nil {
		t.Fatal(err)
	}
	if err := s.SaveBreakerState(ctx, json.RawMessage(`{}`), 0, []store.BreakerDecision{{At: t0.Add(6 * time.Second), Scope: "cohort",
		Cohort: "zone=z1", From: "closed", To: "open", Cause: "cohort-failure-rate", Actor: "controller", Evidence: json.RawMessage(`{"failing":6}`)}}, t0.Add(6*time.Second)); err != nil {
		t.Fatal(err)
	}

	evs := eventsAfter(t, s, 0)
	type want struct {
		typ, key, val string
		at            time.Duration
	}
	wants := []want{
		{store.EventRepair, "to", "detected", 0},
		{store.EventRepair, "to", "quarantined", time.Second},
		{store.EventDiagnosis, "reason", "GPUFallenOffBus", 2 * time.Second},
		{store.EventNode, "health", "failing", 2 * time.Second},
		{store.EventDiagnosis, "reason", "XidEvent", 4 * time.Second},
		// The deactivation: one diagnosis event per row, and the node's flip
		// back to ok once its last condition is gone.
		{store.EventDiagnosis, "active", "false", 5 * time.Second},
		{store.EventNode, "health", "ok", 5 * time.Second},
		{store.EventDiagnosis, "active", "false", 5 * time.Second},
		{store.EventBreaker, "cohort", "zone=z1", 6 * time.Second},
	}
	if len(evs) != len(wants) {
		for _, e := range evs {
			t.Logf("event %d %s %s", e.ID, e.Type, e.Data)
		}
		t.Fatalf("%d events, want %d", len(evs), len(wants))
	}
	var prev int64
	nodeEvents := 0
	for i, w := range wants {
		e := evs[i]
		m := eventData(t, e)
		if e.Type == store.EventNode {
			nodeEvents++
		}
		// Deactivation order between the two rows is the database's.
		if e.Type != w.typ || (w.key != "active" && toString(m[w.key]) != w.val) || (w.key == "active" && m["active"] != false) {
			t.Errorf("event %d = %s %s, want %s with %s=%s", i, e.Type, e.Data, w.typ, w.key, w.val)
		}
		if !e.At.Equal(t0.Add(w.at)) {
			t.Errorf("event %d at %s, want %s", i, e.At, t0.Add(w.at))
		}
		if e.ID <= prev {
			t.Errorf("event ids not increasing: %d after %d", e.ID, prev)
		}
		prev = e.ID
		if e.Type != store.EventBreaker && (e.Cluster != "c1" || e.Node != "n1") {
			t.Errorf("event %d names %s/%s, want c1/n1", i, e.Cluster, e.Node)
		}
	}
	if m := eventData(t, evs[0]); m["repairId"] != float64(r.ID) || m["actor"] != "controller" {
		t.Errorf("repair event data %v, want repairId %d and the actor", m, r.ID)
	}
	if m := eventData(t, evs[3]); m["reason"] != got.Reason {
		t.Errorf("node event data %v, want the reason that made it fail", m)
	}

	oldest, newest, err := s.EventBounds(ctx)
	if err != nil || oldest != evs[0].ID || newest != evs[len(evs)-1].ID {
		t.Errorf("EventBounds = %d, %d, %v; want %d, %d", oldest, newest, err, evs[0].ID, evs[len(evs)-1].ID)
	}
	if after := eventsAfter(t, s, evs[4].ID); len(after) != 4 || after[0].ID != evs[5].ID {
		t.Errorf("EventsAfter(%d) = %d events, want the last 4", evs[4].ID, len(after))
	}
	n, err := s.DeleteEventsBefore(ctx, t0.Add(2*time.Second))
	if err != nil || n != 2 {
		t.Errorf("DeleteEventsBefore = %d, %v; want the 2 repair events", n, err)
	}
	if _, err := s.EventsAfter(ctx, 0, 0); !errors.Is(err, store.ErrInvalid) {
		t.Errorf("EventsAfter limit 0: %v, want ErrInvalid", err)
	}
}

func toString(v any) string {
	if s, ok := v.(string); ok {
		return s
	}
	b, _ := json.Marshal(v)
	return string(b)
}

// ListenEvents is woken by every committed change, on any connection.
func TestListenEvents(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	s := open(t)
	woke, ready := make(chan struct{}, 16), make(chan struct{}, 1)
	go func() {
		_ = s.ListenEvents(ctx, func() { woke <- struct{}{} }, func(time.Time) { ready <- struct{}{} }, func(err error) { t.Log(err) })
	}()
	select {
	case <-ready:
	case <-time.After(30 * time.Second):
		t.Fatal("listener did not connect")
	}
	mustOpen(t, s, newRepair("n1", "gpu"), t0)
	select {
	case <-woke:
	case <-time.After(30 * time.Second):
		t.Fatal("no notification after a repair opened")
	}
}
