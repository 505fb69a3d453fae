package api_test

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/fleetrepair/fleetrepair/agent/finding"
	"github.com/fleetrepair/fleetrepair/controller/auth"
	"github.com/fleetrepair/fleetrepair/controller/catalog"
	"github.com/fleetrepair/fleetrepair/test/pgtest"
	"github.com/fleetrepair/fleetrepair/web/api"
)

// TestJobReports: POST /api/v1/job-reports on a real PostgreSQL. A report
// from a reporter token stores a finding on the reporting node and one on
// the peer (resolved from its address), reconciles both and leaves their
// agent facts alone; a resend inserts nothing; viewers, unknown tokens and
// agents' tokens are refused; malformed and invalid reports are 400 with
// every problem; a fabric incident says so.
func TestJobReports(t *testing.T) {
	ctx := context.Background()
	st := pgtest.Store(t)
	ops, err := auth.NewOperators([]auth.Operator{
		{Name: "slurm-epilog", Role: auth.RoleReporter, TokenSHA256: auth.TokenHash("rep-token")},
		{Name: "viewer", Role: auth.RoleViewer, TokenSHA256: auth.TokenHash("view-token")},
		{Name: "oncall", Role: auth.RoleApprover, TokenSHA256: auth.TokenHash("oncall-token")},
	})
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now().UTC().Truncate(time.Second)
	var triggered []string
	h, err := api.Handler(api.Config{Store: st, Catalog: catalog.Default(), Clusters: []string{"c1"}, Operators: ops,
		Authenticator: auth.StaticToken{Token: "agent-token"}, Now: func() time.Time { return now },
		OnIngest: func(c, n string) { triggered = append(triggered, c+"/"+n) },
		PeerNodes: func(_ context.Context, c string) (map[string]string, error) {
			return map[string]string{"10.0.3.84": "gpu-b"}, nil
		}, Log: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(h)
	defer srv.Close()
	// gpu-a's agent reported before: its facts must stay.
	if _, err := st.IngestReport(ctx, finding.Report{SchemaVersion: finding.SchemaVersion, Cluster: "c1", Node: "gpu-a", BootID: "boot-a",
		SentAt: now, Heartbeat: &finding.Heartbeat{DriverVersion: "570.158.01"}}, now.Add(-time.Minute)); err != nil {
		t.Fatal(err)
	}
	post := func(token, body string) (int, []byte) {
		t.Helper()
		req, _ := http.NewRequest(http.MethodPost, srv.URL+"/api/v1/job-reports", strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, b
	}
	body := func(mod func(*finding.JobReport)) string {
		st := 12
		r := finding.JobReport{SchemaVersion: finding.SchemaVersion, Cluster: "c1", Job: finding.Job{ID: "slurm/4242", Source: finding.JobSourceSlurm},
			Failures: []finding.JobFailure{
				{Kind: finding.JobFailureNCCLNet, Node: "gpu-a", NIC: "mlx5_26", Peer: finding.JobPeer{Address: "10.0.3.84"}, Time: now.Add(-time.Minute), Status: &st},
				{Kind: finding.JobFailureNCCLNet, Node: "gpu-a", NIC: "mlx5_26", Peer: finding.JobPeer{Address: "10.9.9.9"}, Time: now.Add(-time.Minute), Status: &st},
			}}
		if mod != nil {
			mod(&r)
		}
		b, _ := json.Marshal(r)
		return string(b)
	}

	code, b := post("rep-token", body(nil))
	var res api.JobReportResponse
	if err := json.Unmarshal(b, &res); err != nil || code != http.StatusOK {
		t.Fatalf("post: %d %s", code, b)
	}
	if res.Failures != 2 || res.Findings != 3 || res.Inserted != 3 || strings.Join(res.Nodes, ",") != "gpu-a,gpu-b" ||
		strings.Join(res.UnresolvedPeers, ",") != "10.9.9.9" || res.FabricIncident {
		t.Fatalf("response %+v", res)
	}
	if strings.Join(triggered, ",") != "c1/gpu-a,c1/gpu-b" {
		t.Errorf("triggered %v", triggered)
	}
	fa, err := st.FindingsForNode(ctx, "c1", "gpu-a", time.Time{}, 0)
	if err != nil || len(fa) != 2 || fa[0].Attr(finding.AttrJob) != "slurm/4242" || fa[0].Time.IsZero() {
		t.Fatalf("gpu-a findings %v %+v", err, fa)
	}
	fb, err := st.FindingsForNode(ctx, "c1", "gpu-b", time.Time{}, 0)
	if err != nil || len(fb) != 1 || fb[0].Attr(finding.AttrEnd) != finding.EndPeer || fb[0].Attr(finding.AttrPeer) != "gpu-a" {
		t.Fatalf("gpu-b findings %v %+v", err, fb)
	}
	if n, err := st.GetNode(ctx, "c1", "gpu-a"); err != nil || n.BootID != "boot-a" || n.DriverVersion != "570.158.01" || !n.LastSeen.Equal(now.Add(-time.Minute)) {
		t.Errorf("gpu-a's agent facts changed: %+v %v", n, err)
	}
	if _, err := st.GetNode(ctx, "c1", "gpu-b"); err == nil {
		t.Error("a job report made an agent node row for gpu-b")
	}
	// A resend (the reporter retrying) stores nothing twice; approvers may report.
	triggered = nil
	if code, b := post("oncall-token", body(nil)); code != http.StatusOK || !strings.Contains(string(b), `"inserted": 0`) || len(triggered) != 0 {
		t.Errorf("resend: %d %s, triggered %v", code, b, triggered)
	}

	for _, tt := range []struct {
		name, token, body string
		status            int
		want              string
	}{
		{"no token", "", body(nil), http.StatusUnauthorized, "no operator token"},
		{"an agent's token", "agent-token", body(nil), http.StatusUnauthorized, "unknown operator token"},
		{"a viewer", "view-token", body(nil), http.StatusForbidden, "needs reporter"},
		{"unknown field", "rep-token", strings.Replace(body(nil), `"cluster"`, `"clustre":"x","cluster"`, 1), http.StatusBadRequest, "unknown field"},
		{"trailing data", "rep-token", body(nil) + "{}", http.StatusBadRequest, "trailing data"},
		{"unserved cluster", "rep-token", body(func(r *finding.JobReport) { r.Cluster = "c9" }), http.StatusBadRequest, "not served"},
		{"invalid", "rep-token", body(func(r *finding.JobReport) {
			r.Job.Source = "lsf"
			r.Failures[0].Time = now.Add(time.Hour)
			r.Failures[1].Peer.Address = "10.0.0.1:80"
		}), http.StatusBadRequest, `"job.source: \"lsf\" is not one of slurm, kubeflow, ci, other",`},
	} {
		code, b := post(tt.token, tt.body)
		if code != tt.status || !strings.Contains(string(b), tt.want) {
			t.Errorf("%s: %d %s, want %d with %q", tt.name, code, b, tt.status, tt.want)
		}
	}
	// The invalid report lists all three problems.
	_, b = post("rep-token", body(func(r *finding.JobReport) {
		r.Job.Source = "lsf"
		r.Failures[0].Time = now.Add(time.Hour)
		r.Failures[1].Peer.Address = "10.0.0.1:80"
	}))
	var eb api.ErrorBody
	if err := json.Unmarshal(b, &eb); err != nil || len(eb.Validations) != 3 {
		t.Errorf("validations %+v", eb)
	}

	// Four disjoint pairs at once: a fabric incident.
	fabric := body(func(r *finding.JobReport) {
		r.Job.ID = "slurm/5000"
		r.Failures = nil
		for _, p := range [][2]string{{"n1", "n2"}, {"n3", "n4"}, {"n5", "n6"}, {"n7", "n8"}} {
			r.Failures = append(r.Failures, finding.JobFailure{Kind: finding.JobFailureNCCLNet, Node: p[0], Peer: finding.JobPeer{Node: p[1]}, Time: now})
		}
	})
	if code, b := post("rep-token", fabric); code != http.StatusOK || !strings.Contains(string(b), `"fabricIncident": true`) {
		t.Errorf("fabric: %d %s", code, b)
	}
	f8, err := st.FindingsForNode(ctx, "c1", "n8", time.Time{}, 0)
	if err != nil || len(f8) != 1 || f8[0].Attr(finding.AttrFabricIncident) != "true" {
		t.Errorf("n8 findings %v %+v", err, f8)
	}
}
