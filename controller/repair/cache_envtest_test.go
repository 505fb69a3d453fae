package repair_test

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/fleetrepair/fleetrepair/agent/finding"
	"github.com/fleetrepair/fleetrepair/controller/breaker"
	"github.com/fleetrepair/fleetrepair/controller/diagnose"
	"github.com/fleetrepair/fleetrepair/controller/kube"
	"github.com/fleetrepair/fleetrepair/controller/ledger"
	"github.com/fleetrepair/fleetrepair/controller/repair"
	"github.com/fleetrepair/fleetrepair/test/envtest"
	"github.com/fleetrepair/fleetrepair/test/karpentersim"
	"github.com/fleetrepair/fleetrepair/test/pgtest"
)

// requestCounter counts the API requests a client sends, by verb and
// resource ("list nodeclaims", "watch nodes", "patch nodes", ...).
type requestCounter struct {
	mu sync.Mutex
	n  map[string]int
}

func (c *requestCounter) wrap(cfg *rest.Config) *rest.Config {
	cfg = rest.CopyConfig(cfg)
	cfg.WrapTransport = func(rt http.RoundTripper) http.RoundTripper {
		return roundTripper(func(req *http.Request) (*http.Response, error) {
			c.count(req)
			return rt.RoundTrip(req)
		})
	}
	return cfg
}

func (c *requestCounter) count(req *http.Request) {
	parts := strings.Split(strings.Trim(req.URL.Path, "/"), "/")
	var verb, res string
	for i, p := range parts { // .../nodes or .../nodes/NAME[/status]
		if p == "nodes" || p == "nodeclaims" || p == "events" {
			res = p
			switch {
			case req.Method == http.MethodGet && i == len(parts)-1 && req.URL.Query().Get("watch") == "true":
				verb = "watch"
			case req.Method == http.MethodGet && i == len(parts)-1:
				verb = "list"
			default:
				verb = strings.ToLower(req.Method)
			}
			break
		}
	}
	if res == "" {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.n == nil {
		c.n = map[string]int{}
	}
	c.n[verb+" "+res]++
}

func (c *requestCounter) get(key string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.n[key]
}

type roundTripper func(*http.Request) (*http.Response, error)

func (f roundTripper) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// TestCachedClustersOnRealAPIServer runs the reconciler on informer caches
// against two real kube-apiservers holding Nodes and Karpenter NodeClaims:
//   - heartbeats (triggers of every node, again and again) read Nodes and
//     NodeClaims from the cache: no List reaches the API server after the
//     informers' first one, and no Get of a Node or NodeClaim either;
//   - a Node change seen by the watch enqueues its node: a GPU-lost finding
//     stored without any trigger is repaired once the Node changes;
//   - the NodeClaim is found through the field index (the repair names it);
//   - with the second API server stopped, that cluster is unreachable and
//     the first one's repair still goes through.
func TestCachedClustersOnRealAPIServer(t *testing.T) {
	envs := envtest.StartN(t, 2, envtest.Options{})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	st := pgtest.Store(t)
	var names []string
	for i, env := range envs {
		sim := karpentersim.New(env.Client, 0)
		if err := sim.CreateNodePool(ctx, "gpu"); err != nil {
			t.Fatal(err)
		}
		for j := 0; j < 20; j++ {
			name := fmt.Sprintf("gpu-%02d", j)
			if i == 0 {
				names = append(names, name)
			}
			if err := sim.CreateNode(ctx, karpentersim.NodeSpec{Name: name, NodePool: "gpu", Zone: fmt.Sprintf("z%d", j%4),
				InstanceType: "p5.48xlarge", GPUs: 8}); err != nil {
				t.Fatal(err)
			}
		}
	}
	var reqs requestCounter
	east, err := kube.NewCached("east", reqs.wrap(envs[0].Config), kube.CachedOptions{})
	if err != nil {
		t.Fatal(err)
	}
	west, err := kube.NewCached("west", envs[1].Config, kube.CachedOptions{RequestTimeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	pol, err := breaker.NewPolicy(breaker.Config{})
	if err != nil {
		t.Fatal(err)
	}
	eng, _ := diagnose.New(diagnose.Options{})
	if _, err := st.SetClusterBudget(ctx, "east", 100, 10, time.Now()); err != nil {
		t.Fatal(err)
	}
	rec, err := repair.New(repair.Config{Store: st, Engine: eng, Clusters: map[string]*kube.Cluster{"east": east, "west": west},
		Breaker: pol, Toleration: time.Second, Resync: 100 * time.Millisecond, ProbeTimeout: 2 * time.Second, Workers: 4})
	if err != nil {
		t.Fatal(err)
	}
	defer runReconciler(ctx, rec)()

	deadline := time.Now().Add(90 * time.Second)
	explain := func() string { return fmt.Sprintf("requests %v; clusters %+v", reqs.n, rec.Clusters()) }
	reachable := func(name string) bool {
		for _, c := range rec.Clusters() {
			if c.Name == name {
				return c.Reachable
			}
		}
		return false
	}
	waitFor(t, deadline, "both clusters synced and reachable", func() bool { return reachable("east") && reachable("west") }, explain)

	// Heartbeats: 10 rounds over every node of east. (The informers' first
	// list may be a list or, with client-go's WatchList, a watch: count from
	// here.)
	lists := reqs.get("list nodes") + reqs.get("list nodeclaims")
	gets := reqs.get("get nodes") + reqs.get("get nodeclaims")
	for round := 0; round < 10; round++ {
		for _, n := range names {
			rec.Trigger("east", n)
		}
	}
	waitFor(t, deadline, "every east node recorded", func() bool {
		ns, err := st.ListNodes(ctx, "east")
		return err == nil && len(ns) == len(names)
	}, explain)
	if got := reqs.get("list nodes") + reqs.get("list nodeclaims") - lists; got != 0 {
		t.Errorf("%d Node/NodeClaim lists reached the API server during heartbeats; reads must come from the cache", got)
	}
	if got := reqs.get("get nodes") + reqs.get("get nodeclaims") - gets; got != 0 {
		t.Errorf("%d Node/NodeClaim GETs reached the API server during heartbeats; reads must come from the cache", got)
	}
	if reqs.get("watch nodes")+reqs.get("list nodes") == 0 {
		t.Error("no Node list or watch counted: the request counter sees nothing")
	}

	// A finding stored with no trigger; then the Node changes (a label an
	// operator adds): the watch enqueues it and the repair opens, naming the
	// NodeClaim found through the index.
	f := finding.Finding{Detector: finding.DetectorXid, Xid: 79, GPUPCI: "0000:02:00.0", Node: "gpu-03", BootID: "boot-1", Count: 1,
		Time: time.Now(), Evidence: []string{"NVRM: Xid (PCI:0000:02:00): 79, GPU has fallen off the bus."}}
	f.ID = finding.NewID(f)
	if _, err := st.IngestReport(ctx, finding.Report{SchemaVersion: finding.SchemaVersion, Cluster: "east", Node: "gpu-03",
		BootID: "boot-1", Findings: []finding.Finding{f}}, time.Now()); err != nil {
		t.Fatal(err)
	}
	var n corev1.Node
	if err := envs[0].Client.Get(ctx, client.ObjectKey{Name: "gpu-03"}, &n); err != nil {
		t.Fatal(err)
	}
	n.Labels["example.com/rack"] = "r7"
	if err := envs[0].Client.Update(ctx, &n); err != nil {
		t.Fatal(err)
	}
	waitFor(t, deadline, "the watch to open gpu-03's repair", func() bool {
		_, err := st.OpenRepairForNode(ctx, "east", "gpu-03")
		return err == nil
	}, explain)
	rp, _ := st.OpenRepairForNode(ctx, "east", "gpu-03")
	waitFor(t, deadline, "the quarantine condition patch", func() bool { return reqs.get("patch nodes") > 0 }, explain)
	if rp.NodeClaim != "gpu-03-nc" || rp.NodeClaimUID == "" {
		t.Fatalf("repair names NodeClaim %q (uid %q), want gpu-03-nc from the index", rp.NodeClaim, rp.NodeClaimUID)
	}

	// West goes down; east's repair still completes.
	if err := envs[1].Stop(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, deadline, "west unreachable", func() bool { return !reachable("west") }, explain)
	waitFor(t, deadline, "east's repair to delete its NodeClaim", func() bool {
		r, err := st.GetRepair(ctx, rp.ID)
		return err == nil && (r.State == ledger.Deleting || r.State == ledger.Replaced)
	}, explain)
	if !reachable("east") {
		t.Fatal("east reported unreachable while only west is down")
	}
}
