package ui_test

import (
	"io"
	"maps"
	"net/http"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/fleetrepair/fleetrepair/web/api"
)

// TestRequestMetrics checks that the dashboard's pages are counted by
// their route pattern and that a request falling through to the API's
// handler is counted once, by the API's route (or as unmatched).
func TestRequestMetrics(t *testing.T) {
	reg := prometheus.NewRegistry()
	srv, _ := newPlainRegistered(t, true, reg)
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
