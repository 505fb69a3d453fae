package repair_test

import (
	"context"
	"maps"
	"testing"

	"github.com/fleetrepair/fleetrepair/controller/config"
	"github.com/fleetrepair/fleetrepair/controller/diagnose"
	"github.com/fleetrepair/fleetrepair/controller/kube"
	"github.com/fleetrepair/fleetrepair/controller/repair"
	"github.com/fleetrepair/fleetrepair/test/karpentersim"
	"github.com/fleetrepair/fleetrepair/test/pgtest"
)

// TestConfigFromAndCohortLabels: the reconciler built from a configuration
// file (repair.ConfigFrom) takes its settings, and stores the node's values
// of the configured cohort labels, and only those, with its Kubernetes
// facts (the shadow report's label cohorts come from there).
func TestConfigFromAndCohortLabels(t *testing.T) {
	cfg, err := config.Parse([]byte("breaker: {labels: [topology.kubernetes.io/rack]}\nrepair: {resync: 20s, approvalTTL: 2h, drainPerPass: 2}\n"), nil)
	if err != nil {
		t.Fatal(err)
	}
	rc, err := repair.ConfigFrom(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if rc.Resync != cfg.Repair.Resync || rc.ApprovalTTL != cfg.Repair.ApprovalTTL || rc.DrainPerPass != 2 || rc.MaxBreakerAge != cfg.Repair.BreakerAge() ||
		rc.Breaker == nil || len(rc.Breaker.Config().Labels) != 1 {
		t.Fatalf("ConfigFrom = %+v", rc)
	}
	k, _ := fakeFleet(t, []karpentersim.NodeSpec{{Name: "n1", NodePool: "gpu", Zone: "z1", InstanceType: "p5.48xlarge", GPUs: 8,
		Labels: map[string]string{"topology.kubernetes.io/rack": "r7", "example.com/team": "ml"}}})
	st := pgtest.Store(t)
	eng, err := diagnose.New(diagnose.Options{})
	if err != nil {
		t.Fatal(err)
	}
	clk := newClock()
	rc.Store, rc.Engine, rc.Clusters, rc.Now = st, eng, map[string]*kube.Cluster{"c1": k}, clk.Now
	rec, err := repair.New(rc)
	if err != nil {
		t.Fatal(err)
	}
	e := &env{st: st, k: k, rec: rec, clock: clk}
	e.ingest(t, "n1", xid79())
	e.reconcile(t, "n1")
	n, err := st.GetNode(context.Background(), "c1", "n1")
	if err != nil {
		t.Fatal(err)
	}
	if want := map[string]string{"topology.kubernetes.io/rack": "r7"}; !maps.Equal(n.Labels, want) {
		t.Errorf("stored labels %v, want the configured cohort label only %v", n.Labels, want)
	}
}
