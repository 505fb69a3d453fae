package api

import (
	"context"
	"net/http"

	"github.com/go-chi/chi/v5"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// UnmatchedRoute is the route label of a request no route matched (404
// "no such route", 405): every unknown path is this one series, never its
// own.
const UnmatchedRoute = "unmatched"

// streamRoutes are the long-lived routes: the request metrics count them
// when they end, and the duration histogram leaves them out, since a
// stream lasts as long as its client stays (hours for an open dashboard).
var streamRoutes = map[string]bool{"/api/v1/events": true}

// httpDurationBuckets are the buckets of
// fleetrepair_http_request_duration_seconds: bounds at the goals (p99 of
// ingest 100 ms, of the history reads 50 ms; docs/scale.md, "The goals,
// where they stand"), finer below them, and up to the ingest write bound
// (DefaultIngestTimeout, 5 s) and the shadow report's minutes (+Inf).
var httpDurationBuckets = []float64{.0025, .005, .01, .025, .05, .075, .1, .15, .25, .5, 1, 2.5, 5, 10, 30}

// httpMetrics are the HTTP server's request metrics, labelled by chi route
// pattern ("/api/v1/nodes/{cluster}/{node}", never the path), method and
// status code: a bounded set of series whatever the paths asked.
type httpMetrics struct {
	duration *prometheus.HistogramVec
	requests *prometheus.CounterVec
}

func newHTTPMetrics() *httpMetrics {
	labels := []string{"route", "method", "code"}
	return &httpMetrics{
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "fleetrepair_http_request_duration_seconds",
			Help:    "HTTP requests served, by route pattern, method and status code: seconds spent answering, from the router on (the long-lived stream /api/v1/events left out).",
			Buckets: httpDurationBuckets}, labels),
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "fleetrepair_http_requests_total",
			Help: "HTTP requests served, by route pattern, method and status code (streams counted when they end)."}, labels),
	}
}

func (m *httpMetrics) collectors() []prometheus.Collector {
	return []prometheus.Collector{m.duration, m.requests}
}

// unmatchedKey is the context key of a request's *bool that
// markUnmatched sets.
type unmatchedKey struct{}

// markUnmatched records that no route matched r (the NotFound and
// MethodNotAllowed handlers): chi's pattern is then empty or a mount's
// "/api/v1/*", and both are UnmatchedRoute.
func markUnmatched(r *http.Request) {
	if p, ok := r.Context().Value(unmatchedKey{}).(*bool); ok {
		*p = true
	}
}

// routeLabel is r's chi route pattern, read once the router has served r
// (the pattern is known only after routing), or UnmatchedRoute.
func routeLabel(r *http.Request) string {
	if p, ok := r.Context().Value(unmatchedKey{}).(*bool); ok && *p {
		return UnmatchedRoute
	}
	if rp := chi.RouteContext(r.Context()).RoutePattern(); rp != "" {
		return rp
	}
	return UnmatchedRoute
}

// instrument is chi middleware that counts and times every request below
// it (promhttp's handlers, with the route label). It must run inside a chi
// router (its Use), whose route context holds the pattern after routing.
func (m *httpMetrics) instrument(next http.Handler) http.Handler {
	route := promhttp.WithLabelFromRequest("route", routeLabel)
	h := promhttp.InstrumentHandlerCounter(m.requests,
		promhttp.InstrumentHandlerDuration(untimedStreams{m.duration}, next, route), route)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), unmatchedKey{}, new(bool))))
	})
}

// untimedStreams is the duration histogram that drops the observations of
// streamRoutes.
type untimedStreams struct{ *prometheus.HistogramVec }

func (u untimedStreams) With(l prometheus.Labels) prometheus.Observer {
	if streamRoutes[l["route"]] {
		return prometheus.ObserverFunc(func(float64) {})
	}
	return u.HistogramVec.With(l)
}

// Instrument wraps h in the request metrics of the API's routes
// (fleetrepair_http_request_duration_seconds, fleetrepair_http_requests_total),
// for the dashboard's own routes (web/ui): use it inside a chi router (Use,
// With or a Group), on the routes that do not fall through to the API's
// handler, which counts its own.
func (sv *Service) Instrument(h http.Handler) http.Handler { return sv.s.http.instrument(h) }
