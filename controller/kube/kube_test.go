package kube_test

import (
	"context"
	"errors"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	karpv1 "sigs.k8s.io/karpenter/pkg/apis/v1"

	"github.com/fleetrepair/fleetrepair/controller/kube"
	"github.com/fleetrepair/fleetrepair/test/karpentersim"
)

func newFleet(t *testing.T) (*kube.Cluster, *karpentersim.Sim) {
	t.Helper()
	c := fake.NewClientBuilder().WithScheme(kube.Scheme).
		WithStatusSubresource(&corev1.Node{}, &karpv1.NodeClaim{}).Build()
	sim := karpentersim.New(c, 0)
	ctx := context.Background()
	if err := sim.CreateNodePool(ctx, "gpu"); err != nil {
		t.Fatal(err)
	}
	for _, n := range []string{"node-a1", "node-a2"} {
		if err := sim.CreateNode(ctx, karpentersim.NodeSpec{Name: n, NodePool: "gpu", Zone: "us-east-1a", InstanceType: "p5.48xlarge", GPUs: 8}); err != nil {
			t.Fatal(err)
		}
	}
	return kube.New("test", c), sim
}

func TestNodeInfo(t *testing.T) {
	t.Parallel()
	k, _ := newFleet(t)
	info, err := k.NodeInfo(context.Background(), "node-a1")
	if err != nil {
		t.Fatal(err)
	}
	if info.NodePool != "gpu" || info.Zone != "us-east-1a" || info.InstanceType != "p5.48xlarge" || info.NodeClaim != "node-a1-nc" || info.NodeClaimUID == "" || !info.Ready {
		t.Fatalf("NodeInfo = %+v", info)
	}
	if _, err := k.NodeInfo(context.Background(), "missing"); err == nil {
		t.Fatal("NodeInfo(missing) returned no error")
	}
}

func TestSetConditionKeepsOtherConditions(t *testing.T) {
	t.Parallel()
	k, _ := newFleet(t)
	ctx := context.Background()
	now := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	cond := corev1.NodeCondition{Type: "FleetRepairAcceleratedHardwareReady", Status: corev1.ConditionFalse, Reason: "GPULost", Message: "xid 79"}
	if err := k.SetCondition(ctx, "node-a1", cond, now); err != nil {
		t.Fatal(err)
	}
	var n corev1.Node
	if err := k.Client().Get(ctx, client.ObjectKey{Name: "node-a1"}, &n); err != nil {
		t.Fatal(err)
	}
	types := map[corev1.NodeConditionType]corev1.ConditionStatus{}
	for _, c := range n.Status.Conditions {
		types[c.Type] = c.Status
	}
	if types[corev1.NodeReady] != corev1.ConditionTrue || types["FleetRepairAcceleratedHardwareReady"] != corev1.ConditionFalse || len(types) != 2 {
		t.Fatalf("conditions after patch = %v, want the kubelet's Ready kept and ours False", types)
	}
	// Recovery flips it back to True without touching Ready.
	cond.Status, cond.Reason = corev1.ConditionTrue, "Healthy"
	if err := k.SetCondition(ctx, "node-a1", cond, now.Add(time.Minute)); err != nil {
		t.Fatal(err)
	}
	got, ok, err := k.Condition(ctx, "node-a1", "FleetRepairAcceleratedHardwareReady")
	if err != nil || !ok || got.Status != corev1.ConditionTrue || !got.LastTransitionTime.Time.Equal(now.Add(time.Minute)) {
		t.Fatalf("condition after recovery = %+v ok=%v err=%v", got, ok, err)
	}
}

func TestQuarantineIdempotent(t *testing.T) {
	t.Parallel()
	k, _ := newFleet(t)
	ctx := context.Background()
	for i := 0; i < 2; i++ {
		if err := k.SetQuarantine(ctx, "node-a1", true, "GPULost"); err != nil {
			t.Fatal(err)
		}
	}
	var n corev1.Node
	_ = k.Client().Get(ctx, client.ObjectKey{Name: "node-a1"}, &n)
	if len(n.Spec.Taints) != 1 || n.Spec.Taints[0].Key != kube.QuarantineTaintKey || n.Spec.Taints[0].Effect != corev1.TaintEffectNoSchedule {
		t.Fatalf("taints = %+v, want one quarantine taint", n.Spec.Taints)
	}
	if err := k.SetQuarantine(ctx, "node-a1", false, ""); err != nil {
		t.Fatal(err)
	}
	if q, _ := k.Quarantined(ctx, "node-a1"); q {
		t.Fatal("quarantine taint still present after removal")
	}
}

func TestRecordEventDeduplicates(t *testing.T) {
	t.Parallel()
	k, _ := newFleet(t)
	ctx := context.Background()
	for i := 0; i < 3; i++ {
		if err := k.RecordEvent(ctx, "node-a1", corev1.EventTypeWarning, "XidApplicationError", "xid 13", "finding-1", time.Now()); err != nil {
			t.Fatal(err)
		}
	}
	var evs corev1.EventList
	if err := k.Client().List(ctx, &evs); err != nil {
		t.Fatal(err)
	}
	if len(evs.Items) != 1 || evs.Items[0].InvolvedObject.Name != "node-a1" {
		t.Fatalf("events = %d, want exactly 1 on node-a1", len(evs.Items))
	}
}

func TestDeleteNodeClaimUIDPrecondition(t *testing.T) {
	t.Parallel()
	k, sim := newFleet(t)
	ctx := context.Background()
	info, _ := k.NodeInfo(ctx, "node-a1")
	_, err := k.DeleteNodeClaim(ctx, info.NodeClaim, types.UID("some-other-uid"))
	if !errors.Is(err, kube.ErrUIDChanged) {
		t.Fatalf("delete with a stale UID: err = %v, want ErrUIDChanged", err)
	}
	if gone, _ := k.NodeClaimGone(ctx, info.NodeClaim, info.NodeClaimUID); gone {
		t.Fatal("NodeClaim gone after a refused delete")
	}
	if issued, err := k.DeleteNodeClaim(ctx, info.NodeClaim, info.NodeClaimUID); err != nil || !issued {
		t.Fatalf("delete: issued=%v err=%v", issued, err)
	}
	// Deleting twice is fine (already deleting), and sends nothing.
	if issued, err := k.DeleteNodeClaim(ctx, info.NodeClaim, info.NodeClaimUID); err != nil || issued {
		t.Fatalf("second delete: issued=%v err=%v", issued, err)
	}
	if err := sim.Step(ctx, time.Now()); err != nil {
		t.Fatal(err)
	}
	if gone, err := k.NodeClaimGone(ctx, info.NodeClaim, info.NodeClaimUID); err != nil || !gone {
		t.Fatalf("NodeClaimGone = %v, %v after simulated Karpenter finalized it", gone, err)
	}
	reps := sim.Replacements()
	if len(reps) != 1 || reps[0].OldNode != "node-a1" {
		t.Fatalf("replacements = %+v", reps)
	}
	newInfo, err := k.NodeInfo(ctx, reps[0].NewNode)
	if err != nil || newInfo.NodePool != "gpu" || newInfo.Zone != "us-east-1a" || !newInfo.Ready {
		t.Fatalf("replacement node = %+v, %v", newInfo, err)
	}
	if _, err := k.NodeInfo(ctx, "node-a1"); err == nil {
		t.Fatal("old node still exists after replacement")
	}
}
