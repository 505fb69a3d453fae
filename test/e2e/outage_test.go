package e2e

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	karpv1 "sigs.k8s.io/karpenter/pkg/apis/v1"

	"github.com/fleetrepair/fleetrepair/cmd/runner"
	"github.com/fleetrepair/fleetrepair/controller/kube"
	"github.com/fleetrepair/fleetrepair/test/karpentersim"
	"github.com/fleetrepair/fleetrepair/test/pgtest"
)

// TestControllerOutageLosesNothing: the controller is down while the agent
// reads two kernel logs, and the agent is restarted in between (SIGTERM,
// then started again on the same spool directory). When the controller
// comes back, every finding of both runs is stored.
func TestControllerOutageLosesNothing(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close() // the controller is down: nothing listens here yet
	url := "http://" + addr
	spool := t.TempDir()
	run := func(file string, d time.Duration) {
		cmd := exec.Command(agentBin, "run", "--controller", url, "--cluster", cluster, "--node", "outage-1",
			"--boot-id", "boot-outage", "--listen", "", "--flush-interval", "200ms", "--heartbeat-interval", "1s",
			"--spool-dir", spool, "--replay", fixture(t, file))
		out, err := os.CreateTemp(t.TempDir(), "agent-*.log")
		if err != nil {
			t.Fatal(err)
		}
		cmd.Stdout, cmd.Stderr = out, out
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		time.Sleep(d) // the agent reads the file and fails to send, retrying
		_ = cmd.Process.Signal(os.Interrupt)
		_ = cmd.Wait()
	}
	run("c01-xid79-aer-surprise-down/input.devkmsg.txt", 3*time.Second)
	run("c05-xid48-xid64-rminit-failed/input.devkmsg.txt", 3*time.Second)
	entries, _ := os.ReadDir(spool)
	if len(entries) == 0 {
		t.Fatal("the agent left nothing in its spool during the outage")
	}

	// The controller comes back on the same address.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	c := fake.NewClientBuilder().WithScheme(kube.Scheme).WithStatusSubresource(&corev1.Node{}, &karpv1.NodeClaim{}).Build()
	sim := karpentersim.New(c, 0)
	_ = sim.CreateNodePool(ctx, "gpu")
	_ = sim.CreateNode(ctx, karpentersim.NodeSpec{Name: "outage-1", NodePool: "gpu", Zone: "z1", InstanceType: "p5.48xlarge", GPUs: 8})
	ctrl, err := runner.Start(ctx, runner.Options{DatabaseURL: pgtest.DSN(t), Listen: addr, Config: settings(time.Hour, 0),
		Clusters: map[string]*kube.Cluster{cluster: kube.New(cluster, c)}, Log: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { _ = ctrl.Run(ctx); close(done) }()
	defer func() { cancel(); <-done }()
	// A third run drains the spool (the agent sends what it kept first).
	startAgent(t, url, "outage-1", "--spool-dir", spool, "--boot-id", "boot-outage", "--replay", fixture(t, "c03-xid13-burst-then-xid109/input.kmsg.txt"))

	// c01: aer-correctable, aer-fatal, xid 79; c05: xid 48, xid 64, 4 rminit; c03: xid 13, xid 109.
	want := map[string]int{"xid 79": 1, "xid 48": 1, "xid 64": 1, "xid 13": 1, "xid 109": 1, "rminit-failed": 4, "aer-fatal": 1}
	eventually(t, 60*time.Second, "every finding of the outage stored", func() (bool, string) {
		fs, err := ctrl.Store.FindingsForNode(ctx, cluster, "outage-1", time.Time{}, 0)
		if err != nil {
			return false, err.Error()
		}
		got := map[string]int{}
		for _, f := range fs {
			k := f.Detector
			if f.Xid != 0 {
				k = fmt.Sprintf("xid %d", f.Xid)
			}
			got[k] += f.Count
		}
		for k, n := range want {
			if got[k] < n {
				return false, fmt.Sprintf("got %v", got)
			}
		}
		return true, ""
	})
}
