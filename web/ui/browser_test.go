package ui_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/oauth2-proxy/mockoidc"

	"github.com/fleetrepair/fleetrepair/agent/finding"
	"github.com/fleetrepair/fleetrepair/controller/auth"
	"github.com/fleetrepair/fleetrepair/controller/breaker"
	"github.com/fleetrepair/fleetrepair/controller/catalog"
	"github.com/fleetrepair/fleetrepair/controller/feed"
	"github.com/fleetrepair/fleetrepair/controller/ledger"
	"github.com/fleetrepair/fleetrepair/controller/store"
	"github.com/fleetrepair/fleetrepair/test/pgtest"
	"github.com/fleetrepair/fleetrepair/web/api"
	"github.com/fleetrepair/fleetrepair/web/ui"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// chromium finds Debian's Chromium; the browser tests fail (never skip)
// without it, saying how to install it.
func chromium(t *testing.T) string {
	t.Helper()
	if p := os.Getenv("CHROMIUM"); p != "" {
		return p
	}
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	t.Fatal("the dashboard's browser tests need Chromium: install it with `apt-get install -y chromium` (Debian; .ci/run does), or set CHROMIUM to its path")
	return ""
}

type env struct {
	st     *store.Store
	srv    *httptest.Server
	idp    *mockoidc.MockOIDC
	held   []int64
	now    time.Time
	triggs []string
}

// newEnv serves the dashboard on a real PostgreSQL with an in-process OpenID
// provider (mockoidc: discovery, JWKS, authorization code with PKCE) and a
// fleet with three repairs held by an open zone breaker.
func newEnv(t *testing.T) *env {
	t.Helper()
	ctx := context.Background()
	st := pgtest.Store(t)
	e := &env{st: st, now: time.Now().UTC()}
	e.seed(t)

	idp, err := mockoidc.Run()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = idp.Shutdown() })
	e.idp = idp

	e.srv = httptest.NewUnstartedServer(nil)
	base := "http://" + e.srv.Listener.Addr().String()
	login, err := auth.NewOIDC(ctx, auth.OIDCConfig{Issuer: idp.Issuer(), ClientID: idp.ClientID, ClientSecret: idp.ClientSecret,
		RedirectURL: base + "/auth/callback", ApproverGroups: []string{"oncall"}, AdminGroups: []string{"sre-admins"}})
	if err != nil {
		t.Fatal(err)
	}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	hub, err := feed.New(feed.Config{Source: st, Log: log})
	if err != nil {
		t.Fatal(err)
	}
	hctx, stop := context.WithCancel(ctx)
	hubDone := make(chan struct{})
	go func() { defer close(hubDone); _ = hub.Run(hctx) }()
	t.Cleanup(func() { stop(); <-hubDone })
	svc, err := api.New(api.Config{Store: st, Catalog: catalog.Default(), Clusters: []string{"c1"}, Log: log, Feed: hub, Login: true,
		OnIngest: func(c, n string) { e.triggs = append(e.triggs, c+"/"+n) }})
	if err != nil {
		t.Fatal(err)
	}
	h, err := ui.Handler(ui.Config{API: svc, APIHandler: svc.Handler(), OIDC: login, Log: log,
		Sessions: auth.NewSessions(st.Sessions(nil), time.Hour, time.Hour, false)})
	if err != nil {
		t.Fatal(err)
	}
	e.srv.Config.Handler = h
	e.srv.Start()
	t.Cleanup(e.srv.Close)
	return e
}

func (e *env) seed(t *testing.T) {
	t.Helper()
	ctx := context.Background()
	nodes := []struct{ name, zone string }{{"gpu-1", "us-east-1c"}, {"gpu-2", "us-east-1c"}, {"gpu-3", "us-east-1c"}, {"gpu-4", "us-east-1a"}, {"gpu-5", "us-east-1a"}}
	for _, n := range nodes {
		if _, err := e.st.ReadNode(ctx, store.Node{Cluster: "c1", Name: n.name, NodePool: "gpu", Zone: n.zone, NodeClaim: "nc-" + n.name}, 1, e.now); err != nil {
			t.Fatal(err)
		}
		rep := finding.Report{SchemaVersion: finding.SchemaVersion, Cluster: "c1", Node: n.name, BootID: "boot-" + n.name, SentAt: e.now,
			Heartbeat: &finding.Heartbeat{Monitors: []finding.MonitorState{{Name: "xid", State: finding.StateOK}}}}
		if _, err := e.st.IngestReport(ctx, rep, e.now); err != nil {
			t.Fatal(err)
		}
	}
	var failing []string
	for _, n := range nodes[:3] {
		rp, _, err := e.st.OpenRepair(ctx, store.Repair{Cluster: "c1", Node: n.name, NodeClaim: "nc-" + n.name, NodeClaimUID: "uid-" + n.name,
			NodePool: "gpu", Reason: "GPULost", FaultClass: "accelerated-hardware", RecommendedAction: "replace",
			State: ledger.AwaitingApproval, Detail: map[string]any{"held_by": "breaker"}}, "controller", "held by breaker zone=us-east-1c", e.now)
		if err != nil {
			t.Fatal(err)
		}
		e.held = append(e.held, rp.ID)
		failing = append(failing, "c1/"+n.name)
	}
	st := breaker.State{Cohorts: map[string]breaker.Breaker{"zone=us-east-1c": {Scope: breaker.ScopeCohort, Cohort: "zone=us-east-1c",
		Since: e.now.Add(-5 * time.Minute), LastFailure: e.now.Add(-time.Minute), Evidence: breaker.Evidence{At: e.now, WindowSeconds: 600,
			CohortNodes: 3, CohortFailing: 3, RestNodes: 2, RestFailing: 0, PValue: 5e-5, Failing: failing}}}}
	doc, _ := json.Marshal(st)
	if err := e.st.SaveBreakerState(ctx, doc, 0, nil, e.now); err != nil {
		t.Fatal(err)
	}
}

func newBrowser(t *testing.T) context.Context {
	t.Helper()
	opts := append(chromedp.DefaultExecAllocatorOptions[:], chromedp.ExecPath(chromium(t)), chromedp.NoSandbox,
		chromedp.Flag("disable-dev-shm-usage", true), chromedp.WindowSize(1280, 1000))
	actx, cancel := chromedp.NewExecAllocator(context.Background(), opts...)
	t.Cleanup(cancel)
	ctx, cancel2 := chromedp.NewContext(actx)
	t.Cleanup(cancel2)
	// The first call starts the browser and must not have a deadline.
	if err := chromedp.Do(ctx, chromedp.Navigate("about:blank")); err != nil {
		t.Fatalf("start Chromium: %v", err)
	}
	return ctx
}

// dump says where the browser is and what it shows, for a failure message.
func dump(ctx context.Context) string {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	s, err := chromedp.Run(ctx, chromedp.Evaluate[string](`location.href + "\n" + document.body.innerText`))
	if err != nil {
		return "(cannot read the page: " + err.Error() + ")"
	}
	return s
}

// do runs browser steps with a deadline, failing with what the page shows.
func do(t *testing.T, ctx context.Context, steps ...chromedp.Action[chromedp.Void]) {
	t.Helper()
	sctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	if err := chromedp.Do(sctx, steps...); err != nil {
		t.Fatalf("browser: %v; the page:\n%s", err, dump(ctx))
	}
}

func text(t *testing.T, ctx context.Context, sel string) string {
	t.Helper()
	do(t, ctx, chromedp.WaitVisible(sel))
	s, err := chromedp.Run(ctx, chromedp.Text(sel))
	if err != nil {
		t.Fatalf("read %s: %v", sel, err)
	}
	return strings.TrimSpace(s)
}

func (e *env) login(t *testing.T, ctx context.Context, user *mockoidc.MockUser, page string) {
	t.Helper()
	e.idp.QueueUser(user)
	do(t, ctx, chromedp.Navigate(e.srv.URL+page), chromedp.WaitVisible("#oidc-login"), chromedp.Click("#oidc-login"),
		chromedp.WaitVisible("#who"))
	if got := text(t, ctx, "#who"); got != user.Email {
		t.Fatalf("logged in as %q, want %q", got, user.Email)
	}
}

func (e *env) repair(t *testing.T, id int64) (store.Repair, []store.AuditEntry) {
	t.Helper()
	rp, err := e.st.GetRepair(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	a, err := e.st.RepairAudit(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	return rp, a
}

// TestBrowser drives Chromium through the on-call's path: OIDC login, the
// approvals page with the breaker's evidence, one approval, a bulk approval
// with its confirmation, then a viewer who sees no buttons and whose forged
// POST is refused, and a cross-site form post that is refused.
func TestBrowser(t *testing.T) {
	e := newEnv(t)
	ctx := newBrowser(t)

	approver := &mockoidc.MockUser{Subject: "u-alice", Email: "alice@example.com", EmailVerified: true, PreferredUsername: "alice", Groups: []string{"oncall"}}
	e.login(t, ctx, approver, "/approvals")
	if got := text(t, ctx, "#role"); got != "approver" {
		t.Fatalf("role %q, want approver (groups claim oncall)", got)
	}
	ev := text(t, ctx, `section.group[data-cohort="zone=us-east-1c"] .evidence`)
	if want := "3 of 3 nodes in zone=us-east-1c failing vs 0 of 2 elsewhere, p=10^-4.3, window 10m0s"; ev != want {
		t.Fatalf("breaker evidence %q, want %q", ev, want)
	}

	t.Run("approve one", func(t *testing.T) {
		id := e.held[0]
		do(t, ctx, chromedp.Navigate(fmt.Sprintf("%s/repairs/%d", e.srv.URL, id)),
			chromedp.WaitVisible("#approve"), chromedp.SendKeys(`#decide input[name=reason]`, "zone is back, node really lost its GPU"),
			chromedp.Click("#approve"), chromedp.WaitVisible("#flash"))
		if got := text(t, ctx, "#repair-state"); got != "approved" {
			t.Fatalf("page shows state %q, want approved", got)
		}
		rp, audit := e.repair(t, id)
		last := audit[len(audit)-1]
		if rp.State != ledger.Approved || last.Actor != "user:alice@example.com" || last.Reason != "zone is back, node really lost its GPU" ||
			last.Detail["via"] != "dashboard" || last.Detail["role"] != "approver" {
			t.Fatalf("repair %s, last audit %+v", rp.State, last)
		}
	})

	t.Run("bulk approve asks with the exact count", func(t *testing.T) {
		do(t, ctx, chromedp.Navigate(e.srv.URL+"/approvals"), chromedp.WaitVisible("form.bulk button.primary"),
			chromedp.SendKeys(`form.bulk input[name=reason]`, "AZ recovered"), chromedp.Click("form.bulk button.primary"),
			chromedp.WaitVisible("#confirm-count"))
		if got := text(t, ctx, "#confirm-count"); got != "2" {
			t.Fatalf("confirmation counts %q repairs, want 2", got)
		}
		for _, id := range e.held[1:] {
			if rp, _ := e.repair(t, id); rp.State != ledger.AwaitingApproval {
				t.Fatalf("repair %d is %s before the confirmation", id, rp.State)
			}
		}
		do(t, ctx, chromedp.Click("#confirm-approve"), chromedp.WaitVisible("#no-approvals"))
		if got := text(t, ctx, "#flash"); got != "approved 2 of 2 repairs" {
			t.Fatalf("flash %q", got)
		}
		for _, id := range e.held[1:] {
			if rp, _ := e.repair(t, id); rp.State != ledger.Approved {
				t.Fatalf("repair %d is %s after the confirmation", id, rp.State)
			}
		}
	})

	// A fresh held repair for the viewer to (not) act on; the open fleet
	// page shows it without a reload.
	do(t, ctx, chromedp.Navigate(e.srv.URL+"/fleet"), chromedp.WaitVisible("#awaiting-count"))
	if got := text(t, ctx, "#awaiting-count"); got != "0" {
		t.Fatalf("fleet page: %s awaiting approval, want 0", got)
	}
	if _, err := chromedp.Run(ctx, chromedp.Evaluate[int](`window.notReloaded = 1`)); err != nil {
		t.Fatal(err)
	}
	rp, _, err := e.st.OpenRepair(context.Background(), store.Repair{Cluster: "c1", Node: "gpu-4", NodeClaim: "nc-gpu-4", NodePool: "gpu",
		Reason: "GPULost", FaultClass: "accelerated-hardware", RecommendedAction: "replace", State: ledger.AwaitingApproval,
		Detail: map[string]any{"held_by": "action"}}, "controller", "held", e.now)
	if err != nil {
		t.Fatal(err)
	}

	t.Run("open page updates live", func(t *testing.T) {
		if _, err := chromedp.Run(ctx, chromedp.Poll[bool](`document.getElementById("awaiting-count").innerText.trim() === "1" && window.notReloaded === 1`,
			chromedp.WithPollingTimeout(10*time.Second))); err != nil {
			t.Fatalf("the fleet page did not show the new held repair without a reload: %v; the page:\n%s", err, dump(ctx))
		}
	})

	t.Run("viewer sees no buttons and a forged POST is 403", func(t *testing.T) {
		do(t, ctx, chromedp.Click(`header form.who button`), chromedp.WaitVisible("#oidc-login"))
		viewer := &mockoidc.MockUser{Subject: "u-bob", Email: "bob@example.com", EmailVerified: true, Groups: []string{"staff"}}
		e.login(t, ctx, viewer, "/approvals")
		if got := text(t, ctx, "#role"); got != "viewer" {
			t.Fatalf("role %q, want viewer", got)
		}
		do(t, ctx, chromedp.WaitVisible(fmt.Sprintf(`tr.held[data-repair="%d"]`, rp.ID)))
		buttons, err := chromedp.Run(ctx, chromedp.Evaluate[int](`document.querySelectorAll("#live button, #live input[type=checkbox], #live form.bulk input[name=reason]").length`))
		if err != nil {
			t.Fatal(err)
		}
		if buttons != 0 {
			t.Fatalf("viewer sees %d action controls on the approvals page", buttons)
		}
		js := fmt.Sprintf(`fetch("/repairs/%d/approve", {method: "POST", headers: {"Content-Type": "application/x-www-form-urlencoded"}, body: "reason=forged"}).then(r => r.status)`, rp.ID)
		status, err := chromedp.Run(ctx, chromedp.Evaluate[int](js, chromedp.EvalAwaitPromise))
		if err != nil {
			t.Fatal(err)
		}
		if status != http.StatusForbidden {
			t.Fatalf("forged approve as viewer: status %d, want 403", status)
		}
		if got, _ := e.repair(t, rp.ID); got.State != ledger.AwaitingApproval {
			t.Fatalf("repair %s after a viewer's forged approve", got.State)
		}
		evs, err := e.st.SecurityEvents(context.Background(), 10)
		if err != nil || len(evs) == 0 || evs[0].Subject != "bob@example.com" || evs[0].Status != http.StatusForbidden {
			t.Fatalf("security audit %+v, %v; want bob's refusal first", evs, err)
		}
	})

	t.Run("cross-site form post is refused", func(t *testing.T) {
		// Another site (localhost is not 127.0.0.1's site) posts a form to
		// the dashboard in the logged-in browser.
		u, _ := url.Parse(e.srv.URL)
		target := fmt.Sprintf("http://%s/repairs/%d/reject", u.Host, rp.ID)
		evil := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			w.Header().Set("Content-Type", "text/html")
			fmt.Fprintf(w, `<form id=f method=post action=%q><input name=reason value=csrf></form><script>document.getElementById("f").submit()</script>`, target)
		}))
		defer evil.Close()
		eu, _ := url.Parse(evil.URL)
		_, port, _ := strings.Cut(eu.Host, ":")
		do(t, ctx, chromedp.Navigate("http://localhost:"+port+"/"), chromedp.WaitReady("body"))
		if _, err := chromedp.Run(ctx, chromedp.Poll[bool](`location.href.includes("/reject")`, chromedp.WithPollingTimeout(15*time.Second))); err != nil {
			t.Fatalf("the cross-site form did not post: %v; the page:\n%s", err, dump(ctx))
		}
		body, err := chromedp.Run(ctx, chromedp.Text("body"))
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(strings.ToLower(body), "cross-origin") {
			t.Fatalf("cross-site post answered %q, want a cross-origin refusal", body)
		}
		if got, _ := e.repair(t, rp.ID); got.State != ledger.AwaitingApproval {
			t.Fatalf("repair %s after a cross-site post", got.State)
		}
	})
}
