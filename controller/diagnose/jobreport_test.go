package diagnose_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/fleetrepair/fleetrepair/agent/finding"
	"github.com/fleetrepair/fleetrepair/controller/catalog"
	"github.com/fleetrepair/fleetrepair/controller/diagnose"
)

// TestJobReportFindings: job reports' NCCL failures on a node are events
// (NCCLNetworkError) until the node fails with several peers across at
// least two jobs (RDMANetworkDegraded, a condition); one job failing with
// many peers is not yet the node's; the findings of a fabric incident (many
// node pairs in one report) count for no node.
func TestJobReportFindings(t *testing.T) {
	t.Parallel()
	eng, err := diagnose.New(diagnose.Options{})
	if err != nil {
		t.Fatal(err)
	}
	now := time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)
	status := 12
	report := func(job string, pairs ...[2]string) []finding.Finding {
		r := finding.JobReport{SchemaVersion: finding.SchemaVersion, Cluster: "c1", Job: finding.Job{ID: job, Source: finding.JobSourceSlurm}}
		for _, p := range pairs {
			r.Failures = append(r.Failures, finding.JobFailure{Kind: finding.JobFailureNCCLNet, Node: p[0], NIC: "mlx5_0",
				Peer: finding.JobPeer{Node: p[1]}, Time: now.Add(-10 * time.Minute), Status: &status})
		}
		if err := r.Validate(now); err != nil {
			t.Fatal(err)
		}
		return r.Findings(nil)
	}
	on := func(node string, fss ...[]finding.Finding) []finding.Finding {
		var out []finding.Finding
		for _, fs := range fss {
			for _, f := range fs {
				if f.Node == node {
					out = append(out, f)
				}
			}
		}
		return out
	}
	head := func(fs []finding.Finding) (string, catalog.Severity) {
		ds := eng.Diagnose(diagnose.Input{Cluster: "c1", Node: "a", Findings: fs, Now: now})
		h := diagnose.Headline(ds)
		return h.Reason, h.Severity
	}
	one := report("slurm/1", [2]string{"a", "b"})
	if r, sev := head(on("a", one)); r != catalog.ReasonNCCLNetworkError || sev != catalog.SeverityEvent {
		t.Errorf("one failure: %s %s, want an NCCLNetworkError event", r, sev)
	}
	// The peer end is filed too.
	if fs := on("b", one); len(fs) != 1 || fs[0].Attr(finding.AttrEnd) != finding.EndPeer || fs[0].Attr(finding.AttrPeer) != "a" {
		t.Errorf("peer findings %+v", fs)
	}
	oneJob := report("slurm/2", [2]string{"a", "b"}, [2]string{"a", "c"}, [2]string{"a", "d"})
	if r, sev := head(on("a", oneJob)); sev != catalog.SeverityEvent {
		t.Errorf("one job, three peers: %s %s, want an event (a condition needs the failure to repeat across jobs)", r, sev)
	}
	twoJobs := report("slurm/3", [2]string{"a", "e"})
	if r, sev := head(on("a", oneJob, twoJobs)); r != catalog.ReasonRDMANetworkDegraded || sev != catalog.SeverityCondition {
		t.Errorf("two jobs, four peers: %s %s, want RDMANetworkDegraded", r, sev)
	}
	var pairs [][2]string
	for i := 0; i < 6; i++ {
		pairs = append(pairs, [2]string{fmt.Sprintf("n%d", 2*i), fmt.Sprintf("n%d", 2*i+1)})
	}
	pairs = append(pairs, [2]string{"a", "x"})
	fabric := report("slurm/4", pairs...)
	if ok, n := finding.FabricIncident(nil); ok || n != 0 {
		t.Errorf("no failures: fabric %v %d", ok, n)
	}
	if r, sev := head(on("a", oneJob, fabric)); sev != catalog.SeverityEvent {
		t.Errorf("a fabric incident's failures: %s %s, want events only", r, sev)
	}
}
