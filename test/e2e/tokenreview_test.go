package e2e

import (
	"context"
	"io"
	"log/slog"
	"testing"
	"time"

	authnv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/fleetrepair/fleetrepair/cmd/runner"
	"github.com/fleetrepair/fleetrepair/controller/auth"
	"github.com/fleetrepair/fleetrepair/controller/kube"
	"github.com/fleetrepair/fleetrepair/test/envtest"
	"github.com/fleetrepair/fleetrepair/test/karpentersim"
	"github.com/fleetrepair/fleetrepair/test/pgtest"
)

// podToken mints a projected ServiceAccount token for an agent pod on node,
// with the given audience, through the real TokenRequest API.
func podToken(t *testing.T, cs kubernetes.Interface, node, audience string) string {
	t.Helper()
	ctx := context.Background()
	const ns, sa = "fleetrepair", "fleetrepair-agent"
	_, _ = cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{})
	_, _ = cs.CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: sa}}, metav1.CreateOptions{})
	pod, err := cs.CoreV1().Pods(ns).Get(ctx, "agent-"+node, metav1.GetOptions{})
	if err != nil {
		pod, err = cs.CoreV1().Pods(ns).Create(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "agent-" + node},
			Spec: corev1.PodSpec{NodeName: node, ServiceAccountName: sa,
				Containers: []corev1.Container{{Name: "agent", Image: "fleetrepair-agent"}}}}, metav1.CreateOptions{})
		if err != nil {
			t.Fatalf("create agent pod: %v", err)
		}
	}
	exp := int64(3600)
	tr, err := cs.CoreV1().ServiceAccounts(ns).CreateToken(ctx, sa, &authnv1.TokenRequest{Spec: authnv1.TokenRequestSpec{
		Audiences: []string{audience}, ExpirationSeconds: &exp,
		BoundObjectRef: &authnv1.BoundObjectReference{Kind: "Pod", APIVersion: "v1", Name: pod.Name, UID: pod.UID}}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("request token: %v", err)
	}
	return tr.Status.Token
}

// TestAgentTokensAgainstRealAPIServers: projected ServiceAccount tokens
// minted by a real API server, validated by TokenReview against the agent's
// own cluster. The right token for the right node is accepted; a token for
// another audience, used for another node, or presented to another cluster
// is refused with 401/403 and audited.
func TestAgentTokensAgainstRealAPIServers(t *testing.T) {
	envs := envtest.StartN(t, 2, envtest.Options{})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	clusters := map[string]*kube.Cluster{}
	reviewers := map[string]kubernetes.Interface{}
	var cs []kubernetes.Interface
	for i, name := range []string{"east", "west"} {
		sim := karpentersim.New(envs[i].Client, 0)
		_ = sim.CreateNodePool(ctx, "gpu")
		for _, n := range []string{"gpu-1", "gpu-2"} {
			if err := sim.CreateNode(ctx, karpentersim.NodeSpec{Name: n, NodePool: "gpu", Zone: "z1", InstanceType: "p5.48xlarge", GPUs: 8}); err != nil {
				t.Fatal(err)
			}
		}
		c, err := kubernetes.NewForConfig(envs[i].Config)
		if err != nil {
			t.Fatal(err)
		}
		clusters[name], reviewers[name] = kube.New(name, envs[i].Client), c
		cs = append(cs, c)
	}
	ctrl, err := runner.Start(ctx, runner.Options{DatabaseURL: pgtest.DSN(t), Listen: "127.0.0.1:0", Clusters: clusters,
		Authenticator: &auth.TokenReview{Clusters: reviewers, ServiceAccounts: []string{"system:serviceaccount:fleetrepair:fleetrepair-agent"}},
		Config:        settings(time.Hour, 0), Log: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { _ = ctrl.Run(ctx); close(done) }()
	defer func() { cancel(); <-done }()

	good := podToken(t, cs[0], "gpu-1", "fleetrepair")
	otherAud := podToken(t, cs[0], "gpu-2", "not-fleetrepair")
	post := func(clusterName, node, token string) (int, string) {
		return postXid(t, ctrl.URL, clusterName, node, token)
	}
	for _, tc := range []struct {
		name, cluster, node, token string
		status                     int
	}{
		{"own node, own cluster", "east", "gpu-1", good, 200},
		{"another node", "east", "gpu-2", good, 403},
		{"another cluster", "west", "gpu-1", good, 401},
		{"wrong audience", "east", "gpu-2", otherAud, 401},
		{"garbage token", "east", "gpu-1", "not-a-jwt", 401},
	} {
		if status, body := post(tc.cluster, tc.node, tc.token); status != tc.status {
			t.Errorf("%s: %d %s, want %d", tc.name, status, body, tc.status)
		}
	}
	evs, err := ctrl.Store.SecurityEvents(ctx, 20)
	if err != nil || len(evs) != 4 {
		t.Fatalf("security audit = %d entries (%v), want 4: %+v", len(evs), err, evs)
	}
}
