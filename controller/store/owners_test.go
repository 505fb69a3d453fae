package store_test

import (
	"context"
	"testing"
	"time"

	"github.com/fleetrepair/fleetrepair/controller/store"
	"github.com/fleetrepair/fleetrepair/test/pgtest"
)

// TestSetNodeOwners: the owners' holds the deletion guard reads are kept
// per node, changed only when they change, cleared with "", and left alone
// by the informers' UpsertNodeMeta.
func TestSetNodeOwners(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	st := pgtest.Store(t)
	t0 := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	if _, err := st.UpsertNodeMeta(ctx, store.Node{Cluster: "c1", Name: "n1", NodePool: "gpu"}, t0); err != nil {
		t.Fatal(err)
	}
	if err := st.SetNodeOwners(ctx, "c1", "n1", "NodePool gpu", "Pod ml/train-0", t0.Add(time.Minute)); err != nil {
		t.Fatal(err)
	}
	if _, err := st.UpsertNodeMeta(ctx, store.Node{Cluster: "c1", Name: "n1", NodePool: "gpu", Zone: "z1"}, t0.Add(2*time.Minute)); err != nil {
		t.Fatal(err)
	}
	n, err := st.GetNode(ctx, "c1", "n1")
	if err != nil || n.OptOut != "NodePool gpu" || n.DoNotDisrupt != "Pod ml/train-0" || n.Zone != "z1" {
		t.Fatalf("node = %+v, %v; want both holds kept through UpsertNodeMeta", n, err)
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
