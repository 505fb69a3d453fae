package finding_test

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/fleetrepair/fleetrepair/agent/finding"
)

func report(node string, fs ...finding.Finding) finding.Report {
	return finding.Report{SchemaVersion: finding.SchemaVersion, Cluster: "prod-a", Node: node, BootID: "b1",
		SentAt: time.Date(2026, 12, 1, 9, 0, 0, 0, time.UTC), Findings: fs}
}

// TestCheckName: node and cluster names are Kubernetes node names (RFC 1123
// subdomains); hostile ones are refused with a reason (issue 11).
func TestCheckName(t *testing.T) {
	t.Parallel()
	for _, ok := range []string{"gpu-node-1", "ip-10-0-3-17.ec2.internal", "a", strings.Repeat("a", 63) + ".b"} {
		if err := finding.CheckName(ok); err != nil {
			t.Errorf("CheckName(%q) = %v, want nil", ok, err)
		}
	}
	for name, bad := range map[string]string{
		"empty":             "",
		"rtl override":      "node\u202egpj.exe",
		"newline":           "node-1\nERROR forged log line",
		"double dot":        "node..1",
		"dot dot":           "..",
		"leading dot":       ".node",
		"trailing dash":     "node-",
		"markup":            "<script>alert(1)</script>",
		"upper case":        "Node-1",
		"slash":             "a/b",
		"nul":               "node\x00",
		"too long":          strings.Repeat("a", 254),
		"label too long":    strings.Repeat("a", 64),
		"space":             "node 1",
		"unicode homoglyph": "nоde", // Cyrillic о
	} {
		if err := finding.CheckName(bad); err == nil {
			t.Errorf("%s: CheckName(%q) = nil, want an error", name, bad)
		}
	}
	r := report("node\u202e1")
	err := r.Validate()
	if err == nil || !strings.Contains(err.Error(), "node: ") || !strings.Contains(err.Error(), `\u202e`) {
		t.Fatalf("Validate of an RTL-override node name = %v, want a node problem quoting the name escaped", err)
	}
}

// TestXidRange: the agent and the controller share one Xid range (1..MaxXid);
// the agent's parser reads up to five digits, so 99999 must be valid.
func TestXidRange(t *testing.T) {
	t.Parallel()
	for xid, want := range map[int]bool{1: true, 79: true, 65537: true, finding.MaxXid: true, finding.MaxXid + 1: false} {
		r := report("n1", finding.Finding{ID: "f1", Detector: finding.DetectorXid, Xid: xid, Count: 1})
		if err := r.Validate(); (err == nil) != want {
			t.Errorf("Xid %d: Validate = %v, want valid=%v", xid, err, want)
		}
	}
}

// TestSanitizeHeartbeat: NUL bytes anywhere, heartbeat included, are escaped,
// so PostgreSQL never refuses a report for them (issue 11: a NUL in a driver
// string answered 400 with the raw database error).
func TestSanitizeHeartbeat(t *testing.T) {
	t.Parallel()
	r := report("n1", finding.Finding{ID: "f1", Detector: finding.DetectorGSPError, Count: 1,
		Attrs: map[string]string{"message\x00": "a\x00b"}, Evidence: []string{"x\x00y"}})
	r.AgentVersion = "v1\x00"
	r.Heartbeat = &finding.Heartbeat{DriverVersion: "550.54\x00", KernelVersion: "6.1\x00",
		Monitors: []finding.MonitorState{{Name: "nvml\x00", State: "ok", Reason: "r\x00"}},
		GPUs:     []finding.GPU{{PCI: "0000:3b:00.0", UUID: "GPU-\x00", Serial: "\x00", Model: "H100\x00", PCIID: "10de\x00"}}}
	r.Sanitize()
	if err := r.Validate(); err != nil {
		t.Fatal(err)
	}
	b, _ := json.Marshal(r)
	if strings.Contains(string(b), `\u0000`) {
		t.Fatalf("a NUL byte survived Sanitize: %s", b)
	}
	if r.Heartbeat.DriverVersion != `550.54\x00` || r.Findings[0].Attrs[`message\x00`] != `a\x00b` {
		t.Fatalf("escaped values lost information: %+v %+v", r.Heartbeat, r.Findings[0].Attrs)
	}
}

// FuzzReport decodes arbitrary JSON as the controller does (Sanitize, then
// Validate): nothing panics, and a report that validates has names that are
// Kubernetes names, Xids in range and no NUL byte left.
func FuzzReport(f *testing.F) {
	seed, _ := json.Marshal(report("n1", finding.Finding{ID: "f1", Detector: finding.DetectorXid, Xid: 79, Count: 1,
		Evidence: []string{"NVRM: Xid (PCI:0000:3b:00): 79"}}))
	f.Add(seed)
	f.Add([]byte(`{"schemaVersion":"fleetrepair.dev/v1","cluster":"c","node":"n\u202e","bootID":"b","findings":[]}`))
	f.Add([]byte(`{"schemaVersion":"fleetrepair.dev/v1","cluster":"c","node":"n","bootID":"b","findings":[],"heartbeat":{"driverVersion":"\u0000"}}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		var r finding.Report
		if json.Unmarshal(data, &r) != nil {
			return
		}
		r.Sanitize()
		if r.Validate() != nil {
			return
		}
		if finding.CheckName(r.Node) != nil || finding.CheckName(r.Cluster) != nil {
			t.Fatalf("valid report with a bad name: %q/%q", r.Cluster, r.Node)
		}
		for _, fd := range r.Findings {
			if fd.Xid < 0 || fd.Xid > finding.MaxXid {
				t.Fatalf("valid report with Xid %d", fd.Xid)
			}
		}
		if b, _ := json.Marshal(r); strings.Contains(string(b), `\u0000`) {
			t.Fatalf("NUL byte left after Sanitize: %s", b)
		}
	})
}
