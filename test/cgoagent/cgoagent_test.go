// Package cgoagent builds the agent as its image does (CGO_ENABLED=1: NVML
// through go-nvml, DCGM through go-dcgm, both dlopen'ed at run time) and
// runs the real binary on a node without the NVIDIA libraries, against a
// recording controller: the build works, the NVML and DCGM monitors' states
// say exactly why they cannot start, and the monitors that need no NVIDIA
// library (a CRI runtime on the socket, the kubelet's health port, sysfs)
// report ok.
package cgoagent

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/fleetrepair/fleetrepair/agent/finding"
	"github.com/fleetrepair/fleetrepair/agent/uplink"
	"github.com/fleetrepair/fleetrepair/test/envtest"
)

// buildCgo builds cmd/fleetrepair-agent with CGO_ENABLED=1 and checks the
// binary records it.
func buildCgo(t *testing.T) string {
	t.Helper()
	root, err := envtest.ModuleRoot()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := exec.LookPath(goEnv(t, "CC")); err != nil {
		t.Fatalf("the agent image is built with cgo and this test builds it the same way: no C compiler %q (%v); install gcc", goEnv(t, "CC"), err)
	}
	bin := filepath.Join(t.TempDir(), "fleetrepair-agent")
	cmd := exec.Command("go", "build", "-o", bin, "./cmd/fleetrepair-agent")
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "CGO_ENABLED=1")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("CGO_ENABLED=1 go build ./cmd/fleetrepair-agent: %v\n%s", err, out)
	}
	out, err := exec.Command("go", "version", "-m", bin).CombinedOutput()
	if err != nil || !strings.Contains(string(out), "CGO_ENABLED=1") {
		t.Fatalf("go version -m %s: %v, want CGO_ENABLED=1 in:\n%s", bin, err, out)
	}
	return bin
}

func goEnv(t *testing.T, key string) string {
	t.Helper()
	out, err := exec.Command("go", "env", key).Output()
	if err != nil {
		t.Fatalf("go env %s: %v", key, err)
	}
	return strings.TrimSpace(string(out))
}

// recorder is a controller that accepts every report and keeps the newest
// heartbeat's monitor states; it also serves the kubelet's /healthz.
type recorder struct {
	mu        sync.Mutex
	monitors  map[string]finding.MonitorState
	heartbeat finding.Heartbeat
	findings  []finding.Finding
}

func (rc *recorder) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	switch r.URL.Path {
	case "/healthz":
		_, _ = io.WriteString(w, "ok")
	case uplink.ReportsPath:
		var rep finding.Report
		if err := json.NewDecoder(r.Body).Decode(&rep); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		rc.mu.Lock()
		rc.findings = append(rc.findings, rep.Findings...)
		if rep.Heartbeat != nil {
			rc.heartbeat = *rep.Heartbeat
			for _, m := range rep.Heartbeat.Monitors {
				rc.monitors[m.Name] = m
			}
		}
		rc.mu.Unlock()
		w.WriteHeader(http.StatusAccepted)
		_, _ = io.WriteString(w, `{}`)
	default:
		http.NotFound(w, r)
	}
}

func (rc *recorder) states() map[string]finding.MonitorState {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	out := make(map[string]finding.MonitorState, len(rc.monitors))
	for k, v := range rc.monitors {
		out[k] = v
	}
	return out
}

// fakeRuntime is a container runtime's CRI: version and a ready status.
type fakeRuntime struct {
	runtimeapi.UnimplementedRuntimeServiceServer
}

func (fakeRuntime) Version(context.Context, *runtimeapi.VersionRequest) (*runtimeapi.VersionResponse, error) {
	return &runtimeapi.VersionResponse{Version: "0.1.0", RuntimeName: "containerd", RuntimeVersion: "v2.1.4", RuntimeApiVersion: "v1"}, nil
}

func (fakeRuntime) Status(context.Context, *runtimeapi.StatusRequest) (*runtimeapi.StatusResponse, error) {
	return &runtimeapi.StatusResponse{Status: &runtimeapi.RuntimeStatus{Conditions: []*runtimeapi.RuntimeCondition{
		{Type: "RuntimeReady", Status: true}, {Type: "NetworkReady", Status: true}}}}, nil
}

// serveCRI serves fakeRuntime on a unix socket at path.
func serveCRI(t *testing.T, path string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	g := grpc.NewServer()
	runtimeapi.RegisterRuntimeServiceServer(g, fakeRuntime{})
	go func() { _ = g.Serve(ln) }()
	t.Cleanup(g.Stop)
}

// fakeHost is a host root with nGPUs NVIDIA GPUs on the PCI bus (so NVML
// and DCGM are expected), a kernel log, a CRI socket and a kubelet port.
type fakeHost struct {
	root, kmsg string
	rc         *recorder
	srv        *httptest.Server
}

func newFakeHost(t *testing.T, nGPUs int) *fakeHost {
	t.Helper()
	host := t.TempDir()
	for i := range nGPUs {
		gpu := filepath.Join(host, "sys", "bus", "pci", "devices", fmt.Sprintf("0000:%02x:00.0", 0x3b+i))
		for name, v := range map[string]string{"vendor": "0x10de", "class": "0x030200", "device": "0x2330"} {
			if err := os.MkdirAll(gpu, 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(filepath.Join(gpu, name), []byte(v+"\n"), 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := os.MkdirAll(filepath.Join(host, "proc"), 0o755); err != nil {
		t.Fatal(err)
	}
	kmsg := filepath.Join(t.TempDir(), "kmsg.txt")
	if err := os.WriteFile(kmsg, []byte("6,1,1000,-;NVRM: loading NVIDIA UNIX x86_64 Kernel Module\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	serveCRI(t, filepath.Join(host, "run", "containerd", "containerd.sock"))
	rc := &recorder{monitors: map[string]finding.MonitorState{}}
	srv := httptest.NewServer(rc)
	t.Cleanup(srv.Close)
	return &fakeHost{root: host, kmsg: kmsg, rc: rc, srv: srv}
}

// run starts the agent binary on the host with env added to its
// environment, and stops it at the end of the test. It returns the agent's
// stderr.
func (h *fakeHost) run(t *testing.T, bin string, expectedGPUs int, env ...string) *strings.Builder {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	cmd := exec.CommandContext(ctx, bin, "run", "--controller", h.srv.URL, "--cluster", "c1", "--node", "n1", "--token", "t",
		"--boot-id", "b1", "--replay", h.kmsg, "--listen", "", "--host-root", h.root, "--expected-gpus", fmt.Sprint(expectedGPUs),
		"--monitor-interval", "200ms", "--heartbeat-interval", "200ms", "--flush-interval", "100ms",
		"--dcgm-address", "127.0.0.1:1", "--cri-socket", "/run/containerd/containerd.sock", "--kubelet-healthz", h.srv.URL+"/healthz")
	cmd.Env = append(os.Environ(), env...)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		cancel()
		t.Fatal(err)
	}
	t.Cleanup(func() { cancel(); _ = cmd.Wait() })
	return &stderr
}

// await waits up to a minute for the monitor states to match want and fails
// the test with the difference otherwise.
func (h *fakeHost) await(t *testing.T, stderr *strings.Builder, want map[string]struct {
	state   string
	reasons []string
}) map[string]finding.MonitorState {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	var got map[string]finding.MonitorState
	for time.Now().Before(deadline) {
		got = h.rc.states()
		if matches(got, want) == "" {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	if msg := matches(got, want); msg != "" {
		t.Fatalf("monitor states: %s\ngot %+v\nagent log:\n%s", msg, got, stderr.String())
	}
	return got
}

// TestCgoAgentSaysWhy runs the cgo agent on a fake host root with one
// NVIDIA GPU on the PCI bus (so NVML and DCGM are expected) and no NVIDIA
// library, and checks each monitor's state and reason.
func TestCgoAgentSaysWhy(t *testing.T) {
	bin := buildCgo(t)
	h := newFakeHost(t, 1)
	// An empty library path, so no NVIDIA library of this machine is found.
	stderr := h.run(t, bin, 1, "LD_LIBRARY_PATH=")
	got := h.await(t, stderr, map[string]struct {
		state   string
		reasons []string
	}{
		"nvml":              {finding.StateUnknown, []string{"libnvidia-ml.so.1", "runtimeClassName nvidia"}},
		"dcgm-health":       {finding.StateUnknown, []string{"dcgm init", "libdcgm.so.4"}},
		"container-runtime": {finding.StateOK, nil},
		"kubelet":           {finding.StateOK, nil},
		"sysfs-gpu":         {finding.StateOK, nil},
	})
	for name, m := range got {
		if strings.Contains(m.Reason, "without cgo") {
			t.Errorf("monitor %s: %q: the cgo build must not use the no-cgo stubs", name, m.Reason)
		}
		t.Logf("%-18s %-8s %s", name, m.State, m.Reason)
	}
}

// fakeNVML compiles testdata/fakenvml.c (a stand-in libnvidia-ml.so.1 built
// against go-nvml's own nvml.h) and returns the directory holding it.
func fakeNVML(t *testing.T) string {
	t.Helper()
	out, err := exec.Command("go", "list", "-m", "-f", "{{.Dir}}", "github.com/NVIDIA/go-nvml").Output()
	if err != nil {
		t.Fatalf("find go-nvml's nvml.h: %v", err)
	}
	dir := t.TempDir()
	cc := exec.Command(goEnv(t, "CC"), "-shared", "-fPIC", "-Wall", "-Werror",
		"-I", filepath.Join(strings.TrimSpace(string(out)), "pkg", "nvml"),
		"-o", filepath.Join(dir, "libnvidia-ml.so.1"), filepath.Join("testdata", "fakenvml.c"))
	if b, err := cc.CombinedOutput(); err != nil {
		t.Fatalf("build the stand-in libnvidia-ml.so.1: %v\n%s", err, b)
	}
	return dir
}

// TestCgoAgentReadsNVML runs the cgo agent against a stand-in
// libnvidia-ml.so.1 that it dlopens like the driver's: with two healthy
// GPUs the NVML monitor reads ok, reports the driver version and the
// inventory in its heartbeat; with a GPU whose handle answers GPU_IS_LOST
// it reads failing and reports an NVML finding for that GPU.
func TestCgoAgentReadsNVML(t *testing.T) {
	bin := buildCgo(t)
	lib := fakeNVML(t)
	t.Run("healthy", func(t *testing.T) {
		h := newFakeHost(t, 2)
		stderr := h.run(t, bin, 2, "LD_LIBRARY_PATH="+lib, "FAKE_NVML_GPUS=2", "FAKE_NVML_DRIVER=570.133.20")
		h.await(t, stderr, map[string]struct {
			state   string
			reasons []string
		}{
			"nvml":      {finding.StateOK, nil},
			"sysfs-gpu": {finding.StateOK, nil},
		})
		h.rc.mu.Lock()
		hb := h.rc.heartbeat
		h.rc.mu.Unlock()
		if hb.DriverVersion != "570.133.20" || len(hb.GPUs) != 2 || hb.GPUs[0].PCI != "0000:3b:00.0" || hb.GPUs[1].PCI != "0000:3c:00.0" ||
			hb.GPUs[0].Model != "NVIDIA H100 80GB HBM3" || !strings.HasPrefix(hb.GPUs[1].UUID, "GPU-") {
			t.Fatalf("heartbeat driver %q GPUs %+v: want 570.133.20 and two GPUs at 3b and 3c read through NVML", hb.DriverVersion, hb.GPUs)
		}
	})
	t.Run("GPU lost", func(t *testing.T) {
		h := newFakeHost(t, 2)
		stderr := h.run(t, bin, 2, "LD_LIBRARY_PATH="+lib, "FAKE_NVML_GPUS=2", "FAKE_NVML_LOST=1")
		h.await(t, stderr, map[string]struct {
			state   string
			reasons []string
		}{
			"nvml": {finding.StateFailing, []string{"GPU 1"}},
		})
		h.rc.mu.Lock()
		defer h.rc.mu.Unlock()
		for _, f := range h.rc.findings {
			if f.Detector == finding.DetectorNVMLError && f.Attrs[finding.AttrGPUIndex] == "1" {
				return
			}
		}
		t.Fatalf("no %s finding for GPU index 1 among %+v\nagent log:\n%s", finding.DetectorNVMLError, h.rc.findings, stderr.String())
	})
}

// matches says how got differs from want ("" when it does not).
func matches(got map[string]finding.MonitorState, want map[string]struct {
	state   string
	reasons []string
}) string {
	for name, w := range want {
		m, ok := got[name]
		if !ok {
			return fmt.Sprintf("no state for %s yet", name)
		}
		if m.State != w.state {
			return fmt.Sprintf("%s is %s (%q), want %s", name, m.State, m.Reason, w.state)
		}
		for _, r := range w.reasons {
			if !strings.Contains(m.Reason, r) {
				return fmt.Sprintf("%s reason %q does not name %q", name, m.Reason, r)
			}
		}
	}
	return ""
}
