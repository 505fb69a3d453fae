package repair_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/fleetrepair/fleetrepair/agent/finding"
	"github.com/fleetrepair/fleetrepair/controller/diagnose"
	"github.com/fleetrepair/fleetrepair/controller/kube"
	"github.com/fleetrepair/fleetrepair/controller/repair"
	"github.com/fleetrepair/fleetrepair/controller/store"
	"github.com/fleetrepair/fleetrepair/test/envtest"
	"github.com/fleetrepair/fleetrepair/test/karpentersim"
	"github.com/fleetrepair/fleetrepair/test/pgtest"
)

// TestRemovedNodeSweep runs the reconciler on real API servers and
// PostgreSQL with a store left by an earlier run: nodes whose Nodes were
// deleted while no controller watched are marked removed by the pass that
// follows the cache's sync and by later passes, without any reconcile of
// them; a node whose agent still reports, the nodes of a cluster whose API
// server is down and those of a cluster listing no Node stay present; a
// swept node's diagnoses are deactivated, and a Node that comes back is
// present again.
func TestRemovedNodeSweep(t *testing.T) {
	envs := envtest.StartN(t, 3, envtest.Options{})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	st := pgtest.Store(t)
	east := karpentersim.New(envs[0].Client, 0)
	if err := east.CreateNodePool(ctx, "gpu"); err != nil {
		t.Fatal(err)
	}
	nodeSpec := func(name string) karpentersim.NodeSpec {
		return karpentersim.NodeSpec{Name: name, NodePool: "gpu", Zone: "z1", InstanceType: "p5.48xlarge", GPUs: 8}
	}
	var live []string
	for i := range 4 {
		name := fmt.Sprintf("gpu-%d", i)
		live = append(live, name)
		if err := east.CreateNode(ctx, nodeSpec(name)); err != nil {
			t.Fatal(err)
		}
	}
	// What the earlier run stored, an hour ago.
	before := time.Now().Add(-time.Hour)
	seed := func(cluster, name string) {
		t.Helper()
		if _, err := st.ReadNode(ctx, store.Node{Cluster: cluster, Name: name, NodePool: "gpu", Zone: "z1"}, 1, before); err != nil {
			t.Fatal(err)
		}
	}
	for _, n := range append([]string{"gone-1", "gone-2", "reporting"}, live...) {
		seed("east", n)
	}
	if _, err := st.WriteNodeLedger(ctx, store.NodeLedger{Cluster: "east", Node: "gone-2", Diagnoses: []store.DiagnosisRecord{{
		Cluster: "east", Node: "gone-2", BootID: "boot-1", Reason: "GPULost", Severity: "condition", FaultClass: "gpu-lost",
		Action: "replace", Active: true}}}, before); err != nil {
		t.Fatal(err)
	}
	// reporting's Node is gone too, but its agent reported 30 s ago.
	if _, err := st.IngestReport(ctx, finding.Report{SchemaVersion: finding.SchemaVersion, Cluster: "east", Node: "reporting",
		BootID: "boot-1"}, time.Now().Add(-30*time.Second)); err != nil {
		t.Fatal(err)
	}
	seed("west", "w-0")
	seed("west", "w-1")
	seed("bare", "b-0")
	// west's API server is down from the start: its cache never syncs.
	if err := envs[1].Stop(); err != nil {
		t.Fatal(err)
	}
	clusters := map[string]*kube.Cluster{}
	for i, name := range []string{"east", "west", "bare"} {
		k, err := kube.NewCached(name, envs[i].Config, kube.CachedOptions{RequestTimeout: 2 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		clusters[name] = k
	}
	eng, _ := diagnose.New(diagnose.Options{})
	// Resync is an hour: the passes below are the one after the sync and
	// the ones asked for (PassSoon).
	rec, err := repair.New(repair.Config{Store: st, Engine: eng, Clusters: clusters, Resync: time.Hour, ProbeTimeout: 2 * time.Second, Workers: 2})
	if err != nil {
		t.Fatal(err)
	}
	defer runReconciler(ctx, rec)()

	deadline := time.Now().Add(90 * time.Second)
	node := func(cluster, name string) store.Node {
		t.Helper()
		n, err := st.GetNode(ctx, cluster, name)
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	removed := func(cluster, name string) func() bool {
		return func() bool { return node(cluster, name).Removed() }
	}
	explain := func() string {
		ns, _ := st.ListNodes(ctx, "")
		var out []string
		for _, n := range ns {
			out = append(out, fmt.Sprintf("%s/%s removed=%v", n.Cluster, n.Name, n.Removed()))
		}
		return fmt.Sprintf("nodes %v; clusters %+v", out, rec.Clusters())
	}
	waitFor(t, deadline, "the pass after east's sync to mark gone-1 removed", removed("east", "gone-1"), explain)
	waitFor(t, deadline, "gone-2 removed", removed("east", "gone-2"), explain)
	waitFor(t, deadline, "gone-2's diagnoses deactivated by its reconcile", func() bool {
		ds, err := st.ActiveDiagnoses(ctx, "east", "gone-2")
		return err == nil && len(ds) == 0
	}, explain)

	// Later passes sweep what an earlier one could not see (a row an
	// earlier run left, its Node long gone); each waits for the one before,
	// so the first one's pass over bare, synced by then, is over too.
	waitFor(t, deadline, "bare synced and reachable", func() bool {
		for _, c := range rec.Clusters() {
			if c.Name == "bare" {
				return c.Reachable
			}
		}
		return false
	}, explain)
	for _, n := range []string{"gone-3", "gone-4"} {
		seed("east", n)
		rec.PassSoon()
		waitFor(t, deadline, "a later pass to mark "+n+" removed", removed("east", n), explain)
	}
	for _, c := range []struct{ cluster, name, why string }{
		{"east", "reporting", "its agent reported within the grace"},
		{"west", "w-0", "west's API server is down"}, {"west", "w-1", "west's API server is down"},
		{"bare", "b-0", "bare's API server lists no Node"},
	} {
		if node(c.cluster, c.name).Removed() {
			t.Errorf("%s/%s marked removed; want present: %s", c.cluster, c.name, c.why)
		}
	}
	for _, n := range live {
		if node("east", n).Removed() {
			t.Errorf("east/%s marked removed; its Node is there", n)
		}
	}
	for _, c := range rec.Clusters() {
		if c.Name == "west" && c.Reachable {
			t.Errorf("west reachable with its API server stopped: %+v", c)
		}
	}

	// gone-1's Node comes back: its add event reconciles it, present again.
	if err := east.CreateNode(ctx, nodeSpec("gone-1")); err != nil {
		t.Fatal(err)
	}
	waitFor(t, deadline, "gone-1 present again after its Node reappeared", func() bool { return !node("east", "gone-1").Removed() }, explain)
	rec.PassSoon()
	seed("east", "gone-5")
	rec.PassSoon()
	waitFor(t, deadline, "gone-5 removed", removed("east", "gone-5"), explain)
	if node("east", "gone-1").Removed() {
		t.Error("gone-1 swept again with its Node back")
	}
}
