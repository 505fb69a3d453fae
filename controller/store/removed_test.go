package store_test

import (
	"context"
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
		if _, err := s.UpsertNodeMeta(ctx, store.Node{Cluster: "c1", Name: n, NodePool: "gpu"}, t0); err != nil {
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
	if _, err := s.UpsertNodeMeta(ctx, store.Node{Cluster: "c1", Name: "n2", NodePool: "gpu"}, now); err != nil {
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
