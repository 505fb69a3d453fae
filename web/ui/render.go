package ui

import (
	"bytes"
	"fmt"
	"html/template"
	"io/fs"
	"net/http"
	"path"
	"strconv"
	"strings"
	"time"

	"github.com/fleetrepair/fleetrepair/controller/auth"
	"github.com/fleetrepair/fleetrepair/controller/breaker"
	"github.com/fleetrepair/fleetrepair/controller/shadow"
	"github.com/fleetrepair/fleetrepair/web/api"
)

// page is what every template gets: the page's data (the Service read, the
// same value as its JSON twin) and the frame around it.
type page struct {
	Name     string
	Title    string
	Operator auth.Operator
	LoggedIn bool
	DevLogin bool
	Flash    string
	// Self is the page's URL, polled for live updates; JSON its twin under /api/v1.
	Self, JSON string
	// RefreshMS is the period in milliseconds of the page's re-read for
	// what time alone changes (agent silence, expiries; 0: none).
	RefreshMS int64
	// Events is the live stream the page follows (GET /api/v1/events
	// after the feed's position at render; "" without a feed): a relevant
	// event re-reads the page (static/app.js). LiveRepair, LiveCluster and
	// LiveNode narrow what is relevant to one repair or node.
	Events                string
	LiveRepair            int64
	LiveCluster, LiveNode string
	Now                   time.Time
	Data                  any
}

// Can reports whether the logged-in human has at least role.
func (p page) Can(role string) bool { return p.LoggedIn && p.Operator.Role.Allows(auth.Role(role)) }

func (d *dashboard) funcs() template.FuncMap {
	return template.FuncMap{
		"ts": func(t any) string {
			switch v := t.(type) {
			case time.Time:
				if v.IsZero() {
					return "—"
				}
				return v.UTC().Format("2006-01-02 15:04:05Z")
			case *time.Time:
				if v == nil || v.IsZero() {
					return "—"
				}
				return v.UTC().Format("2006-01-02 15:04:05Z")
			}
			return fmt.Sprint(t)
		},
		"ago": func(t time.Time) string {
			if t.IsZero() {
				return "never"
			}
			return human(d.cfg.Now().Sub(t)) + " ago"
		},
		"until": func(t time.Time) string { return "in " + human(t.Sub(d.cfg.Now())) },
		"dur":   human,
		"deref": func(t *time.Time) time.Time {
			if t == nil {
				return time.Time{}
			}
			return *t
		},
		"explain": api.ExplainBreaker,
		"explainTrip": func(tr shadow.Trip) string {
			return api.ExplainBreaker(breaker.Breaker{Scope: breaker.Scope(tr.Scope), Cohort: tr.Cohort, Evidence: tr.Evidence})
		},
		"sum": func(xs []int) int {
			n := 0
			for _, x := range xs {
				n += x
			}
			return n
		},
		"secs":    func(s float64) string { return human(time.Duration(s * float64(time.Second))) },
		"pct":     func(a, b int) int { return a * 100 / max(b, 1) },
		"join":    strings.Join,
		"cohorts": func(st breaker.State) []string { return st.OpenCohorts() },
		"cohort":  func(st breaker.State, c string) breaker.Breaker { return st.Cohorts[c] },
	}
}

// human writes a duration the way an on-call reads it: 45s, 12m, 3h05m, 2d4h.
func human(d time.Duration) string {
	if d < 0 {
		d = -d
	}
	switch {
	case d < time.Minute:
		return fmt.Sprintf("%ds", int(d.Seconds()))
	case d < time.Hour:
		return fmt.Sprintf("%dm%02ds", int(d.Minutes()), int(d.Seconds())%60)
	case d < 48*time.Hour:
		return fmt.Sprintf("%dh%02dm", int(d.Hours()), int(d.Minutes())%60)
	}
	return fmt.Sprintf("%dd%dh", int(d.Hours())/24, int(d.Hours())%24)
}

// parse builds one template set per page: the layout plus the page.
func (d *dashboard) parse() error {
	files, err := fs.Glob(assets, "templates/*.html")
	if err != nil {
		return fmt.Errorf("list templates: %w", err)
	}
	for _, f := range files {
		name := strings.TrimSuffix(path.Base(f), ".html")
		if name == "layout" {
			continue
		}
		t, err := template.New("layout.html").Funcs(d.funcs()).ParseFS(assets, "templates/layout.html", f)
		if err != nil {
			return fmt.Errorf("parse template %s: %w", name, err)
		}
		d.pages[name] = t
	}
	return nil
}

// render writes page name with data; polled pages (Self set) refresh themselves.
func (d *dashboard) render(w http.ResponseWriter, r *http.Request, status int, name string, data any, opts ...func(*page)) {
	p := page{Name: name, Title: name, DevLogin: d.cfg.DevLogin, Now: d.cfg.Now(), Data: data}
	p.Operator, p.LoggedIn = auth.OperatorFrom(r.Context())
	// A live page's poll (htmx targets #live) must not take the flash meant
	// for the page the browser is about to load.
	if p.LoggedIn && r.Header.Get("HX-Target") != "live" {
		p.Flash = d.cfg.Sessions.Pop(r.Context(), "flash")
	}
	for _, o := range opts {
		o(&p)
	}
	t, ok := d.pages[name]
	if !ok {
		http.Error(w, "no template "+name, http.StatusInternalServerError)
		return
	}
	var buf bytes.Buffer
	if err := t.Execute(&buf, p); err != nil {
		d.cfg.Log.ErrorContext(r.Context(), "render dashboard page", "page", name, "err", err)
		http.Error(w, "render page: "+err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	w.Header().Set("X-Frame-Options", "DENY")
	w.Header().Set("Content-Security-Policy", "default-src 'self'; style-src 'self' 'unsafe-inline'; frame-ancestors 'none'")
	w.WriteHeader(status)
	_, _ = w.Write(buf.Bytes())
}

// live makes a page follow the live stream (a relevant event re-reads it
// within a second), re-read itself every Refresh for what time alone
// changes, and names its JSON twin.
func (d *dashboard) live(title, self, json string) func(*page) {
	return func(p *page) {
		p.Title, p.Self, p.JSON, p.RefreshMS = title, self, json, d.cfg.Refresh.Milliseconds()
		if pos, ok := d.cfg.API.LivePosition(); ok {
			p.Events = "/api/v1/events?after=" + strconv.FormatInt(pos, 10)
		}
	}
}

// about narrows a live page to the events of one repair or node.
func about(repair int64, cluster, node string) func(*page) {
	return func(p *page) { p.LiveRepair, p.LiveCluster, p.LiveNode = repair, cluster, node }
}
