// Package e2e runs the real agent binary against the real controller and a
// real PostgreSQL, with a simulated cluster (client fakes + simulated
// Karpenter): kernel log in, NodeClaim deletion out, history in the API.
package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	karpv1 "sigs.k8s.io/karpenter/pkg/apis/v1"

	"github.com/fleetrepair/fleetrepair/cmd/runner"
	"github.com/fleetrepair/fleetrepair/controller/config"
	"github.com/fleetrepair/fleetrepair/controller/kube"
	"github.com/fleetrepair/fleetrepair/controller/ledger"
	"github.com/fleetrepair/fleetrepair/controller/store"
	"github.com/fleetrepair/fleetrepair/test/expect"
	"github.com/fleetrepair/fleetrepair/test/karpentersim"
	"github.com/fleetrepair/fleetrepair/test/pgtest"
	"github.com/fleetrepair/fleetrepair/web/api"
)

var agentBin, controllerBin string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "fleetrepair-e2e-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	agentBin = filepath.Join(dir, "fleetrepair-agent")
	controllerBin = filepath.Join(dir, "fleetrepair")
	out, err := exec.Command("go", "build", "-o", dir+"/", "../../cmd/fleetrepair-agent", "../../cmd/fleetrepair").CombinedOutput()
	if err != nil {
		fmt.Fprintf(os.Stderr, "build binaries: %v\n%s", err, out)
		os.Exit(1)
	}
	code := pgtest.Run(m)
	os.RemoveAll(dir)
	os.Exit(code)
}

const cluster = "e2e"

type fleet struct {
	ctrl *runner.Controller
	sim  *karpentersim.Sim
	k    *kube.Cluster
}

// startFleet starts a controller (toleration tol) on a fresh database and a
// simulated cluster holding the given nodes.
func startFleet(t testing.TB, tol time.Duration, nodes ...string) *fleet {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	c := fake.NewClientBuilder().WithScheme(kube.Scheme).WithStatusSubresource(&corev1.Node{}, &karpv1.NodeClaim{}).Build()
	sim := karpentersim.New(c, 200*time.Millisecond)
	if err := sim.CreateNodePool(ctx, "gpu"); err != nil {
		t.Fatal(err)
	}
	for _, n := range nodes {
		if err := sim.CreateNode(ctx, karpentersim.NodeSpec{Name: n, NodePool: "gpu", Zone: "z1", InstanceType: "p5.48xlarge", GPUs: 8}); err != nil {
			t.Fatal(err)
		}
	}
	k := kube.New(cluster, c)
	ctrl, err := runner.Start(ctx, runner.Options{DatabaseURL: pgtest.DSN(t), Listen: "127.0.0.1:0",
		Clusters: map[string]*kube.Cluster{cluster: k}, Config: settings(tol, 200*time.Millisecond),
		Log: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{}, 2)
	go func() { _ = ctrl.Run(ctx); done <- struct{}{} }()
	go func() { _ = sim.Run(ctx, 100*time.Millisecond); done <- struct{}{} }()
	t.Cleanup(func() { cancel(); <-done; <-done })
	return &fleet{ctrl: ctrl, sim: sim, k: k}
}

// startAgent runs the real agent binary for node with extra flags; it is
// stopped (SIGTERM) at cleanup.
func startAgent(t testing.TB, url, node string, args ...string) {
	t.Helper()
	startAgentIn(t, url, cluster, node, args...)
}

// startAgentIn is startAgent for an agent of another cluster.
func startAgentIn(t testing.TB, url, clusterName, node string, args ...string) {
	t.Helper()
	cmd := exec.Command(agentBin, append([]string{"run", "--controller", url, "--cluster", clusterName, "--node", node,
		"--boot-id", "boot-" + node, "--listen", "", "--flush-interval", "200ms", "--heartbeat-interval", "1s"}, args...)...)
	logf, err := os.CreateTemp("", "agent-"+node+"-*.log")
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Signal(os.Interrupt)
		_ = cmd.Wait()
		if t.Failed() {
			b, _ := os.ReadFile(logf.Name())
			t.Logf("agent %s log:\n%s", node, b)
		}
		logf.Close()
		os.Remove(logf.Name())
	})
}

func fixture(t testing.TB, rel string) string {
	t.Helper()
	_, file, _, _ := runtime.Caller(0)
	p := filepath.Join(filepath.Dir(file), "..", "fixtures", "cases", rel)
	if _, err := os.Stat(p); err != nil {
		t.Fatal(err)
	}
	return p
}

func eventually(t testing.TB, timeout time.Duration, what string, cond func() (bool, string)) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	last := ""
	for time.Now().Before(deadline) {
		ok, state := cond()
		if ok {
			return
		}
		last = state
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("timed out after %s waiting for %s; last state: %s", timeout, what, last)
}

func getJSON(t testing.TB, url string, v any) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: %s", url, resp.Status)
	}
	if err := json.NewDecoder(resp.Body).Decode(v); err != nil {
		t.Fatalf("decode %s: %v", url, err)
	}
}

// TestAgentToReplacement: two real agent processes replay real kernel logs.
// The GPU-lost node's NodeClaim is deleted exactly once and the node
// replaced; the app-error node's never; the API shows both histories.
func TestAgentToReplacement(t *testing.T) {
	f := startFleet(t, 2*time.Second, "e2e-lost", "e2e-app", "e2e-quiet")
	startAgent(t, f.ctrl.URL, "e2e-lost", "--replay", fixture(t, "c01-xid79-aer-surprise-down/input.devkmsg.txt"))
	startAgent(t, f.ctrl.URL, "e2e-app", "--replay", fixture(t, "c10-xid31-driver-rollout/input.kmsg.txt"))
	ctx := context.Background()

	eventually(t, 60*time.Second, "GPU-lost repair to reach replaced", func() (bool, string) {
		rs, _, err := f.ctrl.Store.ListRepairs(ctx, store.RepairFilter{Node: "e2e-lost"})
		if err != nil || len(rs) == 0 {
			return false, fmt.Sprint("no repair ", err)
		}
		return rs[0].State == ledger.Replaced, string(rs[0].State)
	})
	// Let the controller run on: nothing more may happen.
	time.Sleep(1500 * time.Millisecond)

	reps := f.sim.Replacements()
	if len(reps) != 1 || reps[0].OldNode != "e2e-lost" {
		t.Fatalf("replacements = %+v, want exactly one, of e2e-lost", reps)
	}
	var page api.RepairPage
	getJSON(t, f.ctrl.URL+"/api/v1/repairs?cluster="+cluster, &page)
	if len(page.Items) != 1 || page.Items[0].Node != "e2e-lost" || page.Items[0].Reason != "GPULost" || page.Items[0].ExecutedAction != "replace" {
		t.Fatalf("repairs = %+v, want one GPULost repair of e2e-lost, executed as replace", page.Items)
	}
	var detail api.RepairDetail
	getJSON(t, fmt.Sprintf("%s/api/v1/repairs/%d", f.ctrl.URL, page.Items[0].ID), &detail)
	var audit []expect.Transition
	for _, a := range detail.Audit {
		audit = append(audit, expect.Transition{From: ledger.State(a.From), To: ledger.State(a.To)})
	}
	expect.ExpectPath(t, audit, ledger.Detected, ledger.Quarantined, ledger.Tolerating, ledger.Deleting, ledger.Replaced)
	xid79 := false
	for _, fd := range detail.Findings {
		if fd.Detector == "xid" && fd.Xid == 79 && fd.GPUPCI == "0000:02:00.0" && len(fd.Evidence) > 0 {
			xid79 = true
		}
	}
	if !xid79 {
		t.Fatalf("repair findings lack the Xid 79 line: %+v", detail.Findings)
	}

	var app api.NodeDetail
	getJSON(t, f.ctrl.URL+"/api/v1/nodes/"+cluster+"/e2e-app", &app)
	if len(app.Repairs) != 0 {
		t.Fatalf("app-error node has repairs: %+v", app.Repairs)
	}
	if len(app.Findings) == 0 || len(app.Diagnoses) == 0 {
		t.Fatalf("app-error node history missing: findings=%d diagnoses=%d", len(app.Findings), len(app.Diagnoses))
	}
	for _, d := range app.Diagnoses {
		if d.Severity != "event" || d.EventRecordedAt == nil {
			t.Fatalf("app-error diagnosis %+v, want an event-severity diagnosis with its Event recorded", d)
		}
	}
	if q, _ := f.k.Quarantined(ctx, "e2e-app"); q {
		t.Fatal("app-error node tainted")
	}
	if q, _ := f.k.Quarantined(ctx, "e2e-quiet"); q {
		t.Fatal("quiet node tainted")
	}
}

// settings is the default controller configuration with a toleration
// override and, when > 0, a resync period (tests run in seconds).
func settings(toleration, resync time.Duration) *config.Config {
	c := config.Default()
	c.Repair.Toleration = toleration
	if resync > 0 {
		c.Repair.Resync = resync
	}
	return &c
}
