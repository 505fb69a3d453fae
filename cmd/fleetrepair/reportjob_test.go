package main

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/fleetrepair/fleetrepair/agent/finding"
	"github.com/fleetrepair/fleetrepair/controller/auth"
	"github.com/fleetrepair/fleetrepair/controller/catalog"
	"github.com/fleetrepair/fleetrepair/controller/store"
	"github.com/fleetrepair/fleetrepair/test/pgtest"
	"github.com/fleetrepair/fleetrepair/web/api"
)

const c29 = "../../test/fixtures/cases/c29-nccl-ib-completion-error-peer/"

// TestReportJob sends case c29's job logs through `fleetrepair report-job`
// to a real API (PostgreSQL store): the reporting node and the peer get
// their findings, with the job, the NIC and NCCL's status; the pod log's
// own timestamp is kept; a peer no Node holds is said so; a resend stores
// nothing new; a viewer's token is refused; a log without NCCL errors is an
// error, not an empty report.
func TestReportJob(t *testing.T) {
	ctx := context.Background()
	st, srv := reportJobServer(t)
	cli := func(in string, args ...string) (string, error) {
		var out, errOut bytes.Buffer
		err := run(ctx, append([]string{"report-job", "--server", srv.URL}, args...), strings.NewReader(in), &out, &errOut)
		return out.String() + errOut.String(), err
	}
	out, err := cli("", "--token", "rep", "--cluster", "prod", "--job-id", "kubeflow/ml/job-a", "--job-source", "kubeflow",
		"--host", "job-a-worker-0=gpu-a", "--peer", "10.0.2.36=gpu-b", "--time", "2026-01-04T21:00:00Z", "--file", c29+"input.job.log")
	if err != nil || !strings.Contains(out, "1 failures, 2 findings (2 new) on gpu-a, gpu-b") {
		t.Fatalf("report-job: %v\n%s", err, out)
	}
	fa, err := st.FindingsForNode(ctx, "prod", "gpu-a", time.Time{}, 0)
	if err != nil || len(fa) != 1 {
		t.Fatalf("gpu-a: %v %+v", err, fa)
	}
	a := fa[0]
	if a.Detector != finding.DetectorNCCLNetError || a.Count != 3 || a.Attr(finding.AttrStatus) != "12" || a.Attr(finding.AttrVendorErr) != "129" ||
		a.Attr(finding.AttrPeer) != "10.0.2.36" || a.Attr(finding.AttrPeerNode) != "gpu-b" || a.Attr(finding.AttrHCA) != "fd00:0:0:0:0:0:a:22" ||
		a.Attr(finding.AttrJob) != "kubeflow/ml/job-a" || !a.Time.Equal(time.Date(2026, 1, 4, 21, 0, 0, 0, time.UTC)) || len(a.Evidence) != 3 {
		t.Errorf("gpu-a finding %+v", a)
	}
	fb, err := st.FindingsForNode(ctx, "prod", "gpu-b", time.Time{}, 0)
	if err != nil || len(fb) != 1 || fb[0].Attr(finding.AttrEnd) != finding.EndPeer || fb[0].Attr(finding.AttrPeer) != "gpu-a" {
		t.Errorf("gpu-b: %v %+v", err, fb)
	}
	// The pod log from standard input: its own timestamp, its HCA, a peer
	// the controller cannot place.
	pod, _ := readInput(c29+"input.pod.log", nil)
	out, err = cli(string(pod), "--token", "rep", "--cluster", "prod", "--job-id", "kubeflow/ml/job-b", "--job-source", "kubeflow",
		"--node", "gpu-c", "--file", "-")
	if err != nil || !strings.Contains(out, "1 failures, 1 findings (1 new) on gpu-c") || !strings.Contains(out, "10.0.3.84") {
		t.Fatalf("report-job pod log: %v\n%s", err, out)
	}
	fc, _ := st.FindingsForNode(ctx, "prod", "gpu-c", time.Time{}, 0)
	if len(fc) != 1 || fc[0].Attr(finding.AttrHCA) != "mlx5_26" || !fc[0].Time.Equal(time.Date(2026, 1, 4, 21, 33, 4, 0, time.UTC)) {
		t.Errorf("gpu-c: %+v", fc)
	}
	// A resend stores nothing twice.
	if out, err := cli(string(pod), "--token", "rep", "--cluster", "prod", "--job-id", "kubeflow/ml/job-b", "--job-source", "kubeflow",
		"--node", "gpu-c", "--file", "-"); err != nil || !strings.Contains(out, "(0 new)") {
		t.Errorf("resend: %v\n%s", err, out)
	}
	// A viewer may not report.
	if out, err := cli(string(pod), "--token", "view", "--cluster", "prod", "--job-id", "x", "--node", "gpu-c", "--file", "-"); err == nil ||
		!strings.Contains(err.Error(), "needs reporter") {
		t.Errorf("viewer: %v\n%s", err, out)
	}
	// The host NCCL prints is no Node name and nothing maps it: said before sending.
	if _, err := cli(string(pod), "--token", "rep", "--cluster", "prod", "--job-id", "x", "--host", "other=gpu-z", "--file", "-", "--dry-run"); err != nil {
		t.Errorf("dry run with the host as its Node name: %v", err)
	}
	if _, err := cli("nothing here\n", "--token", "rep", "--cluster", "prod", "--job-id", "x", "--file", "-"); err == nil ||
		!strings.Contains(err.Error(), "nothing to report") {
		t.Errorf("empty log: %v", err)
	}
	if _, err := cli(string(pod), "--token", "rep", "--cluster", "prod", "--file", "-"); err == nil || !strings.Contains(err.Error(), "job.id: required") {
		t.Errorf("no job id: %v", err)
	}
	// A ready JSON report is sent as it is.
	js := `{"schemaVersion":"fleetrepair.dev/v1","cluster":"prod","job":{"id":"ci/9","source":"ci"},"failures":[` +
		`{"kind":"nccl-net-error","node":"gpu-d","peer":{"node":"gpu-e"},"time":"2026-01-05T10:00:00Z"}]}`
	if out, err := cli(js, "--token", "rep", "--file", "-"); err != nil || !strings.Contains(out, "on gpu-d, gpu-e") {
		t.Errorf("json report: %v\n%s", err, out)
	}
}

// TestReportJobResendIsIdempotent: a job log whose lines carry no time,
// sent twice without --time (each run places them at its own now), stores
// each finding once; a reporting host that maps to no Node is warned
// about, a Node the controller knows is not.
func TestReportJobResendIsIdempotent(t *testing.T) {
	ctx := context.Background()
	st, srv := reportJobServer(t)
	cli := func(args ...string) (string, string, error) {
		var out, errOut bytes.Buffer
		err := run(ctx, append([]string{"report-job", "--server", srv.URL, "--token", "rep", "--cluster", "prod",
			"--job-id", "kubeflow/ml/job-a", "--job-source", "kubeflow", "--peer", "10.0.2.36=gpu-b", "--file", c29 + "input.job.log"}, args...),
			strings.NewReader(""), &out, &errOut)
		return out.String(), errOut.String(), err
	}
	// Without --host the job's host name is taken for the Node: none is.
	out, warn, err := cli()
	if err != nil || !strings.Contains(out, "(2 new)") {
		t.Fatalf("first send: %v\n%s%s", err, out, warn)
	}
	if !strings.Contains(warn, "warning: no Node of cluster prod is named job-a-worker-0") {
		t.Errorf("unmapped host not warned about: %q", warn)
	}
	if out, warn, err = cli(); err != nil || !strings.Contains(out, "(0 new)") {
		t.Fatalf("resend: %v\n%s%s", err, out, warn)
	}
	for _, n := range []string{"job-a-worker-0", "gpu-b"} {
		if fs, err := st.FindingsForNode(ctx, "prod", n, time.Time{}, 0); err != nil || len(fs) != 1 {
			t.Errorf("%s: %d findings, %v; want 1 (a resend is deduplicated)", n, len(fs), err)
		}
	}
	// A Node the controller knows (its agent reported) draws no warning.
	if _, err := st.IngestReport(ctx, finding.Report{SchemaVersion: finding.SchemaVersion, Cluster: "prod", Node: "gpu-a", BootID: "b"}, time.Now()); err != nil {
		t.Fatal(err)
	}
	if out, warn, err = cli("--host", "job-a-worker-0=gpu-a"); err != nil || !strings.Contains(out, "(2 new) on gpu-a, gpu-b") || warn != "" {
		t.Errorf("known node: %v\n%s%s", err, out, warn)
	}
}

// reportJobServer is the API of cluster prod on a fresh store, with the
// operators epilog (reporter, token "rep") and v (viewer, token "view").
func reportJobServer(t *testing.T) (*store.Store, *httptest.Server) {
	t.Helper()
	st := pgtest.Store(t)
	ops, err := auth.NewOperators([]auth.Operator{{Name: "epilog", Role: auth.RoleReporter, TokenSHA256: auth.TokenHash("rep")},
		{Name: "v", Role: auth.RoleViewer, TokenSHA256: auth.TokenHash("view")}})
	if err != nil {
		t.Fatal(err)
	}
	h, err := api.Handler(api.Config{Store: st, Catalog: catalog.Default(), Clusters: []string{"prod"}, Operators: ops,
		Log: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return st, srv
}
