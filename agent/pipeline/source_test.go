package pipeline

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/fleetrepair/fleetrepair/agent/detect"
	"github.com/fleetrepair/fleetrepair/agent/finding"
	"github.com/fleetrepair/fleetrepair/agent/kmsg"
	"github.com/fleetrepair/fleetrepair/agent/source"
)

// TestKernelLogMissingKeepsAgentRunning: a kernel log that cannot be opened
// (here: a path that does not exist; on a node, EPERM under the device
// cgroup) does not stop the agent. The other monitors keep reporting, the
// heartbeat says kernel-log unknown with the error, the failure is counted,
// and once the file appears the source is opened and its records become
// findings.
func TestKernelLogMissingKeepsAgentRunning(t *testing.T) {
	t.Parallel()
	mu, reports, up := fakeController(t)
	path := filepath.Join(t.TempDir(), "kmsg")
	reg := prometheus.NewRegistry()
	dev := &kmsg.Device{Options: kmsg.ReaderOptions{Path: path}}
	sys := fakeChecker{name: "sysfs-gpu", res: source.Result{State: finding.StateOK}}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	done := make(chan error, 1)
	go func() {
		done <- Run(ctx, Config{Source: dev, Uplink: up, Detector: detect.Options{Node: "node-a1", BootID: "b1"},
			Monitors: []Monitor{{Checker: sys, Every: 50 * time.Millisecond}}, SourceRetry: 20 * time.Millisecond, Registerer: reg})
	}()
	// waitFor polls the reports until cond holds for the latest heartbeat
	// and the findings so far.
	waitFor := func(what string, cond func(hb *finding.Heartbeat, fs []finding.Finding) bool) {
		t.Helper()
		for {
			mu.Lock()
			var hb *finding.Heartbeat
			var fs []finding.Finding
			for _, r := range *reports {
				fs = append(fs, r.Findings...)
				if r.Heartbeat != nil {
					hb = r.Heartbeat
				}
			}
			mu.Unlock()
			if hb != nil && cond(hb, fs) {
				return
			}
			select {
			case err := <-done:
				t.Fatalf("%s: the agent stopped: %v", what, err)
			case <-ctx.Done():
				t.Fatalf("%s: not seen; last reports %+v", what, (*reports)[max(0, len(*reports)-2):])
			case <-time.After(10 * time.Millisecond):
			}
		}
	}
	state := func(hb *finding.Heartbeat, name string) finding.MonitorState {
		for _, m := range hb.Monitors {
			if m.Name == name {
				return m
			}
		}
		return finding.MonitorState{}
	}
	waitFor("kernel-log unknown, sysfs ok", func(hb *finding.Heartbeat, _ []finding.Finding) bool {
		k := state(hb, KernelLogMonitor)
		return k.State == finding.StateUnknown && strings.Contains(k.Reason, "no such file") &&
			state(hb, "sysfs-gpu").State == finding.StateOK
	})
	// The retries go on and are counted (no wall-clock bound: the test's
	// deadline only).
	for counterValue(t, reg, "fleetrepair_agent_source_failures_total") < 2 {
		select {
		case <-ctx.Done():
			t.Fatalf("source failures = %v, want the retries counted (>= 2)", counterValue(t, reg, "fleetrepair_agent_source_failures_total"))
		case <-time.After(10 * time.Millisecond):
		}
	}
	if v := gaugeValue(t, reg, "fleetrepair_agent_monitor_state", map[string]string{"monitor": KernelLogMonitor, "state": "unknown"}); v != 1 {
		t.Errorf("monitor_state{kernel-log,unknown} = %v, want 1", v)
	}

	line := "2,5,7510129324,-;NVRM: Xid (PCI:0000:3b:00): 79, pid=1, GPU has fallen off the bus.\n"
	if err := os.WriteFile(path, []byte(line), 0o600); err != nil {
		t.Fatal(err)
	}
	waitFor("kernel-log ok and the Xid 79 finding", func(hb *finding.Heartbeat, fs []finding.Finding) bool {
		xid := false
		for _, f := range fs {
			xid = xid || f.Xid == 79
		}
		return xid && state(hb, KernelLogMonitor).State == finding.StateOK
	})
	if v := gaugeValue(t, reg, "fleetrepair_agent_monitor_state", map[string]string{"monitor": KernelLogMonitor, "state": "ok"}); v != 1 {
		t.Errorf("monitor_state{kernel-log,ok} = %v, want 1", v)
	}
	cancel()
	if err := <-done; err != nil {
		t.Errorf("Run: %v", err)
	}
}

// metricValue returns the value of the sample of metric name whose labels
// include want, summed over the matching samples.
func metricValue(t *testing.T, reg prometheus.Gatherer, name string, want map[string]string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var v float64
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	sample:
		for _, m := range mf.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			for k, w := range want {
				if labels[k] != w {
					continue sample
				}
			}
			v += m.GetGauge().GetValue() + m.GetCounter().GetValue()
		}
	}
	return v
}

func counterValue(t *testing.T, reg prometheus.Gatherer, name string) float64 {
	t.Helper()
	return metricValue(t, reg, name, nil)
}

func gaugeValue(t *testing.T, reg prometheus.Gatherer, name string, labels map[string]string) float64 {
	t.Helper()
	return metricValue(t, reg, name, labels)
}
