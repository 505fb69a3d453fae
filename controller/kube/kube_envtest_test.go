package kube_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"path"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"
	karpv1 "sigs.k8s.io/karpenter/pkg/apis/v1"

	"github.com/fleetrepair/fleetrepair/controller/kube"
	"github.com/fleetrepair/fleetrepair/test/envtest"
	"github.com/fleetrepair/fleetrepair/test/karpentersim"
)

// TestRealAPIServer runs the whole controller/kube surface and the simulated
// Karpenter against a real kube-apiserver with the real Karpenter CRDs: the
// CRDs' schemas and CEL rules validate every NodePool and NodeClaim, status
// is a real subresource, deletion honours finalizers and UID preconditions,
// and updates conflict on stale resourceVersions, none of which the client
// fakes do. The subtests share one API server and run one after another,
// each on its own NodePool and nodes.
func TestRealAPIServer(t *testing.T) {
	env := envtest.Start(t, envtest.Options{})
	t.Run("NodeInfo", func(t *testing.T) { testNodeInfo(t, env) })
	t.Run("SetConditionKeepsOtherWriters", func(t *testing.T) { testSetConditionKeepsOtherWriters(t, env) })
	t.Run("QuarantineUnderConflicts", func(t *testing.T) { testQuarantineUnderConflicts(t, env) })
	t.Run("RecordEvent", func(t *testing.T) { testRecordEvent(t, env) })
	t.Run("StaleUIDRefusedByAPIServer", func(t *testing.T) { testStaleUIDRefused(t, env) })
	t.Run("FinalizerHoldsNodeClaimUntilKarpenter", func(t *testing.T) { testFinalizerHolds(t, env) })
	t.Run("SimulatedKarpenterRun", func(t *testing.T) { testSimRun(t, env) })
	t.Run("CacheWireFormats", func(t *testing.T) { testCacheWireFormats(t, env) })
}

// realFleet creates NodePool pool and the named nodes (zone z1, 8 GPUs) with
// the simulated Karpenter, which the real CRDs must accept.
func realFleet(t *testing.T, env *envtest.Env, pool string, nodes ...string) (*kube.Cluster, *karpentersim.Sim) {
	t.Helper()
	ctx := context.Background()
	sim := karpentersim.New(env.Client, 0)
	if err := sim.CreateNodePool(ctx, pool); err != nil {
		t.Fatal(err)
	}
	for _, n := range nodes {
		if err := sim.CreateNode(ctx, karpentersim.NodeSpec{Name: n, NodePool: pool, Zone: "z1", InstanceType: "p5.48xlarge", GPUs: 8}); err != nil {
			t.Fatal(err)
		}
	}
	return kube.New("real", env.Client), sim
}

func testNodeInfo(t *testing.T, env *envtest.Env) {
	ctx := context.Background()
	k, _ := realFleet(t, env, "info", "info-1", "info-2")
	info, err := k.NodeInfo(ctx, "info-1")
	if err != nil {
		t.Fatal(err)
	}
	var nc karpv1.NodeClaim
	if err := env.Client.Get(ctx, client.ObjectKey{Name: "info-1-nc"}, &nc); err != nil {
		t.Fatal(err)
	}
	if info.NodePool != "info" || info.Zone != "z1" || info.InstanceType != "p5.48xlarge" || !info.Ready ||
		info.NodeClaim != "info-1-nc" || info.NodeClaimUID != nc.UID || info.ProviderID != "sim:///z1/info-1" {
		t.Fatalf("NodeInfo = %+v, want NodeClaim info-1-nc uid %s", info, nc.UID)
	}

	// A NodeClaim that has not recorded the node's name yet is still found
	// through the provider ID.
	nc.Status.NodeName = ""
	if err := env.Client.Status().Update(ctx, &nc); err != nil {
		t.Fatal(err)
	}
	if info, err := k.NodeInfo(ctx, "info-1"); err != nil || info.NodeClaim != "info-1-nc" {
		t.Fatalf("NodeInfo by providerID = %+v, %v", info, err)
	}

	// A node no NodeClaim owns is not an error.
	if err := env.Client.Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "info-static"}}); err != nil {
		t.Fatal(err)
	}
	if info, err := k.NodeInfo(ctx, "info-static"); err != nil || info.NodeClaim != "" || info.NodeClaimUID != "" {
		t.Fatalf("NodeInfo of a node without NodeClaim = %+v, %v", info, err)
	}
	if _, err := k.NodeInfo(ctx, "info-missing"); !apierrors.IsNotFound(err) {
		t.Fatalf("NodeInfo(missing): err = %v, want a wrapped NotFound", err)
	}
}

// patchForeignCondition sets a condition the way another agent does
// (node-problem-detector, the kubelet): its own strategic-merge patch of
// the status subresource, keyed by type.
func patchForeignCondition(ctx context.Context, c client.Client, node string, cond corev1.NodeCondition) error {
	patch, err := json.Marshal(map[string]any{"status": map[string]any{"conditions": []corev1.NodeCondition{cond}}})
	if err != nil {
		return err
	}
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: node}}
	return c.Status().Patch(ctx, n, client.RawPatch(types.StrategicMergePatchType, patch))
}

func conditions(t *testing.T, c client.Client, node string) map[corev1.NodeConditionType]corev1.NodeCondition {
	t.Helper()
	var n corev1.Node
	if err := c.Get(context.Background(), client.ObjectKey{Name: node}, &n); err != nil {
		t.Fatal(err)
	}
	out := map[corev1.NodeConditionType]corev1.NodeCondition{}
	for _, c := range n.Status.Conditions {
		out[c.Type] = c
	}
	return out
}

func testSetConditionKeepsOtherWriters(t *testing.T, env *envtest.Env) {
	ctx := context.Background()
	k, _ := realFleet(t, env, "cond", "cond-1")
	const ours = corev1.NodeConditionType("FleetRepairAcceleratedHardwareReady")
	// Whole seconds: the API server stores condition times at second precision.
	now := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	npd := corev1.NodeCondition{Type: "KernelDeadlock", Status: corev1.ConditionFalse, Reason: "KernelHasNoDeadlock",
		LastHeartbeatTime: metav1.NewTime(now), LastTransitionTime: metav1.NewTime(now)}
	if err := patchForeignCondition(ctx, env.Client, "cond-1", npd); err != nil {
		t.Fatal(err)
	}

	cond := corev1.NodeCondition{Type: ours, Status: corev1.ConditionFalse, Reason: "GPULost", Message: "xid 79"}
	if err := k.SetCondition(ctx, "cond-1", cond, now); err != nil {
		t.Fatal(err)
	}
	got := conditions(t, env.Client, "cond-1")
	if len(got) != 3 || got[corev1.NodeReady].Status != corev1.ConditionTrue || got["KernelDeadlock"].Reason != "KernelHasNoDeadlock" ||
		got[ours].Status != corev1.ConditionFalse || got[ours].Reason != "GPULost" {
		t.Fatalf("conditions = %+v, want the kubelet's Ready, NPD's KernelDeadlock and ours", got)
	}

	// The same condition again writes nothing.
	var before corev1.Node
	_ = env.Client.Get(ctx, client.ObjectKey{Name: "cond-1"}, &before)
	if err := k.SetCondition(ctx, "cond-1", cond, now.Add(time.Minute)); err != nil {
		t.Fatal(err)
	}
	var after corev1.Node
	_ = env.Client.Get(ctx, client.ObjectKey{Name: "cond-1"}, &after)
	if after.ResourceVersion != before.ResourceVersion {
		t.Fatalf("an unchanged condition was written (resourceVersion %s -> %s)", before.ResourceVersion, after.ResourceVersion)
	}
	// A new message with the same status keeps the transition time.
	cond.Message = "xid 79 on GPU 3"
	if err := k.SetCondition(ctx, "cond-1", cond, now.Add(2*time.Minute)); err != nil {
		t.Fatal(err)
	}
	if c := conditions(t, env.Client, "cond-1")[ours]; !c.LastTransitionTime.Time.Equal(now) || !c.LastHeartbeatTime.Time.Equal(now.Add(2*time.Minute)) {
		t.Fatalf("after a message change: transition %s heartbeat %s, want %s and %s", c.LastTransitionTime, c.LastHeartbeatTime, now, now.Add(2*time.Minute))
	}

	// Another writer patches its condition while we flip ours: neither
	// clobbers the other, whatever the interleaving.
	var wg sync.WaitGroup
	errs := make(chan error, 2)
	wg.Go(func() {
		for i := range 30 {
			c := npd
			c.LastHeartbeatTime = metav1.NewTime(now.Add(time.Duration(i) * time.Second))
			c.Message = fmt.Sprintf("heartbeat %d", i)
			if err := patchForeignCondition(ctx, env.Client, "cond-1", c); err != nil {
				errs <- err
				return
			}
		}
	})
	wg.Go(func() {
		for i := range 20 {
			c := cond
			if i%2 == 0 {
				c.Status, c.Reason = corev1.ConditionTrue, "NoFault"
			}
			if err := k.SetCondition(ctx, "cond-1", c, now.Add(time.Duration(3+i)*time.Minute)); err != nil {
				errs <- err
				return
			}
		}
	})
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	got = conditions(t, env.Client, "cond-1")
	if len(got) != 3 || got[corev1.NodeReady].Status != corev1.ConditionTrue || got["KernelDeadlock"].Message != "heartbeat 29" ||
		got[ours].Status != corev1.ConditionFalse || got[ours].Reason != "GPULost" {
		t.Fatalf("conditions after concurrent writers = %+v", got)
	}
}

func testQuarantineUnderConflicts(t *testing.T, env *envtest.Env) {
	ctx := context.Background()
	_, _ = realFleet(t, env, "taint", "taint-1")
	gpuTaint := corev1.Taint{Key: "nvidia.com/gpu", Value: "present", Effect: corev1.TaintEffectNoSchedule}
	var n corev1.Node
	if err := env.Client.Get(ctx, client.ObjectKey{Name: "taint-1"}, &n); err != nil {
		t.Fatal(err)
	}
	// The API server has added node.kubernetes.io/not-ready on creation
	// (admission plugin TaintNodesByCondition); it stays too.
	n.Spec.Taints = append(n.Spec.Taints, gpuTaint)
	if err := env.Client.Update(ctx, &n); err != nil {
		t.Fatal(err)
	}
	others := n.Spec.Taints

	// Another writer (the kubelet's status, a labeller) changes the node
	// between each of our reads and our update, twice per call: the API
	// server refuses the stale update with 409 Conflict, and SetQuarantine
	// must read again and retry without losing the other writer's change.
	wc, err := client.NewWithWatch(env.Config, client.Options{Scheme: kube.Scheme})
	if err != nil {
		t.Fatal(err)
	}
	var writes, conflicts int
	perCall := 0
	racing := interceptor.NewClient(wc, interceptor.Funcs{
		Update: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.UpdateOption) error {
			if perCall < 2 {
				perCall++
				var other corev1.Node
				if err := env.Client.Get(ctx, client.ObjectKey{Name: obj.GetName()}, &other); err != nil {
					return err
				}
				other.Labels[fmt.Sprintf("writer/%d", writes)] = "x"
				if err := env.Client.Update(ctx, &other); err != nil {
					return err
				}
				writes++
			}
			err := c.Update(ctx, obj, opts...)
			if apierrors.IsConflict(err) {
				conflicts++
			}
			return err
		},
	})
	k := kube.New("racing", racing)
	perCall = 0
	if err := k.SetQuarantine(ctx, "taint-1", true, "GPULost"); err != nil {
		t.Fatal(err)
	}
	perCall = 0
	if err := k.SetQuarantine(ctx, "taint-1", true, "GPULost"); err != nil { // idempotent: no update at all
		t.Fatal(err)
	}
	if err := env.Client.Get(ctx, client.ObjectKey{Name: "taint-1"}, &n); err != nil {
		t.Fatal(err)
	}
	want := append(slices.Clone(others), corev1.Taint{Key: kube.QuarantineTaintKey, Value: "GPULost", Effect: corev1.TaintEffectNoSchedule})
	if !slices.EqualFunc(n.Spec.Taints, want, func(a, b corev1.Taint) bool { return a.MatchTaint(&b) && a.Value == b.Value }) {
		t.Fatalf("taints = %+v, want %+v: the other taints kept, one quarantine taint", n.Spec.Taints, want)
	}
	if conflicts != 2 || n.Labels["writer/0"] != "x" || n.Labels["writer/1"] != "x" {
		t.Fatalf("conflicts = %d (want 2 refused stale updates), labels %v (want the other writer's kept)", conflicts, n.Labels)
	}

	perCall = 0
	if err := k.SetQuarantine(ctx, "taint-1", false, ""); err != nil {
		t.Fatal(err)
	}
	if err := env.Client.Get(ctx, client.ObjectKey{Name: "taint-1"}, &n); err != nil {
		t.Fatal(err)
	}
	if !slices.EqualFunc(n.Spec.Taints, others, func(a, b corev1.Taint) bool { return a.MatchTaint(&b) && a.Value == b.Value }) ||
		conflicts != 4 || n.Labels["writer/3"] != "x" {
		t.Fatalf("after removal: taints %+v (want %+v), conflicts %d, labels %v", n.Spec.Taints, others, conflicts, n.Labels)
	}
}

func testRecordEvent(t *testing.T, env *envtest.Env) {
	ctx := context.Background()
	k, _ := realFleet(t, env, "event", "event-1")
	now := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	for range 3 {
		if err := k.RecordEvent(ctx, "event-1", corev1.EventTypeWarning, "GPULost", "xid 79", "diagnosis-1", now); err != nil {
			t.Fatal(err)
		}
	}
	if err := k.RecordEvent(ctx, "event-1", corev1.EventTypeWarning, "GPULost", "xid 79 again", "diagnosis-2", now); err != nil {
		t.Fatal(err)
	}
	var evs corev1.EventList
	if err := env.Client.List(ctx, &evs, client.InNamespace(metav1.NamespaceDefault)); err != nil {
		t.Fatal(err)
	}
	var ours []corev1.Event
	for _, ev := range evs.Items {
		if ev.InvolvedObject.Name == "event-1" {
			ours = append(ours, ev)
		}
	}
	if len(ours) != 2 {
		t.Fatalf("events on event-1 = %d, want 2 (one per key)", len(ours))
	}
	for _, ev := range ours {
		if ev.InvolvedObject.Kind != "Node" || ev.Source.Component != kube.EventSource || ev.Reason != "GPULost" || ev.Type != corev1.EventTypeWarning {
			t.Fatalf("event = %+v", ev)
		}
	}
}

// replaceNodeClaim deletes the NodeClaim (finalizing it as Karpenter would)
// and creates another under the same name: same name, new UID.
func replaceNodeClaim(ctx context.Context, c client.Client, name string) (types.UID, error) {
	var nc karpv1.NodeClaim
	if err := c.Get(ctx, client.ObjectKey{Name: name}, &nc); err != nil {
		return "", err
	}
	fresh := &karpv1.NodeClaim{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: nc.Labels}, Spec: nc.Spec}
	nc.Finalizers = nil
	if err := c.Update(ctx, &nc); err != nil {
		return "", err
	}
	if err := c.Delete(ctx, &nc); err != nil {
		return "", err
	}
	if err := c.Create(ctx, fresh); err != nil {
		return "", err
	}
	return fresh.UID, nil
}

func testStaleUIDRefused(t *testing.T, env *envtest.Env) {
	ctx := context.Background()
	k, _ := realFleet(t, env, "uid", "uid-1", "uid-2")

	// The API server itself refuses a delete whose UID precondition is stale.
	var nc karpv1.NodeClaim
	if err := env.Client.Get(ctx, client.ObjectKey{Name: "uid-1-nc"}, &nc); err != nil {
		t.Fatal(err)
	}
	stale := types.UID("0d6c4a8e-5c43-4a3e-9f43-000000000000")
	err := env.Client.Delete(ctx, &nc, client.Preconditions{UID: &stale})
	if !apierrors.IsConflict(err) {
		t.Fatalf("delete with a stale UID precondition: err = %v, want 409 Conflict from the API server", err)
	}
	if gone, err := k.NodeClaimGone(ctx, "uid-1-nc", nc.UID); err != nil || gone {
		t.Fatalf("NodeClaim gone = %v, %v after a refused delete", gone, err)
	}

	// The NodeClaim was replaced under the same name since the repair
	// recorded its UID: nothing is deleted.
	info, err := k.NodeInfo(ctx, "uid-1")
	if err != nil {
		t.Fatal(err)
	}
	newUID, err := replaceNodeClaim(ctx, env.Client, "uid-1-nc")
	if err != nil {
		t.Fatal(err)
	}
	if issued, err := k.DeleteNodeClaim(ctx, "uid-1-nc", info.NodeClaimUID); !errors.Is(err, kube.ErrUIDChanged) || issued {
		t.Fatalf("DeleteNodeClaim(recorded uid) after replacement: issued=%v err=%v, want ErrUIDChanged", issued, err)
	}
	if gone, err := k.NodeClaimGone(ctx, "uid-1-nc", info.NodeClaimUID); err != nil || !gone {
		t.Fatalf("NodeClaimGone(old uid) = %v, %v, want true (replaced)", gone, err)
	}
	if gone, _ := k.NodeClaimGone(ctx, "uid-1-nc", newUID); gone {
		t.Fatal("the replacement NodeClaim was deleted")
	}

	// The replacement happens between DeleteNodeClaim's read and its delete
	// call: only the API server's precondition stands in the way, and it
	// refuses.
	info, err = k.NodeInfo(ctx, "uid-2")
	if err != nil {
		t.Fatal(err)
	}
	wc, err := client.NewWithWatch(env.Config, client.Options{Scheme: kube.Scheme})
	if err != nil {
		t.Fatal(err)
	}
	var racedUID types.UID
	raced := interceptor.NewClient(wc, interceptor.Funcs{
		Delete: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.DeleteOption) error {
			if racedUID == "" {
				uid, err := replaceNodeClaim(ctx, c, obj.GetName())
				if err != nil {
					return err
				}
				racedUID = uid
			}
			return c.Delete(ctx, obj, opts...)
		},
	})
	issued, err := kube.New("raced", raced).DeleteNodeClaim(ctx, "uid-2-nc", info.NodeClaimUID)
	if !errors.Is(err, kube.ErrUIDChanged) || !apierrors.IsConflict(err) || issued {
		t.Fatalf("DeleteNodeClaim racing a replacement: issued=%v err=%v, want ErrUIDChanged wrapping the API server's Conflict", issued, err)
	}
	var live karpv1.NodeClaim
	if err := env.Client.Get(ctx, client.ObjectKey{Name: "uid-2-nc"}, &live); err != nil || live.UID != racedUID || live.DeletionTimestamp != nil {
		t.Fatalf("replacement NodeClaim after the refused delete: uid %s (want %s), deleting %v, err %v", live.UID, racedUID, live.DeletionTimestamp, err)
	}
}

func testFinalizerHolds(t *testing.T, env *envtest.Env) {
	ctx := context.Background()
	k, sim := realFleet(t, env, "fin", "fin-1")
	info, err := k.NodeInfo(ctx, "fin-1")
	if err != nil {
		t.Fatal(err)
	}
	if issued, err := k.DeleteNodeClaim(ctx, info.NodeClaim, info.NodeClaimUID); err != nil || !issued {
		t.Fatalf("DeleteNodeClaim: issued=%v err=%v", issued, err)
	}
	// Karpenter's termination finalizer keeps the NodeClaim, marked for
	// deletion, until Karpenter has drained and terminated the node.
	var nc karpv1.NodeClaim
	if err := env.Client.Get(ctx, client.ObjectKey{Name: info.NodeClaim}, &nc); err != nil {
		t.Fatalf("NodeClaim gone before Karpenter finalized it: %v", err)
	}
	if nc.DeletionTimestamp == nil || len(nc.Finalizers) != 1 || nc.Finalizers[0] != karpv1.TerminationFinalizer {
		t.Fatalf("NodeClaim after delete: deletionTimestamp %v finalizers %v", nc.DeletionTimestamp, nc.Finalizers)
	}
	if gone, err := k.NodeClaimGone(ctx, info.NodeClaim, info.NodeClaimUID); err != nil || gone {
		t.Fatalf("NodeClaimGone while finalizing = %v, %v", gone, err)
	}
	if issued, err := k.DeleteNodeClaim(ctx, info.NodeClaim, info.NodeClaimUID); err != nil || issued {
		t.Fatalf("second DeleteNodeClaim: issued=%v err=%v, want nothing sent (already deleting)", issued, err)
	}

	if err := sim.Step(ctx, time.Now()); err != nil {
		t.Fatal(err)
	}
	if gone, err := k.NodeClaimGone(ctx, info.NodeClaim, info.NodeClaimUID); err != nil || !gone {
		t.Fatalf("NodeClaimGone after Karpenter finalized = %v, %v", gone, err)
	}
	if _, err := k.NodeInfo(ctx, "fin-1"); !apierrors.IsNotFound(err) {
		t.Fatalf("old node: err = %v, want NotFound", err)
	}
	reps := sim.Replacements()
	if len(reps) != 1 || reps[0].OldNode != "fin-1" || reps[0].OldNodeClaim != info.NodeClaim {
		t.Fatalf("replacements = %+v", reps)
	}
	repl, err := k.NodeInfo(ctx, reps[0].NewNode)
	if err != nil || repl.NodePool != "fin" || repl.Zone != "z1" || repl.InstanceType != "p5.48xlarge" || !repl.Ready ||
		repl.NodeClaim != reps[0].NewNodeClaim || repl.NodeClaimUID == "" {
		t.Fatalf("replacement = %+v, %v", repl, err)
	}
	nodes, err := k.Nodes(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	found := false
	for _, n := range nodes {
		names = append(names, n.Name)
		found = found || n.Name == reps[0].NewNode && len(n.Conditions) > 0
		if n.Name == "fin-1" {
			t.Fatalf("Nodes lists the removed node: %v", names)
		}
	}
	if !found {
		t.Fatalf("Nodes = %v, want the replacement %s with its conditions", names, reps[0].NewNode)
	}
}

func testSimRun(t *testing.T, env *envtest.Env) {
	ctx, cancel := context.WithCancel(context.Background())
	k, sim := realFleet(t, env, "run", "run-1")
	info, err := k.NodeInfo(ctx, "run-1")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- sim.Run(ctx, 20*time.Millisecond) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("sim.Run: %v", err)
		}
	}()
	if _, err := k.DeleteNodeClaim(ctx, info.NodeClaim, info.NodeClaimUID); err != nil {
		t.Fatal(err)
	}
	envtest.WaitFor(t, 10*time.Second, "the simulated Karpenter to replace run-1", func(ctx context.Context) (bool, error) {
		return k.NodeClaimGone(ctx, info.NodeClaim, info.NodeClaimUID)
	})
	envtest.WaitFor(t, 10*time.Second, "the replacement node", func(context.Context) (bool, error) {
		return len(sim.Replacements()) == 1, nil
	})
}

// testCacheWireFormats: a cached cluster's informers list and watch Nodes
// in protobuf (a built-in type: a tenth of the decoding cost of JSON per
// watch event, docs/design.md) and NodeClaims in JSON (a CRD: the API server
// serves CRDs in JSON only), and the cached Nodes carry no managed fields.
func testCacheWireFormats(t *testing.T, env *envtest.Env) {
	_, _ = realFleet(t, env, "wire", "wire-1")
	var mu sync.Mutex
	seen := map[string]string{}     // "list nodes", "watch nodeclaims", ... -> response Content-Type
	watches := map[string]int{}     // the same keys -> requests
	const timeout = 2 * time.Second // CachedOptions.RequestTimeout
	cfg := rest.CopyConfig(env.Config)
	cfg.WrapTransport = func(rt http.RoundTripper) http.RoundTripper {
		return roundTripperFunc(func(req *http.Request) (*http.Response, error) {
			resp, err := rt.RoundTrip(req)
			res := path.Base(req.URL.Path)
			if err != nil || req.Method != http.MethodGet || (res != "nodes" && res != "nodeclaims") {
				return resp, err
			}
			verb := "list"
			if req.URL.Query().Get("watch") == "true" {
				verb = "watch"
			}
			mu.Lock()
			seen[verb+" "+res] = resp.Header.Get("Content-Type")
			mu.Unlock()
			watches[verb+" "+res]++
			return resp, err
		})
	}
	k, err := kube.NewCached("wire", cfg, kube.CachedOptions{RequestTimeout: timeout})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() { _ = k.Run(ctx, func(string) {}) }()
	envtest.WaitFor(t, 30*time.Second, "the cache to list and watch Nodes and NodeClaims", func(ctx context.Context) (bool, error) {
		mu.Lock()
		defer mu.Unlock()
		return seen["watch nodes"] != "" && seen["watch nodeclaims"] != "", nil
	})
	// With the request timeout on the informers' HTTP client, each watch
	// was cut and re-opened every RequestTimeout; a watch's own server-side
	// timeout is 5 to 10 minutes.
	time.Sleep(3 * timeout)
	mu.Lock()
	defer mu.Unlock()
	// client-go streams the first list as watch events (sendInitialEvents);
	// a list, where made, must use the same format.
	for key, want := range map[string]string{"list nodes": "application/vnd.kubernetes.protobuf", "watch nodes": "application/vnd.kubernetes.protobuf;stream=watch",
		"list nodeclaims": "application/json", "watch nodeclaims": "application/json"} {
		if got, ok := seen[key]; (ok || strings.HasPrefix(key, "watch")) && !strings.HasPrefix(got, want) {
			t.Errorf("%s: Content-Type %q, want %q", key, got, want)
		}
	}
	for _, key := range []string{"watch nodes", "watch nodeclaims"} {
		if n := watches[key]; n != 1 {
			t.Errorf("%s: %d requests in %v, want 1 (a watch outlives the request timeout %v)", key, n, 3*timeout, timeout)
		}
	}
	var n corev1.Node
	if err := k.Client().Get(ctx, client.ObjectKey{Name: "wire-1"}, &n); err != nil {
		t.Fatal(err)
	}
	if len(n.ManagedFields) != 0 {
		t.Errorf("cached Node has %d managedFields entries, want none (stripped by the cache transform)", len(n.ManagedFields))
	}
}

type roundTripperFunc func(*http.Request) (*http.Response, error)

func (f roundTripperFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }
