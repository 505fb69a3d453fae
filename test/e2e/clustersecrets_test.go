package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/fleetrepair/fleetrepair/agent/finding"
	"github.com/fleetrepair/fleetrepair/cmd/runner"
	"github.com/fleetrepair/fleetrepair/controller/auth"
	"github.com/fleetrepair/fleetrepair/controller/kube"
	"github.com/fleetrepair/fleetrepair/controller/ledger"
	"github.com/fleetrepair/fleetrepair/controller/remote"
	"github.com/fleetrepair/fleetrepair/controller/store"
	"github.com/fleetrepair/fleetrepair/test/envtest"
	"github.com/fleetrepair/fleetrepair/test/karpentersim"
	"github.com/fleetrepair/fleetrepair/test/pgtest"
)

// TestClustersFromSecrets: a controller started with one cluster (east,
// which also holds the cluster Secrets) picks up west from a labelled
// kubeconfig Secret without a restart: west's agents are authenticated by
// west's own TokenReview, a lost GPU there is repaired end to end (NodeClaim
// replaced), a broken Secret and one claiming a --cluster name are refused
// and counted, and deleting the Secret drops west (its reports are refused
// again, 401 as before, its ledger stays).
func TestClustersFromSecrets(t *testing.T) {
	envs := envtest.StartN(t, 2, envtest.Options{})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	home, err := kubernetes.NewForConfig(envs[0].Config)
	if err != nil {
		t.Fatal(err)
	}
	westCS, err := kubernetes.NewForConfig(envs[1].Config)
	if err != nil {
		t.Fatal(err)
	}
	const ns = "fleetrepair"
	if _, err := home.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{}, 2)
	sim := karpentersim.New(envs[1].Client, 300*time.Millisecond)
	if err := sim.CreateNodePool(ctx, "gpu"); err != nil {
		t.Fatal(err)
	}
	for _, n := range []string{"gpu-1", "gpu-2"} {
		if err := sim.CreateNode(ctx, karpentersim.NodeSpec{Name: n, NodePool: "gpu", Zone: "z1", InstanceType: "p5.48xlarge", GPUs: 8}); err != nil {
			t.Fatal(err)
		}
	}
	go func() { _ = sim.Run(ctx, 200*time.Millisecond); done <- struct{}{} }()

	reviews := &auth.TokenReview{Clusters: map[string]kubernetes.Interface{"east": home}}
	ctrl, err := runner.Start(ctx, runner.Options{DatabaseURL: pgtest.DSN(t), Listen: "127.0.0.1:0",
		Clusters:      map[string]*kube.Cluster{"east": kube.New("east", envs[0].Client)},
		Authenticator: reviews, Config: settings(2*time.Second, 300*time.Millisecond),
		ClusterSecrets: &runner.ClusterSecrets{Client: home, Namespace: ns,
			Connect: func(name string, cfg *rest.Config) (*kube.Cluster, kubernetes.Interface, error) {
				k, err := kube.NewCached(name, cfg, kube.CachedOptions{})
				if err != nil {
					return nil, nil, err
				}
				cs, err := kubernetes.NewForConfig(cfg)
				return k, cs, err
			}},
		Log: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = ctrl.Run(ctx); done <- struct{}{} }()
	defer func() { cancel(); <-done; <-done }()

	westToken := podToken(t, westCS, "gpu-1", auth.DefaultAudience)
	// Nothing about the served clusters is said before authentication: a
	// cluster not served has no TokenReview, so its agents are 401.
	if status, body := postXid(t, ctrl.URL, "west", "gpu-1", westToken); status != http.StatusUnauthorized {
		t.Fatalf("report for west before its Secret: %d %s, want 401", status, body)
	}

	kubeconfig, err := os.ReadFile(envs[1].Kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	secret := func(name string, data map[string]string) *corev1.Secret {
		s := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Labels: map[string]string{remote.Label: remote.LabelValue}},
			StringData: data}
		return s
	}
	for _, s := range []*corev1.Secret{
		secret("cluster-west", map[string]string{remote.KeyName: "west", remote.KeyKubeconfig: string(kubeconfig)}),
		secret("broken", map[string]string{remote.KeyKubeconfig: "not: [a kubeconfig"}),
		secret("steal-east", map[string]string{remote.KeyName: "east", remote.KeyKubeconfig: string(kubeconfig)}),
	} {
		if _, err := home.CoreV1().Secrets(ns).Create(ctx, s, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	eventually(t, 30*time.Second, "west served and reachable, 2 Secrets refused", func() (bool, string) {
		var cl struct {
			Items []struct {
				Name      string `json:"name"`
				Reachable bool   `json:"reachable"`
			} `json:"items"`
		}
		getJSON(t, ctrl.URL+"/api/v1/clusters", &cl)
		m := metric(t, ctrl.URL, `fleetrepair_cluster_secrets{state="invalid"}`) + " " + metric(t, ctrl.URL, `fleetrepair_cluster_secrets{state="served"}`)
		ok := len(cl.Items) == 2 && cl.Items[1].Name == "west" && cl.Items[1].Reachable && m == "2 1"
		return ok, fmt.Sprintf("%+v invalid/served=%s", cl.Items, m)
	})

	// West's agent, authenticated by west's TokenReview, reports a lost GPU:
	// the repair runs on west's API server through the Secret's credential.
	tokenFile := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(tokenFile, []byte(westToken), 0o600); err != nil {
		t.Fatal(err)
	}
	startAgentIn(t, ctrl.URL, "west", "gpu-1", "--token-file", tokenFile, "--replay", fixture(t, "c01-xid79-aer-surprise-down/input.devkmsg.txt"))
	eventually(t, 90*time.Second, "west gpu-1 replaced", func() (bool, string) {
		rs, _, err := ctrl.Store.ListRepairs(ctx, store.RepairFilter{Cluster: "west", Node: "gpu-1"})
		if err != nil || len(rs) == 0 {
			return false, fmt.Sprint(err)
		}
		return rs[0].State == ledger.Replaced && len(sim.Replacements()) == 1, string(rs[0].State)
	})

	if err := home.CoreV1().Secrets(ns).Delete(ctx, "cluster-west", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	eventually(t, 30*time.Second, "west dropped", func() (bool, string) {
		status, body := postXid(t, ctrl.URL, "west", "gpu-2", podToken(t, westCS, "gpu-2", auth.DefaultAudience))
		return status == http.StatusUnauthorized && strings.Contains(body, "claimed cluster"), fmt.Sprint(status, " ", body)
	})
	var cl struct {
		Items []struct {
			Name string `json:"name"`
		} `json:"items"`
	}
	getJSON(t, ctrl.URL+"/api/v1/clusters", &cl)
	if len(cl.Items) != 1 || cl.Items[0].Name != "east" {
		t.Fatalf("clusters after west's Secret went: %+v, want east only", cl.Items)
	}
	if rs, _, err := ctrl.Store.ListRepairs(ctx, store.RepairFilter{Cluster: "west"}); err != nil || len(rs) != 1 {
		t.Fatalf("west's ledger after the Secret went: %d repairs, %v; want the one repair kept", len(rs), err)
	}
}

// metric returns the value of one exposed series line of /metrics ("" when
// absent).
func metric(t *testing.T, url, series string) string {
	t.Helper()
	resp, err := http.Get(url + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, series+" "); ok {
			return v
		}
	}
	return ""
}

// postXid posts one Xid 13 finding for node of cluster with token and
// returns the answer's status and body.
func postXid(t *testing.T, url, cluster, node, token string) (int, string) {
	t.Helper()
	f := finding.Finding{Detector: "xid", Xid: 13, GPUPCI: "0000:3b:00.0", Count: 1, Evidence: []string{"xid 13 " + node + cluster}}
	f.ID = finding.NewID(f)
	body, _ := json.Marshal(finding.Report{SchemaVersion: finding.SchemaVersion, Cluster: cluster, Node: node, BootID: "b1", Findings: []finding.Finding{f}})
	req, _ := http.NewRequest(http.MethodPost, url+"/api/v1/reports", strings.NewReader(string(body)))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}
