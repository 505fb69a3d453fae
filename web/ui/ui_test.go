package ui_test

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/fleetrepair/fleetrepair/controller/auth"
	"github.com/fleetrepair/fleetrepair/controller/catalog"
	"github.com/fleetrepair/fleetrepair/controller/lifecycle"
	"github.com/fleetrepair/fleetrepair/controller/store"
	"github.com/fleetrepair/fleetrepair/test/pgtest"
	"github.com/fleetrepair/fleetrepair/web/api"
	"github.com/fleetrepair/fleetrepair/web/ui"
)

// newPlain serves the dashboard without OIDC, with the demo's local login
// when dev is set.
func newPlain(t *testing.T, dev bool) (*httptest.Server, *store.Store) {
	t.Helper()
	return newPlainRegistered(t, dev, nil)
}

// newPlainRegistered is newPlain with the API's metrics registered in reg
// (none when nil).
func newPlainRegistered(t *testing.T, dev bool, reg prometheus.Registerer) (*httptest.Server, *store.Store) {
	t.Helper()
	st := pgtest.Store(t)
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	svc, err := api.New(api.Config{Store: st, Catalog: catalog.Default(), Clusters: []string{"c1"}, Registerer: reg, Log: log})
	if err != nil {
		t.Fatal(err)
	}
	h, err := ui.Handler(ui.Config{API: svc, APIHandler: svc.Handler(), DevLogin: dev, Log: log,
		Sessions: auth.NewSessions(st.Sessions(nil), time.Hour, time.Hour, false)})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return srv, st
}

func client(t *testing.T) *http.Client {
	t.Helper()
	jar, _ := cookiejar.New(nil)
	return &http.Client{Jar: jar}
}

func post(t *testing.T, c *http.Client, u string, form url.Values) (int, string) {
	t.Helper()
	resp, err := c.PostForm(u, form)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func TestDevLoginOnlyInDemoMode(t *testing.T) {
	srv, _ := newPlain(t, false)
	c := client(t)
	if code, _ := post(t, c, srv.URL+"/auth/dev", url.Values{"name": {"x"}, "role": {"admin"}}); code != http.StatusNotFound {
		t.Fatalf("dev login outside demo mode: %d, want 404", code)
	}
	resp, err := c.Get(srv.URL + "/fleet")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.Request.URL.Path != "/login" || !strings.Contains(string(b), "No login is configured") || strings.Contains(string(b), "dev-login") {
		t.Fatalf("GET /fleet without login ended at %s:\n%s", resp.Request.URL, b)
	}
}

// TestKillSwitchNeedsAdminAndConfirmation: an approver is refused (403,
// audited); an admin's first POST only asks, the confirmed one switches
// every deletion off through the API's code path, audited with the name.
func TestKillSwitchNeedsAdminAndConfirmation(t *testing.T) {
	srv, st := newPlain(t, true)
	ctx := context.Background()
	approver, admin := client(t), client(t)
	for c, role := range map[*http.Client]string{approver: "approver", admin: "admin"} {
		if code, body := post(t, c, srv.URL+"/auth/dev", url.Values{"name": {role + "-1"}, "role": {role}}); code != http.StatusOK || !strings.Contains(body, "DEMO MODE") {
			t.Fatalf("demo login as %s: %d", role, code)
		}
	}
	form := url.Values{"on": {"true"}, "reason": {"bad driver rollout"}, "confirm": {"on"}}
	if code, _ := post(t, approver, srv.URL+"/breakers/kill-switch", form); code != http.StatusForbidden {
		t.Fatalf("approver's kill switch: %d, want 403", code)
	}
	if code, body := post(t, admin, srv.URL+"/breakers/kill-switch", url.Values{"on": {"true"}, "reason": {"bad driver rollout"}}); code != http.StatusOK || !strings.Contains(body, `id="confirm-kill"`) {
		t.Fatalf("unconfirmed kill switch: %d, want the confirmation page", code)
	}
	if doc, _, _ := st.BreakerState(ctx); doc != nil && strings.Contains(string(doc), `"on":true`) {
		t.Fatal("kill switch on before the confirmation")
	}
	if code, body := post(t, admin, srv.URL+"/breakers/kill-switch", form); code != http.StatusOK || !strings.Contains(body, `id="kill-state">ON`) {
		t.Fatalf("confirmed kill switch: %d\n%s", code, body)
	}
	ds, err := st.BreakerDecisions(ctx, 1)
	if err != nil || len(ds) != 1 || ds[0].Actor != "user:demo:admin-1" || ds[0].Scope != "kill-switch" {
		t.Fatalf("breaker audit %+v, %v", ds, err)
	}
	evs, err := st.SecurityEvents(ctx, 1)
	if err != nil || len(evs) != 1 || evs[0].Subject != "demo:approver-1" || evs[0].Status != http.StatusForbidden {
		t.Fatalf("security audit %+v, %v", evs, err)
	}
}

func TestLogoutEndsTheSession(t *testing.T) {
	srv, _ := newPlain(t, true)
	c := client(t)
	if code, _ := post(t, c, srv.URL+"/auth/dev", url.Values{"name": {"a"}, "role": {"viewer"}}); code != http.StatusOK {
		t.Fatalf("login: %d", code)
	}
	u, _ := url.Parse(srv.URL)
	old := c.Jar.Cookies(u)
	if code, _ := post(t, c, srv.URL+"/logout", nil); code != http.StatusOK {
		t.Fatalf("logout: %d", code)
	}
	// The old cookie no longer opens a page: the session row is gone.
	replay := client(t)
	replay.Jar.SetCookies(u, old)
	resp, err := replay.Get(srv.URL + "/fleet")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.Request.URL.Path != "/login" {
		t.Fatalf("old session cookie after logout reached %s", resp.Request.URL.Path)
	}
}

func TestHistoryPage(t *testing.T) {
	srv, _ := newPlain(t, true)
	c := client(t)
	if code, _ := post(t, c, srv.URL+"/auth/dev", url.Values{"name": {"a"}, "role": {"viewer"}}); code != http.StatusOK {
		t.Fatalf("login: %d", code)
	}
	resp, err := c.Get(srv.URL + "/history")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(b), `id="chart-data">{"days":[`) || !strings.Contains(string(b), "no repairs in the range") {
		t.Fatalf("history: %d\n%s", resp.StatusCode, b)
	}
}

// TestFleetPageShowsStuckNodeClaims: the fleet page lists a cluster's
// stuck NodeClaims (state, for how long, why) and its lifecycle counts.
func TestFleetPageShowsStuckNodeClaims(t *testing.T) {
	st := pgtest.Store(t)
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	now := time.Now()
	claims := []lifecycle.Claim{
		{Cluster: "c1", Name: "gpu-7-nc", Node: "gpu-7", State: lifecycle.StateStuckTerminating, Stuck: true, For: "7d 2h",
			Detail: "deletion pending 7d 2h; finalizers [karpenter.sh/termination]"},
		{Cluster: "c1", Name: "gpu-1-nc", Node: "gpu-1", State: lifecycle.StateActive},
	}
	svc, err := api.New(api.Config{Store: st, Catalog: catalog.Default(), Clusters: []string{"c1"}, Log: log,
		NodeClaims: func(string) ([]lifecycle.Claim, time.Time, bool) { return claims, now, true }})
	if err != nil {
		t.Fatal(err)
	}
	h, err := ui.Handler(ui.Config{API: svc, APIHandler: svc.Handler(), DevLogin: true, Log: log,
		Sessions: auth.NewSessions(st.Sessions(nil), time.Hour, time.Hour, false)})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(h)
	defer srv.Close()
	c := client(t)
	if code, _ := post(t, c, srv.URL+"/auth/dev", url.Values{"name": {"a"}, "role": {"viewer"}}); code != http.StatusOK {
		t.Fatalf("login: %d", code)
	}
	resp, err := c.Get(srv.URL + "/fleet")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	page := string(b)
	for _, want := range []string{`data-nodeclaim="gpu-7-nc" data-state="stuck-terminating"`, "7d 2h", "karpenter.sh/termination",
		`data-state="active">active 1`, `data-state="stuck-terminating">stuck-terminating 1`} {
		if !strings.Contains(page, want) {
			t.Errorf("fleet page lacks %q", want)
		}
	}
	if strings.Contains(page, `data-nodeclaim="gpu-1-nc"`) {
		t.Error("an active NodeClaim is listed as stuck")
	}
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("fleet: %d", resp.StatusCode)
	}
}

// TestCrossOriginRefusalIsTheAPIEnvelope: with the dashboard mounted, a
// cross-origin POST to an API route is refused 403 in the API's JSON error
// envelope (not net/http's plain text), and a page's POST in plain text.
func TestCrossOriginRefusalIsTheAPIEnvelope(t *testing.T) {
	srv, _ := newPlain(t, true)
	for _, tc := range []struct {
		path, contentType, body string
		json                    bool
	}{
		{"/api/v1/breakers/kill-switch", "application/json", `{"on":true,"reason":"x"}`, true},
		{"/logout", "application/x-www-form-urlencoded", "", false},
	} {
		req, _ := http.NewRequest(http.MethodPost, srv.URL+tc.path, strings.NewReader(tc.body))
		req.Header.Set("Content-Type", tc.contentType)
		req.Header.Set("Origin", "https://evil.example")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusForbidden {
			t.Fatalf("POST %s from another origin: %d %s, want 403", tc.path, resp.StatusCode, b)
		}
		var eb api.ErrorBody
		isJSON := json.Unmarshal(b, &eb) == nil && eb.Message == "cross-site request refused" && strings.Contains(eb.Detail, "evil.example")
		if isJSON != tc.json || !strings.Contains(string(b), "request refused") {
			t.Errorf("POST %s from another origin: %s (%s), want the JSON envelope: %v", tc.path, b, resp.Header.Get("Content-Type"), tc.json)
		}
	}
}
