package api_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/fleetrepair/fleetrepair/agent/finding"
)

// TestIngestBoundsFreeText: a heartbeat or finding field out of its bound
// (a 100 KB driverVersion, gpuCount -3, a 10 KB attribute) is a 400 naming
// the field, and nothing of the report is stored.
func TestIngestBoundsFreeText(t *testing.T) {
	e := newEnv(t)
	hb := func(h finding.Heartbeat) string {
		r := finding.Report{SchemaVersion: finding.SchemaVersion, Cluster: "c1", Node: "n1", BootID: "b1", SentAt: time.Now(),
			Findings: []finding.Finding{xid("a", 79)}, Heartbeat: &h}
		b, _ := json.Marshal(r)
		return string(b)
	}
	huge := strings.Repeat("5", 100<<10)
	bigAttr := xid("a", 79)
	bigAttr.Attrs = map[string]string{"pid": strings.Repeat("1", 10<<10)}
	manyLines := xid("a", 79)
	manyLines.Evidence = make([]string, 100)
	for name, tc := range map[string]struct{ body, want string }{
		"driver version": {hb(finding.Heartbeat{DriverVersion: huge}), "heartbeat.driverVersion: longer than 256"},
		"image":          {hb(finding.Heartbeat{Image: huge}), "heartbeat.image: longer"},
		"negative gpus":  {hb(finding.Heartbeat{GPUCount: -3}), "heartbeat.gpuCount: -3 is not 0..64"},
		"monitor reason": {hb(finding.Heartbeat{Monitors: []finding.MonitorState{{Name: "xid", State: "ok", Reason: huge}}}), "heartbeat.monitors[0].reason: longer"},
		"gpu model":      {hb(finding.Heartbeat{GPUs: []finding.GPU{{Index: 0, PCI: "0000:3b:00.0", Model: huge}}}), "heartbeat.gpus[0].model: longer"},
		"gpu index":      {hb(finding.Heartbeat{GPUs: []finding.GPU{{Index: -7, PCI: "0000:3b:00.0"}}}), "heartbeat.gpus[0].index"},
		"attribute":      {report("n1", bigAttr), `findings[0].attrs["pid"]: longer than 4096`},
		"evidence lines": {report("n1", manyLines), "findings[0].evidence: 100 lines"},
		"agent version":  {strings.Replace(report("n1", xid("a", 79)), `"bootID"`, `"agentVersion":"`+huge+`","bootID"`, 1), "agentVersion: longer"},
	} {
		status, eb := e.post(t, tc.body)
		got := eb.Message + " " + eb.Detail + " " + strings.Join(eb.Validations, "; ")
		if status != 400 || !strings.Contains(got, tc.want) {
			t.Errorf("%s: %d %.300q, want 400 containing %q", name, status, got, tc.want)
		}
	}
	if fs, err := e.st.FindingsForNode(context.Background(), "c1", "n1", time.Time{}, 0); err != nil || len(fs) != 0 {
		t.Fatalf("findings after refused reports: %d (%v), want 0", len(fs), err)
	}
	if _, err := e.st.GetNode(context.Background(), "c1", "n1"); err == nil {
		t.Fatal("a refused report stored its node")
	}
}

// TestIngestFindingBefore2000: a finding timed before MinFindingTime (an
// unset clock: 1970-01-01) is stored at its receipt time with the agent's
// time kept in agent_time, as one far in the future is.
func TestIngestFindingBefore2000(t *testing.T) {
	e := newEnv(t)
	old := xid("old", 79)
	old.Time = time.Unix(0, 0).UTC()
	before := time.Now()
	if status, eb := e.post(t, report("n1", old)); status != 200 {
		t.Fatalf("post: %d %+v", status, eb)
	}
	fs, err := e.st.FindingsForNode(context.Background(), "c1", "n1", time.Time{}, 0)
	if err != nil || len(fs) != 1 {
		t.Fatalf("findings: %d %v", len(fs), err)
	}
	if fs[0].Time.Before(before.Add(-time.Second)) || fs[0].Attr("agent_time") != "1970-01-01T00:00:00Z" {
		t.Fatalf("stored time %v, agent_time %q: want the receipt time, the agent's 1970 kept", fs[0].Time, fs[0].Attr("agent_time"))
	}
}
