package pipeline

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fleetrepair/fleetrepair/agent/detect"
	"github.com/fleetrepair/fleetrepair/agent/finding"
	"github.com/fleetrepair/fleetrepair/agent/kmsg"
	"github.com/fleetrepair/fleetrepair/agent/source"
	"github.com/fleetrepair/fleetrepair/agent/uplink"
)

type fakeChecker struct {
	name string
	res  source.Result
}

func (c fakeChecker) Name() string                        { return c.name }
func (c fakeChecker) Check(context.Context) source.Result { return c.res }

type fakePusher struct{}

func (fakePusher) Name() string { return "dcgm-policy" }
func (fakePusher) Run(ctx context.Context, emit func(source.Result)) error {
	emit(source.Result{State: finding.StateUnknown, Reason: "Error connecting to nv-hostengine"})
	<-ctx.Done()
	return nil
}

// TestMonitorsReachTheController runs the pipeline with a polled and a
// pushed monitor against a fake controller and checks the heartbeat
// (monitor states, inventory, driver) and the monitor's finding.
func TestMonitorsReachTheController(t *testing.T) {
	t.Parallel()
	mu, reports, up := fakeController(t)
	nvml := fakeChecker{name: "nvml", res: source.Result{State: finding.StateFailing, Reason: "GPU 1: GPU is lost",
		DriverVersion: "550.90.07", GPUs: []finding.GPU{{Index: 0, PCI: "0000:3b:00.0", Serial: "S0", Model: "NVIDIA H100"}},
		Findings: []finding.Finding{{Detector: finding.DetectorNVMLError, GPUPCI: "0000:3c:00.0",
			Attrs: map[string]string{finding.AttrError: "GPU is lost"}, Evidence: []string{"x"}}}}}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	done := make(chan error, 1)
	go func() {
		done <- Run(ctx, Config{Source: Replay{Path: "x", Open: func(string) (io.ReadCloser, error) {
			return io.NopCloser(strings.NewReader("")), nil
		}}, Uplink: up, Detector: detect.Options{Node: "node-a1", BootID: "b1"},
			Monitors: []Monitor{{Checker: nvml, Every: 50 * time.Millisecond}}, Pushers: []source.Pusher{fakePusher{}}})
	}()
	for {
		mu.Lock()
		var found bool
		var hb *finding.Heartbeat
		for _, r := range *reports {
			for _, f := range r.Findings {
				found = found || (f.Detector == finding.DetectorNVMLError && f.ID != "" && f.Node == "node-a1")
			}
			if r.Heartbeat != nil {
				hb = r.Heartbeat
			}
		}
		mu.Unlock()
		if found && hb != nil && len(hb.GPUs) == 1 && hb.DriverVersion == "550.90.07" && len(hb.Monitors) == 3 {
			states := map[string]string{}
			for _, m := range hb.Monitors {
				states[m.Name] = m.State
				if m.Since.IsZero() {
					t.Errorf("monitor %s without since", m.Name)
				}
			}
			if states["nvml"] != "failing" || states["dcgm-policy"] != "unknown" || states[KernelLogMonitor] != "ok" {
				t.Errorf("states %v", states)
			}
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("no complete report: %+v", *reports)
		}
		time.Sleep(10 * time.Millisecond)
	}
	cancel()
	if err := <-done; err != nil {
		t.Errorf("Run: %v", err)
	}
}

// TestReplayClock: a replayed /dev/kmsg file carries no wall-clock time; with
// a Clock each record gets the time it is replayed, records that carry their
// own time keep it, and without a Clock they stay untimed.
func TestReplayClock(t *testing.T) {
	t.Parallel()
	in := "4,10,7510129324,-;NVRM: Xid (PCI:0000:3b:00): 79, pid=1, GPU has fallen off the bus.\n" +
		"Feb  2 20:48:01 node-a1 kernel: NVRM: Xid (PCI:0000:3b:00): 79, pid=1, GPU has fallen off the bus.\n"
	at := time.Date(2026, 2, 2, 21, 0, 0, 0, time.UTC)
	read := func(clock func() time.Time) []kmsg.Record {
		out := make(chan kmsg.Record, 8)
		err := Replay{Path: "x", Clock: clock, Open: func(string) (io.ReadCloser, error) {
			return io.NopCloser(strings.NewReader(in)), nil
		}}.Run(context.Background(), out)
		if err != nil {
			t.Fatal(err)
		}
		close(out)
		var recs []kmsg.Record
		for r := range out {
			recs = append(recs, r)
		}
		if len(recs) != 2 {
			t.Fatalf("%d records, want 2", len(recs))
		}
		return recs
	}
	recs := read(func() time.Time { return at })
	if !recs[0].Time.Equal(at) || recs[1].Time.Month() != time.February || recs[1].Time.Hour() != 20 {
		t.Errorf("with a clock: %s, %s", recs[0].Time, recs[1].Time)
	}
	if recs := read(nil); !recs[0].Time.IsZero() {
		t.Errorf("without a clock the /dev/kmsg record got time %s", recs[0].Time)
	}
}

// fakeController is a controller that accepts every report and keeps it,
// and an uplink to it from node-a1 of cluster c1 that flushes and
// heartbeats every 20 ms. Read *reports holding mu.
func fakeController(t *testing.T) (*sync.Mutex, *[]finding.Report, *uplink.Uplink) {
	t.Helper()
	mu, reports := new(sync.Mutex), new([]finding.Report)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var rep finding.Report
		if err := json.NewDecoder(r.Body).Decode(&rep); err != nil {
			t.Errorf("decode report: %v", err)
		}
		mu.Lock()
		*reports = append(*reports, rep)
		mu.Unlock()
		w.WriteHeader(http.StatusAccepted)
	}))
	t.Cleanup(srv.Close)
	up, err := uplink.New(uplink.Config{URL: srv.URL, Cluster: "c1", Node: "node-a1", BootID: "b1",
		FlushInterval: 20 * time.Millisecond, HeartbeatInterval: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	return mu, reports, up
}
