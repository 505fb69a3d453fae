package sysfs

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/fleetrepair/fleetrepair/agent/finding"
	"github.com/fleetrepair/fleetrepair/agent/source/hostroot"
)

// tree builds a fake /sys with the given functions: pci address -> "vendor class".
type fn struct{ addr, port, vendor, class string }

func tree(t *testing.T, fns []fn) hostroot.Root {
	t.Helper()
	root := t.TempDir()
	bus := filepath.Join(root, "sys/bus/pci/devices")
	if err := os.MkdirAll(bus, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, f := range fns {
		dev := filepath.Join(root, "sys/devices/pci0000:00", f.port, f.addr)
		write(t, filepath.Join(dev, "vendor"), f.vendor)
		write(t, filepath.Join(dev, "class"), f.class)
		write(t, filepath.Join(dev, "device"), "0x2330")
		write(t, filepath.Join(dev, "aer_dev_fatal"), "Undefined 0\nTOTAL_ERR_FATAL 0\n")
		write(t, filepath.Join(dev, "aer_dev_correctable"), "RxErr 0\nTOTAL_ERR_COR 0\n")
		write(t, filepath.Join(root, "sys/devices/pci0000:00", f.port, "aer_dev_fatal"), "SurpriseDown 0\nTOTAL_ERR_FATAL 0\n")
		if err := os.Symlink(dev, filepath.Join(bus, f.addr)); err != nil {
			t.Fatal(err)
		}
	}
	return hostroot.Root(root)
}

func write(t *testing.T, p, s string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte(s), 0o644); err != nil {
		t.Fatal(err)
	}
}

func gpus(n int) []fn {
	var out []fn
	for i := range n {
		a := "0000:" + string("3456789a"[i]) + "b:00.0"
		out = append(out, fn{addr: a, port: "0000:00:0" + string(rune('1'+i)) + ".0", vendor: "0x10de", class: "0x030200"})
	}
	return out
}

func TestCheckCount(t *testing.T) {
	t.Parallel()
	nic := fn{addr: "0000:05:00.0", port: "0000:00:1f.0", vendor: "0x15b3", class: "0x020000"}
	audio := fn{addr: "0000:06:00.1", port: "0000:00:1e.0", vendor: "0x10de", class: "0x040300"} // NVIDIA HDMI audio
	tests := []struct {
		name         string
		fns          []fn
		expected     int
		instanceType string
		state        string
		missing      string // gpu-count finding's missing attr, "" for none
		gpus         int
	}{
		{"all there", append(gpus(8), nic), 8, "", finding.StateOK, "", 8},
		{"one missing", append(gpus(7), nic, audio), 8, "", finding.StateFailing, "1", 7},
		{"from instance table", gpus(3), 0, "g5.12xlarge", finding.StateFailing, "1", 3},
		{"no expectation", gpus(2), 0, "", finding.StateOK, "", 2},
		{"no gpu, none expected", []fn{nic}, 0, "", finding.StateAbsent, "", 0},
		{"no gpu, 8 expected", []fn{nic}, 8, "", finding.StateFailing, "8", 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			s := New(Options{Root: tree(t, tt.fns), Expected: tt.expected, InstanceType: tt.instanceType})
			res := s.Check(context.Background())
			if res.State != tt.state || len(res.GPUs) != tt.gpus {
				t.Fatalf("state %q (%s), %d GPUs; want %q, %d", res.State, res.Reason, len(res.GPUs), tt.state, tt.gpus)
			}
			var missing string
			for _, f := range res.Findings {
				if f.Detector == finding.DetectorGPUCount {
					missing = f.Attr(finding.AttrMissing)
				}
			}
			if missing != tt.missing {
				t.Errorf("gpu-count missing=%q, want %q (%+v)", missing, tt.missing, res.Findings)
			}
			// Unchanged on the next check: nothing new is reported.
			if again := s.Check(context.Background()); len(again.Findings) != 0 {
				t.Errorf("second check reported %+v", again.Findings)
			}
		})
	}
}

func TestCheckUnknownWithoutSys(t *testing.T) {
	t.Parallel()
	res := New(Options{Root: hostroot.Root(t.TempDir())}).Check(context.Background())
	if res.State != finding.StateUnknown || res.Reason == "" {
		t.Errorf("state %q reason %q, want unknown with a reason", res.State, res.Reason)
	}
}

func TestCheckAER(t *testing.T) {
	t.Parallel()
	root := tree(t, gpus(1))
	now := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	s := New(Options{Root: root, Expected: 1, Now: func() time.Time { return now }})
	if res := s.Check(context.Background()); len(res.Findings) != 0 {
		t.Fatalf("first check with zero counters: %+v", res.Findings)
	}
	dev := root.Path("/sys/devices/pci0000:00/0000:00:01.0/0000:3b:00.0")
	write(t, filepath.Join(dev, "aer_dev_correctable"), "RxErr 40\nTOTAL_ERR_COR 40\n")
	write(t, root.Path("/sys/devices/pci0000:00/0000:00:01.0/aer_dev_fatal"), "SurpriseDown 1\nTOTAL_ERR_FATAL 1\n")
	now = now.Add(time.Minute)
	res := s.Check(context.Background())
	got := map[string]finding.Finding{}
	for _, f := range res.Findings {
		got[f.Detector] = f
	}
	if c := got[finding.DetectorAERCorrectable]; c.Count != 40 || c.GPUPCI != "0000:3b:00.0" || c.Attr("window_s") != "60" || c.Attr(finding.AttrErrors) != "RxErr" {
		t.Errorf("correctable finding %+v", c)
	}
	if f := got[finding.DetectorAERFatal]; f.Count != 1 || f.DevicePCI != "0000:00:01.0" || f.GPUPCI != "0000:3b:00.0" || f.Attr(finding.AttrErrors) != "SurpriseDown" {
		t.Errorf("fatal finding %+v", f)
	}
	if p := s.GPUBehindPort("0000:00:01.0"); p != "0000:3b:00.0" {
		t.Errorf("GPUBehindPort = %q", p)
	}
}

// TestReadCountersOutOfRange: a counter beyond u64 makes the file unread
// (an error naming the counter), never a map missing that counter, which
// would read as a counter that went back to 0.
func TestReadCountersOutOfRange(t *testing.T) {
	t.Parallel()
	p := filepath.Join(t.TempDir(), "aer_dev_fatal")
	write(t, p, "SurpriseDown 1\nTOTAL_ERR_FATAL 99999999999999999999999\n")
	if m, err := readCounters(p); err == nil || !strings.Contains(err.Error(), "TOTAL_ERR_FATAL") {
		t.Errorf("readCounters = %v, %v; want an error naming TOTAL_ERR_FATAL", m, err)
	}
	write(t, p, "SurpriseDown 1\nTOTAL_ERR_FATAL 18446744073709551615\n")
	if m, err := readCounters(p); err != nil || m["TOTAL_ERR_FATAL"] != 18446744073709551615 {
		t.Errorf("readCounters = %v, %v; want the largest u64", m, err)
	}
}
