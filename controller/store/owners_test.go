package store_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/fleetrepair/fleetrepair/controller/ledger"
	"github.com/fleetrepair/fleetrepair/controller/store"
	"github.com/fleetrepair/fleetrepair/test/pgtest"
)

// TestSetNodeOwners: the owners' holds the deletion guard reads are kept
// per node, changed only when they change, cleared with "", and left alone
// by the reconciler's record of the Node's Kubernetes facts (ReadNode).
func TestSetNodeOwners(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	st := pgtest.Store(t)
	t0 := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	if _, err := st.ReadNode(ctx, store.Node{Cluster: "c1", Name: "n1", NodePool: "gpu"}, 1, t0); err != nil {
		t.Fatal(err)
	}
	if err := st.SetNodeOwners(ctx, "c1", "n1", "NodePool gpu", "Pod ml/train-0", t0.Add(time.Minute)); err != nil {
		t.Fatal(err)
	}
	if _, err := st.ReadNode(ctx, store.Node{Cluster: "c1", Name: "n1", NodePool: "gpu", Zone: "z1"}, 1, t0.Add(2*time.Minute)); err != nil {
		t.Fatal(err)
	}
	n, err := st.GetNode(ctx, "c1", "n1")
	if err != nil || n.OptOut != "NodePool gpu" || n.DoNotDisrupt != "Pod ml/train-0" || n.Zone != "z1" {
		t.Fatalf("node = %+v, %v; want both holds kept through ReadNode", n, err)
	}
	// Unchanged: nothing written (updated_at stays).
	if err := st.SetNodeOwners(ctx, "c1", "n1", "NodePool gpu", "Pod ml/train-0", t0.Add(time.Hour)); err != nil {
		t.Fatal(err)
	}
	if m, _ := st.GetNode(ctx, "c1", "n1"); !m.UpdatedAt.Equal(n.UpdatedAt) {
		t.Errorf("an unchanged hold rewrote the node: updated_at %s -> %s", n.UpdatedAt, m.UpdatedAt)
	}
	if err := st.SetNodeOwners(ctx, "c1", "n1", "", "", t0.Add(2*time.Hour)); err != nil {
		t.Fatal(err)
	}
	ns, err := st.ListNodes(ctx, "c1")
	if err != nil || len(ns) != 1 || ns[0].OptOut != "" || ns[0].DoNotDisrupt != "" {
		t.Fatalf("nodes = %+v, %v; want the holds cleared", ns, err)
	}
	// A node not stored: nothing, no error.
	if err := st.SetNodeOwners(ctx, "c1", "ghost", "Node ghost", "", t0); err != nil {
		t.Fatal(err)
	}
}

// TestDeletionBudgets: the gauge's budgets count what BeginDeletion counts
// (real repairs that entered deleting in the last hour, deletions in
// flight per NodePool), leave dry-run repairs out, cover a NodePool with
// nodes but no deletion, leave out a NodePool whose nodes are all removed,
// and never go below zero.
func TestDeletionBudgets(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	st := pgtest.Store(t)
	now := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	if _, err := st.SetClusterBudget(ctx, "c1", 2, 2, now); err != nil {
		t.Fatal(err)
	}
	if err := st.SetNodePoolBudget(ctx, "c1", 4, now); err != nil {
		t.Fatal(err)
	}
	if _, err := st.ReadNode(ctx, store.Node{Cluster: "c1", Name: "cpu-1", NodePool: "cpu"}, 1, now); err != nil {
		t.Fatal(err)
	}
	// NodePool retired's nodes were all replaced (their Nodes gone): it is
	// left out. cpu keeps its one present node next to a removed one.
	for _, n := range []store.Node{{Cluster: "c1", Name: "old-1", NodePool: "retired"}, {Cluster: "c1", Name: "old-2", NodePool: "retired"},
		{Cluster: "c1", Name: "cpu-2", NodePool: "cpu"}} {
		if _, err := st.ReadNode(ctx, n, 1, now.Add(-time.Hour)); err != nil {
			t.Fatal(err)
		}
		if err := st.MarkNodeRemoved(ctx, "c1", n.Name, now.Add(-30*time.Minute)); err != nil {
			t.Fatal(err)
		}
	}
	// An older deletion, finished: outside the sliding hour.
	old := tolerating(t, st, "gpu-old", "gpu", false, now.Add(-3*time.Hour))
	if _, err := st.BeginDeletion(ctx, old.ID, ledger.Tolerating, "controller", "test", now.Add(-2*time.Hour)); err != nil {
		t.Fatal(err)
	}
	step(t, st, old.ID, ledger.Deleting, ledger.Replaced, now.Add(-90*time.Minute))

	for i, dry := range []bool{false, false, true} {
		r := tolerating(t, st, fmt.Sprintf("gpu-%d", i), "gpu", dry, now.Add(-2*time.Hour))
		if _, err := st.BeginDeletion(ctx, r.ID, ledger.Tolerating, "controller", "test", now.Add(-10*time.Minute)); err != nil {
			t.Fatal(err)
		}
	}
	got, err := st.DeletionBudgets(ctx, now)
	if err != nil {
		t.Fatal(err)
	}
	want := []store.BudgetRemaining{
		{Cluster: "c1", Budget: "deletions_per_hour", Limit: 2, Used: 2, Remaining: 0},
		{Cluster: "c1", NodePool: "cpu", Budget: "max_in_flight_per_nodepool", Limit: 2, Used: 0, Remaining: 2},
		{Cluster: "c1", NodePool: "cpu", Budget: "nodepool_deletions_per_hour", Limit: 4, Used: 0, Remaining: 4},
		{Cluster: "c1", NodePool: "gpu", Budget: "max_in_flight_per_nodepool", Limit: 2, Used: 2, Remaining: 0},
		{Cluster: "c1", NodePool: "gpu", Budget: "nodepool_deletions_per_hour", Limit: 4, Used: 2, Remaining: 2},
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("DeletionBudgets =\n%+v\nwant\n%+v", got, want)
	}
	// A node of retired whose agent reports after the removal is back, and
	// so is its NodePool.
	if _, err := st.IngestReport(ctx, report("c1", "old-1", "boot-b", 1, now), now); err != nil {
		t.Fatal(err)
	}
	got, _ = st.DeletionBudgets(ctx, now)
	if len(got) != len(want)+2 || got[5].NodePool != "retired" || got[6].NodePool != "retired" {
		t.Fatalf("DeletionBudgets after old-1 reported =\n%+v\nwant NodePool retired listed again", got)
	}
	// A budget lowered below what was used reads 0, not negative.
	if _, err := st.SetClusterBudget(ctx, "c1", 1, 2, now); err != nil {
		t.Fatal(err)
	}
	got, _ = st.DeletionBudgets(ctx, now)
	if got[0].Remaining != 0 || got[0].Used != 2 {
		t.Fatalf("over-spent budget = %+v, want remaining 0", got[0])
	}
}
