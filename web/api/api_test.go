package api_test

import (
	"context"
	"encoding/json"
	"fmt"
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
	"github.com/fleetrepair/fleetrepair/controller/ledger"
	"github.com/fleetrepair/fleetrepair/controller/store"
	"github.com/fleetrepair/fleetrepair/test/pgtest"
	"github.com/fleetrepair/fleetrepair/web/api"
)

// runTests runs the tests on a throwaway PostgreSQL (TestMain, openapi_test.go).
func runTests(m *testing.M) int { return pgtest.Run(m) }

type env struct {
	srv       *httptest.Server
	st        *store.Store
	triggered []string
}

func newEnv(t *testing.T) *env {
	t.Helper()
	st := pgtest.Store(t)
	e := &env{st: st}
	h, err := api.Handler(api.Config{Store: st, Catalog: catalog.Default(), Clusters: []string{"c1"}, Authenticator: auth.StaticToken{Token: "secret"},
		OnIngest: func(c, n string) { e.triggered = append(e.triggered, c+"/"+n) },
		Log:      slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	e.srv = httptest.NewServer(h)
	t.Cleanup(e.srv.Close)
	return e
}

func (e *env) post(t *testing.T, body string, hdr ...string) (int, api.ErrorBody) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, e.srv.URL+"/api/v1/reports", strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer secret")
	for i := 0; i+1 < len(hdr); i += 2 {
		if hdr[i+1] == "" {
			req.Header.Del(hdr[i])
		} else {
			req.Header.Set(hdr[i], hdr[i+1])
		}
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var eb api.ErrorBody
	_ = json.NewDecoder(resp.Body).Decode(&eb)
	return resp.StatusCode, eb
}

func report(node string, fs ...finding.Finding) string {
	r := finding.Report{SchemaVersion: finding.SchemaVersion, Cluster: "c1", Node: node, BootID: "b1", SentAt: time.Now(), Findings: fs}
	b, _ := json.Marshal(r)
	return string(b)
}

func xid(id string, n int) finding.Finding {
	return finding.Finding{ID: id, Detector: "xid", Xid: n, GPUPCI: "0000:3b:00.0", Count: 1, Evidence: []string{"line"}}
}

func TestIngestRejectsBadReports(t *testing.T) {
	e := newEnv(t)
	good := report("n1", xid("a", 79))
	tests := []struct {
		name   string
		body   string
		hdr    []string
		status int
		want   string
	}{
		{"not json", "{", nil, 400, "malformed"},
		{"trailing data", good + "{}", nil, 400, "trailing"},
		{"unknown field", strings.Replace(good, `"cluster"`, `"colour":"red","cluster"`, 1), nil, 400, "unknown field"},
		{"wrong schema", strings.Replace(good, finding.SchemaVersion, "fleetrepair.dev/v9", 1), nil, 400, "schemaVersion"},
		{"missing id", report("n1", xid("", 79)), nil, 400, "findings[0].id"},
		{"other node", report("n1", finding.Finding{ID: "x", Detector: "xid", Xid: 79, Node: "n2", Count: 1}), nil, 400, "own node"},
		{"zero count", report("n1", finding.Finding{ID: "x", Detector: "xid", Xid: 79}), nil, 400, "count"},
		{"negative xid", report("n1", finding.Finding{ID: "x", Detector: "xid", Xid: -1, Count: 1}), nil, 400, "xid"},
		{"unknown cluster", strings.Replace(good, `"cluster":"c1"`, `"cluster":"c9"`, 1), nil, 403, "unknown cluster"},
		{"no token", good, []string{"Authorization", ""}, 401, "token"},
		{"wrong token", good, []string{"Authorization", "Bearer nope"}, 401, "token"},
		{"wrong content type", good, []string{"Content-Type", "text/plain"}, 415, "content type"},
		{"huge body", `{"findings":[` + strings.Repeat(`{"id":"x"},`, api.MaxReportBytes/10) + `{}]}`, nil, 413, "too large"},
	}
	for _, tc := range tests {
		status, eb := e.post(t, tc.body, tc.hdr...)
		got := eb.Message + " " + eb.Detail + " " + strings.Join(eb.Validations, "; ")
		if status != tc.status || !strings.Contains(got, tc.want) {
			t.Errorf("%s: %d %q, want %d containing %q", tc.name, status, got, tc.status, tc.want)
		}
	}
	// Nothing of the rejected reports was stored.
	fs, err := e.st.FindingsForNode(context.Background(), "c1", "n1", time.Time{}, 0)
	if err != nil || len(fs) != 0 {
		t.Fatalf("findings after rejected reports = %d (%v), want 0", len(fs), err)
	}
	if len(e.triggered) != 0 {
		t.Fatalf("reconciles triggered by rejected reports: %v", e.triggered)
	}
}

func TestIngestIsIdempotent(t *testing.T) {
	e := newEnv(t)
	body := report("n1", xid("a", 79), xid("b", 13))
	for i := 0; i < 3; i++ {
		if status, eb := e.post(t, body); status != 200 {
			t.Fatalf("post %d: %d %+v", i, status, eb)
		}
	}
	fs, _ := e.st.FindingsForNode(context.Background(), "c1", "n1", time.Time{}, 0)
	if len(fs) != 2 {
		t.Fatalf("findings = %d, want 2 after three identical posts", len(fs))
	}
	if len(e.triggered) != 1 {
		t.Fatalf("reconcile triggers = %v, want one (resends add nothing new)", e.triggered)
	}
}

func getStatus(t *testing.T, url string, v any) int {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if v != nil {
		_ = json.NewDecoder(resp.Body).Decode(v)
	}
	return resp.StatusCode
}

func TestRepairsListPaginationAndFilters(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	now := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	for i := 0; i < 7; i++ {
		node := fmt.Sprintf("n%d", i)
		reason := catalog.ReasonGPULost
		if i%2 == 1 {
			reason = catalog.ReasonGPUHang
		}
		if _, _, err := e.st.OpenRepair(ctx, store.Repair{Cluster: "c1", Node: node, Reason: reason, FaultClass: "gpu-lost",
			RecommendedAction: "replace"}, "test", "seed", now.Add(time.Duration(i)*time.Minute)); err != nil {
			t.Fatal(err)
		}
	}
	var ids []int64
	cursor := ""
	for pages := 0; ; pages++ {
		var page api.RepairPage
		if s := getStatus(t, e.srv.URL+"/api/v1/repairs?limit=3&cursor="+cursor, &page); s != 200 {
			t.Fatalf("list: %d", s)
		}
		for _, r := range page.Items {
			ids = append(ids, r.ID)
		}
		if page.NextCursor == "" || pages > 5 {
			break
		}
		cursor = page.NextCursor
	}
	if len(ids) != 7 {
		t.Fatalf("paged through %d repairs, want 7: %v", len(ids), ids)
	}
	for i := 1; i < len(ids); i++ {
		if ids[i] >= ids[i-1] {
			t.Fatalf("ids not strictly descending across pages: %v", ids)
		}
	}
	var page api.RepairPage
	getStatus(t, e.srv.URL+"/api/v1/repairs?reason=GPUHang&state=detected&cluster=c1", &page)
	if len(page.Items) != 3 {
		t.Fatalf("reason filter: %d items, want 3", len(page.Items))
	}
	getStatus(t, e.srv.URL+"/api/v1/repairs?since="+now.Add(5*time.Minute).Format(time.RFC3339), &page)
	if len(page.Items) != 2 {
		t.Fatalf("since filter: %d items, want 2", len(page.Items))
	}
	var detail api.RepairDetail
	if s := getStatus(t, fmt.Sprintf("%s/api/v1/repairs/%d", e.srv.URL, ids[0]), &detail); s != 200 || len(detail.Audit) != 1 || detail.Audit[0].To != string(ledger.Detected) {
		t.Fatalf("repair detail: %d %+v", s, detail)
	}
}

func TestQueryErrors(t *testing.T) {
	e := newEnv(t)
	for url, want := range map[string]int{
		"/api/v1/repairs?state=exploded":  400,
		"/api/v1/repairs?since=yesterday": 400,
		"/api/v1/repairs?cursor=abc":      400,
		"/api/v1/repairs?limit=0":         400,
		"/api/v1/repairs?limit=100000":    400,
		"/api/v1/repairs/abc":             400,
		"/api/v1/repairs/999999":          404,
		"/api/v1/nodes/c1/nobody":         404,
		"/api/v1/nope":                    404,
		"/api/v1/reasons":                 200,
		"/livez":                          200,
		"/readyz":                         200,
		"/metrics":                        200,
	} {
		var eb api.ErrorBody
		if s := getStatus(t, e.srv.URL+url, &eb); s != want {
			t.Errorf("GET %s = %d, want %d", url, s, want)
		} else if want >= 400 && eb.Message == "" {
			t.Errorf("GET %s: no error message in the envelope", url)
		}
	}
	var cat catalog.Catalog
	getStatus(t, e.srv.URL+"/api/v1/reasons", &cat)
	if cat.Version == "" || len(cat.Reasons) < 10 {
		t.Fatalf("reasons endpoint: version %q, %d reasons", cat.Version, len(cat.Reasons))
	}
}

// boundTo is an Authenticator whose every token is bound to one node.
type boundTo string

func (b boundTo) Authenticate(_ context.Context, token, cluster string) (auth.Identity, error) {
	if token != "secret" {
		return auth.Identity{}, fmt.Errorf("bad token: %w", auth.ErrUnauthenticated)
	}
	return auth.Identity{Cluster: cluster, Node: string(b), Subject: "system:serviceaccount:fr:agent"}, nil
}

// TestDeniedReportsAreAudited: a wrong token (401) and a token bound to
// another node (403) are refused with the reason, store nothing, and each
// leaves a security audit entry.
func TestDeniedReportsAreAudited(t *testing.T) {
	e := newEnv(t)
	h, err := api.Handler(api.Config{Store: e.st, Catalog: catalog.Default(), Clusters: []string{"c1"}, Authenticator: boundTo("n1"),
		Log: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(h)
	defer srv.Close()
	e.srv = srv
	if status, eb := e.post(t, report("n2", xid("a", 79))); status != 403 || !strings.Contains(eb.Detail, "own node") {
		t.Fatalf("report for another node: %d %+v", status, eb)
	}
	if status, _ := e.post(t, report("n1", xid("b", 79)), "Authorization", "Bearer wrong"); status != 401 {
		t.Fatalf("wrong token: %d", status)
	}
	if status, _ := e.post(t, report("n1", xid("c", 79))); status != 200 {
		t.Fatalf("valid report: %d", status)
	}
	evs, err := e.st.SecurityEvents(context.Background(), 10)
	if err != nil || len(evs) != 2 {
		t.Fatalf("security events = %+v (%v), want 2", evs, err)
	}
	if evs[1].Status != 403 || evs[1].Node != "n2" || evs[1].Subject == "" || evs[0].Status != 401 {
		t.Fatalf("security events = %+v", evs)
	}
	fs, _ := e.st.FindingsForNode(context.Background(), "c1", "n2", time.Time{}, 0)
	if len(fs) != 0 {
		t.Fatalf("denied report stored %d findings", len(fs))
	}
}

// TestIngestKeepsNULBytes: a kernel line with NUL bytes (read from a text
// file) is stored with the bytes escaped as \x00, and its batch-mates with it.
func TestIngestKeepsNULBytes(t *testing.T) {
	e := newEnv(t)
	bad := xid("nul", 13)
	bad.Evidence = []string{"NVRM: Xid (PCI:0000:3b:00): 13, \x00\x00 garbage"}
	bad.Attrs = map[string]string{"process": "a\x00b"}
	if status, eb := e.post(t, report("n1", bad, xid("ok", 79))); status != 200 {
		t.Fatalf("report with NUL bytes: %d %+v", status, eb)
	}
	fs, _ := e.st.FindingsForNode(context.Background(), "c1", "n1", time.Time{}, 0)
	if len(fs) != 2 {
		t.Fatalf("stored %d findings, want 2", len(fs))
	}
	for _, f := range fs {
		if f.ID == "nul" && (!strings.Contains(f.Evidence[0], `\x00\x00 garbage`) || f.Attrs["process"] != `a\x00b`) {
			t.Fatalf("NUL bytes not kept as \\x00: %q %q", f.Evidence[0], f.Attrs["process"])
		}
	}
}

func TestIngestRejectsMoreBadReports(t *testing.T) {
	e := newEnv(t)
	long := strings.Repeat("n", 300)
	r := finding.Report{SchemaVersion: finding.SchemaVersion, Cluster: "c1", Node: "n1", Findings: []finding.Finding{xid("a", 79)}}
	noBoot, _ := json.Marshal(r)
	for name, tc := range map[string]struct{ body, want string }{
		"duplicate ids":   {report("n1", xid("a", 79), xid("a", 13)), "repeats findings[0].id"},
		"huge xid":        {report("n1", xid("a", 99999999)), "not an Xid number"},
		"huge count":      {strings.Replace(report("n1", xid("a", 79)), `"count":1`, `"count":99999999999`, 1), "count"},
		"long node":       {report(long), "node: longer"},
		"bad gpu pci":     {report("n1", finding.Finding{ID: "x", Detector: "xid", Xid: 79, Count: 1, GPUPCI: "'; DROP TABLE x;--"}), "not a PCI address"},
		"missing boot id": {string(noBoot), "bootID: required"},
	} {
		status, eb := e.post(t, tc.body)
		got := eb.Message + " " + eb.Detail + " " + strings.Join(eb.Validations, "; ")
		if status != 400 || !strings.Contains(got, tc.want) {
			t.Errorf("%s: %d %q, want 400 containing %q", name, status, got, tc.want)
		}
	}
}

func TestMethodNotAllowedIsJSON(t *testing.T) {
	e := newEnv(t)
	req, _ := http.NewRequest(http.MethodDelete, e.srv.URL+"/api/v1/repairs/1", nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var eb api.ErrorBody
	if err := json.NewDecoder(resp.Body).Decode(&eb); err != nil || resp.StatusCode != 405 || eb.Message == "" {
		t.Fatalf("DELETE repair: %d %+v %v", resp.StatusCode, eb, err)
	}
}
