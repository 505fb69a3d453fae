package e2e

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"testing"
	"time"

	karpv1 "sigs.k8s.io/karpenter/pkg/apis/v1"

	"github.com/fleetrepair/fleetrepair/cmd/runner"
	"github.com/fleetrepair/fleetrepair/controller/kube"
	"github.com/fleetrepair/fleetrepair/controller/ledger"
	"github.com/fleetrepair/fleetrepair/controller/store"
	"github.com/fleetrepair/fleetrepair/test/envtest"
	"github.com/fleetrepair/fleetrepair/test/karpentersim"
	"github.com/fleetrepair/fleetrepair/test/pgtest"
)

// TestRealAPIServersTwoClusters drives real agent binaries -> controller ->
// PostgreSQL -> two real kube-apiservers with the Karpenter CRDs: in each
// cluster a GPU falls off the bus, its NodeClaim is deleted (UID
// precondition) and the simulated Karpenter replaces it; the app-error and
// quiet nodes are untouched.
func TestRealAPIServersTwoClusters(t *testing.T) {
	envs := envtest.StartN(t, 2, envtest.Options{})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	names := []string{"east", "west"}
	clusters := map[string]*kube.Cluster{}
	sims := map[string]*karpentersim.Sim{}
	done := make(chan struct{}, 3)
	for i, name := range names {
		sim := karpentersim.New(envs[i].Client, 300*time.Millisecond)
		if err := sim.CreateNodePool(ctx, "gpu"); err != nil {
			t.Fatal(err)
		}
		for _, n := range []string{"gpu-1", "gpu-2", "gpu-3"} {
			if err := sim.CreateNode(ctx, karpentersim.NodeSpec{Name: n, NodePool: "gpu", Zone: "z1", InstanceType: "p5.48xlarge", GPUs: 8}); err != nil {
				t.Fatal(err)
			}
		}
		clusters[name], sims[name] = kube.New(name, envs[i].Client), sim
		go func() { _ = sim.Run(ctx, 200*time.Millisecond); done <- struct{}{} }()
	}
	ctrl, err := runner.Start(ctx, runner.Options{DatabaseURL: pgtest.DSN(t), Listen: "127.0.0.1:0", Clusters: clusters,
		Config: settings(2*time.Second, 300*time.Millisecond), Log: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = ctrl.Run(ctx); done <- struct{}{} }()
	defer func() { cancel(); <-done; <-done; <-done }()

	for _, name := range names {
		startAgentIn(t, ctrl.URL, name, "gpu-1", "--replay", fixture(t, "c01-xid79-aer-surprise-down/input.devkmsg.txt"))
		startAgentIn(t, ctrl.URL, name, "gpu-2", "--replay", fixture(t, "c10-xid31-driver-rollout/input.kmsg.txt"))
		startAgentIn(t, ctrl.URL, name, "gpu-3", "--replay", fixture(t, "c03-xid13-burst-then-xid109/input.kmsg.txt"))
	}
	for i, name := range names {
		eventually(t, 90*time.Second, name+": GPU-lost node replaced", func() (bool, string) {
			rs, _, err := ctrl.Store.ListRepairs(ctx, store.RepairFilter{Cluster: name, Node: "gpu-1"})
			if err != nil || len(rs) == 0 {
				return false, fmt.Sprint(err)
			}
			return rs[0].State == ledger.Replaced && len(sims[name].Replacements()) == 1, string(rs[0].State)
		})
		var ncs karpv1.NodeClaimList
		if err := envs[i].Client.List(ctx, &ncs); err != nil {
			t.Fatal(err)
		}
		have := map[string]bool{}
		for _, nc := range ncs.Items {
			have[nc.Name] = true
		}
		if have["gpu-1-nc"] || !have["gpu-2-nc"] || !have["gpu-3-nc"] || len(ncs.Items) != 3 {
			t.Fatalf("%s NodeClaims = %v, want gpu-1-nc gone, gpu-2-nc and gpu-3-nc kept, one replacement", name, have)
		}
		// gpu-3 (a first GPU hang) waits for approval, tainted, never replaced.
		if r, err := ctrl.Store.OpenRepairForNode(ctx, name, "gpu-3"); err != nil || r.RecommendedAction != "reset-gpu" {
			t.Fatalf("%s gpu-3 repair = %+v, %v", name, r, err)
		}
		if q, err := clusters[name].Quarantined(ctx, "gpu-3"); err != nil || !q {
			t.Fatalf("%s gpu-3 quarantined = %v, %v", name, q, err)
		}
		if _, err := ctrl.Store.OpenRepairForNode(ctx, name, "gpu-2"); err == nil {
			t.Fatalf("%s: the app-error node got a repair", name)
		}
	}
}
