package api_test

import (
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/fleetrepair/fleetrepair/controller/catalog"
	"github.com/fleetrepair/fleetrepair/test/pgtest"
	"github.com/fleetrepair/fleetrepair/web/api"
)

// TestHTTPRequestMetrics serves requests through the real router and reads
// the request metrics back: labelled by route pattern (never the path),
// method and status code; every unknown path in one UnmatchedRoute series;
// the live stream counted but not timed.
func TestHTTPRequestMetrics(t *testing.T) {
	reg := prometheus.NewRegistry()
	h, err := api.Handler(api.Config{Store: pgtest.Store(t), Catalog: catalog.Default(), Clusters: []string{"c1"},
		Registerer: reg, Gatherer: reg, Log: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	for _, rq := range []struct {
		method, path string
		want         int
	}{
		{"GET", "/livez", 200},
		{"GET", "/api/v1/nodes/c1/n1", 404},
		{"GET", "/api/v1/nodes/c1/n2", 404},
		{"GET", "/api/v1/repairs/7", 404},
		{"GET", "/api/v1/reasons", 200},
		{"GET", "/no/such/path", 404},
		{"GET", "/no/such/other", 404},
		{"GET", "/api/v1/no-such-route", 404},
		{"POST", "/livez", 405},
		{"GET", "/api/v1/events", 503}, // no Feed: the stream answers at once
	} {
		req, _ := http.NewRequest(rq.method, srv.URL+rq.path, nil)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != rq.want {
			t.Fatalf("%s %s: %d, want %d", rq.method, rq.path, resp.StatusCode, rq.want)
		}
	}

	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	// series is "route method code" -> the counter's value or the
	// histogram's count.
	series := func(name string) map[string]uint64 {
		out := map[string]uint64{}
		for _, mf := range mfs {
			if mf.GetName() != name {
				continue
			}
			for _, m := range mf.GetMetric() {
				l := map[string]string{}
				for _, lp := range m.GetLabel() {
					l[lp.GetName()] = lp.GetValue()
				}
				key := l["route"] + " " + l["method"] + " " + l["code"]
				if h := m.GetHistogram(); h != nil {
					out[key] = h.GetSampleCount()
					// Bounds at the goals: ingest p99 100 ms, history p99 50 ms.
					var bounds []float64
					for _, b := range h.GetBucket() {
						bounds = append(bounds, b.GetUpperBound())
					}
					if !slices.Contains(bounds, 0.1) || !slices.Contains(bounds, 0.05) {
						t.Errorf("%s{%s}: buckets %v, want bounds at 0.05 and 0.1 s", name, key, bounds)
					}
				} else {
					out[key] = uint64(m.GetCounter().GetValue())
				}
			}
		}
		return out
	}
	timed := map[string]uint64{
		"/livez get 200":                         1,
		"/api/v1/nodes/{cluster}/{node} get 404": 2,
		"/api/v1/repairs/{id} get 404":           1,
		"/api/v1/reasons get 200":                1,
		api.UnmatchedRoute + " get 404":          3,
		api.UnmatchedRoute + " post 405":         1,
	}
	counted := map[string]uint64{"/api/v1/events get 503": 1}
	for k, v := range timed {
		counted[k] = v
	}
	for name, want := range map[string]map[string]uint64{
		"fleetrepair_http_request_duration_seconds": timed,
		"fleetrepair_http_requests_total":           counted,
	} {
		got := series(name)
		if len(got) != len(want) {
			t.Errorf("%s: series %v, want %v", name, got, want)
			continue
		}
		for k, v := range want {
			if got[k] != v {
				t.Errorf("%s{%s}: %d, want %d (all: %v)", name, k, got[k], v, got)
			}
		}
		for k := range got {
			if strings.Contains(k, "c1") || strings.Contains(k, "no-such") || strings.Contains(k, "/no/") {
				t.Errorf("%s: a series labelled with a path: %q", name, k)
			}
		}
	}
}
