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

	"github.com/fleetrepair/fleetrepair/controller/auth"
	"github.com/fleetrepair/fleetrepair/controller/catalog"
	"github.com/fleetrepair/fleetrepair/controller/ledger"
	"github.com/fleetrepair/fleetrepair/controller/store"
	"github.com/fleetrepair/fleetrepair/web/api"
)

func opsEnv(t *testing.T) (*env, *httptest.Server) {
	t.Helper()
	e := newEnv(t)
	ops, err := auth.NewOperators([]auth.Operator{
		{Name: "vera", Role: auth.RoleViewer, TokenSHA256: auth.TokenHash("viewer-token")},
		{Name: "otto", Role: auth.RoleApprover, TokenSHA256: auth.TokenHash("approver-token")},
		{Name: "ada", Role: auth.RoleAdmin, TokenSHA256: auth.TokenHash("admin-token")},
	})
	if err != nil {
		t.Fatal(err)
	}
	h, err := api.Handler(api.Config{Store: e.st, Catalog: catalog.Default(), Clusters: []string{"c1"}, Operators: ops,
		OnIngest: func(c, n string) { e.triggered = append(e.triggered, c+"/"+n) },
		Log:      slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return e, srv
}

func postAs(t *testing.T, url, token, body string) (int, string) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
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
	return resp.StatusCode, string(b)
}

func TestApproveAndReject(t *testing.T) {
	e, srv := opsEnv(t)
	ctx := context.Background()
	now := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	open := func(node string) int64 {
		r, _, err := e.st.OpenRepair(ctx, store.Repair{Cluster: "c1", Node: node, Reason: catalog.ReasonGPUHang, FaultClass: "gpu-hang",
			RecommendedAction: "reset-gpu", State: ledger.AwaitingApproval}, "controller", "held", now)
		if err != nil {
			t.Fatal(err)
		}
		return r.ID
	}
	a, b := open("n1"), open("n2")
	url := func(id int64, verb string) string { return fmt.Sprintf("%s/api/v1/repairs/%d/%s", srv.URL, id, verb) }
	for _, tc := range []struct {
		name, url, token, body string
		status                 int
	}{
		{"no token", url(a, "approve"), "", `{"reason":"x"}`, 401},
		{"unknown token", url(a, "approve"), "nope", `{"reason":"x"}`, 401},
		{"viewer may not approve", url(a, "approve"), "viewer-token", `{"reason":"x"}`, 403},
		{"reason required", url(a, "approve"), "approver-token", `{"reason":"  "}`, 400},
		{"malformed", url(a, "approve"), "approver-token", `{"why":"x"}`, 400},
		{"no such repair", url(999, "approve"), "approver-token", `{"reason":"x"}`, 404},
		{"approver approves", url(a, "approve"), "approver-token", `{"reason":"GPU reset by hand failed, replace"}`, 200},
		{"approving twice conflicts", url(a, "approve"), "approver-token", `{"reason":"again"}`, 409},
		{"admin rejects", url(b, "reject"), "admin-token", `{"reason":"known firmware bug, waiting for the fix"}`, 200},
	} {
		if status, body := postAs(t, tc.url, tc.token, tc.body); status != tc.status {
			t.Errorf("%s: %d %s, want %d", tc.name, status, body, tc.status)
		}
	}
	ra, _ := e.st.GetRepair(ctx, a)
	rb, _ := e.st.GetRepair(ctx, b)
	if ra.State != ledger.Approved || rb.State != ledger.Rejected {
		t.Fatalf("states = %s, %s; want approved, rejected", ra.State, rb.State)
	}
	audit, _ := e.st.RepairAudit(ctx, a)
	last := audit[len(audit)-1]
	if last.Actor != "user:otto" || !strings.Contains(last.Reason, "replace") {
		t.Fatalf("approval audit = %+v, want actor user:otto with the reason", last)
	}
	evs, _ := e.st.SecurityEvents(ctx, 10)
	if len(evs) != 3 {
		t.Fatalf("security events = %d, want 3 (two 401, one 403)", len(evs))
	}
	if len(e.triggered) != 2 {
		t.Fatalf("reconciles triggered = %v, want one per decision", e.triggered)
	}
}

func TestBreakerActions(t *testing.T) {
	_, srv := opsEnv(t)
	for _, tc := range []struct {
		name, path, token, body string
		status                  int
	}{
		{"approver may not switch", "/api/v1/breakers/kill-switch", "approver-token", `{"on":true,"reason":"x"}`, 403},
		{"on required", "/api/v1/breakers/kill-switch", "admin-token", `{"reason":"x"}`, 400},
		{"resume a closed breaker", "/api/v1/breakers/resume", "admin-token", `{"cohort":"zone=a","reason":"x"}`, 409},
		{"admin switches every repair off", "/api/v1/breakers/kill-switch", "admin-token", `{"on":true,"reason":"incident 123"}`, 200},
	} {
		if status, body := postAs(t, srv.URL+tc.path, tc.token, tc.body); status != tc.status {
			t.Errorf("%s: %d %s, want %d", tc.name, status, body, tc.status)
		}
	}
	req, _ := http.NewRequest(http.MethodGet, srv.URL+"/api/v1/breakers", nil)
	req.Header.Set("Authorization", "Bearer viewer-token") // reads need a viewer once operators are configured
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var v api.BreakerView
	if err := json.NewDecoder(resp.Body).Decode(&v); err != nil {
		t.Fatal(err)
	}
	if !v.State.KillSwitch.On || v.State.KillSwitch.Actor != "user:ada" || len(v.Decisions) != 1 || v.Decisions[0].Cause != "kill-switch" {
		t.Fatalf("breakers = %+v", v)
	}
}

// TestTokenHeader: X-Fleetrepair-Token carries an operator token where
// Authorization cannot (the Kubernetes API server's proxy drops it);
// Authorization wins when both are sent.
func TestTokenHeader(t *testing.T) {
	e, srv := opsEnv(t)
	seedFleet(t, e.st)
	send := func(hdr map[string]string) int {
		req, _ := http.NewRequest(http.MethodPost, srv.URL+"/api/v1/repairs/1/reject", strings.NewReader(`{"reason":"via the proxy"}`))
		req.Header.Set("Content-Type", "application/json")
		for k, v := range hdr {
			req.Header.Set(k, v)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	if code := send(map[string]string{"Authorization": "Bearer viewer-token", api.TokenHeader: "approver-token"}); code != http.StatusForbidden {
		t.Errorf("viewer Authorization with an approver header: %d, want 403 (Authorization wins)", code)
	}
	if code := send(map[string]string{api.TokenHeader: "approver-token"}); code != http.StatusOK {
		t.Errorf("approver token in %s: %d, want 200", api.TokenHeader, code)
	}
	audit, err := e.st.RepairAudit(context.Background(), 1)
	if err != nil || audit[len(audit)-1].Actor != "user:otto" || audit[len(audit)-1].Reason != "via the proxy" {
		t.Errorf("audit %+v (%v), want the rejection by user:otto", audit, err)
	}
}
