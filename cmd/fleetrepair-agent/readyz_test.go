package main

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

func TestReadyz(t *testing.T) {
	now := time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)
	reg := prometheus.NewRegistry()
	g := prometheus.NewGauge(prometheus.GaugeOpts{Name: lastSuccessMetric, Help: "test"})
	reg.MustRegister(g)
	h := readyz{reg: reg, within: 90 * time.Second, now: func() time.Time { return now }}
	for _, c := range []struct {
		last time.Time
		code int
		body string
	}{
		{time.Time{}, http.StatusServiceUnavailable, "has not accepted a report"},
		{now.Add(-10 * time.Minute), http.StatusServiceUnavailable, "10m0s ago"},
		{now.Add(-30 * time.Second), http.StatusOK, "ok"},
	} {
		if !c.last.IsZero() {
			g.Set(float64(c.last.Unix()))
		}
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/readyz", nil))
		if rec.Code != c.code || !strings.Contains(rec.Body.String(), c.body) {
			t.Errorf("last %v: %d %q, want %d containing %q", c.last, rec.Code, rec.Body.String(), c.code, c.body)
		}
	}
}
