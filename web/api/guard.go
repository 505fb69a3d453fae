package api

import (
	"context"
	"fmt"
	"mime"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/go-chi/chi/v5/middleware"
	"github.com/go-chi/httprate"
	"github.com/hashicorp/golang-lru/v2/expirable"
	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/time/rate"

	"github.com/fleetrepair/fleetrepair/agent/finding"
	"github.com/fleetrepair/fleetrepair/controller/auth"
	"github.com/fleetrepair/fleetrepair/controller/store"
)

// Limits bounds what one caller can make the controller do (issue 11). The
// zero value of a field takes its default (the Default* constants); a
// negative rate turns that limit off (tests of other parts only).
//
// A "source" is the TCP peer address (r.RemoteAddr, IPv6 by /64): it cannot
// be forged. Behind a reverse proxy every client shares the proxy's
// address; list the proxies in TrustedProxies and the source of a request
// they forward is the client X-Forwarded-For names (never a peer's own
// claim otherwise).
type Limits struct {
	// SourceRPS bounds the requests per second of one source to /api/v1
	// (httprate's sliding window of one second).
	SourceRPS int
	// AgentRPS and AgentBurst bound the reports per second of one
	// authenticated agent (cluster/node); an agent heartbeats every 30 s
	// and sends findings in batches of up to 1,000, so 10/s (with a burst
	// of 50 for a spool drained after an outage) is far above its need.
	AgentRPS   float64
	AgentBurst int
	// VerifyRPS and VerifyBurst bound, per source, the tokens that are not
	// in the authenticator's cache and so cost a TokenReview: a flood of
	// garbage tokens from one source is answered 429 before it reaches the
	// API server, while cached agents on other sources never wait.
	VerifyRPS   float64
	VerifyBurst int
	// ShadowConcurrent bounds the shadow reports computed at once over the
	// whole controller (each holds up to shadow.DefaultMaxFindings findings
	// in memory); one caller runs at most one at a time.
	ShadowConcurrent int
	// AuditRowsPerMinute bounds the security_audit rows written for denials
	// per minute; within a minute, repeats of one (source, action, status,
	// reason) are counted, not written, and a summary row records what was
	// counted. Every denial is counted on fleetrepair_api_denials_total.
	AuditRowsPerMinute int
	// TrustedProxies are the CIDR prefixes ("10.0.0.0/8", "::1/128") of
	// reverse proxies in front of the controller. A request whose TCP peer
	// is in one has the source X-Forwarded-For gives: the rightmost entry
	// outside every prefix (chi's middleware.ClientIPFromXFF); from any other
	// peer the header is ignored, so a client reaching the controller
	// directly cannot pick its own rate-limit key. Empty (the default): the
	// header is never read.
	TrustedProxies []string
}

// Defaults of Limits.
const (
	DefaultSourceRPS          = 100
	DefaultAgentRPS           = 10
	DefaultAgentBurst         = 50
	DefaultVerifyRPS          = 1
	DefaultVerifyBurst        = 10
	DefaultShadowConcurrent   = 2
	DefaultAuditRowsPerMinute = 60
	// MaxClockSkew is how far from the controller's clock an agent's
	// SentAt may be, and how far ahead a finding's Time, before they are
	// clamped (clampTimes; the store's rule for the newest report,
	// store.MaxClockSkew, is the same bound).
	MaxClockSkew = store.MaxClockSkew
)

func (l Limits) withDefaults() Limits {
	def := func(v *int, d int) {
		if *v == 0 {
			*v = d
		}
	}
	deff := func(v *float64, d float64) {
		if *v == 0 {
			*v = d
		}
	}
	def(&l.SourceRPS, DefaultSourceRPS)
	deff(&l.AgentRPS, DefaultAgentRPS)
	def(&l.AgentBurst, DefaultAgentBurst)
	deff(&l.VerifyRPS, DefaultVerifyRPS)
	def(&l.VerifyBurst, DefaultVerifyBurst)
	def(&l.ShadowConcurrent, DefaultShadowConcurrent)
	def(&l.AuditRowsPerMinute, DefaultAuditRowsPerMinute)
	return l
}

// guards are the server's flood protections and their metrics.
type guards struct {
	limits   Limits
	agents   *keyedLimiter
	verify   *keyedLimiter
	shadow   chan struct{}
	shadowBy sync.Map // caller -> struct{}: one running report per caller
	audit    auditSampler

	limited    *prometheus.CounterVec
	denials    *prometheus.CounterVec
	suppressed prometheus.Counter
	skew       prometheus.Histogram
}

func newGuards(l Limits) *guards {
	l = l.withDefaults()
	return &guards{limits: l,
		agents: newKeyedLimiter(l.AgentRPS, l.AgentBurst),
		verify: newKeyedLimiter(l.VerifyRPS, l.VerifyBurst),
		shadow: make(chan struct{}, max(l.ShadowConcurrent, 1)),
		audit:  auditSampler{max: l.AuditRowsPerMinute, seen: map[string]int{}},
		limited: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "fleetrepair_api_rate_limited_total",
			Help: "Requests answered 429, by limit (source, agent, verify, shadow)."}, []string{"limit"}),
		denials: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "fleetrepair_api_denials_total",
			Help: "Authentication and authorization denials, by action and HTTP status (every one, audited or not)."}, []string{"action", "status"}),
		suppressed: prometheus.NewCounter(prometheus.CounterOpts{Name: "fleetrepair_security_audit_suppressed_total",
			Help: "Denials counted but not written to security_audit one by one (repeats within a minute, or over the per-minute cap)."}),
		skew: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "fleetrepair_ingest_clock_skew_seconds",
			Help:    "How far an agent's sentAt is from the controller's clock, ahead or behind, for reports off by more than MaxClockSkew (clamped; a clock behind also moves the report's finding times forward).",
			Buckets: prometheus.ExponentialBuckets(60, 4, 10)}),
	}
}

func (g *guards) collectors() []prometheus.Collector {
	return []prometheus.Collector{g.limited, g.denials, g.suppressed, g.skew}
}

// keyedLimiter is a token bucket (x/time/rate) per key, in a bounded LRU:
// keys idle for ten minutes are forgotten (a fresh bucket is full, so
// forgetting errs towards letting a caller through).
type keyedLimiter struct {
	off   bool
	rps   rate.Limit
	burst int
	mu    sync.Mutex
	lru   *expirable.LRU[string, *rate.Limiter]
}

func newKeyedLimiter(rps float64, burst int) *keyedLimiter {
	return &keyedLimiter{off: rps < 0, rps: rate.Limit(rps), burst: burst,
		lru: expirable.NewLRU[string, *rate.Limiter](65536, nil, 10*time.Minute)}
}

// allow takes a token from key's bucket; when there is none it returns false
// and how long until there is.
func (k *keyedLimiter) allow(key string, now time.Time) (bool, time.Duration) {
	if k.off {
		return true, 0
	}
	k.mu.Lock()
	l, ok := k.lru.Get(key)
	if !ok {
		l = rate.NewLimiter(k.rps, k.burst)
		k.lru.Add(key, l)
	}
	k.mu.Unlock()
	r := l.ReserveN(now, 1)
	if d := r.DelayFrom(now); d > 0 {
		r.CancelAt(now)
		return false, d
	}
	return true, 0
}

// parseProxies parses Limits.TrustedProxies.
func parseProxies(cidrs []string) ([]string, error) {
	out := make([]string, 0, len(cidrs))
	for _, c := range cidrs {
		p, err := netip.ParsePrefix(strings.TrimSpace(c))
		if err != nil {
			return nil, fmt.Errorf("parse trusted proxy %q (want a CIDR prefix such as 10.0.0.0/8): %w", c, err)
		}
		out = append(out, p.String())
	}
	return out, nil
}

// clientIP is the middleware that sets the request's client address
// (middleware.GetClientIP): the TCP peer, or with trusted proxies the
// client their X-Forwarded-For names.
func clientIP(trusted []string) func(http.Handler) http.Handler {
	if len(trusted) == 0 {
		return middleware.ClientIPFromRemoteAddr
	}
	return middleware.ClientIPFromXFF(trusted...)
}

// source is the rate-limit key of the request's client (see clientIP). A
// trusted proxy's malformed X-Forwarded-For leaves no client address; the
// key is then the proxy itself, never one key shared by every such request
// of every proxy.
func source(r *http.Request) string {
	ip := middleware.GetClientIP(r.Context())
	if ip == "" {
		ip, _, _ = net.SplitHostPort(r.RemoteAddr)
	}
	return httprate.CanonicalizeIP(ip)
}

// tooMany answers 429 with Retry-After (whole seconds, at least 1), which the
// agent honours while it spools.
func (s *server) tooMany(w http.ResponseWriter, limit, detail string, wait time.Duration) {
	s.guards.limited.WithLabelValues(limit).Inc()
	secs := max(int((wait+time.Second-1)/time.Second), 1)
	w.Header().Set("Retry-After", strconv.Itoa(secs))
	writeError(w, http.StatusTooManyRequests, "too many requests", detail, nil)
}

// sourceLimit is the per-source limit of /api/v1 (httprate).
func (s *server) sourceLimit() func(http.Handler) http.Handler {
	if s.guards.limits.SourceRPS < 0 {
		return func(h http.Handler) http.Handler { return h }
	}
	return httprate.LimitBy(s.guards.limits.SourceRPS, time.Second,
		func(r *http.Request) (string, error) { return source(r), nil },
		httprate.WithLimitHandler(func(w http.ResponseWriter, r *http.Request) {
			s.tooMany(w, "source", fmt.Sprintf("more than %d requests per second from %s", s.guards.limits.SourceRPS, source(r)), time.Second)
		}))
}

// securityHeaders sets the headers every answer carries: no MIME sniffing,
// no framing, and no caching of API answers (they hold fleet state and,
// for operators, audit details).
func securityHeaders(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := w.Header()
		h.Set("X-Content-Type-Options", "nosniff")
		h.Set("X-Frame-Options", "DENY")
		h.Set("Referrer-Policy", "no-referrer")
		if strings.HasPrefix(r.URL.Path, "/api/") {
			h.Set("Cache-Control", "no-store")
		}
		next.ServeHTTP(w, r)
	})
}

// sameOriginJSON refuses a state-changing request a browser could send
// cross-site: it must carry Content-Type application/json (a cross-site
// form or a "simple" fetch cannot, without a CORS preflight this API never
// grants), must not be marked cross-site by the browser (Sec-Fetch-Site),
// and an Origin, when sent, must be this server's. So with
// --agent-auth=none a web page cannot open a repair, and an operator's
// browser cannot be made to approve one. Agents and the CLI send JSON and
// no Origin. It wraps each state-changing route (so an unknown method still
// gets its 405).
func sameOriginJSON(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if mt, _, err := mime.ParseMediaType(r.Header.Get("Content-Type")); err != nil || mt != "application/json" {
			writeError(w, http.StatusUnsupportedMediaType, "content type must be application/json",
				fmt.Sprintf("got %q: state-changing requests take a JSON body", r.Header.Get("Content-Type")), nil)
			return
		}
		if site := r.Header.Get("Sec-Fetch-Site"); site == "cross-site" || site == "same-site" {
			writeError(w, http.StatusForbidden, "cross-site request refused", "Sec-Fetch-Site: "+site, nil)
			return
		}
		if o := r.Header.Get("Origin"); o != "" {
			u, err := url.Parse(o)
			if err != nil || u.Host != r.Host {
				writeError(w, http.StatusForbidden, "cross-site request refused", fmt.Sprintf("Origin %q is not this server (%s)", o, r.Host), nil)
				return
			}
		}
		next.ServeHTTP(w, r)
	})
}

// cachedAuthenticator is implemented by authenticators whose verification
// costs a call and which cache verdicts (auth.TokenReview): a token not in
// the cache goes through the per-source verification limit. Others
// (auth.StaticToken, a constant-time compare) are not limited.
type cachedAuthenticator interface {
	Cached(token, cluster string) bool
}

// authenticateAgent authenticates and authorizes the report's agent, then
// checks the cluster is served and the agent's rate. It has answered the
// request when it returns false. A token not in the authenticator's cache
// first takes a token from the source's verification bucket, so a flood of
// bad tokens from one source costs no TokenReview and delays nobody else.
// The cluster is checked only after authentication, and the answer names no
// served cluster.
func (s *server) authenticateAgent(w http.ResponseWriter, r *http.Request, rep *finding.Report) bool {
	now := s.cfg.Now()
	if a := s.cfg.Authenticator; a != nil {
		tok := bearer(r)
		if c, ok := a.(cachedAuthenticator); ok && !c.Cached(tok, rep.Cluster) {
			if ok, wait := s.guards.verify.allow(source(r), now); !ok {
				s.tooMany(w, "verify", "too many unverified tokens from "+source(r)+"; retry later", wait)
				return false
			}
		}
		id, err := a.Authenticate(r.Context(), tok, rep.Cluster)
		if err == nil {
			err = auth.Authorize(id, rep.Cluster, rep.Node)
		}
		if err != nil {
			s.deny(w, r, err, rep.Cluster, rep.Node, id.Subject)
			return false
		}
	}
	if !s.serves(rep.Cluster) {
		s.reports.WithLabelValues("invalid").Inc()
		writeError(w, http.StatusForbidden, "unknown cluster", fmt.Sprintf("cluster %q is not served by this controller", rep.Cluster), nil)
		return false
	}
	if ok, wait := s.guards.agents.allow(rep.Cluster+"/"+rep.Node, now); !ok {
		s.tooMany(w, "agent", fmt.Sprintf("more than %g reports per second from %s/%s", s.guards.limits.AgentRPS, rep.Cluster, rep.Node), wait)
		return false
	}
	return true
}

// clampTimes bounds the report's times by the controller's clock, within
// MaxClockSkew either way. The agent stamps SentAt at each attempt, so a
// SentAt off by more than that is the agent's clock, never a report's age:
//
//   - ahead: SentAt becomes now, and a finding Time more than MaxClockSkew
//     ahead becomes now (so does one before MinFindingTime: a clock never
//     set), so one report from a node with a wrong clock, or a
//     forged one, cannot freeze the node's boot ID, heartbeat and versions
//     (the store applies the newest report by SentAt) nor sort a finding
//     after every real one;
//   - behind by D: SentAt becomes now, so a node whose clock went back (an
//     RTC reset at boot) still has its new boot applied, and each finding
//     Time moves forward by D (at most to now): the agent stamped it with
//     the same clock, and left D behind, a fresh Xid would look D old and
//     fall outside every diagnosis window.
//
// A moved finding keeps the agent's time in its attrs (agent_time). The
// offset is recorded on fleetrepair_ingest_clock_skew_seconds.
func (s *server) clampTimes(rep *finding.Report, now time.Time) {
	var shift time.Duration
	switch {
	case rep.SentAt.IsZero():
	case rep.SentAt.After(now.Add(MaxClockSkew)):
		s.guards.skew.Observe(rep.SentAt.Sub(now).Seconds())
		rep.SentAt = now
	case rep.SentAt.Before(now.Add(-MaxClockSkew)):
		shift = now.Sub(rep.SentAt)
		s.guards.skew.Observe(shift.Seconds())
		rep.SentAt = now
	}
	limit := now.Add(MaxClockSkew)
	for i := range rep.Findings {
		f := &rep.Findings[i]
		t := f.Time
		if t.IsZero() {
			continue
		}
		if shift > 0 {
			t = t.Add(shift)
			if t.After(now) {
				t = now
			}
		}
		if t.After(limit) || t.Before(MinFindingTime) {
			t = now
		}
		if t.Equal(f.Time) {
			continue
		}
		attrs := make(map[string]string, len(f.Attrs)+1)
		for k, v := range f.Attrs {
			attrs[k] = v
		}
		attrs["agent_time"] = f.Time.UTC().Format(time.RFC3339Nano)
		f.Attrs, f.Time = attrs, t
	}
}

// auditSampler decides which denials become security_audit rows: per
// minute, the first denial of each (source, action, status, reason) up to
// max rows;
// the others are counted and summarised in one row when the minute is over
// (written with the next denial after it).
type auditSampler struct {
	max        int
	mu         sync.Mutex
	window     time.Time
	rows       int
	seen       map[string]int
	suppressed int
}

// admit returns whether to write the denial keyed key at now, and a summary
// of the previous minute's uncounted denials to write first ("" when none).
func (a *auditSampler) admit(key string, now time.Time) (write bool, summary string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	w := now.Truncate(time.Minute)
	if !w.Equal(a.window) {
		if a.suppressed > 0 {
			summary = fmt.Sprintf("%d further denials in the minute from %s from %d source/action/status combinations were counted, not recorded one by one (fleetrepair_api_denials_total)",
				a.suppressed, a.window.Format(time.RFC3339), len(a.seen))
		}
		a.window, a.rows, a.suppressed = w, 0, 0
		clear(a.seen)
	}
	a.seen[key]++
	if a.seen[key] > 1 || a.rows >= a.max {
		a.suppressed++
		return false, summary
	}
	a.rows++
	return true, summary
}

// audit counts a denial and writes it to security_audit when the sampler
// admits it. A failed write is logged (sampled by the same cap).
func (s *server) audit(ctx context.Context, e store.SecurityEvent) {
	s.guards.denials.WithLabelValues(e.Action, strconv.Itoa(e.Status)).Inc()
	src := e.RemoteAddr
	if host, _, err := net.SplitHostPort(src); err == nil {
		src = host
	}
	write, summary := s.guards.audit.admit(src+"|"+e.Action+"|"+strconv.Itoa(e.Status)+"|"+e.Reason, s.cfg.Now())
	if summary != "" {
		if err := s.cfg.Store.RecordSecurityEvent(ctx, store.SecurityEvent{Action: "denials-summary", Outcome: "denied",
			Reason: summary}, s.cfg.Now()); err != nil {
			s.cfg.Log.ErrorContext(ctx, "record security event summary", "err", err)
		}
	}
	if !write {
		s.guards.suppressed.Inc()
		return
	}
	if err := s.cfg.Store.RecordSecurityEvent(ctx, e, s.cfg.Now()); err != nil {
		s.cfg.Log.ErrorContext(ctx, "record security event", "err", err)
	}
}

// acquireShadow takes one of the controller's shadow report slots for
// caller; false (answered 429) when the caller already runs one or every
// slot is taken. release gives the slot back.
func (s *server) acquireShadow(caller string) (release func(), err error) {
	if _, busy := s.guards.shadowBy.LoadOrStore(caller, struct{}{}); busy {
		return nil, s.busy("shadow", "you already have a shadow report running; wait for it", 10*time.Second)
	}
	select {
	case s.guards.shadow <- struct{}{}:
		return func() { <-s.guards.shadow; s.guards.shadowBy.Delete(caller) }, nil
	default:
		s.guards.shadowBy.Delete(caller)
		return nil, s.busy("shadow", fmt.Sprintf("%d shadow reports are running, the most at once; retry later", cap(s.guards.shadow)), 10*time.Second)
	}
}

// busy is tooMany as a Problem (429 with RetryAfter), for Service methods.
func (s *server) busy(limit, detail string, wait time.Duration) *Problem {
	s.guards.limited.WithLabelValues(limit).Inc()
	return &Problem{Status: http.StatusTooManyRequests, Message: "too many requests", Detail: detail, RetryAfter: wait}
}

// serves reports whether cluster is served now (Config.Serves, else the
// static Config.Clusters).
func (s *server) serves(cluster string) bool {
	if s.cfg.Serves != nil {
		return s.cfg.Serves(cluster)
	}
	return s.clusters[cluster]
}
