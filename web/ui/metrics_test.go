package ui_test

import (
	"io"
	"log/slog"
	"maps"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/fleetrepair/fleetrepair/controller/auth"
	"github.com/fleetrepair/fleetrepair/controller/catalog"
	"github.com/fleetrepair/fleetrepair/test/pgtest"
	"github.com/fleetrepair/fleetrepair/web/api"
	"github.com/fleetrepair/fleetrepair/web/ui"
)

// TestRequestMetrics checks that the dashboard's pages are counted by
// their route pattern and that a request falling through to the API's
// handler is counted once, by the API's route (or as unmatched).
func TestRequestMetrics(t *testing.T) {
	st := pgtest.Store(t)
	reg := prometheus.NewRegistry()
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	svc, err := api.New(api.Config{Store: st, Catalog: catalog.Default(), Clusters: []string{"c1"}, Registerer: reg, Gatherer: reg, Log: log})
	if err != nil {
		t.Fatal(err)
	}
	h, err := ui.Handler(ui.Config{API: svc, APIHandler: svc.Handler(), DevLogin: true, Log: log,
		Sessions: auth.NewSessions(st.Sessions(nil), time.Hour, time.Hour, false)})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	c := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	for _, p := range []string{"/login", "/fleet", "/nodes/c1/n1", "/api/v1/reasons", "/api/v1/nodes/c1/n1", "/no/such/page"} {
		resp, err := c.Get(srv.URL + p)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{} // route -> requests
	for _, mf := range mfs {
		if mf.GetName() != "fleetrepair_http_requests_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "route" {
					got[l.GetValue()] += m.GetCounter().GetValue()
				}
			}
		}
	}
	want := map[string]float64{"/login": 1, "/fleet": 1, "/nodes/{cluster}/{node}": 1, "/api/v1/reasons": 1,
		"/api/v1/nodes/{cluster}/{node}": 1, api.UnmatchedRoute: 1}
	if !maps.Equal(got, want) {
		t.Fatalf("requests by route %v, want %v", got, want)
	}
}
