package cri

import (
	"context"
	"net"
	"path/filepath"
	"testing"
	"time"

	"google.golang.org/grpc"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/fleetrepair/fleetrepair/agent/finding"
)

// fakeRuntime is a CRI runtime service on a real unix socket.
type fakeRuntime struct {
	runtimeapi.UnimplementedRuntimeServiceServer
	hang  bool // Status never answers (a wedged runtime)
	ready bool
}

func (f *fakeRuntime) Version(context.Context, *runtimeapi.VersionRequest) (*runtimeapi.VersionResponse, error) {
	return &runtimeapi.VersionResponse{RuntimeName: "containerd", RuntimeVersion: "1.7.27"}, nil
}

func (f *fakeRuntime) Status(ctx context.Context, _ *runtimeapi.StatusRequest) (*runtimeapi.StatusResponse, error) {
	if f.hang {
		<-ctx.Done()
		return nil, ctx.Err()
	}
	return &runtimeapi.StatusResponse{Status: &runtimeapi.RuntimeStatus{Conditions: []*runtimeapi.RuntimeCondition{
		{Type: "RuntimeReady", Status: f.ready, Reason: "ContainerdNotReady", Message: "shim stuck"},
		{Type: "NetworkReady", Status: true},
	}}}, nil
}

func serve(t *testing.T, f *fakeRuntime) string {
	t.Helper()
	sock := filepath.Join(t.TempDir(), "containerd.sock")
	ln, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	runtimeapi.RegisterRuntimeServiceServer(srv, f)
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(srv.Stop)
	return sock
}

func TestCheck(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		rt      *fakeRuntime // nil: no socket
		states  []string
		wedges  []int
		version string
	}{
		{"ready", &fakeRuntime{ready: true}, []string{"ok", "ok"}, []int{0, 0}, "containerd 1.7.27"},
		{"status hangs", &fakeRuntime{hang: true}, []string{"ok", "failing", "failing"}, []int{0, 1, 0}, "containerd 1.7.27"},
		{"not ready", &fakeRuntime{}, []string{"ok", "failing"}, []int{0, 1}, "containerd 1.7.27"},
		{"no socket", nil, []string{"unknown", "unknown"}, []int{0, 0}, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			sock := filepath.Join(t.TempDir(), "missing.sock")
			if tt.rt != nil {
				sock = serve(t, tt.rt)
			}
			m := New(Options{Socket: sock, Timeout: 100 * time.Millisecond})
			for i, want := range tt.states {
				res := m.Check(context.Background())
				if res.State != want || len(res.Findings) != tt.wedges[i] {
					t.Errorf("check %d: state %q (%s), %d findings; want %q, %d", i, res.State, res.Reason, len(res.Findings), want, tt.wedges[i])
				}
				for _, f := range res.Findings {
					if f.Detector != finding.DetectorRuntimeWedge || f.Attr(finding.AttrCause) == "" {
						t.Errorf("finding %+v", f)
					}
				}
			}
			if m.Version != tt.version {
				t.Errorf("version %q, want %q", m.Version, tt.version)
			}
		})
	}
}
