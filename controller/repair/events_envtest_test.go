package repair_test

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	karpv1 "sigs.k8s.io/karpenter/pkg/apis/v1"

	"github.com/fleetrepair/fleetrepair/agent/finding"
	"github.com/fleetrepair/fleetrepair/controller/decide"
	"github.com/fleetrepair/fleetrepair/controller/diagnose"
	"github.com/fleetrepair/fleetrepair/controller/kube"
	"github.com/fleetrepair/fleetrepair/controller/ledger"
	"github.com/fleetrepair/fleetrepair/controller/repair"
	"github.com/fleetrepair/fleetrepair/controller/store"
	"github.com/fleetrepair/fleetrepair/test/envtest"
	"github.com/fleetrepair/fleetrepair/test/karpentersim"
	"github.com/fleetrepair/fleetrepair/test/pgtest"
)

// TestOwnersAndEventsOnRealAPIServer runs the repair path on a real
// kube-apiserver with the Karpenter CRDs and client-go's events
// broadcaster (kube.Events):
//   - n-dnd has a lost GPU and runs a Pod annotated karpenter.sh/do-not-disrupt:
//     it is quarantined, its deletion is held (audited once, however many
//     passes), and deleted once the Pod is gone;
//   - n-frozen's NodePool carries fleetrepair.dev/repair=disabled: quarantined,
//     never deleted;
//   - every step is an events.k8s.io Event on the Node and on the
//     NodeClaim, with its reason and a note naming the holder, written once:
//     ten more passes add no Event and no series.
func TestOwnersAndEventsOnRealAPIServer(t *testing.T) {
	env := envtest.Start(t, envtest.Options{})
	ctx := context.Background()
	st := pgtest.Store(t)
	sim := karpentersim.New(env.Client, 0)
	for _, p := range []string{"gpu", "frozen"} {
		if err := sim.CreateNodePool(ctx, p); err != nil {
			t.Fatal(err)
		}
	}
	var frozen karpv1.NodePool
	if err := env.Client.Get(ctx, client.ObjectKey{Name: "frozen"}, &frozen); err != nil {
		t.Fatal(err)
	}
	frozen.Labels = map[string]string{decide.OptOutLabel: decide.OptOutDisabled}
	if err := env.Client.Update(ctx, &frozen); err != nil {
		t.Fatal(err)
	}
	for _, n := range []struct{ name, pool string }{{"n-dnd", "gpu"}, {"n-frozen", "frozen"}} {
		if err := sim.CreateNode(ctx, karpentersim.NodeSpec{Name: n.name, NodePool: n.pool, Zone: "z1", InstanceType: "p5.48xlarge", GPUs: 8}); err != nil {
			t.Fatal(err)
		}
	}
	// A training Pod on n-dnd that must not be disrupted (no scheduler here:
	// bound by spec.nodeName).
	if err := env.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "ml"}}); err != nil {
		t.Fatal(err)
	}
	if err := env.Client.Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "default", Namespace: "ml"}}); err != nil {
		t.Fatal(err)
	}
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "train-0", Namespace: "ml",
		Annotations: map[string]string{decide.DoNotDisruptAnnotation: "true"}},
		Spec: corev1.PodSpec{NodeName: "n-dnd", Containers: []corev1.Container{{Name: "train", Image: "train:1"}}}}
	if err := env.Client.Create(ctx, pod); err != nil {
		t.Fatal(err)
	}

	eng, err := diagnose.New(diagnose.Options{})
	if err != nil {
		t.Fatal(err)
	}
	now := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	events := kube.NewEvents()
	defer events.Close()
	rec, err := repair.New(repair.Config{Store: st, Engine: eng, Clusters: map[string]*kube.Cluster{"c1": kube.New("c1", env.Client)},
		Now: func() time.Time { return now }, Events: events})
	if err != nil {
		t.Fatal(err)
	}
	reconcile := func(nodes ...string) {
		t.Helper()
		for _, n := range nodes {
			if err := rec.ReconcileNode(ctx, "c1", n); err != nil {
				t.Fatalf("reconcile %s: %v", n, err)
			}
		}
	}
	for _, n := range []string{"n-dnd", "n-frozen"} {
		f := finding.Finding{Detector: finding.DetectorXid, Xid: 79, GPUPCI: "0000:02:00.0", Node: n, BootID: "boot-" + n,
			Count: 1, Time: now, Evidence: []string{"NVRM: Xid (PCI:0000:02:00): 79, GPU has fallen off the bus."}}
		f.ID = finding.NewID(f)
		if _, err := st.IngestReport(ctx, finding.Report{SchemaVersion: finding.SchemaVersion, Cluster: "c1", Node: n,
			BootID: "boot-" + n, Findings: []finding.Finding{f}}, now); err != nil {
			t.Fatal(err)
		}
	}
	reconcile("n-dnd", "n-frozen")
	now = now.Add(11 * time.Minute) // past the 10m accelerated-hardware toleration
	for range 10 {
		reconcile("n-dnd", "n-frozen")
	}
	for n, hold := range map[string]string{"n-dnd": decide.HoldDoNotDisrupt, "n-frozen": decide.HoldOptOut} {
		rp, err := st.OpenRepairForNode(ctx, "c1", n)
		if err != nil || rp.State != ledger.Tolerating || rp.Detail["waiting_on"] != hold {
			t.Fatalf("%s: repair %+v, %v; want tolerating, waiting on %s", n, rp, err, hold)
		}
		if got := holdAudits(t, st, rp.ID); len(got) != 1 || !strings.Contains(got[0], "deletion held ("+hold+")") {
			t.Fatalf("%s: hold audit entries %q, want exactly one (not one per pass)", n, got)
		}
	}
	var nc karpv1.NodeClaim
	if err := env.Client.Get(ctx, client.ObjectKey{Name: "n-dnd-nc"}, &nc); err != nil || nc.DeletionTimestamp != nil {
		t.Fatalf("n-dnd's NodeClaim deleted behind do-not-disrupt (err %v)", err)
	}

	// The training Pod finishes: the next pass deletes the NodeClaim.
	if err := env.Client.Delete(ctx, pod); err != nil {
		t.Fatal(err)
	}
	reconcile("n-dnd", "n-frozen")
	if err := env.Client.Get(ctx, client.ObjectKey{Name: "n-dnd-nc"}, &nc); err != nil || nc.DeletionTimestamp == nil {
		t.Fatalf("n-dnd's NodeClaim after the Pod left: deleting=%v err=%v; want deleted", nc.DeletionTimestamp, err)
	}
	if err := env.Client.Get(ctx, client.ObjectKey{Name: "n-frozen-nc"}, &nc); err != nil || nc.DeletionTimestamp != nil {
		t.Fatalf("n-frozen's NodeClaim deleted though its NodePool opted out (err %v)", err)
	}

	want := map[string]string{ // regarding/reason -> words of the note
		"Node/n-dnd/" + repair.ReasonQuarantined:                "NoSchedule taint set",
		"NodeClaim/n-dnd-nc/" + repair.ReasonQuarantined:        "NoSchedule taint set",
		"Node/n-dnd/" + repair.ReasonHeldByDoNotDisrupt:         "Pod ml/train-0: held by karpenter.sh/do-not-disrupt",
		"NodeClaim/n-dnd-nc/" + repair.ReasonHeldByDoNotDisrupt: "Pod ml/train-0",
		"Node/n-dnd/" + repair.ReasonNodeClaimDeleted:           "deleted NodeClaim n-dnd-nc",
		"NodeClaim/n-dnd-nc/" + repair.ReasonNodeClaimDeleted:   "Karpenter drains the node",
		"Node/n-frozen/" + repair.ReasonQuarantined:             "GPULost",
		"Node/n-frozen/" + repair.ReasonOptedOut:                "NodePool frozen: opted out of repair by fleetrepair.dev/repair=disabled",
		"NodeClaim/n-frozen-nc/" + repair.ReasonOptedOut:        "NodePool frozen",
		"NodeClaim/n-frozen-nc/" + repair.ReasonQuarantined:     "GPULost",
		// The diagnoses' own Events (core/v1, deterministic names), once each.
		"Node/n-dnd/GPULost":    "fell off the PCIe bus",
		"Node/n-frozen/GPULost": "fell off the PCIe bus",
	}
	var got map[string][]eventsv1.Event
	envtest.WaitFor(t, 30*time.Second, "the repairs' Events", func(ctx context.Context) (bool, error) {
		var evs eventsv1.EventList
		if err := env.Client.List(ctx, &evs, client.InNamespace(metav1.NamespaceDefault)); err != nil {
			return false, err
		}
		got = map[string][]eventsv1.Event{}
		for _, e := range evs.Items {
			if e.ReportingController == kube.ReportingController {
				k := e.Regarding.Kind + "/" + e.Regarding.Name + "/" + e.Reason
				got[k] = append(got[k], e)
			}
		}
		for k := range want {
			if len(got[k]) == 0 {
				return false, nil
			}
		}
		return true, nil
	})
	var keys []string
	for k, evs := range got {
		keys = append(keys, k)
		if len(evs) != 1 || evs[0].Series != nil {
			t.Errorf("%s: %d Events (series %+v), want one, written once", k, len(evs), evs[0].Series)
		}
		words, ok := want[k]
		if !ok {
			t.Errorf("unexpected Event %s: %s", k, evs[0].Note)
			continue
		}
		if e := evs[0]; !strings.Contains(e.Note, words) || !strings.HasSuffix(k, "/GPULost") && (e.Action == "" || e.Related == nil) {
			t.Errorf("%s: note %q action %q related %v; want the note to contain %q, an action and the related object", k, e.Note, e.Action, e.Related, words)
		}
	}
	sort.Strings(keys)
	if testing.Verbose() {
		for _, k := range keys {
			fmt.Printf("%s: %s\n", k, got[k][0].Note)
		}
	}
	// The NodeClaim reference carries its real UID (kubectl describe
	// nodeclaim searches by it).
	if e := got["NodeClaim/n-frozen-nc/"+repair.ReasonOptedOut]; len(e) == 1 {
		if err := env.Client.Get(ctx, client.ObjectKey{Name: "n-frozen-nc"}, &nc); err != nil || e[0].Regarding.UID != nc.UID {
			t.Errorf("NodeClaim Event regards uid %s, the NodeClaim's is %s (%v)", e[0].Regarding.UID, nc.UID, err)
		}
	}
}

// TestStuckNodeClaimEvents: a NodeClaim stuck in Karpenter's lifecycle
// gets one NodeClaimStuck Event however many passes list it, and is told
// again once it was unstuck and gets stuck again (the broadcaster merges the
// repeat into the Event's series).
func TestStuckNodeClaimEvents(t *testing.T) {
	env := envtest.Start(t, envtest.Options{})
	ctx := context.Background()
	st := pgtest.Store(t)
	nc := &karpv1.NodeClaim{ObjectMeta: metav1.ObjectMeta{Name: "launch-nc"}}
	nc.Spec.NodeClassRef = &karpv1.NodeClassReference{Group: "karpenter.k8s.aws", Kind: "EC2NodeClass", Name: "default"}
	nc.Spec.Requirements = []karpv1.NodeSelectorRequirementWithMinValues{{Key: corev1.LabelInstanceTypeStable, Operator: corev1.NodeSelectorOpExists}}
	if err := env.Client.Create(ctx, nc); err != nil {
		t.Fatal(err)
	}
	eng, err := diagnose.New(diagnose.Options{})
	if err != nil {
		t.Fatal(err)
	}
	events := kube.NewEvents()
	defer events.Close()
	rec, err := repair.New(repair.Config{Store: st, Engine: eng, Clusters: map[string]*kube.Cluster{"c1": kube.New("c1", env.Client)}, Events: events})
	if err != nil {
		t.Fatal(err)
	}
	stuck := []repair.StuckClaim{{Name: "launch-nc", State: "not-registered", Detail: "launched 25m ago, never registered a Node"}}
	for range 5 {
		rec.TellStuck(ctx, "c1", stuck)
	}
	list := func() []eventsv1.Event {
		var evs eventsv1.EventList
		if err := env.Client.List(ctx, &evs, client.InNamespace(metav1.NamespaceDefault)); err != nil {
			t.Fatal(err)
		}
		var out []eventsv1.Event
		for _, e := range evs.Items {
			if e.Reason == repair.ReasonNodeClaimStuck {
				out = append(out, e)
			}
		}
		return out
	}
	envtest.WaitFor(t, 20*time.Second, "the NodeClaimStuck Event", func(context.Context) (bool, error) { return len(list()) > 0, nil })
	rec.TellStuck(ctx, "c1", stuck) // a sixth pass, for the broadcaster to have seen any repeat
	time.Sleep(time.Second)
	evs := list()
	if len(evs) != 1 || evs[0].Series != nil || evs[0].Regarding.Kind != "NodeClaim" || evs[0].Regarding.UID != nc.UID ||
		!strings.Contains(evs[0].Note, "not-registered: launched 25m ago") {
		t.Fatalf("after six passes: %+v; want one Event on the NodeClaim (its uid), no series", evs)
	}
	rec.TellStuck(ctx, "c1", nil) // registered after all
	rec.TellStuck(ctx, "c1", stuck)
	envtest.WaitFor(t, 20*time.Second, "the second time it got stuck", func(context.Context) (bool, error) {
		evs := list()
		return len(evs) == 2 || len(evs) == 1 && evs[0].Series != nil && evs[0].Series.Count == 2, nil
	})
}

// holdAudits returns the reasons of repair id's hold audit entries.
func holdAudits(t *testing.T, st *store.Store, id int64) []string {
	t.Helper()
	entries, err := st.RepairAudit(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range entries {
		if strings.HasPrefix(e.Reason, "deletion held") {
			out = append(out, e.Reason)
		}
	}
	return out
}
