package e2e

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"
	karpv1 "sigs.k8s.io/karpenter/pkg/apis/v1"

	"github.com/fleetrepair/fleetrepair/cmd/runner"
	"github.com/fleetrepair/fleetrepair/controller/kube"
	"github.com/fleetrepair/fleetrepair/controller/ledger"
	"github.com/fleetrepair/fleetrepair/controller/store"
	"github.com/fleetrepair/fleetrepair/test/envtest"
	"github.com/fleetrepair/fleetrepair/test/expect"
	"github.com/fleetrepair/fleetrepair/test/karpentersim"
	"github.com/fleetrepair/fleetrepair/test/pgtest"
)

// TestHALeaderKilledMidRepair: two controller replicas share one database
// and one real API server, with per-cluster leader election on a Lease. The
// leader is killed right after the deletion decision, and (second run)
// right after the delete call. The other replica takes the Lease over and
// finishes the repair: exactly one NodeClaim delete reaches the API server,
// the repair ends replaced, its audit is complete.
func TestHALeaderKilledMidRepair(t *testing.T) {
	for _, point := range []string{"after-begin-deletion", "after-delete-call"} {
		t.Run(point, func(t *testing.T) { haRun(t, point) })
	}
}

func haRun(t *testing.T, point string) {
	env := envtest.Start(t, envtest.Options{})
	ctx := context.Background()
	sim := karpentersim.New(env.Client, 300*time.Millisecond)
	if err := sim.CreateNodePool(ctx, "gpu"); err != nil {
		t.Fatal(err)
	}
	if err := sim.CreateNode(ctx, karpentersim.NodeSpec{Name: "gpu-1", NodePool: "gpu", Zone: "z1", InstanceType: "p5.48xlarge", GPUs: 8}); err != nil {
		t.Fatal(err)
	}
	simCtx, stopSim := context.WithCancel(ctx)
	simDone := make(chan struct{})
	go func() { _ = sim.Run(simCtx, 200*time.Millisecond); close(simDone) }()
	defer func() { stopSim(); <-simDone }()

	var deletes atomic.Int32
	dsn := pgtest.DSN(t)
	replica := func(name string, crash func(string) bool) (*runner.Controller, context.CancelFunc, chan struct{}) {
		base, err := client.NewWithWatch(env.Config, client.Options{Scheme: kube.Scheme})
		if err != nil {
			t.Fatal(err)
		}
		c := interceptor.NewClient(base, interceptor.Funcs{
			Delete: func(ctx context.Context, cl client.WithWatch, obj client.Object, opts ...client.DeleteOption) error {
				if _, ok := obj.(*karpv1.NodeClaim); ok {
					deletes.Add(1)
				}
				return cl.Delete(ctx, obj, opts...)
			}})
		cs, err := kubernetes.NewForConfig(env.Config)
		if err != nil {
			t.Fatal(err)
		}
		rctx, cancel := context.WithCancel(ctx)
		ctrl, err := runner.Start(rctx, runner.Options{DatabaseURL: dsn, Listen: "127.0.0.1:0", Config: settings(2*time.Second, 300*time.Millisecond),
			Clusters: map[string]*kube.Cluster{cluster: kube.New(cluster, c)}, Crash: crash,
			LeaderElection: &runner.LeaderElection{Clients: map[string]kubernetes.Interface{cluster: cs}, Namespace: "default",
				Identity: name, LeaseDuration: 2 * time.Second, RenewDeadline: 1500 * time.Millisecond, RetryPeriod: 200 * time.Millisecond},
			Log: slog.New(slog.NewTextHandler(io.Discard, nil))})
		if err != nil {
			t.Fatal(err)
		}
		done := make(chan struct{})
		go func() { _ = ctrl.Run(rctx); close(done) }()
		return ctrl, cancel, done
	}
	// Replica A leads and crashes at the point; B waits for the Lease.
	var once sync.Once
	crashed := make(chan struct{})
	a, killA, aDone := replica("replica-a", func(p string) bool {
		if p != point {
			return false
		}
		hit := false
		once.Do(func() { hit = true; close(crashed) })
		return hit
	})
	waitLeading(t, a, true)
	b, stopB, bDone := replica("replica-b", nil)
	defer func() { stopB(); <-bDone }()

	startAgent(t, a.URL, "gpu-1", "--replay", fixture(t, "c01-xid79-aer-surprise-down/input.devkmsg.txt"))
	select {
	case <-crashed:
	case <-time.After(90 * time.Second):
		t.Fatal("replica A never reached the crash point")
	}
	killA() // the process dies right there: no further step of A runs
	<-aDone
	r, err := b.Store.OpenRepairForNode(ctx, cluster, "gpu-1")
	if err != nil || r.State != ledger.Deleting {
		t.Fatalf("after the crash: repair %+v, %v; want deleting (recorded before acting)", r, err)
	}
	eventually(t, 60*time.Second, "replica B completes the repair", func() (bool, string) {
		rs, _, err := b.Store.ListRepairs(ctx, store.RepairFilter{Node: "gpu-1"})
		if err != nil || len(rs) != 1 {
			return false, fmt.Sprint(len(rs), err)
		}
		return rs[0].State == ledger.Replaced, string(rs[0].State)
	})
	if n := deletes.Load(); n != 1 {
		t.Fatalf("NodeClaim delete calls = %d, want exactly 1", n)
	}
	// The simulated Karpenter finalizes the NodeClaim before it records the
	// replacement: the repair can be replaced a moment before.
	eventually(t, 10*time.Second, "one replacement", func() (bool, string) {
		reps := sim.Replacements()
		return len(reps) == 1, fmt.Sprint(len(reps))
	})
	rs, _, _ := b.Store.ListRepairs(ctx, store.RepairFilter{Node: "gpu-1"})
	expect.ExpectAuditPath(t, b.Store, rs[0].ID, ledger.Detected, ledger.Quarantined, ledger.Tolerating, ledger.Deleting, ledger.Replaced)
}

// waitLeading waits until the controller does (or does not) lead the cluster.
func waitLeading(t *testing.T, c *runner.Controller, want bool) {
	t.Helper()
	eventually(t, 30*time.Second, fmt.Sprintf("leading=%v", want), func() (bool, string) {
		for _, st := range c.Clusters() {
			if st.Name == cluster && st.Leading != nil && *st.Leading == want {
				return true, ""
			}
		}
		return false, fmt.Sprint(c.Clusters())
	})
}
