package e2e

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"
	karpv1 "sigs.k8s.io/karpenter/pkg/apis/v1"

	"github.com/fleetrepair/fleetrepair/cmd/runner"
	"github.com/fleetrepair/fleetrepair/controller/kube"
	"github.com/fleetrepair/fleetrepair/controller/ledger"
	"github.com/fleetrepair/fleetrepair/controller/store"
	"github.com/fleetrepair/fleetrepair/test/karpentersim"
	"github.com/fleetrepair/fleetrepair/test/pgtest"
	"github.com/fleetrepair/fleetrepair/web/api"
)

var errDown = errors.New("dial tcp 10.0.0.1:443: connect: connection refused")

// TestOneControllerTwoClustersOneDown: one controller serves two clusters.
// The API server of "west" is down: its GPU-lost node is unknown, never
// repaired; "east" goes on and replaces its own GPU-lost node.
func TestOneControllerTwoClustersOneDown(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	mk := func(down bool) (client.Client, *karpentersim.Sim) {
		c := fake.NewClientBuilder().WithScheme(kube.Scheme).WithStatusSubresource(&corev1.Node{}, &karpv1.NodeClaim{}).Build()
		sim := karpentersim.New(c, 100*time.Millisecond)
		if err := sim.CreateNodePool(ctx, "gpu"); err != nil {
			t.Fatal(err)
		}
		if err := sim.CreateNode(ctx, karpentersim.NodeSpec{Name: "gpu-1", NodePool: "gpu", Zone: "z1", InstanceType: "p5.48xlarge", GPUs: 8}); err != nil {
			t.Fatal(err)
		}
		if !down {
			return c, sim
		}
		fail := func() error { return errDown }
		return interceptor.NewClient(c.(client.WithWatch), interceptor.Funcs{
			Get: func(context.Context, client.WithWatch, client.ObjectKey, client.Object, ...client.GetOption) error {
				return fail()
			},
			List: func(context.Context, client.WithWatch, client.ObjectList, ...client.ListOption) error { return fail() },
			Patch: func(context.Context, client.WithWatch, client.Object, client.Patch, ...client.PatchOption) error {
				return fail()
			},
			Update: func(context.Context, client.WithWatch, client.Object, ...client.UpdateOption) error { return fail() },
			Delete: func(context.Context, client.WithWatch, client.Object, ...client.DeleteOption) error { return fail() },
			Create: func(context.Context, client.WithWatch, client.Object, ...client.CreateOption) error { return fail() },
		}), sim
	}
	east, eastSim := mk(false)
	west, westSim := mk(true)
	ctrl, err := runner.Start(ctx, runner.Options{DatabaseURL: pgtest.DSN(t), Listen: "127.0.0.1:0",
		Clusters: map[string]*kube.Cluster{"east": kube.New("east", east), "west": kube.New("west", west)},
		Config:   settings(time.Second, 200*time.Millisecond), Log: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{}, 3)
	go func() { _ = ctrl.Run(ctx); done <- struct{}{} }()
	go func() { _ = eastSim.Run(ctx, 100*time.Millisecond); done <- struct{}{} }()
	go func() { _ = westSim.Run(ctx, 100*time.Millisecond); done <- struct{}{} }()
	defer func() { cancel(); <-done; <-done; <-done }()

	c01 := fixture(t, "c01-xid79-aer-surprise-down/input.devkmsg.txt")
	startAgentIn(t, ctrl.URL, "east", "gpu-1", "--replay", c01)
	startAgentIn(t, ctrl.URL, "west", "gpu-1", "--replay", c01)

	eventually(t, 60*time.Second, "east's GPU-lost node replaced", func() (bool, string) {
		rs, _, err := ctrl.Store.ListRepairs(ctx, store.RepairFilter{Cluster: "east"})
		if err != nil || len(rs) == 0 {
			return false, fmt.Sprint(err)
		}
		return rs[0].State == ledger.Replaced, string(rs[0].State)
	})
	if rs, _, _ := ctrl.Store.ListRepairs(ctx, store.RepairFilter{Cluster: "west"}); len(rs) != 0 {
		t.Fatalf("west (API server down) got repairs: %+v", rs)
	}
	var clusters api.ClusterList
	getJSON(t, ctrl.URL+"/api/v1/clusters", &clusters)
	states := map[string]bool{}
	for _, c := range clusters.Items {
		states[c.Name] = c.Reachable
	}
	if !states["east"] || states["west"] || len(states) != 2 {
		t.Fatalf("cluster states = %+v, want east reachable, west not", clusters.Items)
	}
	var node api.NodeDetail
	getJSON(t, ctrl.URL+"/api/v1/nodes/west/gpu-1", &node)
	if node.Health != api.HealthUnknown || len(node.Findings) == 0 {
		t.Fatalf("west node: health %s (%s), %d findings; want unknown with the findings kept", node.Health, node.HealthReason, len(node.Findings))
	}
	if len(westSim.Replacements()) != 0 || len(eastSim.Replacements()) != 1 {
		t.Fatalf("replacements: east %d, west %d; want 1 and 0", len(eastSim.Replacements()), len(westSim.Replacements()))
	}
}
