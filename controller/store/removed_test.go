package store_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/fleetrepair/fleetrepair/controller/store"
)

// A replaced node (its Kubernetes Node deleted, MarkNodeRemoved) leaves the
// fleet counts, the agent gauges and the node list, keeps its row for its
// history, and comes back when its Node reappears or its agent reports
// after the removal.
func TestRemovedNodesLeaveTheFleet(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := open(t)
	for _, n := range []string{"n1", "n2", "n3"} {
		if _, err := s.ReadNode(ctx, store.Node{Cluster: "c1", Name: n, NodePool: "gpu"}, 1, t0); err != nil {
			t.Fatal(err)
		}
		if _, err := s.IngestReport(ctx, report("c1", n, "boot-a", 1, t0), t0); err != nil {
			t.Fatal(err)
		}
	}
	// n2 and n3 are replaced 10 minutes later: their agents went silent.
	removed := t0.Add(10 * time.Minute)
	for _, n := range []string{"n2", "n3"} {
		if err := s.MarkNodeRemoved(ctx, "c1", n, removed); err != nil {
			t.Fatal(err)
		}
	}
	// Marking again keeps the first removal time.
	if err := s.MarkNodeRemoved(ctx, "c1", "n2", removed.Add(time.Hour)); err != nil {
		t.Fatal(err)
	}
	now := t0.Add(time.Hour)
	stale := now.Add(-90 * time.Second)

	sum, err := s.FleetSummary(ctx, stale)
	if err != nil {
		t.Fatal(err)
	}
	if len(sum) != 1 || sum[0].Nodes != 1 || sum[0].Silent != 1 {
		t.Fatalf("fleet summary %+v: want 1 node in NodePool gpu (n1, silent), removed nodes not counted", sum)
	}
	acs, err := s.AgentCounts(ctx, stale, now.Add(-24*time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	if len(acs) != 1 || acs[0].Silent != 1 || acs[0].Reporting != 0 {
		t.Fatalf("agent counts %+v: want 1 silent (n1), removed nodes not counted", acs)
	}
	names := func(f store.NodeFilter) []string {
		t.Helper()
		rows, _, err := s.NodePage(ctx, f)
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, r := range rows {
			out = append(out, r.Name)
		}
		return out
	}
	if got := names(store.NodeFilter{Health: store.NodeHealthAttention, StaleBefore: stale}); len(got) != 1 || got[0] != "n1" {
		t.Fatalf("attention nodes %v: want [n1]", got)
	}
	if got := names(store.NodeFilter{IncludeRemoved: true}); len(got) != 3 {
		t.Fatalf("nodes with the removed %v: want n1, n2, n3", got)
	}
	n2, err := s.GetNode(ctx, "c1", "n2")
	if err != nil {
		t.Fatal(err)
	}
	if !n2.Removed() || !n2.RemovedAt.Equal(removed) {
		t.Fatalf("n2 removed %v at %v: want removed at %v (its first removal), row kept", n2.Removed(), n2.RemovedAt, removed)
	}

	// n2's Node reappears (the reconciler records its Kubernetes facts);
	// n3's agent reports again after the removal.
	if _, err := s.ReadNode(ctx, store.Node{Cluster: "c1", Name: "n2", NodePool: "gpu"}, 1, now); err != nil {
		t.Fatal(err)
	}
	if _, err := s.IngestReport(ctx, report("c1", "n3", "boot-b", 1, now), now); err != nil {
		t.Fatal(err)
	}
	if got := names(store.NodeFilter{}); len(got) != 3 {
		t.Fatalf("nodes after n2 reappeared and n3 reported %v: want n1, n2, n3", got)
	}
	for _, n := range []string{"n2", "n3"} {
		if nd, _ := s.GetNode(ctx, "c1", n); nd.Removed() {
			t.Fatalf("%s is still removed: %+v", n, nd)
		}
	}
	if sum, _ = s.FleetSummary(ctx, stale); len(sum) != 1 || sum[0].Nodes != 3 {
		t.Fatalf("fleet summary %+v: want 3 nodes again", sum)
	}
}

// TestSweepRemovedNodes: the nodes a complete Node list no longer holds are
// marked removed in one statement, except a node whose row or agent report
// is newer than the list, a node whose agent reported within the grace, a
// node already removed (it keeps its first removal time) and the nodes of
// other clusters; the sweep says which marked nodes still have active
// diagnoses, and a second sweep marks nothing.
func TestSweepRemovedNodes(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := open(t)
	listed := t0.Add(10 * time.Minute)
	now := listed.Add(time.Second)
	seed := func(cluster, name string, at time.Time) {
		t.Helper()
		if _, err := s.ReadNode(ctx, store.Node{Cluster: cluster, Name: name, NodePool: "gpu"}, 1, at); err != nil {
			t.Fatal(err)
		}
	}
	for _, n := range []string{"kept", "gone", "gone-diag", "reporting", "removed-earlier"} {
		seed("c1", n, t0)
	}
	seed("c1", "late", listed.Add(time.Second)) // recorded after the list was read
	seed("c2", "gone", t0)
	if _, err := s.WriteNodeLedger(ctx, store.NodeLedger{Cluster: "c1", Node: "gone-diag", Diagnoses: []store.DiagnosisRecord{{
		Cluster: "c1", Node: "gone-diag", BootID: "boot-a", Reason: "GPULost", Severity: "condition", FaultClass: "gpu-lost",
		Action: "replace", Active: true}}}, t0); err != nil {
		t.Fatal(err)
	}
	if _, err := s.IngestReport(ctx, report("c1", "reporting", "boot-a", 0, listed.Add(-30*time.Second)), listed.Add(-30*time.Second)); err != nil {
		t.Fatal(err)
	}
	if err := s.MarkNodeRemoved(ctx, "c1", "removed-earlier", t0.Add(time.Minute)); err != nil {
		t.Fatal(err)
	}

	sw := store.NodeSweep{Cluster: "c1", Present: []string{"kept", "not-stored"}, ListedAt: listed, SilentBefore: listed.Add(-2 * time.Minute)}
	got, err := s.SweepRemovedNodes(ctx, sw, now)
	if err != nil {
		t.Fatal(err)
	}
	want := []store.SweptNode{{Name: "gone"}, {Name: "gone-diag", ActiveDiagnoses: true}}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("swept %+v, want %+v", got, want)
	}
	for _, c := range []struct {
		cluster, name string
		removedAt     time.Time // zero: present
	}{
		{"c1", "kept", time.Time{}}, {"c1", "gone", now}, {"c1", "gone-diag", now}, {"c1", "reporting", time.Time{}},
		{"c1", "late", time.Time{}}, {"c1", "removed-earlier", t0.Add(time.Minute)}, {"c2", "gone", time.Time{}},
	} {
		n, err := s.GetNode(ctx, c.cluster, c.name)
		if err != nil {
			t.Fatal(err)
		}
		if n.Removed() != !c.removedAt.IsZero() || !n.RemovedAt.Equal(c.removedAt) {
			t.Errorf("%s/%s: removed %v at %v, want removed at %v (zero: present)", c.cluster, c.name, n.Removed(), n.RemovedAt, c.removedAt)
		}
	}
	if again, err := s.SweepRemovedNodes(ctx, sw, now.Add(time.Minute)); err != nil || len(again) != 0 {
		t.Fatalf("second sweep marked %+v, %v; want nothing", again, err)
	}
	if _, err := s.SweepRemovedNodes(ctx, store.NodeSweep{ListedAt: listed}, now); !errors.Is(err, store.ErrInvalid) {
		t.Fatalf("sweep without a cluster: %v, want ErrInvalid", err)
	}
}
