package finding

import (
	"errors"
	"strings"
	"testing"
	"time"
)

var jobNow = time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)

func goodJobReport() JobReport {
	st, ve := 12, 129
	return JobReport{SchemaVersion: SchemaVersion, Cluster: "c1", Job: Job{ID: "slurm/4242", Source: JobSourceSlurm, Name: "llama-70b"},
		Failures: []JobFailure{{Kind: JobFailureNCCLNet, Node: "gpu-a", NIC: "mlx5_26", Peer: JobPeer{Address: "10.0.3.84"},
			Time: jobNow.Add(-time.Hour), Count: 3, Status: &st, VendorErr: &ve,
			Evidence: []string{"job-b-master-0:617:2799 [3] transport/net_ib.cc:2360 NCCL WARN NET/IB: Got completion from peer 10.0.3.84<53393> with status=12"}}}}
}

// TestJobReportValidate: every problem of a bad report is listed, each
// naming its field.
func TestJobReportValidate(t *testing.T) {
	t.Parallel()
	good := goodJobReport()
	if err := good.Validate(jobNow); err != nil {
		t.Fatalf("good report: %v", err)
	}
	tests := []struct {
		name string
		mod  func(*JobReport)
		want string
	}{
		{"schema", func(r *JobReport) { r.SchemaVersion = "v0" }, "schemaVersion"},
		{"cluster", func(r *JobReport) { r.Cluster = "C 1" }, "cluster:"},
		{"job id missing", func(r *JobReport) { r.Job.ID = "" }, "job.id: required"},
		{"job id control bytes", func(r *JobReport) { r.Job.ID = "a\x1b[31m" }, "job.id:"},
		{"job id bidi override", func(r *JobReport) { r.Job.ID = "a\u202eb" }, "job.id:"},
		{"source", func(r *JobReport) { r.Job.Source = "lsf" }, "job.source"},
		{"no failures", func(r *JobReport) { r.Failures = nil }, "at least one failure"},
		{"too many failures", func(r *JobReport) {
			for len(r.Failures) <= MaxJobFailures {
				r.Failures = append(r.Failures, r.Failures[0])
			}
		}, "exceed the limit"},
		{"kind", func(r *JobReport) { r.Failures[0].Kind = "xid" }, "failures[0].kind"},
		{"node", func(r *JobReport) { r.Failures[0].Node = "../etc" }, "failures[0].node"},
		{"no peer", func(r *JobReport) { r.Failures[0].Peer = JobPeer{} }, "failures[0].peer: a node or an address"},
		{"peer is itself", func(r *JobReport) { r.Failures[0].Peer = JobPeer{Node: "gpu-a"} }, "the reporting node itself"},
		{"peer node", func(r *JobReport) { r.Failures[0].Peer = JobPeer{Node: "Gpu_B"} }, "failures[0].peer.node"},
		{"peer address with port", func(r *JobReport) { r.Failures[0].Peer.Address = "10.0.3.84:53393" }, "failures[0].peer.address"},
		{"peer address with zone", func(r *JobReport) { r.Failures[0].Peer.Address = "fe80::1%eth0" }, "failures[0].peer.address"},
		{"no time", func(r *JobReport) { r.Failures[0].Time = time.Time{} }, "failures[0].time: required"},
		{"future time", func(r *JobReport) { r.Failures[0].Time = jobNow.Add(time.Hour) }, "in the future"},
		{"count", func(r *JobReport) { r.Failures[0].Count = -1 }, "failures[0].count"},
		{"status", func(r *JobReport) { v := 1 << 20; r.Failures[0].Status = &v }, "failures[0].status"},
		{"evidence lines", func(r *JobReport) { r.Failures[0].Evidence = make([]string, MaxJobEvidence+1) }, "failures[0].evidence:"},
		{"evidence NUL", func(r *JobReport) { r.Failures[0].Evidence = []string{"a\x00b"} }, "failures[0].evidence[0]"},
		{"evidence long", func(r *JobReport) { r.Failures[0].Evidence = []string{strings.Repeat("x", MaxEvidenceLine+1)} }, "failures[0].evidence[0]"},
		{"nic", func(r *JobReport) { r.Failures[0].NIC = strings.Repeat("m", 200) }, "failures[0].nic"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			r := goodJobReport()
			tt.mod(&r)
			err := r.Validate(jobNow)
			var ve *ValidationError
			if !errors.As(err, &ve) || !strings.Contains(strings.Join(ve.Problems, "\n"), tt.want) {
				t.Fatalf("Validate: %v, want a problem with %q", err, tt.want)
			}
		})
	}
}

// TestJobReportFindings: a failure becomes a finding on the reporting node
// and one on the resolved peer, with the job, NICs, status and vendor error;
// a resend makes the same IDs; an unresolved peer gets no finding.
func TestJobReportFindings(t *testing.T) {
	t.Parallel()
	r := goodJobReport()
	resolve := func(a string) string { return map[string]string{"10.0.3.84": "gpu-b"}[a] }
	fs := r.Findings(resolve)
	if len(fs) != 2 {
		t.Fatalf("%d findings, want 2: %+v", len(fs), fs)
	}
	me, peer := fs[0], fs[1]
	if me.Node != "gpu-a" || me.Detector != DetectorNCCLNetError || me.Attr(AttrEnd) != EndReporter || me.Attr(AttrPeer) != "10.0.3.84" ||
		me.Attr(AttrPeerNode) != "gpu-b" || me.Attr(AttrHCA) != "mlx5_26" || me.Attr(AttrStatus) != "12" || me.Attr(AttrVendorErr) != "129" ||
		me.Attr(AttrJob) != "slurm/4242" || me.Attr(AttrJobSource) != "slurm" || me.Count != 3 || !me.Time.Equal(jobNow.Add(-time.Hour)) {
		t.Errorf("reporting end %+v", me)
	}
	if peer.Node != "gpu-b" || peer.Attr(AttrEnd) != EndPeer || peer.Attr(AttrPeer) != "gpu-a" || peer.Attr(AttrPeerHCA) != "mlx5_26" || peer.Attr(AttrHCA) != "" {
		t.Errorf("peer end %+v", peer)
	}
	if me.ID == peer.ID || len(me.ID) > 128 {
		t.Errorf("IDs %q %q", me.ID, peer.ID)
	}
	again := goodJobReport()
	if fs2 := again.Findings(resolve); fs2[0].ID != me.ID || fs2[1].ID != peer.ID {
		t.Error("a resent report makes other IDs")
	}
	if fs := r.Findings(nil); len(fs) != 1 || fs[0].Attr(AttrPeerNode) != "" {
		t.Errorf("unresolved peer: %+v", fs)
	}
	other := goodJobReport()
	other.Job.ID = "slurm/4243"
	if other.Findings(resolve)[0].ID == me.ID {
		t.Error("another job's failure has the same ID")
	}
}

// TestFabricIncident: many node pairs at once are the fabric; one node
// failing with every peer is that node's.
func TestFabricIncident(t *testing.T) {
	t.Parallel()
	f := func(a, b string) JobFailure { return JobFailure{Node: a, Peer: JobPeer{Node: b}} }
	tests := []struct {
		name  string
		fs    []JobFailure
		want  bool
		pairs int
	}{
		{"one pair, both directions", []JobFailure{f("a", "b"), f("b", "a")}, false, 1},
		{"three pairs", []JobFailure{f("a", "b"), f("c", "d"), f("e", "f")}, false, 3},
		{"four disjoint pairs", []JobFailure{f("a", "b"), f("c", "d"), f("e", "f"), f("g", "h")}, true, 4},
		{"one node with five peers", []JobFailure{f("a", "b"), f("a", "c"), f("a", "d"), f("a", "e"), f("a", "f")}, false, 5},
		{"a ring of six", []JobFailure{f("a", "b"), f("b", "c"), f("c", "d"), f("d", "e"), f("e", "f"), f("f", "a")}, true, 6},
	}
	for _, tt := range tests {
		if got, n := FabricIncident(tt.fs); got != tt.want || n != tt.pairs {
			t.Errorf("%s: %v %d, want %v %d", tt.name, got, n, tt.want, tt.pairs)
		}
	}
}
