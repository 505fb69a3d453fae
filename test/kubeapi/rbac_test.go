package kubeapi

import (
	"context"
	"errors"
	"reflect"
	"testing"
	"time"

	authnv1 "k8s.io/api/authentication/v1"
	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	policyv1 "k8s.io/api/policy/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
	"sigs.k8s.io/controller-runtime/pkg/client"
	karpv1 "sigs.k8s.io/karpenter/pkg/apis/v1"

	"github.com/fleetrepair/fleetrepair/agent/finding"
	"github.com/fleetrepair/fleetrepair/cmd/runner"
	"github.com/fleetrepair/fleetrepair/controller/diagnose"
	"github.com/fleetrepair/fleetrepair/controller/kube"
	"github.com/fleetrepair/fleetrepair/controller/ledger"
	"github.com/fleetrepair/fleetrepair/controller/repair"
	"github.com/fleetrepair/fleetrepair/test/envtest"
	"github.com/fleetrepair/fleetrepair/test/karpentersim"
	"github.com/fleetrepair/fleetrepair/test/pgtest"
)

// leaseName is the Lease the controller's leader election holds in its
// namespace; the chart's Role grants get and update on that name only.
const leaseName = runner.LeaseName

// wantClusterRules are the controller's cluster-wide permissions. The test
// compares the chart's ClusterRole with them exactly, so a permission is
// only ever added on purpose, here and in deploy/chart/templates/rbac.yaml.
var wantClusterRules = []rbacv1.PolicyRule{
	{APIGroups: []string{""}, Resources: []string{"nodes"}, Verbs: []string{"get", "list", "watch", "patch", "update"}},
	{APIGroups: []string{""}, Resources: []string{"nodes/status"}, Verbs: []string{"patch"}},
	{APIGroups: []string{""}, Resources: []string{"events"}, Verbs: []string{"create"}},
	{APIGroups: []string{"events.k8s.io"}, Resources: []string{"events"}, Verbs: []string{"create", "patch"}},
	{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"list"}},
	{APIGroups: []string{"karpenter.sh"}, Resources: []string{"nodeclaims"}, Verbs: []string{"get", "list", "watch", "delete"}},
	{APIGroups: []string{"karpenter.sh"}, Resources: []string{"nodepools"}, Verbs: []string{"get", "list", "watch"}},
	{APIGroups: []string{"authentication.k8s.io"}, Resources: []string{"tokenreviews"}, Verbs: []string{"create"}},
}

var wantLeaseRules = []rbacv1.PolicyRule{
	{APIGroups: []string{"coordination.k8s.io"}, Resources: []string{"leases"}, Verbs: []string{"create"}},
	{APIGroups: []string{"coordination.k8s.io"}, Resources: []string{"leases"}, ResourceNames: []string{leaseName}, Verbs: []string{"get", "update"}},
}

// TestControllerRBAC installs the chart's ServiceAccounts and RBAC in an
// API server with RBAC authorization on, runs the real repair path
// (controller/repair on a real PostgreSQL, through controller/kube) as the
// controller's ServiceAccount by impersonation: an Xid 79 quarantines the
// node (condition, taint, Event) and, after the toleration, deletes its
// NodeClaim with a UID precondition; the simulated Karpenter (as admin)
// replaces it. It then checks the rest of what the controller does (leader
// election, TokenReview, NodePool reads) and that what the role does not
// grant is refused.
func TestControllerRBAC(t *testing.T) {
	env := envtest.Start(t, envtest.Options{RBAC: true})
	ctx := context.Background()
	objs, err := render(t, baseValues)
	if err != nil {
		t.Fatalf("helm template: %v", err)
	}
	cr := typed[rbacv1.ClusterRole](t, find(objs, "ClusterRole", controllerSA))
	if !reflect.DeepEqual(cr.Rules, wantClusterRules) {
		t.Fatalf("ClusterRole rules =\n%+v\nwant exactly\n%+v", cr.Rules, wantClusterRules)
	}
	role := typed[rbacv1.Role](t, find(objs, "Role", controllerSA))
	if !reflect.DeepEqual(role.Rules, wantLeaseRules) {
		t.Fatalf("Role rules =\n%+v\nwant exactly\n%+v", role.Rules, wantLeaseRules)
	}

	// The chart's identities and RBAC, for real; the workloads do not run
	// here (no kubelet), the test plays the controller.
	createNamespace(t, env, nil)
	for _, o := range objs {
		switch o.GetKind() {
		case "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding":
			if err := env.Client.Create(ctx, o); err != nil {
				t.Fatalf("create %s %s: %v", o.GetKind(), o.GetName(), err)
			}
		}
	}
	sim := karpentersim.New(env.Client, 0)
	if err := sim.CreateNodePool(ctx, "gpu"); err != nil {
		t.Fatal(err)
	}
	for _, n := range []string{"node-lost", "node-ok"} {
		if err := sim.CreateNode(ctx, karpentersim.NodeSpec{Name: n, NodePool: "gpu", Zone: "z1", InstanceType: "p5.48xlarge", GPUs: 8}); err != nil {
			t.Fatal(err)
		}
	}
	ctrlCfg, ctrl := env.ClientAs(t, envtest.ServiceAccount(namespace, controllerSA))

	t.Run("RepairPath", func(t *testing.T) { testRepairAsController(t, env, sim, ctrlCfg, ctrl) })
	t.Run("LeaderElection", func(t *testing.T) { testLeaderElectionAsController(t, ctrlCfg) })
	t.Run("TokenReview", func(t *testing.T) { testTokenReviewAsController(t, env, ctrlCfg) })
	t.Run("Refused", func(t *testing.T) { testRefused(t, env, ctrl) })
}

func testRepairAsController(t *testing.T, env *envtest.Env, sim *karpentersim.Sim, cfg *rest.Config, ctrl client.Client) {
	ctx := context.Background()
	st := pgtest.Store(t)
	eng, err := diagnose.New(diagnose.Options{})
	if err != nil {
		t.Fatal(err)
	}
	now := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	clock := func() time.Time { return now }
	k := kube.New("c1", ctrl)
	events := kube.NewEvents()
	defer events.Close()
	rec, err := repair.New(repair.Config{Store: st, Engine: eng, Clusters: map[string]*kube.Cluster{"c1": k}, Now: clock, Events: events})
	if err != nil {
		t.Fatal(err)
	}
	reconcile := func(node string) {
		t.Helper()
		if err := rec.ReconcileNode(ctx, "c1", node); err != nil {
			t.Fatalf("reconcile %s as the controller: %v", node, err)
		}
	}
	f := finding.Finding{Detector: finding.DetectorXid, Xid: 79, GPUPCI: "0000:02:00.0", Node: "node-lost", BootID: "boot-1",
		Count: 1, Time: now, Evidence: []string{"NVRM: Xid (PCI:0000:02:00): 79, GPU has fallen off the bus."}}
	f.ID = finding.NewID(f)
	if _, err := st.IngestReport(ctx, finding.Report{SchemaVersion: finding.SchemaVersion, Cluster: "c1", Node: "node-lost",
		BootID: "boot-1", Findings: []finding.Finding{f}}, now); err != nil {
		t.Fatal(err)
	}

	reconcile("node-lost")
	reconcile("node-ok") // the healthy path: reads conditions, keeps the node untainted
	r, err := st.OpenRepairForNode(ctx, "c1", "node-lost")
	if err != nil || r.State != ledger.Tolerating {
		t.Fatalf("repair after the first pass = %+v, %v; want tolerating", r, err)
	}
	var n corev1.Node
	if err := env.Client.Get(ctx, client.ObjectKey{Name: "node-lost"}, &n); err != nil {
		t.Fatal(err)
	}
	tainted, condSet := false, false
	for _, tt := range n.Spec.Taints {
		tainted = tainted || tt.Key == kube.QuarantineTaintKey
	}
	for _, c := range n.Status.Conditions {
		condSet = condSet || c.Reason == "GPULost" && c.Status == corev1.ConditionFalse
	}
	if !tainted || !condSet {
		t.Fatalf("node-lost as the controller left it: taints %v, conditions %v", n.Spec.Taints, n.Status.Conditions)
	}
	var evs corev1.EventList
	if err := env.Client.List(ctx, &evs, client.InNamespace(metav1.NamespaceDefault)); err != nil || len(evs.Items) == 0 {
		t.Fatalf("events = %d, %v; want the controller's Event on node-lost", len(evs.Items), err)
	}

	now = now.Add(11 * time.Minute) // past the 10m accelerated-hardware toleration
	reconcile("node-lost")
	var nc karpv1.NodeClaim
	if err := env.Client.Get(ctx, client.ObjectKey{Name: "node-lost-nc"}, &nc); err != nil || nc.DeletionTimestamp == nil {
		t.Fatalf("NodeClaim after the toleration: deleting=%v err=%v; want deleted by the controller", nc.DeletionTimestamp, err)
	}
	if err := sim.Step(ctx, time.Now()); err != nil { // Karpenter, as admin
		t.Fatal(err)
	}
	reconcile("node-lost")
	r, err = st.GetRepair(ctx, r.ID)
	if err != nil || r.State != ledger.Replaced {
		t.Fatalf("repair = %+v, %v; want replaced", r, err)
	}
	if len(sim.Replacements()) != 1 {
		t.Fatalf("replacements = %+v, want 1", sim.Replacements())
	}
	// The repair's story, written as the controller (events.k8s.io: create).
	envtest.WaitFor(t, 20*time.Second, "the Quarantined and NodeClaimDeleted Events", func(ctx context.Context) (bool, error) {
		var evs eventsv1.EventList
		if err := env.Client.List(ctx, &evs, client.InNamespace(metav1.NamespaceDefault)); err != nil {
			return false, err
		}
		seen := map[string]bool{}
		for _, e := range evs.Items {
			if e.ReportingController == kube.ReportingController {
				seen[e.Regarding.Kind+"/"+e.Reason] = true
			}
		}
		return seen["Node/"+repair.ReasonQuarantined] && seen["NodeClaim/"+repair.ReasonQuarantined] && seen["Node/"+repair.ReasonNodeClaimDeleted], nil
	})

	// The controller's remaining reads: every node (the interop scan) and
	// the NodePools, listed and watched.
	if _, err := k.Nodes(ctx); err != nil {
		t.Fatal(err)
	}
	var pools karpv1.NodePoolList
	if err := ctrl.List(ctx, &pools); err != nil || len(pools.Items) != 1 {
		t.Fatalf("list NodePools as the controller: %d, %v", len(pools.Items), err)
	}
	ww, err := client.NewWithWatch(cfg, client.Options{Scheme: kube.Scheme})
	if err != nil {
		t.Fatal(err)
	}
	for _, list := range []client.ObjectList{&corev1.NodeList{}, &karpv1.NodeClaimList{}, &karpv1.NodePoolList{}} {
		w, err := ww.Watch(ctx, list)
		if err != nil {
			t.Fatalf("watch %T as the controller: %v", list, err)
		}
		w.Stop()
	}
}

// testLeaderElectionAsController runs client-go's leader election on the
// controller's Lease under its identity: acquire (get, create), renew
// (update) and release (update).
func testLeaderElectionAsController(t *testing.T, cfg *rest.Config) {
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	lock := &resourcelock.LeaseLock{
		LeaseMeta:  metav1.ObjectMeta{Name: leaseName, Namespace: namespace},
		Client:     cs.CoordinationV1(),
		LockConfig: resourcelock.ResourceLockConfig{Identity: "replica-a"},
	}
	led := make(chan struct{})
	le, err := leaderelection.NewLeaderElector(leaderelection.LeaderElectionConfig{
		Lock: lock, LeaseDuration: 2 * time.Second, RenewDeadline: time.Second, RetryPeriod: 100 * time.Millisecond,
		ReleaseOnCancel: true, Name: leaseName,
		Callbacks: leaderelection.LeaderCallbacks{
			OnStartedLeading: func(context.Context) { close(led) },
			OnStoppedLeading: func() {},
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { le.Run(ctx); close(done) }()
	select {
	case <-led:
	case <-time.After(15 * time.Second):
		t.Fatal("the controller never acquired its Lease (get/create refused?)")
	}
	var first coordinationv1.Lease
	envtest.WaitFor(t, 10*time.Second, "a Lease renewal", func(ctx context.Context) (bool, error) {
		l, err := cs.CoordinationV1().Leases(namespace).Get(ctx, leaseName, metav1.GetOptions{})
		if err != nil {
			return false, err
		}
		if first.Spec.RenewTime == nil {
			first = *l
			return false, nil
		}
		return l.Spec.RenewTime != nil && l.Spec.RenewTime.After(first.Spec.RenewTime.Time), nil
	})
	cancel()
	<-done
	l, err := cs.CoordinationV1().Leases(namespace).Get(context.Background(), leaseName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if l.Spec.HolderIdentity != nil && *l.Spec.HolderIdentity != "" {
		t.Fatalf("Lease held by %q after release, want released (update refused?)", *l.Spec.HolderIdentity)
	}
}

// testTokenReviewAsController validates an agent's projected token the way
// controller/auth does, and shows the token is useless against the API.
func testTokenReviewAsController(t *testing.T, env *envtest.Env, cfg *rest.Config) {
	ctx := context.Background()
	admin, err := kubernetes.NewForConfig(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	exp := int64(600)
	tr, err := admin.CoreV1().ServiceAccounts(namespace).CreateToken(ctx, agentSA, &authnv1.TokenRequest{
		Spec: authnv1.TokenRequestSpec{Audiences: []string{"fleetrepair"}, ExpirationSeconds: &exp}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	rev, err := cs.AuthenticationV1().TokenReviews().Create(ctx, &authnv1.TokenReview{
		Spec: authnv1.TokenReviewSpec{Token: tr.Status.Token, Audiences: []string{"fleetrepair"}}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("TokenReview as the controller: %v", err)
	}
	if !rev.Status.Authenticated || rev.Status.User.Username != "system:serviceaccount:"+namespace+":"+agentSA {
		t.Fatalf("TokenReview status = %+v, want the agent authenticated", rev.Status)
	}

	// The agent's token carries the fleetrepair audience, not the API
	// server's: it opens nothing in the cluster.
	agentCfg := rest.AnonymousClientConfig(env.Config)
	agentCfg.BearerToken = tr.Status.Token
	agent, err := kubernetes.NewForConfig(agentCfg)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := agent.CoreV1().Nodes().List(ctx, metav1.ListOptions{}); !apierrors.IsUnauthorized(err) {
		t.Fatalf("list nodes with the agent's fleetrepair-audience token: err = %v, want 401", err)
	}
}

// testRefused checks verbs the controller does not hold.
func testRefused(t *testing.T, env *envtest.Env, ctrl client.Client) {
	ctx := context.Background()
	secret := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "fleetrepair-db", Namespace: namespace},
		StringData: map[string]string{"DATABASE_URL": "postgres://x"}}
	if err := env.Client.Create(ctx, secret); err != nil {
		t.Fatal(err)
	}
	var nodes corev1.NodeList
	if err := env.Client.List(ctx, &nodes); err != nil || len(nodes.Items) == 0 {
		t.Fatalf("nodes: %d, %v", len(nodes.Items), err)
	}
	var pools karpv1.NodePoolList
	if err := env.Client.List(ctx, &pools); err != nil || len(pools.Items) == 0 {
		t.Fatalf("nodepools: %d, %v", len(pools.Items), err)
	}
	var claims karpv1.NodeClaimList
	if err := env.Client.List(ctx, &claims); err != nil || len(claims.Items) == 0 {
		t.Fatalf("nodeclaims: %d, %v", len(claims.Items), err)
	}
	node, pool, claim := &nodes.Items[0], &pools.Items[0], &claims.Items[0]
	stripFinalizers := client.RawPatch("application/merge-patch+json", []byte(`{"metadata":{"finalizers":null}}`))
	otherLease := &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: "someone-else", Namespace: namespace}}
	if err := env.Client.Create(ctx, otherLease); err != nil {
		t.Fatal(err)
	}

	for _, c := range []struct {
		what string
		do   func() error
	}{
		{"delete a Node directly", func() error { return ctrl.Delete(ctx, node.DeepCopy()) }},
		{"get a Secret", func() error {
			return ctrl.Get(ctx, client.ObjectKeyFromObject(secret), &corev1.Secret{})
		}},
		{"list Secrets", func() error { return ctrl.List(ctx, &corev1.SecretList{}, client.InNamespace(namespace)) }},
		// Pods are listed (do-not-disrupt, at the deletion guard), never read one by one, changed or deleted.
		{"get a Pod", func() error {
			return ctrl.Get(ctx, client.ObjectKey{Namespace: namespace, Name: "p"}, &corev1.Pod{})
		}},
		{"delete a Pod", func() error {
			return ctrl.Delete(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: namespace}})
		}},
		{"evict a Pod", func() error {
			pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: namespace}}
			return ctrl.SubResource("eviction").Create(ctx, pod, &policyv1.Eviction{ObjectMeta: pod.ObjectMeta})
		}},
		{"create a NodeClaim", func() error {
			nc := &karpv1.NodeClaim{ObjectMeta: metav1.ObjectMeta{Name: "rogue"}, Spec: claim.Spec}
			return ctrl.Create(ctx, nc)
		}},
		{"strip a NodeClaim's finalizer (force deletion past Karpenter)", func() error {
			return ctrl.Patch(ctx, claim.DeepCopy(), stripFinalizers)
		}},
		{"update a NodePool", func() error { return ctrl.Update(ctx, pool.DeepCopy()) }},
		{"delete a NodePool", func() error { return ctrl.Delete(ctx, pool.DeepCopy()) }},
		{"read another Lease", func() error {
			return ctrl.Get(ctx, client.ObjectKeyFromObject(otherLease), &coordinationv1.Lease{})
		}},
		{"delete its own Lease", func() error {
			return ctrl.Delete(ctx, &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: leaseName, Namespace: namespace}})
		}},
		{"create a Lease outside its namespace", func() error {
			return ctrl.Create(ctx, &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: leaseName, Namespace: metav1.NamespaceDefault}})
		}},
		{"grant itself more (ClusterRoleBinding to cluster-admin)", func() error {
			return ctrl.Create(ctx, &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "escalate"},
				RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "cluster-admin"},
				Subjects: []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: controllerSA, Namespace: namespace}}})
		}},
	} {
		err := c.do()
		if !apierrors.IsForbidden(err) {
			t.Errorf("%s as the controller: err = %v, want 403 Forbidden", c.what, err)
			continue
		}
		var status apierrors.APIStatus
		if errors.As(err, &status) {
			t.Logf("refused as expected: %s: %s", c.what, status.Status().Message)
		}
	}
}
