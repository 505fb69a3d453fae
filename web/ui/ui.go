// Package ui is fleetrepair's SRE dashboard: server-rendered pages
// (html/template, assets embedded), progressively enhanced with htmx
// (vendored in static/vendor, no build step), behind an OIDC login.
//
// It holds no business logic: every page renders what a web/api Service read
// returns (the same value its JSON twin under /api/v1 serves), and every
// button calls the Service command the API route calls (Decide, Resume,
// SetKillSwitch), so a decision takes one code path from the CLI, the API or
// the dashboard. State-changing requests are refused cross-origin
// (net/http.CrossOriginProtection) and need a login session with the role;
// the Service audits each with the human's identity.
package ui

import (
	"context"
	"crypto/rand"
	"embed"
	"encoding/json"
	"errors"
	"fmt"
	"html/template"
	"io/fs"
	"log/slog"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/go-chi/chi/v5"
	"golang.org/x/oauth2"

	"github.com/fleetrepair/fleetrepair/controller/auth"
	"github.com/fleetrepair/fleetrepair/web/api"
)

//go:embed templates static
var assets embed.FS

// Config configures the dashboard.
type Config struct {
	// API is the service behind the pages; APIHandler serves every path the
	// dashboard does not (the JSON API, /metrics, /livez, /readyz).
	API        *api.Service
	APIHandler http.Handler
	// Sessions keeps logins (required).
	Sessions *auth.Sessions
	// OIDC is the login provider; nil offers no OIDC login.
	OIDC *auth.OIDC
	// DevLogin offers a local login as any name and role, without a
	// password: only `fleetrepair-demo` sets it, and every page then says
	// so in a banner.
	DevLogin bool
	// Refresh is how often open pages re-read themselves for what time
	// alone changes (agent silence, approval expiry, "ago"; default 30s).
	// Every stored change reaches them sooner, through the live stream
	// (GET /api/v1/events).
	Refresh time.Duration
	Now     func() time.Time
	Log     *slog.Logger
}

type dashboard struct {
	cfg   Config
	pages map[string]*template.Template
}

// Handler returns the dashboard wrapped around cfg.APIHandler, behind
// cross-origin protection and the session middleware.
func Handler(cfg Config) (http.Handler, error) {
	if cfg.API == nil || cfg.APIHandler == nil || cfg.Sessions == nil {
		return nil, errors.New("new dashboard: API, APIHandler and Sessions are required")
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Log == nil {
		cfg.Log = slog.Default()
	}
	if cfg.Refresh <= 0 {
		cfg.Refresh = 30 * time.Second
	}
	d := &dashboard{cfg: cfg, pages: map[string]*template.Template{}}
	if err := d.parse(); err != nil {
		return nil, err
	}
	static, err := fs.Sub(assets, "static")
	if err != nil {
		return nil, fmt.Errorf("new dashboard: %w", err)
	}
	r := chi.NewRouter()
	// The dashboard's routes are counted and timed as the API's are
	// (api.Service.Instrument); the rest falls through to the API's
	// handler, which counts its own.
	r.Group(func(r chi.Router) {
		r.Use(cfg.API.Instrument)
		r.Handle("/static/*", http.StripPrefix("/static/", cacheStatic(http.FileServerFS(static))))
		r.Get("/", func(w http.ResponseWriter, r *http.Request) { http.Redirect(w, r, "/fleet", http.StatusSeeOther) })
		r.Get("/login", d.loginPage)
		r.Get("/auth/login", d.oidcStart)
		r.Get("/auth/callback", d.oidcCallback)
		r.Post("/auth/dev", d.devLogin)
		r.Post("/logout", d.logout)
		r.Group(func(r chi.Router) {
			r.Use(d.requireLogin)
			r.Get("/fleet", d.fleet)
			r.Get("/approvals", d.approvals)
			r.Post("/approvals/bulk", d.bulkApprove)
			r.Post("/repairs/{id}/{decision:approve|reject}", d.decide)
			r.Get("/repairs/{id}", d.repair)
			r.Get("/nodes/{cluster}/{node}", d.node)
			r.Get("/breakers", d.breakers)
			r.Post("/breakers/resume", d.resume)
			r.Post("/breakers/kill-switch", d.killSwitch)
			r.Get("/reasons", d.reasons)
			r.Get("/history", d.history)
			r.Get("/shadow", d.shadowPage)
		})
	})
	r.NotFound(cfg.APIHandler.ServeHTTP)
	r.MethodNotAllowed(cfg.APIHandler.ServeHTTP)
	cop := http.NewCrossOriginProtection()
	cop.SetDenyHandler(http.HandlerFunc(crossOriginDenied))
	return cop.Handler(cfg.Sessions.Middleware(r)), nil
}

// crossOriginDenied answers a request CrossOriginProtection refuses (Origin
// not this Host, Sec-Fetch-Site cross-site): 403 with the API's JSON error
// envelope for /api/ paths, so an API client reads the same refusal as
// without the dashboard mounted (web/api's own same-origin check), and
// plain text for the pages.
func crossOriginDenied(w http.ResponseWriter, r *http.Request) {
	const msg = "cross-site request refused"
	detail := fmt.Sprintf("Origin %q is not this server (%s), or Sec-Fetch-Site is %q", r.Header.Get("Origin"), r.Host, r.Header.Get("Sec-Fetch-Site"))
	if !strings.HasPrefix(r.URL.Path, "/api/") {
		http.Error(w, "cross-origin request refused: "+detail, http.StatusForbidden)
		return
	}
	b, _ := json.Marshal(api.ErrorBody{Message: msg, Detail: detail})
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(http.StatusForbidden)
	_, _ = w.Write(append(b, '\n'))
}

func cacheStatic(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Cache-Control", "public, max-age=3600")
		h.ServeHTTP(w, r)
	})
}

// requireLogin sends a browser without a login session to /login, keeping
// where it wanted to go.
func (d *dashboard) requireLogin(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if _, ok := auth.OperatorFrom(r.Context()); ok {
			next.ServeHTTP(w, r)
			return
		}
		if r.Method != http.MethodGet {
			d.fail(w, r, http.StatusUnauthorized, "not logged in", "log in at /login first")
			return
		}
		to := "/login?next=" + url.QueryEscape(r.URL.RequestURI())
		if r.Header.Get("HX-Request") == "true" {
			w.Header().Set("HX-Redirect", to)
			w.WriteHeader(http.StatusUnauthorized)
			return
		}
		http.Redirect(w, r, to, http.StatusSeeOther)
	})
}

// randomString is a 128-bit random value for the login's state and nonce.
func randomString() string { return rand.Text() }

// safeNext keeps a post-login redirect on this site.
func safeNext(next string) string {
	if !strings.HasPrefix(next, "/") || strings.HasPrefix(next, "//") || strings.HasPrefix(next, "/\\") {
		return "/fleet"
	}
	return next
}

func (d *dashboard) loginPage(w http.ResponseWriter, r *http.Request) {
	d.render(w, r, http.StatusOK, "login", map[string]any{"Next": safeNext(r.URL.Query().Get("next")),
		"OIDC": d.cfg.OIDC != nil, "Error": r.URL.Query().Get("error")})
}

func (d *dashboard) oidcStart(w http.ResponseWriter, r *http.Request) {
	if d.cfg.OIDC == nil {
		d.fail(w, r, http.StatusNotFound, "no OIDC login configured", "start the controller with --oidc-issuer-url, --oidc-client-id, --oidc-redirect-url and --oidc-role")
		return
	}
	state, nonce, verifier := randomString(), randomString(), oauth2.GenerateVerifier()
	ctx := r.Context()
	d.cfg.Sessions.Put(ctx, "oidc_state", state)
	d.cfg.Sessions.Put(ctx, "oidc_nonce", nonce)
	d.cfg.Sessions.Put(ctx, "oidc_verifier", verifier)
	d.cfg.Sessions.Put(ctx, "oidc_next", safeNext(r.URL.Query().Get("next")))
	http.Redirect(w, r, d.cfg.OIDC.AuthCodeURL(state, nonce, verifier), http.StatusFound)
}

func (d *dashboard) oidcCallback(w http.ResponseWriter, r *http.Request) {
	if d.cfg.OIDC == nil {
		d.fail(w, r, http.StatusNotFound, "no OIDC login configured", "")
		return
	}
	ctx := r.Context()
	q := r.URL.Query()
	state, nonce, verifier := d.cfg.Sessions.Pop(ctx, "oidc_state"), d.cfg.Sessions.Pop(ctx, "oidc_nonce"), d.cfg.Sessions.Pop(ctx, "oidc_verifier")
	next := safeNext(d.cfg.Sessions.Pop(ctx, "oidc_next"))
	if e := q.Get("error"); e != "" {
		d.fail(w, r, http.StatusUnauthorized, "the identity provider refused the login", e+": "+q.Get("error_description"))
		return
	}
	if state == "" || q.Get("state") != state {
		d.fail(w, r, http.StatusBadRequest, "login expired or not started here", "start again at /login")
		return
	}
	op, err := d.cfg.OIDC.Exchange(ctx, q.Get("code"), verifier, nonce)
	if err != nil {
		status := http.StatusUnauthorized
		if errors.Is(err, auth.ErrForbidden) {
			status = http.StatusForbidden
		}
		d.fail(w, r, status, "login refused", err.Error())
		return
	}
	d.login(w, r, op, next, "oidc")
}

func (d *dashboard) login(w http.ResponseWriter, r *http.Request, op auth.Operator, next, method string) {
	if err := d.cfg.Sessions.Login(r.Context(), op); err != nil {
		d.fail(w, r, http.StatusInternalServerError, "cannot start a session", err.Error())
		return
	}
	d.cfg.Log.InfoContext(r.Context(), "dashboard login", "operator", op.Name, "role", op.Role, "method", method)
	http.Redirect(w, r, next, http.StatusSeeOther)
}

// devLogin is the demo's local login: any name, any role, no password. It
// exists only when Config.DevLogin is set (fleetrepair-demo).
func (d *dashboard) devLogin(w http.ResponseWriter, r *http.Request) {
	if !d.cfg.DevLogin {
		d.fail(w, r, http.StatusNotFound, "the local login exists only in demo mode", "log in with OIDC")
		return
	}
	name := strings.TrimSpace(r.PostFormValue("name"))
	role := auth.Role(r.PostFormValue("role"))
	if name == "" || !role.Allows(auth.RoleViewer) {
		d.fail(w, r, http.StatusBadRequest, "invalid demo login", "a name and a role (viewer, approver, admin) are required")
		return
	}
	d.login(w, r, auth.Operator{Name: "demo:" + name, Role: role}, safeNext(r.PostFormValue("next")), "demo")
}

func (d *dashboard) logout(w http.ResponseWriter, r *http.Request) {
	if err := d.cfg.Sessions.Logout(r.Context()); err != nil {
		d.fail(w, r, http.StatusInternalServerError, "cannot end the session", err.Error())
		return
	}
	http.Redirect(w, r, "/login", http.StatusSeeOther)
}

func (d *dashboard) caller(r *http.Request) api.Caller {
	op, _ := auth.OperatorFrom(r.Context())
	return api.Caller{Operator: op, Via: "dashboard", RemoteAddr: r.RemoteAddr}
}

// fail renders the error page with status.
func (d *dashboard) fail(w http.ResponseWriter, r *http.Request, status int, msg, detail string) {
	d.render(w, r, status, "error", map[string]any{"Status": status, "Message": msg, "Detail": detail})
}

// failErr renders a Service error: its Problem, or a store error.
func (d *dashboard) failErr(w http.ResponseWriter, r *http.Request, err error) {
	status := api.StatusOf(err)
	var p *api.Problem
	switch {
	case errors.As(err, &p):
		detail := p.Detail
		if len(p.Validations) > 0 {
			detail = strings.TrimSpace(detail + " " + strings.Join(p.Validations, "; "))
		}
		d.fail(w, r, status, p.Message, detail)
	case status == http.StatusInternalServerError:
		d.cfg.Log.ErrorContext(r.Context(), "dashboard error", "path", r.URL.Path, "err", err)
		d.fail(w, r, status, "internal error", "see the controller log")
	default:
		d.fail(w, r, status, http.StatusText(status), err.Error())
	}
}

// flash is a one-line result shown on the next page (after a redirect).
func (d *dashboard) flash(ctx context.Context, msg string) { d.cfg.Sessions.Put(ctx, "flash", msg) }
