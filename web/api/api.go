// Package api is fleetrepair's HTTP interface (chi): agent ingest
// (POST /api/v1/reports), repair history and node timelines for SREs, the
// reason catalog, and the operational endpoints /metrics, /livez and /readyz.
//
// Every error has one JSON envelope, {"message", "detail", "validations"};
// store errors map to status codes in one place (writeStoreError).
package api

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/go-chi/chi/v5"
	"github.com/go-chi/chi/v5/middleware"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"golang.org/x/time/rate"

	"github.com/fleetrepair/fleetrepair/agent/finding"
	"github.com/fleetrepair/fleetrepair/controller/auth"
	"github.com/fleetrepair/fleetrepair/controller/catalog"
	"github.com/fleetrepair/fleetrepair/controller/feed"
	"github.com/fleetrepair/fleetrepair/controller/ledger"
	"github.com/fleetrepair/fleetrepair/controller/lifecycle"
	"github.com/fleetrepair/fleetrepair/controller/store"
)

// MaxReportBytes bounds one ingest request body (4 MiB).
const MaxReportBytes = 4 << 20

// Config configures the API server.
type Config struct {
	Store   *store.Store
	Catalog *catalog.Catalog
	// Clusters are the cluster names this controller serves; reports for
	// other clusters are refused.
	Clusters []string
	// Serves, when set, answers whether a cluster is served at this moment
	// instead of Clusters (clusters picked up and dropped at run time from
	// kubeconfig Secrets; the reconciler's ClusterNames).
	Serves func(cluster string) bool
	// Authenticator checks agents' bearer tokens (auth.StaticToken for demos,
	// *auth.TokenReview in production). Nil accepts every report: only for
	// tests and explicitly insecure setups.
	Authenticator auth.Authenticator
	// OnIngest is called after a report is stored that inserted findings or
	// changed the node's agent facts (the reconciler's Trigger); a heartbeat
	// that changes nothing does not call it.
	OnIngest func(cluster, node string)
	// OnFindings, when set, is called instead of OnIngest after a report
	// that inserted findings (the reconciler's TriggerFindings: new
	// evidence is reconciled ahead of the rest).
	OnFindings func(cluster, node string)
	// MaxIngestInFlight bounds the reports being written to PostgreSQL at
	// once (default DefaultMaxIngestInFlight); a report beyond it is answered
	// 429 with Retry-After at once, so a slow database sheds load instead of
	// queueing requests without bound.
	MaxIngestInFlight int
	// IngestTimeout bounds one report's database write (default
	// DefaultIngestTimeout); a write that takes longer is answered 503 with
	// Retry-After. It is cancelled, but may still commit in the database
	// before the cancel arrives; the agent's resend is then recognised as a
	// duplicate (inserted 0), so nothing is lost or stored twice.
	IngestTimeout time.Duration
	// Operators authenticates humans for the mutating routes (approve,
	// reject). Nil: those routes answer 401. When set, every read of
	// /api/v1 needs an operator token (or a login session) of at least the
	// viewer role (requireViewer).
	Operators *auth.Operators
	// Login is set when the dashboard's login (OIDC or the demo's) is
	// configured: every read of /api/v1 then needs at least a viewer, as
	// with Operators.
	Login bool
	// Feed is the live feed GET /api/v1/events streams (controller/feed;
	// the caller runs it). Nil: that route answers 503.
	Feed *feed.Hub
	// ClusterStates reports each cluster's API server reachability (the
	// reconciler's Clusters); nil: every cluster is assumed reachable.
	ClusterStates func() []ClusterState
	// StaleAfter is how long an agent may stay silent before its node's
	// health is unknown (default 90s: three default heartbeats).
	StaleAfter time.Duration
	Gatherer   prometheus.Gatherer
	// Registerer receives the API's metrics (optional).
	Registerer prometheus.Registerer
	Now        func() time.Time
	Log        *slog.Logger

	// Shadow computes the shadow report of GET /api/v1/shadow for [since,
	// until): what the current policy would have done with the stored
	// findings (controller/shadow's Report; cmd/runner sets it). An
	// error wrapping store.ErrInvalid is a bad range (400). Nil: the route
	// answers 501.
	Shadow func(ctx context.Context, since, until time.Time) (any, error)
	// ShadowLimits are the report's own cost limits (range, findings,
	// lookback), shown with it (Service.ShadowLimits); the concurrency
	// fields are filled from Limits.
	ShadowLimits ShadowLimits
	// Limits bounds what one caller can make the controller do (per-source,
	// per-agent and token verification rates, shadow reports at once,
	// security_audit rows per minute); zero fields take the defaults.
	Limits Limits

	// NodeClaims returns a cluster's NodeClaims as the reconciler's last
	// periodic pass classified them (repair.Reconciler.NodeClaims), when,
	// and false when no pass listed the cluster yet. Nil: GET
	// /api/v1/clusters/{cluster}/nodeclaims answers 503 and the fleet
	// summary carries no NodeClaim counts.
	NodeClaims func(cluster string) ([]lifecycle.Claim, time.Time, bool)

	// PeerNodes maps a cluster's Node addresses (InternalIP, ExternalIP)
	// to Node names, for the peers of job reports named by address
	// (kube.Cluster.NodeAddresses). Nil: such peers stay unresolved.
	PeerNodes func(ctx context.Context, cluster string) (map[string]string, error)

	// ApprovalTTL is how long a held repair waits for a decision before it
	// expires (the reconciler's ApprovalTTL; default 24h),
	// shown as each held repair's expiry.
	ApprovalTTL time.Duration
}

// Ingest backpressure defaults (Config.MaxIngestInFlight, IngestTimeout)
// and the Retry-After answered with 429 (overloaded) and 503 (database
// unavailable), in seconds. The agent (agent/uplink) waits at least that long
// before it resends the same batch, spooling meanwhile. DefaultIngestTimeout
// is half the agent's own request timeout (agent/uplink
// DefaultRequestTimeout, 10 s): a write that slow is answered 503 with
// Retry-After while the agent still listens, instead of the agent giving up
// first and resending at once (docs/scale.md, "The harness at 100,000
// agents").
const (
	DefaultMaxIngestInFlight = 64
	DefaultIngestTimeout     = 5 * time.Second
	RetryAfterOverloaded     = 1
	RetryAfterUnavailable    = 5
)

type server struct {
	cfg Config
	// ingestSlots holds one token per report being written (a semaphore of
	// MaxIngestInFlight).
	ingestSlots chan struct{}
	// ingestErrLog samples the log of failed ingest writes.
	ingestErrLog rate.Sometimes
	clusters     map[string]bool
	reports      *prometheus.CounterVec
	reportsOK    prometheus.Counter // reports{result="ok"}, looked up once: every heartbeat counts on it
	findings     prometheus.Counter
	guards       *guards
	http         *httpMetrics // every route's duration and count (httpmetrics.go)
}

// Handler returns the HTTP handler with every route (New(cfg).Handler()).
func Handler(cfg Config) (http.Handler, error) {
	sv, err := New(cfg)
	if err != nil {
		return nil, err
	}
	return sv.Handler(), nil
}

func newServer(cfg Config) (*server, error) {
	if cfg.Store == nil || cfg.Catalog == nil {
		return nil, errors.New("new api handler: Store and Catalog are required")
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Log == nil {
		cfg.Log = slog.Default()
	}
	if cfg.Gatherer == nil {
		cfg.Gatherer = prometheus.DefaultGatherer
	}
	if cfg.MaxIngestInFlight <= 0 {
		cfg.MaxIngestInFlight = DefaultMaxIngestInFlight
	}
	if cfg.IngestTimeout <= 0 {
		cfg.IngestTimeout = DefaultIngestTimeout
	}
	proxies, err := parseProxies(cfg.Limits.TrustedProxies)
	if err != nil {
		return nil, fmt.Errorf("new api handler: %w", err)
	}
	cfg.Limits.TrustedProxies = proxies
	s := &server{cfg: cfg, clusters: map[string]bool{}, ingestSlots: make(chan struct{}, cfg.MaxIngestInFlight),
		ingestErrLog: rate.Sometimes{Interval: 10 * time.Second},
		reports: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "fleetrepair_ingest_reports_total",
			Help: "Agent reports received, by result (ok, invalid, unauthorized, error: not stored, answered 503; overloaded: answered 429)."}, []string{"result"}),
		findings: prometheus.NewCounter(prometheus.CounterOpts{Name: "fleetrepair_ingest_findings_new_total",
			Help: "Findings stored for the first time (duplicates excluded)."}),
		guards: newGuards(cfg.Limits),
		http:   newHTTPMetrics(),
	}
	if cfg.Registerer != nil {
		cs := append([]prometheus.Collector{s.reports, s.findings, newGauges(s)}, s.guards.collectors()...)
		for _, c := range append(cs, s.http.collectors()...) {
			if err := cfg.Registerer.Register(c); err != nil {
				return nil, fmt.Errorf("register api metrics: %w", err)
			}
		}
	}
	s.reportsOK = s.reports.WithLabelValues("ok")
	for _, c := range cfg.Clusters {
		s.clusters[c] = true
	}
	return s, nil
}

func (s *server) routes() http.Handler {
	cfg := s.cfg
	r := chi.NewRouter()
	r.Use(s.http.instrument, middleware.RequestID, middleware.Recoverer, clientIP(s.guards.limits.TrustedProxies), securityHeaders)
	r.Get("/livez", func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok\n")) })
	r.Get("/readyz", s.readyz)
	r.Method(http.MethodGet, "/metrics", promhttp.HandlerFor(cfg.Gatherer, promhttp.HandlerOpts{}))
	r.Route("/api/v1", func(r chi.Router) {
		// Ingest is not under the per-source limit: 10,000 agents behind one
		// NAT, proxy or load balancer share a source address, and the load
		// harness (test/load) saw 110,000 of 125,000 heartbeats refused 429 by
		// it. Agents are bounded per agent (AgentRPS, after authentication),
		// uncached tokens per source (VerifyRPS), and ingest as a whole by
		// MaxIngestInFlight.
		r.With(sameOriginJSON).Post("/reports", s.ingest)
		r.Get("/openapi.json", serveOpenAPI) // every route here is in it (openapi_test.go)
		r = r.With(s.sourceLimit())
		r.With(sameOriginJSON).Post("/job-reports", s.jobReport)
		// Every read below needs a viewer when operators or a login are
		// configured (requireViewer); the walk of TestEveryReadNeedsViewer
		// holds the router to it.
		r.With(sameOriginJSON).Post("/repairs/{id}/approve", s.decide(ledger.Approved))
		r.With(sameOriginJSON).Post("/repairs/{id}/reject", s.decide(ledger.Rejected))
		r.With(sameOriginJSON).Post("/breakers/resume", s.breakerAction(false))
		r.With(sameOriginJSON).Post("/breakers/kill-switch", s.breakerAction(true))
		r = r.With(s.requireViewer, knownQuery)
		r.Get("/repairs", s.listRepairs)
		r.Get("/repairs/{id}", s.getRepair)
		r.Get("/nodes", s.listNodes)
		r.Get("/nodes/{cluster}/{node}", s.getNode)
		r.Get("/fleet", s.getFleet)
		r.Get("/approvals", s.getApprovals)
		r.Get("/stats", s.getStats)
		r.Get("/reasons", s.reasons)
		r.Get("/clusters", s.listClusters)
		r.Get("/clusters/{cluster}/nodeclaims", s.getNodeClaims)
		r.Get("/breakers", s.getBreakers)
		r.Get("/shadow", s.shadow)
		r.Get("/events", s.events)
	})
	r.NotFound(func(w http.ResponseWriter, r *http.Request) {
		markUnmatched(r)
		writeError(w, http.StatusNotFound, "no such route: "+r.Method+" "+r.URL.Path, "see the route list in README.md", nil)
	})
	r.MethodNotAllowed(func(w http.ResponseWriter, r *http.Request) {
		markUnmatched(r)
		writeError(w, http.StatusMethodNotAllowed, "method not allowed: "+r.Method+" "+r.URL.Path, "", nil)
	})
	return r
}

// ErrorBody is the one error envelope of the API.
type ErrorBody struct {
	Message     string   `json:"message"`
	Detail      string   `json:"detail,omitempty"`
	Validations []string `json:"validations,omitempty"`
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(v)
}

func writeError(w http.ResponseWriter, status int, msg, detail string, validations []string) {
	writeJSON(w, status, ErrorBody{Message: msg, Detail: detail, Validations: validations})
}

// missing names what a 404 did not find from the route's parameters:
// "no repair 999" (for /repairs/999 and /repairs/999/approve alike), "no
// node c1/n7", "no cluster c9"; else "no" and the path under /api/v1.
func missing(r *http.Request) string {
	switch id, cluster, node := chi.URLParam(r, "id"), chi.URLParam(r, "cluster"), chi.URLParam(r, "node"); {
	case id != "" && strings.HasPrefix(r.URL.Path, "/api/v1/repairs/"):
		return "no repair " + id
	case node != "":
		return "no node " + cluster + "/" + node
	case cluster != "":
		return "no cluster " + cluster
	}
	return "no " + strings.TrimPrefix(r.URL.Path, "/api/v1/")
}

// writeStoreError maps store errors to status codes: ErrNotFound 404,
// ErrConflict 409, ErrInvalid 400, anything else 500 (logged, not echoed).
// A database's own error text is never echoed.
func (s *server) writeStoreError(w http.ResponseWriter, r *http.Request, err error) {
	switch {
	case errors.Is(err, store.ErrNotFound):
		writeError(w, http.StatusNotFound, "not found", missing(r), nil)
	case errors.Is(err, store.ErrConflict):
		writeError(w, http.StatusConflict, "conflict", err.Error(), nil)
	case errors.Is(err, store.ErrInvalid) && store.DatabaseRefused(err):
		// The database refused a value: its text names tables and
		// constraints, which are not the caller's business.
		s.cfg.Log.WarnContext(r.Context(), "api: database refused a value", "path", r.URL.Path, "err", err)
		writeError(w, http.StatusBadRequest, "invalid request", "the database refused a value of the request (see the controller log, request id "+middleware.GetReqID(r.Context())+")", nil)
	case errors.Is(err, store.ErrInvalid):
		writeError(w, http.StatusBadRequest, "invalid request", err.Error(), nil)
	default:
		s.cfg.Log.ErrorContext(r.Context(), "api store error", "path", r.URL.Path, "err", err)
		writeError(w, http.StatusInternalServerError, "internal error", "see the controller log, request id "+middleware.GetReqID(r.Context()), nil)
	}
}

func (s *server) readyz(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := context.WithTimeout(r.Context(), 2*time.Second)
	defer cancel()
	if err := s.cfg.Store.Ping(ctx); err != nil {
		writeError(w, http.StatusServiceUnavailable, "database unreachable", err.Error(), nil)
		return
	}
	_, _ = w.Write([]byte("ok\n"))
}

// TokenHeader carries an operator's (or agent's) token when Authorization
// cannot: the Kubernetes API server's service proxy (the CLI's kubeconfig
// contexts, docs/cli.md) authenticates the caller by Authorization and
// drops it before proxying. Authorization wins when both are sent. A
// browser cannot send it cross-site without a CORS preflight, which this
// API never answers.
const TokenHeader = "X-Fleetrepair-Token"

func bearer(r *http.Request) string {
	tok, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	if !ok || strings.TrimSpace(tok) == "" {
		tok = r.Header.Get(TokenHeader)
	}
	return strings.TrimSpace(tok)
}

// deny answers 401/403 for an authentication or authorization failure and
// records it in the security audit (sampled: see auditSampler).
func (s *server) deny(w http.ResponseWriter, r *http.Request, err error, cluster, node, subject string) {
	status, msg := http.StatusUnauthorized, "agent not authenticated"
	if errors.Is(err, auth.ErrForbidden) {
		status, msg = http.StatusForbidden, "agent not allowed"
	} else if !errors.Is(err, auth.ErrUnauthenticated) {
		status, msg = http.StatusServiceUnavailable, "cannot verify the agent's token now"
	}
	s.reports.WithLabelValues("unauthorized").Inc()
	s.audit(r.Context(), store.SecurityEvent{Cluster: cluster, Node: node, Subject: subject,
		Action: "ingest", Outcome: "denied", Status: status, Reason: err.Error(), RemoteAddr: r.RemoteAddr})
	writeError(w, status, msg, err.Error(), nil)
}

// IngestResponse is the body of a successful POST /api/v1/reports.
type IngestResponse struct {
	Accepted int `json:"accepted"` // findings in the report
	Inserted int `json:"inserted"` // findings stored for the first time
}

func (s *server) ingest(w http.ResponseWriter, r *http.Request) {
	if s.cfg.Authenticator != nil && bearer(r) == "" {
		s.deny(w, r, fmt.Errorf("no bearer token (send Authorization: Bearer <token>): %w", auth.ErrUnauthenticated), "", "", "")
		return
	}
	if ct := r.Header.Get("Content-Type"); ct != "" && !strings.HasPrefix(ct, "application/json") {
		s.reports.WithLabelValues("invalid").Inc()
		writeError(w, http.StatusUnsupportedMediaType, "content type must be application/json", ct, nil)
		return
	}
	var rep finding.Report
	if err := decodeStrict(w, r, MaxReportBytes, &rep); err != nil {
		s.reports.WithLabelValues("invalid").Inc()
		if limit, ok := tooLarge(err); ok {
			writeError(w, http.StatusRequestEntityTooLarge, "report too large",
				fmt.Sprintf("the body is over %d bytes: send fewer findings per report (the agent batches at most 1000)", limit), nil)
			return
		}
		writeError(w, http.StatusBadRequest, "malformed report", err.Error(), nil)
		return
	}
	rep.Sanitize()
	if err := rep.Validate(); err != nil {
		s.reports.WithLabelValues("invalid").Inc()
		var ve *finding.ValidationError
		if errors.As(err, &ve) {
			writeError(w, http.StatusBadRequest, "invalid report", "", ve.Problems)
			return
		}
		writeError(w, http.StatusBadRequest, "invalid report", err.Error(), nil)
		return
	}
	if problems := checkReportBounds(&rep); len(problems) > 0 {
		s.reports.WithLabelValues("invalid").Inc()
		writeError(w, http.StatusBadRequest, "invalid report", "", problems)
		return
	}
	if !s.authenticateAgent(w, r, &rep) {
		return
	}
	s.clampTimes(&rep, s.cfg.Now())
	for i := range rep.Findings {
		if rep.Findings[i].Node == "" {
			rep.Findings[i].Node = rep.Node
		}
		if rep.Findings[i].BootID == "" {
			rep.Findings[i].BootID = rep.BootID
		}
	}
	res, err := s.store(r.Context(), rep)
	if err != nil {
		s.writeIngestError(w, r, err)
		return
	}
	s.reportsOK.Inc()
	if res.Inserted > 0 {
		s.findings.Add(float64(res.Inserted))
	}
	switch {
	case res.Inserted > 0 && s.cfg.OnFindings != nil:
		s.cfg.OnFindings(rep.Cluster, rep.Node)
	case s.cfg.OnIngest != nil && (res.Inserted > 0 || res.Changed):
		s.cfg.OnIngest(rep.Cluster, rep.Node)
	}
	writeJSON(w, http.StatusOK, IngestResponse{Accepted: len(rep.Findings), Inserted: res.Inserted})
}

// errOverloaded: MaxIngestInFlight reports are being written already.
var errOverloaded = errors.New("too many reports in flight")

// store writes rep within IngestTimeout, holding one of the
// MaxIngestInFlight slots; errOverloaded when none is free.
func (s *server) store(ctx context.Context, rep finding.Report) (store.IngestResult, error) {
	select {
	case s.ingestSlots <- struct{}{}:
		defer func() { <-s.ingestSlots }()
	default:
		return store.IngestResult{}, errOverloaded
	}
	ctx, cancel := context.WithTimeout(ctx, s.cfg.IngestTimeout)
	defer cancel()
	return s.cfg.Store.IngestReport(ctx, rep, s.cfg.Now())
}

// writeIngestError answers a report that could not be stored. Only a report
// the database refuses (store.ErrInvalid) is the agent's fault (400: it
// drops the batch); every other failure is ours and temporary, so the agent
// is told to resend later and keeps the batch: 429 when too many reports are
// in flight, 503 otherwise (database down, slow past IngestTimeout, or any
// other store error, which is logged), both with Retry-After. Never 500, and
// never the database's text.
func (s *server) writeIngestError(w http.ResponseWriter, r *http.Request, err error) {
	switch {
	case errors.Is(err, errOverloaded):
		s.reports.WithLabelValues("overloaded").Inc()
		w.Header().Set("Retry-After", strconv.Itoa(RetryAfterOverloaded))
		writeError(w, http.StatusTooManyRequests, "controller overloaded", "too many reports in flight; resend after Retry-After", nil)
	case errors.Is(err, store.ErrInvalid):
		s.reports.WithLabelValues("invalid").Inc()
		writeError(w, http.StatusBadRequest, "invalid report", "the database refused a value of the report", nil)
	default:
		s.reports.WithLabelValues("error").Inc() // the FleetRepairIngestErrors alert
		// One line per 10 s, not one per report: an outage under a fleet's
		// load would otherwise write thousands a second. The counter
		// fleetrepair_ingest_reports_total{result="error"} has them all.
		s.ingestErrLog.Do(func() {
			s.cfg.Log.ErrorContext(r.Context(), "ingest: cannot store reports, answering 503 (logged at most every 10s)",
				"err", err, "unavailable", errors.Is(err, store.ErrUnavailable), "request_id", middleware.GetReqID(r.Context()))
		})
		w.Header().Set("Retry-After", strconv.Itoa(RetryAfterUnavailable))
		writeError(w, http.StatusServiceUnavailable, "database unavailable", "resend after Retry-After", nil)
	}
}

func (s *server) reasons(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, http.StatusOK, s.cfg.Catalog)
}

// RepairPage is the body of GET /api/v1/repairs.
type RepairPage struct {
	Items []Repair `json:"items"`
	// NextCursor continues the listing (?cursor=...); empty on the last page.
	NextCursor string `json:"nextCursor,omitempty"`
}

func parseTime(q string) (time.Time, error) {
	if q == "" {
		return time.Time{}, nil
	}
	t, err := time.Parse(time.RFC3339, q)
	if err != nil {
		return time.Time{}, fmt.Errorf("parse time %q (want RFC 3339, e.g. 2026-11-30T12:00:00Z): %w", q, err)
	}
	return t, nil
}

func (s *server) listRepairs(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	f := store.RepairFilter{Cluster: q.Get("cluster"), Node: q.Get("node"), Reason: q.Get("reason"), State: ledger.State(q.Get("state"))}
	var problems []string
	if f.State != "" && !ledger.Valid(f.State) {
		problems = append(problems, fmt.Sprintf("state: %q is not a repair state", f.State))
	}
	var err error
	if f.Since, err = parseTime(q.Get("since")); err != nil {
		problems = append(problems, "since: "+err.Error())
	}
	if f.Until, err = parseTime(q.Get("until")); err != nil {
		problems = append(problems, "until: "+err.Error())
	}
	if !f.Since.IsZero() && !f.Until.IsZero() && !f.Since.Before(f.Until) {
		problems = append(problems, "since: must be before until")
	}
	if f.Reason != "" {
		if _, ok := s.cfg.Catalog.Lookup(f.Reason); !ok {
			problems = append(problems, fmt.Sprintf("reason: %q is not a reason code of catalog %s (GET /api/v1/reasons)", f.Reason, s.cfg.Catalog.Version))
		}
	}
	if c := q.Get("cursor"); c != "" {
		if f.Cursor, err = strconv.ParseInt(c, 10, 64); err != nil || f.Cursor <= 0 {
			problems = append(problems, "cursor: not a cursor returned by this API")
		}
	}
	if l := q.Get("limit"); l != "" {
		if f.Limit, err = strconv.Atoi(l); err != nil || f.Limit < 1 || f.Limit > store.MaxListLimit {
			problems = append(problems, fmt.Sprintf("limit: must be 1..%d", store.MaxListLimit))
		}
	}
	if len(problems) > 0 {
		writeError(w, http.StatusBadRequest, "invalid query", "", problems)
		return
	}
	rs, next, err := s.cfg.Store.ListRepairs(r.Context(), f)
	if err != nil {
		s.writeStoreError(w, r, err)
		return
	}
	page := RepairPage{Items: make([]Repair, 0, len(rs))}
	for _, rp := range rs {
		page.Items = append(page.Items, toRepair(rp))
	}
	if next > 0 {
		page.NextCursor = strconv.FormatInt(next, 10)
	}
	writeJSON(w, http.StatusOK, page)
}

// RepairDetail is the body of GET /api/v1/repairs/{id}.
type RepairDetail struct {
	Repair   Repair            `json:"repair"`
	Audit    []AuditEntry      `json:"audit"`
	Findings []finding.Finding `json:"findings"`
}

func (s *server) getRepair(w http.ResponseWriter, r *http.Request) {
	id, err := strconv.ParseInt(chi.URLParam(r, "id"), 10, 64)
	if err != nil || id <= 0 {
		writeError(w, http.StatusBadRequest, "invalid repair id", chi.URLParam(r, "id"), nil)
		return
	}
	out, err := (&Service{s: s}).RepairDetail(r.Context(), id)
	if err != nil {
		s.writeErr(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, out)
}

// NodeDetail is the body of GET /api/v1/nodes/{cluster}/{node}.
type NodeDetail struct {
	Node Node `json:"node"`
	// Health is ok, failing or unknown (docs/design.md, decision 2: silence and an
	// unreachable cluster are unknown, never healthy, never repaired on).
	Health       string            `json:"health"`
	HealthReason string            `json:"healthReason"`
	Diagnoses    []Diagnosis       `json:"diagnoses"`
	Findings     []finding.Finding `json:"findings"`
	Repairs      []Repair          `json:"repairs"`
}

func (s *server) getNode(w http.ResponseWriter, r *http.Request) {
	out, err := (&Service{s: s}).NodeDetail(r.Context(), chi.URLParam(r, "cluster"), chi.URLParam(r, "node"))
	if err != nil {
		s.writeErr(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, out)
}
