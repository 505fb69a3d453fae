package repair_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"
	karpv1 "sigs.k8s.io/karpenter/pkg/apis/v1"

	"github.com/fleetrepair/fleetrepair/controller/diagnose"
	"github.com/fleetrepair/fleetrepair/controller/kube"
	"github.com/fleetrepair/fleetrepair/controller/ledger"
	"github.com/fleetrepair/fleetrepair/controller/repair"
	"github.com/fleetrepair/fleetrepair/controller/store"
	"github.com/fleetrepair/fleetrepair/test/karpentersim"
	"github.com/fleetrepair/fleetrepair/test/pgtest"
)

// replicas are two controller replicas on one database and one cluster,
// sharing a clock; deletes counts NodeClaim delete calls that reached the API.
type replicas struct {
	st      *store.Store
	sim     *karpentersim.Sim
	k       *kube.Cluster
	a, b    *repair.Reconciler
	clock   *clock
	deletes atomic.Int32
}

func newReplicas(t *testing.T, crashA func(string) bool, nodes ...string) *replicas {
	t.Helper()
	ctx := context.Background()
	dsn := pgtest.DSN(t)
	r := &replicas{clock: newClock()}
	base := fake.NewClientBuilder().WithScheme(kube.Scheme).WithStatusSubresource(&corev1.Node{}, &karpv1.NodeClaim{}).Build()
	c := interceptor.NewClient(base.(client.WithWatch), interceptor.Funcs{
		Delete: func(ctx context.Context, cl client.WithWatch, obj client.Object, opts ...client.DeleteOption) error {
			if _, ok := obj.(*karpv1.NodeClaim); ok {
				r.deletes.Add(1)
			}
			return cl.Delete(ctx, obj, opts...)
		}})
	r.sim = karpentersim.New(base, 0)
	if err := r.sim.CreateNodePool(ctx, "gpu"); err != nil {
		t.Fatal(err)
	}
	for _, n := range nodes {
		if err := r.sim.CreateNode(ctx, karpentersim.NodeSpec{Name: n, NodePool: "gpu", Zone: "z1", InstanceType: "p5.48xlarge", GPUs: 8}); err != nil {
			t.Fatal(err)
		}
	}
	r.k = kube.New("c1", c)
	newRec := func(crash func(string) bool) *repair.Reconciler {
		st, err := store.Open(ctx, dsn) // each replica has its own pool, as separate processes do
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(st.Close)
		if r.st == nil {
			r.st = st
		}
		eng, _ := diagnose.New(diagnose.Options{})
		rec, err := repair.New(repair.Config{Store: st, Engine: eng, Clusters: map[string]*kube.Cluster{"c1": r.k}, Now: r.clock.Now, Crash: crash})
		if err != nil {
			t.Fatal(err)
		}
		return rec
	}
	r.a, r.b = newRec(crashA), newRec(nil)
	return r
}

// TestLeaderKilledMidRepair kills replica A right after the deletion
// decision, and again right after the delete call; replica B takes over.
// Either way: exactly one NodeClaim deletion, the repair completes, its
// audit is intact.
func TestLeaderKilledMidRepair(t *testing.T) {
	for _, point := range []string{"after-begin-deletion", "after-delete-call"} {
		t.Run(point, func(t *testing.T) {
			r := newReplicas(t, func(p string) bool { return p == point }, "node-lost")
			ctx := context.Background()
			env := &env{st: r.st, k: r.k, sim: r.sim, rec: r.a, clock: r.clock}
			env.ingest(t, "node-lost", xid79())
			if err := r.a.ReconcileNode(ctx, "c1", "node-lost"); err != nil {
				t.Fatal(err)
			}
			r.clock.Add(11 * time.Minute)
			if err := r.a.ReconcileNode(ctx, "c1", "node-lost"); !errors.Is(err, repair.ErrCrashed) {
				t.Fatalf("replica A: err = %v, want the injected crash", err)
			}
			if got := env.open(t, "node-lost").State; got != ledger.Deleting {
				t.Fatalf("state after the crash = %s, want deleting (the decision was recorded before acting)", got)
			}
			// Replica B takes over: the resync pass picks up the open repair.
			for i := 0; i < 3; i++ {
				if err := r.b.ReconcileNode(ctx, "c1", "node-lost"); err != nil {
					t.Fatalf("replica B: %v", err)
				}
				if err := r.sim.Step(ctx, time.Now()); err != nil {
					t.Fatal(err)
				}
			}
			if n := r.deletes.Load(); n != 1 {
				t.Fatalf("NodeClaim delete calls = %d, want exactly 1", n)
			}
			rs, _, _ := r.st.ListRepairs(ctx, store.RepairFilter{Node: "node-lost"})
			if len(rs) != 1 || rs[0].State != ledger.Replaced {
				t.Fatalf("repairs = %+v, want one replaced", rs)
			}
			if reps := r.sim.Replacements(); len(reps) != 1 {
				t.Fatalf("replacements = %d, want 1", len(reps))
			}
		})
	}
}

// TestTwoReplicasRaceWithinBudget: two replicas reconcile three broken nodes
// of one NodePool concurrently, many times; with max one deletion in flight
// per NodePool, never more than one NodeClaim is being deleted at once.
func TestTwoReplicasRaceWithinBudget(t *testing.T) {
	nodes := []string{"n1", "n2", "n3"}
	r := newReplicas(t, nil, nodes...)
	ctx := context.Background()
	env := &env{st: r.st, k: r.k, sim: r.sim, clock: r.clock}
	for _, n := range nodes {
		env.ingest(t, n, xid79())
	}
	for _, rec := range []*repair.Reconciler{r.a, r.b} {
		for _, n := range nodes {
			if err := rec.ReconcileNode(ctx, "c1", n); err != nil {
				t.Fatal(err)
			}
		}
	}
	r.clock.Add(11 * time.Minute)
	var wg sync.WaitGroup
	for round := 0; round < 5; round++ {
		for _, rec := range []*repair.Reconciler{r.a, r.b} {
			for _, n := range nodes {
				wg.Add(1)
				go func() {
					defer wg.Done()
					_ = rec.ReconcileNode(ctx, "c1", n)
				}()
			}
		}
		wg.Wait()
		deleting, err := r.st.RepairsInState(ctx, ledger.Deleting)
		if err != nil {
			t.Fatal(err)
		}
		if len(deleting) > 1 {
			t.Fatalf("round %d: %d repairs deleting at once in one NodePool, budget 1", round, len(deleting))
		}
	}
	if n := r.deletes.Load(); n != 1 {
		t.Fatalf("NodeClaim delete calls = %d, want 1 while the first is still in flight", n)
	}
}
