package procfs

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"sigs.k8s.io/yaml"

	"github.com/fleetrepair/fleetrepair/agent/finding"
	"github.com/fleetrepair/fleetrepair/agent/source/hostroot"
)

type proc struct {
	pid    int
	state  string
	sigpnd string
	fds    []string
}

func procTree(t *testing.T, procs []proc) hostroot.Root {
	t.Helper()
	root := t.TempDir()
	for _, p := range procs {
		dir := filepath.Join(root, "proc", strconv.Itoa(p.pid))
		if err := os.MkdirAll(filepath.Join(dir, "fd"), 0o755); err != nil {
			t.Fatal(err)
		}
		status := fmt.Sprintf("Name:\tpython3\nState:\t%s\nSigPnd:\t%s\nShdPnd:\t0000000000000000\n", p.state, p.sigpnd)
		if err := os.WriteFile(filepath.Join(dir, "status"), []byte(status), 0o644); err != nil {
			t.Fatal(err)
		}
		for i, target := range p.fds {
			if err := os.Symlink(target, filepath.Join(dir, "fd", strconv.Itoa(i))); err != nil {
				t.Fatal(err)
			}
		}
	}
	return hostroot.Root(root)
}

const killed = "0000000000000100"

func TestCheck(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name   string
		procs  []proc
		after  time.Duration
		state  string
		wedges int
	}{
		{"killed GPU process stuck", []proc{{pid: 42, state: "D (disk sleep)", sigpnd: killed, fds: []string{"/dev/nvidia0", "/dev/nvidiactl"}}}, 3 * time.Minute, "failing", 1},
		{"not stuck long enough", []proc{{pid: 42, state: "D (disk sleep)", sigpnd: killed, fds: []string{"/dev/nvidia0"}}}, 30 * time.Second, "ok", 0},
		{"D state, not killed", []proc{{pid: 42, state: "D (disk sleep)", sigpnd: "0", fds: []string{"/dev/nvidia0"}}}, 3 * time.Minute, "ok", 0},
		{"killed, not a GPU process", []proc{{pid: 42, state: "D (disk sleep)", sigpnd: killed, fds: []string{"/dev/sda"}}}, 3 * time.Minute, "ok", 0},
		{"killed GPU process running", []proc{{pid: 42, state: "R (running)", sigpnd: killed, fds: []string{"/dev/nvidia0"}}}, 3 * time.Minute, "ok", 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			now := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
			m := New(Options{Root: procTree(t, tt.procs), Now: func() time.Time { return now }})
			if res := m.Check(context.Background()); res.State != "ok" || len(res.Findings) != 0 {
				t.Fatalf("first sight: %+v", res)
			}
			now = now.Add(tt.after)
			res := m.Check(context.Background())
			if res.State != tt.state || len(res.Findings) != tt.wedges {
				t.Errorf("state %q findings %+v; want %q, %d", res.State, res.Findings, tt.state, tt.wedges)
			}
			if again := m.Check(context.Background()); len(again.Findings) != 0 || again.State != tt.state {
				t.Errorf("reported twice: %+v", again)
			}
		})
	}
}

// TestCaseC11StuckKill replays c11's context.simulate ("container_kill:
// never returns, process stuck in the driver, uninterruptible sleep") as a
// fake /proc and compares with the case's expected runtime-wedge finding.
func TestCaseC11StuckKill(t *testing.T) {
	t.Parallel()
	data, err := os.ReadFile("../../../test/fixtures/cases/c11-nvml-unknown-error-runtime-wedge/expected.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var c struct {
		Findings []map[string]any `json:"findings"`
	}
	if err := yaml.Unmarshal(data, &c); err != nil {
		t.Fatal(err)
	}
	var want map[string]any
	for _, f := range c.Findings {
		if f["detector"] == finding.DetectorRuntimeWedge {
			want = f
		}
	}
	if want == nil {
		t.Fatal("c11 expects no runtime-wedge finding")
	}
	now := time.Date(2021, 10, 5, 15, 16, 32, 0, time.UTC)
	m := New(Options{Root: procTree(t, []proc{{pid: 2560705, state: "D (disk sleep)", sigpnd: killed, fds: []string{"/dev/nvidia0"}}}),
		Now: func() time.Time { return now }})
	m.Check(context.Background())
	now = now.Add(10 * time.Minute)
	res := m.Check(context.Background())
	if len(res.Findings) != 1 {
		t.Fatalf("findings %+v", res.Findings)
	}
	g := res.Findings[0]
	if g.Detector != want["detector"] || g.Attr(finding.AttrCause) != want["cause"] || g.GPUPCI != "" || g.Xid != 0 ||
		fmt.Sprint(max(g.Count, 1)) != fmt.Sprint(want["count"]) {
		t.Errorf("got %+v, want %v", g, want)
	}
}
