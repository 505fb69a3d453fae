package conformance

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	karpv1 "sigs.k8s.io/karpenter/pkg/apis/v1"

	"github.com/fleetrepair/fleetrepair/controller/config"
	"github.com/fleetrepair/fleetrepair/controller/decide"
	"github.com/fleetrepair/fleetrepair/controller/diagnose"
	"github.com/fleetrepair/fleetrepair/controller/kube"
	"github.com/fleetrepair/fleetrepair/controller/ledger"
	"github.com/fleetrepair/fleetrepair/controller/repair"
	"github.com/fleetrepair/fleetrepair/controller/store"
	"github.com/fleetrepair/fleetrepair/test/karpentersim"
)

// TestLive runs the rules through the live reconciler: a real PostgreSQL,
// the controller-runtime fake client with the simulated Karpenter (which
// replaces a deleted NodeClaim after the shadow's in-flight time), and a fake clock stepped one
// resync at a time. Each pass is what the controller does: the reports due
// are ingested and their nodes reconciled (the ingest trigger), then the
// periodic pass evaluates the breakers and reconciles every node that ever
// reported (as their heartbeats would trigger).
func TestLive(t *testing.T) { conform(t, live) }

type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *fakeClock) Now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *fakeClock) Set(t time.Time) {
	c.mu.Lock()
	c.t = t
	c.mu.Unlock()
}

func live(t *testing.T, c Case) map[string]Outcome {
	t.Helper()
	ctx := context.Background()
	cfg := c.settings(t)
	st := storedFleet(t, c, cfg)
	cl := fake.NewClientBuilder().WithScheme(kube.Scheme).WithStatusSubresource(&corev1.Node{}, &karpv1.NodeClaim{}).Build()
	// Karpenter replaces a deleted NodeClaim after the replays' in-flight
	// time (docs/shadow.md "In flight"), so the NodePool's in-flight budget
	// frees when the replay's does.
	sim := karpentersim.New(cl, config.DefaultDeletingFor)
	for _, p := range c.Pools {
		if err := sim.CreateNodePool(ctx, p.Name); err != nil {
			t.Fatal(err)
		}
	}
	for _, n := range c.nodes() {
		if err := sim.CreateNode(ctx, karpentersim.NodeSpec{Name: n.name, NodePool: n.pool, Zone: n.zone, InstanceType: "p5.48xlarge", GPUs: 8,
			Labels: n.labels}); err != nil {
			t.Fatal(err)
		}
	}
	for n, hold := range c.Owners {
		if err := ownersHold(ctx, cl, n, hold); err != nil {
			t.Fatal(err)
		}
	}
	eng, err := diagnose.New(diagnose.Options{})
	if err != nil {
		t.Fatal(err)
	}
	clk := &fakeClock{t: t0}
	rc, err := repair.ConfigFrom(cfg)
	if err != nil {
		t.Fatal(err)
	}
	rc.Store, rc.Engine, rc.Clusters, rc.Now = st, eng, map[string]*kube.Cluster{"c1": kube.New("c1", cl)}, clk.Now
	rec, err := repair.New(rc)
	if err != nil {
		t.Fatal(err)
	}
	reconcile := func(node string) {
		t.Helper()
		if err := rec.ReconcileNode(ctx, "c1", node); err != nil {
			t.Fatalf("reconcile %s at %s: %v", node, clk.Now().Sub(t0), err)
		}
	}
	var seq uint64
	reported := map[string]bool{}
	var order []string
	next := 0
	for at := time.Duration(0); at <= c.End; at += resync {
		now := t0.Add(at)
		clk.Set(now)
		if err := sim.Step(ctx, now); err != nil {
			t.Fatal(err)
		}
		var due []string
		for ; next < len(c.Inject) && c.Inject[next].At <= at; next++ {
			in := c.Inject[next]
			for _, n := range in.Nodes {
				report(t, st, n, now, findings(in, n, now, &seq))
				due = append(due, n)
				if !reported[n] {
					reported[n] = true
					order = append(order, n)
				}
			}
		}
		for _, n := range due {
			reconcile(n)
		}
		if err := sim.Step(ctx, now); err != nil {
			t.Fatal(err)
		}
		if err := rec.EvaluateBreakers(ctx); err != nil {
			t.Fatal(err)
		}
		for _, n := range order {
			reconcile(n)
		}
	}
	out := map[string]Outcome{}
	for _, n := range c.nodes() {
		rs, _, err := st.ListRepairs(ctx, store.RepairFilter{Cluster: "c1", Node: n.name})
		if err != nil {
			t.Fatal(err)
		}
		for _, rp := range rs { // newest first
			switch {
			case rp.State == ledger.Replaced || rp.State == ledger.Deleting:
				out[n.name] = Deleted
			case rp.ClosedAt.IsZero() && out[n.name] == "":
				out[n.name] = openOutcome(rp, clk.Now())
			}
		}
	}
	return out
}

// ownersHold puts the owners' hold on a node as Kubernetes carries it: a
// Pod bound to it annotated karpenter.sh/do-not-disrupt, or the Node
// labelled fleetrepair.dev/repair=disabled.
func ownersHold(ctx context.Context, cl client.Client, node, hold string) error {
	switch hold {
	case decide.HoldDoNotDisrupt:
		return cl.Create(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "train-" + node, Namespace: "ml",
			Annotations: map[string]string{decide.DoNotDisruptAnnotation: "true"}},
			Spec: corev1.PodSpec{NodeName: node, Containers: []corev1.Container{{Name: "train", Image: "train:1"}}}})
	case decide.HoldOptOut:
		var n corev1.Node
		if err := cl.Get(ctx, client.ObjectKey{Name: node}, &n); err != nil {
			return err
		}
		n.Labels[decide.OptOutLabel] = decide.OptOutDisabled
		return cl.Update(ctx, &n)
	}
	return fmt.Errorf("unknown owners' hold %q", hold)
}

func openOutcome(rp store.Repair, now time.Time) Outcome {
	if w, _ := rp.Detail["waiting_on"].(string); (w == decide.HoldDoNotDisrupt || w == decide.HoldOptOut) && rp.State != ledger.AwaitingApproval {
		return Outcome("waiting:" + w)
	}
	switch {
	case rp.State == ledger.AwaitingApproval && rp.Detail["held_by"] == "breaker":
		return HeldByBreaker
	case rp.State == ledger.AwaitingApproval:
		return HeldByAction
	case rp.State == ledger.Tolerating && !now.Before(rp.TolerationUntil):
		return Delayed
	}
	return Tolerating
}
